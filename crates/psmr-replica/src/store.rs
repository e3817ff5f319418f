//! The raft log in memory, with the service snapshots that replace its
//! compacted prefix, and the encoding of one log entry (a batch of client
//! commands).

use parking_lot::Mutex;
use psmr_model::wire::{Decoder, WireError, REQUEST_COMMANDS_MAX};
use raft::prelude::{Entry, Snapshot};
use raft::storage::MemStorage;
use raft::{GetEntriesContext, RaftState, Storage, StorageError};
use std::sync::Arc;

/// raft-rs's `MemStorage`, except that the snapshots it hands to raft (to
/// send to a follower that fell behind the compacted log) are the service
/// snapshots the service manager took, with their data.
#[derive(Clone)]
pub struct LogStore {
    /// The log and hard state.
    pub mem: MemStorage,
    snapshot: Arc<Mutex<Option<Snapshot>>>,
}

impl LogStore {
    /// A log for a cluster of `voters`.
    pub fn new(voters: Vec<u64>) -> Self {
        Self { mem: MemStorage::new_with_conf_state((voters, vec![])), snapshot: Arc::new(Mutex::new(None)) }
    }

    /// Keeps `snapshot` (taken locally or received) and drops the log up
    /// to `keep_from` (exclusive), which must not pass the snapshot. A
    /// snapshot older than the one kept is ignored.
    pub fn install(&self, snapshot: Snapshot, keep_from: u64) -> raft::Result<()> {
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
        // Raft restarts from the snapshot: with the membership at its index
        // (see `DiskStore::install`).
        core.set_conf_state(conf);
        let last = core.hard_state().commit;
        let keep_from = keep_from.min(index).min(last);
        if keep_from > 1 {
            core.compact(keep_from)?;
        }
        Ok(())
    }

    /// The newest snapshot kept, if any.
    pub fn kept(&self) -> Option<Snapshot> {
        self.snapshot.lock().clone()
    }

    /// Index of the newest snapshot kept (0: none).
    pub fn snapshot_index(&self) -> u64 {
        self.snapshot.lock().as_ref().map_or(0, |s| s.get_metadata().index)
    }
}

impl Storage for LogStore {
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

/// The log a replica keeps: in memory or on disk.
#[derive(Clone)]
pub enum Log {
    /// [`LogStore`].
    Memory(LogStore),
    /// [`crate::disk::DiskStore`].
    Disk(crate::disk::DiskStore),
}

impl Log {
    /// Persists a ready's entries and hard state (synced on disk).
    pub fn append(&self, entries: &[Entry], hs: Option<&raft::prelude::HardState>) -> raft::Result<()> {
        match self {
            Log::Memory(m) => {
                let mut core = m.mem.wl();
                core.append(entries)?;
                if let Some(hs) = hs {
                    core.set_hardstate(hs.clone());
                }
                Ok(())
            }
            Log::Disk(d) => d.append(entries, hs),
        }
    }

    /// Records a new commit index.
    pub fn set_commit(&self, commit: u64) -> raft::Result<()> {
        match self {
            Log::Memory(m) => {
                m.mem.wl().mut_hard_state().set_commit(commit);
                Ok(())
            }
            Log::Disk(d) => d.set_commit(commit),
        }
    }

    /// Makes a snapshot taken here durable ([`crate::disk::DiskStore::persist`];
    /// nothing to do in memory), before [`Log::install`]. Safe to call
    /// from any thread; false if a snapshot as new is already kept.
    pub fn persist(&self, snapshot: &Snapshot) -> raft::Result<bool> {
        match self {
            Log::Memory(m) => Ok(m.snapshot_index() < snapshot.get_metadata().index),
            Log::Disk(d) => d.persist(snapshot),
        }
    }

    /// Keeps a snapshot taken here; compacts the log before `keep_from`.
    pub fn install(&self, snapshot: Snapshot, keep_from: u64) -> raft::Result<()> {
        match self {
            Log::Memory(m) => m.install(snapshot, keep_from),
            Log::Disk(d) => d.install(snapshot, keep_from),
        }
    }

    /// The vote floor of a replica repaired after it lost its log: the
    /// (term, index) of the last entry it had synced, which it may have
    /// acknowledged. Until its log reaches the floor, the replica votes
    /// for no log behind it and never campaigns (see [`crate::guard`]).
    /// A log in memory has none: such a replica never comes back.
    pub fn vote_floor(&self) -> Option<(u64, u64)> {
        match self {
            Log::Memory(_) => None,
            Log::Disk(d) => d.vote_floor(),
        }
    }

    /// Writes a founding replica's first entries (see
    /// [`crate::membership`]) into a log that has never held anything:
    /// one conf-change entry per replica in `replicas`, committed in term
    /// 1. Does nothing to any other log (a restart, a repaired replica).
    pub fn found(&self, replicas: &[crate::config::Member]) -> raft::Result<()> {
        let state = self.initial_state()?;
        let pristine = state.hard_state == raft::prelude::HardState::default()
            && self.last_index()? == 0
            && self.first_index()? == 1;
        if !pristine {
            return Ok(());
        }
        let entries = crate::membership::founding_entries(replicas);
        let hs = raft::prelude::HardState { term: 1, commit: entries.len() as u64, ..Default::default() };
        self.append(&entries, Some(&hs))
    }

    /// The newest snapshot kept, if any (whatever its membership).
    pub fn kept(&self) -> Option<Snapshot> {
        match self {
            Log::Memory(m) => m.kept(),
            Log::Disk(d) => d.snapshot_kept(),
        }
    }

    /// Refuses a log written before membership lived in the log: one that
    /// starts at index 1 with anything but a founding conf change (and has
    /// no snapshot, which would say who the members are). Raft would run on
    /// it with no members.
    pub fn check_founded(&self) -> Result<(), String> {
        if self.kept().is_some() || self.first_index().unwrap_or(1) != 1 || self.last_index().unwrap_or(0) == 0 {
            return Ok(());
        }
        let first = self.entries(1, 2, None, GetEntriesContext::empty(false)).map_err(|e| e.to_string())?;
        match first.first().map(|e| e.get_entry_type()) {
            Some(raft::prelude::EntryType::EntryConfChangeV2) | None => Ok(()),
            Some(other) => Err(format!(
                "the log starts with a {other:?} entry, not the founding membership: it was written by a psmr \
                 that kept the membership outside the log; start this cluster afresh"
            )),
        }
    }

    /// Replaces the log with a snapshot from the leader.
    pub fn apply_snapshot(&self, snapshot: Snapshot) -> raft::Result<()> {
        match self {
            Log::Memory(m) => {
                // The log's lock must be released before `install` takes it.
                let applied = m.mem.wl().apply_snapshot(snapshot.clone());
                applied?;
                m.install(snapshot, 0)
            }
            Log::Disk(d) => d.apply_snapshot(snapshot),
        }
    }
}

impl Storage for Log {
    fn initial_state(&self) -> raft::Result<RaftState> {
        match self {
            Log::Memory(m) => m.initial_state(),
            Log::Disk(d) => d.initial_state(),
        }
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        match self {
            Log::Memory(m) => m.entries(low, high, max_size, context),
            Log::Disk(d) => d.entries(low, high, max_size, context),
        }
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        match self {
            Log::Memory(m) => m.term(idx),
            Log::Disk(d) => d.term(idx),
        }
    }

    fn first_index(&self) -> raft::Result<u64> {
        match self {
            Log::Memory(m) => m.first_index(),
            Log::Disk(d) => d.first_index(),
        }
    }

    fn last_index(&self) -> raft::Result<u64> {
        match self {
            Log::Memory(m) => m.last_index(),
            Log::Disk(d) => d.last_index(),
        }
    }

    /// The snapshot kept, if it counts `to` as a member: a replica that is
    /// not in a snapshot's membership ignores it, and is sent a newer one
    /// (the service manager takes one when a replica joins).
    fn snapshot(&self, request_index: u64, to: u64) -> raft::Result<Snapshot> {
        let snap = match self {
            Log::Memory(m) => m.snapshot(request_index, to),
            Log::Disk(d) => d.snapshot(request_index, to),
        }?;
        let cs = snap.get_metadata().get_conf_state();
        if !cs.voters.contains(&to) && !cs.learners.contains(&to) {
            return Err(raft::Error::Store(StorageError::SnapshotTemporarilyUnavailable));
        }
        Ok(snap)
    }
}

/// One command in a log entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EntryCommand {
    /// The client.
    pub client: u64,
    /// Its sequence number.
    pub seq: u64,
    /// The encoded operation.
    pub op: Vec<u8>,
}

/// A log entry being built, one command at a time, in the encoding
/// [`decode_entry`] reads: a command count, then per command the client,
/// the sequence number and the operation.
pub struct EntryBuilder {
    buf: Vec<u8>,
    count: u32,
}

impl Default for EntryBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl EntryBuilder {
    /// An entry with no command yet.
    pub fn new() -> Self {
        // The count goes in front once it is known.
        Self { buf: vec![0; 4], count: 0 }
    }

    /// Appends one command.
    pub fn push(&mut self, client: u64, seq: u64, op: &[u8]) {
        encode_command(&mut self.buf, client, seq, op);
        self.count += 1;
    }

    /// Appends `count` commands already encoded by [`encode_command`].
    pub fn extend_encoded(&mut self, count: u32, encoded: &[u8]) {
        self.buf.extend_from_slice(encoded);
        self.count += count;
    }

    /// Commands so far.
    pub fn len(&self) -> usize {
        self.count as usize
    }

    /// Makes room for `bytes` more bytes of commands.
    pub fn reserve(&mut self, bytes: usize) {
        self.buf.reserve(bytes);
    }

    /// No command yet.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The encoded entry; the builder starts over empty.
    pub fn take(&mut self) -> Vec<u8> {
        let mut buf = std::mem::replace(&mut self.buf, vec![0; 4]);
        buf[..4].copy_from_slice(&self.count.to_be_bytes());
        self.count = 0;
        buf
    }
}

/// Appends one command to `buf` in the entry encoding (without the count
/// in front of an entry's commands), as ClientIO prepares a request.
pub fn encode_command(buf: &mut Vec<u8>, client: u64, seq: u64, op: &[u8]) {
    buf.extend_from_slice(&client.to_be_bytes());
    buf.extend_from_slice(&seq.to_be_bytes());
    buf.extend_from_slice(&u32::try_from(op.len()).expect("operations are far below 4 GiB").to_be_bytes());
    buf.extend_from_slice(op);
}

/// Encodes a log entry.
pub fn encode_entry(commands: &[EntryCommand]) -> Vec<u8> {
    let mut e = EntryBuilder::new();
    for c in commands {
        e.push(c.client, c.seq, &c.op);
    }
    e.take()
}

/// One command of a log entry, borrowed from the entry's bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntryRef<'a> {
    /// The client.
    pub client: u64,
    /// Its sequence number.
    pub seq: u64,
    /// The encoded operation.
    pub op: &'a [u8],
}

/// Decodes a log entry without copying its operations.
pub fn entry_commands(bytes: &[u8]) -> Result<Vec<EntryRef<'_>>, WireError> {
    let mut d = Decoder::new(bytes, "log entry");
    let n = d.count(REQUEST_COMMANDS_MAX * 100, 20)?;
    commands(d, n)
}

/// Decodes the `count` commands of one request as [`encode_command`]
/// wrote them (an entry's encoding without the count in front).
pub fn request_commands(bytes: &[u8], count: u32) -> Result<Vec<EntryRef<'_>>, WireError> {
    let n = count as usize;
    if n > bytes.len() / 20 {
        return Err(WireError::Malformed {
            what: "request",
            why: format!("{n} commands cannot fit in {} bytes", bytes.len()),
        });
    }
    commands(Decoder::new(bytes, "request"), n)
}

fn commands(mut d: Decoder<'_>, n: usize) -> Result<Vec<EntryRef<'_>>, WireError> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(EntryRef { client: d.u64()?, seq: d.u64()?, op: d.bytes()? });
    }
    d.end()?;
    Ok(out)
}

/// Decodes a log entry.
pub fn decode_entry(bytes: &[u8]) -> Result<Vec<EntryCommand>, WireError> {
    Ok(entry_commands(bytes)?
        .into_iter()
        .map(|c| EntryCommand { client: c.client, seq: c.seq, op: c.op.to_vec() })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_founded_log_passes_and_one_without_its_membership_is_refused() {
        let members: Vec<crate::Member> = (1..=3)
            .map(|id| {
                crate::Member::new(
                    id,
                    ([127, 0, 0, 1], 7000 + id as u16).into(),
                    ([127, 0, 0, 1], 8000 + id as u16).into(),
                )
            })
            .collect();
        let founded = Log::Memory(LogStore::new(Vec::new()));
        founded.found(&members).unwrap();
        assert_eq!(founded.last_index().unwrap(), 3);
        founded.check_founded().unwrap();
        // Founding again changes nothing: the log is no longer empty.
        founded.found(&members).unwrap();
        assert_eq!(founded.last_index().unwrap(), 3);
        let empty = Log::Memory(LogStore::new(Vec::new()));
        empty.check_founded().unwrap();
        let old = Log::Memory(LogStore::new(vec![1, 2, 3]));
        let batch = Entry { index: 1, term: 1, data: encode_entry(&[]).into(), ..Default::default() };
        old.append(&[batch], None).unwrap();
        assert!(old.check_founded().unwrap_err().contains("start this cluster afresh"));
    }

    #[test]
    fn entries_round_trip_and_garbage_is_refused() {
        let cmds =
            vec![EntryCommand { client: 1, seq: 2, op: vec![3] }, EntryCommand { client: 4, seq: 5, op: vec![] }];
        let bytes = encode_entry(&cmds);
        assert_eq!(decode_entry(&bytes).unwrap(), cmds);
        assert!(decode_entry(&bytes[..bytes.len() - 1]).is_err());
        assert!(decode_entry(&[0xff, 0xff, 0xff, 0xff]).is_err());
    }

    #[test]
    fn an_entry_built_from_encoded_requests_is_the_entry_of_their_commands() {
        let cmds: Vec<EntryCommand> =
            (0..5u64).map(|i| EntryCommand { client: i % 2 + 1, seq: i, op: vec![i as u8; i as usize] }).collect();
        let mut b = EntryBuilder::new();
        b.push(cmds[0].client, cmds[0].seq, &cmds[0].op);
        let mut request = Vec::new();
        for c in &cmds[1..] {
            encode_command(&mut request, c.client, c.seq, &c.op);
        }
        b.extend_encoded(4, &request);
        assert_eq!(b.len(), 5);
        let entry = b.take();
        assert_eq!(entry, encode_entry(&cmds));
        assert!(b.is_empty(), "take starts over");
        assert_eq!(decode_entry(&b.take()).unwrap(), vec![]);
        let borrowed: Vec<_> =
            entry_commands(&entry).unwrap().into_iter().map(|c| (c.client, c.seq, c.op.to_vec())).collect();
        let owned: Vec<_> = cmds.into_iter().map(|c| (c.client, c.seq, c.op)).collect();
        assert_eq!(borrowed, owned);
    }

    #[test]
    fn snapshots_are_served_once_taken() {
        let s = LogStore::new(vec![1, 2, 3]);
        assert!(s.snapshot(0, 2).is_err(), "none taken yet");
        let mut snap = Snapshot::default();
        snap.mut_metadata().index = 0;
        snap.data = vec![1, 2, 3].into();
        s.install(snap, 0).unwrap();
        assert_eq!(s.snapshot(0, 2).unwrap().data.to_vec(), vec![1, 2, 3]);
        assert!(s.snapshot(5, 2).is_err(), "older than asked");
    }
}
