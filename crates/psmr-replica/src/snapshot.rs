//! Snapshots off the critical path. Execution pauses only while the
//! service manager waits for what it submitted to finish and copies the
//! state ([`psmr_model::Service::freeze`]); a side pool of one psmr-rt
//! worker then encodes the copy, makes it durable on disk
//! ([`Log::persist`]: the commit it covers synced, then the file), and
//! hands it to the protocol thread, which keeps it and compacts the log
//! ([`Log::install`]). Neither the manager nor the protocol thread
//! encodes or writes a snapshot any more, so clients wait for neither.
//!
//! One snapshot is in flight at a time: while one is, the manager takes
//! none (it tries again a little later), so at most one copy of the state
//! is held besides the state itself.

use crate::manager::encode_state;
use crate::peer::Inbound;
use crate::queue::Sender;
use crate::store::Log;
use crate::Shared;
use crossbeam::channel::SendTimeoutError;
use psmr_model::Frozen;
use psmr_rt::{Policy, Pool, PoolConfig};
use raft::prelude::{ConfState, Snapshot};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::{info, warn};

/// The side pool's name (its thread is `rt-snapshot-0`).
pub const POOL: &str = "snapshot";

/// How long a finished snapshot waits for room in the protocol thread's
/// queue before it looks whether the replica stops.
const HANDOFF_POLL: Duration = Duration::from_millis(100);

/// What the service manager took while execution paused.
pub(crate) struct Taken {
    /// The last entry the snapshot covers, and its term.
    pub(crate) index: u64,
    pub(crate) term: u64,
    /// The membership at `index`, encoded, and raft's view of it.
    pub(crate) members: Vec<u8>,
    pub(crate) conf: ConfState,
    /// The service's state, to be encoded.
    pub(crate) service: Frozen,
    /// The reply cache, to be encoded.
    pub(crate) cache: Frozen,
    /// When the manager began (waiting for execution included).
    pub(crate) start: Instant,
    /// How long execution paused for it, and how much of that went to
    /// waiting for what was submitted to finish.
    pub(crate) paused: Duration,
    pub(crate) drained: Duration,
}

/// The side pool, and what its jobs need.
pub(crate) struct Snapshotter {
    pool: Pool,
    busy: Arc<AtomicBool>,
    shared: Arc<Shared>,
    log: Log,
    protocol: Sender<Inbound>,
}

impl Snapshotter {
    /// Starts the side pool.
    pub(crate) fn start(shared: Arc<Shared>, log: Log, protocol: Sender<Inbound>) -> std::io::Result<Self> {
        let config = PoolConfig { policy: Policy::Fifo, ..PoolConfig::new(POOL, 1) };
        let pool = Pool::start(config).map_err(std::io::Error::other)?;
        Ok(Self { pool, busy: Arc::default(), shared, log, protocol })
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
        let (busy, shared, log, protocol) =
            (self.busy.clone(), self.shared.clone(), self.log.clone(), self.protocol.clone());
        self.pool.spawn_fn(move || {
            let index = taken.index;
            let done = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                complete(taken, &shared, &log, &protocol);
            }));
            if let Err(payload) = done {
                let why = psmr_sched::panic_message(payload.as_ref());
                shared.fail(format!("the snapshot at index {index} panicked: {why}; the replica stops"));
            }
            busy.store(false, Ordering::Release);
        });
    }
}

/// Encodes `taken`, makes it durable and hands it to the protocol thread.
fn complete(taken: Taken, shared: &Shared, log: &Log, protocol: &Sender<Inbound>) {
    let Taken { index, term, members, conf, service, cache, start, paused, drained } = taken;
    let data = encode_state(index, term, &members, &service(), &cache());
    let bytes = data.len();
    let mut snapshot = Snapshot { data: data.into(), ..Default::default() };
    let meta = snapshot.mut_metadata();
    meta.index = index;
    meta.term = term;
    meta.set_conf_state(conf);
    match log.persist(&snapshot) {
        Ok(true) => {}
        Ok(false) => return info!(index, "snapshot dropped: a newer one is kept"),
        Err(e) => return warn!(index, "cannot write the snapshot, the log is not compacted: {e}"),
    }
    let mut msg = Inbound::Snapshot(Box::new(snapshot));
    loop {
        match protocol.send_timeout(msg, HANDOFF_POLL) {
            Ok(()) => break,
            Err(SendTimeoutError::Timeout(back)) if !shared.stopping() => msg = back,
            Err(_) => return,
        }
    }
    shared.metrics.snapshot_taken(start, bytes);
    info!(index, bytes, ?paused, ?drained, took = ?start.elapsed(), "snapshot taken");
}
