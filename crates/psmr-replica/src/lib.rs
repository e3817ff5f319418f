//! # psmr-replica: one replica of a psmr cluster
//!
//! Replicas agree on one log with Raft (raft-rs); one log entry is one
//! batch of client commands; each replica executes the log with the
//! execution scheduler of its configuration, on many cores, and answers
//! the clients connected to it. The threads follow the staged architecture
//! of 002 §V, stages joined by bounded queues:
//!
//! ```text
//! clients ─▶ ClientIO (tokio, N threads) ─▶ Protocol (batching, raft) ─▶ ServiceManager ─▶ scheduler workers
//!               ▲                                  ▲      │                                      │
//!               └──────── replies (router) ◀───────┼──────┼──────────────────────────────────────┘
//!                               ReplicaIO receivers ┘      └▶ ReplicaIO senders (one per peer)
//! ```
//!
//! * ClientIO ([`client_io`]): framed, versioned client protocol
//!   ([`psmr_model::wire`]); a follower *redirects* clients to the leader
//!   (it does not forward: a redirect costs one round trip once per leader
//!   change, forwarding would cost a hop on every request).
//! * Batching ([`batcher`], on the protocol thread: one hand-off less per
//!   entry): a lone request is proposed at once; entries grow while
//!   earlier ones are in flight, bounded in commands, bytes and delay.
//! * Protocol ([`protocol`]): the raft node; pipelining bounded by
//!   `pipeline` entries proposed and not applied; every peer message
//!   passes the [`guard`] first.
//! * ReplicaIO ([`peer`]): blocking sockets authenticated by mutual TLS
//!   ([`tls`]), a sender thread per peer and a receiver thread per
//!   authenticated peer (handshakes in a bounded pool); never blocks the
//!   protocol thread.
//! * ServiceManager ([`manager`]): reply cache ([`cache`]: each client
//!   command executes once), scheduler, snapshots and log compaction.
//!
//! Storage ([`store::Log`]) is on disk ([`disk`]: raft-engine, synced,
//! recovered after a crash, damage refused with the help of the sync
//! record in [`synced`]) or in memory (the papers' crash-stop model: a
//! replica that crashed must not come back under the same id, and its peers
//! refuse it if it tries, see [`peer`]).
//!
//! Fail-stop: a panic in any thread of a replica (a stage, a ClientIO task,
//! an execution worker) stops the whole replica with the reason
//! ([`Replica::wait`] returns it); it never runs on without that thread.

pub mod app;
pub mod batcher;
pub mod cache;
pub mod client_io;
pub mod config;
pub mod disk;
pub mod guard;
pub mod manager;
pub mod peer;
pub mod protocol;
pub mod ratelog;
pub mod router;
pub mod stages;
pub mod store;
pub mod synced;
pub mod tls;

pub use app::{App, KvApp, ListApp};
pub use config::{Config, ConfigError, Member, Storage};

use crate::cache::ReplyCache;
use crate::manager::{Manager, ManagerSink};
use crate::router::Router;
use parking_lot::{Condvar, Mutex};
use psmr_sched::SchedConfig;
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
    /// Raft refused to start.
    #[error("raft: {0}")]
    Raft(#[from] raft::Error),
    /// The data directory cannot be used.
    #[error(transparent)]
    Storage(#[from] disk::DiskError),
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
    /// Raft messages from peers that the [`guard`] refused: each breaks
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
    /// The scheduler's per-worker metrics, once it runs (early schedulers).
    pub worker_metrics: std::sync::OnceLock<Arc<psmr_sched::Metrics>>,
    stopping: AtomicBool,
    stop_tx: tokio::sync::watch::Sender<bool>,
    failure: Mutex<Option<String>>,
    failed: Condvar,
}

impl Shared {
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

    /// Records that log entry `index` is applied, and wakes the protocol
    /// thread if it waits for room in the pipeline (through `protocol`,
    /// its inbound queue).
    pub(crate) fn set_applied(&self, index: u64, protocol: &crossbeam::channel::Sender<peer::Inbound>) {
        self.applied.store(index, Ordering::SeqCst);
        // SeqCst on both sides (see `Protocol::pipeline_room`): either the
        // protocol thread saw this index, or this sees its flag.
        if self.protocol_waits.swap(false, Ordering::SeqCst) {
            // Full means the protocol thread has messages to wake it.
            let _ = protocol.try_send(peer::Inbound::Applied);
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

impl Replica {
    /// Starts replica `id` of `config` running `app`.
    pub fn start<A: App>(config: Config, id: u64, app: A) -> Result<Replica, ReplicaError> {
        config.validate()?;
        stages::init();
        let me = config.member(id)?.clone();
        let kind = config.scheduler_kind()?;
        let peer_listener =
            TcpListener::bind(me.peer).map_err(|source| ReplicaError::Bind { addr: me.peer, source })?;
        let client_listener =
            TcpListener::bind(me.client).map_err(|source| ReplicaError::Bind { addr: me.client, source })?;
        let client_addr = client_listener.local_addr()?;
        let fresh = {
            use std::hash::{BuildHasher, Hasher};
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u128(
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos(),
            );
            h.finish() | 1
        };
        // The log: a fresh one in memory, or whatever the data directory
        // holds (with the snapshot to restore before replaying it).
        let voters: Vec<u64> = config.replicas.iter().map(|m| m.id).collect();
        let (log, incarnation, recovered) = match config.storage {
            Storage::Memory => (store::Log::Memory(store::LogStore::new(voters)), fresh, None),
            Storage::Disk => {
                let disk = disk::DiskStore::open(&config.replica_dir(id), voters)?;
                // The directory's own, kept in its sync record (and by a
                // repair): `fresh` is for memory storage only.
                let incarnation = disk.incarnation();
                let snapshot = disk.snapshot_kept();
                (store::Log::Disk(disk), incarnation, snapshot)
            }
        };
        let recovered_index = recovered.as_ref().map_or(0, |s| s.get_metadata().index);
        let (stop_tx, _) = tokio::sync::watch::channel(false);
        let shared = Arc::new(Shared {
            config: config.clone(),
            id,
            incarnation,
            incarnations: Mutex::new(HashMap::new()),
            repaired: AtomicBool::new(log.vote_floor().is_some()),
            leader: AtomicU64::new(0),
            term: AtomicU64::new(0),
            is_leader: AtomicBool::new(false),
            applied: AtomicU64::new(0),
            protocol_waits: AtomicBool::new(false),
            router: Arc::new(Router::new(config.client_buffer_bytes_max)),
            stats: Stats::default(),
            worker_metrics: std::sync::OnceLock::new(),
            stopping: AtomicBool::new(false),
            stop_tx,
            failure: Mutex::new(None),
            failed: Condvar::new(),
        });
        let mut replica = Replica { shared: shared.clone(), client_addr, threads: Vec::new(), runtime: None };

        // Execution.
        let app = Arc::new(app);
        let cache = Arc::new(ReplyCache::new(cache::Limits {
            window: config.reply_window,
            clients: config.reply_clients,
            seqs_max: config.reply_seqs_max,
            bytes_per_client: config.reply_bytes_per_client,
            bytes_max: config.reply_bytes_max,
        }));
        let sink = Arc::new(ManagerSink::new(app.clone(), cache.clone(), shared.clone()));
        let mut sched = SchedConfig::new(kind, config.scheduler.workers);
        if kind.needs_mapping() {
            let workers = config.scheduler.workers;
            let mapping = match config.scheduler.mapping.as_str() {
                "default" => app.default_mapping(workers),
                // Checked by `Config::validate` against the same model.
                spec => psmr_model::Mapping::from_spec(app.model(), workers, spec)
                    .map_err(|e| ConfigError::Invalid(format!("scheduler.mapping: {e}")))?,
            };
            sched = sched.with_mapping(mapping);
        }
        // Timing the waits costs two clock reads per wait; the per-worker
        // picture it gives (`psmr bench`) is worth that.
        sched.metrics = true;
        let scheduler = psmr_sched::build(&sched, app.service().clone(), app.model(), sink.clone())?;
        if let Some(m) = scheduler.metrics() {
            let _ = shared.worker_metrics.set(m);
        }

        // Queues between the stages.
        let depth = config.queue_depth;
        let (inbound_tx, inbound_rx) = crossbeam::channel::bounded(depth);
        let (decision_tx, decision_rx) = crossbeam::channel::bounded(depth);
        let (request_tx, request_rx) = batcher::request_queue(depth);

        // ReplicaIO. The certificates are loaded before any peer thread
        // starts: a replica that cannot authenticate must not run at all.
        let tls = match &config.peer_tls {
            Some(files) => Some(Arc::new(tls::PeerTlsContext::load(files, id)?)),
            None => None,
        };
        let mut peers = HashMap::new();
        for m in config.replicas.iter().filter(|m| m.id != id) {
            peers.insert(m.id, peer::spawn_sender(&shared, m.id, m.peer, tls.clone())?);
        }
        let accept = peer::spawn_listener(&shared, peer_listener, tls, inbound_tx.clone())?;
        replica.threads.push(accept);

        // Raft.
        let store = log;
        let raft_config = raft::Config {
            id,
            applied: recovered_index,
            election_tick: config.election_ticks,
            heartbeat_tick: config.heartbeat_ticks,
            max_size_per_msg: (config.peer_frame_max / 4) as u64,
            max_inflight_msgs: 256,
            check_quorum: true,
            pre_vote: true,
            // Followers learn the commit index from the next append or
            // heartbeat instead of from an append of its own after every
            // commit: half the peer messages (and their wake-ups) per
            // entry. Clients hear from the leader, which knows at once; a
            // follower applies at most one heartbeat later when idle.
            skip_bcast_commit: true,
            ..raft::Config::default()
        };
        raft_config.validate()?;
        let logger = slog::Logger::root(RaftLog, slog::o!("replica" => id));
        let node = raft::RawNode::new(&raft_config, store.clone(), &logger)?;
        let protocol = protocol::Protocol {
            shared: shared.clone(),
            node,
            store,
            peers,
            inbound: inbound_rx,
            requests: request_rx,
            batcher: batcher::Batcher::new(batcher::Limits {
                max_commands: config.batch_max_commands,
                max_bytes: config.batch_max_bytes,
                delay: std::time::Duration::from_micros(config.batch_delay_us),
            }),
            decisions: decision_tx.clone(),
        };
        let mut manager = Manager {
            shared: shared.clone(),
            app: app.clone(),
            cache,
            sink,
            scheduler,
            decisions: decision_rx,
            protocol: inbound_tx,
            submitted: 0,
            applied_term: 0,
            since_snapshot: 0,
        };
        if let Some(snapshot) = &recovered {
            manager.restore(snapshot).map_err(ReplicaError::Failed)?;
        }
        replica.spawn("psmr-protocol", move || protocol.run())?;
        replica.spawn("psmr-manager", move || manager.run())?;

        // ClientIO.
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(config.client_io_threads)
            .thread_name("psmr-client-io")
            .enable_all()
            .build()?;
        let io = Arc::new(client_io::ClientIo::new(shared.clone(), request_tx, decision_tx));
        client_listener.set_nonblocking(true)?;
        let listener = {
            let _guard = runtime.enter();
            tokio::net::TcpListener::from_std(client_listener)?
        };
        runtime.spawn(io.serve(listener));
        replica.runtime = Some(runtime);
        info!(id, %client_addr, peer = %me.peer, scheduler = %kind, "replica started");
        Ok(replica)
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

/// Sends raft-rs's log records to `tracing`.
struct RaftLog;

impl slog::Drain for RaftLog {
    type Ok = ();
    type Err = slog::Never;
    fn log(&self, record: &slog::Record<'_>, _values: &slog::OwnedKVList) -> Result<(), slog::Never> {
        match record.level() {
            slog::Level::Critical | slog::Level::Error => tracing::error!(target: "raft", "{}", record.msg()),
            slog::Level::Warning => tracing::warn!(target: "raft", "{}", record.msg()),
            slog::Level::Info => tracing::info!(target: "raft", "{}", record.msg()),
            _ => tracing::debug!(target: "raft", "{}", record.msg()),
        }
        Ok(())
    }
}
