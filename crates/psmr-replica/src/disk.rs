//! The raft log and hard state on disk, with raft-engine (TiKV's log store
//! for raft-rs), and the latest snapshot in a checksummed file beside it.
//!
//! * Entries and hard state of one `Ready` go in one raft-engine write,
//!   synced (`fsync`) before the ready's persisted messages leave: a vote
//!   or an acknowledgement is never sent for something not on disk. One
//!   ready carries every proposal since the previous one, so writes of
//!   many batches share one sync (group commit).
//! * A snapshot is written to a temporary file, synced, renamed over
//!   `snapshot.bin` and the directory synced; only then is the log
//!   compacted behind it. A crash at any point leaves either the old
//!   snapshot with the longer log or the new one.
//! * At start the engine replays its files. A crash leaves the newest file
//!   with an unwritten, preallocated tail, so the log ends at the first
//!   record of the newest file that does not check out (raft-engine's
//!   `TolerateTailCorruption`): what precedes it is checksummed and
//!   intact. Then psmr checks what it can and refuses to start on any
//!   failure rather than serve wrong data: every entry must read back with
//!   a good checksum, the log must reach back to the snapshot, the log must
//!   hold every entry the hard state says is committed, and the snapshot
//!   file's checksum must match.

use crc32fast::Hasher as Crc;
use parking_lot::Mutex;
use protobuf::Message as _;
use raft::prelude::{ConfState, Entry, HardState, Snapshot, SnapshotMetadata};
use raft::{GetEntriesContext, RaftState, Storage, StorageError};
use raft_engine::{Config as EngineConfig, Engine, LogBatch, MessageExt, ReadableSize, RecoveryMode};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use thiserror::Error;

/// The one raft group of a replica, in raft-engine's terms.
const GROUP: u64 = 1;
const HARD_STATE: &[u8] = b"hard_state";
const CONF_STATE: &[u8] = b"conf_state";
const INCARNATION: &[u8] = b"incarnation";
const SNAPSHOT_FILE: &str = "snapshot.bin";
const SNAPSHOT_MAGIC: &[u8; 8] = b"PSMRSNP1";

/// Errors of the disk store.
#[derive(Debug, Error)]
pub enum DiskError {
    /// The directory cannot be created or written.
    #[error("data directory {path}: {source}")]
    Dir {
        /// The directory.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// raft-engine refused (I/O error, corruption, full disk).
    #[error("raft log in {path}: {message}")]
    Engine {
        /// The directory.
        path: String,
        /// raft-engine's message.
        message: String,
    },
    /// The snapshot file is damaged or inconsistent with the log.
    #[error("snapshot {path} is unusable: {why}")]
    Snapshot {
        /// The file.
        path: String,
        /// Why.
        why: String,
    },
}

struct Entries;

impl MessageExt for Entries {
    type Entry = Entry;
    fn index(e: &Entry) -> u64 {
        e.index
    }
}

struct State {
    hs: HardState,
    cs: ConfState,
    snapshot: Option<Snapshot>,
}

/// See the module documentation.
#[derive(Clone)]
pub struct DiskStore {
    engine: Arc<Engine>,
    dir: PathBuf,
    state: Arc<Mutex<State>>,
}

fn engine_err(dir: &Path, e: impl std::fmt::Display) -> DiskError {
    let message = e.to_string();
    let hint = if message.contains("nospace") || message.contains("No space") { " (disk full)" } else { "" };
    DiskError::Engine { path: dir.display().to_string(), message: format!("{message}{hint}") }
}

fn raft_err(e: impl std::fmt::Display) -> raft::Error {
    raft::Error::Store(StorageError::Other(e.to_string().into()))
}

impl DiskStore {
    /// Opens (or creates) the store in `dir` for a cluster of `voters`.
    pub fn open(dir: &Path, voters: Vec<u64>) -> Result<Self, DiskError> {
        let dir_err = |source| DiskError::Dir { path: dir.display().to_string(), source };
        std::fs::create_dir_all(dir).map_err(dir_err)?;
        // Fail now, with a clear message, rather than at the first write.
        let probe = dir.join(".psmr-write-test");
        std::fs::write(&probe, b"ok").and_then(|_| std::fs::remove_file(&probe)).map_err(dir_err)?;
        let log_dir = dir.join("log");
        let config = EngineConfig {
            dir: log_dir.display().to_string(),
            recovery_mode: RecoveryMode::TolerateTailCorruption,
            target_file_size: ReadableSize::mb(32),
            purge_threshold: ReadableSize::mb(256),
            ..EngineConfig::default()
        };
        let engine = Engine::open(config).map_err(|e| engine_err(&log_dir, e))?;
        let hs: HardState =
            engine.get_message(GROUP, HARD_STATE).map_err(|e| engine_err(&log_dir, e))?.unwrap_or_default();
        let cs: Option<ConfState> = engine.get_message(GROUP, CONF_STATE).map_err(|e| engine_err(&log_dir, e))?;
        let snapshot = read_snapshot(&dir.join(SNAPSHOT_FILE))?;
        let store = Self {
            engine: Arc::new(engine),
            dir: dir.to_path_buf(),
            state: Arc::new(Mutex::new(State {
                hs,
                cs: cs.clone().unwrap_or_else(|| ConfState::from((voters, vec![]))),
                snapshot,
            })),
        };
        if cs.is_none() {
            let mut batch = LogBatch::default();
            batch
                .put_message(GROUP, CONF_STATE.to_vec(), &store.state.lock().cs)
                .map_err(|e| engine_err(&log_dir, e))?;
            store.engine.write(&mut batch, true).map_err(|e| engine_err(&log_dir, e))?;
        }
        store.check()?;
        Ok(store)
    }

    /// The log must continue where the snapshot ends, and every entry must
    /// read back intact: raft-engine checks record headers when it opens,
    /// entry checksums only when an entry is read, so every entry is read
    /// once here (the log is short: it is compacted behind snapshots).
    fn check(&self) -> Result<(), DiskError> {
        let snap_index = self.state.lock().snapshot.as_ref().map_or(0, |s| s.get_metadata().index);
        let (Some(first), Some(last)) = (self.engine.first_index(GROUP), self.engine.last_index(GROUP)) else {
            return Ok(());
        };
        if first > snap_index + 1 {
            return Err(DiskError::Snapshot {
                path: self.dir.join(SNAPSHOT_FILE).display().to_string(),
                why: format!("the log starts at {first} but the snapshot ends at {snap_index}"),
            });
        }
        let log = self.dir.join("log");
        let commit = self.state.lock().hs.commit;
        if last < commit {
            return Err(engine_err(
                &log,
                format!("the log ends at {last} but entries up to {commit} were committed: it was damaged or cut"),
            ));
        }
        let mut from = first;
        while from <= last {
            let to = (from + 1024).min(last + 1);
            let mut entries = Vec::new();
            self.engine
                .fetch_entries_to::<Entries>(GROUP, from, to, None, &mut entries)
                .map_err(|e| engine_err(&log, e))?;
            from = to;
        }
        Ok(())
    }

    /// The replica's incarnation, drawn once when the directory was created.
    pub fn incarnation(&self, fresh: u64) -> Result<u64, DiskError> {
        if let Some(v) = self.engine.get(GROUP, INCARNATION) {
            if let Ok(b) = <[u8; 8]>::try_from(v.as_slice()) {
                return Ok(u64::from_be_bytes(b));
            }
        }
        let mut batch = LogBatch::default();
        batch.put(GROUP, INCARNATION.to_vec(), fresh.to_be_bytes().to_vec()).map_err(|e| engine_err(&self.dir, e))?;
        self.engine.write(&mut batch, true).map_err(|e| engine_err(&self.dir, e))?;
        Ok(fresh)
    }

    /// The snapshot kept, if any.
    pub fn snapshot_kept(&self) -> Option<Snapshot> {
        self.state.lock().snapshot.clone()
    }

    /// Persists a ready's entries and hard state, synced.
    pub fn append(&self, entries: &[Entry], hs: Option<&HardState>) -> raft::Result<()> {
        let mut batch = LogBatch::default();
        batch.add_entries::<Entries>(GROUP, entries).map_err(raft_err)?;
        if let Some(hs) = hs {
            batch.put_message(GROUP, HARD_STATE.to_vec(), hs).map_err(raft_err)?;
        }
        if batch.is_empty() {
            return Ok(());
        }
        self.engine.write(&mut batch, true).map_err(raft_err)?;
        if let Some(hs) = hs {
            self.state.lock().hs = hs.clone();
        }
        Ok(())
    }

    /// Records a new commit index (not synced: it can be learnt again).
    pub fn set_commit(&self, commit: u64) -> raft::Result<()> {
        let hs = {
            let mut st = self.state.lock();
            st.hs.commit = commit;
            st.hs.clone()
        };
        let mut batch = LogBatch::default();
        batch.put_message(GROUP, HARD_STATE.to_vec(), &hs).map_err(raft_err)?;
        self.engine.write(&mut batch, false).map_err(raft_err)?;
        Ok(())
    }

    /// Keeps a snapshot taken here and drops the log before `keep_from`.
    pub fn install(&self, snapshot: Snapshot, keep_from: u64) -> raft::Result<()> {
        write_snapshot(&self.dir, &snapshot).map_err(raft_err)?;
        self.state.lock().snapshot = Some(snapshot);
        let last = self.engine.last_index(GROUP).unwrap_or(0);
        if keep_from > 1 {
            self.engine.compact_to(GROUP, keep_from.min(last));
        }
        let _ = self.engine.purge_expired_files();
        Ok(())
    }

    /// Replaces the log with a snapshot from the leader.
    pub fn apply_snapshot(&self, snapshot: Snapshot) -> raft::Result<()> {
        let meta = snapshot.get_metadata().clone();
        if self.engine.first_index(GROUP).is_some_and(|f| f > meta.index + 1) {
            return Err(raft::Error::Store(StorageError::SnapshotOutOfDate));
        }
        write_snapshot(&self.dir, &snapshot).map_err(raft_err)?;
        let mut st = self.state.lock();
        st.hs.term = st.hs.term.max(meta.term);
        st.hs.commit = meta.index;
        st.cs = meta.get_conf_state().clone();
        let mut batch = LogBatch::default();
        batch.add_command(GROUP, raft_engine::Command::Clean);
        batch.put_message(GROUP, HARD_STATE.to_vec(), &st.hs).map_err(raft_err)?;
        batch.put_message(GROUP, CONF_STATE.to_vec(), &st.cs).map_err(raft_err)?;
        let incarnation = self.engine.get(GROUP, INCARNATION);
        if let Some(v) = incarnation {
            batch.put(GROUP, INCARNATION.to_vec(), v).map_err(raft_err)?;
        }
        self.engine.write(&mut batch, true).map_err(raft_err)?;
        st.snapshot = Some(snapshot);
        Ok(())
    }
}

fn snapshot_index(st: &State) -> (u64, u64) {
    st.snapshot.as_ref().map_or((0, 0), |s| (s.get_metadata().index, s.get_metadata().term))
}

impl Storage for DiskStore {
    fn initial_state(&self) -> raft::Result<RaftState> {
        let st = self.state.lock();
        Ok(RaftState::new(st.hs.clone(), st.cs.clone()))
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        _context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        if low < self.first_index()? {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        if high > self.last_index()? + 1 {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        let mut out = Vec::with_capacity((high - low) as usize);
        let max = max_size.into().map(|m| m as usize);
        self.engine.fetch_entries_to::<Entries>(GROUP, low, high, max, &mut out).map_err(raft_err)?;
        // raft-rs expects at least one entry even when the first is too big.
        if out.is_empty() && low < high {
            self.engine.fetch_entries_to::<Entries>(GROUP, low, low + 1, None, &mut out).map_err(raft_err)?;
        }
        Ok(out)
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        let (snap_index, snap_term) = snapshot_index(&self.state.lock());
        if idx == snap_index {
            return Ok(snap_term);
        }
        if idx < self.first_index()? {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        match self.engine.get_entry::<Entries>(GROUP, idx).map_err(raft_err)? {
            Some(e) => Ok(e.term),
            None => Err(raft::Error::Store(StorageError::Unavailable)),
        }
    }

    fn first_index(&self) -> raft::Result<u64> {
        let (snap_index, _) = snapshot_index(&self.state.lock());
        Ok(self.engine.first_index(GROUP).unwrap_or(snap_index + 1))
    }

    fn last_index(&self) -> raft::Result<u64> {
        let (snap_index, _) = snapshot_index(&self.state.lock());
        Ok(self.engine.last_index(GROUP).unwrap_or(snap_index))
    }

    fn snapshot(&self, request_index: u64, _to: u64) -> raft::Result<Snapshot> {
        match &self.state.lock().snapshot {
            Some(s) if s.get_metadata().index >= request_index => Ok(s.clone()),
            _ => Err(raft::Error::Store(StorageError::SnapshotTemporarilyUnavailable)),
        }
    }
}

/// `magic | u32 meta length | meta (protobuf) | u64 data length | data | u32 crc32 of all before`.
fn write_snapshot(dir: &Path, snapshot: &Snapshot) -> std::io::Result<()> {
    let meta = snapshot.get_metadata().write_to_bytes().map_err(std::io::Error::other)?;
    let mut bytes = Vec::with_capacity(snapshot.data.len() + meta.len() + 32);
    bytes.extend_from_slice(SNAPSHOT_MAGIC);
    bytes.extend_from_slice(&(meta.len() as u32).to_be_bytes());
    bytes.extend_from_slice(&meta);
    bytes.extend_from_slice(&(snapshot.data.len() as u64).to_be_bytes());
    bytes.extend_from_slice(&snapshot.data);
    let mut crc = Crc::new();
    crc.update(&bytes);
    bytes.extend_from_slice(&crc.finalize().to_be_bytes());
    let tmp = dir.join(format!("{SNAPSHOT_FILE}.tmp"));
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, dir.join(SNAPSHOT_FILE))?;
    std::fs::File::open(dir)?.sync_all()
}

fn read_snapshot(path: &Path) -> Result<Option<Snapshot>, DiskError> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(DiskError::Snapshot { path: path.display().to_string(), why: e.to_string() }),
    };
    let bad = |why: &str| DiskError::Snapshot { path: path.display().to_string(), why: why.into() };
    if bytes.len() < 8 + 4 + 8 + 4 || &bytes[..8] != SNAPSHOT_MAGIC {
        return Err(bad("not a psmr snapshot (bad header)"));
    }
    let (body, tail) = bytes.split_at(bytes.len() - 4);
    let mut crc = Crc::new();
    crc.update(body);
    if crc.finalize().to_be_bytes() != tail {
        return Err(bad("checksum mismatch (damaged or truncated)"));
    }
    let meta_len = u32::from_be_bytes(body[8..12].try_into().expect("4 bytes")) as usize;
    let rest = body.get(12..).ok_or_else(|| bad("truncated"))?;
    if rest.len() < meta_len + 8 {
        return Err(bad("truncated metadata"));
    }
    let meta = SnapshotMetadata::parse_from_bytes(&rest[..meta_len]).map_err(|e| bad(&e.to_string()))?;
    let data_len = u64::from_be_bytes(rest[meta_len..meta_len + 8].try_into().expect("8 bytes")) as usize;
    let data = &rest[meta_len + 8..];
    if data.len() != data_len {
        return Err(bad("data length does not match"));
    }
    let mut snap = Snapshot { data: data.to_vec().into(), ..Default::default() };
    snap.set_metadata(meta);
    Ok(Some(snap))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(index: u64, term: u64) -> Entry {
        Entry { index, term, data: vec![index as u8].into(), ..Default::default() }
    }

    #[test]
    fn entries_and_state_survive_a_reopen() {
        let dir = std::env::temp_dir().join(format!("psmr-disk-test-{}-a", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        {
            let s = DiskStore::open(&dir, vec![1, 2, 3]).unwrap();
            let hs = HardState { term: 2, vote: 1, commit: 2, ..Default::default() };
            s.append(&[entry(1, 1), entry(2, 1), entry(3, 2)], Some(&hs)).unwrap();
            // Overwriting a suffix truncates what followed.
            s.append(&[entry(3, 3)], None).unwrap();
            assert_eq!(s.incarnation(42).unwrap(), 42);
        }
        let s = DiskStore::open(&dir, vec![1, 2, 3]).unwrap();
        assert_eq!(s.incarnation(7).unwrap(), 42, "drawn once");
        let st = s.initial_state().unwrap();
        assert_eq!((st.hard_state.term, st.hard_state.vote, st.hard_state.commit), (2, 1, 2));
        assert_eq!(st.conf_state.voters, vec![1, 2, 3]);
        assert_eq!((s.first_index().unwrap(), s.last_index().unwrap()), (1, 3));
        assert_eq!(s.term(3).unwrap(), 3);
        let got = s.entries(1, 4, None, GetEntriesContext::empty(false)).unwrap();
        assert_eq!(got.iter().map(|e| e.index).collect::<Vec<_>>(), vec![1, 2, 3]);
        // A snapshot at 2 compacts the log before 2 and survives a reopen.
        let mut snap = Snapshot { data: vec![9; 100].into(), ..Default::default() };
        snap.mut_metadata().index = 2;
        snap.mut_metadata().term = 1;
        s.install(snap, 2).unwrap();
        drop(s);
        let s = DiskStore::open(&dir, vec![1, 2, 3]).unwrap();
        assert_eq!(s.snapshot(0, 2).unwrap().data.to_vec(), vec![9; 100]);
        assert_eq!(s.first_index().unwrap(), 2);
        assert_eq!(s.term(2).unwrap(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_damaged_snapshot_is_refused() {
        let dir = std::env::temp_dir().join(format!("psmr-disk-test-{}-b", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut snap = Snapshot { data: vec![1, 2, 3].into(), ..Default::default() };
        snap.mut_metadata().index = 5;
        write_snapshot(&dir, &snap).unwrap();
        let path = dir.join(SNAPSHOT_FILE);
        assert!(read_snapshot(&path).unwrap().is_some());
        let mut bytes = std::fs::read(&path).unwrap();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let e = DiskStore::open(&dir, vec![1]).err().unwrap().to_string();
        assert!(e.contains("checksum mismatch"), "{e}");
        std::fs::write(&path, &bytes[..10]).unwrap();
        assert!(read_snapshot(&path).unwrap_err().to_string().contains("bad header"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_damaged_log_is_refused() {
        let dir = std::env::temp_dir().join(format!("psmr-disk-test-{}-c", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        {
            // The hard state, early in the file, says 50 entries are
            // committed; damage after it cuts the log short of that.
            let s = DiskStore::open(&dir, vec![1]).unwrap();
            let hs = HardState { term: 1, commit: 50, ..Default::default() };
            s.append(&[entry(1, 1)], Some(&hs)).unwrap();
            for i in 2..=50 {
                s.append(&[entry(i, 1)], None).unwrap();
            }
        }
        let log = std::fs::read_dir(dir.join("log"))
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|x| x == "raftlog"));
        let log = log.expect("a log file");
        let mut bytes = std::fs::read(&log).unwrap();
        // Files may be longer than what was written (preallocation): damage
        // the middle of the records.
        let written = bytes.iter().rposition(|&b| b != 0).expect("records");
        bytes[written / 2] ^= 0xff;
        std::fs::write(&log, &bytes).unwrap();
        let e = DiskStore::open(&dir, vec![1]).err().expect("refused").to_string();
        assert!(e.contains("raft log in") && e.contains("were committed"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_unwritable_directory_is_a_clear_error() {
        let e = DiskStore::open(Path::new("/proc/psmr-cannot-be-here"), vec![1]).err().unwrap().to_string();
        assert!(e.contains("data directory /proc/psmr-cannot-be-here"), "{e}");
    }
}
