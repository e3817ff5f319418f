//! # psmr-sim: deterministic simulation of whole clusters
//!
//! A cluster of 3 or 5 replicas and a handful of clients run in one
//! process, on one thread, on a simulated clock, network and disk, every
//! random choice drawn from one seeded generator
//! ([`rand_chacha::ChaCha8Rng`]): the same seed gives the same run, event
//! for event, on any machine. A failing seed is a reproducible bug report:
//! `psmr simulate --replay SEED` runs it again and prints its trace.
//!
//! ## What is real and what is simulated
//!
//! Real: each replica's whole core, the code replicas run
//! (`psmr-core`). Its protocol — raft-rs's `RawNode` in the configuration
//! of real replicas, the guard every peer message passes, the batcher, the
//! reads without the log (ReadIndex rounds, floors, deferred requests),
//! membership changes driven by client requests, ready handling — and its
//! apply loop — the reply cache consulted in log order, the snapshot
//! triggers and format, the restore — with the key-value store executed
//! through psmr-sched's `sequential` scheduler behind the `Scheduler`
//! trait, exactly as a replica's service manager submits to it. What a
//! replica's threads do around the core, this crate does around it
//! (its `node` module): requests checked and encoded as ClientIO does them, answers
//! sent to the clients served here, snapshots written as the side pool
//! writes them.
//!
//! Simulated, and nothing else:
//!
//! * the disk (its `store` module): synced and unsynced writes, a crash losing the
//!   unsynced, torn writes, a full disk, damage; every restart recovers by
//!   the disk store's own rule (psmr-storage's sync record), and a refused
//!   replica is repaired as an operator repairs one;
//! * the network (`net`), the clock (every replica's raft tick at its own
//!   rate under `skew`), and the clients (`client`): one request
//!   outstanding each, of one to three commands of a few keys, so that they
//!   conflict constantly; retried with the same sequence numbers elsewhere
//!   after a timeout or a redirect, given up after [`ATTEMPTS_MAX`]
//!   attempts (a write is then `unknown`, a read `fail`).
//!
//! Replicas draw raft's randomized election timeouts from a generator the
//! simulation seeds (`psmr_core::protocol::Options`), so a run depends on
//! its seed alone.
//!
//! ## Faults
//!
//! Each kind can be switched on or off ([`Faults`]); when on, its rate is
//! drawn per seed, so some runs are calm and some are storms.
//!
//! * `loss`: a packet (raft message, request or reply) is dropped.
//! * `delay`: a packet takes up to 100 ms instead of up to 1.5 ms.
//! * `duplicate`: a packet arrives twice.
//! * `reorder`: packets of one link may overtake each other (otherwise
//!   links are FIFO, like TCP connections).
//! * `partition`: the replicas are split in two groups that cannot talk;
//!   `one-way`: one group's packets to the other are dropped, but not the
//!   other way round. Clients reach every replica.
//! * `crash`: a replica loses everything in memory and what its disk had
//!   not synced, and restarts later from its disk.
//! * `torn`: the crash strikes the replica's next synced write, which has
//!   reached the disk or not; some of the messages it was sending left,
//!   and the apply loop may have taken the work handed to it.
//! * `skew`: each replica's raft tick runs at its own rate, 0.7 to 1.4
//!   times the nominal 10 ms.
//! * `membership`: replicas join and leave. The founders' logs start with
//!   the founding entries, as real replicas' do, and two more replicas may
//!   join. Now and then an administrator asks the replica it believes
//!   leads for a change, as `psmr client add-replica` / `remove-replica`
//!   do, and follows redirects until it is answered: add a replica that
//!   never ran (it starts at once with an empty log) or remove a member
//!   (keeping three). A replica stops as soon as it commits its own
//!   removal; one that never learns it is stopped at the end, as its next
//!   handshake would tell a real one.
//! * `disk-full`: a replica's disk refuses synced writes for a while; the
//!   replica stops with the store's reason, and restarts once space is
//!   back, with nothing lost.
//! * `damage`: a crashed replica's log loses synced entries; at its restart
//!   recovery refuses it, and it is repaired (an empty log, its term and
//!   vote kept, a vote floor) and catches up.
//! * `pause`: a replica's process stops (a long garbage collection, a
//!   `SIGSTOP`, a virtual machine descheduled) for up to half a second:
//!   what reaches it waits, its clock does not tick; then it goes on where
//!   it was, one tick later, believing what it believed (a leader that did
//!   not see its successor elected).
//!
//! A run has two phases: `steps` simulated milliseconds of load with
//! faults, then a quiet phase: every fault healed, every replica up, no new
//! requests, until every replica has applied everything the leader
//! committed (or [`SimConfig::quiet_ms`] passes: no convergence is a
//! violation too).
//!
//! ## What is checked
//!
//! * Agreement: the entries every replica applies are prefixes of one
//!   sequence: (index, term, digest of the entry's data) must match.
//! * Equal states: the state digest after each applied index is the same on
//!   every replica that applies it (or restores a snapshot there), and at
//!   the end every replica has the same applied index, state and reply
//!   cache.
//! * Exactly-once: a write (client, sequence number) executes at one log
//!   index only, however many times it was retried and proposed.
//! * Client order: a client's commands execute in the order of their
//!   sequence numbers.
//! * Linearizability of the clients' history ([`SimOutcome::history`]),
//!   by [`dst`] with psmr-harness's checker.
//!
//! ## Testing the checks: planted bugs
//!
//! [`SimConfig::bug`] plants a known bug in the replicas' core
//! ([`Bug`], never in this crate's code): the tests make sure the checks
//! catch each one, so that a simulation that passes means something.
//!
//! ## Replaying
//!
//! Every run is a function of its seed and its [`SimConfig`]. With
//! [`SimConfig::trace`] on, [`SimOutcome::trace`] lists every event (packet
//! deliveries with their raft fields, proposals, role changes, crashes,
//! partitions, client operations); [`SimOutcome::trace_hash`] digests the
//! same events and is always computed.

mod checks;
mod client;
pub mod dst;
mod net;
mod node;
mod store;
mod world;

pub use client::ATTEMPTS_MAX;
pub use psmr_core::bug::Bug;

use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use thiserror::Error;

/// Errors that stop a simulation before it can say anything about the
/// system under test.
#[derive(Debug, Error)]
pub enum SimError {
    /// The fault list does not parse.
    #[error("unknown fault {0:?}: expected all, none, or a comma-separated list of {list}", list = Faults::NAMES.join(", "))]
    Faults(String),
    /// The bug name does not parse.
    #[error(transparent)]
    Bug(#[from] psmr_core::bug::UnknownBug),
    /// The configuration cannot be simulated.
    #[error("invalid simulation configuration: {0}")]
    Config(String),
    /// raft refused to start a node.
    #[error("replica {replica}: raft: {why}")]
    Raft {
        /// The replica.
        replica: u64,
        /// Why.
        why: String,
    },
    /// A replica's kept snapshot cannot be restored at restart.
    #[error("replica {replica}: cannot restore its snapshot: {why}")]
    Snapshot {
        /// The replica.
        replica: u64,
        /// Why.
        why: String,
    },
}

/// Which fault kinds a run injects (see the module documentation).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Faults {
    /// Packets are lost.
    pub loss: bool,
    /// Some packets take far longer.
    pub delay: bool,
    /// Packets arrive twice.
    pub duplicate: bool,
    /// Packets of one link overtake each other.
    pub reorder: bool,
    /// Symmetric partitions between replicas.
    pub partition: bool,
    /// One-way partitions.
    pub one_way: bool,
    /// Replicas crash and restart from their disk.
    pub crash: bool,
    /// Crashes in the middle of a ready.
    pub torn: bool,
    /// Replicas' ticks run at different rates.
    pub skew: bool,
    /// Replicas join and leave the cluster.
    pub membership: bool,
    /// A replica's disk fills up for a while.
    pub disk_full: bool,
    /// A crashed replica's log loses synced entries; it is repaired.
    pub damage: bool,
    /// A replica's process stops for a while, then goes on where it was.
    pub pause: bool,
}

impl Faults {
    /// The names [`Faults::parse`] takes, in order.
    pub const NAMES: [&'static str; 13] = [
        "loss",
        "delay",
        "duplicate",
        "reorder",
        "partition",
        "one-way",
        "crash",
        "torn",
        "skew",
        "membership",
        "disk-full",
        "damage",
        "pause",
    ];

    /// Every fault kind.
    pub fn all() -> Self {
        Self {
            loss: true,
            delay: true,
            duplicate: true,
            reorder: true,
            partition: true,
            one_way: true,
            crash: true,
            torn: true,
            skew: true,
            membership: true,
            disk_full: true,
            damage: true,
            pause: true,
        }
    }

    /// No fault at all.
    pub fn none() -> Self {
        Self::default()
    }

    fn flag(&mut self, name: &str) -> Option<&mut bool> {
        Some(match name {
            "loss" => &mut self.loss,
            "delay" => &mut self.delay,
            "duplicate" | "dup" => &mut self.duplicate,
            "reorder" => &mut self.reorder,
            "partition" => &mut self.partition,
            "one-way" | "oneway" => &mut self.one_way,
            "crash" => &mut self.crash,
            "torn" => &mut self.torn,
            "skew" => &mut self.skew,
            "membership" => &mut self.membership,
            "disk-full" => &mut self.disk_full,
            "damage" => &mut self.damage,
            "pause" => &mut self.pause,
            _ => return None,
        })
    }

    /// `all`, `none`, or a comma-separated list of [`Faults::NAMES`].
    pub fn parse(text: &str) -> Result<Self, SimError> {
        match text.trim() {
            "all" => return Ok(Self::all()),
            "none" | "" => return Ok(Self::none()),
            _ => {}
        }
        let mut f = Self::none();
        for name in text.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            *f.flag(name).ok_or_else(|| SimError::Faults(name.to_string()))? = true;
        }
        Ok(f)
    }

    /// The kinds switched on, comma-separated (`none` if none is).
    pub fn names(&self) -> String {
        let mut copy = *self;
        let on: Vec<&str> = Self::NAMES.iter().copied().filter(|n| copy.flag(n).is_some_and(|f| *f)).collect();
        if on.is_empty() {
            "none".into()
        } else if on.len() == Self::NAMES.len() {
            "all".into()
        } else {
            on.join(",")
        }
    }
}

impl fmt::Display for Faults {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.names())
    }
}

/// What to simulate.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// Replicas; 0 draws 3 or 5 from the seed.
    pub replicas: usize,
    /// Clients.
    pub clients: usize,
    /// Keys the clients read and write (few: conflicts).
    pub keys: u64,
    /// Simulated milliseconds of load with faults.
    pub steps: u64,
    /// Longest quiet phase after the load, in simulated milliseconds.
    pub quiet_ms: u64,
    /// Fault kinds injected.
    pub faults: Faults,
    /// Reads through the log (`Some(true)`), without it with raft's
    /// ReadIndex as leaders serve them by default (`Some(false)`, see
    /// `crate::reads`), or either, drawn per seed (`None`).
    pub reads_through_log: Option<bool>,
    /// A bug to inject (testing aid).
    pub bug: Option<Bug>,
    /// Keep the trace as text ([`SimOutcome::trace`]).
    pub trace: bool,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            replicas: 0,
            clients: 4,
            keys: 4,
            steps: 2_000,
            quiet_ms: 10_000,
            faults: Faults::all(),
            reads_through_log: None,
            bug: None,
            trace: false,
        }
    }
}

impl SimConfig {
    /// Checks the bounds.
    pub fn validate(&self) -> Result<(), SimError> {
        if self.replicas > 9 {
            return Err(SimError::Config(format!("{} replicas: at most 9", self.replicas)));
        }
        if !(1..=64).contains(&self.clients) {
            return Err(SimError::Config(format!("{} clients: between 1 and 64", self.clients)));
        }
        if !(1..=1_000).contains(&self.keys) {
            return Err(SimError::Config(format!("{} keys: between 1 and 1000", self.keys)));
        }
        if self.steps > 3_600_000 || self.quiet_ms > 3_600_000 {
            return Err(SimError::Config("steps and quiet_ms: at most an hour of simulated time".into()));
        }
        Ok(())
    }
}

/// The kind of an operation in a simulated history.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum OpKind {
    /// A read of a key.
    Read,
    /// A write of a key.
    Write,
}

/// What an operation returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum OpResult {
    /// A read's value (`None`: never written).
    Read(Option<u64>),
    /// Whether the key had a value before the write.
    Write(bool),
    /// A reply that does not fit the operation (only a bug sends one).
    Garbled,
}

/// What became of an operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum OpStatus {
    /// Answered.
    Ok,
    /// Definitely not executed (or a read, which has no effect anyway).
    Fail,
    /// Unanswered: may have taken effect at any time after its invocation.
    Unknown,
}

/// One client operation of a simulated history.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SimOp {
    /// The client.
    pub client: u64,
    /// Its sequence number.
    pub seq: u64,
    /// Read or write.
    pub kind: OpKind,
    /// The key.
    pub key: u64,
    /// The value written.
    pub value: Option<u64>,
    /// The answer, if `Ok`.
    pub result: Option<OpResult>,
    /// When the client invoked it, simulated µs.
    pub invoke_us: u64,
    /// When the answer arrived (if `Ok`), simulated µs.
    pub complete_us: u64,
    /// What became of it.
    pub status: OpStatus,
}

/// The kinds of violations the simulation finds by itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum ViolationKind {
    /// Two replicas applied different entries at one index, or a replica
    /// skipped or repeated an index.
    Divergence,
    /// Two replicas' states differ at the same applied index.
    StateMismatch,
    /// A write executed twice.
    DoubleExecution,
    /// The quiet phase ended before every replica caught up.
    NoConvergence,
    /// The guard refused a message (no honest replica sends one it
    /// refuses).
    GuardRefusal,
    /// A replica hit an error a real replica stops on (or cannot start
    /// again from its disk).
    Stopped,
    /// A client's commands executed out of the order of their sequence
    /// numbers.
    ClientOrder,
    /// Code under test panicked (raft-rs's assertions among others): the
    /// run stops there.
    Panic,
}

impl ViolationKind {
    /// A short name.
    pub fn name(self) -> &'static str {
        match self {
            ViolationKind::Divergence => "divergence",
            ViolationKind::StateMismatch => "state-mismatch",
            ViolationKind::DoubleExecution => "double-execution",
            ViolationKind::NoConvergence => "no-convergence",
            ViolationKind::GuardRefusal => "guard-refusal",
            ViolationKind::Stopped => "stopped",
            ViolationKind::ClientOrder => "client-order",
            ViolationKind::Panic => "panic",
        }
    }
}

/// One violation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Violation {
    /// Its kind.
    pub kind: ViolationKind,
    /// What happened.
    pub description: String,
}

/// Faults injected in a run (or summed over runs).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct FaultCounts {
    /// Packets lost.
    pub lost: u64,
    /// Packets duplicated.
    pub duplicated: u64,
    /// Packets delayed far longer than usual.
    pub delayed: u64,
    /// Packets dropped by a partition.
    pub cut: u64,
    /// Symmetric partitions.
    pub partitions: u64,
    /// One-way partitions.
    pub one_way_partitions: u64,
    /// Crashes (torn ones included).
    pub crashes: u64,
    /// Crashes in the middle of a ready.
    pub torn_crashes: u64,
    /// Restarts.
    pub restarts: u64,
    /// Membership changes completed (replicas added or removed).
    pub member_changes: u64,
    /// Replicas stopped by a full disk.
    pub full_stops: u64,
    /// Damaged logs refused at a restart, and repaired.
    pub repairs: u64,
    /// Replicas paused.
    pub pauses: u64,
}

impl FaultCounts {
    /// Adds `other` to these counts.
    pub fn add(&mut self, other: &FaultCounts) {
        self.lost += other.lost;
        self.duplicated += other.duplicated;
        self.delayed += other.delayed;
        self.cut += other.cut;
        self.partitions += other.partitions;
        self.one_way_partitions += other.one_way_partitions;
        self.crashes += other.crashes;
        self.torn_crashes += other.torn_crashes;
        self.restarts += other.restarts;
        self.member_changes += other.member_changes;
        self.full_stops += other.full_stops;
        self.repairs += other.repairs;
        self.pauses += other.pauses;
    }
}

/// Counters of a run.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SimStats {
    /// Simulated time, ms.
    pub sim_ms: u64,
    /// Events processed.
    pub events: u64,
    /// Packets delivered.
    pub delivered: u64,
    /// Highest index applied by any replica.
    pub applied: u64,
    /// Highest term reached.
    pub term: u64,
    /// Operations answered.
    pub ops_ok: u64,
    /// Writes left unanswered.
    pub ops_unknown: u64,
    /// Reads abandoned or refused.
    pub ops_fail: u64,
    /// Commands answered from a reply cache (retries of commands executed
    /// before), over all replicas.
    pub cache_answers: u64,
    /// Reads a leader served without the log (ReadIndex).
    pub reads_without_log: u64,
}

/// The result of one run.
#[derive(Clone, Debug)]
pub struct SimOutcome {
    /// The seed.
    pub seed: u64,
    /// Replicas simulated.
    pub replicas: usize,
    /// The clients' operations, in invocation order.
    pub history: Vec<SimOp>,
    /// A digest of every event of the run.
    pub trace_hash: u64,
    /// The events as text, if [`SimConfig::trace`].
    pub trace: Vec<String>,
    /// What the simulation's own checks found (the first few).
    pub violations: Vec<Violation>,
    /// How many violations they found, kept or not.
    pub violations_found: u64,
    /// Guard refusals by rule.
    pub refused: BTreeMap<&'static str, u64>,
    /// Faults injected.
    pub faults: FaultCounts,
    /// Counters.
    pub stats: SimStats,
}

/// Runs one simulation.
pub fn run(seed: u64, config: &SimConfig) -> Result<SimOutcome, SimError> {
    config.validate()?;
    // The simulated replicas' own log lines are not the caller's: the
    // trace says what happened.
    tracing::subscriber::with_default(tracing::subscriber::NoSubscriber::default(), || run_quietly(seed, config))
}

fn run_quietly(seed: u64, config: &SimConfig) -> Result<SimOutcome, SimError> {
    let mut world = world::World::new(seed, config)?;
    // What stops the run early is a finding about the system under test:
    // the outcome keeps the trace up to that point, to replay it.
    match catch_unwind(AssertUnwindSafe(|| world.run())) {
        Ok(Ok(())) => {}
        Ok(Err(e)) => world.stopped(ViolationKind::Stopped, e.to_string()),
        Err(payload) => {
            world.stopped(ViolationKind::Panic, format!("panicked: {}", psmr_sched::panic_message(payload.as_ref())))
        }
    }
    Ok(world.finish())
}
