//! Per-worker metrics of the early schedulers (000 §5.3).
//!
//! Each worker adds to its own cache-padded counters; a sampler in another
//! thread reads them whenever it likes (every second in 000) and turns two
//! snapshots into rates with [`WorkerSample::since`]. The counters:
//!
//! * synchronization idleness: time spent waiting for the other threads of
//!   a sequential class. The executing thread counts from its arrival until
//!   everybody is there; the others count until the execution is over.
//! * queue idleness: time spent waiting for the next batch in the queue.
//! * queue size: commands taken per queue operation (000 takes a batch of
//!   commands per `fifoGet`, and so does psmr).
//! * commands executed, and steals tried and succeeded (zero until a
//!   scheduler steals).
//!
//! Times are measured only when [`crate::SchedConfig::metrics`] is on: two
//! clock reads per synchronization and per batch are cheap, but not free.

use crossbeam::utils::CachePadded;
pub use psmr_model::wire::WorkerSample;
use std::sync::atomic::{AtomicU64, Ordering};

/// The counters of one worker.
#[derive(Debug, Default)]
pub(crate) struct WorkerCounters {
    pub(crate) sync_idle_ns: AtomicU64,
    pub(crate) queue_idle_ns: AtomicU64,
    pub(crate) dequeues: AtomicU64,
    pub(crate) dequeued_commands: AtomicU64,
    pub(crate) executed: AtomicU64,
    pub(crate) steals_tried: AtomicU64,
    pub(crate) steals_ok: AtomicU64,
}

impl WorkerCounters {
    /// Adds `n` to a counter only this worker writes: a plain load and
    /// store, no read-modify-write, since nobody else writes it.
    #[inline]
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.store(counter.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
    }

    /// Adds the nanoseconds since `start` to `counter`; `start` is `None`
    /// when idleness is not being timed.
    #[inline]
    pub(crate) fn add_since(counter: &AtomicU64, start: Option<std::time::Instant>) {
        if let Some(t) = start {
            Self::add(counter, t.elapsed().as_nanos() as u64);
        }
    }

    /// Like [`WorkerCounters::add_since`], less `busy` nanoseconds that
    /// were spent working (stealing while waiting) rather than idle.
    #[inline]
    pub(crate) fn add_since_less(counter: &AtomicU64, start: Option<std::time::Instant>, busy: u64) {
        if let Some(t) = start {
            Self::add(counter, (t.elapsed().as_nanos() as u64).saturating_sub(busy));
        }
    }
}

/// The metrics of a scheduler's workers, shared with whoever samples them.
#[derive(Debug)]
pub struct Metrics {
    workers: Vec<CachePadded<WorkerCounters>>,
}

impl Metrics {
    pub(crate) fn new(workers: usize) -> Self {
        Self { workers: (0..workers).map(|_| CachePadded::new(WorkerCounters::default())).collect() }
    }

    pub(crate) fn worker(&self, id: usize) -> &WorkerCounters {
        &self.workers[id]
    }

    /// Number of workers.
    pub fn workers(&self) -> usize {
        self.workers.len()
    }

    /// The totals of every worker so far (index = worker id).
    pub fn snapshot(&self) -> Vec<WorkerSample> {
        self.workers
            .iter()
            .map(|w| WorkerSample {
                sync_idle_ns: w.sync_idle_ns.load(Ordering::Relaxed),
                queue_idle_ns: w.queue_idle_ns.load(Ordering::Relaxed),
                dequeues: w.dequeues.load(Ordering::Relaxed),
                dequeued_commands: w.dequeued_commands.load(Ordering::Relaxed),
                executed: w.executed.load(Ordering::Relaxed),
                steals_tried: w.steals_tried.load(Ordering::Relaxed),
                steals_ok: w.steals_ok.load(Ordering::Relaxed),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_subtract_and_average() {
        let m = Metrics::new(2);
        let w = m.worker(1);
        WorkerCounters::add(&w.dequeues, 4);
        WorkerCounters::add(&w.dequeued_commands, 10);
        WorkerCounters::add(&w.executed, 7);
        let first = m.snapshot();
        WorkerCounters::add(&w.dequeues, 1);
        WorkerCounters::add(&w.dequeued_commands, 50);
        let second = m.snapshot();
        assert_eq!(first[0], WorkerSample::default());
        assert_eq!(first[1].queue_size_avg(), 2.5);
        let delta = second[1].since(&first[1]);
        assert_eq!((delta.dequeues, delta.dequeued_commands, delta.executed), (1, 50, 0));
        assert_eq!(delta.queue_size_avg(), 50.0);
        assert_eq!(WorkerSample::default().queue_size_avg(), 0.0);
    }
}
