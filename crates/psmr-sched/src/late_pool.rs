//! Late scheduling on a task pool: `late-batch-bitmap-pool` and
//! `late-cbase-pool`.
//!
//! The nodes, the conflict tests and the bound on the graph are
//! [`crate::late`]'s: a new node waits for every older node it conflicts
//! with that has not finished. What differs is where the graph lives and
//! who runs a free node.
//!
//! * **No graph-wide lock.** The edges live in the nodes ([`crate::dag`]):
//!   a worker that has executed a node finishes it under that node's own
//!   lock and learns which nodes it freed, without waiting for the
//!   scheduler thread, which may be comparing a new node with the whole
//!   graph. The list of nodes a new node is compared with belongs to the
//!   scheduler thread; finished nodes leave it during the next comparison.
//! * **Free nodes are pool jobs.** A node free at insertion is spawned by
//!   the scheduler thread (001's single spawner, through the pool's
//!   injector). A node freed by a finishing job is spawned by the worker
//!   that ran that job, into its own slot or stack (`--pool fifo-slot` or
//!   `lifo`): a chain of conflicting commands on one key stays on one core,
//!   the locality 001 §4.3.1 argues for, while idle workers steal the rest.
//!   Of the nodes one job frees, its worker runs the oldest next, as a
//!   worker of `late-batch-bitmap` takes the oldest free node.

use crate::dag::{DagNode, Freed};
use crate::exec::{stats_of, Executor};
use crate::late::{nodes, ConflictTest, Item, Signature};
use crate::sink::ReplySink;
use crate::sync::{AtomicUsize, Mutex, Naps, Patience, Signal};
use crate::{check_classes, SchedConfig, SchedError, SchedStats, Scheduler, SchedulerKind};
use crossbeam::utils::CachePadded;
use psmr_model::{Batch, Service};
use psmr_rt::{Handle, Pool, PoolConfig};
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

type Node<O> = Arc<DagNode<Item<O>>>;

/// What the jobs share: the graph's bookkeeping and the pool they run on.
struct Jobs<S: Service> {
    exec: Executor<S>,
    test: ConflictTest,
    graph_max: usize,
    /// The nodes a new node is compared with, oldest first, with their
    /// signatures inline; finished ones leave at the next insertion, so it
    /// holds at most `graph_max` nodes. Locked by the scheduler thread and
    /// by [`Scheduler::may_conflict`], never by a job.
    scan: Mutex<Vec<(Signature, Node<S::Op>)>>,
    /// Nodes inserted and not yet finished: the graph's size, which
    /// `graph_max` bounds.
    len: CachePadded<AtomicUsize>,
    /// The scheduler waits here for room in the graph, and `finish` for
    /// the graph to empty. Abandoned when a job panics outside the service
    /// (a bug in psmr): its node never finishes, so nobody waits for the
    /// graph any more.
    room: Signal,
    pool: Handle,
    /// Commands executed by each worker, a cache line each: every job
    /// adds to its worker's.
    executed: Vec<CachePadded<AtomicU64>>,
}

/// The late schedulers on a psmr-rt pool.
pub(crate) struct LatePool<S: Service> {
    kind: SchedulerKind,
    jobs: Arc<Jobs<S>>,
    pool: Option<Pool>,
    classes: usize,
}

impl<S: Service> LatePool<S> {
    pub(crate) fn new(
        config: &SchedConfig,
        service: Arc<S>,
        sink: Arc<dyn ReplySink<S::Reply>>,
        classes: usize,
    ) -> Result<Self, SchedError> {
        let pool_config = PoolConfig { policy: config.pool, ..PoolConfig::new("late", config.workers) };
        let pool = Pool::start(pool_config).map_err(|e| SchedError::Spawn(e.to_string()))?;
        let jobs = Arc::new(Jobs {
            exec: Executor::new(service, sink),
            test: ConflictTest::of(config.kind),
            graph_max: config.graph_max,
            scan: Mutex::new(Vec::with_capacity(config.graph_max)),
            len: CachePadded::new(AtomicUsize::new(0)),
            room: Signal::new(),
            pool: pool.handle(),
            executed: (0..config.workers).map(|_| CachePadded::new(AtomicU64::new(0))).collect(),
        });
        Ok(Self { kind: config.kind, jobs, pool: Some(pool), classes })
    }

    /// Inserts a node, waiting for room in the graph, and spawns it if it
    /// is free. As in `late`, a scheduler blocked on a full graph goes on
    /// once the graph has drained to half, not at every removal.
    fn insert(&self, item: Item<S::Op>) -> Result<(), SchedError> {
        let jobs = &self.jobs;
        if jobs.len.load(Ordering::Acquire) >= jobs.graph_max {
            let half = jobs.graph_max / 2;
            jobs.room.wait_until(Patience::brief(), Naps::Notified, || jobs.len.load(Ordering::Acquire) <= half);
            jobs.exec.failure.check()?;
        }
        let mine = item.signature(jobs.test);
        let node = DagNode::new(item);
        let mut scan = jobs.scan.lock().unwrap_or_else(|e| e.into_inner());
        // One pass compares and forgets finished nodes: a node that has
        // finished, or finishes before the edge is added, needs no edge.
        scan.retain(|(sig, older)| {
            if older.is_finished() {
                return false;
            }
            if !sig.may_conflict(&mine) || !older.payload().conflicts(node.payload(), jobs.test) {
                return true;
            }
            older.precede(&node)
        });
        scan.push((mine, node.clone()));
        jobs.len.fetch_add(1, Ordering::AcqRel);
        drop(scan);
        if node.inserted() {
            spawn(jobs, node);
        }
        Ok(())
    }
}

/// Runs `node` as a job of the pool. A panic in the job is a bug in psmr
/// (the service's own are caught in `Executor::run`) that leaves the node
/// unfinished: as when a worker thread dies, the sink hears of it at once,
/// and the scheduler stops waiting for the graph; the pool then logs it.
fn spawn<S: Service>(jobs: &Arc<Jobs<S>>, node: Node<S::Op>) {
    let j = jobs.clone();
    jobs.pool.spawn_fn(move || {
        if let Err(payload) = catch_unwind(AssertUnwindSafe(|| run(&j, node))) {
            let id = j.pool.worker_index().unwrap_or(0);
            j.exec.worker_died(id, payload.as_ref());
            j.room.abandon();
            resume_unwind(payload);
        }
    });
}

/// Executes a node's commands, finishes it, and spawns the nodes that
/// became free from this worker.
fn run<S: Service>(jobs: &Arc<Jobs<S>>, node: Node<S::Op>) {
    let id = jobs.pool.worker_index().unwrap_or(0);
    let item = node.payload();
    let mut executed = 0;
    for cmd in &item.batch.commands()[item.range.start as usize..item.range.end as usize] {
        executed += u64::from(jobs.exec.run(id, cmd));
    }
    jobs.executed[id].fetch_add(executed, Ordering::Relaxed);
    let free = node.finish();
    drop(node);
    let len = jobs.len.fetch_sub(1, Ordering::AcqRel) - 1;
    spawn_freed(jobs, free);
    if len <= jobs.graph_max / 2 {
        jobs.room.notify_one();
    }
}

/// Spawns the nodes a finished job freed (oldest first, as `finish` gives
/// them) from its worker, so that the oldest is the one this worker runs
/// next, as a worker of `late-batch-bitmap` would take it, and the others
/// queue by age for thieves. An older node has had longer to gather
/// dependents, so running it first frees more work sooner. Where the
/// worker runs its newest task first, the oldest is spawned last.
fn spawn_freed<S: Service>(jobs: &Arc<Jobs<S>>, mut free: Freed<Item<S::Op>>) {
    if free.len() > 1 && jobs.pool.config().policy.runs_newest_first() {
        free[..].rotate_left(1);
    }
    for node in free {
        spawn(jobs, node);
    }
}

impl<S: Service> Scheduler<S> for LatePool<S> {
    fn kind(&self) -> SchedulerKind {
        self.kind
    }

    fn submit(&mut self, batch: Batch<S::Op>) -> Result<(), SchedError> {
        self.jobs.exec.failure.check()?;
        check_classes(&batch, self.classes)?;
        if batch.is_empty() {
            return Ok(());
        }
        for item in nodes(batch, self.jobs.test) {
            self.insert(item)?;
        }
        Ok(())
    }

    /// As `late`'s: a node is finished only once its commands have
    /// executed, so a batch that conflicts with no unfinished node
    /// conflicts with nothing left to execute; and a finished node's
    /// effects are visible once `is_finished` says so.
    fn may_conflict(&self, batch: &Batch<S::Op>) -> bool {
        let all = 0..batch.len() as u32;
        let scan = self.jobs.scan.lock().unwrap_or_else(|e| e.into_inner());
        scan.iter().any(|(_, n)| !n.is_finished() && n.payload().conflicts_with(batch, all.clone(), self.jobs.test))
    }

    /// The last node's commands happen before the caller's next step: the
    /// count is taken to zero after they ran, and read with acquire.
    fn drained(&self) -> bool {
        self.jobs.len.load(Ordering::Acquire) == 0
    }

    fn finish(mut self: Box<Self>) -> Result<SchedStats, SchedError> {
        let jobs = &self.jobs;
        jobs.room.wait_until(Patience::brief(), Naps::Notified, || jobs.len.load(Ordering::Acquire) == 0);
        let pool = self.pool.take().expect("finish runs once");
        let joined = match (pool.shutdown(), jobs.exec.failure.dead_worker()) {
            (Ok(_), None) => jobs.executed.iter().map(|e| Ok(e.load(Ordering::Relaxed))).collect(),
            (outcome, panicked) => {
                if let Err(e) = outcome {
                    tracing::error!("late scheduler pool: {e}");
                }
                vec![Err(panicked.unwrap_or(0))]
            }
        };
        stats_of(joined, &jobs.exec.failure)
    }
}
