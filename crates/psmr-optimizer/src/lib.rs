//! # psmr-optimizer: which threads each request class may run on
//!
//! Early scheduling (`psmr-sched`) maps request classes to worker threads
//! before commands are ordered; this crate finds that mapping: the
//! class-to-threads optimizer of 003 §5 (Alg. 3) and the naive mapping of
//! 003 §6.5. It is a crate of its own because it is a solver, not a
//! scheduler: it knows class models and nothing of threads or batches,
//! and the exact optimizer (feature `milp`) pulls in the HiGHS solver.
//!
//! # The model, exactly as Alg. 3 writes it
//!
//! Inputs: the classes `C` (`nc` of them) with their conflict relation `#`,
//! `nt` threads and a weight `w[c] >= 0` per class. Outputs: `uses[c, t]`
//! and `Seq[c]`. Constraints R.1-R.5 (003 §4.4). With `ws` and `wc` the
//! total weight of the sequential and of the concurrent classes, and
//! `n[c] = |{t : uses[c, t]}|`, the cost to minimize is
//!
//! ```text
//!   O.1a  + Σ_{c seq}  n[c] · w[c] / ws
//!   O.1b  - Σ_{c conc} n[c] · w[c] / wc
//!   O.2   + Σ_{c conc} | w[c] / wc - n[c] / nt |
//!   O.3   + Σ_{c1 ≠ c2 both seq, not c1 # c2} |T[c1] ∩ T[c2]| · nt · nc
//! ```
//!
//! Two readings had to be fixed. A quotient whose denominator is zero
//! (`ws` with no sequential class of positive weight, `wc` likewise) is
//! taken as 0: every numerator over it is then 0 too. O.3 sums over ordered
//! pairs of *distinct* classes, as written (so each unordered pair counts
//! twice); a class paired with itself would charge every sequential class
//! `n[c] · nt · nc` for sharing threads with itself, which is no
//! synchronization at all. [`evaluate`] computes these terms for any
//! mapping; it is the definition the solver and the tests are held to.
//!
//! # How it is solved exactly
//!
//! `ws` and `wc` depend on which classes end up sequential, which makes the
//! cost nonlinear. Classes with internal conflicts are sequential (R.2); the
//! others are *free*. The optimizer splits the search into *cases*, one per
//! sequential/concurrent choice of the free classes that R.3 allows; within
//! a case `ws` and `wc` are constants.
//!
//! **One integer program per case, over patterns** (`milp.rs`). Threads are
//! interchangeable, so the program is not stated over `uses[c, t]`, whose
//! `nt!` symmetric copies of every solution would drown a branch-and-bound,
//! but over *patterns*: the set of sequential classes one thread serves,
//! with `x[p]` the number of threads with pattern `p` (`Σ x[p] = nt`). A
//! concurrent class `d` only needs its threads to serve `N(d)`, the
//! sequential classes it conflicts with (R.4), so it is one integer
//! `1 <= n[d] <= Σ_{p ⊇ N(d)} x[p]`, not a factor in the pattern count; its
//! O.1b and O.2 are a convex function of `n[d]`, stated by its chords. O.1a
//! and O.3 are linear in the counts, R.1 and R.5 are covering rows. HiGHS
//! solves it to a zero optimality gap.
//!
//! **Sharing budgets.** Call *sharing* the number of (thread, unordered pair
//! of independent sequential classes) incidences: O.3 is `2 · nt · nc` per
//! unit, more than O.1 and O.2 can move together, so good mappings share
//! little, and patterns that share a lot are numerous. So a case is solved
//! over the mappings with sharing at most a budget `b`, which only need the
//! patterns that share at most `b` themselves and leave the other threads
//! able to do their part (below); if the best such mapping costs no more
//! than a lower bound for the mappings sharing `b + 1` or more, it is the
//! case's optimum, otherwise the budget grows (by a doubling step).
//!
//! **Lower bounds** (`case.rs`, `partition.rs`), each valid for every
//! mapping of the case:
//!
//! * on sharing: the independent pairs within the `N(d)` (each lies whole on
//!   some thread); a pigeonhole bound over *blocks*, disjoint sets of
//!   mutually independent sequential classes that some thread must serve
//!   whole (a class, an R.5 pair, part of an `N(d)`), spread over `nt`
//!   threads; and the least sharing of a partition of the sequential classes
//!   into `nt` parts (each class counted on one of its threads);
//! * on the rest: one thread per sequential class, the best O.1b and O.2 of
//!   each concurrent class plus the O.1a its sequential neighbours then
//!   need; and, for mappings that share nothing, the threads that mutually
//!   exclusive classes must split among themselves.
//!
//! **Best first, with pruning** (`search.rs`). The search keeps every case's
//! lower bound in a priority queue and always works on the lowest: one
//! solve at the next budget, after which the case's bound rises. The naive
//! mapping is the first incumbent, and each integer program gets the best
//! cost so far as its cutoff. Once the lowest bound is not below the best
//! mapping found, no case can hold a better one and the search stops.
//!
//! **Symmetry** (`symmetry.rs`). A permutation of the classes that keeps
//! conflicts, self-conflicts and weights (the shards of the sharded models
//! with equal weights) maps every mapping of one case to a mapping of equal
//! cost of the permuted case, so only one case per orbit is searched.
//!
//! Each step keeps every mapping that could beat the incumbent, so the
//! result is a proven optimum of the model above. `tests/optimizer.rs`
//! checks it against brute force and against [`optimize_exhaustive`], which
//! searches every case with neither symmetry nor these bounds.
//!
//! # Time limit
//!
//! [`optimize_with`] takes [`Limits`]; the deadline is checked between
//! solves and while patterns are enumerated, and each integer program gets
//! the time left as HiGHS's own limit (HiGHS checks it at its own pace, so
//! a run may overshoot by a fraction of a second). When time runs out the
//! best mapping found is returned, never worse than the naive one, with the
//! lowest bound of the cases left open as its proven lower bound
//! ([`Solution::lower_bound`], [`Solution::gap`]). [`optimize`] uses
//! [`DEFAULT_TIME_LIMIT`].
//!
//! In the guide: `docs/design.md` places this crate among the others;
//! `docs/benchmarks.md`: `psmr mapping` and the class-to-threads mappings; docs/papers.md for the paper behind it.

use psmr_model::{ClassId, ClassMapping, ClassModel, Mapping, Mode};
use std::fmt;
use std::time::Duration;
use thiserror::Error;

#[cfg(feature = "milp")]
mod case;
mod enumerate;
#[cfg(feature = "milp")]
mod milp;
#[cfg(feature = "milp")]
mod partition;
#[cfg(feature = "milp")]
mod search;
#[cfg(feature = "milp")]
mod symmetry;

use enumerate::{cases, conflict_masks};

/// Most classes the optimizer and [`brute_force`] take: class sets are
/// 64-bit masks.
pub const OPTIMIZER_CLASSES_MAX: usize = 64;

/// Most sequential/concurrent cases [`optimize`] enumerates (before
/// symmetry and bounds thin them out).
pub const CASES_MAX: usize = 1 << 13;

/// Most thread patterns of one case's integer program: a case that needs
/// more is left unresolved (see [`SearchStats::too_large`]).
pub const PATTERNS_MAX: usize = 50_000;

/// Most candidate mappings [`brute_force`] examines.
pub const BRUTE_FORCE_MAX: u64 = 50_000_000;

/// Bad optimizer input, or a model too large to solve exactly.
#[derive(Clone, Debug, Error, PartialEq)]
pub enum OptimizerError {
    /// Zero threads.
    #[error("the mapping needs at least one thread, got 0")]
    NoThreads,
    /// More threads than a mapping can name.
    #[error("at most {max} threads, got {0}", max = psmr_model::WORKERS_MAX)]
    TooManyThreads(usize),
    /// More classes than the optimizer handles.
    #[error("the optimizer handles at most {max} classes, model {model} has {got}", max = OPTIMIZER_CLASSES_MAX)]
    TooManyClasses {
        /// The model.
        model: String,
        /// Its class count.
        got: usize,
    },
    /// A weight that is negative, infinite or not a number.
    #[error("weight of class {class} must be a finite number >= 0, got {weight}")]
    BadWeight {
        /// The class.
        class: String,
        /// The weight given.
        weight: f64,
    },
    /// A weight for a class the model does not have.
    #[error("weight given for unknown class {class:?} (model {model} has {known})")]
    UnknownClass {
        /// The name given.
        class: String,
        /// The model.
        model: String,
        /// The model's classes, comma-separated.
        known: String,
    },
    /// A class weighted twice.
    #[error("class {0} is given a weight twice")]
    DuplicateWeight(String),
    /// Weights given for some classes but not all.
    #[error("no weight given for class(es) {0}: give a weight to every class, or none for equal weights")]
    MissingWeights(String),
    /// Weights text that is not `CLASS=WEIGHT,...`.
    #[error("malformed weight {0:?}: expected CLASS=WEIGHT, e.g. R1=0.4")]
    WeightFormat(String),
    /// A weight vector of the wrong length.
    #[error("{got} weights given for the {want} classes of model {model}")]
    WeightCount {
        /// The model.
        model: String,
        /// Weights given.
        got: usize,
        /// Classes in the model.
        want: usize,
    },
    /// A weighting name that is none of the known ones.
    #[error("unknown weighting {0:?} (valid: as-written, total)")]
    UnknownWeighting(String),
    /// Every weight is zero.
    #[error("every class weight is zero: at least one class needs a positive weight")]
    AllZero,
    /// Too many sequential/concurrent choices to enumerate.
    #[error("{free} classes may each be sequential or concurrent, which is more than the {max} cases the exact optimizer enumerates")]
    TooManyCases {
        /// Classes free to be either.
        free: usize,
        /// [`CASES_MAX`].
        max: usize,
    },
    /// The search space of [`brute_force`] is too large.
    #[error("brute force would examine more than {max} mappings", max = BRUTE_FORCE_MAX)]
    TooLargeForBruteForce,
    /// The MILP solver failed.
    #[error("MILP solver: {0}")]
    Solver(String),
    /// A time limit that is not a finite number of seconds > 0.
    #[error("the time limit must be a finite number of seconds > 0, got {0}")]
    BadTimeLimit(f64),
}

/// How O.1a and O.1b weigh a class's threads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Weighting {
    /// Alg. 3 as written: a sequential class's threads by `w[c] / ws`, a
    /// concurrent class's by `w[c] / wc`. Solved exactly this rewards making
    /// heavy classes sequential (see the module doc).
    #[default]
    AsWritten,
    /// Both by `w[c] / W`, `W` the weight of all classes, so that a thread
    /// costs or earns the same whatever the mode of the other classes. O.2
    /// and O.3 are unchanged.
    Total,
}

impl Weighting {
    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Weighting::AsWritten => "as-written",
            Weighting::Total => "total",
        }
    }
}

impl fmt::Display for Weighting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Weighting {
    type Err = OptimizerError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [Weighting::AsWritten, Weighting::Total]
            .into_iter()
            .find(|w| w.name() == s)
            .ok_or_else(|| OptimizerError::UnknownWeighting(s.to_string()))
    }
}

/// One instance of the optimization model: classes, conflicts, threads,
/// weights, and how O.1 weighs them.
#[derive(Clone, Debug)]
pub struct Problem {
    model: ClassModel,
    threads: usize,
    weights: Vec<f64>,
    weighting: Weighting,
}

impl Problem {
    /// `model` on `threads` threads, every class of weight 1 (003 §5.1: "If
    /// such information is not available, we assume equal weight to all
    /// classes").
    pub fn new(model: ClassModel, threads: usize) -> Result<Self, OptimizerError> {
        if threads == 0 {
            return Err(OptimizerError::NoThreads);
        }
        if threads > psmr_model::WORKERS_MAX {
            return Err(OptimizerError::TooManyThreads(threads));
        }
        if model.len() > OPTIMIZER_CLASSES_MAX {
            return Err(OptimizerError::TooManyClasses { model: model.name().to_string(), got: model.len() });
        }
        let weights = vec![1.0; model.len()];
        Ok(Self { model, threads, weights, weighting: Weighting::AsWritten })
    }

    /// Chooses how O.1 weighs threads.
    pub fn with_weighting(mut self, weighting: Weighting) -> Self {
        self.weighting = weighting;
        self
    }

    /// How O.1 weighs threads.
    pub fn weighting(&self) -> Weighting {
        self.weighting
    }

    /// Replaces the weights, one per class in id order.
    pub fn with_weights(mut self, weights: Vec<f64>) -> Result<Self, OptimizerError> {
        if weights.len() != self.model.len() {
            return Err(OptimizerError::WeightCount {
                model: self.model.name().to_string(),
                got: weights.len(),
                want: self.model.len(),
            });
        }
        for (c, &w) in self.model.class_ids().zip(&weights) {
            if !w.is_finite() || w < 0.0 {
                return Err(OptimizerError::BadWeight { class: self.model.class_name(c).to_string(), weight: w });
            }
        }
        if weights.iter().all(|&w| w == 0.0) {
            return Err(OptimizerError::AllZero);
        }
        self.weights = weights;
        Ok(self)
    }

    /// Replaces the weights from `CLASS=WEIGHT,...` text (`R1=0.4,W1=0.07`).
    /// Every class must be named exactly once.
    pub fn with_weights_text(self, text: &str) -> Result<Self, OptimizerError> {
        let weights = parse_weights(&self.model, text)?;
        self.with_weights(weights)
    }

    /// The class model.
    pub fn model(&self) -> &ClassModel {
        &self.model
    }

    /// Number of threads.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Weights, one per class in id order.
    pub fn weights(&self) -> &[f64] {
        &self.weights
    }

    fn conflict_mask(&self, c: usize) -> u64 {
        self.model
            .class_ids()
            .filter(|&d| self.model.conflicts(ClassId(c as u16), d))
            .fold(0, |m, d| m | bit(d.index()))
    }
}

fn parse_weights(model: &ClassModel, text: &str) -> Result<Vec<f64>, OptimizerError> {
    let mut weights: Vec<Option<f64>> = vec![None; model.len()];
    for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (name, value) = item.split_once('=').ok_or_else(|| OptimizerError::WeightFormat(item.to_string()))?;
        let name = name.trim();
        let c = model.class_id(name).ok_or_else(|| OptimizerError::UnknownClass {
            class: name.to_string(),
            model: model.name().to_string(),
            known: model.class_ids().map(|c| model.class_name(c)).collect::<Vec<_>>().join(","),
        })?;
        let weight: f64 = value.trim().parse().map_err(|_| OptimizerError::WeightFormat(item.to_string()))?;
        if !weight.is_finite() || weight < 0.0 {
            return Err(OptimizerError::BadWeight { class: name.to_string(), weight });
        }
        if weights[c.index()].replace(weight).is_some() {
            return Err(OptimizerError::DuplicateWeight(name.to_string()));
        }
    }
    let missing: Vec<&str> =
        model.class_ids().filter(|c| weights[c.index()].is_none()).map(|c| model.class_name(c)).collect();
    if !missing.is_empty() {
        return Err(OptimizerError::MissingWeights(missing.join(",")));
    }
    Ok(weights.into_iter().map(|w| w.unwrap_or_default()).collect())
}

/// The four terms of Alg. 3's cost for one mapping.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct Objective {
    /// O.1a: threads of sequential classes, weighted within the sequential ones.
    pub o1a: f64,
    /// O.1b: minus threads of concurrent classes, weighted within the concurrent ones.
    pub o1b: f64,
    /// O.2: distance between each concurrent class's share of weight and of threads.
    pub o2: f64,
    /// O.3: threads shared by independent sequential classes, times `nt · nc`.
    pub o3: f64,
}

impl Objective {
    /// The cost: the sum of the four terms.
    pub fn total(&self) -> f64 {
        self.o1a + self.o1b + self.o2 + self.o3
    }
}

impl fmt::Display for Objective {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:.6} (O.1a {:.6}, O.1b {:.6}, O.2 {:.6}, O.3 {:.6})",
            self.total(),
            self.o1a,
            self.o1b,
            self.o2,
            self.o3
        )
    }
}

/// `a / b`, with `0 / 0` (and anything over 0) taken as 0; see the module doc.
fn ratio(a: f64, b: f64) -> f64 {
    if b == 0.0 {
        0.0
    } else {
        a / b
    }
}

fn bit(i: usize) -> u64 {
    1u64 << i
}

/// Alg. 3's cost of `mapping` for `problem`, term by term. The mapping must
/// have the problem's class count (it need not satisfy R.1-R.5).
pub fn evaluate(problem: &Problem, mapping: &Mapping) -> Objective {
    let seq: Vec<bool> = mapping.classes().iter().map(|m| m.mode == Mode::Sequential).collect();
    let masks: Vec<u64> = mapping.classes().iter().map(|m| m.thread_mask()).collect();
    evaluate_masks(problem, &seq, &masks)
}

fn evaluate_masks(problem: &Problem, seq: &[bool], masks: &[u64]) -> Objective {
    let (nt, nc) = (problem.threads as f64, problem.model.len() as f64);
    let k = Coefficients::new(problem, seq);
    let mut o = Objective::default();
    for c in 0..seq.len() {
        let n = f64::from(masks[c].count_ones());
        if seq[c] {
            o.o1a += n * k.o1[c];
        } else {
            o.o1b += n * k.o1[c];
            o.o2 += (k.share[c] - n / nt).abs();
        }
    }
    let mut shared = 0u32;
    for a in 0..seq.len() {
        for b in 0..seq.len() {
            if a != b && seq[a] && seq[b] && !problem.model.conflicts(ClassId(a as u16), ClassId(b as u16)) {
                shared += (masks[a] & masks[b]).count_ones();
            }
        }
    }
    o.o3 = f64::from(shared) * nt * nc;
    o
}

/// The per-class constants of one sequential/concurrent choice.
struct Coefficients {
    /// What one thread of the class adds to O.1a (sequential, >= 0) or
    /// O.1b (concurrent, <= 0).
    o1: Vec<f64>,
    /// `w[c] / wc` for a concurrent class (O.2), 0 for a sequential one.
    share: Vec<f64>,
}

impl Coefficients {
    fn new(problem: &Problem, seq: &[bool]) -> Self {
        let w = &problem.weights;
        let ws: f64 = (0..seq.len()).filter(|&c| seq[c]).map(|c| w[c]).sum();
        let wc: f64 = (0..seq.len()).filter(|&c| !seq[c]).map(|c| w[c]).sum();
        let all = ws + wc;
        let (by_seq, by_conc) = match problem.weighting {
            Weighting::AsWritten => (ws, wc),
            Weighting::Total => (all, all),
        };
        let o1 = (0..seq.len()).map(|c| if seq[c] { ratio(w[c], by_seq) } else { -ratio(w[c], by_conc) }).collect();
        let share = (0..seq.len()).map(|c| if seq[c] { 0.0 } else { ratio(w[c], wc) }).collect();
        Self { o1, share }
    }
}

/// The naive mapping of 003 §6.5: classes without internal conflicts are
/// concurrent (when one conflicts with a concurrent class before it, it is
/// made sequential instead, as R.3 requires), and threads are dealt to the
/// concurrent classes in proportion to their weights, each getting at least
/// one, in consecutive blocks that wrap around; then each sequential class
/// gets the threads of every concurrent class it conflicts with (R.4), the
/// first thread if that leaves it none (R.1), and, for each conflicting
/// sequential class it shares no thread with, that class's first thread
/// (R.5). Adding threads to a sequential class never breaks R.4 or R.5, so
/// the result always satisfies R.1-R.5.
pub fn naive(problem: &Problem) -> Mapping {
    let model = &problem.model;
    let nt = problem.threads;
    let n = model.len();
    let conflicts = |a: usize, b: usize| model.conflicts(ClassId(a as u16), ClassId(b as u16));
    let mut seq = vec![false; n];
    for c in 0..n {
        seq[c] = conflicts(c, c) || (0..c).any(|d| !seq[d] && conflicts(c, d));
    }
    let wc: f64 = (0..n).filter(|&c| !seq[c]).map(|c| problem.weights[c]).sum();
    let mut masks = vec![0u64; n];
    let mut cursor = 0usize;
    for c in (0..n).filter(|&c| !seq[c]) {
        let share = (ratio(problem.weights[c], wc) * nt as f64).round() as usize;
        for _ in 0..share.clamp(1, nt) {
            masks[c] |= bit(cursor % nt);
            cursor += 1;
        }
    }
    for s in (0..n).filter(|&c| seq[c]) {
        masks[s] = (0..n).filter(|&c| !seq[c] && conflicts(s, c)).fold(0, |m, c| m | masks[c]);
        if masks[s] == 0 {
            masks[s] = 1;
        }
    }
    for a in (0..n).filter(|&c| seq[c]) {
        for b in (0..n).filter(|&c| seq[c] && c != a) {
            if conflicts(a, b) && masks[a] & masks[b] == 0 {
                masks[a] |= masks[b] & masks[b].wrapping_neg();
            }
        }
    }
    to_mapping(nt, &seq, &masks)
}

fn to_mapping(nt: usize, seq: &[bool], masks: &[u64]) -> Mapping {
    let classes = seq
        .iter()
        .zip(masks)
        .map(|(&s, &m)| {
            let mode = if s { Mode::Sequential } else { Mode::Concurrent };
            ClassMapping::new(mode, (0..nt).filter(|&t| m & bit(t) != 0))
        })
        .collect();
    Mapping::new(nt, classes)
}

/// The time [`optimize`] allows itself: generous, since the built-in models
/// solve in well under a second, yet bounded, so that no caller waits
/// forever on an unexpectedly hard model.
pub const DEFAULT_TIME_LIMIT: Duration = Duration::from_secs(10);

/// How long [`optimize_with`] may search.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Limits {
    /// Wall-clock budget of the whole search. When it runs out, the best
    /// mapping found is returned with its proven gap.
    pub time: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self { time: DEFAULT_TIME_LIMIT }
    }
}

impl Limits {
    /// A time limit of `seconds`, which must be a finite number > 0.
    pub fn seconds(seconds: f64) -> Result<Self, OptimizerError> {
        if !seconds.is_finite() || seconds <= 0.0 {
            return Err(OptimizerError::BadTimeLimit(seconds));
        }
        Duration::try_from_secs_f64(seconds)
            .map(|time| Self { time })
            .map_err(|_| OptimizerError::BadTimeLimit(seconds))
    }
}

/// Search statistics of one [`optimize_with`] run.
#[derive(Clone, Debug, PartialEq)]
pub struct SearchStats {
    /// Sequential/concurrent cases R.2 and R.3 allow.
    pub cases: usize,
    /// Cases left after symmetry: one per orbit.
    pub orbits: usize,
    /// Cases skipped because their lower bound could not beat the
    /// incumbent (no integer program solved for them).
    pub pruned: usize,
    /// Integer programs solved (a case may need several as its sharing
    /// budget grows).
    pub solves: usize,
    /// Largest pattern count of one integer program.
    pub patterns_max: usize,
    /// True when no integer program needed a thread shared by independent
    /// sequential classes (sharing budget 0) and the optimum has none.
    pub restricted: bool,
    /// True when the time limit stopped the search.
    pub timed_out: bool,
    /// True when some case needed more than [`PATTERNS_MAX`] patterns and
    /// was left unresolved.
    pub too_large: bool,
    /// Cases left unresolved, by the time limit or by their size: when
    /// any is, the result is not proven optimal.
    pub unresolved: usize,
    /// Wall-clock time of the whole search.
    pub elapsed: Duration,
}

/// The best mapping found, its cost, how far from optimal it may be, and
/// how it was found.
#[derive(Clone, Debug)]
pub struct Solution {
    /// The mapping; it satisfies R.1-R.5.
    pub mapping: Mapping,
    /// Its cost, computed by [`evaluate`].
    pub objective: Objective,
    /// A proven lower bound on the optimal cost: equal to the objective
    /// when [`Solution::optimal`].
    pub lower_bound: f64,
    /// True when the mapping is proven optimal.
    pub optimal: bool,
    /// How the search went.
    pub stats: SearchStats,
}

impl Solution {
    /// The proven gap: the objective minus the lower bound, 0 when optimal.
    pub fn gap(&self) -> f64 {
        if self.optimal {
            0.0
        } else {
            (self.objective.total() - self.lower_bound).max(0.0)
        }
    }
}

/// Solves `problem` to proven optimality (see the module doc for how)
/// within [`DEFAULT_TIME_LIMIT`]; see [`optimize_with`].
#[cfg(feature = "milp")]
pub fn optimize(problem: &Problem) -> Result<Solution, OptimizerError> {
    optimize_with(problem, Limits::default())
}

/// Solves `problem` to proven optimality within `limits`. If time runs out
/// first (or a case is too large, see [`PATTERNS_MAX`]), the best mapping
/// found is returned with [`Solution::optimal`] false and its proven
/// [`Solution::gap`].
#[cfg(feature = "milp")]
pub fn optimize_with(problem: &Problem, limits: Limits) -> Result<Solution, OptimizerError> {
    search::run(problem, limits, search::Strategy { symmetry: true, prune: true, bounds: true })
}

/// Like [`optimize_with`] but solves every case to its own optimum, with
/// neither symmetry reduction nor the lower bounds (a case's only bound is
/// that O.1b is at least `-nt`): slow, a reference to check
/// [`optimize_with`] against on instances too large for [`brute_force`].
#[cfg(feature = "milp")]
pub fn optimize_exhaustive(problem: &Problem, limits: Limits) -> Result<Solution, OptimizerError> {
    search::run(problem, limits, search::Strategy { symmetry: false, prune: false, bounds: false })
}

/// The optimum by exhaustive search over every mode choice and every
/// nonempty thread set of every class: exponential, for checking
/// [`optimize`] on small instances. Ties keep the first mapping found.
pub fn brute_force(problem: &Problem) -> Result<(Mapping, Objective), OptimizerError> {
    let n = problem.model.len();
    let nt = problem.threads;
    let subsets = (1u64 << nt) - 1;
    let all_cases = cases(problem, CASES_MAX)?;
    let per_case = (subsets as f64).powi(n as i32);
    if per_case * all_cases.len() as f64 > BRUTE_FORCE_MAX as f64 {
        return Err(OptimizerError::TooLargeForBruteForce);
    }
    let conflict = conflict_masks(problem);
    let mut best: Option<(f64, Vec<bool>, Vec<u64>)> = None;
    for seq in all_cases {
        let seq_flags: Vec<bool> = (0..n).map(|c| seq & bit(c) != 0).collect();
        let mut masks = vec![1u64; n];
        loop {
            if satisfies_r4_r5(&seq_flags, &conflict, &masks) {
                let cost = evaluate_masks(problem, &seq_flags, &masks).total();
                if best.as_ref().map_or(true, |(b, _, _)| cost < *b - 1e-9) {
                    best = Some((cost, seq_flags.clone(), masks.clone()));
                }
            }
            // Next combination, like an odometer over 1..=subsets.
            let mut i = 0;
            while i < n && masks[i] == subsets {
                masks[i] = 1;
                i += 1;
            }
            if i == n {
                break;
            }
            masks[i] += 1;
        }
    }
    let (_, seq, masks) = best.expect("all classes sequential on every thread is always valid");
    Ok((to_mapping(nt, &seq, &masks), evaluate_masks(problem, &seq, &masks)))
}

fn satisfies_r4_r5(seq: &[bool], conflict: &[u64], masks: &[u64]) -> bool {
    for a in 0..seq.len() {
        for b in 0..seq.len() {
            if a == b || conflict[a] & bit(b) == 0 {
                continue;
            }
            match (seq[a], seq[b]) {
                (true, false) if masks[b] & !masks[a] != 0 => return false,
                (true, true) if masks[a] & masks[b] == 0 => return false,
                _ => {}
            }
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rw() -> ClassModel {
        ClassModel::builder("rw").class("R").class("W").conflict("R", "W").conflict("W", "W").build().unwrap()
    }

    #[test]
    fn weights_text_is_checked() {
        let p = || Problem::new(rw(), 2).unwrap();
        assert_eq!(p().with_weights_text("R=3,W=1").unwrap().weights(), &[3.0, 1.0]);
        assert!(matches!(p().with_weights_text("R=3,X=1"), Err(OptimizerError::UnknownClass { .. })));
        assert!(matches!(p().with_weights_text("R=3"), Err(OptimizerError::MissingWeights(m)) if m == "W"));
        assert!(matches!(p().with_weights_text("R=-1,W=1"), Err(OptimizerError::BadWeight { .. })));
        assert!(matches!(p().with_weights_text("R=1,R=2,W=1"), Err(OptimizerError::DuplicateWeight(_))));
        assert!(matches!(p().with_weights_text("R:1,W=1"), Err(OptimizerError::WeightFormat(_))));
        assert!(matches!(p().with_weights_text("R=x,W=1"), Err(OptimizerError::WeightFormat(_))));
        assert!(matches!(p().with_weights_text("R=0,W=0"), Err(OptimizerError::AllZero)));
        assert!(matches!(p().with_weights(vec![f64::NAN, 1.0]), Err(OptimizerError::BadWeight { .. })));
        assert!(matches!(p().with_weights(vec![1.0]), Err(OptimizerError::WeightCount { .. })));
        assert_eq!(Problem::new(rw(), 0).unwrap_err(), OptimizerError::NoThreads);
        assert_eq!(Problem::new(rw(), 65).unwrap_err(), OptimizerError::TooManyThreads(65));
    }

    #[test]
    fn evaluate_follows_the_formula() {
        // R concurrent on {0}, W sequential on {0, 1}; weights 3 and 1.
        let p = Problem::new(rw(), 2).unwrap().with_weights(vec![3.0, 1.0]).unwrap();
        let m = Mapping::new(
            2,
            vec![ClassMapping::new(Mode::Concurrent, [0]), ClassMapping::new(Mode::Sequential, [0, 1])],
        );
        let o = evaluate(&p, &m);
        assert_eq!(o, Objective { o1a: 2.0, o1b: -1.0, o2: 0.5, o3: 0.0 });
        // Two independent sequential classes sharing one thread: counted
        // once per ordered pair, times nt · nc = 2 · 2.
        let ind =
            ClassModel::builder("ind").class("A").class("B").conflict("A", "A").conflict("B", "B").build().unwrap();
        let p = Problem::new(ind, 2).unwrap();
        let m = Mapping::new(
            2,
            vec![ClassMapping::new(Mode::Sequential, [0]), ClassMapping::new(Mode::Sequential, [0, 1])],
        );
        assert_eq!(evaluate(&p, &m).o3, 8.0);
    }

    #[test]
    fn cases_respect_r2_and_r3() {
        let ab = ClassModel::builder("ab").class("A").class("B").class("C").conflict("A", "B").conflict("C", "C");
        let p = Problem::new(ab.build().unwrap(), 1).unwrap();
        // C is always sequential; A and B not both concurrent.
        let mut got = cases(&p, CASES_MAX).unwrap();
        got.sort_unstable();
        assert_eq!(got, vec![0b101, 0b110, 0b111]);
        assert!(matches!(cases(&p, 2), Err(OptimizerError::TooManyCases { free: 2, .. })));
    }

    #[test]
    #[cfg(feature = "milp")]
    fn patterns_keep_to_the_sharing_budget() {
        // A, B independent and sequential, C concurrent and in conflict
        // with both: C's threads must serve A and B (R.4).
        let m = ClassModel::builder("abc")
            .class("A")
            .class("B")
            .class("C")
            .conflict("A", "A")
            .conflict("B", "B")
            .conflict("A", "C")
            .conflict("B", "C")
            .build()
            .unwrap();
        let p = Problem::new(m, 2).unwrap();
        let c = case::Case::new(&p, &conflict_masks(&p), 0b011);
        // C needs a thread with both A and B: one shared pair at least, so
        // no pattern fits a budget of 0.
        assert_eq!(c.sharing_lb, 1);
        assert_eq!(milp::patterns(&c, 2, 0, true, None).unwrap(), Vec::<u64>::new());
        assert_eq!(milp::patterns(&c, 2, 1, true, None).unwrap(), vec![0, 0b01, 0b10, 0b11]);
        assert_eq!(milp::patterns(&c, 1, 1, true, None).unwrap(), vec![0b11], "one thread serves every class");
        assert_eq!(c.bound_with_sharing(c.sharing_lb), 2.0 * 2.0 * 3.0 + c.rest_lb);
    }
}
