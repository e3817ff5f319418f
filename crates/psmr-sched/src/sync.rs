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

/// Waits until `done` holds without burning a core forever: `spin` rounds of
/// busy spinning (the busy-wait of 000 §6.1, which assumes a core per
/// worker), then up to 64 yields to other threads, then sleeps that double
/// from 8 µs to 256 µs and poll again. The sleeps need no wake-up: whoever
/// makes `done` true does not have to know that somebody waits.
#[cfg(not(loom))]
pub(crate) fn wait_until(spin: u32, done: impl Fn() -> bool) {
    for _ in 0..spin {
        if done() {
            return;
        }
        std::hint::spin_loop();
    }
    for _ in 0..64 {
        if done() {
            return;
        }
        std::thread::yield_now();
    }
    let mut nap = std::time::Duration::from_micros(8);
    while !done() {
        std::thread::sleep(nap);
        nap = (nap * 2).min(std::time::Duration::from_micros(256));
    }
}

/// Under loom every round of waiting is a yield, which loom schedules away
/// from until another thread has moved.
#[cfg(loom)]
pub(crate) fn wait_until(_spin: u32, done: impl Fn() -> bool) {
    while !done() {
        loom::thread::yield_now();
    }
}
