//! What a simulation found: the clients' history, the violations, the
//! faults injected and the counters; and the errors that stop one.

use crate::config::Faults;
use serde::Serialize;
use std::collections::BTreeMap;
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
    /// An entry's stamp is earlier than the stamp of an entry before it.
    StampBack,
}

impl ViolationKind {
    /// A short name.
    pub fn name(self) -> &'static str {
        match self {
            ViolationKind::Divergence => "divergence",
            ViolationKind::StampBack => "stamp-back",
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
    /// Snapshot chunks delivered.
    pub snapshot_chunks: u64,
    /// Snapshots from a leader restored (received in chunks, checked).
    pub snapshots_installed: u64,
    /// Snapshot transfer messages refused (damaged, out of place, not
    /// offered).
    pub transfer_refusals: u64,
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
    /// The events as text, if [`SimConfig::trace`](crate::SimConfig::trace).
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
