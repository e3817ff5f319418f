//! The wire format shared by replicas and clients.
//!
//! Every message travels in a *frame*: a 4-byte big-endian length `n`,
//! then `n` bytes holding a version byte, a kind byte and the body. A
//! reader refuses a frame longer than its limit before reading its body
//! (so a hostile length costs nothing), a version it does not speak, and a
//! body that does not decode exactly (truncated, trailing bytes, lengths
//! that overrun). Each refusal is a [`WireError`] naming what was wrong;
//! the connection it came from is then closed, nothing else.
//!
//! Bodies are hand-encoded: integers big-endian, byte strings and lists
//! prefixed by a 4-byte count. That keeps the format explicit, versioned
//! and cheap to check, and gives the client library no dependency beyond
//! this crate.
//!
//! The client protocol ([`ClientMsg`], [`ServerMsg`]) is defined here;
//! replicas add their own kinds for replica-to-replica traffic on the same
//! framing (kinds 64 and up). Service operations and replies are opaque
//! bytes here; an [`OpCodec`] gives them a type.

use std::io::{self, Read, Write};
use thiserror::Error;

/// The protocol version this build speaks. 2: stats carry the scheduler's
/// per-worker counters; 3: status carries the running scheduler and the
/// last decision of `auto`; 4: so do stats, for reading both every
/// second without a status's drain of the pipeline; 5: status carries the
/// CPUs the replica may use.
pub const WIRE_VERSION: u8 = 5;

/// Default limit on a frame's length (version, kind and body), in bytes.
pub const FRAME_MAX_DEFAULT: usize = 4 << 20;

/// Most commands in one client request.
pub const REQUEST_COMMANDS_MAX: usize = 10_000;

/// Longest metrics text a replica sends in [`ServerMsg::Metrics`] (well
/// below [`FRAME_MAX_DEFAULT`], so that any client with the default limit
/// reads it).
pub const METRICS_TEXT_MAX: usize = 1 << 20;

/// Errors reading or decoding a frame.
#[derive(Debug, Error)]
pub enum WireError {
    /// The connection failed or closed.
    #[error("i/o error: {0}")]
    Io(#[from] io::Error),
    /// The peer closed the connection between frames.
    #[error("connection closed")]
    Closed,
    /// The frame announces more bytes than allowed.
    #[error("frame of {len} bytes exceeds the limit of {max} bytes")]
    TooLarge {
        /// Announced length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The bytes are another protocol's (the length a frame would start
    /// with is over the limit, and they read as that protocol's start):
    /// the other end is not psmr's client or peer port.
    #[error("the other end speaks {0}, not psmr's protocol: wrong port?")]
    OtherProtocol(&'static str),
    /// The frame is too short to hold a version and a kind.
    #[error("frame of {0} bytes is too short")]
    TooShort(usize),
    /// The sender speaks another protocol version.
    #[error("unsupported protocol version {0} (this build speaks {WIRE_VERSION})")]
    Version(u8),
    /// No message has this kind.
    #[error("unknown message kind {0}")]
    UnknownKind(u8),
    /// The body does not decode.
    #[error("malformed {what}: {why}")]
    Malformed {
        /// The message being decoded.
        what: &'static str,
        /// What was wrong.
        why: String,
    },
}

/// One frame: a kind and its body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    /// The message kind.
    pub kind: u8,
    /// The encoded body.
    pub body: Vec<u8>,
}

/// Writes one frame.
pub fn write_frame(w: &mut impl Write, kind: u8, body: &[u8]) -> io::Result<()> {
    w.write_all(&frame_bytes(kind, body))
}

/// One frame as bytes, ready to send.
pub fn frame_bytes(kind: u8, body: &[u8]) -> Vec<u8> {
    let len = u32::try_from(body.len() + 2).expect("frame bodies are far below 4 GiB");
    let mut out = Vec::with_capacity(body.len() + 6);
    out.extend_from_slice(&len.to_be_bytes());
    out.push(WIRE_VERSION);
    out.push(kind);
    out.extend_from_slice(body);
    out
}

/// Checks a frame header (the 4 length bytes) against `max`; returns the
/// number of bytes that follow.
pub fn frame_len(header: [u8; 4], max: usize) -> Result<usize, WireError> {
    let len = u32::from_be_bytes(header) as usize;
    if len > max {
        return Err(other_protocol(header).map_or(WireError::TooLarge { len, max }, WireError::OtherProtocol));
    }
    if len < 2 {
        return Err(WireError::TooShort(len));
    }
    Ok(len)
}

/// What protocol starts with `header`, if it is one a psmr port meets by
/// mistake: TLS records (a port with TLS on, such as a replica's peer
/// port), HTTP (the metrics port) or RESP (a Redis port). Only asked of a
/// length over the limit, so no frame psmr accepts is taken for one.
fn other_protocol(header: [u8; 4]) -> Option<&'static str> {
    let text = |b: &[u8]| b.iter().all(|c| c.is_ascii_graphic() || *c == b' ');
    match header {
        [0x14..=0x17, 0x03, ..] => Some("TLS (a peer port, or a port with TLS on)"),
        [b'H', b'T', b'T', b'P'] => Some("HTTP (a metrics port?)"),
        [b'G', b'E', b'T', b' '] | [b'P', b'O', b'S', b'T'] | [b'P', b'U', b'T', b' '] | [b'H', b'E', b'A', b'D'] => {
            Some("HTTP (an HTTP client)")
        }
        [b'+' | b'-' | b':' | b'$' | b'*', ..] if text(&header[1..]) => Some("RESP (a Redis port?)"),
        _ => None,
    }
}

/// Splits the bytes after the header into a frame, checking the version.
pub fn parse_frame(mut bytes: Vec<u8>) -> Result<Frame, WireError> {
    if bytes.len() < 2 {
        return Err(WireError::TooShort(bytes.len()));
    }
    if bytes[0] != WIRE_VERSION {
        return Err(WireError::Version(bytes[0]));
    }
    let kind = bytes[1];
    bytes.drain(..2);
    Ok(Frame { kind, body: bytes })
}

/// Reads one frame (blocking), refusing one longer than `max` bytes.
/// Returns [`WireError::Closed`] on a clean end of stream between frames.
pub fn read_frame(r: &mut impl Read, max: usize) -> Result<Frame, WireError> {
    let mut header = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        match r.read(&mut header[got..]) {
            Ok(0) if got == 0 => return Err(WireError::Closed),
            Ok(0) => return Err(WireError::Io(io::ErrorKind::UnexpectedEof.into())),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    let len = frame_len(header, max)?;
    let mut bytes = Vec::with_capacity(len.min(BODY_CHUNK));
    let got = r.take(len as u64).read_to_end(&mut bytes)?;
    if got < len {
        return Err(WireError::Io(io::ErrorKind::UnexpectedEof.into()));
    }
    parse_frame(bytes)
}

/// A frame's body is read in steps of at most this many bytes, so that
/// memory follows the bytes that actually arrived, not the length a
/// (possibly hostile) header announced.
pub const BODY_CHUNK: usize = 64 << 10;

/// Reads the `len` bytes of a frame body from an async stream, growing the
/// buffer as bytes arrive (see [`BODY_CHUNK`]).
#[cfg(feature = "async")]
pub async fn read_body_async(r: &mut (impl tokio::io::AsyncReadExt + Unpin), len: usize) -> Result<Vec<u8>, WireError> {
    let mut bytes = Vec::with_capacity(len.min(BODY_CHUNK));
    while bytes.len() < len {
        if bytes.len() == bytes.capacity() {
            bytes.reserve_exact((len - bytes.len()).min(bytes.len().max(BODY_CHUNK)));
        }
        let want = (len - bytes.len()) as u64;
        let mut limited = tokio::io::AsyncReadExt::take(&mut *r, want);
        if tokio::io::AsyncReadExt::read_buf(&mut limited, &mut bytes).await? == 0 {
            return Err(WireError::Io(io::ErrorKind::UnexpectedEof.into()));
        }
    }
    Ok(bytes)
}

/// Reads one frame from an async stream, refusing one longer than `max`
/// bytes; [`WireError::Closed`] on a clean end of stream between frames.
#[cfg(feature = "async")]
pub async fn read_frame_async(r: &mut (impl tokio::io::AsyncReadExt + Unpin), max: usize) -> Result<Frame, WireError> {
    let mut header = [0u8; 4];
    match r.read_exact(&mut header).await {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Err(WireError::Closed),
        Err(e) => return Err(e.into()),
    }
    let len = frame_len(header, max)?;
    parse_frame(read_body_async(r, len).await?)
}

/// Appends values to a body.
#[derive(Default, Debug)]
pub struct Encoder {
    buf: Vec<u8>,
}

impl Encoder {
    /// An empty body.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty body with room for `bytes` bytes, so that a body of about
    /// that size is written without growing.
    pub fn with_capacity(bytes: usize) -> Self {
        Self { buf: Vec::with_capacity(bytes) }
    }

    /// Appends a byte.
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.buf.push(v);
        self
    }

    /// Appends a 32-bit integer.
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_be_bytes());
        self
    }

    /// Appends a 64-bit integer.
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_be_bytes());
        self
    }

    /// Appends a count-prefixed byte string.
    pub fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.u32(u32::try_from(v.len()).expect("byte strings are far below 4 GiB"));
        self.buf.extend_from_slice(v);
        self
    }

    /// Appends a count-prefixed UTF-8 string.
    pub fn str(&mut self, v: &str) -> &mut Self {
        self.bytes(v.as_bytes())
    }

    /// Appends an outcome: tag 0 and the reply bytes, or tag 1 and the
    /// reason.
    pub fn outcome(&mut self, o: &Outcome) -> &mut Self {
        match o {
            Outcome::Ok(b) => self.u8(0).bytes(b),
            Outcome::Rejected(m) => self.u8(1).str(m),
        }
    }

    /// The body.
    pub fn finish(self) -> Vec<u8> {
        self.buf
    }
}

/// Reads values from a body, failing (never panicking) on any overrun.
#[derive(Debug)]
pub struct Decoder<'a> {
    buf: &'a [u8],
    what: &'static str,
}

impl<'a> Decoder<'a> {
    /// Decodes `buf`, a body of message `what` (named in errors).
    pub fn new(buf: &'a [u8], what: &'static str) -> Self {
        Self { buf, what }
    }

    /// An error about this message.
    pub fn error(&self, why: impl Into<String>) -> WireError {
        WireError::Malformed { what: self.what, why: why.into() }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        if self.buf.len() < n {
            return Err(self.error(format!("needs {n} more bytes, has {}", self.buf.len())));
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    /// Reads a byte.
    pub fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.take(1)?[0])
    }

    /// Reads a 32-bit integer.
    pub fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_be_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }

    /// Reads a 64-bit integer.
    pub fn u64(&mut self) -> Result<u64, WireError> {
        Ok(u64::from_be_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }

    /// Reads a count-prefixed byte string.
    pub fn bytes(&mut self) -> Result<&'a [u8], WireError> {
        let n = self.u32()? as usize;
        self.take(n)
    }

    /// Reads a count-prefixed UTF-8 string.
    pub fn str(&mut self) -> Result<String, WireError> {
        let b = self.bytes()?;
        String::from_utf8(b.to_vec()).map_err(|_| self.error("a string is not UTF-8"))
    }

    /// Reads an outcome written by [`Encoder::outcome`].
    pub fn outcome(&mut self) -> Result<Outcome, WireError> {
        match self.u8()? {
            0 => Ok(Outcome::Ok(self.bytes()?.to_vec())),
            1 => Ok(Outcome::Rejected(self.str()?)),
            t => Err(self.error(format!("unknown outcome tag {t}"))),
        }
    }

    /// Reads a list count, refusing more than `max` items or more items
    /// than the remaining bytes could hold at `min_item` bytes each (so
    /// that a lying count cannot make the reader allocate).
    pub fn count(&mut self, max: usize, min_item: usize) -> Result<usize, WireError> {
        let n = self.u32()? as usize;
        if n > max {
            return Err(self.error(format!("{n} items, more than the limit of {max}")));
        }
        if n.saturating_mul(min_item.max(1)) > self.buf.len() {
            return Err(self.error(format!("{n} items cannot fit in {} bytes", self.buf.len())));
        }
        Ok(n)
    }

    /// Decodes `buf`, a body of message `what`, with `f`, which must
    /// consume it exactly.
    pub fn whole<T>(
        buf: &'a [u8],
        what: &'static str,
        f: impl FnOnce(&mut Decoder<'a>) -> Result<T, WireError>,
    ) -> Result<T, WireError> {
        let mut d = Decoder::new(buf, what);
        let value = f(&mut d)?;
        d.end()?;
        Ok(value)
    }

    /// Succeeds if the body was consumed exactly.
    pub fn end(&self) -> Result<(), WireError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(self.error(format!("{} trailing bytes", self.buf.len())))
        }
    }
}

/// One command as a client sends it: its sequence number and the encoded
/// service operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WireCommand {
    /// The client's sequence number for this command.
    pub seq: u64,
    /// The operation, encoded by the service's [`OpCodec`].
    pub op: Vec<u8>,
}

/// The outcome of one command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Executed; the encoded reply.
    Ok(Vec<u8>),
    /// Not executed, and it never will be under this sequence number.
    Rejected(String),
}

impl Outcome {
    /// Bytes of the reply or the refusal's message (what bounds on replies
    /// count).
    pub fn payload_len(&self) -> usize {
        match self {
            Outcome::Ok(b) => b.len(),
            Outcome::Rejected(m) => m.len(),
        }
    }
}

/// Messages from a client to a replica.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClientMsg {
    /// Order and execute these commands (a client batch).
    Request {
        /// The client.
        client: u64,
        /// Its commands, in the order the client issued them.
        commands: Vec<WireCommand>,
    },
    /// Report this replica's state.
    Status,
    /// Report how busy this replica's threads are.
    Stats,
    /// Report this replica's metrics (what its Prometheus endpoint serves).
    /// A replica built before this message existed answers that the kind
    /// is unknown and closes the connection.
    Metrics,
    /// Change the cluster's membership (the leader carries it out; other
    /// replicas redirect). Answered with [`ServerMsg::Members`] once the
    /// change is in effect.
    ChangeMembership(MemberChange),
    /// List the cluster's members as this replica knows them.
    Members,
    /// Change this replica's execution scheduler between two log entries
    /// (its own performance choice; no other replica takes part).
    /// Answered with [`ServerMsg::Reconfigured`] once the new scheduler
    /// runs.
    Reconfigure {
        /// A scheduler name (`psmr_sched::SchedulerKind`).
        scheduler: String,
        /// Worker threads.
        workers: u32,
        /// A class-to-threads mapping spec for early schedulers; empty:
        /// the configuration's, the application's default or the
        /// optimizer's.
        mapping: String,
    },
    /// Send [`SNAPSHOT_CHUNK_MAX`] bytes at most of the snapshot file this
    /// replica keeps, from `offset`: of the snapshot `id` names (as a
    /// [`ServerMsg::SnapshotChunk`] said), or, `id` empty, of the newest
    /// one (`psmr client snapshot save`).
    Snapshot {
        /// The snapshot's id, as the first chunk gave it; empty: the newest.
        id: Vec<u8>,
        /// Where in its file.
        offset: u64,
    },
    /// Act as `user` from now on, on this connection: the first message
    /// of a client of a replica that has users. Answered with
    /// [`ServerMsg::Authenticated`] or [`ServerMsg::Denied`].
    Auth {
        /// The user's name.
        user: String,
        /// Its password.
        password: String,
    },
}

/// The most bytes of a snapshot file one [`ServerMsg::SnapshotChunk`]
/// carries.
pub const SNAPSHOT_CHUNK_MAX: usize = 1 << 20;
/// The longest snapshot id on the wire.
const SNAPSHOT_ID_MAX: usize = 64;

/// Most members a cluster has, voters and learners together: raft's
/// quorum traffic grows with every voter, and clusters of more than a
/// handful gain nothing in availability.
pub const MEMBERS_MAX: usize = 64;

/// How a [`ServerMsg::Error`] answering [`ClientMsg::ChangeMembership`]
/// begins when the same request may succeed if sent again a little later
/// (another change is under way, leadership moved mid-change); any other
/// error is final.
pub const RETRY_LATER: &str = "retry later: ";

/// A change of the cluster's membership ([`ClientMsg::ChangeMembership`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MemberChange {
    /// Add replica `id`, which clients reach at `client` and peers at
    /// `peer`. It joins as a learner, catches up (from a snapshot if the
    /// log is compacted) and then becomes a voter.
    Add {
        /// The new replica's id.
        id: u64,
        /// Its client address.
        client: String,
        /// Its peer address.
        peer: String,
    },
    /// Remove replica `id`; once the removal is in effect it stops.
    Remove {
        /// The replica's id.
        id: u64,
    },
}

/// One member of the cluster, as [`ServerMsg::Members`] lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberInfo {
    /// Replica id.
    pub id: u64,
    /// Its client address.
    pub client: String,
    /// Its peer address.
    pub peer: String,
    /// A voter (true) or a learner still catching up (false).
    pub voter: bool,
}

/// CPU use of one thread of a replica, cumulative since it started.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThreadStat {
    /// The thread's name (its stage).
    pub name: String,
    /// The thread's id in the operating system.
    pub tid: u64,
    /// Time running on a CPU, in ns.
    pub cpu_ns: u64,
    /// Time ready to run but waiting for a CPU, in ns.
    pub runq_ns: u64,
}

/// One execution worker's counters at one moment, or the difference of two
/// moments (000 §5.3): kept by the early schedulers (`psmr_sched::Metrics`)
/// and carried by [`ServerMsg::Stats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WorkerSample {
    /// Nanoseconds waiting for the other threads of a sequential class.
    pub sync_idle_ns: u64,
    /// Nanoseconds waiting for the queue.
    pub queue_idle_ns: u64,
    /// Queue operations (batches taken).
    pub dequeues: u64,
    /// Commands those batches held for this worker.
    pub dequeued_commands: u64,
    /// Commands this worker executed.
    pub executed: u64,
    /// Steal attempts.
    pub steals_tried: u64,
    /// Successful steals.
    pub steals_ok: u64,
}

impl WorkerSample {
    /// What happened between `earlier` and `self`.
    pub fn since(&self, earlier: &WorkerSample) -> WorkerSample {
        WorkerSample {
            sync_idle_ns: self.sync_idle_ns.saturating_sub(earlier.sync_idle_ns),
            queue_idle_ns: self.queue_idle_ns.saturating_sub(earlier.queue_idle_ns),
            dequeues: self.dequeues.saturating_sub(earlier.dequeues),
            dequeued_commands: self.dequeued_commands.saturating_sub(earlier.dequeued_commands),
            executed: self.executed.saturating_sub(earlier.executed),
            steals_tried: self.steals_tried.saturating_sub(earlier.steals_tried),
            steals_ok: self.steals_ok.saturating_sub(earlier.steals_ok),
        }
    }

    /// Average commands per queue operation (000's "queue size").
    pub fn queue_size_avg(&self) -> f64 {
        if self.dequeues == 0 {
            0.0
        } else {
            self.dequeued_commands as f64 / self.dequeues as f64
        }
    }
}

/// What a replica knows about one replica, for `status`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaStatus {
    /// Replica id.
    pub id: u64,
    /// Its client address.
    pub addr: String,
    /// Its process id.
    pub pid: u32,
    /// The leader it follows (0: none known).
    pub leader: u64,
    /// Its raft term.
    pub term: u64,
    /// Log index of the last applied entry.
    pub applied: u64,
    /// Digest of the service state at `applied`, in hex.
    pub digest: String,
    /// The execution scheduler running now, with its workers (`auto`
    /// says what it chose).
    pub scheduler: String,
    /// `auto`'s last decision and its reason; empty otherwise.
    pub decision: String,
    /// Snapshot transfers in progress, to or from this replica (bytes
    /// done of the total, rate); empty if none.
    pub transfers: String,
    /// The CPUs it may use, and why: `2 (affinity 2, no CPU quota)`.
    pub cpus: String,
}

/// Messages from a replica to a client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServerMsg {
    /// Outcomes of commands, by sequence number.
    Replies {
        /// The client.
        client: u64,
        /// `(seq, outcome)`.
        replies: Vec<(u64, Outcome)>,
    },
    /// This replica is not the leader: try `leader` (id and client
    /// address), or another replica if unknown (id 0).
    Redirect {
        /// Leader id, 0 if unknown.
        leader: u64,
        /// Leader's client address, empty if unknown.
        addr: String,
    },
    /// The request was refused as a whole; the connection stays usable
    /// unless the error says otherwise.
    Error(String),
    /// Answer to [`ClientMsg::Auth`]: the connection acts as `user`.
    Authenticated {
        /// The user.
        user: String,
        /// Its role (`data` or `admin`).
        role: String,
    },
    /// The connection's user may not do this, or it has not authenticated
    /// (`NOAUTH ...`, `WRONGPASS ...`, `NOPERM ...`, as Redis says them).
    /// Final: every replica refuses it alike.
    Denied(String),
    /// Answer to [`ClientMsg::Status`].
    Status(ReplicaStatus),
    /// Answer to [`ClientMsg::Snapshot`]: bytes of the snapshot file `id`
    /// names, at `offset`, of its `total`.
    SnapshotChunk {
        /// The snapshot's id (opaque to the client: it sends it back).
        id: Vec<u8>,
        /// Where the bytes are in the file.
        offset: u64,
        /// The file's size.
        total: u64,
        /// The bytes (empty at the end).
        data: Vec<u8>,
    },
    /// Answer to [`ClientMsg::Stats`]: a monotonic clock reading in ns,
    /// every thread's counters and every execution worker's at that time.
    Stats {
        /// Clock reading (ns since the replica started).
        at_ns: u64,
        /// The threads.
        threads: Vec<ThreadStat>,
        /// The scheduler's workers, by worker id (empty for schedulers that
        /// keep no per-worker counters).
        workers: Vec<WorkerSample>,
        /// The execution scheduler running now, as in [`ReplicaStatus`].
        scheduler: String,
        /// `auto`'s last decision, as in [`ReplicaStatus`].
        decision: String,
    },
    /// Answer to [`ClientMsg::Metrics`]: the OpenMetrics text exposition,
    /// at most [`METRICS_TEXT_MAX`] bytes.
    Metrics(String),
    /// Answer to [`ClientMsg::Members`] and [`ClientMsg::ChangeMembership`]:
    /// the members, by id, at most [`MEMBERS_MAX`].
    Members(Vec<MemberInfo>),
    /// Answer to [`ClientMsg::Reconfigure`]: the scheduler that runs now,
    /// and how long execution stalled while the old one drained.
    Reconfigured {
        /// Its name.
        scheduler: String,
        /// Its workers.
        workers: u32,
        /// The stall, in ns.
        stall_ns: u64,
    },
}

const K_REQUEST: u8 = 1;
const K_STATUS: u8 = 2;
const K_STATS: u8 = 3;
const K_METRICS: u8 = 4;
const K_CHANGE_MEMBERSHIP: u8 = 5;
const K_MEMBERS: u8 = 6;
const K_RECONFIGURE: u8 = 7;
const K_SNAPSHOT: u8 = 8;
const K_AUTH: u8 = 9;
const K_REPLIES: u8 = 16;
const K_REDIRECT: u8 = 17;
const K_ERROR: u8 = 18;
const K_STATUS_REPLY: u8 = 19;
const K_STATS_REPLY: u8 = 20;
const K_METRICS_REPLY: u8 = 21;
const K_MEMBERS_REPLY: u8 = 22;
const K_RECONFIGURED: u8 = 23;
const K_SNAPSHOT_CHUNK: u8 = 24;
const K_AUTHENTICATED: u8 = 25;
const K_DENIED: u8 = 26;

/// Reads a snapshot id, at most [`SNAPSHOT_ID_MAX`] bytes.
fn snapshot_id(d: &mut Decoder) -> Result<Vec<u8>, WireError> {
    let id = d.bytes()?;
    if id.len() > SNAPSHOT_ID_MAX {
        return Err(d.error(format!("a snapshot id of {} bytes", id.len())));
    }
    Ok(id.to_vec())
}

/// [`MemberChange`]'s tags.
const CHANGE_ADD: u8 = 1;
const CHANGE_REMOVE: u8 = 2;

impl ClientMsg {
    /// Encodes into a frame.
    pub fn to_frame(&self) -> Vec<u8> {
        let mut e = Encoder::new();
        match self {
            ClientMsg::Request { client, commands } => {
                e.u64(*client).u32(commands.len() as u32);
                for c in commands {
                    e.u64(c.seq).bytes(&c.op);
                }
                frame_bytes(K_REQUEST, &e.finish())
            }
            ClientMsg::Status => frame_bytes(K_STATUS, &[]),
            ClientMsg::Stats => frame_bytes(K_STATS, &[]),
            ClientMsg::Metrics => frame_bytes(K_METRICS, &[]),
            ClientMsg::ChangeMembership(MemberChange::Add { id, client, peer }) => {
                e.u8(CHANGE_ADD).u64(*id).str(client).str(peer);
                frame_bytes(K_CHANGE_MEMBERSHIP, &e.finish())
            }
            ClientMsg::ChangeMembership(MemberChange::Remove { id }) => {
                e.u8(CHANGE_REMOVE).u64(*id);
                frame_bytes(K_CHANGE_MEMBERSHIP, &e.finish())
            }
            ClientMsg::Members => frame_bytes(K_MEMBERS, &[]),
            ClientMsg::Reconfigure { scheduler, workers, mapping } => {
                e.str(scheduler).u32(*workers).str(mapping);
                frame_bytes(K_RECONFIGURE, &e.finish())
            }
            ClientMsg::Snapshot { id, offset } => {
                e.bytes(id).u64(*offset);
                frame_bytes(K_SNAPSHOT, &e.finish())
            }
            ClientMsg::Auth { user, password } => {
                e.str(user).str(password);
                frame_bytes(K_AUTH, &e.finish())
            }
        }
    }

    /// Decodes a frame.
    pub fn from_frame(f: &Frame) -> Result<Self, WireError> {
        match f.kind {
            K_REQUEST => {
                let mut d = Decoder::new(&f.body, "client request");
                let client = d.u64()?;
                let n = d.count(REQUEST_COMMANDS_MAX, 12)?;
                let mut commands = Vec::with_capacity(n);
                for _ in 0..n {
                    commands.push(WireCommand { seq: d.u64()?, op: d.bytes()?.to_vec() });
                }
                d.end()?;
                Ok(ClientMsg::Request { client, commands })
            }
            K_STATUS => Decoder::new(&f.body, "status request").end().map(|_| ClientMsg::Status),
            K_STATS => Decoder::new(&f.body, "stats request").end().map(|_| ClientMsg::Stats),
            K_METRICS => Decoder::new(&f.body, "metrics request").end().map(|_| ClientMsg::Metrics),
            K_CHANGE_MEMBERSHIP => {
                let mut d = Decoder::new(&f.body, "membership change");
                let change = match d.u8()? {
                    CHANGE_ADD => MemberChange::Add { id: d.u64()?, client: d.str()?, peer: d.str()? },
                    CHANGE_REMOVE => MemberChange::Remove { id: d.u64()? },
                    t => return Err(d.error(format!("unknown membership change {t}"))),
                };
                d.end()?;
                Ok(ClientMsg::ChangeMembership(change))
            }
            K_MEMBERS => Decoder::new(&f.body, "members request").end().map(|_| ClientMsg::Members),
            K_RECONFIGURE => {
                let mut d = Decoder::new(&f.body, "reconfigure request");
                let msg = ClientMsg::Reconfigure { scheduler: d.str()?, workers: d.u32()?, mapping: d.str()? };
                d.end()?;
                Ok(msg)
            }
            K_SNAPSHOT => Decoder::whole(&f.body, "snapshot request", |d| {
                let id = snapshot_id(d)?;
                Ok(ClientMsg::Snapshot { id, offset: d.u64()? })
            }),
            K_AUTH => {
                Decoder::whole(&f.body, "auth request", |d| Ok(ClientMsg::Auth { user: d.str()?, password: d.str()? }))
            }
            k => Err(WireError::UnknownKind(k)),
        }
    }
}

impl ServerMsg {
    /// Encodes into a frame.
    pub fn to_frame(&self) -> Vec<u8> {
        let mut e = Encoder::new();
        let kind = match self {
            ServerMsg::Replies { client, replies } => {
                e.u64(*client).u32(replies.len() as u32);
                for (seq, outcome) in replies {
                    e.u64(*seq).outcome(outcome);
                }
                K_REPLIES
            }
            ServerMsg::Redirect { leader, addr } => {
                e.u64(*leader).str(addr);
                K_REDIRECT
            }
            ServerMsg::Error(m) => {
                e.str(m);
                K_ERROR
            }
            ServerMsg::Status(s) => {
                e.u64(s.id).str(&s.addr).u32(s.pid).u64(s.leader).u64(s.term).u64(s.applied).str(&s.digest);
                e.str(&s.scheduler).str(&s.decision).str(&s.transfers).str(&s.cpus);
                K_STATUS_REPLY
            }
            ServerMsg::Stats { at_ns, threads, workers, scheduler, decision } => {
                e.u64(*at_ns).u32(threads.len() as u32);
                for t in threads {
                    e.str(&t.name).u64(t.tid).u64(t.cpu_ns).u64(t.runq_ns);
                }
                e.u32(workers.len() as u32);
                for w in workers {
                    e.u64(w.sync_idle_ns)
                        .u64(w.queue_idle_ns)
                        .u64(w.dequeues)
                        .u64(w.dequeued_commands)
                        .u64(w.executed)
                        .u64(w.steals_tried)
                        .u64(w.steals_ok);
                }
                e.str(scheduler).str(decision);
                K_STATS_REPLY
            }
            ServerMsg::Metrics(text) => {
                e.str(text);
                K_METRICS_REPLY
            }
            ServerMsg::Members(members) => {
                e.u32(members.len() as u32);
                for m in members {
                    e.u64(m.id).str(&m.client).str(&m.peer).u8(m.voter as u8);
                }
                K_MEMBERS_REPLY
            }
            ServerMsg::Reconfigured { scheduler, workers, stall_ns } => {
                e.str(scheduler).u32(*workers).u64(*stall_ns);
                K_RECONFIGURED
            }
            ServerMsg::SnapshotChunk { id, offset, total, data } => {
                e.bytes(id).u64(*offset).u64(*total).bytes(data);
                K_SNAPSHOT_CHUNK
            }
            ServerMsg::Authenticated { user, role } => {
                e.str(user).str(role);
                K_AUTHENTICATED
            }
            ServerMsg::Denied(why) => {
                e.str(why);
                K_DENIED
            }
        };
        frame_bytes(kind, &e.finish())
    }

    /// Decodes a frame.
    pub fn from_frame(f: &Frame) -> Result<Self, WireError> {
        let body = &f.body;
        match f.kind {
            K_REPLIES => Decoder::whole(body, "replies", Self::replies),
            K_REDIRECT => {
                Decoder::whole(body, "redirect", |d| Ok(ServerMsg::Redirect { leader: d.u64()?, addr: d.str()? }))
            }
            K_ERROR => Decoder::whole(body, "error", |d| Ok(ServerMsg::Error(d.str()?))),
            K_STATUS_REPLY => Decoder::whole(body, "status", Self::status),
            K_STATS_REPLY => Decoder::whole(body, "stats", Self::stats),
            K_METRICS_REPLY => Decoder::whole(body, "metrics", |d| {
                let text = d.str()?;
                if text.len() > METRICS_TEXT_MAX {
                    return Err(d.error(format!("{} bytes of text, more than {METRICS_TEXT_MAX}", text.len())));
                }
                Ok(ServerMsg::Metrics(text))
            }),
            K_MEMBERS_REPLY => Decoder::whole(body, "members", Self::members),
            K_RECONFIGURED => Decoder::whole(body, "reconfigured", |d| {
                Ok(ServerMsg::Reconfigured { scheduler: d.str()?, workers: d.u32()?, stall_ns: d.u64()? })
            }),
            K_SNAPSHOT_CHUNK => Decoder::whole(body, "snapshot chunk", |d| {
                let (id, offset, total) = (snapshot_id(d)?, d.u64()?, d.u64()?);
                let data = d.bytes()?;
                if data.len() > SNAPSHOT_CHUNK_MAX {
                    return Err(d.error(format!("{} bytes, more than {SNAPSHOT_CHUNK_MAX}", data.len())));
                }
                Ok(ServerMsg::SnapshotChunk { id, offset, total, data: data.to_vec() })
            }),
            K_AUTHENTICATED => Decoder::whole(body, "authenticated", |d| {
                Ok(ServerMsg::Authenticated { user: d.str()?, role: d.str()? })
            }),
            K_DENIED => Decoder::whole(body, "denied", |d| Ok(ServerMsg::Denied(d.str()?))),
            k => Err(WireError::UnknownKind(k)),
        }
    }

    fn replies(d: &mut Decoder) -> Result<Self, WireError> {
        let client = d.u64()?;
        let n = d.count(REQUEST_COMMANDS_MAX, 13)?;
        let mut replies = Vec::with_capacity(n);
        for _ in 0..n {
            replies.push((d.u64()?, d.outcome()?));
        }
        Ok(ServerMsg::Replies { client, replies })
    }

    fn status(d: &mut Decoder) -> Result<Self, WireError> {
        Ok(ServerMsg::Status(ReplicaStatus {
            id: d.u64()?,
            addr: d.str()?,
            pid: d.u32()?,
            leader: d.u64()?,
            term: d.u64()?,
            applied: d.u64()?,
            digest: d.str()?,
            scheduler: d.str()?,
            decision: d.str()?,
            transfers: d.str()?,
            cpus: d.str()?,
        }))
    }

    fn stats(d: &mut Decoder) -> Result<Self, WireError> {
        let at_ns = d.u64()?;
        let n = d.count(1 << 16, 28)?;
        let mut threads = Vec::with_capacity(n);
        for _ in 0..n {
            threads.push(ThreadStat { name: d.str()?, tid: d.u64()?, cpu_ns: d.u64()?, runq_ns: d.u64()? });
        }
        let n = d.count(1 << 10, 56)?;
        let mut workers = Vec::with_capacity(n);
        for _ in 0..n {
            workers.push(WorkerSample {
                sync_idle_ns: d.u64()?,
                queue_idle_ns: d.u64()?,
                dequeues: d.u64()?,
                dequeued_commands: d.u64()?,
                executed: d.u64()?,
                steals_tried: d.u64()?,
                steals_ok: d.u64()?,
            });
        }
        let (scheduler, decision) = (d.str()?, d.str()?);
        Ok(ServerMsg::Stats { at_ns, threads, workers, scheduler, decision })
    }

    fn members(d: &mut Decoder) -> Result<Self, WireError> {
        let n = d.count(MEMBERS_MAX, 17)?;
        let mut members = Vec::with_capacity(n);
        for _ in 0..n {
            let (id, client, peer) = (d.u64()?, d.str()?, d.str()?);
            let voter = match d.u8()? {
                0 => false,
                1 => true,
                v => return Err(d.error(format!("voter flag {v}"))),
            };
            members.push(MemberInfo { id, client, peer, voter });
        }
        Ok(ServerMsg::Members(members))
    }
}

/// Encodes and decodes a service's operations and replies for the wire.
/// Decoding must reject (never panic on) any bytes.
pub trait OpCodec: Send + Sync + 'static {
    /// The service's operation.
    type Op;
    /// The service's reply.
    type Reply;
    /// Encodes an operation.
    fn encode_op(&self, op: &Self::Op) -> Vec<u8>;
    /// Decodes an operation.
    fn decode_op(&self, bytes: &[u8]) -> Result<Self::Op, WireError>;
    /// Encodes a reply.
    fn encode_reply(&self, reply: &Self::Reply) -> Vec<u8>;
    /// Decodes a reply.
    fn decode_reply(&self, bytes: &[u8]) -> Result<Self::Reply, WireError>;
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn roundtrip_client(m: &ClientMsg) -> ClientMsg {
        let bytes = m.to_frame();
        let f = read_frame(&mut &bytes[..], FRAME_MAX_DEFAULT).unwrap();
        ClientMsg::from_frame(&f).unwrap()
    }

    fn roundtrip_server(m: &ServerMsg) -> ServerMsg {
        let bytes = m.to_frame();
        let f = read_frame(&mut &bytes[..], FRAME_MAX_DEFAULT).unwrap();
        ServerMsg::from_frame(&f).unwrap()
    }

    #[test]
    fn messages_roundtrip() {
        let req = ClientMsg::Request {
            client: 7,
            commands: vec![WireCommand { seq: 1, op: vec![1, 2] }, WireCommand { seq: 2, op: vec![] }],
        };
        assert_eq!(roundtrip_client(&req), req);
        assert_eq!(roundtrip_client(&ClientMsg::Status), ClientMsg::Status);
        let save = ClientMsg::Snapshot { id: vec![1; 28], offset: 9 };
        assert_eq!(roundtrip_client(&save), save);
        let chunk = ServerMsg::SnapshotChunk { id: vec![2; 28], offset: 3, total: 10, data: vec![7; 5] };
        assert_eq!(roundtrip_server(&chunk), chunk);
        assert_eq!(roundtrip_client(&ClientMsg::Stats), ClientMsg::Stats);
        assert_eq!(roundtrip_client(&ClientMsg::Metrics), ClientMsg::Metrics);
        assert_eq!(roundtrip_client(&ClientMsg::Members), ClientMsg::Members);
        let auth = ClientMsg::Auth { user: "admin".into(), password: "pw".into() };
        assert_eq!(roundtrip_client(&auth), auth);
        let who = ServerMsg::Authenticated { user: "admin".into(), role: "admin".into() };
        assert_eq!(roundtrip_server(&who), who);
        let denied = ServerMsg::Denied("NOAUTH Authentication required.".into());
        assert_eq!(roundtrip_server(&denied), denied);
        let r = ClientMsg::Reconfigure { scheduler: "early".into(), workers: 4, mapping: "0,1;2".into() };
        assert_eq!(roundtrip_client(&r), r);
        for change in [
            MemberChange::Add { id: 4, client: "127.0.0.1:7004".into(), peer: "127.0.0.1:8004".into() },
            MemberChange::Remove { id: 2 },
        ] {
            let m = ClientMsg::ChangeMembership(change);
            assert_eq!(roundtrip_client(&m), m);
        }
        for m in [
            ServerMsg::Replies {
                client: 7,
                replies: vec![(1, Outcome::Ok(vec![9])), (2, Outcome::Rejected("stale".into()))],
            },
            ServerMsg::Redirect { leader: 2, addr: "127.0.0.1:1".into() },
            ServerMsg::Error("overloaded".into()),
            ServerMsg::Metrics("psmr_raft_term 3\n# EOF\n".into()),
            ServerMsg::Metrics(String::new()),
            ServerMsg::Members(vec![
                MemberInfo { id: 1, client: "c1".into(), peer: "p1".into(), voter: true },
                MemberInfo { id: 4, client: "c4".into(), peer: "p4".into(), voter: false },
            ]),
            ServerMsg::Members(Vec::new()),
            ServerMsg::Reconfigured { scheduler: "late-batch-bitmap".into(), workers: 2, stall_ns: 1_234 },
            ServerMsg::Stats {
                at_ns: 9,
                threads: vec![ThreadStat { name: "psmr-protocol".into(), tid: 7, cpu_ns: 1, runq_ns: 2 }],
                workers: vec![
                    WorkerSample {
                        sync_idle_ns: 1,
                        queue_idle_ns: 2,
                        dequeues: 3,
                        dequeued_commands: 4,
                        executed: 5,
                        steals_tried: 6,
                        steals_ok: 7,
                    },
                    WorkerSample::default(),
                ],
                scheduler: "auto: early, 2 workers".into(),
                decision: "to early after window 3: conflicts rare".into(),
            },
            ServerMsg::Status(ReplicaStatus {
                id: 1,
                addr: "a".into(),
                pid: 3,
                leader: 1,
                term: 4,
                applied: 5,
                digest: "ff".into(),
                scheduler: "auto: early with 2 workers".into(),
                decision: "fastest for this workload".into(),
                transfers: "receiving the snapshot at 7 from replica 1: 0.5 of 1.0 MiB, 2.0 MiB/s".into(),
                cpus: "1 (affinity 2, quota 1.00 CPUs)".into(),
            }),
        ] {
            assert_eq!(roundtrip_server(&m), m);
        }
    }

    #[test]
    fn bad_frames_are_refused_with_a_reason() {
        // Length beyond the limit: refused from the header alone.
        let big = [0xff, 0xff, 0xff, 0xff, 1, 1];
        assert!(matches!(read_frame(&mut &big[..], 1024), Err(WireError::TooLarge { .. })));
        // Another protocol's first bytes are named, whatever follows.
        let other = |b: &[u8]| match read_frame(&mut &b[..], 1 << 20) {
            Err(WireError::OtherProtocol(what)) => what.split(' ').next().unwrap().to_string(),
            r => format!("{r:?}"),
        };
        assert_eq!(other(b"\x15\x03\x03\x00\x02\x02\x32"), "TLS", "a TLS alert");
        assert_eq!(other(b"\x16\x03\x01\x02\x00\x01"), "TLS", "a ClientHello");
        assert_eq!(other(b"-ERR Protocol error\r\n"), "RESP");
        assert_eq!(other(b"HTTP/1.1 400 Bad Request\r\n"), "HTTP");
        assert_eq!(other(b"GET /metrics HTTP/1.1\r\n"), "HTTP");
        // Within the limit it is a frame, read as one.
        assert!(matches!(read_frame(&mut &b"\x00\x00\x00\x02\x09\x01"[..], 1024), Err(WireError::Version(9))));
        // Wrong version.
        let v = [0, 0, 0, 2, 9, 1];
        assert!(matches!(read_frame(&mut &v[..], 1024), Err(WireError::Version(9))));
        // Too short to hold version and kind.
        let s = [0, 0, 0, 1, 1];
        assert!(matches!(read_frame(&mut &s[..], 1024), Err(WireError::TooShort(1))));
        // Unknown kind.
        let f = Frame { kind: 200, body: vec![] };
        assert!(matches!(ClientMsg::from_frame(&f), Err(WireError::UnknownKind(200))));
        // A count that lies about the bytes that follow.
        let mut e = Encoder::new();
        e.u64(1).u32(1_000);
        let f = Frame { kind: K_REQUEST, body: e.finish() };
        let err = ClientMsg::from_frame(&f).unwrap_err().to_string();
        assert!(err.contains("cannot fit"), "{err}");
        // Trailing bytes.
        let mut bytes = ClientMsg::Status.to_frame();
        bytes[3] += 1;
        bytes.push(0);
        let f = read_frame(&mut &bytes[..], 1024).unwrap();
        assert!(ClientMsg::from_frame(&f).unwrap_err().to_string().contains("trailing"));
        // Metrics: a body beside the request, text that is not UTF-8, a
        // length that overruns, trailing bytes, text over the limit.
        let f = Frame { kind: K_METRICS, body: vec![0] };
        assert!(ClientMsg::from_frame(&f).unwrap_err().to_string().contains("trailing"));
        let f = Frame { kind: K_METRICS_REPLY, body: vec![0, 0, 0, 2, 0xff, 0xfe] };
        assert!(ServerMsg::from_frame(&f).unwrap_err().to_string().contains("UTF-8"));
        let f = Frame { kind: K_METRICS_REPLY, body: vec![0, 0, 0, 9, b'a'] };
        assert!(ServerMsg::from_frame(&f).unwrap_err().to_string().contains("more bytes"));
        let mut e = Encoder::new();
        e.str("a").u8(0);
        let f = Frame { kind: K_METRICS_REPLY, body: e.finish() };
        assert!(ServerMsg::from_frame(&f).unwrap_err().to_string().contains("trailing"));
        let f = Frame {
            kind: K_METRICS_REPLY,
            body: ServerMsg::Metrics("a".repeat(METRICS_TEXT_MAX + 1)).to_frame()[6..].to_vec(),
        };
        assert!(ServerMsg::from_frame(&f).unwrap_err().to_string().contains("more than"));
        // End of stream between frames, and inside one.
        assert!(matches!(read_frame(&mut &[][..], 1024), Err(WireError::Closed)));
        assert!(matches!(read_frame(&mut &[0, 0][..], 1024), Err(WireError::Io(_))));
    }

    proptest! {
        /// Any bytes at all: decoding fails or succeeds, never panics, and
        /// whatever decodes re-encodes to the same frame.
        #[test]
        fn arbitrary_bytes_never_panic(kind in 0u8..32, body in proptest::collection::vec(any::<u8>(), 0..200)) {
            let f = Frame { kind, body };
            if let Ok(m) = ClientMsg::from_frame(&f) {
                let again = parse_frame(m.to_frame()[4..].to_vec()).unwrap();
                prop_assert_eq!(again, f.clone());
            }
            if let Ok(m) = ServerMsg::from_frame(&f) {
                let again = parse_frame(m.to_frame()[4..].to_vec()).unwrap();
                prop_assert_eq!(again, f);
            }
        }
    }
}
