//! ReplicaIO (002 §V-B): blocking I/O, one sender thread per peer and one
//! receiver thread per incoming peer connection.
//!
//! The protocol thread never blocks on a peer: it puts raft messages on the
//! peer's bounded send queue and drops them when the queue is full or the
//! peer is unreachable (raft retransmits what matters). A sender connects,
//! introduces itself with a `Hello` (its id and incarnation), waits for the
//! answer, then streams frames; on any error it reconnects with backoff.
//!
//! The incarnation enforces the crash-stop rule of in-memory storage: a
//! replica that lost its log must not come back under the same id, since
//! it could vote twice in a term. A replica draws its incarnation when it
//! starts in memory, or once when its data directory is created on disk
//! (so a disk replica that restarts keeps it, and one whose directory was
//! wiped gets a new one); a receiver remembers the first incarnation it
//! sees per peer and refuses any other, with a message that the refused
//! replica prints before it stops.

use crate::Shared;
use crossbeam::channel::{Receiver, Sender, TrySendError};
use psmr_model::wire::{frame_bytes, read_frame, Decoder, Encoder, Frame, WireError};
use raft::prelude::Message;
use std::io::{BufWriter, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tracing::{debug, info, warn};

const K_HELLO: u8 = 64;
const K_ACK: u8 = 65;
const K_REFUSED: u8 = 66;
const K_RAFT: u8 = 67;

/// What the protocol thread receives besides proposals.
pub enum Inbound {
    /// A raft message from a peer.
    Raft(Box<Message>),
    /// The service manager took a snapshot of the state after log entry
    /// `index` (of term `term`): keep it and compact the log.
    Snapshot {
        /// Last log index the snapshot covers.
        index: u64,
        /// Term of that entry.
        term: u64,
        /// The snapshot.
        data: Vec<u8>,
    },
}

fn hello(from: u64, incarnation: u64) -> Vec<u8> {
    let mut e = Encoder::new();
    e.u64(from).u64(incarnation);
    frame_bytes(K_HELLO, &e.finish())
}

/// Encodes a raft message for the wire.
fn raft_frame(msg: &Message) -> Vec<u8> {
    use protobuf::Message as _;
    frame_bytes(K_RAFT, &msg.write_to_bytes().expect("raft messages always encode"))
}

fn parse_raft(f: &Frame) -> Result<Message, WireError> {
    use protobuf::Message as _;
    Message::parse_from_bytes(&f.body).map_err(|e| WireError::Malformed { what: "raft message", why: e.to_string() })
}

/// The send side of one peer: a bounded queue, drained by its thread.
pub struct PeerSender {
    queue: Sender<Message>,
}

impl PeerSender {
    /// Queues a message; drops it if the queue is full.
    pub fn send(&self, msg: Message) -> bool {
        match self.queue.try_send(msg) {
            Ok(()) => true,
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => false,
        }
    }
}

/// Starts the sender thread for peer `to` at `addr`.
pub fn spawn_sender(shared: &Arc<Shared>, to: u64, addr: SocketAddr) -> std::io::Result<PeerSender> {
    let (tx, rx) = crossbeam::channel::bounded(shared.config.queue_depth);
    let shared = shared.clone();
    std::thread::Builder::new().name(format!("psmr-peer-snd-{to}")).spawn(move || sender(&shared, to, addr, &rx))?;
    Ok(PeerSender { queue: tx })
}

fn sender(shared: &Shared, to: u64, addr: SocketAddr, rx: &Receiver<Message>) {
    let mut backoff = Duration::from_millis(20);
    while !shared.stopping() {
        let stream = match connect(shared, to, addr) {
            Ok(s) => s,
            Err(e) => {
                debug!(peer = to, "cannot reach peer: {e}");
                // Messages for an unreachable peer are stale by the time it
                // is back; raft sends fresh ones.
                while rx.try_recv().is_ok() {}
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_millis(500));
                continue;
            }
        };
        backoff = Duration::from_millis(20);
        let mut w = BufWriter::new(stream);
        loop {
            let msg = match rx.recv_timeout(Duration::from_millis(100)) {
                Ok(m) => m,
                Err(crossbeam::channel::RecvTimeoutError::Timeout) if !shared.stopping() => continue,
                Err(_) => return,
            };
            let mut result = w.write_all(&raft_frame(&msg));
            // Write whatever else is queued before flushing: one system
            // call for a burst of messages.
            while result.is_ok() {
                match rx.try_recv() {
                    Ok(m) => result = w.write_all(&raft_frame(&m)),
                    Err(_) => break,
                }
            }
            if let Err(e) = result.and_then(|_| w.flush()) {
                debug!(peer = to, "connection to peer lost: {e}");
                break;
            }
        }
    }
}

/// Connects to a peer and introduces this replica.
fn connect(shared: &Shared, to: u64, addr: SocketAddr) -> Result<TcpStream, WireError> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_millis(500))?;
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.write_all(&hello(shared.id, shared.incarnation))?;
    let answer = read_frame(&mut stream, 1 << 16)?;
    match answer.kind {
        K_ACK => {
            stream.set_read_timeout(None)?;
            Ok(stream)
        }
        K_REFUSED => {
            let why = Decoder::new(&answer.body, "refusal").str().unwrap_or_else(|e| e.to_string());
            shared.fail(format!("replica {to} refused this replica: {why}"));
            Err(WireError::Malformed { what: "hello", why })
        }
        k => Err(WireError::UnknownKind(k)),
    }
}

/// Accepts peer connections until the replica stops; one thread each.
pub fn spawn_listener(shared: &Arc<Shared>, listener: TcpListener, inbound: Sender<Inbound>) -> std::io::Result<()> {
    let shared = shared.clone();
    listener.set_nonblocking(true)?;
    std::thread::Builder::new().name("psmr-peer-accept".into()).spawn(move || {
        while !shared.stopping() {
            match listener.accept() {
                Ok((stream, from)) => {
                    let (shared, inbound) = (shared.clone(), inbound.clone());
                    let spawned = std::thread::Builder::new()
                        .name("psmr-peer-rcv".into())
                        .spawn(move || receiver(&shared, stream, from, &inbound));
                    if let Err(e) = spawned {
                        warn!("cannot start a peer receiver: {e}");
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => warn!("peer accept failed: {e}"),
            }
        }
    })?;
    Ok(())
}

fn receiver(shared: &Shared, mut stream: TcpStream, from: SocketAddr, inbound: &Sender<Inbound>) {
    if let Err(e) = receive(shared, &mut stream, inbound) {
        match e {
            WireError::Closed => debug!(%from, "peer connection closed"),
            e => warn!(%from, "closing peer connection: {e}"),
        }
    }
}

fn receive(shared: &Shared, stream: &mut TcpStream, inbound: &Sender<Inbound>) -> Result<(), WireError> {
    stream.set_nonblocking(false)?;
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    let first = read_frame(stream, 1 << 16)?;
    if first.kind != K_HELLO {
        return Err(WireError::Malformed { what: "peer hello", why: format!("got kind {} first", first.kind) });
    }
    let mut d = Decoder::new(&first.body, "peer hello");
    let (peer, incarnation) = (d.u64()?, d.u64()?);
    d.end()?;
    let refusal = if peer == shared.id || shared.config.member(peer).is_err() {
        Some(format!("id {peer} is not another member of this cluster"))
    } else {
        let mut known = shared.incarnations.lock();
        match known.get(&peer) {
            Some(&seen) if seen != incarnation => Some(format!(
                "replica {peer} ran here before and lost its state (in-memory storage or a wiped \
                 data directory); it must not rejoin under the same id: Raft could lose acknowledged commands"
            )),
            _ => {
                known.insert(peer, incarnation);
                None
            }
        }
    };
    if let Some(why) = refusal {
        let mut e = Encoder::new();
        e.str(&why);
        let _ = stream.write_all(&frame_bytes(K_REFUSED, &e.finish()));
        return Err(WireError::Malformed { what: "peer hello", why });
    }
    stream.write_all(&frame_bytes(K_ACK, &[]))?;
    // No timeout from here on: a timeout inside a frame would lose the
    // framing. The thread ends when the peer closes the connection or when
    // the protocol thread is gone.
    stream.set_read_timeout(None)?;
    info!(peer, "peer connected");
    loop {
        let frame = read_frame(stream, shared.config.peer_frame_max)?;
        if frame.kind != K_RAFT {
            return Err(WireError::UnknownKind(frame.kind));
        }
        let msg = parse_raft(&frame)?;
        if msg.from != peer {
            return Err(WireError::Malformed {
                what: "raft message",
                why: format!("from {} on {peer}'s link", msg.from),
            });
        }
        shared.stats.peer_in.fetch_add(1, Ordering::Relaxed);
        if inbound.send(Inbound::Raft(Box::new(msg))).is_err() {
            return Ok(());
        }
    }
}
