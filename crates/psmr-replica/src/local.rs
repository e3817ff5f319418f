//! A cluster of replicas inside this process, on loopback: for trying a
//! service, for examples and for tests.
//!
//! Every replica gets listeners bound by the builder on free ports before
//! any replica starts (no other process can take a port in between), the
//! peers authenticate each other with certificates of a fresh cluster CA,
//! and the log lives in memory unless the configuration says otherwise;
//! certificates and data live in a temporary directory removed with the
//! cluster.

use crate::error::ReplicaError;
use crate::replica::Replica;
use crate::start::ReplicaBuilder;
use psmr_core::config::{ClientTls, Config, Member, Storage};
use psmr_model::App;
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Builds a [`LocalCluster`].
#[derive(Clone, Debug)]
pub struct LocalClusterBuilder {
    replicas: u64,
    config: Config,
    redis: bool,
    metrics: bool,
    client_tls: bool,
}

impl Default for LocalClusterBuilder {
    fn default() -> Self {
        let mut config = Config { storage: Storage::Memory, insecure_clients: true, ..Config::default() };
        // Elections in a fraction of a second rather than seconds.
        config.tick_ms = 20;
        config.client_io_threads = 1;
        Self { replicas: 3, config, redis: false, metrics: false, client_tls: false }
    }
}

impl LocalClusterBuilder {
    /// Three replicas, memory storage, the default scheduler.
    pub fn new() -> Self {
        Self::default()
    }

    /// The number of replicas (2f + 1 tolerate f failures).
    pub fn replicas(mut self, n: u64) -> Self {
        self.replicas = n;
        self
    }

    /// The execution scheduler (a name from `psmr_sched::SchedulerKind`)
    /// and its worker count.
    pub fn scheduler(mut self, kind: &str, workers: usize) -> Self {
        self.config.scheduler.kind = kind.into();
        self.config.scheduler.workers = workers;
        self
    }

    /// Gives every replica a Prometheus endpoint (`/metrics`) on a port of
    /// its own (addresses in [`LocalCluster::metrics_addrs`]).
    pub fn metrics(mut self, on: bool) -> Self {
        self.metrics = on;
        self
    }

    /// TLS on every port clients reach, with the replicas' certificates
    /// (which name the loopback hosts); clients may show user
    /// certificates of the cluster's CA (`[client_tls]`, its CA in
    /// [`LocalCluster::config`]). A `[client_tls]` given to
    /// [`LocalClusterBuilder::configure`] keeps its ports and deadline.
    pub fn client_tls(mut self, on: bool) -> Self {
        self.client_tls = on;
        self
    }

    /// Changes anything else in the configuration every replica gets; the
    /// members, certificates and data directory are the builder's.
    pub fn configure(mut self, f: impl FnOnce(&mut Config)) -> Self {
        f(&mut self.config);
        self
    }

    /// Starts every replica, each running the app `app(id)` returns.
    pub fn start<A: App>(self, app: impl FnMut(u64) -> A) -> Result<LocalCluster, ReplicaError> {
        self.launch(app, |builder, _, _| builder)
    }

    /// Starts every replica like [`LocalClusterBuilder::start`], each also
    /// serving Redis clients with the commands `commands(id)` returns
    /// (addresses in [`LocalCluster::redis_addrs`]).
    pub fn start_with_redis<A, C>(
        mut self,
        app: impl FnMut(u64) -> A,
        mut commands: impl FnMut(u64) -> C,
    ) -> Result<LocalCluster, ReplicaError>
    where
        A: App,
        C: psmr_resp::Commands<Op = A::Op, Reply = A::Reply>,
    {
        self.redis = true;
        self.launch(app, move |builder, id, redis: Option<TcpListener>| match redis {
            Some(l) => builder.redis(commands(id)).redis_listener(l),
            None => builder,
        })
    }

    fn launch<A: App>(
        self,
        mut app: impl FnMut(u64) -> A,
        mut extra: impl FnMut(ReplicaBuilder<A>, u64, Option<TcpListener>) -> ReplicaBuilder<A>,
    ) -> Result<LocalCluster, ReplicaError> {
        let dir = tempfile::Builder::new().prefix("psmr-local-").tempdir()?;
        let ids: Vec<u64> = (1..=self.replicas).collect();
        let bound =
            ids.iter().map(|&id| Bound::new(id, self.redis, self.metrics)).collect::<std::io::Result<Vec<_>>>()?;
        let mut config = self.config;
        config.replicas = bound.iter().map(Bound::member).collect::<std::io::Result<_>>()?;
        // Certificates for the replicas that may join later too.
        let certified: Vec<u64> = (1..=self.replicas + JOINERS_MAX).collect();
        let tls = crate::tls::generate(&dir.path().join("certs"), &certified)?;
        if self.client_tls {
            // The files are the builder's; the ports and the deadline may
            // come from `configure`.
            let given = config.client_tls.take();
            let client = given.unwrap_or_else(|| ClientTls::new(PathBuf::new(), PathBuf::new()));
            config.client_tls =
                Some(ClientTls { cert: tls.cert.clone(), key: tls.key.clone(), ca: Some(tls.ca.clone()), ..client });
        }
        config.peer_tls = Some(tls);
        config.insecure_peers = false;
        config.data_dir = dir.path().join("data");
        let mut replicas = Vec::new();
        for Bound { id, client, peer, redis, metrics } in bound {
            let mut builder = ReplicaBuilder::new(app(id), config.clone(), id).listeners(client, peer);
            if let Some(l) = metrics {
                builder = builder.metrics_listener(l);
            }
            replicas.push(Some(extra(builder, id, redis).start()?));
        }
        Ok(LocalCluster { replicas, config, metrics: self.metrics, _dir: dir })
    }
}

/// The listeners of one member, bound before any replica starts.
struct Bound {
    id: u64,
    client: TcpListener,
    peer: TcpListener,
    redis: Option<TcpListener>,
    metrics: Option<TcpListener>,
}

impl Bound {
    fn new(id: u64, redis: bool, metrics: bool) -> std::io::Result<Self> {
        let bind = || TcpListener::bind("127.0.0.1:0");
        let maybe = |on: bool| if on { bind().map(Some) } else { Ok(None) };
        Ok(Self { id, client: bind()?, peer: bind()?, redis: maybe(redis)?, metrics: maybe(metrics)? })
    }

    fn member(&self) -> std::io::Result<Member> {
        let mut m = Member::new(self.id, self.client.local_addr()?, self.peer.local_addr()?);
        m.redis = self.redis.as_ref().map(TcpListener::local_addr).transpose()?;
        m.metrics = self.metrics.as_ref().map(TcpListener::local_addr).transpose()?;
        Ok(m)
    }
}

/// Replicas that may join a [`LocalCluster`] after it started (each needs
/// a certificate of the cluster's CA, made at the start).
pub const JOINERS_MAX: u64 = 8;

/// Replicas running in this process; stopped when dropped.
pub struct LocalCluster {
    replicas: Vec<Option<Replica>>,
    config: Config,
    metrics: bool,
    _dir: tempfile::TempDir,
}

impl LocalCluster {
    /// A builder: three replicas in memory by default.
    pub fn builder() -> LocalClusterBuilder {
        LocalClusterBuilder::new()
    }

    /// The configuration every replica runs.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Where clients connect, one address per replica (stopped ones too).
    pub fn client_addrs(&self) -> Vec<SocketAddr> {
        self.config.replicas.iter().map(|m| m.client).collect()
    }

    /// Where Redis clients connect, one address per replica (empty unless
    /// started with [`LocalClusterBuilder::start_with_redis`]).
    pub fn redis_addrs(&self) -> Vec<SocketAddr> {
        self.config.replicas.iter().filter_map(|m| m.redis).collect()
    }

    /// Where Prometheus scrapes each replica (`http://ADDR/metrics`), one
    /// address per replica (empty unless built with
    /// [`LocalClusterBuilder::metrics`]).
    pub fn metrics_addrs(&self) -> Vec<SocketAddr> {
        self.config.replicas.iter().filter_map(|m| m.metrics).collect()
    }

    /// Replica `id`, unless stopped.
    pub fn replica(&self, id: u64) -> Option<&Replica> {
        self.replicas.get(id.checked_sub(1)? as usize)?.as_ref()
    }

    /// Stops replica `id` (as a crash would, for memory storage); false
    /// if it is not running.
    pub fn stop(&mut self, id: u64) -> bool {
        let slot = id.checked_sub(1).and_then(|i| self.replicas.get_mut(i as usize));
        slot.and_then(Option::take).map(Replica::stop).is_some()
    }

    /// Starts the next replica (id one more than the last) as a joining
    /// replica running `app` (see [`Config::join`]); it becomes a member
    /// once a client asks the leader to add it (`add-replica`, with the
    /// addresses in [`LocalCluster::config`]). It serves no Redis
    /// clients. Returns its id.
    pub fn join<A: App>(&mut self, app: A) -> Result<u64, ReplicaError> {
        let id = self.replicas.len() as u64 + 1;
        let founders = self.config.replicas.iter().filter(|m| m.id <= self.replicas.len() as u64).count() as u64;
        if id > founders + JOINERS_MAX {
            return Err(ReplicaError::Failed(format!("at most {JOINERS_MAX} replicas join a local cluster")));
        }
        let Bound { client, peer, metrics, .. } = Bound::new(id, false, self.metrics)?;
        let mut member = Member::new(id, client.local_addr()?, peer.local_addr()?);
        member.metrics = metrics.as_ref().map(TcpListener::local_addr).transpose()?;
        let mut config = self.config.clone();
        config.replicas.push(member);
        config.join = true;
        let mut builder = ReplicaBuilder::new(app, config.clone(), id).listeners(client, peer);
        if let Some(l) = metrics {
            builder = builder.metrics_listener(l);
        }
        self.replicas.push(Some(builder.start()?));
        config.join = false;
        self.config = config;
        Ok(id)
    }

    /// Waits until every running replica names the same leader, and
    /// returns it; an error after `timeout`.
    pub fn wait_for_leader(&self, timeout: Duration) -> Result<u64, ReplicaError> {
        let start = Instant::now();
        loop {
            let running = self.replicas.iter().flatten().filter(|r| !r.stopping());
            let mut seen = running.map(|r| r.leader());
            let first = seen.next().unwrap_or(0);
            if first != 0 && seen.all(|l| l == first) {
                return Ok(first);
            }
            if start.elapsed() > timeout {
                return Err(ReplicaError::Failed(format!("no leader agreed on within {timeout:?}")));
            }
            // Elections take ticks of tens of ms: polling at a fraction of
            // that costs nothing and needs no hook in the protocol thread.
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}
