//! The apply loop (002 §V-D): takes committed log entries in order,
//! consults the reply cache, and hands each entry's new commands as one
//! batch to the execution scheduler. Replies come back on the workers'
//! threads through the [`ApplySink`]: into the reply cache, then to the
//! client if it is answered here ([`Replies`]).
//!
//! Every `snapshot_every` entries it waits until everything submitted has
//! executed, freezes the service and the reply cache ([`Taken`]) and hands
//! the copy out to be encoded and persisted off the execution path. A
//! snapshot from the leader replaces the state the same way.
//!
//! Like the protocol, the apply loop owns no thread: a replica's service
//! manager thread drives it with what the protocol hands out, the
//! simulator drives it directly. The execution it starts is the
//! scheduler's (threads of its own, or, for `sequential`, the caller's).

use crate::bug::{Bug, Planted};
use crate::cache::{Admit, Limits, ReplyCache};
use crate::entry::{entry_commands, request_commands};
use crate::membership::{Change, Membership};
use crate::request::Request;
use crate::state::{self, Taken};
use parking_lot::{Condvar, Mutex};
use psmr_model::wire::{OpCodec, Outcome};
use psmr_model::{App, Batch, ClientId, Command, FrozenDigest, Stamp, BITMAP_BITS_DEFAULT};
use psmr_sched::{Reply, ReplySink, SchedConfig, SchedError, Scheduler, SwitchError, Switchable};
use raft::prelude::{Entry, EntryType};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::{debug, error, info};

/// Where the answers to clients go: the connections of the clients this
/// replica serves. Called from the apply loop and from execution workers.
pub trait Replies: Send + Sync + 'static {
    /// Answers command `seq` of `client` if the client is served here;
    /// `outcome` makes the answer (called only then, at most once).
    fn answer(&self, client: u64, seq: u64, outcome: &mut dyn FnMut() -> Outcome);
}

/// What the apply loop tells its driver.
pub trait ApplyIo {
    /// Everything up to `index` is applied (handed to execution, or
    /// restored from a snapshot), and execution's time reached `clock`
    /// (ms; see [`Applier::clock`]): the protocol's floor for the stamps
    /// it proposes ([`crate::protocol::Protocol::set_applied_clock`]).
    fn applied(&mut self, index: u64, clock: u64);
    /// Whether the last snapshot is still being encoded or written: the
    /// next one waits.
    fn snapshot_busy(&self) -> bool;
    /// A frozen state to encode and make durable ([`state::persist`]).
    fn snapshot(&mut self, taken: Taken);
    /// A write (`write`) or read of `client` is admitted to execute at log
    /// `index` (0: a read served without the log). For checks; nothing by
    /// default.
    fn admitted(&mut self, index: u64, client: u64, seq: u64, write: bool) {
        let _ = (index, client, seq, write);
    }
    /// Something worth a metric happened.
    fn event(&mut self, event: ApplyEvent) {
        let _ = event;
    }
}

/// What [`ApplyIo::event`] reports.
#[derive(Clone, Debug)]
pub enum ApplyEvent {
    /// A client switched the scheduler; execution stalled this long.
    Switched(Duration),
    /// `auto` switched the scheduler; execution stalled this long.
    Decided(Duration),
    /// Execution paused this long to freeze a snapshot.
    SnapshotPaused(Duration),
    /// The state was replaced by a snapshot from the leader.
    Restored,
    /// A command the log delivered again was answered from the reply
    /// cache.
    CacheHit,
    /// The running scheduler changed: what runs, `auto`'s last decision.
    Scheduler {
        /// What runs, in words.
        describe: String,
        /// `auto`'s last decision, in words (empty if none).
        decision: String,
        /// Its per-worker metrics, if it keeps them.
        metrics: Option<Arc<psmr_sched::Metrics>>,
    },
}

/// Receives replies from the workers: into the reply cache, then to the
/// client. Tells the apply loop when what it submitted has executed.
pub struct ApplySink<A: App> {
    codec: A::Codec,
    cache: Arc<ReplyCache>,
    replies: Arc<dyn Replies>,
    /// Called once, at once, when execution fails.
    on_failure: Box<dyn Fn(String) + Send + Sync>,
    /// Execution failed: replies still missing will never come.
    broken: AtomicBool,
    /// Commands whose reply has come back.
    done: AtomicU64,
    /// Somebody waits in [`ApplySink::wait_for`].
    waiting: AtomicBool,
    lock: Mutex<()>,
    cvar: Condvar,
}

impl<A: App> ApplySink<A> {
    /// Waits until `submitted` replies have come back; false if execution
    /// failed and they never will.
    fn wait_for(&self, submitted: u64) -> bool {
        let arrived = || self.done.load(Ordering::SeqCst) >= submitted;
        if arrived() {
            return true;
        }
        let mut guard = self.lock.lock();
        self.waiting.store(true, Ordering::SeqCst);
        while !arrived() && !self.broken.load(Ordering::SeqCst) {
            self.cvar.wait(&mut guard);
        }
        self.waiting.store(false, Ordering::SeqCst);
        arrived()
    }

    fn wake(&self) {
        // SeqCst on both sides (with `waiting`): either the waiter sees the
        // change, or this thread sees the waiter and wakes it.
        if self.waiting.load(Ordering::SeqCst) {
            let _guard = self.lock.lock();
            self.cvar.notify_all();
        }
    }
}

impl<A: App> ReplySink<A::Reply> for ApplySink<A> {
    fn deliver(&self, _worker: usize, reply: Reply<A::Reply>) {
        let (client, seq) = (reply.client.0, reply.seq);
        // Encoded only if kept (a write) or answered here (its client is
        // connected to this replica), and then once.
        let encode = || Outcome::Ok(self.codec.encode_reply(&reply.value));
        let mut kept = None;
        self.cache.fill_with(client, seq, || kept.insert(encode()).clone());
        self.replies.answer(client, seq, &mut || kept.take().unwrap_or_else(encode));
        self.done.fetch_add(1, Ordering::SeqCst);
        self.wake();
    }

    fn failed(&self, error: &SchedError) {
        self.broken.store(true, Ordering::SeqCst);
        self.wake();
        (self.on_failure)(format!("execution failed, the state is no longer trusted: {error}"));
    }
}

/// Which commands of an entry the reply cache must remember: writes, and
/// reads followed by a write of the same client in the entry (executing
/// such a read again on a retry would show it that later write). Other
/// reads execute again when retried.
pub fn must_remember<O>(commands: &[Command<O>]) -> Vec<bool> {
    let mut write_follows = std::collections::HashSet::new();
    let mut out: Vec<bool> = commands
        .iter()
        .rev()
        .map(|c| {
            let writes = !c.is_read_only();
            let remember = writes || write_follows.contains(&c.client);
            if writes {
                write_follows.insert(c.client);
            }
            remember
        })
        .collect();
    out.reverse();
    out
}

/// How an [`Applier`] is set up.
pub struct Setup<A: App> {
    /// The service.
    pub app: Arc<A>,
    /// The scheduler to execute with.
    pub scheduler: SchedConfig,
    /// The reply cache's bounds.
    pub cache: Limits,
    /// A snapshot every this many entries...
    pub snapshot_every: u64,
    /// ...or every this many bytes of entries, whichever comes first.
    pub snapshot_every_bytes: u64,
    /// Where the answers to clients go.
    pub replies: Arc<dyn Replies>,
    /// Called once, from the failing thread, when execution fails: the
    /// replica must stop rather than wait for replies that never come.
    pub on_failure: Box<dyn Fn(String) + Send + Sync>,
}

/// The apply loop of one replica. See the module documentation.
pub struct Applier<A: App> {
    app: Arc<A>,
    codec: A::Codec,
    cache: Arc<ReplyCache>,
    sink: Arc<ApplySink<A>>,
    scheduler: Box<Switchable<A>>,
    replies: Arc<dyn Replies>,
    snapshot_every: u64,
    snapshot_every_bytes: u64,
    /// Commands handed to the scheduler.
    submitted: u64,
    /// Decisions of an `auto` scheduler seen so far.
    decisions_made: u64,
    applied: u64,
    since_snapshot: u64,
    /// Bytes of entries applied since the last snapshot.
    since_snapshot_bytes: u64,
    /// The members as of the last applied entry: what a snapshot holds.
    membership: Membership,
    /// The time execution has reached, ms since the Unix epoch: the
    /// largest entry stamp applied so far. An entry stamped earlier (an
    /// entry of a build before stamps, or of a leader whose log missed the
    /// latest stamp) executes at this time instead, so that time never
    /// goes back along the log on any replica.
    clock: u64,
    planted: Planted,
}

/// Read-only counters of the reply cache, for metrics.
#[derive(Clone)]
pub struct CacheStats(Arc<ReplyCache>);

impl CacheStats {
    /// Clients remembered.
    pub fn clients(&self) -> usize {
        self.0.clients()
    }

    /// Sequence numbers remembered, and bytes of outcomes kept.
    pub fn size(&self) -> (usize, usize) {
        self.0.size()
    }
}

impl<A: App> Applier<A> {
    /// An apply loop over `setup`, with nothing applied.
    pub fn new(setup: Setup<A>) -> Result<Self, SchedError> {
        let Setup { app, scheduler, cache, snapshot_every, snapshot_every_bytes, replies, on_failure } = setup;
        let cache = Arc::new(ReplyCache::new(cache));
        let sink = Arc::new(ApplySink {
            codec: A::Codec::default(),
            cache: cache.clone(),
            replies: replies.clone(),
            on_failure,
            broken: AtomicBool::new(false),
            done: AtomicU64::new(0),
            waiting: AtomicBool::new(false),
            lock: Mutex::new(()),
            cvar: Condvar::new(),
        });
        let model = app.class_model();
        let scheduler = Box::new(Switchable::new(scheduler, app.clone(), &model, sink.clone())?);
        Ok(Self {
            app,
            codec: A::Codec::default(),
            cache,
            sink,
            scheduler,
            replies,
            snapshot_every,
            snapshot_every_bytes,
            submitted: 0,
            decisions_made: 0,
            applied: 0,
            since_snapshot: 0,
            since_snapshot_bytes: 0,
            membership: Membership::default(),
            clock: 0,
            planted: Planted::default(),
        })
    }

    /// Plants `bug` (the simulator's testing aid).
    #[cfg(feature = "bugs")]
    pub fn inject(mut self, bug: Option<Bug>) -> Self {
        self.planted = Planted::new(bug);
        self
    }

    /// The scheduler that executes.
    pub fn scheduler(&self) -> &Switchable<A> {
        &self.scheduler
    }

    /// The reply cache's counters.
    pub fn cache_stats(&self) -> CacheStats {
        CacheStats(self.cache.clone())
    }

    /// The last index applied.
    pub fn applied(&self) -> u64 {
        self.applied
    }

    /// The time execution has reached, ms since the Unix epoch (see
    /// [`psmr_model::Stamp`]).
    pub fn clock(&self) -> u64 {
        self.clock
    }

    /// The reply cache's encoding (its digest is part of a replica's state).
    pub fn cache_snapshot(&self) -> Vec<u8> {
        self.cache.snapshot()
    }

    /// Applies committed entries, in log order. An error: the replica must
    /// stop.
    pub fn entries(&mut self, entries: Vec<Entry>, io: &mut impl ApplyIo) -> Result<(), String> {
        for e in &entries {
            if e.get_entry_type() == EntryType::EntryNormal && !e.data.is_empty() {
                self.execute(e, io)?;
            } else if e.get_entry_type() != EntryType::EntryNormal {
                self.change_membership(e);
            }
            self.applied = e.index;
            io.applied(e.index, self.clock);
            self.since_snapshot += 1;
            self.since_snapshot_bytes += e.data.len() as u64;
            if self.since_snapshot >= self.snapshot_every || self.since_snapshot_bytes >= self.snapshot_every_bytes {
                (self.since_snapshot, self.since_snapshot_bytes) = (0, 0);
                self.snapshot(e.index, e.term, io);
            }
        }
        Ok(())
    }

    /// Follows the protocol's membership (which refuses and ignores
    /// exactly the same changes). A new learner gets a snapshot at once:
    /// the leader sends it the newest snapshot that counts it as a member.
    fn change_membership(&mut self, e: &Entry) {
        let Ok(change) = Change::from_entry(e) else { return };
        if self.membership.apply(&change).is_ok() && matches!(change, Change::Add { voter: false, .. }) {
            self.since_snapshot = self.snapshot_every;
        }
    }

    fn execute(&mut self, e: &Entry, io: &mut impl ApplyIo) -> Result<(), String> {
        let (stamp, commands) = match entry_commands(&e.data) {
            Ok(c) => c,
            Err(err) => {
                // Every replica decodes the same bytes the same way, so
                // skipping keeps them equal; it means a bug in a leader.
                error!(index = e.index, "skipping an undecodable log entry: {err}");
                return Ok(());
            }
        };
        self.clock = self.clock.max(stamp.time_ms);
        let stamp = Stamp { time_ms: self.clock, seed: stamp.seed };
        let mut decoded = Vec::with_capacity(commands.len());
        for c in commands {
            match self.app.command(&self.codec, ClientId(c.client), c.seq, c.op) {
                Ok(cmd) => decoded.push(Command { stamp, ..cmd }),
                // Not remembered: the same bytes are refused the same way
                // whenever they come back.
                Err(err) => self.reply(c.client, c.seq, Outcome::Rejected(format!("bad operation: {err}"))),
            }
        }
        let remember = must_remember(&decoded);
        let mut batch = Vec::with_capacity(decoded.len());
        for (cmd, remember) in decoded.into_iter().zip(remember) {
            let (client, seq) = (cmd.client.0, cmd.seq);
            match self.admit(client, seq, e.index, remember) {
                Admit::New => {
                    io.admitted(e.index, client, seq, !cmd.is_read_only());
                    batch.push(cmd);
                }
                Admit::Done(outcome) => {
                    io.event(ApplyEvent::CacheHit);
                    self.reply(client, seq, outcome);
                }
                Admit::Pending => {}
                Admit::Stale => self.reply(client, seq, Outcome::Rejected(self.stale(client, seq))),
                Admit::Superseded => self.reply(client, seq, Outcome::Rejected(superseded(client, seq))),
            }
        }
        self.submit(batch, io)
    }

    fn admit(&self, client: u64, seq: u64, index: u64, remember: bool) -> Admit {
        // Client 0 is the replica itself ([`psmr_model::App::sweep`]): its
        // housekeeping is harmless to execute again and nobody waits for
        // its replies, so the reply cache keeps nothing of it.
        if self.planted.is(Bug::NoReplyCache) || client == 0 {
            return Admit::New;
        }
        self.cache.admit(client, seq, index, remember)
    }

    fn reply(&self, client: u64, seq: u64, outcome: Outcome) {
        let mut outcome = Some(outcome);
        self.replies.answer(client, seq, &mut || outcome.take().unwrap_or_else(|| Outcome::Rejected(String::new())));
    }

    fn stale(&self, client: u64, seq: u64) -> String {
        let window = self.cache.limits().window;
        format!("sequence number {seq} is older than the {window} this replica remembers for client {client}")
    }

    /// Executes reads served without the log, as one batch after every
    /// entry applied so far, at `time_ms` (raised to the clock if behind).
    /// They are not the log's: the reply cache never sees them (a retry
    /// reads again), and nothing replicated changes.
    pub fn reads(&mut self, reads: Vec<Request>, time_ms: u64, io: &mut impl ApplyIo) -> Result<(), String> {
        let stamp = Stamp::at(self.clock.max(time_ms));
        let mut batch = Vec::new();
        for r in &reads {
            let commands = request_commands(&r.encoded, r.count)
                .map_err(|err| format!("a read request that was encoded here does not decode: {err}"))?;
            for c in commands {
                match self.app.command(&self.codec, ClientId(c.client), c.seq, c.op) {
                    Ok(cmd) => {
                        io.admitted(0, c.client, c.seq, !cmd.is_read_only());
                        batch.push(Command { stamp, ..cmd });
                    }
                    Err(err) => self.reply(c.client, c.seq, Outcome::Rejected(format!("bad operation: {err}"))),
                }
            }
        }
        drop(reads);
        self.submit(batch, io)
    }

    /// Hands `batch` to the scheduler, if it holds anything.
    fn submit(&mut self, batch: Vec<Command<A::Op>>, io: &mut impl ApplyIo) -> Result<(), String> {
        if batch.is_empty() {
            return Ok(());
        }
        self.submitted += batch.len() as u64;
        self.scheduler
            .submit(Batch::new(batch, BITMAP_BITS_DEFAULT))
            .map_err(|err| format!("execution failed, the state is no longer trusted: {err}"))?;
        let made = self.scheduler.decisions_made();
        if made != self.decisions_made {
            // `auto` switched: the metrics and the status follow.
            let new = (made - self.decisions_made) as usize;
            for d in self.scheduler.decisions().iter().rev().take(new) {
                io.event(ApplyEvent::Decided(d.stall));
            }
            self.decisions_made = made;
            io.event(self.scheduler_event());
        }
        Ok(())
    }

    /// What runs, and `auto`'s last decision, as an event.
    pub fn scheduler_event(&self) -> ApplyEvent {
        let last = self.scheduler.decisions().pop().map(|d| {
            format!(
                "to {} after window {} (execution stalled {:?}; the old choice held {} commands and gave back {} it \
                 had not begun; {} batches overlapped its last ones): {}",
                d.to, d.window, d.stall, d.held, d.withdrawn, d.overlapped, d.reason
            )
        });
        ApplyEvent::Scheduler {
            describe: self.scheduler.describe(),
            decision: last.unwrap_or_default(),
            metrics: self.scheduler.metrics(),
        }
    }

    /// Pauses execution only to let it finish and to copy the state; the
    /// copy is encoded and written elsewhere. While the last one is still
    /// being written, this one is taken a little later instead.
    fn snapshot(&mut self, index: u64, term: u64, io: &mut impl ApplyIo) {
        if io.snapshot_busy() {
            debug!(index, "the last snapshot is still being written; this one is postponed");
            self.since_snapshot = self.snapshot_every / 2;
            self.since_snapshot_bytes = self.snapshot_every_bytes / 2;
            return;
        }
        let start = Instant::now();
        if !self.sink.wait_for(self.submitted) {
            return;
        }
        let drained = start.elapsed();
        let (service, cache) = (self.app.freeze(), self.cache.freeze());
        let paused = start.elapsed();
        io.event(ApplyEvent::SnapshotPaused(paused));
        let (members, conf) = (self.membership.encode(), self.membership.conf_state());
        let clock = self.clock;
        io.snapshot(Taken { index, term, members, conf, service, cache, clock, paused, drained });
    }

    /// Replaces the state with the snapshot `opened` reads (kept here at a
    /// restart, or from the leader; see [`state::open`]), once everything
    /// submitted has executed. The service reads its stream as it
    /// restores: an error after its header leaves the state partly
    /// replaced, and the replica must stop.
    pub fn restore(&mut self, opened: state::Opened, io: &mut impl ApplyIo) -> Result<(), String> {
        if !self.sink.wait_for(self.submitted) {
            return Err("execution failed before a snapshot could be restored".into());
        }
        let state::Opened { index, members, cache, clock, mut service } = opened;
        let bad = |e: &dyn std::fmt::Display| format!("snapshot at index {index}: {e}");
        let membership = Membership::decode(&members).map_err(|e| bad(&e))?;
        let cache = ReplyCache::decode(&cache).map_err(|e| bad(&e))?;
        self.app.restore_from(&mut service).map_err(|e| bad(&e))?;
        self.cache.install(cache);
        self.membership = membership;
        self.clock = clock;
        self.applied = index;
        io.applied(index, clock);
        self.since_snapshot = 0;
        io.event(ApplyEvent::Restored);
        info!(index, "state restored from a snapshot");
        Ok(())
    }

    /// The applied index and the state's digest (to compute off the
    /// apply loop), once everything before has executed; `None` if
    /// execution failed.
    pub fn status(&self) -> Option<(u64, FrozenDigest)> {
        self.sink.wait_for(self.submitted).then(|| (self.applied, self.app.freeze_digest()))
    }

    /// Switches the scheduler after every command submitted so far has
    /// executed: the stall, or why the running one stays (`Ok(Err)`). An
    /// `Err`: the running one failed while it drained, and the replica
    /// must stop.
    pub fn reconfigure(
        &mut self,
        config: SchedConfig,
        io: &mut impl ApplyIo,
    ) -> Result<Result<Duration, String>, String> {
        let (kind, workers) = (config.kind, config.workers);
        match self.scheduler.switch(config) {
            Ok(stall) => {
                self.decisions_made = self.scheduler.decisions_made();
                io.event(self.scheduler_event());
                io.event(ApplyEvent::Switched(stall));
                info!(scheduler = %kind, workers, ?stall, "execution scheduler switched");
                Ok(Ok(stall))
            }
            Err(e @ SwitchError::Drain(_)) => Err(format!("{e}; the state is no longer trusted")),
            Err(e @ SwitchError::Build(_)) => Ok(Err(e.to_string())),
        }
    }

    /// Waits for the last command and stops the scheduler's threads.
    pub fn finish(self) -> Result<(), SchedError> {
        self.scheduler.finish().map(|_| ())
    }
}

fn superseded(client: u64, seq: u64) -> String {
    format!(
        "read {seq} of client {client} came back after later writes of the same client executed, and reads are not \
         kept: issue it again"
    )
}

#[cfg(test)]
mod tests {
    use super::must_remember;
    use psmr_model::{ClassId, ClientId, Command, KeySet};

    fn cmd(client: u64, seq: u64, write: bool) -> Command<()> {
        let keys: KeySet = [1].into_iter().collect();
        let (reads, writes) = if write { (KeySet::new(), keys) } else { (keys, KeySet::new()) };
        Command { client: ClientId(client), seq, class: ClassId(0), reads, writes, op: (), stamp: Default::default() }
    }

    #[test]
    fn reads_before_a_write_of_their_client_are_remembered() {
        let entry = [cmd(1, 1, false), cmd(2, 1, false), cmd(1, 2, true), cmd(1, 3, false), cmd(2, 2, false)];
        assert_eq!(must_remember(&entry), vec![true, false, true, false, false]);
    }
}
