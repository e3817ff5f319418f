//! Starting a replica directory from a snapshot saved elsewhere (`psmr
//! client snapshot save`), as a new cluster's member: `psmr replica
//! --restore-from FILE`, etcd's `snapshot restore`.

use crate::disk::{DiskError, DiskStore};
use psmr_core::membership::Membership;
use psmr_core::snapfile::SnapshotFile;
use raft::prelude::{HardState, Snapshot};
use std::path::Path;

impl DiskStore {
    /// Starts the replica directory `dir`, which must not hold a replica's
    /// data yet, from the snapshot `saved` holds, with `members` as its
    /// membership: the log starts after the snapshot, in its term, with
    /// the snapshot committed. Every replica of the new cluster is
    /// restored from the same file with the same members, so they start
    /// from the same state. `saved` is checked whole as it is copied; a
    /// damaged file is refused, and a directory made for it removed.
    pub fn restore_from(dir: &Path, saved: Box<dyn SnapshotFile>, members: &Membership) -> Result<Snapshot, DiskError> {
        if dir.join(crate::snapfiles::CURRENT).exists() || crate::disk::holds_log(dir) {
            let why = "it already holds a replica's data: restore into an empty directory".to_string();
            return Err(DiskError::Snapshot { path: dir.display().to_string(), why });
        }
        let made = !dir.exists();
        let restored = Self::restore_into(dir, saved, members);
        if restored.is_err() && made {
            let _ = std::fs::remove_dir_all(dir);
        }
        restored
    }

    fn restore_into(dir: &Path, saved: Box<dyn SnapshotFile>, members: &Membership) -> Result<Snapshot, DiskError> {
        let refused = |why: String| DiskError::Snapshot { path: "the saved snapshot".into(), why };
        let store = DiskStore::open(dir, members.conf_state().voters)?;
        let snap = psmr_core::state::rebase(saved, members, &store).map_err(refused)?;
        let meta = snap.get_metadata();
        let engine = |e: raft::Error| DiskError::Snapshot { path: dir.display().to_string(), why: e.to_string() };
        // The log's term is the snapshot's: raft never runs a log whose
        // last term is ahead of its own.
        store.append(&[], Some(&HardState { term: meta.term, ..Default::default() })).map_err(engine)?;
        if !store.persist(&snap).map_err(engine)? {
            return Err(refused("a snapshot as new is kept already".into()));
        }
        store.install(snap.clone(), meta.index + 1).map_err(engine)?;
        Ok(snap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use psmr_core::snapfile::FileWriter;
    use psmr_core::store::Store as _;
    use psmr_core::Member;
    use std::io::{Read, Write};

    fn members(ids: &[u64]) -> Membership {
        let member = |id: u64| {
            Member::new(id, ([127, 0, 0, 1], 7000 + id as u16).into(), ([127, 0, 0, 1], 8000 + id as u16).into())
        };
        Membership::of_voters(&ids.iter().map(|&id| member(id)).collect::<Vec<_>>()).unwrap()
    }

    /// A snapshot file as a cluster of `ids` saves one: state `data`.
    fn saved(ids: &[u64], data: &[u8]) -> Vec<u8> {
        let mut w = FileWriter::new(Vec::new(), 40, 3).unwrap();
        psmr_core::state::put_front(&mut w, &members(ids).encode(), &[], 0).unwrap();
        w.write_all(data).unwrap();
        w.finish().unwrap().0
    }

    #[test]
    fn a_restored_directory_starts_from_the_snapshot_with_the_new_members() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("r");
        let data: Vec<u8> = (0..600_000u32).map(|i| (i % 251) as u8).collect();
        let file = saved(&[1, 2, 3], &data);
        let snap = DiskStore::restore_from(&dir, Box::new(file.clone()), &members(&[4, 5, 6])).unwrap();
        assert_eq!((snap.get_metadata().index, snap.get_metadata().term), (40, 3));
        let s = DiskStore::open(&dir, vec![]).unwrap();
        assert_eq!(s.kept(), Some(snap.clone()));
        let st = raft::Storage::initial_state(&s).unwrap();
        assert_eq!((st.hard_state.term, st.hard_state.commit), (3, 40));
        assert_eq!(st.conf_state.voters, vec![4, 5, 6]);
        assert_eq!(psmr_core::state::membership(&snap).unwrap().conf_state().voters, vec![4, 5, 6]);
        let mut opened = psmr_core::state::open_kept(&s, &snap).unwrap();
        let mut state = Vec::new();
        opened.service.read_to_end(&mut state).unwrap();
        assert_eq!(state, data);
        drop((opened, s));
        let e = DiskStore::restore_from(&dir, Box::new(file), &members(&[4, 5, 6])).unwrap_err().to_string();
        assert!(e.contains("already holds a replica's data"), "{e}");
    }

    #[test]
    fn a_damaged_saved_snapshot_is_refused_and_nothing_is_kept() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("r");
        let mut file = saved(&[1], &[9; 300_000]);
        let at = file.len() - 1_000;
        file[at] ^= 1;
        let e = DiskStore::restore_from(&dir, Box::new(file), &members(&[1])).unwrap_err().to_string();
        assert!(e.contains("damaged"), "{e}");
        assert!(!dir.exists(), "the directory made for it is gone");
    }
}
