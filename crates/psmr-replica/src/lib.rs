//! # psmr-replica: one replica of a psmr cluster, on threads
//!
//! The threaded runtime of a replica: it runs the replica's core
//! (`psmr-core`: the protocol and the apply loop, which decide everything
//! without IO) on threads, with real sockets, a real clock and a store on
//! disk or in memory (`psmr-storage`). The threads follow the staged
//! architecture of 002 §V, stages joined by queues bounded in items, and
//! those that carry log entries in bytes too ([`queue`]); the messages
//! between them live in [`msg`]:
//!
//! ```text
//! clients ─▶ ClientIO (tokio, N threads) ─▶ protocol thread ─▶ service manager ─▶ scheduler workers
//!               ▲                                ▲      │                                     │
//!               └──────── replies (router) ◀─────┼──────┼─────────────────────────────────────┘
//!                         ReplicaIO receivers ───┘      └▶ ReplicaIO senders (one per peer)
//! ```
//!
//! * ClientIO ([`client_io`]): framed, versioned client protocol
//!   ([`psmr_model::wire`]); a follower *redirects* clients to the leader
//!   (it does not forward: a redirect costs one round trip once per leader
//!   change, forwarding would cost a hop on every request).
//! * The protocol thread drives `psmr_core::protocol::Protocol`: batching,
//!   raft, reads without the log, membership changes; every peer message
//!   passes the guard first.
//! * ReplicaIO ([`peer`]): blocking sockets authenticated by mutual TLS
//!   ([`tls`]), a sender thread per peer and a receiver thread per
//!   authenticated peer (handshakes in a bounded pool); never blocks the
//!   protocol thread.
//! * The service manager thread drives `psmr_core::apply::Applier`: the
//!   reply cache, the execution scheduler, snapshots; a side pool of one
//!   psmr-rt worker encodes and writes the snapshots, so execution pauses
//!   only to copy the state.
//!
//! The deterministic simulator (`psmr-sim`) runs the same core on a
//! simulated clock, network and disk.
//!
//! Fail-stop: a panic in any thread of a replica (a stage, a ClientIO task,
//! an execution worker) stops the whole replica with the reason
//! ([`Replica::wait`] returns it); it never runs on without that thread.

pub mod client_io;
pub mod local;
mod manager;
pub mod metrics;
pub mod msg;
pub mod peer;
mod protocol;
pub mod queue;
pub mod redis;
pub mod router;
mod snapshot;
pub mod stages;
pub mod tls;

pub use local::{LocalCluster, LocalClusterBuilder};
pub use psmr_core::config::{self, Config, ConfigError, Member, Storage};
pub use psmr_core::{membership, ratelog};
pub use psmr_model::App;

use crate::router::Router;
use parking_lot::{Condvar, Mutex};
use psmr_core::apply::{Applier, Setup};
use psmr_core::membership::Membership;
use psmr_core::protocol::{Options, Protocol};
use psmr_model::{ClassModel, Mapping};
use psmr_sched::{optimizer, SchedConfig};
use psmr_storage::{DiskStore, Log};
use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use thiserror::Error;
use tracing::{error, info};

/// Errors starting or running a replica.
#[derive(Debug, Error)]
pub enum ReplicaError {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A socket cannot be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The scheduler cannot be built.
    #[error("scheduler: {0}")]
    Scheduler(#[from] psmr_sched::SchedError),
    /// No class-to-threads mapping could be found.
    #[error("mapping: {0}")]
    Optimizer(#[from] psmr_sched::optimizer::OptimizerError),
    /// Raft refused to start.
    #[error("raft: {0}")]
    Raft(#[from] raft::Error),
    /// The protocol refused to start.
    #[error(transparent)]
    Protocol(#[from] psmr_core::protocol::StartError),
    /// The data directory cannot be used.
    #[error(transparent)]
    Storage(#[from] psmr_storage::DiskError),
    /// The peer certificates cannot be used.
    #[error("peer TLS: {0}")]
    Tls(#[from] tls::TlsError),
    /// A thread or runtime cannot start.
    #[error("cannot start: {0}")]
    Start(#[from] std::io::Error),
    /// The replica stopped because of an error.
    #[error("replica stopped: {0}")]
    Failed(String),
}

/// Counters of a running replica.
#[derive(Debug, Default)]
pub struct Stats {
    /// Raft messages received from peers.
    pub peer_in: AtomicU64,
    /// Raft messages from peers that the guard refused: each breaks
    /// a rule no honest replica breaks (a bug or a damaged frame).
    pub peer_refused: AtomicU64,
    /// Log entries this replica proposed as leader.
    pub entries_proposed: AtomicU64,
    /// Client commands in those entries.
    pub commands_proposed: AtomicU64,
}

/// State shared by a replica's threads.
pub struct Shared {
    /// The configuration.
    pub config: Config,
    /// This replica's id.
    pub id: u64,
    /// Drawn at start; see [`peer`].
    pub incarnation: u64,
    /// Incarnations seen per peer.
    pub(crate) incarnations: Mutex<HashMap<u64, u64>>,
    /// This replica was repaired and its log is still below the vote floor
    /// the repair left: said in the peer `Hello` (see [`peer`]), cleared by
    /// the protocol thread once the log reaches the floor.
    pub(crate) repaired: AtomicBool,
    /// Leader id as this replica knows it (0: none).
    pub leader: AtomicU64,
    /// Current term.
    pub term: AtomicU64,
    /// This replica leads.
    pub is_leader: AtomicBool,
    /// Last log index handed to the scheduler.
    pub applied: AtomicU64,
    /// The protocol thread waits for the service manager to apply an entry
    /// (the pipeline is full); see [`Shared::nudge_protocol`].
    pub(crate) protocol_waits: AtomicBool,
    /// Where replies go.
    pub router: Arc<Router>,
    /// Counters.
    pub stats: Stats,
    /// The running scheduler's per-worker metrics (early schedulers).
    worker_metrics: Mutex<Option<Arc<psmr_sched::Metrics>>>,
    /// What executes, and `auto`'s last decision, for `status`.
    scheduler: Mutex<(String, String)>,
    /// What the Prometheus endpoint serves (see [`metrics`]).
    pub metrics: metrics::Metrics,
    /// The members as of the last committed conf change (written by the
    /// protocol thread; see [`membership`]).
    membership: parking_lot::RwLock<Membership>,
    /// Bumped at every membership change (peer links check it cheaply).
    membership_epoch: AtomicU64,
    stopping: AtomicBool,
    stop_tx: tokio::sync::watch::Sender<bool>,
    failure: Mutex<Option<String>>,
    failed: Condvar,
}

impl Shared {
    /// Member `id`'s addresses. Until the log names any member (a joining
    /// replica that has heard nothing yet), the configuration's list.
    pub fn member(&self, id: u64) -> Option<Member> {
        let m = self.membership.read();
        match m.is_empty() {
            true => self.config.member(id).ok().cloned(),
            false => m.member(id).cloned(),
        }
    }

    /// The answer that sends a client to `leader` (0: none known), with
    /// its client address if this replica knows it.
    pub fn redirect_to(&self, leader: u64) -> psmr_model::wire::ServerMsg {
        let addr = self.member(leader).map(|m| m.client.to_string()).unwrap_or_default();
        psmr_model::wire::ServerMsg::Redirect { leader, addr }
    }

    /// Every member (voters and learners), as [`Shared::member`] sees them.
    pub fn members(&self) -> Vec<Member> {
        let m = self.membership.read();
        match m.is_empty() {
            true => self.config.replicas.clone(),
            false => m.members().cloned().collect(),
        }
    }

    /// The members as a client sees them.
    pub fn member_info(&self) -> Vec<psmr_model::wire::MemberInfo> {
        self.membership.read().info()
    }

    /// Every worker's counters of the running scheduler (empty for
    /// schedulers that keep none).
    pub fn worker_samples(&self) -> Vec<psmr_model::wire::WorkerSample> {
        self.worker_metrics.lock().as_ref().map(|m| m.snapshot()).unwrap_or_default()
    }

    /// The running scheduler's metrics, replaced at every switch.
    pub(crate) fn set_worker_metrics(&self, m: Option<Arc<psmr_sched::Metrics>>) {
        *self.worker_metrics.lock() = m;
    }

    /// What executes, and `auto`'s last decision, for `status`.
    pub(crate) fn set_scheduler_status(&self, describe: String, decision: String) {
        *self.scheduler.lock() = (describe, decision);
    }

    /// What executes, and `auto`'s last decision (empty if none).
    pub fn scheduler_status(&self) -> (String, String) {
        self.scheduler.lock().clone()
    }

    /// Publishes the protocol thread's membership.
    pub(crate) fn set_membership(&self, m: &Membership) {
        *self.membership.write() = m.clone();
        self.membership_epoch.fetch_add(1, Ordering::AcqRel);
    }

    /// Changes with every membership change.
    pub(crate) fn membership_epoch(&self) -> u64 {
        self.membership_epoch.load(Ordering::Acquire)
    }

    /// Whether replica `id` was removed from the cluster (as far as this
    /// replica's log says).
    pub(crate) fn is_removed(&self, id: u64) -> bool {
        self.membership.read().is_removed(id)
    }

    /// Stops this replica because it is no longer a member: a clean stop,
    /// not a failure.
    pub(crate) fn stop_removed(&self, why: &str) {
        if !self.stopping() {
            info!(id = self.id, "{why}: this replica is no longer a member of the cluster and stops");
            self.stop();
        }
    }

    fn new(config: Config, id: u64, incarnation: u64, repaired: bool) -> Self {
        let (stop_tx, _) = tokio::sync::watch::channel(false);
        let router = Arc::new(Router::new(config.client_buffer_bytes_max));
        Shared {
            config,
            id,
            incarnation,
            incarnations: Mutex::new(HashMap::new()),
            repaired: AtomicBool::new(repaired),
            leader: AtomicU64::new(0),
            term: AtomicU64::new(0),
            is_leader: AtomicBool::new(false),
            applied: AtomicU64::new(0),
            protocol_waits: AtomicBool::new(false),
            router,
            stats: Stats::default(),
            worker_metrics: Mutex::new(None),
            scheduler: Mutex::new(Default::default()),
            metrics: metrics::Metrics::new(),
            membership: parking_lot::RwLock::new(Membership::default()),
            membership_epoch: AtomicU64::new(0),
            stopping: AtomicBool::new(false),
            stop_tx,
            failure: Mutex::new(None),
            failed: Condvar::new(),
        }
    }

    /// True once the replica is stopping.
    pub fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }

    /// Completes when the replica stops.
    pub async fn stopped(&self) {
        let mut rx = self.stop_tx.subscribe();
        let _ = rx.wait_for(|&s| s).await;
    }

    /// Stops the replica because of `why` (the first reason wins).
    pub fn fail(&self, why: String) {
        let mut f = self.failure.lock();
        if f.is_none() {
            error!("{why}");
            *f = Some(why);
        }
        self.failed.notify_all();
        drop(f);
        self.stop();
    }

    /// Whether the applied index satisfies `reached`. If not, asks the
    /// service manager to nudge the protocol thread when it applies the
    /// next entry ([`Shared::set_applied`]) and looks again: either the
    /// manager sees the request, or this sees what it applied. The request
    /// stays up even if the second look succeeds: a spare nudge costs one
    /// wake-up, and another wait (pipeline room, reads) may share it.
    pub(crate) fn applied_reaches(&self, reached: impl Fn(u64) -> bool) -> bool {
        if reached(self.applied.load(Ordering::SeqCst)) {
            return true;
        }
        self.protocol_waits.store(true, Ordering::SeqCst);
        reached(self.applied.load(Ordering::SeqCst))
    }

    /// Records that log entry `index` is applied, and wakes the protocol
    /// thread if it waits for room in the pipeline (through `protocol`,
    /// its inbound queue).
    pub(crate) fn set_applied(&self, index: u64, protocol: &queue::Sender<msg::Inbound>) {
        self.applied.store(index, Ordering::SeqCst);
        // SeqCst on both sides (see `Protocol::pipeline_room`): either the
        // protocol thread saw this index, or this sees its flag.
        if self.protocol_waits.swap(false, Ordering::SeqCst) {
            // Full means the protocol thread has messages to wake it.
            let _ = protocol.try_send(msg::Inbound::Applied);
        }
    }

    fn stop(&self) {
        self.stopping.store(true, Ordering::Release);
        self.stop_tx.send_replace(true);
        let _f = self.failure.lock();
        self.failed.notify_all();
    }
}

/// A running replica.
pub struct Replica {
    shared: Arc<Shared>,
    client_addr: SocketAddr,
    threads: Vec<JoinHandle<()>>,
    runtime: Option<tokio::runtime::Runtime>,
}

/// Starts a replica: the application, its configuration and its id, and
/// optionally listeners bound beforehand (so that a caller choosing free
/// ports has no window in which another process takes them).
///
/// ```no_run
/// # fn demo(app: psmr_services::KvApp, config: psmr_replica::Config) -> Result<(), psmr_replica::ReplicaError> {
/// let replica = psmr_replica::ReplicaBuilder::new(app, config, 1).start()?;
/// replica.wait()
/// # }
/// ```
pub struct ReplicaBuilder<A: App> {
    app: A,
    config: Config,
    id: u64,
    listeners: Option<(TcpListener, TcpListener)>,
    redis: Option<RedisFrontEnd<A>>,
    metrics_listener: Option<TcpListener>,
}

/// Makes the Redis gateway of a replica, its types erased.
type RedisFrontEnd<A> = (Box<dyn FnOnce(Arc<Shared>, Arc<A>) -> Arc<dyn redis::Serve> + Send>, Option<TcpListener>);

impl<A: App> ReplicaBuilder<A> {
    /// Replica `id` of `config` running `app`.
    pub fn new(app: A, config: Config, id: u64) -> Self {
        Self { app, config, id, listeners: None, redis: None, metrics_listener: None }
    }

    /// Serves Redis clients on the member's `redis` address, mapping their
    /// commands onto the app's operations with `commands` (see [`redis`]).
    pub fn redis<C>(mut self, commands: C) -> Self
    where
        C: psmr_resp::Commands<Op = A::Op, Reply = A::Reply>,
    {
        let make =
            move |shared, app| Arc::new(redis::Gateway::<A, C>::new(shared, app, commands)) as Arc<dyn redis::Serve>;
        let listener = self.redis.take().and_then(|(_, l)| l);
        self.redis = Some((Box::new(make), listener));
        self
    }

    /// Serves Redis clients on `listener` (bound beforehand to the
    /// member's `redis` address) rather than binding it; needs
    /// [`ReplicaBuilder::redis`] too.
    pub fn redis_listener(mut self, listener: TcpListener) -> Self {
        if let Some((_, l)) = &mut self.redis {
            *l = Some(listener);
        }
        self
    }

    /// Serves clients on `client` and peers on `peer` instead of binding
    /// the configured addresses (which must be theirs).
    pub fn listeners(mut self, client: TcpListener, peer: TcpListener) -> Self {
        self.listeners = Some((client, peer));
        self
    }

    /// Serves `/metrics` on `listener` instead of binding the configured
    /// `metrics` address (see [`metrics`]).
    pub fn metrics_listener(mut self, listener: TcpListener) -> Self {
        self.metrics_listener = Some(listener);
        self
    }

    /// Checks the configuration, opens the log and starts every stage.
    pub fn start(self) -> Result<Replica, ReplicaError> {
        let Self { app, config, id, listeners, redis, metrics_listener } = self;
        config.validate()?;
        stages::init();
        let me = config.member(id)?.clone();
        if me.redis.is_some() && redis.is_none() {
            return Err(ConfigError::Invalid(format!(
                "replica {id} has a redis address, but its application does not speak Redis"
            ))
            .into());
        }
        let model = app.class_model();
        let sched = sched_config(&config, &app, &model)?;
        let (client_listener, peer_listener) = match listeners {
            Some(l) => l,
            None => (bind(me.client)?, bind(me.peer)?),
        };
        let metrics_listener = metrics::listener(metrics_listener, &me)?;
        let client_addr = client_listener.local_addr()?;
        let (log, incarnation) = open_log(&config, id)?;
        let shared =
            Arc::new(Shared::new(config.clone(), id, incarnation, psmr_core::store::Store::vote_floor(&log).is_some()));
        let mut replica = Replica { shared: shared.clone(), client_addr, threads: Vec::new(), runtime: None };

        // Queues between the stages.
        let depth = config.queue_depth;
        let bytes = config.queue_bytes_max;
        let (inbound_tx, inbound_rx) = queue::bounded(depth, bytes, shared.metrics.peer_queue.clone());
        let (decision_tx, decision_rx) = queue::bounded(depth, bytes, shared.metrics.apply_queue.clone());
        let (request_tx, request_rx) = msg::request_queue(depth);

        // ReplicaIO. The certificates are loaded before any peer thread
        // starts: a replica that cannot authenticate must not run at all.
        let tls = match &config.peer_tls {
            Some(files) => Some(Arc::new(tls::PeerTlsContext::load(files, id)?)),
            None => None,
        };
        let accept = peer::spawn_listener(&shared, peer_listener, tls.clone(), inbound_tx.clone())?;
        replica.threads.push(accept);

        // The protocol, then the apply loop, restored from the snapshot the
        // log was compacted to.
        let app = Arc::new(app);
        let protocol = Protocol::new(&config, id, log.clone(), Options::new(fresh_incarnation()))?;
        let manager = manager(&shared, app.clone(), sched, &log, decision_rx, inbound_tx.clone())?;
        let links = protocol::Links {
            shared: shared.clone(),
            peers: HashMap::new(),
            decisions: decision_tx.clone(),
            tls,
            tickets: HashMap::new(),
            next_ticket: 0,
        };
        let protocol = protocol::ProtocolThread {
            shared: shared.clone(),
            protocol,
            inbound: inbound_rx,
            requests: request_rx,
            links,
        };
        replica.spawn("psmr-protocol", move || protocol.run())?;
        replica.spawn("psmr-manager", move || manager.run())?;

        // ClientIO.
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(config.client_io_threads)
            .thread_name("psmr-client-io")
            .enable_all()
            .build()?;
        let io = Arc::new(client_io::ClientIo::new(
            shared.clone(),
            request_tx,
            decision_tx,
            inbound_tx,
            reads_only(&app),
            planner(&app, &config),
        ));
        client_listener.set_nonblocking(true)?;
        let listener = {
            let _guard = runtime.enter();
            tokio::net::TcpListener::from_std(client_listener)?
        };
        runtime.spawn(io.serve(listener));
        metrics::spawn(&runtime, &shared, metrics_listener)?;
        if let (Some(addr), Some((make, listener))) = (me.redis, redis) {
            let listener = match listener {
                Some(l) => l,
                None => bind(addr)?,
            };
            listener.set_nonblocking(true)?;
            let listener = {
                let _guard = runtime.enter();
                tokio::net::TcpListener::from_std(listener)?
            };
            runtime.spawn(make(shared.clone(), app.clone()).serve(listener));
            info!(id, redis = %addr, "serving Redis clients");
        }
        replica.runtime = Some(runtime);
        info!(id, %client_addr, peer = %me.peer, scheduler = %config.scheduler.kind, "replica started");
        Ok(replica)
    }
}

fn bind(addr: SocketAddr) -> Result<TcpListener, ReplicaError> {
    TcpListener::bind(addr).map_err(|source| ReplicaError::Bind { addr, source })
}

/// The scheduler `config` asks for: its kind, workers and, for early
/// schedulers, its mapping.
fn sched_config<A: App>(config: &Config, app: &A, model: &ClassModel) -> Result<SchedConfig, ReplicaError> {
    let kind = config.scheduler_kind()?;
    let mut sched = SchedConfig::new(kind, config.scheduler.workers);
    if kind.needs_mapping() {
        sched.mapping = Some(mapping(config, app, model)?);
    }
    // Timing the waits costs two clock reads per wait; the per-worker
    // picture it gives (`psmr bench`) is worth that.
    sched.metrics = true;
    Ok(sched)
}

/// ClientIO's way to turn a reconfiguration request into a scheduler
/// configuration, as the replica's start does ([`sched_config`]; the
/// optimizer may run, so ClientIO calls it off its async threads).
fn planner<A: App>(app: &Arc<A>, config: &Config) -> client_io::Planner {
    let (app, config) = (app.clone(), config.clone());
    Arc::new(move |kind: &str, workers: usize, mapping: &str| {
        let mut c = config.clone();
        c.scheduler.kind = kind.to_string();
        c.scheduler.workers = workers;
        c.scheduler.mapping = if mapping.is_empty() { "default".into() } else { mapping.to_string() };
        c.validate().map_err(|e| e.to_string())?;
        sched_config(&c, &*app, &app.class_model()).map_err(|e| e.to_string())
    })
}

/// The class-to-threads mapping of an early scheduler: the configured one,
/// else the application's default, else the optimizer's for equally
/// frequent classes.
fn mapping<A: App>(config: &Config, app: &A, model: &ClassModel) -> Result<Mapping, ReplicaError> {
    let workers = config.scheduler.workers;
    if let Some(m) = config.mapping(model)? {
        return Ok(m);
    }
    if let Some(m) = app.default_mapping(workers) {
        m.validate(model).map_err(|e| ReplicaError::Failed(format!("the application's default mapping: {e}")))?;
        return Ok(m);
    }
    let problem = optimizer::Problem::new(model.clone(), workers)?;
    let limits = optimizer::Limits { time: MAPPING_TIME_LIMIT };
    let solution = optimizer::optimize_with(&problem, limits)?;
    info!(
        model = model.name(),
        workers,
        optimal = solution.optimal,
        mapping = %solution.mapping.to_spec(model),
        "class-to-threads mapping found by the optimizer"
    );
    Ok(solution.mapping)
}

/// ClientIO's test for a read request ([`reads`]): every operation decodes
/// and writes no key. An operation that does not decode goes through the
/// log, to be refused there like any other.
fn reads_only<A: App>(app: &Arc<A>) -> client_io::ReadsOnly {
    let (app, codec) = (app.clone(), A::Codec::default());
    Arc::new(move |op: &[u8]| {
        use psmr_model::wire::OpCodec;
        codec.decode_op(op).ok().and_then(|op| app.access(&op).ok()).is_some_and(|a| a.writes.is_empty())
    })
}

/// How long a starting replica lets the optimizer look for a mapping when
/// neither the configuration nor the application gives one: the best found
/// is used, optimal or not.
pub const MAPPING_TIME_LIMIT: std::time::Duration = std::time::Duration::from_secs(2);

/// The log: a fresh one in memory, or whatever the data directory holds.
/// Also the incarnation this replica announces to its peers.
fn open_log(config: &Config, id: u64) -> Result<(Log, u64), ReplicaError> {
    // Raft starts with no members: the founding entries (or, joining, the
    // leader's log or snapshot) say who they are, so that raft's
    // membership at every index is the one the log's entries make (see
    // `membership`).
    let (log, incarnation) = match config.storage {
        Storage::Memory => (Log::Memory(psmr_core::store::MemStore::default()), fresh_incarnation()),
        Storage::Disk => {
            let disk = DiskStore::open(&config.replica_dir(id), Vec::new())?;
            // The directory's own, kept in its sync record (and by a
            // repair): a fresh one is for memory storage only.
            let incarnation = disk.incarnation();
            (Log::Disk(disk), incarnation)
        }
    };
    if !config.join {
        psmr_core::store::found(&log, &config.replicas)
            .map_err(|e| ReplicaError::Failed(format!("cannot found the log: {e}")))?;
    }
    psmr_core::store::check_founded(&log).map_err(|why| ReplicaError::Failed(format!("replica {id}: {why}")))?;
    Ok((log, incarnation))
}

fn fresh_incarnation() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos());
    h.finish() | 1
}

/// The service manager thread of a replica running `app` with `sched`,
/// its state restored from the snapshot `log` keeps.
fn manager<A: App>(
    shared: &Arc<Shared>,
    app: Arc<A>,
    sched: SchedConfig,
    log: &Log,
    decisions: queue::Receiver<msg::Decision>,
    protocol: queue::Sender<msg::Inbound>,
) -> Result<manager::Manager<A>, ReplicaError> {
    let config = &shared.config;
    let failing = shared.clone();
    let setup = Setup {
        app,
        scheduler: sched,
        cache: psmr_core::CacheLimits::of(config),
        snapshot_every: config.snapshot_every,
        replies: shared.router.clone(),
        on_failure: Box::new(move |why| failing.fail(why)),
    };
    let applier = Applier::new(setup)?;
    let cache = applier.cache_stats();
    let _ = shared.metrics.cache.set(Box::new(move || {
        let (seqs, bytes) = cache.size();
        (cache.clients(), seqs, bytes)
    }));
    let snapshots = snapshot::Snapshotter::start(shared.clone(), log.clone(), protocol.clone())?;
    let mut io = manager::ManagerIo { shared: shared.clone(), protocol, snapshots };
    psmr_core::apply::ApplyIo::event(&mut io, applier.scheduler_event());
    let mut manager = manager::Manager { applier, decisions, io };
    if let Some(snapshot) = psmr_core::store::Store::kept(log) {
        manager.applier.restore(&snapshot, &mut manager.io).map_err(ReplicaError::Failed)?;
    }
    Ok(manager)
}

impl Replica {
    /// Starts replica `id` of `config` running `app` (see
    /// [`ReplicaBuilder`] for more choices).
    pub fn start<A: App>(config: Config, id: u64, app: A) -> Result<Replica, ReplicaError> {
        ReplicaBuilder::new(app, config, id).start()
    }

    /// Spawns a stage thread. A panic in it stops the replica (fail-stop):
    /// the other stages would otherwise run on without it, a zombie that
    /// still answers `status`.
    fn spawn(&mut self, name: &str, f: impl FnOnce() + Send + 'static) -> std::io::Result<()> {
        let shared = self.shared.clone();
        let thread = name.to_string();
        let h = std::thread::Builder::new().name(name.into()).spawn(move || {
            if let Err(payload) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
                shared.fail(format!("thread {thread} panicked: {}", psmr_sched::panic_message(payload.as_ref())));
            }
        })?;
        self.threads.push(h);
        Ok(())
    }

    /// Where clients connect.
    pub fn client_addr(&self) -> SocketAddr {
        self.client_addr
    }

    /// The shared state (leader, term, applied index, counters).
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Blocks until the replica stops; the error if it failed.
    pub fn wait(&self) -> Result<(), ReplicaError> {
        let mut f = self.shared.failure.lock();
        while f.is_none() && !self.shared.stopping() {
            self.shared.failed.wait(&mut f);
        }
        match f.clone() {
            Some(why) => Err(ReplicaError::Failed(why)),
            None => Ok(()),
        }
    }

    /// Stops every thread and closes every socket.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.shared.stop();
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_timeout(std::time::Duration::from_secs(1));
        }
        for h in self.threads.drain(..) {
            let _ = h.join();
        }
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.shutdown();
    }
}
