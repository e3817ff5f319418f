//! The Protocol thread (002 §V-C2): the only thread that touches the raft
//! node. It steps peers' messages, proposes the Batcher's log entries while
//! fewer than `pipeline` of them are proposed and not yet applied, ticks,
//! and handles each `Ready`: sends messages, stores entries and hard state,
//! and passes committed entries and snapshots to the service manager.

use crate::manager::Decision;
use crate::peer::{Inbound, PeerSender};
use crate::store::{decode_entry, Log};
use crate::Shared;
use crossbeam::channel::{Receiver, Select, Sender};
use psmr_model::wire::ServerMsg;
use raft::prelude::{Entry, Message, MessageType, Snapshot};
use raft::{RawNode, SnapshotStatus, StateRole};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;
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

pub(crate) struct Protocol {
    pub(crate) shared: Arc<Shared>,
    pub(crate) node: RawNode<Log>,
    pub(crate) store: Log,
    pub(crate) peers: HashMap<u64, PeerSender>,
    pub(crate) inbound: Receiver<Inbound>,
    pub(crate) proposals: Receiver<Proposal>,
    pub(crate) decisions: Sender<Decision>,
}

impl Protocol {
    pub(crate) fn run(mut self) {
        let tick = self.shared.config.tick();
        let mut next_tick = Instant::now() + tick;
        while !self.shared.stopping() {
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
            match got {
                Got::Inbound(m) => self.inbound_msg(m),
                Got::Proposal(p) => self.propose(p),
                Got::Nothing => {}
                Got::Closed => return,
            }
            // Take whatever else is waiting before handling the ready: one
            // ready for a burst of messages.
            for _ in 0..256 {
                match self.inbound.try_recv() {
                    Ok(m) => self.inbound_msg(m),
                    Err(_) => break,
                }
            }
            if Instant::now() >= next_tick {
                self.node.tick();
                next_tick += tick;
                if next_tick < Instant::now() {
                    next_tick = Instant::now() + tick;
                }
            }
            self.on_ready();
            self.publish();
        }
    }

    fn inbound_msg(&mut self, m: Inbound) {
        match m {
            Inbound::Raft(msg) => {
                if let Err(e) = self.node.step(*msg) {
                    debug!("raft refused a message: {e}");
                }
            }
            Inbound::Snapshot { index, term, data } => self.install_own_snapshot(index, term, data),
        }
    }

    fn propose(&mut self, p: Proposal) {
        if self.node.raft.state == StateRole::Leader {
            if let Err(e) = self.node.propose(Vec::new(), p.data.clone()) {
                warn!("proposal dropped: {e}");
            } else {
                return;
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

    fn send(&mut self, msgs: Vec<Message>) {
        for msg in msgs {
            let (to, snapshot) = (msg.to, msg.get_msg_type() == MessageType::MsgSnapshot);
            let sent = self.peers.get(&to).is_some_and(|p| p.send(msg));
            if snapshot {
                let status = if sent { SnapshotStatus::Finish } else { SnapshotStatus::Failure };
                self.node.report_snapshot(to, status);
            }
            if !sent {
                self.node.report_unreachable(to);
            }
        }
    }

    fn deliver(&mut self, entries: Vec<Entry>) {
        if !entries.is_empty() && self.decisions.send(Decision::Entries(entries)).is_err() {
            self.shared.fail("the service manager stopped".into());
        }
    }

    fn on_ready(&mut self) {
        if !self.node.has_ready() {
            return;
        }
        let mut ready = self.node.ready();
        self.send(ready.take_messages());
        if *ready.snapshot() != Snapshot::default() {
            let snap = ready.snapshot().clone();
            let index = snap.get_metadata().index;
            match self.store.apply_snapshot(snap.clone()) {
                Ok(()) => {
                    info!(index, "installing a snapshot from the leader");
                    if self.decisions.send(Decision::Snapshot(Box::new(snap))).is_err() {
                        self.shared.fail("the service manager stopped".into());
                    }
                }
                Err(e) => warn!(index, "snapshot refused: {e}"),
            }
        }
        self.deliver(ready.take_committed_entries());
        // Nothing that depends on these entries or this vote leaves before
        // they are stored (synced, on disk).
        if let Err(e) = self.store.append(ready.entries(), ready.hs()) {
            self.shared.fail(format!("cannot persist the log: {e}"));
            return;
        }
        self.send(ready.take_persisted_messages());
        let mut light = self.node.advance(ready);
        if let Some(commit) = light.commit_index() {
            if let Err(e) = self.store.set_commit(commit) {
                self.shared.fail(format!("cannot persist the log: {e}"));
                return;
            }
        }
        self.send(light.take_messages());
        self.deliver(light.take_committed_entries());
        self.node.advance_apply();
    }

    fn publish(&self) {
        let raft = &self.node.raft;
        self.shared.leader.store(raft.leader_id, Ordering::Release);
        self.shared.term.store(raft.term, Ordering::Release);
        self.shared.is_leader.store(raft.state == StateRole::Leader, Ordering::Release);
    }
}
