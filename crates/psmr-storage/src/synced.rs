//! The sync record: how far this replica's raft log was synced, kept by
//! psmr in a small file beside raft-engine's, so that recovery can tell a
//! torn, unsynced tail (a crash leaves one) from the loss of entries the
//! replica had acknowledged (damage), which raft-engine alone cannot.
//!
//! # What it holds
//!
//! The replica's incarnation (its identity: peers refuse a replica that
//! lost its state and comes back under the same id), the (term, index)
//! of the last log entry and the hard state (term, vote,
//! commit) as of the latest *synced* raft-engine write, and the vote floor
//! a repair leaves (see [`crate::disk::DiskStore::vote_floor`]).
//!
//! # Format
//!
//! File [`RECORD_FILE`] in the replica directory, mode 0600, two slots:
//! slot 0 at byte 0 and slot 1 at byte [`SLOT_STRIDE`]. A slot is
//! [`SLOT_LEN`] bytes, all integers big-endian:
//!
//! ```text
//! magic "PSMRSYN1" | counter u64 | incarnation u64 | last_term u64 | last_index u64
//!   | term u64 | vote u64 | commit u64 | floor_term u64 | floor_index u64 | crc32 u32 of all before
//! ```
//!
//! A floor of (0, 0) means none. Write number `counter` goes to slot
//! `counter % 2`, so a write never touches the newest valid slot: if it is
//! torn, the other slot still holds the previous record. The reader takes
//! the valid slot with the higher counter. The slots sit in separate 4 KiB
//! blocks because a torn write can garble a whole sector or page, not just
//! the bytes written.
//!
//! # When it is written and synced
//!
//! After every synced raft-engine write, by a positioned write of one slot
//! (a few microseconds, no `fsync`): the engine's `fsync` has already
//! happened, so the record never claims more than is durable; after a power
//! loss it may only lag behind. Two exceptions are synced at once, because
//! they are rare and a lagging copy of them would be unsafe for
//! [`crate::disk::DiskStore::repair`]: a change of term, vote or floor (an
//! election: a vote that left this replica is always in the durable
//! record, so a repaired replica never votes twice in a term), and the
//! record written when a snapshot replaces the log. The record is synced
//! when it is closed.

use raft::prelude::HardState;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use tracing::warn;

/// The record's file name in the replica directory.
pub const RECORD_FILE: &str = "sync-record";
/// Byte offset of slot 1 (slot 0 is at 0).
pub const SLOT_STRIDE: u64 = 4096;
/// Bytes of one slot.
pub const SLOT_LEN: usize = 8 + 9 * 8 + 4;
const MAGIC: &[u8; 8] = b"PSMRSYN1";

/// What one record says. See the module documentation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SyncState {
    /// The replica's incarnation, drawn once when its directory was created.
    pub incarnation: u64,
    /// Term of the last log entry (of the snapshot if the log is empty).
    pub last_term: u64,
    /// Index of the last log entry (of the snapshot if the log is empty).
    pub last_index: u64,
    /// The hard state's term.
    pub term: u64,
    /// The hard state's vote (0: none).
    pub vote: u64,
    /// The hard state's commit index.
    pub commit: u64,
    /// The vote floor (term, index) a repair left; `None` once cleared.
    pub floor: Option<(u64, u64)>,
}

impl SyncState {
    /// True if this state says anything was ever synced: a log without its
    /// files then lost something.
    pub fn claims_data(&self) -> bool {
        self.last_index > 0 || self.term > 0 || self.vote > 0 || self.commit > 0
    }

    /// This state after a synced write that left the log ending at `last`
    /// (term, index) with hard state (`term`, `vote`, `commit`); the floor
    /// clears once `last` reaches it in Raft's up-to-date order (term
    /// first, then index).
    pub fn after(&self, last: (u64, u64), term: u64, vote: u64, commit: u64) -> SyncState {
        let floor = self.floor.filter(|&floor| last < floor);
        SyncState { incarnation: self.incarnation, last_term: last.0, last_index: last.1, term, vote, commit, floor }
    }

    fn encode(&self, counter: u64) -> [u8; SLOT_LEN] {
        let (floor_term, floor_index) = self.floor.unwrap_or((0, 0));
        let mut out = [0u8; SLOT_LEN];
        out[..8].copy_from_slice(MAGIC);
        let fields = [
            counter,
            self.incarnation,
            self.last_term,
            self.last_index,
            self.term,
            self.vote,
            self.commit,
            floor_term,
            floor_index,
        ];
        for (i, v) in fields.iter().enumerate() {
            out[8 + 8 * i..16 + 8 * i].copy_from_slice(&v.to_be_bytes());
        }
        let crc = crc32fast::hash(&out[..SLOT_LEN - 4]);
        out[SLOT_LEN - 4..].copy_from_slice(&crc.to_be_bytes());
        out
    }

    /// The slot's counter and state, if it checks out.
    fn decode(slot: &[u8]) -> Option<(u64, SyncState)> {
        let slot = slot.get(..SLOT_LEN)?;
        if &slot[..8] != MAGIC {
            return None;
        }
        let crc = u32::from_be_bytes(slot[SLOT_LEN - 4..].try_into().ok()?);
        if crc32fast::hash(&slot[..SLOT_LEN - 4]) != crc {
            return None;
        }
        let field =
            |i: usize| -> Option<u64> { Some(u64::from_be_bytes(slot.get(8 + 8 * i..16 + 8 * i)?.try_into().ok()?)) };
        let floor = (field(7)?, field(8)?);
        let state = SyncState {
            incarnation: field(1)?,
            last_term: field(2)?,
            last_index: field(3)?,
            term: field(4)?,
            vote: field(5)?,
            commit: field(6)?,
            floor: (floor != (0, 0)).then_some(floor),
        };
        Some((field(0)?, state))
    }
}

impl std::fmt::Display for SyncState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "last entry {} of term {}, term {}, vote {}, commit {}",
            self.last_index, self.last_term, self.term, self.vote, self.commit
        )?;
        if let Some((term, index)) = self.floor {
            write!(f, ", vote floor entry {index} of term {term}")?;
        }
        Ok(())
    }
}

/// The open record file. See the module documentation.
#[derive(Debug)]
pub struct SyncRecord {
    file: File,
    path: PathBuf,
    counter: u64,
    state: SyncState,
    /// Written since the last sync.
    dirty: bool,
}

/// Opens `path` read-write; with `create`, replaces any file there (a
/// temporary left by a crash, whatever its mode) by a new one only its
/// owner can read.
fn open_private(path: &Path, create: bool) -> io::Result<File> {
    let mut options = OpenOptions::new();
    options.read(true).write(true);
    if create {
        match std::fs::remove_file(path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        options.create_new(true).mode(0o600);
    }
    options.open(path)
}

/// Syncs a directory, so that a rename or a new file in it is durable.
pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

impl SyncRecord {
    /// Creates the record at `path` holding `state`, atomically (a
    /// temporary file, synced, renamed, the directory synced): the file
    /// either does not exist or holds one valid slot.
    pub fn create(path: &Path, state: &SyncState) -> io::Result<SyncRecord> {
        let tmp = path.with_extension("tmp");
        {
            let mut f = open_private(&tmp, true)?;
            // Write 1 goes to slot 1 (write n to slot n % 2); slot 0 stays
            // invalid until write 2.
            let mut bytes = vec![0u8; SLOT_STRIDE as usize + SLOT_LEN];
            bytes[SLOT_STRIDE as usize..].copy_from_slice(&state.encode(1));
            f.write_all(&bytes)?;
            f.sync_all()?;
        }
        std::fs::rename(&tmp, path)?;
        if let Some(dir) = path.parent() {
            sync_dir(dir)?;
        }
        let file = open_private(path, false)?;
        Ok(SyncRecord { file, path: path.to_path_buf(), counter: 1, state: *state, dirty: false })
    }

    /// Opens the record at `path`: `None` if there is none, an
    /// `InvalidData` error if neither slot checks out.
    pub fn open(path: &Path) -> io::Result<Option<SyncRecord>> {
        let file = match open_private(path, false) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        // Bounded: only the two slots are read, whatever the file's size.
        let mut bytes = vec![0u8; SLOT_STRIDE as usize + SLOT_LEN];
        let mut read = 0;
        while read < bytes.len() {
            match file.read_at(&mut bytes[read..], read as u64) {
                Ok(0) => break,
                Ok(n) => read += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        bytes.truncate(read);
        let slots = [SyncState::decode(&bytes), bytes.get(SLOT_STRIDE as usize..).and_then(SyncState::decode)];
        let Some((counter, state)) = slots.into_iter().flatten().max_by_key(|(counter, _)| *counter) else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "neither of its two slots checks out (magic and checksum): the record is damaged",
            ));
        };
        Ok(Some(SyncRecord { file, path: path.to_path_buf(), counter, state, dirty: false }))
    }

    /// What the record says.
    pub fn state(&self) -> &SyncState {
        &self.state
    }

    /// Where it is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Records `state` in the slot after the newest. Synced if `sync`, or
    /// if the term, vote, floor or incarnation change (see the module
    /// documentation); otherwise one positioned write.
    pub fn write(&mut self, state: SyncState, sync: bool) -> io::Result<()> {
        let sync = sync
            || (state.term, state.vote, state.floor, state.incarnation)
                != (self.state.term, self.state.vote, self.state.floor, self.state.incarnation);
        let counter = self.counter + 1;
        let offset = if counter % 2 == 0 { 0 } else { SLOT_STRIDE };
        self.file.write_all_at(&state.encode(counter), offset)?;
        self.counter = counter;
        self.state = state;
        self.dirty = true;
        if sync {
            self.sync()?;
        }
        Ok(())
    }

    /// Makes the newest slot durable.
    pub fn sync(&mut self) -> io::Result<()> {
        if self.dirty {
            self.file.sync_data()?;
            self.dirty = false;
        }
        Ok(())
    }
}

impl Drop for SyncRecord {
    /// A clean close leaves the record exact, not lagging.
    fn drop(&mut self) {
        if let Err(e) = self.sync() {
            warn!(path = %self.path.display(), "cannot sync the sync record at close: {e}");
        }
    }
}

/// Whether the recovered hard state and log (ending at `last`, term then
/// index; the snapshot kept at `(index, term)`; `term_at` reads the term of
/// an entry) cover what the record `expect` says was synced; why not if
/// they do not. Every store that keeps a sync record recovers by this
/// rule: the disk store at every open, the simulator's disk after every
/// crash.
pub fn covers(
    expect: &SyncState,
    hs: &HardState,
    last: (u64, u64),
    (snap_index, snap_term): (u64, u64),
    term_at: impl Fn(u64) -> Option<u64>,
) -> Result<(), String> {
    log_covers(expect, last, (snap_index, snap_term), term_at)?;
    if hs.term < expect.term {
        return Err(format!("the hard state is at term {} but term {} was synced", hs.term, expect.term));
    }
    // A vote can be cast after the record was written (the record may lag
    // after a power loss), never withdrawn or changed within a term.
    if hs.term == expect.term && expect.vote != 0 && hs.vote != expect.vote {
        return Err(format!("the vote of term {} is {} but {} was synced", hs.term, hs.vote, expect.vote));
    }
    if hs.commit < expect.commit {
        return Err(format!("the hard state's commit is {} but {} was synced", hs.commit, expect.commit));
    }
    Ok(())
}

/// The log part of [`covers`].
fn log_covers(
    expect: &SyncState,
    last: (u64, u64),
    (snap_index, snap_term): (u64, u64),
    term_at: impl Fn(u64) -> Option<u64>,
) -> Result<(), String> {
    let (term, index) = (expect.last_term, expect.last_index);
    // A newer leader may have replaced the synced suffix with entries of a
    // later term after the record was last written: the log's last term is
    // then above the recorded one, which no cut can produce (terms never
    // decrease along a log). Entries compacted behind the snapshot are
    // covered by the snapshot's own checksum.
    if index == 0 || last.0 > term || index < snap_index {
        return Ok(());
    }
    let found = if index == snap_index {
        Some(snap_term)
    } else if index <= last.1 {
        term_at(index)
    } else {
        None
    };
    match found {
        Some(t) if t == term => Ok(()),
        Some(t) => Err(format!("entry {index} has term {t} but term {term} was synced there")),
        None => Err(format!("the log ends at entry {} but entries up to {index} (term {term}) were synced", last.1)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn state(n: u64) -> SyncState {
        SyncState {
            incarnation: 7,
            last_term: n,
            last_index: 10 * n,
            term: n,
            vote: 2,
            commit: 5 * n,
            floor: (n % 2 == 0).then_some((n, n + 1)),
        }
    }

    #[test]
    fn records_survive_a_reopen_and_alternate_slots() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(RECORD_FILE);
        assert!(SyncRecord::open(&path).unwrap().is_none(), "none yet");
        let mut r = SyncRecord::create(&path, &state(1)).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        for n in 2..=5 {
            r.write(state(n), false).unwrap();
            assert_eq!(*SyncRecord::open(&path).unwrap().unwrap().state(), state(n));
        }
        drop(r);
        let bytes = std::fs::read(&path).unwrap();
        let slot0 = SyncState::decode(&bytes).unwrap();
        let slot1 = SyncState::decode(&bytes[SLOT_STRIDE as usize..]).unwrap();
        assert_eq!((slot0.0, slot1.0), (4, 5), "write n goes to slot n % 2");
    }

    #[test]
    fn a_torn_slot_falls_back_to_the_other() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(RECORD_FILE);
        let mut r = SyncRecord::create(&path, &state(1)).unwrap();
        r.write(state(2), false).unwrap();
        r.write(state(3), false).unwrap();
        drop(r);
        // Write 3 went to slot 1; tear it (half of it never reached the disk).
        let mut bytes = std::fs::read(&path).unwrap();
        let torn = SLOT_STRIDE as usize + SLOT_LEN / 2;
        bytes[torn..SLOT_STRIDE as usize + SLOT_LEN].fill(0);
        std::fs::write(&path, &bytes).unwrap();
        let mut r = SyncRecord::open(&path).unwrap().unwrap();
        assert_eq!(*r.state(), state(2), "the previous record");
        // The next write replaces the torn slot, not the good one.
        r.write(state(4), false).unwrap();
        drop(r);
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(SyncState::decode(&bytes).unwrap(), (2, state(2)));
        assert_eq!(SyncState::decode(&bytes[SLOT_STRIDE as usize..]).unwrap(), (3, state(4)));
        // Both slots damaged: refused, not read as empty.
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[20] ^= 1;
        bytes[SLOT_STRIDE as usize + 20] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let e = SyncRecord::open(&path).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        std::fs::write(&path, b"short").unwrap();
        assert!(SyncRecord::open(&path).is_err());
    }

    #[test]
    fn the_floor_clears_once_the_log_reaches_it() {
        let s = SyncState { floor: Some((3, 10)), ..SyncState::default() };
        assert_eq!(s.after((3, 9), 3, 0, 0).floor, Some((3, 10)));
        assert_eq!(s.after((2, 50), 3, 0, 0).floor, Some((3, 10)), "a longer log of an older term is behind");
        assert_eq!(s.after((3, 10), 3, 0, 0).floor, None);
        assert_eq!(s.after((4, 1), 4, 0, 0).floor, None, "a newer term is ahead");
    }

    #[test]
    fn the_record_is_checked_field_by_field() {
        let hs = |term, vote, commit| HardState { term, vote, commit, ..Default::default() };
        let rec = SyncState { last_term: 2, last_index: 10, term: 3, vote: 1, commit: 8, ..SyncState::default() };
        let term_at = |i: u64| (i <= 12).then_some(2);
        assert!(covers(&rec, &hs(3, 1, 8), (2, 10), (0, 0), term_at).is_ok());
        assert!(covers(&rec, &hs(4, 0, 8), (2, 12), (0, 0), term_at).is_ok(), "a later term, a longer log");
        assert!(covers(&rec, &hs(2, 1, 8), (2, 10), (0, 0), term_at).unwrap_err().contains("term 3 was synced"));
        assert!(covers(&rec, &hs(3, 2, 8), (2, 10), (0, 0), term_at).unwrap_err().contains("vote"));
        assert!(covers(&rec, &hs(3, 1, 7), (2, 10), (0, 0), term_at).unwrap_err().contains("commit"));
        assert!(covers(&rec, &hs(3, 1, 8), (2, 9), (0, 0), term_at).unwrap_err().contains("ends at entry 9"));
        let other_term = |_| Some(1);
        assert!(covers(&rec, &hs(3, 1, 8), (1, 10), (0, 0), other_term).unwrap_err().contains("has term 1"));
        // Replaced by a later leader's entries after the record lagged.
        assert!(covers(&rec, &hs(4, 0, 8), (4, 9), (0, 0), |_| Some(4)).is_ok());
        // Compacted behind the snapshot, or ending at it.
        assert!(covers(&rec, &hs(3, 1, 8), (2, 10), (12, 2), |_| None).is_ok());
        assert!(covers(&rec, &hs(3, 1, 10), (2, 10), (10, 2), |_| None).is_ok());
    }
}
