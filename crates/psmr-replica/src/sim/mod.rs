//! # Deterministic simulation of a whole cluster
//!
//! A cluster of 3 or 5 replicas and a handful of clients run in one
//! process, on one thread, on a simulated clock and a simulated network,
//! every random choice drawn from one seeded generator
//! ([`rand_chacha::ChaCha8Rng`]): the same seed gives the same run, event
//! for event, on any machine. A failing seed is a reproducible bug report:
//! `psmr simulate --replay SEED` runs it again and prints its trace.
//!
//! ## What is real and what is simulated
//!
//! Real, the code a replica runs:
//!
//! * the raft core (raft-rs's `RawNode`, built with the configuration of
//!   real replicas: check quorum, pre-vote, no commit broadcast) and the
//!   protocol thread's ready handling (`protocol::handle_ready`, the very
//!   function the protocol thread calls);
//! * the [`crate::guard`]: every peer message passes it before `step`, as
//!   on the protocol thread (a refusal is reported as a violation: the
//!   guard refuses only what no honest replica sends, whatever the network
//!   did to it);
//! * the log store ([`crate::store::LogStore`], raft-rs's memory storage
//!   with the service snapshots) and the log entry encoding;
//! * the reply cache ([`crate::cache::ReplyCache`]), consulted in log order
//!   exactly as the service manager does, and the service manager's
//!   snapshot format and compaction (every `snapshot_every` entries, a few
//!   entries of slack kept), so lagging replicas catch up by snapshot;
//! * reads without the log ([`crate::reads`]): in half the seeds (drawn,
//!   or fixed by [`SimConfig::reads_through_log`]) a leader serves reads
//!   with raft's ReadIndex as real leaders do, rounds, floors, deferred
//!   requests and all, and the clients' history checks them too.
//!
//! Simulated:
//!
//! * the service: a few registers ([`Registers`], keys and values `u64`,
//!   reads and writes of one key), executed sequentially in log order on
//!   the simulation's thread. The parallel schedulers are not run here:
//!   their threads would make runs slow and their timing
//!   non-deterministic; the differential tests of `psmr-sched` check that
//!   every scheduler ends in the state and replies of sequential execution.
//! * the disk: the memory log store stands for it. It changes only when a
//!   ready has been handled whole (its entries and hard state stored, in
//!   one synced write as the disk store does) or a snapshot installed, so a
//!   crash between two readies keeps what was synced. As on the disk store,
//!   the commit index of a ready's light part (`Log::set_commit`) is
//!   written without a sync and becomes durable with the next synced
//!   write: a crash before that takes it back (a crash is a machine
//!   crash, not just a process crash). A *torn* crash strikes in the
//!   middle of a ready (see below).
//! * the network, the clock, the clients (see below).
//!
//! raft-rs draws randomized election timeouts from `rand::thread_rng()`;
//! after every call into a node whose election clock was just reset
//! (`election_elapsed == 0`), the simulation overwrites the draw with one
//! from the run's generator, so the thread's generator never matters.
//!
//! ## Clients
//!
//! Each client has one request outstanding at a time: a read or a write
//! (every written value unique) of one of a few keys, so that clients
//! conflict constantly. It sends it to the replica it believes leads; a
//! follower answers with the leader it knows (a redirect); the leader
//! proposes the requests it received as one log entry; the replica that
//! received a request answers it when it applies it (from the reply cache,
//! if it executed before). A client retries the same (client, sequence
//! number) at another replica after a timeout and gives up after
//! [`ATTEMPTS_MAX`] attempts: a write is then `unknown`, a read `fail`.
//! Replies cross the simulated network too, and may be lost: the retry is
//! then answered by the reply cache.
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
//! * `crash`: a replica loses everything in memory and restarts later from
//!   its disk (its log store: entries, hard state, kept snapshot).
//! * `torn`: the crash strikes while a ready is being handled: some of the
//!   messages raft lets go before the ready's entries are stored may have
//!   left (a leader's appends), the committed entries may have reached the
//!   service, but the ready's entries and hard state never reached the
//!   disk, and no message that depends on them was sent.
//! * `skew`: each replica's raft tick runs at its own rate, 0.7 to 1.4
//!   times the nominal 10 ms.
//! * `membership`: replicas join and leave. The founders' logs start with
//!   the founding entries, as real replicas' do, and two more replicas
//!   may join. Now and then a membership goal starts: add a replica that
//!   never ran (it starts at once with an empty log) or remove a member
//!   (keeping three). The leader of the moment takes the steps real
//!   leaders take (`admin::next_step`: learner, caught up, voter;
//!   leadership handed over before its own removal), whoever leads next
//!   goes on. A replica stops as soon as it commits its own removal; one
//!   that never learns it is stopped at the end, as its next handshake
//!   would tell a real one. Members refuse removed replicas' messages.
//!   Agreement, states and convergence are checked over the members at
//!   the end.
//!
//! A run has two phases: `steps` simulated milliseconds of load with
//! faults, then a quiet phase: every fault healed, every replica up, no
//! new requests, until every replica has applied everything the leader
//! committed (or [`SimConfig::quiet_ms`] passes: no convergence is a
//! violation too).
//!
//! ## What is checked
//!
//! * Agreement: the entries every replica applies are prefixes of one
//!   sequence: (index, term, digest of the entry's data) must match, and a
//!   replica applies index `i + 1` right after `i`.
//! * Equal states: the service state digest ([`psmr_model::Service::digest`])
//!   after each index is the same on every replica that applies it (or
//!   restores a snapshot there), and at the end every replica has the same
//!   applied index, state and reply cache.
//! * Exactly-once: a write (client, sequence number) executes at one log
//!   index only, however many times it was retried and proposed.
//! * Linearizability of the clients' history ([`SimOutcome::history`]):
//!   checked outside this crate (`psmr_bench::dst`, which feeds it to
//!   `psmr_bench::history::check_linearizable`).
//!
//! ## Testing the checks: injected bugs
//!
//! [`SimConfig::bug`] injects a known bug ([`Bug`]), a testing aid only:
//! the tests make sure the checks catch each one for some seed, so that a
//! simulation that passes means something.
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
mod net;
mod node;
mod service;

pub use client::ATTEMPTS_MAX;
pub use service::{RegOp, RegReply, Registers};

use crate::admin::{Goal, Step};
use crate::cache::Limits;
use checks::{Checks, Trace};
use client::{Action, Client, ClientEnv};
use net::{Addr, Answer, Net, NetParams, Packet, Payload};
use node::{Env, Node, NodeSettings};
use raft::StateRole;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use thiserror::Error;

/// The nominal raft tick, µs.
const TICK_US: u64 = 10_000;
/// Faults are considered this often during the load, µs.
const CHAOS_EVERY_US: u64 = 20_000;
/// Convergence is looked for this often in the quiet phase, µs.
const CHECK_EVERY_US: u64 = 20_000;
/// First client id (replicas are 1..=n).
const CLIENT_ID_BASE: u64 = 1_001;
/// Replicas that may join a run with membership changes on, beyond its
/// founders.
const SPARES: usize = 2;

/// Replica `id`'s addresses: made up (the simulated network routes by id)
/// but distinct, as the membership requires.
fn sim_member(id: u64) -> crate::Member {
    let addr = |base: u64| std::net::SocketAddr::from(([127, 0, 0, 1], (base + id) as u16));
    crate::Member::new(id, addr(20_000), addr(30_000))
}

/// Errors that stop a simulation before it can say anything about the
/// system under test.
#[derive(Debug, Error)]
pub enum SimError {
    /// The fault list does not parse.
    #[error("unknown fault {0:?}: expected all, none, or a comma-separated list of {list}", list = Faults::NAMES.join(", "))]
    Faults(String),
    /// The bug name does not parse.
    #[error("unknown bug {0:?}: expected one of {list}", list = Bug::NAMES.join(", "))]
    Bug(String),
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
}

impl Faults {
    /// The names [`Faults::parse`] takes, in order.
    pub const NAMES: [&'static str; 10] =
        ["loss", "delay", "duplicate", "reorder", "partition", "one-way", "crash", "torn", "skew", "membership"];

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

/// A known bug to inject, so that tests can make sure the checks catch it
/// (a testing aid: never on in a real run).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Bug {
    /// The leader answers a write as soon as it proposes it, before the
    /// entry is committed: a write the cluster later loses was
    /// acknowledged (caught as a linearizability violation).
    AckBeforeCommit,
    /// A restarted replica comes back with an empty log, as if its disk
    /// had not synced anything: it may vote for logs missing entries it
    /// acknowledged, and committed entries can be lost.
    ForgetLogOnRestart,
    /// The reply cache is skipped: a retried write executes again (caught
    /// by the exactly-once check).
    NoReplyCache,
    /// A leader serves reads without the log at once, from its state,
    /// without a ReadIndex round: a leader cut off from the others still
    /// believes it leads and answers stale reads (caught as a
    /// linearizability violation).
    ReadWithoutRound,
}

impl Bug {
    /// The names [`Bug::parse`] takes.
    pub const NAMES: [&'static str; 4] =
        ["ack-before-commit", "forget-log-on-restart", "no-reply-cache", "read-without-round"];

    /// Parses one of [`Bug::NAMES`].
    pub fn parse(text: &str) -> Result<Self, SimError> {
        match text.trim() {
            "ack-before-commit" => Ok(Bug::AckBeforeCommit),
            "forget-log-on-restart" => Ok(Bug::ForgetLogOnRestart),
            "no-reply-cache" => Ok(Bug::NoReplyCache),
            "read-without-round" => Ok(Bug::ReadWithoutRound),
            other => Err(SimError::Bug(other.to_string())),
        }
    }

    /// Its name in [`Bug::NAMES`].
    pub fn name(self) -> &'static str {
        match self {
            Bug::AckBeforeCommit => "ack-before-commit",
            Bug::ForgetLogOnRestart => "forget-log-on-restart",
            Bug::NoReplyCache => "no-reply-cache",
            Bug::ReadWithoutRound => "read-without-round",
        }
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
    let mut world = World::new(seed, config)?;
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

enum Event {
    Deliver(Packet),
    Tick {
        node: usize,
        incarnation: u64,
    },
    /// A node's batch is due.
    Flush {
        node: usize,
        incarnation: u64,
    },
    Issue {
        client: usize,
    },
    ClientTimer {
        client: usize,
        seq: u64,
        attempt: u32,
    },
    Chaos,
    /// A torn crash that found no ready to strike in becomes a plain one.
    Crash {
        node: usize,
        incarnation: u64,
    },
    Restart {
        node: usize,
    },
    Heal,
    EndLoad,
    Check,
}

struct Scheduled {
    at: u64,
    order: u64,
    event: Event,
}

impl PartialEq for Scheduled {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.order) == (other.at, other.order)
    }
}
impl Eq for Scheduled {}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Scheduled {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.order).cmp(&(other.at, other.order))
    }
}

/// The fault rates of a run, drawn from its seed.
struct Rates {
    /// Chance per chaos round that a replica crashes.
    crash: f64,
    /// Chance per chaos round that a partition starts (when none is on).
    partition: f64,
    /// How long a crashed replica stays down, µs.
    down_us: (u64, u64),
    /// How long a partition lasts, µs.
    partition_us: (u64, u64),
}

struct World {
    config: SimConfig,
    seed: u64,
    rng: ChaCha8Rng,
    now: u64,
    order: u64,
    queue: BinaryHeap<Reverse<Scheduled>>,
    net: Net,
    settings: NodeSettings,
    nodes: Vec<Node>,
    ids: Vec<u64>,
    clients: Vec<Client>,
    history: Vec<SimOp>,
    checks: Checks,
    trace: Trace,
    counts: FaultCounts,
    stats: SimStats,
    rates: Rates,
    /// The load (and the faults) go on.
    active: bool,
    quiet_deadline: u64,
    done: bool,
    /// (role, term) of each replica after its last turn, to trace changes.
    roles: Vec<(StateRole, u64)>,
    /// The membership change under way, and the log index a learner must
    /// hold before it votes with the term of the leader that set it (see
    /// `admin::Pending`).
    goal: Option<(Goal, (u64, u64))>,
    /// Chance per chaos round that a membership change starts.
    member_rate: f64,
}

impl World {
    fn new(seed: u64, config: &SimConfig) -> Result<Self, SimError> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let n =
            if config.replicas == 0 { *[3usize, 5].choose(&mut rng).expect("two choices") } else { config.replicas };
        let f = &config.faults;
        let mut params = NetParams::benign();
        if f.loss {
            params.loss = rng.gen_range(0.0..0.15);
        }
        if f.duplicate {
            params.duplicate = rng.gen_range(0.0..0.08);
        }
        if f.delay {
            params.long_delay = rng.gen_range(0.0..0.08);
            params.long_delay_max_us = 100_000;
        }
        if f.reorder {
            params.fifo = false;
            params.delay_max_us = rng.gen_range(1_500..5_000);
        }
        let rates = Rates {
            crash: if f.crash { rng.gen_range(0.0..0.08) } else { 0.0 },
            partition: if f.partition || f.one_way { rng.gen_range(0.0..0.08) } else { 0.0 },
            down_us: (10_000, rng.gen_range(50_000..600_000)),
            partition_us: (20_000, rng.gen_range(50_000..600_000)),
        };
        // Replicas that may join later: two more than the founders.
        let spares = if f.membership { SPARES } else { 0 };
        let ids: Vec<u64> = (1..=(n + spares) as u64).collect();
        let founders = (1..=n as u64).map(sim_member).collect();
        let snapshot_every = rng.gen_range(4..40);
        let settings = NodeSettings {
            founders,
            config: crate::Config::default(),
            snapshot_every,
            log_slack: rng.gen_range(0..=snapshot_every),
            cache: Limits {
                window: *[2u64, 8, 1_024].choose(&mut rng).expect("three choices"),
                ..Limits::of(&crate::Config::default())
            },
            batch_delay_us: rng.gen_range(0..3_000),
            reads_through_log: config.reads_through_log.unwrap_or_else(|| rng.gen_bool(0.5)),
        };
        let nodes = ids
            .iter()
            .map(|&id| {
                let tick_us = if f.skew { (TICK_US as f64 * rng.gen_range(0.7..1.4)) as u64 } else { TICK_US };
                Node::new(id, id as usize <= n, &settings, tick_us)
            })
            .collect();
        let member_rate = if f.membership { rng.gen_range(0.0..0.1) } else { 0.0 };
        let clients = (0..config.clients as u64).map(|i| Client::new(CLIENT_ID_BASE + i)).collect();
        let mut world = World {
            config: config.clone(),
            seed,
            rng,
            now: 0,
            order: 0,
            queue: BinaryHeap::new(),
            net: Net::new(params),
            settings,
            nodes,
            ids,
            clients,
            history: Vec::new(),
            checks: Checks::default(),
            trace: Trace::new(config.trace),
            counts: FaultCounts::default(),
            stats: SimStats::default(),
            rates,
            active: true,
            quiet_deadline: 0,
            done: false,
            roles: vec![(StateRole::Follower, 0); n + spares],
            goal: None,
            member_rate,
        };
        world.describe();
        for i in 0..n {
            world.start(i)?;
        }
        for c in 0..world.clients.len() {
            let at = world.rng.gen_range(0..50_000);
            world.schedule(at, Event::Issue { client: c });
        }
        world.schedule(CHAOS_EVERY_US, Event::Chaos);
        world.schedule(config.steps * 1_000, Event::EndLoad);
        Ok(world)
    }

    /// The run's drawn parameters, at the top of the trace.
    fn describe(&mut self) {
        let (seed, n, p) = (self.seed, self.nodes.len(), self.net.params.clone());
        let ticks: Vec<u64> = self.nodes.iter().map(|n| n.tick_us).collect();
        let (crash, partition) = (self.rates.crash, self.rates.partition);
        let (every, slack, window, delay) = (
            self.settings.snapshot_every,
            self.settings.log_slack,
            self.settings.cache.window,
            self.settings.batch_delay_us,
        );
        let faults = self.config.faults;
        let bug = self.config.bug;
        self.trace.event(0, &[seed, n as u64], || {
            format!(
                "seed {seed}: {n} replicas, faults {faults}, bug {bug:?}; loss {:.3}, duplicate {:.3}, long delay \
                 {:.3}, fifo {}, delay {}-{} µs; crash rate {crash:.3}, partition rate {partition:.3}; ticks {ticks:?} \
                 µs; snapshot every {every} entries, slack {slack}; reply window {window}; batch delay {delay} µs",
                p.loss, p.duplicate, p.long_delay, p.fifo, p.delay_min_us, p.delay_max_us
            )
        });
    }

    fn schedule(&mut self, at: u64, event: Event) {
        self.order += 1;
        self.queue.push(Reverse(Scheduled { at, order: self.order, event }));
    }

    fn run(&mut self) -> Result<(), SimError> {
        let limit = (self.config.steps + self.config.quiet_ms) * 1_000 + CHECK_EVERY_US;
        while let Some(Reverse(s)) = self.queue.pop() {
            if s.at > limit {
                break;
            }
            self.now = s.at;
            self.stats.events += 1;
            self.handle(s.event)?;
            if self.done {
                break;
            }
        }
        Ok(())
    }

    fn handle(&mut self, event: Event) -> Result<(), SimError> {
        match event {
            Event::Deliver(p) => self.deliver(p),
            Event::Tick { node, incarnation } => {
                if self.nodes[node].incarnation == incarnation && self.nodes[node].is_up() {
                    self.with_node(node, |n, s, env| n.tick(s, env));
                    self.drive_goal(node);
                    if self.nodes[node].is_up() {
                        let next = self.now + self.nodes[node].tick_us;
                        self.schedule(next, Event::Tick { node, incarnation });
                    }
                }
            }
            Event::Flush { node, incarnation } => {
                if self.nodes[node].incarnation == incarnation {
                    self.with_node(node, |n, s, env| n.flush(s, env));
                }
            }
            Event::Issue { client } => {
                if self.active && self.clients[client].current.is_none() {
                    let keys = self.config.keys;
                    let mut env = ClientEnv {
                        now: self.now,
                        replicas: &self.ids,
                        rng: &mut self.rng,
                        history: &mut self.history,
                        active: self.active,
                    };
                    let actions = self.clients[client].issue(keys, &mut env);
                    self.trace_issue(client);
                    self.client_actions(client, actions);
                }
            }
            Event::ClientTimer { client, seq, attempt } => {
                let mut env = ClientEnv {
                    now: self.now,
                    replicas: &self.ids,
                    rng: &mut self.rng,
                    history: &mut self.history,
                    active: self.active,
                };
                let actions = self.clients[client].timer(seq, attempt, &mut env);
                self.client_actions(client, actions);
            }
            Event::Chaos => {
                if self.active {
                    self.chaos();
                    self.schedule(self.now + CHAOS_EVERY_US, Event::Chaos);
                }
            }
            Event::Crash { node, incarnation } => {
                let n = &self.nodes[node];
                if n.incarnation == incarnation && n.is_up() && n.torn_next {
                    self.crash(node, "no ready came: a plain crash");
                }
            }
            Event::Restart { node } => {
                if !self.nodes[node].is_up() && !self.nodes[node].removed {
                    self.start(node)?;
                }
            }
            Event::Heal => {
                if self.net.partitioned() {
                    self.net.heal();
                    self.trace.event(self.now, &[0x4EA1], || "partition healed".into());
                }
            }
            Event::EndLoad => self.end_load()?,
            Event::Check => self.check(),
        }
        Ok(())
    }

    /// Runs `f` on node `i` with the world's services, then sends what it
    /// sent and traces a change of role.
    fn with_node(&mut self, i: usize, f: impl FnOnce(&mut Node, &NodeSettings, &mut Env<'_>)) {
        let mut out = Vec::new();
        let mut env = Env {
            now: self.now,
            rng: &mut self.rng,
            checks: &mut self.checks,
            trace: &mut self.trace,
            counts: &mut self.counts,
            out: &mut out,
            bug: self.config.bug,
            wake: None,
        };
        f(&mut self.nodes[i], &self.settings, &mut env);
        if let Some(at) = env.wake {
            let incarnation = self.nodes[i].incarnation;
            self.schedule(at, Event::Flush { node: i, incarnation });
        }
        for p in out {
            self.send(p);
        }
        let node = &self.nodes[i];
        if let Some(live) = &node.live {
            let role = (live.raw.raft.state, live.raw.raft.term);
            if role != self.roles[i] {
                self.roles[i] = role;
                self.stats.term = self.stats.term.max(role.1);
                let id = node.id;
                self.trace.event(self.now, &[0x201E, id, role.0 as u64, role.1], || {
                    format!("r{id} is {:?} in term {}", role.0, role.1)
                });
            }
        } else {
            self.roles[i] = (StateRole::Follower, 0);
        }
    }

    fn send(&mut self, p: Packet) {
        for at in self.net.route(self.now, p.from, p.to, &mut self.rng, &mut self.counts) {
            self.schedule(at, Event::Deliver(p.clone()));
        }
    }

    fn deliver(&mut self, p: Packet) {
        if self.net.is_cut(p.from, p.to) {
            self.counts.cut += 1;
            return;
        }
        self.stats.delivered += 1;
        self.trace_delivery(&p);
        match (p.to, p.payload) {
            (Addr::Replica(to), payload) => {
                let i = (to - 1) as usize;
                if !self.nodes[i].is_up() {
                    return;
                }
                match (p.from, payload) {
                    (_, Payload::Raft(m)) => self.with_node(i, |n, s, env| n.receive_raft(*m, s, env)),
                    (Addr::Client(c), Payload::Request { seq, op }) => {
                        self.with_node(i, |n, s, env| n.receive_request(c, seq, op, s, env))
                    }
                    _ => {}
                }
            }
            (Addr::Client(c), Payload::Reply { seq, answer }) => {
                let (Addr::Replica(from), k) = (p.from, (c - CLIENT_ID_BASE) as usize) else { return };
                let done_before = self.clients[k].current.as_ref().map(|o| o.seq);
                let mut env = ClientEnv {
                    now: self.now,
                    replicas: &self.ids,
                    rng: &mut self.rng,
                    history: &mut self.history,
                    active: self.active,
                };
                let actions = self.clients[k].answer(from, seq, answer, &mut env);
                if done_before == Some(seq) && self.clients[k].current.is_none() {
                    self.trace_done(k, seq);
                }
                self.client_actions(k, actions);
            }
            (Addr::Client(_), _) => {}
        }
    }

    fn client_actions(&mut self, client: usize, actions: Vec<Action>) {
        for a in actions {
            match a {
                Action::Send(p) => self.send(p),
                Action::Timer { at, seq, attempt } => self.schedule(at, Event::ClientTimer { client, seq, attempt }),
                Action::IssueAt(at) => self.schedule(at, Event::Issue { client }),
            }
        }
    }

    fn start(&mut self, i: usize) -> Result<(), SimError> {
        let mut result = Ok(());
        self.with_node(i, |n, s, env| result = n.start(s, env));
        result?;
        let node = &self.nodes[i];
        let (id, incarnation, tick) = (node.id, node.incarnation, node.tick_us);
        if incarnation > 1 {
            self.counts.restarts += 1;
        }
        let applied = node.live.as_ref().map_or(0, |l| l.applied);
        self.trace.event(self.now, &[0x57A, id, incarnation, applied], || {
            format!("r{id} starts (incarnation {incarnation}) from its disk, state restored at index {applied}")
        });
        let first = self.now + self.rng.gen_range(0..tick);
        self.schedule(first, Event::Tick { node: i, incarnation });
        Ok(())
    }

    fn crash(&mut self, i: usize, how: &str) {
        self.nodes[i].crash();
        self.counts.crashes += 1;
        let id = self.nodes[i].id;
        self.trace.event(self.now, &[0xC4A5, id], || format!("r{id} crashes ({how})"));
    }

    /// One round of fault injection.
    fn chaos(&mut self) {
        self.start_goal();
        let f = self.config.faults;
        if self.rates.crash > 0.0 && self.rng.gen_bool(self.rates.crash) {
            let up: Vec<usize> = (0..self.nodes.len()).filter(|&i| self.nodes[i].is_up()).collect();
            if let Some(&i) = up.choose(&mut self.rng) {
                let torn = f.torn && self.rng.gen_bool(0.5);
                let down = self.rng.gen_range(self.rates.down_us.0..=self.rates.down_us.1);
                if torn {
                    // Strikes in its next ready; a plain crash if none comes.
                    self.nodes[i].torn_next = true;
                    let (id, incarnation) = (self.nodes[i].id, self.nodes[i].incarnation);
                    self.trace.event(self.now, &[0x7042, id], || format!("r{id} will crash in its next ready"));
                    self.schedule(self.now + 40_000, Event::Crash { node: i, incarnation });
                    self.schedule(self.now + 40_000 + down, Event::Restart { node: i });
                } else {
                    self.crash(i, "between two readies");
                    self.schedule(self.now + down, Event::Restart { node: i });
                }
            }
        }
        let n = self.ids.len();
        if n > 1 && self.rates.partition > 0.0 && !self.net.partitioned() && self.rng.gen_bool(self.rates.partition) {
            // A random non-empty proper subset on one side.
            let mask = self.rng.gen_range(1..(1u32 << n) - 1);
            let side: Vec<u64> = self.ids.iter().copied().filter(|&id| mask >> (id - 1) & 1 == 1).collect();
            let other: Vec<u64> = self.ids.iter().copied().filter(|&id| mask >> (id - 1) & 1 == 0).collect();
            let one_way = match (f.partition, f.one_way) {
                (true, true) => self.rng.gen_bool(0.5),
                (false, true) => true,
                _ => false,
            };
            for &a in &side {
                for &b in &other {
                    self.net.cut(a, b);
                    if !one_way {
                        self.net.cut(b, a);
                    }
                }
            }
            if one_way {
                self.counts.one_way_partitions += 1;
            } else {
                self.counts.partitions += 1;
            }
            let lasts = self.rng.gen_range(self.rates.partition_us.0..=self.rates.partition_us.1);
            self.trace.event(self.now, &[0x9A47, u64::from(mask), u64::from(one_way), lasts], || {
                let arrow = if one_way { "-/->" } else { "<-/->" };
                format!("partition {side:?} {arrow} {other:?} for {} ms", lasts / 1000)
            });
            self.schedule(self.now + lasts, Event::Heal);
        }
    }

    /// The end of the load: every fault healed, every replica up, clients
    /// finish what they have outstanding.
    fn end_load(&mut self) -> Result<(), SimError> {
        self.active = false;
        self.net.heal();
        self.net.params = NetParams::benign();
        self.trace.event(self.now, &[0xE4D], || "load over: faults healed, quiet phase".into());
        for i in 0..self.nodes.len() {
            self.nodes[i].torn_next = false;
            // A joiner that never started is not part of the run.
            let node = &self.nodes[i];
            if !node.is_up() && !node.removed && node.incarnation > 0 {
                self.start(i)?;
            }
        }
        self.quiet_deadline = self.now + self.config.quiet_ms * 1_000;
        self.schedule(self.now + CHECK_EVERY_US, Event::Check);
        Ok(())
    }

    /// In the quiet phase: once every replica has applied everything the
    /// only leader committed, compares their states and ends the run.
    fn check(&mut self) {
        self.stop_non_members();
        if let Some(applied) = self.converged() {
            let members = self.members().unwrap_or_default();
            let states: Vec<_> =
                self.nodes.iter().filter(|n| members.contains(&n.id)).map(|n| (n.id, n.digests())).collect();
            let first = states[0].1;
            if states.iter().any(|(_, d)| *d != first) {
                let listed: Vec<String> = states
                    .iter()
                    .map(|(id, d)| match d {
                        Some((a, s, c)) => format!("r{id}: applied {a}, state {s}, reply cache {c}"),
                        None => format!("r{id}: down"),
                    })
                    .collect();
                self.checks.violation(
                    ViolationKind::StateMismatch,
                    format!("after the quiet phase the replicas differ: {}", listed.join("; ")),
                );
            }
            self.trace.event(self.now, &[0xD04E, applied], || {
                format!("converged: every replica applied {applied} with the same state")
            });
            self.done = true;
            return;
        }
        if self.now >= self.quiet_deadline {
            let listed: Vec<String> = self
                .nodes
                .iter()
                .map(|n| match &n.live {
                    Some(l) => format!(
                        "r{}: {:?} in term {}, last index {}, commit {}, applied {}",
                        n.id,
                        l.raw.raft.state,
                        l.raw.raft.term,
                        l.raw.raft.raft_log.last_index(),
                        l.raw.raft.raft_log.committed,
                        l.applied
                    ),
                    None => format!("r{}: down", n.id),
                })
                .collect();
            let waiting = self.clients.iter().filter(|c| c.current.is_some()).count();
            self.checks.violation(
                ViolationKind::NoConvergence,
                format!(
                    "{} ms after the faults healed the replicas have not caught up ({waiting} clients still \
                     waiting): {}",
                    self.config.quiet_ms,
                    listed.join("; ")
                ),
            );
            self.done = true;
            return;
        }
        self.schedule(self.now + CHECK_EVERY_US, Event::Check);
    }

    /// The index every replica applied, if they all caught up with the one
    /// leader and no client waits.
    fn converged(&self) -> Option<u64> {
        if self.clients.iter().any(|c| c.current.is_some()) || self.goal.is_some() {
            return None;
        }
        let members = self.members()?;
        let nodes = self.nodes.iter().filter(|n| members.contains(&n.id));
        let lives: Vec<_> = nodes.map(|n| n.live.as_ref()).collect::<Option<_>>()?;
        let mut leaders = lives.iter().filter(|l| l.raw.raft.state == StateRole::Leader);
        let leader = leaders.next()?;
        if leaders.next().is_some() {
            return None;
        }
        let log = &leader.raw.raft.raft_log;
        let committed = log.committed;
        (committed == log.last_index() && lives.iter().all(|l| l.applied == committed)).then_some(committed)
    }

    /// The members as the leader of the highest term sees them, if a
    /// replica leads.
    fn members(&self) -> Option<Vec<u64>> {
        let leaders =
            self.nodes.iter().filter_map(|n| n.live.as_ref()).filter(|l| l.raw.raft.state == StateRole::Leader);
        let leader = leaders.max_by_key(|l| l.raw.raft.term)?;
        Some(leader.membership.members().map(|m| m.id).collect())
    }

    /// Stops, for good, the running replicas the members no longer count
    /// (removed while cut off, they never committed their removal): as a
    /// real one is told at its next handshake. Not while a change is under
    /// way (its joiner is no member yet).
    fn stop_non_members(&mut self) {
        let Some(members) = self.members().filter(|_| self.goal.is_none()) else { return };
        for n in self.nodes.iter_mut().filter(|n| n.is_up() && !members.contains(&n.id)) {
            n.live = None;
            n.removed = true;
            let id = n.id;
            self.trace.event(self.now, &[0x4E31, id], || format!("r{id} is told it was removed and stops"));
        }
    }

    /// Starts a membership change now and then: adds a replica that never
    /// ran (started at once, with an empty log) or removes a member,
    /// keeping at least three voters.
    fn start_goal(&mut self) {
        if self.goal.is_some() || self.member_rate == 0.0 || !self.rng.gen_bool(self.member_rate) {
            return;
        }
        let Some(members) = self.members() else { return };
        let fresh: Vec<usize> = (0..self.nodes.len()).filter(|&i| self.nodes[i].incarnation == 0).collect();
        let add = !fresh.is_empty() && (members.len() <= 3 || self.rng.gen_bool(0.5));
        let goal = if add {
            let i = *fresh.choose(&mut self.rng).expect("not empty");
            if self.start(i).is_err() {
                return;
            }
            Goal::Voter(sim_member(self.nodes[i].id))
        } else if members.len() > 3 {
            Goal::Gone(*members.choose(&mut self.rng).expect("not empty"))
        } else {
            return;
        };
        self.trace.event(self.now, &[0x60A1], || format!("membership goal: {goal:?}"));
        self.goal = Some((goal, (0, 0)));
    }

    /// Lets node `i`, if it leads, take its step towards the goal.
    fn drive_goal(&mut self, i: usize) {
        let Some((goal, mut holds)) = self.goal.clone() else { return };
        let mut step = None;
        self.with_node(i, |n, s, env| step = n.drive_membership(&goal, &mut holds, s, env));
        match step {
            None | Some(Step::Wait) | Some(Step::Propose(_)) | Some(Step::Transfer(_)) => {
                self.goal = Some((goal, holds));
            }
            Some(Step::Done) => {
                self.counts.member_changes += 1;
                self.trace.event(self.now, &[0x60A2], || format!("membership goal reached: {goal:?}"));
                self.goal = None;
            }
            Some(Step::Refuse(why)) => {
                self.trace.event(self.now, &[0x60A3], || format!("membership goal {goal:?} refused: {why}"));
                self.goal = None;
            }
        }
    }

    fn trace_delivery(&mut self, p: &Packet) {
        let (from, to) = (p.from, p.to);
        match &p.payload {
            Payload::Raft(m) => {
                let words = [
                    1,
                    m.from,
                    m.to,
                    m.get_msg_type() as u64,
                    m.term,
                    m.index,
                    m.log_term,
                    m.commit,
                    m.entries.len() as u64,
                    u64::from(m.reject),
                    m.get_snapshot().get_metadata().index,
                ];
                self.trace.event(self.now, &words, || {
                    let mut line = format!(
                        "{to} <- {from} {:?} term {} index {} log term {} commit {}",
                        m.get_msg_type(),
                        m.term,
                        m.index,
                        m.log_term,
                        m.commit
                    );
                    if !m.entries.is_empty() {
                        let first = m.entries[0].index;
                        line += &format!(" entries {first}..={}", first + m.entries.len() as u64 - 1);
                    }
                    if m.reject {
                        line += &format!(" reject (hint {})", m.reject_hint);
                    }
                    if m.has_snapshot() {
                        line += &format!(" snapshot at {}", m.get_snapshot().get_metadata().index);
                    }
                    line
                });
            }
            Payload::Request { seq, .. } => {
                let seq = *seq;
                self.trace.event(self.now, &[2, addr_word(from), addr_word(to), seq], || {
                    format!("{to} <- {from} request {seq}")
                });
            }
            Payload::Reply { seq, answer } => {
                let (seq, code) = (*seq, answer_code(answer));
                self.trace.event(self.now, &[3, addr_word(from), addr_word(to), seq, code], || {
                    format!("{to} <- {from} reply to {seq}: {answer:?}")
                });
            }
        }
    }

    fn trace_issue(&mut self, client: usize) {
        let Some(op) = self.history.last().cloned() else { return };
        let c = self.clients[client].id;
        self.trace.event(self.now, &[4, c, op.seq, op.key, op.value.unwrap_or(u64::MAX)], || {
            format!("c{c} invokes {} {:?} of key {} (value {:?})", op.seq, op.kind, op.key, op.value)
        });
    }

    fn trace_done(&mut self, client: usize, seq: u64) {
        let c = self.clients[client].id;
        let Some(op) = self.history.iter().rev().find(|o| o.client == c && o.seq == seq).cloned() else { return };
        self.trace.event(self.now, &[5, c, seq, op.status as u64], || {
            format!("c{c} completes {seq}: {:?} {:?}", op.status, op.result)
        });
    }

    /// The run cannot go on: records why, at the end of the trace.
    fn stopped(&mut self, kind: ViolationKind, why: String) {
        let why = format!("at {:.3} ms: {why}", self.now as f64 / 1_000.0);
        self.trace.event(self.now, &[0x5709, kind as u64], || format!("the run stops: {why}"));
        self.checks.violation(kind, why);
    }

    fn finish(mut self) -> SimOutcome {
        // Reads still outstanding had no effect.
        for op in &mut self.history {
            if op.status == OpStatus::Unknown && op.kind == OpKind::Read {
                op.status = OpStatus::Fail;
            }
        }
        let mut stats = std::mem::take(&mut self.stats);
        stats.sim_ms = self.now / 1_000;
        stats.cache_answers = self.checks.cache_answers;
        stats.reads_without_log = self.checks.reads_without_log;
        stats.applied = self.checks.highest_applied();
        for op in &self.history {
            match op.status {
                OpStatus::Ok => stats.ops_ok += 1,
                OpStatus::Unknown => stats.ops_unknown += 1,
                OpStatus::Fail => stats.ops_fail += 1,
            }
        }
        SimOutcome {
            seed: self.seed,
            replicas: self.nodes.len(),
            history: std::mem::take(&mut self.history),
            trace_hash: self.trace.hash(),
            trace: self.trace.take_lines(),
            violations: std::mem::take(&mut self.checks.violations),
            violations_found: self.checks.found,
            refused: std::mem::take(&mut self.checks.refused),
            faults: self.counts,
            stats,
        }
    }
}

fn addr_word(a: Addr) -> u64 {
    match a {
        Addr::Replica(id) => id,
        Addr::Client(id) => id << 8,
    }
}

fn answer_code(a: &Answer) -> u64 {
    match a {
        Answer::Ok(_) => 1,
        Answer::Rejected(_) => 2,
        Answer::Redirect(l) => 3 + (l << 2),
    }
}
