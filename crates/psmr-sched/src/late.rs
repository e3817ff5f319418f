//! Late scheduling: a dependency graph shared by the scheduler and the
//! workers (CBASE, 003 §3.2; batches and bitmaps, 004 Alg. 1).
//!
//! One implementation serves the three late schedulers. A node is a run of
//! commands of one batch: a single command for `late-cbase` (the graph of
//! commands of CBASE), the whole batch for `late-batch-*` (the abridged
//! graph of 004). What differs is the conflict test between two nodes:
//! commands' key sets, batches' sorted key lists, or batches' bitmaps.
//!
//! The graph is guarded by one lock, as in both papers (004 footnote 1: "our
//! prototype implements mutual exclusion with monitors"). The operations
//! under it are exactly those of 004 Alg. 1:
//!
//! * `insert` (dgInsertBatch): compare the new node with every node in the
//!   graph, taken or not, and add an edge from each conflicting one. Nodes
//!   under execution stay in the graph until they are removed, so a new
//!   node never overtakes a conflicting one that is still running.
//! * `take` (dgGetBatch): the oldest node with no incoming edge that no
//!   worker has taken. Free nodes wait in a min-heap by log position, so
//!   "oldest" costs `O(log n)` instead of a scan.
//! * `remove` (dgRemoveBatch): drop the node and its outgoing edges; nodes
//!   whose last incoming edge disappears become free.
//!
//! The graph holds at most `graph_max` nodes; the scheduler blocks in
//! `insert` while it is full, which bounds memory and slows the log down to
//! the speed of execution. A blocked scheduler goes on when the graph has
//! drained to half its bound, not at every removal (see `worker`).
//!
//! Idle workers and a blocked scheduler wait as every thread of psmr-sched
//! does ([`crate::Patience`], [`crate::Signal`]): briefly watching a
//! lock-free copy of what they wait for, then asleep until notified.

use crate::exec::Executor;
use crate::pool::{Crew, Pool};
use crate::sink::ReplySink;
use crate::sync::{AtomicBool, AtomicUsize, Naps, Patience, Signal};
use crate::{check_classes, SchedConfig, SchedError, SchedStats, Scheduler, SchedulerKind};
use parking_lot::{Mutex, MutexGuard};
use psmr_model::{Batch, Service};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// How two nodes are compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ConflictTest {
    /// Single commands: their read and write sets.
    Command,
    /// Whole batches: sorted key lists (004 `cmmdKeyConflict`).
    Keys,
    /// Whole batches: one-hash bitmaps (004 `bitmapConflict`).
    Bitmap,
}

impl ConflictTest {
    /// The test of the late scheduler `kind` (on threads or on a pool).
    pub(crate) fn of(kind: SchedulerKind) -> Self {
        match kind {
            SchedulerKind::LateCbase | SchedulerKind::LateCbasePool => ConflictTest::Command,
            SchedulerKind::LateBatchKeys => ConflictTest::Keys,
            SchedulerKind::LateBatchBitmap | SchedulerKind::LateBatchBitmapPool => ConflictTest::Bitmap,
            other => unreachable!("{other} is not a late scheduler"),
        }
    }
}

/// A node of the graph: commands `range` of `batch`.
pub(crate) struct Item<O> {
    pub(crate) batch: Arc<Batch<O>>,
    pub(crate) range: Range<u32>,
}

impl<O> Item<O> {
    /// The node's signature. Only `late-batch-bitmap` (on threads or a
    /// pool) folds its keys into signatures: they are a 64-bit one-hash
    /// bitmap, the technique that scheduler is about. `late-cbase` and
    /// `late-batch-keys` compare keys as their papers do, so their
    /// signatures match everything.
    pub(crate) fn signature(&self, test: ConflictTest) -> Signature {
        if test != ConflictTest::Bitmap {
            return Signature { writes: u64::MAX, touches: u64::MAX };
        }
        let summary = self.batch.summary();
        Signature { writes: fold(summary.write_keys().iter()), touches: fold(summary.all_keys().iter()) }
    }

    pub(crate) fn conflicts(&self, other: &Item<O>, test: ConflictTest) -> bool {
        self.conflicts_with(&other.batch, other.range.clone(), test)
    }

    /// Whether this node conflicts with commands `range` of `batch` (the
    /// whole batch, for the batch tests).
    pub(crate) fn conflicts_with(&self, batch: &Batch<O>, range: Range<u32>, test: ConflictTest) -> bool {
        match test {
            ConflictTest::Command => {
                let mine = &self.batch.commands()[self.range.start as usize];
                batch.commands()[range.start as usize..range.end as usize].iter().any(|c| mine.conflicts_with(c))
            }
            ConflictTest::Keys => self.batch.summary().keys_conflict(batch.summary()),
            ConflictTest::Bitmap => self.batch.summary().bitmap_conflict(batch.summary()),
        }
    }
}

struct Node<O> {
    /// Position in delivery order; the heap of free nodes sorts by it.
    pos: u64,
    item: Arc<Item<O>>,
    /// Incoming edges not yet removed.
    waiting_for: u32,
    /// Slots of the nodes that depend on this one (outgoing edges).
    dependents: Vec<u32>,
}

/// A node's written and touched keys folded into 64 bits each (one bit per
/// key, one hash): a first, coarse level of the batch bitmaps, stored
/// inline in the insertion scan's list. If two nodes conflict, one writes a
/// key the other touches, and that key sets the same bit in both
/// signatures: signatures that do not intersect prove independence, so the
/// scan skips the full test (key lists, bitmaps) for them without chasing a
/// pointer. Read-only nodes have `writes == 0` and never reach the full test
/// against each other.
#[derive(Clone, Copy)]
pub(crate) struct Signature {
    writes: u64,
    touches: u64,
}

impl Signature {
    pub(crate) fn may_conflict(&self, other: &Signature) -> bool {
        self.writes & other.touches != 0 || other.writes & self.touches != 0
    }
}

/// A node of the graph as the insertion scan sees it.
#[derive(Clone, Copy)]
struct Live {
    slot: u32,
    sig: Signature,
}

/// The nodes of a non-empty batch: one per command for CBASE, the whole
/// batch for the batch schedulers.
pub(crate) fn nodes<O>(batch: Batch<O>, test: ConflictTest) -> Vec<Item<O>> {
    let n = batch.len() as u32;
    let batch = Arc::new(batch);
    match test {
        ConflictTest::Command => (0..n).map(|i| Item { batch: batch.clone(), range: i..i + 1 }).collect(),
        _ => vec![Item { batch, range: 0..n }],
    }
}

/// The 64-bit signature of a set of keys.
fn fold<'a>(keys: impl Iterator<Item = &'a psmr_model::Key>) -> u64 {
    keys.fold(0, |sig, &k| sig | 1u64 << (psmr_model::KeyBitmap::bit_of(64, k)))
}

struct Graph<O> {
    /// Node storage; `None` slots are on the free list. Slot numbers are
    /// reused, which is safe because a node's dependents are always younger
    /// and cannot be removed before it.
    slots: Vec<Option<Node<O>>>,
    free_slots: Vec<u32>,
    /// The nodes in the graph, in no particular order, with their key
    /// signatures inline so that the insertion scan rarely leaves this
    /// vector.
    live: Vec<Live>,
    /// Free, not yet taken nodes, oldest first.
    ready: BinaryHeap<Reverse<(u64, u32)>>,
    next_pos: u64,
    closed: bool,
}

impl<O> Graph<O> {
    fn new(capacity: usize) -> Self {
        Self {
            slots: Vec::with_capacity(capacity),
            free_slots: Vec::new(),
            live: Vec::with_capacity(capacity),
            ready: BinaryHeap::with_capacity(capacity),
            next_pos: 0,
            closed: false,
        }
    }

    fn len(&self) -> usize {
        self.live.len()
    }

    /// dgInsertBatch. Returns true when the new node is free to run.
    fn insert(&mut self, item: Item<O>, test: ConflictTest) -> bool {
        let slot = match self.free_slots.pop() {
            Some(s) => s,
            None => {
                self.slots.push(None);
                (self.slots.len() - 1) as u32
            }
        };
        let me = Live { slot, sig: item.signature(test) };
        let mut waiting_for = 0;
        for other in &self.live {
            if !other.sig.may_conflict(&me.sig) {
                continue;
            }
            let node = self.slots[other.slot as usize].as_mut().expect("live slot holds a node");
            if node.item.conflicts(&item, test) {
                node.dependents.push(slot);
                waiting_for += 1;
            }
        }
        let pos = self.next_pos;
        self.next_pos += 1;
        self.slots[slot as usize] = Some(Node { pos, item: Arc::new(item), waiting_for, dependents: Vec::new() });
        self.live.push(me);
        if waiting_for == 0 {
            self.ready.push(Reverse((pos, slot)));
        }
        waiting_for == 0
    }

    /// Whether any node in the graph (waiting, free or executing)
    /// conflicts with a command of `batch`.
    fn conflicts_with(&self, batch: &Batch<O>, test: ConflictTest) -> bool {
        let all = 0..batch.len() as u32;
        self.live.iter().any(|l| {
            let node = self.slots[l.slot as usize].as_ref().expect("live slot holds a node");
            node.item.conflicts_with(batch, all.clone(), test)
        })
    }

    /// dgGetBatch: the oldest free node, now taken.
    fn take(&mut self) -> Option<(u32, Arc<Item<O>>)> {
        let Reverse((_, slot)) = self.ready.pop()?;
        let node = self.slots[slot as usize].as_ref().expect("ready slot holds a node");
        Some((slot, node.item.clone()))
    }

    /// dgRemoveBatch. Returns how many nodes became free.
    fn remove(&mut self, slot: u32) -> usize {
        let node = self.slots[slot as usize].take().expect("removed slot holds a node");
        let at = self.live.iter().position(|l| l.slot == slot).expect("removed node is live");
        self.live.swap_remove(at);
        self.free_slots.push(slot);
        let mut freed = 0;
        for d in node.dependents {
            let dep = self.slots[d as usize].as_mut().expect("dependent is live");
            debug_assert!(dep.pos > node.pos, "edges point from older to younger nodes");
            dep.waiting_for -= 1;
            if dep.waiting_for == 0 {
                self.ready.push(Reverse((dep.pos, d)));
                freed += 1;
            }
        }
        freed
    }
}

struct Shared<S: Service> {
    graph: Mutex<Graph<S::Op>>,
    /// Workers wait here for a free node.
    work: Signal,
    /// The scheduler waits here for room in the graph.
    room: Signal,
    graph_max: usize,
    test: ConflictTest,
    /// Copies of the graph's state, written under its lock, read without
    /// it by the threads deciding whether to keep waiting: free nodes,
    /// nodes, and whether the graph is closed and empty for good.
    ready_hint: AtomicUsize,
    len_hint: AtomicUsize,
    drained: AtomicBool,
    exec: Executor<S>,
}

impl<S: Service> Shared<S> {
    /// An empty graph for the late scheduler `config` describes.
    fn new(config: &SchedConfig, exec: Executor<S>) -> Self {
        Self {
            graph: Mutex::new(Graph::new(config.graph_max)),
            work: Signal::new(),
            room: Signal::new(),
            graph_max: config.graph_max,
            test: ConflictTest::of(config.kind),
            ready_hint: AtomicUsize::new(0),
            len_hint: AtomicUsize::new(0),
            drained: AtomicBool::new(false),
            exec,
        }
    }

    /// Refreshes the hints; called under the graph's lock after a change.
    fn publish(&self, g: &Graph<S::Op>) {
        self.ready_hint.store(g.ready.len(), Ordering::Relaxed);
        self.len_hint.store(g.len(), Ordering::Relaxed);
        self.drained.store(g.closed && g.len() == 0, Ordering::Relaxed);
    }

    fn lock(&self) -> MutexGuard<'_, Graph<S::Op>> {
        self.graph.lock()
    }

    /// [`Scheduler::may_conflict`] of a late scheduler: a node leaves the
    /// graph only once its commands have executed, and a scheduler no
    /// longer given batches inserts none, so a batch that conflicts with
    /// no node in the graph conflicts with nothing left to execute.
    fn may_conflict(&self, batch: &Batch<S::Op>) -> bool {
        self.lock().conflicts_with(batch, self.test)
    }

    /// [`Scheduler::drained`] of a late scheduler. Under the lock, as
    /// [`Shared::may_conflict`]: what the last node's commands did happens
    /// before what the caller runs next.
    fn is_empty(&self) -> bool {
        self.lock().len() == 0
    }
}

impl<S: Service> Crew for Shared<S> {
    fn close(&self) {
        let mut g = self.lock();
        g.closed = true;
        self.publish(&g);
        drop(g);
        self.work.notify_all();
    }

    fn abandon(&self) {
        self.work.abandon();
        self.room.abandon();
    }
}

/// The three late schedulers.
pub(crate) struct Late<S: Service> {
    kind: SchedulerKind,
    pool: Pool<Shared<S>>,
    classes: usize,
}

impl<S: Service> Late<S> {
    pub(crate) fn new(
        config: &SchedConfig,
        service: Arc<S>,
        sink: Arc<dyn ReplySink<S::Reply>>,
        classes: usize,
    ) -> Result<Self, SchedError> {
        let exec = Executor::new(service, sink);
        let shared = Arc::new(Shared::new(config, exec.clone()));
        let pool = Pool::start(&exec, "late", config.workers, shared, worker)?;
        Ok(Self { kind: config.kind, pool, classes })
    }

    /// Inserts `item`, waiting for room in the graph; an error if a
    /// worker died meanwhile (the graph then never drains).
    fn insert(&self, item: Item<S::Op>) -> Result<(), SchedError> {
        let shared = self.pool.crew();
        let mut g = shared.lock();
        if g.len() >= shared.graph_max {
            drop(g);
            let half = shared.graph_max / 2;
            shared
                .room
                .wait_until(Patience::brief(), Naps::Notified, || shared.len_hint.load(Ordering::Relaxed) <= half);
            shared.exec.failure.check()?;
            g = shared.lock();
        }
        let free = g.insert(item, shared.test);
        shared.publish(&g);
        drop(g);
        if free {
            shared.work.notify_one();
        }
        Ok(())
    }
}

fn worker<S: Service>(id: usize, shared: &Shared<S>) -> u64 {
    let mut executed = 0u64;
    let mut g = shared.lock();
    loop {
        let Some((slot, item)) = g.take() else {
            // A worker that died holds its node for ever: nothing that
            // depends on it will be free.
            if (g.closed && g.len() == 0) || shared.exec.failure.dead_worker().is_some() {
                return executed;
            }
            // When commands are light the next node is usually
            // microseconds away, and a sleep and a wake-up per node would
            // cost more than executing it: watch the hints first. They are
            // only hints; `take` under the lock decides.
            drop(g);
            shared.work.wait_until(Patience::brief(), Naps::Notified, || {
                shared.ready_hint.load(Ordering::Relaxed) > 0 || shared.drained.load(Ordering::Relaxed)
            });
            g = shared.lock();
            continue;
        };
        shared.publish(&g);
        drop(g);
        for cmd in &item.batch.commands()[item.range.start as usize..item.range.end as usize] {
            if shared.exec.run(id, cmd) {
                executed += 1;
            }
        }
        drop(item);
        g = shared.lock();
        let freed = g.remove(slot);
        shared.publish(&g);
        // One freed node per waiting worker; this worker loops and takes
        // one itself, so wake the others only for the rest.
        for _ in 1..freed {
            shared.work.notify_one();
        }
        // A scheduler blocked on a full graph goes on once the graph has
        // drained to half: it then inserts many nodes in one go instead of
        // being woken (a context switch on each side) for every removal.
        if g.len() <= shared.graph_max / 2 {
            shared.room.notify_one();
        }
        if g.closed && g.len() == 0 {
            // Everyone else may be waiting for work that will never come.
            shared.work.notify_all();
        }
    }
}

impl<S: Service> Scheduler<S> for Late<S> {
    fn kind(&self) -> SchedulerKind {
        self.kind
    }

    fn submit(&mut self, batch: Batch<S::Op>) -> Result<(), SchedError> {
        self.pool.crew().exec.failure.check()?;
        check_classes(&batch, self.classes)?;
        if batch.is_empty() {
            return Ok(());
        }
        for item in nodes(batch, self.pool.crew().test) {
            self.insert(item)?;
        }
        Ok(())
    }

    fn may_conflict(&self, batch: &Batch<S::Op>) -> bool {
        self.pool.crew().may_conflict(batch)
    }

    fn drained(&self) -> bool {
        self.pool.crew().is_empty()
    }

    fn finish(mut self: Box<Self>) -> Result<SchedStats, SchedError> {
        let exec = self.pool.crew().exec.clone();
        self.pool.finish(&exec)
    }
}
