//! Early scheduling (003 Alg. 1-2) and its refinements: classes are mapped
//! to worker threads before execution, so scheduling a command is a table
//! lookup.
//!
//! The scheduler (the thread calling `submit`) looks up each command's
//! class in the mapping: a command of a concurrent class goes to one of the
//! class's threads, round-robin; a command of a sequential class goes to
//! every thread of the class. Each worker takes commands from its own FIFO
//! queue ([`WsQueue`]). Because every queue is in log order and conflicting
//! classes share threads (rules R.1-R.5), conflicting commands execute in
//! log order (003 Appendix A). The threads of a sequential class meet to
//! run each of its commands once ([`crate::plan`]):
//!
//! * `early`: at the class barrier; the lowest thread executes.
//! * `early-busywait` (000 Alg. 4-5): on two-cycle atomic counters
//!   ([`crate::CycleCounters`]); the last to arrive executes, the others
//!   spin for `spin` rounds, then yield, then sleep until it is done.
//! * the `early-ws-*` schedulers steal as well ([`crate::ws`]).
//!
//! All of them share this one pool: the same queues, the same credits
//! bounding them, the same way to start, drain and stop the threads.
//!
//! Commands travel per batch: for each batch the scheduler computes one
//! 64-bit target mask per command and sends the batch, with its masks, once
//! to each worker that has something in it. A worker walks the batch and
//! executes the commands whose mask has its bit. This is the "fifoGet
//! returns a batch" of 000 §5.3 and makes one queue operation per batch and
//! worker instead of one per command.
//!
//! At a switch the batches no worker has begun are withdrawn
//! ([`crate::withdraw`]): each worker asks the gate before it begins a
//! batch; the switch takes the withdrawn ones out of the queues and out of
//! their dispatches (a worker that already took one skips it), and they go
//! to the next scheduler, which runs them beside the batches still
//! executing here unless they depend on those.

use crate::exec::Executor;
use crate::metrics::{Metrics, WorkerCounters};
use crate::plan::{at_barrier, on_cycles, ClassPlan, Meeting};
use crate::pool::{Credits, Crew, Pool};
use crate::queue::{ClassSet, WsQueue};
use crate::sink::ReplySink;
use crate::sync::{fence, Naps, RwLock, RwLockReadGuard};
use crate::withdraw::Returns;
use crate::ws::{conflicting, steal_round, steal_until, Thief};
use crate::{
    check_classes, SchedConfig, SchedError, SchedStats, Scheduler, SchedulerKind, Victims, Withdrawal, STEAL_RETRY_MAX,
};
use crossbeam::channel::Receiver;
use psmr_model::{Batch, ClassModel, Command, Mapping, Mode, Service};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, PoisonError, Weak};
use std::time::{Duration, Instant};

/// Dispatches held beyond which finished ones behind an unfinished one are
/// let go of.
const HELD_PRUNE: usize = 256;

/// One batch as sent to the workers, with each command's target threads.
pub(crate) struct Dispatch<O> {
    /// Read by workers once the gate admitted it; taken out by a switch
    /// that withdrew it, which no worker then reads.
    batch: RwLock<Batch<O>>,
    /// Per command, the workers it goes to (bit `t` for worker `t`).
    pub(crate) targets: Vec<u64>,
    /// Its number, from 1 in submission order, for the [`Returns`]' gate.
    n: u64,
    returns: Arc<Returns>,
}

impl<O> Drop for Dispatch<O> {
    /// After a switch closed the gate, the batch reports that every worker
    /// is done with it.
    fn drop(&mut self) {
        self.returns.dropped();
    }
}

impl<O> Dispatch<O> {
    /// The batch, to read.
    pub(crate) fn batch(&self) -> RwLockReadGuard<'_, Batch<O>> {
        // Workers only read it: a panic cannot leave it half-written.
        self.batch.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// The commands of a withdrawn batch, taken out for the next
    /// scheduler. No worker reads a withdrawn batch (it asks the gate
    /// first), so the lock is free.
    fn take(&self) -> Batch<O> {
        let mut batch = self.batch.write().unwrap_or_else(PoisonError::into_inner);
        std::mem::replace(&mut *batch, Batch::new(Vec::new(), 0))
    }
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
/// next thread of its class, round-robin. Returns the dispatch, batch `n`
/// of its scheduler, and the union of its targets.
fn dispatch<O>(routes: &mut [Route], batch: Batch<O>, n: u64, returns: &Arc<Returns>) -> (Arc<Dispatch<O>>, u64) {
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
    (Arc::new(Dispatch { batch: RwLock::new(batch), targets, n, returns: returns.clone() }), any)
}

/// A run of one dispatched batch's commands for one worker: commands
/// `start..end` of the batch (those addressed to the worker). For the
/// stealing schedulers a run starts at a sequential command or holds only
/// concurrent ones, so that the concurrent runs at the front of a ready
/// queue can be stolen; the others send the whole batch as one run.
///
/// The queue bound counts dispatched batches, not runs: a batch's runs for
/// one worker take one credit, pushed all at once, and the credit comes
/// back when the last of them has executed, whoever executed it. (Taking a
/// credit per run could block the scheduler between two runs of one batch
/// while the worker waits at a barrier for a thread that has not received
/// that batch yet: a deadlock.)
pub(crate) struct Slice<O> {
    job: Arc<Job<O>>,
    start: u32,
    end: u32,
}

/// One dispatched batch as one worker receives it. Its runs share it, so
/// that cutting a batch into runs touches the batch's own reference count
/// (which every worker's runs also drop) once per worker, not once per
/// run.
struct Job<O> {
    d: Arc<Dispatch<O>>,
    /// Runs of this job not yet executed.
    left: AtomicU32,
}

impl<O> Slice<O> {
    /// Called once the run has executed: returns the credit of `owner`
    /// when it was the last run of its batch.
    pub(crate) fn done(&self, credits: &Credits, owner: usize) {
        if self.job.left.fetch_sub(1, Ordering::AcqRel) == 1 {
            credits.release(owner);
        }
    }
}

/// How the stealing schedulers steal.
pub(crate) struct Stealing {
    pub(crate) victims: Victims,
    /// `early-ws-optimistic`: validate a steal on the hints first.
    pub(crate) optimistic: bool,
    /// The longest pause between fruitless steal rounds.
    pub(crate) retry_max: std::time::Duration,
    /// Per class, the classes that conflict with it: what a thread waiting
    /// for one of its commands may not steal. Empty for `early-ws-queue`,
    /// which does not steal while it waits.
    pub(crate) avoid: Vec<Vec<u64>>,
}

/// What the workers of an early scheduler share.
pub(crate) struct Shared<S: Service> {
    pub(crate) queues: Vec<WsQueue<Slice<S::Op>>>,
    plans: Vec<ClassPlan>,
    pub(crate) exec: Executor<S>,
    pub(crate) credits: Credits,
    pub(crate) metrics: Arc<Metrics>,
    /// `None` for `early` and `early-busywait`.
    pub(crate) stealing: Option<Stealing>,
    spin: u32,
    pub(crate) timing: bool,
}

impl<S: Service> Crew for Shared<S> {
    fn close(&self) {
        self.queues.iter().for_each(WsQueue::close);
    }

    fn abandon(&self) {
        self.queues.iter().for_each(WsQueue::abandon);
        self.credits.abandon();
        for plan in &self.plans {
            match plan {
                ClassPlan::Barrier { barrier, .. } => barrier.abandon(),
                ClassPlan::Semi { barrier, signal, .. } => {
                    barrier.abandon();
                    signal.abandon();
                }
                ClassPlan::Cycles(counters) => counters.abandon(),
                ClassPlan::Concurrent | ClassPlan::Alone => {}
            }
        }
    }
}

impl<S: Service> Shared<S> {
    /// Starts timing a wait, if metrics are on.
    pub(crate) fn clock(&self) -> Option<Instant> {
        self.timing.then(Instant::now)
    }

    /// The classes a thread waiting for a command of `class` may not steal,
    /// if it steals while it waits.
    fn avoid(&self, class: usize) -> Option<&[u64]> {
        self.stealing.as_ref().and_then(|s| s.avoid.get(class)).map(Vec::as_slice)
    }

    fn run(&self, me: usize, cmd: &Command<S::Op>) {
        if self.exec.run(me, cmd) {
            WorkerCounters::add(&self.metrics.worker(me).executed, 1);
        }
    }
}

/// The early schedulers (see the module documentation).
pub(crate) struct Early<S: Service> {
    kind: SchedulerKind,
    /// Words of a class bit set (0 unless the scheduler steals while it
    /// waits, which needs the classes in each ready queue).
    class_words: usize,
    /// Scratch space for the runs of one batch for one worker.
    runs: Vec<(Slice<S::Op>, bool, ClassSet)>,
    routes: Vec<Route>,
    /// Batches submitted so far.
    submitted: u64,
    /// Dispatches some worker may still hold, oldest first: what
    /// [`Scheduler::withdraw`] looks through.
    held: VecDeque<Arc<Dispatch<S::Op>>>,
    returns: Arc<Returns>,
    withdrawn: Receiver<()>,
    /// Dispatches held when the gate closed: each reports once.
    reports: usize,
    /// The dispatches admitted and still held when the gate closed.
    begun: Vec<Weak<Dispatch<S::Op>>>,
    pool: Pool<Shared<S>>,
}

impl<S: Service> Early<S> {
    pub(crate) fn new(
        config: &SchedConfig,
        mapping: Mapping,
        model: &ClassModel,
        service: Arc<S>,
        sink: Arc<dyn ReplySink<S::Reply>>,
    ) -> Result<Self, SchedError> {
        let meeting = match config.kind {
            SchedulerKind::Early | SchedulerKind::EarlyWsQueue => Meeting::Barrier,
            SchedulerKind::EarlyWsSemi => Meeting::Semi,
            _ => Meeting::Cycles,
        };
        let waits_stealing = config.kind.steals() && meeting != Meeting::Barrier;
        let stealing = config.kind.steals().then(|| Stealing {
            victims: config.victim_policy(),
            optimistic: config.kind == SchedulerKind::EarlyWsOptimistic,
            retry_max: config.steal_retry_max,
            avoid: if waits_stealing {
                model.class_ids().map(|id| conflicting(model, id)).collect()
            } else {
                Vec::new()
            },
        });
        let shared = Arc::new(Shared {
            queues: (0..config.workers).map(|_| WsQueue::new(config.workers)).collect(),
            plans: ClassPlan::all(&mapping, meeting),
            exec: Executor::new(service, sink),
            credits: Credits::new(config.workers, config.queue_depth),
            metrics: Arc::new(Metrics::new(config.workers)),
            stealing,
            spin: config.spin_budget(),
            timing: config.metrics,
        });
        let exec = shared.exec.clone();
        let name = if config.kind.steals() { "ws" } else { "early" };
        let (returns, withdrawn) = Returns::new();
        Ok(Self {
            kind: config.kind,
            class_words: if waits_stealing { model.len().div_ceil(64) } else { 0 },
            runs: Vec::new(),
            routes: routes_of(&mapping),
            submitted: 0,
            held: VecDeque::new(),
            returns,
            withdrawn,
            reports: 0,
            begun: Vec::new(),
            pool: Pool::start(&exec, name, config.workers, shared, worker)?,
        })
    }

    /// Keeps `d` among the dispatches held, and lets go of those every
    /// worker has finished (only this list still refers to them). The
    /// list stays about as long as the workers' queues.
    fn hold(&mut self, d: Arc<Dispatch<S::Op>>) {
        let done = |d: &Arc<Dispatch<S::Op>>| Arc::strong_count(d) == 1;
        while self.held.front().is_some_and(done) {
            self.held.pop_front();
        }
        // A worker far behind keeps the front: finished ones behind it go
        // too, now and then.
        if self.held.len() > HELD_PRUNE {
            self.held.retain(|d| !done(d));
        }
        self.held.push_back(d);
    }

    /// Cuts worker `w`'s commands of `d` into runs in `self.runs`: one run
    /// for the whole batch, or, when stealing, runs that start at each
    /// sequential command.
    fn cut(&mut self, d: &Arc<Dispatch<S::Op>>, w: usize) -> Arc<Job<S::Op>> {
        let bit = 1u64 << w;
        let job = Arc::new(Job { d: d.clone(), left: AtomicU32::new(0) });
        let shared = self.pool.crew();
        if shared.stealing.is_none() {
            self.runs.push((Slice { job: job.clone(), start: 0, end: d.targets.len() as u32 }, false, ClassSet::new()));
            return job;
        }
        for (i, (c, &t)) in d.batch().commands().iter().zip(&d.targets).enumerate() {
            if t & bit == 0 {
                continue;
            }
            let i = i as u32;
            let sequential = shared.plans[c.class.index()].sequential();
            if sequential || self.runs.is_empty() {
                let slice = Slice { job: job.clone(), start: i, end: i + 1 };
                self.runs.push((slice, sequential, smallvec::smallvec![0; self.class_words]));
            }
            let (run, _, classes) = self.runs.last_mut().expect("a run is open");
            run.end = i + 1;
            if let Some(word) = classes.get_mut(c.class.index() / 64) {
                *word |= 1 << (c.class.index() % 64);
            }
        }
        job
    }
}

/// Executes the commands of `slice` addressed to worker `owner` (its own,
/// or a victim's when stealing), on behalf of worker `thief.me`. Returns
/// how many there were.
pub(crate) fn execute_entry<S: Service>(
    thief: &mut Thief,
    owner: usize,
    slice: &Slice<S::Op>,
    shared: &Shared<S>,
) -> u64 {
    let d = &slice.job.d;
    if !d.returns.gate.admit(d.n) {
        // Withdrawn at a switch: the next scheduler executes it.
        return 0;
    }
    let bit = 1u64 << owner;
    let mut mine = 0;
    let range = slice.start as usize..slice.end as usize;
    let batch = d.batch();
    for (cmd, &targets) in batch.commands()[range.clone()].iter().zip(&d.targets[range]) {
        if targets & bit == 0 {
            continue;
        }
        mine += 1;
        let plan = &shared.plans[cmd.class.index()];
        if !plan.sequential() {
            shared.run(thief.me, cmd);
            continue;
        }
        debug_assert_eq!(thief.me, owner, "sequential commands are never stolen");
        if shared.stealing.is_some() {
            wait_for_stealers(thief, shared, cmd.class.index());
        }
        meet(thief, plan, cmd, shared);
    }
    mine
}

/// Before a sequential command, every thread of the class waits until
/// what was stolen from it has executed: a stolen command may precede this
/// one and conflict with it. The variants that steal while they wait for a
/// sequential command steal here too: this is part of that wait, and the
/// stealers may be stuck on work only the waiting thread is free to run.
fn wait_for_stealers<S: Service>(thief: &mut Thief, shared: &Shared<S>, class: usize) {
    let own = &shared.queues[thief.me];
    let waited = shared.clock();
    let busy = match shared.avoid(class) {
        None => {
            let patience = own.wait_for_stealers(thief.spin.patience_if(crate::cpus::contended()));
            thief.spin.learn(&patience);
            0
        }
        Some(avoid) => steal_until(thief, shared, avoid, own.signal(), || own.no_stealers()),
    };
    WorkerCounters::add_since_less(&shared.metrics.worker(thief.me).sync_idle_ns, waited, busy);
}

/// Runs a sequential command with the other threads of its class, as the
/// class's plan says; counts the time spent waiting for them.
fn meet<S: Service>(thief: &mut Thief, plan: &ClassPlan, cmd: &Command<S::Op>, shared: &Shared<S>) {
    let me = thief.me;
    let idle = &shared.metrics.worker(me).sync_idle_ns;
    let waited = shared.clock();
    let avoid = shared.avoid(cmd.class.index());
    match plan {
        ClassPlan::Concurrent | ClassPlan::Alone => shared.run(me, cmd),
        ClassPlan::Barrier { barrier, executor } => {
            let executes = *executor == me;
            at_barrier(barrier, executes, || {
                WorkerCounters::add_since(idle, waited);
                shared.run(me, cmd);
            });
            if !executes {
                WorkerCounters::add_since(idle, waited);
            }
        }
        ClassPlan::Cycles(counters) => {
            let mut cycle = thief.cycles[cmd.class.index()];
            on_cycles(
                counters,
                &mut cycle,
                || shared.run(me, cmd),
                |c| {
                    let busy = match avoid {
                        Some(avoid) => steal_until(thief, shared, avoid, counters.signal(), || counters.released(c)),
                        None => {
                            let patience = counters.wait(c, thief.spin.patience_if(crate::cpus::contended()));
                            thief.spin.learn(&patience);
                            0
                        }
                    };
                    WorkerCounters::add_since_less(idle, waited, busy);
                },
            );
            thief.cycles[cmd.class.index()] = cycle;
        }
        ClassPlan::Semi { barrier, mark, parties, signal } => {
            let mut busy = 0;
            if mark.fetch_add(1, Ordering::AcqRel) + 1 == *parties {
                // The last to arrive executes.
                shared.run(me, cmd);
                mark.store(0, Ordering::Release);
                signal.notify_all();
            } else {
                // Steal while the others arrive and the executor runs.
                let avoid = avoid.unwrap_or(&[]);
                busy = steal_until(thief, shared, avoid, signal, || mark.load(Ordering::Acquire) == 0);
            }
            barrier.wait();
            WorkerCounters::add_since_less(idle, waited, busy);
        }
    }
}

/// A worker: executes what its queue receives; when it has nothing, steals
/// (if its scheduler does) or sleeps until it has.
fn worker<S: Service>(me: usize, shared: &Shared<S>) -> u64 {
    let own = &shared.queues[me];
    let counters = shared.metrics.worker(me);
    let retry_max = shared.stealing.as_ref().map_or(STEAL_RETRY_MAX, |s| s.retry_max);
    let mut thief = Thief::new(me, shared.plans.len(), shared.spin, retry_max);
    let mut batch = Vec::new();
    loop {
        if shared.exec.failure.dead_worker().is_some() {
            // A worker died: the meetings it belongs to never complete.
            return counters.executed.load(Ordering::Relaxed);
        }
        own.take_all_into(&mut batch);
        if !batch.is_empty() {
            for (d, _) in batch.drain(..) {
                let mine = execute_entry(&mut thief, me, &d, shared);
                WorkerCounters::add(&counters.dequeues, 1);
                WorkerCounters::add(&counters.dequeued_commands, mine);
                d.done(&shared.credits, me);
            }
            continue;
        }
        let waited = shared.clock();
        match &shared.stealing {
            None if own.drained() => return counters.executed.load(Ordering::Relaxed),
            None => {
                let patience = thief.idle.patience_if(crate::cpus::contended());
                let patience = own.signal().wait_until(patience, Naps::Notified, || own.has_ready() || own.drained());
                thief.idle.learn(&patience);
            }
            Some(_) => {
                if steal_round(&mut thief, shared, &[]).is_some() {
                    continue;
                }
                // A worker leaves when no queue will ever hold work again:
                // until then it may still steal from busy ones; but where
                // the cores are contended there is no core to steal with,
                // and it leaves once its own queue is done.
                let contended = crate::cpus::contended();
                if shared.queues.iter().all(WsQueue::drained) || (contended && own.drained()) {
                    return counters.executed.load(Ordering::Relaxed);
                }
                // Stealing chances wake nobody (whoever makes one does not
                // know who could use it), so a sleeping worker also wakes
                // by itself, after 50 µs, then twice as long each time, up
                // to when its next steal round is due (at least 1 ms);
                // except where the cores are contended: there is no core
                // to run stolen work on, and it sleeps until work comes.
                let cap = thief.backoff.nap_cap(Duration::from_millis(1));
                let naps =
                    if contended { Naps::Notified } else { Naps::Capped { first: Duration::from_micros(50), cap } };
                let backoff = &thief.backoff;
                let patience = own.signal().wait_until(thief.idle.patience_if(contended), naps, || {
                    own.has_ready()
                        || (!contended && backoff.may_try() && shared.queues.iter().any(WsQueue::stealable))
                        || (contended && own.drained())
                        || shared.queues.iter().all(WsQueue::drained)
                });
                thief.idle.learn(&patience);
            }
        }
        WorkerCounters::add_since(&counters.queue_idle_ns, waited);
    }
}

impl<S: Service> Scheduler<S> for Early<S> {
    fn kind(&self) -> SchedulerKind {
        self.kind
    }

    fn submit(&mut self, batch: Batch<S::Op>) -> Result<(), SchedError> {
        self.pool.crew().exec.failure.check()?;
        check_classes(&batch, self.routes.len())?;
        self.submitted += 1;
        let (d, any) = dispatch(&mut self.routes, batch, self.submitted, &self.returns);
        self.hold(d.clone());
        for w in 0..self.pool.crew().queues.len() {
            if any & (1u64 << w) == 0 {
                continue;
            }
            let job = self.cut(&d, w);
            // Published to the workers by the queue's lock.
            job.left.store(self.runs.len() as u32, Ordering::Relaxed);
            let shared = self.pool.crew();
            if !shared.credits.acquire(w) {
                self.runs.clear();
                break;
            }
            shared.queues[w].push_all(&mut self.runs);
        }
        self.pool.crew().exec.failure.check()
    }

    fn metrics(&self) -> Option<Arc<Metrics>> {
        Some(self.pool.crew().metrics.clone())
    }

    /// Closes the gate and takes the batches no worker has begun out of
    /// the queues and out of their dispatches, so that the switch has them
    /// at once (a worker that already took one skips it at the gate); the
    /// batches begun report as they finish ([`Returns`]).
    fn withdraw(&mut self) -> Option<Withdrawal<S::Op>> {
        let last = self.returns.gate.close();
        self.reports = self.held.len();
        let shared = self.pool.crew();
        for (w, queue) in shared.queues.iter().enumerate() {
            for slice in queue.pop_back_while(|s| s.job.d.n > last) {
                slice.done(&shared.credits, w);
            }
        }
        // Held in log order; empty batches have nothing to give back.
        let taken = self.held.iter().filter(|d| d.n > last).map(|d| d.take()).filter(|b| !b.is_empty()).collect();
        // What the workers may still be executing: all that a later batch
        // can depend on. Weak, so that each still reports as it goes.
        self.begun = self.held.drain(..).filter(|d| d.n <= last).map(|d| Arc::downgrade(&d)).collect();
        let failure = shared.exec.failure.clone();
        Some(Withdrawal::new(taken, self.withdrawn.clone(), self.reports, failure))
    }

    /// After a withdrawal, exact: whether `batch` conflicts with a command
    /// of a batch that was begun and has not finished.
    fn may_conflict(&self, batch: &Batch<S::Op>) -> bool {
        if !self.returns.gate.closed() {
            return true;
        }
        let conflicts =
            self.begun.iter().filter_map(Weak::upgrade).any(|d| d.batch().summary().keys_conflict(batch.summary()));
        // A batch found gone was let go of after it executed: with the
        // release of its last reference, which the failed upgrade read,
        // this makes what it did happen before what runs next.
        fence(Ordering::Acquire);
        conflicts
    }

    /// After a withdrawal, once every batch held then has reported: a
    /// worker or thief lets go of a batch only after executing its part.
    fn drained(&self) -> bool {
        self.returns.gate.closed() && self.returns.gone() >= self.reports
    }

    fn finish(mut self: Box<Self>) -> Result<SchedStats, SchedError> {
        let exec = self.pool.crew().exec.clone();
        self.pool.finish(&exec)
    }
}
