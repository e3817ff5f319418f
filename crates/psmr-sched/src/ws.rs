//! Early scheduling with work stealing (000 §6.2), in four steps:
//!
//! * `early-ws-queue` (000 Alg. 6-8): a worker whose queue is empty steals;
//!   sequential classes synchronize at barriers as in `early`.
//! * `early-ws-semi` (000 Alg. 9-11): a thread that arrives at a
//!   sequential command before the others also steals, work free of the
//!   classes that conflict with that command, until the last thread has
//!   arrived and executed it; then they all meet at the class barrier.
//! * `early-ws-nonblocking` (000 Alg. 12-13): the same without any barrier:
//!   the threads of a sequential class meet on two-cycle counters
//!   ([`crate::CycleCounters`]), and the waiters steal until the reset.
//! * `early-ws-optimistic` (000 Alg. 14): `early-ws-nonblocking` whose
//!   stealers first check a victim's steal conditions on lock-free hints
//!   and take its lock only when the check passes, then check again under
//!   the lock. Stealers no longer queue up on the locks of victims that
//!   have nothing to give, which is most of them most of the time; the
//!   victims need those locks to take their own work.
//!
//! Each worker has a *ready* queue, filled by the scheduler, and an *exec*
//! batch it is working through. A worker moves its whole ready queue to its
//! exec batch at once. A worker that finds its ready queue empty tries to
//! steal: it takes the concurrent commands at the front of a victim's
//! ready queue, up to its first sequential command (000 takes the whole
//! queue and only when it holds no sequential command; see
//! [`WsQueue::try_steal`]), but only when the batch the victim is
//! executing holds no sequential command (`exec_flag`), and it raises the
//! victim's `marker` for itself until the stolen commands have executed.
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
//! In the three variants that steal while they synchronize, that wait for
//! the markers is part of the synchronization and the thread steals during
//! it too, under the same condition (no class conflicting with the
//! sequential command's). Without that, a thread could wait for a stealer
//! that is stuck on work only the waiting thread is free to run; stolen
//! work is concurrent, never synchronizes, and so never waits in turn.
//!
//! Waiting follows [`crate::SchedConfig::spin`]: spin, then yield, then
//! nap, polling between steps, and back to spinning after each steal.
//!
//! The queue protocol lives in [`WsQueue`] and is model-checked with loom
//! in `tests/loom_steal.rs` (idle stealing, markers, flags) and
//! `tests/loom_semi.rs` (stealing while waiting on two-cycle counters,
//! with and without a conflicting class).

use crate::barrier::Barrier;
use crate::cycles::{CycleCounters, Role};
use crate::early::{dispatch, routes_of, Credits, Dispatch, Route};
use crate::exec::{stats_of, Executor};
use crate::metrics::{Metrics, WorkerCounters};
use crate::sink::ReplySink;
use crate::sync::{wait_until, AtomicBool, AtomicU64, AtomicUsize, Mutex, MutexGuard, Patience};
use crate::{check_classes, SchedConfig, SchedError, SchedStats, Scheduler, SchedulerKind};
use crossbeam::utils::CachePadded;
use psmr_model::{Batch, ClassModel, Mapping, Mode, Service};
use smallvec::SmallVec;
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

/// A set of classes, bit `c` for class `c`; one word, inline, for up to 64
/// classes.
pub type ClassSet = SmallVec<[u64; 1]>;

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
    /// The classes of the entries a steal would take, folded to 64 bits
    /// (class `c` on bit `c % 64`); meaningful when `stealable`.
    steal_classes: AtomicU64,
    /// Closed, and nothing left in the ready queue.
    drained: AtomicBool,
}

#[derive(Debug)]
struct Ready<T> {
    /// Entries, whether each holds a sequential command, and the classes of
    /// its commands as a bit set (000 Alg. 9 `readyClasses`, kept per entry;
    /// empty for `early-ws-queue`).
    queue: VecDeque<(T, bool, ClassSet)>,
    /// Entries of `queue` holding a sequential command (`readyFlag` is
    /// `ready_seq > 0`).
    ready_seq: usize,
    /// Entries at the front of `queue` before the first sequential one:
    /// what a steal takes. Their classes, folded as in `steal_classes`.
    prefix: usize,
    prefix_classes: u64,
    /// The batch the owner is executing holds a sequential command.
    exec_flag: bool,
    closed: bool,
}

impl<T> WsQueue<T> {
    /// Queues for a worker among `workers`.
    pub fn new(workers: usize) -> Self {
        Self {
            state: Mutex::new(Ready {
                queue: VecDeque::new(),
                ready_seq: 0,
                prefix: 0,
                prefix_classes: 0,
                exec_flag: false,
                closed: false,
            }),
            markers: (0..workers).map(|_| AtomicBool::new(false)).collect(),
            has_ready: AtomicBool::new(false),
            stealable: AtomicBool::new(false),
            steal_classes: AtomicU64::new(0),
            drained: AtomicBool::new(false),
        }
    }

    /// Refreshes the hints; called under the lock after every change.
    fn hint(&self, st: &Ready<T>) {
        self.has_ready.store(!st.queue.is_empty(), Ordering::Relaxed);
        self.stealable.store(!st.exec_flag && st.prefix > 0, Ordering::Relaxed);
        self.steal_classes.store(st.prefix_classes, Ordering::Relaxed);
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
        self.push_with_classes(entry, sequential, &[]);
    }

    /// Like [`WsQueue::push`], also recording the classes of the entry's
    /// commands (a bit set, bit `c` for class `c`; 000 Alg. 10).
    pub fn push_with_classes(&self, entry: T, sequential: bool, classes: &[u64]) {
        let mut st = self.lock();
        Self::append(&mut st, entry, sequential, classes.into());
        self.hint(&st);
    }

    /// Appends several entries at once, under one acquisition of the lock,
    /// leaving `entries` empty: `(entry, sequential, classes)` as in
    /// [`WsQueue::push_with_classes`].
    pub fn push_all(&self, entries: &mut Vec<(T, bool, ClassSet)>) {
        let mut st = self.lock();
        for (entry, sequential, classes) in entries.drain(..) {
            Self::append(&mut st, entry, sequential, classes);
        }
        self.hint(&st);
    }

    fn append(st: &mut Ready<T>, entry: T, sequential: bool, classes: ClassSet) {
        if !sequential && st.prefix == st.queue.len() {
            st.prefix += 1;
            st.prefix_classes |= fold(&classes);
        }
        st.queue.push_back((entry, sequential, classes));
        st.ready_seq += usize::from(sequential);
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
        let mut batch = Vec::new();
        self.take_all_into(&mut batch);
        batch
    }

    /// [`WsQueue::take_all`] into a buffer the owner reuses (appended to).
    pub fn take_all_into(&self, batch: &mut Vec<(T, bool)>) {
        let mut st = self.lock();
        st.exec_flag = st.ready_seq > 0;
        st.ready_seq = 0;
        st.prefix = 0;
        st.prefix_classes = 0;
        batch.extend(st.queue.drain(..).map(|(t, seq, _)| (t, seq)));
        self.hint(&st);
    }

    /// Hint: the ready queue holds something.
    pub fn has_ready(&self) -> bool {
        self.has_ready.load(Ordering::Relaxed)
    }

    /// Hint: a steal from this queue could succeed.
    pub fn stealable(&self) -> bool {
        self.stealable.load(Ordering::Relaxed)
    }

    /// The optimistic validation of 000 Alg. 14 (line 5): the steal
    /// conditions of [`WsQueue::try_steal_avoiding`] evaluated on the
    /// hints, without the lock. `avoid` is folded to 64 bits, so with more
    /// than 64 classes it may refuse a steal the locked check would allow
    /// (never the reverse matters: the locked check decides).
    pub fn may_steal(&self, avoid: &[u64]) -> bool {
        self.stealable() && self.steal_classes.load(Ordering::Relaxed) & fold(avoid) == 0
    }

    /// Stealer side (Alg. 8 lines 29-36): takes the entries at the front of
    /// the victim's ready queue up to its first sequential one, if the
    /// batch the victim is executing holds no sequential command, and
    /// raises the victim's marker for `stealer`.
    ///
    /// 000 steals the whole ready queue and only when it holds no
    /// sequential command at all. psmr delivers commands in batches, so a
    /// ready queue nearly always holds one; stealing the prefix before it is
    /// just as safe: the stolen commands precede the sequential one in log
    /// order, and the victim waits for its markers before it runs it.
    pub fn try_steal(&self, stealer: usize) -> Option<Vec<T>> {
        self.try_steal_avoiding(stealer, &[])
    }

    /// Like [`WsQueue::try_steal`], and only if the stolen entries hold no
    /// command of the classes in `avoid` (000 Alg. 11, `NoConflict`: a
    /// stealer waiting for a sequential command of class `c` passes the
    /// classes that conflict with `c`).
    pub fn try_steal_avoiding(&self, stealer: usize, avoid: &[u64]) -> Option<Vec<T>> {
        let mut st = self.lock();
        if st.exec_flag {
            return None;
        }
        let prefix = st.prefix;
        if prefix == 0 {
            return None;
        }
        let conflicting =
            st.queue.iter().take(prefix).any(|e| e.2.iter().zip(avoid).any(|(have, bad)| have & bad != 0));
        if conflicting {
            return None;
        }
        // Raised under the lock: the owner can only see the steal's effect
        // (an emptier queue) together with the marker.
        self.markers[stealer].store(true, Ordering::Release);
        let stolen = st.queue.drain(..prefix).map(|(t, _, _)| t).collect();
        // The front is now a sequential entry, or nothing.
        st.prefix = 0;
        st.prefix_classes = 0;
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

/// A class bit set folded to one word: class `c` on bit `c % 64`.
fn fold(classes: &[u64]) -> u64 {
    classes.iter().fold(0, |a, w| a | w)
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
    /// `early-ws-semi` (000 Alg. 11): arrivals counted on `mark`; the last
    /// to arrive executes; the others steal work free of the classes that
    /// conflict with this one until it is done; then everybody meets at
    /// the barrier.
    Semi { barrier: Barrier, mark: CachePadded<AtomicUsize>, parties: usize },
    /// `early-ws-nonblocking` and `early-ws-optimistic` (000 Alg. 13): the
    /// last to arrive on the class's two-cycle counters executes; the
    /// others steal work free of the conflicting classes until the reset.
    NonBlocking(CycleCounters),
}

/// Where an idle worker sleeps. A worker with nothing of its own to do and
/// nothing to steal spins, yields, then parks; the scheduler unparks it when
/// it hands the worker a batch. Stealing chances do not wake anybody (the
/// thread that makes one does not know who could use it), so a parked
/// worker also wakes up by itself, after 50 µs, then after twice as long
/// each time, up to 1 ms. Napping without the wake-up, as the other waits
/// do, left a worker asleep for up to a nap while its queue filled and the
/// others waited for it at the next sequential command.
#[derive(Default)]
struct Idle {
    parked: CachePadded<std::sync::atomic::AtomicBool>,
    thread: std::sync::OnceLock<std::thread::Thread>,
}

impl Idle {
    /// Called by the worker's own thread before it waits.
    fn register(&self) {
        let _ = self.thread.set(std::thread::current());
    }

    /// Waits until `done` holds (see the type's documentation).
    fn wait_until(&self, spin: u32, done: impl Fn() -> bool) {
        use std::sync::atomic::{fence, Ordering::SeqCst};
        let mut patience = Patience::new(spin);
        let mut sleep_us = 50;
        while !done() {
            if !patience.tired() {
                patience.snooze();
                continue;
            }
            self.parked.store(true, Ordering::Relaxed);
            // Pairs with the fence in `wake`: either the waker sees
            // `parked`, or this thread sees what the waker published
            // before waking it. (A lost wake-up would cost a timeout, not
            // a hang, but there is none.)
            fence(SeqCst);
            if !done() {
                std::thread::park_timeout(std::time::Duration::from_micros(sleep_us));
                sleep_us = (sleep_us * 2).min(1000);
            }
            self.parked.store(false, Ordering::Relaxed);
        }
    }

    /// Wakes the worker if it is parked; called after publishing its work.
    fn wake(&self) {
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        if self.parked.load(Ordering::Relaxed) {
            if let Some(thread) = self.thread.get() {
                thread.unpark();
            }
        }
    }
}

/// A worker's own state: its id, where it starts looking for victims and
/// its cycle bit per class (000 Alg. 13 `cycles`).
struct Thief {
    me: usize,
    rng: u64,
    cycles: Vec<usize>,
}

impl Thief {
    fn new(me: usize, classes: usize) -> Self {
        // Seeded by the worker id: victim choice changes timing, never
        // results.
        Self { me, rng: 0x9E37_79B9_7F4A_7C15u64 ^ (me as u64 + 1), cycles: vec![0; classes] }
    }

    fn start(&mut self, victims: Victims, workers: usize) -> usize {
        match victims {
            Victims::First => 0,
            Victims::Next => (self.me + 1) % workers,
            Victims::Random => {
                self.rng ^= self.rng << 13;
                self.rng ^= self.rng >> 7;
                self.rng ^= self.rng << 17;
                (self.rng % workers as u64) as usize
            }
        }
    }
}

/// Tries each victim once, in the order of the victim policy, skipping
/// those whose hints say no when stealing optimistically; executes the
/// first haul. Returns `None` if it stole nothing, else the nanoseconds
/// spent executing the haul (0 unless metrics are timed), which are not
/// idle time for a worker that steals while it waits.
fn steal_once<S: Service>(thief: &mut Thief, shared: &Shared<S>, avoid: &[u64]) -> Option<u64> {
    let (me, n) = (thief.me, shared.queues.len());
    let counters = shared.metrics.worker(me);
    let start = thief.start(shared.victims, n);
    for v in victim_order(me, n, start) {
        WorkerCounters::add(&counters.steals_tried, 1);
        let victim = &shared.queues[v];
        if shared.optimistic && !victim.may_steal(avoid) {
            continue;
        }
        if let Some(entries) = victim.try_steal_avoiding(me, avoid) {
            let began = shared.timing.then(std::time::Instant::now);
            for d in &entries {
                execute_entry(thief, v, d, shared);
                d.done(&shared.credits, v);
            }
            victim.steal_done(me);
            WorkerCounters::add(&counters.steals_ok, 1);
            return Some(began.map_or(0, |t| t.elapsed().as_nanos() as u64));
        }
    }
    None
}

/// Waits until `done` holds, stealing work free of the classes in `avoid`
/// meanwhile (000 Alg. 11 and 13). Returns the nanoseconds spent executing
/// stolen work.
fn steal_until<S: Service>(thief: &mut Thief, shared: &Shared<S>, avoid: &[u64], done: impl Fn() -> bool) -> u64 {
    let mut busy = 0;
    let mut patience = Patience::new(shared.spin);
    while !done() {
        match steal_once(thief, shared, avoid) {
            Some(ns) => {
                busy += ns;
                patience.reset();
            }
            None => patience.snooze(),
        }
    }
    busy
}

/// A run of one dispatched batch's commands for one worker: commands
/// `start..end` of the batch (those addressed to the worker). A run starts
/// at a sequential command or holds only concurrent ones, so that the
/// concurrent runs at the front of a ready queue can be stolen.
///
/// The queue bound counts dispatched batches, not runs: a batch's runs for
/// one worker take one credit, pushed all at once, and the credit comes
/// back when the last of them has executed, whoever executed it. (Taking a
/// credit per run could block the scheduler between two runs of one batch
/// while the worker waits at a barrier for a thread that has not received
/// that batch yet: a deadlock.)
struct Slice<O> {
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
    left: std::sync::atomic::AtomicU32,
}

impl<O> Slice<O> {
    /// Called once the run has executed: returns the credit of `owner`
    /// when it was the last run of its batch.
    fn done(&self, credits: &Credits, owner: usize) {
        if self.job.left.fetch_sub(1, Ordering::AcqRel) == 1 {
            credits.release(owner);
        }
    }
}

struct Shared<S: Service> {
    queues: Vec<WsQueue<Slice<S::Op>>>,
    /// Per worker, where it sleeps when it has nothing to do.
    idle: Vec<Idle>,
    plans: Vec<ClassPlan>,
    /// Per class, the classes that conflict with it: what a thread waiting
    /// for one of its commands may not steal. Empty for `early-ws-queue`,
    /// which does not steal while it waits.
    avoid: Vec<Vec<u64>>,
    exec: Executor<S>,
    credits: Credits,
    metrics: Arc<Metrics>,
    victims: Victims,
    /// `early-ws-optimistic`: validate a steal on the hints first.
    optimistic: bool,
    spin: u32,
    timing: bool,
}

pub(crate) struct WorkStealing<S: Service> {
    kind: SchedulerKind,
    /// Words of a class bit set (0 for `early-ws-queue`, which does not
    /// track the classes in each ready queue).
    class_words: usize,
    /// Scratch space for the runs of one batch for one worker.
    runs: Vec<(Slice<S::Op>, bool, ClassSet)>,
    shared: Arc<Shared<S>>,
    routes: Vec<Route>,
    workers: Vec<JoinHandle<u64>>,
}

impl<S: Service> WorkStealing<S> {
    pub(crate) fn new(
        config: &SchedConfig,
        mapping: Mapping,
        model: &ClassModel,
        service: Arc<S>,
        sink: Arc<dyn ReplySink<S::Reply>>,
    ) -> Result<Self, SchedError> {
        let semi = config.kind == SchedulerKind::EarlyWsSemi;
        let nonblocking = matches!(config.kind, SchedulerKind::EarlyWsNonBlocking | SchedulerKind::EarlyWsOptimistic);
        // Stealing while synchronizing needs the classes of what is stolen.
        let words = if semi || nonblocking { model.len().div_ceil(64) } else { 0 };
        let plans = model
            .class_ids()
            .map(|id| {
                let c = mapping.class(id);
                match (c.mode, c.threads.len()) {
                    (Mode::Concurrent, _) => ClassPlan::Concurrent,
                    (Mode::Sequential, 1) => ClassPlan::Alone,
                    (Mode::Sequential, n) if nonblocking => ClassPlan::NonBlocking(CycleCounters::new(n)),
                    (Mode::Sequential, n) if semi => ClassPlan::Semi {
                        barrier: Barrier::new(n),
                        mark: CachePadded::new(AtomicUsize::new(0)),
                        parties: n,
                    },
                    (Mode::Sequential, n) => ClassPlan::Barrier { barrier: Barrier::new(n), executor: c.threads[0] },
                }
            })
            .collect();
        let shared = Arc::new(Shared {
            queues: (0..config.workers).map(|_| WsQueue::new(config.workers)).collect(),
            idle: (0..config.workers).map(|_| Idle::default()).collect(),
            plans,
            avoid: if words > 0 { model.class_ids().map(|id| conflicting(model, id)).collect() } else { Vec::new() },
            exec: Executor::new(service, sink),
            credits: Credits::new(config.workers, config.queue_depth),
            metrics: Arc::new(Metrics::new(config.workers)),
            victims: config.victim_policy(),
            optimistic: config.kind == SchedulerKind::EarlyWsOptimistic,
            spin: config.spin_budget(),
            timing: config.metrics,
        });
        let mut ws = Self {
            kind: config.kind,
            shared,
            routes: routes_of(&mapping),
            workers: Vec::new(),
            class_words: words,
            runs: Vec::new(),
        };
        for id in 0..config.workers {
            let shared = ws.shared.clone();
            match ws.shared.exec.spawn_worker(format!("psmr-ws-{id}"), id, move || worker(id, &shared)) {
                Ok(h) => ws.workers.push(h),
                Err(e) => {
                    ws.close_and_join();
                    return Err(e);
                }
            }
        }
        Ok(ws)
    }

    fn close_and_join(&mut self) -> Vec<Result<u64, usize>> {
        for (q, idle) in self.shared.queues.iter().zip(&self.shared.idle) {
            q.close();
            idle.wake();
        }
        self.workers.drain(..).enumerate().map(|(id, h)| h.join().map_err(|_| id)).collect()
    }
}

/// Executes the commands of `d` addressed to worker `owner` (its own, or a
/// victim's when stealing), on behalf of worker `me`.
fn execute_entry<S: Service>(thief: &mut Thief, owner: usize, slice: &Slice<S::Op>, shared: &Shared<S>) -> u64 {
    let me = thief.me;
    let bit = 1u64 << owner;
    let counters = shared.metrics.worker(me);
    let mut mine = 0;
    let range = slice.start as usize..slice.end as usize;
    let d = &slice.job.d;
    for (cmd, &targets) in d.batch.commands()[range.clone()].iter().zip(&d.targets[range]) {
        if targets & bit == 0 {
            continue;
        }
        mine += 1;
        let plan = &shared.plans[cmd.class.index()];
        let avoid = shared.avoid.get(cmd.class.index()).map_or(&[][..], Vec::as_slice);
        if !matches!(plan, ClassPlan::Concurrent) {
            debug_assert_eq!(me, owner, "sequential commands are never stolen");
            // Every thread of the class waits until what was stolen from it
            // has executed: a stolen command may precede this one and
            // conflict with it. The variants that steal while they wait
            // for a sequential command steal here too: this is part of
            // that wait, and the stealers may be stuck on work only the
            // waiting thread is free to run.
            let waited = shared.timing.then(std::time::Instant::now);
            let own = &shared.queues[me];
            let busy = if shared.avoid.is_empty() {
                wait_until(shared.spin, || own.no_stealers());
                0
            } else {
                steal_until(thief, shared, avoid, || own.no_stealers())
            };
            WorkerCounters::add_since_less(&counters.sync_idle_ns, waited, busy);
        }
        match plan {
            ClassPlan::Concurrent | ClassPlan::Alone => {
                if shared.exec.run(me, cmd) {
                    WorkerCounters::add(&counters.executed, 1);
                }
            }
            ClassPlan::Semi { barrier, mark, parties } => {
                let waited = shared.timing.then(std::time::Instant::now);
                let mut busy = 0;
                if mark.fetch_add(1, Ordering::AcqRel) + 1 == *parties {
                    // The last to arrive executes.
                    if shared.exec.run(me, cmd) {
                        WorkerCounters::add(&counters.executed, 1);
                    }
                    mark.store(0, Ordering::Release);
                } else {
                    // Steal while the others arrive and the executor runs.
                    busy = steal_until(thief, shared, avoid, || mark.load(Ordering::Acquire) == 0);
                }
                barrier.wait();
                WorkerCounters::add_since_less(&counters.sync_idle_ns, waited, busy);
            }
            ClassPlan::NonBlocking(marks) => {
                let cycle = &mut thief.cycles[cmd.class.index()];
                match marks.arrive(cycle) {
                    Role::Execute => {
                        if shared.exec.run(me, cmd) {
                            WorkerCounters::add(&counters.executed, 1);
                        }
                        marks.done(*cycle);
                    }
                    Role::Wait => {
                        let (waited, cycle) = (shared.timing.then(std::time::Instant::now), *cycle);
                        let busy = steal_until(thief, shared, avoid, || marks.released(cycle));
                        WorkerCounters::add_since_less(&counters.sync_idle_ns, waited, busy);
                    }
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
                WorkerCounters::add_since(&counters.sync_idle_ns, waited);
            }
        }
    }
    mine
}

/// The classes that conflict with `class`, as a bit set: what a thread
/// waiting for a command of `class` must not steal.
fn conflicting(model: &ClassModel, class: psmr_model::ClassId) -> Vec<u64> {
    let mut set = vec![0u64; model.len().div_ceil(64)];
    for other in model.class_ids().filter(|&o| model.conflicts(class, o)) {
        set[other.index() / 64] |= 1 << (other.index() % 64);
    }
    set
}

/// The order in which stealer `me` visits victims, starting at `start`.
fn victim_order(me: usize, workers: usize, start: usize) -> impl Iterator<Item = usize> {
    (0..workers).map(move |i| (start + i) % workers).filter(move |&v| v != me)
}

fn worker<S: Service>(me: usize, shared: &Shared<S>) -> u64 {
    shared.idle[me].register();
    let own = &shared.queues[me];
    let counters = shared.metrics.worker(me);
    let mut thief = Thief::new(me, shared.plans.len());
    let mut batch = Vec::new();
    loop {
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
        // Nothing of our own: try to steal once from each victim in turn.
        if steal_once(&mut thief, shared, &[]).is_none() {
            // A worker leaves only when no queue will ever hold work again:
            // until then it may still steal from the ones that are busy.
            if shared.queues.iter().all(WsQueue::drained) {
                return counters.executed.load(Ordering::Relaxed);
            }
            // Wait for work of our own, a stealing chance or the end.
            let waited = shared.timing.then(std::time::Instant::now);
            shared.idle[me].wait_until(shared.spin.min(200), || {
                own.has_ready()
                    || shared.queues.iter().any(WsQueue::stealable)
                    || shared.queues.iter().all(WsQueue::drained)
            });
            WorkerCounters::add_since(&counters.queue_idle_ns, waited);
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
        let shared = self.shared.clone();
        for (w, q) in shared.queues.iter().enumerate() {
            let bit = 1u64 << w;
            if any & bit == 0 {
                continue;
            }
            // Cut this worker's commands into runs that start at each
            // sequential command.
            let runs = &mut self.runs;
            let job = Arc::new(Job { d: d.clone(), left: std::sync::atomic::AtomicU32::new(0) });
            for (i, (c, &t)) in d.batch.commands().iter().zip(&d.targets).enumerate() {
                if t & bit == 0 {
                    continue;
                }
                let i = i as u32;
                let sequential = !matches!(self.shared.plans[c.class.index()], ClassPlan::Concurrent);
                if sequential || runs.is_empty() {
                    let slice = Slice { job: job.clone(), start: i, end: i + 1 };
                    runs.push((slice, sequential, smallvec::smallvec![0; self.class_words]));
                }
                let (run, _, classes) = runs.last_mut().expect("a run is open");
                run.end = i + 1;
                if let Some(word) = classes.get_mut(c.class.index() / 64) {
                    *word |= 1 << (c.class.index() % 64);
                }
            }
            // Published to the workers by the queue's lock.
            job.left.store(runs.len() as u32, Ordering::Relaxed);
            self.shared.credits.acquire(w);
            q.push_all(runs);
            self.shared.idle[w].wake();
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

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn flags_decide_what_may_be_stolen() {
        let q = WsQueue::new(2);
        assert_eq!(q.try_steal(1), None, "nothing to steal");
        q.push(1u32, false);
        q.push(2, false);
        assert_eq!(q.try_steal(1), Some(vec![1, 2]));
        assert!(!q.no_stealers(), "the marker is up until the stealer is done");
        q.steal_done(1);
        assert!(q.no_stealers());
        // A sequential entry and everything behind it stay; the concurrent
        // entries before it may go.
        q.push(3, false);
        q.push(4, true);
        q.push(7, false);
        assert_eq!(q.try_steal(1), Some(vec![3]));
        assert_eq!(q.try_steal(1), None, "the front is sequential now");
        q.steal_done(1);
        // Once the owner takes it, the exec flag protects what comes next.
        assert_eq!(q.take_all(), vec![(4, true), (7, false)]);
        q.push(5, false);
        assert_eq!(q.try_steal(1), None);
        // The next take clears the exec flag.
        assert_eq!(q.take_all(), vec![(5, false)]);
        q.push(6, false);
        assert_eq!(q.try_steal(1), Some(vec![6]));
        q.steal_done(1);
    }

    #[test]
    fn semi_blocked_stealers_avoid_conflicting_classes() {
        let q = WsQueue::new(2);
        q.push_with_classes(1u32, false, &[0b010]);
        assert_eq!(q.try_steal_avoiding(1, &[0b010]), None, "class 1 conflicts");
        assert_eq!(q.try_steal_avoiding(1, &[0b101]), Some(vec![1]));
        q.steal_done(1);
        // Stealing cleared the recorded classes.
        q.push_with_classes(2, false, &[0b100]);
        assert_eq!(q.try_steal_avoiding(1, &[0b010]), Some(vec![2]));
    }

    #[test]
    fn lock_free_hints_agree_with_the_locked_check() {
        let q = WsQueue::new(2);
        assert!(!q.may_steal(&[]), "empty");
        q.push_with_classes(1u32, false, &[0b001]);
        q.push_with_classes(2, false, &[0b100]);
        q.push_with_classes(3, true, &[0b010]);
        q.push_with_classes(4, false, &[0b1000]);
        // The prefix is 1 and 2: classes 0 and 2; entry 4's class is
        // behind the sequential entry and does not count.
        assert!(q.may_steal(&[0b1010]));
        assert!(!q.may_steal(&[0b100]), "class 2 is in the prefix");
        assert_eq!(q.try_steal_avoiding(1, &[0b1010]), Some(vec![1, 2]));
        assert!(!q.may_steal(&[]), "the front is sequential");
        q.steal_done(1);
        assert_eq!(q.take_all().len(), 2);
        q.push_with_classes(5, false, &[0b001]);
        assert!(!q.may_steal(&[]), "the exec batch holds a sequential command");
        assert_eq!(q.try_steal(1), None);
        assert!(q.take_all().len() == 1 && !q.may_steal(&[]));
        q.push_with_classes(6, false, &[0, 0b1]);
        assert!(q.may_steal(&[0b10]), "class 64 folds onto bit 0 and 0b10 is clear");
        assert!(!q.may_steal(&[0b1]), "folded: class 0 and class 64 look alike");
        assert_eq!(q.try_steal_avoiding(1, &[0b1]), Some(vec![6]), "the locked check is exact");
    }

    #[test]
    fn victims_are_visited_once_each_and_never_the_stealer() {
        let order: Vec<usize> = victim_order(2, 4, 3).collect();
        assert_eq!(order, vec![3, 0, 1]);
        let mut thief = Thief::new(1, 0);
        assert_eq!(thief.start(Victims::First, 4), 0);
        assert_eq!(thief.start(Victims::Next, 4), 2);
        for _ in 0..10 {
            assert!(thief.start(Victims::Random, 4) < 4);
        }
    }
}
