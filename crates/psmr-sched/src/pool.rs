//! The worker pool every parallel scheduler runs on: how its threads
//! start, learn that no more work comes, and are joined, and how the
//! scheduler thread waits for room in a worker's queue.
//!
//! One mechanism for every scheduler is what lets a replica swap
//! schedulers and resize pools at run time ([`crate::Switchable`]): each
//! one drains, stops and reports in the same way.

use crate::exec::{stats_of, Executor};
use crate::sync::AtomicUsize;
use crate::sync::{Naps, Patience, Signal};
use crate::{SchedError, SchedStats};
use crossbeam::utils::CachePadded;
use psmr_model::Service;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;

/// What the workers of a pool share: the part that tells them to stop.
pub(crate) trait Crew: Send + Sync + 'static {
    /// No more work will come: each worker finishes what it holds and
    /// returns. Called once, by the pool.
    fn close(&self);

    /// A worker died outside the service (its [`Failure`] says which):
    /// what it held is never given back, so every wait of the crew's
    /// threads and of the scheduler thread must end. Abandons every
    /// [`crate::Signal`] they wait on; each waiter then finds the failure
    /// and gives up (a worker returns, `submit` and `finish` report it).
    fn abandon(&self);
}

/// The threads of one scheduler, sharing `crew`.
pub(crate) struct Pool<C: Crew> {
    crew: Arc<C>,
    handles: Vec<JoinHandle<u64>>,
}

impl<C: Crew> Pool<C> {
    /// Starts `workers` threads named `psmr-<name>-<id>`, each running
    /// `body(id, &crew)` and returning the commands it executed. If a
    /// thread cannot start, the ones started are closed and joined.
    pub(crate) fn start<S: Service>(
        exec: &Executor<S>,
        name: &str,
        workers: usize,
        crew: Arc<C>,
        body: fn(usize, &C) -> u64,
    ) -> Result<Self, SchedError> {
        let mut pool = Self { crew, handles: Vec::with_capacity(workers) };
        for id in 0..workers {
            let (crew, mourner) = (pool.crew.clone(), pool.crew.clone());
            // A worker that dies abandons the crew before anyone joins it,
            // so that the threads waiting for it stop waiting (fail-stop).
            let abandon = move || mourner.abandon();
            match exec.spawn_worker(format!("psmr-{name}-{id}"), id, move || body(id, &crew), abandon) {
                Ok(h) => pool.handles.push(h),
                Err(e) => {
                    pool.join();
                    return Err(e);
                }
            }
        }
        Ok(pool)
    }

    /// What the workers share.
    pub(crate) fn crew(&self) -> &Arc<C> {
        &self.crew
    }

    /// Closes the crew and joins every thread: each one's count of executed
    /// commands, or its id if it died.
    fn join(&mut self) -> Vec<Result<u64, usize>> {
        self.crew.close();
        self.handles.drain(..).enumerate().map(|(id, h)| h.join().map_err(|_| id)).collect()
    }

    /// Drains and joins the pool, and reports as [`crate::Scheduler::finish`].
    pub(crate) fn finish<S: Service>(&mut self, exec: &Executor<S>) -> Result<SchedStats, SchedError> {
        let joined = self.join();
        stats_of(joined, &exec.failure)
    }
}

impl<C: Crew> Drop for Pool<C> {
    /// A scheduler dropped without `finish` still leaves no thread behind.
    fn drop(&mut self) {
        if !self.handles.is_empty() {
            self.join();
        }
    }
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
    room: Signal,
}

impl Credits {
    pub(crate) fn new(workers: usize, depth: usize) -> Self {
        Self {
            pending: (0..workers).map(|_| CachePadded::new(AtomicUsize::new(0))).collect(),
            depth,
            room: Signal::new(),
        }
    }

    fn low(&self) -> usize {
        self.depth / 2
    }

    /// Scheduler side: waits for room in worker `w`'s queue, takes a slot.
    /// False if the wait was abandoned (a worker died): nothing taken.
    pub(crate) fn acquire(&self, w: usize) -> bool {
        let pending = &self.pending[w];
        if pending.load(Ordering::Acquire) >= self.depth {
            self.room.wait_until(Patience::brief(), Naps::Notified, || pending.load(Ordering::Acquire) <= self.low());
            if self.room.abandoned() {
                return false;
            }
        }
        pending.fetch_add(1, Ordering::AcqRel);
        true
    }

    /// A worker died: the scheduler thread stops waiting for room.
    pub(crate) fn abandon(&self) {
        self.room.abandon();
    }

    /// Worker side: one batch of worker `w` is done.
    pub(crate) fn release(&self, w: usize) {
        if self.pending[w].fetch_sub(1, Ordering::AcqRel) - 1 == self.low() {
            self.room.notify_one();
        }
    }
}
