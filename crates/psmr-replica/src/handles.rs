//! The narrow handles a replica's stages share, besides the transport's
//! [`Life`](psmr_transport::life::Life) and
//! [`ClusterView`](psmr_transport::view::ClusterView): each stage gets the
//! ones it reads or writes, and nothing else.

use parking_lot::Mutex;
use psmr_transport::msg::Inbound;
use psmr_transport::queue::Sender;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// The last log index the service manager applied, and the protocol
/// thread's request to be woken when it applies the next.
#[derive(Debug, Default)]
pub(crate) struct Applied {
    index: AtomicU64,
    /// Execution's time at `index` or later (ms): stored before `index`,
    /// so that whoever reads `index` first reads a clock at least as new.
    clock: AtomicU64,
    waits: AtomicBool,
}

impl Applied {
    /// The last index applied.
    pub(crate) fn get(&self) -> u64 {
        self.index.load(Ordering::SeqCst)
    }

    /// The last index applied and execution's time there or later (ms).
    pub(crate) fn with_clock(&self) -> (u64, u64) {
        let index = self.get();
        (index, self.clock.load(Ordering::SeqCst))
    }

    /// The index applied, after asking to be woken when it grows: either
    /// the service manager sees the request, or this sees what it applied.
    /// The request stays up: a spare nudge costs one wake-up.
    pub(crate) fn wait_for_more(&self) -> u64 {
        self.waits.store(true, Ordering::SeqCst);
        self.get()
    }

    /// Records that log entry `index` is applied, and wakes the protocol
    /// thread if it waits for it (through `protocol`, its inbound queue).
    pub(crate) fn set(&self, index: u64, clock: u64, protocol: &Sender<Inbound>) {
        self.clock.store(clock, Ordering::SeqCst);
        self.index.store(index, Ordering::SeqCst);
        // SeqCst on both sides (with `wait_for_more`): either the protocol
        // thread saw this index, or this sees its request.
        if self.waits.swap(false, Ordering::SeqCst) {
            // Full means the protocol thread has messages to wake it.
            let _ = protocol.try_send(Inbound::Applied);
        }
    }
}

/// What executes, for `status` and the metrics: the scheduler in words,
/// `auto`'s last decision, and the running scheduler's per-worker metrics.
#[derive(Default)]
pub(crate) struct Scheduling {
    status: Mutex<(String, String)>,
    metrics: Mutex<Option<Arc<psmr_sched::Metrics>>>,
}

impl Scheduling {
    /// Follows a change of scheduler.
    pub(crate) fn set(&self, describe: String, decision: String, metrics: Option<Arc<psmr_sched::Metrics>>) {
        *self.status.lock() = (describe, decision);
        *self.metrics.lock() = metrics;
    }

    /// What executes, and `auto`'s last decision (empty if none).
    pub(crate) fn status(&self) -> (String, String) {
        self.status.lock().clone()
    }

    /// Every worker's counters (empty for schedulers that keep none).
    pub(crate) fn workers(&self) -> Vec<psmr_model::wire::WorkerSample> {
        self.metrics.lock().as_ref().map(|m| m.snapshot()).unwrap_or_default()
    }
}

/// Counters the protocol thread keeps.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) peer_refused: AtomicU64,
    pub(crate) entries_proposed: AtomicU64,
    pub(crate) commands_proposed: AtomicU64,
}

/// Counters of a running replica, read at once.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Raft messages received from peers.
    pub peer_in: u64,
    /// Raft messages from peers that the guard refused: each breaks a
    /// rule no honest replica breaks (a bug or a damaged frame).
    pub peer_refused: u64,
    /// Log entries this replica proposed as leader.
    pub entries_proposed: u64,
    /// Client commands in those entries.
    pub commands_proposed: u64,
}
