//! The class-to-threads optimizer of 003 §5 (Alg. 3) and the naive mapping
//! of 003 §6.5.
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
//! others are *free*. [`optimize`] enumerates every sequential/concurrent
//! choice of the free classes that R.3 allows (a *case*); within a case
//! `ws` and `wc` are constants and the rest is an integer program.
//!
//! Threads are interchangeable, so the integer program is not stated over
//! `uses[c, t]`, whose `nt!` symmetric copies of every solution would drown
//! a branch-and-bound, but over *patterns*: a pattern is the set of classes
//! one thread serves, and the variables `x[p]` count the threads with
//! pattern `p` (`Σ x[p] = nt`, the empty pattern allowed). This breaks the
//! symmetry between threads completely. Every term above is linear in the
//! counts: `n[c] = Σ_{p ∋ c} x[p]` and `|T[c1] ∩ T[c2]| = Σ_{p ∋ c1, c2}
//! x[p]`; R.1 and R.5 are covering rows; R.4 is a property of a single
//! pattern (a thread of a concurrent class serves every sequential class
//! that class conflicts with), so only patterns that keep it are generated;
//! O.2's absolute values get one auxiliary variable each. Each case is
//! solved by HiGHS to a zero optimality gap.
//!
//! Patterns grow as `2^nc`, but most are never worth using: a thread shared
//! by two independent sequential classes costs at least `2 · nt · nc` in
//! O.3, while O.1a, O.1b and O.2 together move by at most
//! `2 · nt + nc + 1` over all mappings. So whenever
//! `(2 · nt - 1) · (nc - 1) > 2` and some case has a solution without such a
//! thread, every mapping with one is worse than every mapping without. The
//! optimizer therefore first solves every case over the patterns with no
//! two independent sequential classes (few: for the sharded models a thread
//! then serves at most one shard), and only if no case is feasible that way,
//! or the inequality does not hold, solves every case over all R.4-closed
//! patterns. Either way the result is a proven optimum of the model above;
//! `tests/optimizer.rs` checks it against brute force.

use psmr_model::{ClassId, ClassMapping, ClassModel, Mapping, Mode};
use std::fmt;
use std::time::Duration;
use thiserror::Error;

/// Most classes the optimizer and [`brute_force`] take: class sets are
/// 64-bit masks.
pub const OPTIMIZER_CLASSES_MAX: usize = 64;

/// Most sequential/concurrent cases [`optimize`] enumerates: one integer
/// program each.
pub const CASES_MAX: usize = 1 << 13;

/// Most thread patterns of one case's integer program.
pub const PATTERNS_MAX: usize = 200_000;

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
    /// Too many thread patterns in one case.
    #[error("a case has more than {max} thread patterns; the model is too large to solve exactly")]
    TooManyPatterns {
        /// [`PATTERNS_MAX`].
        max: usize,
    },
    /// The search space of [`brute_force`] is too large.
    #[error("brute force would examine more than {max} mappings", max = BRUTE_FORCE_MAX)]
    TooLargeForBruteForce,
    /// The MILP solver failed.
    #[error("MILP solver: {0}")]
    Solver(String),
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

/// The sequential/concurrent choices R.2 and R.3 allow, as sequential-class
/// masks: self-conflicting classes always sequential, and no two
/// conflicting classes both concurrent.
fn cases(problem: &Problem, limit: usize) -> Result<Vec<u64>, OptimizerError> {
    let n = problem.model.len();
    let conflict: Vec<u64> = (0..n).map(|c| problem.conflict_mask(c)).collect();
    let forced: u64 = (0..n).filter(|&c| conflict[c] & bit(c) != 0).fold(0, |m, c| m | bit(c));
    let free: Vec<usize> = (0..n).filter(|&c| forced & bit(c) == 0).collect();
    if free.len() >= usize::BITS as usize - 1 || 1usize << free.len() > limit {
        return Err(OptimizerError::TooManyCases { free: free.len(), max: limit });
    }
    let mut out = Vec::new();
    for choice in 0..1u64 << free.len() {
        // Bit i of `choice` set: free class i is sequential.
        let seq = free.iter().enumerate().filter(|(i, _)| choice & bit(*i) != 0).fold(forced, |m, (_, &c)| m | bit(c));
        let concurrent_conflict = (0..n).any(|c| seq & bit(c) == 0 && conflict[c] & !seq & !bit(c) != 0);
        if !concurrent_conflict {
            out.push(seq);
        }
    }
    Ok(out)
}

/// Search statistics of one [`optimize`] run.
#[derive(Clone, Debug, PartialEq)]
pub struct SearchStats {
    /// Sequential/concurrent cases R.2 and R.3 allow.
    pub cases: usize,
    /// Integer programs solved (a case infeasible over the restricted
    /// patterns is solved again over all of them).
    pub solves: usize,
    /// Largest pattern count of one integer program.
    pub patterns_max: usize,
    /// True when the restricted patterns sufficed (see the module doc).
    pub restricted: bool,
    /// Wall-clock time of the whole search.
    pub elapsed: Duration,
}

/// An optimal mapping, its cost and how it was found.
#[derive(Clone, Debug)]
pub struct Solution {
    /// The mapping; it satisfies R.1-R.5.
    pub mapping: Mapping,
    /// Its cost, computed by [`evaluate`].
    pub objective: Objective,
    /// How the search went.
    pub stats: SearchStats,
}

/// The patterns of one case: sets of classes one thread may serve, closed
/// under R.4; with `restricted`, only those without two independent
/// sequential classes. The empty pattern is always first.
fn patterns(problem: &Problem, seq: u64, restricted: bool) -> Result<Vec<u64>, OptimizerError> {
    let n = problem.model.len();
    let conflict: Vec<u64> = (0..n).map(|c| problem.conflict_mask(c)).collect();
    let seq_classes: Vec<usize> = (0..n).filter(|&c| seq & bit(c) != 0).collect();
    let conc_classes: Vec<usize> = (0..n).filter(|&c| seq & bit(c) == 0).collect();
    let mut out = Vec::new();
    // Sequential classes first: a concurrent class may join a pattern only
    // when every sequential class it conflicts with is in (R.4).
    let mut stack = vec![(0usize, 0u64)];
    let depth = seq_classes.len() + conc_classes.len();
    while let Some((i, p)) = stack.pop() {
        if i == depth {
            out.push(p);
            if out.len() > PATTERNS_MAX {
                return Err(OptimizerError::TooManyPatterns { max: PATTERNS_MAX });
            }
            continue;
        }
        let (c, include) = if i < seq_classes.len() {
            let c = seq_classes[i];
            let independent = seq & !conflict[c] & !bit(c);
            (c, !restricted || p & independent == 0)
        } else {
            let c = conc_classes[i - seq_classes.len()];
            (c, conflict[c] & seq & !p == 0)
        };
        if include {
            stack.push((i + 1, p | bit(c)));
        }
        stack.push((i + 1, p));
    }
    out.sort_unstable_by_key(|p| (p.count_ones() != 0, p.trailing_zeros(), *p));
    Ok(out)
}

/// Solves `problem` to proven optimality (see the module doc for how).
#[cfg(feature = "optimizer")]
pub fn optimize(problem: &Problem) -> Result<Solution, OptimizerError> {
    let start = std::time::Instant::now();
    let all_cases = cases(problem, CASES_MAX)?;
    let (nt, nc) = (problem.threads, problem.model.len());
    let dominance = (2 * nt - 1) * nc.saturating_sub(1) > 2;
    let mut stats = SearchStats {
        cases: all_cases.len(),
        solves: 0,
        patterns_max: 0,
        restricted: dominance,
        elapsed: Duration::ZERO,
    };
    let mut best: Option<(f64, Vec<bool>, Vec<u64>)> = None;
    for restricted in [true, false] {
        if restricted && !dominance {
            continue;
        }
        for &seq in &all_cases {
            let pats = patterns(problem, seq, restricted)?;
            stats.patterns_max = stats.patterns_max.max(pats.len());
            stats.solves += 1;
            if let Some((cost, masks)) = milp::solve_case(problem, seq, &pats)? {
                let seq_flags: Vec<bool> = (0..nc).map(|c| seq & bit(c) != 0).collect();
                if best.as_ref().map_or(true, |(b, _, _)| cost < *b - 1e-9) {
                    best = Some((cost, seq_flags, masks));
                }
            }
        }
        if best.is_some() {
            break;
        }
        stats.restricted = false;
    }
    // All classes sequential on every thread satisfies R.1-R.5, so the
    // unrestricted search always finds a solution.
    let (_, seq, masks) = best.ok_or_else(|| OptimizerError::Solver("no case is feasible".into()))?;
    let mapping = to_mapping(nt, &seq, &masks);
    let objective = evaluate_masks(problem, &seq, &masks);
    stats.elapsed = start.elapsed();
    Ok(Solution { mapping, objective, stats })
}

#[cfg(feature = "optimizer")]
mod milp {
    use super::{bit, Coefficients, OptimizerError, Problem};
    use good_lp::solvers::highs::highs;
    use good_lp::{variable, variables, Expression, ResolutionError, Solution as _, SolverModel, Variable};
    use psmr_model::ClassId;

    /// Solves one case over `patterns`; `None` when it is infeasible.
    /// Returns the cost and the thread mask of each class.
    pub(super) fn solve_case(
        problem: &Problem,
        seq: u64,
        patterns: &[u64],
    ) -> Result<Option<(f64, Vec<u64>)>, OptimizerError> {
        let n = problem.model.len();
        let nt = problem.threads as f64;
        let is_seq = |c: usize| seq & bit(c) != 0;
        let conflicts = |a: usize, b: usize| problem.model.conflicts(ClassId(a as u16), ClassId(b as u16));
        let seq_flags: Vec<bool> = (0..n).map(is_seq).collect();
        let k = Coefficients::new(problem, &seq_flags);
        let o3_unit = nt * n as f64;

        let mut vars = variables!();
        let x: Vec<Variable> = patterns.iter().map(|_| vars.add(variable().integer().min(0.0).max(nt))).collect();
        let threads_of = |c: usize| -> Expression {
            patterns.iter().zip(&x).filter(|(p, _)| **p & bit(c) != 0).map(|(_, v)| *v).sum()
        };
        let mut objective = Expression::from(0.0);
        for (p, v) in patterns.iter().zip(&x) {
            let mut cost = 0.0;
            for c in (0..n).filter(|&c| p & bit(c) != 0) {
                cost += k.o1[c];
                let independent = (0..n).filter(|&d| d != c && is_seq(c) && is_seq(d) && !conflicts(c, d));
                cost += independent.filter(|&d| p & bit(d) != 0).count() as f64 * o3_unit;
            }
            objective += cost * *v;
        }
        let mut constraints = vec![x.iter().copied().sum::<Expression>().eq(nt)];
        let mut deviation = Vec::new();
        for c in 0..n {
            // R.1.
            constraints.push(threads_of(c).geq(1.0));
            if !is_seq(c) {
                // O.2: d >= |w/wc - n/nt|.
                let d = vars.add(variable().min(0.0));
                let share = k.share[c];
                constraints.push((d + threads_of(c) * (1.0 / nt)).geq(share));
                constraints.push((d - threads_of(c) * (1.0 / nt)).geq(-share));
                deviation.push(d);
            }
        }
        for a in (0..n).filter(|&c| is_seq(c)) {
            for b in (a + 1..n).filter(|&c| is_seq(c) && conflicts(a, c)) {
                // R.5.
                let both: Expression = patterns
                    .iter()
                    .zip(&x)
                    .filter(|(p, _)| **p & bit(a) != 0 && **p & bit(b) != 0)
                    .map(|(_, v)| *v)
                    .sum();
                constraints.push(both.geq(1.0));
            }
        }
        objective += deviation.iter().copied().sum::<Expression>();
        let mut model = vars
            .minimise(objective)
            .using(highs)
            .set_option("output_flag", false)
            .set_threads(1)
            .set_mip_rel_gap(0.0)
            .and_then(|m| m.set_mip_abs_gap(0.0))
            .map_err(|e| OptimizerError::Solver(e.to_string()))?;
        for c in constraints {
            model.add_constraint(c);
        }
        let solution = match model.solve() {
            Ok(s) => s,
            Err(ResolutionError::Infeasible) => return Ok(None),
            Err(e) => return Err(OptimizerError::Solver(e.to_string())),
        };
        // good_lp reports HiGHS's "optimal" as `GapLimit` when the final gap
        // is a rounding residue above zero; with both gap tolerances at zero
        // HiGHS only stops early on a limit, which is `TimeLimit`.
        if matches!(solution.status(), good_lp::SolutionStatus::TimeLimit) {
            return Err(OptimizerError::Solver(format!("stopped before proving optimality: {:?}", solution.status())));
        }
        let mut masks = vec![0u64; n];
        let mut thread = 0usize;
        for (p, v) in patterns.iter().zip(&x) {
            let count = solution.value(*v).round() as usize;
            for _ in 0..count {
                for (c, m) in masks.iter_mut().enumerate() {
                    if p & bit(c) != 0 {
                        *m |= bit(thread);
                    }
                }
                thread += 1;
            }
        }
        if thread != problem.threads {
            return Err(OptimizerError::Solver(format!("solution uses {thread} threads, not {}", problem.threads)));
        }
        let cost = super::evaluate_masks(problem, &seq_flags, &masks).total();
        Ok(Some((cost, masks)))
    }
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
    let conflict: Vec<u64> = (0..n).map(|c| problem.conflict_mask(c)).collect();
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
    fn patterns_are_r4_closed() {
        let p = Problem::new(rw(), 2).unwrap();
        // R concurrent, W sequential: a thread with R must have W.
        let mut got = patterns(&p, 0b10, false).unwrap();
        assert_eq!(got[0], 0, "the empty pattern comes first");
        got.sort_unstable();
        assert_eq!(got, vec![0, 0b10, 0b11]);
    }
}
