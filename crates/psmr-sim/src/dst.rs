//! Deterministic simulation testing: runs the cluster simulation over
//! many seeds and judges each run.
//!
//! A seed's run is judged by the simulation's own checks (agreement on the
//! applied entries, equal states, exactly-once execution of writes,
//! convergence once the faults heal, no message refused by the guard) and
//! by the linearizability of its clients' history, converted here to a
//! [`history::Operation`] list and given to
//! [`history::check_linearizable`]. A history too hard for the checker
//! within its state bound is counted apart: neither a pass nor a
//! violation. A panic inside a run (raft-rs's assertions, the
//! simulation's own) is a violation too.
//!
//! Every run depends on its seed and configuration only, so a violation is
//! replayed with `psmr simulate --replay SEED` (same `--faults` and
//! `--steps`), which prints the run's trace.

use crate::config::SimConfig;
use crate::outcome::{FaultCounts, OpResult, OpStatus, SimError, SimOp, SimOutcome};
use psmr_harness::history::{self, OpKind, Operation, Status, Verdict};
use serde::Serialize;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;
use thiserror::Error;

/// The states the linearizability checker may explore per key, by default:
/// generous, so that too-hard histories stay rare.
pub const MAX_STATES_DEFAULT: usize = 5_000_000;

/// Errors running the simulation (not violations: those are in the
/// report).
#[derive(Debug, Error)]
pub enum DstError {
    /// The simulation cannot run with this configuration.
    #[error(transparent)]
    Sim(#[from] SimError),
    /// Nothing to run.
    #[error("no seeds to run")]
    NoSeeds,
}

/// Which seeds to run, and how.
#[derive(Clone, Debug)]
pub struct DstConfig {
    /// The first seed.
    pub first_seed: u64,
    /// Seeds to run: `first_seed`, `first_seed + 1`, ...
    pub seeds: u64,
    /// Threads running seeds at once (at least 1).
    pub jobs: usize,
    /// The simulation of each seed.
    pub sim: SimConfig,
    /// The linearizability checker's bound per key.
    pub max_states: usize,
    /// Stop at the first violation.
    pub stop_on_violation: bool,
}

impl Default for DstConfig {
    fn default() -> Self {
        Self {
            first_seed: 0,
            seeds: 100,
            jobs: std::thread::available_parallelism().map_or(1, |n| n.get()),
            sim: SimConfig::default(),
            max_states: MAX_STATES_DEFAULT,
            stop_on_violation: false,
        }
    }
}

/// One violation, with the seed that replays it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SeedViolation {
    /// The seed.
    pub seed: u64,
    /// `divergence`, `state-mismatch`, `double-execution`,
    /// `no-convergence`, `guard-refusal`, `stopped` (the simulation's
    /// checks), `not-linearizable` or `panic`.
    pub kind: String,
    /// What happened.
    pub description: String,
}

/// The verdict on one seed.
#[derive(Clone, Debug)]
pub struct SeedResult {
    /// The seed.
    pub seed: u64,
    /// The run, unless it panicked.
    pub outcome: Option<SimOutcome>,
    /// Its violations (empty: it passed, or its history was too hard).
    pub violations: Vec<SeedViolation>,
    /// The history was too hard to check within the bound (and nothing
    /// else was wrong).
    pub too_hard: bool,
}

/// The report on many seeds.
#[derive(Clone, Debug, Default, Serialize)]
pub struct DstReport {
    /// The first seed run.
    pub first_seed: u64,
    /// Seeds run.
    pub seeds_run: u64,
    /// Seeds whose run passed every check.
    pub passed: u64,
    /// Seeds with at least one violation.
    pub failed: u64,
    /// Seeds whose history was too hard to check (not counted as passed).
    pub too_hard: u64,
    /// Those seeds.
    pub too_hard_seeds: Vec<u64>,
    /// Violations, by seed (the first few per seed).
    pub violations: Vec<SeedViolation>,
    /// Wall-clock time, s.
    pub elapsed_s: f64,
    /// Seeds per second of wall-clock time.
    pub seeds_per_s: f64,
    /// Faults injected, over all seeds.
    pub faults: FaultCounts,
    /// Client operations answered, over all seeds.
    pub ops_ok: u64,
    /// Writes left unanswered.
    pub ops_unknown: u64,
    /// Reads abandoned.
    pub ops_fail: u64,
    /// Retried commands answered from a reply cache, over all replicas.
    pub cache_answers: u64,
    /// Reads leaders served without the log (ReadIndex).
    pub reads_without_log: u64,
    /// Snapshots from a leader restored, over all seeds.
    pub snapshots_installed: u64,
    /// Their chunks delivered.
    pub snapshot_chunks: u64,
    /// Snapshot transfer messages refused.
    pub transfer_refusals: u64,
    /// Log entries applied (highest index per seed, summed).
    pub entries: u64,
    /// Simulated time, s, over all seeds.
    pub sim_s: f64,
}

impl DstReport {
    /// No violation.
    pub fn clean(&self) -> bool {
        self.failed == 0
    }

    /// The seeds with a violation, in order.
    pub fn failed_seeds(&self) -> Vec<u64> {
        let mut seeds: Vec<u64> = self.violations.iter().map(|v| v.seed).collect();
        seeds.dedup();
        seeds
    }

    /// The report for people.
    pub fn text(&self) -> String {
        let f = &self.faults;
        let mut s = format!(
            "{} seeds ({}..={}) in {:.1} s: {:.1} seeds/s, {:.0} simulated s\n\
             passed {}, failed {}, too hard to check {}\n\
             operations: {} answered, {} writes unknown, {} reads abandoned; {} answered from a reply cache, \
             {} reads without the log; {} log entries applied\n\
             snapshots: {} restored from a leader, sent in {} chunks; {} transfer messages refused\n\
             faults: {} packets lost, {} duplicated, {} delayed, {} cut by {} partitions and {} one-way ones; \
             {} crashes ({} torn), {} restarts, {} pauses; {} stops on a full disk, {} damaged logs repaired; {} \
             membership changes\n",
            self.seeds_run,
            self.first_seed,
            (self.first_seed + self.seeds_run).saturating_sub(1),
            self.elapsed_s,
            self.seeds_per_s,
            self.sim_s,
            self.passed,
            self.failed,
            self.too_hard,
            self.ops_ok,
            self.ops_unknown,
            self.ops_fail,
            self.cache_answers,
            self.reads_without_log,
            self.entries,
            self.snapshots_installed,
            self.snapshot_chunks,
            self.transfer_refusals,
            f.lost,
            f.duplicated,
            f.delayed,
            f.cut,
            f.partitions,
            f.one_way_partitions,
            f.crashes,
            f.torn_crashes,
            f.restarts,
            f.pauses,
            f.full_stops,
            f.repairs,
            f.member_changes,
        );
        if !self.too_hard_seeds.is_empty() {
            let shown: Vec<String> = self.too_hard_seeds.iter().take(20).map(u64::to_string).collect();
            s += &format!("too hard: seeds {}\n", shown.join(", "));
        }
        for v in &self.violations {
            s += &format!("VIOLATION seed {}: {}: {}\n", v.seed, v.kind, v.description);
        }
        s
    }
}

/// The history of a run as the checker reads it: values as text, times in
/// ns.
pub fn to_operations(history: &[SimOp]) -> Vec<Operation> {
    history
        .iter()
        .map(|o| {
            let result = match o.result {
                Some(OpResult::Read(Some(v))) => serde_json::Value::String(v.to_string()),
                Some(OpResult::Read(None)) => serde_json::Value::Null,
                Some(OpResult::Write(existed)) => serde_json::Value::Bool(existed),
                // Fits no operation: the checker cannot place it.
                Some(OpResult::Garbled) => serde_json::Value::String("garbled reply".into()),
                None => serde_json::Value::Null,
            };
            Operation {
                client: o.client,
                op: match o.kind {
                    crate::outcome::OpKind::Read => OpKind::Read,
                    crate::outcome::OpKind::Write => OpKind::Write,
                },
                key: o.key.to_string(),
                value: o.value.map(|v| v.to_string()),
                result,
                invoke_ns: o.invoke_us * 1_000,
                complete_ns: o.complete_us * 1_000,
                status: match o.status {
                    OpStatus::Ok => Status::Ok,
                    OpStatus::Fail => Status::Fail,
                    OpStatus::Unknown => Status::Unknown,
                },
            }
        })
        .collect()
}

/// Runs seed `seed` and judges it. A configuration the simulation refuses
/// is an error; everything that goes wrong inside the run is a violation.
pub fn run_seed(seed: u64, config: &SimConfig, max_states: usize) -> Result<SeedResult, DstError> {
    config.validate()?;
    let ran = catch_unwind(AssertUnwindSafe(|| crate::run::run(seed, config)));
    let outcome = match ran {
        Ok(Ok(outcome)) => outcome,
        Ok(Err(e)) => {
            // A replica that cannot restart from its own disk is a bug of
            // the system under test, not of the configuration.
            let v = SeedViolation { seed, kind: "stopped".into(), description: e.to_string() };
            return Ok(SeedResult { seed, outcome: None, violations: vec![v], too_hard: false });
        }
        Err(payload) => {
            let v = SeedViolation { seed, kind: "panic".into(), description: panic_message(payload.as_ref()) };
            return Ok(SeedResult { seed, outcome: None, violations: vec![v], too_hard: false });
        }
    };
    let mut violations: Vec<SeedViolation> = outcome
        .violations
        .iter()
        .map(|v| SeedViolation { seed, kind: v.kind.name().into(), description: v.description.clone() })
        .collect();
    let ops = to_operations(&outcome.history);
    let mut too_hard = false;
    match history::check_linearizable(&ops, max_states) {
        Verdict::Linearizable => {}
        Verdict::Violation { key, ops: stuck } => {
            let shown: Vec<String> = stuck
                .iter()
                .take(4)
                .map(|&i| {
                    let o = &outcome.history[i];
                    format!(
                        "client {} seq {} {:?} {:?} -> {:?} ({:?}, {}-{} µs)",
                        o.client, o.seq, o.kind, o.value, o.result, o.status, o.invoke_us, o.complete_us
                    )
                })
                .collect();
            violations.push(SeedViolation {
                seed,
                kind: "not-linearizable".into(),
                description: format!(
                    "key {key}: no linearization places {} operation(s), e.g. {}",
                    stuck.len(),
                    shown.join("; ")
                ),
            });
        }
        Verdict::TooHard { .. } => too_hard = true,
    }
    Ok(SeedResult { seed, outcome: Some(outcome), too_hard: too_hard && violations.is_empty(), violations })
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic with a non-text payload".into()
    }
}

/// Runs the seeds of `config` on `config.jobs` threads; `progress` is
/// called after each seed (from the thread that ran it) with the seeds
/// done so far.
pub fn run(config: &DstConfig, progress: impl Fn(u64, &SeedResult) + Sync) -> Result<DstReport, DstError> {
    config.sim.validate()?;
    if config.seeds == 0 {
        return Err(DstError::NoSeeds);
    }
    let start = Instant::now();
    let next = AtomicU64::new(0);
    let done = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let report = Mutex::new(DstReport { first_seed: config.first_seed, ..DstReport::default() });
    let jobs = config.jobs.clamp(1, 256);
    let failure: Mutex<Option<DstError>> = Mutex::new(None);
    std::thread::scope(|scope| {
        for _ in 0..jobs {
            scope.spawn(|| loop {
                if stop.load(Ordering::Relaxed) {
                    return;
                }
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= config.seeds {
                    return;
                }
                let seed = config.first_seed.wrapping_add(i);
                let result = match run_seed(seed, &config.sim, config.max_states) {
                    Ok(r) => r,
                    Err(e) => {
                        stop.store(true, Ordering::Relaxed);
                        *failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                        return;
                    }
                };
                if !result.violations.is_empty() && config.stop_on_violation {
                    stop.store(true, Ordering::Relaxed);
                }
                {
                    let mut r = report.lock().unwrap_or_else(|p| p.into_inner());
                    r.seeds_run += 1;
                    if !result.violations.is_empty() {
                        r.failed += 1;
                        r.violations.extend(result.violations.iter().cloned());
                    } else if result.too_hard {
                        r.too_hard += 1;
                        r.too_hard_seeds.push(seed);
                    } else {
                        r.passed += 1;
                    }
                    if let Some(o) = &result.outcome {
                        r.faults.add(&o.faults);
                        r.ops_ok += o.stats.ops_ok;
                        r.ops_unknown += o.stats.ops_unknown;
                        r.ops_fail += o.stats.ops_fail;
                        r.cache_answers += o.stats.cache_answers;
                        r.reads_without_log += o.stats.reads_without_log;
                        r.snapshots_installed += o.stats.snapshots_installed;
                        r.snapshot_chunks += o.stats.snapshot_chunks;
                        r.transfer_refusals += o.stats.transfer_refusals;
                        r.entries += o.stats.applied;
                        r.sim_s += o.stats.sim_ms as f64 / 1_000.0;
                    }
                }
                let n = done.fetch_add(1, Ordering::Relaxed) + 1;
                progress(n, &result);
            });
        }
    });
    if let Some(e) = failure.into_inner().unwrap_or_else(|p| p.into_inner()) {
        return Err(e);
    }
    let mut report = report.into_inner().unwrap_or_else(|p| p.into_inner());
    report.violations.sort_by_key(|v| v.seed);
    report.too_hard_seeds.sort_unstable();
    report.elapsed_s = start.elapsed().as_secs_f64();
    report.seeds_per_s = report.seeds_run as f64 / report.elapsed_s.max(1e-9);
    Ok(report)
}
