//! One simulated replica: the real raft node, guard, log store and reply
//! cache, with the service manager's work (apply in log order, reply,
//! snapshot and compact) done sequentially on the simulation's thread.

use super::checks::{data_hash, Checks, Trace};
use super::net::{Addr, Answer, Packet, Payload};
use super::service::{RegReply, Registers};
use super::{Bug, FaultCounts, SimError, ViolationKind};
use crate::admin::{next_step, take_step, Goal, Step};
use crate::batcher::Request;
use crate::cache::{Admit, Limits, ReplyCache};
use crate::guard::Guard;
use crate::manager::{decode_state, encode_state, must_remember};
use crate::membership::{self, Change, Committed, Membership};
use crate::protocol::{handle_ready, ReadyOut};
use crate::reads::Reads;
use crate::store::{encode_command, entry_commands, request_commands, EntryBuilder, EntryRef, Log, LogStore};
use psmr_model::wire::{OpCodec, Outcome};
use psmr_model::{App, ClientId, Command, Service};
use raft::prelude::{Entry, EntryType, Message, MessageType, Snapshot};
use raft::{RawNode, ReadState, SnapshotStatus, StateRole, Storage};
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use std::collections::BTreeSet;

/// Readies handled in one turn at most (each `advance` may leave another).
const READIES_PER_TURN: usize = 8;

/// What a node needs from the world while it works.
pub(crate) struct Env<'a> {
    pub now: u64,
    pub rng: &'a mut ChaCha8Rng,
    pub checks: &'a mut Checks,
    pub trace: &'a mut Trace,
    pub counts: &'a mut FaultCounts,
    pub out: &'a mut Vec<Packet>,
    pub bug: Option<Bug>,
    /// Set by a node that wants a turn at this time (its batch is due).
    pub wake: Option<u64>,
}

/// The settings every node of a run shares.
#[derive(Clone, Debug)]
pub(crate) struct NodeSettings {
    /// The founding members: their logs start with the founding entries.
    pub founders: Vec<crate::Member>,
    /// The replica configuration raft's is made from (`crate::raft_config`).
    pub config: crate::Config,
    pub snapshot_every: u64,
    /// Entries kept behind a snapshot when the log is compacted.
    pub log_slack: u64,
    pub cache: Limits,
    /// The batcher's delay: while entries are in flight, requests wait up
    /// to this long for more to share their entry, µs.
    pub batch_delay_us: u64,
    /// Reads take the log too, instead of raft's ReadIndex.
    pub reads_through_log: bool,
}

/// What lives only in memory: lost in a crash.
pub(crate) struct Live {
    pub raw: RawNode<Log>,
    service: Registers,
    cache: ReplyCache,
    codec: <Registers as App>::Codec,
    guard: Guard,
    /// Requests waiting for the next proposal (client, seq, op).
    batch: Vec<(u64, u64, Vec<u8>)>,
    /// When the batch is due even if entries are still in flight.
    batch_due: u64,
    /// Requests that reached this replica: it answers them when it applies
    /// them.
    waiting: BTreeSet<(u64, u64)>,
    pub applied: u64,
    since_snapshot: u64,
    /// Crashing in the middle of a ready: the service manager may still
    /// apply what it was handed, but the protocol thread, gone, installs
    /// no snapshot.
    dying: bool,
    /// Reads served without the log, and requests waiting for them.
    reads: Reads,
    /// Ticks so far: the clock of read rounds.
    ticks: u64,
    /// The members as of the last committed conf change (the protocol
    /// thread's view: whom to hear from, whom to promote).
    pub membership: Membership,
    /// The members as of the last applied entry (the service manager's
    /// view: what a snapshot holds).
    applied_membership: Membership,
}

impl Live {
    /// The guard for this membership.
    fn guard(id: u64, membership: &Membership) -> Guard {
        Guard::new(id).with_removed(membership.removed())
    }

    /// Executes the commands of entry `index` in log order through the
    /// reply cache, as the service manager does, and answers the ones that
    /// reached this replica.
    fn execute(&mut self, id: u64, index: u64, commands: Vec<EntryRef<'_>>, env: &mut Env<'_>) {
        let mut decoded = Vec::with_capacity(commands.len());
        for c in commands {
            match self.service.command(&self.codec, ClientId(c.client), c.seq, c.op) {
                Ok(cmd) => decoded.push(cmd),
                Err(err) => {
                    if self.waiting.remove(&(c.client, c.seq)) {
                        let answer = Answer::Rejected(format!("bad operation: {err}"));
                        reply(env.out, id, c.client, c.seq, answer);
                    }
                }
            }
        }
        let remember = must_remember(&decoded);
        for (cmd, remember) in decoded.into_iter().zip(remember) {
            let (client, seq) = (cmd.client.0, cmd.seq);
            let admit = if env.bug == Some(Bug::NoReplyCache) {
                Admit::New
            } else {
                self.cache.admit(client, seq, index, remember)
            };
            let answer = match admit {
                Admit::New => {
                    let value = self.service.execute(&cmd);
                    let outcome = Outcome::Ok(self.codec.encode_reply(&value));
                    self.cache.fill(client, seq, &outcome);
                    if !cmd.is_read_only() {
                        env.checks.executed(id, client, seq, index);
                    }
                    Some(outcome)
                }
                Admit::Done(outcome) => {
                    env.checks.cache_answers += 1;
                    Some(outcome)
                }
                // Execution is synchronous here: nothing is
                // ever admitted and not yet executed.
                Admit::Pending => None,
                Admit::Stale => Some(Outcome::Rejected(format!("sequence number {seq} is stale"))),
                Admit::Superseded => Some(Outcome::Rejected(format!("read {seq} superseded"))),
            };
            if let Some(outcome) = answer {
                if self.waiting.remove(&(client, seq)) {
                    let answer = match outcome {
                        Outcome::Ok(bytes) => Answer::Ok(bytes),
                        Outcome::Rejected(why) => Answer::Rejected(why),
                    };
                    reply(env.out, id, client, seq, answer);
                }
            }
        }
    }

    /// Puts a request in the next entry; the replica answers it when it
    /// applies it.
    fn enqueue(&mut self, client: u64, seq: u64, op: Vec<u8>, settings: &NodeSettings, env: &mut Env<'_>) {
        self.waiting.insert((client, seq));
        if self.batch.iter().any(|&(c, s, _)| (c, s) == (client, seq)) {
            return;
        }
        if self.batch.is_empty() {
            self.batch_due = env.now + settings.batch_delay_us;
            env.wake = Some(self.batch_due);
        }
        self.batch.push((client, seq, op));
    }
}

/// A replica.
pub(crate) struct Node {
    pub id: u64,
    /// What its disk holds: survives crashes. (The memory log store stands
    /// for the disk: it changes only when a ready has been handled whole,
    /// or when a snapshot is installed; see the module documentation of
    /// [`super`] for the torn crash.)
    pub log: Log,
    pub live: Option<Live>,
    /// Interval between two of its raft ticks, µs (its clock's skew).
    pub tick_us: u64,
    /// Starts so far: tells a crashed incarnation's timers from the
    /// current one's.
    pub incarnation: u64,
    /// Crash in the middle of the next ready.
    pub torn_next: bool,
    /// The highest commit index the disk has synced. The log store writes
    /// commit updates of the light ready (`Log::set_commit`) without a
    /// sync, as the disk store does; the next synced write makes them
    /// durable. A crash takes the store's commit back to this.
    durable_commit: u64,
    /// A founding member (its log starts with the founding entries); the
    /// others join later, with an empty log.
    pub founder: bool,
    /// Removed from the cluster: stopped for good.
    pub removed: bool,
}

/// What a ready may have changed on the disk, seen from outside.
#[derive(Clone, Copy, PartialEq, Eq)]
struct DiskView {
    /// Index and term of the last entry.
    last: (u64, u64),
    term: u64,
    vote: u64,
    commit: u64,
}

impl DiskView {
    fn of(log: &Log) -> Self {
        let hs = log.initial_state().map(|s| s.hard_state).unwrap_or_default();
        let last = log.last_index().unwrap_or(0);
        Self { last: (last, log.term(last).unwrap_or(0)), term: hs.term, vote: hs.vote, commit: hs.commit }
    }
}

/// Collects what `handle_ready` hands out.
#[derive(Default)]
struct SimOut {
    msgs: Vec<Message>,
    applied: Vec<Applied>,
    read_states: Vec<ReadState>,
    /// The node's membership, lent for the ready.
    membership: Membership,
    /// Conf changes applied (or ignored, with why), for the trace.
    changes: Vec<String>,
    /// A snapshot or a change replaced the membership.
    changed: bool,
    /// The node committed its own removal.
    removed: bool,
}

enum Applied {
    Entries(Vec<Entry>),
    Snapshot(Box<Snapshot>),
}

impl ReadyOut for SimOut {
    fn send(&mut self, node: &mut RawNode<Log>, msgs: Vec<Message>) {
        for m in msgs {
            // Handed to the network is sent, as the protocol thread reports
            // a snapshot handed to its peer's sender; lost on the way, the
            // leader finds out by probing.
            if m.get_msg_type() == MessageType::MsgSnapshot {
                node.report_snapshot(m.to, SnapshotStatus::Finish);
            }
            self.msgs.push(m);
        }
    }

    fn deliver(&mut self, entries: Vec<Entry>) -> Result<(), String> {
        if !entries.is_empty() {
            self.applied.push(Applied::Entries(entries));
        }
        Ok(())
    }

    fn restore(&mut self, snapshot: Snapshot) -> Result<(), String> {
        self.membership = snapshot_membership(&snapshot)?;
        self.changed = true;
        self.applied.push(Applied::Snapshot(Box::new(snapshot)));
        Ok(())
    }

    fn read_states(&mut self, states: Vec<ReadState>) {
        self.read_states.extend(states);
    }

    fn conf_change(&mut self, node: &mut RawNode<Log>, e: &Entry) -> Result<(), String> {
        match membership::apply_committed(node, &mut self.membership, e)? {
            Committed::Ignored(why) => self.changes.push(format!("entry {} changes nothing: {why}", e.index)),
            Committed::Changed(change) => {
                self.changes.push(format!("entry {}: {change:?}", e.index));
                self.changed = true;
            }
            Committed::RemovedSelf => {
                self.removed = true;
                return Err("removed".into());
            }
        }
        Ok(())
    }
}

/// The membership a snapshot holds.
fn snapshot_membership(snap: &Snapshot) -> Result<Membership, String> {
    let state = decode_state(&snap.data).map_err(|e| e.to_string())?;
    Membership::decode(state.members).map_err(|e| e.to_string())
}

/// A new disk: a founder's holds the founding entries, a joiner's nothing.
fn fresh_log(founder: bool, settings: &NodeSettings) -> Log {
    let log = Log::Memory(LogStore::new(Vec::new()));
    if founder {
        log.found(&settings.founders).expect("a memory log founds");
    }
    log
}

/// raft-rs draws each randomized election timeout from `thread_rng`:
/// whenever a call into the node has just reset the election clock,
/// replace its draw by one from the run's generator, so that the thread's
/// generator never matters.
fn seeded_timeout(raw: &mut RawNode<Log>, rng: &mut ChaCha8Rng) {
    if raw.raft.election_elapsed == 0 {
        let base = raw.raft.election_timeout();
        raw.raft.set_randomized_election_timeout(rng.gen_range(base..2 * base));
    }
}

fn reply(out: &mut Vec<Packet>, from: u64, client: u64, seq: u64, answer: Answer) {
    out.push(Packet { from: Addr::Replica(from), to: Addr::Client(client), payload: Payload::Reply { seq, answer } });
}

impl Node {
    pub(crate) fn new(id: u64, founder: bool, settings: &NodeSettings, tick_us: u64) -> Self {
        Self {
            id,
            log: fresh_log(founder, settings),
            live: None,
            tick_us,
            incarnation: 0,
            torn_next: false,
            durable_commit: 0,
            founder,
            removed: false,
        }
    }

    pub(crate) fn is_up(&self) -> bool {
        self.live.is_some()
    }

    /// Starts (or restarts) the replica from what its disk holds: the kept
    /// snapshot restores the service and the reply cache, raft replays the
    /// committed entries after it.
    pub(crate) fn start(&mut self, settings: &NodeSettings, env: &mut Env<'_>) -> Result<(), SimError> {
        if env.bug == Some(Bug::ForgetLogOnRestart) && self.incarnation > 0 {
            self.log = fresh_log(self.founder, settings);
        }
        self.incarnation += 1;
        self.torn_next = false;
        self.durable_commit = DiskView::of(&self.log).commit;
        let service = Registers::new();
        let cache = ReplyCache::new(settings.cache);
        let mut applied = 0;
        let mut membership = Membership::default();
        if let Some(snapshot) = self.log.kept() {
            let bad = |why: String| SimError::Snapshot { replica: self.id, why };
            applied = restore(&service, &cache, &snapshot).map_err(bad)?;
            membership = snapshot_membership(&snapshot).map_err(bad)?;
            env.checks.state(self.id, applied, service.digest());
        }
        let config = crate::raft_config(&settings.config, self.id, applied)
            .map_err(|e| SimError::Raft { replica: self.id, why: e.to_string() })?;
        let logger = slog::Logger::root(slog::Discard, slog::o!());
        let mut raw = RawNode::new(&config, self.log.clone(), &logger)
            .map_err(|e| SimError::Raft { replica: self.id, why: e.to_string() })?;
        seeded_timeout(&mut raw, env.rng);
        self.live = Some(Live {
            raw,
            service,
            cache,
            codec: Default::default(),
            guard: Live::guard(self.id, &membership),
            batch: Vec::new(),
            batch_due: 0,
            waiting: BTreeSet::new(),
            applied,
            since_snapshot: 0,
            dying: false,
            reads: Reads::default(),
            ticks: 0,
            applied_membership: membership.clone(),
            membership,
        });
        Ok(())
    }

    /// Crashes the replica: everything in memory is gone, the disk stays.
    /// The disk keeps what was synced: the commit index of the last synced
    /// write, not a later unsynced update.
    pub(crate) fn crash(&mut self) {
        self.live = None;
        self.torn_next = false;
        if let Log::Memory(m) = &self.log {
            let mut core = m.mem.wl();
            if core.hard_state().commit > self.durable_commit {
                core.mut_hard_state().commit = self.durable_commit;
            }
        }
    }

    pub(crate) fn tick(&mut self, settings: &NodeSettings, env: &mut Env<'_>) {
        let Some(live) = &mut self.live else { return };
        live.raw.tick();
        live.ticks += 1;
        seeded_timeout(&mut live.raw, env.rng);
        self.turn(settings, env);
    }

    /// A raft message from a peer: through the guard, as the protocol
    /// thread does (no vote floor: a simulated replica never loses its
    /// disk), then stepped.
    pub(crate) fn receive_raft(&mut self, msg: Message, settings: &NodeSettings, env: &mut Env<'_>) {
        let Some(live) = &mut self.live else { return };
        let sender = msg.from;
        // A removed replica is refused at the handshake of its link,
        // before any raft message (`peer`).
        if live.membership.is_removed(sender) {
            let id = self.id;
            env.trace.event(env.now, &[0x4E3B, id, sender], || format!("r{id} drops a message of removed r{sender}"));
            return;
        }
        if let Err(why) = live.guard.check(&msg, sender, &live.raw.raft, None) {
            let (id, raft) = (self.id, &live.raw.raft);
            let what = || {
                format!(
                    "{:?} from {} (term {}, index {}, log term {}, commit {}, {} entries) in its term {}, \
                     last index {}, commit {}",
                    msg.get_msg_type(),
                    msg.from,
                    msg.term,
                    msg.index,
                    msg.log_term,
                    msg.commit,
                    msg.entries.len(),
                    raft.term,
                    raft.raft_log.last_index(),
                    raft.raft_log.committed
                )
            };
            env.checks.refused(id, &why, what);
            env.trace.event(env.now, &[0xBAD, id, sender], || {
                format!("r{id} guard refused a message from r{sender}: {why}")
            });
            return;
        }
        // raft-rs refuses some messages with an error (e.g. a stale
        // snapshot status); the protocol thread logs and goes on.
        let _ = live.raw.step(msg);
        seeded_timeout(&mut live.raw, env.rng);
        self.turn(settings, env);
    }

    /// A client's request: a leader proposes it with the next entry; any
    /// other replica sends the client to the leader it knows.
    pub(crate) fn receive_request(
        &mut self,
        client: u64,
        seq: u64,
        op: Vec<u8>,
        settings: &NodeSettings,
        env: &mut Env<'_>,
    ) {
        let Some(live) = &mut self.live else { return };
        if live.raw.raft.state != StateRole::Leader {
            reply(env.out, self.id, client, seq, Answer::Redirect(live.raw.raft.leader_id));
            return;
        }
        // As ClientIO marks a read and the protocol thread takes a request
        // (`Protocol::take`).
        let reads_only = live
            .codec
            .decode_op(&op)
            .ok()
            .and_then(|o| live.service.access(&o).ok())
            .is_some_and(|a| a.writes.is_empty());
        let read = reads_only && !settings.reads_through_log && !live.batch.iter().any(|&(c, _, _)| c == client);
        let mut encoded = Vec::new();
        encode_command(&mut encoded, client, seq, &op);
        let mut request = Request::new(client, 1, encoded, op.len(), None);
        request.read = reads_only;
        if live.reads.take(request, read).is_some() {
            live.enqueue(client, seq, op, settings, env);
        }
        self.turn(settings, env);
    }

    /// A turn with nothing new: the batch may be due.
    pub(crate) fn flush(&mut self, settings: &NodeSettings, env: &mut Env<'_>) {
        if self.live.is_some() {
            self.turn(settings, env);
        }
    }

    /// The end of a protocol turn: propose what waits, start a read round,
    /// handle the readies, serve the reads whose index is applied.
    fn turn(&mut self, settings: &NodeSettings, env: &mut Env<'_>) {
        self.propose(env);
        self.start_reads(settings, env);
        self.handle_readies(settings, env);
        self.serve_reads(settings, env);
    }

    fn handle_readies(&mut self, settings: &NodeSettings, env: &mut Env<'_>) {
        for _ in 0..READIES_PER_TURN {
            let Some(live) = &mut self.live else { return };
            if !live.raw.has_ready() {
                return;
            }
            if self.torn_next {
                self.torn_ready(settings, env);
                return;
            }
            let mut out = SimOut { membership: std::mem::take(&mut live.membership), ..SimOut::default() };
            let (before, committed) = (DiskView::of(&self.log), live.raw.raft.raft_log.committed);
            let handled = handle_ready(&mut live.raw, &self.log, &mut out);
            let id = self.id;
            for change in &out.changes {
                env.trace.event(env.now, &[0xC0F, id], || format!("r{id} membership: {change}"));
            }
            if out.removed {
                env.trace.event(env.now, &[0x4E30, id], || format!("r{id} committed its own removal and stops"));
                self.live = None;
                self.removed = true;
                return;
            }
            if let Err(why) = handled {
                env.checks.violation(ViolationKind::Stopped, format!("replica {} stopped: {why}", self.id));
                self.crash();
                return;
            }
            live.membership = out.membership;
            if out.changed {
                live.guard = Live::guard(id, &live.membership);
            }
            // The ready's entries and hard state (its commit is the one raft
            // had before the ready) went in one synced write, if there was
            // anything to write; every earlier write is then durable too.
            let after = DiskView::of(&self.log);
            let wrote = after.last != before.last
                || (after.term, after.vote) != (before.term, before.vote)
                || committed != before.commit;
            if wrote {
                self.durable_commit = self.durable_commit.max(committed.min(after.commit));
            }
            seeded_timeout(&mut live.raw, env.rng);
            for state in &out.read_states {
                live.reads.answered(&state.request_ctx, state.index);
            }
            self.send_raft(out.msgs, env);
            for a in out.applied {
                self.apply(a, settings, env);
            }
        }
    }

    /// Starts a read round as a leader does (`Protocol::start_reads`); a
    /// replica that no longer leads sends its reads' clients away.
    fn start_reads(&mut self, settings: &NodeSettings, env: &mut Env<'_>) {
        let Some(live) = &mut self.live else { return };
        if live.raw.raft.state != StateRole::Leader {
            for r in live.reads.drain() {
                for c in request_commands(&r.encoded, r.count).unwrap_or_default() {
                    reply(env.out, self.id, c.client, c.seq, Answer::Redirect(live.raw.raft.leader_id));
                }
            }
            return;
        }
        let bug = env.bug == Some(Bug::ReadWithoutRound);
        // The injected bug waits for no entry of its own either.
        let last = if bug { 0 } else { live.raw.raft.raft_log.last_index() };
        let (timeout, in_flight) = (settings.config.election_ticks as u64, settings.config.pipeline);
        if let Some(ctx) = live.reads.start(last, live.ticks, timeout, in_flight) {
            if bug {
                // The injected bug: the round answers itself, at once.
                live.reads.answered(&ctx, 0);
                return;
            }
            live.raw.read_index(ctx);
            seeded_timeout(&mut live.raw, env.rng);
        }
    }

    /// Executes the reads whose index is applied and answers them, then
    /// takes back the requests that waited for them (`Protocol::serve_reads`).
    fn serve_reads(&mut self, settings: &NodeSettings, env: &mut Env<'_>) {
        let Some(live) = &mut self.live else { return };
        for r in live.reads.due(live.applied) {
            for c in request_commands(&r.encoded, r.count).unwrap_or_default() {
                let answer = match live.service.command(&live.codec, ClientId(c.client), c.seq, c.op) {
                    Ok(cmd) => Answer::Ok(live.codec.encode_reply(&live.service.execute(&cmd))),
                    Err(err) => Answer::Rejected(format!("bad operation: {err}")),
                };
                env.checks.reads_without_log += 1;
                reply(env.out, self.id, c.client, c.seq, answer);
            }
        }
        while let Some(r) = live.reads.next_released() {
            let Some(c) = request_commands(&r.encoded, r.count).ok().and_then(|c| c.into_iter().next()) else {
                continue;
            };
            let (client, seq, op) = (c.client, c.seq, c.op.to_vec());
            let read = r.read && !settings.reads_through_log && !live.batch.iter().any(|&(b, _, _)| b == client);
            if live.reads.admit(r, read).is_some() {
                live.enqueue(client, seq, op, settings, env);
            }
        }
    }

    fn propose(&mut self, env: &mut Env<'_>) {
        let Some(live) = &mut self.live else { return };
        if live.batch.is_empty() {
            return;
        }
        let leads = live.raw.raft.state == StateRole::Leader;
        // The batcher's rule: at once when nothing is in flight, else when
        // the delay is over (a follower turns the requests away at once).
        let log = &live.raw.raft.raft_log;
        if leads && log.last_index() > log.committed && env.now < live.batch_due {
            return;
        }
        let batch = std::mem::take(&mut live.batch);
        let mut entry = EntryBuilder::new();
        for (client, seq, op) in &batch {
            entry.push(*client, *seq, op);
        }
        let proposed = leads && live.raw.propose(Vec::new(), entry.take()).is_ok();
        seeded_timeout(&mut live.raw, env.rng);
        if !proposed {
            for (client, seq, _) in batch {
                live.waiting.remove(&(client, seq));
                reply(env.out, self.id, client, seq, Answer::Redirect(live.raw.raft.leader_id));
            }
            return;
        }
        let (id, index) = (self.id, live.raw.raft.raft_log.last_index());
        env.trace.event(env.now, &[0x9E0, id, index, batch.len() as u64], || {
            format!("r{id} proposes {} command(s) at index {index}", batch.len())
        });
        if env.bug == Some(Bug::AckBeforeCommit) {
            // The injected bug: answer writes at once, from the state as
            // it is, before the entry is committed (or even stored).
            for (client, seq, op) in batch {
                let Ok(cmd) = live.service.command(&live.codec, ClientId(client), seq, &op) else { continue };
                if cmd.is_read_only() {
                    continue;
                }
                let super::RegOp::Write { key, .. } = cmd.op else { continue };
                let existed = live.service.execute(&Command { op: super::RegOp::Read { key }, ..cmd.clone() })
                    != RegReply::Value(None);
                live.waiting.remove(&(client, seq));
                let bytes = live.codec.encode_reply(&RegReply::Written { existed });
                reply(env.out, self.id, client, seq, Answer::Ok(bytes));
            }
        }
    }

    fn send_raft(&self, msgs: Vec<Message>, env: &mut Env<'_>) {
        for m in msgs {
            env.out.push(Packet {
                from: Addr::Replica(self.id),
                to: Addr::Replica(m.to),
                payload: Payload::Raft(Box::new(m)),
            });
        }
    }

    /// The replica crashes in the middle of handling a ready: the messages
    /// raft lets go before the ready's entries and hard state are stored
    /// (a leader's appends to its followers) may have left, some of them;
    /// the committed entries may have reached the service manager; the
    /// entries and the hard state never reached the disk, and nothing that
    /// depends on them was sent.
    fn torn_ready(&mut self, settings: &NodeSettings, env: &mut Env<'_>) {
        let Some(live) = &mut self.live else { return };
        let mut ready = live.raw.ready();
        let mut msgs = ready.take_messages();
        let sent = env.rng.gen_range(0..=msgs.len());
        msgs.truncate(sent);
        let entries = ready.entries().len();
        let applies = *ready.snapshot() == Snapshot::default() && env.rng.gen_bool(0.5);
        let committed = if applies { ready.take_committed_entries() } else { Vec::new() };
        let id = self.id;
        env.trace.event(env.now, &[0x7E4, id, sent as u64, entries as u64, committed.len() as u64], || {
            format!(
                "r{id} crashes in the middle of a ready: {sent} messages sent, {entries} entries and the hard state \
                 lost, {} committed entries applied",
                committed.len()
            )
        });
        drop(ready);
        live.dying = true;
        self.send_raft(msgs, env);
        if !committed.is_empty() {
            self.apply(Applied::Entries(committed), settings, env);
        }
        env.counts.crashes += 1;
        env.counts.torn_crashes += 1;
        self.crash();
    }

    fn apply(&mut self, applied: Applied, settings: &NodeSettings, env: &mut Env<'_>) {
        match applied {
            Applied::Entries(entries) => {
                for e in entries {
                    self.apply_entry(&e, settings, env);
                }
            }
            Applied::Snapshot(snap) => {
                let Some(live) = &mut self.live else { return };
                match restore(&live.service, &live.cache, &snap) {
                    Ok(index) => {
                        live.applied_membership = snapshot_membership(&snap).unwrap_or_default();
                        live.applied = index;
                        live.since_snapshot = 0;
                        env.checks.state(self.id, index, live.service.digest());
                        let id = self.id;
                        env.trace.event(env.now, &[0x5A9, id, index], || {
                            format!("r{id} restores a snapshot from the leader at index {index}")
                        });
                    }
                    Err(e) => env.checks.violation(
                        ViolationKind::Stopped,
                        format!(
                            "replica {} cannot restore the snapshot at {}: {e}",
                            self.id,
                            snap.get_metadata().index
                        ),
                    ),
                }
            }
        }
    }

    fn apply_entry(&mut self, e: &Entry, settings: &NodeSettings, env: &mut Env<'_>) {
        let Some(live) = &mut self.live else { return };
        let id = self.id;
        if e.index != live.applied + 1 {
            env.checks.violation(
                ViolationKind::Divergence,
                format!("replica {id} applied entry {} right after entry {}", e.index, live.applied),
            );
        }
        env.checks.entry(id, e.index, e.term, data_hash(&e.data));
        if e.get_entry_type() != EntryType::EntryNormal {
            // As the service manager follows the membership, and takes a
            // snapshot at once for a new learner.
            let change = Change::from_entry(e);
            if let Ok(change) = &change {
                let joins = matches!(change, Change::Add { voter: false, .. });
                if live.applied_membership.apply(change).is_ok() && joins {
                    live.since_snapshot = settings.snapshot_every;
                }
            }
        } else if !e.data.is_empty() {
            match entry_commands(&e.data) {
                Ok(commands) => live.execute(id, e.index, commands, env),
                // Every replica skips the same undecodable bytes (see the
                // service manager); an honest leader never proposes them.
                Err(err) => env
                    .checks
                    .violation(ViolationKind::Stopped, format!("replica {id} cannot decode entry {}: {err}", e.index)),
            }
        }
        live.applied = e.index;
        env.checks.state(id, e.index, live.service.digest());
        live.since_snapshot += 1;
        if live.since_snapshot >= settings.snapshot_every {
            live.since_snapshot = 0;
            self.snapshot(e.index, e.term, settings, env);
        }
    }

    /// The service manager's snapshot and the protocol thread's compaction
    /// behind it, in one step (the log store installs it at once: a
    /// snapshot is durable when installed).
    fn snapshot(&mut self, index: u64, term: u64, settings: &NodeSettings, env: &mut Env<'_>) {
        let Some(live) = &mut self.live else { return };
        if live.dying {
            return;
        }
        let members = live.applied_membership.encode();
        let data = encode_state(index, term, &members, &live.service.snapshot(), &live.cache.snapshot());
        let mut snap = Snapshot { data: data.into(), ..Default::default() };
        let meta = snap.mut_metadata();
        meta.index = index;
        meta.term = term;
        meta.set_conf_state(live.applied_membership.conf_state());
        let keep_from = index.saturating_sub(settings.log_slack);
        let id = self.id;
        if let Err(e) = self.log.install(snap, keep_from) {
            env.checks
                .violation(ViolationKind::Stopped, format!("replica {id} cannot compact its log at {index}: {e}"));
        } else {
            // The disk store syncs the commit a snapshot covers before it
            // keeps the snapshot (`DiskStore::install`).
            self.durable_commit = self.durable_commit.max(index);
        }
        env.trace.event(env.now, &[0x5A7, id, index], || format!("r{id} snapshots at index {index}"));
    }

    /// A leader's step towards a membership goal, taken as the protocol
    /// thread takes it (`admin`); `holds` and the term it belongs to as in
    /// `admin::Pending` (a leader of another term starts over, as a client
    /// asks the next leader again). `None` if this replica does not lead.
    pub(crate) fn drive_membership(
        &mut self,
        goal: &Goal,
        (holds, term): &mut (u64, u64),
        settings: &NodeSettings,
        env: &mut Env<'_>,
    ) -> Option<Step> {
        let live = self.live.as_mut().filter(|l| l.raw.raft.state == StateRole::Leader)?;
        if *term != live.raw.raft.term {
            (*holds, *term) = (live.raw.raft.raft_log.last_index(), live.raw.raft.term);
        }
        let step = next_step(&live.raw, &live.membership, goal, *holds);
        if matches!(step, Step::Done | Step::Wait | Step::Refuse(_)) {
            return Some(step);
        }
        // Refused only while another change is pending: the next turn
        // looks again.
        let _ = take_step(&mut live.raw, &step, holds);
        seeded_timeout(&mut live.raw, env.rng);
        self.turn(settings, env);
        Some(step)
    }

    /// The digests a finished run compares: applied index, service state,
    /// reply cache.
    pub(crate) fn digests(&self) -> Option<(u64, psmr_model::Digest, psmr_model::Digest)> {
        let live = self.live.as_ref()?;
        Some((live.applied, live.service.digest(), psmr_model::Digest::of_bytes(&live.cache.snapshot())))
    }
}

/// Restores the service and the reply cache from a snapshot in the service
/// manager's format; the index it was taken at.
fn restore(service: &Registers, cache: &ReplyCache, snap: &Snapshot) -> Result<u64, String> {
    let crate::manager::State { index, service: s, cache: c, .. } =
        decode_state(&snap.data).map_err(|e| e.to_string())?;
    service.restore(s).map_err(|e| e.to_string())?;
    cache.restore(c).map_err(|e| e.to_string())?;
    Ok(index)
}
