//! # psmr-gateway: the Redis port of a replica
//!
//! A replica whose member has a `redis` address, and whose application
//! maps Redis commands onto its operations ([`psmr_resp::Commands`]),
//! serves RESP2 (and RESP3 after `HELLO 3`) there.
//!
//! Every replica's Redis port accepts every command, so `redis-cli` and
//! `redis-benchmark` work against any of them: the port is a *gateway*, a
//! client of the cluster. It submits commands through a
//! [`psmr_client::Submit`], one [`psmr_client::Session`] per Redis
//! connection, and depends on nothing else of the replica: over the
//! network ([`psmr_client::Network`]) a session finds the leader and
//! follows it, retries with the same sequence numbers after a leader
//! change (the reply cache executes each command once), and so forwards
//! from a follower. A follower does not answer `-MOVED`: plain Redis
//! clients do not follow it.
//!
//! A pipeline becomes client batches: the requests that have arrived are
//! taken together, up to `batch_max_commands` and `batch_max_bytes`, and
//! submitted as one request, so a pipeline of N commands is one trip
//! through the log. Every command, reads included, is ordered by the log:
//! replies are linearizable. Connection commands (`PING`, `ECHO`,
//! `HELLO`, `SELECT 0`, `CLIENT`, `QUIT`, `COMMAND`, `INFO`, `CONFIG GET`,
//! `ACL WHOAMI`) are answered here, in their place among the replies;
//! `AUTH` waits for the replies before it (the `auth` module: who a
//! connection is, and the check of every command against its rights).
//!
//! Hostile input: requests are parsed within [`psmr_resp::Limits`] derived
//! from the configuration (an argument or a request over `frame_max` fails
//! as soon as it is declared); the bytes read and not yet submitted are
//! held against one budget of `client_buffer_bytes_max` for all
//! connections; a request must arrive whole within `frame_timeout_ms`; an
//! idle connection closes after `client_idle_timeout_ms`; at most
//! `max_connections` Redis connections are open. Replies are written as
//! their outcomes come, within bounded bytes (the `answers` module): a client
//! that reads slowly slows its own pipeline down and holds nothing more. A protocol error is
//! answered with Redis's `-ERR Protocol error: ...` and closes the
//! connection, as Redis does; an unknown command or wrong arity is a
//! `-ERR` reply and the connection lives on.
//!
//! In the guide: `docs/design.md` places this crate among the others;
//! `docs/redis.md`: the Redis port, command by command.

mod answers;
mod auth;
mod multi;
mod wait;
mod watch;

use answers::{Answers, Replier, Step};
pub use auth::{Auth, HandshakeFailed, Refused};
use bytes::{Bytes, BytesMut};
use psmr_auth::{Need, Principal};
use psmr_client::{Session, Submit};
use psmr_model::ratelog::RateLimit;
use psmr_model::wire::{OpCodec, Outcome};
use psmr_model::App;
use psmr_resp::{Commands, Limits, Reply, Request, RequestParser, Version};
use psmr_tls::Stream;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tracing::debug;

/// The commands the gateway answers itself, whatever the service: the
/// connection's, the transactions' and the tools' (`redis-cli`,
/// `redis-benchmark`, client libraries).
pub const CONNECTION_COMMANDS: [&str; 16] = [
    "AUTH", "HELLO", "QUIT", "PING", "ECHO", "SELECT", "CLIENT", "COMMAND", "CONFIG", "INFO", "ACL", "MULTI", "EXEC",
    "DISCARD", "WATCH", "UNWATCH",
];

/// Bytes read from a socket at a time (and held against the budget ahead
/// of a read).
const READ_CHUNK: usize = 16 * 1024;

static BAD_REDIS_CLIENT: RateLimit = RateLimit::new(10, Duration::from_secs(10));

/// The bounds of a gateway, from the replica's configuration.
#[derive(Clone, Copy, Debug)]
pub struct GatewayLimits {
    /// Redis connections open at once, at most (`max_connections`).
    pub max_connections: usize,
    /// Bytes read and not yet submitted, over all connections
    /// (`client_buffer_bytes_max`).
    pub buffered_max: usize,
    /// Longest argument or request (`frame_max`).
    pub frame_max: usize,
    /// Commands per submitted batch (`batch_max_commands`).
    pub batch_max_commands: usize,
    /// Bytes of operations per submitted batch (`batch_max_bytes`).
    pub batch_max_bytes: usize,
    /// An idle connection closes after this long (`client_idle_timeout_ms`).
    pub idle_timeout: Duration,
    /// A request must arrive whole within this long (`frame_timeout_ms`).
    pub frame_timeout: Duration,
}

/// What a gateway reports in `INFO` of the replica it runs in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Replica {
    /// Its id.
    pub id: u64,
    /// The leader it knows (0: none).
    pub leader: u64,
    /// It leads.
    pub is_leader: bool,
    /// Its term.
    pub term: u64,
    /// The last index it applied.
    pub applied: u64,
}

/// Reads [`Replica`] now.
pub type Info = Arc<dyn Fn() -> Replica + Send + Sync>;

/// Serves Redis clients for application `A`, whose Redis commands `C`
/// maps, submitting through `S`.
pub struct Gateway<A: App, C, S> {
    limits: GatewayLimits,
    submit: S,
    app: Arc<A>,
    commands: C,
    codec: A::Codec,
    info: Info,
    connections: Arc<Semaphore>,
    buffered: Arc<Semaphore>,
    /// Bytes of outcomes held ahead of their turn, over all connections
    /// (the `answers` module).
    held: Arc<Semaphore>,
    auth: Auth,
}

/// A pinned, boxed, sendable future of nothing.
pub type BoxFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A gateway with its types erased, so that a replica can hold one.
pub trait Serve: Send + Sync {
    /// Accepts and serves connections on `listener` until `stop`
    /// completes; `fail` is told if a connection task panics (the replica
    /// must stop).
    fn serve(self: Arc<Self>, listener: TcpListener, stop: Stop, fail: Fail) -> BoxFuture;
}

/// Completes when the replica stops (a fresh future each time).
pub type Stop = Arc<dyn Fn() -> BoxFuture + Send + Sync>;

/// Told why the replica must stop.
pub type Fail = Arc<dyn Fn(String) + Send + Sync>;

impl<A, C, S> Gateway<A, C, S>
where
    A: App,
    C: Commands<Op = A::Op, Reply = A::Reply>,
    S: Submit,
{
    /// A gateway within `limits`, for `app` whose Redis commands `commands`
    /// maps, submitting through `submit`, with `info` for `INFO`, serving
    /// the users of `auth`.
    pub fn new(limits: GatewayLimits, submit: S, app: Arc<A>, commands: C, info: Info, auth: Auth) -> Self {
        let connections = Arc::new(Semaphore::new(limits.max_connections.min(Semaphore::MAX_PERMITS)));
        let buffered = Arc::new(Semaphore::new(limits.buffered_max.min(Semaphore::MAX_PERMITS)));
        let held = Arc::new(Semaphore::new(limits.buffered_max.min(Semaphore::MAX_PERMITS)));
        let codec = A::Codec::default();
        Self { limits, submit, app, commands, codec, info, connections, buffered, held, auth }
    }

    async fn accept_loop(self: Arc<Self>, listener: TcpListener, stop: Stop, fail: Fail) {
        loop {
            let (mut stream, peer) = tokio::select! {
                r = listener.accept() => match r {
                    Ok(x) => x,
                    Err(e) => {
                        psmr_model::warn_limited!(BAD_REDIS_CLIENT, "redis accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                },
                _ = stop() => return,
            };
            let Ok(permit) = self.connections.clone().try_acquire_owned() else {
                let _ =
                    stream.write_all(&Reply::error("ERR max number of clients reached").to_bytes(Version::Resp2)).await;
                continue;
            };
            let (gateway, fail, stop) = (self.clone(), fail.clone(), stop.clone());
            tokio::spawn(async move {
                let task = tokio::spawn(gateway.connection(stream, peer, stop));
                if let Err(e) = task.await {
                    if e.is_panic() {
                        let why = psmr_sched::panic_message(e.into_panic().as_ref());
                        fail(format!("a Redis connection task panicked: {why}"));
                    }
                }
                drop(permit);
            });
        }
    }

    async fn connection(self: Arc<Self>, stream: TcpStream, peer: SocketAddr, stop: Stop) {
        let Some(stream) = self.auth.handshake(stream, peer).await else { return };
        match Connection::open(&self, stream, peer, stop) {
            Ok(mut conn) => match conn.run().await {
                Ok(()) => debug!(%peer, "redis client disconnected"),
                Err(why) => psmr_model::warn_limited!(BAD_REDIS_CLIENT, %peer, "closing redis connection: {why}"),
            },
            Err(why) => psmr_model::warn_limited!(BAD_REDIS_CLIENT, %peer, "redis connection: {why}"),
        }
    }

    fn parser_limits(&self) -> Limits {
        let frame_max = self.limits.frame_max;
        Limits { args_max: 1024 * 1024, bulk_max: frame_max, request_max: frame_max, ..Limits::default() }
    }
}

impl<A, C, S> Replier<A::Op> for Gateway<A, C, S>
where
    A: App,
    C: Commands<Op = A::Op, Reply = A::Reply>,
    S: Submit,
{
    fn reply(&self, op: &A::Op, outcome: Outcome) -> Reply {
        match outcome {
            Outcome::Ok(bytes) => match self.codec.decode_reply(&bytes) {
                Ok(reply) => self.commands.reply(op, reply),
                Err(e) => Reply::error(format!("ERR undecodable reply: {e}")),
            },
            Outcome::Rejected(why) => error_reply(&why),
        }
    }
}

impl<A, C, S> Serve for Gateway<A, C, S>
where
    A: App,
    C: Commands<Op = A::Op, Reply = A::Reply>,
    S: Submit,
{
    fn serve(self: Arc<Self>, listener: TcpListener, stop: Stop, fail: Fail) -> BoxFuture {
        Box::pin(self.accept_loop(listener, stop, fail))
    }
}

struct Connection<'g, A: App, C, S: Submit> {
    gateway: &'g Gateway<A, C, S>,
    stream: Stream,
    client: S::Session,
    /// Completes when the replica stops.
    stop: Stop,
    parser: RequestParser,
    buf: BytesMut,
    held: Option<OwnedSemaphorePermit>,
    /// A parsed operation that did not fit in the last batch.
    carried: Option<Step<A::Op>>,
    version: Version,
    name: Option<Bytes>,
    peer: SocketAddr,
    /// The user it acts as; None before it authenticates.
    who: Option<Principal>,
    /// The transaction queued since `MULTI`, if any.
    multi: Option<multi::Transaction<A::Op>>,
    /// The keys `WATCH`ed since the last `EXEC`, `DISCARD` or `UNWATCH`.
    watched: watch::Watched,
}

impl<'g, A, C, S> Connection<'g, A, C, S>
where
    A: App,
    C: Commands<Op = A::Op, Reply = A::Reply>,
    S: Submit,
{
    fn open(gateway: &'g Gateway<A, C, S>, stream: Stream, peer: SocketAddr, stop: Stop) -> Result<Self, String> {
        let client = gateway.submit.session().map_err(|e| e.to_string())?;
        Ok(Self {
            gateway,
            stream,
            client,
            stop,
            parser: RequestParser::new(gateway.parser_limits()),
            buf: BytesMut::with_capacity(READ_CHUNK),
            held: None,
            carried: None,
            version: Version::Resp2,
            name: None,
            peer,
            who: gateway.auth.gate.anonymous(),
            multi: None,
            watched: watch::Watched::default(),
        })
    }

    async fn run(&mut self) -> Result<(), String> {
        loop {
            let mut steps = Vec::new();
            // The requests before a protocol error are served, as Redis
            // serves them; then the error is said and the connection ends.
            let broken = self.parse_ready(&mut steps).err();
            let served = !steps.is_empty();
            if served && self.execute(steps).await? {
                return Ok(());
            }
            if let Some(reply) = broken {
                let why = reply_text(&reply);
                self.answer_now(&[reply]).await;
                return Err(why);
            }
            if served {
                continue;
            }
            if !self.read_more().await? {
                return Ok(());
            }
        }
    }

    /// Takes the complete requests buffered, up to one batch.
    fn parse_ready(&mut self, steps: &mut Vec<Step<C::Op>>) -> Result<(), Reply> {
        let limits = &self.gateway.limits;
        let (mut ops, mut bytes) = (0, 0);
        while ops < limits.batch_max_commands {
            let step = match self.carried.take() {
                Some(step) => step,
                None => match self.parser.next(&mut self.buf).map_err(Reply::from)? {
                    Some(request) => self.step(&request),
                    None => break,
                },
            };
            // The batch is submitted whole or refused whole: an operation
            // (or a transaction) that would take it past the byte limit
            // waits for the next one.
            let (n, b) = step.load();
            if n > 0 {
                if (bytes + b > limits.batch_max_bytes || ops + n > limits.batch_max_commands) && ops > 0 {
                    self.carried = Some(step);
                    break;
                }
                (ops, bytes) = (ops + n, bytes + b);
            }
            let step = match step {
                Step::Transaction(queued) => {
                    steps.push(Step::ArrayStart(queued.len()));
                    steps.extend(queued);
                    continue;
                }
                // A waiting command is a batch of its own: the commands
                // after it wait for it, as in Redis. So is a `WATCH`: the
                // commands after it need its versions.
                Step::Wait(..) | Step::Watch(..) if !steps.is_empty() => {
                    self.carried = Some(step);
                    break;
                }
                step @ (Step::Wait(..) | Step::Watch(..)) => {
                    steps.push(step);
                    break;
                }
                step => step,
            };
            let barrier = matches!(step, Step::Hello(..) | Step::Quit | Step::Auth(_));
            steps.push(step);
            if barrier {
                break;
            }
        }
        Ok(())
    }

    /// Reads more bytes, holding them against the shared budget: false
    /// when the client closed between requests, an error when it closed
    /// within one, went idle or sends a request too slowly.
    async fn read_more(&mut self) -> Result<bool, String> {
        let limits = self.gateway.limits;
        let want = self.buf.len() + READ_CHUNK;
        let have = self.held.as_ref().map_or(0, |p| p.num_permits());
        if want > have {
            let more = u32::try_from(want - have).map_err(|_| "request too large".to_string())?;
            let permit = self.gateway.buffered.clone().acquire_many_owned(more).await.map_err(|e| e.to_string())?;
            match &mut self.held {
                Some(held) => held.merge(permit),
                None => self.held = Some(permit),
            }
        }
        // Nothing buffered: the client may idle. Part of a request: the
        // rest must come within the frame timeout.
        let limit = if self.buf.is_empty() { limits.idle_timeout } else { limits.frame_timeout };
        self.buf.reserve(READ_CHUNK);
        let read = tokio::select! {
            r = tokio::time::timeout(limit, self.stream.read_buf(&mut self.buf)) => r,
            _ = (self.stop)() => return Err("replica stopping".into()),
        };
        match read {
            Err(_) if self.buf.is_empty() => Err(format!("idle for {} ms", limit.as_millis())),
            Err(_) => Err(format!("a request did not arrive whole within {} ms", limit.as_millis())),
            Ok(Err(e)) => Err(e.to_string()),
            Ok(Ok(0)) if self.buf.is_empty() => Ok(false),
            Ok(Ok(0)) => Err("closed by the client within a request".into()),
            Ok(Ok(_)) => {
                self.release_unused();
                Ok(true)
            }
        }
    }

    /// Gives back budget beyond what the buffer holds plus one read.
    fn release_unused(&mut self) {
        let keep = self.buf.len() + READ_CHUNK;
        if let Some(held) = &mut self.held {
            if held.num_permits() > keep {
                drop(held.split(held.num_permits() - keep));
            }
        }
    }

    /// What `request` turns into, in or out of a transaction.
    fn step(&mut self, request: &Request) -> Step<C::Op> {
        let name = String::from_utf8_lossy(&request.args[0]).to_ascii_uppercase();
        let limits = self.gateway.limits;
        match multi::control(&name, request.args.len(), self.multi.is_some()) {
            multi::Control::Multi => match self.gateway.auth.may(self.peer, self.who.as_ref(), Need::Data, "multi") {
                Ok(()) => {
                    self.multi = Some(multi::Transaction::default());
                    Step::Local(Reply::ok())
                }
                Err(refusal) => Step::Local(refusal),
            },
            multi::Control::Exec => match self.multi.take() {
                Some(transaction) => self.exec_step(transaction),
                None => Step::Local(Reply::error("ERR EXEC without MULTI")),
            },
            multi::Control::Discard => {
                self.multi = None;
                self.unwatch();
                Step::Local(Reply::ok())
            }
            multi::Control::Answer(reply) => Step::Local(reply),
            multi::Control::Watch => self.watch_step(&request.args),
            multi::Control::Unwatch => {
                self.unwatch();
                Step::Local(Reply::ok())
            }
            multi::Control::Other => {
                let step = self.command(request, name);
                match &mut self.multi {
                    Some(t) => Step::Local(t.queue(step, limits.batch_max_commands, limits.batch_max_bytes)),
                    None => step,
                }
            }
        }
    }

    /// What a command that is not about transactions turns into.
    fn command(&mut self, request: &Request, name: String) -> Step<C::Op> {
        let args = &request.args;
        let auth = &self.gateway.auth;
        let need = match name.as_str() {
            "AUTH" => return auth::auth_command(args).map_or_else(Step::Local, Step::Auth),
            "HELLO" => return self.hello(args),
            "QUIT" => return Step::Quit,
            "CONFIG" => Need::Admin,
            _ => Need::Data,
        };
        if let Err(refusal) = auth.may(self.peer, self.who.as_ref(), need, &name.to_ascii_lowercase()) {
            return Step::Local(refusal);
        }
        match name.as_str() {
            "PING" => match args.len() {
                1 => Step::Local(Reply::simple("PONG")),
                2 => Step::Local(Reply::bulk(args[1].clone())),
                _ => Step::Local(psmr_resp::wrong_arity("ping")),
            },
            "ECHO" if args.len() == 2 => Step::Local(Reply::bulk(args[1].clone())),
            "ECHO" => Step::Local(psmr_resp::wrong_arity("echo")),
            // Only inside a transaction (`multi::control` takes it
            // outside): queued, and answered in its place.
            "UNWATCH" => Step::Local(Reply::ok()),
            "SELECT" => Step::Local(select(args)),
            "CLIENT" => Step::Local(self.client_command(args)),
            "COMMAND" => Step::Local(command_info(args)),
            "CONFIG" => Step::Local(config_get(args)),
            "INFO" => Step::Local(Reply::bulk(self.info())),
            "ACL" => Step::Local(self.acl(args)),
            // An operation the service refuses is refused here, without a
            // trip through the log (every replica would refuse it alike).
            _ => match self.gateway.commands.operation(args) {
                Ok(op) => match self.operation(op, &name) {
                    // In a transaction a waiting command is tried once.
                    Step::Execute(op, encoded) if self.multi.is_none() => match self.gateway.commands.waits(args) {
                        Some(Ok(timeout)) => Step::Wait(op, encoded, timeout),
                        Some(Err(reply)) => Step::Local(reply),
                        None => Step::Execute(op, encoded),
                    },
                    step => step,
                },
                Err(reply) => Step::Local(reply),
            },
        }
    }

    /// `ACL WHOAMI`; no other `ACL` subcommand (users live in the
    /// replicas' configuration).
    fn acl(&self, args: &[Bytes]) -> Reply {
        match args.get(1).map(|s| s.to_ascii_uppercase()).as_deref() {
            Some(b"WHOAMI") if args.len() == 2 => {
                self.who.as_ref().map_or_else(|| Reply::bulk("default"), |p| Reply::bulk(p.name().to_string()))
            }
            Some(b"WHOAMI") => psmr_resp::wrong_arity("acl|whoami"),
            _ => Reply::error("ERR psmr answers ACL WHOAMI only: users are in the replicas' configuration"),
        }
    }

    /// An operation to submit, or the reason it cannot be.
    fn operation(&self, op: C::Op, name: &str) -> Step<C::Op> {
        if let Err(refused) = self.gateway.app.access(&op) {
            return Step::Local(error_reply(&refused.0));
        }
        if self.gateway.app.privileged(&op) {
            let auth = &self.gateway.auth;
            if let Err(refusal) = auth.may(self.peer, self.who.as_ref(), Need::Admin, &name.to_ascii_lowercase()) {
                return Step::Local(refusal);
            }
        }
        let encoded = self.gateway.codec.encode_op(&op);
        let max = self.gateway.limits.batch_max_bytes;
        if encoded.len() > max {
            let why =
                format!("ERR command too large: {} bytes of operation, at most {max} (batch_max_bytes)", encoded.len());
            return Step::Local(Reply::error(why));
        }
        Step::Execute(op, encoded)
    }

    fn hello(&mut self, args: &[Bytes]) -> Step<C::Op> {
        let hello = match auth::hello_command(args) {
            Ok(hello) => hello,
            Err(reply) => return Step::Local(reply),
        };
        if let Some(login) = hello.login {
            return Step::Auth(login);
        }
        if self.who.is_none() {
            return Step::Local(auth::hello_noauth());
        }
        if let Some(name) = hello.name {
            self.name = Some(name);
        }
        let version = hello.version.unwrap_or(self.version);
        Step::Hello(version, self.hello_reply(version))
    }

    fn hello_reply(&self, version: Version) -> Reply {
        let proto = if version == Version::Resp3 { 3 } else { 2 };
        let field = |k: &str, v: Reply| (Reply::bulk(k.to_string()), v);
        Reply::map(vec![
            field("server", Reply::bulk("redis")),
            field("version", Reply::bulk("7.0.0")),
            field("proto", Reply::integer(proto)),
            field("id", Reply::integer(self.client.id() as i64)),
            field("mode", Reply::bulk("standalone")),
            field("role", Reply::bulk("master")),
            field("modules", Reply::array(Vec::new())),
        ])
    }

    /// Authenticates (after the replies before it are out): `+OK`, or
    /// `HELLO`'s reply in its version, or the refusal.
    async fn login(&mut self, login: auth::Login) {
        let reply = match self.gateway.auth.login(self.peer, &login).await {
            Ok((principal, credentials)) => {
                self.who = Some(principal);
                self.client.identify(credentials);
                match login.hello {
                    Some(version) => {
                        self.version = version;
                        self.hello_reply(version)
                    }
                    None => Reply::ok(),
                }
            }
            Err(refusal) => refusal,
        };
        self.answer_now(&[reply]).await;
    }

    fn client_command(&mut self, args: &[Bytes]) -> Reply {
        let sub = args.get(1).map(|s| String::from_utf8_lossy(s).to_ascii_uppercase()).unwrap_or_default();
        match (sub.as_str(), args.len()) {
            ("SETNAME", 3) => {
                self.name = Some(args[2].clone());
                Reply::ok()
            }
            ("GETNAME", 2) => self.name.clone().map_or_else(Reply::null, Reply::bulk),
            ("ID", 2) => Reply::integer(self.client.id() as i64),
            // Client libraries announce themselves; nothing to keep.
            ("SETINFO", 4) => Reply::ok(),
            ("", _) => psmr_resp::wrong_arity("client"),
            _ => Reply::error(format!("ERR unknown or unsupported CLIENT subcommand or arguments '{sub}'")),
        }
    }

    fn info(&self) -> String {
        let r = (self.gateway.info)();
        format!(
            "# Server\r\nredis_version:7.0.0\r\nredis_mode:standalone\r\npsmr_replica:{}\r\n\
             # Replication\r\nrole:master\r\npsmr_leader:{}\r\npsmr_is_leader:{}\r\npsmr_term:{}\r\n\
             psmr_applied:{}\r\n",
            r.id,
            r.leader,
            u8::from(r.is_leader),
            r.term,
            r.applied,
        )
    }

    /// Submits the operations among `steps` as one request and writes
    /// every reply in order as it comes; Ok(true) when the client asked to
    /// quit.
    async fn execute(&mut self, mut steps: Vec<Step<C::Op>>) -> Result<bool, String> {
        match steps.pop() {
            Some(Step::Wait(op, encoded, timeout)) if steps.is_empty() => return self.wait(op, encoded, timeout).await,
            Some(Step::Watch(op, encoded, keys)) if steps.is_empty() => return self.watch(op, encoded, keys).await,
            Some(step) => steps.push(step),
            None => {}
        }
        let login = match steps.last() {
            Some(Step::Auth(_)) => steps.pop(),
            _ => None,
        };
        let quit = self.submit(steps).await?;
        if let Some(Step::Auth(login)) = login {
            self.login(login).await;
        }
        Ok(quit)
    }

    /// Submits the operations among `steps` and writes every reply.
    async fn submit(&mut self, mut steps: Vec<Step<C::Op>>) -> Result<bool, String> {
        let encoded: Vec<Vec<u8>> = steps
            .iter_mut()
            .filter_map(|s| match s {
                Step::Execute(_, e) | Step::Exec(_, e, _) => Some(std::mem::take(e)),
                _ => None,
            })
            .collect();
        let gateway = self.gateway;
        let (stall, held) = (gateway.limits.idle_timeout, gateway.held.clone());
        let mut answers = Answers::new(steps, gateway, &mut self.stream, &mut self.version, stall, held);
        // The commands may or may not have executed: the client is told,
        // and decides, as after a lost connection.
        let failed = if encoded.is_empty() {
            None
        } else {
            self.client.submit(encoded, &mut answers).await.err().map(|e| format!("cluster unavailable: {e}"))
        };
        answers.finish(failed.as_deref()).await
    }

    async fn answer_now(&mut self, replies: &[Reply]) {
        let mut out = Vec::new();
        for r in replies {
            r.encode(self.version, &mut out);
        }
        let _ = self.stream.send(&out).await;
    }
}

/// An error as Redis clients read one: a text that starts with an
/// upper-case code keeps it, any other gets `ERR`.
fn error_reply(why: &str) -> Reply {
    let code = why.split(' ').next().unwrap_or("");
    if !code.is_empty() && code.bytes().all(|b| b.is_ascii_uppercase()) {
        Reply::error(why)
    } else {
        Reply::error(format!("ERR {why}"))
    }
}

fn reply_text(reply: &Reply) -> String {
    match reply {
        Reply::Error(e) => e.clone(),
        other => format!("{other:?}"),
    }
}

fn select(args: &[Bytes]) -> Reply {
    match args.get(1).map(|a| a.as_ref()) {
        _ if args.len() != 2 => psmr_resp::wrong_arity("select"),
        Some(b"0") => Reply::ok(),
        _ => Reply::error("ERR DB index is out of range"),
    }
}

/// Enough of `COMMAND` for `redis-cli`'s start-up: no command table.
fn command_info(args: &[Bytes]) -> Reply {
    match args.get(1).map(|s| s.to_ascii_uppercase()).as_deref() {
        Some(b"COUNT") => Reply::integer(0),
        Some(b"DOCS") => Reply::map(Vec::new()),
        _ => Reply::array(Vec::new()),
    }
}

/// `CONFIG GET` of the two settings `redis-benchmark` asks for; nothing
/// can be set.
fn config_get(args: &[Bytes]) -> Reply {
    let sub = args.get(1).map(|s| s.to_ascii_uppercase());
    match (sub.as_deref(), args.get(2).map(|p| p.to_ascii_lowercase())) {
        (Some(b"GET"), Some(param)) => {
            let value: &[u8] = match param.as_slice() {
                b"save" => b"",
                b"appendonly" => b"no",
                _ => return Reply::array(Vec::new()),
            };
            Reply::array(vec![Reply::bulk(param), Reply::bulk(value.to_vec())])
        }
        (Some(b"GET"), None) => psmr_resp::wrong_arity("config|get"),
        _ => Reply::error("ERR psmr accepts CONFIG GET only: its configuration is in its file"),
    }
}
