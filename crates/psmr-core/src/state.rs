//! A snapshot of a replica's state: what the apply loop freezes, how it is
//! written, and how it is read back.
//!
//! A snapshot file ([`crate::snapfile`]) holds, in its pieces, the
//! membership at its index ([`Membership::encode`]), the reply cache's
//! snapshot, the apply loop's clock (the time execution had reached, ms;
//! format 3 on, 0 in a format 2 file), then the service's own stream
//! ([`psmr_model::snapshot`]).
//! Raft carries only its [`Descriptor`]: the file's id and the
//! membership. The apply loop only *freezes* the state ([`Taken`]:
//! execution pauses for the copy); writing it happens in [`persist`], on a
//! side pool in a threaded replica, inline in the simulator, a piece at a
//! time: no copy of the encoded state is ever held.

use crate::cache::FrozenCache;
use crate::membership::Membership;
use crate::snapfile::{
    read_end, Cursor, Descriptor, FileReader, FileWriter, SnapshotFile, SnapshotId, END_BYTES, HEADER_BYTES,
};
use crate::store::Store;
use psmr_model::snapshot::{put_bytes, put_u64, SnapshotReader};
use psmr_model::Frozen;
use raft::prelude::{ConfState, Snapshot};
use std::io::{self, Write};
use std::time::Duration;

/// The most bytes of membership a snapshot may hold.
const MEMBERS_BYTES_MAX: usize = 1 << 20;
/// The most bytes of reply cache a snapshot may hold.
const CACHE_BYTES_MAX: usize = 1 << 31;

/// The membership a snapshot holds (from its descriptor).
pub fn membership(snap: &Snapshot) -> Result<Membership, String> {
    let index = snap.get_metadata().index;
    let d = Descriptor::decode(&snap.data).map_err(|e| format!("the snapshot at {index}: {e}"))?;
    Membership::decode(&d.members).map_err(|e| format!("the snapshot at {index}: {e}"))
}

/// What raft carries of the snapshot in file `id`: its index, term and
/// membership, and the descriptor as its data.
pub fn raft_snapshot(id: SnapshotId, members: Vec<u8>, conf: ConfState) -> Snapshot {
    let mut snapshot = Snapshot { data: Descriptor { id, members }.encode().into(), ..Default::default() };
    let meta = snapshot.mut_metadata();
    meta.index = id.index;
    meta.term = id.term;
    meta.set_conf_state(conf);
    snapshot
}

/// What the apply loop took while execution paused.
pub struct Taken {
    /// The last entry the snapshot covers.
    pub index: u64,
    /// Its term.
    pub term: u64,
    /// The membership at `index`, encoded.
    pub members: Vec<u8>,
    /// Raft's view of it.
    pub conf: ConfState,
    /// The service's state, to be written.
    pub service: Frozen,
    /// The reply cache, to be encoded.
    pub cache: FrozenCache,
    /// The apply loop's clock at `index`: the time execution reached.
    pub clock: u64,
    /// How long execution paused for it.
    pub paused: Duration,
    /// How much of that went to waiting for what was submitted to finish.
    pub drained: Duration,
}

/// What became of a snapshot handed to [`persist`].
pub enum Persisted {
    /// Durable: keep it and compact the log behind it. Its size in bytes.
    Kept(Snapshot, u64),
    /// A snapshot as new is kept already.
    Stale,
}

/// Writes `taken` into a new file of `store`, a piece at a time, and keeps
/// it. An error leaves the log uncompacted and the last snapshot kept
/// (a full disk included); the replica goes on.
pub fn persist(taken: Taken, store: &impl Store) -> Result<Persisted, String> {
    let Taken { index, term, members, conf, service, cache, clock, .. } = taken;
    let failed =
        |e: &dyn std::fmt::Display| format!("cannot write the snapshot at {index}, the log is not compacted: {e}");
    let id = write(store, (index, term, clock), &members, service, cache).map_err(|e| failed(&e))?;
    let snapshot = raft_snapshot(id, members, conf);
    match store.persist(&snapshot) {
        Ok(true) => Ok(Persisted::Kept(snapshot, id.bytes)),
        Ok(false) => Ok(Persisted::Stale),
        Err(e) => Err(failed(&e)),
    }
}

/// Writes the pieces before the service's stream: the membership, the
/// reply cache and the apply loop's clock ([`open`] reads them back).
pub fn put_front(w: &mut impl Write, members: &[u8], cache: &[u8], clock: u64) -> io::Result<()> {
    put_bytes(w, members)?;
    put_bytes(w, cache)?;
    put_u64(w, clock)
}

/// Writes a snapshot at `(index, term, clock)`.
fn write(
    store: &impl Store,
    (index, term, clock): (u64, u64, u64),
    members: &[u8],
    service: Frozen,
    cache: FrozenCache,
) -> io::Result<SnapshotId> {
    let mut w = FileWriter::new(store.snapshot_writer()?, index, term)?;
    put_front(&mut w, members, &cache(), clock)?;
    service(&mut w)?;
    w.flush()?;
    let (sink, id) = w.finish()?;
    sink.finish()?;
    Ok(id)
}

/// A snapshot file opened to be restored: its membership and reply cache
/// read, the service's stream next.
pub struct Opened {
    /// The index of the last entry it covers.
    pub index: u64,
    /// The membership at `index`, encoded.
    pub members: Vec<u8>,
    /// The reply cache's snapshot.
    pub cache: Vec<u8>,
    /// The apply loop's clock at `index` (0 in a format 2 file).
    pub clock: u64,
    /// The service's stream, each piece checked as it is read.
    pub service: FileReader<Cursor>,
}

/// Opens the snapshot `store` keeps, `snap`, to restore it (at a restart).
pub fn open_kept(store: &impl Store, snap: &Snapshot) -> Result<Opened, String> {
    let index = snap.get_metadata().index;
    let bad = |e: &dyn std::fmt::Display| format!("the snapshot at {index}: {e}");
    let id = Descriptor::decode(&snap.data).map_err(|e| bad(&e))?.id;
    open(snap, store.open_snapshot(&id).map_err(|e| bad(&e))?)
}

/// Opens `file`, the file of `snap`, to restore it: reads its header,
/// membership and reply cache; the service's stream is read as the
/// service restores.
pub fn open(snap: &Snapshot, file: Box<dyn SnapshotFile>) -> Result<Opened, String> {
    let index = snap.get_metadata().index;
    let bad = |e: &dyn std::fmt::Display| format!("the snapshot at {index}: {e}");
    let id = Descriptor::decode(&snap.data).map_err(|e| bad(&e))?.id;
    let mut service = FileReader::open(Cursor::new(file)).map_err(|e| bad(&e))?;
    if (service.index, service.term) != (id.index, id.term) {
        return Err(bad(&format!("its file is of index {} and term {}", service.index, service.term)));
    }
    let (members, cache, clock) = read_front(&mut service).map_err(|e| bad(&e))?;
    Ok(Opened { index, members, cache, clock, service })
}

/// Reads the pieces before the service's stream: the membership, the
/// reply cache and the clock (0 before format 3).
fn read_front(reader: &mut FileReader<Cursor>) -> Result<(Vec<u8>, Vec<u8>, u64), psmr_model::SnapshotError> {
    let version = reader.version;
    let mut r = SnapshotReader::new(reader);
    let members = r.bytes(MEMBERS_BYTES_MAX, "the membership")?;
    let cache = r.bytes(CACHE_BYTES_MAX, "the reply cache")?;
    let clock = if version >= 3 { r.u64()? } else { 0 };
    Ok((members, cache, clock))
}

/// Writes the snapshot `saved` holds (a file saved from a cluster, `psmr
/// client snapshot save`) into a new file of `store`, with `members` as
/// its membership, so that a new cluster starts from its state (`psmr
/// replica --restore-from`); raft's view of the new file, to persist and
/// install. Every piece of `saved` is checked as it is copied, and its
/// whole checksum at the end: a damaged file writes nothing kept.
pub fn rebase(saved: Box<dyn SnapshotFile>, members: &Membership, store: &impl Store) -> Result<Snapshot, String> {
    let mut reader = FileReader::open(Cursor::new(saved)).map_err(|e| e.to_string())?;
    let (index, term) = (reader.index, reader.term);
    let (_, cache, clock) = read_front(&mut reader).map_err(|e| e.to_string())?;
    let encoded = members.encode();
    let mut copy = || -> io::Result<SnapshotId> {
        let mut w = FileWriter::new(store.snapshot_writer()?, index, term)?;
        put_front(&mut w, &encoded, &cache, clock)?;
        io::copy(&mut reader, &mut w)?;
        let (sink, id) = w.finish()?;
        sink.finish()?;
        Ok(id)
    };
    let id = copy().map_err(|e| e.to_string())?;
    Ok(raft_snapshot(id, encoded, members.conf_state()))
}

/// Raft's view of the snapshot in `file` (as a store reads the file it
/// kept when it opens): its index and term from the header, its
/// membership from the first piece, its id from the end mark. Only those
/// parts are checked here; the rest is when it is restored.
pub fn describe(file: Box<dyn SnapshotFile>) -> Result<Snapshot, String> {
    let len = file.len();
    let mut end = [0u8; END_BYTES as usize];
    if len < HEADER_BYTES + END_BYTES || file.read_at(len - END_BYTES, &mut end).map_err(|e| e.to_string())? < end.len()
    {
        return Err(format!("a snapshot file of {len} bytes, too short for its header and end mark"));
    }
    let (crc, _) = read_end(&end).map_err(|e| e.to_string())?;
    let mut reader = FileReader::open(Cursor::new(file)).map_err(|e| e.to_string())?;
    let (index, term) = (reader.index, reader.term);
    let members =
        SnapshotReader::new(&mut reader).bytes(MEMBERS_BYTES_MAX, "the membership").map_err(|e| e.to_string())?;
    let conf = Membership::decode(&members).map_err(|e| format!("its membership: {e}"))?.conf_state();
    Ok(raft_snapshot(SnapshotId { index, term, bytes: len, crc }, members, conf))
}
