//! Early scheduling (003 Alg. 1-2): classes are mapped to worker threads
//! before execution, so scheduling a command is a table lookup.
//!
//! The scheduler (the thread calling `submit`) looks up each command's
//! class in the mapping: a command of a concurrent class goes to one of the
//! class's threads, round-robin; a command of a sequential class goes to
//! every thread of the class. Each worker takes commands from its own FIFO
//! queue. For a sequential command the class's threads meet at the class
//! barrier; the lowest-numbered thread executes while the others wait at a
//! second barrier. Because every queue is in log order and conflicting
//! classes share threads (rules R.1-R.5), conflicting commands execute in
//! log order (003 Appendix A).
//!
//! `early-busywait` (000 Alg. 4-5) replaces each class barrier by a pair of
//! atomic counters used in alternating cycles ([`crate::CycleCounters`]):
//! the last thread to arrive executes, the others wait for its reset,
//! spinning for `spin` rounds, then yielding, then napping, so that a
//! machine with fewer cores than workers still makes progress.
//!
//! Commands travel per batch: for each batch the scheduler computes one
//! 64-bit target mask per command and sends the batch, with its masks, once
//! to each worker that has something in it. A worker walks the batch and
//! executes the commands whose mask has its bit. This is the "fifoGet
//! returns a batch" of 000 §5.3 and makes one queue operation per batch and
//! worker instead of one per command.

use crate::barrier::Barrier;
use crate::cycles::{CycleCounters, Role};
use crate::exec::{stats_of, Executor};
use crate::metrics::{Metrics, WorkerCounters};
use crate::sink::ReplySink;
use crate::sync::{backoff_until, wait_until};
use crate::{check_classes, SchedConfig, SchedError, SchedStats, Scheduler, SchedulerKind};
use crossbeam::channel::{unbounded, Receiver, Sender};
use crossbeam::utils::CachePadded;
use parking_lot::{Condvar, Mutex};
use psmr_model::{Batch, Mapping, Mode, Service};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

/// One batch as sent to the workers, with each command's target threads.
pub(crate) struct Dispatch<O> {
    pub(crate) batch: Batch<O>,
    /// Per command, the workers it goes to (bit `t` for worker `t`).
    pub(crate) targets: Vec<u64>,
}

/// What a worker needs to know about a class.
enum ClassPlan {
    /// Concurrent class, or sequential class on one thread: just execute.
    Alone,
    /// `early`: the class barrier; `executor` (the lowest thread) executes.
    Barrier { barrier: Barrier, executor: usize },
    /// `early-busywait`: two-cycle counters; the last to arrive executes.
    Cycles(Box<CycleCounters>),
}

/// Bounds each worker's queue, with hysteresis.
///
/// A worker's queue holds at most `depth` dispatched batches. When it is
/// full the scheduler waits until the worker has drained it to half, and
/// the worker wakes it only on that crossing. A plain bounded channel would
/// wake the scheduler at every batch the worker takes, a context switch on
/// each side per batch, which on a machine with few cores costs more than
/// scheduling the batch.
pub(crate) struct Credits {
    /// Batches sent to each worker and not yet finished by it.
    pending: Vec<CachePadded<AtomicUsize>>,
    depth: usize,
    lock: Mutex<()>,
    room: Condvar,
}

impl Credits {
    pub(crate) fn new(workers: usize, depth: usize) -> Self {
        Self {
            pending: (0..workers).map(|_| CachePadded::new(AtomicUsize::new(0))).collect(),
            depth,
            lock: Mutex::new(()),
            room: Condvar::new(),
        }
    }

    fn low(&self) -> usize {
        self.depth / 2
    }

    /// Scheduler side: waits for room in worker `w`'s queue, takes a slot.
    pub(crate) fn acquire(&self, w: usize) {
        let pending = &self.pending[w];
        if pending.load(Ordering::Acquire) >= self.depth
            && !backoff_until(|| pending.load(Ordering::Acquire) <= self.low())
        {
            let mut guard = self.lock.lock();
            while pending.load(Ordering::Acquire) > self.low() {
                self.room.wait(&mut guard);
            }
        }
        pending.fetch_add(1, Ordering::AcqRel);
    }

    /// Worker side: one batch of worker `w` is done.
    pub(crate) fn release(&self, w: usize) {
        if self.pending[w].fetch_sub(1, Ordering::AcqRel) - 1 == self.low() {
            // Taking the lock orders this wake-up after a scheduler's check
            // of the counter, so the wake-up cannot be lost.
            let _guard = self.lock.lock();
            self.room.notify_one();
        }
    }
}

pub(crate) struct Early<S: Service> {
    kind: SchedulerKind,
    metrics: Arc<Metrics>,
    exec: Executor<S>,
    credits: Arc<Credits>,
    senders: Vec<Sender<Arc<Dispatch<S::Op>>>>,
    workers: Vec<JoinHandle<u64>>,
    /// Per class: its mode and thread list, for dispatch.
    routes: Vec<Route>,
}

pub(crate) struct Route {
    sequential: bool,
    threads: Vec<usize>,
    mask: u64,
    /// Round-robin cursor into `threads` (003 Alg. 1, `next`).
    next: usize,
}

/// The dispatch table of a mapping: one route per class.
pub(crate) fn routes_of(mapping: &Mapping) -> Vec<Route> {
    mapping
        .classes()
        .iter()
        .map(|c| Route {
            sequential: c.mode == Mode::Sequential,
            threads: c.threads.clone(),
            mask: c.thread_mask(),
            next: 0,
        })
        .collect()
}

/// 003 Alg. 1 for one batch: each command of a sequential class goes to
/// every thread of its class, each command of a concurrent class to the
/// next thread of its class, round-robin. Returns the dispatch and the
/// union of its targets.
pub(crate) fn dispatch<O>(routes: &mut [Route], batch: Batch<O>) -> (Arc<Dispatch<O>>, u64) {
    let mut targets = Vec::with_capacity(batch.len());
    let mut any = 0u64;
    for cmd in batch.commands() {
        let route = &mut routes[cmd.class.index()];
        let mask = if route.sequential {
            route.mask
        } else {
            let t = route.threads[route.next];
            route.next = if route.next + 1 == route.threads.len() { 0 } else { route.next + 1 };
            1u64 << t
        };
        targets.push(mask);
        any |= mask;
    }
    (Arc::new(Dispatch { batch, targets }), any)
}

impl<S: Service> Early<S> {
    pub(crate) fn new(
        config: &SchedConfig,
        mapping: Mapping,
        service: Arc<S>,
        sink: Arc<dyn ReplySink<S::Reply>>,
    ) -> Result<Self, SchedError> {
        let busy_wait = config.kind == SchedulerKind::EarlyBusyWait;
        let spin = config.spin_budget();
        let plans: Arc<Vec<ClassPlan>> = Arc::new(
            mapping
                .classes()
                .iter()
                .map(|c| match (c.mode, c.threads.len()) {
                    (Mode::Concurrent, _) | (_, 1) => ClassPlan::Alone,
                    (Mode::Sequential, n) if busy_wait => ClassPlan::Cycles(Box::new(CycleCounters::new(n))),
                    (Mode::Sequential, n) => ClassPlan::Barrier { barrier: Barrier::new(n), executor: c.threads[0] },
                })
                .collect(),
        );
        let routes = routes_of(&mapping);
        let credits = Arc::new(Credits::new(config.workers, config.queue_depth));
        let mut early = Self {
            kind: config.kind,
            metrics: Arc::new(Metrics::new(config.workers)),
            exec: Executor::new(service, sink),
            credits,
            senders: Vec::new(),
            workers: Vec::new(),
            routes,
        };
        for id in 0..config.workers {
            // Unbounded channel, bounded by `Credits`.
            let (tx, rx) = unbounded();
            let (exec, plans, credits) = (early.exec.clone(), plans.clone(), early.credits.clone());
            let (metrics, timing) = (early.metrics.clone(), config.metrics);
            match early.exec.spawn_worker(format!("psmr-early-{id}"), id, move || {
                let env = WorkerEnv {
                    id,
                    plans: &plans,
                    exec: &exec,
                    credits: &credits,
                    spin,
                    counters: metrics.worker(id),
                    timing,
                };
                worker(&rx, &env);
                metrics.worker(id).executed.load(Ordering::Relaxed)
            }) {
                Ok(h) => {
                    early.senders.push(tx);
                    early.workers.push(h);
                }
                Err(e) => {
                    early.close_and_join();
                    return Err(e);
                }
            }
        }
        Ok(early)
    }

    fn close_and_join(&mut self) -> Vec<Result<u64, usize>> {
        // Dropping the senders ends each worker once its queue is drained.
        self.senders.clear();
        self.workers.drain(..).enumerate().map(|(id, h)| h.join().map_err(|_| id)).collect()
    }
}

/// What a worker thread needs besides its queue.
struct WorkerEnv<'a, S: Service> {
    id: usize,
    plans: &'a [ClassPlan],
    exec: &'a Executor<S>,
    credits: &'a Credits,
    spin: u32,
    counters: &'a WorkerCounters,
    /// Measure idleness (two clock reads per wait).
    timing: bool,
}

impl<S: Service> WorkerEnv<'_, S> {
    /// Starts timing a wait, if metrics are on.
    #[inline]
    fn start(&self) -> Option<Instant> {
        self.timing.then(Instant::now)
    }

    /// Adds the time since `start` to `counter`.
    #[inline]
    fn stop(&self, start: Option<Instant>, counter: &AtomicU64) {
        WorkerCounters::add_since(counter, start);
    }

    #[inline]
    fn run(&self, cmd: &psmr_model::Command<S::Op>) {
        if self.exec.run(self.id, cmd) {
            WorkerCounters::add(&self.counters.executed, 1);
        }
    }
}

fn worker<S: Service>(rx: &Receiver<Arc<Dispatch<S::Op>>>, env: &WorkerEnv<'_, S>) {
    let (id, c) = (env.id, env.counters);
    let bit = 1u64 << id;
    // This worker's cycle bit per class (000 Alg. 5, `cycles`).
    let mut cycles = vec![0usize; env.plans.len()];
    loop {
        let waited = env.start();
        let Ok(d) = rx.recv() else { return };
        env.stop(waited, &c.queue_idle_ns);
        let mut mine = 0u64;
        for (cmd, &targets) in d.batch.commands().iter().zip(&d.targets) {
            if targets & bit == 0 {
                continue;
            }
            mine += 1;
            match &env.plans[cmd.class.index()] {
                ClassPlan::Alone => env.run(cmd),
                ClassPlan::Barrier { barrier, executor } => {
                    let waited = env.start();
                    if *executor == id {
                        barrier.wait(); // every thread of the class is here
                        env.stop(waited, &c.sync_idle_ns);
                        env.run(cmd);
                        barrier.wait(); // release them
                    } else {
                        barrier.wait(); // signal the executor
                        barrier.wait(); // wait for the execution
                        env.stop(waited, &c.sync_idle_ns);
                    }
                }
                ClassPlan::Cycles(counters) => {
                    let cycle = &mut cycles[cmd.class.index()];
                    match counters.arrive(cycle) {
                        // The last to arrive finds everybody there.
                        Role::Execute => {
                            env.run(cmd);
                            counters.done(*cycle);
                        }
                        Role::Wait => {
                            let (waited, cycle) = (env.start(), *cycle);
                            wait_until(env.spin, || counters.released(cycle));
                            env.stop(waited, &c.sync_idle_ns);
                        }
                    }
                }
            }
        }
        WorkerCounters::add(&c.dequeues, 1);
        WorkerCounters::add(&c.dequeued_commands, mine);
        drop(d);
        env.credits.release(id);
    }
}

impl<S: Service> Scheduler<S> for Early<S> {
    fn kind(&self) -> SchedulerKind {
        self.kind
    }

    fn submit(&mut self, batch: Batch<S::Op>) -> Result<(), SchedError> {
        self.exec.failure.check()?;
        check_classes(&batch, self.routes.len())?;
        let (dispatch, any) = dispatch(&mut self.routes, batch);
        for (id, tx) in self.senders.iter().enumerate() {
            if any & (1u64 << id) != 0 {
                self.credits.acquire(id);
                if tx.send(dispatch.clone()).is_err() {
                    // A receiver only goes away if its worker died.
                    return Err(SchedError::WorkerPanicked(id));
                }
            }
        }
        Ok(())
    }

    fn metrics(&self) -> Option<Arc<Metrics>> {
        Some(self.metrics.clone())
    }

    fn finish(mut self: Box<Self>) -> Result<SchedStats, SchedError> {
        let results = self.close_and_join();
        stats_of(results, &self.exec.failure)
    }
}

impl<S: Service> Drop for Early<S> {
    fn drop(&mut self) {
        if !self.workers.is_empty() {
            self.close_and_join();
        }
    }
}
