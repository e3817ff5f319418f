//! Small disks for the nemesis's `disk-full` fault: each replica's data
//! directory on a size-limited file system of its own, which the nemesis
//! fills to the last byte while the other replicas carry on, and empties
//! at the heal.
//!
//! The file system is a tmpfs mounted over `DIR/replica-ID` before the
//! replica starts: any other file system would need an image and a loop
//! device per replica, and what the fault tests is the same, a write or an
//! allocation that fails with `ENOSPC` in the middle of the replica's
//! work. Mounting needs root (or `CAP_SYS_ADMIN`); without it the fault
//! cannot be injected and [`SmallDisks::mount`] says so. The mounts go
//! with the [`SmallDisks`] that made them.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use thiserror::Error;

/// How big each replica's disk is: room for the log and snapshots of a
/// benchmark's state many times over, and only what is written of it is
/// held in memory.
pub const DISK_BYTES: u64 = 1 << 30;

/// What fills a disk, beside the replica's own files.
const BALLAST: &str = "nemesis-ballast";

/// `ENOSPC`: the one error that means the disk is full.
const ENOSPC: i32 = 28;

/// Small disks that cannot be set up.
#[derive(Debug, Error)]
pub enum DiskError {
    /// The directory to mount over cannot be made.
    #[error("cannot create {path}: {source}")]
    Create {
        /// The directory.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// `mount` failed (no root, no tmpfs) or could not be run.
    #[error(
        "cannot mount a {bytes}-byte tmpfs on {path} for the disk-full fault: {reason} (it needs root or CAP_SYS_ADMIN)"
    )]
    Mount {
        /// The directory.
        path: PathBuf,
        /// Its size.
        bytes: u64,
        /// What `mount` said.
        reason: String,
    },
}

/// One tmpfs per replica over its data directory; unmounted when dropped.
#[derive(Debug)]
pub struct SmallDisks {
    mounts: BTreeMap<u64, PathBuf>,
}

impl SmallDisks {
    /// Mounts a disk of `bytes` over `data_dir/replica-ID` for each of
    /// `ids`, before their replicas start.
    pub fn mount(data_dir: &Path, ids: &[u64], bytes: u64) -> Result<Self, DiskError> {
        let mut disks = Self { mounts: BTreeMap::new() };
        for &id in ids {
            let path = data_dir.join(format!("replica-{id}"));
            std::fs::create_dir_all(&path).map_err(|source| DiskError::Create { path: path.clone(), source })?;
            let out = Command::new("mount")
                .args(["-t", "tmpfs", "-o", &format!("size={bytes},mode=0700"), "psmr-nemesis"])
                .arg(&path)
                .output();
            let reason = match out {
                Ok(o) if o.status.success() => None,
                Ok(o) => Some(String::from_utf8_lossy(&o.stderr).trim().to_string()),
                Err(e) => Some(format!("cannot run mount: {e}")),
            };
            if let Some(reason) = reason {
                // Those mounted so far go when `disks` drops.
                return Err(DiskError::Mount { path, bytes, reason });
            }
            disks.mounts.insert(id, path);
        }
        Ok(disks)
    }

    /// Fills replica `id`'s disk until nothing more fits; the bytes it
    /// took.
    pub fn fill(&self, id: u64) -> io::Result<u64> {
        let mut file = OpenOptions::new().create(true).append(true).open(self.ballast(id)?)?;
        let mut written = 0;
        // Big pieces first, then small ones into what is left.
        for piece in [1 << 20, 4 << 10] {
            written += write_until_full(&mut file, piece)?;
        }
        Ok(written)
    }

    /// Empties what [`SmallDisks::fill`] put on replica `id`'s disk.
    pub fn empty(&self, id: u64) -> io::Result<()> {
        match std::fs::remove_file(self.ballast(id)?) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            r => r,
        }
    }

    fn ballast(&self, id: u64) -> io::Result<PathBuf> {
        let dir = self.mounts.get(&id).ok_or_else(|| io::Error::other(format!("replica {id} has no small disk")))?;
        Ok(dir.join(BALLAST))
    }
}

/// Appends zeros to `file` in pieces of `piece` bytes until the disk is
/// full; the bytes written.
fn write_until_full(file: &mut File, piece: usize) -> io::Result<u64> {
    let zeros = vec![0u8; piece];
    let mut written = 0u64;
    loop {
        match file.write(&zeros) {
            Ok(0) => return Ok(written),
            Ok(n) => written += n as u64,
            Err(e) if e.raw_os_error() == Some(ENOSPC) => return Ok(written),
            Err(e) => return Err(e),
        }
    }
}

impl Drop for SmallDisks {
    fn drop(&mut self) {
        for path in self.mounts.values() {
            let unmounted = Command::new("umount").arg(path).status().is_ok_and(|s| s.success());
            if !unmounted {
                // Still in use (a replica not reaped yet): detached now,
                // gone once the last user closes it.
                let _ = Command::new("umount").arg("-l").arg(path).status();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mounted(path: &Path) -> bool {
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
        let path = path.to_string_lossy();
        mounts.lines().any(|l| l.split_whitespace().nth(1) == Some(path.as_ref()))
    }

    /// Needs root, as the fault does: a machine where it cannot run fails
    /// here rather than in the middle of a nemesis run.
    #[test]
    fn a_full_disk_refuses_writes_until_it_is_emptied_and_goes_when_dropped() {
        let dir = crate::launch::ClusterDir::scratch("psmr-disk-test-").unwrap();
        let disks = SmallDisks::mount(dir.path(), &[1, 2], 8 << 20).unwrap();
        let (one, two) = (dir.path().join("replica-1"), dir.path().join("replica-2"));
        assert!(mounted(&one) && mounted(&two));
        let filled = disks.fill(1).unwrap();
        assert!(filled > (7 << 20) && filled <= 8 << 20, "{filled}");
        let write = |p: &Path| std::fs::write(p.join("data"), vec![1u8; 64 << 10]);
        let err = write(&one).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(ENOSPC), "{err}");
        write(&two).expect("the other replica's disk is its own");
        disks.empty(1).unwrap();
        write(&one).expect("room again once emptied");
        disks.empty(1).unwrap();
        assert!(disks.fill(3).is_err(), "no disk of replica 3");
        drop(disks);
        assert!(!mounted(&one) && !mounted(&two));
    }
}
