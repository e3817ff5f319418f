//! Synchronization primitives, swapped for loom's under `--cfg loom` so the
//! protocols built on them can be model-checked.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::AtomicU64;
#[cfg(loom)]
pub(crate) use loom::sync::{Condvar, Mutex};

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::AtomicU64;
#[cfg(not(loom))]
pub(crate) use std::sync::{Condvar, Mutex};

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
