//! A lower bound on sharing from partitions of the sequential classes.
//!
//! Pick, for every sequential class, one thread that serves it (R.1): the
//! picks partition the classes into at most `nt` parts, each part within
//! one thread's pattern. So every mapping shares at least
//! `min_partition Σ_part indep(part)` pairs, whatever else R.4 and R.5
//! add. The minimum is found by depth-first search with iterative
//! deepening on the cost (each round either finds a partition within the
//! threshold or proves there is none, and the next threshold is the least
//! cost the round cut off), under a node budget: when it runs out, the last
//! threshold proven infeasible is still a valid bound.

use super::bit;
use super::case::ones;

/// Search nodes one bound may take in all: enough for the small thread
/// counts where it matters, cheap next to one integer program.
const NODES_MAX: usize = 100_000;

/// At least `floor` and at most the least sharing of a partition of
/// `classes` into `parts` parts, where `indep[c]` is the set of classes
/// independent of `c`.
pub(super) fn partition_bound(indep: &[u64], classes: u64, parts: usize, floor: u64) -> u64 {
    if parts as u32 >= classes.count_ones() {
        return floor;
    }
    // Most independent first: their placement decides the most.
    let mut order: Vec<usize> = ones(classes).collect();
    order.sort_by_key(|&c| std::cmp::Reverse((indep[c] & classes).count_ones()));
    let mut search = Search { indep, order, parts: vec![0; parts], nodes: 0, cut: u64::MAX };
    let mut threshold = floor;
    loop {
        search.cut = u64::MAX;
        match search.fits(0, 0, 0, threshold) {
            Some(true) => return threshold,
            // Out of nodes: every threshold below this one is infeasible.
            None => return threshold,
            Some(false) if search.cut == u64::MAX => return threshold,
            Some(false) => threshold = search.cut,
        }
    }
}

struct Search<'a> {
    indep: &'a [u64],
    order: Vec<usize>,
    /// Classes placed in each part so far.
    parts: Vec<u64>,
    nodes: usize,
    /// Least cost above the threshold that a branch was cut at.
    cut: u64,
}

impl Search<'_> {
    /// Whether `order[k..]` can be placed with total cost at most
    /// `threshold`, given `cost` so far and `used` parts non-empty; `None`
    /// when the node budget runs out.
    fn fits(&mut self, k: usize, used: usize, cost: u64, threshold: u64) -> Option<bool> {
        self.nodes += 1;
        if self.nodes > NODES_MAX {
            return None;
        }
        let bound = cost + self.rest_bound(k, used);
        if bound > threshold {
            self.cut = self.cut.min(bound);
            return Some(false);
        }
        if k == self.order.len() {
            return Some(true);
        }
        let c = self.order[k];
        // Parts beyond the first empty one are interchangeable with it.
        for j in 0..(used + 1).min(self.parts.len()) {
            let added = u64::from((self.parts[j] & self.indep[c]).count_ones());
            self.parts[j] |= bit(c);
            let fits = self.fits(k + 1, used.max(j + 1), cost + added, threshold);
            self.parts[j] &= !bit(c);
            if fits != Some(false) {
                return fits;
            }
        }
        Some(false)
    }

    /// Each class still to place adds at least its independent classes in
    /// the part where it has fewest (none while a part is empty).
    fn rest_bound(&self, k: usize, used: usize) -> u64 {
        if used < self.parts.len() {
            return 0;
        }
        self.order[k..]
            .iter()
            .map(|&c| self.parts.iter().map(|p| u64::from((p & self.indep[c]).count_ones())).min().unwrap_or(0))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn independent_classes_spread_evenly() {
        // Five pairwise independent classes on two threads: 3 + 2, so
        // 3 + 1 pairs.
        let indep: Vec<u64> = (0..5).map(|c| 0b11111 & !(1 << c)).collect();
        assert_eq!(partition_bound(&indep, 0b11111, 2, 0), 4);
        assert_eq!(partition_bound(&indep, 0b11111, 5, 0), 0);
        // The floor is kept when it is higher (it comes from elsewhere).
        assert_eq!(partition_bound(&indep, 0b11111, 5, 3), 3);
    }
}
