//! # psmr-sched-bench: the scheduler benchmark (`psmr sched-bench`)
//!
//! Schedulers measured in one process, with no network and no consensus
//! in the way: a workload for a service and class model is generated and
//! cut into ordered batches before the clock starts, and the same batches
//! are fed to each scheduler in turn. Every run starts from a fresh
//! service and ends with the service's state digest and a digest of all
//! replies; a parallel scheduler that disagrees with `sequential` is an
//! error, not a number. Where parallel execution can gain on a machine,
//! this is where it shows first (end-to-end runs share the cores with
//! the replicas' other stages and the clients).
//!
//! In the guide: `docs/design.md` places this crate among the others;
//! `docs/benchmarks.md`: `psmr sched-bench`.

use psmr_model::{Batch, ClassModel, Command, Mapping, MappingError, Service, BITMAP_BITS_DEFAULT, BITMAP_BITS_MAX};
use psmr_sched::optimizer::{self, OptimizerError, Problem, Weighting};
use psmr_sched::{DigestSink, SchedConfig, SchedError, SchedulerKind, QUEUE_DEPTH_DEFAULT};
use psmr_services::{kv, list, Cost, WorkloadConfig, WorkloadError};
use serde::Serialize;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use thiserror::Error;

/// Most commands one batch may hold.
pub const BATCH_MAX: usize = 100_000;

/// Most commands one benchmark run may generate (they are all in memory).
pub const COMMANDS_MAX: usize = 50_000_000;

/// Most repetitions of each variant.
pub const REPEAT_MAX: usize = 100;

/// Which service to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServiceKind {
    /// The key-value store.
    Kv,
    /// The sharded linked list.
    List,
}

impl fmt::Display for ServiceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ServiceKind::Kv => "kv",
            ServiceKind::List => "list",
        })
    }
}

impl FromStr for ServiceKind {
    type Err = BenchError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "kv" => Ok(ServiceKind::Kv),
            "list" => Ok(ServiceKind::List),
            other => Err(BenchError::Config(format!("unknown service {other:?} (known: kv, list)"))),
        }
    }
}

/// Where the early schedulers' mapping comes from.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum MappingSource {
    /// The documented default of the class model.
    #[default]
    Default,
    /// The optimizer's mapping (003 Alg. 3, `psmr_sched::optimizer`) for
    /// class weights equal to the workload's class frequencies, with the
    /// given weighting of O.1.
    Optimal(Weighting),
    /// The naive mapping of 003 §6.5 for the same weights.
    Naive,
    /// A JSON file (`{"classes":[{"name":..,"mode":..,"threads":[..]}]}`).
    File(PathBuf),
    /// The compact form `R=conc:0,1;W=seq:0-1`.
    Spec(String),
}

impl MappingSource {
    /// The sources of several `--mapping` values: a spec (which has commas
    /// of its own) or a file is one source; a comma-separated list of
    /// keywords (`naive,optimal`) is several.
    pub fn parse_list(values: &[String]) -> Result<Vec<Self>, BenchError> {
        let keyword = |s: &str| s.trim().starts_with("optimal") || matches!(s.trim(), "default" | "naive");
        let mut out = Vec::new();
        for v in values {
            if v.contains(',') && v.split(',').all(keyword) {
                for s in v.split(',') {
                    out.push(s.trim().parse()?);
                }
            } else {
                out.push(v.parse()?);
            }
        }
        Ok(out)
    }

    /// The name reports show: `default`, `optimal`, `naive`, the file, or
    /// the spec.
    pub fn label(&self) -> String {
        match self {
            MappingSource::Default => "default".into(),
            MappingSource::Optimal(Weighting::AsWritten) => "optimal".into(),
            MappingSource::Optimal(w) => format!("optimal:{w}"),
            MappingSource::Naive => "naive".into(),
            MappingSource::File(path) => path.display().to_string(),
            MappingSource::Spec(spec) => spec.clone(),
        }
    }
}

impl FromStr for MappingSource {
    type Err = BenchError;
    /// `default`, `optimal` (O.1 as written), `optimal:as-written`,
    /// `optimal:total`, `naive`, a spec containing `=`, or else a file path.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "default" => MappingSource::Default,
            "optimal" | "optimal:as-written" => MappingSource::Optimal(Weighting::AsWritten),
            "optimal:total" => MappingSource::Optimal(Weighting::Total),
            "naive" => MappingSource::Naive,
            _ if s.starts_with("optimal:") => {
                return Err(BenchError::Config(format!(
                    "unknown mapping {s:?}: the optimizer's weightings are optimal:as-written and optimal:total"
                )))
            }
            _ if s.contains('=') => MappingSource::Spec(s.to_string()),
            _ => MappingSource::File(PathBuf::from(s)),
        })
    }
}

/// Everything a benchmark invocation needs.
#[derive(Clone, Debug)]
pub struct SchedBenchConfig {
    /// Service to run.
    pub service: ServiceKind,
    /// Class model name (see `psmr_services::list::ListModel` and `kv::KvModel`).
    pub model: String,
    /// Schedulers to compare, in order.
    pub schedulers: Vec<SchedulerKind>,
    /// Worker counts to run each parallel scheduler with.
    pub workers: Vec<usize>,
    /// Commands per batch.
    pub batch: usize,
    /// Execution cost of a command.
    pub cost: Cost,
    /// List service: entries per shard, overriding the cost's default.
    pub list_size: Option<usize>,
    /// The workload (commands, seed, mix, shards, skew, spread, keys).
    pub workload: WorkloadConfig,
    /// Bits of each batch bitmap.
    pub bitmap_bits: u32,
    /// Schedulers with a dependency graph: its bounds, in nodes; each such
    /// scheduler runs with each. Empty gives each scheduler its own default
    /// ([`SchedulerKind::graph_max_default`]).
    pub graph_max: Vec<usize>,
    /// Work stealing: the longest pauses between fruitless steal rounds to
    /// compare (`psmr_sched::SchedConfig::steal_retry_max`); each stealing
    /// scheduler runs with each. Empty gives the default.
    pub steal_retry_max: Vec<std::time::Duration>,
    /// Early: per-worker queue bound, in batches.
    pub queue_depth: usize,
    /// Early schedulers: where mappings come from. Each scheduler that
    /// needs a mapping runs once with each, so that mappings compare side
    /// by side in one invocation.
    pub mappings: Vec<MappingSource>,
    /// Runs of each variant; the report gives the median.
    pub repeat: usize,
    /// `early-busywait`: spin budget of a waiting thread (`None`: automatic,
    /// see `psmr_sched::SchedConfig::spin`).
    pub spin: Option<u32>,
    /// Sample per-worker metrics every this many milliseconds (`None`: off).
    pub metrics_interval_ms: Option<u64>,
    /// Work stealing: victim selection (`None`: each scheduler's default,
    /// see `psmr_sched::SchedConfig::victims`).
    pub victims: Option<psmr_sched::Victims>,
    /// `late-*-pool`: the psmr-rt pool's policy.
    pub pool: psmr_rt::Policy,
    /// Run every run in a child process of its own (see [`Isolate`]);
    /// `None`: all in this process.
    pub isolate: Option<Isolate>,
    /// Run only variant `i` of the plan, once (what an isolated child
    /// does).
    pub only: Option<usize>,
}

/// How to run one variant in a child process: `program` with `args`, then
/// `--only I --repeat 1 --json`, prints that run's report as JSON lines
/// (`psmr sched-bench` re-runs itself).
///
/// Why: runs that share a process do not start equal. The list service
/// allocates its nodes as it goes; a run that follows others allocates
/// them in memory the earlier runs fragmented, and walking its lists then
/// misses the cache more: on the 2-shard list at moderate cost, a
/// scheduler ran 20 % slower third in line than alone. A fresh process
/// per run gives every variant the same start.
#[derive(Clone, Debug)]
pub struct Isolate {
    /// The program (`psmr`).
    pub program: std::path::PathBuf,
    /// Its arguments up to the variant's.
    pub args: Vec<String>,
}

impl Default for SchedBenchConfig {
    fn default() -> Self {
        Self {
            service: ServiceKind::Kv,
            model: "readers-writers".into(),
            schedulers: SchedulerKind::ALL.to_vec(),
            workers: vec![1, 2],
            batch: 50,
            cost: Cost::Light,
            list_size: None,
            workload: WorkloadConfig { commands: 1_000_000, ..WorkloadConfig::default() },
            bitmap_bits: BITMAP_BITS_DEFAULT,
            graph_max: Vec::new(),
            steal_retry_max: Vec::new(),
            queue_depth: QUEUE_DEPTH_DEFAULT,
            mappings: vec![MappingSource::Default],
            repeat: 1,
            spin: None,
            metrics_interval_ms: None,
            victims: None,
            pool: psmr_rt::Policy::FifoSlot,
            isolate: None,
            only: None,
        }
    }
}

/// Benchmark failures.
#[derive(Debug, Error)]
pub enum BenchError {
    /// A parameter is out of range or unknown.
    #[error("{0}")]
    Config(String),
    /// The workload parameters are invalid.
    #[error(transparent)]
    Workload(#[from] WorkloadError),
    /// The mapping is invalid.
    #[error("invalid mapping: {0}")]
    Mapping(#[from] MappingError),
    /// The optimizer failed.
    #[error("mapping optimizer: {0}")]
    Optimizer(#[from] OptimizerError),
    /// The mapping file cannot be read.
    #[error("cannot read mapping file {path}: {source}")]
    MappingFile {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A scheduler failed.
    #[error("{scheduler} with {workers} workers failed: {source}")]
    Scheduler {
        /// Which scheduler.
        scheduler: SchedulerKind,
        /// With how many workers.
        workers: usize,
        /// Why.
        source: SchedError,
    },
    /// A scheduler produced other replies or another state than the first
    /// run. This is a correctness bug, never noise.
    #[error(
        "{scheduler} with {workers} workers diverged from {reference}: state {digest} vs {ref_digest}, replies {reply_digest} vs {ref_reply_digest}"
    )]
    Diverged {
        /// Diverging scheduler.
        scheduler: SchedulerKind,
        /// Its workers.
        workers: usize,
        /// The reference run's scheduler.
        reference: SchedulerKind,
        /// Its state digest.
        digest: String,
        /// The reference state digest.
        ref_digest: String,
        /// Its reply digest.
        reply_digest: String,
        /// The reference reply digest.
        ref_reply_digest: String,
    },
}

/// One scheduler run: the JSON line of `psmr sched-bench --json`.
#[derive(Clone, Debug, Serialize)]
pub struct RunReport {
    /// Scheduler name.
    pub scheduler: String,
    /// Worker threads (1 for `sequential`).
    pub workers: usize,
    /// Commands executed.
    pub commands: usize,
    /// Wall-clock time from the scheduler's creation to its last reply, in
    /// seconds: the median over `runs` runs.
    pub elapsed_s: f64,
    /// Runs behind `elapsed_s` (`--repeat`).
    pub runs: usize,
    /// Fastest run, seconds.
    pub elapsed_min_s: f64,
    /// Slowest run, seconds.
    pub elapsed_max_s: f64,
    /// Commands per second.
    pub throughput_cps: f64,
    /// Service state digest after the run (hex).
    pub digest: String,
    /// Digest of all (client, seq, reply) triples (hex).
    pub reply_digest: String,
    /// Throughput relative to `sequential` in the same invocation, if it ran.
    pub vs_sequential: Option<f64>,
    /// Throughput relative to the first variant's, paired round by round
    /// (`--repeat` 2 or more; not for the first variant itself).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vs_first: Option<Paired>,
    /// Service name.
    pub service: String,
    /// Class model name.
    pub model: String,
    /// Cost name.
    pub cost: String,
    /// Workload as α-β-γ.
    pub workload: String,
    /// Shards.
    pub shards: usize,
    /// Skew.
    pub skew: f64,
    /// Skew of local writes, when it differs from `skew`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub write_skew: Option<f64>,
    /// Schedulers with a dependency graph: its bound, in nodes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub graph_max: Option<usize>,
    /// Stealing schedulers: the longest pause between fruitless steal
    /// rounds, in µs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub steal_retry_max_us: Option<u64>,
    /// Early schedulers: where the mapping came from (`default`,
    /// `optimal`, `naive`, a file or a spec).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mapping: Option<String>,
    /// Early schedulers: the mapping that ran, in the compact form
    /// `--mapping` accepts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mapping_spec: Option<String>,
    /// Commands per batch.
    pub batch: usize,
    /// Workload seed.
    pub seed: u64,
    /// Commands executed by each worker.
    pub executed_per_worker: Vec<u64>,
    /// Per-worker metrics samples of the last run (with
    /// `metrics_interval_ms`), printed as their own JSON lines.
    #[serde(skip)]
    pub metrics: Vec<MetricsSample>,
}

/// One variant's throughput over another's, from runs paired by round:
/// the two runs of a round are adjacent in time, so a ratio per round
/// cancels the machine's slow drift that separate medians keep.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Paired {
    /// Rounds behind the ratio.
    pub rounds: usize,
    /// The median of the per-round ratios.
    pub median: f64,
    /// A 95 % confidence interval of that median, from the ratios' order
    /// statistics (no assumption about their distribution); `None` with
    /// fewer than 6 rounds, which cannot give one.
    pub ci95: Option<(f64, f64)>,
}

impl Paired {
    /// The ratios `first[r] / other[r]` of elapsed times (so throughput of
    /// `other` over `first`), round by round.
    pub fn of(first: &[f64], other: &[f64]) -> Option<Paired> {
        if first.len() != other.len() || first.len() < 2 {
            return None;
        }
        let mut ratios: Vec<f64> = first.iter().zip(other).map(|(f, o)| f / o.max(1e-12)).collect();
        ratios.sort_by(f64::total_cmp);
        let n = ratios.len();
        let median = if n % 2 == 1 { ratios[n / 2] } else { (ratios[n / 2 - 1] + ratios[n / 2]) / 2.0 };
        let ci95 = median_rank_bound(n).map(|k| (ratios[k - 1], ratios[n - k]));
        Some(Paired { rounds: n, median, ci95 })
    }

    /// The table cell: `1.02x` and, when there is one, the interval.
    fn cell(&self) -> String {
        match self.ci95 {
            Some((low, high)) => format!("{:.2}x ({low:.2}-{high:.2})", self.median),
            None => format!("{:.2}x", self.median),
        }
    }
}

/// The largest rank `k` such that the `k`-th smallest and `k`-th largest
/// of `n` samples bound their population's median with 95 % confidence:
/// the median lies outside them only when at most `k - 1` samples fall on
/// one side of it, which for each side has the probability of a binomial
/// `B(n, 1/2)` being at most `k - 1`. `None` when even the extremes give
/// less than 95 % (fewer than 6 samples).
fn median_rank_bound(n: usize) -> Option<usize> {
    // P(B(n, 1/2) <= j), one term at a time: C(n, j) / 2^n.
    let mut term = 0.5f64.powi(n as i32);
    let mut below = 0.0;
    let mut k = None;
    for j in 0..n / 2 {
        below += term;
        if 2.0 * below > 0.05 {
            break;
        }
        k = Some(j + 1);
        term *= (n - j) as f64 / (j + 1) as f64;
    }
    k
}

impl SchedBenchConfig {
    /// Checks every parameter; the error is one line naming the bad one.
    pub fn validate(&self) -> Result<(), BenchError> {
        self.workload.validate()?;
        if self.schedulers.is_empty() {
            return Err(BenchError::Config("no scheduler given".into()));
        }
        if let Some(&w) = self.workers.iter().find(|&&w| w == 0 || w > psmr_sched::WORKERS_MAX) {
            return Err(BenchError::Config(format!(
                "--workers must be between 1 and {}, got {w}",
                psmr_sched::WORKERS_MAX
            )));
        }
        if self.workers.is_empty() {
            return Err(BenchError::Config("no worker count given".into()));
        }
        if self.batch == 0 || self.batch > BATCH_MAX {
            return Err(BenchError::Config(format!("--batch must be between 1 and {BATCH_MAX}, got {}", self.batch)));
        }
        if self.workload.commands == 0 || self.workload.commands > COMMANDS_MAX {
            return Err(BenchError::Config(format!(
                "--commands must be between 1 and {COMMANDS_MAX}, got {}",
                self.workload.commands
            )));
        }
        if self.bitmap_bits == 0 || self.bitmap_bits > BITMAP_BITS_MAX {
            return Err(BenchError::Config(format!(
                "--bitmap-bits must be between 1 and {BITMAP_BITS_MAX}, got {}",
                self.bitmap_bits
            )));
        }
        if let Some(&g) = self.graph_max.iter().find(|&&g| g == 0 || g > psmr_sched::GRAPH_MAX_LIMIT) {
            return Err(BenchError::Config(format!(
                "--graph-max must be between 1 and {}, got {g}",
                psmr_sched::GRAPH_MAX_LIMIT
            )));
        }
        if self.queue_depth == 0 {
            return Err(BenchError::Config("--queue-depth must be at least 1".into()));
        }
        if let Some(spin) = self.spin.filter(|&s| s > psmr_sched::SPIN_MAX) {
            return Err(BenchError::Config(format!(
                "--spin must be between 0 and {}, got {spin}",
                psmr_sched::SPIN_MAX
            )));
        }
        if let Some(ms) = self.metrics_interval_ms.filter(|&ms| ms == 0 || ms > 60_000) {
            return Err(BenchError::Config(format!("--metrics must be between 1 and 60000 ms, got {ms}")));
        }
        if self.repeat == 0 || self.repeat > REPEAT_MAX {
            return Err(BenchError::Config(format!(
                "--repeat must be between 1 and {REPEAT_MAX}, got {}",
                self.repeat
            )));
        }
        if self.list_size == Some(0) {
            return Err(BenchError::Config("--list-size must be at least 1".into()));
        }
        if self.mappings.is_empty() {
            return Err(BenchError::Config("no mapping given".into()));
        }
        Ok(())
    }

    /// Entries per list shard.
    pub fn list_size(&self) -> usize {
        self.list_size.unwrap_or_else(|| self.cost.list_size())
    }
}

/// Runs every (scheduler, workers) pair of `config` over the same batches,
/// calling `on_run` after each run, and checks that all runs agree.
pub fn run(config: &SchedBenchConfig, mut on_run: impl FnMut(&RunReport)) -> Result<Vec<RunReport>, BenchError> {
    config.validate()?;
    match config.service {
        ServiceKind::List => {
            let model: list::ListModel = config.model.parse()?;
            let shards = config.workload.shards;
            let size = config.list_size();
            let commands = list::generate(model, &config.workload, size)?;
            let setup = Setup {
                model: list::class_model(model, shards),
                default_mapping: &|w| list::default_mapping(model, shards, w),
                make: &|| list::ListService::new(shards, size),
            };
            run_service(config, setup, commands, &mut on_run)
        }
        ServiceKind::Kv => {
            let model: kv::KvModel = config.model.parse()?;
            let shards = config.workload.shards;
            let (keys, cost) = (config.workload.keys, config.cost);
            let commands = kv::generate(model, &config.workload)?;
            let setup = Setup {
                model: kv::class_model(model, shards),
                default_mapping: &|w| kv::default_mapping(model, shards, w),
                make: &|| kv::KvService::new(keys, cost),
            };
            run_service(config, setup, commands, &mut on_run)
        }
    }
}

struct Setup<'a, S> {
    model: ClassModel,
    default_mapping: &'a dyn Fn(usize) -> Mapping,
    make: &'a dyn Fn() -> S,
}

/// Class weights for the optimizer: each class's share of the commands.
pub fn class_frequencies<O>(model: &ClassModel, commands: &[Command<O>]) -> Vec<f64> {
    let mut counts = vec![0u64; model.len()];
    for c in commands {
        if let Some(n) = counts.get_mut(c.class.index()) {
            *n += 1;
        }
    }
    let total = commands.len().max(1) as f64;
    counts.into_iter().map(|n| n as f64 / total).collect()
}

/// The optimizer's (`Optimal`) or the naive (`Naive`) mapping of `model`
/// on `workers` threads for the class weights `weights`; `None` for the
/// other sources, which are given rather than computed.
pub fn computed_mapping(
    source: &MappingSource,
    model: &ClassModel,
    weights: &[f64],
    workers: usize,
) -> Result<Option<Mapping>, BenchError> {
    let problem = |weighting| -> Result<Problem, BenchError> {
        Ok(Problem::new(model.clone(), workers)?.with_weights(weights.to_vec())?.with_weighting(weighting))
    };
    Ok(Some(match source {
        MappingSource::Optimal(weighting) => {
            let solution = optimizer::optimize(&problem(*weighting)?)?;
            if !solution.optimal {
                tracing::warn!(
                    gap = solution.gap(),
                    "the optimizer's time limit ran out: the mapping is the best found"
                );
            }
            tracing::info!(
                workers,
                objective = %solution.objective,
                elapsed_ms = solution.stats.elapsed.as_secs_f64() * 1e3,
                "optimal mapping {}",
                solution.mapping.to_spec(model)
            );
            solution.mapping
        }
        MappingSource::Naive => optimizer::naive(&problem(Weighting::AsWritten)?),
        MappingSource::Default | MappingSource::File(_) | MappingSource::Spec(_) => return Ok(None),
    }))
}

fn mapping_for(
    source: &MappingSource,
    setup_model: &ClassModel,
    default: &dyn Fn(usize) -> Mapping,
    weights: &[f64],
    workers: usize,
) -> Result<Mapping, BenchError> {
    let computed = computed_mapping(source, setup_model, weights, workers)?;
    let mapping = match (computed, source) {
        (Some(mapping), _) => mapping,
        (None, MappingSource::Spec(spec)) => Mapping::from_spec(setup_model, workers, spec)?,
        (None, MappingSource::File(path)) => {
            let text = std::fs::read_to_string(path)
                .map_err(|source| BenchError::MappingFile { path: path.clone(), source })?;
            Mapping::from_json(setup_model, workers, &text)?
        }
        (None, _) => default(workers),
    };
    mapping.validate(setup_model)?;
    Ok(mapping)
}

/// One variant of a run: scheduler, workers, mapping source (an index
/// into `mappings`), graph bound, steal backoff (an index into
/// `steal_retry_max`).
type Variant = (SchedulerKind, usize, Option<usize>, Option<usize>, Option<usize>);

fn run_service<S: Service>(
    config: &SchedBenchConfig,
    setup: Setup<'_, S>,
    commands: Vec<Command<S::Op>>,
    on_run: &mut dyn FnMut(&RunReport),
) -> Result<Vec<RunReport>, BenchError>
where
    S::Op: Clone,
{
    let n = commands.len();
    let weights = class_frequencies(&setup.model, &commands);
    // Runs in child processes build their own batches: a copy here would
    // only double the memory of a large workload.
    let batches: Vec<Batch<S::Op>> = match config.isolate {
        Some(_) => Vec::new(),
        None => commands.chunks(config.batch).map(|c| Batch::new(c.to_vec(), config.bitmap_bits)).collect(),
    };
    drop(commands);
    let plan = plan_variants(config)?;
    let mappings = plan_mappings(config, &setup, &weights, &plan)?;
    // Rounds run the whole plan in turn, so that drift in the machine's
    // speed spreads over every variant instead of favoring the first.
    let mut elapsed: Vec<Vec<f64>> = vec![Vec::new(); plan.len()];
    let mut outcomes: Vec<Option<Outcome>> = vec![None; plan.len()];
    let mut reference: Option<(SchedulerKind, Outcome)> = None;
    for _round in 0..config.repeat {
        for (i, (&(kind, workers, _, graph, backoff), mapping)) in plan.iter().zip(&mappings).enumerate() {
            let (secs, outcome) = match &config.isolate {
                Some(isolate) => run_child(isolate, i, kind, workers)?,
                None => run_once(config, &setup, &batches, (kind, workers, graph, backoff), mapping.clone())?,
            };
            match &reference {
                Some((ref_kind, r)) => same_as(r, *ref_kind, &outcome, kind, workers)?,
                None => reference = Some((kind, outcome.clone())),
            }
            elapsed[i].push(secs);
            outcomes[i] = Some(outcome);
        }
    }
    let first = elapsed[0].clone();
    let mut reports: Vec<RunReport> = Vec::new();
    let mut sequential_cps = None;
    for (i, &variant) in plan.iter().enumerate() {
        let vs_first = if i == 0 { None } else { Paired::of(&first, &elapsed[i]) };
        let outcome = outcomes[i].take().expect("every variant ran");
        let spec = mappings[i].as_ref().map(|m| m.to_spec(&setup.model));
        let mut report = report_of(config, variant, &mut elapsed[i], n, outcome, spec);
        report.vs_first = vs_first;
        if variant.0 == SchedulerKind::Sequential {
            sequential_cps = Some(report.throughput_cps);
        }
        report.vs_sequential = sequential_cps.map(|s| report.throughput_cps / s);
        on_run(&report);
        reports.push(report);
    }
    Ok(reports)
}

/// One variant per (scheduler, workers, mapping source, graph bound);
/// schedulers without a mapping or a graph run once per worker count.
fn plan_variants(config: &SchedBenchConfig) -> Result<Vec<Variant>, BenchError> {
    let mut plan: Vec<Variant> = Vec::new();
    for &kind in &config.schedulers {
        let sources: Vec<Option<usize>> =
            if kind.needs_mapping() { (0..config.mappings.len()).map(Some).collect() } else { vec![None] };
        let graphs: Vec<Option<usize>> = match kind.has_graph() && !config.graph_max.is_empty() {
            true => config.graph_max.iter().copied().map(Some).collect(),
            false => vec![None],
        };
        let backoffs: Vec<Option<usize>> = match kind.steals() && !config.steal_retry_max.is_empty() {
            true => (0..config.steal_retry_max.len()).map(Some).collect(),
            false => vec![None],
        };
        let worker_counts: &[usize] = if kind == SchedulerKind::Sequential { &[1] } else { &config.workers };
        for &w in worker_counts {
            for &m in &sources {
                for (&g, &b) in graphs.iter().flat_map(|g| backoffs.iter().map(move |b| (g, b))) {
                    if !plan.contains(&(kind, w, m, g, b)) {
                        plan.push((kind, w, m, g, b));
                    }
                }
            }
        }
    }
    if let Some(i) = config.only {
        let entry = *plan.get(i).ok_or_else(|| BenchError::Config(format!("no variant {i} in the plan")))?;
        plan = vec![entry];
    }
    Ok(plan)
}

/// Each variant's mapping, made and checked before anything runs: a bad
/// mapping file must not cost a long sequential run first. Each (source,
/// workers) pair is solved once.
fn plan_mappings<S: Service>(
    config: &SchedBenchConfig,
    setup: &Setup<'_, S>,
    weights: &[f64],
    plan: &[Variant],
) -> Result<Vec<Option<Mapping>>, BenchError> {
    let mut made: Vec<((usize, usize), Mapping)> = Vec::new();
    let mut mappings = Vec::with_capacity(plan.len());
    for &(_, w, m, _, _) in plan {
        mappings.push(match m {
            None => None,
            Some(i) => {
                if let Some((_, mapping)) = made.iter().find(|(key, _)| *key == (i, w)) {
                    Some(mapping.clone())
                } else {
                    let mapping = mapping_for(&config.mappings[i], &setup.model, setup.default_mapping, weights, w)?;
                    made.push(((i, w), mapping.clone()));
                    Some(mapping)
                }
            }
        });
    }
    Ok(mappings)
}

/// An error unless `outcome` (of `kind` with `workers`) left the state and
/// the replies `reference` (of `ref_kind`) did.
fn same_as(
    reference: &Outcome,
    ref_kind: SchedulerKind,
    outcome: &Outcome,
    kind: SchedulerKind,
    workers: usize,
) -> Result<(), BenchError> {
    if reference.digest == outcome.digest && reference.reply_digest == outcome.reply_digest {
        return Ok(());
    }
    Err(BenchError::Diverged {
        scheduler: kind,
        workers,
        reference: ref_kind,
        digest: outcome.digest.clone(),
        ref_digest: reference.digest.clone(),
        reply_digest: outcome.reply_digest.clone(),
        ref_reply_digest: reference.reply_digest.clone(),
    })
}

/// The report of one variant from its run times (sorted here) and its
/// last outcome; the comparisons with other variants are the caller's.
fn report_of(
    config: &SchedBenchConfig,
    (kind, workers, source, graph, backoff): Variant,
    times: &mut [f64],
    n: usize,
    outcome: Outcome,
    mapping_spec: Option<String>,
) -> RunReport {
    times.sort_by(f64::total_cmp);
    let elapsed_s = times[times.len() / 2];
    RunReport {
        scheduler: kind.name().to_string(),
        workers,
        commands: n,
        elapsed_s,
        throughput_cps: n as f64 / elapsed_s.max(1e-9),
        runs: times.len(),
        elapsed_min_s: times[0],
        elapsed_max_s: times[times.len() - 1],
        digest: outcome.digest,
        reply_digest: outcome.reply_digest,
        vs_sequential: None,
        vs_first: None,
        service: config.service.to_string(),
        model: config.model.clone(),
        cost: config.cost.to_string(),
        workload: config.workload.mix.to_string(),
        shards: config.workload.shards,
        skew: config.workload.skew,
        write_skew: config.workload.write_skew,
        graph_max: kind.has_graph().then(|| graph.unwrap_or(kind.graph_max_default())),
        steal_retry_max_us: kind.steals().then(|| {
            let max = backoff.map_or(psmr_sched::STEAL_RETRY_MAX, |b| config.steal_retry_max[b]);
            max.as_micros() as u64
        }),
        mapping: source.map(|m| config.mappings[m].label()),
        mapping_spec,
        batch: config.batch,
        seed: config.workload.seed,
        executed_per_worker: outcome.executed_per_worker,
        metrics: outcome.metrics,
    }
}

/// Runs variant `i` in a child process (see [`Isolate`]) and reads back
/// its time and outcome.
fn run_child(isolate: &Isolate, i: usize, kind: SchedulerKind, workers: usize) -> Result<(f64, Outcome), BenchError> {
    let fail = |why: String| BenchError::Config(format!("{kind} with {workers} workers, in a child process: {why}"));
    let out = std::process::Command::new(&isolate.program)
        .args(&isolate.args)
        .args(["--only", &i.to_string(), "--repeat", "1", "--json"])
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| fail(format!("cannot start {}: {e}", isolate.program.display())))?;
    if !out.status.success() {
        return Err(fail(format!("{}: {}", out.status, String::from_utf8_lossy(&out.stderr).trim())));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let mut run: Option<ChildRun> = None;
    let mut metrics = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let value: serde_json::Value =
            serde_json::from_str(line).map_err(|e| fail(format!("bad output {line:?}: {e}")))?;
        if value.get("type").and_then(|t| t.as_str()) == Some("metrics") {
            metrics.push(serde_json::from_value::<MetricsSample>(value).map_err(|e| fail(e.to_string()))?);
        } else {
            run = Some(serde_json::from_value(value).map_err(|e| fail(e.to_string()))?);
        }
    }
    let run = run.ok_or_else(|| fail("no report".into()))?;
    let outcome = Outcome {
        digest: run.digest,
        reply_digest: run.reply_digest,
        executed_per_worker: run.executed_per_worker,
        metrics,
    };
    Ok((run.elapsed_s, outcome))
}

/// What the parent reads of a child's [`RunReport`].
#[derive(serde::Deserialize)]
struct ChildRun {
    elapsed_s: f64,
    digest: String,
    reply_digest: String,
    executed_per_worker: Vec<u64>,
}

/// What one run leaves behind besides its time.
#[derive(Clone, Debug)]
struct Outcome {
    digest: String,
    reply_digest: String,
    executed_per_worker: Vec<u64>,
    metrics: Vec<MetricsSample>,
}

/// Runs the batches once through a fresh service; returns the seconds from
/// the scheduler's creation to its last reply.
fn run_once<S: Service>(
    config: &SchedBenchConfig,
    setup: &Setup<'_, S>,
    batches: &[Batch<S::Op>],
    (kind, workers, graph, backoff): (SchedulerKind, usize, Option<usize>, Option<usize>),
    mapping: Option<Mapping>,
) -> Result<(f64, Outcome), BenchError>
where
    S::Op: Clone,
{
    let n: usize = batches.iter().map(Batch::len).sum();
    let service = Arc::new((setup.make)());
    let sink = Arc::new(DigestSink::new(workers));
    let mut sched_config = SchedConfig::new(kind, workers);
    if let Some(graph_max) = graph {
        sched_config.graph_max = graph_max;
    }
    sched_config.queue_depth = config.queue_depth;
    sched_config.mapping = mapping;
    sched_config.spin = config.spin;
    sched_config.metrics = config.metrics_interval_ms.is_some();
    sched_config.victims = config.victims;
    sched_config.pool = config.pool;
    if let Some(b) = backoff {
        sched_config.steal_retry_max = config.steal_retry_max[b];
    }
    let fail = |source| BenchError::Scheduler { scheduler: kind, workers, source };
    let input = batches.to_vec();
    tracing::debug!(%kind, workers, "run starts");
    let start = Instant::now();
    let mut scheduler = psmr_sched::build(&sched_config, service.clone(), &setup.model, sink.clone()).map_err(fail)?;
    let sampler = match (config.metrics_interval_ms, scheduler.metrics()) {
        (Some(ms), Some(m)) => Some(Sampler::start(m, kind, workers, Duration::from_millis(ms), start)),
        _ => None,
    };
    for batch in input {
        scheduler.submit(batch).map_err(fail)?;
    }
    let stats = scheduler.finish().map_err(fail)?;
    let secs = start.elapsed().as_secs_f64();
    let metrics = sampler.map(Sampler::stop).unwrap_or_default();
    let (reply_digest, replies) = sink.digest();
    if replies != n as u64 {
        return Err(BenchError::Config(format!(
            "{kind} with {workers} workers produced {replies} replies for {n} commands"
        )));
    }
    let outcome = Outcome {
        digest: service.digest().to_string(),
        reply_digest: reply_digest.to_string(),
        executed_per_worker: stats.executed_per_worker,
        metrics,
    };
    Ok((secs, outcome))
}

/// One worker's metrics over one sampling interval (000 §5.3): a JSON line
/// of `psmr sched-bench --metrics-interval-ms MS --json`.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct MetricsSample {
    /// Always `"metrics"`, to tell these lines from run reports.
    #[serde(rename = "type")]
    pub kind: String,
    /// Scheduler name.
    pub scheduler: String,
    /// Workers of the run.
    pub workers: usize,
    /// This worker's id.
    pub worker: usize,
    /// End of the interval, seconds since the run started.
    pub t_s: f64,
    /// Length of the interval, seconds.
    pub interval_s: f64,
    /// Seconds spent waiting for the other threads of sequential classes.
    pub sync_idle_s: f64,
    /// Seconds spent waiting for the queue.
    pub queue_idle_s: f64,
    /// Commands per queue operation.
    pub queue_size_avg: f64,
    /// Commands executed.
    pub executed: u64,
    /// Steal attempts.
    pub steals_tried: u64,
    /// Successful steals.
    pub steals_ok: u64,
}

/// Samples a scheduler's metrics from its own thread until stopped.
struct Sampler {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<Vec<MetricsSample>>,
}

impl Sampler {
    fn start(
        metrics: Arc<psmr_sched::Metrics>,
        kind: SchedulerKind,
        workers: usize,
        every: Duration,
        t0: Instant,
    ) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        // The first snapshot is taken here, before any command is submitted,
        // so that the samples add up to the run's totals.
        let mut last = metrics.snapshot();
        let handle = std::thread::spawn(move || {
            let mut out = Vec::new();
            let mut last_t = 0.0;
            loop {
                // Sleep in short steps so that stopping is prompt.
                let until = Instant::now() + every;
                while Instant::now() < until && !flag.load(Ordering::Relaxed) {
                    std::thread::sleep(every.min(Duration::from_millis(5)));
                }
                let stopping = flag.load(Ordering::Relaxed);
                let now = metrics.snapshot();
                let t = t0.elapsed().as_secs_f64();
                for (worker, (n, l)) in now.iter().zip(&last).enumerate() {
                    let d = n.since(l);
                    out.push(MetricsSample {
                        kind: "metrics".into(),
                        scheduler: kind.name().to_string(),
                        workers,
                        worker,
                        t_s: t,
                        interval_s: t - last_t,
                        sync_idle_s: d.sync_idle_ns as f64 / 1e9,
                        queue_idle_s: d.queue_idle_ns as f64 / 1e9,
                        queue_size_avg: d.queue_size_avg(),
                        executed: d.executed,
                        steals_tried: d.steals_tried,
                        steals_ok: d.steals_ok,
                    });
                }
                (last, last_t) = (now, t);
                if stopping {
                    return out;
                }
            }
        });
        Self { stop, handle }
    }

    fn stop(self) -> Vec<MetricsSample> {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().unwrap_or_default()
    }
}

/// Per-worker totals of each run's metrics: one line per worker with the
/// share of the run spent idle in synchronization and on the queue.
pub fn format_metrics_table(reports: &[RunReport]) -> String {
    let name = name_width(reports);
    let mut out = format!(
        "{:<name$} {:>7} {:>6} {:>10} {:>9} {:>10} {:>10} {:>7}\n",
        "scheduler", "workers", "worker", "executed", "sync_idle", "queue_idle", "queue_size", "steals"
    );
    for r in reports {
        let mut totals: Vec<(u64, f64, f64, f64, u64, u64)> = vec![(0, 0.0, 0.0, 0.0, 0, 0); r.workers];
        for m in &r.metrics {
            let t = &mut totals[m.worker];
            t.0 += m.executed;
            t.1 += m.sync_idle_s;
            t.2 += m.queue_idle_s;
            t.3 += m.queue_size_avg * m.interval_s;
            t.4 += m.steals_ok;
            t.5 += m.steals_tried;
        }
        if r.metrics.is_empty() {
            continue;
        }
        let span = r.metrics.iter().map(|m| m.t_s).fold(0.0, f64::max).max(1e-9);
        for (w, t) in totals.iter().enumerate() {
            out.push_str(&format!(
                "{:<name$} {:>7} {:>6} {:>10} {:>8.1}% {:>9.1}% {:>10.1} {:>3}/{:<3}\n",
                r.scheduler,
                r.workers,
                w,
                t.0,
                100.0 * t.1 / span,
                100.0 * t.2 / span,
                t.3 / span,
                t.4,
                t.5
            ));
        }
    }
    out
}

/// The width of a table's scheduler column: its longest name.
fn name_width(reports: &[RunReport]) -> usize {
    reports.iter().map(|r| r.scheduler.len()).max().unwrap_or(0).max("scheduler".len())
}

/// A readable table of runs, one line each.
pub fn format_table(reports: &[RunReport]) -> String {
    let name = name_width(reports);
    let mut out = String::new();
    if let Some(r) = reports.first() {
        let write_skew = r.write_skew.map(|w| format!(" write-skew {w}")).unwrap_or_default();
        out.push_str(&format!(
            "service {} model {} cost {} workload {} shards {} skew {}{write_skew} batch {} commands {} seed {}\n",
            r.service, r.model, r.cost, r.workload, r.shards, r.skew, r.batch, r.commands, r.seed
        ));
    }
    // The mapping column only when mappings are compared.
    let labels: Vec<&str> = reports.iter().filter_map(|r| r.mapping.as_deref()).collect();
    let show_mapping = labels.iter().any(|&l| l != "default");
    let width = labels.iter().map(|l| l.len()).max().unwrap_or(0).clamp(7, 40);
    let mapping_cell =
        |m: Option<&str>| if show_mapping { format!(" {:<width$}", m.unwrap_or("-")) } else { String::new() };
    // The graph column only when graph bounds are compared: when one
    // scheduler ran with two.
    let show_graph = reports.iter().any(|a| {
        reports.iter().any(|b| a.scheduler == b.scheduler && a.graph_max.is_some() && a.graph_max != b.graph_max)
    });
    let graph_cell =
        |g: Option<String>| if show_graph { format!(" {:>5}", g.unwrap_or("-".into())) } else { String::new() };
    // The backoff column only when steal backoffs are compared.
    let show_backoff = reports
        .iter()
        .any(|a| reports.iter().any(|b| a.scheduler == b.scheduler && a.steal_retry_max_us != b.steal_retry_max_us));
    let backoff_cell =
        |b: Option<String>| if show_backoff { format!(" {:>8}", b.unwrap_or("-".into())) } else { String::new() };
    // The paired column only when rounds were paired.
    let paired: Vec<String> = reports.iter().map(|r| r.vs_first.as_ref().map_or("-".into(), Paired::cell)).collect();
    let show_paired = reports.iter().any(|r| r.vs_first.is_some());
    let pw = paired.iter().map(String::len).max().unwrap_or(0).max("vs_first".len());
    let paired_cell = |c: &str| if show_paired { format!(" {c:>pw$}") } else { String::new() };
    out.push_str(&format!(
        "{:<name$} {:>7}{}{}{} {:>10} {:>14} {:>8}{}  {}\n",
        "scheduler",
        "workers",
        mapping_cell(Some("mapping")),
        graph_cell(Some("graph".into())),
        backoff_cell(Some("backoff".into())),
        "elapsed_s",
        "throughput_cps",
        "vs_seq",
        paired_cell("vs_first"),
        "digest"
    ));
    for (r, p) in reports.iter().zip(&paired) {
        let vs = r.vs_sequential.map(|v| format!("{v:.2}x")).unwrap_or_else(|| "-".into());
        out.push_str(&format!(
            "{:<name$} {:>7}{}{}{} {:>10.3} {:>14.0} {:>8}{}  {}\n",
            r.scheduler,
            r.workers,
            mapping_cell(r.mapping.as_deref()),
            graph_cell(r.graph_max.map(|g| g.to_string())),
            backoff_cell(r.steal_retry_max_us.map(|us| format!("{us}us"))),
            r.elapsed_s,
            r.throughput_cps,
            vs,
            paired_cell(p),
            r.digest
        ));
    }
    if show_paired {
        out.push_str("vs_first: throughput over the first line's, the median of one ratio per round, with its 95 % confidence interval\n");
    }
    if show_mapping {
        out.push_str("mappings that ran:\n");
        let mut seen = Vec::new();
        for r in reports {
            if let (Some(label), Some(spec)) = (&r.mapping, &r.mapping_spec) {
                if !seen.contains(&(label, r.workers)) {
                    seen.push((label, r.workers));
                    out.push_str(&format!("  {label} with {} workers: {spec}\n", r.workers));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapping_lists_split_keywords_but_not_specs() {
        let list = |v: &[&str]| MappingSource::parse_list(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        let both = list(&["naive,optimal:total"]).unwrap();
        assert_eq!(both, [MappingSource::Naive, MappingSource::Optimal(Weighting::Total)]);
        let spec = list(&["R=conc:0,1;W=seq:0-1", "default"]).unwrap();
        assert_eq!(spec, [MappingSource::Spec("R=conc:0,1;W=seq:0-1".into()), MappingSource::Default]);
        assert!(list(&["naive,optimal:best"]).is_err());
    }

    #[test]
    fn each_stealing_scheduler_runs_with_each_steal_backoff_and_the_others_once() {
        use std::time::Duration;
        let config = SchedBenchConfig {
            schedulers: vec![SchedulerKind::Sequential, SchedulerKind::Early, SchedulerKind::EarlyWsSemi],
            workers: vec![2],
            steal_retry_max: vec![Duration::ZERO, Duration::from_millis(32)],
            ..SchedBenchConfig::default()
        };
        let plan = plan_variants(&config).unwrap();
        let backoffs: Vec<(SchedulerKind, Option<usize>)> = plan.iter().map(|v| (v.0, v.4)).collect();
        assert_eq!(
            backoffs,
            [
                (SchedulerKind::Sequential, None),
                (SchedulerKind::Early, None),
                (SchedulerKind::EarlyWsSemi, Some(0)),
                (SchedulerKind::EarlyWsSemi, Some(1)),
            ]
        );
    }

    #[test]
    fn the_median_interval_has_the_ranks_of_the_binomial_tables() {
        // Ranks from the exact binomial distribution (e.g. Conover,
        // Practical Nonparametric Statistics, table A3).
        assert_eq!(median_rank_bound(5), None);
        assert_eq!(median_rank_bound(6), Some(1));
        assert_eq!(median_rank_bound(9), Some(2));
        assert_eq!(median_rank_bound(21), Some(6));
        assert_eq!(median_rank_bound(41), Some(14));
        assert_eq!(median_rank_bound(100), Some(40));
    }

    #[test]
    fn paired_ratios_are_taken_round_by_round() {
        // The machine drifts slower round by round, and the second
        // variant is 10 % faster in every round: every ratio is 1.10.
        let first: Vec<f64> = (0..9).map(|r| 1.0 + 0.1 * r as f64).collect();
        let other: Vec<f64> = first.iter().map(|f| f / 1.1).collect();
        let p = Paired::of(&first, &other).expect("paired");
        assert_eq!(p.rounds, 9);
        assert!((p.median - 1.1).abs() < 1e-9, "{p:?}");
        let (low, high) = p.ci95.expect("9 rounds give an interval");
        assert!((low - 1.1).abs() < 1e-9 && (high - 1.1).abs() < 1e-9, "{p:?}");
        // Ratios 1..=9: the interval is the 2nd smallest and largest.
        let other: Vec<f64> = (1..=9).map(|r| 1.0 / r as f64).collect();
        let p = Paired::of(&[1.0; 9], &other).expect("paired");
        assert_eq!((p.median, p.ci95), (5.0, Some((2.0, 8.0))));
        assert_eq!(Paired::of(&[1.0; 4], &[0.5; 4]).expect("paired").ci95, None);
        assert_eq!(Paired::of(&[1.0], &[1.0]), None, "one round pairs nothing");
    }

    #[test]
    fn the_scheduler_column_fits_the_longest_name() {
        let report = |scheduler: &str| RunReport {
            scheduler: scheduler.into(),
            workers: 2,
            commands: 1,
            elapsed_s: 1.0,
            runs: 1,
            elapsed_min_s: 1.0,
            elapsed_max_s: 1.0,
            throughput_cps: 1.0,
            digest: "d".into(),
            reply_digest: "r".into(),
            vs_sequential: None,
            vs_first: None,
            service: "kv".into(),
            model: "readers-writers".into(),
            cost: "light".into(),
            workload: "0-0-0".into(),
            shards: 1,
            skew: 0.0,
            write_skew: None,
            graph_max: None,
            steal_retry_max_us: None,
            mapping: None,
            mapping_spec: None,
            batch: 1,
            seed: 1,
            executed_per_worker: vec![1],
            metrics: Vec::new(),
        };
        let mut pool = report("late-batch-bitmap-pool");
        pool.vs_first = Some(Paired { rounds: 9, median: 1.1, ci95: Some((1.0, 1.2)) });
        let table = format_table(&[report("sequential"), pool]);
        assert!(table.contains(" vs_first ") && table.contains(" 1.10x (1.00-1.20) "), "{table}");
        // Where each line's second column (workers) ends.
        let ends: Vec<usize> = table
            .lines()
            .skip(1)
            .take_while(|line| !line.starts_with("vs_first:"))
            .map(|line| {
                let after_name = line.find(' ').expect("two columns");
                let rest = line[after_name..].trim_start();
                line.len() - rest.len() + rest.find(' ').expect("more columns")
            })
            .collect();
        assert_eq!(ends.len(), 3, "{table}");
        assert!(table.ends_with("confidence interval\n"), "{table}");
        assert!(ends.iter().all(|&e| e == ends[0]), "columns do not line up:\n{table}");
        assert!(!table.contains(" graph "), "no graph bounds were compared:\n{table}");
        // One scheduler with two graph bounds: the column tells them apart.
        let mut lines = [report("late-batch-bitmap"), report("late-batch-bitmap"), report("early")];
        (lines[0].graph_max, lines[1].graph_max) = (Some(32), Some(150));
        let table = format_table(&lines);
        let cells: Vec<&str> = table.lines().skip(1).map(|l| l.split_whitespace().nth(2).unwrap_or("")).collect();
        assert_eq!(cells, ["graph", "32", "150", "-"], "{table}");
    }
}
