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
use parking_lot::Mutex;
use raft::prelude::{Entry, HardState, Snapshot};
use raft::storage::MemStorage;
use raft::{GetEntriesContext, RaftState, Storage, StorageError};
use std::sync::Arc;

/// A replica's durable log: raft's [`Storage`] to read it, and the writes
/// the core makes.
pub trait Store: Storage + Clone + Send + Sync + 'static {
    /// Persists a ready's entries and hard state; returns once they are
    /// durable (synced).
    fn append(&self, entries: &[Entry], hs: Option<&HardState>) -> raft::Result<()>;

    /// Records a new commit index. It need not be synced: the next synced
    /// write makes it durable, and a commit index lost in a crash is
    /// learned again from the leader.
    fn set_commit(&self, commit: u64) -> raft::Result<()>;

    /// Makes a snapshot taken here durable, before [`Store::install`].
    /// Safe to call from any thread; false if a snapshot as new is kept
    /// already.
    fn persist(&self, snapshot: &Snapshot) -> raft::Result<bool>;

    /// Keeps a snapshot taken here (persisted) and compacts the log
    /// before `keep_from`; a snapshot older than the one kept is ignored.
    fn install(&self, snapshot: Snapshot, keep_from: u64) -> raft::Result<()>;

    /// Replaces the log with a snapshot from the leader.
    fn apply_snapshot(&self, snapshot: Snapshot) -> raft::Result<()>;

    /// The newest snapshot kept, if any.
    fn kept(&self) -> Option<Snapshot>;

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
/// snapshots the service manager took, with their data.
#[derive(Clone)]
pub struct MemStore {
    /// The log and hard state.
    pub mem: MemStorage,
    snapshot: Arc<Mutex<Option<Snapshot>>>,
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
        Self { mem: MemStorage::new_with_conf_state((voters, vec![])), snapshot: Arc::new(Mutex::new(None)) }
    }

    /// Index of the newest snapshot kept (0: none).
    pub fn snapshot_index(&self) -> u64 {
        self.snapshot.lock().as_ref().map_or(0, |s| s.get_metadata().index)
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

    fn persist(&self, snapshot: &Snapshot) -> raft::Result<bool> {
        Ok(self.snapshot_index() < snapshot.get_metadata().index)
    }

    fn install(&self, snapshot: Snapshot, keep_from: u64) -> raft::Result<()> {
        let index = snapshot.get_metadata().index;
        let conf = snapshot.get_metadata().get_conf_state().clone();
        {
            let mut kept = self.snapshot.lock();
            if kept.as_ref().is_some_and(|k| k.get_metadata().index >= index) {
                return Ok(());
            }
            *kept = Some(snapshot);
        }
        let mut core = self.mem.wl();
        // Raft restarts from the snapshot: with the membership at its index.
        core.set_conf_state(conf);
        let last = core.hard_state().commit;
        let keep_from = keep_from.min(index).min(last);
        if keep_from > 1 {
            core.compact(keep_from)?;
        }
        Ok(())
    }

    fn apply_snapshot(&self, snapshot: Snapshot) -> raft::Result<()> {
        // The log's lock must be released before `install` takes it.
        let applied = self.mem.wl().apply_snapshot(snapshot.clone());
        applied?;
        self.install(snapshot, 0)
    }

    fn kept(&self) -> Option<Snapshot> {
        self.snapshot.lock().clone()
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
        match &*self.snapshot.lock() {
            Some(s) if s.get_metadata().index >= request_index => Ok(s.clone()),
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

    #[test]
    fn snapshots_are_served_once_taken_and_only_to_their_members() {
        let s = MemStore::new(vec![1, 2, 3]);
        assert!(s.snapshot(0, 2).is_err(), "none taken yet");
        let mut snap = Snapshot::default();
        snap.mut_metadata().index = 0;
        snap.mut_metadata().mut_conf_state().voters = vec![1, 2];
        snap.data = vec![1, 2, 3].into();
        s.install(snap, 0).unwrap();
        assert_eq!(s.snapshot(0, 2).unwrap().data.to_vec(), vec![1, 2, 3]);
        assert!(s.snapshot(5, 2).is_err(), "older than asked");
        let raft = RaftLog(s);
        assert!(raft.snapshot(0, 2).is_ok());
        assert!(raft.snapshot(0, 3).is_err(), "replica 3 is not in the snapshot's membership");
    }
}
