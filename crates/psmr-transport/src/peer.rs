//! ReplicaIO (002 §V-B): blocking I/O, one sender thread per peer and, per
//! peer, one receiver thread for its current connection.
//!
//! The protocol thread never blocks on a peer: it puts raft messages on the
//! peer's bounded send queue and drops them when the queue is full or the
//! peer is unreachable (raft retransmits what matters). A sender connects,
//! authenticates (below), introduces itself with a `Hello` (its id,
//! incarnation and whether it was repaired), waits for the answer, then
//! streams frames through a 64 KiB buffer, so that a burst of messages
//! leaves in one TLS record (up to 16 KiB each) and one system call; on any
//! error it reconnects with backoff.
//!
//! # Who may speak raft here
//!
//! The peer port is reachable by every process on the network and on the
//! host (docs/design.md, "Trust"). With `[peer_tls]` ([`crate::tls`]) each
//! connection first runs a mutual TLS 1.3 handshake: the accepting replica
//! requires a certificate from the cluster CA, the connecting one checks
//! that the server is the replica it meant to reach, and the id claimed in
//! the `Hello` must be the one in the client's certificate. A connection
//! that fails any of this is closed before a byte of it reaches raft; a
//! forged `MsgAppend` needs a replica's private key. TLS also keeps the
//! raft traffic confidential and unaltered on the wire. It does not stop a
//! replica whose key was stolen, and it is no defence against floods,
//! which the limits below bound instead. With `insecure_peers` the same
//! protocol runs over plain TCP and anyone who reaches the port is
//! believed (closed networks and measurements only).
//!
//! # Limits: what any process can cost a replica
//!
//! * **Handshakes.** At most [`HANDSHAKES_MAX`] connections are between
//!   accept and a verified `Hello` at once, each for at most
//!   [`HANDSHAKE_TIMEOUT`] (TLS handshake, `Hello` and answer together);
//!   a connection beyond that is closed at once. A flood can delay a
//!   replica's *new* peer connections by that much, never break the
//!   established ones.
//! * **Receivers.** After authentication there is one receiver thread per
//!   peer id: a newer authenticated connection from the same peer replaces
//!   the older one (whose socket is shut down, which ends its thread). So
//!   peer threads are bounded by [`HANDSHAKES_MAX`] plus the peers,
//!   whatever connects.
//! * **Time.** An established connection must deliver a frame whole within
//!   `frame_timeout_ms` of its first byte (a frame that trickles in is cut
//!   off, however steady the trickle), and one silent for ten election
//!   timeouts (at least [`IDLE_MIN`]) is closed: a live leader or follower
//!   sends far more often. Two followers have nothing to say to each other
//!   while a leader lives, so their links close; a sender notices the
//!   close while it is quiet and connects again with its next message (a
//!   vote when an election needs the link), which the new connection
//!   carries.
//! * **Memory.** A frame's buffer grows as its bytes arrive, so a length
//!   announced and not sent costs nothing.
//! * **Logs.** Warnings about bad connections are rate-limited
//!   ([`psmr_model::ratelog`]).
//!
//! # Incarnations
//!
//! The incarnation enforces the crash-stop rule of in-memory storage: a
//! replica that lost its log must not come back under the same id, since
//! it could vote twice in a term. A replica draws its incarnation when it
//! starts in memory, or once when its data directory is created on disk
//! (so a disk replica that restarts keeps it, and one whose directory was
//! wiped gets a new one); a receiver remembers the first incarnation it
//! sees per peer and refuses any other, with a message that the refused
//! replica prints before it stops. The check runs only after the peer is
//! authenticated, so that nobody can claim a replica's id first and have
//! the real replica refused.
//!
//! # Repaired replicas
//!
//! A repair (`psmr_storage::DiskStore::repair`) keeps the incarnation but
//! empties the log: the replica no longer holds entries it acknowledged.
//! A leader that was already leading does not know that: its progress for
//! the replica keeps the old `matched` index: raft-rs sends heartbeats
//! committing up to it, which the guard (`psmr_core::guard`) drops (rule 10: a
//! heartbeat never commits beyond the receiver's log), and, while it
//! replicates, takes rejections at or below it for stale
//! (`Progress::maybe_decr_to`). So nothing the replica answers moves the
//! leader: its probe stays paused (only a heartbeat response resumes it),
//! and the replica would never catch up until the leader changes (a new
//! leader starts every progress from scratch). So the `Hello` also says
//! whether the sender is below the vote floor a repair left, that is,
//! repaired and not caught up: the receiver passes that on
//! ([`Inbound::PeerRepaired`]), and the protocol thread, if it leads,
//! resets its progress for the peer to nothing matched, so that it probes
//! the peer's real log (or sends a snapshot) as for a new follower. The
//! flag comes from the vote floor, which is persisted in the sync record
//! until the log reaches it, so a repaired replica that restarts before it
//! caught up says so again. It is believed only after authentication;
//! a false one costs a resend (from a snapshot, at worst), never safety:
//! `matched` only ever overstates what a follower holds, and a lower one
//! delays nothing already committed.

use crate::life::Life;
use crate::msg::Inbound;
use crate::queue::{Meter, Weigh};
use crate::tls::{PeerTlsContext, TlsError, TlsStream};
use crate::view::ClusterView;
use crossbeam::channel::TrySendError;
use parking_lot::Mutex;
use psmr_core::transfer::SnapMsg;
use psmr_core::Config;
use psmr_model::ratelog::RateLimit;
use psmr_model::wire::{frame_bytes, frame_len, parse_frame, read_frame, Decoder, Encoder, Frame, WireError};
use raft::prelude::Message;
use std::collections::HashMap;
use std::io::{self, BufWriter, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use thiserror::Error;
use tracing::{debug, info};

const K_HELLO: u8 = 64;
const K_ACK: u8 = 65;
const K_REFUSED: u8 = 66;
/// The peer applied this replica's removal from the cluster.
const K_REMOVED: u8 = 68;
const K_RAFT: u8 = 67;
const K_SNAP: u8 = 69;

/// The lane of a connection, named in its `Hello`: raft's messages, or
/// the chunks of snapshot transfers, which never hold up appends and
/// heartbeats behind them (`psmr_core::transfer`).
const LANE_RAFT: u8 = 0;
/// See [`LANE_RAFT`].
const LANE_SNAPSHOT: u8 = 1;

/// Most peer connections between accept and a verified `Hello` at once.
/// Each holds a thread for at most [`HANDSHAKE_TIMEOUT`]; 16 is far more
/// than the handful of replicas that reconnect at once after a restart.
pub const HANDSHAKES_MAX: usize = 16;

/// Longest time from accepting (or connecting) to a verified `Hello` and
/// its answer. A constant rather than `frame_timeout_ms`: a TLS handshake
/// is three round trips and two signatures, milliseconds even on a busy
/// host, and a hostile connection must give its slot back soon whatever
/// the configuration says about large frames.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(2);

/// Shortest time an established peer connection may stay silent before it
/// is closed (see [`idle_timeout`]).
pub const IDLE_MIN: Duration = Duration::from_secs(5);

/// The sender's buffer: a burst of raft messages up to this size leaves in
/// one write.
const SEND_BUFFER: usize = 64 << 10;

/// Longest `Hello` or answer.
const HELLO_MAX: usize = 1 << 16;

/// Warnings about connections that fail authentication or break the
/// protocol.
static BAD_PEER: RateLimit = RateLimit::new(10, Duration::from_secs(10));
/// Warnings about connections closed because every handshake slot is taken.
static BUSY: RateLimit = RateLimit::new(1, Duration::from_secs(10));
/// Warnings about failing accepts (out of file descriptors, say).
static ACCEPT: RateLimit = RateLimit::new(1, Duration::from_secs(10));
/// Warnings of senders that cannot authenticate a peer.
static SEND_AUTH: RateLimit = RateLimit::new(3, Duration::from_secs(10));

/// How long an established peer connection may stay silent: ten election
/// timeouts, at least [`IDLE_MIN`]. A leader sends heartbeats every
/// `heartbeat_ticks` and followers answer them, so only a dead or hung
/// peer (or a connection nobody uses) stays silent that long.
pub fn idle_timeout(config: &Config) -> Duration {
    let election = config.tick_ms.saturating_mul(config.election_ticks as u64);
    Duration::from_millis(election.saturating_mul(10)).max(IDLE_MIN)
}

/// Why a peer connection ended.
#[derive(Debug, Error)]
enum PeerError {
    #[error(transparent)]
    Wire(#[from] WireError),
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error("silent for {0:?}")]
    Idle(Duration),
    #[error("a frame took longer than {0:?} to arrive")]
    SlowFrame(Duration),
    #[error("refused: {0}")]
    Refused(String),
}

impl From<io::Error> for PeerError {
    fn from(e: io::Error) -> Self {
        PeerError::Wire(WireError::Io(e))
    }
}

impl PeerError {
    /// The peer went away between frames: not worth a warning.
    fn is_close(&self) -> bool {
        match self {
            PeerError::Wire(WireError::Closed) => true,
            // A TLS peer that exits without a close_notify.
            PeerError::Wire(WireError::Io(e)) => {
                matches!(e.kind(), io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset)
            }
            _ => false,
        }
    }
}

/// The `Hello`: this replica's id, its incarnation, whether it was
/// repaired and has not caught up yet (its log is below its vote floor;
/// see "Repaired replicas" above), where it listens, and the lane of the
/// connection.
fn hello(from: u64, incarnation: u64, repaired: bool, peer_addr: SocketAddr, lane: u8) -> Vec<u8> {
    let mut e = Encoder::new();
    e.u64(from).u64(incarnation).u8(u8::from(repaired)).str(&peer_addr.to_string()).u8(lane);
    frame_bytes(K_HELLO, &e.finish())
}

/// What a lane carries.
trait Outbound: Send + 'static {
    /// The lane.
    const LANE: u8;
    /// The message as a frame.
    fn frame(&self) -> Vec<u8>;
}

impl Outbound for Message {
    const LANE: u8 = LANE_RAFT;
    fn frame(&self) -> Vec<u8> {
        use protobuf::Message as _;
        frame_bytes(K_RAFT, &self.write_to_bytes().expect("raft messages always encode"))
    }
}

impl Outbound for SnapMsg {
    const LANE: u8 = LANE_SNAPSHOT;
    fn frame(&self) -> Vec<u8> {
        frame_bytes(K_SNAP, &self.encode())
    }
}

/// Decodes the body of a peer's raft frame: hostile bytes, refused with
/// an error (never a panic, nor an allocation beyond what the bytes
/// warrant).
pub fn decode_raft(body: Vec<u8>) -> Result<Message, WireError> {
    let body = bytes::Bytes::from(body);
    psmr_core::decode_proto(&body).map_err(|e| WireError::Malformed { what: "raft message", why: e.to_string() })
}

/// A TCP socket whose reads fail with `TimedOut` once its deadline has
/// passed, however the bytes trickle in (a plain read timeout restarts
/// with every byte).
struct Sock {
    tcp: TcpStream,
    deadline: Option<Instant>,
    /// The read timeout last given to the socket.
    applied: Option<Duration>,
}

impl Sock {
    fn new(tcp: TcpStream, deadline: Option<Instant>) -> Self {
        Self { tcp, deadline, applied: None }
    }
}

impl Read for Sock {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let Some(deadline) = self.deadline else {
            if self.applied.take().is_some() {
                self.tcp.set_read_timeout(None)?;
            }
            return self.tcp.read(buf);
        };
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::ErrorKind::TimedOut.into());
            }
            // Setting the timeout is a system call; one up to an eighth
            // longer than what is left is kept, so that reads of a steady
            // stream cost no extra call and a deadline is late by at most
            // an eighth.
            if self.applied.map_or(true, |a| a > left + left / 8) {
                self.tcp.set_read_timeout(Some(left))?;
                self.applied = Some(left);
            }
            match self.tcp.read(buf) {
                // The timeout in force was shorter than what is left now
                // (the deadline moved later): wait again with the right one.
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                    self.applied = None;
                }
                other => return other,
            }
        }
    }
}

impl Write for Sock {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.tcp.write(buf)
    }

    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        self.tcp.write_vectored(bufs)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.tcp.flush()
    }
}

/// A peer connection, authenticated with TLS or plain TCP.
enum PeerStream {
    Plain(Sock),
    Tls(Box<TlsStream<Sock>>),
}

impl PeerStream {
    fn sock(&mut self) -> &mut Sock {
        match self {
            PeerStream::Plain(s) => s,
            PeerStream::Tls(t) => t.get_mut(),
        }
    }

    fn set_deadline(&mut self, deadline: Option<Instant>) {
        self.sock().deadline = deadline;
    }
}

impl Read for PeerStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            PeerStream::Plain(s) => s.read(buf),
            PeerStream::Tls(t) => t.read(buf),
        }
    }
}

impl Write for PeerStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            PeerStream::Plain(s) => s.write(buf),
            PeerStream::Tls(t) => t.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            PeerStream::Plain(s) => s.flush(),
            PeerStream::Tls(t) => t.flush(),
        }
    }
}

/// Reads one frame of an established connection: the frame must start
/// within `idle` and arrive whole within `whole` of its first byte.
fn read_frame_timed(s: &mut PeerStream, max: usize, idle: Duration, whole: Duration) -> Result<Frame, PeerError> {
    s.set_deadline(Some(Instant::now() + idle));
    let mut header = [0u8; 4];
    let got = loop {
        match s.read(&mut header) {
            Ok(0) => return Err(WireError::Closed.into()),
            Ok(n) => break n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::TimedOut => return Err(PeerError::Idle(idle)),
            Err(e) => return Err(e.into()),
        }
    };
    s.set_deadline(Some(Instant::now() + whole));
    let slow = |e: io::Error| match e.kind() {
        io::ErrorKind::TimedOut => PeerError::SlowFrame(whole),
        _ => e.into(),
    };
    s.read_exact(&mut header[got..]).map_err(slow)?;
    let len = frame_len(header, max)?;
    let mut body = Vec::with_capacity(len.min(SEND_BUFFER));
    let n = (&mut *s).take(len as u64).read_to_end(&mut body).map_err(slow)?;
    if n < len {
        return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into());
    }
    Ok(parse_frame(body)?)
}

/// What the peer links of one replica share.
pub struct Peers {
    /// This replica's id.
    pub id: u64,
    /// Its incarnation (see "Incarnations" above).
    pub incarnation: u64,
    /// Its configuration: its peer address, the frame and queue limits.
    pub config: Arc<Config>,
    /// Its life: links end when it stops, and a refusal by a peer stops it.
    pub life: Arc<Life>,
    /// What it knows of the cluster: who was removed, who is a member,
    /// whether it was repaired.
    pub view: Arc<ClusterView>,
    /// Raft messages received from peers.
    pub received: AtomicU64,
    /// The incarnation seen per peer.
    incarnations: Mutex<HashMap<u64, u64>>,
}

impl Peers {
    /// The links of replica `id`, of incarnation `incarnation`.
    pub fn new(id: u64, incarnation: u64, config: Arc<Config>, life: Arc<Life>, view: Arc<ClusterView>) -> Self {
        Self { id, incarnation, config, life, view, received: AtomicU64::new(0), incarnations: Mutex::default() }
    }

    /// Why peer `peer` (authenticated) of incarnation `incarnation` may not
    /// connect, if it may not: a removed replica, or one that lost its
    /// state and came back under the same id.
    fn refusal(&self, peer: u64, incarnation: u64) -> Option<(u8, String)> {
        // Any replica the cluster's CA certified may connect, but a removed
        // one: a replica that lags must hear from members added after the
        // changes it has seen.
        if self.view.is_removed(peer) {
            return Some((K_REMOVED, format!("replica {peer} was removed from the cluster")));
        }
        if peer == self.id || peer == 0 {
            return Some((K_REFUSED, format!("id {peer} is not another replica's")));
        }
        let mut known = self.incarnations.lock();
        match known.get(&peer) {
            Some(&seen) if seen != incarnation => Some((
                K_REFUSED,
                format!(
                    "replica {peer} ran here before and lost its state (in-memory storage or a wiped data \
                     directory); it must not rejoin under the same id: Raft could lose acknowledged commands"
                ),
            )),
            _ => {
                known.insert(peer, incarnation);
                None
            }
        }
    }
}

/// The send side of one peer: a queue per lane, bounded in items and in
/// bytes (`queue_depth`, `queue_bytes_max`), each drained by its thread
/// over a connection of its own.
pub struct PeerSender {
    queue: crate::queue::Sender<Message>,
    snapshots: crate::queue::Sender<SnapMsg>,
}

impl PeerSender {
    /// Queues a raft message; drops it if the queue is full.
    pub fn send(&self, msg: Message) -> bool {
        match self.queue.try_send(msg) {
            Ok(()) => true,
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => false,
        }
    }

    /// Queues a message of a snapshot transfer on its lane; false if the
    /// lane is full (a window of chunks is on its way).
    pub fn send_snapshot(&self, msg: SnapMsg) -> bool {
        match self.snapshots.try_send(msg) {
            Ok(()) => true,
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => false,
        }
    }
}

/// Starts the sender threads for peer `to` at `addr`, one per lane; with
/// `tls`, they authenticate both ends before they send anything. The
/// snapshot lane holds a window of chunks and a few more messages: its
/// bytes are bounded by `snapshot_window_chunks` chunks.
pub fn spawn_sender(
    peers: &Arc<Peers>,
    to: u64,
    addr: SocketAddr,
    tls: Option<Arc<PeerTlsContext>>,
) -> io::Result<PeerSender> {
    let queue = spawn_lane::<Message>(peers, to, addr, tls.clone(), peers.config.queue_depth)?;
    let snapshots = spawn_lane::<SnapMsg>(peers, to, addr, tls, peers.config.snapshot_window_chunks + 4)?;
    Ok(PeerSender { queue, snapshots })
}

fn spawn_lane<T: Outbound + Weigh>(
    peers: &Arc<Peers>,
    to: u64,
    addr: SocketAddr,
    tls: Option<Arc<PeerTlsContext>>,
    depth: usize,
) -> io::Result<crate::queue::Sender<T>> {
    let (tx, rx) = crate::queue::bounded(depth, peers.config.queue_bytes_max, Meter::default());
    let peers = peers.clone();
    let name = match T::LANE {
        LANE_RAFT => format!("psmr-peer-snd-{to}"),
        _ => format!("psmr-peer-snap-{to}"),
    };
    std::thread::Builder::new().name(name).spawn(move || sender(&peers, to, addr, tls.as_deref(), &rx))?;
    Ok(tx)
}

fn sender<T: Outbound + Weigh>(
    peers: &Peers,
    to: u64,
    addr: SocketAddr,
    tls: Option<&PeerTlsContext>,
    rx: &crate::queue::Receiver<T>,
) {
    let mut backoff = Duration::from_millis(20);
    while !peers.life.stopping() {
        // Connected when there is something to send: a link that stays
        // quiet (between two followers) is closed by its receiver, and
        // reopened by the next message, which the new connection carries.
        // A repaired replica that has not caught up connects at once: its
        // `Hello` is what tells a leader to forget what it acknowledged
        // before, and it may have nothing else to say (it drops the
        // heartbeats that commit beyond its empty log).
        let first = if T::LANE == LANE_RAFT && peers.view.repaired() {
            None
        } else {
            match rx.recv_timeout(Duration::from_millis(100)) {
                Ok(m) => Some(m),
                Err(crossbeam::channel::RecvTimeoutError::Timeout) => continue,
                Err(_) => return,
            }
        };
        let stream = match connect(peers, to, addr, tls, T::LANE) {
            Ok(s) => s,
            Err(e) => {
                unreachable_peer(to, addr, &e);
                // Messages for an unreachable peer are stale by the time it
                // is back; raft sends fresh ones. No sender left: the peer
                // was removed.
                loop {
                    match rx.try_recv() {
                        Ok(_) => {}
                        Err(crossbeam::channel::TryRecvError::Empty) => break,
                        Err(crossbeam::channel::TryRecvError::Disconnected) => return,
                    }
                }
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_millis(500));
                continue;
            }
        };
        backoff = Duration::from_millis(20);
        if !send_on(peers, to, stream, first, rx) {
            return;
        }
    }
}

fn unreachable_peer(to: u64, addr: SocketAddr, e: &PeerError) {
    match e {
        // The peer is up and something is wrong with who it is or who we
        // are: worth telling, within limits.
        PeerError::Tls(TlsError::Handshake(e)) if e.kind() == io::ErrorKind::InvalidData => {
            psmr_model::warn_limited!(SEND_AUTH, peer = to, %addr, "cannot authenticate: {e}")
        }
        // Down, restarting, or too busy to take a handshake.
        e => debug!(peer = to, "cannot reach peer: {e}"),
    }
}

/// Writes `first` (if any) and what follows over `stream` until the
/// connection fails or its receiver closes it; false once the queue has
/// no sender left (the peer was removed) or the replica stops.
fn send_on<T: Outbound + Weigh>(
    peers: &Peers,
    to: u64,
    stream: PeerStream,
    first: Option<T>,
    rx: &crate::queue::Receiver<T>,
) -> bool {
    let mut w = BufWriter::with_capacity(SEND_BUFFER, stream);
    let mut next = first;
    loop {
        let msg = match next.take().map_or_else(|| rx.recv_timeout(Duration::from_millis(100)), Ok) {
            Ok(m) => m,
            Err(crossbeam::channel::RecvTimeoutError::Timeout) if !peers.life.stopping() => {
                // Quiet: a receiver that closed the link for its silence
                // is noticed now, not by the next message, which would be
                // lost on the dead connection (a vote, when an election
                // needs this link after a leader's end).
                if closed_by_peer(w.get_mut().sock()) {
                    debug!(peer = to, "the peer closed the quiet link");
                    drop(w.into_parts());
                    return true;
                }
                continue;
            }
            Err(_) => return false,
        };
        let mut result = w.write_all(&msg.frame());
        // Write whatever else is queued before flushing: one record
        // and one system call for a burst of messages.
        while result.is_ok() {
            match rx.try_recv() {
                Ok(m) => result = w.write_all(&m.frame()),
                Err(_) => break,
            }
        }
        if let Err(e) = result.and_then(|_| w.flush()) {
            debug!(peer = to, "connection to peer lost: {e}");
            // Dropped without the flush a `BufWriter` tries on drop:
            // it would wait on the dead connection once more.
            drop(w.into_parts());
            return true;
        }
    }
}

/// Whether the receiving end closed `sock`'s connection. The sender
/// never reads its connection: whatever the receiver sent after the
/// handshake (a TLS session ticket) is read here and dropped, and an end
/// of stream or an error means the link is gone.
fn closed_by_peer(sock: &mut Sock) -> bool {
    if sock.tcp.set_nonblocking(true).is_err() {
        return true;
    }
    let mut scratch = [0u8; 512];
    let closed = loop {
        match (&sock.tcp).read(&mut scratch) {
            Ok(0) => break true,
            Ok(_) => continue,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break false,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break true,
        }
    };
    closed || sock.tcp.set_nonblocking(false).is_err()
}

/// Connects to `addr` from address `from` (any port), as a replica on a
/// host of its own does: its peers, their firewalls and a fault injector
/// see its connections come from the address it listens on. From the
/// unspecified address, or to an address of the other family, the kernel
/// picks the source.
fn dial(addr: SocketAddr, from: IpAddr, timeout: Duration) -> io::Result<TcpStream> {
    if from.is_unspecified() || from.is_ipv4() != addr.is_ipv4() {
        return TcpStream::connect_timeout(&addr, timeout);
    }
    let socket = socket2::Socket::new(socket2::Domain::for_address(addr), socket2::Type::STREAM, None)?;
    socket.bind(&SocketAddr::new(from, 0).into())?;
    socket.connect_timeout(&addr.into(), timeout)?;
    Ok(socket.into())
}

/// Connects to a peer, authenticates both ends (with TLS) and introduces
/// this replica.
fn connect(
    peers: &Peers,
    to: u64,
    addr: SocketAddr,
    tls: Option<&PeerTlsContext>,
    lane: u8,
) -> Result<PeerStream, PeerError> {
    let me = peers.config.member(peers.id).map_err(|e| io::Error::other(e.to_string()))?.peer;
    let tcp = dial(addr, me.ip(), Duration::from_millis(500))?;
    tcp.set_nodelay(true)?;
    tcp.set_write_timeout(Some(HANDSHAKE_TIMEOUT))?;
    let sock = Sock::new(tcp, Some(Instant::now() + HANDSHAKE_TIMEOUT));
    let mut stream = match tls {
        Some(tls) => PeerStream::Tls(Box::new(tls.connect(to, sock)?)),
        None => PeerStream::Plain(sock),
    };
    stream.write_all(&hello(peers.id, peers.incarnation, peers.view.repaired(), me, lane))?;
    stream.flush()?;
    let answer = read_frame(&mut stream, HELLO_MAX).map_err(|e| match e {
        // The server refused our certificate: its alert arrives here.
        WireError::Io(e) if e.kind() == io::ErrorKind::InvalidData && tls.is_some() => {
            PeerError::Tls(TlsError::Handshake(e))
        }
        e => e.into(),
    })?;
    match answer.kind {
        K_ACK => {
            // The sender never reads again; a peer that takes no bytes for
            // as long as a connection may stay silent is gone.
            stream.set_deadline(None);
            stream.sock().tcp.set_write_timeout(Some(idle_timeout(&peers.config)))?;
            Ok(stream)
        }
        K_REFUSED | K_REMOVED => {
            let why = Decoder::new(&answer.body, "refusal").str().unwrap_or_else(|e| e.to_string());
            match answer.kind {
                K_REFUSED => peers.life.fail(format!("replica {to} refused this replica: {why}")),
                _ => peers.life.stop_removed(&format!("replica {to} says {why}")),
            }
            Err(PeerError::Refused(why))
        }
        k => Err(WireError::UnknownKind(k).into()),
    }
}

/// Peer connections accepted by one replica: the handshakes in progress
/// and the receiver of each authenticated peer.
#[derive(Default)]
struct Pool {
    handshakes: AtomicUsize,
    /// Per peer id and lane: the current receiver's number and a handle
    /// on its socket, to shut it down when a newer connection replaces it.
    receivers: Mutex<HashMap<Link, (u64, TcpStream)>>,
    /// Per peer id and lane, the number of its current receiver, under a
    /// lock of its own that a receiver holds while it passes a message on
    /// (see [`Registration::pass`]).
    gates: Mutex<HashMap<Link, Arc<Mutex<u64>>>>,
    next: AtomicU64,
}

/// A handshake slot, given back when dropped.
struct Slot(Arc<Pool>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.handshakes.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A peer and a lane.
type Link = (u64, u8);

/// A peer's current receiver on one lane, unregistered when dropped.
struct Registration {
    pool: Arc<Pool>,
    link: Link,
    number: u64,
    gate: Arc<Mutex<u64>>,
}

impl Registration {
    /// Passes `msg` on to the protocol thread, unless a newer connection of
    /// the same peer replaced this one: what the old connection still held
    /// (messages of a process that crashed and came back, maybe repaired)
    /// must not reach raft after what the new one said in its handshake.
    /// The gate makes the check and the send one step with respect to a
    /// new registration. `Ok(false)`: replaced; an error: the protocol
    /// thread is gone.
    fn pass(&self, inbound: &crate::queue::Sender<Inbound>, msg: Inbound) -> Result<bool, ()> {
        let gate = self.gate.lock();
        if *gate != self.number {
            return Ok(false);
        }
        inbound.send(msg).map(|()| true).map_err(|_| ())
    }

    /// False once a newer connection of the same peer replaced this one.
    fn current(&self) -> bool {
        self.pool.receivers.lock().get(&self.link).is_some_and(|(n, _)| *n == self.number)
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut receivers = self.pool.receivers.lock();
        if receivers.get(&self.link).is_some_and(|(n, _)| *n == self.number) {
            receivers.remove(&self.link);
        }
    }
}

impl Pool {
    fn try_handshake(self: &Arc<Self>) -> Option<Slot> {
        let taken = self.handshakes.fetch_add(1, Ordering::AcqRel);
        // Built first, so that giving the slot back is the guard's job.
        let slot = Slot(self.clone());
        (taken < HANDSHAKES_MAX).then_some(slot)
    }

    /// Makes `socket` the receiver of `link`, shutting down the one before.
    fn register(self: &Arc<Self>, link: Link, socket: TcpStream) -> Registration {
        let number = self.next.fetch_add(1, Ordering::Relaxed);
        let gate = self.gates.lock().entry(link).or_default().clone();
        *gate.lock() = number;
        if let Some((_, old)) = self.receivers.lock().insert(link, (number, socket)) {
            let _ = old.shutdown(Shutdown::Both);
        }
        Registration { pool: self.clone(), link, number, gate }
    }

    fn close_all(&self) {
        for (_, (_, s)) in self.receivers.lock().drain() {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

/// Accepts peer connections until the replica stops; with `tls`, only
/// authenticated replicas get past the handshake.
pub fn spawn_listener(
    peers: &Arc<Peers>,
    listener: TcpListener,
    tls: Option<Arc<PeerTlsContext>>,
    inbound: crate::queue::Sender<Inbound>,
) -> io::Result<std::thread::JoinHandle<()>> {
    let peers = peers.clone();
    listener.set_nonblocking(true)?;
    // The handle is joined when the replica stops: until this thread ends,
    // the listener holds the peer port, and a replica restarted on the same
    // configuration could not bind it.
    std::thread::Builder::new().name("psmr-peer-accept".into()).spawn(move || {
        let pool = Arc::new(Pool::default());
        while !peers.life.stopping() {
            match listener.accept() {
                Ok((stream, from)) => {
                    let Some(slot) = pool.try_handshake() else {
                        psmr_model::warn_limited!(
                            BUSY,
                            %from,
                            "peer port busy ({HANDSHAKES_MAX} handshakes in progress): closing a new connection"
                        );
                        continue;
                    };
                    let (peers, pool, tls, inbound) = (peers.clone(), pool.clone(), tls.clone(), inbound.clone());
                    let spawned = std::thread::Builder::new()
                        .name("psmr-peer-rcv".into())
                        .spawn(move || receiver(&peers, &pool, slot, stream, from, tls.as_deref(), &inbound));
                    if let Err(e) = spawned {
                        psmr_model::warn_limited!(ACCEPT, "cannot start a peer receiver: {e}");
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => {
                    psmr_model::warn_limited!(ACCEPT, "peer accept failed: {e}");
                    // Out of descriptors, say: give connections time to end.
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }
        pool.close_all();
    })
}

fn receiver(
    peers: &Peers,
    pool: &Arc<Pool>,
    slot: Slot,
    stream: TcpStream,
    from: SocketAddr,
    tls: Option<&PeerTlsContext>,
    inbound: &crate::queue::Sender<Inbound>,
) {
    let mut registration = None;
    let result = receive(peers, pool, slot, stream, tls, inbound, &mut registration);
    let replaced = registration.as_ref().is_some_and(|r| !r.current());
    let snapshots = registration.as_ref().is_some_and(|r| r.link.1 == LANE_SNAPSHOT);
    match result {
        Ok(()) => {}
        Err(_) if replaced || peers.life.stopping() => debug!(%from, "peer connection replaced or closed"),
        Err(e) if e.is_close() => debug!(%from, "peer connection closed"),
        // The snapshot lane is silent between transfers.
        Err(e @ PeerError::Idle(_)) if snapshots => debug!(%from, "closing a snapshot lane: {e}"),
        // Only an authenticated peer gets this far: no flood to fear.
        Err(e @ PeerError::Idle(_)) => info!(%from, "closing peer connection: {e}"),
        Err(e) => psmr_model::warn_limited!(BAD_PEER, %from, "closing peer connection: {e}"),
    }
}

/// What a peer says of itself in its `Hello`.
struct Hello {
    peer: u64,
    incarnation: u64,
    /// Repaired and not caught up yet (see "Repaired replicas" above).
    repaired: bool,
    /// Where it listens, if it says.
    listens: Option<SocketAddr>,
    /// The connection's lane (raft's, from a replica built before lanes).
    lane: u8,
}

/// Reads a `Hello` (hostile bytes: refused with an error).
fn read_hello(stream: &mut PeerStream) -> Result<Hello, PeerError> {
    let first = read_frame(stream, HELLO_MAX)?;
    if first.kind != K_HELLO {
        return Err(WireError::Malformed { what: "peer hello", why: format!("got kind {} first", first.kind) }.into());
    }
    let mut d = Decoder::new(&first.body, "peer hello");
    let (peer, incarnation) = (d.u64()?, d.u64()?);
    // Absent in the `Hello` of a replica built before the flag existed: it
    // was never repaired by this protocol's rules, or cannot say so (it
    // then catches up once the leader changes, as before).
    let repaired = match if d.end().is_ok() { 0 } else { d.u8()? } {
        0 => false,
        1 => true,
        other => {
            return Err(WireError::Malformed { what: "peer hello", why: format!("repaired flag {other}") }.into());
        }
    };
    // Where the peer listens (absent from older replicas' hellos): a
    // replica that does not know it yet, because it has not seen the
    // entry that added it, answers it there.
    let listens = if d.end().is_ok() { None } else { Some(d.str()?) };
    let lane = if d.end().is_ok() { LANE_RAFT } else { d.u8()? };
    d.end()?;
    if lane > LANE_SNAPSHOT {
        return Err(WireError::Malformed { what: "peer hello", why: format!("lane {lane}") }.into());
    }
    let listens = listens
        .map(|a| a.parse::<SocketAddr>())
        .transpose()
        .map_err(|_| WireError::Malformed { what: "peer hello", why: "a peer address that is not host:port".into() })?;
    Ok(Hello { peer, incarnation, repaired, listens, lane })
}

/// Authenticates an accepted connection and reads its `Hello`; answers it
/// (a refusal ends the connection).
fn handshake(peers: &Peers, tcp: TcpStream, tls: Option<&PeerTlsContext>) -> Result<(PeerStream, Hello), PeerError> {
    tcp.set_nonblocking(false)?;
    tcp.set_nodelay(true)?;
    tcp.set_write_timeout(Some(HANDSHAKE_TIMEOUT))?;
    let sock = Sock::new(tcp, Some(Instant::now() + HANDSHAKE_TIMEOUT));
    let mut stream = match tls {
        Some(tls) => PeerStream::Tls(Box::new(tls.accept(sock)?)),
        None => PeerStream::Plain(sock),
    };
    let hello = read_hello(&mut stream)?;
    // Who the peer is, before anything it claims is believed.
    if let PeerStream::Tls(t) = &stream {
        t.verify_peer_is(hello.peer)?;
    }
    if let Some((kind, why)) = peers.refusal(hello.peer, hello.incarnation) {
        let mut e = Encoder::new();
        e.str(&why);
        let _ = stream.write_all(&frame_bytes(kind, &e.finish())).and_then(|()| stream.flush());
        return Err(PeerError::Refused(why));
    }
    stream.write_all(&frame_bytes(K_ACK, &[]))?;
    stream.flush()?;
    Ok((stream, hello))
}

fn receive(
    peers: &Peers,
    pool: &Arc<Pool>,
    slot: Slot,
    tcp: TcpStream,
    tls: Option<&PeerTlsContext>,
    inbound: &crate::queue::Sender<Inbound>,
    registration: &mut Option<Registration>,
) -> Result<(), PeerError> {
    let control = tcp.try_clone()?;
    let (mut stream, hello) = handshake(peers, tcp, tls)?;
    let (peer, lane) = (hello.peer, hello.lane);
    let current = registration.insert(pool.register((peer, lane), control));
    // From here on this thread is `peer`'s receiver, not a handshake.
    drop(slot);
    if lane == LANE_SNAPSHOT {
        debug!(peer, "snapshot lane connected");
        return relay(peers, (peer, lane), &mut stream, current, inbound);
    }
    info!(peer, repaired = hello.repaired, "peer connected");
    // Before any raft message of this connection: the protocol thread
    // forgets what the peer acknowledged before it was repaired.
    if hello.repaired && current.pass(inbound, Inbound::PeerRepaired { peer }) != Ok(true) {
        return Ok(());
    }
    if let Some(addr) = hello.listens.filter(|_| peers.view.member(peer).is_none()) {
        if current.pass(inbound, Inbound::PeerListens { peer, addr }) != Ok(true) {
            return Ok(());
        }
    }
    relay(peers, (peer, lane), &mut stream, current, inbound)
}

/// Passes the messages of an established connection from `peer` on to
/// the protocol thread, until the connection ends, the peer is removed or
/// a newer connection replaces this one: raft's, or on the snapshot lane
/// those of snapshot transfers (the protocol checks what they say).
fn relay(
    peers: &Peers,
    (peer, lane): Link,
    stream: &mut PeerStream,
    current: &Registration,
    inbound: &crate::queue::Sender<Inbound>,
) -> Result<(), PeerError> {
    let config = &peers.config;
    let (idle, whole) = (idle_timeout(config), Duration::from_millis(config.frame_timeout_ms));
    let mut epoch = peers.view.epoch();
    loop {
        let frame = read_frame_timed(stream, config.peer_frame_max, idle, whole)?;
        // A removed peer's link closes; its next handshake tells it why.
        if peers.view.epoch() != epoch {
            epoch = peers.view.epoch();
            if peers.view.is_removed(peer) {
                info!(peer, "closing the link of a replica that is no longer a member");
                return Ok(());
            }
        }
        let msg = match lane {
            LANE_SNAPSHOT => snapshot_msg(peer, frame)?,
            _ => raft_msg(peers, peer, frame)?,
        };
        if current.pass(inbound, msg) != Ok(true) {
            return Ok(());
        }
    }
}

/// A raft message from `peer`, checked to be from and to the link's ends.
fn raft_msg(peers: &Peers, peer: u64, frame: Frame) -> Result<Inbound, PeerError> {
    if frame.kind != K_RAFT {
        return Err(WireError::UnknownKind(frame.kind).into());
    }
    let msg = decode_raft(frame.body)?;
    if msg.from != peer || msg.to != peers.id {
        return Err(WireError::Malformed {
            what: "raft message",
            why: format!("from {} to {} on the link from {peer} to {}", msg.from, msg.to, peers.id),
        }
        .into());
    }
    peers.received.fetch_add(1, Ordering::Relaxed);
    Ok(Inbound::Raft(Box::new(msg)))
}

/// A message of a snapshot transfer from `peer`.
fn snapshot_msg(peer: u64, frame: Frame) -> Result<Inbound, PeerError> {
    if frame.kind != K_SNAP {
        return Err(WireError::UnknownKind(frame.kind).into());
    }
    Ok(Inbound::Snap { peer, msg: Box::new(SnapMsg::decode(&frame.body)?) })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> (TcpStream, PeerStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        (a, PeerStream::Plain(Sock::new(b, None)))
    }

    #[test]
    fn a_sender_notices_that_its_receiver_closed_the_link() {
        let (mut receiver, mut sender) = pair();
        assert!(!closed_by_peer(sender.sock()), "open and quiet");
        // What the receiver sends after the handshake is read and dropped.
        receiver.write_all(b"ticket").unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while sender.sock().tcp.peek(&mut [0u8; 1]).is_err() {
            assert!(Instant::now() < deadline, "the bytes never arrived");
        }
        assert!(!closed_by_peer(sender.sock()), "bytes from the receiver are not a close");
        sender.sock().tcp.write_all(b"still blocking").unwrap();
        drop(receiver);
        // The close takes a moment to arrive: polled, within a bound.
        while !closed_by_peer(sender.sock()) {
            assert!(Instant::now() < deadline, "the close was never noticed");
            std::thread::yield_now();
        }
    }

    #[test]
    fn a_peer_connection_leaves_from_the_replica_s_own_address() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let to = l.local_addr().unwrap();
        let own: IpAddr = "127.0.0.12".parse().unwrap();
        let _a = dial(to, own, Duration::from_secs(5)).unwrap();
        assert_eq!(l.accept().unwrap().1.ip(), own);
        let unspecified: IpAddr = "0.0.0.0".parse().unwrap();
        let _b = dial(to, unspecified, Duration::from_secs(5)).unwrap();
        assert_eq!(l.accept().unwrap().1.ip(), to.ip(), "from 0.0.0.0 the kernel picks");
    }

    #[test]
    fn a_whole_frame_passes_and_a_trickling_one_is_cut_off() {
        let (mut a, mut b) = pair();
        let frame = frame_bytes(K_RAFT, &[7; 40]);
        a.write_all(&frame).unwrap();
        let got = read_frame_timed(&mut b, 1 << 10, Duration::from_secs(5), Duration::from_secs(5)).unwrap();
        assert_eq!((got.kind, got.body), (K_RAFT, vec![7; 40]));
        // One byte at a time, each well within any read timeout, the whole
        // far beyond the frame's deadline: a plain read timeout would
        // never fire.
        let writer = std::thread::spawn(move || {
            for byte in frame {
                if a.write_all(&[byte]).is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        let e = read_frame_timed(&mut b, 1 << 10, Duration::from_secs(5), Duration::from_millis(150)).unwrap_err();
        assert!(matches!(e, PeerError::SlowFrame(_)), "{e}");
        drop(b);
        writer.join().unwrap();
    }

    #[test]
    fn a_silent_connection_is_closed_and_a_closed_one_is_quiet() {
        let (a, mut b) = pair();
        let e = read_frame_timed(&mut b, 1 << 10, Duration::from_millis(100), Duration::from_secs(5)).unwrap_err();
        assert!(matches!(e, PeerError::Idle(_)), "{e}");
        drop(a);
        let e = read_frame_timed(&mut b, 1 << 10, Duration::from_secs(5), Duration::from_secs(5)).unwrap_err();
        assert!(e.is_close(), "{e}");
    }

    #[test]
    fn a_frame_announced_and_not_sent_is_an_error() {
        let (mut a, mut b) = pair();
        // 200 MiB announced (the buffer grows with what arrives), 10 bytes
        // sent, then the sender goes away.
        a.write_all(&(200u32 << 20).to_be_bytes()).unwrap();
        a.write_all(&[0; 10]).unwrap();
        drop(a);
        let e = read_frame_timed(&mut b, 256 << 20, Duration::from_secs(5), Duration::from_secs(5)).unwrap_err();
        assert!(matches!(&e, PeerError::Wire(WireError::Io(io)) if io.kind() == io::ErrorKind::UnexpectedEof), "{e}");
    }

    #[test]
    fn handshake_slots_are_bounded_and_given_back() {
        let pool = Arc::new(Pool::default());
        let slots: Vec<Slot> = (0..HANDSHAKES_MAX).map(|_| pool.try_handshake().unwrap()).collect();
        assert!(pool.try_handshake().is_none());
        drop(slots);
        assert_eq!(pool.handshakes.load(Ordering::Acquire), 0);
        assert!(pool.try_handshake().is_some());
    }
}
