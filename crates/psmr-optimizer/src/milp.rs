//! One case's integer program over thread patterns, solved by HiGHS.

use super::case::{ones, Case};
use super::{bit, OptimizerError, Problem, PATTERNS_MAX};
use good_lp::solvers::highs::highs;
use good_lp::{
    variable, variables, Constraint, Expression, ProblemVariables, ResolutionError, Solution as _, SolutionStatus,
    SolverModel, Variable,
};
use std::time::Instant;

/// Slopes of `f_d` smaller than this are rounding noise.
const FLAT: f64 = 1e-12;

/// The share of the time left that HiGHS's own limit is set to.
const TIME_SHARE: f64 = 0.9;

/// Why [`patterns`] gave up.
#[derive(Debug)]
pub(super) enum NoPatterns {
    /// The deadline passed.
    OutOfTime,
    /// More than [`PATTERNS_MAX`]: too large a program to solve in time.
    TooMany,
}

/// What one solve established.
pub(super) enum Outcome {
    /// The cheapest mapping of the case with at most the given sharing,
    /// proven: its cost and each class's thread mask.
    Optimal(f64, Vec<u64>),
    /// No mapping of the case with at most the given sharing costs less
    /// than the cutoff.
    NothingBelow,
    /// Time ran out first; the best mapping found, if any.
    Stopped(Option<(f64, Vec<u64>)>),
}

/// The patterns a mapping of `case` sharing at most `budget` pairs can use,
/// smallest first. A thread with pattern `p` shares `indep(p)` pairs, and
/// the other `threads - 1` threads share at least: the pairs forced by the
/// concurrent classes `p` cannot serve ([`Case::forced_pairs`]), and the
/// pigeonhole bound of the case's blocks that `p` does not serve whole
/// (with one thread, `p` must serve every class). Without `filter`, only
/// the budget on `p` itself is applied.
pub(super) fn patterns(
    case: &Case,
    threads: usize,
    budget: u64,
    filter: bool,
    deadline: Option<Instant>,
) -> Result<Vec<u64>, NoPatterns> {
    if threads == 1 {
        return Ok(if case.sharing(case.seq) <= budget { vec![case.seq] } else { Vec::new() });
    }
    let classes: Vec<usize> = case.seq_classes().collect();
    let mut out = Vec::new();
    let mut leaves = 0;
    let mut stack = vec![(0usize, 0u64, 0u64)];
    while let Some((i, p, shared)) = stack.pop() {
        if i == classes.len() {
            leaves += 1;
            if leaves > 4 * PATTERNS_MAX {
                return Err(NoPatterns::TooMany);
            }
            if leaves % 4096 == 0 && past(deadline) {
                return Err(NoPatterns::OutOfTime);
            }
            if filter && shared.saturating_add(residual_sharing(case, p, threads)) > budget {
                continue;
            }
            out.push(p);
            if out.len() > PATTERNS_MAX {
                return Err(NoPatterns::TooMany);
            }
            continue;
        }
        let c = classes[i];
        let with = shared + u64::from((p & case.indep[c]).count_ones());
        if with <= budget {
            stack.push((i + 1, p | bit(c), with));
        }
        stack.push((i + 1, p, shared));
    }
    out.sort_unstable_by_key(|p| (p.count_ones(), *p));
    Ok(out)
}

/// Lower bound on the pairs the other `threads - 1` threads share when one
/// thread has pattern `p` (`u64::MAX` when they cannot serve what they
/// must).
fn residual_sharing(case: &Case, p: u64, threads: usize) -> u64 {
    let forced = case.forced_pairs(|need| need & !p != 0);
    let rest: Vec<u64> = case.blocks.iter().copied().filter(|&b| b & !p != 0).collect();
    case.pigeonhole(&rest, threads - 1).map_or(u64::MAX, |r| r.max(forced))
}

/// Whether `deadline` has passed (`None` never does).
pub(super) fn past(deadline: Option<Instant>) -> bool {
    seconds_until(deadline) <= 0.0
}

/// Seconds until `deadline`, infinite for `None`.
pub(super) fn seconds_until(deadline: Option<Instant>) -> f64 {
    deadline.map_or(f64::INFINITY, |d| d.saturating_duration_since(Instant::now()).as_secs_f64())
}

/// Limits of one solve.
pub(super) struct Bounds {
    /// Most pairs of independent sequential classes over all threads.
    pub sharing: u64,
    /// Only mappings cheaper than this matter (may be infinite).
    pub cutoff: f64,
    /// When to give up; HiGHS gets what is left when it starts.
    pub deadline: Option<Instant>,
}

/// One case's integer program, as `good_lp` builds it.
struct Program {
    vars: ProblemVariables,
    objective: Expression,
    constraints: Vec<Constraint>,
    /// Threads per pattern.
    x: Vec<Variable>,
    /// Threads per concurrent class.
    counts: Vec<Variable>,
}

/// Solves `case` over `patterns` within `bounds`.
pub(super) fn solve(
    problem: &Problem,
    case: &Case,
    patterns: &[u64],
    bounds: &Bounds,
) -> Result<Outcome, OptimizerError> {
    if patterns.is_empty() {
        // No thread can be given a pattern (and HiGHS rejects a program
        // that may have no variables at all).
        return Ok(Outcome::NothingBelow);
    }
    let Program { vars, objective, constraints, x, counts } = program(problem, case, patterns, bounds.sharing);
    let mut model = vars
        .minimise(objective)
        .using(highs)
        .set_option("output_flag", false)
        .set_threads(1)
        .set_mip_rel_gap(0.0)
        .and_then(|m| m.set_mip_abs_gap(0.0))
        .map_err(|e| OptimizerError::Solver(e.to_string()))?;
    if bounds.cutoff.is_finite() {
        model = model.set_option("objective_bound", bounds.cutoff);
    }
    // MIP presolve and the feasibility-jump heuristic run before HiGHS
    // looks at its clock much, and on programs with many patterns take
    // seconds past the time limit; on these small programs the solve is
    // faster without them (measured on every built-in model).
    model = model.set_option("presolve", "off").set_option("mip_heuristic_run_feasibility_jump", false);
    for c in constraints {
        model.add_constraint(c);
    }
    // Building the program takes time too: HiGHS gets only what is left.
    let seconds = seconds_until(bounds.deadline);
    if seconds <= 0.0 {
        return Ok(Outcome::Stopped(None));
    }
    if seconds.is_finite() {
        // HiGHS reads its clock only now and then: leave it some headroom.
        model = model.set_time_limit(seconds * TIME_SHARE);
    }
    let solution = match model.solve() {
        Ok(s) => s,
        Err(ResolutionError::Infeasible) => return Ok(Outcome::NothingBelow),
        // HiGHS stopped on its time limit before finding any mapping.
        Err(ResolutionError::Other("NoSolutionFound")) => return Ok(Outcome::Stopped(None)),
        Err(e) => return Err(OptimizerError::Solver(e.to_string())),
    };
    let threads: Vec<usize> = x.iter().map(|v| solution.value(*v).round() as usize).collect();
    let n: Vec<usize> = counts.iter().map(|v| solution.value(*v).round() as usize).collect();
    let masks = masks(problem, case, patterns, &threads, &n)?;
    let cost = super::evaluate_masks(problem, &case.flags, &masks).total();
    // good_lp reports HiGHS's "optimal" as `GapLimit` when the final gap
    // is a rounding residue above zero; with both gap tolerances at zero
    // HiGHS only stops early on a limit, which is `TimeLimit`.
    Ok(match solution.status() {
        SolutionStatus::TimeLimit => Outcome::Stopped(Some((cost, masks))),
        _ => Outcome::Optimal(cost, masks),
    })
}

/// The program of the module doc for `case` over `patterns`, sharing at
/// most `sharing` pairs.
fn program(problem: &Problem, case: &Case, patterns: &[u64], sharing: u64) -> Program {
    let nt = problem.threads as f64;
    let mut vars = variables!();
    let x: Vec<Variable> = patterns.iter().map(|_| vars.add(variable().integer().min(0.0).max(nt))).collect();
    let on =
        |set: u64| -> Expression { patterns.iter().zip(&x).filter(|(p, _)| *p & set == set).map(|(_, v)| *v).sum() };
    let mut objective: Expression = patterns
        .iter()
        .zip(&x)
        .map(|(&p, &v)| {
            let o1a: f64 = ones(p).map(|c| case.seq_cost[c]).sum();
            (o1a + case.pair_cost * case.sharing(p) as f64) * v
        })
        .sum();
    let mut constraints = vec![x.iter().copied().sum::<Expression>().eq(nt)];
    // R.1 for sequential classes, R.5.
    constraints.extend(case.seq_classes().map(|c| on(bit(c)).geq(1.0)));
    constraints.extend(case.pairs.iter().map(|&(a, b)| on(bit(a) | bit(b)).geq(1.0)));
    let shared: Expression = patterns.iter().zip(&x).map(|(&p, &v)| case.sharing(p) as f64 * v).sum();
    constraints.push(shared.leq(sharing as f64));
    let mut counts = Vec::with_capacity(case.concurrent.len());
    for d in &case.concurrent {
        let n = vars.add(variable().integer().min(1.0).max(d.cost.len() as f64));
        // f_d is convex: its chords bound it from below, and the solver
        // sits on the lowest, f_d(n) itself.
        let f = vars.add(variable());
        for (slope, at) in chords(&d.cost) {
            // A flat chord leaves `n` out rather than hand HiGHS a zero.
            constraints.push(if slope == 0.0 { Expression::from(f).geq(at) } else { (f - slope * n).geq(at) });
        }
        // R.1 and R.4: n[d] threads that serve N(d).
        constraints.push((on(d.need) - n).geq(0.0));
        objective += f;
        counts.push(n);
    }
    Program { vars, objective, constraints, x, counts }
}

/// The lines through consecutive points `(n, f(n))`, `(n + 1, f(n + 1))`
/// of `f` (given as `f(n)` at index `n - 1`) as `(slope, intercept at 0)`,
/// or the constant `f(1)` when `f` has one point: for a convex `f`, the
/// largest of them at an integer `n` is `f(n)`.
fn chords(cost: &[f64]) -> impl Iterator<Item = (f64, f64)> + '_ {
    (0..cost.len().saturating_sub(1))
        .map(move |i| {
            let slope = cost[i + 1] - cost[i];
            // Rounding leaves ±1e-17 where `f` is flat; HiGHS would drop
            // such a coefficient with a warning. Flat it is.
            let slope = if slope.abs() < FLAT { 0.0 } else { slope };
            (slope, cost[i] - slope * (i + 1) as f64)
        })
        .chain(std::iter::once((0.0, cost[cost.len() - 1])).filter(move |_| cost.len() == 1))
}

/// Each class's thread mask: `threads[i]` threads with `patterns[i]`, and
/// concurrent class `d` on the first `n[d]` threads that serve `N(d)`.
fn masks(
    problem: &Problem,
    case: &Case,
    patterns: &[u64],
    threads: &[usize],
    n: &[usize],
) -> Result<Vec<u64>, OptimizerError> {
    let mut thread_pattern = Vec::with_capacity(problem.threads);
    for (&p, &count) in patterns.iter().zip(threads) {
        thread_pattern.extend(std::iter::repeat(p).take(count));
    }
    if thread_pattern.len() != problem.threads {
        return Err(OptimizerError::Solver(format!(
            "solution uses {} threads, not {}",
            thread_pattern.len(),
            problem.threads
        )));
    }
    let mut masks = vec![0u64; case.flags.len()];
    for (t, &p) in thread_pattern.iter().enumerate() {
        ones(p).for_each(|c| masks[c] |= bit(t));
    }
    for (d, &count) in case.concurrent.iter().zip(n) {
        let serving = (0..problem.threads).filter(|&t| thread_pattern[t] & d.need == d.need);
        masks[d.class] = serving.take(count).fold(0, |m, t| m | bit(t));
        if masks[d.class].count_ones() as usize != count {
            return Err(OptimizerError::Solver(format!("concurrent class {} lacks threads", d.class)));
        }
    }
    Ok(masks)
}
