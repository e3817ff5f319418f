//! The search over cases: bound them, then repeatedly work on the case
//! whose bound is lowest (best first), one sharing budget at a time, until
//! no bound is below the best mapping found.

use super::case::Case;
use super::milp::{self, Bounds, NoPatterns, Outcome};
use super::partition::partition_bound;
use super::symmetry::orbit_representatives;
use super::{
    bit, cases, conflict_masks, evaluate, evaluate_masks, naive, satisfies_r4_r5, to_mapping, Limits, Mode,
    OptimizerError, Problem, SearchStats, Solution, CASES_MAX,
};
use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;
use std::time::{Duration, Instant};

/// Which shortcuts [`run`] takes; each keeps the optimum exact.
pub(super) struct Strategy {
    /// Solve one case per orbit of the model's automorphisms.
    pub symmetry: bool,
    /// Stop working on a case once its lower bound reaches the best cost
    /// found in any case, not just in its own.
    pub prune: bool,
    /// Use the case bounds of `case.rs` (and the partition bound); without
    /// them a case's only bound is `pair · sharing - nt` (O.1b is at least
    /// `-nt`, the other terms at least 0), so that a search without them
    /// checks them.
    pub bounds: bool,
}

/// Costs closer than this (relative) are a tie: the first found stays.
const TIE: f64 = 1e-9;

/// Slack on HiGHS's cutoff so that its own tolerances never discard a
/// mapping that beats the incumbent by more than [`TIE`].
const CUTOFF_SLACK: f64 = 1e-6;

/// The tie tolerance at `cost`; none at an infinite cost (no mapping yet),
/// where `∞ - ∞` would make every comparison false.
fn tie(cost: f64) -> f64 {
    if cost.is_finite() {
        TIE * cost.abs().max(1.0)
    } else {
        0.0
    }
}

/// The best mapping so far.
struct Best {
    cost: f64,
    flags: Vec<bool>,
    masks: Vec<u64>,
}

/// Where the search stands on one case: every mapping of it not yet
/// ruled out shares at least `proven` pairs, so costs at least `floor`.
struct Open {
    floor: f64,
    /// Index into the case list (ties go to the earlier case).
    case: usize,
    proven: u64,
    /// Sharing levels the next solve covers: doubles each time, so that a
    /// weak bound costs few solves.
    step: u64,
    /// The best cost found within the case.
    best: f64,
}

impl PartialEq for Open {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Open {}

impl PartialOrd for Open {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Open {
    fn cmp(&self, other: &Self) -> Ordering {
        self.floor.total_cmp(&other.floor).then(self.case.cmp(&other.case))
    }
}

struct Search<'a> {
    problem: &'a Problem,
    strategy: Strategy,
    /// `None`: a limit too far away to represent, which is no limit.
    deadline: Option<Instant>,
    best: Best,
    stats: SearchStats,
    /// Largest sharing budget of an integer program.
    budget_max: u64,
    /// Lowest lower bound of a case left unresolved.
    open_bound: f64,
}

/// Solves `problem` within `limits` (see the module doc).
pub(super) fn run(problem: &Problem, limits: Limits, strategy: Strategy) -> Result<Solution, OptimizerError> {
    let start = Instant::now();
    let conflict = conflict_masks(problem);
    let all = cases(problem, CASES_MAX)?;
    let representatives = if strategy.symmetry { orbit_representatives(problem, &conflict, &all) } else { all.clone() };
    let list: Vec<Case> = representatives.iter().map(|&s| Case::new(problem, &conflict, s)).collect();
    let mut search = Search::new(problem, strategy, start.checked_add(limits.time));
    search.stats.cases = all.len();
    search.stats.orbits = list.len();
    search.explore(&list)?;
    Ok(search.finish(start))
}

/// Takes threads away from classes, one at a time, while that keeps R.1-R.5
/// and lowers the cost (`cost` is that of `masks`); returns the final cost.
/// The naive mapping serves many classes on shared threads, which this
/// undoes in part, so that a search stopped early returns something better.
fn drop_threads(problem: &Problem, flags: &[bool], masks: &mut [u64], mut cost: f64) -> f64 {
    let conflict = conflict_masks(problem);
    let mut improved = true;
    while improved {
        improved = false;
        for c in 0..masks.len() {
            for t in 0..problem.threads {
                if masks[c] & bit(t) == 0 {
                    continue;
                }
                let kept = masks[c];
                masks[c] &= !bit(t);
                let valid = masks[c] != 0 && satisfies_r4_r5(flags, &conflict, masks);
                let new = if valid { evaluate_masks(problem, flags, masks).total() } else { f64::INFINITY };
                if new < cost - tie(cost) {
                    cost = new;
                    improved = true;
                } else {
                    masks[c] = kept;
                }
            }
        }
    }
    cost
}

impl<'a> Search<'a> {
    /// A search whose first incumbent is the naive mapping of 003 §6.5,
    /// which always satisfies R.1-R.5, polished by [`drop_threads`].
    fn new(problem: &'a Problem, strategy: Strategy, deadline: Option<Instant>) -> Self {
        let m = naive(problem);
        let flags: Vec<bool> = m.classes().iter().map(|c| c.mode == Mode::Sequential).collect();
        let mut masks: Vec<u64> = m.classes().iter().map(|c| c.thread_mask()).collect();
        let cost = drop_threads(problem, &flags, &mut masks, evaluate(problem, &m).total());
        let best = Best { cost, flags, masks };
        let stats = SearchStats {
            cases: 0,
            orbits: 0,
            pruned: 0,
            solves: 0,
            patterns_max: 0,
            restricted: false,
            timed_out: false,
            too_large: false,
            unresolved: 0,
            elapsed: Duration::ZERO,
        };
        Self { problem, strategy, deadline, best, stats, budget_max: 0, open_bound: f64::INFINITY }
    }

    /// Works on the open case of lowest floor until none is left that
    /// could beat its cutoff, or time is up.
    fn explore(&mut self, list: &[Case]) -> Result<(), OptimizerError> {
        let mut heap: BinaryHeap<Reverse<Open>> = list
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let proven = if self.strategy.bounds { c.sharing_lb } else { 0 };
                Reverse(Open { floor: self.floor(c, proven), case: i, proven, step: 1, best: f64::INFINITY })
            })
            .collect();
        let mut refined = vec![false; list.len()];
        let mut solved = vec![false; list.len()];
        let mut floors: Vec<f64> = vec![f64::INFINITY; list.len()];
        heap.iter().for_each(|Reverse(open)| floors[open.case] = open.floor);
        while let Some(Reverse(mut open)) = heap.pop() {
            if self.strategy.prune && open.floor >= self.best.cost - tie(self.best.cost) {
                // Lowest floor first: no open case can win any more.
                break;
            }
            if self.out_of_time() {
                self.open(open.floor);
                let limit = self.best.cost - tie(self.best.cost);
                self.stats.unresolved += heap.iter().filter(|Reverse(o)| o.floor < limit).count();
                break;
            }
            let case = &list[open.case];
            if self.strategy.bounds && !refined[open.case] {
                // The partition bound costs more than the others: only
                // for cases the search reaches, before their first solve.
                refined[open.case] = true;
                open.proven = partition_bound(&case.indep, case.seq, self.problem.threads, open.proven);
                open.floor = self.floor(case, open.proven);
                floors[open.case] = open.floor;
                heap.push(Reverse(open));
                continue;
            }
            solved[open.case] = true;
            let open_still = self.step(case, &mut open)?;
            floors[open.case] = open.floor;
            if open_still {
                heap.push(Reverse(open));
            }
        }
        // Cases no integer program was needed for, their bound being no
        // better than the result (when time ran out, the others are open).
        let limit = self.best.cost - tie(self.best.cost);
        self.stats.pruned = (0..list.len()).filter(|&i| !solved[i] && floors[i] >= limit).count();
        Ok(())
    }

    /// Lower bound on the mappings of `case` sharing at least `sharing`
    /// pairs.
    fn floor(&self, case: &Case, sharing: u64) -> f64 {
        if self.strategy.bounds {
            case.bound_with_sharing(sharing)
        } else {
            case.pair_cost * sharing as f64 - self.problem.threads as f64
        }
    }

    fn out_of_time(&self) -> bool {
        self.seconds_left() <= 0.0
    }

    fn seconds_left(&self) -> f64 {
        milp::seconds_until(self.deadline)
    }

    /// Records that time ran out with a case of lower bound `bound` open.
    fn open(&mut self, bound: f64) {
        self.stats.timed_out = true;
        self.leave_open(bound);
    }

    /// Records that a case with lower bound `bound` is left unresolved.
    fn leave_open(&mut self, bound: f64) {
        self.stats.unresolved += 1;
        self.open_bound = self.open_bound.min(bound);
    }

    fn offer(&mut self, case: &Case, cost: f64, masks: Vec<u64>) {
        if cost < self.best.cost - tie(self.best.cost) {
            self.best = Best { cost, flags: case.flags.clone(), masks };
        }
    }

    /// Solves `case` over the mappings sharing at most `budget` pairs, the
    /// next levels above `open.proven`; true while the case stays open.
    fn step(&mut self, case: &Case, open: &mut Open) -> Result<bool, OptimizerError> {
        let cutoff = if self.strategy.prune { self.best.cost.min(open.best) } else { open.best };
        let budget = open.proven + open.step - 1;
        let filter = self.strategy.bounds;
        let patterns = match milp::patterns(case, self.problem.threads, budget, filter, self.deadline) {
            Ok(p) => p,
            Err(NoPatterns::OutOfTime) => {
                self.open(open.best.min(open.floor));
                return Ok(false);
            }
            Err(NoPatterns::TooMany) => {
                // Left open; the other cases may still be solved.
                self.stats.too_large = true;
                self.leave_open(open.best.min(open.floor));
                return Ok(false);
            }
        };
        self.stats.patterns_max = self.stats.patterns_max.max(patterns.len());
        self.stats.solves += 1;
        self.budget_max = self.budget_max.max(budget);
        let slack = if cutoff.is_finite() { CUTOFF_SLACK * cutoff.abs().max(1.0) } else { 0.0 };
        let bounds = Bounds { sharing: budget, cutoff: cutoff + slack, deadline: self.deadline };
        match milp::solve(self.problem, case, &patterns, &bounds)? {
            Outcome::Optimal(cost, masks) => {
                open.best = open.best.min(cost);
                self.offer(case, cost, masks);
            }
            Outcome::NothingBelow => {}
            Outcome::Stopped(found) => {
                if let Some((cost, masks)) = found {
                    open.best = open.best.min(cost);
                    self.offer(case, cost, masks);
                }
                self.open(open.best.min(open.floor));
                return Ok(false);
            }
        }
        open.proven = budget + 1;
        open.step *= 2;
        open.floor = self.floor(case, open.proven);
        // Resolved once no mapping with more sharing can beat what the
        // case (or, pruning, any case) already has.
        let cutoff = if self.strategy.prune { self.best.cost.min(open.best) } else { open.best };
        Ok(open.floor < cutoff - tie(cutoff))
    }

    fn finish(mut self, start: Instant) -> Solution {
        let problem = self.problem;
        let mapping = to_mapping(problem.threads, &self.best.flags, &self.best.masks);
        let objective = evaluate_masks(problem, &self.best.flags, &self.best.masks);
        self.stats.restricted = self.budget_max == 0 && objective.o3 == 0.0;
        self.stats.elapsed = start.elapsed();
        let optimal = self.stats.unresolved == 0;
        let lower_bound = if optimal { objective.total() } else { self.open_bound.min(objective.total()) };
        Solution { mapping, objective, lower_bound, optimal, stats: self.stats }
    }
}
