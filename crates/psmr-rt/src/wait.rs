//! How a thread waits: spin, yield, then sleep until notified. One
//! mechanism for psmr's worker pools (the execution schedulers of
//! psmr-sched and the task pools of this crate).
//!
//! A waiting thread first waits actively, then sleeps ([`Patience`]): it
//! spins for a budget of rounds (the busy-wait of 000 §6.1, which pays off
//! when every thread has a core), then yields its core a few times, then
//! sleeps on a [`Signal`] until the thread that ends the wait notifies it.
//! Where a wait can also end without a notification (a chance to steal
//! appears when some other worker's queue fills), the sleeps are naps that
//! double up to a cap, and the waiter polls between them.
//!
//! The primitives are swapped for loom's under `--cfg loom`, so the
//! protocols built on them can be model-checked; psmr-sched's
//! `tests/loom_signal.rs` checks that a [`Signal`] loses no wake-up, and
//! this crate's `tests/loom_rt.rs` that an idle worker misses no task.

#[cfg(loom)]
pub use loom::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicUsize};
#[cfg(loom)]
pub use loom::sync::{Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard};

#[cfg(not(loom))]
pub use std::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicUsize};
#[cfg(not(loom))]
pub use std::sync::{Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard};

use std::sync::atomic::Ordering;
use std::time::Duration;

/// Spin rounds of a brief wait ([`Patience::brief`]): about what crossbeam's
/// `Backoff` spins before it yields.
const BRIEF_SPIN: u32 = 128;
/// Yields of a brief wait before it sleeps.
const BRIEF_YIELDS: u32 = 4;
/// Yields of a wait with a spin budget before it sleeps.
const YIELDS: u32 = 64;

/// How a sleeping waiter learns that its wait may be over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Naps {
    /// Whoever ends the wait notifies the signal: sleep until then.
    Notified,
    /// The wait may end without a notification: sleep at most `first`,
    /// then twice as long each time, up to `cap`, polling in between (a
    /// notification still ends a nap early).
    Capped {
        /// The first nap.
        first: Duration,
        /// The longest nap.
        cap: Duration,
    },
}

/// The waiting policy, one step at a time (see the module documentation).
#[derive(Debug)]
pub struct Patience {
    spin: u32,
    yields: u32,
    step: u32,
    nap: Option<Duration>,
}

impl Patience {
    /// Spin `spin` rounds, then yield 64 times, then sleep: the waits of
    /// the busy-waiting schedulers, whose spin budget is a setting.
    pub fn new(spin: u32) -> Self {
        Self { spin, yields: YIELDS, step: 0, nap: None }
    }

    /// A short spin and a few yields before sleeping: for waits that are
    /// usually over within microseconds (a barrier whose parties arrive
    /// together, a queue with room again), where a sleep and a wake-up per
    /// wait would cost more than the wait.
    pub fn brief() -> Self {
        Self { spin: BRIEF_SPIN, yields: BRIEF_YIELDS, step: 0, nap: None }
    }

    /// Spin `spin` rounds, then yield `yields` times, then sleep.
    pub fn with_yields(spin: u32, yields: u32) -> Self {
        Self { spin, yields, step: 0, nap: None }
    }

    /// True while the wait has not gone past its spin budget: a wait
    /// that ends now ended by spinning.
    pub fn spinning(&self) -> bool {
        self.step < self.spin
    }

    /// True once spinning and yielding are over: the next step sleeps.
    pub fn tired(&self) -> bool {
        self.step >= self.spin.saturating_add(self.yields)
    }

    /// Progress was made: start again from spinning.
    pub fn reset(&mut self) {
        self.step = 0;
        self.nap = None;
    }

    /// Waits one step: a spin, a yield, or a sleep on `signal` that ends
    /// when `done` holds (see [`Naps`]).
    pub fn snooze(&mut self, signal: &Signal, naps: Naps, done: &impl Fn() -> bool) {
        if !self.tired() {
            self.active_step();
            return;
        }
        match naps {
            Naps::Notified => signal.sleep(done, None),
            Naps::Capped { first, cap } => {
                let nap = self.nap.map_or(first, |n| (n * 2).min(cap));
                self.nap = Some(nap);
                signal.sleep(done, Some(nap));
            }
        }
    }

    #[cfg(not(loom))]
    fn active_step(&mut self) {
        if self.step < self.spin {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
        self.step += 1;
    }

    /// Under loom one yield stands for the whole active phase: it explores
    /// both outcomes (the wait ended while spinning, or the thread goes on
    /// to sleep) without an unbounded state space.
    #[cfg(loom)]
    fn active_step(&mut self) {
        loom::thread::yield_now();
        self.step = self.spin.saturating_add(self.yields);
    }
}

/// Smallest budget of an [`AdaptiveSpin`]: a few hundred nanoseconds, so
/// that a thread whose partners start arriving at once again finds out.
pub const ADAPTIVE_SPIN_MIN: u32 = 32;
/// Spin rounds per yield of an [`AdaptiveSpin`]'s waits: 2 000 rounds
/// come with 62 yields (what [`Patience::new`] gives), the floor with one.
const SPINS_PER_YIELD: u32 = 32;

/// A budget of active waiting (spins, then yields) that follows whether
/// it pays, for one thread's waits of one kind (000 §6.1: busy-waiting
/// pays only while the awaited thread runs on another core).
///
/// Each wait starts with the current budget. A wait that ends while
/// still spinning doubles it (up to the configured most); any other
/// halves it (down to [`ADAPTIVE_SPIN_MIN`]): a wait that a yield ended
/// was won by giving the core away, which the spinning did not help. Where the threads have
/// cores of their own, partners arrive within the spin and the budget
/// stays at its most; where they share cores (more threads than cores, a
/// CPU quota, other processes), the awaited thread is usually not
/// running, and a yield hands the core to some other process's thread:
/// in the 3-replica main job on 2 cores, `early`'s workers spent half
/// their CPU time in `sched_yield` and its context switches. There the
/// waits fail, and within a few of them the thread spins a few hundred
/// nanoseconds and yields once before it sleeps: the active waiting the
/// machine cannot use is not spent. The measure is the outcome of the
/// waits themselves, so it needs no reading of the kernel's counters.
#[derive(Clone, Copy, Debug)]
pub struct AdaptiveSpin {
    budget: u32,
    max: u32,
}

impl AdaptiveSpin {
    /// Starts at `max`, the most it will spin.
    pub fn new(max: u32) -> Self {
        Self { budget: max, max }
    }

    /// The budget now.
    pub fn budget(&self) -> u32 {
        self.budget
    }

    /// The patience of the next wait.
    pub fn patience(&self) -> Patience {
        Patience::with_yields(self.budget, self.budget.div_ceil(SPINS_PER_YIELD))
    }

    /// The patience of the next wait when the cores are `contended` (more
    /// runnable threads than cores): no spinning and no yielding at all,
    /// since the awaited thread may be queued for the very core a spinner
    /// holds; otherwise [`AdaptiveSpin::patience`]. A wait that did not
    /// spin teaches nothing.
    pub fn patience_if(&self, contended: bool) -> Patience {
        if contended {
            Patience::with_yields(0, 0)
        } else {
            self.patience()
        }
    }

    /// Learns from a wait that just ended with `patience`.
    pub fn learn(&mut self, patience: &Patience) {
        if patience.spin == 0 && patience.yields == 0 {
            return;
        }
        let floor = ADAPTIVE_SPIN_MIN.min(self.max);
        self.budget = if patience.spinning() {
            self.budget.saturating_mul(2).clamp(floor, self.max)
        } else {
            (self.budget / 2).max(floor)
        };
    }
}

/// Where waiting threads sleep and are woken: an event count.
///
/// A waiter that has waited actively long enough registers as a sleeper,
/// checks its condition once more and sleeps on a condition variable. A
/// thread that may have ended somebody's wait publishes what it changed,
/// then calls [`Signal::notify_one`] or [`Signal::notify_all`], which cost
/// one fence and one load when nobody sleeps. No wake-up is lost: the
/// sleeper's registration and the notifier's publication are each followed
/// by a sequentially consistent fence, so either the notifier sees the
/// sleeper, or the sleeper sees the change before it sleeps; and the
/// notifier takes the lock before it notifies, so the sleeper is either
/// still before its last check (which then sees the change) or already
/// waiting.
///
/// A signal can be *abandoned* ([`Signal::abandon`]) when the thread that
/// would end its waits is gone (a worker died): every wait on it ends at
/// once, now and later, whether or not its condition holds, and the
/// waiter asks [`Signal::abandoned`] to tell the two apart. Abandoning is
/// a change published like any other, so no sleeper misses it.
#[derive(Debug, Default)]
pub struct Signal {
    sleepers: AtomicUsize,
    abandoned: AtomicBool,
    lock: Mutex<()>,
    cvar: Condvar,
}

impl Signal {
    /// A signal nobody sleeps on yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Waits until `done` holds, with `patience`, sleeping as `naps` says;
    /// or until the signal is abandoned. Returns the patience, which says
    /// how the wait ended (for [`AdaptiveSpin::learn`]).
    pub fn wait_until(&self, mut patience: Patience, naps: Naps, done: impl Fn() -> bool) -> Patience {
        while !done() && !self.abandoned() {
            patience.snooze(self, naps, &done);
        }
        patience
    }

    /// Nobody will end the waits on this signal (the thread that would is
    /// gone): wakes every sleeper, and every wait, now or later, ends at
    /// once.
    pub fn abandon(&self) {
        self.abandoned.store(true, Ordering::Release);
        self.notify_all();
    }

    /// Whether [`Signal::abandon`] was called: a wait that ended without
    /// its condition ended for that.
    pub fn abandoned(&self) -> bool {
        self.abandoned.load(Ordering::Acquire)
    }

    /// Wakes one sleeper, if any; call after publishing the change.
    pub fn notify_one(&self) {
        if self.has_sleepers() {
            drop(self.lock());
            self.cvar.notify_one();
        }
    }

    /// Wakes every sleeper, if any; call after publishing the change.
    pub fn notify_all(&self) {
        if self.has_sleepers() {
            drop(self.lock());
            self.cvar.notify_all();
        }
    }

    fn has_sleepers(&self) -> bool {
        fence(Ordering::SeqCst);
        self.sleepers.load(Ordering::Relaxed) > 0
    }

    fn lock(&self) -> MutexGuard<'_, ()> {
        // The lock guards no data; a panic elsewhere cannot break it.
        self.lock.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sleeps until `done` holds (or, with a nap, at most that long).
    fn sleep(&self, done: &impl Fn() -> bool, nap: Option<Duration>) {
        self.sleepers.fetch_add(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        let mut guard = self.lock();
        if !done() && !self.abandoned() {
            guard = match nap {
                None => self.cvar.wait(guard).unwrap_or_else(|e| e.into_inner()),
                Some(nap) => self.nap(guard, nap),
            };
        }
        drop(guard);
        self.sleepers.fetch_sub(1, Ordering::Relaxed);
    }

    #[cfg(not(loom))]
    fn nap<'a>(&self, guard: MutexGuard<'a, ()>, nap: Duration) -> MutexGuard<'a, ()> {
        self.cvar.wait_timeout(guard, nap).map_or_else(|e| e.into_inner().0, |(g, _)| g)
    }

    /// Loom has no timeouts: a nap is a yield, and the caller polls.
    #[cfg(loom)]
    fn nap<'a>(&'a self, guard: MutexGuard<'a, ()>, _nap: Duration) -> MutexGuard<'a, ()> {
        drop(guard);
        loom::thread::yield_now();
        self.lock()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    #[test]
    fn patience_spins_then_yields_then_is_tired_and_starts_over_on_reset() {
        let mut p = Patience::new(3);
        let signal = Signal::new();
        for _ in 0..3 + YIELDS {
            assert!(!p.tired());
            p.snooze(&signal, Naps::Notified, &|| true);
        }
        assert!(p.tired());
        p.reset();
        assert!(!p.tired());
    }

    #[test]
    fn a_sleeper_is_woken_by_a_notification() {
        let signal = Arc::new(Signal::new());
        let flag = Arc::new(AtomicBool::new(false));
        let (s, f) = (signal.clone(), flag.clone());
        let waiter =
            std::thread::spawn(move || s.wait_until(Patience::new(0), Naps::Notified, || f.load(Ordering::Acquire)));
        flag.store(true, Ordering::Release);
        signal.notify_all();
        waiter.join().unwrap();
    }

    #[test]
    fn abandoning_a_signal_ends_a_wait_whose_condition_never_holds() {
        let signal = Arc::new(Signal::new());
        let s = signal.clone();
        let waiter = std::thread::spawn(move || {
            s.wait_until(Patience::new(0), Naps::Notified, || false);
            s.abandoned()
        });
        assert!(!signal.abandoned());
        signal.abandon();
        assert!(waiter.join().unwrap(), "the wait ended because the signal was abandoned");
    }

    #[test]
    fn an_adaptive_spin_halves_on_vain_spins_and_doubles_on_quick_waits() {
        let signal = Signal::new();
        let mut spin = AdaptiveSpin::new(1024);
        let spin_of = |budget: u32| AdaptiveSpin { budget, max: 1024 };
        // A wait that spins and yields its whole budget, in vain.
        let vain = |budget: u32| {
            let mut p = spin_of(budget).patience();
            while !p.tired() {
                p.snooze(&signal, Naps::Notified, &|| true);
            }
            p
        };
        for expected in [512, 256, 128, 64, 32, 32] {
            spin.learn(&vain(spin.budget()));
            assert_eq!(spin.budget(), expected);
        }
        // Waits that end at once.
        for expected in [64, 128, 256, 512, 1024, 1024] {
            spin.learn(&spin.patience());
            assert_eq!(spin.budget(), expected);
        }
        // Yields follow the spins: 1 024 rounds come with 32.
        assert_eq!(spin.patience().yields, 32);
        // A budget set below the floor is kept.
        let mut tiny = AdaptiveSpin::new(0);
        tiny.learn(&tiny.patience());
        assert_eq!(tiny.budget(), 0);
    }

    #[test]
    fn capped_naps_double_and_end_without_a_notification() {
        let mut p = Patience::new(0);
        let signal = Signal::new();
        let naps = Naps::Capped { first: Duration::from_micros(1), cap: Duration::from_micros(4) };
        for _ in 0..YIELDS {
            p.snooze(&signal, naps, &|| false);
        }
        for expected in [1, 2, 4, 4] {
            p.snooze(&signal, naps, &|| false);
            assert_eq!(p.nap, Some(Duration::from_micros(expected)));
        }
    }
}
