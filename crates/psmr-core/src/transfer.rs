//! Snapshot transfer: how a leader's snapshot file reaches a follower that
//! fell behind the compacted log, whatever its size.
//!
//! Raft's `MsgSnapshot` carries only the snapshot's metadata and its
//! [`Descriptor`] (the file's id and the membership). The file itself
//! ([`crate::snapfile`]) goes in chunks, on a lane of the peer link that
//! never holds raft's appends and heartbeats behind it:
//!
//! ```text
//! leader                                   follower
//!   Offer(MsgSnapshot)          ──▶          guard-checked; resumes the same
//!                               ◀──          Ack{next, resume}   (id) or starts over
//!   Chunk{offset, crc, data} ×window ──▶     written in order, synced every
//!                               ◀──          Ack{next}           sync_bytes
//!   ...                                      whole: end mark and checksum
//!                               ◀──          Ack{next = size}    checked, then the
//!   report_snapshot(Finish)                  MsgSnapshot is stepped
//! ```
//!
//! **Flow control**: a leader has at most `window` chunks unacknowledged
//! per follower, and at most `transfers_max` transfers at once; it reads
//! each chunk from the kept file (a handle that survives a newer snapshot)
//! as it sends it, so a transfer costs it a window of chunks, never the
//! state. **Resumption**: an offer of a snapshot the follower is already
//! receiving (the same index, term, size and checksum) goes on from what
//! it holds; after a restart, what it holds is the whole prefix of the
//! file it kept ([`Scan`], a bounded number of bytes per turn), and
//! chunks written since the last sync may be gone. An offer of another
//! snapshot starts over and drops the partial file. **Checks**: every
//! chunk's checksum, its place (a chunk out of order asks the leader to
//! resume from what the follower holds), and at the end the file's end
//! mark and whole checksum against the id offered; only then does raft
//! see the snapshot, and the store keeps the file atomically
//! ([`crate::store::Store::apply_snapshot`]). A leader that hears nothing
//! offers again every [`RETRY_NS`] and gives up after `stall` (raft
//! offers again later); one that stops leading drops its transfers.
//!
//! Everything here is a decision: the protocol's driver carries the
//! messages ([`crate::protocol::ProtocolIo::send_snapshot`]), the store
//! holds the files, and the clock comes with the protocol's turns.

use crate::config::Config;
use crate::snapfile::{Assembly, Descriptor, Scan, SnapshotFile, SnapshotId, END_BYTES};
use crate::store::Store;
use psmr_model::wire::{Decoder, Encoder, WireError};
use raft::prelude::{Message, MessageType};
use raft::SnapshotStatus;
use std::collections::BTreeMap;
use std::sync::Arc;
use tracing::{debug, info};

/// The service's check of a snapshot's stream before it is kept
/// ([`psmr_model::Service::check_snapshot`]), as the protocol calls it.
pub type SnapshotCheck = Arc<dyn Fn(&mut dyn std::io::Read) -> Result<(), String> + Send + Sync>;

/// The largest chunk a replica accepts (and `snapshot_chunk_bytes` may
/// be).
pub const CHUNK_MAX: usize = 16 << 20;
/// The longest reason a refusal carries.
const WHY_MAX: usize = 1024;
/// The largest raft message an offer carries (its snapshot holds only a
/// descriptor).
const OFFER_MAX: usize = 4 << 20;
/// A leader offers again after this long without an answer (a lost offer,
/// a connection that dropped chunks in flight).
pub const RETRY_NS: u64 = 1_000_000_000;
/// Bytes of a partial file a follower checks per turn when it resumes a
/// transfer after a restart, so that a gigabyte file never stops the
/// protocol for long.
const SCAN_BUDGET: u64 = 16 << 20;

/// A message of the snapshot lane.
#[derive(Clone, Debug, PartialEq)]
pub enum SnapMsg {
    /// Leader to follower: raft's `MsgSnapshot`, whose descriptor names
    /// the file that follows.
    Offer(Box<Message>),
    /// Leader to follower: the bytes of file `id` at `offset`, with their
    /// crc32.
    Chunk {
        /// The file.
        id: SnapshotId,
        /// Where the bytes go.
        offset: u64,
        /// Their crc32.
        crc: u32,
        /// The bytes.
        data: Vec<u8>,
    },
    /// Follower to leader: it holds the first `next` bytes of `id`; with
    /// `resume`, the leader sends from there (an answer to an offer, or
    /// to a chunk out of place).
    Ack {
        /// The file.
        id: SnapshotId,
        /// The bytes held.
        next: u64,
        /// Send from `next`.
        resume: bool,
    },
    /// Follower to leader: it will not take `id`, and why.
    Refuse {
        /// The file.
        id: SnapshotId,
        /// Why.
        why: String,
    },
}

const T_OFFER: u8 = 1;
const T_CHUNK: u8 = 2;
const T_ACK: u8 = 3;
const T_REFUSE: u8 = 4;

impl SnapMsg {
    /// A chunk of `data` at `offset` of `id`, with its checksum.
    pub fn chunk(id: SnapshotId, offset: u64, data: Vec<u8>) -> Self {
        SnapMsg::Chunk { id, offset, crc: crc32fast::hash(&data), data }
    }

    /// The message's body on the wire.
    pub fn encode(&self) -> Vec<u8> {
        use protobuf::Message as _;
        match self {
            SnapMsg::Offer(m) => {
                let mut e = Encoder::new();
                e.u8(T_OFFER).bytes(&m.write_to_bytes().expect("raft messages always encode"));
                e.finish()
            }
            SnapMsg::Chunk { id, offset, crc, data } => {
                let mut e = Encoder::with_capacity(data.len() + 64);
                e.u8(T_CHUNK).bytes(&id.encode()).u64(*offset).u32(*crc).bytes(data);
                e.finish()
            }
            SnapMsg::Ack { id, next, resume } => {
                let mut e = Encoder::new();
                e.u8(T_ACK).bytes(&id.encode()).u64(*next).u8(u8::from(*resume));
                e.finish()
            }
            SnapMsg::Refuse { id, why } => {
                let mut e = Encoder::new();
                let why = cut(why, WHY_MAX);
                e.u8(T_REFUSE).bytes(&id.encode()).str(why);
                e.finish()
            }
        }
    }

    /// Reads what [`SnapMsg::encode`] wrote: hostile bytes, refused with
    /// an error, never a panic nor an allocation beyond their length.
    pub fn decode(body: &[u8]) -> Result<Self, WireError> {
        Decoder::whole(body, "snapshot message", |d| {
            let kind = d.u8()?;
            if kind == T_OFFER {
                let raw = d.bytes()?;
                if raw.len() > OFFER_MAX {
                    return Err(d.error(format!("an offer of {} bytes", raw.len())));
                }
                let m = crate::decode_proto(&bytes::Bytes::copy_from_slice(raw)).map_err(|e| d.error(e.to_string()))?;
                return Ok(SnapMsg::Offer(Box::new(m)));
            }
            let id = SnapshotId::decode(d.bytes()?).map_err(|e| d.error(e))?;
            match kind {
                T_CHUNK => {
                    let (offset, crc, data) = (d.u64()?, d.u32()?, d.bytes()?);
                    if data.is_empty() || data.len() > CHUNK_MAX {
                        return Err(d.error(format!("a chunk of {} bytes", data.len())));
                    }
                    Ok(SnapMsg::Chunk { id, offset, crc, data: data.to_vec() })
                }
                T_ACK => {
                    let (next, resume) = (d.u64()?, d.u8()?);
                    if resume > 1 {
                        return Err(d.error(format!("resume flag {resume}")));
                    }
                    Ok(SnapMsg::Ack { id, next, resume: resume == 1 })
                }
                T_REFUSE => Ok(SnapMsg::Refuse { id, why: d.str()? }),
                k => Err(d.error(format!("unknown kind {k}"))),
            }
        })
    }

    /// The bytes it holds beyond its headers (a chunk's data).
    pub fn weight(&self) -> usize {
        match self {
            SnapMsg::Chunk { data, .. } => data.len(),
            _ => 0,
        }
    }
}

/// `s` cut to at most `max` bytes, at a character boundary.
fn cut(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// The id of the file raft's snapshot message names, checked against its
/// metadata.
pub fn offered_id(msg: &Message) -> Result<SnapshotId, String> {
    let snap = msg.get_snapshot();
    let id = Descriptor::decode(&snap.data)?.id;
    let meta = snap.get_metadata();
    if (id.index, id.term) != (meta.index, meta.term) {
        return Err(format!("a descriptor of {id} for a snapshot at index {} term {}", meta.index, meta.term));
    }
    Ok(id)
}

/// A transfer's settings, from the configuration.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Bytes per chunk.
    pub chunk: usize,
    /// Chunks unacknowledged per transfer.
    pub window: usize,
    /// Bytes received between two syncs.
    pub sync_bytes: u64,
    /// Transfers a leader runs at once.
    pub transfers_max: usize,
    /// No progress for this long (ns): the transfer is abandoned.
    pub stall_ns: u64,
}

impl Limits {
    /// The limits `config` sets.
    pub fn of(config: &Config) -> Self {
        Self {
            // A chunk and its header fit in one peer frame.
            chunk: config.snapshot_chunk_bytes.min(config.peer_frame_max.saturating_sub(1024)).max(1),
            window: config.snapshot_window_chunks,
            sync_bytes: config.snapshot_sync_bytes,
            transfers_max: config.snapshot_transfers_max,
            stall_ns: config.snapshot_stall_ms.saturating_mul(1_000_000),
        }
    }
}

/// Where transfers send, and tell of what they refused.
pub(crate) trait Link {
    /// Sends `msg` to `to` on the snapshot lane; false if it cannot now.
    fn send(&mut self, to: u64, msg: SnapMsg) -> bool;
    /// A message from `peer` was refused.
    fn refused(&mut self, peer: u64, why: &str);
}

/// What a replica can tell of a transfer in progress.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Progress {
    /// The other end.
    pub peer: u64,
    /// This replica sends (leader) or receives (follower).
    pub sending: bool,
    /// The file.
    pub id: SnapshotId,
    /// Bytes acknowledged (sending) or received (receiving).
    pub done: u64,
    /// When it started, on the protocol's clock (ns).
    pub started_ns: u64,
}

/// A file on its way to a follower.
struct Outgoing {
    id: SnapshotId,
    offer: Message,
    file: Box<dyn SnapshotFile>,
    /// The end of the bytes sent.
    sent: u64,
    /// The end of the bytes the follower holds.
    acked: u64,
    /// The follower answered the offer.
    accepted: bool,
    /// When the offer last went out (`None`: not yet).
    offered_ns: Option<u64>,
    /// When the follower last answered.
    heard_ns: u64,
    started_ns: u64,
}

/// A file on its way from the leader.
struct Incoming {
    from: u64,
    offer: Message,
    assembly: Assembly,
    /// Bytes held, in order.
    written: u64,
    /// Bytes synced.
    synced: u64,
    /// Checking what a restart left of the file, before anything else.
    scan: Option<Scan>,
    started_ns: u64,
}

/// The transfers of one replica: those it sends as leader, the one it
/// receives. See the module documentation.
pub(crate) struct Transfers {
    limits: Limits,
    check: Option<SnapshotCheck>,
    out: BTreeMap<u64, Outgoing>,
    inc: Option<Incoming>,
    /// The protocol's clock as of its last event.
    pub(crate) now_ns: u64,
}

/// raft's report of a transfer that ended, for `report_snapshot`.
pub(crate) type Report = (u64, SnapshotStatus);

impl Transfers {
    pub(crate) fn new(limits: Limits, check: Option<SnapshotCheck>) -> Self {
        Self { limits, check, out: BTreeMap::new(), inc: None, now_ns: 0 }
    }

    /// The transfers in progress.
    pub(crate) fn progress(&self) -> Vec<Progress> {
        let out = self.out.iter().map(|(&peer, o)| Progress {
            peer,
            sending: true,
            id: o.id,
            done: o.acked,
            started_ns: o.started_ns,
        });
        let inc = self.inc.iter().map(|i| Progress {
            peer: i.from,
            sending: false,
            id: i.assembly.id(),
            done: i.written,
            started_ns: i.started_ns,
        });
        out.chain(inc).collect()
    }

    // ----- the leader's side -----

    /// Raft wants `msg` (a `MsgSnapshot`) sent: starts its transfer. An
    /// error: it cannot start (raft is told it failed, and offers again
    /// later).
    pub(crate) fn offer(&mut self, msg: Message, store: &impl Store) -> Result<(), String> {
        let to = msg.to;
        let id = offered_id(&msg)?;
        if self.out.get(&to).is_some_and(|o| o.id == id) {
            return Ok(());
        }
        if !self.out.contains_key(&to) && self.out.len() >= self.limits.transfers_max {
            return Err(format!("{} snapshot transfers are running already", self.out.len()));
        }
        let file = store.open_snapshot(&id).map_err(|e| format!("cannot open {id}: {e}"))?;
        if file.len() != id.bytes {
            return Err(format!("the file of {id} holds {} bytes", file.len()));
        }
        info!(peer = to, %id, "sending a snapshot");
        let now = self.now_ns;
        let o = Outgoing {
            id,
            offer: msg,
            file,
            sent: 0,
            acked: 0,
            accepted: false,
            offered_ns: None,
            heard_ns: now,
            started_ns: now,
        };
        self.out.insert(to, o);
        Ok(())
    }

    /// Sends what is due: offers, and chunks within each window. Returns
    /// the transfers that ended (abandoned, or all of them once this
    /// replica no longer leads).
    pub(crate) fn pump_out(&mut self, leading: bool, link: &mut impl Link) -> Vec<Report> {
        if !leading {
            let peers: Vec<u64> = self.out.keys().copied().collect();
            self.out.clear();
            return peers.into_iter().map(|p| (p, SnapshotStatus::Failure)).collect();
        }
        let (now, limits) = (self.now_ns, self.limits);
        let mut ended = Vec::new();
        for (&to, o) in self.out.iter_mut() {
            if now.saturating_sub(o.heard_ns) > limits.stall_ns {
                info!(peer = to, id = %o.id, acked = o.acked, "abandoning a snapshot transfer: no answer");
                ended.push(to);
                continue;
            }
            let quiet = now.saturating_sub(o.heard_ns) >= RETRY_NS;
            if (!o.accepted || quiet) && o.offered_ns.map_or(true, |at| now.saturating_sub(at) >= RETRY_NS) {
                o.offered_ns = Some(now);
                link.send(to, SnapMsg::Offer(Box::new(o.offer.clone())));
            }
            if o.accepted {
                if let Err(e) = send_window(to, o, &limits, link) {
                    tracing::warn!(peer = to, id = %o.id, "cannot read the snapshot being sent: {e}");
                    ended.push(to);
                }
            }
        }
        for peer in &ended {
            self.out.remove(peer);
        }
        ended.into_iter().map(|p| (p, SnapshotStatus::Failure)).collect()
    }

    /// The follower's answer; a report if the transfer ended.
    pub(crate) fn on_ack(&mut self, from: u64, id: SnapshotId, next: u64, resume: bool) -> Option<Report> {
        let o = self.out.get_mut(&from).filter(|o| o.id == id)?;
        if next > id.bytes {
            return None;
        }
        o.heard_ns = self.now_ns;
        o.accepted = true;
        if next == id.bytes && !resume {
            info!(peer = from, %id, "snapshot sent");
            self.out.remove(&from);
            return Some((from, SnapshotStatus::Finish));
        }
        if resume {
            debug!(peer = from, %id, next, "resuming a snapshot transfer");
            o.sent = next;
            o.acked = next;
        } else {
            o.acked = o.acked.max(next);
            o.sent = o.sent.max(o.acked);
        }
        None
    }

    /// The follower refused the transfer.
    pub(crate) fn on_refuse(&mut self, from: u64, id: SnapshotId, why: &str) -> Option<Report> {
        self.out.get(&from).filter(|o| o.id == id)?;
        info!(peer = from, %id, "replica {from} refused the snapshot: {why}");
        self.out.remove(&from);
        Some((from, SnapshotStatus::Failure))
    }
}

/// Sends chunks while the window has room and the lane takes them.
fn send_window(to: u64, o: &mut Outgoing, limits: &Limits, link: &mut impl Link) -> std::io::Result<()> {
    let window = (limits.chunk as u64).saturating_mul(limits.window as u64);
    while o.sent < o.id.bytes && o.sent - o.acked < window {
        let len = (o.id.bytes - o.sent).min(limits.chunk as u64) as usize;
        let mut data = vec![0u8; len];
        let n = o.file.read_at(o.sent, &mut data)?;
        if n < len {
            return Err(std::io::Error::other(format!("the file ends at {}", o.sent + n as u64)));
        }
        if !link.send(to, SnapMsg::chunk(o.id, o.sent, data)) {
            break;
        }
        o.sent += len as u64;
    }
    Ok(())
}

impl Transfers {
    // ----- the follower's side -----

    /// An offer from the leader `from`, its raft message checked by the
    /// protocol: resumes the same file, or starts over.
    pub(crate) fn on_offer(&mut self, from: u64, msg: Message, store: &impl Store, link: &mut impl Link) {
        let id = match offered_id(&msg) {
            Ok(id) => id,
            // No id to refuse by: the leader gives up on its own.
            Err(why) => return link.refused(from, &format!("an offer: {why}")),
        };
        if let Some(inc) = self.inc.as_mut() {
            let current = inc.assembly.id();
            if current == id {
                (inc.from, inc.offer) = (from, msg);
                if inc.scan.is_none() {
                    link.send(from, SnapMsg::Ack { id, next: inc.written, resume: true });
                }
                return;
            }
            // Only a leader of a later term than this offer's may hold the
            // file: the latest leader's offer wins, or a transfer from a
            // leader that is gone would block this replica for ever (the
            // simulation found one, seed 16578).
            if inc.offer.term > msg.term {
                let why = format!("receiving {current} from the leader of term {}", inc.offer.term);
                link.send(from, SnapMsg::Refuse { id, why });
                return;
            }
        }
        let fresh = Incoming {
            from,
            offer: msg,
            assembly: Assembly::new(id),
            written: 0,
            synced: 0,
            scan: None,
            started_ns: self.now_ns,
        };
        if self.inc.is_none() && store.receiving().is_some_and(|(r, _)| r == id) {
            info!(peer = from, %id, "resuming a snapshot transfer from what this replica kept of it");
            self.inc = Some(Incoming { scan: Some(Scan::new(id)), ..fresh });
            return;
        }
        info!(peer = from, %id, "receiving a snapshot");
        self.inc = Some(fresh);
        self.start_over(store, link);
    }

    /// Drops what was received of the file and asks for it from the
    /// start; a store that cannot even do that refuses the transfer.
    fn start_over(&mut self, store: &impl Store, link: &mut impl Link) {
        let Some(inc) = self.inc.as_mut() else { return };
        let id = inc.assembly.id();
        (inc.assembly, inc.written, inc.synced, inc.scan) = (Assembly::new(id), 0, 0, None);
        match store.receive(&id, 0, &[]) {
            Ok(()) => {
                link.send(inc.from, SnapMsg::Ack { id, next: 0, resume: true });
            }
            Err(e) => self.give_up(&format!("cannot store it: {e}"), store, link),
        }
    }

    /// Refuses the transfer in progress and drops its file.
    fn give_up(&mut self, why: &str, store: &impl Store, link: &mut impl Link) {
        let Some(inc) = self.inc.take() else { return };
        let id = inc.assembly.id();
        tracing::warn!(peer = inc.from, %id, "giving up a snapshot transfer: {why}");
        let _ = store.receive(&id, 0, &[]);
        link.send(inc.from, SnapMsg::Refuse { id, why: why.into() });
    }

    /// Goes on checking what a restart left of the file; once done,
    /// resumes from its whole part. The offer to step if that is the
    /// whole file.
    pub(crate) fn pump_in(&mut self, store: &impl Store, link: &mut impl Link) -> Option<Message> {
        let inc = self.inc.as_mut()?;
        let scan = inc.scan.as_mut()?;
        let id = inc.assembly.id();
        let step = store.open_snapshot(&id).and_then(|file| scan.step(&*file, SCAN_BUDGET));
        let (valid, assembly) = match step {
            Ok(None) => return None,
            Ok(Some(done)) => done,
            Err(e) => {
                info!(%id, "the partial snapshot file cannot be read, starting over: {e}");
                self.start_over(store, link);
                return None;
            }
        };
        if let Err(e) = store.receive(&id, valid, &[]) {
            self.give_up(&format!("cannot store it: {e}"), store, link);
            return None;
        }
        info!(%id, valid, "resuming a snapshot transfer after what was kept of it");
        (inc.scan, inc.written, inc.synced, inc.assembly) = (None, valid, valid, assembly);
        if valid == id.bytes {
            return self.complete(store, link);
        }
        link.send(inc.from, SnapMsg::Ack { id, next: valid, resume: true });
        None
    }

    /// A chunk from `from`: written if it comes in its place; the offer
    /// to step once the file is whole and checked.
    pub(crate) fn on_chunk(
        &mut self,
        from: u64,
        (id, offset, crc): (SnapshotId, u64, u32),
        data: &[u8],
        store: &impl Store,
        link: &mut impl Link,
    ) -> Option<Message> {
        let Some(inc) = self.inc.as_mut().filter(|i| i.assembly.id() == id && i.from == from) else {
            link.refused(from, &format!("a chunk of {id}, which this replica is not receiving from replica {from}"));
            link.send(from, SnapMsg::Refuse { id, why: "not offered, or offered since by another".into() });
            return None;
        };
        if inc.scan.is_some() {
            return None;
        }
        if crc32fast::hash(data) != crc {
            link.refused(from, &format!("the chunk of {id} at offset {offset} is damaged (checksum mismatch)"));
            link.send(from, SnapMsg::Ack { id, next: inc.written, resume: true });
            return None;
        }
        let end = offset.saturating_add(data.len() as u64);
        if offset > inc.written || end <= inc.written {
            // A gap (a chunk lost or reordered): from what is held. A
            // repeat: nothing to do.
            if offset > inc.written {
                link.send(from, SnapMsg::Ack { id, next: inc.written, resume: true });
            }
            return None;
        }
        let data = &data[(inc.written - offset) as usize..];
        if let Err(why) = inc.assembly.update(data) {
            link.refused(from, &why);
            self.give_up(&why, store, link);
            return None;
        }
        self.write(data, store, link)
    }

    /// Writes the next bytes of the file; syncs every `sync_bytes` and at
    /// the end.
    fn write(&mut self, data: &[u8], store: &impl Store, link: &mut impl Link) -> Option<Message> {
        let sync_bytes = self.limits.sync_bytes;
        let inc = self.inc.as_mut()?;
        let id = inc.assembly.id();
        let mut stored = store.receive(&id, inc.written, data);
        inc.written += data.len() as u64;
        if stored.is_ok() && (inc.written - inc.synced >= sync_bytes || inc.written == id.bytes) {
            stored = store.sync_received();
            inc.synced = inc.written;
        }
        if let Err(e) = stored {
            self.give_up(&format!("cannot store it: {e}"), store, link);
            return None;
        }
        if inc.written == id.bytes {
            return self.complete(store, link);
        }
        link.send(inc.from, SnapMsg::Ack { id, next: inc.written, resume: false });
        None
    }

    /// The whole file arrived: checks it against the id offered; the
    /// offer to step if it passes, else the transfer starts over.
    fn complete(&mut self, store: &impl Store, link: &mut impl Link) -> Option<Message> {
        let inc = self.inc.as_ref()?;
        let id = inc.assembly.id();
        let checked = store.open_snapshot(&id).map_err(|e| e.to_string()).and_then(|file| {
            let mut end = [0u8; END_BYTES as usize];
            match file.read_at(id.bytes - END_BYTES, &mut end) {
                Ok(n) if n == end.len() => inc.assembly.check(&end),
                Ok(n) => Err(format!("the file ends {} bytes early", END_BYTES as usize - n)),
                Err(e) => Err(e.to_string()),
            }
        });
        if let Err(why) = checked {
            link.refused(inc.from, &format!("the snapshot received, {id}: {why}"));
            self.start_over(store, link);
            return None;
        }
        if let Err(why) = self.readable(&inc.offer, &id, store) {
            // Whole and intact, but not a state this replica can restore
            // (another service, a newer format): nothing is kept, and the
            // leader is told why; this replica runs on with its own state.
            let (from, why) = (inc.from, format!("the snapshot received, {id}, cannot be restored: {why}"));
            link.refused(from, &why);
            self.give_up(&why, store, link);
            return None;
        }
        let inc = self.inc.take()?;
        info!(peer = inc.from, %id, "snapshot received whole");
        link.send(inc.from, SnapMsg::Ack { id, next: id.bytes, resume: false });
        Some(inc.offer)
    }

    /// Whether the received file of `offer` opens as a snapshot (its
    /// membership and reply cache decode) and the service's check takes
    /// its stream.
    fn readable(&self, offer: &Message, id: &SnapshotId, store: &impl Store) -> Result<(), String> {
        let file = store.open_snapshot(id).map_err(|e| e.to_string())?;
        let mut opened = crate::state::open(offer.get_snapshot(), file)?;
        crate::membership::Membership::decode(&opened.members).map_err(|e| e.to_string())?;
        crate::cache::ReplyCache::decode(&opened.cache).map_err(|e| e.to_string())?;
        self.check.as_ref().map_or(Ok(()), |check| check(&mut opened.service))
    }

    /// Whether `msg` is an offer, from `from` and to `me`.
    pub(crate) fn is_offer_between(msg: &Message, from: u64, me: u64) -> bool {
        msg.get_msg_type() == MessageType::MsgSnapshot && msg.from == from && msg.to == me
    }
}
