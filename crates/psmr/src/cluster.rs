//! `psmr replica`, `psmr cluster`, `psmr client` and `psmr check-history`:
//! their flags, and what they print. Starting replicas and clusters of
//! replica processes is `psmr_harness::launch`'s, asking a cluster about
//! itself `psmr_harness::probe`'s, the load `psmr_harness::load`'s.

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Subcommand};
use psmr_client::{Access, Client, ClientConfig, Reconfiguration};
use psmr_core::config::FacingPort;
use psmr_harness::launch::{self, describe_exit, ClusterDir, ClusterSpec, ProcessCluster};
use psmr_harness::load::{LoadSpec, Ops};
use psmr_harness::probe::{self, Probe};
use psmr_model::wire::{MemberChange, MemberInfo};
use psmr_replica::{Config, Storage};
use psmr_services::kv::{KvCodec, KvOp, KvReply};
use psmr_services::ServiceConfig;
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// `psmr replica`.
#[derive(Args, Debug)]
pub struct ReplicaArgs {
    /// The cluster's configuration (TOML; see docs/cluster.md).
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
    /// Join a running cluster instead of founding one: start with an empty
    /// log and wait for the leader, which adds this replica with `psmr
    /// client add-replica`; the configuration must list this replica and
    /// the current members. Ignored when the data directory already holds
    /// a log.
    #[arg(long)]
    join: bool,
    /// Disk storage: before starting, make this replica's empty data
    /// directory start from FILE, a snapshot saved with `psmr client
    /// snapshot save` (from this cluster or another), with the members of
    /// --config as its membership. Restore every replica of the new
    /// cluster from the same file; they start where the snapshot ends.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["join", "repair"])]
    restore_from: Option<PathBuf>,
    /// Listen for peers at ADDR instead of at this replica's peer address
    /// in the configuration, which the peers still dial: for a relay or
    /// proxy in front of the replica (the nemesis of `psmr bench` puts
    /// one there to cut, stall, reset and delay its links).
    #[arg(long, value_name = "ADDR")]
    peer_listen: Option<std::net::SocketAddr>,
}

/// Set while this process runs a replica: a panic in any thread then ends
/// the process with [`launch::EXIT_PANIC`] (see `main`).
pub static FAIL_STOP: AtomicBool = AtomicBool::new(false);

/// Runs one replica until it fails or is killed.
pub fn replica(args: ReplicaArgs) -> Result<()> {
    FAIL_STOP.store(true, Ordering::SeqCst);
    let mut config = Config::from_file(&args.config)?;
    if let Some(dir) = args.data_dir {
        config.data_dir = dir;
    }
    if args.join {
        config.join = true;
    }
    if args.repair {
        if config.storage != Storage::Disk {
            bail!("--repair applies to disk storage only: a replica in memory keeps nothing to repair");
        }
        let report = psmr_storage::DiskStore::repair(&config.replica_dir(args.id))
            .with_context(|| format!("replica {}: repair", args.id))?;
        println!("{report}");
    }
    if let Some(file) = &args.restore_from {
        restore(&config, args.id, file)?;
    }
    // SIGTERM and SIGINT stop the replica cleanly: its threads finish and
    // its log files close whole, so that the restart finds nothing to cut.
    // SIGHUP reloads its certificates (rotated files), as daemons reload.
    // The handlers go in before the replica starts (and says so): a signal
    // sent the moment it has started waits for them instead of killing
    // the process by the signal's default action.
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT, SIGHUP])
        .context("cannot handle SIGTERM, SIGINT and SIGHUP")?;
    let signals_handle = signals.handle();
    let replica = launch::start_replica(&config, args.id, args.peer_listen)?;
    println!("replica {} listening on {} pid {}", args.id, replica.client_addr(), std::process::id());
    let waited = std::thread::scope(|scope| {
        let replica = &replica;
        scope.spawn(move || {
            for signal in signals.forever() {
                match signal {
                    SIGHUP => match replica.reload_certificates() {
                        Ok(()) => tracing::info!(id = args.id, "certificates reloaded"),
                        Err(e) => tracing::error!(id = args.id, "{e}"),
                    },
                    _ => replica.stopper().stop(),
                }
            }
        });
        let waited = replica.wait();
        signals_handle.close();
        waited
    });
    if let Err(e) = waited {
        // Exit at once: joining the replica's threads could wait forever
        // on the one that failed.
        eprintln!("psmr: error: replica {}: {e}", args.id);
        std::process::exit(1);
    }
    replica.stop();
    Ok(())
}

/// Starts replica `id`'s data directory from the saved snapshot `file`.
fn restore(config: &Config, id: u64, file: &Path) -> Result<()> {
    if config.storage != Storage::Disk {
        bail!("--restore-from applies to disk storage only: a replica in memory starts empty");
    }
    let saved = std::fs::File::open(file).with_context(|| format!("cannot open {}", file.display()))?;
    let members = psmr_core::membership::Membership::of_voters(&config.replicas).map_err(|e| anyhow!(e))?;
    let dir = config.replica_dir(id);
    let snap = psmr_storage::DiskStore::restore_from(&dir, Box::new(psmr_storage::DiskFile(saved)), &members)
        .with_context(|| format!("replica {id}: restore from {}", file.display()))?;
    let meta = snap.get_metadata();
    println!(
        "replica {id} restored from {} (index {}, term {}) into {}",
        file.display(),
        meta.index,
        meta.term,
        dir.display()
    );
    Ok(())
}

/// `psmr cluster`.
#[derive(Args, Debug)]
pub struct ClusterArgs {
    /// Number of replicas (2f+1 tolerates f crashes).
    #[arg(long, default_value_t = 3)]
    replicas: u64,
    /// The replicated service: kv (key-value store) or list (sharded
    /// linked list).
    #[arg(long, default_value = "kv")]
    service: String,
    /// Class model. kv: readers-writers or sharded; list: readers-writers,
    /// sharded-snapshot or sharded-global.
    #[arg(long, default_value = "readers-writers")]
    model: String,
    /// Shards of the kv key space (sharded model) or of the list.
    #[arg(long, default_value_t = 1)]
    shards: usize,
    /// kv: keys the store starts with.
    #[arg(long, default_value_t = 0)]
    keys: u64,
    /// Execution cost: light, moderate or heavy (list: 1, 1k, 10k entries
    /// per shard).
    #[arg(long, default_value = "light")]
    cost: String,
    /// Early schedulers' class-to-threads mapping: default, or a spec
    /// such as `R=conc:0,1;W=seq:0-1` (`psmr mapping` prints one).
    #[arg(long, default_value = "default")]
    mapping: String,
    /// Execution scheduler of every replica: `auto` (each replica measures
    /// its workload and machine and picks among sequential,
    /// late-batch-bitmap and early, changing when they change), or one of
    /// the fixed ones (`psmr sched-bench --help` lists them).
    #[arg(long, default_value = "auto")]
    scheduler: String,
    /// Worker threads per replica (for `auto`: at most this many).
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Where each replica keeps its log: disk (synced, survives crashes) or
    /// memory (a crashed replica cannot rejoin).
    #[arg(long, default_value = "disk")]
    storage: String,
    /// ClientIO threads per replica.
    #[arg(long, default_value_t = 2)]
    client_io_threads: usize,
    /// Most commands in one log entry.
    #[arg(long, default_value_t = 1000)]
    batch_max_commands: usize,
    /// Longest a request waits for its log entry to fill while earlier
    /// entries are in flight, in µs (with none in flight it goes at once).
    #[arg(long, default_value_t = 200)]
    batch_delay_us: u64,
    /// Log entries proposed and not yet applied, at most.
    #[arg(long, default_value_t = 8)]
    pipeline: usize,
    /// Log entries between snapshots.
    #[arg(long, default_value_t = 10_000)]
    snapshot_every: u64,
    /// Serve read-only requests through the log like writes, instead of
    /// by the leader alone after a heartbeat round (raft's ReadIndex; as
    /// linearizable, and without a log entry).
    #[arg(long)]
    reads_through_log: bool,
    /// Hosts the replicas listen on, comma-separated: one for all, or one
    /// per replica (replica N on the Nth), whose peer connections then
    /// leave from it as from a host of its own; on one machine, loopback
    /// addresses such as 127.0.0.11,127.0.0.12,127.0.0.13.
    #[arg(long, alias = "host", value_delimiter = ',', default_value = "127.0.0.1")]
    hosts: Vec<String>,
    /// The cluster's directory: its configuration (cluster.toml) and each
    /// replica's data (replica-N). If DIR/cluster.toml exists, the cluster
    /// starts again from it and its data, on the same addresses, and the
    /// other flags are ignored [default: a new private directory under the
    /// system's temporary directory, removed when the cluster stops].
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Run the replicas without peer authentication: any process that
    /// reaches a peer port can then speak raft to them. Only for closed
    /// networks and for measuring what TLS costs [default: mutual TLS, with
    /// a cluster CA and a certificate per replica made under DIR/certs].
    #[arg(long)]
    insecure_peers: bool,
    /// Serve clients without authentication: anyone who reaches a client
    /// or Redis port may read, write, flush and change the membership
    /// [default: an `admin` and a `default` (data) user, their passwords
    /// in DIR/admin.password and DIR/default.password].
    #[arg(long)]
    insecure_clients: bool,
    /// Give each replica a Prometheus endpoint on a free port of the host
    /// (printed at start; `GET http://ADDR/metrics`).
    #[arg(long)]
    metrics: bool,
    /// Give each replica a Redis port on a free port of the host (printed
    /// at start): redis-cli, redis-benchmark and Redis client libraries
    /// work against any of them (kv service only).
    #[arg(long)]
    redis: bool,
    /// TLS on the client, Redis and metrics ports too, with the replicas'
    /// certificates from DIR/certs (`psmr client` and `redis-cli --tls`
    /// check them against DIR/certs/ca.pem; the ready line says how)
    /// [default: plain TCP with users, on loopback only].
    #[arg(long)]
    client_tls: bool,
}

impl ClusterArgs {
    /// The new cluster the flags describe.
    fn spec(&self, storage: Storage) -> ClusterSpec {
        let mut base = Config {
            storage,
            insecure_peers: self.insecure_peers,
            insecure_clients: self.insecure_clients,
            client_io_threads: self.client_io_threads,
            batch_max_commands: self.batch_max_commands,
            batch_delay_us: self.batch_delay_us,
            pipeline: self.pipeline,
            snapshot_every: self.snapshot_every,
            reads_through_log: self.reads_through_log,
            ..Config::default()
        };
        base.scheduler.kind = self.scheduler.clone();
        base.scheduler.workers = self.workers;
        base.scheduler.mapping = self.mapping.clone();
        let service = ServiceConfig {
            kind: self.service.clone(),
            model: self.model.clone(),
            shards: self.shards,
            keys: self.keys,
            cost: self.cost.clone(),
        };
        ClusterSpec {
            replicas: self.replicas,
            hosts: self.hosts.clone(),
            service,
            base,
            metrics: self.metrics,
            redis: self.redis,
            client_tls: self.client_tls,
        }
    }
}

/// This executable, which local clusters run as `psmr replica`.
pub fn psmr_exe() -> Result<PathBuf> {
    std::env::current_exe().context("cannot find the psmr executable")
}

/// Starts a local cluster of replica processes and waits for Ctrl-C or
/// SIGTERM, then stops them all. `given`: the flags given on the command
/// line, which a restart over an existing cluster ignores (and says so).
pub fn cluster(args: ClusterArgs, given: Vec<String>) -> Result<()> {
    let storage = launch::parse_storage(&args.storage)?;
    let dir = match &args.data_dir {
        Some(d) => ClusterDir::at(d),
        None => ClusterDir::scratch("psmr-cluster-")?,
    };
    if let Some(config) = dir.existing()? {
        let file = dir.config_file();
        eprintln!("cluster configuration: {} (existing; starting again from its data)", file.display());
        let ignored: Vec<&String> = given.iter().filter(|f| *f != "--data-dir").collect();
        if !ignored.is_empty() {
            let list = ignored.iter().map(|f| f.as_str()).collect::<Vec<_>>().join(" ");
            eprintln!("ignored on a restart: {list} (the existing configuration decides; edit it to change them)");
        }
        return run_cluster(&file, &config);
    }
    let config = args.spec(storage).config(dir.path())?;
    let file = dir.write(&config)?;
    eprintln!("cluster configuration: {}", file.display());
    run_cluster(&file, &config)
}

/// Runs one `psmr replica` process per member of `config` (read from
/// `file`) until Ctrl-C or SIGTERM.
fn run_cluster(file: &Path, config: &Config) -> Result<()> {
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        ctrlc::set_handler(move || stop.store(true, Ordering::SeqCst)).context("cannot handle Ctrl-C")?;
    }
    let dir = file.parent().unwrap_or(Path::new("."));
    let mut cluster = ProcessCluster::start(&psmr_exe()?, file, config, None)?;
    let scheme = if config.tls_on(FacingPort::Metrics).is_some() { "https" } else { "http" };
    let cli_tls = match config.tls_on(FacingPort::Redis).and_then(|t| t.ca.as_ref()) {
        Some(ca) => format!(" --tls --cacert {}", ca.display()),
        None => String::new(),
    };
    for m in config.replicas.iter() {
        if let Some(addr) = m.metrics {
            eprintln!("replica {} metrics: {scheme}://{addr}/metrics", m.id);
        }
        if let Some(addr) = m.redis {
            let auth = match config.users.is_empty() {
                true => String::new(),
                false => {
                    format!("REDISCLI_AUTH=$(cat {}) ", launch::password_file(dir, psmr_auth::DEFAULT_USER).display())
                }
            };
            eprintln!("replica {} redis: {auth}redis-cli{cli_tls} -h {} -p {}", m.id, addr.ip(), addr.port());
        }
    }
    announce(config, dir, &stop);
    cluster.supervise(&stop, |id, status| eprintln!("replica {id} exited: {}", describe_exit(status)))?;
    for id in cluster.stop(STOP_GRACE) {
        eprintln!("replica {id} did not stop within {STOP_GRACE:?} of SIGTERM: killed");
    }
    eprintln!("cluster stopped");
    Ok(())
}

/// How long `psmr cluster` gives its replicas to stop cleanly before it
/// kills them.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// How long `psmr cluster` waits for its first leader before it says so.
const ELECTION_WAIT: Duration = Duration::from_secs(30);

/// Says once that the cluster is ready, with what to paste: the leader,
/// the `PSMR_CLUSTER` line that `psmr client` reads (and the user it acts
/// as, where the cluster has users: those `psmr cluster` made, in `dir`)
/// and an example.
fn announce(config: &Config, dir: &Path, stop: &AtomicBool) {
    let addrs: Vec<SocketAddr> = config.replicas.iter().map(|m| m.client).collect();
    let mut export =
        format!("export PSMR_CLUSTER={}", addrs.iter().map(ToString::to_string).collect::<Vec<_>>().join(","));
    let mut admin = None;
    if !config.users.is_empty() {
        let file = launch::password_file(dir, launch::ADMIN_USER);
        admin = psmr_auth::Credentials::from_file(launch::ADMIN_USER, &file).ok();
        let data = launch::password_file(dir, psmr_auth::DEFAULT_USER);
        eprintln!(
            "users: {} (admin, password in {}), {} (data, password in {})",
            launch::ADMIN_USER,
            file.display(),
            psmr_auth::DEFAULT_USER,
            data.display()
        );
        export += &format!(" PSMR_USER={} PSMR_PASSWORD_FILE={}", launch::ADMIN_USER, file.display());
    }
    let tls = match launch::client_connector(config) {
        Ok(tls) => tls,
        Err(e) => return eprintln!("cannot reach the client ports in TLS: {e}"),
    };
    if let (Some(_), Some(client_tls)) = (&tls, &config.client_tls) {
        let ca = client_tls.ca.as_deref().unwrap_or(Path::new("?"));
        export += &format!(" PSMR_TLS_CA={}", ca.display());
    }
    let Ok(client) = Client::new(ClientConfig::new(addrs.clone())) else { return };
    let end = std::time::Instant::now() + ELECTION_WAIT;
    while !stop.load(Ordering::SeqCst) && std::time::Instant::now() < end {
        let access = Access::new(Duration::from_millis(500), admin.clone()).with_tls(tls.clone());
        let status = |a| client.status_of(a, access.clone()).ok();
        if let Some(id) = addrs.iter().find_map(|&a| status(a).map(|s| s.leader).filter(|&l| l > 0)) {
            eprintln!("ready: replica {id} leads; {export}; then e.g. psmr client put k v");
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    if !stop.load(Ordering::SeqCst) {
        eprintln!("no leader elected within {ELECTION_WAIT:?}; clients: {export}");
    }
}

/// `psmr check-history`.
#[derive(Args, Debug)]
pub struct CheckHistoryArgs {
    /// The history: one JSON operation per line (see docs/testing.md).
    file: PathBuf,
    /// Give up on a key after this many search states (the verdict is then
    /// "undecided", exit code 2).
    #[arg(long, default_value_t = psmr_harness::history::MAX_STATES_DEFAULT)]
    max_states: usize,
}

/// Checks a kv history for linearizability: exit code 0 only when it is.
pub fn check_history(args: CheckHistoryArgs) -> Result<std::process::ExitCode> {
    use psmr_harness::history::{check_linearizable, read, Verdict};
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
    /// Client addresses of the replicas: HOST:PORT[,HOST:PORT...] (`psmr
    /// cluster` prints the line to export once a leader is elected).
    #[arg(long, required = true, value_delimiter = ',', env = "PSMR_CLUSTER")]
    cluster: Vec<String>,
    /// Seconds a request may take, retries included.
    #[arg(long, default_value_t = 10.0)]
    timeout: f64,
    #[command(flatten)]
    who: crate::users::CredentialArgs,
    #[command(subcommand)]
    op: ClientOp,
}

#[derive(Subcommand, Debug)]
enum ClientOp {
    /// Set KEY (any string: `17` is the key redis-cli calls 17) to VALUE;
    /// prints "created" or "replaced".
    Put {
        /// The key.
        key: String,
        /// The value.
        value: String,
    },
    /// Print the value of KEY; exit code 1 if it does not exist.
    Get {
        /// The key.
        key: String,
    },
    /// Remove KEY; prints "deleted" or "absent".
    Delete {
        /// The key.
        key: String,
    },
    /// Print every key, one per line (as Redis's SCAN walks them: a part
    /// of the key space per request, so a large store is listed without
    /// one large reply). Example: `psmr client scan --match 'user:*'`.
    Scan {
        /// Only keys matching this glob (`*`, `?`, `[...]`, as Redis).
        #[arg(long = "match", value_name = "GLOB")]
        pattern: Option<String>,
        /// Only keys holding this kind: string, hash, list, set or zset.
        #[arg(long = "type", value_name = "KIND")]
        kind: Option<String>,
        /// About how many keys each request looks at.
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
        count: u64,
    },
    /// Every replica's id, address, pid, applied index and state digest,
    /// and key numbers of its metrics: term, leader, commit and applied
    /// index, entries and commands proposed, requests answered with their
    /// latency (p50, p99), frames and messages refused.
    Status {
        /// One JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Closed-loop load: throughput and latency, and how busy each replica
    /// thread was.
    Load(LoadArgs),
    /// Add replica ID (started beforehand with `psmr replica --join`) to the
    /// cluster: as a learner first, then, once it has caught up with the
    /// log, as a voter. Prints the members (id, client and peer address,
    /// voter or learner). Waits up to the larger of --timeout and 120 s.
    AddReplica {
        /// The new replica's id (1 or more, unused in the cluster).
        #[arg(value_parser = replica_id)]
        id: u64,
        /// Where the new replica serves clients: IP:PORT.
        #[arg(value_parser = socket_addr)]
        client_addr: SocketAddr,
        /// Where the new replica listens to its peers: IP:PORT.
        #[arg(value_parser = socket_addr)]
        peer_addr: SocketAddr,
    },
    /// Remove replica ID from the cluster; once the removal is in effect
    /// the removed replica stops. Prints the members. Waits up to the
    /// larger of --timeout and 120 s.
    RemoveReplica {
        /// The replica's id.
        #[arg(value_parser = replica_id)]
        id: u64,
    },
    /// Switch replica ID's execution scheduler between two log entries,
    /// under load if there is any: the old scheduler drains, the new one
    /// takes the next entry. Each replica chooses its own; replies and
    /// state stay those of sequential execution. Prints how long
    /// execution stalled.
    Reconfigure {
        /// The replica (its id; its address comes from the members list).
        #[arg(long, value_parser = replica_id)]
        replica: u64,
        /// The scheduler: sequential, late-cbase, late-batch-keys,
        /// late-batch-bitmap, late-cbase-pool, late-batch-bitmap-pool,
        /// early, early-busywait, early-ws-queue, early-ws-semi,
        /// early-ws-nonblocking, early-ws-optimistic or auto.
        #[arg(long)]
        scheduler: String,
        /// Worker threads.
        #[arg(long)]
        workers: u32,
        /// Early schedulers: a class-to-threads mapping spec (what `psmr
        /// mapping` prints) [default: the configuration's, the service's
        /// or the optimizer's].
        #[arg(long)]
        mapping: Option<String>,
    },
    /// Snapshots: `save FILE` writes the newest snapshot a replica keeps
    /// to FILE (restore a new cluster from it with `psmr replica
    /// --restore-from FILE`).
    Snapshot {
        #[command(subcommand)]
        op: SnapshotOp,
    },
    /// The cluster's members (id, client and peer address, voter or
    /// learner), as the first replica of --cluster that answers knows them.
    Members {
        /// A JSON array of {id, client, peer, voter} objects instead of a
        /// table.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand, Debug)]
enum SnapshotOp {
    /// Write the newest snapshot the first replica of --cluster that
    /// answers keeps (or replica --replica) to FILE, streamed chunk by
    /// chunk, then check every piece and the whole file's checksum before
    /// it takes the name FILE (FILE.partial until then).
    Save {
        /// Where to write it.
        file: PathBuf,
        /// The replica to save it from (its id; its address comes from the
        /// members list).
        #[arg(long, value_parser = replica_id)]
        replica: Option<u64>,
    },
}

/// Parses a replica id (ids start at 1).
fn replica_id(s: &str) -> Result<u64, String> {
    match s.parse::<u64>() {
        Ok(0) => Err("replica ids start at 1".into()),
        Ok(id) => Ok(id),
        Err(e) => Err(format!("not a replica id: {e}")),
    }
}

/// Parses an `IP:PORT` argument (what replicas store and dial).
fn socket_addr(s: &str) -> Result<SocketAddr, String> {
    s.parse().map_err(|_| "not a socket address (expected IP:PORT, such as 127.0.0.1:7004)".to_string())
}

/// Shortest wait for a membership change: an added replica must catch up
/// with the log before it votes.
const MEMBERSHIP_DEADLINE_MIN: Duration = Duration::from_secs(120);

/// Least time `reconfigure` waits: the optimizer may run for 2 s before
/// the old scheduler drains.
const RECONFIGURE_DEADLINE_MIN: Duration = Duration::from_secs(30);

/// Longest wait for one replica's answer to `members`.
const MEMBERS_ATTEMPT_MAX: Duration = Duration::from_secs(3);

/// How long a client command waits for each address to answer before it
/// starts (see [`client`]).
const REACH_ATTEMPT: Duration = Duration::from_secs(1);

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
    /// Keys the commands touch: PREFIX0 to PREFIX(N-1).
    #[arg(long, default_value_t = 10_000)]
    keys: u64,
    /// What every key the load writes and reads starts with, so that the
    /// load keeps off a cluster's other data ("" for the bare numbers
    /// 0..N, the keys a benchmark's store is filled with).
    #[arg(long, default_value = "psmr-load:")]
    prefix: String,
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

fn secs(s: f64, what: &str) -> Result<Duration> {
    Duration::try_from_secs_f64(s)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| anyhow!("{what} must be a positive number of seconds, got {s}"))
}

/// Runs a client command.
pub fn client(args: ClientArgs) -> Result<()> {
    let addrs = probe::resolve(&args.cluster)?;
    let timeout = secs(args.timeout, "--timeout")?;
    let (who, tls) = (args.who.credentials()?, args.who.tls()?);
    if !matches!(args.op, ClientOp::Status { .. } | ClientOp::Members { .. }) {
        // A wrong or dead address list fails within a second per address,
        // each named with what it answered (nothing, or another protocol),
        // instead of being retried until --timeout.
        let reach = REACH_ATTEMPT * u32::try_from(addrs.len()).unwrap_or(u32::MAX);
        members(&addrs, tls.clone(), timeout.min(reach)).context("no psmr client port among --cluster")?;
    }
    let config = || {
        let mut c = ClientConfig::new(addrs.clone());
        c.deadline = timeout;
        c.credentials = who.clone();
        c.tls = tls.clone();
        c
    };
    let access = |t: Duration| Access::new(t, who.clone()).with_tls(tls.clone());
    let one = |op: KvOp| -> Result<KvReply> {
        let mut c = Client::new(config())?;
        let mut replies = c.call(&KvCodec, &[op])?;
        replies.pop().expect("one reply per command").map_err(|m| anyhow!("refused: {m}"))
    };
    match args.op {
        ClientOp::Put { key, value } => match one(KvOp::Put { key: key.into_bytes(), value: value.into_bytes() })? {
            KvReply::Done(true) => println!("replaced"),
            _ => println!("created"),
        },
        ClientOp::Get { key } => match one(KvOp::Read { key: key.clone().into_bytes() })? {
            KvReply::Value(Some(v)) => println!("{}", String::from_utf8_lossy(&v)),
            _ => bail!("key {key} not found"),
        },
        ClientOp::Delete { key } => match one(KvOp::Delete { key: key.into_bytes() })? {
            KvReply::Done(true) => println!("deleted"),
            _ => println!("absent"),
        },
        ClientOp::Scan { pattern, kind, count } => scan(one, pattern, kind, count)?,
        ClientOp::Status { json } => status(&addrs, (who.clone(), tls.clone()), json)?,
        ClientOp::Load(l) => load(&addrs, config, l)?,
        ClientOp::AddReplica { id, client_addr, peer_addr } => {
            let change = MemberChange::Add { id, client: client_addr.to_string(), peer: peer_addr.to_string() };
            let members =
                change_membership(&addrs, change, access(timeout)).with_context(|| format!("add replica {id}"))?;
            print!("{}", members_table(&members));
        }
        ClientOp::RemoveReplica { id } => {
            let now = members(&addrs, tls.clone(), timeout)?;
            if !now.iter().any(|m| m.id == id) {
                let ids: Vec<String> = now.iter().map(|m| m.id.to_string()).collect();
                bail!("replica {id} is not a member of the cluster (members: {})", ids.join(", "));
            }
            let members = change_membership(&addrs, MemberChange::Remove { id }, access(timeout))
                .with_context(|| format!("remove replica {id}"))?;
            print!("{}", members_table(&members));
        }
        ClientOp::Reconfigure { replica, scheduler, workers, mapping } => {
            let change = Reconfiguration { scheduler, workers, mapping: mapping.unwrap_or_default() };
            reconfigure(&addrs, replica, change, access(timeout))?
        }
        ClientOp::Snapshot { op: SnapshotOp::Save { file, replica } } => {
            save_snapshot(&addrs, replica, &file, access(timeout))?
        }
        ClientOp::Members { json } => {
            let members = members(&addrs, tls.clone(), timeout)?;
            if json {
                println!("{}", members_json(&members));
            } else {
                print!("{}", members_table(&members));
            }
        }
    }
    Ok(())
}

/// Prints every key `SCAN` finds, following its cursor to the end.
fn scan(
    one: impl Fn(KvOp) -> Result<KvReply>,
    pattern: Option<String>,
    kind: Option<String>,
    count: u64,
) -> Result<()> {
    use std::io::Write;
    let (pattern, kind) = (pattern.map(String::into_bytes), kind.map(String::into_bytes));
    let mut out = std::io::stdout().lock();
    let mut cursor = 0u64;
    loop {
        let op = KvOp::Scan { cursor, pattern: pattern.clone(), count, kind: kind.clone() };
        let KvReply::Values(values) = one(op)? else { bail!("the cluster answered SCAN with something else") };
        let mut values = values.into_iter().flatten();
        let next = values.next().and_then(|c| String::from_utf8(c).ok()?.parse().ok());
        let Some(next) = next else { bail!("the cluster answered SCAN without a cursor") };
        for key in values {
            out.write_all(&key)?;
            out.write_all(b"\n")?;
        }
        if next == 0 {
            return Ok(());
        }
        cursor = next;
    }
}

/// Switches replica `replica`'s scheduler as `change` says.
fn reconfigure(addrs: &[SocketAddr], replica: u64, change: Reconfiguration, access: Access) -> Result<()> {
    let member = members(addrs, access.tls.clone(), access.timeout)?.into_iter().find(|m| m.id == replica);
    let Some(member) = member else { bail!("replica {replica} is not a member of the cluster") };
    let addr: SocketAddr =
        member.client.parse().map_err(|_| anyhow!("replica {replica}'s client address {:?}", member.client))?;
    let client = Client::new(ClientConfig::new(vec![addr]))?;
    // Planning may run the optimizer (up to 2 s), then the old scheduler
    // drains.
    let access = Access { timeout: access.timeout.max(RECONFIGURE_DEADLINE_MIN), ..access };
    let done = client.reconfigure_of(addr, change, access).map_err(|e| anyhow!(e))?;
    println!(
        "replica {replica} runs {} with {} workers (execution stalled {:?} while the old scheduler drained)",
        done.scheduler, done.workers, done.stall
    );
    Ok(())
}

/// Saves the newest snapshot of replica `replica` (or of the first of
/// `addrs` that answers) to `file`, checked.
fn save_snapshot(addrs: &[SocketAddr], replica: Option<u64>, file: &Path, access: Access) -> Result<()> {
    let timeout = access.timeout;
    let from: Vec<SocketAddr> = match replica {
        Some(id) => {
            let member = members(addrs, access.tls.clone(), timeout)?.into_iter().find(|m| m.id == id);
            let member = member.ok_or_else(|| anyhow!("replica {id} is not a member of the cluster"))?;
            vec![member.client.parse().map_err(|_| anyhow!("replica {id}'s client address {:?}", member.client))?]
        }
        None => addrs.to_vec(),
    };
    let partial = file.with_extension("partial");
    let client = Client::new(ClientConfig::new(from.clone()))?;
    let mut why = Vec::new();
    for addr in from {
        let mut out = std::io::BufWriter::new(
            std::fs::File::create(&partial).with_context(|| format!("cannot create {}", partial.display()))?,
        );
        match client.save_snapshot_of(addr, &mut out, access.clone()) {
            Ok(bytes) => {
                drop(out);
                let (index, term) = check_saved(&partial)?;
                std::fs::rename(&partial, file).with_context(|| format!("cannot rename to {}", file.display()))?;
                println!(
                    "saved the snapshot at index {index} (term {term}) of {addr}: {bytes} bytes, checked, in {}",
                    file.display()
                );
                return Ok(());
            }
            Err(e) => why.push(format!("{addr}: {e}")),
        }
    }
    let _ = std::fs::remove_file(&partial);
    bail!("no replica saved its snapshot: {}", why.join("; "))
}

/// Reads a saved snapshot file through, checking every piece and the
/// whole; its index and term.
fn check_saved(path: &Path) -> Result<(u64, u64)> {
    let f = std::fs::File::open(path)?;
    let mut r = psmr_core::snapfile::FileReader::open(std::io::BufReader::new(f))
        .with_context(|| format!("{} is not a snapshot", path.display()))?;
    std::io::copy(&mut r, &mut std::io::sink()).with_context(|| format!("{} is damaged", path.display()))?;
    Ok((r.index, r.term))
}

fn change_membership(addrs: &[SocketAddr], change: MemberChange, access: Access) -> Result<Vec<MemberInfo>> {
    let client = Client::new(ClientConfig::new(addrs.to_vec()))?;
    let access = Access { timeout: access.timeout.max(MEMBERSHIP_DEADLINE_MIN), ..access };
    client.change_membership(addrs, change, access).map_err(|e| anyhow!(e))
}

/// The members as the first replica of `addrs` to answer knows them, all
/// within `timeout`; the error says why each replica did not answer.
fn members(addrs: &[SocketAddr], tls: Option<psmr_client::Connector>, timeout: Duration) -> Result<Vec<MemberInfo>> {
    let client = Client::new(ClientConfig::new(addrs.to_vec()))?;
    let end = std::time::Instant::now() + timeout;
    let mut why = Vec::new();
    for &addr in addrs {
        let left = end.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            why.push(format!("{addr}: not asked, --timeout passed"));
            continue;
        }
        let per = (timeout / u32::try_from(addrs.len()).unwrap_or(u32::MAX)).max(REACH_ATTEMPT);
        let access = Access::from(left.min(per).min(MEMBERS_ATTEMPT_MAX)).with_tls(tls.clone());
        match client.members_of(addr, access) {
            Ok(members) => return Ok(members),
            Err(e) => why.push(format!("{addr}: {e}")),
        }
    }
    bail!("no replica answered ({})", why.join("; "))
}

fn members_table(members: &[MemberInfo]) -> String {
    let rows: Vec<[String; 4]> = members
        .iter()
        .map(|m| {
            let role = if m.voter { "voter" } else { "learner" };
            [m.id.to_string(), m.client.clone(), m.peer.clone(), role.to_string()]
        })
        .collect();
    let header = ["id", "client", "peer", "role"].map(String::from);
    let mut widths = header.clone().map(|h| h.len());
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let mut out = String::new();
    for row in std::iter::once(&header).chain(&rows) {
        let line: Vec<String> = row.iter().zip(widths).map(|(cell, w)| format!("{cell:<w$}")).collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

fn members_json(members: &[MemberInfo]) -> serde_json::Value {
    members
        .iter()
        .map(|m| serde_json::json!({"id": m.id, "client": m.client, "peer": m.peer, "voter": m.voter}))
        .collect()
}

/// Who asks, and in TLS or not.
type Asker = (Option<psmr_client::Credentials>, Option<psmr_client::Connector>);

fn status(addrs: &[SocketAddr], (who, tls): Asker, json: bool) -> Result<()> {
    let status = Probe::new(addrs)?.as_user(who).with_tls(tls).status(Duration::from_secs(3));
    if json {
        println!("{}", status.to_json());
    } else {
        print!("{}", status.format_table());
    }
    if !status.any_answered() {
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
        ops: Ops::Kv { keys: l.keys, write_pct: l.write_pct, value_bytes: None, prefix: l.prefix.clone() },
        phases: Vec::new(),
        history: l.history,
        seed: l.seed,
    };
    let r = psmr_harness::load::run(addrs, config, &spec)?;
    if l.json {
        println!("{}", r.to_json(&spec));
    } else {
        print!("{}", r.format_summary(&spec));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_print_as_an_aligned_table_and_as_json() {
        let members = vec![
            MemberInfo { id: 1, client: "127.0.0.1:7001".into(), peer: "127.0.0.1:8001".into(), voter: true },
            MemberInfo { id: 12, client: "10.0.0.12:7012".into(), peer: "10.0.0.12:8012".into(), voter: false },
        ];
        assert_eq!(
            members_table(&members),
            "id  client          peer            role\n\
             1   127.0.0.1:7001  127.0.0.1:8001  voter\n\
             12  10.0.0.12:7012  10.0.0.12:8012  learner\n"
        );
        assert_eq!(
            members_json(&members),
            serde_json::json!([
                {"id": 1, "client": "127.0.0.1:7001", "peer": "127.0.0.1:8001", "voter": true},
                {"id": 12, "client": "10.0.0.12:7012", "peer": "10.0.0.12:8012", "voter": false},
            ])
        );
        assert_eq!(replica_id("4"), Ok(4));
        assert!(replica_id("0").unwrap_err().contains("start at 1"));
        assert!(replica_id("-1").is_err() && replica_id("four").is_err());
        assert!(socket_addr("notanaddr").unwrap_err().contains("IP:PORT"));
        assert_eq!(socket_addr("127.0.0.1:7004"), Ok("127.0.0.1:7004".parse().unwrap()));
    }
}
