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
//! Warnings about bad connections are rate-limited ([`psmr_model::ratelog`]).

use crate::life::Life;
use crate::metrics::{ClientRefusal, CounterSet, Histogram, PendingRequests, ReplyClock};
use crate::msg::RequestSender;
use crate::router::{Outbox, OutboxRx, Outgoing, Router};
use crate::view::ClusterView;
use parking_lot::Mutex;
use psmr_auth::{Gate, Need, Principal};
use psmr_core::request::{Lease, Refusal, Request};
use psmr_core::Config;
use psmr_model::ratelog::RateLimit;
use psmr_model::wire::{
    frame_len, parse_frame, read_body_async, ClientMsg, Frame, MemberChange, Outcome, ReplicaStatus, ServerMsg,
    WireCommand, WireError,
};
use psmr_tls::{ReadHalf, Stream, WriteHalf};
use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::BufReader;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tracing::debug;

/// Bytes a connection reads ahead of the frame it parses (held outside
/// the frame budget: at most this much per connection).
pub const READ_BUFFER: usize = 2048;

type Reader = BufReader<ReadHalf>;

/// A connection idle at least this long may be closed to make room for a
/// new one when `max_connections` are open.
pub const EVICTABLE_IDLE: Duration = Duration::from_secs(1);

static BAD_CLIENT: RateLimit = RateLimit::new(10, Duration::from_secs(10));
static REFUSED_CLIENT: RateLimit = RateLimit::new(5, Duration::from_secs(10));
static DENIED_CLIENT: RateLimit = RateLimit::new(10, Duration::from_secs(10));

/// A boxed, sendable future.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What the client port asks of the replica behind it, besides queueing
/// its requests for the protocol thread.
pub trait Control: Send + Sync + 'static {
    /// The replica's status, once everything before has executed.
    fn status(&self) -> BoxFuture<'_, Result<ReplicaStatus, String>>;
    /// Switches the execution scheduler; the answer to send.
    fn reconfigure(&self, scheduler: String, workers: usize, mapping: String) -> BoxFuture<'_, ServerMsg>;
    /// Carries out a membership change (if this replica leads); the answer.
    fn change_membership(&self, change: MemberChange) -> BoxFuture<'_, ServerMsg>;
    /// The replica's metrics, as OpenMetrics text.
    fn metrics(&self) -> String;
    /// What its threads and workers did so far.
    fn stats(&self) -> ServerMsg;
    /// Whether an operation only reads (the application decides): a request
    /// of reads only may be served without the log.
    fn reads_only(&self, op: &[u8]) -> bool;
    /// Bytes of the snapshot file this replica keeps, for a client that
    /// saves it ([`ClientMsg::Snapshot`]); the answer to send.
    fn snapshot_chunk(&self, id: Vec<u8>, offset: u64) -> BoxFuture<'_, ServerMsg>;
    /// Whether an operation needs the admin role (the application decides,
    /// e.g. flushing the store); one that does not decode does not (the
    /// service manager refuses it).
    fn privileged(&self, op: &[u8]) -> bool;
}

/// The client port's metrics.
#[derive(Clone, Debug)]
pub struct ClientMetrics {
    /// `psmr_client_refused_total`, by [`ClientRefusal`].
    pub refused: CounterSet,
    /// `psmr_request_latency_seconds`.
    pub request_latency: Histogram,
}

impl ClientMetrics {
    /// Counts a refusal.
    pub fn refused(&self, why: ClientRefusal) {
        self.refused.inc(why.index());
    }

    /// Counts a connection that ended with `e`, if `e` refused a frame.
    fn connection_ended(&self, e: &WireError) {
        if let Some(why) = ClientRefusal::of(e) {
            self.refused(why);
        }
    }
}

/// One open connection, as the acceptor sees it.
struct Open {
    /// When the connection last delivered a whole frame (ns since start).
    active_ns: AtomicU64,
    /// Told to close to make room.
    evict: Notify,
}

/// What the client port of a replica is made of.
pub struct ClientPort {
    /// The replica's configuration (the limits of connections and frames).
    pub config: Arc<Config>,
    /// Its life: the port closes when it stops; a panicking connection
    /// task stops it.
    pub life: Arc<Life>,
    /// Who leads, and the members: a follower sends clients there.
    pub view: Arc<ClusterView>,
    /// Where the replies go.
    pub router: Arc<Router>,
    /// The queue of requests to the protocol thread.
    pub requests: RequestSender,
    /// The replica behind the port.
    pub control: Arc<dyn Control>,
    /// What the port records.
    pub metrics: ClientMetrics,
    /// Who clients are and what they may do.
    pub gate: Arc<Gate>,
    /// TLS on the port (`[client_tls]` with `client` among its ports).
    pub tls: Option<psmr_tls::Acceptor>,
}

/// The client port. See the module documentation.
pub struct ClientIo {
    pub(crate) port: ClientPort,
    /// Bytes of client frames in memory, one permit a byte.
    pub(crate) buffered: Arc<Semaphore>,
    open: Mutex<HashMap<u64, Arc<Open>>>,
    /// Numbers connections and in-process sessions apart in the router.
    pub(crate) next_conn: AtomicU64,
}

/// Who is at the other end of a connection.
struct Who {
    peer: SocketAddr,
    /// The user it acts as; None before it authenticates.
    principal: Option<Principal>,
}

/// Why a connection ended, when it was not the client's doing.
fn timed_out(why: String) -> WireError {
    WireError::Io(io::Error::new(io::ErrorKind::TimedOut, why))
}

impl ClientIo {
    /// A port made of `port`.
    pub fn new(port: ClientPort) -> Self {
        let buffered = Arc::new(Semaphore::new(port.config.client_buffer_bytes_max.min(Semaphore::MAX_PERMITS)));
        let (open, next_conn) = (Mutex::default(), AtomicU64::new(0));
        Self { port, buffered, open, next_conn }
    }

    /// Who clients are and what they may do, for front ends that share
    /// the port's users.
    pub fn gate(&self) -> &Arc<Gate> {
        &self.port.gate
    }

    /// Accepts and serves connections on `listener` until the replica
    /// stops.
    pub async fn serve(self: Arc<Self>, listener: TcpListener) {
        loop {
            let (stream, peer) = tokio::select! {
                r = listener.accept() => match r {
                    Ok(x) => x,
                    Err(e) => {
                        psmr_model::warn_limited!(REFUSED_CLIENT, "accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                },
                _ = self.port.life.stopped() => return,
            };
            let conn = self.next_conn.fetch_add(1, Ordering::Relaxed);
            let Some(open) = self.admit(conn) else {
                self.port.metrics.refused(ClientRefusal::ConnectionLimit);
                psmr_model::warn_limited!(
                    REFUSED_CLIENT,
                    %peer,
                    "refusing a client: {} busy connections already",
                    self.port.config.max_connections
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
                        io.port.life.fail(format!("a ClientIO task panicked: {why}"));
                    }
                }
                io.open.lock().remove(&conn);
            });
        }
    }

    /// Registers connection `conn`, closing the one idle longest if the
    /// limit is reached; None if every open connection is busy.
    fn admit(&self, conn: u64) -> Option<Arc<Open>> {
        let now = crate::clock::now_ns();
        let mut open = self.open.lock();
        if open.len() >= self.port.config.max_connections {
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
        let result = self.serve_connection(stream, peer, conn, &open).await;
        if let Err(e) = &result {
            self.port.metrics.connection_ended(e);
        }
        match result {
            Ok(()) | Err(WireError::Closed) => debug!(%peer, "client disconnected"),
            Err(WireError::Io(e)) if e.kind() != io::ErrorKind::TimedOut => debug!(%peer, "client connection: {e}"),
            Err(e) => psmr_model::warn_limited!(BAD_CLIENT, %peer, "closing client connection: {e}"),
        }
    }

    async fn serve_connection(
        &self,
        stream: TcpStream,
        peer: SocketAddr,
        conn: u64,
        open: &Open,
    ) -> Result<(), WireError> {
        stream.set_nodelay(true)?;
        let mut who = Who { peer, principal: self.port.gate.anonymous() };
        let stream = match &self.port.tls {
            None => Stream::Plain(stream),
            Some(tls) => {
                let (stream, user) = match tls.accept(stream).await {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        self.port.metrics.refused(ClientRefusal::Handshake);
                        psmr_model::warn_limited!(BAD_CLIENT, %peer, "client refused: {e}");
                        return Ok(());
                    }
                };
                if let Some(principal) = user.and_then(|u| self.port.gate.certified(&u)) {
                    who.principal = Some(principal);
                }
                stream
            }
        };
        let (rd, wr) = stream.into_split();
        // A small buffer takes a frame's header and (usually) its body in
        // one read; a larger body bypasses it.
        let mut rd = BufReader::with_capacity(READ_BUFFER, rd);
        let (outbox, rx) = self.port.router.outbox(self.port.config.queue_depth);
        let pending = PendingRequests::default();
        let clock = ReplyClock::new(pending.clone(), self.port.metrics.request_latency.clone());
        let writer = tokio::spawn(write_loop(wr, rx, clock));
        let mut clients = Vec::new();
        let result = tokio::select! {
            r = self.read_loop(&mut rd, (conn, who), open, &outbox, &pending, &mut clients) => r,
            _ = open.evict.notified() => Err(timed_out(format!(
                "closed to make room: idle while {} connections were open", self.port.config.max_connections))),
        };
        for c in clients {
            self.port.router.unregister(c, conn);
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
        let config = &self.port.config;
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
        (conn, mut who): (u64, Who),
        open: &Open,
        outbox: &Outbox,
        pending: &PendingRequests,
        clients: &mut Vec<u64>,
    ) -> Result<(), WireError> {
        loop {
            let (frame, permit) = tokio::select! {
                f = self.read_frame(rd) => f?,
                _ = self.port.life.stopped() => return Ok(()),
            };
            let read_at = Instant::now();
            open.active_ns.store(crate::clock::now_ns(), Ordering::Relaxed);
            let msg = ClientMsg::from_frame(&frame)?;
            if let Err(refusal) = self.permitted(&who, &msg) {
                drop(permit);
                let answer = self.denied(&who, &refusal);
                match outbox.send(Outgoing::Msg(answer)).await {
                    Ok(()) => continue,
                    Err(_) => return Ok(()),
                }
            }
            let answer = match msg {
                ClientMsg::Auth { user, password } => self.authenticate(&mut who, user, password).await,
                ClientMsg::Request { client, commands } => {
                    if !clients.contains(&client) {
                        clients.push(client);
                    }
                    self.port.router.register(client, conn, outbox);
                    let queued = Queued { client, commands, permit, read_at, pending };
                    match self.request(queued).await {
                        Ok(None) => continue,
                        Ok(Some(msg)) => msg,
                        Err(()) => return Ok(()),
                    }
                }
                other => self.control(other).await,
            };
            if outbox.send(Outgoing::Msg(answer)).await.is_err() {
                return Ok(());
            }
        }
    }

    /// The answer to a message that is not a request.
    async fn control(&self, msg: ClientMsg) -> ServerMsg {
        let control = &self.port.control;
        match msg {
            ClientMsg::Status => control.status().await.map_or_else(ServerMsg::Error, ServerMsg::Status),
            ClientMsg::Members => ServerMsg::Members(self.port.view.member_info()),
            ClientMsg::Reconfigure { scheduler, workers, mapping } => {
                control.reconfigure(scheduler, workers as usize, mapping).await
            }
            ClientMsg::ChangeMembership(change) => control.change_membership(change).await,
            ClientMsg::Metrics => {
                let text = control.metrics();
                match text.len() <= psmr_model::wire::METRICS_TEXT_MAX {
                    true => ServerMsg::Metrics(text),
                    false => ServerMsg::Error(format!("{} bytes of metrics, more than a reply holds", text.len())),
                }
            }
            ClientMsg::Stats => control.stats(),
            ClientMsg::Snapshot { id, offset } => control.snapshot_chunk(id, offset).await,
            ClientMsg::Request { .. } | ClientMsg::Auth { .. } => unreachable!("answered before"),
        }
    }

    /// Whether `who` may send `msg`: the refusal if not. Admin messages
    /// that pass are written to the audit log.
    fn permitted(&self, who: &Who, msg: &ClientMsg) -> Result<(), psmr_auth::Refusal> {
        let (need, what) = match msg {
            ClientMsg::Members | ClientMsg::Auth { .. } => return Ok(()),
            ClientMsg::Request { commands, .. } => match who.principal.as_ref() {
                // Only a data user's requests are decoded for this.
                Some(p) if p.role() == psmr_auth::Role::Data => {
                    match commands.iter().any(|c| self.port.control.privileged(&c.op)) {
                        true => (Need::Admin, "privileged operation"),
                        false => (Need::Data, "request"),
                    }
                }
                _ => (Need::Data, "request"),
            },
            ClientMsg::Status | ClientMsg::Stats | ClientMsg::Metrics => (Need::Data, "status"),
            ClientMsg::ChangeMembership(MemberChange::Add { .. }) => (Need::Admin, "add-replica"),
            ClientMsg::ChangeMembership(MemberChange::Remove { .. }) => (Need::Admin, "remove-replica"),
            ClientMsg::Reconfigure { .. } => (Need::Admin, "reconfigure"),
            ClientMsg::Snapshot { .. } => (Need::Admin, "snapshot save"),
        };
        let principal = who.principal.as_ref().ok_or(psmr_auth::Refusal::NoAuth)?;
        principal.may(need, what)?;
        if need == Need::Admin && self.port.gate.required() {
            tracing::info!(target: "psmr::audit", user = principal.name(), peer = %who.peer, "{what}: {msg:?}");
        }
        Ok(())
    }

    /// The answer to a refused message, counted and logged.
    fn denied(&self, who: &Who, refusal: &psmr_auth::Refusal) -> ServerMsg {
        self.port.metrics.refused(ClientRefusal::of_auth(refusal));
        let user = who.principal.as_ref().map_or("(anonymous)", Principal::name);
        psmr_model::warn_limited!(DENIED_CLIENT, peer = %who.peer, user, "client refused: {refusal}");
        ServerMsg::Denied(refusal.to_string())
    }

    /// Checks credentials ([`psmr_auth::authenticate`]); the connection
    /// acts as the user from now on.
    async fn authenticate(&self, who: &mut Who, user: String, password: String) -> ServerMsg {
        let (gate, source) = (self.port.gate.clone(), who.peer.ip());
        let checked = psmr_auth::authenticate(gate, source, user.into_bytes(), password.into_bytes()).await;
        match checked {
            Ok(principal) => {
                let answer = ServerMsg::Authenticated {
                    user: principal.name().to_string(),
                    role: principal.role().name().to_string(),
                };
                who.principal = Some(principal);
                answer
            }
            Err(refusal) => self.denied(who, &refusal),
        }
    }

    /// Checks a request and queues it for the protocol thread (waiting while
    /// it is behind: back-pressure); `Ok(Some)`: the refusal or redirect to
    /// send instead; `Err`: the protocol thread is gone.
    async fn request(&self, q: Queued<'_>) -> Result<Option<ServerMsg>, ()> {
        if let Some(msg) = self.check(q.client, q.commands.iter().map(|c| c.op.len())) {
            self.port.metrics.request_latency.observe_since(q.read_at);
            return Ok(Some(msg));
        }
        let commands = q.commands.iter().map(|c| (c.seq, c.op.as_slice()));
        let (request, first, last) = self.encode(q.client, commands, q.permit);
        // Noted before it is queued: its replies cannot reach the writer
        // first.
        q.pending.lock().expect(q.client, first, last, request.count, q.read_at);
        self.port.requests.send(request).await.map(|()| None).map_err(|_| ())
    }

    /// The request of `client`'s `commands` (sequence number, operation),
    /// checked already, holding `held` (its bytes' share of the port's
    /// budget) until its commands are in a proposed entry; with its first
    /// and last sequence numbers.
    pub(crate) fn encode<'a>(
        &self,
        client: u64,
        commands: impl Iterator<Item = (u64, &'a [u8])> + Clone,
        held: OwnedSemaphorePermit,
    ) -> (Request, u64, u64) {
        // Operations are decoded once, by the apply loop of every replica,
        // which refuses one that does not decode the same way everywhere
        // (the request's size was checked before).
        let read =
            !self.port.config.reads_through_log && commands.clone().all(|(_, op)| self.port.control.reads_only(op));
        let mut encoded = Vec::with_capacity(commands.clone().map(|(_, op)| op.len() + 20).sum());
        let (mut count, mut bytes, mut first, mut last) = (0, 0, u64::MAX, 0);
        for (seq, op) in commands {
            (count, bytes) = (count + 1, bytes + op.len());
            (first, last) = (first.min(seq), last.max(seq));
            psmr_core::entry::encode_command(&mut encoded, client, seq, op);
        }
        let mut request = Request::new(client, count, encoded, bytes, crate::clock::now_ns());
        request.read = read;
        request.held = Lease::new(held);
        (request, first, last)
    }

    /// A whole-request refusal of `client`'s operations of `ops` bytes each,
    /// if any: a redirect to the leader, or an error.
    pub(crate) fn check(&self, client: u64, ops: impl ExactSizeIterator<Item = usize>) -> Option<ServerMsg> {
        if !self.port.view.is_leader() {
            self.port.metrics.refused(ClientRefusal::NotLeader);
            return Some(self.port.view.redirect());
        }
        let config = &self.port.config;
        let refusal =
            psmr_core::request::check(client, ops, config.batch_max_commands, config.batch_max_bytes).err()?;
        self.port.metrics.refused(match refusal {
            Refusal::ReservedClient => ClientRefusal::ReservedClient,
            Refusal::Empty => ClientRefusal::EmptyRequest,
            Refusal::TooManyCommands { .. } => ClientRefusal::RequestCommands,
            Refusal::TooManyBytes { .. } => ClientRefusal::RequestBytes,
        });
        Some(ServerMsg::Error(refusal.to_string()))
    }
}

/// A request read from a connection, with what it holds.
struct Queued<'a> {
    client: u64,
    commands: Vec<WireCommand>,
    /// Its frame's share of the port's memory budget.
    permit: OwnedSemaphorePermit,
    read_at: Instant,
    pending: &'a PendingRequests,
}

/// Writes a connection's outgoing messages, coalescing the outcomes that
/// are waiting into one `Replies` frame per client.
async fn write_loop(mut wr: WriteHalf, mut rx: OutboxRx, mut clock: ReplyClock) {
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
        // The flush sends what TLS kept back (nothing in plain TCP).
        if wr.write_all(&buf).await.is_err() || wr.flush().await.is_err() {
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
