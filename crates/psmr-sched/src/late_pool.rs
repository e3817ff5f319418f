//! Late scheduling on a task pool: `late-batch-bitmap-pool` and
//! `late-cbase-pool`.
//!
//! The dependency graph is [`crate::late`]'s, with the same conflict tests
//! and bound, but no worker loops on it. A node that is free when the
//! scheduler thread inserts it becomes a job of a psmr-rt pool, spawned by
//! the scheduler thread (001's single spawner, through the pool's
//! injector). A node freed by a finishing job is spawned by the worker that
//! ran that job, into its own slot or stack (`--pool fifo-slot` or `lifo`):
//! a chain of conflicting commands on one key stays on one core, the
//! locality 001 §4.3.1 argues for, while idle workers steal the rest. Of
//! the nodes one job frees, its worker runs the oldest next, as a worker of
//! `late-batch-bitmap` would.

use crate::exec::{stats_of, Executor};
use crate::late::{nodes, Item, Shared};
use crate::sink::ReplySink;
use crate::sync::{Naps, Patience};
use crate::{check_classes, SchedConfig, SchedError, SchedStats, Scheduler, SchedulerKind};
use crossbeam::utils::CachePadded;
use psmr_model::{Batch, Service};
use psmr_rt::{Handle, Pool, PoolConfig};
use smallvec::SmallVec;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Nodes freed at once: almost always few.
type Freed<O> = SmallVec<[(u32, Arc<Item<O>>); 4]>;

/// What the jobs share: the graph and the pool they run on.
struct Jobs<S: Service> {
    shared: Shared<S>,
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
        let shared = Shared::new(config, Executor::new(service, sink));
        let executed = (0..config.workers).map(|_| CachePadded::new(AtomicU64::new(0))).collect();
        let jobs = Arc::new(Jobs { shared, pool: pool.handle(), executed });
        Ok(Self { kind: config.kind, jobs, pool: Some(pool), classes })
    }

    /// Inserts a node, waiting for room in the graph, and spawns it if it
    /// is free.
    fn insert(&self, item: Item<S::Op>) {
        let shared = &self.jobs.shared;
        if shared.len_hint.load(Ordering::Relaxed) >= shared.graph_max {
            let half = shared.graph_max / 2;
            shared
                .room
                .wait_until(Patience::brief(), Naps::Notified, || shared.len_hint.load(Ordering::Relaxed) <= half);
        }
        let mut g = shared.lock();
        g.insert(item, shared.test);
        let free: Freed<_> = std::iter::from_fn(|| g.take()).collect();
        shared.publish(&g);
        drop(g);
        for (slot, item) in free {
            spawn(&self.jobs, slot, item);
        }
    }
}

/// Spawns the nodes a finished job freed (oldest first, as the graph
/// gives them) from its worker, so that the oldest is the one this worker
/// runs next, as a worker of `late-batch-bitmap` would take it, and the
/// others queue by age for thieves. An older node has had longer to gather
/// dependents, so running it first frees more work sooner. Where the
/// worker runs its newest task first, the oldest is spawned last.
fn spawn_freed<S: Service>(jobs: &Arc<Jobs<S>>, mut free: Freed<S::Op>) {
    if free.len() > 1 && jobs.pool.config().policy.runs_newest_first() {
        free[..].rotate_left(1);
    }
    for (slot, item) in free {
        spawn(jobs, slot, item);
    }
}

/// Runs node `slot` as a job of the pool.
fn spawn<S: Service>(jobs: &Arc<Jobs<S>>, slot: u32, item: Arc<Item<S::Op>>) {
    let j = jobs.clone();
    jobs.pool.spawn_fn(move || run(&j, slot, item));
}

/// Executes a node's commands, removes it, and spawns the nodes that
/// became free from this worker.
fn run<S: Service>(jobs: &Arc<Jobs<S>>, slot: u32, item: Arc<Item<S::Op>>) {
    let shared = &jobs.shared;
    let id = jobs.pool.worker_index().unwrap_or(0);
    let mut executed = 0;
    for cmd in &item.batch.commands()[item.range.start as usize..item.range.end as usize] {
        executed += u64::from(shared.exec.run(id, cmd));
    }
    jobs.executed[id].fetch_add(executed, Ordering::Relaxed);
    drop(item);
    let mut g = shared.lock();
    g.remove(slot);
    let free: Freed<_> = std::iter::from_fn(|| g.take()).collect();
    shared.publish(&g);
    let (len, drained) = (g.len(), g.closed && g.len() == 0);
    drop(g);
    spawn_freed(jobs, free);
    // As in `late`: a scheduler blocked on a full graph goes on once it
    // has drained to half; `finish` waits for it to drain completely.
    if len <= shared.graph_max / 2 {
        shared.room.notify_one();
    }
    if drained {
        shared.room.notify_all();
    }
}

impl<S: Service> Scheduler<S> for LatePool<S> {
    fn kind(&self) -> SchedulerKind {
        self.kind
    }

    fn submit(&mut self, batch: Batch<S::Op>) -> Result<(), SchedError> {
        self.jobs.shared.exec.failure.check()?;
        check_classes(&batch, self.classes)?;
        if batch.is_empty() {
            return Ok(());
        }
        for item in nodes(batch, self.jobs.shared.test) {
            self.insert(item);
        }
        Ok(())
    }

    fn may_conflict(&self, batch: &Batch<S::Op>) -> bool {
        self.jobs.shared.may_conflict(batch)
    }

    fn drained(&self) -> bool {
        self.jobs.shared.is_empty()
    }

    fn finish(mut self: Box<Self>) -> Result<SchedStats, SchedError> {
        let shared = &self.jobs.shared;
        let mut g = shared.lock();
        g.closed = true;
        shared.publish(&g);
        drop(g);
        shared.room.wait_until(Patience::brief(), Naps::Notified, || shared.drained.load(Ordering::Relaxed));
        let pool = self.pool.take().expect("finish runs once");
        let joined = match pool.shutdown() {
            Ok(_) => self.jobs.executed.iter().map(|e| Ok(e.load(Ordering::Relaxed))).collect(),
            Err(e) => {
                tracing::error!("late scheduler pool: {e}");
                vec![Err(0)]
            }
        };
        stats_of(joined, &shared.exec.failure)
    }
}
