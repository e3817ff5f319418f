//! Local clusters of replica *processes*: a new cluster's configuration
//! (free ports, peer certificates), its directory, and the processes
//! themselves, each a `psmr replica --config FILE --id N`, started,
//! killed, restarted and watched. This is what `psmr cluster` and `psmr
//! bench` run; `psmr_bench::faults` kills and restarts replicas through it.
//! For a cluster inside the current process, see
//! [`psmr_replica::LocalCluster`].
//!
//! The executable is a parameter: the `psmr` binary passes its own
//! ([`std::env::current_exe`]), a test passes `env!("CARGO_BIN_EXE_psmr")`.
//! [`start_replica`] is what such a process runs.
//!
//! ```no_run
//! use psmr_harness::launch::{ClusterDir, ClusterSpec, ProcessCluster};
//! use std::time::Duration;
//!
//! let dir = ClusterDir::scratch("psmr-example-")?;
//! let config = ClusterSpec::default().config(dir.path())?;
//! let file = dir.write(&config)?;
//! let exe = std::path::Path::new("target/debug/psmr");
//! let mut cluster = ProcessCluster::start(exe, &file, &config, None)?;
//! cluster.wait_ready(Duration::from_secs(30))?;
//! println!("clients connect to {:?}", cluster.addrs());
//! # Ok::<(), psmr_harness::launch::LaunchError>(())
//! ```

use crate::clock::Clocks;
use crate::probe::Probe;
use psmr_client::ClientError;
use psmr_core::config::{ClientTls, PeerTls};
use psmr_replica::{Config, ConfigError, Member, Replica, ReplicaBuilder, ReplicaError, Storage};
use psmr_services::kv::KvRedis;
use psmr_services::{BuiltIn, KvApp, ListApp, ServiceConfig, WorkloadError};
use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};
use thiserror::Error;

/// Exit status of a replica process that stopped because a thread panicked
/// (fail-stop).
pub const EXIT_PANIC: i32 = 101;

/// Most replicas of a local cluster.
pub const REPLICAS_MAX: u64 = 15;

/// How often a watched cluster's processes are looked at.
const POLL: Duration = Duration::from_millis(100);

/// What can go wrong configuring, starting or running a local cluster.
/// The range errors name the `psmr cluster` flags that set them.
#[derive(Debug, Error)]
pub enum LaunchError {
    /// [`ClusterSpec::replicas`] is out of range.
    #[error("--replicas must be between 1 and {REPLICAS_MAX}, got {0}")]
    Replicas(u64),
    /// Redis ports asked of a service that does not speak Redis.
    #[error("--redis needs --service kv: only the key-value store speaks Redis")]
    RedisNeedsKv,
    /// [`ClusterSpec::hosts`] names neither one host nor one per replica.
    #[error("--hosts names {hosts} hosts for {replicas} replicas: give one for all, or one per replica")]
    Hosts {
        /// Hosts named.
        hosts: usize,
        /// Replicas.
        replicas: u64,
    },
    /// A storage name that is neither `disk` nor `memory`.
    #[error("unknown storage {0:?} (known: disk, memory)")]
    UnknownStorage(String),
    /// The configuration breaks a rule.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The `[service]` section is invalid.
    #[error("invalid configuration: [service]: {0}")]
    Service(#[source] WorkloadError),
    /// The service cannot be set up.
    #[error(transparent)]
    Workload(#[from] WorkloadError),
    /// The `[service]` section does not serialize.
    #[error("the [service] section: {0}")]
    ServiceTable(#[from] toml::ser::Error),
    /// The certificates cannot be made or read.
    #[error("certificates in {dir}: {source}")]
    Certificates {
        /// Where they were to be.
        dir: PathBuf,
        /// Why.
        source: psmr_replica::tls::TlsError,
    },
    /// The cluster's users cannot be made.
    #[error("cannot make the cluster's users: {0}")]
    Users(#[from] psmr_auth::AuthError),
    /// The replicas' own clocks cannot be given.
    #[error(transparent)]
    Clock(#[from] crate::clock::ClockError),
    /// A file, directory, port or process operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Why it failed.
        source: std::io::Error,
    },
    /// A replica cannot start (in this process).
    #[error("replica {id} cannot start: {source}")]
    Start {
        /// The replica.
        id: u64,
        /// Why.
        source: ReplicaError,
    },
    /// The cluster has no replica of that id.
    #[error("no replica {0} to kill")]
    NoSuchReplica(u64),
    /// A replica process exited while the cluster started.
    #[error("replica {id} exited while starting: {status}")]
    ExitedStarting {
        /// The replica.
        id: u64,
        /// How it ended.
        status: ExitStatus,
    },
    /// No leader in time.
    #[error("the cluster did not elect a leader within {} s", .0.as_secs())]
    NotReady(Duration),
    /// Every replica process exited.
    #[error("every replica exited")]
    AllExited,
    /// The probe of the replicas cannot start.
    #[error(transparent)]
    Client(#[from] ClientError),
}

/// The users of a new cluster: [`ADMIN_USER`] and `default` (the data
/// role; a one-argument Redis `AUTH` names it), each with a new random
/// password in `dir/NAME.password`, readable by its owner only.
pub fn make_users(dir: &Path) -> Result<Vec<psmr_auth::UserSpec>, LaunchError> {
    let mut users = Vec::new();
    for (name, role) in [(ADMIN_USER, psmr_auth::Role::Admin), (psmr_auth::DEFAULT_USER, psmr_auth::Role::Data)] {
        let secret = psmr_auth::new_secret()?;
        write_private(&password_file(dir, name), &secret)?;
        let hash = psmr_auth::PasswordHash::new(secret.as_bytes(), psmr_auth::ITERATIONS_DEFAULT)?;
        users.push(psmr_auth::UserSpec { name: name.into(), password: hash.to_string(), role });
    }
    Ok(users)
}

/// Writes `text` and a line end into a new file at `path` that only its
/// owner may read (an existing file is never overwritten).
pub fn write_private(path: &Path, text: &str) -> Result<(), LaunchError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(io(format!("create {}", path.display())))?;
    writeln!(file, "{text}").map_err(io(format!("write {}", path.display())))
}

/// The admin user [`make_users`] makes.
pub const ADMIN_USER: &str = "admin";

/// Where [`make_users`] keeps `user`'s password.
pub fn password_file(dir: &Path, user: &str) -> PathBuf {
    dir.join(format!("{user}.password"))
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> LaunchError {
    let what = what.into();
    move |source| LaunchError::Io { what, source }
}

/// `disk` or `memory`.
pub fn parse_storage(name: &str) -> Result<Storage, LaunchError> {
    match name {
        "memory" => Ok(Storage::Memory),
        "disk" => Ok(Storage::Disk),
        other => Err(LaunchError::UnknownStorage(other.into())),
    }
}

/// Picks `n` free ports on `host`. Every listener stays open until all are
/// chosen: a port closed at once may be handed out again.
pub fn free_ports(host: &str, n: usize) -> Result<Vec<SocketAddr>, LaunchError> {
    let bind = || io(format!("cannot bind a port on {host}"));
    let held = hold_free_ports(host, n).map_err(bind())?;
    held.iter().map(|l| l.local_addr().map_err(bind())).collect()
}

/// The next port [`hold_free_ports`] tries, shared by the process's
/// threads so that two clusters started one after the other get different
/// ports; 0 until first used.
static NEXT_PORT: AtomicU32 = AtomicU32::new(0);

/// `n` listeners on distinct free ports of `host`, below the kernel's range
/// of ephemeral ports (`/proc/sys/net/ipv4/ip_local_port_range`): the
/// kernel never gives one of those to an outgoing connection, so a replica
/// killed and restarted on its port finds it free, where a port of the
/// ephemeral range may meanwhile be the local end of any connection of any
/// process. The ports are tried in turn from a place that depends on the
/// process id (concurrent processes start apart), one cursor for the
/// whole process; where no such port can be bound, the kernel picks.
pub fn hold_free_ports(host: &str, n: usize) -> std::io::Result<Vec<TcpListener>> {
    let (lo, hi) = below_ephemeral();
    let span = u32::from(hi - lo);
    let start = u32::from(lo) + std::process::id().wrapping_mul(7919) % span;
    let _ = NEXT_PORT.compare_exchange(0, start, Ordering::Relaxed, Ordering::Relaxed);
    let mut held = Vec::with_capacity(n);
    for _ in 0..span {
        if held.len() == n {
            break;
        }
        let port = NEXT_PORT.fetch_add(1, Ordering::Relaxed);
        let port = u16::try_from(u32::from(lo) + (port - u32::from(lo)) % span).unwrap_or(lo);
        if let Ok(l) = TcpListener::bind((host, port)) {
            held.push(l);
        }
    }
    while held.len() < n {
        held.push(TcpListener::bind((host, 0))?);
    }
    Ok(held)
}

/// The ports from half the start of the ephemeral range up to it (16384 to
/// 32767 under Linux's default range, 32768 to 60999).
fn below_ephemeral() -> (u16, u16) {
    let first = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|f| f.parse::<u16>().ok()))
        .filter(|&f| f >= 2048)
        .unwrap_or(32768);
    (first / 2, first)
}

/// The configuration's `[service]` section, checked, with the scheduler's
/// mapping checked against the service's class model.
pub fn checked_service(config: &Config) -> Result<ServiceConfig, LaunchError> {
    let service: ServiceConfig = config.service_section()?;
    let model = service.class_model().map_err(LaunchError::Service)?;
    config.mapping(&model)?;
    Ok(service)
}

/// Starts replica `id` of `config` in this process, running the built-in
/// service its `[service]` section names (the kv store with its Redis
/// commands): what a `psmr replica` process runs.
/// With `peer_listen`, the replica listens for its peers there rather than
/// at its configured peer address, which its peers dial (a relay's:
/// [`crate::relay`]).
pub fn start_replica(config: &Config, id: u64, peer_listen: Option<SocketAddr>) -> Result<Replica, LaunchError> {
    let service = checked_service(config)?;
    let listeners = match peer_listen {
        None => None,
        Some(peer) => {
            let me = config.member(id)?;
            let bind = |addr: SocketAddr| TcpListener::bind(addr).map_err(io(format!("cannot listen on {addr}")));
            Some((bind(me.client)?, bind(peer)?))
        }
    };
    let replica = match service.check()? {
        BuiltIn::Kv(_) => {
            let builder = ReplicaBuilder::new(KvApp::new(&service)?, config.clone(), id).redis(KvRedis);
            with_listeners(builder, listeners).start()
        }
        BuiltIn::List(_) => {
            let builder = ReplicaBuilder::new(ListApp::new(&service)?, config.clone(), id);
            with_listeners(builder, listeners).start()
        }
    };
    replica.map_err(|source| LaunchError::Start { id, source })
}

fn with_listeners<A: psmr_model::App>(
    builder: ReplicaBuilder<A>,
    listeners: Option<(TcpListener, TcpListener)>,
) -> ReplicaBuilder<A> {
    match listeners {
        Some((client, peer)) => builder.listeners(client, peer),
        None => builder,
    }
}

/// How a replica process ended, for people.
pub fn describe_exit(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(EXIT_PANIC), _) => "a thread panicked and the replica stopped itself (fail-stop); see its log".into(),
        (Some(1), _) => "stopped on an error; see its log".into(),
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(sig)) => format!("killed by signal {sig}"),
        (None, None) => status.to_string(),
    }
}

/// A new local cluster: what [`ClusterSpec::config`] makes a
/// configuration of. The defaults are those of `psmr cluster`.
#[derive(Clone, Debug)]
pub struct ClusterSpec {
    /// Replicas, 1 to [`REPLICAS_MAX`] (2f+1 tolerate f crashes).
    pub replicas: u64,
    /// Hosts the replicas listen on, each on free ports: one for all, or
    /// one per replica (replica N on the Nth), whose peer connections then
    /// leave from it as from a host of its own (`127.0.0.11`,
    /// `127.0.0.12`, ... on one machine: all of `127.0.0.0/8` is loopback).
    pub hosts: Vec<String>,
    /// The built-in service every replica runs.
    pub service: ServiceConfig,
    /// Everything else every replica gets: scheduler, storage, batching,
    /// pipeline, snapshots, `insecure_peers`... Its members, service
    /// section, data directory and certificates are the spec's to set.
    pub base: Config,
    /// Give each replica a Prometheus endpoint on a free port.
    pub metrics: bool,
    /// Give each replica a Redis port on a free port (kv only).
    pub redis: bool,
    /// TLS on every port clients reach (`[client_tls]`), with the
    /// replicas' certificates (made even where peers are insecure), which
    /// name the spec's hosts; clients may show user certificates of the
    /// cluster's CA.
    pub client_tls: bool,
}

impl Default for ClusterSpec {
    fn default() -> Self {
        Self {
            replicas: 3,
            hosts: vec!["127.0.0.1".into()],
            service: ServiceConfig::default(),
            // Tests and benchmarks drive their clusters without users;
            // `psmr cluster` makes users unless told otherwise.
            base: Config { insecure_clients: true, ..Config::default() },
            metrics: false,
            redis: false,
            client_tls: false,
        }
    }
}

impl ClusterSpec {
    /// A new cluster's configuration: free ports on the host, replica data
    /// under `dir`, (unless `base.insecure_peers`) a new cluster CA and
    /// replica certificates under `dir/certs`, and (unless
    /// `base.insecure_clients` or `base.users` lists some) the users
    /// [`make_users`] makes.
    pub fn config(&self, dir: &Path) -> Result<Config, LaunchError> {
        if !(1..=REPLICAS_MAX).contains(&self.replicas) {
            return Err(LaunchError::Replicas(self.replicas));
        }
        if self.redis && self.service.kind != "kv" {
            return Err(LaunchError::RedisNeedsKv);
        }
        let mut config = Config {
            replicas: self.members()?,
            service: toml::Table::try_from(&self.service)?,
            data_dir: dir.to_path_buf(),
            peer_tls: None,
            // Every other rule is checked before the certificates are
            // made, so that a bad value leaves no files behind to refuse
            // the next attempt.
            insecure_peers: true,
            insecure_clients: true,
            users: Vec::new(),
            ..self.base.clone()
        };
        config.validate()?;
        checked_service(&config)?;
        if !self.base.insecure_peers || self.client_tls {
            let tls = self.certificates(&config, dir)?;
            if self.client_tls {
                let client = ClientTls::new(tls.cert.clone(), tls.key.clone());
                config.client_tls = Some(ClientTls { ca: Some(tls.ca.clone()), ..client });
            }
            if !self.base.insecure_peers {
                config.peer_tls = Some(tls);
                config.insecure_peers = false;
            }
            config.validate()?;
        }
        if !self.base.insecure_clients {
            config.users = match self.base.users.is_empty() {
                true => make_users(dir)?,
                false => self.base.users.clone(),
            };
            config.insecure_clients = false;
            config.validate()?;
        }
        Ok(config)
    }

    /// A new cluster CA and certificates under `dir/certs`, for the
    /// replicas of `config` and those that may join later (`psmr replica
    /// --join`, then `psmr client add-replica`), naming the spec's hosts.
    fn certificates(&self, config: &Config, dir: &Path) -> Result<PeerTls, LaunchError> {
        let last = config.replicas.iter().map(|m| m.id).max().unwrap_or(0);
        let ids: Vec<u64> = (1..=last + psmr_replica::local::JOINERS_MAX).collect();
        let certs = dir.join("certs");
        let mut hosts: Vec<&str> = psmr_replica::tls::LOOPBACK_HOSTS.to_vec();
        hosts.extend(self.hosts.iter().map(String::as_str).filter(|h| !psmr_replica::tls::LOOPBACK_HOSTS.contains(h)));
        psmr_replica::tls::generate_for_hosts(&certs, &ids, &hosts)
            .map_err(|source| LaunchError::Certificates { dir: certs, source })
    }

    /// Members 1 to `replicas`, each on free ports: client, peer, then
    /// metrics and Redis if asked for.
    fn members(&self) -> Result<Vec<Member>, LaunchError> {
        let per = 2 + usize::from(self.metrics) + usize::from(self.redis);
        let ports = match self.hosts.as_slice() {
            [host] => free_ports(host, per * self.replicas as usize)?,
            hosts if hosts.len() as u64 == self.replicas => {
                let each: Result<Vec<_>, _> = hosts.iter().map(|h| free_ports(h, per)).collect();
                each?.concat()
            }
            hosts => return Err(LaunchError::Hosts { hosts: hosts.len(), replicas: self.replicas }),
        };
        let members = (1..=self.replicas).zip(ports.chunks(per)).map(|(id, p)| {
            let mut extra = p[2..].iter().copied();
            let metrics = if self.metrics { extra.next() } else { None };
            let redis = if self.redis { extra.next() } else { None };
            Member { id, client: p[0], peer: p[1], redis, metrics }
        });
        Ok(members.collect())
    }
}

/// What a client of `config`'s cluster needs to reach its client ports in
/// TLS (trusting `[client_tls]`'s CA), if they are.
pub fn client_connector(config: &Config) -> Result<Option<psmr_client::Connector>, LaunchError> {
    let tls = config.tls_on(psmr_core::config::FacingPort::Client);
    match tls.and_then(|t| t.ca.as_ref().or(config.peer_tls.as_ref().map(|p| &p.ca))) {
        Some(ca) => Ok(Some(
            psmr_client::Connector::load(ca, None)
                .map_err(|source| LaunchError::Certificates { dir: ca.clone(), source })?,
        )),
        None => Ok(None),
    }
}

/// A cluster's directory: its configuration (`cluster.toml`) and each
/// replica's data (`replica-N`); a scratch one is removed when dropped.
#[derive(Debug)]
pub struct ClusterDir {
    path: PathBuf,
    _scratch: Option<tempfile::TempDir>,
}

impl ClusterDir {
    /// The directory at `path` (created when a configuration is written),
    /// kept when dropped.
    pub fn at(path: &Path) -> Self {
        Self { path: path.to_path_buf(), _scratch: None }
    }

    /// A new directory under the system's temporary directory, named
    /// `prefix` and random characters, private to this user (never one
    /// another process could have planted), removed when dropped.
    pub fn scratch(prefix: &str) -> Result<Self, LaunchError> {
        let t = tempfile::Builder::new()
            .prefix(prefix)
            .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .tempdir()
            .map_err(io("cannot make a temporary directory"))?;
        Ok(Self { path: t.path().to_path_buf(), _scratch: Some(t) })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Its configuration file, `cluster.toml`.
    pub fn config_file(&self) -> PathBuf {
        self.path.join("cluster.toml")
    }

    /// The configuration of the cluster that ran here before, if any.
    pub fn existing(&self) -> Result<Option<Config>, LaunchError> {
        let file = self.config_file();
        Ok(if file.exists() { Some(Config::from_file(&file)?) } else { None })
    }

    /// Writes `config` as the directory's configuration; returns its file.
    pub fn write(&self, config: &Config) -> Result<PathBuf, LaunchError> {
        std::fs::create_dir_all(&self.path).map_err(io(format!("cannot create {}", self.path.display())))?;
        let file = self.config_file();
        std::fs::write(&file, config.to_toml()).map_err(io(format!("cannot write {}", file.display())))?;
        Ok(file)
    }
}

/// The replica processes of one cluster on this machine, each a `psmr
/// replica`; dropping it kills them all.
pub struct ProcessCluster {
    children: Vec<(u64, Child)>,
    /// Client addresses, in replica id order.
    addrs: Vec<SocketAddr>,
    config_file: PathBuf,
    exe: PathBuf,
    /// Where each replica's stderr goes (`replica-N.log`, appended), and
    /// its stdout nowhere; `None`: both inherited.
    logs: Option<PathBuf>,
    /// Replicas killed on purpose and not restarted yet.
    killed: Vec<u64>,
    /// Replicas started with `--join`, and the configuration that lists
    /// them (a restart reads it).
    joined: Vec<(u64, PathBuf)>,
    /// Where replicas behind a relay listen for their peers
    /// (`--peer-listen`).
    peer_listen: BTreeMap<u64, SocketAddr>,
    /// TLS to the client ports, if they are in TLS.
    tls: Option<psmr_client::Connector>,
    /// The replicas' own clocks, if they run on them.
    clocks: Option<Clocks>,
}

/// How [`ProcessCluster::start_with`] starts replicas, besides their
/// configuration.
#[derive(Clone, Debug, Default)]
pub struct Spawn {
    /// Where each replica's stderr goes (`replica-N.log`, appended), and
    /// its stdout nowhere; `None`: both inherited.
    pub logs: Option<PathBuf>,
    /// Where replicas behind a relay listen for their peers, each behind a
    /// relay at its configured address ([`crate::relay::Relays`]).
    pub peer_listen: BTreeMap<u64, SocketAddr>,
    /// Clocks of their own that the nemesis moves, if any.
    pub clocks: Option<Clocks>,
}

impl ProcessCluster {
    /// Starts one `exe replica --config config_file --id N` per member of
    /// `config` (the contents of `config_file`); with `logs`, their output
    /// goes to files there.
    pub fn start(exe: &Path, config_file: &Path, config: &Config, logs: Option<&Path>) -> Result<Self, LaunchError> {
        Self::start_behind(exe, (config_file, config), logs, BTreeMap::new())
    }

    /// As [`ProcessCluster::start`], each replica of `peer_listen`
    /// listening for its peers at its address there, behind a relay at its
    /// configured one ([`crate::relay::Relays`]).
    pub fn start_behind(
        exe: &Path,
        (config_file, config): (&Path, &Config),
        logs: Option<&Path>,
        peer_listen: BTreeMap<u64, SocketAddr>,
    ) -> Result<Self, LaunchError> {
        let spawn = Spawn { logs: logs.map(Path::to_path_buf), peer_listen, clocks: None };
        Self::start_with(exe, (config_file, config), spawn)
    }

    /// As [`ProcessCluster::start`], the replicas started as `spawn` says.
    pub fn start_with(
        exe: &Path,
        (config_file, config): (&Path, &Config),
        Spawn { logs, peer_listen, clocks }: Spawn,
    ) -> Result<Self, LaunchError> {
        let tls = client_connector(config)?;
        let mut cluster = ProcessCluster {
            tls,
            children: Vec::new(),
            addrs: config.replicas.iter().map(|m| m.client).collect(),
            config_file: config_file.to_path_buf(),
            exe: exe.to_path_buf(),
            logs,
            killed: Vec::new(),
            joined: Vec::new(),
            peer_listen,
            clocks,
        };
        for m in &config.replicas {
            // On error the cluster is dropped, which stops those started.
            let child = cluster.spawn(m.id, &cluster.config_file, false)?;
            cluster.children.push((m.id, child));
        }
        Ok(cluster)
    }

    fn spawn(&self, id: u64, config_file: &Path, join: bool) -> Result<Child, LaunchError> {
        let mut command = Command::new(&self.exe);
        command.arg("replica").arg("--config").arg(config_file).arg("--id").arg(id.to_string());
        if join {
            command.arg("--join");
        }
        if let Some(addr) = self.peer_listen.get(&id) {
            command.arg("--peer-listen").arg(addr.to_string());
        }
        if let Some(clocks) = &self.clocks {
            command.envs(clocks.env(id)?);
        }
        if let Some(dir) = &self.logs {
            std::fs::create_dir_all(dir).map_err(io(format!("cannot create {}", dir.display())))?;
            let file = dir.join(format!("replica-{id}.log"));
            let log = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&file)
                .map_err(io(format!("cannot open {}", file.display())))?;
            command.stdout(Stdio::null()).stderr(log);
        }
        tracing::debug!(id, exe = %self.exe.display(), "starting a replica process");
        command.spawn().map_err(io(format!("cannot start replica {id}")))
    }

    /// Starts replica `id` with `--join` from `config_file`, a
    /// configuration that lists it beside the members; it waits, empty,
    /// for `add-replica` ([`psmr_client::Client::change_membership`]).
    pub fn join(&mut self, id: u64, config_file: &Path, client: SocketAddr) -> Result<(), LaunchError> {
        let child = self.spawn(id, config_file, true)?;
        self.children.push((id, child));
        self.joined.push((id, config_file.to_path_buf()));
        self.addrs.push(client);
        Ok(())
    }

    /// Client addresses of the replicas, in id order.
    pub fn addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// Kills replica `id` with SIGKILL (a crash) and waits for it to die.
    pub fn kill(&mut self, id: u64) -> Result<(), LaunchError> {
        let (_, child) = self.children.iter_mut().find(|(i, _)| *i == id).ok_or(LaunchError::NoSuchReplica(id))?;
        child.kill().map_err(io(format!("cannot kill replica {id}")))?;
        let _ = child.wait();
        self.killed.push(id);
        Ok(())
    }

    /// Sends replica `id` the signal named `signal` (`STOP`, `CONT`, ...),
    /// as `kill -SIGNAL` does.
    pub fn signal(&self, id: u64, signal: &str) -> Result<(), LaunchError> {
        let (_, child) = self.children.iter().find(|(i, _)| *i == id).ok_or(LaunchError::NoSuchReplica(id))?;
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(child.id().to_string())
            .status()
            .map_err(io(format!("cannot signal replica {id}")))?;
        match status.success() {
            true => Ok(()),
            false => Err(io(format!("kill -{signal} of replica {id}"))(std::io::Error::other(status.to_string()))),
        }
    }

    /// Stops every replica cleanly: SIGCONT (a paused one must run to
    /// stop) and SIGTERM, then waits up to `grace` for them to exit, and
    /// kills those still running: their ids.
    pub fn stop(&mut self, grace: Duration) -> Vec<u64> {
        let mut running = Vec::new();
        for (id, c) in self.children.iter_mut() {
            if matches!(c.try_wait(), Ok(None)) {
                running.push(*id);
            }
        }
        for &id in &running {
            let _ = self.signal(id, "CONT");
            let _ = self.signal(id, "TERM");
        }
        let end = Instant::now() + grace;
        let mut killed = Vec::new();
        for (id, c) in self.children.iter_mut() {
            while matches!(c.try_wait(), Ok(None)) && Instant::now() < end {
                std::thread::sleep(Duration::from_millis(20));
            }
            if matches!(c.try_wait(), Ok(None)) {
                killed.push(*id);
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        killed
    }

    /// Starts replica `id` again from its data directory.
    pub fn restart(&mut self, id: u64) -> Result<(), LaunchError> {
        let joined = self.joined.iter().find(|(i, _)| *i == id).map(|(_, f)| f);
        let child = self.spawn(id, joined.unwrap_or(&self.config_file), false)?;
        if let Some(slot) = self.children.iter_mut().find(|(i, _)| *i == id) {
            slot.1 = child;
        }
        self.killed.retain(|&k| k != id);
        Ok(())
    }

    /// The leader the answering replicas know of, if any.
    pub fn leader(&self) -> Option<u64> {
        self.probe().ok()?.leader(Duration::from_millis(500))
    }

    /// Replicas that have exited on their own (not killed on purpose),
    /// with their status.
    pub fn exited(&mut self) -> Vec<(u64, ExitStatus)> {
        let killed = &self.killed;
        self.children
            .iter_mut()
            .filter(|(id, _)| !killed.contains(id))
            .filter_map(|(id, c)| c.try_wait().ok().flatten().map(|s| (*id, s)))
            .collect()
    }

    /// How replica `id` exited, if it exited on its own (not killed on
    /// purpose).
    pub fn exit_of(&mut self, id: u64) -> Option<ExitStatus> {
        self.exited().into_iter().find(|(i, _)| *i == id).map(|(_, s)| s)
    }

    /// The last error replica `id` logged, without colours: its log's
    /// last line that says `ERROR` or `error:` (none without `logs`).
    pub fn last_error(&self, id: u64) -> Option<String> {
        let file = self.logs.as_ref()?.join(format!("replica-{id}.log"));
        let text = std::fs::read(file).ok()?;
        let text = String::from_utf8_lossy(&text);
        let line = text.lines().rev().find(|l| l.contains("ERROR") || l.contains("error:"))?;
        Some(without_colours(line).trim().to_string())
    }

    /// The credentials of `user` of a cluster whose users [`make_users`]
    /// made beside its configuration file; None for a cluster without
    /// users (or whose passwords are kept elsewhere).
    pub fn user(&self, user: &str) -> Option<psmr_client::Credentials> {
        let dir = self.config_file.parent()?;
        psmr_client::Credentials::from_file(user, &password_file(dir, user)).ok()
    }

    /// What a client needs to reach the client ports in TLS, if they are.
    pub fn tls(&self) -> Option<psmr_client::Connector> {
        self.tls.clone()
    }

    /// A probe of the replicas, as the admin (where there are users).
    fn probe(&self) -> Result<Probe, ClientError> {
        Ok(Probe::new(&self.addrs)?.as_user(self.user(ADMIN_USER)).with_tls(self.tls()))
    }

    /// Waits until every replica answers and one of them leads.
    pub fn wait_ready(&mut self, timeout: Duration) -> Result<(), LaunchError> {
        let deadline = Instant::now() + timeout;
        let probe = self.probe()?;
        loop {
            if let Some((id, status)) = self.exited().into_iter().next() {
                return Err(LaunchError::ExitedStarting { id, status });
            }
            if probe.statuses(Duration::from_secs(1)).iter().all(|r| r.as_ref().is_ok_and(|s| s.leader != 0)) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(LaunchError::NotReady(timeout));
            }
            std::thread::sleep(POLL);
        }
    }

    /// Watches the replicas until `stop` is set, telling `on_exit` of each
    /// that exits on its own, once; fails when every one has exited.
    pub fn supervise(
        &mut self,
        stop: &AtomicBool,
        mut on_exit: impl FnMut(u64, ExitStatus),
    ) -> Result<(), LaunchError> {
        let mut reported = std::collections::HashSet::new();
        while !stop.load(Ordering::SeqCst) {
            for (id, status) in self.exited() {
                if reported.insert(id) {
                    on_exit(id, status);
                }
            }
            if reported.len() == self.children.len() {
                return Err(LaunchError::AllExited);
            }
            std::thread::sleep(POLL);
        }
        Ok(())
    }
}

/// `line` without its ANSI escape sequences (`ESC [ ... letter`).
fn without_colours(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c != '\x1b' {
            out.push(c);
            continue;
        }
        if chars.next() == Some('[') {
            for e in chars.by_ref() {
                if e.is_ascii_alphabetic() {
                    break;
                }
            }
        }
    }
    out
}

impl Drop for ProcessCluster {
    fn drop(&mut self) {
        for (_, c) in self.children.iter_mut() {
            let _ = c.kill();
        }
        for (_, c) in self.children.iter_mut() {
            let _ = c.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_are_checked_before_any_file_is_made() {
        let dir = ClusterDir::scratch("psmr-launch-test-").unwrap();
        let bad = |spec: ClusterSpec| spec.config(dir.path()).unwrap_err().to_string();
        assert!(bad(ClusterSpec { replicas: 0, ..ClusterSpec::default() }).contains("between 1 and 15"));
        let list = ServiceConfig { kind: "list".into(), ..ServiceConfig::default() };
        assert!(bad(ClusterSpec { redis: true, service: list, ..ClusterSpec::default() }).contains("--redis"));
        let mut base = Config::default();
        base.scheduler.kind = "fastest".into();
        assert!(bad(ClusterSpec { base, ..ClusterSpec::default() }).contains("fastest"));
        assert!(!dir.path().join("certs").exists());
        assert_eq!(parse_storage("tape").unwrap_err().to_string(), "unknown storage \"tape\" (known: disk, memory)");
    }

    #[test]
    fn a_spec_gives_every_replica_its_own_ports_and_certificates() {
        let dir = ClusterDir::scratch("psmr-launch-test-").unwrap();
        let spec = ClusterSpec { metrics: true, redis: true, ..ClusterSpec::default() };
        let config = spec.config(dir.path()).unwrap();
        let addrs: std::collections::HashSet<SocketAddr> = config.replicas.iter().flat_map(Member::addrs).collect();
        assert_eq!(addrs.len(), 3 * 4);
        assert!(config.replicas.iter().all(|m| m.metrics.is_some() && m.redis.is_some()));
        assert!(!config.insecure_peers && dir.path().join("certs/replica-3.key").exists());
        let file = dir.write(&config).unwrap();
        assert_eq!(dir.existing().unwrap(), Some(config));
        assert_eq!(file, dir.config_file());
        let path = dir.path().to_path_buf();
        drop(dir);
        assert!(!path.exists(), "a scratch directory goes with its owner");
    }

    #[test]
    fn colours_come_off_log_lines() {
        let line = "\x1b[2m2026\x1b[0m \x1b[31mERROR\x1b[0m cannot persist: no space";
        assert_eq!(without_colours(line), "2026 ERROR cannot persist: no space");
        assert_eq!(without_colours("plain"), "plain");
        assert_eq!(without_colours("cut \x1b"), "cut ");
    }

    /// A stand-in for `psmr` that ignores its arguments and runs `body`.
    fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    #[test]
    fn free_ports_lie_below_the_ephemeral_range_and_are_not_handed_out_twice() {
        let (lo, hi) = below_ephemeral();
        assert!(lo < hi && hi >= 1024, "{lo}..{hi}");
        let first = free_ports("127.0.0.1", 6).unwrap();
        let second = free_ports("127.0.0.1", 6).unwrap();
        let ports: std::collections::BTreeSet<u16> = first.iter().chain(&second).map(SocketAddr::port).collect();
        assert_eq!(ports.len(), 12, "two calls, twelve different ports: {first:?} {second:?}");
        // Where another process holds the whole range the kernel picks;
        // on a test machine it does not.
        assert!(ports.iter().all(|&p| (lo..hi).contains(&p)), "{ports:?} outside {lo}..{hi}");
        // Each is free: it binds again once its listener is gone.
        for a in &first {
            TcpListener::bind(a).unwrap_or_else(|e| panic!("{a}: {e}"));
        }
    }

    #[test]
    fn processes_are_killed_restarted_and_watched() {
        let dir = ClusterDir::scratch("psmr-launch-test-").unwrap();
        let base = Config { insecure_peers: true, ..Config::default() };
        let config = ClusterSpec { base, ..ClusterSpec::default() }.config(dir.path()).unwrap();
        let file = dir.write(&config).unwrap();
        // Both written before anything starts: a script still open for
        // writing in a forked child cannot be executed.
        let sleeper = script(dir.path(), "sleeper", "exec sleep 60");
        let panicker = script(dir.path(), "panicker", &format!("exit {EXIT_PANIC}"));
        let logs = dir.path().join("logs");

        let mut cluster = ProcessCluster::start(&sleeper, &file, &config, Some(&logs)).unwrap();
        assert_eq!(cluster.addrs().len(), 3);
        cluster.kill(2).unwrap();
        assert!(cluster.exited().is_empty(), "a replica killed on purpose has not exited on its own");
        cluster.restart(2).unwrap();
        assert!(matches!(cluster.kill(9), Err(LaunchError::NoSuchReplica(9))));
        assert!(logs.join("replica-3.log").exists());
        assert!(cluster.supervise(&AtomicBool::new(true), |_, _| panic!("nothing exited")).is_ok());
        drop(cluster);

        let mut cluster = ProcessCluster::start(&panicker, &file, &config, None).unwrap();
        let mut seen = Vec::new();
        let stopped = cluster.supervise(&AtomicBool::new(false), |id, status| seen.push((id, describe_exit(status))));
        assert!(matches!(stopped, Err(LaunchError::AllExited)));
        seen.sort();
        assert_eq!(seen.iter().map(|s| s.0).collect::<Vec<_>>(), [1, 2, 3]);
        assert!(seen.iter().all(|(_, why)| why.contains("fail-stop")), "{seen:?}");
        assert!(matches!(cluster.wait_ready(Duration::from_secs(1)), Err(LaunchError::ExitedStarting { .. })));
    }
}
