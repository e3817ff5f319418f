//! The snapshot files of a replica directory, in the format of
//! [`psmr_core::snapfile`]:
//!
//! * `snapshot.bin`, the snapshot kept: the state the log's compacted
//!   prefix made. Replaced only by a rename, then a sync of the directory.
//! * `snapshot.next`, one being written here, a piece at a time as the
//!   service produces them; synced, then renamed over `snapshot.bin` once
//!   kept. An error (a full disk) removes it and leaves the kept one
//!   intact; a restart removes what a crash left of it.
//! * `snapshot.recv`, one being received from the leader, and
//!   `snapshot.recv.id`, the id it was offered under (written and synced
//!   before any byte of it): after a restart, an offer of the same id
//!   resumes from the whole part of what survived. Renamed over
//!   `snapshot.bin` once whole and checked; removed when another is
//!   offered, or once a snapshot as new is kept.
//!
//! So the directory holds at most three snapshot files, whatever happens.
//! All are private (0600). A handle on a file ([`Store::open_snapshot`])
//! reads it even after a rename replaced it: the leader sends from it
//! while newer snapshots are taken.
//!
//! [`Store::open_snapshot`]: psmr_core::store::Store::open_snapshot

use crate::synced::sync_dir;
use parking_lot::Mutex;
use psmr_core::snapfile::{read_end, SnapshotFile, SnapshotId, END_BYTES};
use psmr_core::store::SnapshotSink;
use raft::prelude::Snapshot;
use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The snapshot kept.
pub(crate) const CURRENT: &str = "snapshot.bin";
const TAKING: &str = "snapshot.next";
const RECEIVING: &str = "snapshot.recv";
const RECEIVING_ID: &str = "snapshot.recv.id";
/// What builds before streamed snapshots left while writing one.
const OLD_TMP: &str = "snapshot.bin.tmp";
/// Bytes a snapshot being taken is buffered by before they reach the file.
const WRITE_BUFFER: usize = 1 << 20;
/// Bytes of a snapshot being taken written between two syncs. Without
/// them the kernel holds a gigabyte state's file as dirty pages and writes
/// it back all at once at the final sync, while the log's own syncs wait
/// behind that writeback: a 3-replica cluster filling an 850 MiB state
/// stopped committing for seconds at every snapshot. Synced as it goes,
/// the file never has more than this much unwritten.
const SYNC_EVERY: u64 = 32 << 20;

/// A snapshot file on disk, read at any offset: the store's own, or one
/// `psmr client snapshot save` wrote, handed to
/// [`crate::DiskStore::restore_from`].
pub struct DiskFile(pub File);

impl SnapshotFile for DiskFile {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        let mut done = 0;
        while done < buf.len() {
            match self.0.read_at(&mut buf[done..], offset + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(done)
    }

    fn len(&self) -> u64 {
        self.0.metadata().map_or(0, |m| m.len())
    }
}

/// Reads the snapshot kept in `path`, if there is one: raft's view of it
/// ([`psmr_core::state::describe`]). A file of the format before streamed
/// snapshots is refused with that reason.
pub(crate) fn read_current(path: &Path) -> Result<Option<Snapshot>, String> {
    match File::open(path) {
        Ok(f) => psmr_core::state::describe(Box::new(DiskFile(f))).map(Some),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}

fn create_private(path: &Path) -> io::Result<File> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    OpenOptions::new().read(true).write(true).create_new(true).mode(0o600).open(path)
}

fn remove(path: &Path) -> io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// The file being received.
struct Receiving {
    id: SnapshotId,
    file: File,
    len: u64,
}

#[derive(Default)]
struct Inner {
    current: Option<SnapshotId>,
    recv: Option<Receiving>,
}

/// See the module documentation.
pub(crate) struct SnapFiles {
    dir: PathBuf,
    inner: Mutex<Inner>,
}

impl SnapFiles {
    /// The files of `dir`, whose kept snapshot is `current`: what a crash
    /// left of one being taken is removed; one being received stays to be
    /// resumed, unless it is not newer.
    pub(crate) fn open(dir: &Path, current: Option<SnapshotId>) -> io::Result<Self> {
        remove(&dir.join(TAKING))?;
        remove(&dir.join(OLD_TMP))?;
        let recv = read_receiving(dir).filter(|r| current.map_or(true, |c| r.id.index > c.index));
        if recv.is_none() {
            remove(&dir.join(RECEIVING))?;
            remove(&dir.join(RECEIVING_ID))?;
        }
        Ok(Self { dir: dir.to_path_buf(), inner: Mutex::new(Inner { current, recv }) })
    }

    /// Starts the file of a snapshot taken here.
    pub(crate) fn writer(&self) -> io::Result<Box<dyn SnapshotSink>> {
        let path = self.dir.join(TAKING);
        let file = create_private(&path)?;
        Ok(Box::new(TakingSink { file: Some(BufWriter::with_capacity(WRITE_BUFFER, file)), path, unsynced: 0 }))
    }

    /// Keeps the file last taken here as `id`'s.
    pub(crate) fn keep_taken(&self, id: &SnapshotId) -> io::Result<()> {
        let mut inner = self.inner.lock();
        let taking = self.dir.join(TAKING);
        let file = DiskFile(File::open(&taking)?);
        check_end(&file, id)?;
        std::fs::rename(&taking, self.dir.join(CURRENT))?;
        sync_dir(&self.dir)?;
        inner.current = Some(*id);
        if inner.recv.as_ref().is_some_and(|r| r.id.index <= id.index) {
            inner.recv = None;
            remove(&self.dir.join(RECEIVING))?;
            remove(&self.dir.join(RECEIVING_ID))?;
        }
        Ok(())
    }

    /// Keeps the file received whole as `id`'s.
    pub(crate) fn keep_received(&self, id: &SnapshotId) -> io::Result<()> {
        let mut inner = self.inner.lock();
        let recv = inner.recv.as_ref().filter(|r| r.id == *id && r.len == id.bytes);
        let recv = recv.ok_or_else(|| io::Error::other(format!("{id} was not received whole")))?;
        recv.file.sync_all()?;
        std::fs::rename(self.dir.join(RECEIVING), self.dir.join(CURRENT))?;
        remove(&self.dir.join(RECEIVING_ID))?;
        sync_dir(&self.dir)?;
        inner.recv = None;
        inner.current = Some(*id);
        Ok(())
    }

    /// A handle on the file of `id`: the one kept, or the one received.
    pub(crate) fn open_file(&self, id: &SnapshotId) -> io::Result<Box<dyn SnapshotFile>> {
        let inner = self.inner.lock();
        let name = match () {
            _ if inner.current == Some(*id) => CURRENT,
            _ if inner.recv.as_ref().is_some_and(|r| r.id == *id) => RECEIVING,
            _ => return Err(io::Error::new(io::ErrorKind::NotFound, format!("no file of {id}"))),
        };
        Ok(Box::new(DiskFile(File::open(self.dir.join(name))?)))
    }

    /// The file being received: its id and size.
    pub(crate) fn receiving(&self) -> Option<(SnapshotId, u64)> {
        self.inner.lock().recv.as_ref().map(|r| (r.id, r.len))
    }

    /// See [`psmr_core::store::Store::receive`].
    pub(crate) fn receive(&self, id: &SnapshotId, offset: u64, data: &[u8]) -> io::Result<()> {
        let mut inner = self.inner.lock();
        if inner.recv.as_ref().map_or(true, |r| r.id != *id) {
            if offset != 0 {
                return Err(io::Error::other(format!("{id} is not being received; it starts at offset 0")));
            }
            inner.recv = None;
            inner.recv = Some(self.start_receiving(id)?);
        }
        let recv = inner.recv.as_mut().expect("set above");
        if offset > recv.len {
            return Err(io::Error::other(format!("offset {offset} beyond the {} bytes received", recv.len)));
        }
        if offset < recv.len {
            recv.file.set_len(offset)?;
            recv.len = offset;
        }
        recv.file.write_all_at(data, offset)?;
        recv.len = offset + data.len() as u64;
        Ok(())
    }

    /// A new file to receive `id` into, its id durable first.
    fn start_receiving(&self, id: &SnapshotId) -> io::Result<Receiving> {
        remove(&self.dir.join(RECEIVING))?;
        let mut named = create_private(&self.dir.join(RECEIVING_ID))?;
        let encoded = id.encode();
        named.write_all(&encoded)?;
        named.write_all(&crc32fast::hash(&encoded).to_le_bytes())?;
        named.sync_all()?;
        let file = create_private(&self.dir.join(RECEIVING))?;
        sync_dir(&self.dir)?;
        Ok(Receiving { id: *id, file, len: 0 })
    }

    /// Makes what was received durable.
    pub(crate) fn sync_received(&self) -> io::Result<()> {
        match &self.inner.lock().recv {
            Some(r) => r.file.sync_data(),
            None => Ok(()),
        }
    }
}

/// The file being received that a restart found, if its id reads back.
fn read_receiving(dir: &Path) -> Option<Receiving> {
    let named = std::fs::read(dir.join(RECEIVING_ID)).ok()?;
    let (encoded, crc) = named.split_at_checked(SnapshotId::ENCODED)?;
    if crc != crc32fast::hash(encoded).to_le_bytes() {
        return None;
    }
    let id = SnapshotId::decode(encoded).ok()?;
    let file = OpenOptions::new().read(true).write(true).open(dir.join(RECEIVING)).ok()?;
    let len = file.metadata().ok()?.len();
    Some(Receiving { id, file, len })
}

/// Whether `file` ends as file `id` does.
fn check_end(file: &DiskFile, id: &SnapshotId) -> io::Result<()> {
    let len = file.len();
    let mut end = [0u8; END_BYTES as usize];
    let whole = len == id.bytes && file.read_at(len.saturating_sub(END_BYTES), &mut end)? == end.len();
    if !whole || read_end(&end)?.0 != id.crc {
        return Err(io::Error::other(format!("the file written is not {id}")));
    }
    Ok(())
}

/// Writes a snapshot taken here into `snapshot.next`; removes it unless
/// finished.
struct TakingSink {
    file: Option<BufWriter<File>>,
    path: PathBuf,
    /// Bytes written since the last sync.
    unsynced: u64,
}

impl Write for TakingSink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let Some(f) = self.file.as_mut() else { return Ok(0) };
        let n = f.write(buf)?;
        self.unsynced += n as u64;
        if self.unsynced >= SYNC_EVERY {
            f.flush()?;
            f.get_ref().sync_data()?;
            self.unsynced = 0;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.as_mut().map_or(Ok(()), |f| f.flush())
    }
}

impl SnapshotSink for TakingSink {
    fn finish(mut self: Box<Self>) -> io::Result<()> {
        let file = self.file.take().ok_or_else(|| io::Error::other("finished twice"))?;
        let file = file.into_inner().map_err(|e| e.into_error())?;
        let synced = file.sync_all();
        if synced.is_err() {
            let _ = std::fs::remove_file(&self.path);
        }
        synced
    }
}

impl Drop for TakingSink {
    fn drop(&mut self) {
        if self.file.take().is_some() {
            // Not finished: an error (a full disk) stopped it.
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use psmr_core::snapfile::FileWriter;
    use std::os::unix::fs::PermissionsExt;

    fn file(index: u64, len: usize) -> (Vec<u8>, SnapshotId) {
        let mut w = FileWriter::new(Vec::new(), index, 2).unwrap();
        w.write_all(&vec![index as u8; len]).unwrap();
        w.finish().unwrap()
    }

    fn read(f: &dyn SnapshotFile) -> Vec<u8> {
        let mut b = vec![0; f.len() as usize];
        f.read_at(0, &mut b).unwrap();
        b
    }

    #[test]
    fn a_file_being_received_survives_a_reopen_and_another_offer_drops_it() {
        let tmp = tempfile::tempdir().unwrap();
        let (bytes, id) = file(5, 10_000);
        let files = SnapFiles::open(tmp.path(), None).unwrap();
        files.receive(&id, 0, &bytes[..4_000]).unwrap();
        files.sync_received().unwrap();
        assert!(files.keep_received(&id).is_err(), "not whole");
        drop(files);
        let files = SnapFiles::open(tmp.path(), None).unwrap();
        assert_eq!(files.receiving(), Some((id, 4_000)));
        assert!(files.receive(&id, 4_001, &bytes[4_001..]).is_err(), "a gap");
        files.receive(&id, 3_000, &bytes[3_000..]).unwrap();
        assert_eq!(read(&*files.open_file(&id).unwrap()), bytes);
        let (other, other_id) = file(6, 100);
        assert!(files.receive(&other_id, 10, &other[10..]).is_err(), "a new file starts at 0");
        files.receive(&other_id, 0, &other).unwrap();
        assert!(files.open_file(&id).is_err(), "the other offer dropped it");
        files.keep_received(&other_id).unwrap();
        assert_eq!(files.receiving(), None);
        assert_eq!(read(&*files.open_file(&other_id).unwrap()), other);
        let mode = std::fs::metadata(tmp.path().join(CURRENT)).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert!(!tmp.path().join(RECEIVING).exists() && !tmp.path().join(RECEIVING_ID).exists());
        // One received before a newer snapshot was kept is dropped.
        files.receive(&id, 0, &bytes[..10]).unwrap();
        drop(files);
        let files = SnapFiles::open(tmp.path(), Some(other_id)).unwrap();
        assert_eq!(files.receiving(), None);
    }

    #[test]
    fn a_snapshot_cut_short_is_removed_and_the_kept_one_stays() {
        let tmp = tempfile::tempdir().unwrap();
        let files = SnapFiles::open(tmp.path(), None).unwrap();
        let (bytes, id) = file(5, 3_000);
        let mut sink = files.writer().unwrap();
        sink.write_all(&bytes).unwrap();
        sink.finish().unwrap();
        files.keep_taken(&id).unwrap();
        // A full disk stops the next one: its file goes, the kept one stays.
        let (newer, newer_id) = file(9, 3_000);
        let mut sink = files.writer().unwrap();
        sink.write_all(&newer[..1_000]).unwrap();
        drop(sink);
        assert!(!tmp.path().join(TAKING).exists());
        assert!(files.keep_taken(&newer_id).is_err());
        assert_eq!(read(&*files.open_file(&id).unwrap()), bytes);
        // A handle reads its file even after a newer one replaced it.
        let old = files.open_file(&id).unwrap();
        let mut sink = files.writer().unwrap();
        sink.write_all(&newer).unwrap();
        sink.finish().unwrap();
        assert!(files.keep_taken(&id).is_err(), "the file written is another");
        files.keep_taken(&newer_id).unwrap();
        assert_eq!(read(&*old), bytes);
        assert_eq!(read(&*files.open_file(&newer_id).unwrap()), newer);
    }
}
