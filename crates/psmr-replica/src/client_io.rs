//! ClientIO (002 §V-A): non-blocking connections on a pool of
//! `client_io_threads` threads (a tokio runtime that does nothing else).
//!
//! A connection reads frames, at most `frame_max` bytes each. A client
//! request is checked (a follower redirects it to the leader; size
//! limits; its operations are decoded once, later, by the service manager
//! of every replica, which refuses those that do not decode), then queued
//! for the protocol thread's batching; when
//! that bounded queue is full the connection stops reading until there is
//! room, and TCP slows the client down. A frame that does not decode closes
//! that connection with a logged reason, nothing else. Replies come through
//! the connection's outbox ([`crate::router`]); its writer coalesces the
//! outcomes waiting for one client into one `Replies` frame.
//!
//! Memory is bounded whatever clients do:
//! * a frame's bytes are held against one budget of
//!   `client_buffer_bytes_max` bytes for all connections, from its header
//!   until the Batcher has taken the request (a connection waits for room
//!   before it reads a body, and its buffer grows with the bytes that
//!   arrive, never to the length a header announces);
//! * a frame must arrive whole within `frame_timeout_ms` of its header, and
//!   a connection with no request for `client_idle_timeout_ms` is closed;
//! * at `max_connections`, a new connection closes the one idle longest
//!   (if idle for at least [`EVICTABLE_IDLE`]), so idle sockets cannot lock
//!   clients out; otherwise the new one is refused.
//!
//! Warnings about bad connections are rate-limited ([`crate::ratelog`]).

use crate::metrics::{ClientRefusal, PendingRequests, ReplyClock};
use crate::msg::{Decision, Inbound, RequestSender};
use crate::queue::Sender;
use crate::router::{Outbox, OutboxRx, Outgoing};
use crate::Shared;
use parking_lot::Mutex;
use psmr_core::ratelog::RateLimit;
use psmr_core::request::{Lease, Refusal, Request};
use psmr_model::wire::{
    frame_len, parse_frame, read_body_async, ClientMsg, Frame, Outcome, ReplicaStatus, ServerMsg, WireError,
};
use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::BufReader;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedReadHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tracing::debug;

/// Bytes a connection reads ahead of the frame it parses (held outside
/// the frame budget: at most this much per connection).
pub const READ_BUFFER: usize = 2048;

type Reader = BufReader<OwnedReadHalf>;

/// Whether an operation only reads (the replica's application decides).
pub(crate) type ReadsOnly = Arc<dyn Fn(&[u8]) -> bool + Send + Sync>;

/// The scheduler configuration for a scheduler name, a worker count and a
/// mapping spec (empty: the default), or why there is none.
pub(crate) type Planner = Arc<dyn Fn(&str, usize, &str) -> Result<psmr_sched::SchedConfig, String> + Send + Sync>;

/// A connection idle at least this long may be closed to make room for a
/// new one when `max_connections` are open.
pub const EVICTABLE_IDLE: Duration = Duration::from_secs(1);

static BAD_CLIENT: RateLimit = RateLimit::new(10, Duration::from_secs(10));
static REFUSED_CLIENT: RateLimit = RateLimit::new(5, Duration::from_secs(10));

/// One open connection, as the acceptor sees it.
struct Open {
    /// When the connection last delivered a whole frame (ns since start).
    active_ns: AtomicU64,
    /// Told to close to make room.
    evict: Notify,
}

pub(crate) struct ClientIo {
    pub(crate) shared: Arc<Shared>,
    pub(crate) requests: RequestSender,
    pub(crate) decisions: Sender<Decision>,
    /// To the protocol thread: membership changes.
    pub(crate) protocol: Sender<Inbound>,
    /// Bytes of client frames in memory, one permit a byte.
    pub(crate) buffered: Arc<Semaphore>,
    /// Whether an operation only reads.
    reads_only: ReadsOnly,
    /// Turns a reconfiguration request into a scheduler configuration.
    planner: Planner,
    open: Mutex<HashMap<u64, Arc<Open>>>,
    next_conn: AtomicU64,
}

/// Why a connection ended, when it was not the client's doing.
fn timed_out(why: String) -> WireError {
    WireError::Io(io::Error::new(io::ErrorKind::TimedOut, why))
}

impl ClientIo {
    pub(crate) fn new(
        shared: Arc<Shared>,
        requests: RequestSender,
        decisions: Sender<Decision>,
        protocol: Sender<Inbound>,
        reads_only: ReadsOnly,
        planner: Planner,
    ) -> Self {
        let buffered = Arc::new(Semaphore::new(shared.config.client_buffer_bytes_max.min(Semaphore::MAX_PERMITS)));
        let (open, next_conn) = (Mutex::default(), AtomicU64::new(0));
        Self { shared, requests, decisions, protocol, buffered, reads_only, planner, open, next_conn }
    }

    pub(crate) async fn serve(self: Arc<Self>, listener: TcpListener) {
        loop {
            let (stream, peer) = tokio::select! {
                r = listener.accept() => match r {
                    Ok(x) => x,
                    Err(e) => {
                        psmr_core::warn_limited!(REFUSED_CLIENT, "accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                },
                _ = self.shared.stopped() => return,
            };
            let conn = self.next_conn.fetch_add(1, Ordering::Relaxed);
            let Some(open) = self.admit(conn) else {
                self.shared.metrics.client_refused(ClientRefusal::ConnectionLimit);
                psmr_core::warn_limited!(
                    REFUSED_CLIENT,
                    %peer,
                    "refusing a client: {} busy connections already",
                    self.shared.config.max_connections
                );
                let mut stream = stream;
                let msg = ServerMsg::Error("too many connections, try later".into()).to_frame();
                let _ = stream.write_all(&msg).await;
                continue;
            };
            let io = self.clone();
            tokio::spawn(async move {
                let task = tokio::spawn(io.clone().connection(stream, peer, conn, open));
                if let Err(e) = task.await {
                    if e.is_panic() {
                        let why = psmr_sched::panic_message(e.into_panic().as_ref());
                        io.shared.fail(format!("a ClientIO task panicked: {why}"));
                    }
                }
                io.open.lock().remove(&conn);
            });
        }
    }

    /// Registers connection `conn`, closing the one idle longest if the
    /// limit is reached; None if every open connection is busy.
    fn admit(&self, conn: u64) -> Option<Arc<Open>> {
        let now = crate::stages::now_ns();
        let mut open = self.open.lock();
        if open.len() >= self.shared.config.max_connections {
            let (&victim, oldest) = open.iter().min_by_key(|(_, o)| o.active_ns.load(Ordering::Relaxed))?;
            let idle = now.saturating_sub(oldest.active_ns.load(Ordering::Relaxed));
            if idle < EVICTABLE_IDLE.as_nanos() as u64 {
                return None;
            }
            oldest.evict.notify_one();
            open.remove(&victim);
        }
        let entry = Arc::new(Open { active_ns: AtomicU64::new(now), evict: Notify::new() });
        open.insert(conn, entry.clone());
        Some(entry)
    }

    async fn connection(self: Arc<Self>, stream: TcpStream, peer: std::net::SocketAddr, conn: u64, open: Arc<Open>) {
        let result = self.serve_connection(stream, conn, &open).await;
        if let Err(e) = &result {
            self.shared.metrics.connection_ended(e);
        }
        match result {
            Ok(()) | Err(WireError::Closed) => debug!(%peer, "client disconnected"),
            Err(WireError::Io(e)) if e.kind() != io::ErrorKind::TimedOut => debug!(%peer, "client connection: {e}"),
            Err(e) => psmr_core::warn_limited!(BAD_CLIENT, %peer, "closing client connection: {e}"),
        }
    }

    async fn serve_connection(&self, stream: TcpStream, conn: u64, open: &Open) -> Result<(), WireError> {
        stream.set_nodelay(true)?;
        let (rd, wr) = stream.into_split();
        // A small buffer takes a frame's header and (usually) its body in
        // one read; a larger body bypasses it.
        let mut rd = BufReader::with_capacity(READ_BUFFER, rd);
        let (outbox, rx) = self.shared.router.outbox(self.shared.config.queue_depth);
        let pending = PendingRequests::default();
        let clock = ReplyClock::new(pending.clone(), self.shared.metrics.request_latency.clone());
        let writer = tokio::spawn(write_loop(wr, rx, clock));
        let mut clients = Vec::new();
        let result = tokio::select! {
            r = self.read_loop(&mut rd, conn, open, &outbox, &pending, &mut clients) => r,
            _ = open.evict.notified() => Err(timed_out(format!(
                "closed to make room: idle while {} connections were open", self.shared.config.max_connections))),
        };
        for c in clients {
            self.shared.router.unregister(c, conn);
        }
        if let Err(e) = &result {
            if !matches!(e, WireError::Closed) {
                // Tell the client why before closing, if it still listens.
                let _ = outbox.send(Outgoing::Msg(ServerMsg::Error(e.to_string()))).await;
            }
        }
        drop(outbox);
        let _ = writer.await;
        result
    }

    /// Reads one frame within the connection's time limits, holding its
    /// bytes against the shared budget.
    async fn read_frame(&self, rd: &mut Reader) -> Result<(Frame, OwnedSemaphorePermit), WireError> {
        let config = &self.shared.config;
        let idle = Duration::from_millis(config.client_idle_timeout_ms);
        let mut header = [0u8; 4];
        match tokio::time::timeout(idle, rd.read_exact(&mut header)).await {
            Err(_) => return Err(timed_out(format!("no request for {} ms", config.client_idle_timeout_ms))),
            Ok(Err(e)) if e.kind() == io::ErrorKind::UnexpectedEof => return Err(WireError::Closed),
            Ok(r) => r?,
        };
        let len = frame_len(header, config.frame_max)?;
        // Waiting for room is the replica's doing, not the client's: no
        // deadline, and the client is slowed down by TCP meanwhile.
        let permit = self
            .buffered
            .clone()
            .acquire_many_owned(u32::try_from(len).expect("frame_max fits in u32"))
            .await
            .map_err(|_| WireError::Closed)?;
        let frame_timeout = Duration::from_millis(config.frame_timeout_ms);
        let body = tokio::time::timeout(frame_timeout, read_body_async(rd, len)).await.map_err(|_| {
            WireError::Malformed {
                what: "frame",
                why: format!("{len} bytes did not arrive within {} ms", config.frame_timeout_ms),
            }
        })??;
        Ok((parse_frame(body)?, permit))
    }

    async fn read_loop(
        &self,
        rd: &mut Reader,
        conn: u64,
        open: &Open,
        outbox: &Outbox,
        pending: &PendingRequests,
        clients: &mut Vec<u64>,
    ) -> Result<(), WireError> {
        loop {
            let (frame, permit) = tokio::select! {
                f = self.read_frame(rd) => f?,
                _ = self.shared.stopped() => return Ok(()),
            };
            let read_at = Instant::now();
            open.active_ns.store(crate::stages::now_ns(), Ordering::Relaxed);
            match ClientMsg::from_frame(&frame)? {
                ClientMsg::Status => {
                    let status = self.status().await;
                    let msg = match status {
                        Ok(s) => ServerMsg::Status(s),
                        Err(e) => ServerMsg::Error(e),
                    };
                    if outbox.send(Outgoing::Msg(msg)).await.is_err() {
                        return Ok(());
                    }
                }
                ClientMsg::Members => {
                    if outbox.send(Outgoing::Msg(ServerMsg::Members(self.shared.member_info()))).await.is_err() {
                        return Ok(());
                    }
                }
                ClientMsg::Reconfigure { scheduler, workers, mapping } => {
                    let msg = self.reconfigure(scheduler, workers as usize, mapping).await;
                    if outbox.send(Outgoing::Msg(msg)).await.is_err() {
                        return Ok(());
                    }
                }
                ClientMsg::ChangeMembership(change) => {
                    let msg = self.change_membership(change).await;
                    if outbox.send(Outgoing::Msg(msg)).await.is_err() {
                        return Ok(());
                    }
                }
                ClientMsg::Metrics => {
                    let text = crate::metrics::exposition(&self.shared);
                    let msg = if text.len() <= psmr_model::wire::METRICS_TEXT_MAX {
                        ServerMsg::Metrics(text)
                    } else {
                        ServerMsg::Error(format!("{} bytes of metrics, more than a reply holds", text.len()))
                    };
                    if outbox.send(Outgoing::Msg(msg)).await.is_err() {
                        return Ok(());
                    }
                }
                ClientMsg::Stats => {
                    let workers = self.shared.worker_samples();
                    let (scheduler, decision) = self.shared.scheduler_status();
                    let (at_ns, threads) = (crate::stages::now_ns(), crate::stages::threads());
                    let msg = ServerMsg::Stats { at_ns, threads, workers, scheduler, decision };
                    if outbox.send(Outgoing::Msg(msg)).await.is_err() {
                        return Ok(());
                    }
                }
                ClientMsg::Request { client, commands } => {
                    if !clients.contains(&client) {
                        clients.push(client);
                    }
                    self.shared.router.register(client, conn, outbox);
                    if let Some(msg) = self.check(client, &commands) {
                        self.shared.metrics.request_latency.observe_since(read_at);
                        if outbox.send(Outgoing::Msg(msg)).await.is_err() {
                            return Ok(());
                        }
                        continue;
                    }
                    // Operations are decoded once, by the service manager
                    // of every replica, which refuses one that does not
                    // decode the same way everywhere (the request's size
                    // was checked above).
                    let mut bytes = 0;
                    let count = commands.len() as u32;
                    let mut encoded = Vec::with_capacity(frame.body.len() + 8 * commands.len());
                    let (mut first, mut last) = (u64::MAX, 0);
                    let read =
                        !self.shared.config.reads_through_log && commands.iter().all(|c| (self.reads_only)(&c.op));
                    for c in commands {
                        bytes += c.op.len();
                        (first, last) = (first.min(c.seq), last.max(c.seq));
                        psmr_core::entry::encode_command(&mut encoded, client, c.seq, &c.op);
                    }
                    // Noted before it is queued: its replies cannot
                    // reach the writer first.
                    pending.lock().expect(client, first, last, count, read_at);
                    // Waits while the protocol thread is behind:
                    // back-pressure. The frame's bytes stay counted until
                    // its commands are in a proposed entry.
                    let mut request = Request::new(client, count, encoded, bytes, crate::stages::now_ns());
                    request.read = read;
                    request.held = Lease::new(permit);
                    if self.requests.send(request).await.is_err() {
                        return Ok(());
                    }
                }
            }
        }
    }

    /// A whole-request refusal, if any.
    fn check(&self, client: u64, commands: &[psmr_model::wire::WireCommand]) -> Option<ServerMsg> {
        if !self.shared.is_leader.load(Ordering::Acquire) {
            self.shared.metrics.client_refused(ClientRefusal::NotLeader);
            return Some(self.shared.redirect_to(self.shared.leader.load(Ordering::Acquire)));
        }
        let config = &self.shared.config;
        let ops = commands.iter().map(|c| c.op.len());
        let refusal =
            psmr_core::request::check(client, ops, config.batch_max_commands, config.batch_max_bytes).err()?;
        self.shared.metrics.client_refused(match refusal {
            Refusal::ReservedClient => ClientRefusal::ReservedClient,
            Refusal::Empty => ClientRefusal::EmptyRequest,
            Refusal::TooManyCommands { .. } => ClientRefusal::RequestCommands,
            Refusal::TooManyBytes { .. } => ClientRefusal::RequestBytes,
        });
        Some(ServerMsg::Error(refusal.to_string()))
    }

    /// Plans the scheduler a client asks for (off the async threads: the
    /// optimizer may run) and has the service manager switch to it
    /// between two entries.
    async fn reconfigure(&self, scheduler: String, workers: usize, mapping: String) -> ServerMsg {
        let planner = self.planner.clone();
        let plan = tokio::task::spawn_blocking(move || planner(&scheduler, workers, &mapping)).await;
        let config = match plan {
            Ok(Ok(config)) => config,
            Ok(Err(why)) => return ServerMsg::Error(why),
            Err(e) => return ServerMsg::Error(format!("planning the scheduler failed: {e}")),
        };
        let (kind, workers) = (config.kind.name().to_string(), config.workers as u32);
        let (reply, answer) = tokio::sync::oneshot::channel();
        if self.decisions.try_send(Decision::Reconfigure(config, reply)).is_err() {
            return ServerMsg::Error("replica busy, try again".into());
        }
        match answer.await {
            Ok(Ok(stall)) => ServerMsg::Reconfigured { scheduler: kind, workers, stall_ns: stall.as_nanos() as u64 },
            Ok(Err(why)) => ServerMsg::Error(why),
            Err(_) => ServerMsg::Error("the replica is stopping".into()),
        }
    }

    /// Hands a membership change to the protocol thread (the leader's
    /// protocol carries it out) and waits for its answer.
    async fn change_membership(&self, change: psmr_model::wire::MemberChange) -> ServerMsg {
        use psmr_model::wire::RETRY_LATER;
        if !self.shared.is_leader.load(Ordering::Acquire) {
            return self.shared.redirect_to(self.shared.leader.load(Ordering::Acquire));
        }
        let (reply, answer) = tokio::sync::oneshot::channel();
        if self.protocol.try_send(Inbound::Admin(change, reply)).is_err() {
            return ServerMsg::Error(format!("{RETRY_LATER}the protocol thread is busy"));
        }
        answer.await.unwrap_or_else(|_| ServerMsg::Error("the replica is stopping".into()))
    }

    async fn status(&self) -> Result<ReplicaStatus, String> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.decisions.try_send(Decision::Status(tx)).map_err(|_| "replica busy, try again".to_string())?;
        let (applied, digest) = rx.await.map_err(|_| "replica stopping".to_string())?;
        let me = self.shared.config.member(self.shared.id).map_err(|e| e.to_string())?;
        let (scheduler, decision) = self.shared.scheduler_status();
        Ok(ReplicaStatus {
            id: self.shared.id,
            addr: me.client.to_string(),
            pid: std::process::id(),
            leader: self.shared.leader.load(Ordering::Acquire),
            term: self.shared.term.load(Ordering::Acquire),
            applied,
            digest: digest.to_string(),
            scheduler,
            decision,
        })
    }
}

/// Writes a connection's outgoing messages, coalescing the outcomes that
/// are waiting into one `Replies` frame per client.
async fn write_loop(mut wr: tokio::net::tcp::OwnedWriteHalf, mut rx: OutboxRx, mut clock: ReplyClock) {
    let mut buf = Vec::new();
    let mut replies: Vec<(u64, Vec<(u64, Outcome)>)> = Vec::new();
    while let Some(first) = rx.recv().await {
        let mut next = Some(first);
        let mut taken = 0;
        while let Some(item) = next.take() {
            match item {
                Outgoing::Reply { client, seq, outcome } => {
                    clock.note(client, seq);
                    match replies.iter_mut().find(|r| r.0 == client) {
                        Some(r) => r.1.push((seq, outcome)),
                        None => replies.push((client, vec![(seq, outcome)])),
                    }
                }
                Outgoing::Msg(m) => {
                    flush_replies(&mut replies, &mut buf);
                    buf.extend_from_slice(&m.to_frame());
                }
            }
            taken += 1;
            if taken < 4096 {
                next = rx.try_recv();
            }
        }
        flush_replies(&mut replies, &mut buf);
        // Observed before the bytes go out: a client that has its reply
        // finds its request counted.
        clock.settle();
        if wr.write_all(&buf).await.is_err() {
            return;
        }
        buf.clear();
    }
    let _ = wr.shutdown().await;
}

/// Bytes of outcomes in one `Replies` frame, at most (unless one outcome
/// is larger): well below what clients accept in a frame.
const REPLIES_FRAME_BYTES: usize = psmr_model::wire::FRAME_MAX_DEFAULT / 2;

fn flush_replies(replies: &mut Vec<(u64, Vec<(u64, Outcome)>)>, buf: &mut Vec<u8>) {
    for (client, list) in replies.drain(..) {
        let mut frame = Vec::new();
        let mut bytes = 0;
        for (seq, outcome) in list {
            let n = outcome.payload_len() + 16;
            if bytes + n > REPLIES_FRAME_BYTES && !frame.is_empty() {
                buf.extend_from_slice(&ServerMsg::Replies { client, replies: std::mem::take(&mut frame) }.to_frame());
                bytes = 0;
            }
            frame.push((seq, outcome));
            bytes += n;
        }
        buf.extend_from_slice(&ServerMsg::Replies { client, replies: frame }.to_frame());
    }
}
