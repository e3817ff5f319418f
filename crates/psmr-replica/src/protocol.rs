//! The Protocol thread (002 §V-C2): the only thread that touches the raft
//! node. It steps peers' messages, proposes the Batcher's log entries while
//! fewer than `pipeline` of them are proposed and not yet applied, ticks,
//! and handles each `Ready`: sends messages, stores entries and hard state,
//! and passes committed entries and snapshots to the service manager.
//!
//! Every peer message passes the [`guard`] before raft sees
//! it. Should raft-rs panic anyway (in `step`, `tick`, `propose` or while a
//! ready is handled), the thread stops the replica: raft's state after a
//! panic cannot be trusted, and a replica whose protocol thread is gone
//! must not run on as a zombie.

use crate::guard::{self, Guard};
use crate::manager::Decision;
use crate::peer::{Inbound, PeerSender};
use crate::ratelog::RateLimit;
use crate::store::{decode_entry, Log};
use crate::Shared;
use crossbeam::channel::{Receiver, Select, Sender};
use psmr_model::wire::ServerMsg;
use raft::prelude::{Entry, Message, MessageType, Snapshot};
use raft::{RawNode, SnapshotStatus, StateRole};
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};

/// A log entry ready to propose (the clients whose commands it holds are
/// told to go elsewhere if the proposal is dropped).
pub struct Proposal {
    /// The encoded entry.
    pub data: Vec<u8>,
}

/// Entries the log keeps behind a snapshot (at most), so that a follower
/// slightly behind catches up from the log rather than from a snapshot.
const LOG_SLACK: u64 = 1_000;

/// Warnings about refused peer messages: a misbehaving peer sends many.
static REFUSED: RateLimit = RateLimit::new(10, Duration::from_secs(10));

/// Messages stepped between two readies that a failure report names.
const STEPPED_REPORTED: usize = 8;

pub(crate) struct Protocol {
    pub(crate) shared: Arc<Shared>,
    pub(crate) node: RawNode<Log>,
    pub(crate) store: Log,
    pub(crate) peers: HashMap<u64, PeerSender>,
    pub(crate) inbound: Receiver<Inbound>,
    pub(crate) proposals: Receiver<Proposal>,
    pub(crate) decisions: Sender<Decision>,
}

/// The replica is stopping because raft-rs panicked or a ready could not
/// be handled: the raft node must not be touched again.
struct Stopped;

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

/// Runs `f`, which touches the raft node; if it panics, stops the replica
/// with a message saying what it was doing (`what`).
///
/// `AssertUnwindSafe` is sound here because nothing that `f` may have left
/// half-updated is used after a panic: the protocol thread returns at once.
fn contained<R>(shared: &Shared, what: impl FnOnce() -> String, f: impl FnOnce() -> R) -> Result<R, Stopped> {
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
        let guard = Guard::new(self.shared.id, self.shared.config.replicas.iter().map(|m| m.id));
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
            if self.turn(&guard, floor, tick, &mut next_tick).is_err() {
                return;
            }
        }
    }

    fn turn(
        &mut self,
        guard: &Guard,
        floor: Option<(u64, u64)>,
        tick: Duration,
        next_tick: &mut Instant,
    ) -> Result<(), Stopped> {
        let in_flight =
            self.node.raft.raft_log.last_index().saturating_sub(self.shared.applied.load(Ordering::Acquire));
        let leader = self.node.raft.state == StateRole::Leader;
        // A follower takes proposals only to turn them away.
        let take_proposals = !leader || in_flight < self.shared.config.pipeline as u64;
        enum Got {
            Inbound(Inbound),
            Proposal(Proposal),
            Nothing,
            Closed,
        }
        let got = {
            let mut sel = Select::new();
            let i_in = sel.recv(&self.inbound);
            let i_prop = take_proposals.then(|| sel.recv(&self.proposals));
            let timeout = next_tick.saturating_duration_since(Instant::now());
            match sel.select_timeout(timeout) {
                Ok(op) if op.index() == i_in => op.recv(&self.inbound).map_or(Got::Closed, Got::Inbound),
                Ok(op) if Some(op.index()) == i_prop => op.recv(&self.proposals).map_or(Got::Closed, Got::Proposal),
                Ok(_) => unreachable!("only two operations are selected"),
                Err(_) => Got::Nothing,
            }
        };
        let mut stepped = Stepped::default();
        match got {
            Got::Inbound(m) => self.inbound_msg(guard, floor, m, &mut stepped)?,
            Got::Proposal(p) => self.propose(p)?,
            Got::Nothing => {}
            Got::Closed => return Err(Stopped),
        }
        // Take whatever else is waiting before handling the ready: one
        // ready for a burst of messages.
        for _ in 0..256 {
            match self.inbound.try_recv() {
                Ok(m) => self.inbound_msg(guard, floor, m, &mut stepped)?,
                Err(_) => break,
            }
        }
        if Instant::now() >= *next_tick {
            // A follower that is not ticked never starts an election: below
            // its vote floor, this replica must not campaign. It still
            // answers appends and heartbeats and installs snapshots.
            if floor.is_none() {
                contained(&self.shared, || "ticking".into(), || self.node.tick())?;
            }
            *next_tick += tick;
            if *next_tick < Instant::now() {
                *next_tick = Instant::now() + tick;
            }
        }
        self.on_ready(&stepped)?;
        self.publish();
        Ok(())
    }

    fn inbound_msg(
        &mut self,
        guard: &Guard,
        floor: Option<(u64, u64)>,
        m: Inbound,
        stepped: &mut Stepped,
    ) -> Result<(), Stopped> {
        match m {
            Inbound::Raft(msg) => {
                let (kind, from) = (msg.get_msg_type(), msg.from);
                // The receiver (see `peer`) passes on only messages whose
                // `from` is the peer authenticated on the link.
                let sender = from;
                let what = || format!("checking {kind:?} from replica {from}");
                let verdict = contained(&self.shared, what, || guard.check(&msg, sender, &self.node.raft, floor))?;
                if let Err(why) = verdict {
                    self.shared.stats.peer_refused.fetch_add(1, Ordering::Relaxed);
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
            Inbound::Snapshot { index, term, data } => self.install_own_snapshot(index, term, data),
            Inbound::PeerRepaired { peer } => self.forget_progress(peer)?,
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

    fn propose(&mut self, p: Proposal) -> Result<(), Stopped> {
        if self.node.raft.state == StateRole::Leader {
            let proposed =
                contained(&self.shared, || "proposing".into(), || self.node.propose(Vec::new(), p.data.clone()))?;
            match proposed {
                Ok(()) => return Ok(()),
                Err(e) => warn!("proposal dropped: {e}"),
            }
        }
        // Not the leader (any more): send the clients to the leader; they
        // retry there with the same sequence numbers.
        let leader = self.node.raft.leader_id;
        let addr = self.shared.config.member(leader).map(|m| m.client.to_string()).unwrap_or_default();
        if let Ok(cmds) = decode_entry(&p.data) {
            let mut told = std::collections::HashSet::new();
            for c in cmds {
                if told.insert(c.client) {
                    let msg = ServerMsg::Redirect { leader, addr: addr.clone() };
                    self.shared.router.send(c.client, crate::router::Outgoing::Msg(msg));
                }
            }
        }
        Ok(())
    }

    fn install_own_snapshot(&mut self, index: u64, term: u64, data: Vec<u8>) {
        let mut snap = Snapshot { data: data.into(), ..Default::default() };
        let meta = snap.mut_metadata();
        meta.index = index;
        meta.term = term;
        meta.set_conf_state(self.node.raft.prs().conf().to_conf_state());
        let slack = LOG_SLACK.min(self.shared.config.snapshot_every);
        if let Err(e) = self.store.install(snap, index.saturating_sub(slack)) {
            warn!(index, "cannot compact the log: {e}");
        } else {
            debug!(index, "log compacted behind a snapshot");
        }
    }

    fn on_ready(&mut self, stepped: &Stepped) -> Result<(), Stopped> {
        let mut out = Wire { peers: &self.peers, decisions: &self.decisions };
        let what = || format!("handling a ready after {}", stepped.describe());
        let handle = || {
            fail::fail_point!("protocol-ready");
            handle_ready(&mut self.node, &self.store, &mut out)
        };
        let handled = contained(&self.shared, what, handle)?;
        handled.map_err(|why| {
            self.shared.fail(why);
            Stopped
        })
    }

    fn publish(&self) {
        let raft = &self.node.raft;
        self.shared.leader.store(raft.leader_id, Ordering::Release);
        self.shared.term.store(raft.term, Ordering::Release);
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
}

/// The protocol thread's [`ReadyOut`].
struct Wire<'a> {
    peers: &'a HashMap<u64, PeerSender>,
    decisions: &'a Sender<Decision>,
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
        self.decisions.send(Decision::Snapshot(Box::new(snapshot))).map_err(|_| "the service manager stopped".into())
    }
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
    if *ready.snapshot() != Snapshot::default() {
        let snap = ready.snapshot().clone();
        let index = snap.get_metadata().index;
        // raft has already restored its log from the snapshot: a log that
        // refuses it would leave the two disagreeing.
        store.apply_snapshot(snap.clone()).map_err(|e| format!("cannot install the snapshot at {index}: {e}"))?;
        info!(index, "installing a snapshot from the leader");
        out.restore(snap)?;
    }
    out.deliver(ready.take_committed_entries())?;
    // Nothing that depends on these entries or this vote leaves before
    // they are stored (synced, on disk).
    store.append(ready.entries(), ready.hs()).map_err(|e| format!("cannot persist the log: {e}"))?;
    out.send(node, ready.take_persisted_messages());
    let mut light = node.advance(ready);
    if let Some(commit) = light.commit_index() {
        store.set_commit(commit).map_err(|e| format!("cannot persist the log: {e}"))?;
    }
    out.send(node, light.take_messages());
    out.deliver(light.take_committed_entries())?;
    node.advance_apply();
    Ok(())
}
