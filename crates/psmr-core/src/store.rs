//! What the core keeps durable, behind a trait: the raft log and hard
//! state, and the snapshots that replace the log's compacted prefix.
//!
//! The core calls its [`Store`] from the protocol (appends, the commit,
//! snapshots from the leader) and from wherever snapshots are written
//! ([`Store::persist`], off the protocol's path). Production stores are
//! raft-engine on disk and [`MemStore`] in memory (the papers' crash-stop
//! model); the simulator's store models a disk that syncs, loses what was
//! not synced in a crash, tears writes and fills up.
//!
//! Every store keeps one rule the protocol depends on: [`Store::append`]
//! returns only once what it wrote survives a crash; nothing that depends
//! on it (a vote, an acknowledgement) leaves before.

use crate::config::Member;
use crate::snapfile::{Descriptor, SnapshotFile, SnapshotId};
use parking_lot::Mutex;
use raft::prelude::{Entry, HardState, Snapshot};
use raft::storage::MemStorage;
use raft::{GetEntriesContext, RaftState, Storage, StorageError};
use std::io::{self, Write};
use std::sync::Arc;

/// Where a snapshot taken here is written: the bytes of its file
/// ([`crate::snapfile`]), in order.
pub trait SnapshotSink: Write + Send {
    /// Makes what was written durable; the file then waits for
    /// [`Store::persist`] to be kept.
    fn finish(self: Box<Self>) -> io::Result<()>;
}

/// A replica's durable log: raft's [`Storage`] to read it, and the writes
/// the core makes; and its snapshot files, which hold the state the log's
/// compacted prefix made ([`crate::snapfile`]): the one kept, one being
/// written here, and one being received from the leader.
pub trait Store: Storage + Clone + Send + Sync + 'static {
    /// Persists a ready's entries and hard state; returns once they are
    /// durable (synced).
    fn append(&self, entries: &[Entry], hs: Option<&HardState>) -> raft::Result<()>;

    /// Records a new commit index. It need not be synced: the next synced
    /// write makes it durable, and a commit index lost in a crash is
    /// learned again from the leader.
    fn set_commit(&self, commit: u64) -> raft::Result<()>;

    /// Starts the file of a snapshot taken here, dropping one started
    /// before and never persisted. Safe to call from any thread.
    fn snapshot_writer(&self) -> io::Result<Box<dyn SnapshotSink>>;

    /// Keeps the file the last [`Store::snapshot_writer`] finished as the
    /// snapshot `snapshot` describes (its data is the file's
    /// [`crate::snapfile::Descriptor`]), durably, before
    /// [`Store::install`]. Safe to call from any thread; false if a
    /// snapshot as new is kept already.
    fn persist(&self, snapshot: &Snapshot) -> raft::Result<bool>;

    /// Keeps a snapshot taken here (persisted) and compacts the log
    /// before `keep_from`; a snapshot older than the one kept is ignored.
    fn install(&self, snapshot: Snapshot, keep_from: u64) -> raft::Result<()>;

    /// Replaces the log with a snapshot from the leader, whose file was
    /// received whole ([`Store::receive`]) and checked.
    fn apply_snapshot(&self, snapshot: Snapshot) -> raft::Result<()>;

    /// The newest snapshot kept, if any.
    fn kept(&self) -> Option<Snapshot>;

    /// The file of snapshot `id`: the one kept, or the one being
    /// received. The handle reads it even after a newer one replaces it.
    fn open_snapshot(&self, id: &SnapshotId) -> io::Result<Box<dyn SnapshotFile>>;

    /// The snapshot file being received, if any: its id and its size now
    /// (after a crash, what survived of it; the core checks it).
    fn receiving(&self) -> Option<(SnapshotId, u64)>;

    /// Writes `data` at `offset` of the file of `id` being received, and
    /// drops whatever it held after; a file being received of another id
    /// is dropped first (then `offset` is 0). Need not be synced.
    fn receive(&self, id: &SnapshotId, offset: u64, data: &[u8]) -> io::Result<()>;

    /// Makes every byte received so far durable.
    fn sync_received(&self) -> io::Result<()>;

    /// The vote floor of a replica repaired after it lost its log: the
    /// (term, index) of the last entry it had synced, which it may have
    /// acknowledged. Until its log reaches the floor the replica votes for
    /// no log behind it and never campaigns (see [`crate::guard`]).
    fn vote_floor(&self) -> Option<(u64, u64)> {
        None
    }
}

/// Writes a founding replica's first entries (see
/// [`crate::membership`]) into a log that has never held anything: one
/// conf-change entry per replica in `replicas`, committed in term 1. Does
/// nothing to any other log (a restart, a repaired replica).
pub fn found(store: &impl Store, replicas: &[Member]) -> raft::Result<()> {
    let state = store.initial_state()?;
    let pristine = state.hard_state == HardState::default() && store.last_index()? == 0 && store.first_index()? == 1;
    if !pristine {
        return Ok(());
    }
    let entries = crate::membership::founding_entries(replicas);
    let hs = HardState { term: 1, commit: entries.len() as u64, ..Default::default() };
    store.append(&entries, Some(&hs))
}

/// Refuses a log written before membership lived in the log: one that
/// starts at index 1 with anything but a founding conf change (and has no
/// snapshot, which would say who the members are). Raft would run on it
/// with no members.
pub fn check_founded(store: &impl Store) -> Result<(), String> {
    if store.kept().is_some() || store.first_index().unwrap_or(1) != 1 || store.last_index().unwrap_or(0) == 0 {
        return Ok(());
    }
    let first = store.entries(1, 2, None, GetEntriesContext::empty(false)).map_err(|e| e.to_string())?;
    match first.first().map(|e| e.get_entry_type()) {
        Some(raft::prelude::EntryType::EntryConfChangeV2) | None => Ok(()),
        Some(other) => Err(format!(
            "the log starts with a {other:?} entry, not the founding membership: it was written by a psmr \
             that kept the membership outside the log; start this cluster afresh"
        )),
    }
}

/// The store as raft reads it: a snapshot is offered to a follower only if
/// it counts the follower as a member (a replica that is not in a
/// snapshot's membership ignores it, and is sent a newer one: the service
/// manager takes one when a replica joins).
#[derive(Clone)]
pub(crate) struct RaftLog<S>(pub(crate) S);

impl<S: Store> Storage for RaftLog<S> {
    fn initial_state(&self) -> raft::Result<RaftState> {
        self.0.initial_state()
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        self.0.entries(low, high, max_size, context)
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        self.0.term(idx)
    }

    fn first_index(&self) -> raft::Result<u64> {
        self.0.first_index()
    }

    fn last_index(&self) -> raft::Result<u64> {
        self.0.last_index()
    }

    fn snapshot(&self, request_index: u64, to: u64) -> raft::Result<Snapshot> {
        let snap = self.0.snapshot(request_index, to)?;
        let cs = snap.get_metadata().get_conf_state();
        if !cs.voters.contains(&to) && !cs.learners.contains(&to) {
            return Err(raft::Error::Store(StorageError::SnapshotTemporarilyUnavailable));
        }
        Ok(snap)
    }
}

/// raft-rs's `MemStorage`, except that the snapshots it hands to raft (to
/// send to a follower that fell behind the compacted log) are the service
/// snapshots the service manager took; their files live in memory too.
#[derive(Clone)]
pub struct MemStore {
    /// The log and hard state.
    pub mem: MemStorage,
    files: Arc<Mutex<Files>>,
    floor: Option<(u64, u64)>,
}

/// The snapshot files of a store that keeps them in memory.
#[derive(Default)]
pub struct Files {
    /// The kept snapshot and its file.
    pub kept: Option<(Snapshot, Arc<Vec<u8>>)>,
    /// The last file written here and finished, not yet kept.
    pub taken: Option<Arc<Vec<u8>>>,
    /// The file being received, with its id.
    pub receiving: Option<(SnapshotId, Arc<Vec<u8>>)>,
}

impl Files {
    /// Keeps the taken file as `snapshot`, if it is newer than the kept
    /// one and the file its descriptor names.
    pub fn persist(&mut self, snapshot: &Snapshot) -> raft::Result<bool> {
        let index = snapshot.get_metadata().index;
        if self.kept.as_ref().is_some_and(|(k, _)| k.get_metadata().index >= index) {
            return Ok(false);
        }
        let id = descriptor_id(snapshot)?;
        match self.taken.take() {
            Some(file) if file.len() == id.bytes => {
                self.kept = Some((snapshot.clone(), file));
                self.receiving = self.receiving.take().filter(|(r, _)| r.index > index);
                Ok(true)
            }
            _ => Err(store_error(format!("no finished file for {id}"))),
        }
    }

    /// Keeps the received file as `snapshot`, if it is whole and the file
    /// its descriptor names.
    pub fn keep_received(&mut self, snapshot: &Snapshot) -> raft::Result<()> {
        let id = descriptor_id(snapshot)?;
        match self.receiving.take() {
            Some((got, file)) if got == id && file.len() == id.bytes => {
                self.kept = Some((snapshot.clone(), file));
                Ok(())
            }
            other => {
                self.receiving = other;
                Err(store_error(format!("{id} was not received whole")))
            }
        }
    }

    /// The kept file or the one being received, if it is `id`'s.
    pub fn open(&self, id: &SnapshotId) -> io::Result<Box<dyn SnapshotFile>> {
        let kept = self.kept.as_ref().filter(|(s, _)| descriptor_id(s).is_ok_and(|k| k == *id)).map(|k| &k.1);
        let receiving = self.receiving.as_ref().filter(|(r, _)| r == id).map(|r| &r.1);
        match kept.or(receiving) {
            Some(file) => Ok(Box::new(file.clone())),
            None => Err(io::Error::new(io::ErrorKind::NotFound, format!("no file of {id}"))),
        }
    }

    /// Writes received bytes (see [`Store::receive`]).
    pub fn receive(&mut self, id: &SnapshotId, offset: u64, data: &[u8]) -> io::Result<()> {
        if !matches!(&self.receiving, Some((r, _)) if r == id) {
            if offset != 0 {
                return Err(io::Error::other(format!("{id} is not being received; it starts at offset 0")));
            }
            self.receiving = Some((*id, Arc::default()));
        }
        let file = Arc::make_mut(&mut self.receiving.as_mut().expect("set above").1);
        let at = usize::try_from(offset).ok().filter(|&at| at <= file.len());
        let at =
            at.ok_or_else(|| io::Error::other(format!("offset {offset} beyond the {} bytes received", file.len())))?;
        file.truncate(at);
        file.extend_from_slice(data);
        Ok(())
    }
}

/// The id of the file a snapshot's descriptor names.
pub fn descriptor_id(snapshot: &Snapshot) -> raft::Result<SnapshotId> {
    Descriptor::decode(&snapshot.data).map(|d| d.id).map_err(store_error)
}

fn store_error(why: String) -> raft::Error {
    raft::Error::Store(StorageError::Other(why.into()))
}

impl SnapshotFile for Arc<Vec<u8>> {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        self.as_ref().read_at(offset, buf)
    }

    fn len(&self) -> u64 {
        self.as_ref().len() as u64
    }
}

/// A [`SnapshotSink`] into memory: the file goes to `files.taken` when
/// finished.
struct MemSink {
    files: Arc<Mutex<Files>>,
    bytes: Vec<u8>,
}

impl Write for MemSink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.bytes.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl SnapshotSink for MemSink {
    fn finish(self: Box<Self>) -> io::Result<()> {
        self.files.lock().taken = Some(Arc::new(self.bytes));
        Ok(())
    }
}

impl Default for MemStore {
    fn default() -> Self {
        Self::new(Vec::new())
    }
}

impl MemStore {
    /// A log for a cluster of `voters` (none: the founding entries or the
    /// leader say who the members are).
    pub fn new(voters: Vec<u64>) -> Self {
        Self { mem: MemStorage::new_with_conf_state((voters, vec![])), files: Arc::default(), floor: None }
    }

    /// The same log, as a repair leaves it: with the vote floor `floor`
    /// ([`Store::vote_floor`]).
    pub fn with_vote_floor(mut self, floor: (u64, u64)) -> Self {
        self.floor = Some(floor);
        self
    }

    /// Index of the newest snapshot kept (0: none).
    pub fn snapshot_index(&self) -> u64 {
        self.files.lock().kept.as_ref().map_or(0, |(s, _)| s.get_metadata().index)
    }

    /// Its snapshot files.
    pub fn files(&self) -> &Arc<Mutex<Files>> {
        &self.files
    }

    /// Compacts the log behind `snapshot`, kept: raft restarts from it,
    /// with the membership at its index.
    fn compact(&self, snapshot: &Snapshot, keep_from: u64) -> raft::Result<()> {
        let mut core = self.mem.wl();
        core.set_conf_state(snapshot.get_metadata().get_conf_state().clone());
        let last = core.hard_state().commit;
        let keep_from = keep_from.min(snapshot.get_metadata().index).min(last);
        if keep_from > 1 {
            core.compact(keep_from)?;
        }
        Ok(())
    }
}

impl Store for MemStore {
    fn append(&self, entries: &[Entry], hs: Option<&HardState>) -> raft::Result<()> {
        let mut core = self.mem.wl();
        core.append(entries)?;
        if let Some(hs) = hs {
            core.set_hardstate(hs.clone());
        }
        Ok(())
    }

    fn set_commit(&self, commit: u64) -> raft::Result<()> {
        self.mem.wl().mut_hard_state().set_commit(commit);
        Ok(())
    }

    fn snapshot_writer(&self) -> io::Result<Box<dyn SnapshotSink>> {
        Ok(Box::new(MemSink { files: self.files.clone(), bytes: Vec::new() }))
    }

    fn persist(&self, snapshot: &Snapshot) -> raft::Result<bool> {
        self.files.lock().persist(snapshot)
    }

    fn install(&self, snapshot: Snapshot, keep_from: u64) -> raft::Result<()> {
        let index = snapshot.get_metadata().index;
        match &self.files.lock().kept {
            Some((k, _)) if k.get_metadata().index == index => {}
            // Older than the one kept (or never persisted): nothing to do.
            _ => return Ok(()),
        }
        self.compact(&snapshot, keep_from)
    }

    fn apply_snapshot(&self, snapshot: Snapshot) -> raft::Result<()> {
        self.files.lock().keep_received(&snapshot)?;
        // The log's lock must be released before `compact` takes it.
        let applied = self.mem.wl().apply_snapshot(snapshot.clone());
        applied?;
        self.compact(&snapshot, 0)
    }

    fn kept(&self) -> Option<Snapshot> {
        self.files.lock().kept.as_ref().map(|(s, _)| s.clone())
    }

    fn open_snapshot(&self, id: &SnapshotId) -> io::Result<Box<dyn SnapshotFile>> {
        self.files.lock().open(id)
    }

    fn receiving(&self) -> Option<(SnapshotId, u64)> {
        self.files.lock().receiving.as_ref().map(|(id, f)| (*id, f.len()))
    }

    fn receive(&self, id: &SnapshotId, offset: u64, data: &[u8]) -> io::Result<()> {
        self.files.lock().receive(id, offset, data)
    }

    fn sync_received(&self) -> io::Result<()> {
        Ok(())
    }

    fn vote_floor(&self) -> Option<(u64, u64)> {
        self.floor
    }
}

impl Storage for MemStore {
    fn initial_state(&self) -> raft::Result<RaftState> {
        self.mem.initial_state()
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        self.mem.entries(low, high, max_size, context)
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        self.mem.term(idx)
    }

    fn first_index(&self) -> raft::Result<u64> {
        self.mem.first_index()
    }

    fn last_index(&self) -> raft::Result<u64> {
        self.mem.last_index()
    }

    fn snapshot(&self, request_index: u64, _to: u64) -> raft::Result<Snapshot> {
        match &self.files.lock().kept {
            Some((s, _)) if s.get_metadata().index >= request_index => Ok(s.clone()),
            // Raft asks again later; by then the service manager has taken
            // one.
            _ => Err(raft::Error::Store(StorageError::SnapshotTemporarilyUnavailable)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entry::encode_entry;
    use raft::prelude::ConfState;

    #[test]
    fn a_founded_log_passes_and_one_without_its_membership_is_refused() {
        let members: Vec<Member> = (1..=3)
            .map(|id| {
                Member::new(id, ([127, 0, 0, 1], 7000 + id as u16).into(), ([127, 0, 0, 1], 8000 + id as u16).into())
            })
            .collect();
        let founded = MemStore::default();
        found(&founded, &members).unwrap();
        assert_eq!(founded.last_index().unwrap(), 3);
        check_founded(&founded).unwrap();
        // Founding again changes nothing: the log is no longer empty.
        found(&founded, &members).unwrap();
        assert_eq!(founded.last_index().unwrap(), 3);
        check_founded(&MemStore::default()).unwrap();
        let old = MemStore::new(vec![1, 2, 3]);
        let batch = Entry { index: 1, term: 1, data: encode_entry(&[]).into(), ..Default::default() };
        old.append(&[batch], None).unwrap();
        assert!(check_founded(&old).unwrap_err().contains("start this cluster afresh"));
    }

    /// Writes a snapshot file of `data` at `index` into `s` and keeps it.
    fn take(s: &MemStore, index: u64, data: &[u8]) -> Snapshot {
        let mut w = crate::snapfile::FileWriter::new(s.snapshot_writer().unwrap(), index, 1).unwrap();
        w.write_all(data).unwrap();
        let (sink, id) = w.finish().unwrap();
        sink.finish().unwrap();
        let snap = crate::state::raft_snapshot(id, Vec::new(), ConfState::from((vec![1, 2], vec![])));
        assert!(s.persist(&snap).unwrap());
        snap
    }

    #[test]
    fn snapshots_are_served_once_taken_and_only_to_their_members() {
        let s = MemStore::new(vec![1, 2, 3]);
        assert!(s.snapshot(0, 2).is_err(), "none taken yet");
        let snap = take(&s, 0, b"state");
        s.install(snap.clone(), 0).unwrap();
        assert_eq!(s.snapshot(0, 2).unwrap(), snap);
        assert!(s.snapshot(5, 2).is_err(), "older than asked");
        let raft = RaftLog(s);
        assert!(raft.snapshot(0, 2).is_ok());
        assert!(raft.snapshot(0, 3).is_err(), "replica 3 is not in the snapshot's membership");
    }

    #[test]
    fn a_received_file_is_kept_only_whole_and_as_offered() {
        let leader = MemStore::new(vec![1, 2]);
        let snap = take(&leader, 5, &[7; 3000]);
        let id = descriptor_id(&snap).unwrap();
        let file = leader.open_snapshot(&id).unwrap();
        let mut bytes = vec![0; id.bytes as usize];
        assert_eq!(file.read_at(0, &mut bytes).unwrap(), bytes.len());
        let s = MemStore::new(vec![1, 2]);
        assert!(s.receive(&id, 10, &bytes[..10]).is_err(), "a new file starts at 0");
        s.receive(&id, 0, &bytes[..100]).unwrap();
        assert!(s.apply_snapshot(snap.clone()).is_err(), "not whole");
        assert_eq!(s.receiving(), Some((id, 100)));
        // A rewrite from an offset drops what came after it.
        s.receive(&id, 50, &bytes[50..60]).unwrap();
        assert_eq!(s.receiving(), Some((id, 60)));
        s.receive(&id, 60, &bytes[60..]).unwrap();
        s.apply_snapshot(snap.clone()).unwrap();
        assert_eq!(s.kept(), Some(snap));
        assert_eq!(s.receiving(), None);
        let kept = s.open_snapshot(&id).unwrap();
        let mut again = vec![0; bytes.len()];
        kept.read_at(0, &mut again).unwrap();
        assert_eq!(again, bytes);
    }
}
