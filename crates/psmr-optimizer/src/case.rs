//! One sequential/concurrent case: its constants and its lower bounds.
//!
//! Within a case, a mapping is a *pattern* (the set of sequential classes
//! it serves) per thread plus, per concurrent class `d`, its thread count
//! `n[d]`: R.4 only asks each of `d`'s threads to serve `N(d)`, the
//! sequential classes `d` conflicts with. Its cost is
//!
//! ```text
//!   Σ_t Σ_{c ∈ p_t} a[c]  +  pair · Σ_t indep(p_t)  +  Σ_d f_d(n[d])
//! ```
//!
//! with `a[c]` a sequential class's O.1a weight, `indep(p)` the number of
//! unordered pairs of independent classes in `p`, `pair = 2 · nt · nc` (O.3
//! counts ordered pairs) and `f_d(n) = o1[d] · n + |share[d] - n / nt|`
//! (O.1b and O.2). The bounds below hold for every mapping of the case.

use super::{bit, Coefficients, Problem};
use std::cmp::Reverse;

/// A concurrent class of a case.
pub(super) struct Concurrent {
    /// The class.
    pub class: usize,
    /// `N(d)`: the sequential classes it conflicts with, which every one
    /// of its threads must serve (R.4).
    pub need: u64,
    /// `f_d(n)` at index `n - 1`, for `n` from 1 up to the smallest
    /// minimizer of the convex `f_d` over `1..=nt`: more threads never
    /// lower its cost, so the case's program never gives it more.
    pub cost: Vec<f64>,
}

/// A case with everything its bounds and its integer program need.
pub(super) struct Case {
    /// The sequential classes.
    pub seq: u64,
    /// Per class: sequential or not.
    pub flags: Vec<bool>,
    /// Per sequential class: its O.1a weight per thread (`a[c] >= 0`).
    pub seq_cost: Vec<f64>,
    /// Per sequential class: the sequential classes it is independent of.
    pub indep: Vec<u64>,
    /// The concurrent classes.
    pub concurrent: Vec<Concurrent>,
    /// Conflicting pairs of sequential classes (R.5), lower class first.
    pub pairs: Vec<(usize, usize)>,
    /// O.3 of one thread shared by two independent sequential classes.
    pub pair_cost: f64,
    /// Lower bound on `Σ_t indep(p_t)` over the case's mappings.
    pub sharing_lb: u64,
    /// Lower bound on the cost without O.3.
    pub rest_lb: f64,
    /// Lower bound on the cost of the mappings without any shared pair
    /// (infinite if there are none).
    pub unshared_lb: f64,
    /// Disjoint sets of sequential classes, each of which some thread must
    /// serve whole, with no conflict between two of them: the blocks of
    /// the pigeonhole bound (see [`Case::sharing_bound`]).
    pub blocks: Vec<u64>,
}

impl Case {
    /// Case `seq` of `problem`; `conflict` from `conflict_masks`.
    pub fn new(problem: &Problem, conflict: &[u64], seq: u64) -> Self {
        let n = conflict.len();
        let nt = problem.threads;
        let flags: Vec<bool> = (0..n).map(|c| seq & bit(c) != 0).collect();
        let k = Coefficients::new(problem, &flags);
        let seq_cost = (0..n).map(|c| if flags[c] { k.o1[c] } else { 0.0 }).collect();
        let indep = (0..n).map(|c| if flags[c] { seq & !conflict[c] & !bit(c) } else { 0 }).collect();
        let concurrent = (0..n)
            .filter(|&c| !flags[c])
            .map(|c| Concurrent { class: c, need: conflict[c] & seq, cost: concurrent_costs(&k, c, nt) })
            .collect();
        let pairs = (0..n)
            .flat_map(|a| (a + 1..n).map(move |b| (a, b)))
            .filter(|&(a, b)| flags[a] && flags[b] && conflict[a] & bit(b) != 0)
            .collect();
        let pair_cost = 2.0 * nt as f64 * n as f64;
        let mut case = Case {
            seq,
            flags,
            seq_cost,
            indep,
            concurrent,
            pairs,
            pair_cost,
            sharing_lb: 0,
            rest_lb: 0.0,
            unshared_lb: 0.0,
            blocks: Vec::new(),
        };
        case.rest_lb = case.rest_bound();
        case.unshared_lb = case.unshared_bound(nt);
        case.blocks = case.best_blocks(nt).1;
        case.sharing_lb = case.sharing_bound(nt);
        case
    }

    /// Lower bound on the cost of every mapping of the case whose sharing
    /// is at least `sharing`.
    pub fn bound_with_sharing(&self, sharing: u64) -> f64 {
        let shared = self.pair_cost * sharing.max(1) as f64 + self.rest_lb;
        if sharing == 0 {
            shared.min(self.unshared_lb)
        } else {
            shared
        }
    }

    /// `indep(p)`: unordered pairs of independent sequential classes in `p`.
    pub fn sharing(&self, p: u64) -> u64 {
        let twice: u32 = ones(p).map(|c| (p & self.indep[c]).count_ones()).sum();
        u64::from(twice / 2)
    }

    /// The sequential classes in id order.
    pub fn seq_classes(&self) -> impl Iterator<Item = usize> + '_ {
        ones(self.seq)
    }

    /// O.1a, O.1b and O.2 of any mapping are at least: one thread per
    /// sequential class, plus per concurrent class `d` the best of
    /// `f_d(n)` plus the O.1a of the `n - 1` threads more that `d`'s
    /// sequential neighbours then need (R.4), each neighbour's extra threads
    /// split evenly among the concurrent classes that may demand them, since
    /// one extra thread may serve several of them.
    fn rest_bound(&self) -> f64 {
        let base: f64 = self.seq_classes().map(|c| self.seq_cost[c]).sum();
        base + self.with_neighbours(1.0).iter().map(|h| h.iter().copied().fold(f64::INFINITY, f64::min)).sum::<f64>()
    }

    /// Per concurrent class `d`, `f_d(n)` plus the O.1a of the `n - 1`
    /// threads more that its sequential neighbours then need (R.4), each
    /// neighbour's extra threads split evenly among the concurrent classes
    /// that may demand them, since one extra thread may serve several of
    /// them; at index `n - 1`. Convex in `n`, like `f_d`.
    /// `scale` weighs the neighbours' part (see [`Case::unshared_bound`]).
    fn with_neighbours(&self, scale: f64) -> Vec<Vec<f64>> {
        let mut demand = vec![0u32; self.flags.len()];
        for d in &self.concurrent {
            ones(d.need).for_each(|c| demand[c] += 1);
        }
        self.concurrent
            .iter()
            .map(|d| {
                let extra: f64 = ones(d.need).map(|c| scale * self.seq_cost[c] / f64::from(demand[c])).sum();
                d.cost.iter().enumerate().map(|(i, f)| f + i as f64 * extra).collect()
            })
            .collect()
    }

    /// Lower bound on the cost without O.3 of the mappings that share no
    /// pair. Then two independent sequential classes have disjoint threads,
    /// and a sequential class needs a thread of its own for each of its
    /// conflicting partners that are pairwise independent (R.5): its
    /// *apart* count. A concurrent class's threads serve `N(d)`, so two
    /// concurrent classes whose `N(d)` together hold an independent pair
    /// never share a thread, nor does a concurrent class with a sequential
    /// class independent of some class of its `N(d)`. A family of such
    /// mutually exclusive classes splits the `nt` threads: the sequential
    /// ones take at least their apart counts, the concurrent ones the rest.
    /// The sequential classes' O.1a is charged both through their
    /// concurrent neighbours as in [`Case::rest_bound`] and by their apart
    /// counts, in a few mixes; the largest bound holds.
    fn unshared_bound(&self, nt: usize) -> f64 {
        if self.concurrent.iter().any(|d| self.sharing(d.need) > 0) {
            return f64::INFINITY;
        }
        let apart = self.apart_counts();
        if self.seq_classes().any(|c| ones(self.indep[c]).any(|e| (apart[c] + apart[e]) as usize > nt)) {
            return f64::INFINITY;
        }
        let (family, reserved) = self.exclusive_family(&apart);
        let Some(spare) = nt.checked_sub(reserved).filter(|&t| t >= family.len()) else {
            return f64::INFINITY;
        };
        // A sequential class `c` pays `a[c] · n[c] >= a[c] · max(apart,
        // 1 + its neighbours' extra threads)`, at least any mix of the two.
        [0.0, 0.25, 0.5, 0.75, 1.0]
            .into_iter()
            .map(|mix| {
                let seq: f64 =
                    self.seq_classes().map(|c| self.seq_cost[c] * (mix * f64::from(apart[c]) + 1.0 - mix)).sum();
                seq + split_threads(&self.with_neighbours(1.0 - mix), &family, spare)
            })
            .fold(f64::NEG_INFINITY, f64::max)
    }

    /// Per sequential class, the most conflicting partners that are
    /// pairwise independent (at least 1).
    fn apart_counts(&self) -> Vec<u32> {
        let mut apart = vec![1u32; self.flags.len()];
        for c in self.seq_classes() {
            let mut budget = INDEPENDENT_NODES_MAX;
            let partners = self.seq & !self.indep[c] & !bit(c);
            apart[c] = self.max_independent(partners, 0, 0, &mut budget).count_ones().max(1);
        }
        apart
    }

    /// A family of mutually exclusive classes for [`Case::unshared_bound`],
    /// greedily: its concurrent members (indices into `concurrent`) and the
    /// threads its sequential members take at least.
    fn exclusive_family(&self, apart: &[u32]) -> (Vec<usize>, usize) {
        let mut family: Vec<usize> = Vec::new();
        for (i, d) in self.concurrent.iter().enumerate() {
            if family.iter().all(|&j| self.sharing(d.need | self.concurrent[j].need) > 0) {
                family.push(i);
            }
        }
        let mut members = 0u64;
        let mut classes: Vec<usize> = self.seq_classes().collect();
        classes.sort_by_key(|&c| Reverse(apart[c]));
        for c in classes {
            let apart_from_family = family.iter().all(|&j| self.indep[c] & self.concurrent[j].need != 0);
            if apart_from_family && members & !self.indep[c] == 0 {
                members |= bit(c);
            }
        }
        (family, ones(members).map(|c| apart[c] as usize).sum())
    }

    /// Lower bound on `Σ_t indep(p_t)`. With one thread every sequential
    /// class is on it. Otherwise the larger of: the independent pairs
    /// within the `N(d)`, each of which some thread must serve whole
    /// ([`Case::forced_pairs`]); and a pigeonhole bound over
    /// *blocks*, disjoint sets of sequential classes each of which some
    /// thread must serve whole (a class by R.1, a conflicting pair by R.5,
    /// a subset of some `N(d)` by R.4) and with no conflict between two
    /// blocks: blocks on one thread share all their cross pairs, and spread
    /// over `nt` threads their sizes add up to at least the most balanced
    /// split allows.
    fn sharing_bound(&self, nt: usize) -> u64 {
        if nt == 1 {
            return self.sharing(self.seq);
        }
        self.forced_pairs(|_| true).max(self.best_blocks(nt).0)
    }

    /// The independent pairs that some thread must hold because they lie
    /// within `N(d)` of a concurrent class `d` that `include` selects,
    /// counted once each: each such thread serves all of `N(d)` (R.4).
    pub fn forced_pairs(&self, include: impl Fn(u64) -> bool) -> u64 {
        let mut pairs = [0u64; 64];
        for need in self.concurrent.iter().map(|d| d.need).filter(|&m| include(m)) {
            ones(need).for_each(|x| pairs[x] |= need & self.indep[x]);
        }
        // Each pair is in the masks of both its classes.
        u64::from(pairs.iter().map(|m| m.count_ones()).sum::<u32>() / 2)
    }

    /// The pigeonhole bound of [`Case::sharing_bound`] for `blocks` on
    /// `threads` threads (`None` when blocks need a thread and there is
    /// none).
    pub fn pigeonhole(&self, blocks: &[u64], threads: usize) -> Option<u64> {
        if threads == 0 {
            return blocks.is_empty().then_some(0);
        }
        let internal: u64 = blocks.iter().map(|&b| self.sharing(b)).sum();
        let sizes: Vec<u64> = blocks.iter().map(|b| u64::from(b.count_ones())).collect();
        let total: u64 = sizes.iter().sum();
        let squares: u64 = sizes.iter().map(|s| s * s).sum();
        let (q, r) = (total / threads as u64, total % threads as u64);
        let balanced = r * (q + 1) * (q + 1) + (threads as u64 - r) * q * q;
        Some(internal + balanced.saturating_sub(squares) / 2)
    }

    /// The best of a few block families: which is best depends on the
    /// model, and each is cheap.
    fn best_blocks(&self, nt: usize) -> (u64, Vec<u64>) {
        [self.grown_independent_blocks(), self.largest_first_blocks()]
            .into_iter()
            .map(|b| (self.pigeonhole(&b, nt).unwrap_or(0), b))
            .max_by_key(|(bound, _)| *bound)
            .unwrap_or_default()
    }

    /// A largest set of pairwise independent sequential classes, each grown
    /// greedily by classes that must share a thread with it and conflict
    /// with no other block.
    fn grown_independent_blocks(&self) -> Vec<u64> {
        let mut budget = INDEPENDENT_NODES_MAX;
        let seeds = self.max_independent(self.seq, 0, 0, &mut budget);
        let mut blocks: Vec<u64> = ones(seeds).map(bit).collect();
        let mut used = seeds;
        for i in 0..blocks.len() {
            for e in ones(self.seq & !used) {
                let others = blocks.iter().enumerate().filter(|&(j, _)| j != i).fold(0, |m, (_, &b)| m | b);
                let grown = blocks[i] | bit(e);
                if others & !self.indep[e] == 0 && self.served_together(grown) {
                    blocks[i] = grown;
                    used |= bit(e);
                }
            }
        }
        blocks
    }

    /// Sets some thread must serve whole (each `N(d)`, each conflicting
    /// pair, each class), largest first, each taken when it is independent
    /// of every set taken before.
    fn largest_first_blocks(&self) -> Vec<u64> {
        let mut candidates: Vec<u64> = self.concurrent.iter().map(|d| d.need).filter(|&m| m != 0).collect();
        candidates.extend(self.pairs.iter().map(|&(a, b)| bit(a) | bit(b)));
        candidates.extend(self.seq_classes().map(bit));
        candidates.sort_by_key(|m| Reverse(m.count_ones()));
        let mut blocks = Vec::new();
        let mut allowed = self.seq;
        for m in candidates {
            if m & !allowed == 0 {
                blocks.push(m);
                allowed &= !m;
                ones(m).for_each(|c| allowed &= self.indep[c]);
            }
        }
        blocks
    }

    /// Whether some thread must serve all of `set`: it is one class, a
    /// conflicting sequential pair, or within some `N(d)`.
    fn served_together(&self, set: u64) -> bool {
        let pair = set.count_ones() == 2 && {
            let a = set.trailing_zeros() as usize;
            set & self.indep[a] == 0
        };
        set.count_ones() <= 1 || pair || self.concurrent.iter().any(|d| set & !d.need == 0)
    }

    /// A largest independent set of sequential classes within `candidates`
    /// (given `chosen` so far and the best `best` known), by branching on
    /// a class of most conflicts; when the node budget runs out the best
    /// set found is returned, which still gives a valid bound.
    fn max_independent(&self, candidates: u64, chosen: u64, best: u64, budget: &mut u32) -> u64 {
        let mut best = best;
        if chosen.count_ones() + candidates.count_ones() <= best.count_ones() || *budget == 0 {
            return best;
        }
        *budget -= 1;
        let conflicts = |c: usize| candidates & !self.indep[c] & !bit(c);
        let Some(v) = ones(candidates).max_by_key(|&c| conflicts(c).count_ones()) else {
            return chosen;
        };
        if conflicts(v) == 0 {
            // No conflicts left among the candidates: take them all.
            return chosen | candidates;
        }
        best = self.max_independent(candidates & !conflicts(v) & !bit(v), chosen | bit(v), best, budget);
        self.max_independent(candidates & !bit(v), chosen, best, budget)
    }
}

/// Branch-and-bound nodes for the independent set of [`Case::blocks`].
const INDEPENDENT_NODES_MAX: u32 = 10_000;

/// The least `Σ_d h[d][n_d - 1]` when the classes of `family` take
/// disjoint threads (`Σ n_d <= threads`, each at least one) and the others
/// any count: each `h[d]` is convex, so giving the spare threads one at a time
/// to the best marginal gain is exact.
fn split_threads(h: &[Vec<f64>], family: &[usize], threads: usize) -> f64 {
    let best = |h: &[f64]| h.iter().copied().fold(f64::INFINITY, f64::min);
    let outside: f64 = (0..h.len()).filter(|i| !family.contains(i)).map(|i| best(&h[i])).sum();
    let mut n = vec![0usize; family.len()];
    for _ in family.len()..threads {
        let gain = |k: usize| h[family[k]].get(n[k] + 1).map_or(0.0, |next| next - h[family[k]][n[k]]);
        match (0..family.len()).min_by(|&a, &b| gain(a).total_cmp(&gain(b))) {
            Some(k) if gain(k) < 0.0 => n[k] += 1,
            _ => break,
        }
    }
    outside + family.iter().zip(&n).map(|(&i, &k)| h[i][k]).sum::<f64>()
}

/// `f_d(n)` for `n` from 1 up to its smallest minimizer over `1..=nt`.
fn concurrent_costs(k: &Coefficients, d: usize, nt: usize) -> Vec<f64> {
    let f = |n: usize| k.o1[d] * n as f64 + (k.share[d] - n as f64 / nt as f64).abs();
    let all: Vec<f64> = (1..=nt).map(f).collect();
    let best = all.iter().copied().fold(f64::INFINITY, f64::min);
    let stop = all.iter().position(|&v| v == best).unwrap_or(0);
    all[..=stop].to_vec()
}

/// The indices of the set bits of `mask`, lowest first.
pub(super) fn ones(mask: u64) -> impl Iterator<Item = usize> {
    let mut m = mask;
    std::iter::from_fn(move || {
        (m != 0).then(|| {
            let i = m.trailing_zeros() as usize;
            m &= m - 1;
            i
        })
    })
}
