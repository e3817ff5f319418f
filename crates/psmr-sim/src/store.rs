//! The simulated disk: a replica's [`Store`] that behaves as a real disk
//! does where it matters to the protocol.
//!
//! * **Synced and unsynced writes.** Appends, snapshots made durable and
//!   snapshots from the leader are synced writes; a commit index alone is
//!   written unsynced (as the disk store writes a light ready's commit) and
//!   becomes durable with the next synced write.
//! * **A crash loses what was not synced**: the commit index goes back to
//!   the last synced one. A snapshot made durable and not yet kept is found
//!   at the restart, as the disk store finds its snapshot file.
//! * **Torn writes.** A crash may strike a synced write
//!   ([`SimStore::arm`]): the write has reached the disk or not (the
//!   torn tail of a real log is cut at recovery), and the replica dies
//!   before it hears either way.
//! * **A full disk** refuses synced writes until space frees up; the replica
//!   stops with the store's reason, and restarts later with nothing lost.
//! * **Damage**: the log loses synced entries while the replica is down.
//! * **Snapshot files** as the disk store keeps them: one taken here is
//!   written and synced before it is kept (a full disk or a crash leaves
//!   the kept one); one being received loses, in a crash, what was written
//!   since its last sync, and resumes from the rest.
//!
//! Every synced write updates a sync record (psmr-storage's
//! [`SyncState`]), and every restart recovers by the disk store's own rule
//! ([`covers`]): a log that no longer covers what was synced is refused,
//! never run. A refused replica is repaired as an operator repairs one
//! (`psmr replica --repair`): an empty log, its term and vote kept, and a
//! vote floor at the last entry it had synced.

use parking_lot::Mutex;
use psmr_core::snapfile::{SnapshotFile, SnapshotId};
use psmr_core::store::{MemStore, SnapshotSink, Store};
use psmr_storage::synced::{covers, SyncState};
use raft::prelude::{Entry, HardState, Snapshot};
use raft::{GetEntriesContext, RaftState, Storage, StorageError};
use std::io::{self, Write};
use std::sync::Arc;

/// What a crash does to the synced write it strikes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Tear {
    /// The write reached the disk; the replica died before it knew.
    Landed,
    /// The write never reached the disk.
    Lost,
}

/// The disk of one replica; clones share it.
#[derive(Clone)]
pub(crate) struct SimStore(Arc<Mutex<Disk>>);

/// What the disk holds.
struct Disk {
    /// The log, hard state and kept snapshot, as the replica sees them
    /// (synced or not).
    mem: MemStore,
    /// The commit index as of the last synced write.
    durable_commit: u64,
    /// The sync record.
    record: SyncState,
    /// A snapshot made durable and not yet kept.
    persisted: Option<Snapshot>,
    /// The bytes of the snapshot file being received that were synced.
    recv_synced: u64,
    /// A crash strikes the next synced write.
    armed: Option<Tear>,
    /// A crash struck: the replica is dead, and writes fail until it
    /// restarts.
    struck: bool,
    /// No space left: synced writes fail.
    full: bool,
}

/// Why a simulated write failed.
fn refused(why: &str) -> raft::Error {
    raft::Error::Store(StorageError::Other(why.to_string().into()))
}

impl Disk {
    /// A synced write: fails on a full disk or a crash; records what it
    /// made durable.
    fn synced(&mut self, write: impl FnOnce(&MemStore) -> raft::Result<()>) -> raft::Result<()> {
        if self.struck {
            return Err(refused("the machine crashed"));
        }
        if self.full {
            return Err(refused("No space left on device (os error 28)"));
        }
        if let Some(tear) = self.armed.take() {
            self.struck = true;
            if tear == Tear::Landed && write(&self.mem).is_ok() {
                self.record_synced();
            }
            return Err(refused("the machine crashed in the middle of a synced write"));
        }
        write(&self.mem)?;
        self.record_synced();
        Ok(())
    }

    /// The record after a synced write: every earlier write is durable too.
    fn record_synced(&mut self) {
        let hs = self.mem.initial_state().map(|s| s.hard_state).unwrap_or_default();
        let last_index = self.mem.last_index().unwrap_or(0);
        let last = (self.mem.term(last_index).unwrap_or(0), last_index);
        self.durable_commit = hs.commit;
        self.record = self.record.after(last, hs.term, hs.vote, hs.commit);
    }

    fn alive(&self) -> raft::Result<()> {
        match self.struck {
            true => Err(refused("the machine crashed")),
            false => Ok(()),
        }
    }

    /// Whether a file may be written now: not after a crash, nor on a full
    /// disk.
    fn writable(&self) -> io::Result<()> {
        match (self.struck, self.full) {
            (true, _) => Err(io::Error::other("the machine crashed")),
            (_, true) => Err(io::Error::other("No space left on device (os error 28)")),
            _ => Ok(()),
        }
    }
}

/// A snapshot being taken, written to the simulated disk.
struct SimSink {
    store: SimStore,
    inner: Box<dyn SnapshotSink>,
}

impl Write for SimSink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.store.0.lock().writable()?;
        self.inner.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

impl SnapshotSink for SimSink {
    fn finish(self: Box<Self>) -> io::Result<()> {
        self.store.0.lock().writable()?;
        self.inner.finish()
    }
}

impl SimStore {
    /// A new, empty disk.
    pub(crate) fn new(incarnation: u64) -> Self {
        let record = SyncState { incarnation, ..SyncState::default() };
        let mem = MemStore::default();
        let disk = Disk {
            mem,
            durable_commit: 0,
            record,
            persisted: None,
            recv_synced: 0,
            armed: None,
            struck: false,
            full: false,
        };
        Self(Arc::new(Mutex::new(disk)))
    }

    /// A crash strikes the next synced write, with `tear` as its fate.
    pub(crate) fn arm(&self, tear: Tear) {
        self.0.lock().armed = Some(tear);
    }

    /// Disarms a crash that found no write to strike.
    pub(crate) fn disarm(&self) {
        self.0.lock().armed = None;
    }

    /// Whether a crash struck a write.
    pub(crate) fn struck(&self) -> bool {
        self.0.lock().struck
    }

    /// Fills the disk up (`true`) or frees space.
    pub(crate) fn set_full(&self, full: bool) {
        self.0.lock().full = full;
    }

    /// Whether the disk is full.
    pub(crate) fn full(&self) -> bool {
        self.0.lock().full
    }

    /// Whether the replica was repaired and its log is still below the
    /// vote floor the repair left (up or down).
    pub(crate) fn repaired(&self) -> bool {
        self.0.lock().record.floor.is_some()
    }

    /// The index of the last entry the sync record says was synced.
    pub(crate) fn synced_index(&self) -> u64 {
        self.0.lock().record.last_index
    }

    /// The first index the log holds.
    pub(crate) fn log_start(&self) -> u64 {
        self.0.lock().mem.first_index().unwrap_or(1)
    }

    /// The machine crashed: what was not synced is gone; a snapshot made
    /// durable and not yet kept is found at the restart.
    pub(crate) fn crash(&self) {
        let mut disk = self.0.lock();
        disk.struck = false;
        disk.armed = None;
        let durable = disk.durable_commit;
        {
            let mut core = disk.mem.mem.wl();
            if core.hard_state().commit > durable {
                core.mut_hard_state().commit = durable;
            }
        }
        if let Some(snap) = disk.persisted.take() {
            let _ = disk.mem.install(snap, 0);
        }
        let synced = disk.recv_synced as usize;
        let mut files = disk.mem.files().lock();
        if let Some((_, file)) = files.receiving.as_mut() {
            Arc::make_mut(file).truncate(synced);
        }
    }

    /// The log loses every synced entry after `keep` (damage while the
    /// replica is down): what remains is all the disk holds.
    pub(crate) fn damage(&self, keep: u64) {
        let mut disk = self.0.lock();
        let (first, last) = (disk.mem.first_index().unwrap_or(1), disk.mem.last_index().unwrap_or(0));
        // What a snapshot covers is in its own file: only the log after it
        // is lost.
        let keep = keep.max(disk.mem.snapshot_index());
        if keep >= last || keep + 1 < first {
            return;
        }
        let from = first.max(disk.mem.snapshot_index() + 1);
        let kept = disk.mem.entries(from, keep + 1, None, GetEntriesContext::empty(false)).unwrap_or_default();
        let mut hs = disk.mem.initial_state().map(|s| s.hard_state).unwrap_or_default();
        hs.commit = hs.commit.min(keep);
        // The snapshot files are not the log's: they stay.
        let rebuilt = MemStore::default();
        *rebuilt.files().lock() = std::mem::take(&mut *disk.mem.files().lock());
        if let Some(snap) = rebuilt.kept() {
            let _ = rebuilt.mem.wl().apply_snapshot(snap);
        }
        let _ = rebuilt.append(&kept, Some(&hs));
        disk.mem = rebuilt;
    }

    /// Recovers after a crash by the disk store's rule: refuses a log that
    /// does not cover what the sync record says was synced.
    pub(crate) fn recover(&self) -> Result<(), String> {
        let disk = self.0.lock();
        let mem = &disk.mem;
        let hs = mem.initial_state().map_err(|e| e.to_string())?.hard_state;
        let last_index = mem.last_index().map_err(|e| e.to_string())?;
        let last = (mem.term(last_index).unwrap_or(0), last_index);
        let snap = mem.kept().map_or((0, 0), |s| (s.get_metadata().index, s.get_metadata().term));
        covers(&disk.record, &hs, last, snap, |i| mem.term(i).ok())
    }

    /// Repairs a replica whose log was refused, as `psmr replica --repair`
    /// does: an empty log holding only the recorded term and vote, and a
    /// vote floor at the last entry the record says was synced.
    pub(crate) fn repair(&self) {
        let mut disk = self.0.lock();
        let record = disk.record;
        let rebuilt = MemStore::default();
        let hs = HardState { term: record.term, vote: record.vote, commit: 0, ..Default::default() };
        let _ = rebuilt.append(&[], Some(&hs));
        let floor = (record.last_term, record.last_index).max(record.floor.unwrap_or((0, 0)));
        let (incarnation, term, vote) = (record.incarnation, record.term, record.vote);
        disk.record = SyncState { incarnation, term, vote, ..SyncState::default() };
        disk.record.floor = (floor != (0, 0)).then_some(floor);
        disk.durable_commit = 0;
        disk.persisted = None;
        disk.recv_synced = 0;
        disk.mem = rebuilt;
    }
}

impl Store for SimStore {
    fn append(&self, entries: &[Entry], hs: Option<&HardState>) -> raft::Result<()> {
        if entries.is_empty() && hs.is_none() {
            return Ok(());
        }
        self.0.lock().synced(|mem| mem.append(entries, hs))
    }

    fn set_commit(&self, commit: u64) -> raft::Result<()> {
        let disk = self.0.lock();
        disk.alive()?;
        disk.mem.set_commit(commit)
    }

    fn persist(&self, snapshot: &Snapshot) -> raft::Result<bool> {
        let index = snapshot.get_metadata().index;
        let mut disk = self.0.lock();
        if disk.mem.snapshot_index() >= index {
            return Ok(false);
        }
        // The commit the snapshot covers is synced first, as the disk
        // store does: a state ahead of the durable commit cannot restart.
        disk.synced(|mem| {
            let mut core = mem.mem.wl();
            let commit = core.hard_state().commit.max(index);
            core.mut_hard_state().commit = commit;
            Ok(())
        })?;
        if !disk.mem.persist(snapshot)? {
            return Ok(false);
        }
        disk.persisted = Some(snapshot.clone());
        Ok(true)
    }

    fn install(&self, snapshot: Snapshot, keep_from: u64) -> raft::Result<()> {
        let mut disk = self.0.lock();
        disk.alive()?;
        let index = snapshot.get_metadata().index;
        if disk.persisted.as_ref().is_some_and(|p| p.get_metadata().index <= index) {
            disk.persisted = None;
        }
        disk.mem.install(snapshot, keep_from)
    }

    fn apply_snapshot(&self, snapshot: Snapshot) -> raft::Result<()> {
        let mut disk = self.0.lock();
        disk.synced(|mem| mem.apply_snapshot(snapshot))?;
        disk.recv_synced = 0;
        Ok(())
    }

    fn kept(&self) -> Option<Snapshot> {
        self.0.lock().mem.kept()
    }

    fn snapshot_writer(&self) -> io::Result<Box<dyn SnapshotSink>> {
        let inner = {
            let disk = self.0.lock();
            disk.writable()?;
            disk.mem.snapshot_writer()?
        };
        Ok(Box::new(SimSink { store: self.clone(), inner }))
    }

    fn open_snapshot(&self, id: &SnapshotId) -> io::Result<Box<dyn SnapshotFile>> {
        self.0.lock().mem.open_snapshot(id)
    }

    fn receiving(&self) -> Option<(SnapshotId, u64)> {
        self.0.lock().mem.receiving()
    }

    fn receive(&self, id: &SnapshotId, offset: u64, data: &[u8]) -> io::Result<()> {
        let mut disk = self.0.lock();
        disk.writable()?;
        if disk.mem.receiving().map_or(true, |(r, _)| r != *id) {
            disk.recv_synced = 0;
        }
        disk.mem.receive(id, offset, data)?;
        disk.recv_synced = disk.recv_synced.min(offset);
        Ok(())
    }

    fn sync_received(&self) -> io::Result<()> {
        let mut disk = self.0.lock();
        disk.writable()?;
        disk.recv_synced = disk.mem.receiving().map_or(0, |(_, len)| len);
        Ok(())
    }

    fn vote_floor(&self) -> Option<(u64, u64)> {
        self.0.lock().record.floor
    }
}

impl Storage for SimStore {
    fn initial_state(&self) -> raft::Result<RaftState> {
        self.0.lock().mem.initial_state()
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        self.0.lock().mem.entries(low, high, max_size, context)
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        self.0.lock().mem.term(idx)
    }

    fn first_index(&self) -> raft::Result<u64> {
        self.0.lock().mem.first_index()
    }

    fn last_index(&self) -> raft::Result<u64> {
        self.0.lock().mem.last_index()
    }

    fn snapshot(&self, request_index: u64, to: u64) -> raft::Result<Snapshot> {
        self.0.lock().mem.snapshot(request_index, to)
    }
}
