//! Snapshots off the critical path. Execution pauses only while the apply
//! loop waits for what it submitted to finish and copies the state
//! ([`psmr_model::Service::freeze`]); a side pool of one psmr-rt worker
//! then encodes the copy and makes it durable
//! ([`psmr_core::state::persist`]: the commit it covers synced, then the
//! file), and hands it to the protocol thread, which keeps it and compacts
//! the log. Neither the service manager nor the protocol thread encodes or
//! writes a snapshot, so clients wait for neither.
//!
//! One snapshot is in flight at a time: while one is, the apply loop takes
//! none (it tries again a little later), so at most one copy of the state
//! is held besides the state itself.

use crate::metrics::Metrics;
use crossbeam::channel::SendTimeoutError;
use psmr_core::state::{self, Persisted, Taken};
use psmr_rt::{Policy, Pool, PoolConfig};
use psmr_storage::Log;
use psmr_transport::life::Life;
use psmr_transport::msg::Inbound;
use psmr_transport::queue::Sender;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::{info, warn};

/// The side pool's name (its thread is `rt-snapshot-0`).
pub const POOL: &str = "snapshot";

/// How long a finished snapshot waits for room in the protocol thread's
/// queue before it looks whether the replica stops.
const HANDOFF_POLL: Duration = Duration::from_millis(100);

/// The side pool, and what its jobs need.
pub(crate) struct Snapshotter {
    pool: Pool,
    busy: Arc<AtomicBool>,
    job: Arc<Job>,
}

/// What a snapshot job needs.
struct Job {
    life: Arc<Life>,
    metrics: Arc<Metrics>,
    log: Log,
    protocol: Sender<Inbound>,
}

impl Snapshotter {
    /// Starts the side pool.
    pub(crate) fn start(
        life: Arc<Life>,
        metrics: Arc<Metrics>,
        log: Log,
        protocol: Sender<Inbound>,
    ) -> std::io::Result<Self> {
        let config = PoolConfig { policy: Policy::Fifo, ..PoolConfig::new(POOL, 1) };
        let pool = Pool::start(config).map_err(std::io::Error::other)?;
        Ok(Self { pool, busy: Arc::default(), job: Arc::new(Job { life, metrics, log, protocol }) })
    }

    /// Whether the last snapshot is still being encoded or written.
    pub(crate) fn busy(&self) -> bool {
        self.busy.load(Ordering::Acquire)
    }

    /// Encodes, persists and hands over `taken` on the side pool. A panic
    /// there stops the replica: a snapshot that cannot be made means a
    /// state that cannot be trusted.
    pub(crate) fn finish(&self, taken: Taken) {
        self.busy.store(true, Ordering::Release);
        let (busy, job) = (self.busy.clone(), self.job.clone());
        self.pool.spawn_fn(move || {
            let index = taken.index;
            let done = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job.complete(taken)));
            if let Err(payload) = done {
                let why = psmr_sched::panic_message(payload.as_ref());
                job.life.fail(format!("the snapshot at index {index} panicked: {why}; the replica stops"));
            }
            busy.store(false, Ordering::Release);
        });
    }
}

impl Job {
    /// Encodes `taken`, makes it durable and hands it to the protocol
    /// thread.
    fn complete(&self, taken: Taken) {
        let (index, paused, drained, start) = (taken.index, taken.paused, taken.drained, Instant::now());
        let (snapshot, bytes) = match state::persist(taken, &self.log) {
            Ok(Persisted::Kept(snapshot, bytes)) => (snapshot, bytes),
            Ok(Persisted::Stale) => return info!(index, "snapshot dropped: a newer one is kept"),
            Err(why) => return warn!(index, "{why}"),
        };
        let mut msg = Inbound::Snapshot(Box::new(snapshot));
        loop {
            match self.protocol.send_timeout(msg, HANDOFF_POLL) {
                Ok(()) => break,
                Err(SendTimeoutError::Timeout(back)) if !self.life.stopping() => msg = back,
                Err(_) => return,
            }
        }
        let took = paused + start.elapsed();
        self.metrics.snapshots.taken(took, bytes);
        info!(index, bytes, ?paused, ?drained, ?took, "snapshot taken");
    }
}
