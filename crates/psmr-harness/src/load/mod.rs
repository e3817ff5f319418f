//! The closed-loop load of `psmr client load` and `psmr bench`: client
//! threads that each send a request and wait for its outcome before the
//! next, latency histograms per command kind, a throughput timeline, the
//! replicas' per-stage busy time and per-worker counters, each replica
//! process's CPU time per command, and the optional history of every
//! operation (the schema of [`crate::history`]).
//!
//! It drives any cluster whose client addresses it is given: one started
//! by [`crate::launch`], an in-process [`psmr_replica::LocalCluster`], or
//! one on other machines.
//!
//! ```no_run
//! use psmr_harness::load::{self, LoadSpec, Ops};
//! use psmr_client::ClientConfig;
//! use std::time::Duration;
//!
//! let addrs = vec!["127.0.0.1:7001".parse().unwrap()];
//! let spec = LoadSpec {
//!     clients: 8,
//!     per_request: 10,
//!     warmup: Duration::from_secs(1),
//!     duration: Duration::from_secs(5),
//!     ops: Ops::Kv { keys: 10_000, write_pct: 50, value_bytes: None, prefix: String::new() },
//!     phases: Vec::new(),
//!     history: None,
//!     seed: 1,
//! };
//! let result = load::run(&addrs, || ClientConfig::new(addrs.clone()), &spec)?;
//! println!("{:.0} commands/s", result.commands_per_s());
//! # Ok::<(), psmr_harness::load::LoadError>(())
//! ```

mod client;
mod gaps;
mod recorder;
mod sample;
mod summary;

use crate::cpu::ReplicaCpu;
use crate::probe::Probe;
use client::{histogram, ClientTally, Driver, Generator, Window};
use gaps::Completions;
pub use gaps::{longest_gap, TICK};
use hdrhistogram::Histogram;
use psmr_client::{Client, ClientConfig, ClientError};
use psmr_services::list::{ListModel, OpStream};
use psmr_services::{WorkloadConfig, WorkloadError};
use recorder::Recorder;
use sample::CpuWatch;
use serde::Serialize;
use std::collections::btree_map::Entry;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use thiserror::Error;

/// Most closed-loop clients (one thread each).
pub const CLIENTS_MAX: usize = 4096;

/// Most phases of one load (each has a generator per client).
pub const PHASES_MAX: usize = 16;

/// Largest value a sized kv load writes, bytes.
pub const VALUE_BYTES_MAX: usize = 4096;

/// Why a load cannot run, or failed. The range errors name the `psmr`
/// flags that set them.
#[derive(Debug, Error)]
pub enum LoadError {
    /// [`LoadSpec::clients`] is out of range.
    #[error("--clients must be between 1 and {CLIENTS_MAX}, got {0}")]
    Clients(usize),
    /// [`LoadSpec::per_request`] is out of range.
    #[error("--per-request must be between 1 and {max}, got {0}", max = psmr_model::wire::REQUEST_COMMANDS_MAX)]
    PerRequest(usize),
    /// A kv load over no keys.
    #[error("--keys must be at least 1")]
    Keys,
    /// A kv load's write percentage is above 100.
    #[error("--write-pct must be at most 100, got {0}")]
    WritePct(u8),
    /// A kv load's key prefix is too long.
    #[error("--prefix must be at most {PREFIX_MAX} bytes, got {0}")]
    Prefix(usize),
    /// A kv load's value size is out of range.
    #[error("value_bytes must be between 1 and {VALUE_BYTES_MAX}, got {0}")]
    ValueBytes(usize),
    /// A history was asked of the list load.
    #[error("histories are of key-value operations; the list load cannot write one")]
    ListHistory,
    /// Too many phases.
    #[error("a load has at most {PHASES_MAX} phases, got {0}")]
    Phases(usize),
    /// [`LoadSpec::duration`] is zero.
    #[error("the measured duration must be positive")]
    Duration,
    /// The list workload is invalid.
    #[error(transparent)]
    Workload(#[from] WorkloadError),
    /// A client cannot start.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The history file cannot be created.
    #[error("cannot create {path}: {source}")]
    HistoryCreate {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The history cannot be written.
    #[error("cannot write the history: {0}")]
    HistoryWrite(#[source] std::io::Error),
    /// A reply or an operation the history has no record for.
    #[error("{0}")]
    Unexpected(String),
    /// A latency histogram refused its bounds or another histogram.
    #[error("latency histogram: {0}")]
    Histogram(String),
    /// A client thread panicked.
    #[error("a client thread panicked")]
    Panicked,
}

/// Longest key prefix of [`Ops::Kv`].
pub const PREFIX_MAX: usize = 256;

/// The commands a load sends.
#[derive(Clone, Debug)]
pub enum Ops {
    /// Key-value store: puts (`write_pct` %) and reads of keys
    /// [`psmr_services::kv::key_bytes`]`(0..keys)`: `"0"`, `"1"`, ... in
    /// decimal, after `prefix`.
    Kv {
        /// Keys the commands touch.
        keys: u64,
        /// Percentage of writes.
        write_pct: u8,
        /// Bytes of every value written, 1 to [`VALUE_BYTES_MAX`]: the
        /// random number in decimal, padded with zeros on the left (or its
        /// last `value_bytes` digits). None: the number's own digits.
        value_bytes: Option<usize>,
        /// Before every key's number, at most [`PREFIX_MAX`] bytes: a
        /// load on a cluster that holds other data keeps to keys of its
        /// own (`psmr client load`); empty for the preloaded keys of a
        /// benchmark's cluster.
        prefix: String,
    },
    /// Sharded list: the α-β-γ workload of `workload` (its mix, shards,
    /// skew, write skew and spread; its seed is replaced per client).
    List {
        /// The list's class model (for checking the workload).
        model: ListModel,
        /// The workload.
        workload: WorkloadConfig,
        /// Entries per shard (values are drawn from twice that).
        list_size: usize,
    },
}

/// What load to run.
#[derive(Clone, Debug)]
pub struct LoadSpec {
    /// Closed-loop clients, one thread each.
    pub clients: usize,
    /// Commands per client request.
    pub per_request: usize,
    /// Warm-up before measuring.
    pub warmup: Duration,
    /// How long to measure.
    pub duration: Duration,
    /// What the commands are.
    pub ops: Ops,
    /// What they become as the load goes on: with `n` later phases the
    /// measured window is cut into `n + 1` equal parts, the first (and
    /// the warm-up) running `ops`, part `k` running `phases[k - 1]`.
    pub phases: Vec<Ops>,
    /// Where to write every operation (the `psmr check-history` schema).
    pub history: Option<PathBuf>,
    /// Seed of the clients' random keys, operations and values.
    pub seed: u64,
}

impl LoadSpec {
    /// Checks the ranges.
    pub fn validate(&self) -> Result<(), LoadError> {
        if !(1..=CLIENTS_MAX).contains(&self.clients) {
            return Err(LoadError::Clients(self.clients));
        }
        if !(1..=psmr_model::wire::REQUEST_COMMANDS_MAX).contains(&self.per_request) {
            return Err(LoadError::PerRequest(self.per_request));
        }
        for ops in std::iter::once(&self.ops).chain(&self.phases) {
            ops.validate(self.history.is_some())?;
        }
        if self.phases.len() >= PHASES_MAX {
            return Err(LoadError::Phases(self.phases.len() + 1));
        }
        if self.duration.is_zero() {
            return Err(LoadError::Duration);
        }
        Ok(())
    }
}

impl Ops {
    /// Checks the ranges (and that a history, if `recorded`, can be
    /// written of these operations).
    fn validate(&self, recorded: bool) -> Result<(), LoadError> {
        match self {
            Ops::Kv { keys, write_pct, value_bytes, prefix } => {
                if prefix.len() > PREFIX_MAX {
                    return Err(LoadError::Prefix(prefix.len()));
                }
                if *keys == 0 {
                    return Err(LoadError::Keys);
                }
                if *write_pct > 100 {
                    return Err(LoadError::WritePct(*write_pct));
                }
                if let Some(n) = value_bytes.filter(|n| !(1..=VALUE_BYTES_MAX).contains(n)) {
                    return Err(LoadError::ValueBytes(n));
                }
            }
            Ops::List { model, workload, list_size } => {
                if recorded {
                    return Err(LoadError::ListHistory);
                }
                OpStream::new(*model, workload, *list_size)?;
            }
        }
        Ok(())
    }
}

/// What one load run measured.
#[derive(Debug)]
pub struct LoadResult {
    /// Length of the measured window, seconds.
    pub seconds: f64,
    /// Commands completed in the window.
    pub commands: u64,
    /// Requests completed in the window.
    pub requests: u64,
    /// Requests that failed (timed out or refused) over the whole run.
    pub errors: u64,
    /// Request latency, µs, one sample per command, by command kind (kv:
    /// `read`, `write`; list: `local-read`, `local-write`, `global-read`,
    /// `global-write`).
    pub latency: BTreeMap<&'static str, Histogram<u64>>,
    /// Request latency, µs, one sample per request.
    pub request_latency: Histogram<u64>,
    /// Commands completed in each second of the window.
    pub timeline: Vec<u64>,
    /// Requests completed in each [`TICK`] since the load's start, warm-up
    /// included: where the cluster answered nothing ([`longest_gap`]).
    pub completed: Vec<u32>,
    /// Per replica and stage: busy, waiting for a CPU, blocked.
    pub stages: Vec<StageRow>,
    /// Per replica and execution worker (early schedulers).
    pub workers: Vec<WorkerRow>,
    /// The same for each second of the window.
    pub worker_timeline: Vec<Vec<WorkerRow>>,
    /// Changes of the replicas' schedulers seen during the window.
    pub switches: Vec<Switch>,
    /// Each replica process's CPU time over the window (see [`CpuSource`]).
    pub cpu: Vec<ReplicaCpu>,
    /// Why `cpu` is empty or its roles uncertain, if they are.
    pub cpu_note: Option<String>,
}

impl LoadResult {
    /// Commands per second over the window.
    pub fn commands_per_s(&self) -> f64 {
        self.commands as f64 / self.seconds
    }

    /// Adds one client's counts and latencies.
    fn add(&mut self, t: ClientTally) -> Result<(), LoadError> {
        self.commands += t.commands;
        self.requests += t.requests;
        self.errors += t.errors;
        for (kind, h) in t.latency {
            match self.latency.entry(kind) {
                Entry::Occupied(mut e) => e.get_mut().add(&h).map_err(LoadError::histogram)?,
                Entry::Vacant(e) => {
                    e.insert(h);
                }
            }
        }
        self.request_latency.add(&t.request).map_err(LoadError::histogram)?;
        for (sum, n) in self.timeline.iter_mut().zip(&t.timeline) {
            *sum += n;
        }
        Ok(())
    }
}

impl LoadError {
    fn histogram(e: impl std::fmt::Display) -> Self {
        LoadError::Histogram(e.to_string())
    }
}

/// Whose CPU time a load measures: the replica processes, found by the
/// pid each reports in its status.
#[derive(Clone, Debug)]
pub enum CpuSource {
    /// None; the reason goes in the report (`n/a`).
    Off(String),
    /// The replicas are processes this one started: their pids are ours
    /// to read.
    Local,
    /// Only replicas on a loopback address whose pid is a `psmr` process
    /// here (a cluster started by hand next to the client); `n/a` for the
    /// others.
    IfLocal,
}

/// Runs `spec` against the replicas at `addrs`, each client with the
/// configuration `config` returns, measuring the replicas' CPU time when
/// they are `psmr` processes of this machine ([`CpuSource::IfLocal`]).
pub fn run(addrs: &[SocketAddr], config: impl Fn() -> ClientConfig, spec: &LoadSpec) -> Result<LoadResult, LoadError> {
    run_with_cpu(addrs, config, spec, &CpuSource::IfLocal)
}

/// Runs `spec` against the replicas at `addrs`; `cpu` says whose CPU time
/// to measure.
pub fn run_with_cpu(
    addrs: &[SocketAddr],
    config: impl Fn() -> ClientConfig,
    spec: &LoadSpec,
    cpu: &CpuSource,
) -> Result<LoadResult, LoadError> {
    spec.validate()?;
    // The probe asks as the clients do.
    let asks = config();
    let probe = Probe::new(addrs)?.as_user(asks.credentials).with_tls(asks.tls);
    // Before the clients start, so that finding the replicas costs the
    // load nothing.
    let watch = CpuWatch::locate(&probe, cpu);
    let window = Window::new(Instant::now(), spec);
    let recorder = match &spec.history {
        Some(path) => Some(Arc::new(Recorder::create(path, window.start)?)),
        None => None,
    };
    let completions = Arc::new(Completions::new(window.start, spec.warmup + spec.duration));
    let mut handles = Vec::with_capacity(spec.clients);
    for i in 0..spec.clients {
        let driver = Driver {
            client: Client::new(config())?,
            generators: Generator::phases(spec, i)?,
            per: spec.per_request,
            window,
            recorder: recorder.clone(),
            completions: completions.clone(),
        };
        handles.push(std::thread::spawn(move || driver.run()));
    }
    let sampled = sample::window(&probe, &window, &watch);
    let mut result = LoadResult {
        seconds: spec.duration.as_secs_f64(),
        commands: 0,
        requests: 0,
        errors: 0,
        latency: BTreeMap::new(),
        request_latency: histogram()?,
        timeline: vec![0; window.buckets],
        completed: Vec::new(),
        stages: sampled.stages,
        workers: sampled.workers,
        worker_timeline: sampled.worker_timeline,
        switches: sampled.switches,
        cpu: Vec::new(),
        cpu_note: watch.note.clone(),
    };
    for h in handles {
        result.add(h.join().map_err(|_| LoadError::Panicked)??)?;
    }
    result.completed = completions.counts();
    if let Some(r) = recorder {
        r.flush()?;
    }
    result.cpu = watch.rows(&sampled.cpu_before, &sampled.cpu_after, result.commands);
    if let Some(change) = watch.leader_change(&probe) {
        result.cpu_note = Some(change);
    }
    Ok(result)
}

/// Busy time of one stage of one replica (002 Fig. 8 style).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StageRow {
    /// The replica's client address.
    pub replica: String,
    /// The stage.
    pub stage: String,
    /// Share of the measured window on a CPU.
    pub busy: f64,
    /// Share runnable but waiting for a CPU.
    pub waiting_cpu: f64,
    /// Share blocked.
    pub blocked: f64,
    /// Threads of the stage (the shares are their average).
    pub threads: usize,
}

/// One execution worker of one replica over a point's window (000 §5.3).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WorkerRow {
    /// The replica's client address.
    pub replica: String,
    /// The worker's id.
    pub worker: usize,
    /// Share of the window waiting for other threads (sequential classes).
    pub sync_idle: f64,
    /// Share of the window waiting for its queue.
    pub queue_idle: f64,
    /// Commands executed.
    pub executed: u64,
    /// Average commands per batch taken from its queue.
    pub queue_size: f64,
    /// Steal attempts.
    pub steals_tried: u64,
    /// Successful steals.
    pub steals_ok: u64,
}

/// A change of what a replica executes with (a decision of `auto`, or a
/// `psmr client reconfigure`), seen in its counters read every second.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Switch {
    /// Seconds into the measured window of the reading that first showed
    /// it (the change happened in the second before).
    pub at_s: f64,
    /// The replica's client address.
    pub replica: String,
    /// What it executes with since (`auto: early, 2 workers`).
    pub scheduler: String,
    /// `auto`'s last decision and its reason, if it decided.
    pub decision: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sized_loads_check_their_value_size() {
        let spec = |value_bytes| LoadSpec {
            clients: 1,
            per_request: 1,
            warmup: Duration::ZERO,
            duration: Duration::from_secs(1),
            ops: Ops::Kv { keys: 10, write_pct: 100, value_bytes: Some(value_bytes), prefix: String::new() },
            phases: Vec::new(),
            history: None,
            seed: 1,
        };
        assert!(spec(64).validate().is_ok());
        assert!(spec(0).validate().unwrap_err().to_string().contains("value_bytes must be between 1 and 4096"));
        assert!(spec(VALUE_BYTES_MAX + 1).validate().is_err());
    }
}
