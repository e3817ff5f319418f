//! # psmr-sched: deterministic parallel execution of ordered batches
//!
//! A replica hands this crate batches of commands in log order; the crate
//! executes them on worker threads so that every replica, whatever its
//! thread timing, produces the same replies and reaches the same state as if
//! it had executed the log one command after the other. How it does that is
//! the choice of [`SchedulerKind`]:
//!
//! | name | idea |
//! | --- | --- |
//! | `sequential` | the caller's thread executes every command in log order: classic SMR, the baseline |
//! | `late-cbase` | one dependency graph of commands (CBASE), shared under one lock by the scheduler and the workers |
//! | `late-batch-keys` | a graph of whole batches; conflicts found key by key (004 Alg. 1) |
//! | `late-batch-bitmap` | a graph of whole batches; conflicts found by intersecting one-hash bitmaps (004 Alg. 1) |
//! | `late-cbase-pool`, `late-batch-bitmap-pool` | the same graphs with their edges kept in the nodes, so that no worker waits for the scheduler's comparisons; free nodes run as jobs of a psmr-rt pool (001) |
//! | `early` | classes mapped to threads before ordering (003 Alg. 1-2): per-worker FIFO queues, one barrier per sequential class |
//! | `early-busywait` | `early` with the barriers replaced by two-cycle atomic counters (000 Alg. 4-5) |
//! | `early-ws-queue` | `early` whose idle workers steal concurrent commands from others' queues (000 Alg. 6-8) |
//! | `early-ws-semi` | `early-ws-queue` that also steals while waiting for a sequential command, then meets at a barrier (000 Alg. 9-11) |
//! | `early-ws-nonblocking` | `early-ws-semi` without barriers: two-cycle counters, waiters steal until the command has run (000 Alg. 12-13) |
//! | `early-ws-optimistic` | `early-ws-nonblocking` checking a victim without its lock first, visiting the next worker first (000 Alg. 14) |
//! | `auto` | measures the workload and the machine and runs whichever of `sequential`, `late-batch-bitmap` and `early` serves it best, switching at batch boundaries ([`auto`]) |
//!
//! All of them implement [`Scheduler`]: [`Scheduler::submit`] one batch at a
//! time (blocking when the scheduler's bounded queues are full, which is how
//! back-pressure reaches the log), then [`Scheduler::finish`] to wait for the
//! last command and join every thread. Replies leave through a [`ReplySink`]
//! with the client id and sequence number of their command.
//!
//! How many CPUs there are to run on is [`cpus`]'s to say: the affinity
//! mask and the cgroup's CPU quota, which `auto` and `early-busywait`'s
//! spinning respect.
//!
//! The thread that calls `submit` is the scheduler thread of the papers: it
//! inserts into the dependency graph (late) or dispatches to worker queues
//! (early). `sequential` executes right there.
//!
//! A panic inside [`Service::execute`] does not hang anything: it is caught,
//! the command is reported in [`SchedError::ServicePanicked`], later commands
//! are skipped (the state is no longer trusted) while the workers still run
//! their synchronization so that every thread drains and exits.
//!
//! In the guide: `docs/design.md` places this crate among the others;
//! `docs/papers.md`: the papers each scheduler comes from.

pub mod auto;
mod barrier;
pub mod check;
pub mod cpus;
mod cycles;
mod dag;
mod early;
mod exec;
mod late;
mod late_pool;
mod metrics;
mod plan;
mod pool;
mod queue;
mod sequential;
mod sink;
mod switch;
mod sync;
mod withdraw;
mod ws;

pub use barrier::Barrier;
pub use cycles::{CycleCounters, Role};
pub use dag::{DagNode, Freed};
pub use exec::panic_message;
pub use metrics::{Metrics, WorkerSample};
/// The class-to-threads optimizer (its own crate, `psmr-optimizer`).
pub use psmr_optimizer as optimizer;
pub use queue::WsQueue;
pub use sink::{CollectSink, DigestSink, NullSink, Reply, ReplySink};
pub use switch::{Overlap, SwitchError, Switchable};
pub use sync::{AdaptiveSpin, Naps, Patience, Signal};
pub use withdraw::{Gate, Withdrawal};
pub use ws::{Victims, STEAL_RETRY_FIRST, STEAL_RETRY_MAX};

use psmr_model::{Batch, ClassModel, Mapping, MappingError, Service};
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use thiserror::Error;

/// Default bound on a dependency graph of single commands (`late-cbase`,
/// `late-cbase-pool`), in commands. 003 §6.1 used 50 for write-only
/// workloads and 150 otherwise.
pub const GRAPH_MAX_COMMANDS_DEFAULT: usize = 150;

/// Default bound on a dependency graph of whole batches (`late-batch-*`,
/// and `auto` when it runs `late-batch-bitmap`), in batches. At 50 commands
/// a batch, 32 batches look 1 600 commands ahead; a larger graph makes
/// every insertion compare the new batch with more nodes for parallelism
/// two to a few dozen workers cannot use. In `psmr sched-bench` on a
/// 2-core machine (kv, 2 workers), `late-batch-bitmap` ran at least as
/// fast with 32 as with 150, and `late-batch-bitmap-pool`, whose scheduler
/// thread is never held back by its workers and so fills whatever bound it
/// is given, ran faster (docs/benchmarks.md, late scheduling on a pool).
pub const GRAPH_MAX_BATCHES_DEFAULT: usize = 32;

/// Largest accepted bound on a dependency graph, in nodes: every insertion
/// compares the new node with each node in the graph, so a bound beyond
/// this only costs memory and time.
pub const GRAPH_MAX_LIMIT: usize = 100_000;

/// Default bound on each early worker's input queue, in dispatched batches.
pub const QUEUE_DEPTH_DEFAULT: usize = 64;

/// Default spin budget of the busy-waiting schedulers: rounds of busy spinning (a few
/// microseconds) before a waiting thread yields. Busy waiting pays off when
/// every worker has a core; on a machine with fewer cores the yields and
/// naps that follow keep the waiting thread from starving the one it waits
/// for.
pub const SPIN_DEFAULT: u32 = 2_000;

/// Largest accepted spin budget.
pub const SPIN_MAX: u32 = 10_000_000;

/// The execution schedulers, by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SchedulerKind {
    /// One thread, log order.
    Sequential,
    /// Dependency graph of single commands (CBASE).
    LateCbase,
    /// Dependency graph of batches, key-by-key conflicts.
    LateBatchKeys,
    /// Dependency graph of batches, bitmap conflicts.
    LateBatchBitmap,
    /// `late-cbase` whose free commands run as jobs of a psmr-rt pool.
    LateCbasePool,
    /// `late-batch-bitmap` whose free batches run as jobs of a psmr-rt
    /// pool.
    LateBatchBitmapPool,
    /// Early scheduling with a class-to-threads mapping.
    Early,
    /// Early scheduling, busy-wait synchronization with two cycles.
    EarlyBusyWait,
    /// Early scheduling with work stealing when a queue is empty.
    EarlyWsQueue,
    /// Work stealing also while synchronizing (semi-blocked).
    EarlyWsSemi,
    /// Work stealing while synchronizing, without barriers.
    EarlyWsNonBlocking,
    /// Barrier-free work stealing with optimistic (lock-free first)
    /// validation of each steal.
    EarlyWsOptimistic,
    /// Chosen and changed at run time by a controller ([`auto`]).
    Auto,
}

impl SchedulerKind {
    /// Every scheduler, in the order tables print them.
    pub const ALL: [SchedulerKind; 13] = [
        SchedulerKind::Sequential,
        SchedulerKind::LateCbase,
        SchedulerKind::LateBatchKeys,
        SchedulerKind::LateBatchBitmap,
        SchedulerKind::LateCbasePool,
        SchedulerKind::LateBatchBitmapPool,
        SchedulerKind::Early,
        SchedulerKind::EarlyBusyWait,
        SchedulerKind::EarlyWsQueue,
        SchedulerKind::EarlyWsSemi,
        SchedulerKind::EarlyWsNonBlocking,
        SchedulerKind::EarlyWsOptimistic,
        SchedulerKind::Auto,
    ];

    /// The scheduler's name, as accepted by `FromStr`.
    pub fn name(self) -> &'static str {
        match self {
            SchedulerKind::Sequential => "sequential",
            SchedulerKind::LateCbase => "late-cbase",
            SchedulerKind::LateBatchKeys => "late-batch-keys",
            SchedulerKind::LateBatchBitmap => "late-batch-bitmap",
            SchedulerKind::LateCbasePool => "late-cbase-pool",
            SchedulerKind::LateBatchBitmapPool => "late-batch-bitmap-pool",
            SchedulerKind::Early => "early",
            SchedulerKind::EarlyBusyWait => "early-busywait",
            SchedulerKind::EarlyWsQueue => "early-ws-queue",
            SchedulerKind::EarlyWsSemi => "early-ws-semi",
            SchedulerKind::EarlyWsNonBlocking => "early-ws-nonblocking",
            SchedulerKind::EarlyWsOptimistic => "early-ws-optimistic",
            SchedulerKind::Auto => "auto",
        }
    }

    /// True for schedulers that need a class-to-threads mapping.
    pub fn needs_mapping(self) -> bool {
        matches!(self, SchedulerKind::Early | SchedulerKind::EarlyBusyWait) || self.steals()
    }

    /// True for the work-stealing schedulers.
    pub fn steals(self) -> bool {
        matches!(
            self,
            SchedulerKind::EarlyWsQueue
                | SchedulerKind::EarlyWsSemi
                | SchedulerKind::EarlyWsNonBlocking
                | SchedulerKind::EarlyWsOptimistic
        )
    }

    /// The default bound on this scheduler's dependency graph, in its
    /// nodes: [`GRAPH_MAX_COMMANDS_DEFAULT`] for a graph of commands,
    /// [`GRAPH_MAX_BATCHES_DEFAULT`] for a graph of batches (and for the
    /// schedulers without a graph, which ignore it).
    pub fn graph_max_default(self) -> usize {
        match self {
            SchedulerKind::LateCbase | SchedulerKind::LateCbasePool => GRAPH_MAX_COMMANDS_DEFAULT,
            _ => GRAPH_MAX_BATCHES_DEFAULT,
        }
    }

    /// True for the schedulers that keep a dependency graph, whose size
    /// [`SchedConfig::graph_max`] bounds: the late ones, and `auto`, which
    /// may run `late-batch-bitmap`.
    pub fn has_graph(self) -> bool {
        matches!(
            self,
            SchedulerKind::LateCbase
                | SchedulerKind::LateBatchKeys
                | SchedulerKind::LateBatchBitmap
                | SchedulerKind::LateCbasePool
                | SchedulerKind::LateBatchBitmapPool
                | SchedulerKind::Auto
        )
    }

    /// The names of every scheduler, comma-separated, for messages.
    pub fn names() -> String {
        SchedulerKind::ALL.map(SchedulerKind::name).join(", ")
    }
}

impl fmt::Display for SchedulerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for SchedulerKind {
    type Err = SchedError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        SchedulerKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| SchedError::UnknownScheduler(s.to_string()))
    }
}

/// How to build a scheduler.
#[derive(Clone, Debug)]
pub struct SchedConfig {
    /// Which scheduler.
    pub kind: SchedulerKind,
    /// Worker threads (ignored by `sequential`, which uses the caller's).
    pub workers: usize,
    /// Late schedulers: most nodes in the dependency graph
    /// ([`SchedulerKind::graph_max_default`] by default).
    pub graph_max: usize,
    /// Early: most dispatched batches waiting in one worker's queue.
    pub queue_depth: usize,
    /// Early: the class-to-threads mapping (its worker count must equal
    /// `workers`).
    pub mapping: Option<Mapping>,
    /// Busy-waiting schedulers (`early-busywait` and the stealing ones):
    /// the most rounds a waiting thread spins before it starts yielding and
    /// napping (`0..=SPIN_MAX`). `None` chooses: spin
    /// [`SPIN_DEFAULT`] rounds when every worker can have a core of its own,
    /// not at all when there are more workers than cores (a spinning thread
    /// would then take the core from the thread it waits for). Each worker
    /// spins less than this where spinning does not pay
    /// ([`AdaptiveSpin`]), and not at all while the machine has more
    /// runnable threads than the process has CPUs ([`cpus::contended`]).
    pub spin: Option<u32>,
    /// Early: time synchronization and queue idleness for [`Metrics`]
    /// (counts are always kept).
    pub metrics: bool,
    /// Work stealing: the order in which idle workers visit victims.
    /// `None` chooses as 000 did: [`Victims::Next`] for
    /// `early-ws-optimistic`, [`Victims::First`] for the others.
    pub victims: Option<Victims>,
    /// `auto`: the length of one observation window
    /// ([`auto::WINDOW`] by default; tests shorten it to see many
    /// decisions in a short run).
    pub auto_window: std::time::Duration,
    /// `late-*-pool`: the policy of the psmr-rt pool the jobs run on
    /// (`fifo-slot` by default: a freed node runs next on the worker that
    /// freed it).
    pub pool: psmr_rt::Policy,
    /// Work stealing: the longest pause between fruitless steal rounds
    /// ([`STEAL_RETRY_MAX`] by default; see the backoff's reasons in the
    /// `ws` module). Zero retries at once, as 000's stealers did: for
    /// comparisons (`psmr sched-bench --steal-backoff`).
    pub steal_retry_max: std::time::Duration,
}

impl SchedConfig {
    /// A configuration with default bounds and no mapping.
    pub fn new(kind: SchedulerKind, workers: usize) -> Self {
        Self {
            kind,
            workers,
            graph_max: kind.graph_max_default(),
            queue_depth: QUEUE_DEPTH_DEFAULT,
            mapping: None,
            spin: None,
            metrics: false,
            victims: None,
            auto_window: auto::WINDOW,
            pool: psmr_rt::Policy::FifoSlot,
            steal_retry_max: STEAL_RETRY_MAX,
        }
    }

    /// Sets the mapping used by `early`.
    pub fn with_mapping(mut self, mapping: Mapping) -> Self {
        self.mapping = Some(mapping);
        self
    }

    /// The spin budget `early-busywait` uses: `spin`, or the automatic
    /// choice described there.
    pub fn spin_budget(&self) -> u32 {
        self.spin.unwrap_or_else(|| {
            let cores = cpus::Cpus::read().usable;
            if self.workers <= cores {
                SPIN_DEFAULT
            } else {
                0
            }
        })
    }
}

impl SchedConfig {
    /// The victim policy the work-stealing schedulers use: `victims`, or
    /// the default described there.
    pub fn victim_policy(&self) -> Victims {
        self.victims.unwrap_or(if self.kind == SchedulerKind::EarlyWsOptimistic {
            Victims::Next
        } else {
            Victims::First
        })
    }
}

/// Most worker threads a scheduler accepts.
pub const WORKERS_MAX: usize = psmr_model::WORKERS_MAX;

/// Errors of the schedulers.
#[derive(Debug, Error)]
pub enum SchedError {
    /// No scheduler has this name.
    #[error("unknown scheduler {0:?} (known: {names})", names = SchedulerKind::names())]
    UnknownScheduler(String),
    /// Invalid configuration value.
    #[error("invalid scheduler configuration: {0}")]
    Config(String),
    /// The mapping breaks a rule or does not fit the class model.
    #[error("invalid mapping: {0}")]
    Mapping(#[from] MappingError),
    /// A command names a class the model does not have.
    #[error("command (client {client}, seq {seq}) has class #{class} but the class model has {classes} classes")]
    UnknownClass {
        /// Client of the command.
        client: u64,
        /// Sequence number of the command.
        seq: u64,
        /// Its class id.
        class: u16,
        /// Number of classes of the model.
        classes: usize,
    },
    /// The service panicked while executing a command. Later commands were
    /// not executed.
    #[error("service panicked executing command (client {client}, seq {seq}, class #{class}): {message}")]
    ServicePanicked {
        /// Client of the command.
        client: u64,
        /// Sequence number of the command.
        seq: u64,
        /// Class of the command.
        class: u16,
        /// The panic message.
        message: String,
    },
    /// A worker thread died outside the service (a bug in psmr).
    #[error("worker thread {worker} panicked: {message}")]
    WorkerPanicked {
        /// The worker's id in its pool.
        worker: usize,
        /// The panic message.
        message: String,
    },
    /// The operating system refused a thread.
    #[error("cannot spawn worker thread: {0}")]
    Spawn(String),
    /// A scheduler switched away from panicked while its threads exited.
    #[error("a scheduler switched away from panicked while it finished: {0}")]
    Retired(String),
    /// Batches a scheduler held at a switch never reported back (a bug in
    /// psmr).
    #[error("{lost} of the {held} batches a scheduler held at a switch never reported back")]
    WithdrawnLost {
        /// Batches held at the switch.
        held: usize,
        /// Batches that never reported.
        lost: usize,
    },
}

/// What a finished scheduler reports.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SchedStats {
    /// Commands executed by each worker (index = worker id).
    pub executed_per_worker: Vec<u64>,
}

impl SchedStats {
    /// Commands executed in total.
    pub fn executed(&self) -> u64 {
        self.executed_per_worker.iter().sum()
    }
}

/// An execution scheduler. See the crate documentation.
pub trait Scheduler<S: Service>: Send {
    /// The scheduler's kind.
    fn kind(&self) -> SchedulerKind;

    /// Hands over the next batch in log order. Blocks while the scheduler's
    /// bounded queues are full. Fails once a command has panicked.
    fn submit(&mut self, batch: Batch<S::Op>) -> Result<(), SchedError>;

    /// The scheduler executing now: [`Scheduler::kind`], except for those
    /// that change it at run time (`auto`).
    fn running(&self) -> SchedulerKind {
        self.kind()
    }

    /// The latest decisions of a scheduler that changes itself at run time
    /// (`auto`), oldest first, at most [`auto::DECISIONS_KEPT`]; empty for
    /// the others.
    fn decisions(&self) -> Vec<auto::Decision> {
        Vec::new()
    }

    /// How many decisions it has taken so far: cheap, for callers that
    /// check after every batch whether to look at [`Scheduler::decisions`].
    fn decisions_made(&self) -> u64 {
        0
    }

    /// What runs, in words: the scheduler and its workers.
    fn describe(&self) -> String {
        self.running().name().to_string()
    }

    /// The per-worker metrics (000 §5.3) of the schedulers that keep them
    /// (the early ones), to sample from any thread while it runs.
    fn metrics(&self) -> Option<Arc<Metrics>> {
        None
    }

    /// Whether a command of `batch` may conflict with a command this
    /// scheduler was given and has not finished executing. Asked of a
    /// scheduler that is no longer given batches: where the answer is no,
    /// `batch` may run elsewhere at once, concurrently with what this one
    /// still executes ([`Switchable::switch_overlapped`]). `true`, the
    /// default, is always right; the late schedulers answer from their
    /// dependency graph, the early ones, once they have withdrawn, from the
    /// key summaries of the batches they began (what they gave back is no
    /// longer theirs).
    fn may_conflict(&self, _batch: &Batch<S::Op>) -> bool {
        true
    }

    /// Whether every command given has finished executing (after
    /// [`Scheduler::withdraw`], every command it kept), if the scheduler
    /// can tell cheaply; `false`, the default, when it cannot.
    fn drained(&self) -> bool {
        false
    }

    /// Stops the scheduler from beginning the batches it holds and has not
    /// begun, and hands them back for the next scheduler ([`Withdrawal`]),
    /// which may run each of them, and what follows, beside what this one
    /// still executes where [`Scheduler::may_conflict`] says no, and the
    /// rest once this one has executed everything it kept. Asked of a
    /// scheduler that is given no more batches; only `may_conflict`,
    /// `drained` and [`Scheduler::finish`] may follow. `None`, the default,
    /// for a scheduler that executes everything it was given; the early
    /// schedulers withdraw what still waits in their queues.
    fn withdraw(&mut self) -> Option<Withdrawal<S::Op>> {
        None
    }

    /// Waits until every submitted command has executed, stops and joins
    /// every thread, and reports. Fails if a command panicked.
    fn finish(self: Box<Self>) -> Result<SchedStats, SchedError>;
}

/// Builds the scheduler `config.kind` over `service`.
///
/// `model` is the service's class model: `early` routes by it, and every
/// scheduler uses it to reject commands whose class id is out of range.
pub fn build<S: Service>(
    config: &SchedConfig,
    service: Arc<S>,
    model: &ClassModel,
    sink: Arc<dyn ReplySink<S::Reply>>,
) -> Result<Box<dyn Scheduler<S>>, SchedError> {
    if config.kind != SchedulerKind::Sequential && (config.workers == 0 || config.workers > WORKERS_MAX) {
        return Err(SchedError::Config(format!("workers must be between 1 and {WORKERS_MAX}, got {}", config.workers)));
    }
    if config.graph_max == 0 || config.graph_max > GRAPH_MAX_LIMIT {
        return Err(SchedError::Config(format!(
            "graph size must be between 1 and {GRAPH_MAX_LIMIT}, got {}",
            config.graph_max
        )));
    }
    if let Some(spin) = config.spin.filter(|&s| s > SPIN_MAX) {
        return Err(SchedError::Config(format!("spin budget must be between 0 and {SPIN_MAX}, got {spin}")));
    }
    if config.queue_depth == 0 {
        return Err(SchedError::Config("queue depth must be at least 1".into()));
    }
    let classes = model.len();
    Ok(match config.kind {
        SchedulerKind::Sequential => Box::new(sequential::Sequential::new(service, sink, classes)),
        SchedulerKind::LateCbase | SchedulerKind::LateBatchKeys | SchedulerKind::LateBatchBitmap => {
            Box::new(late::Late::new(config, service, sink, classes)?)
        }
        SchedulerKind::LateCbasePool | SchedulerKind::LateBatchBitmapPool => {
            Box::new(late_pool::LatePool::new(config, service, sink, classes)?)
        }
        SchedulerKind::Auto => Box::new(auto::Auto::new(config, service, model, sink)?),
        kind => {
            debug_assert!(kind.needs_mapping());
            let mapping = config
                .mapping
                .as_ref()
                .ok_or_else(|| SchedError::Config("the early scheduler needs a class-to-threads mapping".into()))?;
            if mapping.workers() != config.workers {
                return Err(SchedError::Config(format!(
                    "mapping is for {} workers but the scheduler has {}",
                    mapping.workers(),
                    config.workers
                )));
            }
            mapping.validate(model)?;
            Box::new(early::Early::new(config, mapping.clone(), model, service, sink)?)
        }
    })
}

/// Checks that every command's class is in the model, before any of the
/// batch is scheduled: a bad command must not leave a half-scheduled batch.
pub(crate) fn check_classes<O>(batch: &Batch<O>, classes: usize) -> Result<(), SchedError> {
    match batch.commands().iter().find(|c| c.class.index() >= classes) {
        Some(c) => Err(SchedError::UnknownClass { client: c.client.0, seq: c.seq, class: c.class.0, classes }),
        None => Ok(()),
    }
}
