//! The Protocol thread (002 §V-C2): the only thread that touches the raft
//! node. It steps peers' messages, turns client requests into log entries
//! and proposes them ([`crate::batcher`]: at once when nothing is in flight,
//! growing while entries are in flight, at most `pipeline` proposed and not
//! yet applied), ticks, and handles each `Ready`: sends messages, stores
//! entries and hard state, and passes committed entries and snapshots to
//! the service manager.
//!
//! Every peer message passes the [`guard`] before raft sees
//! it. Should raft-rs panic anyway (in `step`, `tick`, `propose` or while a
//! ready is handled), the thread stops the replica: raft's state after a
//! panic cannot be trusted, and a replica whose protocol thread is gone
//! must not run on as a zombie.

use crate::batcher::{Batcher, Request, RequestReceiver};
use crate::guard::{self, Guard};
use crate::manager::Decision;
use crate::membership::{self, Committed, Membership};
use crate::peer::{Inbound, PeerSender};
use crate::queue::{Receiver, Sender};
use crate::ratelog::RateLimit;
use crate::reads::Reads;
use crate::store::Log;
use crate::Shared;
use crossbeam::channel::Select;
use raft::prelude::{Entry, EntryType, Message, MessageType, Snapshot};
use raft::{RawNode, ReadState, SnapshotStatus, StateRole};
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};

/// Entries the log keeps behind a snapshot (at most), so that a follower
/// slightly behind catches up from the log rather than from a snapshot.
const LOG_SLACK: u64 = 1_000;

/// Warnings about refused peer messages: a misbehaving peer sends many.
static REFUSED: RateLimit = RateLimit::new(10, Duration::from_secs(10));

/// Messages stepped between two readies that a failure report names.
const STEPPED_REPORTED: usize = 8;

/// Peer messages, and separately client requests, taken in one turn at
/// most: one ready for a burst, yet ticks and readies still come often.
const TURN_TAKES: usize = 256;

pub(crate) struct Protocol {
    pub(crate) shared: Arc<Shared>,
    pub(crate) node: RawNode<Log>,
    pub(crate) store: Log,
    pub(crate) peers: HashMap<u64, PeerSender>,
    pub(crate) inbound: Receiver<Inbound>,
    pub(crate) requests: RequestReceiver,
    pub(crate) batcher: Batcher,
    pub(crate) reads: Reads,
    pub(crate) decisions: Sender<Decision>,
    /// Ticks so far: the clock of read rounds.
    pub(crate) ticks: u64,
    /// The rules every peer message passes.
    pub(crate) guard: Guard,
    /// The members as of the last committed conf change.
    pub(crate) membership: Membership,
    /// Peer TLS, for senders to replicas added later.
    pub(crate) tls: Option<Arc<crate::tls::PeerTlsContext>>,
    /// The membership change under way (leader only).
    pub(crate) admin: Option<crate::admin::Pending>,
    /// Peers not (yet) in this replica's membership that connected and
    /// said where they listen (see `Inbound::PeerListens`).
    pub(crate) announced: HashMap<u64, std::net::SocketAddr>,
}

/// The replica is stopping because raft-rs panicked or a ready could not
/// be handled: the raft node must not be touched again.
pub(crate) struct Stopped;

/// What one turn of the loop has stepped, for the failure report.
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
        let more = self.count - self.first.len();
        if more > 0 {
            format!("{} and {more} more", named.join(", "))
        } else {
            named.join(", ")
        }
    }
}

/// Makes this thread's timed waits end within a microsecond of their
/// deadline instead of Linux's default slack of 50 µs: the batching delay
/// is honoured to within microseconds, not to within the kernel's timer
/// coalescing.
fn precise_timers() {
    #[cfg(target_os = "linux")]
    if let Err(e) = nix::sys::prctl::set_timerslack(1_000) {
        debug!("cannot lower the protocol thread's timer slack: {e}");
    }
}

/// Runs `f`, which touches the raft node; if it panics, stops the replica
/// with a message saying what it was doing (`what`).
///
/// `AssertUnwindSafe` is sound here because nothing that `f` may have left
/// half-updated is used after a panic: the protocol thread returns at once.
pub(crate) fn contained<R>(
    shared: &Shared,
    what: impl FnOnce() -> String,
    f: impl FnOnce() -> R,
) -> Result<R, Stopped> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|payload| {
        shared.fail(format!(
            "raft panicked {}: {}; its state can no longer be trusted, the replica stops",
            what(),
            psmr_sched::panic_message(payload.as_ref())
        ));
        Stopped
    })
}

impl Protocol {
    pub(crate) fn run(mut self) {
        precise_timers();
        if let Log::Disk(disk) = &self.store {
            disk.time_syncs(self.shared.metrics.log_sync.clone());
        }
        self.membership_changed();
        // Read once: the floor only ever goes away, and it does once this
        // replica's log reaches it (then Raft's own up-to-date check covers
        // everything this replica ever acknowledged).
        let mut floor = self.store.vote_floor();
        if let Some((term, index)) = floor {
            info!(term, index, "vote floor: no votes for shorter logs and no campaigns until the log reaches it");
        }
        let tick = self.shared.config.tick();
        let mut next_tick = Instant::now() + tick;
        while !self.shared.stopping() {
            if floor.is_some() && !guard::floor_holds(&self.node.raft, floor) {
                info!("the log reached the vote floor: this replica votes and campaigns again");
                floor = None;
                self.shared.repaired.store(false, Ordering::Release);
            }
            if self.turn(floor, tick, &mut next_tick).is_err() {
                return;
            }
        }
    }

    fn turn(&mut self, floor: Option<(u64, u64)>, tick: Duration, next_tick: &mut Instant) -> Result<(), Stopped> {
        let mut stepped = Stepped::default();
        self.wait(floor, *next_tick, &mut stepped)?;
        // Take whatever else is waiting before handling the ready: one
        // ready (one sync) for a burst of messages and requests.
        for _ in 0..TURN_TAKES {
            match self.inbound.try_recv() {
                Ok(m) => self.inbound_msg(floor, m, &mut stepped)?,
                Err(_) => break,
            }
        }
        self.take_released();
        for _ in 0..TURN_TAKES {
            if !self.batcher.has_room() {
                break;
            }
            match self.requests.rx.try_recv() {
                Ok(r) => self.take(r),
                Err(_) => break,
            }
        }
        self.propose_due(Instant::now())?;
        self.start_reads()?;
        if Instant::now() >= *next_tick {
            // A follower that is not ticked never starts an election: below
            // its vote floor, this replica must not campaign. It still
            // answers appends and heartbeats and installs snapshots.
            if floor.is_none() {
                contained(&self.shared, || "ticking".into(), || self.node.tick())?;
            }
            self.ticks += 1;
            *next_tick += tick;
            if *next_tick < Instant::now() {
                *next_tick = Instant::now() + tick;
            }
        }
        for state in self.on_ready(&stepped)? {
            let reads = self.reads.answered(&state.request_ctx, state.index);
            if reads > 0 {
                self.shared.metrics.read_round_requests.observe(reads as u64);
            }
        }
        self.serve_reads()?;
        self.drive_admin()?;
        self.publish();
        Ok(())
    }

    /// Waits for a peer message or a request, until the next tick or until
    /// the waiting entry is due; handles what came.
    fn wait(&mut self, floor: Option<(u64, u64)>, next_tick: Instant, stepped: &mut Stepped) -> Result<(), Stopped> {
        let now = Instant::now();
        let deadline = if !self.wait_for_applied() {
            now
        } else if self.batcher.is_empty() || !self.pipeline_room() {
            next_tick
        } else if self.batcher.due(self.in_flight(), now) {
            now
        } else {
            self.batcher.deadline().map_or(next_tick, |d| d.min(next_tick))
        };
        enum Got {
            Inbound(Inbound),
            Request(Request),
            Nothing,
            Closed,
        }
        let got = {
            let mut sel = Select::new();
            let i_in = self.inbound.select(&mut sel);
            let i_req = self.batcher.has_room().then(|| sel.recv(&self.requests.rx));
            match sel.select_deadline(deadline) {
                Ok(op) if op.index() == i_in => self.inbound.complete(op).map_or(Got::Closed, Got::Inbound),
                Ok(op) if Some(op.index()) == i_req => op.recv(&self.requests.rx).map_or(Got::Closed, Got::Request),
                Ok(_) => unreachable!("only two operations are selected"),
                Err(_) => Got::Nothing,
            }
        };
        match got {
            Got::Inbound(m) => self.inbound_msg(floor, m, stepped),
            Got::Request(r) => {
                self.take(r);
                Ok(())
            }
            Got::Nothing => Ok(()),
            Got::Closed => Err(Stopped),
        }
    }

    fn inbound_msg(&mut self, floor: Option<(u64, u64)>, m: Inbound, stepped: &mut Stepped) -> Result<(), Stopped> {
        match m {
            Inbound::Raft(msg) => {
                let (kind, from) = (msg.get_msg_type(), msg.from);
                // The receiver (see `peer`) passes on only messages whose
                // `from` is the peer authenticated on the link.
                let sender = from;
                let what = || format!("checking {kind:?} from replica {from}");
                let verdict = contained(&self.shared, what, || self.guard.check(&msg, sender, &self.node.raft, floor))?;
                if let Err(why) = verdict {
                    self.shared.stats.peer_refused.fetch_add(1, Ordering::Relaxed);
                    self.shared.metrics.peer_refused(why.rule);
                    crate::warn_limited!(REFUSED, peer = sender, kind = ?kind, "refused a raft message: {why}");
                    return Ok(());
                }
                stepped.push(kind, from);
                let what = || format!("stepping {kind:?} from replica {from}");
                let step = || {
                    // Stands for a raft-rs panic the guard did not foresee.
                    fail::fail_point!("protocol-step");
                    self.node.step(*msg)
                };
                if let Err(e) = contained(&self.shared, what, step)? {
                    debug!("raft refused a message: {e}");
                }
            }
            Inbound::Snapshot(snap) => self.install_own_snapshot(*snap),
            Inbound::Admin(request) => self.admin_request(request)?,
            Inbound::PeerListens { peer, addr } => {
                // Sent again at each of the peer's reconnections: only a
                // new address changes the senders.
                let new = self.announced.get(&peer) != Some(&addr);
                if new && !self.membership.is_removed(peer) && !self.membership.contains(peer) {
                    self.announced.insert(peer, addr);
                    self.membership_changed();
                }
            }
            Inbound::PeerRepaired { peer } => self.forget_progress(peer)?,
            // The turn this ends looks at the pipeline again.
            Inbound::Applied => {}
        }
        Ok(())
    }

    /// Peer `peer` was repaired and has not caught up (see `peer`,
    /// "Repaired replicas"): if this replica leads, its progress for the
    /// peer claims entries the peer no longer holds. Reset it as for a new
    /// follower: nothing matched, probing from the start, so the next
    /// append goes to the peer's real log or, compacted, becomes a
    /// snapshot; heartbeats then commit nothing beyond `matched` (0).
    ///
    /// raft-rs has no public call for this (`Progress::reset` is
    /// crate-private), hence the fields. The follower-side alternative,
    /// `RawNode::request_snapshot`, does not do: it needs a known leader
    /// (the repaired replica learns it from a heartbeat, which rule 10
    /// drops), its rejection hint is later than its index (rule 12), and
    /// the snapshot it gets may still end below the stale `matched`.
    /// Lowering `matched` is sound: it only ever overstated what the peer
    /// holds, the commit index never goes back, and a later acknowledgement
    /// raises it again. A follower or candidate has nothing to reset: a
    /// leader elected later starts every progress from scratch.
    fn forget_progress(&mut self, peer: u64) -> Result<(), Stopped> {
        if self.node.raft.state != StateRole::Leader || peer == self.shared.id {
            return Ok(());
        }
        let what = || format!("resetting the progress of repaired replica {peer}");
        contained(&self.shared, what, || {
            let Some(pr) = self.node.raft.mut_prs().get_mut(peer) else { return };
            info!(peer, matched = pr.matched, "replica {peer} was repaired: its progress starts over");
            pr.matched = 0;
            pr.become_probe();
            self.node.raft.send_append(peer);
        })
    }

    /// Takes a request: a read the leader serves without the log, a
    /// request that waits for its client's reads, or into the next entry
    /// (see [`crate::reads`] for the order of a client's requests). A
    /// read of a client whose earlier request waits in the entry goes with
    /// it, so that it sees that request's writes.
    fn take(&mut self, r: Request) {
        let read = self.may_skip_log(&r);
        if let Some(r) = self.reads.take(r, read) {
            self.batcher.push(r);
        }
    }

    fn may_skip_log(&self, r: &Request) -> bool {
        r.read && !self.shared.config.reads_through_log && !self.batcher.holds(r.client)
    }

    /// Takes back the requests that waited for their clients' reads, as
    /// far as the entry has room; before any new request.
    fn take_released(&mut self) {
        while self.batcher.has_room() {
            let Some(r) = self.reads.next_released() else { return };
            let read = self.may_skip_log(&r);
            if let Some(r) = self.reads.admit(r, read) {
                self.batcher.push(r);
            }
        }
    }

    /// Starts a read round if reads wait (or the round in flight went
    /// unanswered for an election timeout); a follower turns them away.
    fn start_reads(&mut self) -> Result<(), Stopped> {
        if self.node.raft.state != StateRole::Leader {
            let clients = self.reads.drain().into_iter().map(|r| r.client).collect();
            self.redirect(clients);
            return Ok(());
        }
        let last = self.node.raft.raft_log.last_index();
        let timeout = self.shared.config.election_ticks as u64;
        let in_flight = self.shared.config.pipeline;
        if let Some(ctx) = self.reads.start(last, self.ticks, timeout, in_flight) {
            contained(&self.shared, || "starting a read round".into(), || self.node.read_index(ctx))?;
        }
        Ok(())
    }

    /// Hands the reads whose index is applied to the service manager.
    fn serve_reads(&mut self) -> Result<(), Stopped> {
        let due = self.reads.due(self.shared.applied.load(Ordering::SeqCst));
        if due.is_empty() {
            return Ok(());
        }
        if self.decisions.send(Decision::Reads(due)).is_err() {
            self.shared.fail("the service manager stopped".into());
            return Err(Stopped);
        }
        // Proposed after the reads are sent: their entries come after.
        self.take_released();
        Ok(())
    }

    /// Whether the reads held may keep waiting: none waits for an applied
    /// index, or the one they wait for is not applied yet (and the service
    /// manager nudges this thread when it applies the next entry). False:
    /// serve them now.
    fn wait_for_applied(&self) -> bool {
        self.reads.next_due().map_or(true, |at| !self.shared.applied_reaches(|applied| applied >= at))
    }

    /// Entries this replica appended and that are not committed yet: while
    /// there are any, the next entry grows.
    fn in_flight(&self) -> u64 {
        let log = &self.node.raft.raft_log;
        log.last_index().saturating_sub(log.committed)
    }

    /// Whether a leader may propose another entry: fewer than `pipeline`
    /// proposed and not yet applied. If not, the service manager nudges
    /// this thread when it applies one, so the wait for room is not a wait
    /// for the next tick.
    fn pipeline_room(&self) -> bool {
        if self.node.raft.state != StateRole::Leader {
            return true;
        }
        let last = self.node.raft.raft_log.last_index();
        let pipeline = self.shared.config.pipeline as u64;
        self.shared.applied_reaches(|applied| last.saturating_sub(applied) < pipeline)
    }

    /// Proposes the waiting entry if it is due; a follower turns the
    /// requests away instead.
    fn propose_due(&mut self, now: Instant) -> Result<(), Stopped> {
        if self.batcher.is_empty() {
            return Ok(());
        }
        if self.node.raft.state != StateRole::Leader {
            let (_, clients) = self.batcher.take();
            self.redirect(clients);
            return Ok(());
        }
        if !self.pipeline_room() || !self.batcher.due(self.in_flight(), now) {
            return Ok(());
        }
        let commands = self.batcher.len() as u64;
        let (data, clients) = self.batcher.take();
        let bytes = data.len();
        let proposed = contained(&self.shared, || "proposing".into(), || self.node.propose(Vec::new(), data))?;
        match proposed {
            Ok(()) => {
                let stats = &self.shared.stats;
                stats.entries_proposed.fetch_add(1, Ordering::Relaxed);
                stats.commands_proposed.fetch_add(commands, Ordering::Relaxed);
                self.shared.metrics.entry_proposed(commands, bytes);
            }
            Err(e) => {
                warn!("proposal dropped: {e}");
                self.redirect(clients);
            }
        }
        Ok(())
    }

    /// Sends `clients` to the leader; they retry there with the same
    /// sequence numbers.
    fn redirect(&self, clients: Vec<u64>) {
        let msg = self.shared.redirect_to(self.node.raft.leader_id);
        let mut told = std::collections::HashSet::new();
        for client in clients {
            if told.insert(client) {
                self.shared.router.send(client, crate::router::Outgoing::Msg(msg.clone()));
            }
        }
    }

    /// Keeps a snapshot taken here (made durable already, see
    /// [`crate::snapshot`]); its membership is the service manager's at
    /// its index, which may lag this thread's.
    fn install_own_snapshot(&mut self, snap: Snapshot) {
        let index = snap.get_metadata().index;
        let slack = LOG_SLACK.min(self.shared.config.snapshot_every);
        if let Err(e) = self.store.install(snap, index.saturating_sub(slack)) {
            warn!(index, "cannot compact the log: {e}");
        } else {
            debug!(index, "log compacted behind a snapshot");
        }
    }

    /// Handles the ready, if any; returns its read states.
    fn on_ready(&mut self, stepped: &Stepped) -> Result<Vec<ReadState>, Stopped> {
        let mut out = Wire {
            peers: &self.peers,
            decisions: &self.decisions,
            read_states: Vec::new(),
            membership: &mut self.membership,
            changed: false,
            removed_at: None,
        };
        let what = || format!("handling a ready after {}", stepped.describe());
        let handle = || {
            fail::fail_point!("protocol-ready");
            handle_ready(&mut self.node, &self.store, &mut out)
        };
        let handled = contained(&self.shared, what, handle)?;
        if let Some(index) = out.removed_at {
            self.shared.stop_removed(&format!("its removal was committed at index {index}"));
            return Err(Stopped);
        }
        handled.map_err(|why| {
            self.shared.fail(why);
            Stopped
        })?;
        let (read_states, changed) = (out.read_states, out.changed);
        if changed {
            self.membership_changed();
        }
        Ok(read_states)
    }

    /// After the membership changed (a conf change or a snapshot): a
    /// sender for every other member and none for anyone else, the guard's
    /// removed replicas, the published view.
    fn membership_changed(&mut self) {
        let id = self.shared.id;
        self.shared.set_membership(&self.membership);
        let membership = &self.membership;
        self.announced.retain(|peer, _| !membership.contains(*peer) && !membership.is_removed(*peer));
        let mut wanted: HashMap<u64, std::net::SocketAddr> =
            self.shared.members().into_iter().map(|m| (m.id, m.peer)).collect();
        wanted.extend(self.announced.iter().map(|(&peer, &addr)| (peer, addr)));
        wanted.remove(&id);
        self.peers.retain(|peer, _| wanted.contains_key(peer));
        for (peer, addr) in wanted {
            if self.peers.contains_key(&peer) {
                continue;
            }
            match crate::peer::spawn_sender(&self.shared, peer, addr, self.tls.clone()) {
                Ok(sender) => {
                    self.peers.insert(peer, sender);
                }
                Err(e) => warn!(peer, "cannot start a sender: {e}"),
            }
        }
        self.guard = Guard::new(id).with_removed(self.membership.removed());
    }

    fn publish(&self) {
        let raft = &self.node.raft;
        self.shared.leader.store(raft.leader_id, Ordering::Release);
        self.shared.term.store(raft.term, Ordering::Release);
        self.shared.metrics.commit.store(raft.raft_log.committed, Ordering::Release);
        self.shared.is_leader.store(raft.state == StateRole::Leader, Ordering::Release);
    }
}

/// Where the output of a ready goes, besides the log: the protocol thread
/// sends to peers and to the service manager; tests collect it.
pub(crate) trait ReadyOut {
    /// Sends messages to peers, telling `node` about the ones that cannot
    /// be sent.
    fn send(&mut self, node: &mut RawNode<Log>, msgs: Vec<Message>);
    /// Hands committed entries, in log order, to the service manager.
    fn deliver(&mut self, entries: Vec<Entry>) -> Result<(), String>;
    /// Hands a snapshot from the leader, now in the log, to the service
    /// manager.
    fn restore(&mut self, snapshot: Snapshot) -> Result<(), String>;
    /// Hands over the answers to read-index requests: each says which
    /// commit index the reads with that context must wait for.
    fn read_states(&mut self, states: Vec<ReadState>);
    /// Applies the committed conf-change entry `e` to `node` (before the
    /// entry reaches the service manager). A caller whose membership
    /// never changes after its start may ignore them.
    fn conf_change(&mut self, node: &mut RawNode<Log>, e: &Entry) -> Result<(), String> {
        let _ = (node, e);
        Ok(())
    }
}

/// The protocol thread's [`ReadyOut`].
struct Wire<'a> {
    peers: &'a HashMap<u64, PeerSender>,
    decisions: &'a Sender<Decision>,
    /// Read states of this ready, for the protocol thread to match with
    /// its waiting reads.
    read_states: Vec<ReadState>,
    membership: &'a mut Membership,
    /// A conf change or a snapshot changed the membership.
    changed: bool,
    /// The index at which this replica's own removal was committed.
    removed_at: Option<u64>,
}

impl ReadyOut for Wire<'_> {
    fn send(&mut self, node: &mut RawNode<Log>, msgs: Vec<Message>) {
        for msg in msgs {
            let (to, snapshot) = (msg.to, msg.get_msg_type() == MessageType::MsgSnapshot);
            let sent = self.peers.get(&to).is_some_and(|p| p.send(msg));
            if snapshot {
                let status = if sent { SnapshotStatus::Finish } else { SnapshotStatus::Failure };
                node.report_snapshot(to, status);
            }
            if !sent {
                node.report_unreachable(to);
            }
        }
    }

    fn deliver(&mut self, entries: Vec<Entry>) -> Result<(), String> {
        if !entries.is_empty() && self.decisions.send(Decision::Entries(entries)).is_err() {
            return Err("the service manager stopped".into());
        }
        Ok(())
    }

    fn restore(&mut self, snapshot: Snapshot) -> Result<(), String> {
        let index = snapshot.get_metadata().index;
        let state = crate::manager::decode_state(&snapshot.data)
            .map_err(|e| format!("the snapshot at {index} from the leader: {e}"))?;
        *self.membership = Membership::decode(state.members).map_err(|e| format!("the snapshot at {index}: {e}"))?;
        self.changed = true;
        self.decisions.send(Decision::Snapshot(Box::new(snapshot))).map_err(|_| "the service manager stopped".into())
    }

    fn read_states(&mut self, states: Vec<ReadState>) {
        self.read_states.extend(states);
    }

    fn conf_change(&mut self, node: &mut RawNode<Log>, e: &Entry) -> Result<(), String> {
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

/// Applies the conf changes among `entries` to `node`, then hands them
/// all to the service manager.
fn deliver_committed(node: &mut RawNode<Log>, out: &mut impl ReadyOut, entries: Vec<Entry>) -> Result<(), String> {
    for e in entries.iter().filter(|e| e.get_entry_type() != EntryType::EntryNormal) {
        out.conf_change(node, e)?;
    }
    out.deliver(entries)
}

/// Handles one ready of `node`, if it has one: stores what raft asks to
/// store in `store`, and sends and delivers the rest through `out`. An
/// error means the replica must stop.
pub(crate) fn handle_ready(node: &mut RawNode<Log>, store: &Log, out: &mut impl ReadyOut) -> Result<(), String> {
    if !node.has_ready() {
        return Ok(());
    }
    let mut ready = node.ready();
    out.send(node, ready.take_messages());
    if !ready.read_states().is_empty() {
        out.read_states(ready.take_read_states());
    }
    if *ready.snapshot() != Snapshot::default() {
        let snap = ready.snapshot().clone();
        let index = snap.get_metadata().index;
        // raft has already restored its log from the snapshot: a log that
        // refuses it would leave the two disagreeing.
        store.apply_snapshot(snap.clone()).map_err(|e| format!("cannot install the snapshot at {index}: {e}"))?;
        info!(index, "installing a snapshot from the leader");
        out.restore(snap)?;
    }
    deliver_committed(node, out, ready.take_committed_entries())?;
    // Nothing that depends on these entries or this vote leaves before
    // they are stored (synced, on disk).
    store.append(ready.entries(), ready.hs()).map_err(|e| format!("cannot persist the log: {e}"))?;
    out.send(node, ready.take_persisted_messages());
    let mut light = node.advance(ready);
    if let Some(commit) = light.commit_index() {
        store.set_commit(commit).map_err(|e| format!("cannot persist the log: {e}"))?;
    }
    out.send(node, light.take_messages());
    deliver_committed(node, out, light.take_committed_entries())?;
    node.advance_apply();
    Ok(())
}
