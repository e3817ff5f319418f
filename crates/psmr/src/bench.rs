//! `psmr bench`: its flags, and what it prints while named end-to-end
//! scenarios run (`psmr_bench::runner` runs their points, on local
//! clusters of replica processes or an existing one, with faults; the
//! peers scenario's cases are `psmr_bench::peers::cases`').

use crate::cluster::psmr_exe;
use anyhow::{bail, Context, Result};
use clap::Args;
use psmr_bench::compare;
use psmr_bench::faults::Faults;
use psmr_bench::peers::{self, cases};
use psmr_bench::report;
use psmr_bench::runner::{self, Runner, Target};
use psmr_bench::scenario::{self, Params, Point, Scenario, ScenarioKind, Sweep};
use psmr_harness::probe;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

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
    /// the scenario's sweep over KEY or adds one. Keys of the cluster:
    /// service, model, shards, cost, mapping, replicas, scheduler, workers,
    /// storage, client_io_threads, batch_max_commands, batch_delay_us,
    /// pipeline, snapshot_every, insecure_peers, auth, client_tls, reads;
    /// of the load: workload, skew, write_skew, clients, per_request,
    /// write_pct, keys, value_bytes, warmup_s, duration_s, phases.
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
    /// Who the load acts as on a `--cluster` with users.
    #[command(flatten)]
    who: crate::users::CredentialArgs,
    /// Write every client operation as a JSON line (the `psmr
    /// check-history` schema) to FILE; with several points, point N writes
    /// to FILE with `.N` before its extension.
    #[arg(long, value_name = "FILE")]
    history: Option<PathBuf>,
    /// Run every point N times, in N rounds of all the points (a drift in
    /// the machine's speed then touches every point alike), each round in
    /// an order shuffled from --seed (a point runs slower right after one
    /// that loaded the machine hard), and report each point by its run of
    /// median commands/s, every run's figure beside it; the replicas' logs
    /// go to logs/run-K/point-N. Cluster scenarios only.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100))]
    repeat: u32,
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
    /// Faults against the replicas' processes, their disks and the links
    /// between them, on a schedule drawn from --seed: `all`, or a
    /// comma-separated list of partition, one-way, reset, delay, pause,
    /// kill, disk-full and clock; with several kinds, two faults may be
    /// under way at once. Each replica gets a loopback address of its own
    /// (127.0.0.11, ...) and a relay in front of its peer port that cuts,
    /// stalls, resets and delays its links; `disk-full` puts each
    /// replica's data on a tmpfs of its own (needs root) and fills one.
    /// `kill` and `disk-full` restart replicas, which needs disk storage.
    /// `clock` runs each replica under libfaketime and moves one's wall
    /// clock 1 to 30 s forward or back; a client then sets keys with TTLs
    /// and reads them back with `TIME`, and the run fails if the log's
    /// time goes back or a key expires before or lives past its deadline.
    /// The run records its history (logs/history.jsonl unless --history)
    /// and is judged at the end: a final read of every acknowledged key,
    /// linearizability, the replicas' digests. The report lists every
    /// fault, what it cost and the judgement; a fault that could not be
    /// injected, a kind never injected or a failed judgement fails the
    /// run, printing the seed and the schedule to replay it.
    #[arg(long, value_name = "KINDS", value_parser = parse_nemesis)]
    nemesis: Option<String>,
}

/// `--nemesis`, checked (and parsed again where it is used).
fn parse_nemesis(s: &str) -> Result<String, String> {
    psmr_harness::nemesis::parse_kinds(s).map(|_| s.to_string()).map_err(|e| e.to_string())
}

/// `2s`, `500ms`, `1m` or plain seconds (`1.5`), at most an hour.
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
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

/// A steal backoff: `0`, `Nus`, or a duration [`parse_duration`] reads,
/// at most a second.
pub(crate) fn parse_backoff(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let d = match t.strip_suffix("us") {
        _ if t == "0" => Duration::ZERO,
        Some(us) => us.parse().map(Duration::from_micros).map_err(|_| format!("bad backoff {s:?}"))?,
        None => parse_duration(t)?,
    };
    if d > Duration::from_secs(1) {
        return Err(format!("backoff {s:?} must be at most 1s"));
    }
    Ok(d)
}

impl BenchArgs {
    fn faults(&self) -> Faults {
        Faults {
            kill_leader_every: self.kill_leader_every,
            kill_replica: self.kill_replica.map(|id| (id, self.at.unwrap_or(Duration::from_secs(1)))),
            restart_after: self.restart_after,
            nemesis: self
                .nemesis
                .as_deref()
                .and_then(|k| psmr_harness::nemesis::parse_kinds(k).ok())
                .unwrap_or_default(),
        }
    }

    fn overrides(&self) -> Result<Vec<Sweep>> {
        Ok(self.sweeps.iter().map(|s| s.parse::<Sweep>()).collect::<Result<Vec<_>, _>>()?)
    }
}

pub fn bench(args: BenchArgs) -> Result<()> {
    if args.list {
        for s in scenario::scenarios() {
            println!("{:<20} {} [{}]", s.name, s.about, s.source);
        }
        return Ok(());
    }
    let scenario = scenario::find(&args.scenario)?;
    if args.repeat > 1 && scenario.kind != ScenarioKind::Cluster {
        bail!("--repeat applies to the scenarios that run clusters; scenario {} runs each case once", scenario.name);
    }
    if args.repeat > 1 && args.history.is_some() {
        bail!("--history writes one history per point, which --repeat would overwrite: run with --repeat 1");
    }
    match scenario.kind {
        ScenarioKind::BitmapSimulation => return simulation(&args, &scenario),
        ScenarioKind::Peers => return peers(&args, &scenario),
        ScenarioKind::CatchUp => return catch_up(&args, &scenario),
        ScenarioKind::Cluster | ScenarioKind::Nemesis => {}
    }
    let (mut faults, existing) = (args.faults(), !args.cluster.is_empty());
    if scenario.kind == ScenarioKind::Nemesis {
        if existing {
            bail!("scenario nemesis hurts a cluster of its own: drop --cluster");
        }
        if faults.nemesis.is_empty() {
            faults.nemesis = psmr_harness::nemesis::Kind::ALL.to_vec();
        }
    }
    let plan = runner::plan(&scenario, &args.overrides()?, existing, &faults)?;
    for d in &plan.dropped {
        eprintln!("--cluster: the cluster's own settings replace the sweep {d}");
    }
    let mut base = plan.base;
    apply_quick_and_sets(&args, &mut base)?;
    let points = scenario::expand(&base, &plan.sweeps)?;
    // Every point is checked before the first one runs: a bad value in the
    // last point must not cost the whole run.
    for point in &points {
        runner::check_point(point, existing, &faults, args.seed)?;
    }
    let target = if existing {
        let access =
            psmr_client::Access::new(Duration::from_secs(3), args.who.credentials()?).with_tls(args.who.tls()?);
        Target::Existing(probe::reachable(&args.cluster, access.clone())?, access)
    } else {
        Target::Local { exe: psmr_exe()? }
    };
    run_points(&args, &scenario, &plan.sweeps, &points, &Runner { target, faults, seed: args.seed })
}

/// Runs every point in order, `--repeat` rounds of them, until one fails;
/// then writes the report of those that ran, each point by its median run.
fn run_points(
    args: &BenchArgs,
    scenario: &Scenario,
    sweeps: &[Sweep],
    points: &[Point],
    runner: &Runner,
) -> Result<()> {
    let out = output_dir(args, scenario)?;
    eprintln!(
        "scenario {} ({} point{}), seed {} (pass --seed to replay), results into {}; this machine has {} cores",
        scenario.name,
        points.len(),
        if points.len() == 1 { "" } else { "s" },
        args.seed,
        out.display(),
        report::Machine::this().cores
    );
    let names: Vec<String> = points.iter().map(Point::name).collect();
    let total_s = |i: usize| points[i].params.warmup_s + points[i].params.duration_s;
    let run = |i: usize, logs: &Path| {
        let history = args.history.as_deref().map(|f| runner::history_path(f, i, points.len()));
        runner.run(&points[i], history, logs).with_context(|| format!("point {}", names[i]))
    };
    let summary = |r: &report::PointResult| {
        let p99 = r.latency_us.get("request").map_or(0, |l| l.p99);
        let failed = match r.failed_requests {
            0 => String::new(),
            n => format!(", {n} failed requests"),
        };
        format!("{:.0} commands/s, request p99 {:.2} ms{failed}", r.commands_per_s, p99 as f64 / 1e3)
    };
    let rounds = args.repeat as usize;
    let mut runs: Vec<Vec<report::PointResult>> = vec![Vec::new(); points.len()];
    let mut failure = None;
    for round in 1..=rounds {
        let (tags, logs) = match rounds {
            1 => (names.clone(), out.join("logs")),
            _ => (
                names.iter().map(|n| format!("run {round}/{rounds}: {n}")).collect(),
                out.join("logs").join(format!("run-{round}")),
            ),
        };
        let order = compare::round_order(points.len(), rounds, round, args.seed);
        let (done, failed) = run_each(&tags, &order, total_s, &logs, &run, summary);
        for (i, r) in done {
            runs[i].push(r);
        }
        if failed.is_some() {
            failure = failed;
            break;
        }
    }
    let results: Vec<report::PointResult> = runs.into_iter().filter_map(compare::median_run).collect();
    if !results.is_empty() {
        let files = report::write_all(&out, scenario, sweeps, &results)
            .with_context(|| format!("cannot write results into {}", out.display()))?;
        print!("{}", report::format_points(&results));
        print!("{}", compare::format_auto(&results));
        for f in files {
            println!("wrote {}", f.display());
        }
    }
    if let Some(e) = failure {
        return Err(e);
    }
    judge_nemesis(&runner.faults.nemesis, &results, args.seed)
}

/// Fails a nemesis run that did not pass, with the seed and the schedule
/// to replay it.
fn judge_nemesis(kinds: &[psmr_harness::nemesis::Kind], results: &[report::PointResult], seed: u64) -> Result<()> {
    if kinds.is_empty() {
        return Ok(());
    }
    let mut failed = false;
    for r in results {
        let problems = psmr_bench::faults::nemesis_failures(kinds, &r.events, r.judgement.as_ref());
        if problems.is_empty() {
            continue;
        }
        failed = true;
        eprintln!("point {} did not pass under the nemesis (seed {seed}):", r.name);
        for p in &problems {
            eprintln!("  {p}");
        }
        eprintln!("  its faults:");
        for e in &r.events {
            eprintln!("    {:>8.3} s  {}", e.at_s, e.action);
        }
    }
    match failed {
        true => bail!("the nemesis run did not pass; replay it with --seed {seed}"),
        false => Ok(()),
    }
}

/// `--out`, or `psmr-bench-out/SCENARIO`, created: an unusable output
/// directory fails before a long run, not after.
fn output_dir(args: &BenchArgs, scenario: &Scenario) -> Result<PathBuf> {
    let out = args.out.clone().unwrap_or_else(|| PathBuf::from("psmr-bench-out").join(scenario.name));
    std::fs::create_dir_all(&out).with_context(|| format!("cannot create output directory {}", out.display()))?;
    Ok(out)
}

/// Runs `run(i, logs)` for each point `i` of `order` in turn (`names[i]`
/// names it), its replicas' logs in `logs/point-i`, until one fails: one
/// line per run on stderr (from `summary`), with a progress bar of
/// `total_s(i)` seconds on a terminal. Returns what ran, by point, and
/// the failure.
fn run_each<T>(
    names: &[String],
    order: &[usize],
    total_s: impl Fn(usize) -> f64,
    logs: &Path,
    mut run: impl FnMut(usize, &Path) -> Result<T>,
    summary: impl Fn(&T) -> String,
) -> (Vec<(usize, T)>, Option<anyhow::Error>) {
    let terminal = std::io::stderr().is_terminal();
    // Erases the rest of a progress line on a terminal.
    let clear = if terminal { "\x1b[K" } else { "" };
    let mut done = Vec::with_capacity(order.len());
    for (k, &i) in order.iter().enumerate() {
        let tag = format!("[{}/{}] {}", k + 1, order.len(), names[i]);
        let logs = logs.join(format!("point-{i}"));
        let finished = AtomicBool::new(false);
        let outcome = std::thread::scope(|scope| {
            if terminal {
                let (tag, finished, total) = (&tag, &finished, total_s(i));
                scope.spawn(move || progress(tag, total, finished));
            }
            let outcome = run(i, &logs);
            finished.store(true, Ordering::SeqCst);
            outcome
        });
        match outcome {
            Ok(r) => {
                eprintln!("{tag}: {}{clear}", summary(&r));
                done.push((i, r));
            }
            Err(e) => {
                eprintln!("{tag}: failed{clear}");
                return (done, Some(e));
            }
        }
    }
    (done, None)
}

/// `--quick` and every `--set` applied to `base`.
fn apply_quick_and_sets(args: &BenchArgs, base: &mut Params) -> Result<()> {
    if args.quick {
        // A shifting workload keeps 2 s per phase: long enough for `auto`
        // to see it and decide.
        base.warmup_s = 0.5;
        base.duration_s = 2.0 * (base.phases.len() + 1) as f64;
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
fn progress(tag: &str, total_s: f64, done: &AtomicBool) {
    const WIDTH: usize = 30;
    let start = std::time::Instant::now();
    while !done.load(Ordering::SeqCst) {
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
        || args.kill_replica.is_some()
        || args.nemesis.is_some();
    if cluster_flags {
        bail!(
            "scenario {} is a simulation without a cluster or clients: --sweep, --set, --cluster, --history and faults do not apply",
            scenario.name
        );
    }
    let iterations =
        if args.quick { psmr_bench::simulate::PAPER_ITERATIONS / 10 } else { psmr_bench::simulate::PAPER_ITERATIONS };
    let out = output_dir(args, scenario)?;
    eprintln!(
        "scenario {}: {iterations} iterations per cell, seed {} (pass --seed to replay)",
        scenario.name, args.seed
    );
    let cells = psmr_bench::simulate::table(iterations, args.seed);
    print!("{}", psmr_bench::simulate::format_table(&cells));
    for f in report::write_simulation(&out, scenario, args.seed, &cells)
        .with_context(|| format!("cannot write results into {}", out.display()))?
    {
        println!("wrote {}", f.display());
    }
    Ok(())
}

/// `--scenario catch-up`: one run of `psmr_bench::catch_up`, configured by
/// `--set` (keys, value_bytes, clients, per_request, duration_s, ...).
fn catch_up(args: &BenchArgs, scenario: &Scenario) -> Result<()> {
    let extra = !args.sweeps.is_empty()
        || !args.cluster.is_empty()
        || args.history.is_some()
        || args.kill_leader_every.is_some()
        || args.kill_replica.is_some()
        || args.nemesis.is_some();
    if extra {
        bail!("scenario catch-up is one run on a cluster of its own, with faults of its own: --sweep, --cluster, --history and faults do not apply");
    }
    let mut params = scenario.base.clone();
    if args.quick {
        params.keys = 1 << 16;
        params.duration_s = 2.0;
    }
    for set in &args.sets {
        let Some((key, value)) = set.split_once('=') else {
            bail!("malformed --set {set:?}: expected KEY=VALUE such as keys=2097152");
        };
        params.set(key, value)?;
    }
    if params.service != "kv" {
        bail!("scenario catch-up fills the key-value store: service must be kv");
    }
    runner::check_params(&params, false, args.seed)?;
    let out = output_dir(args, scenario)?;
    eprintln!(
        "scenario catch-up: {} keys of {} bytes, seed {} (pass --seed to replay), results into {}",
        params.keys,
        params.value_bytes.unwrap_or(1024),
        args.seed,
        out.display()
    );
    let (exe, logs) = (psmr_exe()?, out.join("logs"));
    let spec = psmr_bench::catch_up::CatchUpSpec { exe: &exe, params: &params, seed: args.seed, logs: &logs };
    let report = psmr_bench::catch_up::run(&spec)?;
    let text = report.to_markdown();
    print!("{text}");
    let (md, json) = (out.join("report.md"), out.join("results.json"));
    std::fs::write(&md, &text).with_context(|| format!("cannot write {}", md.display()))?;
    std::fs::write(&json, serde_json::to_string_pretty(&report)?)
        .with_context(|| format!("cannot write {}", json.display()))?;
    println!("wrote {}\nwrote {}", md.display(), json.display());
    Ok(())
}

/// `--scenario peers`: etcd, psmr and Redis side by side on this machine
/// (`psmr_bench::peers`); the psmr runs are ordinary points.
fn peers(args: &BenchArgs, scenario: &Scenario) -> Result<()> {
    let extra = !args.cluster.is_empty()
        || args.history.is_some()
        || args.kill_leader_every.is_some()
        || args.kill_replica.is_some()
        || args.nemesis.is_some();
    if extra {
        bail!("scenario peers starts its own clusters of every system: --cluster, --history and faults do not apply");
    }
    let overrides = args.overrides()?;
    if let Some(s) = overrides.iter().find(|s| s.key != "clients") {
        bail!("scenario peers sweeps only clients (its systems and setups are fixed), not {}", s.key);
    }
    // Before anything runs: a missing program is the likeliest failure.
    let tools = peers::Tools::find()?;
    let mut base = scenario.base.clone();
    apply_quick_and_sets(args, &mut base)?;
    let cases = cases::plan(&scenario::merge(&scenario.sweeps, &overrides)?, &base)?;
    for case in &cases {
        cases::check(case, &base, args.seed).with_context(|| case.name())?;
    }
    let out = output_dir(args, scenario)?;
    let mut setup = cases::setup(&tools, &base, args.seed);
    eprintln!(
        "scenario peers ({} runs; etcd {}, redis {}), seed {}, results into {}",
        cases.len(),
        setup.etcd_version,
        setup.redis_version,
        args.seed,
        out.display()
    );
    let exe = psmr_exe()?;
    let names: Vec<String> = cases.iter().map(peers::Case::name).collect();
    let run = |i: usize, logs: &Path| {
        cases::run(&cases[i], &tools, &setup, &base, logs, args.seed, &exe).with_context(|| names[i].clone())
    };
    let summary = |row: &peers::Row| {
        format!(
            "{:.0} puts/s, p50 {:.2} ms, p99 {:.2} ms",
            row.puts_per_s,
            row.p50_us as f64 / 1e3,
            row.p99_us as f64 / 1e3
        )
    };
    let order: Vec<usize> = (0..names.len()).collect();
    let (rows, failure) =
        run_each(&names, &order, |_| base.warmup_s + base.duration_s, &out.join("logs"), run, summary);
    let rows: Vec<peers::Row> = rows.into_iter().map(|(_, row)| row).collect();
    setup.load_average = format!("{} before the runs, {} after", setup.load_average, cases::load_average());
    if !rows.is_empty() {
        let files = peers::write(&out, scenario.about, &setup, &rows)
            .with_context(|| format!("cannot write results into {}", out.display()))?;
        print!("{}", peers::format_table(&rows));
        for f in files {
            println!("wrote {}", f.display());
        }
    }
    failure.map_or(Ok(()), Err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steal_backoffs_take_zero_microseconds_and_durations_up_to_a_second() {
        assert_eq!(parse_backoff("0"), Ok(Duration::ZERO));
        assert_eq!(parse_backoff("500us"), Ok(Duration::from_micros(500)));
        assert_eq!(parse_backoff("32ms"), Ok(Duration::from_millis(32)));
        assert!(parse_backoff("2s").is_err());
        assert!(parse_backoff("xus").is_err());
        assert!(parse_backoff("-1").is_err());
    }

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
    fn the_help_names_every_parameter() {
        use clap::CommandFactory;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            bench: BenchArgs,
        }
        let help = Cli::command().render_long_help().to_string().replace(char::is_whitespace, "");
        for key in scenario::keys() {
            assert!(help.contains(key), "{key} is missing");
        }
    }
}
