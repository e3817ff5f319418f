//! `psmr replica`, `psmr cluster` and `psmr client`: running replicas and
//! talking to them.

use crate::load::LoadSpec;
use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Subcommand};
use psmr_client::{Client, ClientConfig};
use psmr_replica::{Config, KvApp, ListApp, Member, Replica, Storage};
use psmr_services::kv::{KvCodec, KvOp, KvReply};
use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `psmr replica`.
#[derive(Args, Debug)]
pub struct ReplicaArgs {
    /// The cluster's configuration (TOML; see the README).
    #[arg(long)]
    config: PathBuf,
    /// This replica's id in the configuration.
    #[arg(long)]
    id: u64,
    /// Disk storage: keep this replica's data in DIR/replica-ID [default:
    /// the configuration's data_dir].
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Disk storage, after the replica refused to start on damaged data:
    /// move its data aside to DIR/replica-ID.damaged-<unix time> (nothing
    /// is deleted), rebuild it empty under the same identity (keeping its
    /// term and vote, with a vote floor at what it had synced), then start;
    /// it catches up from the leader. Never done automatically.
    #[arg(long)]
    repair: bool,
}

/// Set while this process runs a replica: a panic in any thread then ends
/// the process with [`EXIT_PANIC`] (see `main`).
pub static FAIL_STOP: AtomicBool = AtomicBool::new(false);

/// Exit status of a replica process that stopped because a thread panicked.
pub const EXIT_PANIC: i32 = 101;

/// Runs one replica until it fails or is killed.
pub fn replica(args: ReplicaArgs) -> Result<()> {
    FAIL_STOP.store(true, Ordering::SeqCst);
    let mut config = Config::from_file(&args.config)?;
    if let Some(dir) = args.data_dir {
        config.data_dir = dir;
    }
    if args.repair {
        if config.storage != Storage::Disk {
            bail!("--repair applies to disk storage only: a replica in memory keeps nothing to repair");
        }
        let report = psmr_replica::disk::DiskStore::repair(&config.replica_dir(args.id))
            .with_context(|| format!("replica {}: repair", args.id))?;
        println!("{report}");
    }
    let replica = match config.service.kind.as_str() {
        "list" => Replica::start(config.clone(), args.id, ListApp::new(&config.service)),
        _ => Replica::start(config.clone(), args.id, KvApp::new(&config.service)),
    }
    .with_context(|| format!("replica {} cannot start", args.id))?;
    println!("replica {} listening on {} pid {}", args.id, replica.client_addr(), std::process::id());
    if let Err(e) = replica.wait() {
        // Exit at once: joining the replica's threads could wait forever
        // on the one that failed.
        eprintln!("psmr: error: replica {}: {e}", args.id);
        std::process::exit(1);
    }
    Ok(())
}

/// How a replica process ended, for people.
pub(crate) fn describe_exit(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(EXIT_PANIC), _) => "a thread panicked and the replica stopped itself (fail-stop); see its log".into(),
        (Some(1), _) => "stopped on an error; see its log".into(),
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(sig)) => format!("killed by signal {sig}"),
        (None, None) => status.to_string(),
    }
}

/// `psmr cluster`.
#[derive(Args, Debug)]
pub struct ClusterArgs {
    /// Number of replicas (2f+1 tolerates f crashes).
    #[arg(long, default_value_t = 3)]
    pub(crate) replicas: u64,
    /// The replicated service: kv (key-value store) or list (sharded
    /// linked list).
    #[arg(long, default_value = "kv")]
    pub(crate) service: String,
    /// Class model. kv: readers-writers or sharded; list: readers-writers,
    /// sharded-snapshot or sharded-global.
    #[arg(long, default_value = "readers-writers")]
    pub(crate) model: String,
    /// Shards of the kv key space (sharded model) or of the list.
    #[arg(long, default_value_t = 1)]
    pub(crate) shards: usize,
    /// kv: keys the store starts with.
    #[arg(long, default_value_t = 0)]
    pub(crate) keys: u64,
    /// Execution cost: light, moderate or heavy (list: 1, 1k, 10k entries
    /// per shard).
    #[arg(long, default_value = "light")]
    pub(crate) cost: String,
    /// Early schedulers' class-to-threads mapping: default, or a spec
    /// such as `R=conc:0,1;W=seq:0-1` (`psmr mapping` prints one).
    #[arg(long, default_value = "default")]
    pub(crate) mapping: String,
    /// Execution scheduler of every replica.
    #[arg(long, default_value = "early")]
    pub(crate) scheduler: String,
    /// Worker threads per replica.
    #[arg(long, default_value_t = 2)]
    pub(crate) workers: usize,
    /// Where each replica keeps its log: disk (synced, survives crashes) or
    /// memory (a crashed replica cannot rejoin).
    #[arg(long, default_value = "disk")]
    pub(crate) storage: String,
    /// ClientIO threads per replica.
    #[arg(long, default_value_t = 2)]
    pub(crate) client_io_threads: usize,
    /// Most commands in one log entry.
    #[arg(long, default_value_t = 1000)]
    pub(crate) batch_max_commands: usize,
    /// Longest a request waits for its log entry to fill while earlier
    /// entries are in flight, in µs (with none in flight it goes at once).
    #[arg(long, default_value_t = 200)]
    pub(crate) batch_delay_us: u64,
    /// Log entries proposed and not yet applied, at most.
    #[arg(long, default_value_t = 8)]
    pub(crate) pipeline: usize,
    /// Log entries between snapshots.
    #[arg(long, default_value_t = 10_000)]
    pub(crate) snapshot_every: u64,
    /// Host the replicas listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub(crate) host: String,
    /// The cluster's directory: its configuration (cluster.toml) and each
    /// replica's data (replica-N). If DIR/cluster.toml exists, the cluster
    /// starts again from it and its data, on the same addresses, and the
    /// other flags are ignored [default: a new private directory under the
    /// system's temporary directory, removed when the cluster stops].
    #[arg(long, value_name = "DIR")]
    pub(crate) data_dir: Option<PathBuf>,
    /// Run the replicas without peer authentication: any process that
    /// reaches a peer port can then speak raft to them. Only for closed
    /// networks and for measuring what TLS costs [default: mutual TLS, with
    /// a cluster CA and a certificate per replica made under DIR/certs].
    #[arg(long)]
    pub(crate) insecure_peers: bool,
}

/// Picks `n` free ports on `host`. Every listener stays open until all are
/// chosen: a port closed at once may be handed out again.
fn free_ports(host: &str, n: usize) -> Result<Vec<SocketAddr>> {
    let held = (0..n)
        .map(|_| TcpListener::bind((host, 0)).with_context(|| format!("cannot bind a port on {host}")))
        .collect::<Result<Vec<_>>>()?;
    held.iter().map(|l| Ok(l.local_addr()?)).collect()
}

/// Starts a local cluster of replica processes and waits for Ctrl-C or
/// SIGTERM, then stops them all.
pub fn cluster(args: ClusterArgs) -> Result<()> {
    let storage = parse_storage(&args.storage)?;
    // Without --data-dir: a new directory of a random name, private to
    // this user (never one another process could have planted), removed
    // when the cluster stops.
    let (dir, scratch) = match &args.data_dir {
        Some(d) => (d.clone(), None),
        None => {
            let t = tempfile::Builder::new()
                .prefix("psmr-cluster-")
                .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700))
                .tempdir()
                .context("cannot make a temporary directory")?;
            (t.path().to_path_buf(), Some(t))
        }
    };
    let path = dir.join("cluster.toml");
    if scratch.is_none() && path.exists() {
        let config = Config::from_file(&path)?;
        eprintln!("cluster configuration: {} (existing; starting again from its data)", path.display());
        return run_cluster(&path, &config);
    }
    let config = fresh_config(&args, storage, &dir)?;
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    std::fs::write(&path, config.to_toml()).with_context(|| format!("cannot write {}", path.display()))?;
    eprintln!("cluster configuration: {}", path.display());
    run_cluster(&path, &config)
}

pub(crate) fn parse_storage(name: &str) -> Result<Storage> {
    match name {
        "memory" => Ok(Storage::Memory),
        "disk" => Ok(Storage::Disk),
        other => bail!("unknown storage {other:?} (known: disk, memory)"),
    }
}

/// A new cluster's configuration from the flags: free ports on the host,
/// replica data under `dir`, and (unless `--insecure-peers`) a new cluster
/// CA and replica certificates under `dir/certs`.
pub(crate) fn fresh_config(args: &ClusterArgs, storage: Storage, dir: &std::path::Path) -> Result<Config> {
    if !(1..=15).contains(&args.replicas) {
        bail!("--replicas must be between 1 and 15, got {}", args.replicas);
    }
    let mut config = Config { storage, data_dir: dir.to_path_buf(), ..Config::default() };
    let ports = free_ports(&args.host, 2 * args.replicas as usize)?;
    for (id, pair) in (1..=args.replicas).zip(ports.chunks(2)) {
        config.replicas.push(Member { id, client: pair[0], peer: pair[1] });
    }
    config.service.kind = args.service.clone();
    config.service.model = args.model.clone();
    config.service.shards = args.shards;
    config.service.keys = args.keys;
    config.service.cost = args.cost.clone();
    config.scheduler.mapping = args.mapping.clone();
    config.scheduler.kind = args.scheduler.clone();
    config.scheduler.workers = args.workers;
    config.client_io_threads = args.client_io_threads;
    config.batch_max_commands = args.batch_max_commands;
    config.batch_delay_us = args.batch_delay_us;
    config.pipeline = args.pipeline;
    config.snapshot_every = args.snapshot_every;
    // Every other rule is checked before the certificates are made, so
    // that a bad flag leaves no files behind to refuse the next attempt.
    config.insecure_peers = true;
    config.validate()?;
    if !args.insecure_peers {
        let ids: Vec<u64> = config.replicas.iter().map(|m| m.id).collect();
        let certs = dir.join("certs");
        config.peer_tls = Some(
            psmr_replica::tls::generate(&certs, &ids)
                .with_context(|| format!("cannot make peer certificates in {}", certs.display()))?,
        );
        config.insecure_peers = false;
        config.validate()?;
    }
    Ok(config)
}

/// The replica processes of one cluster on this machine, each a `psmr
/// replica`; dropping it kills them all.
pub(crate) struct LocalCluster {
    children: Vec<(u64, Child)>,
    /// Client addresses, in replica id order.
    pub(crate) addrs: Vec<SocketAddr>,
    path: PathBuf,
    exe: PathBuf,
    /// Where each replica's stderr goes (`replica-N.log`, appended), and
    /// its stdout nowhere; `None`: both inherited.
    logs: Option<PathBuf>,
    /// Replicas killed on purpose and not restarted yet.
    killed: Vec<u64>,
}

impl LocalCluster {
    /// Starts one `psmr replica --config path --id N` per member; with
    /// `logs`, their output goes to files there.
    pub(crate) fn start(path: &std::path::Path, config: &Config, logs: Option<&std::path::Path>) -> Result<Self> {
        let exe = std::env::current_exe().context("cannot find the psmr executable")?;
        let mut cluster = LocalCluster {
            children: Vec::new(),
            addrs: config.replicas.iter().map(|m| m.client).collect(),
            path: path.to_path_buf(),
            exe,
            logs: logs.map(std::path::Path::to_path_buf),
            killed: Vec::new(),
        };
        for m in &config.replicas {
            // On error the cluster is dropped, which stops those started.
            let child = cluster.spawn(m.id)?;
            cluster.children.push((m.id, child));
        }
        Ok(cluster)
    }

    fn spawn(&self, id: u64) -> Result<Child> {
        let mut command = Command::new(&self.exe);
        command.arg("replica").arg("--config").arg(&self.path).arg("--id").arg(id.to_string());
        if let Some(dir) = &self.logs {
            std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
            let file = dir.join(format!("replica-{id}.log"));
            let log = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&file)
                .with_context(|| format!("cannot open {}", file.display()))?;
            command.stdout(std::process::Stdio::null()).stderr(log);
        }
        command.spawn().with_context(|| format!("cannot start replica {id}"))
    }

    /// Kills replica `id` with SIGKILL (a crash) and waits for it to die.
    pub(crate) fn kill(&mut self, id: u64) -> Result<()> {
        let (_, child) =
            self.children.iter_mut().find(|(i, _)| *i == id).ok_or_else(|| anyhow!("no replica {id} to kill"))?;
        child.kill().with_context(|| format!("cannot kill replica {id}"))?;
        let _ = child.wait();
        self.killed.push(id);
        Ok(())
    }

    /// Starts replica `id` again from its data directory.
    pub(crate) fn restart(&mut self, id: u64) -> Result<()> {
        let child = self.spawn(id)?;
        if let Some(slot) = self.children.iter_mut().find(|(i, _)| *i == id) {
            slot.1 = child;
        }
        self.killed.retain(|&k| k != id);
        Ok(())
    }

    /// The leader, as the replicas that answer see it (the highest term
    /// wins), if any.
    pub(crate) fn leader(&self) -> Option<u64> {
        let probe = Client::new(ClientConfig::new(self.addrs.clone())).ok()?;
        self.addrs
            .iter()
            .filter_map(|&a| probe.status_of(a, Duration::from_millis(500)).ok())
            .filter(|s| s.leader != 0)
            .max_by_key(|s| s.term)
            .map(|s| s.leader)
    }

    /// Replicas that have exited on their own (not killed on purpose),
    /// with their status.
    pub(crate) fn exited(&mut self) -> Vec<(u64, std::process::ExitStatus)> {
        let killed = self.killed.clone();
        self.children
            .iter_mut()
            .filter(|(id, _)| !killed.contains(id))
            .filter_map(|(id, c)| c.try_wait().ok().flatten().map(|s| (*id, s)))
            .collect()
    }

    /// Waits until every replica answers and one of them leads.
    pub(crate) fn wait_ready(&mut self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let probe = Client::new(ClientConfig::new(self.addrs.clone()))?;
        loop {
            if let Some((id, status)) = self.exited().into_iter().next() {
                bail!("replica {id} exited while starting: {status}");
            }
            let answers: Vec<_> = self.addrs.iter().map(|&a| probe.status_of(a, Duration::from_secs(1))).collect();
            if answers.iter().all(|r| r.as_ref().is_ok_and(|s| s.leader != 0)) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!("the cluster did not elect a leader within {} s", timeout.as_secs());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        kill_all(&mut self.children);
    }
}

/// Runs one `psmr replica` process per member of `config` (read from
/// `path`) until Ctrl-C or SIGTERM.
fn run_cluster(path: &std::path::Path, config: &Config) -> Result<()> {
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        ctrlc::set_handler(move || stop.store(true, Ordering::SeqCst)).context("cannot handle Ctrl-C")?;
    }
    let mut cluster = LocalCluster::start(path, config, None)?;
    let mut reported = std::collections::HashSet::new();
    while !stop.load(Ordering::SeqCst) {
        for (id, status) in cluster.exited() {
            if reported.insert(id) {
                eprintln!("replica {id} exited: {}", describe_exit(status));
            }
        }
        if reported.len() == cluster.children.len() {
            bail!("every replica exited");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(cluster);
    eprintln!("cluster stopped");
    Ok(())
}

fn kill_all(children: &mut [(u64, Child)]) {
    for (_, c) in children.iter_mut() {
        let _ = c.kill();
    }
    for (_, c) in children.iter_mut() {
        let _ = c.wait();
    }
}

/// `psmr check-history`.
#[derive(Args, Debug)]
pub struct CheckHistoryArgs {
    /// The history: one JSON operation per line (see the README).
    file: PathBuf,
    /// Give up on a key after this many search states (the verdict is then
    /// "undecided", exit code 2).
    #[arg(long, default_value_t = psmr_bench::history::MAX_STATES_DEFAULT)]
    max_states: usize,
}

/// Checks a kv history for linearizability: exit code 0 only when it is.
pub fn check_history(args: CheckHistoryArgs) -> Result<std::process::ExitCode> {
    use psmr_bench::history::{check_linearizable, read, Verdict};
    let file = std::fs::File::open(&args.file).with_context(|| format!("cannot open {}", args.file.display()))?;
    let ops = read(std::io::BufReader::new(file)).with_context(|| format!("{}", args.file.display()))?;
    match check_linearizable(&ops, args.max_states) {
        Verdict::Linearizable => {
            println!("linearizable: {} operations", ops.len());
            Ok(std::process::ExitCode::SUCCESS)
        }
        Verdict::Violation { key, ops: bad } => {
            println!("not linearizable: key {key}; operations that fit no linearization:");
            for i in bad {
                println!("  line {}: {}", i + 1, serde_json::to_string(&ops[i])?);
            }
            Ok(std::process::ExitCode::from(1))
        }
        Verdict::TooHard { key, states } => {
            println!("undecided: key {key} needs more than {states} search states (raise --max-states)");
            Ok(std::process::ExitCode::from(2))
        }
    }
}

/// `psmr client`.
#[derive(Args, Debug)]
pub struct ClientArgs {
    /// Client addresses of the replicas: HOST:PORT[,HOST:PORT...].
    #[arg(long, required = true, value_delimiter = ',')]
    cluster: Vec<String>,
    /// Seconds a request may take, retries included.
    #[arg(long, default_value_t = 10.0)]
    timeout: f64,
    #[command(subcommand)]
    op: ClientOp,
}

#[derive(Subcommand, Debug)]
enum ClientOp {
    /// Set KEY (a number) to VALUE; prints "created" or "replaced".
    Put {
        /// The key.
        key: u64,
        /// The value.
        value: String,
    },
    /// Print the value of KEY; exit code 1 if it does not exist.
    Get {
        /// The key.
        key: u64,
    },
    /// Remove KEY; prints "deleted" or "absent".
    Delete {
        /// The key.
        key: u64,
    },
    /// Every replica's id, address, pid, applied index and state digest.
    Status {
        /// One JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Closed-loop load: throughput and latency, and how busy each replica
    /// thread was.
    Load(LoadArgs),
}

#[derive(Args, Debug)]
struct LoadArgs {
    /// Closed-loop clients.
    #[arg(long, default_value_t = 8)]
    clients: usize,
    /// Commands per client request.
    #[arg(long, default_value_t = 1)]
    per_request: usize,
    /// Seconds to run (after one second of warm-up).
    #[arg(long, default_value_t = 5.0)]
    duration: f64,
    /// Keys the commands touch.
    #[arg(long, default_value_t = 10_000)]
    keys: u64,
    /// Percentage of writes (puts); the rest are reads.
    #[arg(long, default_value_t = 50)]
    write_pct: u8,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
    /// Seed of the clients' random keys, operations and values.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Write every operation to FILE, one JSON line each (the schema of
    /// `psmr check-history`). Values are the decimal numbers the load
    /// writes.
    #[arg(long, value_name = "FILE")]
    history: Option<PathBuf>,
}

pub(crate) fn resolve(list: &[String]) -> Result<Vec<SocketAddr>> {
    let mut out = Vec::new();
    for a in list {
        let mut addrs = a.to_socket_addrs().with_context(|| format!("bad replica address {a:?}"))?;
        out.push(addrs.next().ok_or_else(|| anyhow!("address {a:?} resolves to nothing"))?);
    }
    Ok(out)
}

fn secs(s: f64, what: &str) -> Result<Duration> {
    Duration::try_from_secs_f64(s)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| anyhow!("{what} must be a positive number of seconds, got {s}"))
}

/// Runs a client command.
pub fn client(args: ClientArgs) -> Result<()> {
    let addrs = resolve(&args.cluster)?;
    let timeout = secs(args.timeout, "--timeout")?;
    let config = || {
        let mut c = ClientConfig::new(addrs.clone());
        c.deadline = timeout;
        c
    };
    let one = |op: KvOp| -> Result<KvReply> {
        let mut c = Client::new(config())?;
        let mut replies = c.call(&KvCodec, &[op])?;
        replies.pop().expect("one reply per command").map_err(|m| anyhow!("refused: {m}"))
    };
    match args.op {
        ClientOp::Put { key, value } => match one(KvOp::Put { key, value: value.into_bytes() })? {
            KvReply::Done(true) => println!("replaced"),
            _ => println!("created"),
        },
        ClientOp::Get { key } => match one(KvOp::Read { key })? {
            KvReply::Value(Some(v)) => println!("{}", String::from_utf8_lossy(&v)),
            _ => bail!("key {key} not found"),
        },
        ClientOp::Delete { key } => match one(KvOp::Delete { key })? {
            KvReply::Done(true) => println!("deleted"),
            _ => println!("absent"),
        },
        ClientOp::Status { json } => status(&addrs, json)?,
        ClientOp::Load(l) => load(&addrs, config, l)?,
    }
    Ok(())
}

fn status(addrs: &[SocketAddr], json: bool) -> Result<()> {
    let probe = Client::new(ClientConfig::new(addrs.to_vec()))?;
    let results: Vec<_> = addrs.iter().map(|&a| (a, probe.status_of(a, Duration::from_secs(3)))).collect();
    let leader = results.iter().filter_map(|(_, r)| r.as_ref().ok()).max_by_key(|s| s.term).map_or(0, |s| s.leader);
    if json {
        let replicas: Vec<serde_json::Value> = results
            .iter()
            .map(|(a, r)| match r {
                Ok(s) => serde_json::json!({"id": s.id, "addr": s.addr, "pid": s.pid, "applied": s.applied,
                    "digest": s.digest, "term": s.term, "leader": s.leader}),
                Err(e) => serde_json::json!({"addr": a.to_string(), "error": e}),
            })
            .collect();
        println!("{}", serde_json::json!({"leader": leader, "replicas": replicas}));
    } else {
        println!("leader {leader}");
        println!("{:>3} {:<22} {:>8} {:>6} {:>9}  digest", "id", "addr", "pid", "term", "applied");
        for (a, r) in &results {
            match r {
                Ok(s) => {
                    println!("{:>3} {:<22} {:>8} {:>6} {:>9}  {}", s.id, s.addr, s.pid, s.term, s.applied, s.digest)
                }
                Err(e) => println!("  ? {a:<22} error: {e}"),
            }
        }
    }
    if results.iter().all(|(_, r)| r.is_err()) {
        bail!("no replica answered");
    }
    Ok(())
}

fn load(addrs: &[SocketAddr], config: impl Fn() -> ClientConfig, l: LoadArgs) -> Result<()> {
    let spec = LoadSpec {
        clients: l.clients,
        per_request: l.per_request,
        warmup: Duration::from_secs(1),
        duration: secs(l.duration, "--duration")?,
        ops: crate::load::Ops::Kv { keys: l.keys, write_pct: l.write_pct, value_bytes: None },
        history: l.history,
        seed: l.seed,
    };
    let r = crate::load::run(addrs, config, &spec)?;
    let (p50, p99) = (r.request_latency.value_at_quantile(0.5), r.request_latency.value_at_quantile(0.99));
    if l.json {
        let stages: Vec<serde_json::Value> = r
            .stages
            .iter()
            .map(|s| {
                serde_json::json!({"replica": s.replica, "thread": s.stage, "busy": s.busy,
                "waiting_cpu": s.waiting_cpu, "blocked": s.blocked})
            })
            .collect();
        println!(
            "{}",
            serde_json::json!({"clients": l.clients, "per_request": l.per_request, "seconds": r.seconds,
                "commands_per_s": r.commands_per_s(), "requests_per_s": r.requests as f64 / r.seconds,
                "p50_us": p50, "p99_us": p99, "max_us": r.request_latency.max(), "failed_requests": r.errors,
                "stages": stages, "cpu": serde_json::to_value(&r.cpu)?, "cpu_note": r.cpu_note})
        );
    } else {
        println!(
            "{} clients x {} commands/request: {:.0} commands/s, {:.0} requests/s, latency p50 {} us, p99 {} us, {} failed requests",
            l.clients,
            l.per_request,
            r.commands_per_s(),
            r.requests as f64 / r.seconds,
            p50,
            p99,
            r.errors
        );
        let (leader, followers) = psmr_bench::cpu::cells(&r.cpu);
        println!("cpu µs/command: leader {leader}, followers mean/max {followers}");
        if let Some(note) = &r.cpu_note {
            println!("cpu: {note}");
        }
        println!("{:<22} {:<16} {:>6} {:>8} {:>8}", "replica", "thread", "busy", "wait-cpu", "blocked");
        for s in &r.stages {
            println!(
                "{:<22} {:<16} {:>5.1}% {:>7.1}% {:>7.1}%",
                s.replica,
                s.stage,
                s.busy * 100.0,
                s.waiting_cpu * 100.0,
                s.blocked * 100.0
            );
        }
    }
    Ok(())
}
