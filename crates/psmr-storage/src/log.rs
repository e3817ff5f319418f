//! The log a replica keeps, in memory or on disk, behind one [`Store`].

use crate::disk::DiskStore;
use psmr_core::snapfile::{SnapshotFile, SnapshotId};
use psmr_core::store::{MemStore, SnapshotSink, Store};
use raft::prelude::{Entry, HardState, Snapshot};
use raft::{GetEntriesContext, RaftState, Storage};
use std::io;
use std::sync::Arc;
use std::time::Duration;

/// Told how long each synced write took (a replica's metrics).
pub type SyncTimer = Arc<dyn Fn(Duration) + Send + Sync>;

/// The log a replica keeps: in memory or on disk.
#[derive(Clone)]
pub enum Log {
    /// [`MemStore`].
    Memory(MemStore),
    /// [`DiskStore`].
    Disk(DiskStore),
}

impl Log {
    /// The disk store, if the log is on disk.
    pub fn disk(&self) -> Option<&DiskStore> {
        match self {
            Log::Memory(_) => None,
            Log::Disk(d) => Some(d),
        }
    }
}

/// Calls `$call` on whichever store `$log` is.
macro_rules! either {
    ($log:expr, $s:ident => $call:expr) => {
        match $log {
            Log::Memory($s) => $call,
            Log::Disk($s) => $call,
        }
    };
}

impl Store for Log {
    fn append(&self, entries: &[Entry], hs: Option<&HardState>) -> raft::Result<()> {
        either!(self, s => s.append(entries, hs))
    }

    fn set_commit(&self, commit: u64) -> raft::Result<()> {
        either!(self, s => s.set_commit(commit))
    }

    fn persist(&self, snapshot: &Snapshot) -> raft::Result<bool> {
        either!(self, s => s.persist(snapshot))
    }

    fn install(&self, snapshot: Snapshot, keep_from: u64) -> raft::Result<()> {
        either!(self, s => s.install(snapshot, keep_from))
    }

    fn apply_snapshot(&self, snapshot: Snapshot) -> raft::Result<()> {
        either!(self, s => s.apply_snapshot(snapshot))
    }

    fn kept(&self) -> Option<Snapshot> {
        either!(self, s => Store::kept(s))
    }

    fn snapshot_writer(&self) -> io::Result<Box<dyn SnapshotSink>> {
        either!(self, s => s.snapshot_writer())
    }

    fn open_snapshot(&self, id: &SnapshotId) -> io::Result<Box<dyn SnapshotFile>> {
        either!(self, s => s.open_snapshot(id))
    }

    fn receiving(&self) -> Option<(SnapshotId, u64)> {
        either!(self, s => s.receiving())
    }

    fn receive(&self, id: &SnapshotId, offset: u64, data: &[u8]) -> io::Result<()> {
        either!(self, s => s.receive(id, offset, data))
    }

    fn sync_received(&self) -> io::Result<()> {
        either!(self, s => s.sync_received())
    }

    fn vote_floor(&self) -> Option<(u64, u64)> {
        either!(self, s => Store::vote_floor(s))
    }
}

impl Storage for Log {
    fn initial_state(&self) -> raft::Result<RaftState> {
        either!(self, s => s.initial_state())
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        let max_size = max_size.into();
        either!(self, s => s.entries(low, high, max_size, context))
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        either!(self, s => s.term(idx))
    }

    fn first_index(&self) -> raft::Result<u64> {
        either!(self, s => s.first_index())
    }

    fn last_index(&self) -> raft::Result<u64> {
        either!(self, s => s.last_index())
    }

    fn snapshot(&self, request_index: u64, to: u64) -> raft::Result<Snapshot> {
        either!(self, s => s.snapshot(request_index, to))
    }
}
