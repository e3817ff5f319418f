//! Automorphisms of a weighted class model and the orbits of cases under
//! them.
//!
//! A permutation `π` of the classes that keeps every conflict, every
//! self-conflict and every weight maps a mapping of case `S` to a mapping
//! of case `π(S)` that satisfies R.1-R.5 as well and costs exactly as much:
//! each term of the cost reads only weights, conflicts and thread sets, all
//! of which `π` carries over. So all cases of one orbit have the same
//! optimum and solving one of them is enough. Any set of automorphisms is
//! sound here (a smaller group only leaves more orbits), so the search for
//! them is bounded and may give up.

use super::{bit, Problem};
use std::collections::HashMap;

/// Backtracking nodes allowed to find one automorphism: the built-in
/// models need a few dozen.
const NODES_MAX: usize = 20_000;

/// One representative per orbit of `cases` under the automorphisms of
/// `problem`'s model, in the order of `cases`.
pub(super) fn orbit_representatives(problem: &Problem, conflict: &[u64], cases: &[u64]) -> Vec<u64> {
    let generators = automorphisms(problem, conflict);
    if generators.is_empty() {
        return cases.to_vec();
    }
    let index: HashMap<u64, usize> = cases.iter().enumerate().map(|(i, &s)| (s, i)).collect();
    let mut orbits = UnionFind::new(cases.len());
    for (i, &seq) in cases.iter().enumerate() {
        for g in &generators {
            // Automorphisms keep R.2 and R.3, so the image is a case too.
            if let Some(&j) = index.get(&apply(g, seq)) {
                orbits.union(i, j);
            }
        }
    }
    cases.iter().enumerate().filter(|&(i, _)| orbits.find(i) == i).map(|(_, &s)| s).collect()
}

/// The image of the class set `mask` under the permutation `p`.
fn apply(p: &[usize], mask: u64) -> u64 {
    p.iter().enumerate().filter(|&(c, _)| mask & bit(c) != 0).fold(0, |m, (_, &d)| m | bit(d))
}

/// Automorphisms that together move every class to every class it can be
/// moved to (each found by backtracking within [`NODES_MAX`]).
fn automorphisms(problem: &Problem, conflict: &[u64]) -> Vec<Vec<usize>> {
    let n = conflict.len();
    let colour: Vec<(bool, u64, u32)> = (0..n)
        .map(|c| (conflict[c] & bit(c) != 0, problem.weights[c].to_bits(), (conflict[c] & !bit(c)).count_ones()))
        .collect();
    let graph = Graph { conflict, colour: &colour };
    let mut classes = UnionFind::new(n);
    let mut generators = Vec::new();
    for u in 0..n {
        for v in u + 1..n {
            if colour[u] != colour[v] || classes.find(u) == classes.find(v) {
                continue;
            }
            if let Some(p) = graph.automorphism_moving(u, v) {
                for (c, &d) in p.iter().enumerate() {
                    classes.union(c, d);
                }
                generators.push(p);
            }
        }
    }
    generators
}

struct Graph<'a> {
    conflict: &'a [u64],
    /// Self-conflict, weight bits and degree: what an automorphism keeps.
    colour: &'a [(bool, u64, u32)],
}

impl Graph<'_> {
    /// An automorphism mapping `u` to `v`, preferring to fix every other
    /// class so that it tends to be a small swap; `None` if there is none
    /// or the search ran out of nodes.
    fn automorphism_moving(&self, u: usize, v: usize) -> Option<Vec<usize>> {
        let order = self.search_order(u);
        let mut image = vec![usize::MAX; order.len()];
        image[u] = v;
        let mut nodes = 0;
        self.extend(&order, 1, &mut image, bit(v), &mut nodes).then_some(image)
    }

    /// `u` first, then the others in breadth-first order over conflicts so
    /// that each class is checked against many placed neighbours early.
    fn search_order(&self, u: usize) -> Vec<usize> {
        let n = self.conflict.len();
        let mut order = vec![u];
        let mut seen = bit(u);
        let mut i = 0;
        while order.len() < n {
            let next = if i < order.len() {
                let c = order[i];
                i += 1;
                self.conflict[c] & !seen
            } else {
                // Another connected component.
                bit((!seen).trailing_zeros() as usize)
            };
            for d in (0..n).filter(|&d| next & bit(d) != 0) {
                order.push(d);
                seen |= bit(d);
            }
        }
        order
    }

    fn extend(&self, order: &[usize], k: usize, image: &mut [usize], used: u64, nodes: &mut usize) -> bool {
        if k == order.len() {
            return true;
        }
        let x = order[k];
        let candidates = std::iter::once(x).chain((0..order.len()).filter(|&y| y != x));
        for y in candidates {
            *nodes += 1;
            if *nodes > NODES_MAX {
                return false;
            }
            if used & bit(y) != 0 || self.colour[x] != self.colour[y] || !self.consistent(order, k, image, y) {
                continue;
            }
            image[x] = y;
            if self.extend(order, k + 1, image, used | bit(y), nodes) {
                return true;
            }
        }
        image[x] = usize::MAX;
        false
    }

    /// Whether mapping `order[k]` to `y` keeps every conflict with the
    /// classes placed before it.
    fn consistent(&self, order: &[usize], k: usize, image: &[usize], y: usize) -> bool {
        let x = order[k];
        order[..k].iter().all(|&z| (self.conflict[x] & bit(z) != 0) == (self.conflict[y] & bit(image[z]) != 0))
    }
}

struct UnionFind(Vec<usize>);

impl UnionFind {
    fn new(n: usize) -> Self {
        Self((0..n).collect())
    }

    fn find(&mut self, mut i: usize) -> usize {
        while self.0[i] != i {
            self.0[i] = self.0[self.0[i]];
            i = self.0[i];
        }
        i
    }

    /// Joins the sets of `a` and `b`; the smaller index stays the root, so
    /// each orbit's root is its first member.
    fn union(&mut self, a: usize, b: usize) {
        let (a, b) = (self.find(a), self.find(b));
        let (lo, hi) = (a.min(b), a.max(b));
        self.0[hi] = lo;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use psmr_model::ClassModel;

    fn two_shards() -> Problem {
        let m = ClassModel::builder("s")
            .class("R1")
            .class("R2")
            .class("W1")
            .class("W2")
            .conflict("R1", "W1")
            .conflict("R2", "W2")
            .conflict("W1", "W1")
            .conflict("W2", "W2")
            .build()
            .unwrap();
        Problem::new(m, 2).unwrap()
    }

    #[test]
    fn shards_swap_and_weights_break_the_symmetry() {
        let p = two_shards();
        let conflict = super::super::conflict_masks(&p);
        let gens = automorphisms(&p, &conflict);
        assert_eq!(gens, vec![vec![1, 0, 3, 2]]);
        // Cases: W1, W2 always sequential; R1 and R2 free: four cases, of
        // which "R1 sequential" and "R2 sequential" are one orbit.
        let cases = [0b1100, 0b1101, 0b1110, 0b1111];
        assert_eq!(orbit_representatives(&p, &conflict, &cases), vec![0b1100, 0b1101, 0b1111]);
        let p = p.with_weights(vec![1.0, 2.0, 1.0, 1.0]).unwrap();
        assert!(automorphisms(&p, &conflict).is_empty());
    }
}
