//! What a pool counts: per worker, the tasks it ran, its steals, its full
//! queues and its parks; per pool, how long tasks waited in a queue.

use crate::pool::Shared;
use hdrhistogram::Histogram;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Longest queue wait the histograms tell apart, ns (10 s); longer ones
/// count as 10 s.
const WAIT_MAX_NS: u64 = 10_000_000_000;

/// One worker's counters, written by it alone (relaxed: they order
/// nothing).
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub tasks_run: AtomicU64,
    pub steals_tried: AtomicU64,
    pub steals_ok: AtomicU64,
    pub stolen: AtomicU64,
    pub overflows: AtomicU64,
    pub overflowed: AtomicU64,
    pub resizes: AtomicU64,
    pub parks: AtomicU64,
}

impl Counters {
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    fn read(&self) -> WorkerStats {
        let r = |c: &AtomicU64| c.load(Ordering::Relaxed);
        WorkerStats {
            tasks_run: r(&self.tasks_run),
            steals_tried: r(&self.steals_tried),
            steals_ok: r(&self.steals_ok),
            stolen: r(&self.stolen),
            overflows: r(&self.overflows),
            overflowed: r(&self.overflowed),
            resizes: r(&self.resizes),
            parks: r(&self.parks),
        }
    }
}

/// One worker's queue waits, recorded by it alone; the lock is
/// uncontended but for a reader of [`PoolStats`].
pub(crate) struct WaitHistogram(Mutex<Histogram<u64>>);

impl WaitHistogram {
    pub fn new() -> Self {
        // Two significant digits: a few dozen KiB per worker.
        let h = Histogram::new_with_bounds(1, WAIT_MAX_NS, 2).expect("static histogram bounds are valid");
        WaitHistogram(Mutex::new(h))
    }

    pub fn record(&self, ns: u64) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).saturating_record(ns.clamp(1, WAIT_MAX_NS));
    }

    fn read(&self) -> Histogram<u64> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// One worker's counters at a moment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WorkerStats {
    /// Tasks and jobs it ran.
    pub tasks_run: u64,
    /// Steal attempts on another worker's queue.
    pub steals_tried: u64,
    /// Those that took something.
    pub steals_ok: u64,
    /// Tasks those took (a steal-half takes several).
    pub stolen: u64,
    /// Insertions that found its queue full and moved half of it to the
    /// injector ([`Full::Overflow`](crate::Full::Overflow)).
    pub overflows: u64,
    /// Tasks those moved.
    pub overflowed: u64,
    /// Insertions that found its queue full and grew it
    /// ([`Full::Resize`](crate::Full::Resize)). An insertion never retries:
    /// a full queue overflows or grows.
    pub resizes: u64,
    /// Times it slept for want of work.
    pub parks: u64,
}

impl std::ops::AddAssign<&WorkerStats> for WorkerStats {
    fn add_assign(&mut self, o: &WorkerStats) {
        self.tasks_run += o.tasks_run;
        self.steals_tried += o.steals_tried;
        self.steals_ok += o.steals_ok;
        self.stolen += o.stolen;
        self.overflows += o.overflows;
        self.overflowed += o.overflowed;
        self.resizes += o.resizes;
        self.parks += o.parks;
    }
}

/// A pool's counters at a moment.
#[derive(Clone, Debug)]
pub struct PoolStats {
    /// The pool.
    pub name: String,
    /// Per worker, by index.
    pub workers: Vec<WorkerStats>,
    /// Tasks spawned or woken from outside the pool (into its injector).
    pub injected: u64,
    /// Spawns from outside refused because the pool was stopping.
    pub rejected: u64,
    /// How long tasks waited between being queued and starting to run,
    /// ns, over every worker: one task in
    /// [`WAIT_SAMPLE`](crate::WAIT_SAMPLE) queued by each thread.
    pub queue_wait_ns: Histogram<u64>,
}

impl PoolStats {
    pub(crate) fn of(shared: &Shared) -> Self {
        let mut queue_wait_ns = shared.waits[0].read();
        for w in &shared.waits[1..] {
            // Same bounds on every worker: adding cannot fail.
            let _ = queue_wait_ns.add(w.read());
        }
        PoolStats {
            name: shared.config.name.clone(),
            workers: shared.counters.iter().map(Counters::read).collect(),
            injected: shared.injected.load(Ordering::Relaxed),
            rejected: shared.rejected.load(Ordering::Relaxed),
            queue_wait_ns,
        }
    }

    /// Every worker's counters summed.
    pub fn total(&self) -> WorkerStats {
        let mut t = WorkerStats::default();
        for w in &self.workers {
            t += w;
        }
        t
    }
}
