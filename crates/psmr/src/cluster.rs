//! `psmr replica`, `psmr cluster` and `psmr client`: running replicas and
//! talking to them.

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Subcommand};
use psmr_client::{Client, ClientConfig};
use psmr_model::wire::ThreadStat;
use psmr_replica::{Config, KvApp, Member, Replica, Storage};
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
}

/// Runs one replica until it fails or is killed.
pub fn replica(args: ReplicaArgs) -> Result<()> {
    let mut config = Config::from_file(&args.config)?;
    if let Some(dir) = args.data_dir {
        config.data_dir = dir;
    }
    let replica = Replica::start(config.clone(), args.id, KvApp::new(&config.service))
        .with_context(|| format!("replica {} cannot start", args.id))?;
    println!("replica {} listening on {} pid {}", args.id, replica.client_addr(), std::process::id());
    replica.wait().with_context(|| format!("replica {}", args.id))?;
    Ok(())
}

/// `psmr cluster`.
#[derive(Args, Debug)]
pub struct ClusterArgs {
    /// Number of replicas (2f+1 tolerates f crashes).
    #[arg(long, default_value_t = 3)]
    replicas: u64,
    /// The replicated service (only kv so far).
    #[arg(long, default_value = "kv")]
    service: String,
    /// kv class model: readers-writers or sharded.
    #[arg(long, default_value = "readers-writers")]
    model: String,
    /// kv shards (sharded model).
    #[arg(long, default_value_t = 1)]
    shards: usize,
    /// Keys the store starts with.
    #[arg(long, default_value_t = 0)]
    keys: u64,
    /// Execution scheduler of every replica.
    #[arg(long, default_value = "early")]
    scheduler: String,
    /// Worker threads per replica.
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
    /// Longest a command waits for its log entry to fill, in µs.
    #[arg(long, default_value_t = 200)]
    batch_delay_us: u64,
    /// Log entries proposed and not yet applied, at most.
    #[arg(long, default_value_t = 8)]
    pipeline: usize,
    /// Log entries between snapshots.
    #[arg(long, default_value_t = 10_000)]
    snapshot_every: u64,
    /// Host the replicas listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// The cluster's directory: its configuration (cluster.toml) and each
    /// replica's data (replica-N). If DIR/cluster.toml exists, the cluster
    /// starts again from it and its data, on the same addresses, and the
    /// other flags are ignored [default: a fresh directory under the
    /// system's temporary directory].
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
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
    if !(1..=15).contains(&args.replicas) {
        bail!("--replicas must be between 1 and 15, got {}", args.replicas);
    }
    let storage = match args.storage.as_str() {
        "memory" => Storage::Memory,
        "disk" => Storage::Disk,
        other => bail!("unknown storage {other:?} (known: disk, memory)"),
    };
    let dir = match &args.data_dir {
        Some(d) => d.clone(),
        None => std::env::temp_dir().join(format!("psmr-cluster-{}", std::process::id())),
    };
    let path = dir.join("cluster.toml");
    if path.exists() {
        let config = Config::from_file(&path)?;
        eprintln!("cluster configuration: {} (existing; starting again from its data)", path.display());
        return run_cluster(&path, &config);
    }
    let mut config = Config { storage, data_dir: dir.clone(), ..Config::default() };
    let ports = free_ports(&args.host, 2 * args.replicas as usize)?;
    for (id, pair) in (1..=args.replicas).zip(ports.chunks(2)) {
        config.replicas.push(Member { id, client: pair[0], peer: pair[1] });
    }
    config.service.kind = args.service;
    config.service.model = args.model;
    config.service.shards = args.shards;
    config.service.keys = args.keys;
    config.scheduler.kind = args.scheduler;
    config.scheduler.workers = args.workers;
    config.client_io_threads = args.client_io_threads;
    config.batch_max_commands = args.batch_max_commands;
    config.batch_delay_us = args.batch_delay_us;
    config.pipeline = args.pipeline;
    config.snapshot_every = args.snapshot_every;
    config.validate()?;
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    std::fs::write(&path, config.to_toml()).with_context(|| format!("cannot write {}", path.display()))?;
    eprintln!("cluster configuration: {}", path.display());
    run_cluster(&path, &config)
}

/// Runs one `psmr replica` process per member of `config` (read from
/// `path`) until Ctrl-C or SIGTERM.
fn run_cluster(path: &std::path::Path, config: &Config) -> Result<()> {
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        ctrlc::set_handler(move || stop.store(true, Ordering::SeqCst)).context("cannot handle Ctrl-C")?;
    }
    let exe = std::env::current_exe().context("cannot find the psmr executable")?;
    let mut children: Vec<(u64, Child)> = Vec::new();
    for m in &config.replicas {
        let child = Command::new(&exe)
            .arg("replica")
            .arg("--config")
            .arg(path)
            .arg("--id")
            .arg(m.id.to_string())
            .spawn()
            .with_context(|| format!("cannot start replica {}", m.id));
        match child {
            Ok(c) => children.push((m.id, c)),
            Err(e) => {
                kill_all(&mut children);
                return Err(e);
            }
        }
    }
    let mut reported = std::collections::HashSet::new();
    while !stop.load(Ordering::SeqCst) {
        for (id, child) in &mut children {
            if let Ok(Some(status)) = child.try_wait() {
                if reported.insert(*id) {
                    eprintln!("replica {id} exited: {status}");
                }
            }
        }
        if reported.len() == children.len() {
            bail!("every replica exited");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    kill_all(&mut children);
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
    /// Write every operation to FILE, one JSON line each (the schema of
    /// `psmr check-history`). Values are the decimal numbers the load
    /// writes.
    #[arg(long, value_name = "FILE")]
    history: Option<PathBuf>,
}

/// Where the load's client threads append their operations.
struct Recorder {
    out: std::sync::Mutex<std::io::BufWriter<std::fs::File>>,
    origin: Instant,
}

impl Recorder {
    fn ns(&self, t: Instant) -> u64 {
        t.duration_since(self.origin).as_nanos() as u64
    }

    /// Records one request: its operations, their outcomes (or why the
    /// request as a whole failed) and its times.
    fn request(
        &self,
        client: u64,
        ops: &[KvOp],
        outcome: &std::result::Result<Vec<std::result::Result<KvReply, String>>, String>,
        invoked: Instant,
        completed: Instant,
    ) -> Result<()> {
        use psmr_bench::history::{OpKind, Operation, Status};
        use std::io::Write as _;
        let mut lines = String::new();
        for (i, op) in ops.iter().enumerate() {
            let (kind, key, value) = match op {
                KvOp::Read { key } => (OpKind::Read, *key, None),
                KvOp::Put { key, value } => (OpKind::Write, *key, Some(String::from_utf8_lossy(value).into_owned())),
                KvOp::Delete { key } => (OpKind::Delete, *key, None),
                other => bail!("the load does not issue {other:?}"),
            };
            let (status, result) = match outcome.as_ref().map(|r| &r[i]) {
                Ok(Ok(KvReply::Value(v))) => (
                    Status::Ok,
                    v.as_ref().map_or(serde_json::Value::Null, |v| String::from_utf8_lossy(v).into_owned().into()),
                ),
                Ok(Ok(KvReply::Done(existed))) => (Status::Ok, (*existed).into()),
                Ok(Err(_refused)) => (Status::Fail, serde_json::Value::Null),
                Err(_) => (Status::Unknown, serde_json::Value::Null),
            };
            let record = Operation {
                client,
                op: kind,
                key,
                value,
                result,
                invoke_ns: self.ns(invoked),
                complete_ns: if status == Status::Ok { self.ns(completed) } else { 0 },
                status,
            };
            lines.push_str(&serde_json::to_string(&record)?);
            lines.push('\n');
        }
        let mut out = self.out.lock().map_err(|_| anyhow!("a client thread panicked"))?;
        out.write_all(lines.as_bytes())?;
        Ok(())
    }
}

fn resolve(list: &[String]) -> Result<Vec<SocketAddr>> {
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
    if l.clients == 0 || l.per_request == 0 || l.keys == 0 || l.write_pct > 100 {
        bail!("--clients, --per-request and --keys must be positive and --write-pct at most 100");
    }
    let duration = secs(l.duration, "--duration")?;
    let warmup = Duration::from_secs(1);
    let start = Instant::now();
    let (measure_from, measure_to) = (start + warmup, start + warmup + duration);
    let recorder = match &l.history {
        Some(path) => {
            let file = std::fs::File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
            Some(Arc::new(Recorder { out: std::sync::Mutex::new(std::io::BufWriter::new(file)), origin: start }))
        }
        None => None,
    };
    let mut handles = Vec::new();
    for i in 0..l.clients {
        let mut client = Client::new(config())?;
        let (per, keys, write_pct) = (l.per_request, l.keys, l.write_pct as u64);
        let recorder = recorder.clone();
        handles.push(std::thread::spawn(move || -> Result<(u64, hdrhistogram::Histogram<u64>)> {
            let mut hist = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
            let mut x = (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            let mut next = || {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x
            };
            let mut commands = 0u64;
            loop {
                let now = Instant::now();
                if now >= measure_to {
                    return Ok((commands, hist));
                }
                let ops: Vec<KvOp> = (0..per)
                    .map(|_| {
                        let key = next() % keys;
                        if next() % 100 < write_pct {
                            KvOp::Put { key, value: next().to_string().into_bytes() }
                        } else {
                            KvOp::Read { key }
                        }
                    })
                    .collect();
                let outcome = client.call(&KvCodec, &ops);
                if let Some(r) = &recorder {
                    let shown = outcome.as_ref().map(Clone::clone).map_err(|e| e.to_string());
                    r.request(client.id(), &ops, &shown, now, Instant::now())?;
                }
                outcome?;
                if now >= measure_from {
                    commands += per as u64;
                    hist.record(now.elapsed().as_micros().max(1) as u64)?;
                }
            }
        }));
    }
    let probe = Client::new(ClientConfig::new(addrs.to_vec()))?;
    std::thread::sleep(measure_from.saturating_duration_since(Instant::now()));
    let before: Vec<_> = addrs.iter().map(|&a| probe.stats_of(a, Duration::from_secs(3)).ok()).collect();
    std::thread::sleep(measure_to.saturating_duration_since(Instant::now()));
    let after: Vec<_> = addrs.iter().map(|&a| probe.stats_of(a, Duration::from_secs(3)).ok()).collect();
    let mut total = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    let mut commands = 0;
    for h in handles {
        let (c, hist) = h.join().map_err(|_| anyhow!("a client thread panicked"))??;
        commands += c;
        total.add(&hist)?;
    }
    if let Some(r) = recorder {
        use std::io::Write as _;
        r.out.lock().map_err(|_| anyhow!("a client thread panicked"))?.flush()?;
    }
    let secs = duration.as_secs_f64();
    let (p50, p99) = (total.value_at_quantile(0.5), total.value_at_quantile(0.99));
    let stages = stage_shares(addrs, &before, &after);
    if l.json {
        let stages: Vec<serde_json::Value> = stages
            .iter()
            .map(|(addr, name, busy, runq)| {
                serde_json::json!({"replica": addr.to_string(), "thread": name, "busy": busy, "waiting_cpu": runq,
                "blocked": (1.0 - busy - runq).max(0.0)})
            })
            .collect();
        println!(
            "{}",
            serde_json::json!({"clients": l.clients, "per_request": l.per_request, "seconds": secs,
                "commands_per_s": commands as f64 / secs, "requests_per_s": total.len() as f64 / secs,
                "p50_us": p50, "p99_us": p99, "max_us": total.max(), "stages": stages})
        );
    } else {
        println!(
            "{} clients x {} commands/request: {:.0} commands/s, {:.0} requests/s, latency p50 {} us, p99 {} us",
            l.clients,
            l.per_request,
            commands as f64 / secs,
            total.len() as f64 / secs,
            p50,
            p99
        );
        println!("{:<22} {:<16} {:>6} {:>8} {:>8}", "replica", "thread", "busy", "wait-cpu", "blocked");
        for (addr, name, busy, runq) in &stages {
            println!(
                "{:<22} {:<16} {:>5.1}% {:>7.1}% {:>7.1}%",
                addr.to_string(),
                name,
                busy * 100.0,
                runq * 100.0,
                (1.0 - busy - runq).max(0.0) * 100.0
            );
        }
    }
    Ok(())
}

type Reading = Option<(u64, Vec<ThreadStat>)>;

/// Per replica and thread name (threads of one name summed, then divided
/// by their number): shares of the interval on a CPU and waiting for one.
fn stage_shares(addrs: &[SocketAddr], before: &[Reading], after: &[Reading]) -> Vec<(SocketAddr, String, f64, f64)> {
    let mut out = Vec::new();
    for ((addr, b), a) in addrs.iter().zip(before).zip(after) {
        let (Some((t0, b)), Some((t1, a))) = (b, a) else { continue };
        let wall = t1.saturating_sub(*t0).max(1) as f64;
        let mut groups: std::collections::BTreeMap<String, (f64, f64, usize)> = Default::default();
        // The process's main thread only waits for the others.
        for t in a.iter().filter(|t| t.name.starts_with("psmr-")) {
            if let Some(old) = b.iter().find(|o| o.tid == t.tid) {
                let g = groups.entry(stage_of(&t.name)).or_default();
                g.0 += t.cpu_ns.saturating_sub(old.cpu_ns) as f64 / wall;
                g.1 += t.runq_ns.saturating_sub(old.runq_ns) as f64 / wall;
                g.2 += 1;
            }
        }
        for (name, (busy, runq, n)) in groups {
            out.push((*addr, name, busy / n as f64, runq / n as f64));
        }
    }
    out
}

/// Threads of one stage share a name up to a trailing number.
fn stage_of(name: &str) -> String {
    name.trim_end_matches(|c: char| c.is_ascii_digit()).trim_end_matches('-').to_string()
}
