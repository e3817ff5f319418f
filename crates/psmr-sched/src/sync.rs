//! Synchronization primitives, swapped for loom's under `--cfg loom` so the
//! protocols built on them can be model-checked.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
#[cfg(loom)]
pub(crate) use loom::sync::{Condvar, Mutex, MutexGuard};

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
#[cfg(not(loom))]
pub(crate) use std::sync::{Condvar, Mutex, MutexGuard};

/// Spins, then yields, for a bounded time (crossbeam's `Backoff`: a few
/// microseconds) until `done` holds. Returns whether it did. The caller
/// blocks if it did not, so a waiting thread never burns a core for long.
#[cfg(not(loom))]
pub(crate) fn backoff_until(done: impl Fn() -> bool) -> bool {
    let backoff = crossbeam::utils::Backoff::new();
    while !backoff.is_completed() {
        if done() {
            return true;
        }
        backoff.snooze();
    }
    done()
}

/// Under loom a spin is one yield: enough to explore both outcomes (the
/// condition became true while spinning, or the thread goes on to block)
/// without an unbounded state space.
#[cfg(loom)]
pub(crate) fn backoff_until(done: impl Fn() -> bool) -> bool {
    loom::thread::yield_now();
    done()
}

/// The waiting policy of the busy-waiting schedulers, one step at a time:
/// `spin` rounds of busy spinning (the busy-wait of 000 §6.1, which
/// assumes a core per worker), then up to 64 yields to other threads, then
/// sleeps that double from 8 µs to 256 µs. A waiter polls between steps, so
/// the sleeps need no wake-up: whoever ends the wait does not have to know
/// that somebody waits.
pub(crate) struct Patience {
    spin: u32,
    step: u32,
    nap_us: u64,
}

impl Patience {
    pub(crate) fn new(spin: u32) -> Self {
        Self { spin, step: 0, nap_us: 8 }
    }

    /// Waits one step, longer as the wait goes on.
    #[cfg(not(loom))]
    pub(crate) fn snooze(&mut self) {
        if self.step < self.spin {
            std::hint::spin_loop();
        } else if self.step - self.spin < 64 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(std::time::Duration::from_micros(self.nap_us));
            self.nap_us = (self.nap_us * 2).min(256);
        }
        self.step = self.step.saturating_add(1);
    }

    /// Under loom every step is a yield, which loom schedules away from
    /// until another thread has moved.
    #[cfg(loom)]
    pub(crate) fn snooze(&mut self) {
        loom::thread::yield_now();
    }

    /// True once spinning and yielding are over: the next steps nap.
    pub(crate) fn tired(&self) -> bool {
        self.step >= self.spin.saturating_add(64)
    }

    /// Progress was made: start again from spinning.
    pub(crate) fn reset(&mut self) {
        self.step = 0;
        self.nap_us = 8;
    }
}

/// Waits until `done` holds, with [`Patience`].
pub(crate) fn wait_until(spin: u32, done: impl Fn() -> bool) {
    let mut patience = Patience::new(spin);
    while !done() {
        patience.snooze();
    }
}
