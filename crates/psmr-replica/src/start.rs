//! Starting a replica: the builder, and the wiring of its stages, each
//! given the handles it needs.

use crate::control::{OpTest, Planner, ReplicaControl};
use crate::error::ReplicaError;
use crate::handles::{Applied, Counters, Scheduling};
use crate::metrics::{Metrics, Observed};
use crate::replica::Replica;
use crate::{manager, metrics, protocol, snapshot};
use psmr_core::apply::{Applier, Setup};
use psmr_core::config::{Config, ConfigError, FacingPort, Member, PeerTls, Storage};
use psmr_core::protocol::{Options, Protocol};
use psmr_model::App;
use psmr_model::{ClassModel, Mapping};
use psmr_sched::{optimizer, SchedConfig};
use psmr_storage::{DiskStore, Log};
use psmr_transport::client::{ClientIo, ClientPort};
use psmr_transport::life::Life;
use psmr_transport::msg::{self, Decision, Inbound, RequestReceiver, RequestSender};
use psmr_transport::peer::{self, Peers};
use psmr_transport::queue;
use psmr_transport::router::Router;
use psmr_transport::tls::PeerTlsContext;
use psmr_transport::view::ClusterView;
use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;
use tracing::info;

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
type RedisFrontEnd<A> = (
    Box<dyn FnOnce(&Handles, Arc<ClientIo>, SocketAddr, Arc<A>) -> Arc<dyn psmr_gateway::Serve> + Send>,
    Option<TcpListener>,
);

impl<A: App> ReplicaBuilder<A> {
    /// Replica `id` of `config` running `app`.
    pub fn new(app: A, config: Config, id: u64) -> Self {
        Self { app, config, id, listeners: None, redis: None, metrics_listener: None }
    }

    /// Serves Redis clients on the member's `redis` address, mapping their
    /// commands onto the app's operations with `commands` (the gateway of
    /// `psmr-gateway`).
    pub fn redis<C>(mut self, commands: C) -> Self
    where
        C: psmr_resp::Commands<Op = A::Op, Reply = A::Reply>,
    {
        let make = move |h: &Handles, io, me, app| crate::gateway::make(h, io, me, app, commands);
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
    /// `metrics` address (see [`crate::metrics`]).
    pub fn metrics_listener(mut self, listener: TcpListener) -> Self {
        self.metrics_listener = Some(listener);
        self
    }

    /// Checks the configuration, opens the log and starts every stage.
    pub fn start(self) -> Result<Replica, ReplicaError> {
        let Self { app, config, id, listeners, redis, metrics_listener } = self;
        config.validate()?;
        psmr_transport::clock::init();
        let me = config.member(id)?.clone();
        if me.redis.is_some() && redis.is_none() {
            let why = format!("replica {id} has a redis address, but its application does not speak Redis");
            return Err(ConfigError::Invalid(why).into());
        }
        let sched = sched_config(&config, &app, &app.class_model())?;
        let (client_listener, peer_listener) = match listeners {
            Some(l) => l,
            None => (bind(me.client)?, bind(me.peer)?),
        };
        let metrics_listener = metrics::listener(metrics_listener, &me)?;
        let (client_tls, forward_tls) = client_tls(&config, id)?;
        let (log, incarnation) = open_log(&config, id)?;
        let mut h = Handles::new(config, id, incarnation, psmr_core::store::Store::vote_floor(&log).is_some());
        (h.client_tls, h.forward_tls) = (client_tls, forward_tls);
        let mut replica = h.replica(client_listener.local_addr()?);
        let q = Queues::new(&h);
        let tls = start_peers(&h, peer_listener, &q, &mut replica)?;
        replica.certificates = crate::replica::Certificates {
            peer: tls.clone(),
            client: h.client_tls.clone(),
            forward: h.forward_tls.clone(),
        };
        let app = Arc::new(app);
        let (request_tx, decision_tx, inbound_tx) = (q.requests.clone(), q.decisions.clone(), q.inbound.clone());
        start_stages(&h, app.clone(), sched, log.clone(), q, tls, &mut replica)?;
        let control = control(&h, &app, &me, (decision_tx, inbound_tx), log);
        let (runtime, io) = start_io(&h, request_tx.clone(), control, client_listener, metrics_listener)?;
        crate::sweeper::spawn(&runtime, &h, app.clone(), request_tx);
        if let (Some(addr), Some((make, listener))) = (me.redis, redis) {
            let listener = match listener {
                Some(l) => l,
                None => bind(addr)?,
            };
            crate::gateway::spawn(&runtime, &h, make(&h, io, me.client, app), listener)?;
            info!(id, redis = %addr, "serving Redis clients");
        }
        replica.runtime = Some(runtime);
        info!(id, client = %replica.client_addr, peer = %me.peer, scheduler = %h.config.scheduler.kind, "replica started");
        Ok(replica)
    }
}

/// What a replica's stages share, each taking the handles it needs.
pub(crate) struct Handles {
    pub(crate) config: Arc<Config>,
    pub(crate) id: u64,
    pub(crate) life: Arc<Life>,
    pub(crate) view: Arc<ClusterView>,
    pub(crate) applied: Arc<Applied>,
    pub(crate) counters: Arc<Counters>,
    pub(crate) scheduling: Arc<Scheduling>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) router: Arc<Router>,
    pub(crate) peers: Arc<Peers>,
    /// TLS for the ports clients reach (`[client_tls]`), if any.
    pub(crate) client_tls: Option<psmr_tls::Acceptor>,
    /// TLS for the Redis gateway's own client of the leader's client
    /// port, if that port is in TLS.
    pub(crate) forward_tls: Option<psmr_tls::Connector>,
}

impl Handles {
    fn new(config: Config, id: u64, incarnation: u64, repaired: bool) -> Self {
        let config = Arc::new(config);
        let life = Arc::new(Life::new(id));
        let view = Arc::new(ClusterView::new(id, config.replicas.clone(), repaired));
        let peers = Arc::new(Peers::new(id, incarnation, config.clone(), life.clone(), view.clone()));
        let router = Arc::new(Router::new(config.client_buffer_bytes_max));
        Self {
            config,
            id,
            life,
            view,
            applied: Arc::default(),
            counters: Arc::default(),
            scheduling: Arc::default(),
            metrics: Arc::default(),
            router,
            peers,
            client_tls: None,
            forward_tls: None,
        }
    }

    /// TLS for `port`, if `[client_tls]` lists it.
    pub(crate) fn tls_for(&self, port: FacingPort) -> Option<psmr_tls::Acceptor> {
        self.config.tls_on(port).and(self.client_tls.clone())
    }

    pub(crate) fn observed(&self) -> Observed {
        Observed {
            id: self.id,
            view: self.view.clone(),
            applied: self.applied.clone(),
            counters: self.counters.clone(),
            peers: self.peers.clone(),
            scheduling: self.scheduling.clone(),
            metrics: self.metrics.clone(),
            router: self.router.clone(),
        }
    }

    /// The replica these handles run, with no thread yet.
    fn replica(&self, client_addr: SocketAddr) -> Replica {
        Replica {
            id: self.id,
            life: self.life.clone(),
            view: self.view.clone(),
            applied: self.applied.clone(),
            counters: self.counters.clone(),
            peers: self.peers.clone(),
            observed: self.observed(),
            client_addr,
            threads: Vec::new(),
            runtime: None,
            certificates: Default::default(),
        }
    }
}

/// The queues between the stages.
struct Queues {
    inbound: queue::Sender<Inbound>,
    inbound_rx: queue::Receiver<Inbound>,
    decisions: queue::Sender<Decision>,
    decisions_rx: queue::Receiver<Decision>,
    requests: RequestSender,
    requests_rx: RequestReceiver,
}

impl Queues {
    fn new(h: &Handles) -> Self {
        let (depth, bytes) = (h.config.queue_depth, h.config.queue_bytes_max);
        let (inbound, inbound_rx) = queue::bounded(depth, bytes, h.metrics.peer_queue.clone());
        let (decisions, decisions_rx) = queue::bounded(depth, bytes, h.metrics.apply_queue.clone());
        let (requests, requests_rx) = msg::request_queue(depth);
        Self { inbound, inbound_rx, decisions, decisions_rx, requests, requests_rx }
    }
}

/// ReplicaIO. The certificates are loaded before any peer thread starts: a
/// replica that cannot authenticate must not run at all.
fn start_peers(
    h: &Handles,
    listener: TcpListener,
    q: &Queues,
    replica: &mut Replica,
) -> Result<Option<Arc<PeerTlsContext>>, ReplicaError> {
    let tls = match &h.config.peer_tls {
        Some(files) => Some(Arc::new(PeerTlsContext::load(files, h.id)?)),
        None => None,
    };
    replica.threads.push(peer::spawn_listener(&h.peers, listener, tls.clone(), q.inbound.clone())?);
    Ok(tls)
}

/// The protocol thread and the service manager thread, the apply loop
/// restored from the snapshot the log was compacted to.
fn start_stages<A: App>(
    h: &Handles,
    app: Arc<A>,
    sched: SchedConfig,
    log: Log,
    q: Queues,
    tls: Option<Arc<PeerTlsContext>>,
    replica: &mut Replica,
) -> Result<(), ReplicaError> {
    let options = Options::new(fresh_incarnation()).checked_by(app.clone());
    let protocol = Protocol::new(&h.config, h.id, log.clone(), options)?;
    let manager = manager(h, app, sched, &log, q.decisions_rx, q.inbound.clone())?;
    let links = protocol::Links {
        view: h.view.clone(),
        peers: h.peers.clone(),
        senders: HashMap::new(),
        decisions: q.decisions,
        router: h.router.clone(),
        metrics: h.metrics.clone(),
        counters: h.counters.clone(),
        tls,
        tickets: HashMap::new(),
        next_ticket: 0,
    };
    let protocol = protocol::ProtocolThread {
        life: h.life.clone(),
        applied: h.applied.clone(),
        tick: h.config.tick(),
        protocol,
        inbound: q.inbound_rx,
        requests: q.requests_rx,
        links,
    };
    replica.spawn("psmr-protocol", move || protocol.run())?;
    replica.spawn("psmr-manager", move || manager.run())?;
    Ok(())
}

/// What the client port asks of this replica.
fn control<A: App>(
    h: &Handles,
    app: &Arc<A>,
    me: &Member,
    (decisions, protocol): (queue::Sender<Decision>, queue::Sender<Inbound>),
    log: Log,
) -> Arc<ReplicaControl> {
    Arc::new(ReplicaControl {
        id: h.id,
        addr: me.client,
        view: h.view.clone(),
        scheduling: h.scheduling.clone(),
        observed: h.observed(),
        decisions,
        protocol,
        planner: planner(app, &h.config),
        reads_only: reads_only(app),
        privileged: privileged(app),
        log,
        snapshot_reads: Arc::new(tokio::sync::Semaphore::new(crate::control::SNAPSHOT_READS_MAX)),
    })
}

/// ClientIO and the metrics endpoint, on a tokio runtime of their own;
/// the port, for a front end inside the replica.
fn start_io(
    h: &Handles,
    requests: RequestSender,
    control: Arc<ReplicaControl>,
    client_listener: TcpListener,
    metrics_listener: Option<TcpListener>,
) -> Result<(tokio::runtime::Runtime, Arc<ClientIo>), ReplicaError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(h.config.client_io_threads)
        .thread_name("psmr-client-io")
        .enable_all()
        .build()?;
    let port = ClientPort {
        config: h.config.clone(),
        life: h.life.clone(),
        view: h.view.clone(),
        router: h.router.clone(),
        requests,
        control,
        metrics: h.metrics.client.clone(),
        gate: Arc::new(psmr_auth::Gate::new(&h.config.users, h.config.insecure_clients)?),
        tls: h.tls_for(FacingPort::Client),
    };
    client_listener.set_nonblocking(true)?;
    let listener = {
        let _guard = runtime.enter();
        tokio::net::TcpListener::from_std(client_listener)?
    };
    let io = Arc::new(ClientIo::new(port));
    runtime.spawn(io.clone().serve(listener));
    metrics::spawn(&runtime, h, metrics_listener)?;
    Ok((runtime, io))
}

/// The acceptor of `[client_tls]` for replica `id`, if configured, and the
/// connector its Redis gateway reaches the leader's client port with, if
/// that port is in TLS (trusting `[client_tls]`'s CA, else the peers'):
/// their files are read (and checked) once, at start.
type ClientTlsPair = (Option<psmr_tls::Acceptor>, Option<psmr_tls::Connector>);

fn client_tls(config: &Config, id: u64) -> Result<ClientTlsPair, ReplicaError> {
    let Some(tls) = &config.client_tls else { return Ok((None, None)) };
    let (cert, key) = (PeerTls::for_replica(&tls.cert, id), PeerTls::for_replica(&tls.key, id));
    let deadline = Duration::from_millis(tls.handshake_timeout_ms);
    let acceptor = psmr_tls::Acceptor::load(&cert, &key, tls.ca.as_deref(), deadline)?;
    let ca = tls.ca.as_ref().or(config.peer_tls.as_ref().map(|p| &p.ca));
    let connector = match (config.tls_on(FacingPort::Client), ca) {
        (Some(_), Some(ca)) => Some(psmr_tls::Connector::load(ca, None)?),
        _ => None,
    };
    Ok((Some(acceptor), connector))
}

/// The scheduler `config` asks for: its kind, workers and, for early
/// schedulers, its mapping.
fn sched_config<A: App>(config: &Config, app: &A, model: &ClassModel) -> Result<SchedConfig, ReplicaError> {
    let kind = config.scheduler_kind()?;
    let cpus = psmr_sched::cpus::Cpus::read();
    if config.scheduler.workers > cpus.usable && kind != psmr_sched::SchedulerKind::Sequential {
        // `auto` caps itself; a fixed scheduler runs what it is told.
        tracing::warn!(
            workers = config.scheduler.workers,
            cpus = %cpus.describe(),
            "more execution workers than CPUs this replica can use: the extra ones only queue for a CPU"
        );
    }
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
fn planner<A: App>(app: &Arc<A>, config: &Config) -> Planner {
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

/// ClientIO's test for a read request: every operation decodes
/// and writes no key. An operation that does not decode goes through the
/// log, to be refused there like any other.
fn reads_only<A: App>(app: &Arc<A>) -> OpTest {
    let (app, codec) = (app.clone(), A::Codec::default());
    Arc::new(move |op: &[u8]| {
        use psmr_model::wire::OpCodec;
        codec.decode_op(op).ok().and_then(|op| app.access(&op).ok()).is_some_and(|a| a.writes.is_empty())
    })
}

/// ClientIO's test for an operation only admins may send: it decodes
/// and the application says so.
fn privileged<A: App>(app: &Arc<A>) -> OpTest {
    let (app, codec) = (app.clone(), A::Codec::default());
    Arc::new(move |op: &[u8]| {
        use psmr_model::wire::OpCodec;
        codec.decode_op(op).is_ok_and(|op| app.privileged(&op))
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
    h: &Handles,
    app: Arc<A>,
    sched: SchedConfig,
    log: &Log,
    decisions: queue::Receiver<Decision>,
    protocol: queue::Sender<Inbound>,
) -> Result<manager::Manager<A>, ReplicaError> {
    let config = &h.config;
    let life = h.life.clone();
    let setup = Setup {
        app,
        scheduler: sched,
        cache: psmr_core::CacheLimits::of(config),
        snapshot_every: config.snapshot_every,
        snapshot_every_bytes: config.snapshot_every_bytes,
        replies: h.router.clone(),
        on_failure: Box::new(move |why| life.fail(why)),
    };
    let applier = Applier::new(setup)?;
    let cache = applier.cache_stats();
    let _ = h.metrics.cache.set(Box::new(move || {
        let (seqs, bytes) = cache.size();
        (cache.clients(), seqs, bytes)
    }));
    let snapshots = snapshot::Snapshotter::start(h.life.clone(), h.metrics.clone(), log.clone(), protocol.clone())?;
    let mut io = manager::ManagerIo {
        life: h.life.clone(),
        applied: h.applied.clone(),
        scheduling: h.scheduling.clone(),
        metrics: h.metrics.clone(),
        protocol,
        snapshots,
    };
    psmr_core::apply::ApplyIo::event(&mut io, applier.scheduler_event());
    let mut manager = manager::Manager { applier, decisions, io };
    if let Some(snapshot) = psmr_core::store::Store::kept(log) {
        let opened = psmr_core::state::open_kept(log, &snapshot).map_err(ReplicaError::Failed)?;
        manager.applier.restore(opened, &mut manager.io).map_err(ReplicaError::Failed)?;
    }
    Ok(manager)
}

/// Binds `addr`, saying which address failed.
pub(crate) fn bind(addr: SocketAddr) -> Result<TcpListener, ReplicaError> {
    TcpListener::bind(addr).map_err(|source| ReplicaError::Bind { addr, source })
}
