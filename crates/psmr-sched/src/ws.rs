//! Early scheduling with work stealing when a queue is empty
//! (`early-ws-queue`, 000 Alg. 6-8).
//!
//! Each worker has a *ready* queue, filled by the scheduler, and an *exec*
//! batch it is working through. A worker moves its whole ready queue to its
//! exec batch at once. A worker that finds its ready queue empty tries to
//! steal: it takes the whole ready queue of a victim, but only when that
//! victim has no sequential command, neither ready (`ready_flag`) nor in
//! the batch it is executing (`exec_flag`), and it raises the victim's
//! `marker` for itself until the stolen commands have executed.
//!
//! Why this keeps the order of conflicting commands: concurrent commands
//! never conflict with each other (R.3), and a sequential command that
//! conflicts with a stolen concurrent one has every thread of the
//! concurrent class among its own (R.4), the victim included. So it sits in
//! the victim's queue too: before the stolen ones (then the flags forbid the
//! steal) or after them, and then the victim waits until its markers are
//! down before it takes part in that command. 000 Alg. 8 makes only the
//! class's lowest thread wait (lines 14-16); psmr makes every thread of the
//! class wait for its own stealers, which is what the safety argument of
//! §6.2.1.1 needs when the victim is not the lowest thread.
//!
//! The queue protocol lives in [`WsQueue`] and is model-checked with loom
//! in `tests/loom_steal.rs`.

use crate::barrier::Barrier;
use crate::early::{dispatch, routes_of, Credits, Dispatch, Route};
use crate::exec::{stats_of, Executor};
use crate::metrics::{Metrics, WorkerCounters};
use crate::sink::ReplySink;
use crate::sync::{wait_until, AtomicBool, Mutex, MutexGuard};
use crate::{check_classes, SchedConfig, SchedError, SchedStats, Scheduler, SchedulerKind};
use psmr_model::{Batch, Mapping, Mode, Service};
use std::collections::VecDeque;
use std::fmt;
use std::str::FromStr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;

/// How a stealer picks its victims (000 §6.2.2.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Victims {
    /// By id, from the smallest.
    #[default]
    First,
    /// From a random id (per-worker generator seeded by the worker id), then
    /// in id order.
    Random,
    /// From the id after the stealer's, wrapping around (the thesis's
    /// "smart" choice: stealers start at different victims).
    Next,
}

impl Victims {
    /// The name accepted by `FromStr`.
    pub fn name(self) -> &'static str {
        match self {
            Victims::First => "first",
            Victims::Random => "random",
            Victims::Next => "next",
        }
    }
}

impl fmt::Display for Victims {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Victims {
    type Err = SchedError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [Victims::First, Victims::Random, Victims::Next]
            .into_iter()
            .find(|v| v.name() == s)
            .ok_or_else(|| SchedError::Config(format!("unknown victim policy {s:?} (known: first, random, next)")))
    }
}

/// One worker's queues, flags and markers (000 Alg. 6), generic over what
/// an entry is so that loom can check the protocol with plain numbers.
#[derive(Debug)]
pub struct WsQueue<T> {
    state: Mutex<Ready<T>>,
    /// `markers[s]`: worker `s` stole from this worker and is not done.
    markers: Vec<AtomicBool>,
    /// Lock-free hints for waiting workers, written under the lock: the
    /// ready queue is not empty; a steal could succeed.
    has_ready: AtomicBool,
    stealable: AtomicBool,
    /// Closed, and nothing left in the ready queue.
    drained: AtomicBool,
}

#[derive(Debug)]
struct Ready<T> {
    queue: VecDeque<(T, bool)>,
    /// Entries of `queue` holding a sequential command (`readyFlag` is
    /// `ready_seq > 0`).
    ready_seq: usize,
    /// The batch the owner is executing holds a sequential command.
    exec_flag: bool,
    closed: bool,
}

impl<T> WsQueue<T> {
    /// Queues for a worker among `workers`.
    pub fn new(workers: usize) -> Self {
        Self {
            state: Mutex::new(Ready { queue: VecDeque::new(), ready_seq: 0, exec_flag: false, closed: false }),
            markers: (0..workers).map(|_| AtomicBool::new(false)).collect(),
            has_ready: AtomicBool::new(false),
            stealable: AtomicBool::new(false),
            drained: AtomicBool::new(false),
        }
    }

    /// Refreshes the hints; called under the lock after every change.
    fn hint(&self, st: &Ready<T>) {
        self.has_ready.store(!st.queue.is_empty(), Ordering::Relaxed);
        self.stealable.store(st.ready_seq == 0 && !st.exec_flag && !st.queue.is_empty(), Ordering::Relaxed);
        self.drained.store(st.closed && st.queue.is_empty(), Ordering::Release);
    }

    /// True once the queue is closed and its ready queue empty for good.
    pub fn drained(&self) -> bool {
        self.drained.load(Ordering::Acquire)
    }

    fn lock(&self) -> MutexGuard<'_, Ready<T>> {
        // Nothing panics while holding this lock; recover the data anyway.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Scheduler side (Alg. 7): appends an entry; `sequential` when it holds
    /// a sequential command for this worker.
    pub fn push(&self, entry: T, sequential: bool) {
        let mut st = self.lock();
        st.queue.push_back((entry, sequential));
        st.ready_seq += usize::from(sequential);
        self.hint(&st);
    }

    /// No more entries will come.
    pub fn close(&self) {
        let mut st = self.lock();
        st.closed = true;
        self.hint(&st);
    }

    /// Owner side (Alg. 8 lines 5-9): moves the whole ready queue to the
    /// returned exec batch and sets `exec_flag` to whether it holds a
    /// sequential command.
    pub fn take_all(&self) -> Vec<(T, bool)> {
        let mut st = self.lock();
        st.exec_flag = st.ready_seq > 0;
        st.ready_seq = 0;
        let batch = st.queue.drain(..).collect();
        self.hint(&st);
        batch
    }

    /// Hint: the ready queue holds something.
    pub fn has_ready(&self) -> bool {
        self.has_ready.load(Ordering::Relaxed)
    }

    /// Hint: a steal from this queue could succeed.
    pub fn stealable(&self) -> bool {
        self.stealable.load(Ordering::Relaxed)
    }

    /// Stealer side (Alg. 8 lines 29-36): takes the victim's whole ready
    /// queue if neither it nor the victim's exec batch holds a sequential
    /// command, and raises the victim's marker for `stealer`.
    pub fn try_steal(&self, stealer: usize) -> Option<Vec<T>> {
        let mut st = self.lock();
        if st.ready_seq > 0 || st.exec_flag || st.queue.is_empty() {
            return None;
        }
        // Raised under the lock: the owner can only see the steal's effect
        // (an emptier queue) together with the marker.
        self.markers[stealer].store(true, Ordering::Release);
        let stolen = st.queue.drain(..).map(|(t, _)| t).collect();
        self.hint(&st);
        Some(stolen)
    }

    /// Stealer side (Alg. 8 line 40): the stolen entries have executed.
    pub fn steal_done(&self, stealer: usize) {
        self.markers[stealer].store(false, Ordering::Release);
    }

    /// True when no stealer holds work taken from this worker.
    pub fn no_stealers(&self) -> bool {
        self.markers.iter().all(|m| !m.load(Ordering::Acquire))
    }
}

/// What a worker needs to know about a class.
enum ClassPlan {
    /// A concurrent class: may be stolen.
    Concurrent,
    /// A sequential class on one thread: no barrier, but never stolen.
    Alone,
    /// A sequential class on several threads: the barrier; the lowest
    /// thread executes.
    Barrier { barrier: Barrier, executor: usize },
}

struct Shared<S: Service> {
    queues: Vec<WsQueue<Arc<Dispatch<S::Op>>>>,
    plans: Vec<ClassPlan>,
    exec: Executor<S>,
    credits: Credits,
    metrics: Arc<Metrics>,
    victims: Victims,
    spin: u32,
    timing: bool,
}

pub(crate) struct WorkStealing<S: Service> {
    kind: SchedulerKind,
    shared: Arc<Shared<S>>,
    routes: Vec<Route>,
    workers: Vec<JoinHandle<u64>>,
}

impl<S: Service> WorkStealing<S> {
    pub(crate) fn new(
        config: &SchedConfig,
        mapping: Mapping,
        service: Arc<S>,
        sink: Arc<dyn ReplySink<S::Reply>>,
    ) -> Result<Self, SchedError> {
        let plans = mapping
            .classes()
            .iter()
            .map(|c| match (c.mode, c.threads.len()) {
                (Mode::Concurrent, _) => ClassPlan::Concurrent,
                (Mode::Sequential, 1) => ClassPlan::Alone,
                (Mode::Sequential, n) => ClassPlan::Barrier { barrier: Barrier::new(n), executor: c.threads[0] },
            })
            .collect();
        let shared = Arc::new(Shared {
            queues: (0..config.workers).map(|_| WsQueue::new(config.workers)).collect(),
            plans,
            exec: Executor::new(service, sink),
            credits: Credits::new(config.workers, config.queue_depth),
            metrics: Arc::new(Metrics::new(config.workers)),
            victims: config.victims,
            spin: config.spin_budget(),
            timing: config.metrics,
        });
        let mut ws = Self { kind: config.kind, shared, routes: routes_of(&mapping), workers: Vec::new() };
        for id in 0..config.workers {
            let shared = ws.shared.clone();
            match std::thread::Builder::new().name(format!("psmr-ws-{id}")).spawn(move || worker(id, &shared)) {
                Ok(h) => ws.workers.push(h),
                Err(e) => {
                    ws.close_and_join();
                    return Err(SchedError::Spawn(e.to_string()));
                }
            }
        }
        Ok(ws)
    }

    fn close_and_join(&mut self) -> Vec<Result<u64, usize>> {
        for q in &self.shared.queues {
            q.close();
        }
        self.workers.drain(..).enumerate().map(|(id, h)| h.join().map_err(|_| id)).collect()
    }
}

/// Executes the commands of `d` addressed to worker `owner` (its own, or a
/// victim's when stealing), on behalf of worker `me`.
fn execute_entry<S: Service>(me: usize, owner: usize, d: &Dispatch<S::Op>, shared: &Shared<S>) -> u64 {
    let bit = 1u64 << owner;
    let counters = shared.metrics.worker(me);
    let mut mine = 0;
    for (cmd, &targets) in d.batch.commands().iter().zip(&d.targets) {
        if targets & bit == 0 {
            continue;
        }
        mine += 1;
        let plan = &shared.plans[cmd.class.index()];
        if !matches!(plan, ClassPlan::Concurrent) {
            debug_assert_eq!(me, owner, "sequential commands are never stolen");
            // Every thread of the class waits until what was stolen from it
            // has executed: a stolen command may precede this one and
            // conflict with it.
            let waited = shared.timing.then(std::time::Instant::now);
            wait_until(shared.spin, || shared.queues[me].no_stealers());
            if let Some(t) = waited {
                WorkerCounters::add(&counters.sync_idle_ns, t.elapsed().as_nanos() as u64);
            }
        }
        match plan {
            ClassPlan::Concurrent | ClassPlan::Alone => {
                if shared.exec.run(me, cmd) {
                    WorkerCounters::add(&counters.executed, 1);
                }
            }
            ClassPlan::Barrier { barrier, executor } => {
                let waited = shared.timing.then(std::time::Instant::now);
                if *executor == me {
                    barrier.wait();
                    if shared.exec.run(me, cmd) {
                        WorkerCounters::add(&counters.executed, 1);
                    }
                    barrier.wait();
                } else {
                    barrier.wait();
                    barrier.wait();
                }
                if let Some(t) = waited {
                    WorkerCounters::add(&counters.sync_idle_ns, t.elapsed().as_nanos() as u64);
                }
            }
        }
    }
    mine
}

/// The order in which stealer `me` visits victims, starting at `start`.
fn victim_order(me: usize, workers: usize, start: usize) -> impl Iterator<Item = usize> {
    (0..workers).map(move |i| (start + i) % workers).filter(move |&v| v != me)
}

fn worker<S: Service>(me: usize, shared: &Shared<S>) -> u64 {
    let n = shared.queues.len();
    let own = &shared.queues[me];
    let counters = shared.metrics.worker(me);
    // xorshift state for `Victims::Random`, seeded by the worker id: victim
    // choice changes timing, never results.
    let mut rng = 0x9E37_79B9_7F4A_7C15u64 ^ (me as u64 + 1);
    loop {
        let batch = own.take_all();
        if !batch.is_empty() {
            for (d, _) in &batch {
                let mine = execute_entry(me, me, d, shared);
                WorkerCounters::add(&counters.dequeues, 1);
                WorkerCounters::add(&counters.dequeued_commands, mine);
                shared.credits.release(me);
            }
            continue;
        }
        // Nothing of our own: try to steal once from each victim in turn.
        let start = match shared.victims {
            Victims::First => 0,
            Victims::Next => (me + 1) % n,
            Victims::Random => {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                (rng % n as u64) as usize
            }
        };
        let mut stole = false;
        for v in victim_order(me, n, start) {
            WorkerCounters::add(&counters.steals_tried, 1);
            if let Some(entries) = shared.queues[v].try_steal(me) {
                for d in &entries {
                    execute_entry(me, v, d, shared);
                    shared.credits.release(v);
                }
                shared.queues[v].steal_done(me);
                WorkerCounters::add(&counters.steals_ok, 1);
                stole = true;
                break;
            }
        }
        if !stole {
            // A worker leaves only when no queue will ever hold work again:
            // until then it may still steal from the ones that are busy.
            if shared.queues.iter().all(WsQueue::drained) {
                return counters.executed.load(Ordering::Relaxed);
            }
            // Wait for work of our own (or for the end), briefly: stealing
            // chances come back as the others' queues fill.
            let waited = shared.timing.then(std::time::Instant::now);
            wait_until(shared.spin.min(200), || {
                own.has_ready()
                    || shared.queues.iter().any(WsQueue::stealable)
                    || shared.queues.iter().all(WsQueue::drained)
            });
            if let Some(t) = waited {
                WorkerCounters::add(&counters.queue_idle_ns, t.elapsed().as_nanos() as u64);
            }
        }
    }
}

impl<S: Service> Scheduler<S> for WorkStealing<S> {
    fn kind(&self) -> SchedulerKind {
        self.kind
    }

    fn submit(&mut self, batch: Batch<S::Op>) -> Result<(), SchedError> {
        self.shared.exec.failure.check()?;
        check_classes(&batch, self.routes.len())?;
        let (d, any) = dispatch(&mut self.routes, batch);
        for (w, q) in self.shared.queues.iter().enumerate() {
            let bit = 1u64 << w;
            if any & bit == 0 {
                continue;
            }
            let sequential =
                d.batch.commands().iter().zip(&d.targets).any(|(c, &t)| {
                    t & bit != 0 && !matches!(self.shared.plans[c.class.index()], ClassPlan::Concurrent)
                });
            self.shared.credits.acquire(w);
            q.push(d.clone(), sequential);
        }
        Ok(())
    }

    fn metrics(&self) -> Option<Arc<Metrics>> {
        Some(self.shared.metrics.clone())
    }

    fn finish(mut self: Box<Self>) -> Result<SchedStats, SchedError> {
        let results = self.close_and_join();
        stats_of(results, &self.shared.exec.failure)
    }
}

impl<S: Service> Drop for WorkStealing<S> {
    fn drop(&mut self) {
        if !self.workers.is_empty() {
            self.close_and_join();
        }
    }
}
