//! A replica's configuration: the cluster's static membership, the service,
//! the scheduler and the pipeline's limits, read from TOML and checked
//! before anything starts.

use psmr_model::wire::FRAME_MAX_DEFAULT;
use psmr_sched::SchedulerKind;
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;
use thiserror::Error;

/// Default of [`Config::queue_bytes_max`]: 64 MiB per queue, 64 entries of
/// the largest size a leader makes by default.
pub const QUEUE_BYTES_MAX_DEFAULT: usize = 64 << 20;

/// Errors in a configuration.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// The file cannot be read.
    #[error("cannot read configuration {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not valid TOML for a configuration.
    #[error("invalid configuration {path}: {message}")]
    Parse {
        /// The file.
        path: String,
        /// The parser's message (with line and column).
        message: String,
    },
    /// A value breaks a rule.
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

/// One member of the cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Member {
    /// Raft id, at least 1, unique.
    pub id: u64,
    /// Where clients connect.
    pub client: SocketAddr,
    /// Where the other replicas connect.
    pub peer: SocketAddr,
    /// Where Redis clients connect, if this replica serves the Redis
    /// protocol (an application that speaks it, such as the kv store).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redis: Option<SocketAddr>,
    /// Where Prometheus scrapes this replica's metrics (`/metrics`), if
    /// anywhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<SocketAddr>,
}

impl Member {
    /// Member `id` serving clients at `client` and peers at `peer`, with
    /// neither a Redis nor a metrics endpoint.
    pub fn new(id: u64, client: SocketAddr, peer: SocketAddr) -> Self {
        Self { id, client, peer, redis: None, metrics: None }
    }

    /// Every address this member listens on.
    pub fn addrs(&self) -> impl Iterator<Item = SocketAddr> + '_ {
        [Some(self.client), Some(self.peer), self.redis, self.metrics].into_iter().flatten()
    }
}

/// Where the raft log lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Storage {
    /// In memory: a crashed replica has lost its state and must not rejoin
    /// under the same id (the papers' crash-stop model).
    Memory,
    /// On disk under `data_dir` (raft-engine, synced): a replica that
    /// crashed restarts from its directory and rejoins.
    #[default]
    Disk,
}

/// The execution scheduler.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SchedulerConfig {
    /// A scheduler name (`psmr_sched::SchedulerKind`).
    pub kind: String,
    /// Worker threads.
    pub workers: usize,
    /// Early schedulers: `default` (the service's documented mapping) or
    /// a class-to-threads mapping in the compact form
    /// `R=conc:0,1;W=seq:0-1` (what `psmr mapping` prints as its spec).
    pub mapping: String,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self { kind: "early".into(), workers: 2, mapping: "default".into() }
    }
}

/// Mutual TLS between replicas: every replica proves its id with a
/// certificate issued by the cluster's CA, and accepts raft messages only
/// from replicas that did the same (`psmr certs` makes the files).
///
/// `{id}` in `cert` and `key` stands for the replica's id, so that one
/// configuration serves every member. Relative paths are relative to the
/// working directory, like `data_dir`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerTls {
    /// The cluster CA's certificate (PEM).
    pub ca: PathBuf,
    /// This replica's certificate (PEM), e.g. `certs/replica-{id}.pem`.
    pub cert: PathBuf,
    /// This replica's private key (PEM, readable by its owner only), e.g.
    /// `certs/replica-{id}.key`.
    pub key: PathBuf,
}

impl PeerTls {
    /// `path` with `{id}` replaced by `id`.
    pub fn for_replica(path: &Path, id: u64) -> PathBuf {
        PathBuf::from(path.to_string_lossy().replace("{id}", &id.to_string()))
    }
}

/// A port that clients reach.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FacingPort {
    /// psmr's own client port.
    Client,
    /// The Redis port.
    Redis,
    /// The metrics port (HTTPS when in TLS).
    Metrics,
}

impl FacingPort {
    /// Every port clients reach.
    pub const ALL: [FacingPort; 3] = [FacingPort::Client, FacingPort::Redis, FacingPort::Metrics];

    /// The name the configuration gives it.
    pub fn name(self) -> &'static str {
        match self {
            FacingPort::Client => "client",
            FacingPort::Redis => "redis",
            FacingPort::Metrics => "metrics",
        }
    }
}

/// TLS on the ports clients reach (`psmr certs` makes the files; a
/// replica's certificate names the hosts clients dial). Required for a
/// port that listens beyond loopback, unless `insecure_clients`.
///
/// `{id}` in `cert` and `key` stands for the replica's id, as in
/// [`PeerTls`]; the replicas' peer certificates serve here too.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientTls {
    /// The certificate this replica shows clients (PEM), e.g.
    /// `certs/replica-{id}.pem`.
    pub cert: PathBuf,
    /// Its private key (PEM, readable by its owner only).
    pub key: PathBuf,
    /// The CA whose user certificates (`psmr certs --user NAME`) let a
    /// client prove it is user `NAME` without a password; a certificate
    /// from another CA is refused. None: clients show no certificate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca: Option<PathBuf>,
    /// The ports in TLS (`client`, `redis`, `metrics`); all by default.
    #[serde(default = "ClientTls::all_ports")]
    pub ports: Vec<FacingPort>,
    /// A client's TLS handshake must finish within this, in ms, or its
    /// connection is closed.
    #[serde(default = "ClientTls::handshake_default")]
    pub handshake_timeout_ms: u64,
}

impl ClientTls {
    fn all_ports() -> Vec<FacingPort> {
        FacingPort::ALL.to_vec()
    }

    fn handshake_default() -> u64 {
        5_000
    }

    /// TLS on every port clients reach, with `cert` and `key`.
    pub fn new(cert: PathBuf, key: PathBuf) -> Self {
        Self { cert, key, ca: None, ports: Self::all_ports(), handshake_timeout_ms: Self::handshake_default() }
    }
}

/// A replica's configuration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// The cluster, every member including this one (2f+1 of them). A
    /// cluster's first start makes them its members; later membership
    /// changes (`psmr client add-replica` / `remove-replica`) live in the
    /// log, and a replica learns the members' addresses from there.
    pub replicas: Vec<Member>,
    /// This replica joins a running cluster instead of founding one: it
    /// starts with an empty log and no members, and waits for the leader
    /// (which adds it with `psmr client add-replica`) to send it the log or
    /// a snapshot. `replicas` must list this replica and where to reach
    /// the current members. Ignored when the data directory already holds
    /// a log.
    pub join: bool,
    /// The service's own section (`[service]`), read by the application
    /// that starts the replica ([`Config::service_section`]); the replica
    /// itself never looks inside.
    pub service: toml::Table,
    /// The scheduler.
    pub scheduler: SchedulerConfig,
    /// Where the log lives.
    pub storage: Storage,
    /// Disk storage: replica `N` keeps its data in `data_dir/replica-N`.
    pub data_dir: PathBuf,
    /// Mutual TLS between replicas (required unless `insecure_peers`).
    pub peer_tls: Option<PeerTls>,
    /// Accept peers without authentication: any process that reaches a
    /// peer port can then speak raft to this replica. Only for closed test
    /// networks and for measuring what TLS costs.
    pub insecure_peers: bool,
    /// Who may use the client and Redis ports, and as what
    /// (`[[users]]`: `name`, `password` as a hash from `psmr passwd`,
    /// `role` = `data` or `admin`). Every replica of a cluster lists the
    /// same users. Required unless `insecure_clients`.
    pub users: Vec<psmr_auth::UserSpec>,
    /// Serve clients without authentication: every connection may read,
    /// write, flush and change the membership. Only where every process
    /// that can reach the client and Redis ports is trusted.
    pub insecure_clients: bool,
    /// TLS on the ports clients reach (`[client_tls]`); plain TCP if
    /// absent, which only loopback addresses allow (or
    /// `insecure_clients`).
    pub client_tls: Option<ClientTls>,
    /// ClientIO threads.
    pub client_io_threads: usize,
    /// Most client connections at once. A new connection beyond it closes
    /// the connection that has been idle longest (if one has been idle for
    /// a second or more), otherwise it is refused.
    pub max_connections: usize,
    /// A client connection with no request for this long is closed, in ms.
    pub client_idle_timeout_ms: u64,
    /// A frame (client or peer) must arrive whole within this long of its
    /// first byte, in ms; a slower sender is disconnected.
    pub frame_timeout_ms: u64,
    /// Bytes of client frames being read or waiting for the Batcher, over
    /// all connections (a connection waits for room before reading a
    /// frame); and, separately, bytes of replies waiting to be written
    /// (replies beyond it are dropped; a retry gets them again).
    pub client_buffer_bytes_max: usize,
    /// Batching: most commands in one log entry.
    pub batch_max_commands: usize,
    /// Batching: most bytes of operations in one log entry.
    pub batch_max_bytes: usize,
    /// Batching: longest a request waits for its entry to fill while
    /// earlier entries are in flight, in µs (with nothing in flight it is
    /// proposed at once; see the protocol's batcher).
    pub batch_delay_us: u64,
    /// Log entries the leader has proposed and not yet applied, at most
    /// (pipelining).
    pub pipeline: usize,
    /// Serve reads through the log like writes. By default the leader
    /// serves a request whose commands all only read without a log entry,
    /// as linearizable as through the log (raft's ReadIndex, see
    /// `crate::reads`): one heartbeat round for every read waiting, and
    /// only the leader executes them.
    pub reads_through_log: bool,
    /// Bound of every queue between stages, in items.
    pub queue_depth: usize,
    /// Bound of the queues between stages that carry log entries (peer
    /// messages to the protocol thread, committed entries to the service
    /// manager), in bytes each; an item larger than it passes alone.
    pub queue_bytes_max: usize,
    /// Longest frame accepted from a client, in bytes.
    pub frame_max: usize,
    /// Longest frame accepted from another replica, in bytes: raft's
    /// appends and a snapshot's chunks (see `snapshot_chunk_bytes`).
    pub peer_frame_max: usize,
    /// Sequence numbers per client the reply cache remembers.
    pub reply_window: u64,
    /// Clients the reply cache remembers (least recently active forgotten
    /// first).
    pub reply_clients: usize,
    /// Write sequence numbers the reply cache remembers over all clients
    /// (least recently active clients forgotten first).
    pub reply_seqs_max: usize,
    /// Bytes of write outcomes the reply cache keeps per client (older
    /// outcomes give way first; reads are never cached).
    pub reply_bytes_per_client: usize,
    /// Bytes of write outcomes the reply cache keeps in total.
    pub reply_bytes_max: usize,
    /// Take a snapshot and compact the log every this many entries...
    pub snapshot_every: u64,
    /// ...or every this many bytes of entries, whichever comes first: a
    /// log of large entries is compacted before a lagging follower would
    /// have to be sent gigabytes of it.
    pub snapshot_every_bytes: u64,
    /// Bytes of a snapshot's file a leader sends a follower in one chunk
    /// (`crate::transfer`), at most 16 MiB; cut to fit in a peer frame
    /// (`peer_frame_max` less 1 KiB) if larger.
    pub snapshot_chunk_bytes: usize,
    /// Chunks a leader sends ahead of the follower's acknowledgements:
    /// the flow control of a transfer (chunk × window bytes in flight).
    pub snapshot_window_chunks: usize,
    /// Bytes a follower receives between two syncs of the file: a
    /// transfer cut by a crash resumes from the last synced chunk.
    pub snapshot_sync_bytes: u64,
    /// Snapshot transfers a leader runs at once (one per follower at most).
    pub snapshot_transfers_max: usize,
    /// A transfer without progress for this long, in ms, is abandoned (raft
    /// offers a snapshot again later).
    pub snapshot_stall_ms: u64,
    /// Raft tick, in ms.
    pub tick_ms: u64,
    /// Ticks without a leader before a follower campaigns.
    pub election_ticks: usize,
    /// Ticks between a leader's heartbeats.
    pub heartbeat_ticks: usize,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            replicas: Vec::new(),
            join: false,
            service: toml::Table::new(),
            scheduler: SchedulerConfig::default(),
            storage: Storage::Disk,
            data_dir: PathBuf::from("psmr-data"),
            peer_tls: None,
            insecure_peers: false,
            users: Vec::new(),
            insecure_clients: false,
            client_tls: None,
            client_io_threads: 2,
            max_connections: 10_000,
            client_idle_timeout_ms: 300_000,
            frame_timeout_ms: 10_000,
            client_buffer_bytes_max: 256 << 20,
            batch_max_commands: 1_000,
            batch_max_bytes: 1 << 20,
            batch_delay_us: 200,
            pipeline: 8,
            reads_through_log: false,
            queue_depth: 1_024,
            queue_bytes_max: QUEUE_BYTES_MAX_DEFAULT,
            frame_max: FRAME_MAX_DEFAULT,
            peer_frame_max: 256 << 20,
            reply_window: 1_024,
            reply_clients: 100_000,
            reply_seqs_max: 1_000_000,
            reply_bytes_per_client: 1 << 20,
            reply_bytes_max: 64 << 20,
            snapshot_every: 10_000,
            snapshot_every_bytes: 1 << 30,
            snapshot_chunk_bytes: 1 << 20,
            snapshot_window_chunks: 8,
            snapshot_sync_bytes: 16 << 20,
            snapshot_transfers_max: 2,
            snapshot_stall_ms: 10_000,
            tick_ms: 50,
            election_ticks: 10,
            heartbeat_ticks: 2,
        }
    }
}

fn bounded(name: &str, value: u64, min: u64, max: u64) -> Result<(), ConfigError> {
    if value < min || value > max {
        return Err(ConfigError::Invalid(format!("{name} must be between {min} and {max}, got {value}")));
    }
    Ok(())
}

impl Config {
    /// Reads and checks a TOML file.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ConfigError::Read { path: path.display().to_string(), source })?;
        let config: Config = toml::from_str(&text)
            .map_err(|e| ConfigError::Parse { path: path.display().to_string(), message: e.to_string() })?;
        config.validate()?;
        Ok(config)
    }

    /// The configuration as TOML.
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).expect("a configuration always serializes")
    }

    /// Checks every rule; the first broken one is the error.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let n = self.replicas.len();
        if n == 0 {
            return Err(ConfigError::Invalid("no replicas listed".into()));
        }
        let mut ids: Vec<u64> = self.replicas.iter().map(|m| m.id).collect();
        ids.sort_unstable();
        if ids[0] == 0 {
            return Err(ConfigError::Invalid("replica ids start at 1 (0 means none in raft)".into()));
        }
        if let Some(w) = ids.windows(2).find(|w| w[0] == w[1]) {
            return Err(ConfigError::Invalid(format!("replica id {} is listed twice", w[0])));
        }
        let mut addrs: Vec<SocketAddr> = self.replicas.iter().flat_map(Member::addrs).collect();
        addrs.sort_unstable();
        if let Some(w) = addrs.windows(2).find(|w| w[0] == w[1]) {
            return Err(ConfigError::Invalid(format!("address {} is used twice", w[0])));
        }
        self.scheduler_kind()?;
        bounded("scheduler.workers", self.scheduler.workers as u64, 1, psmr_sched::WORKERS_MAX as u64)?;
        match (&self.peer_tls, self.insecure_peers) {
            (None, false) => {
                return Err(ConfigError::Invalid(
                    "peers are not authenticated: give [peer_tls] (`psmr certs` makes a cluster CA and a \
                     certificate per replica) or, on a closed network only, set insecure_peers = true"
                        .into(),
                ))
            }
            (Some(_), true) => {
                return Err(ConfigError::Invalid("peer_tls and insecure_peers = true exclude each other".into()))
            }
            _ => {}
        }
        psmr_auth::Gate::new(&self.users, self.insecure_clients).map_err(|e| ConfigError::Invalid(e.to_string()))?;
        self.check_client_tls()?;
        bounded("client_io_threads", self.client_io_threads as u64, 1, 256)?;
        bounded("max_connections", self.max_connections as u64, 1, 1_000_000)?;
        bounded("client_idle_timeout_ms", self.client_idle_timeout_ms, 100, 86_400_000)?;
        bounded("frame_timeout_ms", self.frame_timeout_ms, 10, 3_600_000)?;
        bounded("batch_max_commands", self.batch_max_commands as u64, 1, 100_000)?;
        bounded("batch_max_bytes", self.batch_max_bytes as u64, 1, (self.frame_max / 2) as u64)?;
        bounded("batch_delay_us", self.batch_delay_us, 0, 1_000_000)?;
        bounded("pipeline", self.pipeline as u64, 1, 1_024)?;
        bounded("queue_depth", self.queue_depth as u64, 1, 1 << 20)?;
        bounded("queue_bytes_max", self.queue_bytes_max as u64, 1 << 16, 1 << 40)?;
        bounded("frame_max", self.frame_max as u64, 1 << 10, 1 << 30)?;
        bounded("peer_frame_max", self.peer_frame_max as u64, self.frame_max as u64, 1 << 31)?;
        // Room for at least one largest frame, or a client could wait forever.
        bounded("client_buffer_bytes_max", self.client_buffer_bytes_max as u64, self.frame_max as u64, 1 << 40)?;
        bounded("reply_window", self.reply_window, 1, 1 << 20)?;
        bounded("reply_clients", self.reply_clients as u64, 1, 10_000_000)?;
        bounded("reply_seqs_max", self.reply_seqs_max as u64, 1, 1 << 32)?;
        bounded("reply_bytes_per_client", self.reply_bytes_per_client as u64, 0, 1 << 40)?;
        bounded("reply_bytes_max", self.reply_bytes_max as u64, self.reply_bytes_per_client as u64, 1 << 40)?;
        bounded("snapshot_every", self.snapshot_every, 1, u64::MAX)?;
        bounded("snapshot_every_bytes", self.snapshot_every_bytes, 1, 1 << 40)?;
        bounded("snapshot_chunk_bytes", self.snapshot_chunk_bytes as u64, 1, crate::transfer::CHUNK_MAX as u64)?;
        bounded("snapshot_window_chunks", self.snapshot_window_chunks as u64, 1, 1_024)?;
        bounded("snapshot_sync_bytes", self.snapshot_sync_bytes, 1, 1 << 40)?;
        bounded("snapshot_transfers_max", self.snapshot_transfers_max as u64, 1, 64)?;
        bounded("snapshot_stall_ms", self.snapshot_stall_ms, 100, 3_600_000)?;
        bounded("tick_ms", self.tick_ms, 1, 10_000)?;
        bounded("heartbeat_ticks", self.heartbeat_ticks as u64, 1, 1_000)?;
        if self.election_ticks <= self.heartbeat_ticks {
            return Err(ConfigError::Invalid(format!(
                "election_ticks ({}) must exceed heartbeat_ticks ({})",
                self.election_ticks, self.heartbeat_ticks
            )));
        }
        Ok(())
    }

    /// `[client_tls]` if `port` is in TLS.
    pub fn tls_on(&self, port: FacingPort) -> Option<&ClientTls> {
        self.client_tls.as_ref().filter(|t| t.ports.contains(&port))
    }

    /// The ports clients reach are in TLS where they listen beyond
    /// loopback, unless every client is trusted.
    fn check_client_tls(&self) -> Result<(), ConfigError> {
        if let Some(tls) = &self.client_tls {
            bounded("client_tls.handshake_timeout_ms", tls.handshake_timeout_ms, 10, 600_000)?;
            if tls.ports.is_empty() {
                return Err(ConfigError::Invalid("client_tls.ports is empty: list client, redis or metrics".into()));
            }
            let forwards = tls.ports.contains(&FacingPort::Client) && self.replicas.iter().any(|m| m.redis.is_some());
            if forwards && tls.ca.is_none() && self.peer_tls.is_none() {
                return Err(ConfigError::Invalid(
                    "client_tls: the Redis ports reach the leader's client port in TLS and need a CA to trust: \
                     give client_tls.ca (or [peer_tls])"
                        .into(),
                ));
            }
        }
        if self.insecure_clients {
            return Ok(());
        }
        for m in &self.replicas {
            let ports =
                [(FacingPort::Client, Some(m.client)), (FacingPort::Redis, m.redis), (FacingPort::Metrics, m.metrics)];
            for (port, addr) in ports {
                let Some(addr) = addr.filter(|a| !a.ip().is_loopback()) else { continue };
                if self.tls_on(port).is_none() {
                    return Err(ConfigError::Invalid(format!(
                        "replica {}'s {} port listens on {addr}, beyond loopback, in plain TCP: give [client_tls] \
                         with {:?} in its ports (`psmr certs` makes the files) or, where every process that can \
                         reach it is trusted, set insecure_clients = true",
                        m.id,
                        port.name(),
                        port.name()
                    )));
                }
            }
        }
        Ok(())
    }

    /// The `[service]` section as the application's own type `T`; an
    /// error names what in it is wrong.
    pub fn service_section<T: serde::de::DeserializeOwned>(&self) -> Result<T, ConfigError> {
        T::deserialize(toml::Value::Table(self.service.clone()))
            .map_err(|e| ConfigError::Invalid(format!("[service]: {}", e.message())))
    }

    /// The mapping the configuration asks for, for `model`: `None` for
    /// `default` (the application's, see [`psmr_model::App::default_mapping`]).
    pub fn mapping(&self, model: &psmr_model::ClassModel) -> Result<Option<psmr_model::Mapping>, ConfigError> {
        match self.scheduler.mapping.as_str() {
            "default" => Ok(None),
            spec => psmr_model::Mapping::from_spec(model, self.scheduler.workers, spec)
                .map(Some)
                .map_err(|e| ConfigError::Invalid(format!("scheduler.mapping: {e}"))),
        }
    }

    /// The scheduler's kind.
    pub fn scheduler_kind(&self) -> Result<SchedulerKind, ConfigError> {
        self.scheduler.kind.parse().map_err(|e: psmr_sched::SchedError| ConfigError::Invalid(e.to_string()))
    }

    /// The member with `id`.
    pub fn member(&self, id: u64) -> Result<&Member, ConfigError> {
        self.replicas.iter().find(|m| m.id == id).ok_or_else(|| {
            let ids: Vec<String> = self.replicas.iter().map(|m| m.id.to_string()).collect();
            ConfigError::Invalid(format!("replica {id} is not in the configuration (ids: {})", ids.join(", ")))
        })
    }

    /// Where replica `id` keeps its data (disk storage).
    pub fn replica_dir(&self, id: u64) -> PathBuf {
        self.data_dir.join(format!("replica-{id}"))
    }

    /// The raft tick.
    pub fn tick(&self) -> Duration {
        Duration::from_millis(self.tick_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn three() -> Config {
        let m = |id: u64| {
            let addr = |port: u64| format!("127.0.0.1:{port}").parse().unwrap();
            Member::new(id, addr(7000 + id), addr(7100 + id))
        };
        Config { replicas: vec![m(1), m(2), m(3)], insecure_peers: true, insecure_clients: true, ..Config::default() }
    }

    #[test]
    fn round_trips_through_toml() {
        let c = three();
        c.validate().unwrap();
        let back: Config = toml::from_str(&c.to_toml()).unwrap();
        assert_eq!(back, c);
    }

    #[test]
    fn bad_values_are_named() {
        let mut c = three();
        c.replicas[1].id = 1;
        assert!(c.validate().unwrap_err().to_string().contains("replica id 1 is listed twice"));
        let mut c = three();
        c.replicas[2].peer = c.replicas[0].client;
        assert!(c.validate().unwrap_err().to_string().contains("used twice"));
        let mut c = three();
        c.replicas[1].metrics = Some(c.replicas[0].peer);
        assert!(c.validate().unwrap_err().to_string().contains("used twice"));
        let mut c = three();
        c.scheduler.kind = "fastest".into();
        assert!(c.validate().unwrap_err().to_string().contains("unknown scheduler \"fastest\""));
        let mut c = three();
        c.pipeline = 0;
        assert!(c.validate().unwrap_err().to_string().contains("pipeline must be between 1 and"));
        let mut c = three();
        c.election_ticks = 2;
        assert!(c.validate().unwrap_err().to_string().contains("must exceed heartbeat_ticks"));
        assert!(Config::default().validate().unwrap_err().to_string().contains("no replicas"));
        let mut c = three();
        c.insecure_peers = false;
        assert!(c.validate().unwrap_err().to_string().contains("peers are not authenticated"));
        let mut c = three();
        c.insecure_clients = false;
        assert!(c.validate().unwrap_err().to_string().contains("no users"));
        assert!(three().member(9).unwrap_err().to_string().contains("replica 9 is not in the configuration"));
    }

    #[test]
    fn the_documented_sample_is_valid() {
        let readme = include_str!("../../../docs/cluster.md");
        let start = readme.find("```toml\n").expect("a TOML sample") + 8;
        let sample = &readme[start..start + readme[start..].find("```").expect("its end")];
        let c: Config = toml::from_str(sample).unwrap();
        c.validate().unwrap();
        assert_eq!(c.replicas.len(), 3);
    }

    #[test]
    fn the_documented_values_are_the_defaults() {
        let doc = include_str!("../../../docs/cluster.md");
        let start = doc.find("```toml\n").expect("a TOML sample") + 8;
        let sample: toml::Table = toml::from_str(&doc[start..start + doc[start..].find("```").unwrap()]).unwrap();
        let defaults = toml::Table::try_from(Config::default()).unwrap();
        let differ: Vec<String> = sample
            .iter()
            .filter(|(_, v)| !v.is_table() && !v.is_array())
            .filter(|(k, v)| defaults.get(*k) != Some(v))
            .map(|(k, v)| format!("{k}: shown {v}, default {:?}", defaults.get(k)))
            .collect();
        assert!(differ.is_empty(), "docs/cluster.md's sample shows values that are not the defaults: {differ:?}");
    }

    #[test]
    fn every_key_is_documented() {
        let doc = include_str!("../../../docs/cluster.md");
        let tls = PeerTls { ca: "ca.pem".into(), cert: "c.pem".into(), key: "c.key".into() };
        let client = ClientTls { ca: Some("ca.pem".into()), ..ClientTls::new("c.pem".into(), "c.key".into()) };
        let keys =
            toml::Table::try_from(Config { peer_tls: Some(tls), client_tls: Some(client.clone()), ..three() }).unwrap();
        let client_keys = toml::Table::try_from(client).unwrap();
        let shown =
            |k: &String| [format!("\n{k} ="), format!("\n[{k}]"), format!("\n[[{k}]]")].iter().any(|p| doc.contains(p));
        let missing: Vec<&String> = keys.keys().chain(client_keys.keys()).filter(|k| !shown(k)).collect();
        assert!(missing.is_empty(), "docs/cluster.md's sample does not show {missing:?}");
    }

    #[test]
    fn ports_beyond_loopback_need_tls_unless_every_client_is_trusted() {
        let mut c = three();
        c.replicas[1].redis = Some("10.0.0.2:6379".parse().unwrap());
        c.validate().unwrap();
        c.insecure_clients = false;
        c.users = vec![psmr_auth::UserSpec {
            name: "u".into(),
            password: psmr_auth::PasswordHash::new(b"pw", psmr_auth::ITERATIONS_MIN).unwrap().to_string(),
            role: psmr_auth::Role::Data,
        }];
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("replica 2's redis port listens on 10.0.0.2:6379, beyond loopback"), "{e}");
        let mut tls = ClientTls::new("c.pem".into(), "c.key".into());
        tls.ports = vec![FacingPort::Client, FacingPort::Metrics];
        tls.ca = Some("ca.pem".into());
        c.client_tls = Some(tls.clone());
        assert!(c.validate().unwrap_err().to_string().contains("redis port"));
        tls.ports.push(FacingPort::Redis);
        c.client_tls = Some(tls.clone());
        c.validate().unwrap();
        // The Redis gateway's own client needs a CA to trust the leader.
        c.client_tls = Some(ClientTls { ca: None, ..tls.clone() });
        assert!(c.validate().unwrap_err().to_string().contains("need a CA to trust"));
        tls.ports.clear();
        c.client_tls = Some(tls.clone());
        assert!(c.validate().unwrap_err().to_string().contains("client_tls.ports is empty"));
        let text = "cert = \"c\"\nkey = \"k\"\nports = [\"gopher\"]\n";
        assert!(toml::from_str::<ClientTls>(text).is_err());
        let text = "cert = \"c\"\nkey = \"k\"\n";
        assert_eq!(toml::from_str::<ClientTls>(text).unwrap().ports, FacingPort::ALL.to_vec());
    }

    #[test]
    fn unknown_keys_are_refused() {
        let text = three().to_toml() + "\nbatch_size = 3\n";
        let e = toml::from_str::<Config>(&text).unwrap_err().to_string();
        assert!(e.contains("batch_size"), "{e}");
    }
}
