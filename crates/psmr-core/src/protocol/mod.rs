//! The protocol: the raft node and every decision around it (002 §V-C),
//! as a state machine that takes events and hands out effects.
//!
//! Events are method calls: a peer's message ([`Protocol::step`]), a
//! client request ([`Protocol::request`]), a tick ([`Protocol::tick`]), a
//! snapshot made durable ([`Protocol::snapshot_persisted`]), a membership
//! change asked for ([`Protocol::admin`]), the apply loop's progress
//! ([`Protocol::set_applied`]). After a burst of events the driver calls
//! [`Protocol::turn`], which proposes the entry if it is due
//! (its batcher), starts a read round (the protocol's reads), handles
//! raft's readies (stores what must be stored through the [`Store`], then
//! lets messages go), serves the reads whose index is applied, and takes
//! the next step of a membership change. Effects go out through
//! [`ProtocolIo`], implemented by the driver: messages to peers, work for
//! the apply loop, answers to clients.
//!
//! The protocol owns no thread, socket or clock: time comes with
//! [`Protocol::turn`], ticks are counted as they come, and raft's
//! randomized election timeouts are drawn from a generator seeded by the
//! driver. A replica's protocol thread and the simulator drive this same
//! code.
//!
//! Every peer message passes the [`crate::guard`] before raft sees it.
//! Should raft-rs panic anyway (in `step`, `tick`, `propose` or while a
//! ready is handled), the call returns [`Stop::Failed`]: raft's state after
//! a panic cannot be trusted, and the replica must stop.

mod admin;
mod ready;

use crate::batcher::{self, Batcher};
use crate::bug::{Bug, Planted};
use crate::config::{Config, Member};
use crate::entry::{self, request_commands, EntryBuilder};
use crate::guard::{self, Guard, Refusal};
use crate::membership::{self, Committed, Membership};
use crate::reads::Reads;
use crate::request::Request;
use crate::snapfile::SnapshotFile;
use crate::store::{RaftLog, Store};
use crate::transfer::{self, Link, Progress, Report, SnapMsg, Transfers};
use psmr_model::wire::ServerMsg;
use psmr_model::Stamp;
use raft::prelude::{Entry, Message, MessageType, Snapshot};
use raft::{RawNode, ReadState, SnapshotStatus, StateRole};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::panic::{catch_unwind, AssertUnwindSafe};
use thiserror::Error;
use tracing::{debug, info, warn};

pub(crate) use ready::{handle_ready, ReadyOut};

/// Entries the log keeps behind a snapshot (at most), so that a follower
/// slightly behind catches up from the log rather than from a snapshot.
pub const LOG_SLACK: u64 = 1_000;

/// Appends in flight to one follower, at least (see [`raft_config`]).
const INFLIGHT_MIN: usize = 64;

/// Readies handled in one turn at most (each `advance` may leave another).
const READIES_PER_TURN: usize = 8;

/// Messages stepped between two turns that a failure report names.
const STEPPED_REPORTED: usize = 8;

/// Work for the apply loop, in the order the protocol hands it out.
pub enum Apply {
    /// Committed entries, in log order.
    Entries(Vec<Entry>),
    /// A snapshot from the leader replaces the state: raft's snapshot, and
    /// a handle on its file, which stays readable whatever the store
    /// keeps next ([`crate::state::open`]).
    Snapshot(Box<Snapshot>, Box<dyn SnapshotFile>),
    /// Reads the leader serves without the log: every entry they must
    /// see is applied; they execute after it, at the time given (ms since
    /// the Unix epoch: the log's time, which the apply loop raises to its
    /// own clock if behind).
    Reads(Vec<Request>, u64),
}

/// Why the protocol stopped: the raft node must not be touched again.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum Stop {
    /// Something went wrong that the replica cannot run on after: raft
    /// panicked, the store refused a write, the apply loop is gone.
    #[error("{0}")]
    Failed(String),
    /// This replica's removal from the cluster was committed: a clean
    /// stop.
    #[error("{0}")]
    Removed(String),
}

/// What the protocol asks of its driver.
pub trait ProtocolIo {
    /// Sends a raft message to its peer (`msg.to`); false if it cannot be
    /// sent now (raft then treats the peer as unreachable for a while).
    /// Never a `MsgSnapshot`: those go with their files
    /// ([`ProtocolIo::send_snapshot`]).
    fn send(&mut self, msg: Message) -> bool;
    /// Sends a message of a snapshot transfer to peer `to`, on the lane
    /// that carries nothing else ([`crate::transfer`]); false if the lane
    /// cannot take it now (the transfer tries again in a later turn).
    fn send_snapshot(&mut self, to: u64, msg: SnapMsg) -> bool;
    /// A message of a snapshot transfer from `peer` was refused: `why`
    /// (count it, log it within limits).
    fn transfer_refused(&mut self, peer: u64, why: &str) {
        debug!(peer, "snapshot transfer: {why}");
    }
    /// Hands work to the apply loop, in order; false if it is gone.
    fn apply(&mut self, work: Apply) -> bool;
    /// Sends `msg` to client `client`: a redirect to the leader.
    fn tell(&mut self, client: u64, msg: ServerMsg);
    /// The membership changed; `peers` are the replicas to keep links to
    /// (every member but this one, and the peers that announced
    /// themselves and are not known yet), with their peer addresses.
    fn membership(&mut self, membership: &Membership, peers: &BTreeMap<u64, SocketAddr>);
    /// The answer to the membership change with this ticket.
    fn answer(&mut self, ticket: u64, msg: ServerMsg);
    /// The guard refused `msg`: it breaks a rule no honest replica breaks.
    fn refused(&mut self, msg: &Message, why: &Refusal);
    /// An entry of `commands` commands and `bytes` bytes was proposed.
    fn proposed(&mut self, commands: u64, bytes: usize) {
        let _ = (commands, bytes);
    }
    /// A read round was answered, for `reads` reads.
    fn read_round(&mut self, reads: usize) {
        let _ = reads;
    }
    /// An entry of no command was proposed so that the reads waiting run
    /// at a recent log time ([`READ_CLOCK_SLACK_MS`]).
    fn clock_entry_proposed(&mut self) {}
}

/// What a driver and its observers may read of the protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct View {
    /// The leader as this replica knows it (0: none).
    pub leader: u64,
    /// The current term.
    pub term: u64,
    /// This replica's raft role.
    pub role: StateRole,
    /// The commit index.
    pub commit: u64,
    /// The last index of the log.
    pub last_index: u64,
    /// This replica was repaired and its log is still below the vote floor
    /// the repair left (it says so to its peers).
    pub repaired: bool,
}

impl View {
    /// This replica leads.
    pub fn is_leader(&self) -> bool {
        self.role == StateRole::Leader
    }
}

/// How a protocol starts: the seed of its election timeouts, whether
/// raft-rs's own log lines go to `tracing`, the service's check of
/// snapshots received, and (for the simulator) a bug.
#[derive(Clone)]
pub struct Options {
    seed: u64,
    raft_logs: bool,
    planted: Planted,
    check: Option<crate::transfer::SnapshotCheck>,
}

impl Options {
    /// Election timeouts drawn from `seed`; raft-rs's log lines kept;
    /// every snapshot whose file is whole taken.
    pub fn new(seed: u64) -> Self {
        Self { seed, raft_logs: true, planted: Planted::default(), check: None }
    }

    /// Snapshots received from the leader are kept only if `service`'s
    /// [`psmr_model::Service::check_snapshot`] takes their stream.
    pub fn checked_by<A: psmr_model::Service>(mut self, service: std::sync::Arc<A>) -> Self {
        self.check = Some(std::sync::Arc::new(move |r| service.check_snapshot(r).map_err(|e| e.to_string())));
        self
    }

    /// raft-rs's log lines dropped (a simulation runs thousands of
    /// replicas).
    pub fn quiet(mut self) -> Self {
        self.raft_logs = false;
        self
    }

    /// Plants `bug` (the simulator's testing aid).
    #[cfg(feature = "bugs")]
    pub fn inject(mut self, bug: Option<Bug>) -> Self {
        self.planted = Planted::new(bug);
        self
    }
}

/// Errors starting the protocol.
#[derive(Debug, Error)]
pub enum StartError {
    /// raft refused its configuration or the log.
    #[error("raft: {0}")]
    Raft(#[from] raft::Error),
    /// The snapshot the log keeps cannot be read.
    #[error("{0}")]
    Snapshot(String),
}

/// Entries [`Protocol::next_stamp`] reads back at most to find the latest
/// stamp: raft's own entries and membership changes, which carry none,
/// come a few at a time.
const STAMP_SCAN: u64 = 64;

/// How far the log's time may lag the leader's clock before reads wait
/// for an entry of no command that brings it up: reads served without the
/// log run at the log's time, so a read sees a key expire at most this
/// late, plus one round.
pub const READ_CLOCK_SLACK_MS: u64 = 100;

/// The protocol of one replica over its store `S`. See the module
/// documentation.
pub struct Protocol<S: Store> {
    id: u64,
    config: Config,
    node: RawNode<RaftLog<S>>,
    store: S,
    guard: Guard,
    batcher: Batcher,
    reads: Reads,
    /// The members as of the last committed conf change.
    membership: Membership,
    /// Peers not (yet) in the membership that connected and said where
    /// they listen.
    announced: BTreeMap<u64, SocketAddr>,
    /// The membership change under way (leader only).
    admin: Option<admin::Pending>,
    /// Ticks so far: the clock of read rounds and membership changes.
    ticks: u64,
    /// The vote floor left by a repair, until the log reaches it.
    floor: Option<(u64, u64)>,
    /// The last index the apply loop applied.
    applied: u64,
    rng: ChaCha8Rng,
    stepped: Stepped,
    planted: Planted,
    /// Snapshot files on their way to followers, or from the leader.
    transfers: Transfers,
    /// The driver's wall clock, ms since the Unix epoch.
    wall_ms: u64,
    /// The latest stamp of an entry in this replica's log, as far as
    /// `stamped_through` (see [`Protocol::next_stamp`]).
    last_stamp: u64,
    /// The apply loop's last report ([`Protocol::set_applied_clock`]): the
    /// index its clock is of.
    clock_applied: u64,
    /// The log's last entry (index, term) when `last_stamp` was last
    /// brought up to date.
    stamped_through: (u64, u64),
    /// The time execution has reached at `clock_applied`: the time reads
    /// run at.
    applied_clock_ms: u64,
    /// An entry of no command proposed to bring the log's time up to the
    /// leader's clock for the reads due: its index.
    tick: Option<u64>,
}

/// The raft-rs configuration of replica `id`, from its configuration.
pub fn raft_config(config: &Config, id: u64, applied: u64) -> raft::Result<raft::Config> {
    // What is in flight to one follower fits its send queue. Past the
    // queue's bound sends fail and raft probes again; and raft-rs, once
    // a follower answers, sends as many appends as inflights allow at
    // once, reading the log for each: with 256 of a quarter frame each, a
    // follower just restored from a large snapshot had the leader read a
    // gigabyte of log backlog in one turn, past the election timeout.
    // The pipeline's entries, each in an append of its own, always fit.
    let inflight = INFLIGHT_MIN.max(2 * config.pipeline);
    let per_msg = (config.queue_bytes_max / inflight).min(config.peer_frame_max / 4).max(1);
    let raft_config = raft::Config {
        id,
        applied,
        election_tick: config.election_ticks,
        heartbeat_tick: config.heartbeat_ticks,
        max_size_per_msg: per_msg as u64,
        max_inflight_msgs: inflight,
        check_quorum: true,
        pre_vote: true,
        // Followers learn the commit index from the next append or
        // heartbeat instead of from an append of its own after every
        // commit: half the peer messages (and their wake-ups) per entry.
        // Clients hear from the leader, which knows at once; a follower
        // applies at most one heartbeat later when idle.
        skip_bcast_commit: true,
        // One hand-off to the apply loop holds at most a quarter of its
        // queue's bytes (and at least one entry): the rest comes in the
        // next readies.
        max_committed_size_per_ready: (config.queue_bytes_max / 4) as u64,
        ..raft::Config::default()
    };
    raft_config.validate()?;
    Ok(raft_config)
}

impl<S: Store> Protocol<S> {
    /// The protocol of replica `id` of `config` over `store`, restarted
    /// from whatever the store keeps: raft resumes after the kept
    /// snapshot, with the membership it holds (the entries after it replay
    /// the changes since).
    pub fn new(config: &Config, id: u64, store: S, options: Options) -> Result<Self, StartError> {
        let kept = store.kept();
        let membership = match &kept {
            Some(snap) => crate::state::membership(snap).map_err(StartError::Snapshot)?,
            None => Membership::default(),
        };
        let mut applied = kept.as_ref().map_or(0, |s| s.get_metadata().index);
        if options.planted.is(Bug::ApplyTwiceAfterRestore) {
            applied = 0;
        }
        let logger = match options.raft_logs {
            true => slog::Logger::root(RaftLogDrain, slog::o!("replica" => id)),
            false => slog::Logger::root(slog::Discard, slog::o!()),
        };
        let node = RawNode::new(&raft_config(config, id, applied)?, RaftLog(store.clone()), &logger)?;
        let floor = store.vote_floor();
        if let Some((term, index)) = floor {
            info!(term, index, "vote floor: no votes for shorter logs and no campaigns until the log reaches it");
        }
        let limits = batcher::Limits {
            max_commands: config.batch_max_commands,
            max_bytes: config.batch_max_bytes,
            delay_ns: config.batch_delay_us.saturating_mul(1_000),
        };
        let mut protocol = Self {
            id,
            config: config.clone(),
            node,
            store,
            guard: Guard::new(id).with_removed(membership.removed()),
            batcher: Batcher::new(limits),
            reads: Reads::default(),
            membership,
            announced: BTreeMap::new(),
            admin: None,
            ticks: 0,
            floor,
            applied: kept.map_or(0, |s| s.get_metadata().index),
            rng: ChaCha8Rng::seed_from_u64(options.seed),
            stepped: Stepped::default(),
            planted: options.planted,
            transfers: Transfers::new(transfer::Limits::of(config), options.check.clone()),
            wall_ms: 0,
            last_stamp: 0,
            clock_applied: 0,
            stamped_through: (0, 0),
            applied_clock_ms: 0,
            tick: None,
        };
        protocol.reseed();
        Ok(protocol)
    }

    /// Announces the starting membership: the driver opens its links.
    pub fn start(&mut self, io: &mut impl ProtocolIo) {
        self.membership_changed(io);
    }

    /// What the driver and its observers may read.
    pub fn view(&self) -> View {
        let raft = &self.node.raft;
        View {
            leader: raft.leader_id,
            term: raft.term,
            role: raft.state,
            commit: raft.raft_log.committed,
            last_index: raft.raft_log.last_index(),
            repaired: self.floor.is_some(),
        }
    }

    /// The members as of the last committed conf change.
    pub fn membership(&self) -> &Membership {
        &self.membership
    }

    /// The store the protocol writes.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// Member `id`'s addresses: from the membership, or, until the log
    /// names any member (a joining replica that has heard nothing yet),
    /// from the configuration.
    pub fn member(&self, id: u64) -> Option<Member> {
        match self.membership.is_empty() {
            true => self.config.member(id).ok().cloned(),
            false => self.membership.member(id).cloned(),
        }
    }

    /// The answer that sends a client to the leader, with its client
    /// address if known.
    pub fn redirect(&self) -> ServerMsg {
        let leader = self.node.raft.leader_id;
        let addr = self.member(leader).map(|m| m.client.to_string()).unwrap_or_default();
        ServerMsg::Redirect { leader, addr }
    }

    /// A raft message from peer `msg.from` (authenticated by the driver):
    /// through the guard, then stepped. A `MsgSnapshot` is refused here: it
    /// comes with its file ([`Protocol::snapshot_msg`]).
    pub fn step(&mut self, msg: Message, io: &mut impl ProtocolIo) -> Result<(), Stop> {
        if msg.get_msg_type() == MessageType::MsgSnapshot {
            let detail = "a snapshot comes with its file, on the snapshot lane".into();
            io.refused(&msg, &Refusal { rule: guard::Rule::Snapshot, detail });
            return Ok(());
        }
        self.step_checked(msg, io)
    }

    fn step_checked(&mut self, msg: Message, io: &mut impl ProtocolIo) -> Result<(), Stop> {
        let (kind, from) = (msg.get_msg_type(), msg.from);
        let floor = self.rules_floor();
        let what = || format!("checking {kind:?} from replica {from}");
        let verdict = contained(what, || self.guard.check(&msg, from, &self.node.raft, floor))?;
        if let Err(why) = verdict {
            io.refused(&msg, &why);
            return Ok(());
        }
        self.stepped.push(kind, from);
        let what = || format!("stepping {kind:?} from replica {from}");
        let step = || {
            // Stands for a raft-rs panic the guard did not foresee.
            fail::fail_point!("protocol-step");
            self.node.step(msg)
        };
        if let Err(e) = contained(what, step)? {
            debug!("raft refused a message: {e}");
        }
        self.reseed();
        Ok(())
    }

    /// Whether the entry being filled takes more requests: while it does
    /// not, the driver leaves requests in their queue (back-pressure).
    pub fn has_room(&self) -> bool {
        self.batcher.has_room()
    }

    /// Takes a client request: a read the leader serves without the log, a
    /// request that waits for its client's reads, or into the next entry.
    /// A read of a client whose earlier request waits in the entry goes
    /// with it, so that it sees that request's writes.
    pub fn request(&mut self, r: Request) {
        let read = self.may_skip_log(&r);
        if let Some(r) = self.reads.take(r, read) {
            self.push(r);
        }
    }

    fn may_skip_log(&self, r: &Request) -> bool {
        r.read && !self.config.reads_through_log && !self.batcher.holds(r.client)
    }

    fn push(&mut self, r: Request) {
        if !self.planted.is(Bug::ReorderCommands) {
            return self.batcher.push(r);
        }
        self.batcher.push_encoded(r, |entry, count, encoded| match request_commands(encoded, count) {
            Ok(commands) => commands.iter().rev().for_each(|c| entry.push(c.client, c.seq, c.op)),
            Err(_) => entry.extend_encoded(count, encoded),
        });
    }

    /// One raft tick. A replica below its vote floor must not campaign: its
    /// election clock runs, so that its leader's lease expires as its
    /// peers' do and it grants votes again (to logs that reach its floor),
    /// but raft's tick, which would start a campaign, does not. (Left
    /// unticked, a repaired replica would take the leader it last heard of
    /// for alive for ever, and refuse every vote: the simulation found a
    /// cluster that could then never elect a leader.)
    pub fn tick(&mut self) -> Result<(), Stop> {
        if self.rules_floor().is_none() {
            contained(|| "ticking".into(), || self.node.tick())?;
        } else {
            self.node.raft.election_elapsed = self.node.raft.election_elapsed.saturating_add(1);
        }
        self.ticks += 1;
        self.reseed();
        Ok(())
    }

    /// A message of a snapshot transfer from peer `from` (authenticated by
    /// the driver), at `now_ns` on the driver's clock. A snapshot received
    /// whole and checked is stepped, and its ready handled at once: the
    /// store keeps its file before anything else can replace it.
    pub fn snapshot_msg(&mut self, from: u64, msg: SnapMsg, now_ns: u64, io: &mut impl ProtocolIo) -> Result<(), Stop> {
        self.transfers.now_ns = self.transfers.now_ns.max(now_ns);
        let report = match msg {
            SnapMsg::Offer(m) => return self.offered(from, *m, io),
            SnapMsg::Chunk { id, offset, crc, data } => {
                let whole = self.transfers.on_chunk(from, (id, offset, crc), &data, &self.store, &mut LinkIo(io));
                return whole.map_or(Ok(()), |offer| self.install(offer, io));
            }
            SnapMsg::Ack { id, next, resume } => self.transfers.on_ack(from, id, next, resume),
            SnapMsg::Refuse { id, why } => self.transfers.on_refuse(from, id, &why),
        };
        self.report(report.into_iter());
        Ok(())
    }

    /// The transfers in progress, sending and receiving.
    pub fn transfers(&self) -> Vec<Progress> {
        self.transfers.progress()
    }

    /// An offer from `from`: checked as the raft message it carries; a
    /// snapshot raft would not restore (the log holds what it covers) is
    /// stepped at once, so that the leader learns where this log is,
    /// and its file is not asked for.
    fn offered(&mut self, from: u64, m: Message, io: &mut impl ProtocolIo) -> Result<(), Stop> {
        if !Transfers::is_offer_between(&m, from, self.id) {
            io.transfer_refused(from, "an offer that is not a snapshot from its sender to this replica");
            return Ok(());
        }
        let floor = self.rules_floor();
        let what = || format!("checking a snapshot offer from replica {from}");
        if let Err(why) = contained(what, || self.guard.check(&m, from, &self.node.raft, floor))? {
            io.refused(&m, &why);
            return Ok(());
        }
        let meta = m.get_snapshot().get_metadata();
        let log = &self.node.raft.raft_log;
        if meta.index < log.committed || log.match_term(meta.index, meta.term) {
            if let Ok(id) = transfer::offered_id(&m) {
                io.send_snapshot(from, SnapMsg::Refuse { id, why: "this replica's log holds it".into() });
            }
            return self.step_checked(m, io);
        }
        self.transfers.on_offer(from, m, &self.store, &mut LinkIo(io));
        Ok(())
    }

    /// Steps the offer of a snapshot received whole (through the guard
    /// again: the term may have moved on) and handles the ready.
    fn install(&mut self, offer: Message, io: &mut impl ProtocolIo) -> Result<(), Stop> {
        self.step_checked(offer, io)?;
        self.handle_readies(io)
    }

    fn report(&mut self, reports: impl Iterator<Item = Report>) {
        for (peer, status) in reports {
            self.node.report_snapshot(peer, status);
        }
    }

    /// Sends what transfers have due, and goes on with one resumed after a
    /// restart.
    fn pump_transfers(&mut self, now_ns: u64, io: &mut impl ProtocolIo) -> Result<(), Stop> {
        self.transfers.now_ns = self.transfers.now_ns.max(now_ns);
        let leading = self.node.raft.state == StateRole::Leader;
        let ended = self.transfers.pump_out(leading, &mut LinkIo(io));
        if leading {
            self.report(ended.into_iter());
        }
        match self.transfers.pump_in(&self.store, &mut LinkIo(io)) {
            Some(offer) => self.install(offer, io),
            None => Ok(()),
        }
    }

    /// The apply loop applied everything up to `applied`.
    pub fn set_applied(&mut self, applied: u64) {
        self.applied = self.applied.max(applied);
    }

    /// The apply loop applied everything up to `index`, and execution's
    /// time reached `clock_ms` there: stamps proposed from now on are not
    /// before it. This is what a replica whose log holds nothing after a
    /// snapshot knows of the stamps the snapshot covers; until the apply
    /// loop has said so for the snapshot the log starts after, this
    /// replica proposes nothing.
    pub fn set_applied_clock(&mut self, index: u64, clock_ms: u64) {
        self.clock_applied = self.clock_applied.max(index);
        self.last_stamp = self.last_stamp.max(clock_ms);
        self.applied_clock_ms = self.applied_clock_ms.max(clock_ms);
    }

    /// Keeps a snapshot taken here, made durable ([`crate::state::persist`]),
    /// and compacts the log behind it.
    pub fn snapshot_persisted(&mut self, snap: Snapshot) {
        let index = snap.get_metadata().index;
        let slack = LOG_SLACK.min(self.config.snapshot_every);
        let keep_from = index.saturating_sub(slack).min(self.kept_for_followers(index));
        match self.store.install(snap, keep_from) {
            Ok(()) => debug!(index, "log compacted behind a snapshot"),
            Err(e) => warn!(index, "cannot compact the log: {e}"),
        }
    }

    /// On a leader, the first entry a follower catching up still needs
    /// from its log: the one after the snapshot a transfer is sending it,
    /// or after where a follower that answered lately stands, within
    /// `snapshot_every` entries (and [`LOG_SLACK`]) of `index`. Without
    /// it, a follower that takes longer to receive and restore a large
    /// snapshot than the leader takes to make the next one would find the
    /// log compacted past it again, and be sent snapshots for ever.
    fn kept_for_followers(&self, index: u64) -> u64 {
        if self.node.raft.state != StateRole::Leader {
            return u64::MAX;
        }
        let floor = index.saturating_sub(self.config.snapshot_every.max(LOG_SLACK));
        let sending = self.transfers.progress().into_iter().filter(|t| t.sending).map(|t| t.id.index + 1);
        let prs = self.node.raft.prs();
        let active = prs.iter().filter(|(&id, pr)| id != self.id && pr.recent_active).map(|(_, pr)| pr.matched + 1);
        sending.chain(active).filter(|&i| i >= floor).min().unwrap_or(u64::MAX)
    }

    /// Peer `peer`, authenticated, not a member this replica knows of,
    /// listens at `addr` (it was added by an entry not seen here yet): a
    /// link to it lets this replica answer it.
    pub fn peer_listens(&mut self, peer: u64, addr: SocketAddr, io: &mut impl ProtocolIo) {
        let new = self.announced.get(&peer) != Some(&addr);
        if new && !self.membership.is_removed(peer) && !self.membership.contains(peer) {
            self.announced.insert(peer, addr);
            self.membership_changed(io);
        }
    }

    /// Peer `peer` connected saying it was repaired and has not caught up:
    /// if this replica leads, its progress for the peer claims entries the
    /// peer no longer holds. Reset it as for a new follower: nothing
    /// matched, probing from the start, so the next append goes to the
    /// peer's real log or, compacted, becomes a snapshot.
    ///
    /// raft-rs has no public call for this (`Progress::reset` is
    /// crate-private), hence the fields. Lowering `matched` is sound: it
    /// only ever overstated what the peer holds, the commit index never
    /// goes back, and a later acknowledgement raises it again. A follower
    /// has nothing to reset: a leader elected later starts every progress
    /// from scratch.
    pub fn peer_repaired(&mut self, peer: u64) -> Result<(), Stop> {
        if self.node.raft.state != StateRole::Leader || peer == self.id {
            return Ok(());
        }
        let what = || format!("resetting the progress of repaired replica {peer}");
        contained(what, || {
            let Some(pr) = self.node.raft.mut_prs().get_mut(peer) else { return };
            info!(peer, matched = pr.matched, "replica {peer} was repaired: its progress starts over");
            pr.matched = 0;
            pr.become_probe();
            self.node.raft.send_append(peer);
        })
    }

    /// The driver's wall clock, ms since the Unix epoch, for the stamps of
    /// the entries proposed from now on (see [`psmr_model::Stamp`]). May
    /// jump either way: stamps never go back all the same.
    pub fn set_wall_clock(&mut self, wall_ms: u64) {
        self.wall_ms = wall_ms;
    }

    /// The stamp of the entry about to be proposed after the log's last:
    /// the wall clock, but never before the latest stamp in the log, so
    /// that stamps never go back along the log, across leader changes
    /// included (a new leader's log holds every committed entry). The log
    /// is read only when its last entry (index and term) is not the one
    /// this replica stamped last (it was a follower, it restarted, it
    /// proposed a membership change, its log was cut and written again),
    /// so a leader reads nothing per proposal; then from the end back to
    /// the first entry with a stamp (stamps grow along the log, so that
    /// one is the latest), at most [`STAMP_SCAN`] entries.
    fn next_stamp(&mut self) -> Stamp {
        let log = &self.node.raft.raft_log;
        let last = (log.last_index(), log.last_term());
        if last != self.stamped_through {
            let from = log.first_index().max(last.0.saturating_sub(STAMP_SCAN - 1));
            let context = raft::GetEntriesContext::empty(false);
            if let Ok(entries) = log.entries(from, None, context) {
                let read = entries.iter().rev().map(|e| entry::entry_stamp(&e.data).time_ms).find(|&t| t != 0);
                self.last_stamp = self.last_stamp.max(read.unwrap_or(0));
            }
            self.stamped_through = last;
        }
        let time_ms = self.wall_ms.max(self.last_stamp);
        Stamp { time_ms, seed: entry::seed(self.node.raft.term, last.0 + 1, time_ms) }
    }

    /// Everything that is due after a burst of events, at `now_ns` on the
    /// driver's clock: the vote floor, the entry, reads, readies, and the
    /// membership change under way.
    pub fn turn(&mut self, now_ns: u64, io: &mut impl ProtocolIo) -> Result<(), Stop> {
        self.check_floor();
        self.take_released();
        self.propose_due(now_ns, io)?;
        self.start_reads(io)?;
        self.handle_readies(io)?;
        self.pump_transfers(now_ns, io)?;
        self.serve_reads(io)?;
        self.drive_admin(io)?;
        self.stepped = Stepped::default();
        Ok(())
    }

    /// Handles raft's readies, a bounded number of them.
    fn handle_readies(&mut self, io: &mut impl ProtocolIo) -> Result<(), Stop> {
        for _ in 0..READIES_PER_TURN {
            if !self.node.has_ready() {
                break;
            }
            for state in self.on_ready(io)? {
                let reads = self.reads.answered(&state.request_ctx, state.index);
                if reads > 0 {
                    io.read_round(reads);
                }
            }
        }
        Ok(())
    }

    /// When the next turn is due without any event, ns on the driver's
    /// clock (`now_ns` if at once); `None` if only an event or a tick can
    /// make one due.
    pub fn due(&self, now_ns: u64) -> Option<u64> {
        if self.reads.next_due().is_some_and(|at| at <= self.applied) {
            return Some(now_ns);
        }
        if self.batcher.is_empty() || !self.pipeline_room() {
            return None;
        }
        if self.batcher.due(self.in_flight(), now_ns) {
            return Some(now_ns);
        }
        self.batcher.deadline()
    }

    /// Whether work waits for the apply loop to apply more: reads for
    /// their index, or an entry for room in the pipeline. The driver then
    /// has the apply loop wake it when it applies the next entry.
    pub fn waits_for_applied(&self) -> bool {
        let reads = self.reads.next_due().is_some_and(|at| at > self.applied);
        reads || (!self.batcher.is_empty() && !self.pipeline_room())
    }

    /// The vote floor the rules keep: none if the planted bug ignores it
    /// (the replica still says it was repaired).
    fn rules_floor(&self) -> Option<(u64, u64)> {
        self.floor.filter(|_| !self.planted.is(Bug::IgnoreVoteFloor))
    }

    fn check_floor(&mut self) {
        if self.floor.is_some() && !guard::floor_holds(&self.node.raft, self.floor) {
            info!("the log reached the vote floor: this replica votes and campaigns again");
            self.floor = None;
        }
    }

    /// Takes back the requests that waited for their clients' reads, as
    /// far as the entry has room; before any new request.
    fn take_released(&mut self) {
        while self.batcher.has_room() {
            let Some(r) = self.reads.next_released() else { return };
            let read = self.may_skip_log(&r);
            if let Some(r) = self.reads.admit(r, read) {
                self.push(r);
            }
        }
    }

    /// Starts a read round if reads wait (or the round in flight went
    /// unanswered for an election timeout); a follower turns them away.
    fn start_reads(&mut self, io: &mut impl ProtocolIo) -> Result<(), Stop> {
        if self.node.raft.state != StateRole::Leader {
            let clients: Vec<u64> = self.reads.drain().into_iter().map(|r| r.client).collect();
            self.redirect_all(&clients, io);
            return Ok(());
        }
        let planted = self.planted.is(Bug::ReadWithoutRound);
        let last = if planted { 0 } else { self.node.raft.raft_log.last_index() };
        let timeout = self.config.election_ticks as u64;
        let Some(ctx) = self.reads.start(last, self.ticks, timeout, self.config.pipeline) else { return Ok(()) };
        if planted {
            // The planted bug: the round answers itself, at once.
            self.reads.answered(&ctx, 0);
            return Ok(());
        }
        contained(|| "starting a read round".into(), || self.node.read_index(ctx))?;
        self.reseed();
        Ok(())
    }

    /// Hands the reads whose index is applied to the apply loop.
    ///
    /// They run at the log's time, where execution has reached, never at
    /// this replica's clock: that may be ahead of the log's and then jump
    /// back, or a new leader's may be behind the old one's, and a key a
    /// read saw expire would come back. The log's time never goes back, and
    /// a read after another has a read index at least as far along. When
    /// the log's time lags the clock by more than [`READ_CLOCK_SLACK_MS`]
    /// (nothing was written for a while), the reads wait for an entry of no
    /// command that brings it up (one for all of them), and are served once
    /// it is applied.
    fn serve_reads(&mut self, io: &mut impl ProtocolIo) -> Result<(), Stop> {
        if self.reads.next_due().map_or(true, |index| index > self.applied) {
            return Ok(());
        }
        match self.tick {
            Some(index) if self.clock_applied < index => return Ok(()),
            Some(_) => self.tick = None,
            None if self.wall_ms > self.applied_clock_ms.saturating_add(READ_CLOCK_SLACK_MS) => {
                return self.propose_tick(io);
            }
            None => {}
        }
        let due = self.reads.due(self.applied);
        if !io.apply(Apply::Reads(due, self.applied_clock_ms)) {
            return Err(Stop::Failed("the apply loop stopped".into()));
        }
        // Proposed after the reads are handed over: their entries come
        // after.
        self.take_released();
        Ok(())
    }

    /// Proposes an entry of no command, stamped now, for the reads due
    /// (see [`Protocol::serve_reads`]); a replica that cannot propose yet
    /// (it does not know the time of the snapshot its log starts after)
    /// serves them at the time it knows.
    fn propose_tick(&mut self, io: &mut impl ProtocolIo) -> Result<(), Stop> {
        if self.clock_applied < self.node.raft.raft_log.first_index() - 1 {
            return Ok(());
        }
        let mut data = EntryBuilder::new().take();
        let stamp = self.next_stamp();
        entry::stamp(&mut data, stamp);
        let proposed = contained(|| "proposing a tick".into(), || self.node.propose(Vec::new(), data))?;
        self.reseed();
        if proposed.is_ok() {
            self.last_stamp = stamp.time_ms;
            let log = &self.node.raft.raft_log;
            self.stamped_through = (log.last_index(), log.last_term());
            self.tick = Some(log.last_index());
            io.clock_entry_proposed();
        }
        Ok(())
    }

    /// Entries this replica appended and that are not committed yet: while
    /// there are any, the next entry grows.
    fn in_flight(&self) -> u64 {
        let log = &self.node.raft.raft_log;
        log.last_index().saturating_sub(log.committed)
    }

    /// Whether a leader may propose another entry: fewer than `pipeline`
    /// proposed and not yet applied.
    fn pipeline_room(&self) -> bool {
        if self.node.raft.state != StateRole::Leader {
            return true;
        }
        let last = self.node.raft.raft_log.last_index();
        last.saturating_sub(self.applied) < self.config.pipeline as u64
    }

    /// Proposes the waiting entry if it is due; a follower turns the
    /// requests away instead.
    fn propose_due(&mut self, now_ns: u64, io: &mut impl ProtocolIo) -> Result<(), Stop> {
        if self.batcher.is_empty() {
            return Ok(());
        }
        if self.node.raft.state != StateRole::Leader {
            let (_, clients) = self.batcher.take();
            self.redirect_all(&clients, io);
            return Ok(());
        }
        if !self.pipeline_room() || !self.batcher.due(self.in_flight(), now_ns) {
            return Ok(());
        }
        // The stamps of the entries a snapshot covers are known only once
        // the apply loop has restored it: until then the entry waits.
        if self.clock_applied < self.node.raft.raft_log.first_index() - 1 {
            return Ok(());
        }
        let commands = self.batcher.len() as u64;
        let (mut data, clients) = self.batcher.take();
        let stamp = self.next_stamp();
        entry::stamp(&mut data, stamp);
        let bytes = data.len();
        let early = self.planted.is(Bug::AckBeforeCommit).then(|| data.clone());
        let proposed = contained(|| "proposing".into(), || self.node.propose(Vec::new(), data))?;
        self.reseed();
        match proposed {
            Ok(()) => {
                self.last_stamp = stamp.time_ms;
                let log = &self.node.raft.raft_log;
                self.stamped_through = (log.last_index(), log.last_term());
                io.proposed(commands, bytes)
            }
            Err(e) => {
                warn!("proposal dropped: {e}");
                self.redirect_all(&clients, io);
                return Ok(());
            }
        }
        if let Some(entry) = early {
            // The planted bug: the entry's commands execute now, outside
            // the log, and are answered.
            let r = Request::new(0, commands as u32, entry[entry::HEADER_BYTES..].to_vec(), bytes, now_ns);
            if !io.apply(Apply::Reads(vec![r], self.wall_ms)) {
                return Err(Stop::Failed("the apply loop stopped".into()));
            }
        }
        Ok(())
    }

    /// Sends `clients` to the leader; they retry there with the same
    /// sequence numbers.
    fn redirect_all(&self, clients: &[u64], io: &mut impl ProtocolIo) {
        if clients.is_empty() {
            return;
        }
        let msg = self.redirect();
        let mut told = HashSet::new();
        for &client in clients {
            if told.insert(client) {
                io.tell(client, msg.clone());
            }
        }
    }

    /// Handles the ready; returns its read states.
    fn on_ready(&mut self, io: &mut impl ProtocolIo) -> Result<Vec<ReadState>, Stop> {
        let (membership, transfers, store) = (&mut self.membership, &mut self.transfers, &self.store);
        let mut out =
            Wire { io, membership, transfers, store, read_states: Vec::new(), changed: false, removed_at: None };
        let what = || format!("handling a ready after {}", self.stepped.describe());
        let (node, planted) = (&mut self.node, self.planted);
        let handle = || {
            fail::fail_point!("protocol-ready");
            handle_ready(node, store, &mut out, planted)
        };
        let handled = contained(what, handle)?;
        let Wire { read_states, changed, removed_at, .. } = out;
        self.reseed();
        if let Some(index) = removed_at {
            return Err(Stop::Removed(format!("its removal was committed at index {index}")));
        }
        handled.map_err(Stop::Failed)?;
        if changed {
            self.membership_changed(io);
        }
        Ok(read_states)
    }

    /// After the membership changed (a conf change, a snapshot, a peer
    /// that announced itself): the links the driver keeps, and the guard's
    /// removed replicas.
    fn membership_changed(&mut self, io: &mut impl ProtocolIo) {
        let membership = &self.membership;
        self.announced.retain(|peer, _| !membership.contains(*peer) && !membership.is_removed(*peer));
        let members: Vec<Member> = match membership.is_empty() {
            true => self.config.replicas.clone(),
            false => membership.members().cloned().collect(),
        };
        let mut peers: BTreeMap<u64, SocketAddr> = members.into_iter().map(|m| (m.id, m.peer)).collect();
        peers.extend(self.announced.iter().map(|(&peer, &addr)| (peer, addr)));
        peers.remove(&self.id);
        self.guard = Guard::new(self.id).with_removed(self.membership.removed());
        io.membership(&self.membership, &peers);
    }

    /// raft-rs draws each randomized election timeout from `thread_rng`:
    /// whenever a call has just reset the election clock, the draw is
    /// replaced by one from this protocol's seeded generator, so that a
    /// run depends on its seed alone.
    fn reseed(&mut self) {
        if self.node.raft.election_elapsed == 0 {
            let base = self.node.raft.election_timeout();
            let timeout = self.rng.gen_range(base..2 * base);
            self.node.raft.set_randomized_election_timeout(timeout);
        }
    }
}

/// The protocol's [`ReadyOut`]: the driver's io, the membership the
/// ready's conf changes and snapshots change, and the transfers its
/// snapshot messages start.
struct Wire<'a, I, S> {
    io: &'a mut I,
    membership: &'a mut Membership,
    transfers: &'a mut Transfers,
    store: &'a S,
    read_states: Vec<ReadState>,
    /// A conf change or a snapshot changed the membership.
    changed: bool,
    /// The index at which this replica's own removal was committed.
    removed_at: Option<u64>,
}

impl<S: Store, I: ProtocolIo> ReadyOut<S> for Wire<'_, I, S> {
    fn send(&mut self, node: &mut RawNode<RaftLog<S>>, msgs: Vec<Message>) {
        for msg in msgs {
            let to = msg.to;
            if msg.get_msg_type() == MessageType::MsgSnapshot {
                // Raft waits for the transfer's report; it offers again
                // after a failure.
                if let Err(why) = self.transfers.offer(msg, self.store) {
                    debug!(peer = to, "cannot send a snapshot now: {why}");
                    node.report_snapshot(to, SnapshotStatus::Failure);
                }
                continue;
            }
            if !self.io.send(msg) {
                node.report_unreachable(to);
            }
        }
    }

    fn deliver(&mut self, entries: Vec<Entry>) -> Result<(), String> {
        if !entries.is_empty() && !self.io.apply(Apply::Entries(entries)) {
            return Err("the apply loop stopped".into());
        }
        Ok(())
    }

    fn restore(&mut self, snapshot: Snapshot) -> Result<(), String> {
        *self.membership = crate::state::membership(&snapshot)?;
        self.changed = true;
        let id = crate::store::descriptor_id(&snapshot).map_err(|e| e.to_string())?;
        let file = self.store.open_snapshot(&id).map_err(|e| format!("cannot open the snapshot just kept: {e}"))?;
        match self.io.apply(Apply::Snapshot(Box::new(snapshot), file)) {
            true => Ok(()),
            false => Err("the apply loop stopped".into()),
        }
    }

    fn read_states(&mut self, states: Vec<ReadState>) {
        self.read_states.extend(states);
    }

    fn conf_change(&mut self, node: &mut RawNode<RaftLog<S>>, e: &Entry) -> Result<(), String> {
        match membership::apply_committed(node, self.membership, e)? {
            Committed::Ignored(why) => warn!(index = e.index, "a conf-change entry that changes nothing: {why}"),
            Committed::Changed(change) => {
                info!(index = e.index, ?change, "membership changed");
                self.changed = true;
            }
            Committed::RemovedSelf => {
                self.removed_at = Some(e.index);
                return Err("removed from the cluster".into());
            }
        }
        Ok(())
    }
}

/// Runs `f`, which touches the raft node; if it panics, the protocol must
/// stop: [`Stop::Failed`] says what it was doing (`what`).
///
/// `AssertUnwindSafe` is sound here because nothing that `f` may have left
/// half-updated is used after a panic: the driver stops the protocol.
fn contained<R>(what: impl FnOnce() -> String, f: impl FnOnce() -> R) -> Result<R, Stop> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|payload| {
        Stop::Failed(format!(
            "raft panicked {}: {}; its state can no longer be trusted, the replica stops",
            what(),
            psmr_sched::panic_message(payload.as_ref())
        ))
    })
}

/// What one turn has stepped, for the failure report.
#[derive(Default)]
struct Stepped {
    count: usize,
    first: Vec<(MessageType, u64)>,
}

impl Stepped {
    fn push(&mut self, kind: MessageType, from: u64) {
        self.count += 1;
        if self.first.len() < STEPPED_REPORTED {
            self.first.push((kind, from));
        }
    }

    fn describe(&self) -> String {
        if self.count == 0 {
            return "no peer message".into();
        }
        let named: Vec<String> =
            self.first.iter().map(|(kind, from)| format!("{kind:?} from replica {from}")).collect();
        match self.count - self.first.len() {
            0 => named.join(", "),
            more => format!("{} and {more} more", named.join(", ")),
        }
    }
}

/// Sends raft-rs's log records to `tracing`.
struct RaftLogDrain;

impl slog::Drain for RaftLogDrain {
    type Ok = ();
    type Err = slog::Never;
    fn log(&self, record: &slog::Record<'_>, _values: &slog::OwnedKVList) -> Result<(), slog::Never> {
        match record.level() {
            slog::Level::Critical | slog::Level::Error => tracing::error!(target: "raft", "{}", record.msg()),
            slog::Level::Warning => tracing::warn!(target: "raft", "{}", record.msg()),
            slog::Level::Info => tracing::info!(target: "raft", "{}", record.msg()),
            _ => tracing::debug!(target: "raft", "{}", record.msg()),
        }
        Ok(())
    }
}

/// The driver's io as transfers use it.
struct LinkIo<'a, I>(&'a mut I);

impl<I: ProtocolIo> Link for LinkIo<'_, I> {
    fn send(&mut self, to: u64, msg: SnapMsg) -> bool {
        self.0.send_snapshot(to, msg)
    }

    fn refused(&mut self, peer: u64, why: &str) {
        self.0.transfer_refused(peer, why)
    }
}
