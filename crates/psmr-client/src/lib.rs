//! # psmr-client: talking to a psmr cluster
//!
//! A client sends *requests*, each a batch of commands (003 and 000 clients
//! send 50 per request), and waits for every command's outcome before it
//! sends the next request: a closed loop. Every command carries the
//! client's id and a sequence number; retries reuse them, so the cluster's
//! reply cache executes each command once however often it is sent.
//!
//! Leader discovery: the client tries the replica it last succeeded with,
//! then the others in turn; a follower answers with a redirect to the
//! leader, which the client follows. An attempt that hears nothing for
//! `attempt_timeout` moves on to another replica at once, and the silent
//! one is passed over, even when a follower still names it, for another
//! `attempt_timeout`: a paused or cut-off leader still accepts
//! connections, and its followers name it until they elect another, so
//! following them back would cost a whole attempt more (a replica that
//! answered part of a request and then fell silent is asked again: it
//! dropped the rest of the replies because they were taken too slowly). A
//! request that gets no further outcome for `deadline` fails with
//! [`ClientError::Timeout`], naming the last problem seen.
//!
//! [`AsyncClient`] is the tokio API; [`Client`] wraps it for blocking use
//! with a private single-threaded runtime. Both are generic over nothing:
//! operations and replies are bytes, and [`AsyncClient::call`] puts a
//! service's typed operations on the wire with its
//! [`psmr_model::wire::OpCodec`].
//!
//! [`Submit`] and [`Session`] are what a front end such as the Redis
//! gateway needs of a cluster: sessions that order and execute requests.
//! [`Network`] reaches a cluster over the network with [`AsyncClient`]s;
//! a replica implements them in its own process.
//!
//! Membership: [`AsyncClient::members_of`] asks one replica for the
//! cluster's members; [`AsyncClient::change_membership`] adds or removes a
//! replica, finding the leader and retrying until the change is in effect
//! or its deadline passes.
//!
//! In the guide: `docs/design.md` places this crate among the others;
//! `docs/cli.md`: `psmr client` and its flags; docs/cluster.md for the cluster it talks to.

use psmr_model::wire::{
    read_frame_async, ClientMsg, MemberChange, MemberInfo, OpCodec, Outcome, ReplicaStatus, ServerMsg, ThreadStat,
    WireCommand, WireError, WorkerSample, FRAME_MAX_DEFAULT, RETRY_LATER,
};
use psmr_model::App;
use std::net::SocketAddr;

pub use psmr_auth::Credentials;
use std::time::Duration;

pub mod order;
pub use order::{Deliver, InOrder, Offered, Round};
pub use psmr_tls::Connector;
use psmr_tls::Stream;
use thiserror::Error;
use tokio::time::Instant;
use tracing::debug;

/// Errors of the client.
#[derive(Debug, Error)]
pub enum ClientError {
    /// No replica address was given.
    #[error("no replica addresses given")]
    NoAddresses,
    /// The request did not complete in time.
    #[error("request not completed within {after:?} (last problem: {last})")]
    Timeout {
        /// The deadline.
        after: Duration,
        /// The last problem seen.
        last: String,
    },
    /// The cluster refused the whole request.
    #[error("refused by the cluster: {0}")]
    Refused(String),
    /// The cluster does not let this client do this: it has not
    /// authenticated, its credentials are wrong, or its user lacks the
    /// rights (`NOAUTH`, `WRONGPASS`, `NOPERM`).
    #[error("denied: {0}")]
    Denied(String),
    /// The cluster refused one command (e.g. an operation the service
    /// does not accept); the others of its request may have executed.
    #[error("command refused: {0}")]
    Rejected(String),
    /// A reply did not decode.
    #[error("bad reply: {0}")]
    Wire(#[from] WireError),
    /// The runtime of the blocking client cannot start.
    #[error("cannot start the client runtime: {0}")]
    Runtime(std::io::Error),
}

/// How a client behaves.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// Client addresses of the replicas.
    pub cluster: Vec<SocketAddr>,
    /// The client's id (random if `None`; 0 is reserved).
    pub id: Option<u64>,
    /// Longest wait for an answer from one replica.
    pub attempt_timeout: Duration,
    /// Longest time a request may go without a further outcome, retries
    /// included.
    pub deadline: Duration,
    /// Longest frame accepted from a replica.
    pub frame_max: usize,
    /// Who the client is (sent first on every connection); None: nobody,
    /// for replicas with `insecure_clients`.
    pub credentials: Option<Credentials>,
    /// TLS to the replicas' client ports (`[client_tls]`): the cluster's
    /// CA, and a user certificate if the client shows one; None: plain
    /// TCP.
    pub tls: Option<Connector>,
}

impl ClientConfig {
    /// Defaults for `cluster`: 1 s per attempt, 30 s per request.
    pub fn new(cluster: Vec<SocketAddr>) -> Self {
        Self {
            cluster,
            id: None,
            attempt_timeout: Duration::from_secs(1),
            deadline: Duration::from_secs(30),
            frame_max: FRAME_MAX_DEFAULT,
            credentials: None,
            tls: None,
        }
    }
}

/// How one exchange with one replica goes (the `..._of` calls of
/// [`AsyncClient`]): how long it may take, and who asks. A bare
/// [`Duration`] is an anonymous exchange.
#[derive(Clone, Debug, Default)]
pub struct Access {
    /// The whole exchange's time limit.
    pub timeout: Duration,
    /// Who asks (sent before the question); None: nobody.
    pub credentials: Option<Credentials>,
    /// TLS to the replica, if its client port is in TLS.
    pub tls: Option<Connector>,
}

impl From<Duration> for Access {
    fn from(timeout: Duration) -> Self {
        Self { timeout, credentials: None, tls: None }
    }
}

impl Access {
    /// `credentials` asking within `timeout`.
    pub fn new(timeout: Duration, credentials: Option<Credentials>) -> Self {
        Self { timeout, credentials, tls: None }
    }

    /// The same, in TLS with `tls` (None: plain TCP).
    pub fn with_tls(mut self, tls: Option<Connector>) -> Self {
        self.tls = tls;
        self
    }
}

/// Says who the client is on a fresh connection `s`, if it has
/// credentials; a refusal as [`ServerMsg::Denied`]'s text.
async fn authenticate(s: &mut Stream, who: Option<&Credentials>, max: usize) -> Result<(), Attempt> {
    let Some(who) = who else { return Ok(()) };
    let msg = ClientMsg::Auth { user: who.user().to_string(), password: who.password().to_string() };
    s.send(&msg.to_frame()).await.map_err(|e| Attempt::Retry(format!("send failed: {e}")))?;
    let f = read_frame_async(s, max).await.map_err(|e| Attempt::Retry(format!("receive failed: {e}")))?;
    match ServerMsg::from_frame(&f).map_err(|e| Attempt::Retry(format!("bad answer: {e}")))? {
        ServerMsg::Authenticated { .. } => Ok(()),
        ServerMsg::Denied(why) => Err(Attempt::Denied(why)),
        ServerMsg::Error(why) => Err(Attempt::Refused(why)),
        other => Err(Attempt::Retry(format!("unexpected answer to authentication: {other:?}"))),
    }
}

fn random_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(std::process::id() as u64);
    h.finish().max(1)
}

/// Where a front end's commands go: a cluster reached over the network
/// ([`Network`]), or the replica the front end runs in.
pub trait Submit: Send + Sync + 'static {
    /// One client of the cluster: an id of its own and its own sequence
    /// numbers (a Redis gateway opens one per connection).
    type Session: Session;

    /// A new session.
    fn session(&self) -> Result<Self::Session, ClientError>;
}

/// One client's way to the cluster. See [`Submit`].
pub trait Session: Send + 'static {
    /// The client id of the session.
    fn id(&self) -> u64;

    /// Orders and executes `ops` (encoded operations) as one request,
    /// handing each outcome to `to` in order as soon as it and all before
    /// it are in ([`order`]).
    fn submit<D: Deliver>(
        &mut self,
        ops: Vec<Vec<u8>>,
        to: &mut D,
    ) -> impl std::future::Future<Output = Result<(), ClientError>> + Send;

    /// Acts as `credentials` from now on. A session that reaches the
    /// cluster over the network authenticates as them (and the replica it
    /// reaches checks every request against their rights); a front end
    /// that submits inside a replica checks them itself, before it
    /// submits.
    fn identify(&mut self, credentials: Credentials);
}

/// A cluster reached over the network: each session is an
/// [`AsyncClient`] with this configuration (and an id of its own).
#[derive(Clone, Debug)]
pub struct Network(pub ClientConfig);

impl Submit for Network {
    type Session = AsyncClient;

    fn session(&self) -> Result<AsyncClient, ClientError> {
        AsyncClient::new(ClientConfig { id: None, ..self.0.clone() })
    }
}

impl Session for AsyncClient {
    fn id(&self) -> u64 {
        AsyncClient::id(self)
    }

    async fn submit<D: Deliver>(&mut self, ops: Vec<Vec<u8>>, to: &mut D) -> Result<(), ClientError> {
        let mut order = InOrder::new(self.reserve(ops.len()), ops.len());
        self.resume(&ops, &mut order, to).await
    }

    fn identify(&mut self, credentials: Credentials) {
        AsyncClient::identify(self, credentials);
    }
}

/// The asynchronous client. See the crate documentation.
pub struct AsyncClient {
    config: ClientConfig,
    id: u64,
    next_seq: u64,
    conn: Option<(SocketAddr, Stream)>,
    /// Where to try next.
    next_addr: usize,
    leader: Option<SocketAddr>,
    /// A replica that let an attempt go unanswered, and until when it is
    /// passed over. A paused or cut-off leader still accepts connections
    /// and its followers still name it until they elect another: without
    /// this, a client would spend another whole attempt on it.
    suspect: Option<(SocketAddr, Instant)>,
}

impl AsyncClient {
    /// A client for `config` (connects lazily).
    pub fn new(config: ClientConfig) -> Result<Self, ClientError> {
        if config.cluster.is_empty() {
            return Err(ClientError::NoAddresses);
        }
        let id = config.id.filter(|&i| i != 0).unwrap_or_else(random_id);
        Ok(Self { config, id, next_seq: 1, conn: None, next_addr: 0, leader: None, suspect: None })
    }

    /// The client's id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The replica to try: the leader last named, else the next in turn;
    /// never the suspect while it is one, unless it is the only replica.
    fn pick(&mut self) -> SocketAddr {
        let now = Instant::now();
        let suspect = self.suspect.filter(|&(_, until)| now < until).map(|(a, _)| a);
        if let Some(l) = self.leader.take().filter(|&l| Some(l) != suspect) {
            return l;
        }
        let n = self.config.cluster.len();
        let mut a = self.config.cluster[self.next_addr % n];
        for _ in 0..n {
            a = self.config.cluster[self.next_addr % n];
            self.next_addr += 1;
            if Some(a) != suspect {
                break;
            }
        }
        a
    }

    /// The connection to the replica to ask, made (and authenticated)
    /// if there is none.
    async fn connection(&mut self) -> Result<&mut Stream, Attempt> {
        if self.conn.is_none() {
            let addr = self.pick();
            let timeout = self.config.attempt_timeout;
            let (who, max) = (self.config.credentials.as_ref(), self.config.frame_max);
            let tls = self.config.tls.as_ref();
            let open = async {
                let mut stream = Connector::dial(tls, addr)
                    .await
                    .map_err(|e| Attempt::Retry(format!("cannot connect to {addr}: {e}")))?;
                authenticate(&mut stream, who, max).await?;
                Ok(stream)
            };
            let stream = tokio::time::timeout(timeout, open)
                .await
                .map_err(|_| Attempt::Silent(format!("connecting to {addr} took more than {timeout:?}")))??;
            self.conn = Some((addr, stream));
        }
        Ok(&mut self.conn.as_mut().expect("just connected").1)
    }

    /// Acts as `credentials` from the next connection on (the current one,
    /// if any, is closed).
    pub fn identify(&mut self, credentials: Credentials) {
        self.config.credentials = Some(credentials);
        self.conn = None;
    }

    /// Orders and executes `ops` (encoded operations) as one request;
    /// returns their outcomes in order.
    pub async fn submit(&mut self, ops: Vec<Vec<u8>>) -> Result<Vec<Outcome>, ClientError> {
        let mut outcomes = Vec::with_capacity(ops.len());
        Session::submit(self, ops, &mut outcomes).await?;
        Ok(outcomes)
    }

    /// Takes the next `n` sequence numbers for a request this client's
    /// session sends another way (a front end inside a replica queues it
    /// there); the first. Finish it with [`AsyncClient::resume`] if that
    /// way fails.
    pub fn reserve(&mut self, n: usize) -> u64 {
        let first = self.next_seq;
        self.next_seq += n as u64;
        first
    }

    /// Finishes the request of `ops` (commands `order.first()..`, reserved
    /// with [`AsyncClient::reserve`]) over the network, asking for the
    /// commands whose outcomes `order` misses, until every one is
    /// delivered to `to`; every replica's reply cache answers a command
    /// that already executed with its outcome, so none executes twice.
    pub async fn resume<D: Deliver>(
        &mut self,
        ops: &[Vec<u8>],
        order: &mut InOrder,
        to: &mut D,
    ) -> Result<(), ClientError> {
        let mut start = Instant::now();
        let mut last = String::from("none");
        let mut delivered = order.delivered();
        while !order.done() {
            if order.delivered() > delivered {
                // The deadline bounds a wait for the cluster, not the time
                // `to` takes over what it was given.
                (start, delivered) = (Instant::now(), order.delivered());
            }
            if start.elapsed() >= self.config.deadline {
                return Err(ClientError::Timeout { after: self.config.deadline, last });
            }
            let first = order.first();
            let pending: Vec<WireCommand> =
                order.to_ask().into_iter().map(|i| WireCommand { seq: first + i as u64, op: ops[i].clone() }).collect();
            let mut round = Round::new(pending.len());
            let result = self.attempt(pending, order, to, &mut round).await;
            if matches!(result, Ok(()) | Err(Attempt::Partial(_))) {
                order.asked(round.kept(), result.is_ok());
            }
            match result {
                Ok(()) => {}
                Err(Attempt::Refused(m)) => return Err(ClientError::Refused(m)),
                Err(Attempt::Denied(m)) => return Err(ClientError::Denied(m)),
                Err(Attempt::Partial(why)) => {
                    debug!(client = self.id, "asking again: {why}");
                    last = why;
                    // Over a new connection: replies to the old one may
                    // still be on their way.
                    self.leader = self.conn.take().map(|(addr, _)| addr);
                }
                Err(Attempt::Retry(why)) => {
                    debug!(client = self.id, "retrying: {why}");
                    last = why;
                    self.conn = None;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(Attempt::Silent(why)) => {
                    debug!(client = self.id, "retrying elsewhere: {why}");
                    last = why;
                    if let Some((addr, _)) = self.conn.take() {
                        self.suspect = Some((addr, Instant::now() + self.config.attempt_timeout));
                    }
                }
            }
        }
        Ok(())
    }

    /// Sends `pending` once and takes replies until each of them was
    /// answered (delivered, held or forgotten by `order`), counted in
    /// `round`.
    async fn attempt<D: Deliver>(
        &mut self,
        pending: Vec<WireCommand>,
        order: &mut InOrder,
        to: &mut D,
        round: &mut Round,
    ) -> Result<(), Attempt> {
        let (id, timeout, max) = (self.id, self.config.attempt_timeout, self.config.frame_max);
        let frame = ClientMsg::Request { client: id, commands: pending }.to_frame();
        let stream = self.connection().await?;
        stream.send(&frame).await.map_err(|e| Attempt::Retry(format!("send failed: {e}")))?;
        drop(frame);
        while round.unanswered() > 0 {
            let f = tokio::time::timeout(timeout, read_frame_async(stream, max))
                .await
                .map_err(|_| {
                    let why = format!("no answer within {timeout:?}");
                    // A replica that answered part of the request lives: the
                    // rest was dropped (its outbox for us was full while we
                    // delivered slowly). Ask it again rather than pass it over.
                    let (unanswered, asked) = (round.unanswered(), round.asked());
                    if unanswered < asked {
                        Attempt::Partial(format!("{why} to {unanswered} of {asked} commands"))
                    } else {
                        Attempt::Silent(why)
                    }
                })?
                .map_err(|e| Attempt::Retry(format!("receive failed: {e}")))?;
            match ServerMsg::from_frame(&f).map_err(|e| Attempt::Retry(e.to_string()))? {
                ServerMsg::Replies { client, replies } if client == id => {
                    drop(f);
                    for (seq, outcome) in replies {
                        round.take(order, seq, outcome, to);
                    }
                    // Delivering may wait for a slow receiver; meanwhile
                    // this socket is not read, and the replica's bounded
                    // outbox for it takes the back-pressure.
                    order.flush(to).await;
                }
                ServerMsg::Replies { .. }
                | ServerMsg::Status(_)
                | ServerMsg::Stats { .. }
                | ServerMsg::Metrics(_)
                | ServerMsg::Members(_)
                | ServerMsg::Reconfigured { .. }
                | ServerMsg::Authenticated { .. }
                | ServerMsg::SnapshotChunk { .. } => {}
                ServerMsg::Redirect { leader, addr } => {
                    self.leader = addr.parse().ok();
                    return Err(Attempt::Retry(if leader == 0 {
                        "no leader elected yet".into()
                    } else {
                        format!("redirected to leader {leader} at {addr}")
                    }));
                }
                ServerMsg::Error(m) => return Err(Attempt::Refused(m)),
                ServerMsg::Denied(m) => return Err(Attempt::Denied(m)),
            }
        }
        Ok(())
    }

    /// Encodes `ops` with `codec`, submits them as one request and decodes
    /// the replies: per command, the reply or the reason it was refused.
    pub async fn call<C: OpCodec>(
        &mut self,
        codec: &C,
        ops: &[C::Op],
    ) -> Result<Vec<Result<C::Reply, String>>, ClientError> {
        let outcomes = self.submit(ops.iter().map(|o| codec.encode_op(o)).collect()).await?;
        outcomes
            .into_iter()
            .map(|o| match o {
                Outcome::Ok(b) => Ok(codec.decode_reply(&b).map_err(|e| e.to_string())),
                Outcome::Rejected(m) => Ok(Err(m)),
            })
            .collect()
    }

    /// Asks one replica for its status.
    pub async fn status_of(addr: SocketAddr, access: impl Into<Access>) -> Result<ReplicaStatus, String> {
        match Self::ask(addr, ClientMsg::Status, access).await? {
            ServerMsg::Status(st) => Ok(st),
            other => Err(format!("unexpected answer {other:?}")),
        }
    }

    /// Asks one replica how busy its threads are: a clock reading in ns,
    /// the threads' counters and the execution workers' (see
    /// [`ServerMsg::Stats`]).
    pub async fn stats_of(addr: SocketAddr, access: impl Into<Access>) -> Result<ReplicaStats, String> {
        match Self::ask(addr, ClientMsg::Stats, access).await? {
            ServerMsg::Stats { at_ns, threads, workers, scheduler, decision } => {
                Ok(ReplicaStats { at_ns, threads, workers, scheduler, decision })
            }
            other => Err(format!("unexpected answer {other:?}")),
        }
    }

    /// Asks one replica for its metrics: the OpenMetrics text its
    /// Prometheus endpoint serves (`psmr_replica::metrics::Scrape` reads
    /// it).
    pub async fn metrics_of(addr: SocketAddr, access: impl Into<Access>) -> Result<String, String> {
        match Self::ask(addr, ClientMsg::Metrics, access).await? {
            ServerMsg::Metrics(text) => Ok(text),
            other => Err(format!("unexpected answer {other:?}")),
        }
    }

    /// Saves the newest snapshot the replica at `addr` keeps into `out`,
    /// chunk by chunk over one connection, each chunk within `timeout`;
    /// the bytes saved. The replica sends its snapshot file as it is (a
    /// stream of checksummed pieces, `psmr_core::snapfile`): check what
    /// was saved by reading it back. A newer snapshot that replaced the
    /// file meanwhile is an error: save again.
    pub async fn save_snapshot_of(
        addr: SocketAddr,
        out: &mut (dyn std::io::Write + Send),
        access: impl Into<Access>,
    ) -> Result<u64, String> {
        let access = access.into();
        let timeout = access.timeout;
        let within = |what: &'static str| move |_| format!("{what}: no answer within {timeout:?}");
        let connect = tokio::time::timeout(timeout, Self::open(addr, &access)).await.map_err(within("connect"))?;
        let mut s = connect?;
        let (mut id, mut offset) = (Vec::new(), 0u64);
        loop {
            let msg = ClientMsg::Snapshot { id: id.clone(), offset };
            let step = async {
                s.send(&msg.to_frame()).await.map_err(|e| format!("send failed: {e}"))?;
                let f =
                    read_frame_async(&mut s, FRAME_MAX_DEFAULT).await.map_err(|e| format!("receive failed: {e}"))?;
                ServerMsg::from_frame(&f).map_err(|e| format!("bad answer: {e}"))
            };
            let (got, at, total, data) =
                match tokio::time::timeout(timeout, step).await.map_err(within("a chunk"))?? {
                    ServerMsg::SnapshotChunk { id, offset, total, data } => (id, offset, total, data),
                    ServerMsg::Error(e) => return Err(e),
                    other => return Err(format!("unexpected answer {other:?}")),
                };
            if at != offset || (!id.is_empty() && got != id) || (data.is_empty() && offset < total) {
                return Err(format!("a chunk of {} bytes at {at} of {total}, asked for {offset}", data.len()));
            }
            out.write_all(&data).map_err(|e| format!("cannot write the snapshot: {e}"))?;
            (id, offset) = (got, offset + data.len() as u64);
            if offset >= total {
                return Ok(offset);
            }
        }
    }

    /// Asks one replica for the cluster's members as it knows them (its
    /// latest membership, committed or not), by id. A replica that does
    /// not answer this itself (e.g. one that redirects to the leader) is an
    /// error naming what it answered.
    pub async fn members_of(addr: SocketAddr, access: impl Into<Access>) -> Result<Vec<MemberInfo>, String> {
        match Self::ask(addr, ClientMsg::Members, access).await? {
            ServerMsg::Members(members) => Ok(members),
            ServerMsg::Redirect { leader: 0, .. } => Err("no answer here, and no leader known".into()),
            ServerMsg::Redirect { leader, addr } => Err(format!("no answer here: ask leader {leader} at {addr}")),
            other => Err(format!("unexpected answer {other:?}")),
        }
    }

    /// Has the replica at `addr` switch its execution scheduler to
    /// `scheduler` with `workers` workers (and, for early schedulers, the
    /// mapping spec `mapping`; empty: its default) between two log
    /// entries. Returns what runs now and how long execution stalled.
    pub async fn reconfigure_of(
        addr: SocketAddr,
        change: Reconfiguration,
        access: impl Into<Access>,
    ) -> Result<Reconfigured, String> {
        let Reconfiguration { scheduler, workers, mapping } = change;
        match Self::ask(addr, ClientMsg::Reconfigure { scheduler, workers, mapping }, access).await? {
            ServerMsg::Reconfigured { scheduler, workers, stall_ns } => {
                Ok(Reconfigured { scheduler, workers, stall: Duration::from_nanos(stall_ns) })
            }
            other => Err(format!("unexpected answer {other:?}")),
        }
    }

    /// Adds or removes a replica, and returns the members once the change
    /// is in effect (for an addition: once the new replica has caught up
    /// and votes), which can take tens of seconds.
    ///
    /// The change goes to the replicas of `cluster` in turn, following
    /// redirects to the leader (a replica that knows no leader sends it on
    /// to the next replica of the list). An answer that the change may
    /// succeed later (an error starting with [`RETRY_LATER`]), a connection
    /// that fails and an attempt that hears nothing are retried after a
    /// backoff (50 ms, doubling up to 1 s); any other error is final and
    /// returned as the replica sent it. Every attempt, and the whole call,
    /// ends by `deadline`; the error then says what the last attempt got.
    ///
    /// An attempt cut short (connection lost, deadline) may still take
    /// effect later: [`AsyncClient::members_of`] tells.
    pub async fn change_membership(
        cluster: &[SocketAddr],
        change: MemberChange,
        deadline: impl Into<Access>,
    ) -> Result<Vec<MemberInfo>, String> {
        let access = deadline.into();
        let deadline = access.timeout;
        if cluster.is_empty() {
            return Err(ClientError::NoAddresses.to_string());
        }
        let end = Instant::now() + deadline;
        let msg = ClientMsg::ChangeMembership(change);
        let mut next = 0;
        let mut leader: Option<SocketAddr> = None;
        let mut backoff = CHANGE_BACKOFF_MIN;
        // Redirects followed since the last pause: past one per replica,
        // the cluster is between leaders (or its answers disagree), so
        // wait as after a failure instead of going round at once.
        let mut hops = 0;
        let mut last = String::from("no attempt");
        loop {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(format!("membership change not in effect within {deadline:?} (last attempt: {last})"));
            }
            let addr = leader.take().unwrap_or_else(|| {
                next += 1;
                cluster[(next - 1) % cluster.len()]
            });
            let within = Access { timeout: left, ..access.clone() };
            let pause = match Self::exchange(addr, &msg, within).await {
                Ok(ServerMsg::Members(members)) => return Ok(members),
                Ok(ServerMsg::Redirect { leader: id, addr: to }) => {
                    match to.parse::<SocketAddr>() {
                        Ok(to_addr) if id != 0 => {
                            last = format!("{addr}: redirected to leader {id} at {to}");
                            leader = Some(to_addr);
                        }
                        _ if id != 0 => last = format!("{addr}: redirected to leader {id} at unusable address {to:?}"),
                        _ => last = format!("{addr}: no leader known"),
                    }
                    hops += 1;
                    hops > cluster.len()
                }
                Ok(ServerMsg::Error(m)) if m.starts_with(RETRY_LATER) => {
                    last = format!("{addr}: {m}");
                    // The replica that said so is worth asking again.
                    leader = Some(addr);
                    true
                }
                Ok(ServerMsg::Error(m)) => return Err(m),
                Ok(ServerMsg::Denied(m)) => return Err(format!("denied: {m}")),
                Ok(other) => return Err(format!("{addr}: unexpected answer {other:?}")),
                Err(e) => {
                    last = format!("{addr}: {e}");
                    true
                }
            };
            debug!("membership change: {last}");
            if pause {
                hops = 0;
                tokio::time::sleep(backoff.min(end.saturating_duration_since(Instant::now()))).await;
                backoff = (backoff * 2).min(CHANGE_BACKOFF_MAX);
            }
        }
    }

    /// Sends `msg` to the replica at `addr` (as `access` says who asks)
    /// and reads its answer, all within `access.timeout`; the replica's
    /// error is an answer, not an `Err`.
    async fn exchange(addr: SocketAddr, msg: &ClientMsg, access: Access) -> Result<ServerMsg, String> {
        let timeout = access.timeout;
        let work = async {
            let mut s = Self::open(addr, &access).await?;
            s.send(&msg.to_frame()).await.map_err(|e| format!("send failed: {e}"))?;
            let f = read_frame_async(&mut s, FRAME_MAX_DEFAULT).await.map_err(|e| format!("receive failed: {e}"))?;
            ServerMsg::from_frame(&f).map_err(|e| format!("bad answer: {e}"))
        };
        tokio::time::timeout(timeout, work).await.map_err(|_| format!("no answer within {timeout:?}"))?
    }

    /// A connection to `addr`, authenticated as `access` says.
    async fn open(addr: SocketAddr, access: &Access) -> Result<Stream, String> {
        let mut s = Connector::dial(access.tls.as_ref(), addr).await.map_err(|e| format!("cannot connect: {e}"))?;
        authenticate(&mut s, access.credentials.as_ref(), FRAME_MAX_DEFAULT).await.map_err(Attempt::into_text)?;
        Ok(s)
    }

    async fn ask(addr: SocketAddr, msg: ClientMsg, access: impl Into<Access>) -> Result<ServerMsg, String> {
        match Self::exchange(addr, &msg, access.into()).await? {
            ServerMsg::Error(e) => Err(e),
            ServerMsg::Denied(e) => Err(format!("denied: {e}")),
            other => Ok(other),
        }
    }
}

/// First pause of [`AsyncClient::change_membership`] before it tries again.
const CHANGE_BACKOFF_MIN: Duration = Duration::from_millis(50);
/// Longest such pause.
const CHANGE_BACKOFF_MAX: Duration = Duration::from_secs(1);

enum Attempt {
    /// Try again after a pause (a redirect, a lost connection).
    Retry(String),
    /// No answer within the attempt's time: try another replica at once.
    Silent(String),
    /// Part of the request answered, then silence: the replica dropped the
    /// rest (its outbox for us was full). Ask it again at once, for fewer.
    Partial(String),
    /// The cluster refused the request.
    Refused(String),
    /// The client may not do this (final: every replica says the same).
    Denied(String),
}

impl Attempt {
    /// What went wrong, as one line.
    fn into_text(self) -> String {
        match self {
            Attempt::Retry(m) | Attempt::Silent(m) | Attempt::Partial(m) | Attempt::Refused(m) => m,
            Attempt::Denied(m) => format!("denied: {m}"),
        }
    }
}

/// The execution scheduler a replica is asked to switch to
/// ([`AsyncClient::reconfigure_of`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reconfiguration {
    /// A scheduler name (`psmr_sched::SchedulerKind`).
    pub scheduler: String,
    /// Worker threads.
    pub workers: u32,
    /// A mapping spec for early schedulers; empty: the replica's default.
    pub mapping: String,
}

/// What a replica runs after a reconfiguration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reconfigured {
    /// The scheduler.
    pub scheduler: String,
    /// Its workers.
    pub workers: u32,
    /// How long execution stalled while the old scheduler drained.
    pub stall: Duration,
}

/// One replica's answer to a stats request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaStats {
    /// Clock reading, ns since the replica started.
    pub at_ns: u64,
    /// Every thread's CPU counters.
    pub threads: Vec<ThreadStat>,
    /// Every execution worker's counters (early schedulers; else empty).
    pub workers: Vec<WorkerSample>,
    /// The execution scheduler running, as `status` names it.
    pub scheduler: String,
    /// `auto`'s last decision and its reason; empty if none.
    pub decision: String,
}

/// The blocking client: [`AsyncClient`] on a private runtime.
pub struct Client {
    rt: tokio::runtime::Runtime,
    inner: AsyncClient,
}

impl Client {
    /// A client for `config`.
    pub fn new(config: ClientConfig) -> Result<Self, ClientError> {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(ClientError::Runtime)?;
        Ok(Self { rt, inner: AsyncClient::new(config)? })
    }

    /// The client's id.
    pub fn id(&self) -> u64 {
        self.inner.id()
    }

    /// See [`AsyncClient::submit`].
    pub fn submit(&mut self, ops: Vec<Vec<u8>>) -> Result<Vec<Outcome>, ClientError> {
        self.rt.block_on(self.inner.submit(ops))
    }

    /// See [`AsyncClient::call`].
    pub fn call<C: OpCodec>(&mut self, codec: &C, ops: &[C::Op]) -> Result<Vec<Result<C::Reply, String>>, ClientError> {
        self.rt.block_on(self.inner.call(codec, ops))
    }

    /// See [`AsyncClient::status_of`].
    pub fn status_of(&self, addr: SocketAddr, access: impl Into<Access>) -> Result<ReplicaStatus, String> {
        self.rt.block_on(AsyncClient::status_of(addr, access))
    }

    /// See [`AsyncClient::stats_of`].
    pub fn stats_of(&self, addr: SocketAddr, access: impl Into<Access>) -> Result<ReplicaStats, String> {
        self.rt.block_on(AsyncClient::stats_of(addr, access))
    }

    /// See [`AsyncClient::metrics_of`].
    pub fn metrics_of(&self, addr: SocketAddr, access: impl Into<Access>) -> Result<String, String> {
        self.rt.block_on(AsyncClient::metrics_of(addr, access))
    }

    /// See [`AsyncClient::reconfigure_of`].
    pub fn reconfigure_of(
        &self,
        addr: SocketAddr,
        change: Reconfiguration,
        access: impl Into<Access>,
    ) -> Result<Reconfigured, String> {
        self.rt.block_on(AsyncClient::reconfigure_of(addr, change, access))
    }

    /// See [`AsyncClient::save_snapshot_of`].
    pub fn save_snapshot_of(
        &self,
        addr: SocketAddr,
        out: &mut (dyn std::io::Write + Send),
        access: impl Into<Access>,
    ) -> Result<u64, String> {
        self.rt.block_on(AsyncClient::save_snapshot_of(addr, out, access))
    }

    /// See [`AsyncClient::members_of`].
    pub fn members_of(&self, addr: SocketAddr, access: impl Into<Access>) -> Result<Vec<MemberInfo>, String> {
        self.rt.block_on(AsyncClient::members_of(addr, access))
    }

    /// See [`AsyncClient::change_membership`].
    pub fn change_membership(
        &self,
        cluster: &[SocketAddr],
        change: MemberChange,
        deadline: impl Into<Access>,
    ) -> Result<Vec<MemberInfo>, String> {
        self.rt.block_on(AsyncClient::change_membership(cluster, change, deadline))
    }
}

/// A blocking client for one service: typed operations in, typed replies
/// out, through the service's codec.
///
/// ```no_run
/// # use psmr_model::wire::OpCodec;
/// # fn demo<C: OpCodec>(codec: C, op: C::Op) -> Result<(), psmr_client::ClientError> {
/// let mut client = psmr_client::ServiceClient::connect(vec!["127.0.0.1:7001".parse().unwrap()], codec)?;
/// let reply = client.call(op)?;
/// # Ok(()) }
/// ```
pub struct ServiceClient<C: OpCodec> {
    client: Client,
    codec: C,
}

impl<C: OpCodec> ServiceClient<C> {
    /// A client of the cluster whose replicas serve clients at `cluster`,
    /// with the default timeouts.
    pub fn connect(cluster: Vec<SocketAddr>, codec: C) -> Result<Self, ClientError> {
        Self::with_config(ClientConfig::new(cluster), codec)
    }

    /// A client of a cluster running `A`, with `A`'s codec.
    pub fn for_app<A: App<Codec = C>>(cluster: Vec<SocketAddr>) -> Result<Self, ClientError>
    where
        C: Default,
    {
        Self::connect(cluster, C::default())
    }

    /// A client configured by `config`.
    pub fn with_config(config: ClientConfig, codec: C) -> Result<Self, ClientError> {
        Ok(Self { client: Client::new(config)?, codec })
    }

    /// Executes one operation and returns its reply.
    pub fn call(&mut self, op: C::Op) -> Result<C::Reply, ClientError> {
        let mut replies = self.client.call(&self.codec, std::slice::from_ref(&op))?;
        match replies.pop() {
            Some(reply) => reply.map_err(ClientError::Rejected),
            None => Err(ClientError::Refused("no reply to the command".into())),
        }
    }

    /// Executes `ops` as one request (one client batch, one trip to the
    /// cluster): per operation, its reply or why it was refused.
    pub fn call_all(&mut self, ops: &[C::Op]) -> Result<Vec<Result<C::Reply, String>>, ClientError> {
        self.client.call(&self.codec, ops)
    }

    /// The underlying untyped client.
    pub fn inner(&mut self) -> &mut Client {
        &mut self.client
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[test]
    fn bad_configurations_and_unreachable_clusters_are_clear_errors() {
        assert!(matches!(Client::new(ClientConfig::new(vec![])), Err(ClientError::NoAddresses)));
        let mut cfg = ClientConfig::new(vec!["127.0.0.1:1".parse().unwrap()]);
        cfg.id = Some(0);
        cfg.attempt_timeout = Duration::from_millis(50);
        cfg.deadline = Duration::from_millis(200);
        let mut c = Client::new(cfg).unwrap();
        assert_ne!(c.id(), 0, "id 0 is reserved");
        let e = c.submit(vec![vec![1]]).unwrap_err().to_string();
        assert!(e.contains("not completed within") && e.contains("127.0.0.1:1"), "{e}");
    }

    /// A fake replica: answers the connections it accepts, one message
    /// each, with `answers` in order, then stops listening; returns what
    /// it was sent.
    async fn fake_replica(answers: Vec<ServerMsg>) -> (SocketAddr, tokio::task::JoinHandle<Vec<ClientMsg>>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let mut got = Vec::new();
            for answer in answers {
                let (mut s, _) = listener.accept().await.unwrap();
                let f = read_frame_async(&mut s, FRAME_MAX_DEFAULT).await.unwrap();
                got.push(ClientMsg::from_frame(&f).unwrap());
                s.write_all(&answer.to_frame()).await.unwrap();
            }
            got
        });
        (addr, task)
    }

    fn members() -> Vec<MemberInfo> {
        vec![
            MemberInfo { id: 1, client: "127.0.0.1:7001".into(), peer: "127.0.0.1:8001".into(), voter: true },
            MemberInfo { id: 4, client: "127.0.0.1:7004".into(), peer: "127.0.0.1:8004".into(), voter: true },
        ]
    }

    fn add4() -> MemberChange {
        MemberChange::Add { id: 4, client: "127.0.0.1:7004".into(), peer: "127.0.0.1:8004".into() }
    }

    #[tokio::test]
    async fn change_membership_finds_the_leader_and_waits_out_retry_later() {
        // The leader first says to come back, then answers.
        let (leader, leader_got) = fake_replica(vec![
            ServerMsg::Error(format!("{RETRY_LATER}replica 4 is catching up")),
            ServerMsg::Members(members()),
        ])
        .await;
        // The first replica of the list knows no leader; the second names it.
        let (lost, lost_got) = fake_replica(vec![ServerMsg::Redirect { leader: 0, addr: String::new() }]).await;
        let (follower, follower_got) =
            fake_replica(vec![ServerMsg::Redirect { leader: 2, addr: leader.to_string() }]).await;
        let start = Instant::now();
        let got = AsyncClient::change_membership(&[lost, follower], add4(), Duration::from_secs(20)).await;
        assert_eq!(got, Ok(members()));
        assert!(start.elapsed() >= CHANGE_BACKOFF_MIN, "retried without a pause");
        let sent = ClientMsg::ChangeMembership(add4());
        assert_eq!(lost_got.await.unwrap(), vec![sent.clone()]);
        assert_eq!(follower_got.await.unwrap(), vec![sent.clone()]);
        assert_eq!(leader_got.await.unwrap(), vec![sent.clone(), sent]);
    }

    #[tokio::test]
    async fn a_final_error_is_returned_at_once_as_sent() {
        let refusal = "replica 4 is already a member";
        let (addr, got) = fake_replica(vec![ServerMsg::Error(refusal.into())]).await;
        let start = Instant::now();
        let r = AsyncClient::change_membership(&[addr], MemberChange::Remove { id: 4 }, Duration::from_secs(20)).await;
        assert_eq!(r, Err(refusal.to_string()));
        assert!(start.elapsed() < Duration::from_secs(5), "took {:?}", start.elapsed());
        assert_eq!(got.await.unwrap(), vec![ClientMsg::ChangeMembership(MemberChange::Remove { id: 4 })]);
    }

    /// A replica that accepts connections and reads, and never answers;
    /// counts the connections.
    async fn silent_replica() -> (SocketAddr, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let count = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = count.clone();
        tokio::spawn(async move {
            let mut conns = Vec::new();
            while let Ok((s, _)) = listener.accept().await {
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                conns.push(s);
            }
        });
        (addr, count)
    }

    #[tokio::test]
    async fn a_replica_that_went_silent_is_passed_over_even_when_a_follower_names_it() {
        // The leader went silent; its follower still names it once (no
        // election yet), then answers as the new leader.
        let (old, old_conns) = silent_replica().await;
        let reply = ServerMsg::Replies { client: 7, replies: vec![(1, Outcome::Ok(b"ok".to_vec()))] };
        let (new, new_got) = fake_replica(vec![ServerMsg::Redirect { leader: 1, addr: old.to_string() }, reply]).await;
        let mut cfg = ClientConfig::new(vec![old, new]);
        cfg.id = Some(7);
        cfg.attempt_timeout = Duration::from_millis(300);
        let mut client = AsyncClient::new(cfg).unwrap();
        let got = client.submit(vec![b"op".to_vec()]).await.unwrap();
        assert_eq!(got, vec![Outcome::Ok(b"ok".to_vec())]);
        assert_eq!(old_conns.load(std::sync::atomic::Ordering::SeqCst), 1, "the silent one tried once");
        assert_eq!(new_got.await.unwrap().len(), 2);
    }

    #[tokio::test]
    async fn the_deadline_bounds_each_attempt_and_names_the_last_problem() {
        // A replica that accepts and never answers: one attempt would wait
        // forever if the deadline did not bound it.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let silent = listener.local_addr().unwrap();
        let _keep = tokio::spawn(async move {
            let mut conns = Vec::new();
            loop {
                conns.push(listener.accept().await.unwrap());
            }
        });
        let deadline = Duration::from_millis(300);
        let start = Instant::now();
        let e = AsyncClient::change_membership(&[silent], add4(), deadline).await.unwrap_err();
        assert!(start.elapsed() >= deadline && start.elapsed() < Duration::from_secs(5), "{:?}", start.elapsed());
        assert!(e.contains("not in effect within 300ms") && e.contains(&silent.to_string()), "{e}");
        assert!(e.contains("no answer within"), "{e}");
        // Nobody listening: retried with pauses, then the connection error.
        let start = Instant::now();
        let e = AsyncClient::change_membership(&["127.0.0.1:1".parse().unwrap()], add4(), deadline).await.unwrap_err();
        assert!(start.elapsed() >= deadline && start.elapsed() < Duration::from_secs(5), "{:?}", start.elapsed());
        assert!(e.contains("127.0.0.1:1: cannot connect"), "{e}");
        assert!(AsyncClient::change_membership(&[], add4(), deadline).await.unwrap_err().contains("no replica"));
    }

    #[tokio::test]
    async fn members_of_returns_the_members_or_says_why_not() {
        let (addr, got) = fake_replica(vec![
            ServerMsg::Members(members()),
            ServerMsg::Redirect { leader: 3, addr: "127.0.0.1:7003".into() },
            ServerMsg::Error("shutting down".into()),
        ])
        .await;
        let t = Duration::from_secs(5);
        assert_eq!(AsyncClient::members_of(addr, t).await, Ok(members()));
        let e = AsyncClient::members_of(addr, t).await.unwrap_err();
        assert!(e.contains("leader 3 at 127.0.0.1:7003"), "{e}");
        assert_eq!(AsyncClient::members_of(addr, t).await, Err("shutting down".into()));
        assert_eq!(got.await.unwrap(), vec![ClientMsg::Members; 3]);
    }

    #[test]
    fn the_blocking_client_changes_membership_too() {
        // A fake replica on a thread of its own, as the blocking client
        // runs its own runtime.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let mut got = Vec::new();
            for answer in [ServerMsg::Members(members()), ServerMsg::Members(members())] {
                let (mut s, _) = listener.accept().unwrap();
                let f = psmr_model::wire::read_frame(&mut s, FRAME_MAX_DEFAULT).unwrap();
                got.push(ClientMsg::from_frame(&f).unwrap());
                std::io::Write::write_all(&mut s, &answer.to_frame()).unwrap();
            }
            got
        });
        let c = Client::new(ClientConfig::new(vec![addr])).unwrap();
        assert_eq!(c.change_membership(&[addr], add4(), Duration::from_secs(20)), Ok(members()));
        assert_eq!(c.members_of(addr, Duration::from_secs(5)), Ok(members()));
        assert_eq!(server.join().unwrap(), vec![ClientMsg::ChangeMembership(add4()), ClientMsg::Members]);
    }
}
