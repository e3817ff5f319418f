//! One simulated replica: the replica's own protocol and apply loop
//! (`psmr-core`), with the kv store executed by the `sequential` scheduler,
//! over a simulated disk ([`SimStore`]). This module only does what a
//! replica's threads do around them: turn packets into events, and effects
//! into packets; run the apply loop on what the protocol hands it; write
//! the snapshots it freezes.

use crate::checks::{data_hash, Checks, Trace};
use crate::net::{Addr, Answer, Packet, Payload};
use crate::outcome::{FaultCounts, SimError, ViolationKind};
use crate::store::{SimStore, Tear};
use parking_lot::Mutex;
use psmr_core::apply::{Applier, ApplyEvent, ApplyIo, Replies, Setup};
use psmr_core::bug::Bug;
use psmr_core::guard::Refusal;
use psmr_core::membership::Membership;
use psmr_core::protocol::{Apply, Options, Protocol, ProtocolIo, Stop, View};
use psmr_core::request::Request;
use psmr_core::state::{self, Persisted, Taken};
use psmr_core::transfer::SnapMsg;
use psmr_core::{CacheLimits, Config, Member};
use psmr_model::wire::{MemberChange, OpCodec, Outcome, ServerMsg};
use psmr_model::{App, Service};
use psmr_sched::{SchedConfig, SchedulerKind};
use psmr_services::kv::KvCodec;
use psmr_services::{KvApp, ServiceConfig};
use raft::prelude::{EntryType, Message};
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;

/// Turns taken in a row at one instant at most, while the protocol says
/// one is due at once (the apply loop freed the pipeline or made reads
/// due).
const TURNS_IN_A_ROW: usize = 4;

/// What a node needs from the world while it works.
pub(crate) struct Env<'a> {
    pub now: u64,
    pub rng: &'a mut ChaCha8Rng,
    pub checks: &'a mut Checks,
    pub trace: &'a mut Trace,
    pub counts: &'a mut FaultCounts,
    pub out: &'a mut Vec<Packet>,
    /// Answers to membership changes, by ticket.
    pub answers: &'a mut Vec<(u64, ServerMsg)>,
    pub bug: Option<Bug>,
    /// Set by a node whose protocol has a turn due at this time.
    pub wake: Option<u64>,
}

/// The settings every node of a run shares.
#[derive(Clone, Debug)]
pub(crate) struct NodeSettings {
    /// The replicas' configuration (the founding members, the batching,
    /// the snapshots): what real replicas run, with a few values drawn
    /// per seed.
    pub config: Config,
    /// The reply cache's bounds.
    pub cache: CacheLimits,
}

/// Answers the apply loop hands out, for the node to send to the clients
/// served here.
#[derive(Default)]
struct Collected(Mutex<Vec<(u64, u64, Outcome)>>);

impl Replies for Collected {
    fn answer(&self, client: u64, seq: u64, outcome: &mut dyn FnMut() -> Outcome) {
        self.0.lock().push((client, seq, outcome()));
    }
}

/// What lives only in memory: lost in a crash.
pub(crate) struct Live {
    protocol: Protocol<SimStore>,
    applier: Applier<KvApp>,
    app: Arc<KvApp>,
    replies: Arc<Collected>,
    /// Clients whose requests reached this replica: it answers them, as a
    /// replica answers the clients connected to it.
    clients: BTreeSet<u64>,
    /// Work the protocol handed out and the apply loop has not taken yet.
    work: VecDeque<Apply>,
    /// Requests waiting for room in the entry being filled (the request
    /// queue of a real replica).
    pending: VecDeque<Request>,
    /// Execution failed (the sink's report).
    failed: Arc<Mutex<Option<String>>>,
}

/// A replica.
pub(crate) struct Node {
    pub id: u64,
    /// What its disk holds: survives crashes.
    pub store: SimStore,
    pub live: Option<Live>,
    /// Interval between two of its raft ticks, µs (its clock's skew).
    pub tick_us: u64,
    /// How far its wall clock is off, ms: the leader stamps entries with
    /// it (see [`wall_ms`]).
    pub wall_offset_ms: i64,
    /// Starts so far: tells a crashed incarnation's timers from the
    /// current one's.
    pub incarnation: u64,
    /// A founding member (its log starts with the founding entries); the
    /// others join later, with an empty log.
    pub founder: bool,
    /// Removed from the cluster: stopped for good.
    pub removed: bool,
}

/// When simulated time starts on the wall clock, ms since the Unix epoch
/// (2026-01-01): far enough from 0 that clocks off by seconds stay after
/// the epoch.
const WALL_EPOCH_MS: u64 = 1_767_225_600_000;

/// A replica's wall clock at simulated time `now_us`, `offset_ms` off.
pub(crate) fn wall_ms(now_us: u64, offset_ms: i64) -> u64 {
    (WALL_EPOCH_MS + now_us / 1_000).saturating_add_signed(offset_ms)
}

/// Replica `id`'s addresses: made up (the simulated network routes by id)
/// but distinct, as the membership requires.
pub(crate) fn sim_member(id: u64) -> Member {
    let addr = |base: u64| SocketAddr::from(([127, 0, 0, 1], (base + id) as u16));
    Member::new(id, addr(20_000), addr(30_000))
}

/// The protocol's effects, as the simulated network and clients see them.
struct NodeIo<'a, 'e> {
    id: u64,
    env: &'a mut Env<'e>,
    work: &'a mut VecDeque<Apply>,
    clients: &'a BTreeSet<u64>,
}

impl ProtocolIo for NodeIo<'_, '_> {
    fn send(&mut self, msg: Message) -> bool {
        let to = Addr::Replica(msg.to);
        self.env.out.push(Packet { from: Addr::Replica(self.id), to, payload: Payload::Raft(Box::new(msg)) });
        true
    }

    fn send_snapshot(&mut self, to: u64, msg: SnapMsg) -> bool {
        let (from, to) = (Addr::Replica(self.id), Addr::Replica(to));
        self.env.out.push(Packet { from, to, payload: Payload::Snap(Box::new(msg)) });
        true
    }

    fn transfer_refused(&mut self, peer: u64, why: &str) {
        let id = self.id;
        self.env.checks.transfer_refusals += 1;
        self.env.trace.event(self.env.now, &[0x5AF, id, peer], || format!("r{id} refuses from r{peer}: {why}"));
    }

    fn apply(&mut self, work: Apply) -> bool {
        self.work.push_back(work);
        true
    }

    fn tell(&mut self, client: u64, msg: ServerMsg) {
        if let (ServerMsg::Redirect { leader, .. }, true) = (msg, self.clients.contains(&client)) {
            let payload = Payload::Redirect { leader };
            self.env.out.push(Packet { from: Addr::Replica(self.id), to: Addr::Client(client), payload });
        }
    }

    fn membership(&mut self, membership: &Membership, _peers: &BTreeMap<u64, SocketAddr>) {
        let (id, members) = (self.id, membership.members().map(|m| m.id).collect::<Vec<_>>());
        self.env.trace.event(self.env.now, &[0xC0F, id, members.len() as u64], || format!("r{id} members {members:?}"));
    }

    fn answer(&mut self, ticket: u64, msg: ServerMsg) {
        self.env.answers.push((ticket, msg));
    }

    fn refused(&mut self, msg: &Message, why: &Refusal) {
        let (id, from, kind) = (self.id, msg.from, msg.get_msg_type());
        let what = || format!("{kind:?} from {from} (term {}, index {}, commit {})", msg.term, msg.index, msg.commit);
        self.env.checks.refused(id, why, what);
        self.env
            .trace
            .event(self.env.now, &[0xBAD, id, from], || format!("r{id} guard refused a message from r{from}: {why}"));
    }

    fn proposed(&mut self, commands: u64, _bytes: usize) {
        let (id, now) = (self.id, self.env.now);
        self.env.trace.event(now, &[0x9E0, id, commands], || format!("r{id} proposes {commands} command(s)"));
    }
}

/// The apply loop's effects.
struct ApplierIo<'a, 'e> {
    id: u64,
    /// The index applied before the work at hand.
    applied: u64,
    app: &'a KvApp,
    env: &'a mut Env<'e>,
    taken: &'a mut Vec<Taken>,
}

impl ApplyIo for ApplierIo<'_, '_> {
    fn applied(&mut self, index: u64, _clock: u64) {
        self.env.checks.state(self.id, index, self.app.digest());
    }

    fn snapshot_busy(&self) -> bool {
        false
    }

    fn snapshot(&mut self, taken: Taken) {
        self.taken.push(taken);
    }

    fn event(&mut self, event: ApplyEvent) {
        if let ApplyEvent::CacheHit = event {
            self.env.checks.cache_answers += 1;
        }
    }

    fn admitted(&mut self, index: u64, client: u64, seq: u64, write: bool) {
        if index == 0 {
            // A read without the log executes after every entry applied.
            self.env.checks.reads_without_log += 1;
            self.env.checks.read_without_log(self.id, client, seq, self.applied);
            return;
        }
        if write {
            self.env.checks.executed(self.id, client, seq, index);
        }
        self.env.checks.admitted(self.id, client, seq, index);
    }
}

impl Node {
    pub(crate) fn new(id: u64, founder: bool, tick_us: u64, wall_offset_ms: i64) -> Self {
        let store = SimStore::new(id);
        Self { id, store, live: None, tick_us, wall_offset_ms, incarnation: 0, founder, removed: false }
    }

    pub(crate) fn is_up(&self) -> bool {
        self.live.is_some()
    }

    /// The protocol's view, if the replica runs.
    pub(crate) fn view(&self) -> Option<View> {
        self.live.as_ref().map(|l| l.protocol.view())
    }

    /// The members as its protocol knows them, if it runs.
    pub(crate) fn membership(&self) -> Option<&Membership> {
        self.live.as_ref().map(|l| l.protocol.membership())
    }

    /// The index its apply loop applied, if it runs.
    pub(crate) fn applied(&self) -> Option<u64> {
        self.live.as_ref().map(|l| l.applier.applied())
    }

    /// Starts (or restarts) the replica from what its disk holds: the disk
    /// recovers by its rules (a refused one is repaired, as an operator
    /// would), the kept snapshot restores the apply loop, raft replays the
    /// committed entries after it.
    pub(crate) fn start(&mut self, settings: &NodeSettings, env: &mut Env<'_>) -> Result<(), SimError> {
        self.incarnation += 1;
        self.store.disarm();
        if let Err(why) = self.store.recover() {
            let id = self.id;
            env.trace
                .event(env.now, &[0x4E9A, id], || format!("r{id} refuses its damaged disk ({why}) and is repaired"));
            env.counts.repairs += 1;
            self.store.repair();
        }
        let config = &settings.config;
        if self.founder {
            psmr_core::store::found(&self.store, &config.replicas)
                .map_err(|e| SimError::Raft { replica: self.id, why: e.to_string() })?;
        }
        let app = Arc::new(KvApp::new(&ServiceConfig::default()).map_err(|e| SimError::Config(e.to_string()))?);
        let options = Options::new(env.rng.gen()).quiet().inject(env.bug).checked_by(app.clone());
        let protocol = Protocol::new(config, self.id, self.store.clone(), options)
            .map_err(|e| SimError::Raft { replica: self.id, why: e.to_string() })?;
        let mut live = self.live(settings, env, protocol, app)?;
        env.checks.restarted(self.id);
        let mut io = NodeIo { id: self.id, env, work: &mut live.work, clients: &live.clients };
        live.protocol.start(&mut io);
        self.live = Some(live);
        Ok(())
    }

    /// The apply loop of a starting replica, restored from the kept
    /// snapshot.
    fn live(
        &self,
        settings: &NodeSettings,
        env: &mut Env<'_>,
        protocol: Protocol<SimStore>,
        app: Arc<KvApp>,
    ) -> Result<Live, SimError> {
        let replies = Arc::new(Collected::default());
        let failed = Arc::new(Mutex::new(None));
        let on_failure = {
            let failed = failed.clone();
            Box::new(move |why: String| *failed.lock() = Some(why))
        };
        let setup = Setup {
            app: app.clone(),
            scheduler: SchedConfig::new(SchedulerKind::Sequential, 1),
            cache: settings.cache,
            snapshot_every: settings.config.snapshot_every,
            snapshot_every_bytes: settings.config.snapshot_every_bytes,
            replies: replies.clone(),
            on_failure,
        };
        let bad = |why: String| SimError::Snapshot { replica: self.id, why };
        let mut applier = Applier::new(setup).map_err(|e| bad(e.to_string()))?.inject(env.bug);
        if let Some(snapshot) = psmr_core::store::Store::kept(&self.store) {
            let mut taken = Vec::new();
            let mut io = ApplierIo { id: self.id, applied: 0, app: &app, env, taken: &mut taken };
            let opened = state::open_kept(&self.store, &snapshot).map_err(bad)?;
            applier.restore(opened, &mut io).map_err(bad)?;
        }
        let (work, pending, clients) = (VecDeque::new(), VecDeque::new(), BTreeSet::new());
        Ok(Live { protocol, applier, app, replies, clients, work, pending, failed })
    }

    /// Crashes the replica: everything in memory is gone, the disk keeps
    /// what was synced.
    pub(crate) fn crash(&mut self) {
        self.live = None;
        self.store.crash();
    }

    pub(crate) fn tick(&mut self, settings: &NodeSettings, env: &mut Env<'_>) {
        let Some(live) = &mut self.live else { return };
        let ticked = live.protocol.tick();
        self.after(ticked, settings, env);
    }

    /// A raft message from a peer.
    pub(crate) fn receive_raft(&mut self, msg: Message, settings: &NodeSettings, env: &mut Env<'_>) {
        let Some(live) = &mut self.live else { return };
        let sender = msg.from;
        // A removed replica is refused at the handshake of its link,
        // before any raft message.
        if live.protocol.membership().is_removed(sender) {
            let id = self.id;
            env.trace.event(env.now, &[0x4E3B, id, sender], || format!("r{id} drops a message of removed r{sender}"));
            return;
        }
        let mut io = NodeIo { id: self.id, env, work: &mut live.work, clients: &live.clients };
        let stepped = live.protocol.step(msg, &mut io);
        self.after(stepped, settings, env);
    }

    /// A message of a snapshot transfer from peer `from`.
    pub(crate) fn receive_snap(&mut self, from: u64, msg: SnapMsg, settings: &NodeSettings, env: &mut Env<'_>) {
        let Some(live) = &mut self.live else { return };
        if live.protocol.membership().is_removed(from) {
            return;
        }
        if matches!(msg, SnapMsg::Chunk { .. }) {
            env.checks.snapshot_chunks += 1;
        }
        let (now_ns, sent) = (env.now * 1_000, env.out.len());
        let mut io = NodeIo { id: self.id, env, work: &mut live.work, clients: &live.clients };
        // A snapshot received whole is installed at once: synced writes,
        // which a crash or a full disk may strike.
        if let Err(stop) = live.protocol.snapshot_msg(from, msg, now_ns, &mut io) {
            return self.stopped_in_turn(stop, sent, settings, env);
        }
        self.after(Ok(()), settings, env);
    }

    /// A client's request, checked and encoded as ClientIO does: a replica
    /// that does not lead sends the client to the leader; every command
    /// that only reads makes the request a read.
    pub(crate) fn receive_request(
        &mut self,
        client: u64,
        seq: u64,
        ops: Vec<Vec<u8>>,
        settings: &NodeSettings,
        env: &mut Env<'_>,
    ) {
        let Some(live) = &mut self.live else { return };
        live.clients.insert(client);
        let view = live.protocol.view();
        if !view.is_leader() {
            let payload = Payload::Redirect { leader: view.leader };
            env.out.push(Packet { from: Addr::Replica(self.id), to: Addr::Client(client), payload });
            return;
        }
        let config = &settings.config;
        if psmr_core::request::check(
            client,
            ops.iter().map(Vec::len),
            config.batch_max_commands,
            config.batch_max_bytes,
        )
        .is_err()
        {
            return;
        }
        let reads_only = |op: &[u8]| {
            KvCodec.decode_op(op).ok().and_then(|o| live.app.access(&o).ok()).is_some_and(|a| a.writes.is_empty())
        };
        let read = !config.reads_through_log && ops.iter().all(|op| reads_only(op));
        let (mut encoded, bytes) = (Vec::new(), ops.iter().map(Vec::len).sum());
        for (i, op) in ops.iter().enumerate() {
            psmr_core::entry::encode_command(&mut encoded, client, seq + i as u64, op);
        }
        let mut request = Request::new(client, ops.len() as u32, encoded, bytes, env.now * 1_000);
        request.read = read;
        // A full queue stops the connection's reads: the client waits, and
        // retries elsewhere after its timeout.
        if live.pending.len() < config.queue_depth {
            live.pending.push_back(request);
        }
        self.after(Ok(()), settings, env);
    }

    /// A client's membership change, known by `ticket`.
    pub(crate) fn admin(&mut self, ticket: u64, change: MemberChange, settings: &NodeSettings, env: &mut Env<'_>) {
        let Some(live) = &mut self.live else { return };
        let mut io = NodeIo { id: self.id, env, work: &mut live.work, clients: &live.clients };
        let taken = live.protocol.admin(ticket, change, &mut io);
        self.after(taken, settings, env);
    }

    /// Peer `peer` connected saying it was repaired.
    pub(crate) fn peer_repaired(&mut self, peer: u64, settings: &NodeSettings, env: &mut Env<'_>) {
        let Some(live) = &mut self.live else { return };
        let reset = live.protocol.peer_repaired(peer);
        self.after(reset, settings, env);
    }

    /// A turn with nothing new: the entry or the reads may be due.
    pub(crate) fn flush(&mut self, settings: &NodeSettings, env: &mut Env<'_>) {
        if self.live.is_some() {
            self.after(Ok(()), settings, env);
        }
    }

    /// After an event: the protocol's turn, the apply loop's work, the
    /// snapshots, the answers; again while a turn is due at once.
    fn after(&mut self, event: Result<(), Stop>, settings: &NodeSettings, env: &mut Env<'_>) {
        if let Err(stop) = event {
            return self.stopped(stop, env);
        }
        for _ in 0..TURNS_IN_A_ROW {
            let Some(live) = &mut self.live else { return };
            while live.protocol.has_room() {
                let Some(r) = live.pending.pop_front() else { break };
                live.protocol.request(r);
            }
            let (sent, now_ns) = (env.out.len(), env.now * 1_000);
            live.protocol.set_wall_clock(wall_ms(env.now, self.wall_offset_ms));
            let mut io = NodeIo { id: self.id, env, work: &mut live.work, clients: &live.clients };
            if let Err(stop) = live.protocol.turn(now_ns, &mut io) {
                return self.stopped_in_turn(stop, sent, settings, env);
            }
            if let Err(why) = self.apply_work(env) {
                return self.stopped_in_turn(Stop::Failed(why), env.out.len(), settings, env);
            }
            let Some(live) = &mut self.live else { return };
            match live.protocol.due(env.now * 1_000) {
                Some(at) if at <= env.now * 1_000 => continue,
                Some(at) => env.wake = Some(env.wake.map_or(at / 1_000 + 1, |w| w.min(at / 1_000 + 1))),
                None => {}
            }
            return;
        }
    }

    /// The apply loop takes the work the protocol handed out, in order;
    /// its snapshots are written and kept, its answers sent.
    fn apply_work(&mut self, env: &mut Env<'_>) -> Result<(), String> {
        let Some(live) = &mut self.live else { return Ok(()) };
        while let Some(work) = live.work.pop_front() {
            let (mut taken, applied) = (Vec::new(), live.applier.applied());
            let mut io = ApplierIo { id: self.id, applied, app: &live.app, env, taken: &mut taken };
            match work {
                Apply::Entries(entries) => {
                    for e in &entries {
                        io.env.checks.entry(self.id, e.index, e.term, data_hash(&e.data));
                        io.env.checks.stamp(e.index, psmr_core::entry::entry_stamp(&e.data).time_ms);
                        if e.get_entry_type() != EntryType::EntryNormal {
                            let id = self.id;
                            io.env.trace.event(io.env.now, &[0x5A8, id, e.index], || {
                                format!("r{id} applies a conf change at {}", e.index)
                            });
                        }
                    }
                    live.applier.entries(entries, &mut io)?;
                }
                Apply::Snapshot(snap, file) => {
                    let (id, index) = (self.id, snap.get_metadata().index);
                    io.env.trace.event(io.env.now, &[0x5A9, id, index], || {
                        format!("r{id} restores a snapshot from the leader at index {index}")
                    });
                    io.env.checks.snapshots_installed += 1;
                    live.applier.restore(state::open(&snap, file)?, &mut io)?;
                }
                Apply::Reads(reads, at) => live.applier.reads(reads, at, &mut io)?,
            }
            if let Some(why) = live.failed.lock().take() {
                return Err(why);
            }
            for taken in taken {
                let index = taken.index;
                match state::persist(taken, &self.store) {
                    Ok(Persisted::Kept(snap, _)) => {
                        let id = self.id;
                        env.trace.event(env.now, &[0x5A7, id, index], || format!("r{id} snapshots at index {index}"));
                        live.protocol.snapshot_persisted(snap);
                    }
                    Ok(Persisted::Stale) => {}
                    // A full disk: the log is not compacted, the replica
                    // goes on (as a real one does).
                    Err(_) if self.store.full() => {}
                    Err(why) => return Err(why),
                }
            }
            live.protocol.set_applied(live.applier.applied());
            live.protocol.set_applied_clock(live.applier.applied(), live.applier.clock());
            send_answers(self.id, live, env);
        }
        Ok(())
    }

    /// The protocol stopped outside a turn.
    fn stopped(&mut self, stop: Stop, env: &mut Env<'_>) {
        let id = self.id;
        match stop {
            Stop::Removed(_) => {
                env.trace.event(env.now, &[0x4E30, id], || format!("r{id} committed its own removal and stops"));
                self.live = None;
                self.removed = true;
            }
            Stop::Failed(why) => {
                env.checks.violation(ViolationKind::Stopped, format!("replica {id} stopped: {why}"));
                self.crash();
            }
        }
    }

    /// The protocol stopped in a turn: a torn crash or a full disk, as the
    /// simulated disk caused them, or a failure. A torn crash struck
    /// while the turn's messages were leaving (`sent` of them had left
    /// before the turn): some of the rest may have; the work handed to the
    /// apply loop in the turn may have been taken.
    fn stopped_in_turn(&mut self, stop: Stop, sent: usize, settings: &NodeSettings, env: &mut Env<'_>) {
        let id = self.id;
        if self.store.struck() {
            let keep = env.rng.gen_range(sent..=env.out.len());
            env.out.truncate(keep);
            let applies = env.rng.gen_bool(0.5);
            env.trace.event(env.now, &[0x7E4, id, keep as u64, u64::from(applies)], || {
                format!("r{id} crashes in the middle of a synced write; {} of its messages left", keep - sent)
            });
            if applies {
                let _ = self.apply_work(env);
            }
            env.counts.crashes += 1;
            env.counts.torn_crashes += 1;
            return self.crash();
        }
        if self.store.full() {
            env.trace.event(env.now, &[0xF011, id], || format!("r{id} stops: its disk is full ({stop})"));
            env.counts.full_stops += 1;
            // A process that stops, not a machine that crashes: what it
            // wrote stays.
            self.live = None;
            return;
        }
        let _ = settings;
        self.stopped(stop, env)
    }

    /// The digests a finished run compares: applied index, service state,
    /// reply cache.
    pub(crate) fn digests(&self) -> Option<(u64, psmr_model::Digest, psmr_model::Digest)> {
        let live = self.live.as_ref()?;
        let cache = psmr_model::Digest::of_bytes(&live.applier.cache_snapshot());
        Some((live.applier.applied(), live.app.digest(), cache))
    }

    /// Arms a torn crash: it strikes the node's next synced write.
    pub(crate) fn arm_torn(&self, rng: &mut ChaCha8Rng) {
        self.store.arm(if rng.gen_bool(0.5) { Tear::Landed } else { Tear::Lost });
    }
}

/// Sends the answers the apply loop made to the clients served here.
fn send_answers(id: u64, live: &mut Live, env: &mut Env<'_>) {
    for (client, seq, outcome) in std::mem::take(&mut *live.replies.0.lock()) {
        if !live.clients.contains(&client) {
            continue;
        }
        let answer = match outcome {
            Outcome::Ok(bytes) => Answer::Ok(bytes),
            Outcome::Rejected(why) => Answer::Rejected(why),
        };
        let payload = Payload::Reply { seq, answer };
        env.out.push(Packet { from: Addr::Replica(id), to: Addr::Client(client), payload });
    }
}
