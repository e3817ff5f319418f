//! The raft log and hard state on disk, with raft-engine (TiKV's log store
//! for raft-rs), the latest snapshot in a checksummed file beside it, and
//! the sync record ([`crate::synced`]) that says how far the log was synced.
//!
//! # Writing
//!
//! * Entries and hard state of one `Ready` go in one raft-engine write,
//!   synced (`fsync`) before the ready's persisted messages leave: a vote
//!   or an acknowledgement is never sent for something not on disk. One
//!   ready carries every proposal since the previous one, so writes of
//!   many batches share one sync (group commit).
//! * After each synced write (and after a snapshot from the leader
//!   replaced the log), the sync record gets the new last entry and hard
//!   state: one positioned write of a few dozen bytes, no extra sync.
//! * A snapshot is written a piece at a time as the service produces it
//!   (`snapshot.next`), synced, renamed over `snapshot.bin` and the
//!   directory synced; only then is the log compacted behind it. A crash
//!   at any point leaves either the old snapshot with the longer log or
//!   the new one. One from the leader arrives in chunks (`snapshot.recv`)
//!   and takes the same rename once whole and checked. See
//!   `snapfiles.rs` for the files. Membership at a restart
//!   is the snapshot file's, since the log is replayed from it; the key
//!   beside the log that also holds it may lag or, written by older
//!   builds, lead the file after a crash.
//!
//! # Recovery
//!
//! raft-engine alone cannot tell a torn tail (a crash leaves one: the
//! newest file is preallocated, and its last write may be half done) from
//! damage: in its tolerant mode it cuts the newest file at the first record
//! that does not check out, wherever that is, and the replica comes back
//! with its log *and hard state* rolled back. So psmr opens the log in two
//! steps and compares what it finds with the sync record:
//!
//! 1. raft-engine in `AbsoluteConsistency` mode, which refuses anything
//!    that does not check out. If it opens, the recovered log and hard
//!    state must *cover* the record: the log reaches the recorded last
//!    entry with the same term (unless compacted behind the snapshot, or
//!    replaced by entries of a later term), and the hard state's term,
//!    vote and commit are not behind. A log cut at a record boundary fails
//!    here; psmr refuses, naming the newest log file and its length.
//! 2. If the strict open fails on corruption, the newest file of each
//!    raft-engine queue is copied aside (into `recovery/`, synced), and
//!    raft-engine opens again with `TolerateTailCorruption`, which cuts
//!    those files in place. If the result covers the record, only an
//!    unsynced tail was cut: psmr logs a warning naming each file and the
//!    byte it was cut at, and drops the copies. Otherwise it puts the
//!    copies back, so the files are exactly as they were (evidence for a
//!    repair), and refuses, naming the file and the byte where the damage
//!    starts. When raft-engine itself refuses (damage in an older file, or
//!    in a file header), psmr locates the first record that does not check
//!    out by walking the files itself (read only) and names it.
//!
//! Then, as before, every entry must read back with a good checksum
//! (raft-engine checks entry blocks only when they are read; a damaged one
//! is located and named the same way), the log must reach back to the
//! snapshot, hold every entry the hard state says is committed, and the
//! snapshot file's checksum must match. A missing or unreadable sync record
//! beside a non-empty log is refused: it cannot be told from damage. A
//! directory written before the sync record existed (its incarnation is a
//! raft-engine key) is migrated once, if its log opens strictly and passes
//! every check; otherwise it is refused the same way.
//!
//! After a crash in the middle of recovery, the copies in `recovery/` are
//! put back first, so recovery starts over from the files as they were.
//!
//! On any refusal the replica does not start; nothing is ever repaired
//! automatically. [`DiskStore::repair`] (`psmr replica --repair`) is the
//! operator's deliberate step: it moves the data aside and rebuilds the
//! replica empty under the same identity, keeping its term and vote and
//! setting a vote floor (see [`DiskStore::vote_floor`]).
//!
//! # Privacy
//!
//! The replica directory and `log/` are created 0700 (an existing one that
//! group or others can reach is tightened, with a warning); every file
//! psmr writes is created 0600, and raft-engine writes through a file
//! system that does the same (`private.rs`), so the log files it
//! adds as the log rotates are private from the start. Files a build
//! before that left looser are tightened at every open.

use crate::log::SyncTimer;
use crate::private::Engine;
use crate::snapfiles::SnapFiles;
use crate::synced::{covers, sync_dir, SyncRecord, SyncState, RECORD_FILE};
use parking_lot::Mutex;
use psmr_core::snapfile::{SnapshotFile, SnapshotId};
use psmr_core::store::{descriptor_id, SnapshotSink};
use raft::prelude::{ConfState, Entry, HardState, Snapshot};
use raft::{GetEntriesContext, RaftState, Storage, StorageError};
use raft_engine::{Config as EngineConfig, LogBatch, MessageExt, ReadableSize, RecoveryMode};
use std::fs::{DirBuilder, File, OpenOptions, Permissions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use thiserror::Error;
use tracing::{debug, warn};

/// The one raft group of a replica, in raft-engine's terms.
const GROUP: u64 = 1;
const HARD_STATE: &[u8] = b"hard_state";
const CONF_STATE: &[u8] = b"conf_state";
/// Where the incarnation was kept before the sync record existed: read once
/// to migrate such a directory, then deleted.
const LEGACY_INCARNATION: &[u8] = b"incarnation";
const LOG_DIR: &str = "log";
/// Copies of the newest log files while raft-engine cuts a torn tail.
const RECOVERY_DIR: &str = "recovery";
/// Suffix of the directory a repair builds before it takes the replica's
/// place.
const REPAIRING: &str = ".repairing";
const REPAIR_HINT: &str = "The files are left exactly as they were. `psmr replica --repair` moves this replica's \
                           data aside (nothing is deleted) and rebuilds it empty under the same identity, keeping \
                           its term and vote; it then catches up from the leader";
const NO_RECORD_HINT: &str = "The files are left as they were. `--repair` needs the record as well (it holds the \
                              term this replica voted in and what it acknowledged): keep the directory as evidence \
                              and replace this replica";
/// Entries read at a time when every entry is checked at open.
const CHECK_CHUNK: u64 = 1024;

/// Errors of the disk store.
#[derive(Debug, Error)]
pub enum DiskError {
    /// The directory, or a file in it, cannot be created, read or written.
    #[error("data directory {path}: {source}")]
    Dir {
        /// The directory or file.
        path: String,
        /// Why.
        source: io::Error,
    },
    /// raft-engine refused (I/O error, full disk).
    #[error("raft log in {path}: {message}")]
    Engine {
        /// The directory.
        path: String,
        /// raft-engine's message.
        message: String,
    },
    /// Another process holds the raft log (a replica runs on this
    /// directory).
    #[error("raft log in {path} is in use by another process: is a replica already running on this directory?")]
    Busy {
        /// The directory.
        path: String,
    },
    /// The snapshot file is damaged or inconsistent with the log.
    #[error("snapshot {path} is unusable: {why}")]
    Snapshot {
        /// The file.
        path: String,
        /// Why.
        why: String,
    },
    /// A raft log file is damaged where it held synced data.
    #[error(
        "raft log file {file} is damaged at byte {offset}: {why}. The replica refuses to start rather than lose \
         entries it acknowledged. {hint}",
        hint = REPAIR_HINT
    )]
    LogDamaged {
        /// The file.
        file: String,
        /// Where the first record that does not check out starts.
        offset: u64,
        /// What is wrong and what it would lose.
        why: String,
    },
    /// The log checks out but ends short of what was synced: it was cut at
    /// a record boundary, or files are missing.
    #[error(
        "the raft log ends short of what was synced: {why}; its newest file {file} is {length} bytes long, so it \
         was cut or lost. The replica refuses to start rather than lose entries it acknowledged. {hint}",
        hint = REPAIR_HINT
    )]
    LogCut {
        /// The newest log file (the log directory if there is none).
        file: String,
        /// Its length in bytes.
        length: u64,
        /// What is missing.
        why: String,
    },
    /// The sync record is missing beside a log, or unreadable.
    #[error("sync record {path}: {why}")]
    Record {
        /// The file.
        path: String,
        /// Why.
        why: String,
    },
    /// The replica directory is missing because a repair was interrupted.
    #[error(
        "{path} is missing, and {path}{REPAIRING} holds a rebuilt replica: a repair was interrupted; run \
         `psmr replica --repair` again to finish it"
    )]
    Interrupted {
        /// The replica directory.
        path: String,
    },
    /// [`DiskStore::repair`] refused.
    #[error("cannot repair {path}: {why}")]
    Repair {
        /// The replica directory.
        path: String,
        /// Why.
        why: String,
    },
}

/// Settings of a [`DiskStore`]; `Default` is what replicas use.
#[derive(Clone, Debug)]
pub struct DiskOptions {
    /// Size at which raft-engine starts a new log file. Small values (tests)
    /// give many files.
    pub log_file_bytes: u64,
}

impl Default for DiskOptions {
    fn default() -> Self {
        DiskOptions { log_file_bytes: 32 << 20 }
    }
}

/// What [`DiskStore::repair`] did.
#[derive(Clone, Debug)]
pub struct RepairReport {
    /// The replica directory, rebuilt.
    pub dir: PathBuf,
    /// Where its old contents went (nothing was deleted); `None` if this
    /// call only finished an interrupted repair that had moved them.
    pub moved_to: Option<PathBuf>,
    /// Why the replica could not start (what [`DiskStore::open`] said);
    /// `None` if the data passed every check and was set aside anyway.
    pub damage: Option<String>,
    /// The incarnation, kept: the replica's identity.
    pub incarnation: u64,
    /// The hard state's term, kept.
    pub term: u64,
    /// The vote in that term, kept (0: none): a replica never votes twice
    /// in a term.
    pub vote: u64,
    /// The vote floor set, (term, index); see [`DiskStore::vote_floor`].
    pub vote_floor: Option<(u64, u64)>,
}

impl std::fmt::Display for RepairReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.moved_to {
            Some(to) => {
                writeln!(f, "repair: moved the data of {} to {} (nothing deleted)", self.dir.display(), to.display())?
            }
            None => writeln!(f, "repair: finished an interrupted repair of {}", self.dir.display())?,
        }
        match &self.damage {
            Some(why) => writeln!(f, "repair: it could not start: {why}")?,
            None => writeln!(f, "repair: it passed every check; set aside anyway, as asked")?,
        }
        write!(
            f,
            "repair: rebuilt it empty with incarnation {}, term {} and vote {} kept",
            self.incarnation, self.term, self.vote
        )?;
        match self.vote_floor {
            Some((term, index)) => write!(
                f,
                ", and a vote floor at entry {index} of term {term} (it may have acknowledged entries up to there); \
                 it catches up from the leader"
            ),
            None => write!(f, "; it catches up from the leader"),
        }
    }
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
    /// (term, index) of the last entry (of the snapshot if the log is empty).
    last: (u64, u64),
    /// The record's vote floor, readable while a writer holds the record
    /// (through a sync).
    floor: Option<(u64, u64)>,
}

/// See the module documentation.
#[derive(Clone)]
pub struct DiskStore {
    engine: Arc<Engine>,
    state: Arc<Mutex<State>>,
    /// Also serializes the writers, so that records follow the engine's
    /// writes in order. Locked before `state`.
    record: Arc<Mutex<SyncRecord>>,
    /// The index of the snapshot in the snapshot file (0: none). Locked
    /// after `record` when both are; held alone while a snapshot taken
    /// here is written, off the protocol thread.
    snapshot_file: Arc<Mutex<u64>>,
    /// The snapshot files: kept, being taken, being received.
    files: Arc<SnapFiles>,
    incarnation: u64,
    /// Where the time of each synced write goes, once the replica runs.
    sync_time: Arc<std::sync::OnceLock<SyncTimer>>,
    /// Purges the files compactions leave behind, off the caller's thread.
    purger: Arc<crate::purge::Purger>,
}

fn engine_err(dir: &Path, e: impl std::fmt::Display) -> DiskError {
    let message = e.to_string();
    let hint = if message.contains("nospace") || message.contains("No space") { " (disk full)" } else { "" };
    DiskError::Engine { path: dir.display().to_string(), message: format!("{message}{hint}") }
}

/// raft-engine refused to open: corruption goes to the recovery steps, the
/// rest is an error of its own.
fn open_err(dir: &Path, e: raft_engine::Error) -> DiskError {
    match &e {
        // raft-engine's only `Other` errors at open: its directory lock, and
        // a path that is not a directory.
        raft_engine::Error::Other(m) if m.to_string().contains("lock") => {
            DiskError::Busy { path: dir.display().to_string() }
        }
        _ => engine_err(dir, e),
    }
}

/// Errors of a strict open that may be a torn tail; I/O errors (a failing
/// disk, permissions) and the directory lock are not.
fn tolerable(e: &raft_engine::Error) -> bool {
    !matches!(e, raft_engine::Error::Io(_) | raft_engine::Error::Other(_))
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> DiskError + '_ {
    move |source| DiskError::Dir { path: path.display().to_string(), source }
}

fn raft_err(e: impl std::fmt::Display) -> raft::Error {
    raft::Error::Store(StorageError::Other(e.to_string().into()))
}

/// The files of a replica directory.
struct Layout {
    dir: PathBuf,
    log: PathBuf,
    record: PathBuf,
    snapshot: PathBuf,
    recovery: PathBuf,
}

impl Layout {
    fn new(dir: &Path) -> Layout {
        Layout {
            dir: dir.to_path_buf(),
            log: dir.join(LOG_DIR),
            record: dir.join(RECORD_FILE),
            snapshot: dir.join(crate::snapfiles::CURRENT),
            recovery: dir.join(RECOVERY_DIR),
        }
    }

    fn record_err(&self) -> impl FnOnce(io::Error) -> DiskError + '_ {
        move |e| DiskError::Record { path: self.record.display().to_string(), why: e.to_string() }
    }
}

/// `dir` with `suffix` appended to its name.
fn sibling(dir: &Path, suffix: &str) -> PathBuf {
    let mut s = dir.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

fn engine_config(log: &Path, mode: RecoveryMode, options: &DiskOptions) -> EngineConfig {
    EngineConfig {
        dir: log.display().to_string(),
        recovery_mode: mode,
        target_file_size: ReadableSize(options.log_file_bytes),
        purge_threshold: ReadableSize(options.log_file_bytes.saturating_mul(8)),
        ..EngineConfig::default()
    }
}

/// Creates `path` (and missing parents) 0700, or tightens it to 0700 if
/// group or others can reach it.
fn private_dir(path: &Path) -> Result<(), DiskError> {
    DirBuilder::new().recursive(true).mode(0o700).create(path).map_err(io_err(path))?;
    let mode = std::fs::metadata(path).map_err(io_err(path))?.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        std::fs::set_permissions(path, Permissions::from_mode(0o700)).map_err(io_err(path))?;
        warn!(path = %path.display(), "the data directory was open to other users (mode {mode:o}): tightened to 0700");
    }
    Ok(())
}

/// Makes every file in `dir` 0600 (raft-engine creates its own with the
/// process umask).
fn private_files(dir: &Path) -> Result<(), DiskError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_err(dir)(e)),
    };
    for entry in entries {
        let entry = entry.map_err(io_err(dir))?;
        let meta = entry.metadata().map_err(io_err(&entry.path()))?;
        if meta.is_file() && meta.permissions().mode() & 0o077 != 0 {
            let path = entry.path();
            std::fs::set_permissions(&path, Permissions::from_mode(0o600)).map_err(io_err(&path))?;
            debug!(path = %path.display(), "made private (0600)");
        }
    }
    Ok(())
}

/// Creates a file only its owner can read, replacing any file (a
/// temporary left by a crash, whatever its mode) at `path`. Never writes
/// through a link planted there.
fn create_private(path: &Path) -> io::Result<File> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    OpenOptions::new().write(true).create_new(true).mode(0o600).open(path)
}

fn fresh_incarnation() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos());
    h.write_u32(std::process::id());
    h.finish() | 1
}

/// Whether `dir` holds raft-engine log files.
pub(crate) fn holds_log(dir: &Path) -> bool {
    log_files(&dir.join(LOG_DIR)).is_ok_and(|files| !files.is_empty())
}

/// One raft-engine log file.
#[derive(Clone, Debug)]
struct LogFile {
    path: PathBuf,
    /// In the rewrite queue (raft-engine's compacted copies), not the
    /// append queue.
    rewrite: bool,
    seq: u64,
}

/// raft-engine's log files in `log`, append queue first, each queue
/// oldest first (raft-engine's own naming rule).
fn log_files(log: &Path) -> Result<Vec<LogFile>, DiskError> {
    let entries = match std::fs::read_dir(log) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_err(log)(e)),
    };
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry.map_err(io_err(log))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(seq) = name.get(..16).and_then(|s| s.parse::<u64>().ok()).filter(|_| name.len() > 16) else {
            continue;
        };
        let rewrite = if name.ends_with(".raftlog") {
            false
        } else if name.ends_with(".rewrite") {
            true
        } else {
            continue;
        };
        files.push(LogFile { path: entry.path(), rewrite, seq });
    }
    files.sort_by_key(|f| (f.rewrite, f.seq));
    Ok(files)
}

fn file_len(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}

/// What the checks found wrong.
enum Mismatch {
    /// The log or hard state is behind what was synced or committed.
    Behind(String),
    /// Something does not read back.
    Unreadable(String),
    /// Any other refusal, already an error.
    Fatal(DiskError),
}

/// What a checked log holds.
struct Checked {
    hs: HardState,
    cs: Option<ConfState>,
    last: (u64, u64),
}

struct Recovered {
    engine: Engine,
    checked: Checked,
}

/// Every check of the recovered log; see the module documentation.
fn verify(
    engine: &Engine,
    layout: &Layout,
    expect: &SyncState,
    snapshot: Option<&Snapshot>,
) -> Result<Checked, Mismatch> {
    let unreadable =
        |what: &str, e: raft_engine::Error| Mismatch::Unreadable(format!("{what} does not read back ({e})"));
    let hs: HardState =
        engine.get_message(GROUP, HARD_STATE).map_err(|e| unreadable("the hard state", e))?.unwrap_or_default();
    let cs: Option<ConfState> = engine.get_message(GROUP, CONF_STATE).map_err(|e| unreadable("the conf state", e))?;
    let (snap_index, snap_term) = snapshot.map_or((0, 0), |s| (s.get_metadata().index, s.get_metadata().term));
    let mut last = (snap_term, snap_index);
    if let (Some(first), Some(last_index)) = (engine.first_index(GROUP), engine.last_index(GROUP)) {
        if first > snap_index + 1 {
            return Err(Mismatch::Fatal(DiskError::Snapshot {
                path: layout.snapshot.display().to_string(),
                why: format!("the log starts at {first} but the snapshot ends at {snap_index}"),
            }));
        }
        last = (read_every_entry(engine, first, last_index)?, last_index);
    }
    if last.1 < hs.commit {
        return Err(Mismatch::Behind(format!(
            "the log ends at entry {} but the hard state says entries up to {} were committed",
            last.1, hs.commit
        )));
    }
    covers(expect, &hs, last, (snap_index, snap_term), |i| {
        engine.get_entry::<Entries>(GROUP, i).ok().flatten().map(|e| e.term)
    })
    .map_err(Mismatch::Behind)?;
    Ok(Checked { hs, cs, last })
}

/// Reads every entry once: raft-engine checks record checksums when it
/// opens, the checksums of entry blocks only when they are read. The log is
/// short (compacted behind snapshots). Returns the last entry's term.
fn read_every_entry(engine: &Engine, first: u64, last: u64) -> Result<u64, Mismatch> {
    let mut from = first;
    let mut last_term = 0;
    while from <= last {
        let to = (from + CHECK_CHUNK).min(last + 1);
        let mut entries = Vec::new();
        let read = engine.fetch_entries_to::<Entries>(GROUP, from, to, None, &mut entries);
        if read.is_err() || entries.len() as u64 != to - from {
            // Name the first entry that does not read back.
            let bad = (from..to)
                .find(|&i| !matches!(engine.get_entry::<Entries>(GROUP, i), Ok(Some(e)) if e.index == i))
                .unwrap_or(from);
            let why = read.err().map_or_else(|| "missing".to_string(), |e| e.to_string());
            return Err(Mismatch::Unreadable(format!("log entry {bad} does not read back ({why})")));
        }
        last_term = entries.last().map_or(last_term, |e| e.term);
        from = to;
    }
    Ok(last_term)
}

/// The refusal for `mismatch`. `cut` is where raft-engine cut a file in
/// tolerant mode (put back since), the damage when the log is then behind.
fn refusal(layout: &Layout, mismatch: Mismatch, cut: Option<&Cut>) -> DiskError {
    match (mismatch, cut) {
        (Mismatch::Fatal(e), _) => e,
        (Mismatch::Behind(why), Some(cut)) => {
            // Say what is wrong there, if the walk agrees on the place.
            let what = match first_bad_record(&cut.file) {
                Ok(Some((offset, what))) if offset == cut.offset => what,
                _ => "raft-engine cannot read past it",
            };
            DiskError::LogDamaged {
                file: cut.file.path.display().to_string(),
                offset: cut.offset,
                why: format!("{what}; without it and what follows, {why}"),
            }
        }
        (Mismatch::Behind(why), None) => {
            let files = log_files(&layout.log).unwrap_or_default();
            match files.iter().rfind(|f| !f.rewrite) {
                Some(newest) => {
                    DiskError::LogCut { file: newest.path.display().to_string(), length: file_len(&newest.path), why }
                }
                None => DiskError::LogCut { file: layout.log.display().to_string(), length: 0, why },
            }
        }
        (Mismatch::Unreadable(why), _) => locate(layout, why),
    }
}

/// Names the first record in the log files that does not check out.
fn locate(layout: &Layout, why: String) -> DiskError {
    for file in log_files(&layout.log).unwrap_or_default() {
        match first_bad_record(&file) {
            Ok(None) => {}
            Ok(Some((offset, what))) => {
                return DiskError::LogDamaged {
                    file: file.path.display().to_string(),
                    offset,
                    why: format!("{what}; {why}"),
                };
            }
            Err(e) => {
                return DiskError::LogDamaged {
                    file: file.path.display().to_string(),
                    offset: 0,
                    why: format!("it cannot be read ({e}; {why})"),
                };
            }
        }
    }
    DiskError::Engine {
        path: layout.log.display().to_string(),
        message: format!("{why}; no damaged record was found in its files. {REPAIR_HINT}"),
    }
}

/// Where raft-engine cut a file in tolerant mode.
#[derive(Debug)]
struct Cut {
    file: LogFile,
    offset: u64,
    was: u64,
}

/// Synced copies of the newest log files, taken before raft-engine cuts
/// them in tolerant mode.
struct Backup<'a> {
    layout: &'a Layout,
    /// (original, copy, length).
    files: Vec<(LogFile, PathBuf, u64)>,
}

impl<'a> Backup<'a> {
    fn take(layout: &'a Layout, files: &[&LogFile]) -> Result<Backup<'a>, DiskError> {
        private_dir(&layout.recovery)?;
        let mut backup = Backup { layout, files: Vec::new() };
        for file in files {
            let Some(name) = file.path.file_name() else { continue };
            let copy = layout.recovery.join(name);
            // Only a complete, synced copy gets the file's own name: that is
            // what `restore_leftovers` puts back after a crash.
            let partial = sibling(&copy, ".partial");
            let copied = (|| {
                let mut src = File::open(&file.path)?;
                let mut dst = create_private(&partial)?;
                io::copy(&mut src, &mut dst)?;
                dst.sync_all()?;
                std::fs::rename(&partial, &copy)
            })();
            copied.map_err(io_err(&copy))?;
            backup.files.push(((*file).clone(), copy.clone(), file_len(&copy)));
        }
        sync_dir(&layout.recovery).map_err(io_err(&layout.recovery))?;
        Ok(backup)
    }

    /// The files raft-engine cut since the copies were taken.
    fn cuts(&self) -> Vec<Cut> {
        self.files
            .iter()
            .filter_map(|(file, copy, was)| {
                let now = file_len(&file.path);
                // A file with a broken header is emptied, then gets a new
                // header: the cut is at 0, not at its new length.
                let offset = if header_ok(copy) { now.min(*was) } else { 0 };
                (now != *was).then(|| Cut { file: file.clone(), offset, was: *was })
            })
            .collect()
    }

    /// Puts the copies back: the files are as they were before.
    fn restore(self) -> Result<(), DiskError> {
        for (file, copy, _) in &self.files {
            std::fs::rename(copy, &file.path).map_err(io_err(&file.path))?;
        }
        sync_dir(&self.layout.log).map_err(io_err(&self.layout.log))?;
        self.remove_dir()
    }

    /// Drops the copies: the cut files stand.
    fn discard(self) -> Result<(), DiskError> {
        for (_, copy, _) in &self.files {
            std::fs::remove_file(copy).map_err(io_err(copy))?;
        }
        self.remove_dir()
    }

    fn remove_dir(&self) -> Result<(), DiskError> {
        let recovery = &self.layout.recovery;
        std::fs::remove_dir(recovery).map_err(io_err(recovery))?;
        sync_dir(&self.layout.dir).map_err(io_err(&self.layout.dir))
    }
}

/// Puts back the copies a crash left in `recovery/` (see [`Backup`]), so
/// recovery starts over from the files as they were.
fn restore_leftovers(layout: &Layout) -> Result<(), DiskError> {
    let entries = match std::fs::read_dir(&layout.recovery) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_err(&layout.recovery)(e)),
    };
    for entry in entries {
        let entry = entry.map_err(io_err(&layout.recovery))?;
        let path = entry.path();
        if path.extension().is_some_and(|x| x == "partial") {
            std::fs::remove_file(&path).map_err(io_err(&path))?;
            continue;
        }
        let original = layout.log.join(entry.file_name());
        std::fs::rename(&path, &original).map_err(io_err(&original))?;
        warn!(file = %original.display(), "put back the copy of a raft log file taken by a recovery that was interrupted");
    }
    sync_dir(&layout.log).map_err(io_err(&layout.log))?;
    std::fs::remove_dir(&layout.recovery).map_err(io_err(&layout.recovery))?;
    sync_dir(&layout.dir).map_err(io_err(&layout.dir))
}

/// Opens the log and checks it against `expect` (see the module
/// documentation); on a refusal the files are as they were.
fn recover(
    layout: &Layout,
    expect: &SyncState,
    snapshot: Option<&Snapshot>,
    options: &DiskOptions,
) -> Result<Recovered, DiskError> {
    let files = log_files(&layout.log)?;
    if files.is_empty() && expect.claims_data() {
        return Err(DiskError::LogCut {
            file: layout.log.display().to_string(),
            length: 0,
            why: format!("the log directory holds no log file, but the sync record says {expect}"),
        });
    }
    let strict = match crate::private::open(engine_config(&layout.log, RecoveryMode::AbsoluteConsistency, options)) {
        Ok(engine) => {
            return match verify(&engine, layout, expect, snapshot) {
                Ok(checked) => Ok(Recovered { engine, checked }),
                Err(mismatch) => {
                    drop(engine);
                    Err(refusal(layout, mismatch, None))
                }
            };
        }
        Err(e) if tolerable(&e) => e,
        Err(e) => return Err(open_err(&layout.log, e)),
    };
    recover_tail(layout, expect, snapshot, options, &files, strict)
}

/// Step 2 of recovery: the strict open failed with `strict`.
fn recover_tail(
    layout: &Layout,
    expect: &SyncState,
    snapshot: Option<&Snapshot>,
    options: &DiskOptions,
    files: &[LogFile],
    strict: raft_engine::Error,
) -> Result<Recovered, DiskError> {
    // raft-engine tolerates a broken tail in the newest file of each queue.
    let newest: Vec<&LogFile> = [false, true].iter().filter_map(|&q| files.iter().rfind(|f| f.rewrite == q)).collect();
    let backup = Backup::take(layout, &newest)?;
    let engine = match crate::private::open(engine_config(&layout.log, RecoveryMode::TolerateTailCorruption, options)) {
        Ok(engine) => engine,
        // Refused before touching any file (the directory lock).
        Err(e @ raft_engine::Error::Other(_)) => {
            backup.discard()?;
            return Err(open_err(&layout.log, e));
        }
        Err(e) => {
            // It may have cut the newest files before it failed on an
            // older one.
            backup.restore()?;
            return Err(locate(layout, format!("raft-engine refuses the log ({e})")));
        }
    };
    let cuts = backup.cuts();
    match verify(&engine, layout, expect, snapshot) {
        Ok(checked) => {
            // Before anything is written: from here on the cut files stand.
            backup.discard()?;
            for cut in &cuts {
                warn!(
                    file = %cut.file.path.display(),
                    offset = cut.offset,
                    bytes_dropped = cut.was - cut.offset,
                    "cut the torn tail of a raft log file at byte {}: a crash left records there that were never \
                     synced (raft-engine: {strict}); everything the sync record says was synced is intact",
                    cut.offset
                );
            }
            Ok(Recovered { engine, checked })
        }
        Err(mismatch) => {
            // Put back while raft-engine still holds its directory lock;
            // its handles point to the cut files, which the renames unlink.
            let restored = backup.restore();
            drop(engine);
            restored?;
            let cut = cuts.iter().min_by_key(|c| c.offset);
            Err(refusal(layout, mismatch, cut))
        }
    }
}

/// A directory written before the sync record existed: migrated if its log
/// opens strictly and passes every check. Returns its incarnation.
fn recover_legacy(
    layout: &Layout,
    snapshot: Option<&Snapshot>,
    options: &DiskOptions,
) -> Result<(Recovered, u64), DiskError> {
    let missing = |why: String| DiskError::Record { path: layout.record.display().to_string(), why };
    let engine = match crate::private::open(engine_config(&layout.log, RecoveryMode::AbsoluteConsistency, options)) {
        Ok(engine) => engine,
        Err(e) if tolerable(&e) => {
            return Err(missing(format!(
                "missing, beside a raft log that does not open cleanly ({e}): without the record a torn tail cannot \
                 be told from lost entries. {NO_RECORD_HINT}"
            )));
        }
        Err(e) => return Err(open_err(&layout.log, e)),
    };
    let legacy = engine.get(GROUP, LEGACY_INCARNATION).and_then(|v| <[u8; 8]>::try_from(v.as_slice()).ok());
    let Some(incarnation) = legacy.map(u64::from_be_bytes) else {
        return Err(missing(format!(
            "missing beside a non-empty raft log: a log without its record cannot be told from a damaged one. \
             {NO_RECORD_HINT}"
        )));
    };
    match verify(&engine, layout, &SyncState::default(), snapshot) {
        Ok(checked) => Ok((Recovered { engine, checked }, incarnation)),
        Err(mismatch) => {
            drop(engine);
            Err(refusal(layout, mismatch, None))
        }
    }
}

/// Checks that `dir` can hold a store, making it if needed, and puts back
/// what an interrupted file replacement left: its layout.
fn prepare(dir: &Path) -> Result<Layout, DiskError> {
    let layout = Layout::new(dir);
    if !dir.exists() && sibling(dir, REPAIRING).join(RECORD_FILE).exists() {
        return Err(DiskError::Interrupted { path: dir.display().to_string() });
    }
    private_dir(dir)?;
    // Fail now, with a clear message, rather than at the first write.
    let probe = dir.join(".psmr-write-test");
    create_private(&probe)
        .and_then(|mut f| f.write_all(b"ok"))
        .and_then(|_| std::fs::remove_file(&probe))
        .map_err(io_err(dir))?;
    private_dir(&layout.log)?;
    restore_leftovers(&layout)?;
    private_files(dir)?;
    private_files(&layout.log)?;
    Ok(layout)
}

/// Recovers the log under its sync record; a new directory gets its record
/// first (a log never exists without one), and a directory written before
/// records existed gets one after its log is recovered.
fn recover_with_record(
    layout: &Layout,
    snapshot: Option<&Snapshot>,
    options: &DiskOptions,
) -> Result<(Recovered, SyncRecord), DiskError> {
    Ok(match SyncRecord::open(&layout.record).map_err(layout.record_err())? {
        Some(record) => (recover(layout, record.state(), snapshot, options)?, record),
        None if log_files(&layout.log)?.is_empty() => {
            let state = SyncState { incarnation: fresh_incarnation(), ..SyncState::default() };
            let record = SyncRecord::create(&layout.record, &state).map_err(layout.record_err())?;
            (recover(layout, &state, snapshot, options)?, record)
        }
        None => {
            let (recovered, incarnation) = recover_legacy(layout, snapshot, options)?;
            let state = SyncState { incarnation, ..SyncState::default() };
            let record = SyncRecord::create(&layout.record, &state).map_err(layout.record_err())?;
            warn!(dir = %layout.dir.display(), "added a sync record to a data directory written without one");
            (recovered, record)
        }
    })
}

impl DiskStore {
    /// Opens (or creates) the store in `dir` for a cluster of `voters`.
    pub fn open(dir: &Path, voters: Vec<u64>) -> Result<Self, DiskError> {
        Self::open_with(dir, voters, &DiskOptions::default())
    }

    /// [`DiskStore::open`] with `options`.
    pub fn open_with(dir: &Path, voters: Vec<u64>, options: &DiskOptions) -> Result<Self, DiskError> {
        let layout = prepare(dir)?;
        let snapshot = read_snapshot(&layout.snapshot)?;
        let current = snapshot.as_ref().map(descriptor_id).transpose().map_err(|e| snapshot_err(&layout, e))?;
        let files = SnapFiles::open(dir, current).map_err(io_err(dir))?;
        let (recovered, mut record) = recover_with_record(&layout, snapshot.as_ref(), options)?;
        let Recovered { engine, checked: Checked { hs, cs, last } } = recovered;
        let log_err = |e| engine_err(&layout.log, e);
        let mut batch = LogBatch::default();
        let cs = match (snapshot.as_ref(), cs) {
            // A restart applies the log from the snapshot on, so raft's
            // membership starts from the snapshot's, whatever a crash left
            // in the key beside it (`persist` writes the key after the
            // file; older builds wrote it before).
            (Some(snapshot), stored) => {
                let cs = snapshot.get_metadata().get_conf_state().clone();
                if stored.as_ref() != Some(&cs) {
                    batch.put_message(GROUP, CONF_STATE.to_vec(), &cs).map_err(log_err)?;
                }
                cs
            }
            (None, Some(cs)) => cs,
            (None, None) => {
                let cs = ConfState::from((voters, vec![]));
                batch.put_message(GROUP, CONF_STATE.to_vec(), &cs).map_err(log_err)?;
                cs
            }
        };
        if engine.get(GROUP, LEGACY_INCARNATION).is_some() {
            // The record holds it now; the log files should not.
            batch.delete(GROUP, LEGACY_INCARNATION.to_vec());
        }
        // What was recovered may include writes a crash left unsynced in
        // the page cache: sync them before the record says they are.
        if batch.is_empty() {
            engine.sync().map_err(log_err)?;
        } else {
            engine.write(&mut batch, true).map_err(log_err)?;
        }
        let now = record.state().after(last, hs.term, hs.vote, hs.commit);
        record.write(now, true).map_err(layout.record_err())?;
        // A file raft-engine created just now.
        private_files(&layout.log)?;
        let (incarnation, floor) = (record.state().incarnation, record.state().floor);
        let on_disk = snapshot.as_ref().map_or(0, |s| s.get_metadata().index);
        let engine = Arc::new(engine);
        Ok(Self {
            purger: Arc::new(crate::purge::Purger::start(engine.clone())),
            engine,
            state: Arc::new(Mutex::new(State { hs, cs, snapshot, last, floor })),
            record: Arc::new(Mutex::new(record)),
            snapshot_file: Arc::new(Mutex::new(on_disk)),
            files: Arc::new(files),
            incarnation,
            sync_time: Arc::default(),
        })
    }

    /// The replica's incarnation, drawn once when the directory was
    /// created and kept by a repair: its identity (peers refuse a replica
    /// that lost its state and comes back under the same id).
    pub fn incarnation(&self) -> u64 {
        self.incarnation
    }

    /// The vote floor a [`DiskStore::repair`] left: the (term, index) of
    /// the last entry this replica had synced, and may have acknowledged,
    /// before its data was set aside. While it is set, the replica must not
    /// grant its vote to a candidate whose last entry is behind it in
    /// Raft's up-to-date order (term first, then index), nor campaign: a
    /// quorum may have counted on the entries it acknowledged, and only a
    /// leader holding them may be elected. It is persisted in the sync
    /// record and clears once this replica's own synced log reaches it
    /// (from then on Raft's own vote rule is at least as strict). `None` on
    /// a replica that was never repaired.
    pub fn vote_floor(&self) -> Option<(u64, u64)> {
        self.state.lock().floor
    }

    /// The snapshot kept, if any.
    pub fn snapshot_kept(&self) -> Option<Snapshot> {
        self.state.lock().snapshot.clone()
    }

    /// Tells `timer` how long every synced write takes from now on (the
    /// first call wins).
    pub fn time_syncs(&self, timer: SyncTimer) {
        let _ = self.sync_time.set(timer);
    }

    /// A synced write of `batch`, timed.
    fn write_synced(&self, batch: &mut LogBatch) -> raft::Result<()> {
        let start = std::time::Instant::now();
        self.engine.write(batch, true).map_err(raft_err)?;
        if let Some(timer) = self.sync_time.get() {
            timer(start.elapsed());
        }
        Ok(())
    }

    /// Persists a ready's entries and hard state, synced, then records how
    /// far the log is synced.
    pub fn append(&self, entries: &[Entry], hs: Option<&HardState>) -> raft::Result<()> {
        let mut batch = LogBatch::default();
        batch.add_entries::<Entries>(GROUP, entries).map_err(raft_err)?;
        if let Some(hs) = hs {
            batch.put_message(GROUP, HARD_STATE.to_vec(), hs).map_err(raft_err)?;
        }
        if batch.is_empty() {
            return Ok(());
        }
        let mut record = self.record.lock();
        self.write_synced(&mut batch)?;
        let now = {
            let mut st = self.state.lock();
            if let Some(hs) = hs {
                st.hs = hs.clone();
            }
            // Appending at an index replaces everything after it.
            if let Some(e) = entries.last() {
                st.last = (e.term, e.index);
            }
            // The sync made every earlier write durable too, the unsynced
            // commit updates included: the record takes the whole state.
            record.state().after(st.last, st.hs.term, st.hs.vote, st.hs.commit)
        };
        self.write_record(&mut record, now, false)
    }

    /// Writes `now` to the record; a cleared floor is published once it is
    /// durable (a change of floor is always synced).
    fn write_record(&self, record: &mut SyncRecord, now: SyncState, sync: bool) -> raft::Result<()> {
        let floor_changed = now.floor != record.state().floor;
        record.write(now, sync).map_err(raft_err)?;
        if floor_changed {
            self.state.lock().floor = now.floor;
        }
        Ok(())
    }

    /// Records a new commit index (not synced: it can be learnt again; the
    /// sync record takes it with the next synced write).
    pub fn set_commit(&self, commit: u64) -> raft::Result<()> {
        let _writer = self.record.lock();
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

    /// Makes a snapshot taken here durable, without holding up the
    /// protocol thread's writes while the file is written: the replica
    /// calls this on a side pool, then [`DiskStore::install`]. Returns
    /// false, writing nothing, if a snapshot as new is already kept (one
    /// from the leader may have come meanwhile).
    ///
    /// The snapshot holds the state up to its index, so the commit index
    /// that survives a crash must reach that index first: raft refuses to
    /// start with a state ahead of its log's commit, and a light ready's
    /// commit ([`DiskStore::set_commit`]) is written unsynced. (The cluster
    /// simulation found this: a one-replica cluster commits through light
    /// readies only, and after a machine crash could not restart.)
    pub fn persist(&self, snapshot: &Snapshot) -> raft::Result<bool> {
        let index = snapshot.get_metadata().index;
        {
            let mut record = self.record.lock();
            // A restart applies the log from the snapshot on, so raft's
            // membership then starts from the snapshot's (see `membership`).
            let hs = {
                let mut st = self.state.lock();
                if snapshot_index(&st).0 >= index {
                    return Ok(false);
                }
                st.hs.commit = st.hs.commit.max(index);
                st.hs.clone()
            };
            let mut batch = LogBatch::default();
            batch.put_message(GROUP, HARD_STATE.to_vec(), &hs).map_err(raft_err)?;
            self.write_synced(&mut batch)?;
            let now = {
                let st = self.state.lock();
                record.state().after(st.last, st.hs.term, st.hs.vote, st.hs.commit)
            };
            self.write_record(&mut record, now, false)?;
        }
        let mut on_disk = self.snapshot_file.lock();
        if *on_disk >= index {
            return Ok(false);
        }
        self.files.keep_taken(&descriptor_id(snapshot)?).map_err(raft_err)?;
        *on_disk = index;
        // Only now, so that the key never runs ahead of the file. Unsynced:
        // a restart takes the conf state from the file anyway.
        let cs = snapshot.get_metadata().get_conf_state().clone();
        let mut batch = LogBatch::default();
        batch.put_message(GROUP, CONF_STATE.to_vec(), &cs).map_err(raft_err)?;
        self.engine.write(&mut batch, false).map_err(raft_err)?;
        self.state.lock().cs = cs;
        Ok(true)
    }

    /// Keeps a snapshot taken here and drops the log before `keep_from`;
    /// [`DiskStore::persist`]s it first unless that was done. A snapshot
    /// older than the one kept is ignored.
    pub fn install(&self, snapshot: Snapshot, keep_from: u64) -> raft::Result<()> {
        let index = snapshot.get_metadata().index;
        if *self.snapshot_file.lock() < index && !self.persist(&snapshot)? {
            return Ok(());
        }
        {
            let _writer = self.record.lock();
            let mut st = self.state.lock();
            if snapshot_index(&st).0 >= index {
                return Ok(());
            }
            st.snapshot = Some(snapshot);
        }
        let last = self.engine.last_index(GROUP).unwrap_or(0);
        if keep_from > 1 {
            self.engine.compact_to(GROUP, keep_from.min(last));
        }
        self.purger.request();
        Ok(())
    }

    /// Replaces the log with a snapshot from the leader.
    pub fn apply_snapshot(&self, snapshot: Snapshot) -> raft::Result<()> {
        let meta = snapshot.get_metadata().clone();
        let mut record = self.record.lock();
        if self.engine.first_index(GROUP).is_some_and(|f| f > meta.index + 1) {
            return Err(raft::Error::Store(StorageError::SnapshotOutOfDate));
        }
        {
            let mut on_disk = self.snapshot_file.lock();
            self.files.keep_received(&descriptor_id(&snapshot)?).map_err(raft_err)?;
            *on_disk = meta.index;
        }
        let mut st = self.state.lock();
        st.hs.term = st.hs.term.max(meta.term);
        st.hs.commit = meta.index;
        st.cs = meta.get_conf_state().clone();
        let mut batch = LogBatch::default();
        batch.add_command(GROUP, raft_engine::Command::Clean);
        batch.put_message(GROUP, HARD_STATE.to_vec(), &st.hs).map_err(raft_err)?;
        batch.put_message(GROUP, CONF_STATE.to_vec(), &st.cs).map_err(raft_err)?;
        self.write_synced(&mut batch)?;
        st.snapshot = Some(snapshot);
        st.last = (meta.term, meta.index);
        let now = record.state().after(st.last, st.hs.term, st.hs.vote, st.hs.commit);
        drop(st);
        // Synced: rare, and the log it replaced is gone.
        self.write_record(&mut record, now, true)
    }

    /// Moves the data of the replica directory `dir` aside and rebuilds it
    /// empty, for an operator who decided to (`psmr replica --repair`):
    ///
    /// 1. Refuses if the sync record is missing or damaged (without it the
    ///    replica cannot be rebuilt safely under the same id), or if a
    ///    replica runs on `dir`.
    /// 2. Diagnoses the directory as [`DiskStore::open`] would (the report
    ///    says why it could not start).
    /// 3. Builds the new directory beside it (`DIR.repairing`): a log that
    ///    holds only the hard state (the recorded term and vote, commit 0)
    ///    and a sync record with the same incarnation, an empty log and the
    ///    vote floor at the recorded last entry (or the old floor, if that
    ///    is further); synced.
    /// 4. Renames `dir` to `DIR.damaged-<unix time>` (nothing is deleted)
    ///    and the new directory to `dir`.
    ///
    /// A crash between the two renames leaves `dir` missing: `open` then
    /// refuses, and `repair` again finishes the job. The replica starts
    /// with an empty log and catches up from the leader (a snapshot).
    pub fn repair(dir: &Path) -> Result<RepairReport, DiskError> {
        let layout = Layout::new(dir);
        let repairing = sibling(dir, REPAIRING);
        let refuse = |why: String| DiskError::Repair { path: dir.display().to_string(), why };
        if !dir.exists() {
            return finish_interrupted_repair(&layout, &repairing);
        }
        restore_leftovers(&layout)?;
        let old = match SyncRecord::open(&layout.record) {
            Ok(Some(record)) => *record.state(),
            Ok(None) => {
                return Err(refuse(format!("it has no sync record ({}): {WHY_RECORD}", layout.record.display())))
            }
            Err(e) => {
                return Err(refuse(format!(
                    "its sync record {} is unusable ({e}): {WHY_RECORD}",
                    layout.record.display()
                )))
            }
        };
        // As a start would; raft-engine's directory lock also tells whether
        // a replica runs here.
        let diagnosis = read_snapshot(&layout.snapshot)
            .and_then(|snapshot| recover(&layout, &old, snapshot.as_ref(), &DiskOptions::default()));
        let damage = match diagnosis {
            Ok(recovered) => {
                drop(recovered);
                None
            }
            Err(e @ DiskError::Busy { .. }) => return Err(e),
            Err(e) => Some(e.to_string()),
        };
        let synced = (old.last_index > 0).then_some((old.last_term, old.last_index));
        let floor = old.floor.max(synced);
        let fresh =
            SyncState { incarnation: old.incarnation, term: old.term, vote: old.vote, floor, ..SyncState::default() };
        build_repaired(&repairing, &fresh)?;
        let moved_to = damaged_name(dir);
        std::fs::rename(dir, &moved_to).map_err(io_err(dir))?;
        std::fs::rename(&repairing, dir).map_err(io_err(dir))?;
        sync_parent(dir)?;
        Ok(RepairReport {
            dir: dir.to_path_buf(),
            moved_to: Some(moved_to),
            damage,
            incarnation: fresh.incarnation,
            term: fresh.term,
            vote: fresh.vote,
            vote_floor: fresh.floor,
        })
    }
}

/// Why a repair needs the sync record.
const WHY_RECORD: &str = "without it psmr cannot know which term this replica voted in or which entries it \
                          acknowledged, so it cannot rebuild it safely under the same id; nothing was changed";

/// Ends a repair interrupted after it moved the damaged directory aside:
/// the rebuilt one takes its place.
fn finish_interrupted_repair(layout: &Layout, repairing: &Path) -> Result<RepairReport, DiskError> {
    let dir = &layout.dir;
    let refuse = |why: &str| DiskError::Repair { path: dir.display().to_string(), why: why.into() };
    if !repairing.join(RECORD_FILE).exists() {
        return Err(refuse("there is no such directory"));
    }
    std::fs::rename(repairing, dir).map_err(io_err(dir))?;
    sync_parent(dir)?;
    let state = match SyncRecord::open(&layout.record) {
        Ok(Some(record)) => *record.state(),
        _ => return Err(refuse("the rebuilt directory's sync record is unreadable")),
    };
    Ok(RepairReport {
        dir: dir.clone(),
        moved_to: None,
        damage: Some("a repair was interrupted after it moved the data aside".into()),
        incarnation: state.incarnation,
        term: state.term,
        vote: state.vote,
        vote_floor: state.floor,
    })
}

/// A free name beside `dir` for its damaged data, kept for inspection.
fn damaged_name(dir: &Path) -> PathBuf {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let base = sibling(dir, &format!(".damaged-{secs}"));
    let mut moved_to = base.clone();
    let mut n = 0;
    while moved_to.exists() {
        n += 1;
        moved_to = sibling(&base, &format!("-{n}"));
    }
    moved_to
}

fn sync_parent(dir: &Path) -> Result<(), DiskError> {
    match dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        Some(parent) => sync_dir(parent).map_err(io_err(parent)),
        None => sync_dir(Path::new(".")).map_err(io_err(dir)),
    }
}

/// Step 3 of [`DiskStore::repair`]. The record is written last: it marks
/// the directory complete.
fn build_repaired(repairing: &Path, fresh: &SyncState) -> Result<(), DiskError> {
    if repairing.exists() {
        // Left by a repair interrupted before it moved the old directory:
        // only what the repair itself wrote.
        std::fs::remove_dir_all(repairing).map_err(io_err(repairing))?;
    }
    let layout = Layout::new(repairing);
    private_dir(repairing)?;
    private_dir(&layout.log)?;
    {
        let log_err = |e| engine_err(&layout.log, e);
        let config = engine_config(&layout.log, RecoveryMode::AbsoluteConsistency, &DiskOptions::default());
        let engine = crate::private::open(config).map_err(log_err)?;
        let hs = HardState { term: fresh.term, vote: fresh.vote, commit: 0, ..Default::default() };
        let mut batch = LogBatch::default();
        batch.put_message(GROUP, HARD_STATE.to_vec(), &hs).map_err(log_err)?;
        engine.write(&mut batch, true).map_err(log_err)?;
    }
    private_files(&layout.log)?;
    drop(SyncRecord::create(&layout.record, fresh).map_err(layout.record_err())?);
    sync_dir(repairing).map_err(io_err(repairing))
}

fn snapshot_index(st: &State) -> (u64, u64) {
    st.snapshot.as_ref().map_or((0, 0), |s| (s.get_metadata().index, s.get_metadata().term))
}

impl psmr_core::store::Store for DiskStore {
    fn append(&self, entries: &[Entry], hs: Option<&HardState>) -> raft::Result<()> {
        DiskStore::append(self, entries, hs)
    }

    fn set_commit(&self, commit: u64) -> raft::Result<()> {
        DiskStore::set_commit(self, commit)
    }

    fn persist(&self, snapshot: &Snapshot) -> raft::Result<bool> {
        DiskStore::persist(self, snapshot)
    }

    fn install(&self, snapshot: Snapshot, keep_from: u64) -> raft::Result<()> {
        DiskStore::install(self, snapshot, keep_from)
    }

    fn apply_snapshot(&self, snapshot: Snapshot) -> raft::Result<()> {
        DiskStore::apply_snapshot(self, snapshot)
    }

    fn kept(&self) -> Option<Snapshot> {
        self.snapshot_kept()
    }

    fn snapshot_writer(&self) -> io::Result<Box<dyn SnapshotSink>> {
        self.files.writer()
    }

    fn open_snapshot(&self, id: &SnapshotId) -> io::Result<Box<dyn SnapshotFile>> {
        self.files.open_file(id)
    }

    fn receiving(&self) -> Option<(SnapshotId, u64)> {
        self.files.receiving()
    }

    fn receive(&self, id: &SnapshotId, offset: u64, data: &[u8]) -> io::Result<()> {
        self.files.receive(id, offset, data)
    }

    fn sync_received(&self) -> io::Result<()> {
        self.files.sync_received()
    }

    fn vote_floor(&self) -> Option<(u64, u64)> {
        DiskStore::vote_floor(self)
    }
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
fn read_snapshot(path: &Path) -> Result<Option<Snapshot>, DiskError> {
    crate::snapfiles::read_current(path).map_err(|why| DiskError::Snapshot { path: path.display().to_string(), why })
}

fn snapshot_err(layout: &Layout, e: raft::Error) -> DiskError {
    DiskError::Snapshot { path: layout.snapshot.display().to_string(), why: e.to_string() }
}

/// raft-engine's file header: magic, then the format version (u64), then
/// (version 2) the alignment (u64); big-endian.
const ENGINE_MAGIC: &[u8] = b"RAFT-LOG-FILE-HEADER-9986AB3E47F320B394C8E84916EB0ED5";
/// raft-engine's record header: `u64 length << 8 | compression` and `u64
/// offset of the item footer`, big-endian.
const ENGINE_RECORD_HEADER: usize = 16;

/// Whether `path` starts with a raft-engine file header it can read.
fn header_ok(path: &Path) -> bool {
    let mut header = [0u8; ENGINE_MAGIC.len() + 8];
    let read = File::open(path).and_then(|mut f| io::Read::read_exact(&mut f, &mut header));
    read.is_ok()
        && header.starts_with(ENGINE_MAGIC)
        && matches!(header[ENGINE_MAGIC.len()..].try_into().map(u64::from_be_bytes), Ok(1 | 2))
}

/// The first record of a raft-engine log file that does not check out, as
/// (byte offset, what), for the error message only: raft-engine and the
/// checks above decide what is refused; this says where. It follows
/// raft-engine 0.4's on-disk format (stable across its versions, since
/// files outlive upgrades): after the header, records of `header | entries
/// block (data, crc32) | items (data, crc32 xor the file's sequence number
/// in format 2)`, checksums little-endian. `None`: every record checks out
/// (or the file uses a layout this does not know).
fn first_bad_record(file: &LogFile) -> io::Result<Option<(u64, &'static str)>> {
    let bytes = std::fs::read(&file.path)?;
    let be = |at: usize| -> Option<u64> { Some(u64::from_be_bytes(bytes.get(at..at + 8)?.try_into().ok()?)) };
    if !bytes.starts_with(ENGINE_MAGIC) {
        return Ok(Some((0, "its file header is damaged")));
    }
    let (start, signature) = match be(ENGINE_MAGIC.len()) {
        Some(1) => (ENGINE_MAGIC.len() + 8, 0),
        Some(2) => match be(ENGINE_MAGIC.len() + 8) {
            Some(0) => (ENGINE_MAGIC.len() + 16, file.seq as u32),
            // Aligned (direct I/O) layout: psmr never writes it.
            Some(_) => return Ok(None),
            None => return Ok(Some((0, "its file header is damaged"))),
        },
        _ => return Ok(Some((0, "its file header is damaged"))),
    };
    let crc_ok = |block: &[u8], signature: u32| -> bool {
        let Some(split) = block.len().checked_sub(4).filter(|&n| n > 0) else { return false };
        let (data, crc) = block.split_at(split);
        crc.try_into().is_ok_and(|crc| crc32fast::hash(data) == u32::from_le_bytes(crc) ^ signature)
    };
    let mut at = start;
    while at < bytes.len() {
        let header = (be(at), be(at + 8));
        let (Some(len_and_type), Some(footer)) = header else {
            return Ok(Some((at as u64, "a record header is cut short")));
        };
        let (len, compression, footer) = ((len_and_type >> 8) as usize, len_and_type as u8, footer as usize);
        if compression > 1 || footer < ENGINE_RECORD_HEADER || footer > len || len > bytes.len() - at {
            return Ok(Some((at as u64, "no valid record starts there (a damaged header, or a record cut short)")));
        }
        let entries = &bytes[at + ENGINE_RECORD_HEADER..at + footer];
        if !entries.is_empty() && !crc_ok(entries, 0) {
            return Ok(Some((at as u64, "the entries of the record there fail their checksum")));
        }
        if !crc_ok(&bytes[at + footer..at + len], signature) {
            return Ok(Some((at as u64, "the record there fails its checksum")));
        }
        at += len;
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use psmr_core::membership::{Change, Membership};
    use psmr_core::snapfile::FileWriter;
    use psmr_core::store::Store as _;
    use psmr_core::Member;

    /// The file of a snapshot of `data` at `index` and `term` of a
    /// cluster of `voters`, as a replica writes one, and raft's view of it.
    fn snapshot_file(index: u64, term: u64, voters: &[u64], data: &[u8]) -> (Vec<u8>, Snapshot) {
        let mut members = Membership::default();
        for &id in voters {
            let member =
                Member::new(id, ([127, 0, 0, 1], 7000 + id as u16).into(), ([127, 0, 0, 1], 8000 + id as u16).into());
            members.apply(&Change::Add { member, voter: true }).unwrap();
        }
        let mut w = FileWriter::new(Vec::new(), index, term).unwrap();
        psmr_core::state::put_front(&mut w, &members.encode(), &[], 0).unwrap();
        w.write_all(data).unwrap();
        let (bytes, id) = w.finish().unwrap();
        (bytes, psmr_core::state::raft_snapshot(id, members.encode(), members.conf_state()))
    }

    /// A snapshot taken in `s`: its file written, not yet kept.
    fn taken(s: &DiskStore, index: u64, voters: &[u64], data: &[u8]) -> Snapshot {
        let (bytes, snap) = snapshot_file(index, 1, voters, data);
        let mut sink = s.snapshot_writer().unwrap();
        sink.write_all(&bytes).unwrap();
        sink.finish().unwrap();
        snap
    }

    /// A snapshot received whole by `s`, not yet kept.
    fn received(s: &DiskStore, index: u64, data: &[u8]) -> Snapshot {
        let (bytes, snap) = snapshot_file(index, 1, &[1], data);
        s.receive(&descriptor_id(&snap).unwrap(), 0, &bytes).unwrap();
        snap
    }

    fn entry(index: u64, term: u64) -> Entry {
        Entry { index, term, data: vec![index as u8].into(), ..Default::default() }
    }

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn entries_and_state_survive_a_reopen() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("r");
        let incarnation;
        {
            let s = DiskStore::open(&dir, vec![1, 2, 3]).unwrap();
            let hs = HardState { term: 2, vote: 1, commit: 2, ..Default::default() };
            s.append(&[entry(1, 1), entry(2, 1), entry(3, 2)], Some(&hs)).unwrap();
            // Overwriting a suffix truncates what followed.
            s.append(&[entry(3, 3)], None).unwrap();
            incarnation = s.incarnation();
            assert_ne!(incarnation, 0);
        }
        let s = DiskStore::open(&dir, vec![1, 2, 3]).unwrap();
        assert_eq!(s.incarnation(), incarnation, "drawn once");
        let st = s.initial_state().unwrap();
        assert_eq!((st.hard_state.term, st.hard_state.vote, st.hard_state.commit), (2, 1, 2));
        assert_eq!(st.conf_state.voters, vec![1, 2, 3]);
        assert_eq!((s.first_index().unwrap(), s.last_index().unwrap()), (1, 3));
        assert_eq!(s.term(3).unwrap(), 3);
        let got = s.entries(1, 4, None, GetEntriesContext::empty(false)).unwrap();
        assert_eq!(got.iter().map(|e| e.index).collect::<Vec<_>>(), vec![1, 2, 3]);
        // A snapshot at 2 compacts the log before 2 and survives a reopen.
        let snap = taken(&s, 2, &[1, 2, 3], &[9; 100]);
        s.install(snap.clone(), 2).unwrap();
        drop(s);
        let s = DiskStore::open(&dir, vec![1, 2, 3]).unwrap();
        assert_eq!(s.snapshot(0, 2).unwrap(), snap);
        assert_eq!(s.first_index().unwrap(), 2);
        assert_eq!(s.term(2).unwrap(), 1);
        assert_eq!(s.vote_floor(), None, "never repaired");
    }

    /// A snapshot is kept only once the commit index covering it is
    /// synced: the commit a light ready wrote unsynced must not be lost
    /// behind a snapshot.
    #[test]
    fn a_snapshot_syncs_the_commit_it_covers_first() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("r");
        let s = DiskStore::open(&dir, vec![1]).unwrap();
        let count = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counter = count.clone();
        s.time_syncs(Arc::new(move |_| {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }));
        let syncs = || count.load(std::sync::atomic::Ordering::SeqCst);
        let hs = HardState { term: 1, vote: 1, commit: 1, ..Default::default() };
        s.append(&[entry(1, 1), entry(2, 1), entry(3, 1)], Some(&hs)).unwrap();
        assert_eq!(syncs(), 1);
        s.set_commit(3).unwrap();
        assert_eq!(syncs(), 1, "a commit alone is not synced");
        s.install(taken(&s, 3, &[1], &[5]), 2).unwrap();
        assert_eq!(syncs(), 2, "the commit is synced before the snapshot is kept");
        drop(s);
        let s = DiskStore::open(&dir, vec![1]).unwrap();
        assert_eq!(s.initial_state().unwrap().hard_state.commit, 3);
        assert_eq!(s.snapshot(0, 1).unwrap().get_metadata().index, 3);
    }

    /// A snapshot taken here is persisted off the protocol thread and kept
    /// later; one from the leader that came in between wins, whatever the
    /// order: the older one is neither written over it nor kept.
    #[test]
    fn an_older_snapshot_never_replaces_a_newer_one() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("r");
        let s = DiskStore::open(&dir, vec![1]).unwrap();
        let hs = HardState { term: 1, vote: 1, commit: 4, ..Default::default() };
        s.append(&(1..=4).map(|i| entry(i, 1)).collect::<Vec<_>>(), Some(&hs)).unwrap();
        let three = taken(&s, 3, &[1], &[3]);
        assert!(s.persist(&three).unwrap(), "a new snapshot is written");
        let nine = received(&s, 9, &[9]);
        s.apply_snapshot(nine.clone()).unwrap();
        s.install(three, 2).unwrap();
        let five = taken(&s, 5, &[1], &[5]);
        assert!(!s.persist(&five).unwrap(), "older than the leader's");
        s.install(five, 4).unwrap();
        assert_eq!(s.snapshot(0, 1).unwrap(), nine);
        drop(s);
        let s = DiskStore::open(&dir, vec![1]).unwrap();
        assert_eq!(s.snapshot(0, 1).unwrap(), nine);
    }

    /// A crash between the snapshot file and the conf state key beside it
    /// leaves the two from different snapshots, either way round; the
    /// restart replays the log from the file's snapshot, so its membership
    /// is the file's.
    #[test]
    fn a_restart_takes_the_membership_of_the_snapshot_it_replays_from() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("r");
        let key = |dir: &Path, voters: Vec<u64>| {
            let config = engine_config(&dir.join(LOG_DIR), RecoveryMode::AbsoluteConsistency, &DiskOptions::default());
            let engine = crate::private::open(config).unwrap();
            let mut batch = LogBatch::default();
            batch.put_message(GROUP, CONF_STATE.to_vec(), &ConfState::from((voters, vec![]))).unwrap();
            engine.write(&mut batch, true).unwrap();
        };
        let voters =
            |dir: &Path| DiskStore::open(dir, vec![1, 2, 3]).unwrap().initial_state().unwrap().conf_state.voters;
        {
            let s = DiskStore::open(&dir, vec![1, 2, 3]).unwrap();
            let hs = HardState { term: 1, vote: 1, commit: 4, ..Default::default() };
            s.append(&(1..=4).map(|i| entry(i, 1)).collect::<Vec<_>>(), Some(&hs)).unwrap();
            s.install(taken(&s, 2, &[1, 2, 3], &[2]), 2).unwrap();
        }
        assert_eq!(voters(&dir), [1, 2, 3]);
        // The key of a later snapshot, whose file never landed.
        key(&dir, vec![1, 2, 3, 4]);
        assert_eq!(voters(&dir), [1, 2, 3], "the key ran ahead of the file");
        assert_eq!(voters(&dir), [1, 2, 3], "and was mended");
        // A later file, whose key never landed.
        std::fs::write(dir.join(crate::snapfiles::CURRENT), snapshot_file(3, 1, &[2, 3, 4], &[3]).0).unwrap();
        assert_eq!(voters(&dir), [2, 3, 4], "the file ran ahead of the key");
    }

    #[test]
    fn a_damaged_or_old_snapshot_is_refused_with_its_reason() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("r");
        let path = dir.join(crate::snapfiles::CURRENT);
        {
            let s = DiskStore::open(&dir, vec![1]).unwrap();
            s.append(&[entry(1, 1), entry(2, 1)], Some(&HardState { term: 1, commit: 2, ..Default::default() }))
                .unwrap();
            s.install(taken(&s, 2, &[1], &[1, 2, 3]), 1).unwrap();
        }
        assert_eq!(mode(&path), 0o600);
        assert!(read_snapshot(&path).unwrap().is_some());
        let good = std::fs::read(&path).unwrap();
        let refused = |bytes: &[u8]| {
            std::fs::write(&path, bytes).unwrap();
            match DiskStore::open(&dir, vec![1]) {
                Ok(_) => panic!("{} bytes of {} accepted", bytes.len(), good.len()),
                Err(e) => e.to_string(),
            }
        };
        let mut bytes = good.clone();
        bytes[30] ^= 1;
        assert!(refused(&bytes).contains("damaged"), "a damaged membership");
        // The whole file's checksum is checked as it is restored.
        let mut bytes = good.clone();
        let end = bytes.len() - 12;
        bytes[end] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let s = DiskStore::open(&dir, vec![1]).unwrap();
        let mut opened = psmr_core::state::open_kept(&s, &s.snapshot_kept().unwrap()).unwrap();
        let e = io::Read::read_to_end(&mut opened.service, &mut Vec::new()).unwrap_err().to_string();
        assert!(e.contains("checksum"), "a damaged end mark: {e}");
        drop((opened, s));
        assert!(refused(&good[..10]).contains("too short"));
        let mut old = b"PSMRSNP1".to_vec();
        old.extend_from_slice(&good[8..]);
        let e = refused(&old);
        assert!(e.contains("format 1") && e.contains("--repair"), "{e}");
    }

    #[test]
    fn a_damaged_log_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("r");
        {
            let s = DiskStore::open(&dir, vec![1]).unwrap();
            let hs = HardState { term: 1, commit: 50, ..Default::default() };
            s.append(&[entry(1, 1)], Some(&hs)).unwrap();
            for i in 2..=50 {
                s.append(&[entry(i, 1)], None).unwrap();
            }
        }
        let log = log_files(&dir.join(LOG_DIR)).unwrap().into_iter().rfind(|f| !f.rewrite).expect("a log file").path;
        let mut bytes = std::fs::read(&log).unwrap();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0xff;
        std::fs::write(&log, &bytes).unwrap();
        let e = DiskStore::open(&dir, vec![1]).err().expect("refused").to_string();
        assert!(e.contains(&format!("raft log file {} is damaged at byte ", log.display())), "{e}");
        assert!(e.contains("--repair"), "{e}");
        assert_eq!(std::fs::read(&log).unwrap(), bytes, "left as it was");
    }

    #[test]
    fn the_record_follows_synced_writes_only() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("r");
        let s = DiskStore::open(&dir, vec![1]).unwrap();
        let record = || *SyncRecord::open(&dir.join(RECORD_FILE)).unwrap().unwrap().state();
        let hs = HardState { term: 2, vote: 1, commit: 1, ..Default::default() };
        s.append(&[entry(1, 1), entry(2, 2)], Some(&hs)).unwrap();
        let r = record();
        assert_eq!((r.last_term, r.last_index, r.term, r.vote, r.commit), (2, 2, 2, 1, 1));
        assert_eq!(r.incarnation, s.incarnation());
        s.set_commit(2).unwrap();
        assert_eq!(record().commit, 1, "set_commit is not synced");
        s.append(&[entry(3, 2)], None).unwrap();
        assert_eq!((record().last_index, record().commit), (3, 2), "the next synced write carries it");
        // A snapshot from the leader replaces the log.
        let (bytes, snap) = snapshot_file(10, 4, &[1], &[1]);
        s.receive(&descriptor_id(&snap).unwrap(), 0, &bytes).unwrap();
        s.apply_snapshot(snap).unwrap();
        let r = record();
        assert_eq!((r.last_term, r.last_index, r.term, r.commit), (4, 10, 4, 10));
        drop(s);
        let s = DiskStore::open(&dir, vec![1]).unwrap();
        assert_eq!((s.last_index().unwrap(), s.term(10).unwrap()), (10, 4));
    }

    #[test]
    fn a_log_without_its_record_is_refused_unless_it_predates_records() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("r");
        {
            let s = DiskStore::open(&dir, vec![1]).unwrap();
            s.append(&[entry(1, 1)], Some(&HardState { term: 1, ..Default::default() })).unwrap();
        }
        std::fs::remove_file(dir.join(RECORD_FILE)).unwrap();
        let e = DiskStore::open(&dir, vec![1]).err().expect("refused").to_string();
        assert!(e.contains("missing beside a non-empty raft log"), "{e}");
        // A directory written before the record: the incarnation is in the
        // log. Migrated once, the key then gone from the log.
        {
            let config = engine_config(&dir.join(LOG_DIR), RecoveryMode::AbsoluteConsistency, &DiskOptions::default());
            let engine = crate::private::open(config).unwrap();
            let mut batch = LogBatch::default();
            batch.put(GROUP, LEGACY_INCARNATION.to_vec(), 42u64.to_be_bytes().to_vec()).unwrap();
            engine.write(&mut batch, true).unwrap();
        }
        let s = DiskStore::open(&dir, vec![1]).unwrap();
        assert_eq!(s.incarnation(), 42);
        assert_eq!(s.last_index().unwrap(), 1);
        assert!(s.engine.get(GROUP, LEGACY_INCARNATION).is_none());
        drop(s);
        assert_eq!(DiskStore::open(&dir, vec![1]).unwrap().incarnation(), 42);
    }

    #[test]
    fn log_files_made_as_the_log_rotates_are_private() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("r");
        let s = DiskStore::open_with(&dir, vec![1], &DiskOptions { log_file_bytes: 4096 }).unwrap();
        for i in 1..=200 {
            let e = Entry { index: i, term: 1, data: vec![7; 200].into(), ..Default::default() };
            s.append(&[e], None).unwrap();
        }
        let files = log_files(&dir.join(LOG_DIR)).unwrap();
        assert!(files.len() > 3, "{} log files", files.len());
        for f in files {
            assert_eq!(mode(&f.path), 0o600, "{}", f.path.display());
        }
    }

    #[test]
    fn directories_and_files_are_private() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("r");
        {
            let s = DiskStore::open(&dir, vec![1]).unwrap();
            s.append(&[entry(1, 1)], None).unwrap();
            s.install(taken(&s, 1, &[1], &[1]), 0).unwrap();
        }
        let check = |dir: &Path| {
            assert_eq!(mode(dir), 0o700);
            assert_eq!(mode(&dir.join(LOG_DIR)), 0o700);
            for d in [dir.to_path_buf(), dir.join(LOG_DIR)] {
                for f in std::fs::read_dir(&d).unwrap().flatten().filter(|f| f.path().is_file()) {
                    assert_eq!(mode(&f.path()), 0o600, "{}", f.path().display());
                }
            }
        };
        check(&dir);
        assert!(dir.join(crate::snapfiles::CURRENT).exists() && dir.join(RECORD_FILE).exists());
        // Loosened by someone: tightened at the next open.
        std::fs::set_permissions(&dir, Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(dir.join(LOG_DIR), Permissions::from_mode(0o755)).unwrap();
        for f in std::fs::read_dir(dir.join(LOG_DIR)).unwrap().flatten() {
            std::fs::set_permissions(f.path(), Permissions::from_mode(0o644)).unwrap();
        }
        std::fs::set_permissions(dir.join(crate::snapfiles::CURRENT), Permissions::from_mode(0o644)).unwrap();
        drop(DiskStore::open(&dir, vec![1]).unwrap());
        check(&dir);
    }

    #[test]
    fn an_unwritable_directory_is_a_clear_error() {
        let e = DiskStore::open(Path::new("/proc/psmr-cannot-be-here"), vec![1]).err().unwrap().to_string();
        assert!(e.contains("data directory /proc/psmr-cannot-be-here"), "{e}");
    }
}
