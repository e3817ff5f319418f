//! A pool of worker threads with one local queue each, a shared injector,
//! a yield queue, work stealing and parking (001 §4.4.1, §4.5).
//!
//! Where a task goes: spawned or woken on a worker of its own pool, into
//! that worker's local queue (or slot); from anywhere else, into the
//! pool's injector; woken by itself while it runs (a yield), into its
//! worker's soft-yield slot, or, when that slot is taken, into the pool's
//! yield queue (001 §4.5.3's fast "soft yield" and its global slow path).
//! A worker takes, in order: its slot (within its budget), its own queue
//! by its policy, a batch from the injector, a steal from its victims, the
//! yield queue, its soft-yield slot; and every few tasks it looks at the
//! yield queue and the injector first, so that neither starves. A worker
//! that finds anything else to run first moves its soft-yielded task to
//! the yield queue, where any worker can take it: a yielded task is kept
//! out of other workers' reach only while its own worker is free to run
//! it, and runs again only when that worker found nothing else, so yields
//! cannot livelock the pool. A ping-pong of yielding tasks thus stays on
//! each worker, off the shared queue.
//! With nothing found it parks on the pool's [`Signal`], which every
//! insertion notifies. A stopping pool's workers leave once no task is
//! queued and no worker is running one: a running task may still yield or
//! spawn work that only another worker is free to run.

use crate::config::{Full, Policy, PoolConfig, Steal, Victims};
use crate::shim::deque::{Injector, SegQueue, Steal as Stolen, Stealer, Worker};
use crate::stats::{Counters, PoolStats, WaitHistogram};
use crate::task::{Stamp, Task};
use crate::wait::{AtomicBool, Naps, Patience, Signal};
use crate::RtError;
use async_task::{Runnable, ScheduleInfo, WithInfo};
use crossbeam::utils::CachePadded;
use std::cell::{Cell, RefCell};
use std::future::Future;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// One task in this many queued by a thread has its queue wait timed.
pub const WAIT_SAMPLE: u64 = 8;

/// Slot tasks a worker runs in a row before it takes from its queue.
pub const SLOT_BUDGET: u32 = 3;

/// Every this many tasks a worker looks at the yield queue first.
const YIELD_EVERY: u64 = 31;

/// Every this many tasks a worker looks at the injector first.
const INJECT_EVERY: u64 = 61;

/// A job that never suspends: a closure, run once.
type Job = Box<dyn FnOnce() + Send>;

/// What queues hold.
pub(crate) enum Item {
    /// A future's task, with its stamp in its metadata.
    Task(Runnable<Stamp>),
    /// A job, with the time it was queued (ns since the pool started).
    Job(Job, u64),
}

/// What the workers of a pool share.
pub(crate) struct Shared {
    pub(crate) config: PoolConfig,
    injector: Injector<Item>,
    yields: SegQueue<Item>,
    stealers: Vec<Stealer<Item>>,
    signal: Signal,
    stopping: AtomicBool,
    /// Per worker, whether it is looking for a task or running one: while
    /// any is, a stopping pool's idle workers stay, since that task may
    /// yield or spawn work only another worker is free to run. One flag
    /// each, so that the hot path writes no shared line.
    busy: Vec<CachePadded<AtomicBool>>,
    epoch: Instant,
    pub(crate) counters: Vec<Counters>,
    pub(crate) waits: Vec<WaitHistogram>,
    /// Tasks spawned or woken from outside the pool.
    pub(crate) injected: std::sync::atomic::AtomicU64,
    /// Spawns refused because the pool stops.
    pub(crate) rejected: std::sync::atomic::AtomicU64,
    panics: Mutex<Vec<String>>,
}

#[cfg(loom)]
loom::thread_local! {
    static CURRENT: RefCell<Option<Rc<Local>>> = RefCell::new(None);
    static QUEUED: Cell<u64> = Cell::new(0);
}
#[cfg(not(loom))]
thread_local! {
    static CURRENT: RefCell<Option<Rc<Local>>> = const { RefCell::new(None) };
    /// Tasks this thread queued, for sampling their queue waits.
    static QUEUED: Cell<u64> = const { Cell::new(0) };
}

impl Shared {
    /// Nanoseconds since the pool started (at least 1).
    fn now_ns(&self) -> u64 {
        (self.epoch.elapsed().as_nanos() as u64).max(1)
    }

    /// The stamp of a task being queued: the time, for one task in
    /// [`WAIT_SAMPLE`] queued by this thread, else 0 (not timed). Reading
    /// the clock twice for every task would cost fine-grained tasks a few
    /// per cent.
    pub(crate) fn stamp(&self) -> u64 {
        let n = QUEUED.with(|q| {
            let n = q.get();
            q.set(n.wrapping_add(1));
            n
        });
        if n % WAIT_SAMPLE == 0 {
            self.now_ns()
        } else {
            0
        }
    }

    /// Queues `item`: on this pool's worker if the caller is one (its
    /// slot or queue; a yield in its soft-yield slot), else in the
    /// injector (a yield in the yield queue).
    fn schedule(self: &Arc<Self>, item: Item, yielded: bool) {
        if self.stopping.load(Ordering::Acquire) && !self.on_worker() {
            self.rejected.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let left = CURRENT.with(|c| match c.borrow().as_ref() {
            Some(local) if Arc::ptr_eq(&local.shared, self) => match yielded {
                true => local.soft_yield(item),
                false => {
                    local.push(item);
                    None
                }
            },
            _ => Some(item),
        });
        let Some(item) = left else { return };
        if yielded {
            self.yields.push(item);
        } else {
            self.injected.fetch_add(1, Ordering::Relaxed);
            self.injector.push(item);
        }
        self.signal.notify_one();
    }

    /// Whether some worker is looking for a task or running one.
    fn any_busy(&self) -> bool {
        self.busy.iter().any(|b| b.load(Ordering::SeqCst))
    }

    /// Whether the pool stops and no worker may still make work.
    fn done(&self) -> bool {
        self.stopping.load(Ordering::SeqCst) && !self.any_busy()
    }

    /// Whether the calling thread is a worker of this pool.
    pub(crate) fn on_worker(self: &Arc<Self>) -> bool {
        CURRENT.with(|c| c.borrow().as_ref().is_some_and(|l| Arc::ptr_eq(&l.shared, self)))
    }

    /// Whether any queue another worker could take from holds a task.
    fn has_work(&self) -> bool {
        !self.injector.is_empty() || !self.yields.is_empty() || self.stealers.iter().any(|s| !s.is_empty())
    }

    fn panicked(&self, message: String) {
        tracing::error!(pool = %self.config.name, "a task panicked: {message}");
        self.panics.lock().unwrap_or_else(|e| e.into_inner()).push(message);
    }
}

/// A handle on a pool, for spawning into it from anywhere (another pool's
/// task included: staged composition, 001 §4.4.2). Cheap to clone.
#[derive(Clone)]
pub struct Handle {
    pub(crate) shared: Arc<Shared>,
}

impl std::fmt::Debug for Handle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Handle({})", self.shared.config.name)
    }
}

impl Handle {
    /// The pool's name.
    pub fn name(&self) -> &str {
        &self.shared.config.name
    }

    /// Its settings.
    pub fn config(&self) -> &PoolConfig {
        &self.shared.config
    }

    /// Runs `future` on the pool. The task runs whether or not anybody
    /// awaits the returned [`Task`] (an eager promise, 001 §4.5.4).
    pub fn spawn<F>(&self, future: F) -> Task<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let shared = self.shared.clone();
        let schedule = move |runnable: Runnable<Stamp>, info: ScheduleInfo| {
            runnable.metadata().set(shared.stamp());
            shared.schedule(Item::Task(runnable), info.woken_while_running);
        };
        let (runnable, task) =
            async_task::Builder::new().metadata(Stamp::default()).spawn(move |_| future, WithInfo(schedule));
        runnable.schedule();
        Task::new(task, self.shared.clone())
    }

    /// Runs `job` on the pool: a closure that never suspends, with no
    /// future, no waker and no result (cheaper than [`Handle::spawn`]).
    pub fn spawn_fn(&self, job: impl FnOnce() + Send + 'static) {
        self.shared.schedule(Item::Job(Box::new(job), self.shared.stamp()), false);
    }

    /// The pool whose worker runs the caller, if any.
    pub fn current() -> Option<Handle> {
        CURRENT.with(|c| c.borrow().as_ref().map(|l| Handle { shared: l.shared.clone() }))
    }

    /// The index of the worker of this pool that runs the caller (`0` to
    /// `workers - 1`), if a worker of this pool runs it.
    pub fn worker_index(&self) -> Option<usize> {
        CURRENT.with(|c| c.borrow().as_ref().filter(|l| Arc::ptr_eq(&l.shared, &self.shared)).map(|l| l.index))
    }

    /// Its counters and queue-wait histogram so far.
    pub fn stats(&self) -> PoolStats {
        PoolStats::of(&self.shared)
    }

    /// What the pool's tasks panicked with, in order.
    pub fn panics(&self) -> Vec<String> {
        self.shared.panics.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// A running pool: its threads, stopped and joined by
/// [`Pool::shutdown`] or on drop. Spawn through it (it derefs to its
/// [`Handle`]) or through a handle.
pub struct Pool {
    handle: Handle,
    threads: Vec<crate::shim::JoinHandle>,
}

impl std::ops::Deref for Pool {
    type Target = Handle;

    fn deref(&self) -> &Handle {
        &self.handle
    }
}

impl Pool {
    /// Starts a pool of `config.workers` threads.
    pub fn start(config: PoolConfig) -> Result<Pool, RtError> {
        config.validate()?;
        let queues: Vec<Worker<Item>> = (0..config.workers)
            .map(|_| if config.policy.is_lifo() { Worker::new_lifo() } else { Worker::new_fifo() })
            .collect();
        let shared = Arc::new(Shared {
            injector: Injector::new(),
            yields: SegQueue::new(),
            stealers: queues.iter().map(Worker::stealer).collect(),
            signal: Signal::new(),
            stopping: AtomicBool::new(false),
            busy: (0..config.workers).map(|_| CachePadded::new(AtomicBool::new(false))).collect(),
            epoch: Instant::now(),
            counters: (0..config.workers).map(|_| Counters::default()).collect(),
            waits: (0..config.workers).map(|_| WaitHistogram::new()).collect(),
            injected: Default::default(),
            rejected: Default::default(),
            panics: Mutex::new(Vec::new()),
            config,
        });
        let mut pool = Pool { handle: Handle { shared: shared.clone() }, threads: Vec::new() };
        for (index, queue) in queues.into_iter().enumerate() {
            let local = Local::new(shared.clone(), index, queue);
            let name = format!("rt-{}-{index}", shared.config.name);
            let thread = crate::shim::spawn(name, move || local.run()).map_err(RtError::Thread)?;
            pool.threads.push(thread);
        }
        Ok(pool)
    }

    /// A handle for spawning into the pool from elsewhere.
    pub fn handle(&self) -> Handle {
        self.handle.clone()
    }

    /// Lets the workers run every task queued so far (and those these
    /// spawn), then stops and joins them; refuses spawns from outside the
    /// pool from now on. The pool's final counters, or the panics of its
    /// tasks.
    pub fn shutdown(mut self) -> Result<PoolStats, RtError> {
        self.stop();
        let panics = self.panics();
        if !panics.is_empty() {
            return Err(RtError::Panicked { pool: self.name().to_string(), messages: panics });
        }
        Ok(self.stats())
    }

    fn stop(&mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        self.shared.signal.notify_all();
        for t in std::mem::take(&mut self.threads) {
            if t.join().is_err() {
                self.shared.panicked("a worker thread panicked outside any task".into());
            }
        }
        // What a stopping pool refused, or a task woke too late, is
        // dropped here: its awaiters see it cancelled.
        while !self.shared.injector.is_empty() {
            let _ = self.shared.injector.steal();
        }
        while self.shared.yields.pop().is_some() {}
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.stop();
    }
}

/// What one look for a task came to.
enum Look {
    /// A task ran.
    Ran,
    /// Nothing to run: wait for work.
    Nothing,
    /// Nothing to run, ever: the pool stops and nobody can make work.
    Leave,
}

/// One worker's own state, on its thread only.
struct Local {
    shared: Arc<Shared>,
    index: usize,
    queue: Worker<Item>,
    /// The worker's own queue seen as a thief sees it: its oldest task.
    own: Stealer<Item>,
    /// The workers it steals from, by index (set once: every other
    /// worker, or its neighbourhood).
    victims: Vec<usize>,
    slot: Cell<Option<Item>>,
    slot_run: Cell<u32>,
    /// A task that yielded on this worker, run again when the worker finds
    /// nothing else.
    soft: Cell<Option<Item>>,
    tick: Cell<u64>,
    rng: Cell<u64>,
    /// LIFO heuristics: the next removal is FIFO (alternating), and FIFO
    /// removals still owed (reverse) and tasks since the last reversal.
    flip: Cell<bool>,
    owed: Cell<usize>,
    since: Cell<u32>,
}

impl Local {
    fn new(shared: Arc<Shared>, index: usize, queue: Worker<Item>) -> Self {
        let seed = shared.config.seed ^ (index as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let n = shared.config.workers;
        let victims = match shared.config.victims {
            Victims::Random => (1..n).map(|d| (index + d) % n).collect(),
            Victims::Neighbourhood(k) => neighbours(index, n, k),
        };
        Local {
            victims,
            own: queue.stealer(),
            queue,
            slot: Cell::new(None),
            slot_run: Cell::new(0),
            soft: Cell::new(None),
            tick: Cell::new(0),
            rng: Cell::new(seed | 1),
            flip: Cell::new(false),
            owed: Cell::new(0),
            since: Cell::new(0),
            shared,
            index,
        }
    }

    fn counters(&self) -> &Counters {
        &self.shared.counters[self.index]
    }

    fn random(&self) -> u64 {
        // xorshift64: victims and self-steals need no more.
        let mut x = self.rng.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng.set(x);
        x
    }

    fn run(self) {
        let me = Rc::new(self);
        CURRENT.with(|c| *c.borrow_mut() = Some(me.clone()));
        loop {
            match me.look() {
                Look::Ran => {}
                Look::Nothing => me.idle(),
                Look::Leave => break,
            }
        }
        CURRENT.with(|c| *c.borrow_mut() = None);
    }

    /// Takes a task and runs it, flagged busy from before the look, so that
    /// no other worker of a stopping pool leaves while this one may still
    /// make work. The worker leaves when the pool was stopping before a
    /// look that found nothing (so the look saw every task queued before
    /// the stop) and no other worker is busy.
    fn look(&self) -> Look {
        let (shared, busy) = (&self.shared, &self.shared.busy[self.index]);
        let stopping = shared.stopping.load(Ordering::SeqCst);
        busy.store(true, Ordering::SeqCst);
        let found = self.next();
        let ran = found.is_some();
        if let Some(item) = found {
            self.execute(item);
        }
        busy.store(false, Ordering::SeqCst);
        if !shared.stopping.load(Ordering::SeqCst) || shared.any_busy() {
            return if ran { Look::Ran } else { Look::Nothing };
        }
        // Idle workers of a stopping pool wait for the last busy one.
        shared.signal.notify_all();
        match (ran, stopping) {
            (true, _) => Look::Ran,
            (false, true) => Look::Leave,
            (false, false) => Look::Nothing,
        }
    }

    /// A task from the worker's own (slot within budget, or queue).
    fn push(&self, item: Item) {
        let item = match self.shared.config.policy {
            Policy::FifoSlot => match self.slot.replace(Some(item)) {
                Some(previous) => previous,
                None => return,
            },
            _ => item,
        };
        self.enqueue(item);
    }

    /// Keeps a yielded task in the soft-yield slot, or hands it back for
    /// the pool's yield queue when the slot is taken.
    fn soft_yield(&self, item: Item) -> Option<Item> {
        match self.soft.take() {
            None => {
                self.soft.set(Some(item));
                None
            }
            Some(kept) => {
                self.soft.set(Some(kept));
                Some(item)
            }
        }
    }

    /// Into the local queue, which overflows or grows when full; thieves
    /// may take it, so a sleeper is woken.
    fn enqueue(&self, item: Item) {
        if self.queue.len() >= self.shared.config.capacity {
            match self.shared.config.full {
                Full::Overflow => self.overflow(),
                Full::Resize => Counters::add(&self.counters().resizes, 1),
            }
        }
        self.queue.push(item);
        self.shared.signal.notify_one();
    }

    /// Moves the older half of the local queue to the injector.
    fn overflow(&self) {
        let mut moved = 0u64;
        while moved < (self.shared.config.capacity / 2) as u64 {
            match self.own.steal() {
                Stolen::Success(item) => {
                    self.shared.injector.push(item);
                    moved += 1;
                }
                Stolen::Empty => break,
                Stolen::Retry => {}
            }
        }
        Counters::add(&self.counters().overflows, 1);
        Counters::add(&self.counters().overflowed, moved);
    }

    /// The next task to run; a soft-yielded task only if there is no
    /// other, the pool's other yielded tasks included, and if there is,
    /// the soft one goes where others can take it. (Run before the yield
    /// queue, a task spinning on `yield_now` would take all but one turn
    /// in [`YIELD_EVERY`] from the tasks yielded before it.)
    fn next(&self) -> Option<Item> {
        let found = self.next_other().or_else(|| self.shared.yields.pop());
        match found {
            None => self.soft.take(),
            found => {
                if let Some(kept) = self.soft.take() {
                    self.shared.yields.push(kept);
                    self.shared.signal.notify_one();
                }
                found
            }
        }
    }

    /// The next task other than the soft-yielded one.
    fn next_other(&self) -> Option<Item> {
        let tick = self.tick.get() + 1;
        self.tick.set(tick);
        if tick % YIELD_EVERY == 0 {
            if let Some(item) = self.shared.yields.pop() {
                return Some(item);
            }
        }
        if tick % INJECT_EVERY == 0 {
            if let Some(item) = self.take_injected() {
                return Some(item);
            }
        }
        self.take_own().or_else(|| self.take_injected()).or_else(|| self.steal())
    }

    fn take_own(&self) -> Option<Item> {
        if !matches!(self.shared.config.policy, Policy::FifoSlot) && self.queue.is_empty() {
            // The heuristics count turns that took a task: an idle
            // worker's looks must not move them.
            return None;
        }
        match self.shared.config.policy {
            Policy::FifoSlot => {
                if let Some(item) = self.slot.take() {
                    if self.slot_run.get() < SLOT_BUDGET {
                        self.slot_run.set(self.slot_run.get() + 1);
                        return Some(item);
                    }
                    // Over budget: behind the queue's older tasks it goes.
                    self.enqueue(item);
                }
                self.slot_run.set(0);
                self.queue.pop()
            }
            Policy::Fifo | Policy::Lifo => self.queue.pop(),
            Policy::LifoAlternate => {
                self.flip.set(!self.flip.get());
                if self.flip.get() {
                    self.oldest()
                } else {
                    self.queue.pop()
                }
            }
            Policy::LifoStochastic(p) => {
                if (self.random() >> 11) as f64 / (1u64 << 53) as f64 <= p {
                    self.oldest()
                } else {
                    self.queue.pop()
                }
            }
            Policy::LifoReverse(n) => {
                if self.owed.get() == 0 {
                    // Every n-th turn starts a reversal: as many oldest-first
                    // turns as the stack holds, this one included.
                    self.since.set(self.since.get() + 1);
                    if self.since.get() >= n {
                        self.since.set(0);
                        self.owed.set(self.queue.len());
                    }
                }
                if self.owed.get() > 0 {
                    self.owed.set(self.owed.get() - 1);
                    return self.oldest();
                }
                self.queue.pop()
            }
        }
    }

    /// The oldest task of the worker's own stack: a FIFO removal.
    fn oldest(&self) -> Option<Item> {
        loop {
            match self.own.steal() {
                Stolen::Success(item) => return Some(item),
                Stolen::Empty => return None,
                Stolen::Retry => {}
            }
        }
    }

    fn take_injected(&self) -> Option<Item> {
        loop {
            let got = match self.shared.config.steal {
                Steal::Half => self.shared.injector.steal_batch_and_pop(&self.queue),
                Steal::One => self.shared.injector.steal(),
            };
            match got {
                Stolen::Success(item) => return Some(item),
                Stolen::Empty => return None,
                Stolen::Retry => {}
            }
        }
    }

    /// How many tasks a steal-half may take: half the victim's queue,
    /// however long (crossbeam's own batch stops at 32, which leaves a
    /// thief holding the victim's 32 oldest tasks of thousands), but no
    /// more than the thief's queue holds before it would overflow.
    fn room(&self) -> usize {
        match self.shared.config.full {
            Full::Resize => usize::MAX,
            Full::Overflow => self.shared.config.capacity.saturating_sub(self.queue.len()).max(1),
        }
    }

    /// Tries each victim once (twice if it was busy).
    fn steal(&self) -> Option<Item> {
        let candidates = &self.victims;
        if candidates.is_empty() {
            return None;
        }
        let start = self.random() as usize % candidates.len();
        for i in 0..candidates.len() {
            let victim = &self.shared.stealers[candidates[(start + i) % candidates.len()]];
            for _ in 0..2 {
                Counters::add(&self.counters().steals_tried, 1);
                let got = match self.shared.config.steal {
                    Steal::Half => victim.steal_batch_with_limit_and_pop(&self.queue, self.room()),
                    Steal::One => victim.steal(),
                };
                match got {
                    Stolen::Success(item) => {
                        Counters::add(&self.counters().steals_ok, 1);
                        Counters::add(&self.counters().stolen, 1 + self.queue.len() as u64);
                        return Some(item);
                    }
                    Stolen::Empty => break,
                    Stolen::Retry => {}
                }
            }
        }
        None
    }

    fn execute(&self, item: Item) {
        let stamp = match &item {
            Item::Task(r) => r.metadata().get(),
            Item::Job(_, at) => *at,
        };
        if stamp != 0 {
            self.shared.waits[self.index].record(self.shared.now_ns().saturating_sub(stamp));
        }
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match item {
            Item::Task(r) => {
                r.run();
            }
            Item::Job(job, _) => job(),
        }));
        Counters::add(&self.counters().tasks_run, 1);
        if let Err(payload) = outcome {
            let message = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic with no message".into());
            self.shared.panicked(message);
        }
    }

    /// Waits for work anywhere in the pool, or for the pool to stop.
    fn idle(&self) {
        let shared = &self.shared;
        let done = || shared.has_work() || shared.done();
        let mut patience = Patience::brief();
        while !done() {
            if patience.tired() {
                Counters::add(&self.counters().parks, 1);
            }
            patience.snooze(&shared.signal, Naps::Notified, &done);
        }
    }
}

/// The `k` workers nearest to `me` in a ring of `n`: `+1, -1, +2, -2, ...`.
fn neighbours(me: usize, n: usize, k: usize) -> Vec<usize> {
    let mut out = Vec::with_capacity(k.min(n.saturating_sub(1)));
    let mut d = 1;
    while out.len() < k.min(n - 1) {
        for cand in [(me + d) % n, (me + n - d % n) % n] {
            if cand != me && !out.contains(&cand) && out.len() < k {
                out.push(cand);
            }
        }
        d += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::neighbours;

    #[test]
    fn neighbourhoods_are_the_nearest_in_the_ring() {
        assert_eq!(neighbours(0, 8, 2), [1, 7]);
        assert_eq!(neighbours(3, 8, 3), [4, 2, 5]);
        assert_eq!(neighbours(0, 2, 4), [1]);
        assert!(neighbours(0, 1, 4).is_empty());
    }
}
