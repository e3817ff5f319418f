//! `psmr bench`: named end-to-end scenarios against local clusters (or an
//! existing one), with sweeps, and a report written to a directory.

use crate::cluster::{fresh_config, parse_storage, ClusterArgs, LocalCluster};
use crate::load::{CpuSource, LoadResult, LoadSpec, Ops};
use anyhow::{bail, Context, Result};
use clap::Args;
use psmr_bench::peers;
use psmr_bench::report::{self, Event, Percentiles, PointResult};
use psmr_bench::scenario::{self, Params, Point, Scenario, ScenarioKind, Sweep, CLUSTER_KEYS};
use psmr_client::{Client, ClientConfig};
use psmr_model::{ClassId, ClassModel};
use psmr_sched::optimizer::{self, Problem, Weighting};
use psmr_services::kv::{self, KvModel};
use psmr_services::list::{self, ListModel};
use psmr_services::{Cost, Mix, WorkloadConfig};
use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long a fresh cluster may take to elect a leader.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// The scenario to run (`--list` shows them all).
    #[arg(long, default_value = "schedulers")]
    scenario: String,
    /// List the scenarios, one per line, and exit.
    #[arg(long)]
    list: bool,
    /// Short runs: 0.5 s of warm-up and 2 s measured per point.
    #[arg(long)]
    quick: bool,
    /// Sweep a parameter over values, KEY=V1,V2,... (repeatable); replaces
    /// the scenario's sweep over KEY or adds one. Keys: replicas, scheduler,
    /// workers, storage, client_io_threads, batch_max_commands,
    /// batch_delay_us, pipeline, insecure_peers, clients, per_request,
    /// write_pct, keys, value_bytes, warmup_s, duration_s.
    #[arg(long = "sweep", value_name = "KEY=V1,V2")]
    sweeps: Vec<String>,
    /// Set a parameter of every point, KEY=VALUE (repeatable; same keys).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    sets: Vec<String>,
    /// Where to write results.json, results.csv, the SVG plots, report.md
    /// and the replicas' logs (logs/point-N/replica-M.log) [default:
    /// psmr-bench-out/SCENARIO].
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Drive an existing cluster (client addresses HOST:PORT,...) instead
    /// of starting one per point; only load parameters may then vary.
    #[arg(long, value_delimiter = ',', value_name = "ADDRS")]
    cluster: Vec<String>,
    /// Write every client operation as a JSON line (the `psmr
    /// check-history` schema) to FILE; with several points, point N writes
    /// to FILE with `.N` before its extension.
    #[arg(long, value_name = "FILE")]
    history: Option<PathBuf>,
    /// Seed of the clients' random operations (and of the simulation);
    /// printed, pass it back to replay.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Fault: every DURATION (`2s`, `500ms`, `1.5`), kill the leader with
    /// SIGKILL and restart it `--restart-after` later. Faults restart
    /// replicas from their data, so storage defaults to disk.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    kill_leader_every: Option<Duration>,
    /// Fault: kill replica N (its id, from 1) with SIGKILL at `--at`.
    #[arg(long, value_name = "N")]
    kill_replica: Option<u64>,
    /// When `--kill-replica` strikes, counted from the start of the load
    /// (warm-up included).
    #[arg(long, value_name = "T", requires = "kill_replica", value_parser = parse_duration)]
    at: Option<Duration>,
    /// How long a killed replica stays down before it restarts.
    #[arg(long, value_name = "D", default_value = "1s", value_parser = parse_duration)]
    restart_after: Duration,
}

/// `2s`, `500ms`, `1m` or plain seconds (`1.5`), at most an hour.
fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let (number, unit) = match t.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => t.split_at(i),
        None => (t, "s"),
    };
    let scale = match unit {
        "ms" => 1e-3,
        "s" => 1.0,
        "m" => 60.0,
        _ => return Err(format!("bad duration {s:?}: use e.g. 500ms, 2s, 1m or 1.5")),
    };
    let plain = !number.is_empty() && number.chars().all(|c| c.is_ascii_digit() || c == '.');
    let value: f64 = plain
        .then(|| number.parse().ok())
        .flatten()
        .ok_or_else(|| format!("bad duration {s:?}: use e.g. 500ms, 2s, 1m or 1.5"))?;
    let secs = value * scale;
    if !(secs > 0.0 && secs <= 3600.0) {
        return Err(format!("duration {s:?} must be above 0 and at most an hour"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// The faults to inject into every point.
#[derive(Clone, Debug, Default)]
struct Faults {
    kill_leader_every: Option<Duration>,
    kill_replica: Option<(u64, Duration)>,
    restart_after: Duration,
}

impl Faults {
    fn any(&self) -> bool {
        self.kill_leader_every.is_some() || self.kill_replica.is_some()
    }
}

/// What the fault thread does next.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Action {
    KillLeader,
    Kill(u64),
    Restart(u64),
}

/// Injects `faults` into `cluster` from `start` until `stop` is set;
/// returns what it did.
fn inject(
    cluster: &std::sync::Mutex<LocalCluster>,
    faults: &Faults,
    start: std::time::Instant,
    stop: &std::sync::atomic::AtomicBool,
) -> Vec<Event> {
    use std::sync::atomic::Ordering;
    let mut pending: Vec<(Duration, Action)> = Vec::new();
    if let Some(every) = faults.kill_leader_every {
        pending.push((every, Action::KillLeader));
    }
    if let Some((id, at)) = faults.kill_replica {
        pending.push((at, Action::Kill(id)));
    }
    let mut events = Vec::new();
    while !pending.is_empty() {
        pending.sort_by_key(|p| std::cmp::Reverse(p.0));
        let (at, action) = pending.pop().expect("not empty");
        while start.elapsed() < at {
            if stop.load(Ordering::SeqCst) {
                return events;
            }
            std::thread::sleep(Duration::from_millis(10).min(at.saturating_sub(start.elapsed())));
        }
        let mut cluster = match cluster.lock() {
            Ok(c) => c,
            Err(_) => return events,
        };
        let mut record = |action: &str, replica: u64, result: Result<()>| {
            let error = result.err().map(|e| format!("{e:#}"));
            events.push(Event { at_s: start.elapsed().as_secs_f64(), action: action.into(), replica, error });
        };
        match action {
            Action::KillLeader => {
                if let Some(every) = faults.kill_leader_every {
                    pending.push((at + every, Action::KillLeader));
                }
                match cluster.leader() {
                    Some(id) => {
                        let result = cluster.kill(id);
                        let ok = result.is_ok();
                        record("kill leader", id, result);
                        if ok {
                            pending.push((start.elapsed() + faults.restart_after, Action::Restart(id)));
                        }
                    }
                    None => record("kill leader", 0, Err(anyhow::anyhow!("no leader to kill"))),
                }
            }
            Action::Kill(id) => {
                let result = cluster.kill(id);
                let ok = result.is_ok();
                record("kill", id, result);
                if ok {
                    pending.push((start.elapsed() + faults.restart_after, Action::Restart(id)));
                }
            }
            Action::Restart(id) => {
                let result = cluster.restart(id);
                record("restart", id, result);
            }
        }
    }
    events
}

/// `FILE` for one point, else `FILE` with `.N` before its extension.
fn history_path(file: &Path, point: usize, points: usize) -> PathBuf {
    if points == 1 {
        return file.to_path_buf();
    }
    let stem = file.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let name = match file.extension() {
        Some(ext) => format!("{stem}.{point}.{}", ext.to_string_lossy()),
        None => format!("{stem}.{point}"),
    };
    file.with_file_name(name)
}

pub fn bench(args: BenchArgs) -> Result<()> {
    if args.list {
        for s in scenario::scenarios() {
            println!("{:<20} {} [{}]", s.name, s.about, s.source);
        }
        return Ok(());
    }
    let scenario = scenario::find(&args.scenario)?;
    match scenario.kind {
        ScenarioKind::BitmapSimulation => return simulation(&args, &scenario),
        ScenarioKind::Peers => return peers(&args, &scenario),
        ScenarioKind::Cluster => {}
    }
    let overrides = args.sweeps.iter().map(|s| s.parse::<Sweep>()).collect::<Result<Vec<_>, _>>()?;
    let scenario_sweeps: Vec<Sweep> = if args.cluster.is_empty() {
        scenario.sweeps.clone()
    } else {
        if let Some(s) = overrides.iter().find(|s| CLUSTER_KEYS.contains(&s.key.as_str())) {
            bail!("--cluster drives an existing cluster, whose {} cannot be swept", s.key);
        }
        // The existing cluster has its own scheduler, workers, ...: only
        // the scenario's load sweeps apply.
        let (kept, dropped): (Vec<Sweep>, Vec<Sweep>) =
            scenario.sweeps.iter().cloned().partition(|s| !CLUSTER_KEYS.contains(&s.key.as_str()));
        for d in dropped {
            eprintln!("--cluster: the cluster's own settings replace the sweep {d}");
        }
        kept
    };
    let sweeps = scenario::merge(&scenario_sweeps, &overrides)?;
    let faults = Faults {
        kill_leader_every: args.kill_leader_every,
        kill_replica: args.kill_replica.map(|id| (id, args.at.unwrap_or(Duration::from_secs(1)))),
        restart_after: args.restart_after,
    };
    let mut base = scenario.base.clone();
    if faults.any() {
        if !args.cluster.is_empty() {
            bail!("faults kill and restart replica processes, which psmr bench can do only to clusters it started (drop --cluster)");
        }
        // A replica restarted from memory would have forgotten its log.
        base.storage = "disk".into();
    }
    apply_quick_and_sets(&args, &mut base)?;
    let points = scenario::expand(&base, &sweeps)?;
    // Every point is checked before the first one runs: a bad value in the
    // last point must not cost the whole run.
    for point in &points {
        load_spec(&point.params, None, args.seed)?.validate().with_context(|| format!("point {}", point.name()))?;
        if args.cluster.is_empty() {
            // Checked without peer TLS: making a point's certificates is
            // its run's job (in its own directory), not the check's.
            let check = Params { insecure_peers: true, ..point.params.clone() };
            cluster_config(&check, &std::env::temp_dir()).with_context(|| format!("point {}", point.name()))?;
        }
        if args.cluster.is_empty() && point.params.per_request > point.params.batch_max_commands {
            bail!(
                "point {}: per_request {} is above batch_max_commands {}, and replicas refuse requests larger than a log entry",
                point.name(),
                point.params.per_request,
                point.params.batch_max_commands
            );
        }
        if faults.any() && point.params.storage == "memory" {
            bail!("point {}: faults restart replicas, which memory storage cannot (it forgets the log)", point.name());
        }
        if let Some((id, _)) = faults.kill_replica {
            if id == 0 || id > point.params.replicas {
                bail!("--kill-replica {id}: point {} has replicas 1 to {}", point.name(), point.params.replicas);
            }
        }
    }
    let existing = if args.cluster.is_empty() { None } else { Some(reachable(&args.cluster)?) };
    let out = args.out.clone().unwrap_or_else(|| PathBuf::from("psmr-bench-out").join(scenario.name));
    // Fail on an unusable output directory before a long run, not after.
    std::fs::create_dir_all(&out).with_context(|| format!("cannot create output directory {}", out.display()))?;
    eprintln!(
        "scenario {} ({} point{}), seed {} (pass --seed to replay), results into {}",
        scenario.name,
        points.len(),
        if points.len() == 1 { "" } else { "s" },
        args.seed,
        out.display()
    );
    let terminal = std::io::stderr().is_terminal();
    // Erases the rest of a progress line on a terminal.
    let clear = if terminal { "\x1b[K" } else { "" };
    let mut results = Vec::with_capacity(points.len());
    let mut failure = None;
    for (i, point) in points.iter().enumerate() {
        let tag = format!("[{}/{}] {}", i + 1, points.len(), point.name());
        let history = args.history.as_deref().map(|f| history_path(f, i, points.len()));
        let logs = out.join("logs").join(format!("point-{i}"));
        let done = std::sync::atomic::AtomicBool::new(false);
        let outcome = std::thread::scope(|scope| {
            if terminal {
                let (tag, done) = (&tag, &done);
                let total = point.params.warmup_s + point.params.duration_s;
                scope.spawn(move || progress(tag, total, done));
            }
            let outcome = run_point(point, existing.as_deref(), history, &faults, &logs, args.seed);
            done.store(true, std::sync::atomic::Ordering::SeqCst);
            outcome
        });
        match outcome {
            Ok(r) => {
                let p99 = r.latency_us.get("request").map_or(0, |l| l.p99);
                let failed = match r.failed_requests {
                    0 => String::new(),
                    n => format!(", {n} failed requests"),
                };
                eprintln!(
                    "{tag}: {:.0} commands/s, request p99 {:.2} ms{failed}{clear}",
                    r.commands_per_s,
                    p99 as f64 / 1e3
                );
                results.push(r);
            }
            Err(e) => {
                eprintln!("{tag}: failed{clear}");
                failure = Some(e.context(format!("point {}", point.name())));
                break;
            }
        }
    }
    if !results.is_empty() {
        let files = report::write_all(&out, &scenario, &sweeps, &results)
            .with_context(|| format!("cannot write results into {}", out.display()))?;
        println!(
            "{:<40} {:>14} {:>12} {:>12} {:>18} {:>20}",
            "point", "commands/s", "p50 ms", "p99 ms", "cpu µs/cmd leader", "followers mean/max"
        );
        for r in &results {
            let l = r.latency_us.get("request").cloned().unwrap_or_default();
            let (leader, followers) = psmr_bench::cpu::cells(&r.cpu);
            println!(
                "{:<40} {:>14.0} {:>12.2} {:>12.2} {:>18} {:>20}",
                r.name,
                r.commands_per_s,
                l.p50 as f64 / 1e3,
                l.p99 as f64 / 1e3,
                leader,
                followers
            );
        }
        for f in files {
            println!("wrote {}", f.display());
        }
    }
    match failure {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// `--quick` and every `--set` applied to `base`.
fn apply_quick_and_sets(args: &BenchArgs, base: &mut Params) -> Result<()> {
    if args.quick {
        base.warmup_s = 0.5;
        base.duration_s = 2.0;
    }
    for set in &args.sets {
        let Some((key, value)) = set.split_once('=') else {
            bail!("malformed --set {set:?}: expected KEY=VALUE such as clients=8");
        };
        base.set(key, value)?;
    }
    Ok(())
}

/// A progress bar on the terminal for one point, until `done`: the
/// cluster's start, then the warm-up and the measured time.
fn progress(tag: &str, total_s: f64, done: &std::sync::atomic::AtomicBool) {
    const WIDTH: usize = 30;
    let start = std::time::Instant::now();
    while !done.load(std::sync::atomic::Ordering::SeqCst) {
        let elapsed = start.elapsed().as_secs_f64();
        let filled = ((elapsed / total_s.max(1e-3)).min(1.0) * WIDTH as f64) as usize;
        eprint!("\r{tag} [{}{}] {elapsed:.0}/{total_s:.0} s\x1b[K", "#".repeat(filled), ".".repeat(WIDTH - filled));
        std::thread::sleep(Duration::from_millis(200));
    }
    eprint!("\r\x1b[K");
}

/// The bitmap false-positive simulation (004 Table I): no cluster.
fn simulation(args: &BenchArgs, scenario: &Scenario) -> Result<()> {
    let cluster_flags = !args.sweeps.is_empty()
        || !args.sets.is_empty()
        || !args.cluster.is_empty()
        || args.history.is_some()
        || args.kill_leader_every.is_some()
        || args.kill_replica.is_some();
    if cluster_flags {
        bail!(
            "scenario {} is a simulation without a cluster or clients: --sweep, --set, --cluster, --history and faults do not apply",
            scenario.name
        );
    }
    let iterations =
        if args.quick { psmr_bench::simulate::PAPER_ITERATIONS / 10 } else { psmr_bench::simulate::PAPER_ITERATIONS };
    let out = args.out.clone().unwrap_or_else(|| PathBuf::from("psmr-bench-out").join(scenario.name));
    std::fs::create_dir_all(&out).with_context(|| format!("cannot create output directory {}", out.display()))?;
    eprintln!(
        "scenario {}: {iterations} iterations per cell, seed {} (pass --seed to replay)",
        scenario.name, args.seed
    );
    let cells = psmr_bench::simulate::table(iterations, args.seed);
    println!(
        "{:>12} {:>6} {:>6} {:>10} {:>12} {:>10}",
        "bitmap_bits", "graph", "batch", "psmr", "closed_form", "paper"
    );
    for c in &cells {
        let paper = c.paper_rate.map_or("-".to_string(), |p| format!("{:.2}%", 100.0 * p));
        println!(
            "{:>12} {:>6} {:>6} {:>9.2}% {:>11.2}% {:>10}",
            c.bits,
            c.graph,
            c.batch,
            100.0 * c.conflict_rate,
            100.0 * c.expected_rate,
            paper
        );
    }
    for f in report::write_simulation(&out, scenario, args.seed, &cells)
        .with_context(|| format!("cannot write results into {}", out.display()))?
    {
        println!("wrote {}", f.display());
    }
    Ok(())
}

/// `--scenario peers`: etcd, psmr and Redis side by side on this machine
/// (`psmr_bench::peers`); the psmr runs are ordinary points.
fn peers(args: &BenchArgs, scenario: &Scenario) -> Result<()> {
    let extra = !args.cluster.is_empty()
        || args.history.is_some()
        || args.kill_leader_every.is_some()
        || args.kill_replica.is_some();
    if extra {
        bail!("scenario peers starts its own clusters of every system: --cluster, --history and faults do not apply");
    }
    let overrides = args.sweeps.iter().map(|s| s.parse::<Sweep>()).collect::<Result<Vec<_>, _>>()?;
    if let Some(s) = overrides.iter().find(|s| s.key != "clients") {
        bail!("scenario peers sweeps only clients (its systems and setups are fixed), not {}", s.key);
    }
    // Before anything runs: a missing program is the likeliest failure.
    let tools = peers::Tools::find()?;
    let mut base = scenario.base.clone();
    apply_quick_and_sets(args, &mut base)?;
    let sweeps = scenario::merge(&scenario.sweeps, &overrides)?;
    let clients = sweeps
        .iter()
        .find(|s| s.key == "clients")
        .map(|s| s.values.iter().map(|v| v.parse::<usize>()).collect::<Result<Vec<_>, _>>())
        .transpose()?
        .unwrap_or_else(|| vec![base.clients]);
    let cases = peers::plan(&clients);
    for case in &cases {
        check_case(case, &base, args.seed).with_context(|| case.name())?;
    }
    let out = args.out.clone().unwrap_or_else(|| PathBuf::from("psmr-bench-out").join(scenario.name));
    std::fs::create_dir_all(&out).with_context(|| format!("cannot create output directory {}", out.display()))?;
    let mut setup = peers_setup(&tools, &base, args.seed);
    eprintln!(
        "scenario peers ({} runs; etcd {}, redis {}), seed {}, results into {}",
        cases.len(),
        setup.etcd_version,
        setup.redis_version,
        args.seed,
        out.display()
    );
    let (rows, failure) = run_cases(&cases, &tools, &setup, &base, &out, args.seed);
    setup.load_average = format!("{} before the runs, {} after", setup.load_average, load_average());
    if !rows.is_empty() {
        let files = peers::write(&out, scenario.about, &setup, &rows)
            .with_context(|| format!("cannot write results into {}", out.display()))?;
        print_peers(&rows);
        for f in files {
            println!("wrote {}", f.display());
        }
    }
    failure.map_or(Ok(()), Err)
}

/// The parameters of a psmr case.
fn case_params(base: &Params, storage: &str, clients: usize, per_request: usize) -> Params {
    Params { storage: storage.to_string(), clients, per_request, ..base.clone() }
}

/// Checks one case's settings before the first run.
fn check_case(case: &peers::Case, base: &Params, seed: u64) -> Result<()> {
    match case {
        peers::Case::Psmr { storage, clients, per_request } => {
            let p = case_params(base, storage, *clients, *per_request);
            load_spec(&p, None, seed)?.validate()?;
            let check = Params { insecure_peers: true, ..p.clone() };
            cluster_config(&check, &std::env::temp_dir())?;
            if p.per_request > p.batch_max_commands {
                bail!("per_request {} is above batch_max_commands {}", p.per_request, p.batch_max_commands);
            }
        }
        peers::Case::Etcd { clients, .. } | peers::Case::Redis { clients, .. } => {
            peers::PeerLoad::of(base, *clients, seed)?;
        }
    }
    Ok(())
}

/// Versions, the load and the psmr cluster, for the report.
fn peers_setup(tools: &peers::Tools, base: &Params, seed: u64) -> peers::Setup {
    let tmp = std::env::temp_dir();
    let fs = peers::fs_type(&tmp).unwrap_or_else(|| "file system unknown".into());
    peers::Setup {
        etcd_version: peers::version_of(&tools.etcd),
        redis_version: peers::version_of(&tools.redis_server),
        redis_benchmark_version: peers::version_of(&tools.redis_benchmark),
        keys: base.keys,
        key_bytes: peers::KEY_BYTES,
        value_bytes: base.value_bytes.unwrap_or(peers::VALUE_BYTES),
        warmup_s: base.warmup_s,
        duration_s: base.duration_s,
        seed,
        psmr: psmr_summary(base),
        data_dir: format!("{} ({fs}), for etcd and psmr alike", tmp.display()),
        cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
        load_average: load_average(),
    }
}

fn load_average() -> String {
    peers::load_average().unwrap_or_else(|| "unknown".into())
}

/// The psmr cluster of `p` in words.
fn psmr_summary(p: &Params) -> String {
    format!(
        "{} `psmr replica` processes ({} between them), scheduler {}, {} workers, {} ClientIO threads, log entries of at most {} commands, batch delay {} µs, pipeline {}; closed-loop psmr clients that find the leader and send to it",
        p.replicas,
        if p.insecure_peers { "plain TCP" } else { "mutual TLS" },
        p.scheduler,
        p.workers,
        p.client_io_threads,
        p.batch_max_commands,
        p.batch_delay_us,
        p.pipeline
    )
}

/// Runs every case in order until one fails; returns the rows and the
/// failure.
fn run_cases(
    cases: &[peers::Case],
    tools: &peers::Tools,
    setup: &peers::Setup,
    base: &Params,
    out: &Path,
    seed: u64,
) -> (Vec<peers::Row>, Option<anyhow::Error>) {
    let terminal = std::io::stderr().is_terminal();
    let clear = if terminal { "\x1b[K" } else { "" };
    let mut rows = Vec::with_capacity(cases.len());
    for (i, case) in cases.iter().enumerate() {
        let tag = format!("[{}/{}] {}", i + 1, cases.len(), case.name());
        let logs = out.join("logs").join(format!("point-{i}"));
        let done = std::sync::atomic::AtomicBool::new(false);
        let outcome = std::thread::scope(|scope| {
            if terminal {
                let (tag, done) = (&tag, &done);
                scope.spawn(move || progress(tag, base.warmup_s + base.duration_s, done));
            }
            let outcome = run_case(case, tools, setup, base, &logs, seed);
            done.store(true, std::sync::atomic::Ordering::SeqCst);
            outcome
        });
        match outcome {
            Ok(row) => {
                eprintln!(
                    "{tag}: {:.0} puts/s, p50 {:.2} ms, p99 {:.2} ms{clear}",
                    row.puts_per_s,
                    row.p50_us as f64 / 1e3,
                    row.p99_us as f64 / 1e3
                );
                rows.push(row);
            }
            Err(e) => {
                eprintln!("{tag}: failed{clear}");
                return (rows, Some(e.context(case.name())));
            }
        }
    }
    (rows, None)
}

/// Runs one case.
fn run_case(
    case: &peers::Case,
    tools: &peers::Tools,
    setup: &peers::Setup,
    base: &Params,
    logs: &Path,
    seed: u64,
) -> Result<peers::Row> {
    Ok(match case {
        peers::Case::Etcd { fsync, clients } => {
            let load = peers::PeerLoad::of(base, *clients, seed)?;
            peers::etcd::run(&tools.etcd, &setup.etcd_version, *fsync, &load, logs)?
        }
        peers::Case::Redis { clients, pipeline } => {
            let load = peers::PeerLoad::of(base, *clients, seed)?;
            let versions = (setup.redis_version.as_str(), setup.redis_benchmark_version.as_str());
            peers::redis::run(tools, versions, &load, *pipeline, logs)?
        }
        peers::Case::Psmr { storage, clients, per_request } => {
            psmr_row(&case_params(base, storage, *clients, *per_request), logs, seed)?
        }
    })
}

/// One psmr run of the peers scenario, as a row of its table.
fn psmr_row(p: &Params, logs: &Path, seed: u64) -> Result<peers::Row> {
    let label = [("storage", p.storage.clone()), ("clients", p.clients.to_string())];
    let point = Point { params: p.clone(), label: label.map(|(k, v)| (k.to_string(), v)).to_vec() };
    let r = run_point(&point, None, None, &Faults::default(), logs, seed)?;
    let l = r.latency_us.get("request").cloned().unwrap_or_default();
    Ok(peers::Row {
        system: "psmr".into(),
        setup: p.storage.clone(),
        clients: p.clients,
        per_request: p.per_request,
        puts_per_s: r.commands_per_s,
        p50_us: l.p50,
        p99_us: l.p99,
        max_us: l.max,
        failed_requests: r.failed_requests,
        cpu: r.cpu,
        cpu_note: r.cpu_note,
        ran: format!(
            "psmr {}: storage {}; {} clients x {} puts per request, {} % writes, {} B values",
            env!("CARGO_PKG_VERSION"),
            p.storage,
            p.clients,
            p.per_request,
            p.write_pct,
            p.value_bytes.map_or("decimal".to_string(), |b| b.to_string())
        ),
    })
}

/// The peers' rows and ratios on stdout.
fn print_peers(rows: &[peers::Row]) {
    println!(
        "{:<8} {:<12} {:>7} {:>7} {:>12} {:>9} {:>9} {:>18} {:>20}",
        "system",
        "setup",
        "clients",
        "per req",
        "puts/s",
        "p50 ms",
        "p99 ms",
        "cpu µs/put leader",
        "followers mean/max"
    );
    for r in rows {
        let (leader, followers) = psmr_bench::cpu::cells(&r.cpu);
        println!(
            "{:<8} {:<12} {:>7} {:>7} {:>12.0} {:>9.2} {:>9.2} {:>18} {:>20}",
            r.system,
            r.setup,
            r.clients,
            r.per_request,
            r.puts_per_s,
            r.p50_us as f64 / 1e3,
            r.p99_us as f64 / 1e3,
            leader,
            followers
        );
    }
    println!("\n{:<32} {:>14} {:>10} {:>10} {:>10}", "psmr/peer", "clients x req", "puts/s", "p50", "p99");
    for c in peers::compare(rows) {
        println!(
            "{:<32} {:>14} {:>9.2}x {:>9.2}x {:>9.2}x",
            c.pair,
            format!("{} x {}", c.clients, c.per_request),
            c.puts_ratio,
            c.p50_ratio,
            c.p99_ratio
        );
    }
}

/// The addresses of `--cluster`, once at least one replica answers.
fn reachable(list: &[String]) -> Result<Vec<SocketAddr>> {
    let addrs = crate::cluster::resolve(list)?;
    let probe = Client::new(ClientConfig::new(addrs.clone()))?;
    let answers: Vec<_> = addrs.iter().map(|&a| (a, probe.status_of(a, Duration::from_secs(3)))).collect();
    if answers.iter().all(|(_, r)| r.is_err()) {
        let why: Vec<String> =
            answers.iter().map(|(a, r)| format!("{a}: {}", r.as_ref().err().map_or("", |e| e))).collect();
        bail!("no replica of --cluster answered ({})", why.join("; "));
    }
    Ok(addrs)
}

/// The list workload of `p` (its mix, shards and skews).
fn list_workload(p: &Params) -> Result<WorkloadConfig> {
    let mix: Mix = p.workload.parse()?;
    Ok(WorkloadConfig { shards: p.shards, skew: p.skew, write_skew: p.write_skew, mix, ..WorkloadConfig::default() })
}

fn load_spec(p: &Params, history: Option<PathBuf>, seed: u64) -> Result<LoadSpec> {
    let ops = match p.service.as_str() {
        "list" => {
            let cost: Cost = p.cost.parse()?;
            Ops::List { model: p.model.parse()?, workload: list_workload(p)?, list_size: cost.list_size() }
        }
        _ => Ops::Kv { keys: p.keys, write_pct: p.write_pct, value_bytes: p.value_bytes },
    };
    Ok(LoadSpec {
        seed,
        clients: p.clients,
        per_request: p.per_request,
        warmup: Duration::from_secs_f64(p.warmup_s),
        duration: Duration::from_secs_f64(p.duration_s),
        ops,
        history,
    })
}

/// The mapping a replica runs for `p`: `default`, a spec as given, or the
/// optimizer's or the naive one for the class frequencies of 100k commands
/// of the point's workload.
fn mapping_spec(p: &Params) -> Result<String> {
    let weighting = match p.mapping.as_str() {
        "optimal" | "optimal:as-written" => Weighting::AsWritten,
        "optimal:total" => Weighting::Total,
        "naive" => Weighting::AsWritten,
        other => return Ok(other.to_string()),
    };
    let sample = 100_000;
    let (model, classes): (ClassModel, Vec<ClassId>) = match p.service.as_str() {
        "list" => {
            let model: ListModel = p.model.parse()?;
            let cost: Cost = p.cost.parse()?;
            let cfg = WorkloadConfig { commands: sample, ..list_workload(p)? };
            let commands = list::generate(model, &cfg, cost.list_size())?;
            (list::class_model(model, p.shards), commands.iter().map(|c| c.class).collect())
        }
        _ => {
            let model: KvModel = p.model.parse()?;
            let cfg = WorkloadConfig {
                commands: sample,
                shards: p.shards,
                keys: p.keys,
                mix: Mix::writes(f64::from(p.write_pct)),
                ..WorkloadConfig::default()
            };
            let commands = kv::generate(model, &cfg)?;
            (kv::class_model(model, p.shards), commands.iter().map(|c| c.class).collect())
        }
    };
    let mut weights = vec![0.0; model.len()];
    for c in classes {
        weights[c.index()] += 1.0 / sample as f64;
    }
    let problem = Problem::new(model.clone(), p.workers)?.with_weights(weights)?.with_weighting(weighting);
    let mapping = if p.mapping == "naive" { optimizer::naive(&problem) } else { optimal_mapping(&problem)? };
    Ok(mapping.to_spec(&model))
}

/// Runs one point: a fresh local cluster (unless `existing`), the load,
/// the cluster stopped and its data removed.
fn run_point(
    point: &Point,
    existing: Option<&[SocketAddr]>,
    history: Option<PathBuf>,
    faults: &Faults,
    logs: &Path,
    seed: u64,
) -> Result<PointResult> {
    let p = &point.params;
    // `load::run` checks the spec again; `bench` checked every point first.
    let spec = load_spec(p, history, seed)?;
    let (load, events, mapping) = match existing {
        Some(addrs) => {
            // Another machine's pids, or ours by chance: not guessed at.
            let cpu = CpuSource::Off("n/a: the replicas of --cluster are not processes psmr bench started".into());
            (crate::load::run_with_cpu(addrs, || ClientConfig::new(addrs.to_vec()), &spec, &cpu)?, Vec::new(), None)
        }
        None => {
            let dir = std::env::temp_dir().join(format!("psmr-bench-{}-{}", std::process::id(), next_dir_number()));
            let result = run_local(p, &dir, &spec, faults, logs);
            // The data of a finished point is of no further use.
            let _ = std::fs::remove_dir_all(&dir);
            result?
        }
    };
    let mut result = to_result(point, &load);
    result.events = events;
    result.mapping_spec = mapping.filter(|m| m != "default");
    Ok(result)
}

fn next_dir_number() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// The configuration of a fresh local kv cluster for `p`, data under `dir`.
fn cluster_config(p: &Params, dir: &Path) -> Result<psmr_replica::Config> {
    let args = ClusterArgs {
        replicas: p.replicas,
        service: p.service.clone(),
        model: p.model.clone(),
        shards: p.shards,
        keys: 0,
        cost: p.cost.clone(),
        mapping: mapping_spec(p)?,
        scheduler: p.scheduler.clone(),
        workers: p.workers,
        storage: p.storage.clone(),
        client_io_threads: p.client_io_threads,
        batch_max_commands: p.batch_max_commands,
        batch_delay_us: p.batch_delay_us,
        pipeline: p.pipeline,
        snapshot_every: 10_000,
        host: "127.0.0.1".into(),
        data_dir: None,
        insecure_peers: p.insecure_peers,
    };
    fresh_config(&args, parse_storage(&p.storage)?, dir)
}

fn run_local(
    p: &Params,
    dir: &Path,
    spec: &LoadSpec,
    faults: &Faults,
    logs: &Path,
) -> Result<(LoadResult, Vec<Event>, Option<String>)> {
    use std::sync::atomic::{AtomicBool, Ordering};
    let config = cluster_config(p, dir)?;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let path = dir.join("cluster.toml");
    std::fs::write(&path, config.to_toml()).with_context(|| format!("cannot write {}", path.display()))?;
    let mut cluster = LocalCluster::start(&path, &config, Some(logs))?;
    cluster.wait_ready(READY_TIMEOUT)?;
    let addrs = cluster.addrs.clone();
    let cluster = std::sync::Mutex::new(cluster);
    let stop = AtomicBool::new(false);
    let start = std::time::Instant::now();
    let (result, events) = std::thread::scope(|scope| {
        let injector = faults.any().then(|| scope.spawn(|| inject(&cluster, faults, start, &stop)));
        let result = crate::load::run_with_cpu(&addrs, || ClientConfig::new(addrs.clone()), spec, &CpuSource::Local);
        stop.store(true, Ordering::SeqCst);
        let events = injector.map(|h| h.join().unwrap_or_default()).unwrap_or_default();
        (result, events)
    });
    let result = result?;
    let mut cluster = cluster.into_inner().map_err(|_| anyhow::anyhow!("the fault thread panicked"))?;
    if let Some((id, status)) = cluster.exited().into_iter().next() {
        bail!("replica {id} exited during the run: {status}");
    }
    // The mapping the replicas ran, computed once for their configuration.
    Ok((result, events, Some(config.scheduler.mapping)))
}

fn percentiles(h: &hdrhistogram::Histogram<u64>) -> Percentiles {
    Percentiles {
        count: h.len(),
        p50: h.value_at_quantile(0.5),
        p90: h.value_at_quantile(0.9),
        p99: h.value_at_quantile(0.99),
        p999: h.value_at_quantile(0.999),
        max: h.max(),
    }
}

fn to_result(point: &Point, load: &LoadResult) -> PointResult {
    let mut r = PointResult::new(point);
    r.commands_per_s = load.commands_per_s();
    r.requests_per_s = load.requests as f64 / load.seconds;
    r.failed_requests = load.errors;
    for (kind, h) in &load.latency {
        r.latency_us.insert(kind.to_string(), percentiles(h));
    }
    r.latency_us.insert("request".into(), percentiles(&load.request_latency));
    r.timeline = load.timeline.clone();
    r.workers = load.workers.clone();
    r.worker_timeline = load.worker_timeline.clone();
    r.stages = load.stages.clone();
    r.cpu = load.cpu.clone();
    r.cpu_note = load.cpu_note.clone();
    r
}

/// The optimizer's mapping for `problem`, with a warning if its time limit
/// ran out before the mapping was proven optimal.
fn optimal_mapping(problem: &optimizer::Problem) -> Result<psmr_model::Mapping> {
    let solution = optimizer::optimize(problem)?;
    if !solution.optimal {
        eprintln!(
            "psmr: warning: the optimizer's time limit ran out; its best mapping is within {:.3} of the optimum",
            solution.gap()
        );
    }
    Ok(solution.mapping)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units_and_reject_nonsense() {
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        for bad in ["", "0", "0s", "-1s", "2h", "fast", "1e3", "NaN", "2 s s", "7200"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn history_files_are_numbered_per_point() {
        let f = Path::new("/tmp/h.jsonl");
        assert_eq!(history_path(f, 0, 1), PathBuf::from("/tmp/h.jsonl"));
        assert_eq!(history_path(f, 3, 5), PathBuf::from("/tmp/h.3.jsonl"));
        assert_eq!(history_path(Path::new("h"), 1, 2), PathBuf::from("h.1"));
    }
}
