//! `psmr bench`: named end-to-end scenarios against local clusters (or an
//! existing one), with sweeps, and a report written to a directory.

use crate::cluster::{fresh_config, parse_storage, ClusterArgs, LocalCluster};
use crate::load::{LoadResult, LoadSpec};
use anyhow::{bail, Context, Result};
use clap::Args;
use psmr_bench::report::{self, Percentiles, PointResult, StageRow};
use psmr_bench::scenario::{self, Params, Point, Sweep, CLUSTER_KEYS};
use psmr_client::{Client, ClientConfig};
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
    /// workers, storage, client_io_threads, batch_delay_us, pipeline,
    /// clients, per_request, write_pct, keys, warmup_s, duration_s.
    #[arg(long = "sweep", value_name = "KEY=V1,V2")]
    sweeps: Vec<String>,
    /// Set a parameter of every point, KEY=VALUE (repeatable; same keys).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    sets: Vec<String>,
    /// Where to write results.json, results.csv, the SVG plots and
    /// report.md [default: psmr-bench-out/SCENARIO].
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
    let mut base = scenario.base.clone();
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
    let points = scenario::expand(&base, &sweeps)?;
    // Every point is checked before the first one runs: a bad value in the
    // last point must not cost the whole run.
    for point in &points {
        load_spec(&point.params, None).validate().with_context(|| format!("point {}", point.name()))?;
        if args.cluster.is_empty() {
            cluster_config(&point.params, &std::env::temp_dir()).with_context(|| format!("point {}", point.name()))?;
        }
    }
    let existing = if args.cluster.is_empty() { None } else { Some(reachable(&args.cluster)?) };
    let out = args.out.clone().unwrap_or_else(|| PathBuf::from("psmr-bench-out").join(scenario.name));
    // Fail on an unusable output directory before a long run, not after.
    std::fs::create_dir_all(&out).with_context(|| format!("cannot create output directory {}", out.display()))?;
    eprintln!(
        "scenario {} ({} point{}), results into {}",
        scenario.name,
        points.len(),
        if points.len() == 1 { "" } else { "s" },
        out.display()
    );
    let terminal = std::io::stderr().is_terminal();
    // Erases the rest of a progress line on a terminal.
    let clear = if terminal { "\x1b[K" } else { "" };
    let mut results = Vec::with_capacity(points.len());
    let mut failure = None;
    for (i, point) in points.iter().enumerate() {
        let tag = format!("[{}/{}] {}", i + 1, points.len(), point.name());
        if terminal {
            eprint!("{tag}: running ({:.0} s)...\r", point.params.warmup_s + point.params.duration_s);
        }
        let history = args.history.as_deref().map(|f| history_path(f, i, points.len()));
        match run_point(point, existing.as_deref(), history) {
            Ok(r) => {
                let p99 = r.latency_us.get("request").map_or(0, |l| l.p99);
                eprintln!("{tag}: {:.0} commands/s, request p99 {:.2} ms{clear}", r.commands_per_s, p99 as f64 / 1e3);
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
        println!("{:<40} {:>14} {:>12} {:>12}", "point", "commands/s", "p50 ms", "p99 ms");
        for r in &results {
            let l = r.latency_us.get("request").cloned().unwrap_or_default();
            println!(
                "{:<40} {:>14.0} {:>12.2} {:>12.2}",
                r.name,
                r.commands_per_s,
                l.p50 as f64 / 1e3,
                l.p99 as f64 / 1e3
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

fn load_spec(p: &Params, history: Option<PathBuf>) -> LoadSpec {
    LoadSpec {
        clients: p.clients,
        per_request: p.per_request,
        warmup: Duration::from_secs_f64(p.warmup_s),
        duration: Duration::from_secs_f64(p.duration_s),
        keys: p.keys,
        write_pct: p.write_pct,
        history,
    }
}

/// Runs one point: a fresh local cluster (unless `existing`), the load,
/// the cluster stopped and its data removed.
fn run_point(point: &Point, existing: Option<&[SocketAddr]>, history: Option<PathBuf>) -> Result<PointResult> {
    let p = &point.params;
    let spec = load_spec(p, history);
    spec.validate()?;
    let load = match existing {
        Some(addrs) => crate::load::run(addrs, || ClientConfig::new(addrs.to_vec()), &spec)?,
        None => {
            let dir = std::env::temp_dir().join(format!("psmr-bench-{}-{}", std::process::id(), next_dir_number()));
            let result = run_local(p, &dir, &spec);
            // The data of a finished point is of no further use.
            let _ = std::fs::remove_dir_all(&dir);
            result?
        }
    };
    Ok(to_result(point, &load))
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
        service: "kv".into(),
        model: "readers-writers".into(),
        shards: 1,
        keys: 0,
        scheduler: p.scheduler.clone(),
        workers: p.workers,
        storage: p.storage.clone(),
        client_io_threads: p.client_io_threads,
        batch_max_commands: 1000,
        batch_delay_us: p.batch_delay_us,
        pipeline: p.pipeline,
        snapshot_every: 10_000,
        host: "127.0.0.1".into(),
        data_dir: None,
    };
    fresh_config(&args, parse_storage(&p.storage)?, dir)
}

fn run_local(p: &Params, dir: &Path, spec: &LoadSpec) -> Result<LoadResult> {
    let config = cluster_config(p, dir)?;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let path = dir.join("cluster.toml");
    std::fs::write(&path, config.to_toml()).with_context(|| format!("cannot write {}", path.display()))?;
    let mut cluster = LocalCluster::start(&path, &config, true)?;
    cluster.wait_ready(READY_TIMEOUT)?;
    let addrs = cluster.addrs.clone();
    let result = crate::load::run(&addrs, || ClientConfig::new(addrs.clone()), spec)?;
    if let Some((id, status)) = cluster.exited().into_iter().next() {
        bail!("replica {id} exited during the run: {status}");
    }
    Ok(result)
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
    r.latency_us.insert("read".into(), percentiles(&load.read_latency));
    r.latency_us.insert("write".into(), percentiles(&load.write_latency));
    r.latency_us.insert("request".into(), percentiles(&load.request_latency));
    r.timeline = load.timeline.clone();
    r.stages = load
        .stages
        .iter()
        .map(|s| StageRow {
            replica: s.replica.to_string(),
            stage: s.stage.clone(),
            busy: s.busy,
            waiting_cpu: s.waiting_cpu,
            blocked: s.blocked(),
        })
        .collect();
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn history_files_are_numbered_per_point() {
        let f = Path::new("/tmp/h.jsonl");
        assert_eq!(history_path(f, 0, 1), PathBuf::from("/tmp/h.jsonl"));
        assert_eq!(history_path(f, 3, 5), PathBuf::from("/tmp/h.3.jsonl"));
        assert_eq!(history_path(Path::new("h"), 1, 2), PathBuf::from("h.1"));
    }
}
