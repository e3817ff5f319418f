//! Damage to a replica's raft log on disk: refused at start, naming the file
//! and the byte, with the files left exactly as they were; a torn tail that
//! a crash leaves is cut and nothing synced is lost; an operator's repair
//! sets the data aside and keeps the replica's identity, term, vote and
//! vote floor.

use psmr_core::snapfile::FileWriter;
use psmr_core::store::Store as _;
use psmr_storage::disk::{DiskError, DiskOptions, DiskStore};
use psmr_storage::synced::{RECORD_FILE, SLOT_STRIDE};
use raft::prelude::{Entry, HardState};
use raft::{GetEntriesContext, Storage};
use std::path::{Path, PathBuf};

const VOTERS: [u64; 3] = [1, 2, 3];

fn entry(index: u64, term: u64) -> Entry {
    let data: Vec<u8> = (0..200).map(|i| (index as u8).wrapping_add(i as u8)).collect();
    Entry { index, term, data: data.into(), ..Default::default() }
}

fn open(dir: &Path) -> Result<DiskStore, DiskError> {
    DiskStore::open(dir, VOTERS.to_vec())
}

/// Appends entries `from..=to` of term 2, one synced write each, each with
/// the hard state (term 2, vote 1, commit = the entry before).
fn fill(store: &DiskStore, from: u64, to: u64) {
    for i in from..=to {
        let hs = HardState { term: 2, vote: 1, commit: i - 1, ..Default::default() };
        store.append(&[entry(i, 2)], Some(&hs)).unwrap();
    }
}

/// A replica directory holding entries 1..=n (see [`fill`]), closed.
fn written(dir: &Path, options: &DiskOptions, n: u64) -> u64 {
    let store = DiskStore::open_with(dir, VOTERS.to_vec(), options).unwrap();
    fill(&store, 1, n);
    store.incarnation()
}

/// Everything [`written`] wrote is there and reads back.
fn assert_intact(store: &DiskStore, n: u64) {
    assert_eq!(store.last_index().unwrap(), n);
    let got = store.entries(1, n + 1, None, GetEntriesContext::empty(false)).unwrap();
    assert_eq!(got, (1..=n).map(|i| entry(i, 2)).collect::<Vec<_>>());
    let hs = store.initial_state().unwrap().hard_state;
    assert_eq!((hs.term, hs.vote, hs.commit), (2, 1, n - 1));
}

/// raft-engine's append-queue files, oldest first.
fn log_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir.join("log"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "raftlog"))
        .collect();
    files.sort();
    files
}

fn newest(dir: &Path) -> PathBuf {
    log_files(dir).pop().expect("a log file")
}

fn flip(path: &Path, at: usize, n: usize) {
    let mut bytes = std::fs::read(path).unwrap();
    for b in &mut bytes[at..at + n] {
        *b ^= 0xff;
    }
    std::fs::write(path, &bytes).unwrap();
}

fn set_len(path: &Path, len: u64) {
    std::fs::OpenOptions::new().write(true).open(path).unwrap().set_len(len).unwrap();
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        if e.path().is_dir() {
            copy_dir(&e.path(), &to.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

/// The refusal must name `file` and the byte, and leave it as it was.
fn assert_damaged(e: DiskError, file: &Path) -> u64 {
    let message = e.to_string();
    let DiskError::LogDamaged { file: named, offset, .. } = e else { panic!("not a damaged file: {message}") };
    assert_eq!(Path::new(&named), file, "{message}");
    assert!(message.contains(&format!("{} is damaged at byte {offset}", file.display())), "{message}");
    assert!(message.contains("--repair"), "{message}");
    offset
}

#[test]
fn four_flipped_bytes_in_the_middle_of_the_newest_file_are_refused_and_left_as_they_were() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("replica-1");
    written(&dir, &DiskOptions::default(), 100);
    let file = newest(&dir);
    let original = std::fs::read(&file).unwrap();
    let mid = original.len() / 2;
    flip(&file, mid, 4);
    let damaged = std::fs::read(&file).unwrap();
    let offset = assert_damaged(open(&dir).err().expect("refused"), &file);
    assert!(offset as usize <= mid && offset > 0, "the record holding byte {mid} starts at {offset}");
    assert_eq!(std::fs::read(&file).unwrap(), damaged, "the file is unchanged byte for byte");
    assert!(!dir.join("recovery").exists());
    // Refused again, the same way: nothing was cut on the first attempt.
    assert_eq!(assert_damaged(open(&dir).err().expect("refused"), &file), offset);
    // Undone, the replica starts with everything.
    std::fs::write(&file, &original).unwrap();
    assert_intact(&open(&dir).unwrap(), 100);
}

#[test]
fn flipped_bytes_in_a_record_footer_are_refused_too() {
    // Damage raft-engine itself sees when it opens (a record's items, at
    // its end), unlike damage to entry data (seen when entries are read):
    // its tolerant mode would cut the file there; psmr puts it back.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("replica-1");
    written(&dir, &DiskOptions::default(), 50);
    let file = newest(&dir);
    let boundary = std::fs::metadata(&file).unwrap().len();
    let store = open(&dir).unwrap();
    fill(&store, 51, 51);
    drop(store);
    // The record of entry 51 spans `boundary..record_end`; its footer
    // (items and checksum) ends it.
    let record_end = std::fs::metadata(&file).unwrap().len();
    let store = open(&dir).unwrap();
    fill(&store, 52, 60);
    drop(store);
    flip(&file, record_end as usize - 2, 2);
    let damaged = std::fs::read(&file).unwrap();
    let offset = assert_damaged(open(&dir).err().expect("refused"), &file);
    assert_eq!(offset, boundary, "where raft-engine stops reading");
    assert_eq!(std::fs::read(&file).unwrap(), damaged, "put back byte for byte after raft-engine cut it");
}

#[test]
fn the_newest_file_cut_mid_record_or_at_a_record_boundary_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("replica-1");
    written(&dir, &DiskOptions::default(), 50);
    let file = newest(&dir);
    // A clean close leaves the file ending at its last record.
    let boundary = std::fs::metadata(&file).unwrap().len();
    let store = open(&dir).unwrap();
    fill(&store, 51, 60);
    drop(store);
    let original = std::fs::read(&file).unwrap();

    // At the boundary: every record checks out, but entries 51..=60 and
    // their hard states are gone.
    set_len(&file, boundary);
    let e = open(&dir).err().expect("refused");
    let message = e.to_string();
    let DiskError::LogCut { file: named, length, .. } = e else { panic!("not a cut: {message}") };
    assert_eq!((Path::new(&named), length), (file.as_path(), boundary), "{message}");
    assert!(message.contains(&format!("{} is {boundary} bytes long", file.display())), "{message}");
    assert!(message.contains("the log ends at entry 50 but entries up to 60 (term 2) were synced"), "{message}");
    assert_eq!(std::fs::metadata(&file).unwrap().len(), boundary);

    // Mid-record: raft-engine would cut the file at the boundary.
    std::fs::write(&file, &original[..boundary as usize + 30]).unwrap();
    assert_eq!(assert_damaged(open(&dir).err().expect("refused"), &file), boundary);
    assert_eq!(std::fs::read(&file).unwrap(), &original[..boundary as usize + 30], "put back as it was");

    std::fs::write(&file, &original).unwrap();
    assert_intact(&open(&dir).unwrap(), 60);
}

#[test]
fn a_damaged_file_header_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("replica-1");
    written(&dir, &DiskOptions::default(), 20);
    let file = newest(&dir);
    flip(&file, 3, 4);
    let damaged = std::fs::read(&file).unwrap();
    // raft-engine's tolerant mode would empty the file (and the replica
    // would come back blank).
    assert_eq!(assert_damaged(open(&dir).err().expect("refused"), &file), 0);
    assert_eq!(std::fs::read(&file).unwrap(), damaged, "left as it was");
}

#[test]
fn damage_in_an_older_file_is_refused_naming_that_file() {
    let small = DiskOptions { log_file_bytes: 4096 };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("replica-1");
    written(&dir, &small, 120);
    let files = log_files(&dir);
    assert!(files.len() >= 4, "{} files", files.len());
    let older = &files[1];
    let original = std::fs::read(older).unwrap();

    // In the middle of its records.
    flip(older, original.len() / 2, 4);
    let damaged = std::fs::read(older).unwrap();
    let e = DiskStore::open_with(&dir, VOTERS.to_vec(), &small).err().expect("refused");
    assert_damaged(e, older);
    assert_eq!(std::fs::read(older).unwrap(), damaged);

    // In its header.
    std::fs::write(older, &original).unwrap();
    flip(older, 0, 4);
    let e = DiskStore::open_with(&dir, VOTERS.to_vec(), &small).err().expect("refused");
    assert_eq!(assert_damaged(e, older), 0);

    std::fs::write(older, &original).unwrap();
    assert_intact(&DiskStore::open_with(&dir, VOTERS.to_vec(), &small).unwrap(), 120);
    for f in &files {
        assert!(f.exists(), "no file was dropped");
    }
}

#[test]
fn zeros_or_garbage_after_the_last_synced_record_are_cut_and_nothing_synced_is_lost() {
    for tail in [vec![0u8; 8192], (0..5000u32).map(|i| (i * 7919 % 251) as u8).collect::<Vec<_>>()] {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("replica-1");
        written(&dir, &DiskOptions::default(), 40);
        let file = newest(&dir);
        let clean = std::fs::read(&file).unwrap();
        let mut torn = clean.clone();
        torn.extend_from_slice(&tail);
        std::fs::write(&file, &torn).unwrap();
        let store = open(&dir).unwrap();
        assert_intact(&store, 40);
        assert_eq!(std::fs::read(&file).unwrap(), clean, "cut where the synced records end");
        assert!(!dir.join("recovery").exists(), "the copy taken before the cut is gone");
        // And it goes on from there.
        fill(&store, 41, 45);
        drop(store);
        assert_intact(&open(&dir).unwrap(), 45);
    }
}

#[test]
fn a_write_torn_by_a_crash_before_its_sync_is_cut() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("replica-1");
    written(&dir, &DiskOptions::default(), 30);
    let file = newest(&dir);
    let boundary = std::fs::metadata(&file).unwrap().len() as usize;
    let record_before = std::fs::read(dir.join(RECORD_FILE)).unwrap();
    let store = open(&dir).unwrap();
    fill(&store, 31, 31);
    drop(store);
    // The crash: half of the write of entry 31 reached the file, its sync
    // never returned, so neither did the sync record's update.
    let bytes = std::fs::read(&file).unwrap();
    let half = boundary + (bytes.len() - boundary) / 2;
    std::fs::write(&file, &bytes[..half]).unwrap();
    std::fs::write(dir.join(RECORD_FILE), &record_before).unwrap();
    let store = open(&dir).unwrap();
    assert_intact(&store, 30);
    assert_eq!(std::fs::metadata(&file).unwrap().len() as usize, boundary);
}

#[test]
fn a_copy_taken_mid_run_is_what_a_crash_leaves_and_opens_with_nothing_synced_lost() {
    // A SIGKILL leaves the files as they are while the store runs: the
    // newest one preallocated past its last record.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("replica-1");
    let store = DiskStore::open(&dir, VOTERS.to_vec()).unwrap();
    fill(&store, 1, 25);
    let crashed = tmp.path().join("crashed");
    copy_dir(&dir, &crashed);
    fill(&store, 26, 30);
    drop(store);
    let file = newest(&crashed);
    let len = std::fs::metadata(&file).unwrap().len();

    // raft-engine's strict mode refuses such a tail, so psmr cannot stop
    // there: it takes the second step.
    let strict = tmp.path().join("strict");
    copy_dir(&crashed, &strict);
    let config = raft_engine::Config {
        dir: strict.join("log").display().to_string(),
        recovery_mode: raft_engine::RecoveryMode::AbsoluteConsistency,
        ..Default::default()
    };
    assert!(raft_engine::Engine::open(config).is_err(), "a crash leaves a tail strict recovery refuses");

    let store = open(&crashed).unwrap();
    assert_intact(&store, 25);
    assert!(std::fs::metadata(&file).unwrap().len() < len, "the preallocated tail was cut");
}

#[test]
fn repair_moves_the_data_aside_and_keeps_identity_term_vote_and_a_vote_floor() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("replica-2");
    let incarnation = written(&dir, &DiskOptions::default(), 30);
    let file = newest(&dir);
    flip(&file, std::fs::metadata(&file).unwrap().len() as usize / 2, 4);
    let damaged = std::fs::read(&file).unwrap();
    assert!(open(&dir).is_err());

    let report = DiskStore::repair(&dir).unwrap();
    let moved = report.moved_to.clone().expect("moved aside");
    assert!(moved.file_name().unwrap().to_str().unwrap().starts_with("replica-2.damaged-"), "{}", moved.display());
    assert_eq!(std::fs::read(moved.join("log").join(file.file_name().unwrap())).unwrap(), damaged, "kept as it was");
    assert!(moved.join(RECORD_FILE).exists());
    assert!(report.damage.as_deref().is_some_and(|d| d.contains("is damaged at byte")), "{report:?}");
    assert_eq!((report.incarnation, report.term, report.vote), (incarnation, 2, 1));
    assert_eq!(report.vote_floor, Some((2, 30)));
    let text = report.to_string();
    assert!(text.contains("nothing deleted") && text.contains("vote floor at entry 30 of term 2"), "{text}");

    // The rebuilt replica: same identity, term and vote, empty, and a floor
    // until its own log reaches what it had synced.
    let store = open(&dir).unwrap();
    assert_eq!(store.incarnation(), incarnation);
    let hs = store.initial_state().unwrap().hard_state;
    assert_eq!((hs.term, hs.vote, hs.commit), (2, 1, 0));
    assert_eq!((store.first_index().unwrap(), store.last_index().unwrap()), (1, 0));
    assert_eq!(store.vote_floor(), Some((2, 30)));
    fill(&store, 1, 29);
    assert_eq!(store.vote_floor(), Some((2, 30)), "entry 29 is behind entry 30");
    drop(store);
    let store = open(&dir).unwrap();
    assert_eq!(store.vote_floor(), Some((2, 30)), "persisted");
    fill(&store, 30, 30);
    assert_eq!(store.vote_floor(), None, "reached");
    drop(store);
    assert_eq!(open(&dir).unwrap().vote_floor(), None, "cleared for good");
}

#[test]
fn a_snapshot_from_the_leader_clears_the_floor_it_passes() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("replica-1");
    written(&dir, &DiskOptions::default(), 10);
    DiskStore::repair(&dir).unwrap();
    let store = open(&dir).unwrap();
    assert_eq!(store.vote_floor(), Some((2, 10)));
    // The file as the transfer leaves it: received whole.
    let (bytes, id) = FileWriter::new(Vec::new(), 20, 3).unwrap().finish().unwrap();
    store.receive(&id, 0, &bytes).unwrap();
    let conf = raft::prelude::ConfState::from((VOTERS.to_vec(), vec![]));
    store.apply_snapshot(psmr_core::state::raft_snapshot(id, Vec::new(), conf)).unwrap();
    assert_eq!(store.vote_floor(), None);
}

#[test]
fn repair_refuses_without_a_sound_record_or_while_the_replica_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("replica-3");
    written(&dir, &DiskOptions::default(), 10);

    let store = open(&dir).unwrap();
    let e = DiskStore::repair(&dir).unwrap_err();
    assert!(matches!(e, DiskError::Busy { .. }), "{e}");
    drop(store);

    // Both slots of the record damaged.
    let record = dir.join(RECORD_FILE);
    flip(&record, 20, 1);
    flip(&record, SLOT_STRIDE as usize + 20, 1);
    let e = DiskStore::repair(&dir).unwrap_err();
    let message = e.to_string();
    assert!(matches!(e, DiskError::Repair { .. }) && message.contains("sync record"), "{message}");
    assert!(message.contains("cannot rebuild it safely under the same id"), "{message}");
    let siblings: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().flatten().map(|e| e.file_name()).collect();
    assert_eq!(siblings, vec![std::ffi::OsString::from("replica-3")], "nothing moved or built");
    // And a start refuses it as well.
    let e = open(&dir).err().expect("refused").to_string();
    assert!(e.contains("sync record") && e.contains("damaged"), "{e}");

    std::fs::remove_file(&record).unwrap();
    let e = DiskStore::repair(&dir).unwrap_err().to_string();
    assert!(e.contains("no sync record"), "{e}");
}
