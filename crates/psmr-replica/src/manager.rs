//! The ServiceManager (002 §V-D): takes committed log entries in order,
//! consults the reply cache, and hands each entry's new commands as one
//! batch to the execution scheduler chosen in the configuration. Replies
//! come back through [`ManagerSink`] on the workers' threads: into the
//! reply cache, then to the client's connection if it is here.
//!
//! Every `snapshot_every` entries it waits until everything submitted has
//! executed, snapshots the service and the reply cache, and gives the
//! snapshot to the protocol thread, which compacts the log behind it. A
//! snapshot from the leader replaces the state the same way.

use crate::cache::{Admit, ReplyCache};
use crate::membership::{Change, Membership};
use crate::peer::Inbound;
use crate::queue::{Receiver, Sender, Weigh, ITEM_OVERHEAD};
use crate::router::Router;
use crate::snapshot::{Snapshotter, Taken};
use crate::store::{entry_commands, request_commands};
use crate::Shared;
use parking_lot::{Condvar, Mutex};
use psmr_model::wire::OpCodec;
use psmr_model::wire::{Decoder, Encoder, Outcome, WireError};
use psmr_model::App;
use psmr_model::{Batch, ClientId, Digest, BITMAP_BITS_DEFAULT};
use psmr_sched::{Reply, ReplySink, SchedConfig, SchedError, Scheduler, SwitchError, Switchable};
use raft::prelude::{Entry, EntryType, Snapshot};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use tracing::{debug, error, info};

/// What the service manager receives, in order.
pub enum Decision {
    /// Committed entries, in log order.
    Entries(Vec<Entry>),
    /// A snapshot from the leader replaces the state.
    Snapshot(Box<Snapshot>),
    /// Reads the leader serves without the log ([`crate::reads`]): every
    /// entry they must see is applied; they execute after it.
    Reads(Vec<crate::batcher::Request>),
    /// Report the applied index and the state digest once everything
    /// before this request has executed.
    Status(tokio::sync::oneshot::Sender<(u64, Digest)>),
    /// Replace the execution scheduler between two entries (see
    /// [`psmr_sched::Switchable`]); the answer is the stall, or why the
    /// running scheduler stays.
    Reconfigure(SchedConfig, tokio::sync::oneshot::Sender<Result<std::time::Duration, String>>),
}

impl Weigh for Decision {
    /// Committed entries and a snapshot weigh what they carry; reads keep
    /// their bytes in ClientIO's budget until they execute.
    fn weight(&self) -> usize {
        match self {
            Decision::Entries(entries) => entries.iter().map(crate::peer::entry_weight).sum::<usize>() + ITEM_OVERHEAD,
            Decision::Snapshot(snap) => snap.data.len() + ITEM_OVERHEAD,
            Decision::Reads(reads) => reads.len() * ITEM_OVERHEAD + ITEM_OVERHEAD,
            Decision::Status(_) | Decision::Reconfigure(..) => ITEM_OVERHEAD,
        }
    }
}

/// Receives replies from the workers.
pub struct ManagerSink<A: App> {
    codec: A::Codec,
    cache: Arc<ReplyCache>,
    router: Arc<Router>,
    /// Stopped by an execution failure.
    shared: Arc<Shared>,
    /// Execution failed: replies still missing will never come.
    broken: AtomicBool,
    /// Commands whose reply has come back.
    done: AtomicU64,
    /// Somebody waits in [`ManagerSink::wait_for`].
    waiting: AtomicBool,
    lock: Mutex<()>,
    cvar: Condvar,
}

impl<A: App> ManagerSink<A> {
    pub(crate) fn new(cache: Arc<ReplyCache>, shared: Arc<Shared>) -> Self {
        Self {
            codec: A::Codec::default(),
            cache,
            router: shared.router.clone(),
            shared,
            broken: AtomicBool::new(false),
            done: AtomicU64::new(0),
            waiting: AtomicBool::new(false),
            lock: Mutex::new(()),
            cvar: Condvar::new(),
        }
    }

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

impl<A: App> ReplySink<A::Reply> for ManagerSink<A> {
    fn deliver(&self, _worker: usize, reply: Reply<A::Reply>) {
        let (client, seq) = (reply.client.0, reply.seq);
        // Encoded only if kept (a write) or answered here (its client is
        // connected to this replica), and then once.
        let encode = || Outcome::Ok(self.codec.encode_reply(&reply.value));
        let mut kept = None;
        self.cache.fill_with(client, seq, || kept.insert(encode()).clone());
        self.router.reply_with(client, seq, || kept.take().unwrap_or_else(encode));
        self.done.fetch_add(1, Ordering::SeqCst);
        self.wake();
    }

    fn failed(&self, error: &SchedError) {
        self.broken.store(true, Ordering::SeqCst);
        self.wake();
        self.shared.fail(format!("execution failed, the state is no longer trusted: {error}"));
    }
}

/// Which commands of an entry the reply cache must remember: writes, and
/// reads followed by a write of the same client in the entry (executing
/// such a read again on a retry would show it that later write). Other
/// reads execute again when retried.
pub(crate) fn must_remember<O>(commands: &[psmr_model::Command<O>]) -> Vec<bool> {
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

/// The state a snapshot holds: the index and term of its last entry, the
/// membership at that index ([`Membership::encode`]), the service's
/// snapshot and the reply cache's.
pub(crate) fn encode_state(index: u64, term: u64, members: &[u8], service: &[u8], cache: &[u8]) -> Vec<u8> {
    let mut enc = Encoder::new();
    enc.u64(index).u64(term).bytes(members).bytes(service).bytes(cache);
    enc.finish()
}

/// What [`encode_state`] wrote, borrowed from the snapshot.
pub(crate) struct State<'a> {
    /// The index of the last entry the snapshot covers.
    pub(crate) index: u64,
    /// The membership at that index.
    pub(crate) members: &'a [u8],
    /// The service's snapshot.
    pub(crate) service: &'a [u8],
    /// The reply cache's.
    pub(crate) cache: &'a [u8],
}

/// Reads what [`encode_state`] wrote.
pub(crate) fn decode_state(bytes: &[u8]) -> Result<State<'_>, WireError> {
    let mut d = Decoder::new(bytes, "state snapshot");
    let (index, _term) = (d.u64()?, d.u64()?);
    let (members, service, cache) = (d.bytes()?, d.bytes()?, d.bytes()?);
    d.end()?;
    Ok(State { index, members, service, cache })
}

pub(crate) struct Manager<A: App> {
    shared: Arc<Shared>,
    app: Arc<A>,
    codec: A::Codec,
    cache: Arc<ReplyCache>,
    sink: Arc<ManagerSink<A>>,
    scheduler: Box<Switchable<A>>,
    decisions: Receiver<Decision>,
    protocol: Sender<Inbound>,
    /// Where snapshots are encoded and written.
    snapshots: Snapshotter,
    /// Commands handed to the scheduler.
    submitted: u64,
    /// Decisions of an `auto` scheduler seen so far.
    decisions_made: u64,
    applied_term: u64,
    since_snapshot: u64,
    /// The members as of the last applied entry: what a snapshot holds.
    membership: Membership,
}

impl<A: App> Manager<A> {
    pub(crate) fn new(
        shared: Arc<Shared>,
        app: Arc<A>,
        sink: Arc<ManagerSink<A>>,
        scheduler: Box<Switchable<A>>,
        decisions: Receiver<Decision>,
        protocol: Sender<Inbound>,
        snapshots: Snapshotter,
    ) -> Self {
        let (submitted, applied_term, since_snapshot) = (0, 0, 0);
        let cache = sink.cache.clone();
        let _ = shared.metrics.cache.set(cache.clone());
        let codec = A::Codec::default();
        Self {
            shared,
            app,
            codec,
            cache,
            sink,
            scheduler,
            decisions,
            protocol,
            snapshots,
            submitted,
            decisions_made: 0,
            applied_term,
            since_snapshot,
            membership: Membership::default(),
        }
    }

    pub(crate) fn run(mut self) {
        while let Ok(d) = self.decisions.recv() {
            match d {
                Decision::Entries(entries) => {
                    for e in entries {
                        if let Err(why) = self.apply(&e) {
                            self.shared.fail(why);
                            return;
                        }
                    }
                }
                Decision::Snapshot(snap) => {
                    if let Err(why) = self.restore(&snap) {
                        self.shared.fail(why);
                        return;
                    }
                }
                Decision::Reads(reads) => {
                    if let Err(why) = self.read(reads) {
                        self.shared.fail(why);
                        return;
                    }
                }
                Decision::Reconfigure(config, reply) => {
                    if let Err(why) = self.reconfigure(config, reply) {
                        self.shared.fail(why);
                        return;
                    }
                }
                Decision::Status(reply) => {
                    // A failed replica has no state worth reporting: the
                    // request is dropped and ClientIO answers that it stops.
                    if self.sink.wait_for(self.submitted) {
                        let _ = reply.send((self.shared.applied.load(Ordering::Acquire), self.app.digest()));
                    }
                }
            }
        }
        if let Err(e) = self.scheduler.finish() {
            error!("scheduler: {e}");
        }
    }

    fn apply(&mut self, e: &Entry) -> Result<(), String> {
        fail::fail_point!("manager-apply");
        if e.get_entry_type() == EntryType::EntryNormal && !e.data.is_empty() {
            self.execute(e)?;
        } else if e.get_entry_type() != EntryType::EntryNormal {
            self.change_membership(e);
        }
        self.shared.set_applied(e.index, &self.protocol);
        self.applied_term = e.term;
        self.since_snapshot += 1;
        if self.since_snapshot >= self.shared.config.snapshot_every {
            self.since_snapshot = 0;
            self.snapshot(e.index, e.term);
        }
        Ok(())
    }

    /// Switches the scheduler after every command submitted so far has
    /// executed. A scheduler that cannot be built leaves the running one
    /// (the client hears why); one that fails while it drains stops the
    /// replica.
    fn reconfigure(
        &mut self,
        config: SchedConfig,
        reply: tokio::sync::oneshot::Sender<Result<std::time::Duration, String>>,
    ) -> Result<(), String> {
        let (kind, workers) = (config.kind, config.workers);
        match self.scheduler.switch(config) {
            Ok(stall) => {
                self.decisions_made = self.scheduler.decisions_made();
                self.shared.scheduler_changed(self.scheduler.as_ref());
                self.shared.metrics.scheduler_switched(stall);
                info!(scheduler = %kind, workers, ?stall, "execution scheduler switched");
                let _ = reply.send(Ok(stall));
                Ok(())
            }
            Err(e @ SwitchError::Drain(_)) => Err(format!("{e}; the state is no longer trusted")),
            Err(e @ SwitchError::Build(_)) => {
                let _ = reply.send(Err(e.to_string()));
                Ok(())
            }
        }
    }

    /// Follows the protocol thread's membership (which refuses and ignores
    /// exactly the same changes). A new learner gets a snapshot at once:
    /// the leader sends it the newest snapshot that counts it as a member.
    fn change_membership(&mut self, e: &Entry) {
        let Ok(change) = Change::from_entry(e) else { return };
        if self.membership.apply(&change).is_ok() && matches!(change, Change::Add { voter: false, .. }) {
            self.since_snapshot = self.shared.config.snapshot_every;
        }
    }

    fn execute(&mut self, e: &Entry) -> Result<(), String> {
        let commands = match entry_commands(&e.data) {
            Ok(c) => c,
            Err(err) => {
                // Every replica decodes the same bytes the same way, so
                // skipping keeps them equal; it means a bug in a leader.
                error!(index = e.index, "skipping an undecodable log entry: {err}");
                return Ok(());
            }
        };
        let router = &self.shared.router;
        let mut decoded = Vec::with_capacity(commands.len());
        for c in commands {
            match self.app.command(&self.codec, ClientId(c.client), c.seq, c.op) {
                Ok(cmd) => decoded.push(cmd),
                // Not remembered: the same bytes are refused the same way
                // whenever they come back.
                Err(err) => router.reply(c.client, c.seq, Outcome::Rejected(format!("bad operation: {err}"))),
            }
        }
        let remember = must_remember(&decoded);
        let mut batch = Vec::with_capacity(decoded.len());
        for (cmd, remember) in decoded.into_iter().zip(remember) {
            let (client, seq) = (cmd.client.0, cmd.seq);
            match self.cache.admit(client, seq, e.index, remember) {
                Admit::New => batch.push(cmd),
                Admit::Done(outcome) => router.reply(client, seq, outcome),
                Admit::Pending => {}
                Admit::Stale => router.reply(
                    client,
                    seq,
                    Outcome::Rejected(format!(
                        "sequence number {seq} is older than the {} this replica remembers for client {client}",
                        self.shared.config.reply_window
                    )),
                ),
                Admit::Superseded => router.reply(
                    client,
                    seq,
                    Outcome::Rejected(format!(
                        "read {seq} of client {client} came back after later writes of the same client executed, \
                         and reads are not kept: issue it again"
                    )),
                ),
            }
        }
        self.submit(batch)
    }

    /// Executes reads served without the log, as one batch after every
    /// entry applied so far. They are not the log's: the reply cache never
    /// sees them (a retry reads again), and nothing replicated changes.
    fn read(&mut self, reads: Vec<crate::batcher::Request>) -> Result<(), String> {
        let router = &self.shared.router;
        let mut batch = Vec::new();
        for r in &reads {
            let commands = match request_commands(&r.encoded, r.count) {
                Ok(c) => c,
                Err(err) => return Err(format!("a read request ClientIO encoded does not decode: {err}")),
            };
            for c in commands {
                match self.app.command(&self.codec, ClientId(c.client), c.seq, c.op) {
                    Ok(cmd) => batch.push(cmd),
                    Err(err) => router.reply(c.client, c.seq, Outcome::Rejected(format!("bad operation: {err}"))),
                }
            }
        }
        drop(reads);
        self.submit(batch)
    }

    /// Hands `batch` to the scheduler, if it holds anything.
    fn submit(&mut self, batch: Vec<psmr_model::Command<A::Op>>) -> Result<(), String> {
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
                self.shared.metrics.scheduler_decided(d.stall);
            }
            self.decisions_made = made;
            self.shared.scheduler_changed(self.scheduler.as_ref());
        }
        Ok(())
    }

    /// Pauses execution only to let it finish and to copy the state; the
    /// snapshot side pool encodes and writes the copy ([`crate::snapshot`]).
    /// While the last one is still being written, this one is taken a
    /// little later instead.
    fn snapshot(&mut self, index: u64, term: u64) {
        if self.snapshots.busy() {
            debug!(index, "the last snapshot is still being written; this one is postponed");
            self.since_snapshot = self.shared.config.snapshot_every / 2;
            return;
        }
        let start = std::time::Instant::now();
        if !self.sink.wait_for(self.submitted) {
            return;
        }
        let drained = start.elapsed();
        let (service, cache) = (self.app.freeze(), self.cache.freeze());
        let paused = start.elapsed();
        self.shared.metrics.snapshot_pause.observe_duration(paused);
        let (members, conf) = (self.membership.encode(), self.membership.conf_state());
        self.snapshots.finish(Taken { index, term, members, conf, service, cache, start, paused, drained });
    }

    pub(crate) fn restore(&mut self, snap: &Snapshot) -> Result<(), String> {
        if !self.sink.wait_for(self.submitted) {
            return Err("execution failed before a snapshot could be restored".into());
        }
        let bad = |e: &dyn std::fmt::Display| format!("snapshot at index {}: {e}", snap.get_metadata().index);
        let State { index, members, service, cache } = decode_state(&snap.data).map_err(|e| bad(&e))?;
        self.membership = Membership::decode(members).map_err(|e| bad(&e))?;
        self.app.restore(service).map_err(|e| bad(&e))?;
        self.cache.restore(cache).map_err(|e| bad(&e))?;
        self.shared.set_applied(index, &self.protocol);
        self.applied_term = snap.get_metadata().term;
        self.since_snapshot = 0;
        self.shared.metrics.snapshot_restored();
        info!(index, "state restored from a snapshot");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::must_remember;
    use psmr_model::{ClassId, ClientId, Command, KeySet};

    fn cmd(client: u64, seq: u64, write: bool) -> Command<()> {
        let keys: KeySet = [1].into_iter().collect();
        let (reads, writes) = if write { (KeySet::new(), keys) } else { (keys, KeySet::new()) };
        Command { client: ClientId(client), seq, class: ClassId(0), reads, writes, op: () }
    }

    #[test]
    fn reads_before_a_write_of_their_client_are_remembered() {
        let entry = [cmd(1, 1, false), cmd(2, 1, false), cmd(1, 2, true), cmd(1, 3, false), cmd(2, 2, false)];
        assert_eq!(must_remember(&entry), vec![true, false, true, false, false]);
    }
}
