//! `psmr`: the command line of psmr, parallel state machine replication.
//!
//! A thin layer over the library crates: it parses flags, turns them into
//! the crates' configurations, and prints what they return. Every error ends
//! up as one `psmr: error: ...` line on stderr and a non-zero exit code.

mod bench;
mod certs;
mod cluster;
mod mapping;
mod rt_bench;
mod simulate;
mod users;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use psmr_sched::SchedulerKind;
use psmr_sched_bench::{format_table, MappingSource, SchedBenchConfig, ServiceKind};
use psmr_services::{Cost, Mix, Spread, WorkloadConfig};
use std::io::Write;
use std::process::ExitCode;

/// A replica allocates and frees a few small buffers per command on many
/// threads (operations, replies, reply-cache slots): mimalloc's per-thread
/// free lists make that a fraction of what glibc's allocator costs there.
/// It is built without transparent huge pages (the workspace's `no_thp`):
/// see the workspace's Cargo.toml.
#[cfg(not(feature = "alloc-meter"))]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// With `alloc-meter`, `cap::Cap` around mimalloc counts the bytes
/// allocated (no limit) for `psmr fuzz`'s allocation bound. Off by default:
/// its counters are shared by all threads, and contended atomics on every
/// allocation slow a replica's parallel execution measurably.
#[cfg(feature = "alloc-meter")]
#[global_allocator]
static ALLOCATOR: cap::Cap<mimalloc::MiMalloc> = cap::Cap::new(mimalloc::MiMalloc, usize::MAX);

/// The bytes allocated so far, where this build counts them.
fn alloc_meter() -> Option<psmr_harness::fuzz::AllocMeter> {
    #[cfg(feature = "alloc-meter")]
    return Some(|| ALLOCATOR.total_allocated());
    #[cfg(not(feature = "alloc-meter"))]
    None
}

/// Parallel state machine replication: replicas agree on an order of
/// commands and execute them on many cores, deterministically.
#[derive(Parser, Debug)]
#[command(
    name = "psmr",
    version,
    about,
    long_about = None,
    propagate_version = true,
    after_help = "Help texts cite the papers psmr implements by number and place (\"003 Alg. 3\": \
                  Algorithm 3 of document 003); docs/papers.md lists them."
)]
struct Cli {
    /// How log lines are written to standard error: `text` for people,
    /// `json` (one object per line) for log shippers. Replicas that
    /// `psmr cluster` starts take PSMR_LOG_FORMAT from the environment.
    #[arg(long, global = true, env = "PSMR_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

/// `--log-format`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum LogFormat {
    /// Lines for people (in colour on a terminal only).
    Text,
    /// One JSON object per line: time, level, target, fields, message.
    Json,
}

/// Logs to standard error in `format`: warnings, and the audit of admin
/// operations, unless `RUST_LOG` says otherwise.
fn init_logs(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,psmr::audit=info"));
    let logs = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        LogFormat::Json => logs.json().init(),
        // Colour for a terminal only: logs written to a file or a pipe
        // carry no escape codes.
        LogFormat::Text => logs.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())).init(),
    }
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run one replica of a cluster described by a configuration file.
    #[command(after_help = "Examples:\n  \
        psmr replica --config cluster.toml --id 2          # one host of a cluster (docs/cluster.md)\n  \
        psmr replica --config cluster.toml --id 4 --join   # a replica added later; then psmr client add-replica")]
    Replica(cluster::ReplicaArgs),
    /// Run a local cluster of replica processes on this machine (loopback,
    /// free ports) until Ctrl-C or SIGTERM.
    #[command(after_help = "Examples:\n  \
        psmr cluster --replicas 3 --redis              # prints the variables to export once a leader is elected\n  \
        psmr cluster --data-dir ./c --storage disk     # kept in ./c; run it again to bring the same cluster back")]
    Cluster(cluster::ClusterArgs),
    /// Talk to a cluster: put, get, delete, status, load, members,
    /// add-replica, remove-replica.
    #[command(after_help = "Examples:\n  \
        export PSMR_CLUSTER=127.0.0.1:7001,127.0.0.1:7002 PSMR_USER=admin PSMR_PASSWORD_FILE=DIR/admin.password\n  \
        psmr client put 7 seven && psmr client get 7\n  \
        psmr client status\n  \
        psmr client load --clients 8 --per-request 50 --duration 5\n  \
        psmr client remove-replica 3                   # an admin's command")]
    Client(cluster::ClientArgs),
    /// Compare execution schedulers on pre-built ordered batches (no network).
    ///
    /// Generates one workload, cuts it into batches, and runs it through each
    /// scheduler and worker count from a fresh service. Every run must end
    /// with the same state digest and reply digest as the first; a mismatch
    /// is an error.
    SchedBench(SchedBenchArgs),
    /// Check a key-value history (one JSON operation per line) for
    /// linearizability; exit code 0 only when it is linearizable.
    CheckHistory(cluster::CheckHistoryArgs),
    /// Run a named end-to-end scenario (local clusters, closed-loop
    /// clients, sweeps) and write its report: JSON, CSV, SVG plots and
    /// Markdown.
    Bench(bench::BenchArgs),
    /// Map request classes to worker threads for early scheduling: the
    /// optimizer of 003 Alg. 3 (proven optimal) or the naive mapping.
    Mapping(mapping::MappingArgs),
    /// Make a cluster CA and a certificate per replica for mutual TLS
    /// between replicas and TLS on the ports clients reach, and user
    /// certificates; print the `[peer_tls]` and `[client_tls]` blocks.
    #[command(after_help = "Examples:\n  \
        psmr certs --dir certs --replicas 3            # a new cluster CA and replicas 1-3\n  \
        psmr certs --dir certs --ids 4                 # replica 4, signed by the CA already in certs/\n  \
        psmr certs --dir certs --replicas 3 --hosts 10.0.0.1,10.0.0.2,10.0.0.3   # clients dial these\n  \
        psmr certs --dir certs --user ops              # ops's certificate: no password needed")]
    Certs(certs::CertsArgs),
    /// Hash a user's password (read from standard input, or made with
    /// --generate) and print the `[[users]]` block for every replica's
    /// configuration.
    #[command(after_help = "Examples:\n  \
        psmr passwd --user app < app.password                          # a data user; the password from a file\n  \
        psmr passwd --user ops --role admin --generate ops.password    # an admin with a new random password")]
    Passwd(users::PasswdArgs),
    /// Fuzz the decoders of the wire, log entries, snapshots and RESP with
    /// seeded mutations of valid encodings; fails on any panic or any input
    /// allocating more than the bound.
    Fuzz(FuzzArgs),
    /// Deterministic simulation testing: run whole simulated clusters (the
    /// replicas' own core: raft, guard, batching, reads, membership, reply
    /// cache and apply loop, executing the kv store; simulated clock,
    /// network, disk and clients) under faults, one seed each, and check agreement,
    /// equal states, exactly-once and linearizability; `--replay SEED`
    /// prints one seed's trace. Exit code 0 only when every seed passes.
    Simulate(simulate::SimulateArgs),
    /// Run psmr-rt's task pools, policy by policy, next to tokio's
    /// multi-thread runtime on the workloads of 001 (packets, cache
    /// effects, bimodal chains, option pricing, the audio mixer) and two
    /// micro-benchmarks (spawn, yield): throughput, tail latency, steals
    /// and overflows.
    RtBench(rt_bench::RtBenchArgs),
}

#[derive(Args, Debug)]
struct FuzzArgs {
    /// Inputs per target.
    #[arg(long, default_value_t = 100_000)]
    inputs: u64,
    /// Target to fuzz (repeatable or comma-separated): wire-client,
    /// wire-server, entry, kv-op, kv-reply, list-op, list-reply,
    /// snapshot-kv, snapshot-list, raft, membership, conf-change, resp, serde, or
    /// all.
    #[arg(long = "target", value_delimiter = ',', default_value = "all")]
    targets: Vec<String>,
    /// Seed of the random inputs (default: from the clock; printed).
    #[arg(long)]
    seed: Option<u64>,
    /// Allocation bound per input: this many times its length ...
    #[arg(long, default_value_t = 4)]
    alloc_factor: usize,
    /// ... plus this many bytes.
    #[arg(long, default_value_t = 1 << 20)]
    alloc_slack: usize,
    /// Print the report as one JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
#[command(args_override_self = true)]
struct SchedBenchArgs {
    /// Service: kv (key-value store) or list (sharded linked list).
    #[arg(long, default_value = "kv", value_parser = parse_service)]
    service: ServiceKind,
    /// Class model. list: readers-writers, sharded-snapshot, sharded-global;
    /// kv: readers-writers, sharded.
    #[arg(long, default_value = "readers-writers")]
    model: String,
    /// Scheduler to run (repeatable or comma-separated): sequential,
    /// late-cbase, late-batch-keys, late-batch-bitmap, late-cbase-pool,
    /// late-batch-bitmap-pool, early, early-busywait, early-ws-queue,
    /// early-ws-semi, early-ws-nonblocking, early-ws-optimistic, auto, or
    /// all.
    #[arg(long = "scheduler", value_delimiter = ',', default_value = "all")]
    schedulers: Vec<String>,
    /// Worker threads (comma-separated list: each parallel scheduler runs with each).
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    workers: Vec<usize>,
    /// Commands to generate.
    #[arg(long, default_value_t = 1_000_000)]
    commands: usize,
    /// Commands per batch (one batch is one log entry).
    #[arg(long, default_value_t = 50)]
    batch: usize,
    /// Execution cost: light, moderate or heavy (list: 1, 1k, 10k entries per shard).
    #[arg(long, default_value = "light", value_parser = parse_cost)]
    cost: Cost,
    /// List service: entries per shard, overriding --cost.
    #[arg(long)]
    list_size: Option<usize>,
    /// Percentage of writes (shorthand for --workload P-0-0).
    #[arg(long, conflicts_with = "workload")]
    write_pct: Option<f64>,
    /// Workload α-β-γ: α% local writes, β% global operations, γ% of which write (e.g. 25-5-25).
    #[arg(long, value_parser = parse_mix)]
    workload: Option<Mix>,
    /// Shards of the list, or of the kv key space for the sharded model.
    #[arg(long, default_value_t = 1)]
    shards: usize,
    /// Share of local operations sent to shard 1 (0 = balanced).
    #[arg(long, default_value_t = 0.0)]
    skew: f64,
    /// Share of local writes sent to shard 1, when it differs from --skew
    /// (which then applies to local reads only; 0 = balanced).
    #[arg(long)]
    write_skew: Option<f64>,
    /// How conflicting commands are spread among the others: uniform or exponential.
    #[arg(long, default_value = "uniform", value_parser = parse_spread)]
    spread: Spread,
    /// kv: size of the key space.
    #[arg(long, default_value_t = 100_000)]
    keys: u64,
    /// Distinct client ids the commands are spread over.
    #[arg(long, default_value_t = 64)]
    clients: u64,
    /// Workload seed (printed with the results; pass it back to replay).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Bits of each batch bitmap (late-batch-bitmap).
    #[arg(long, default_value_t = psmr_model::BITMAP_BITS_DEFAULT)]
    bitmap_bits: u32,
    /// Late schedulers (and auto): most nodes in the dependency graph
    /// (comma-separated list: each such scheduler runs with each) [default:
    /// 150 for late-cbase and late-cbase-pool, whose nodes are commands; 32
    /// for the others, whose nodes are batches]
    #[arg(long, value_delimiter = ',')]
    graph_max: Vec<usize>,
    /// Work stealing: the longest pause between fruitless steal rounds
    /// (`32ms`, `500us`, or `0` to retry at once); a comma-separated list
    /// runs each stealing scheduler with each, to compare them [default:
    /// 32ms]
    #[arg(long, value_delimiter = ',', value_parser = bench::parse_backoff)]
    steal_backoff: Vec<std::time::Duration>,
    /// Early: most batches waiting in one worker's queue.
    #[arg(long, default_value_t = psmr_sched::QUEUE_DEPTH_DEFAULT)]
    queue_depth: usize,
    /// Early schedulers: `default`; `optimal` (003 Alg. 3 for weights equal
    /// to the workload's class frequencies; `optimal:total` weighs O.1 by
    /// all classes, see `psmr mapping --help`); `naive` (003 §6.5); a JSON
    /// mapping file; or a spec like `R=conc:0,1;W=seq:0-1`. Repeat the flag,
    /// or list keywords comma-separated (`naive,optimal`), to run each
    /// scheduler with each mapping.
    #[arg(long = "mapping", default_value = "default")]
    mappings: Vec<String>,
    /// early-busywait and work stealing: rounds a waiting worker spins before
    /// it yields and naps [default: 2000 when every worker has a core, else 0].
    #[arg(long)]
    spin: Option<u32>,
    /// Sample per-worker metrics of the early schedulers (000 §5.3) every
    /// MS milliseconds: sync and queue idleness, queue size, executed, steals.
    #[arg(long, value_name = "MS", num_args = 0..=1, default_missing_value = "1000")]
    metrics: Option<u64>,
    /// Work stealing: which victims an idle worker tries, in order: first
    /// (by id), random, or next (from the id after its own) [default: next
    /// for early-ws-optimistic, first for the others, as in 000 §6.2].
    #[arg(long, value_parser = parse_victims)]
    victims: Option<psmr_sched::Victims>,
    /// late-batch-bitmap-pool and late-cbase-pool: the policy of their
    /// psmr-rt pool: fifo, lifo, fifo-slot (a freed command runs next on
    /// the worker that freed it), or a LIFO heuristic.
    #[arg(long, default_value = "fifo-slot", value_parser = parse_pool)]
    pool: psmr_rt::Policy,
    /// Run each variant N times (in rounds over all variants) and report the median.
    ///
    /// With 2 or more, each variant after the first is also compared with the first
    /// round by round (the `vs_first` column): the median of the per-round throughput
    /// ratios, and from 6 rounds on its 95 % confidence interval. A difference is
    /// resolved when the interval excludes 1.00x.
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// Run every variant in this process instead of a fresh child process
    /// per run. Runs that share a process do not start equal (a run after
    /// others allocates in memory they fragmented), so this is for
    /// debugging, not for comparisons.
    #[arg(long)]
    in_process: bool,
    /// Run only variant I of the plan (what each child process does).
    #[arg(long, hide = true, value_name = "I")]
    only: Option<usize>,
    /// Print one JSON object per run instead of a table.
    #[arg(long)]
    json: bool,
}

fn parse_service(s: &str) -> Result<ServiceKind, String> {
    s.parse().map_err(|e: psmr_sched_bench::BenchError| e.to_string())
}

fn parse_victims(s: &str) -> Result<psmr_sched::Victims, String> {
    s.parse().map_err(|e: psmr_sched::SchedError| e.to_string())
}

fn parse_pool(s: &str) -> Result<psmr_rt::Policy, String> {
    s.parse().map_err(|e: psmr_rt::RtError| e.to_string())
}

fn parse_cost(s: &str) -> Result<Cost, String> {
    s.parse().map_err(|e| format!("{e}"))
}

fn parse_spread(s: &str) -> Result<Spread, String> {
    s.parse().map_err(|e| format!("{e}"))
}

fn parse_mix(s: &str) -> Result<Mix, String> {
    s.parse().map_err(|e| format!("{e}"))
}

/// Every run in a child process of its own, unless told otherwise or
/// already a child: this program again, with the same arguments and the
/// seed made explicit.
fn isolation(in_process: bool, config: &SchedBenchConfig) -> Result<Option<psmr_sched_bench::Isolate>> {
    if in_process || config.only.is_some() {
        return Ok(None);
    }
    let program = std::env::current_exe().context("cannot find this program to run each variant in a child")?;
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    args.extend(["--seed".to_string(), config.workload.seed.to_string()]);
    Ok(Some(psmr_sched_bench::Isolate { program, args }))
}

fn sched_bench(args: SchedBenchArgs) -> Result<()> {
    let mut schedulers = Vec::new();
    for name in &args.schedulers {
        if name == "all" {
            schedulers.extend(SchedulerKind::ALL);
        } else {
            schedulers.push(name.parse::<SchedulerKind>()?);
        }
    }
    let mix = match (args.write_pct, args.workload) {
        (Some(p), _) => Mix::writes(p),
        (None, Some(m)) => m,
        (None, None) => Mix::writes(0.0),
    };
    let config = SchedBenchConfig {
        service: args.service,
        model: args.model,
        schedulers,
        workers: args.workers,
        batch: args.batch,
        cost: args.cost,
        list_size: args.list_size,
        workload: WorkloadConfig {
            commands: args.commands,
            seed: args.seed,
            shards: args.shards,
            skew: args.skew,
            write_skew: args.write_skew,
            spread: args.spread,
            mix,
            keys: args.keys,
            clients: args.clients,
        },
        bitmap_bits: args.bitmap_bits,
        graph_max: args.graph_max,
        steal_retry_max: args.steal_backoff,
        queue_depth: args.queue_depth,
        mappings: MappingSource::parse_list(&args.mappings)?,
        repeat: args.repeat,
        spin: args.spin,
        metrics_interval_ms: args.metrics,
        victims: args.victims,
        pool: args.pool,
        isolate: None,
        only: args.only,
    };
    config.validate()?;
    let config = SchedBenchConfig { isolate: isolation(args.in_process, &config)?, ..config };
    let json = args.json;
    let stdout = std::io::stdout();
    if !json {
        eprintln!("running {} with seed {} (pass --seed to replay)", config.service, config.workload.seed);
    }
    let reports = psmr_sched_bench::run(&config, |r| {
        if json {
            let mut out = stdout.lock();
            // A closed stdout (e.g. piped into `head`) is not worth a panic.
            let _ = writeln!(out, "{}", serde_json::to_string(r).expect("report serializes"));
            for m in &r.metrics {
                let _ = writeln!(out, "{}", serde_json::to_string(m).expect("sample serializes"));
            }
        } else {
            eprintln!("  {} with {} workers: {:.0} commands/s", r.scheduler, r.workers, r.throughput_cps);
        }
    })
    .context("sched-bench failed")?;
    if !json {
        print!("{}", format_table(&reports));
        if config.metrics_interval_ms.is_some() {
            println!("per-worker metrics (share of the run):");
            print!("{}", psmr_sched_bench::format_metrics_table(&reports));
        }
        println!("all {} runs agree on state and replies", reports.len());
    }
    if reports.is_empty() {
        bail!("nothing ran");
    }
    Ok(())
}

fn fuzz(args: FuzzArgs) -> Result<()> {
    use psmr_harness::fuzz;
    let targets = fuzz::select(&args.targets).map_err(anyhow::Error::msg)?;
    let config = fuzz::FuzzConfig {
        inputs: args.inputs,
        seed: args.seed.unwrap_or_else(fuzz::fresh_seed),
        alloc_factor: args.alloc_factor,
        alloc_slack: args.alloc_slack,
    };
    if !args.json {
        eprintln!("fuzzing {} targets, seed {} (repeat with --seed {})", targets.len(), config.seed, config.seed);
    }
    let meter = alloc_meter();
    if meter.is_none() && !args.json {
        eprintln!("allocation is not measured: build psmr with --features alloc-meter for the allocation bound");
    }
    let report = fuzz::run(&targets, &config, meter);
    if args.json {
        println!("{}", serde_json::to_string(&report).context("report serializes")?);
    } else {
        print!("{}", report.text());
    }
    if !report.clean() {
        bail!(
            "fuzzing found {} crashes and {} inputs over the allocation bound (seed {})",
            report.total_crashes,
            report.total_over_bound,
            config.seed
        );
    }
    Ok(())
}

/// The error and its causes on one line. Library errors often repeat their
/// source in their own message; a cause already said is not said twice.
fn error_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let msg = cause.to_string();
        if !line.ends_with(&msg) {
            if !line.is_empty() {
                line.push_str(": ");
            }
            line.push_str(&msg);
        }
    }
    line
}

fn main() -> ExitCode {
    // Rust ignores SIGPIPE, so printing to a closed pipe (`psmr ... | head`)
    // panics in `println!`. Unix tools end quietly instead.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let msg = info.payload().downcast_ref::<String>().map(String::as_str).unwrap_or("");
        if msg.contains("failed printing to stdout") && msg.contains("Broken pipe") {
            std::process::exit(0);
        }
        default_hook(info);
        if cluster::FAIL_STOP.load(std::sync::atomic::Ordering::SeqCst) {
            // A replica whose thread panicked must not run on without it.
            eprintln!("psmr replica: a thread panicked; the replica stops (fail-stop)");
            std::process::exit(psmr_harness::launch::EXIT_PANIC);
        }
    }));
    let matches = <Cli as clap::CommandFactory>::command().get_matches();
    let cli = match <Cli as clap::FromArgMatches>::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    init_logs(cli.log_format);
    // `FAILPOINTS=name=action` injects faults (builds with `failpoints`).
    #[cfg(feature = "failpoints")]
    let _faults = fail::FailScenario::setup();
    let result = match cli.command {
        Command::SchedBench(args) => sched_bench(args),
        Command::Replica(args) => cluster::replica(args),
        Command::Cluster(args) => cluster::cluster(args, given(&matches, "cluster")),
        Command::Client(args) => cluster::client(args),
        Command::Bench(args) => bench::bench(args),
        Command::Mapping(args) => mapping::mapping(args),
        Command::Certs(args) => certs::certs(args),
        Command::Passwd(args) => users::passwd(args),
        Command::Fuzz(args) => fuzz(args),
        Command::Simulate(args) => simulate::simulate(args),
        Command::RtBench(args) => rt_bench::rt_bench(args),
        Command::CheckHistory(args) => match cluster::check_history(args) {
            Ok(code) => return code,
            Err(e) => Err(e),
        },
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("psmr: error: {}", error_line(&e));
            ExitCode::FAILURE
        }
    }
}

/// The flags of subcommand `name` given on the command line (not
/// defaulted), as `--flag-name`.
fn given(matches: &clap::ArgMatches, name: &str) -> Vec<String> {
    let Some(sub) = matches.subcommand_matches(name) else { return Vec::new() };
    sub.ids()
        .filter(|id| sub.value_source(id.as_str()) == Some(clap::parser::ValueSource::CommandLine))
        .map(|id| format!("--{}", id.as_str().replace('_', "-")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// `docs/cli.md`: the long help of `psmr` and of every subcommand, as
    /// the binary prints it (environment values hidden, 100 columns).
    fn cli_reference() -> String {
        fn add(out: &mut String, path: &str, cmd: &mut clap::Command) {
            let mut cmd = cmd.clone().term_width(100).mut_args(|a| a.hide_env_values(true));
            let help = cmd.render_long_help().to_string();
            let help: Vec<&str> = help.lines().map(str::trim_end).collect();
            out.push_str(&format!("\n## `{path}`\n\n```text\n{}\n```\n", help.join("\n").trim_end()));
            let names: Vec<String> = cmd.get_subcommands().map(|c| c.get_name().to_string()).collect();
            for name in names.iter().filter(|n| *n != "help") {
                add(out, &format!("{path} {name}"), cmd.find_subcommand_mut(name).expect("listed"));
            }
        }
        let mut out = String::from(
            "# Command line reference\n\nEvery `psmr` command and flag, as `psmr ... --help` prints them. \
             Generated: a test (`cli_reference_is_current` in `crates/psmr/src/main.rs`) fails when this page \
             and the code differ, and `PSMR_UPDATE_DOCS=1 cargo test -p psmr --bin psmr cli_reference` \
             rewrites it.\n",
        );
        add(&mut out, "psmr", &mut Cli::command());
        out
    }

    #[test]
    fn cli_reference_is_current() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/cli.md");
        let now = cli_reference();
        if std::env::var_os("PSMR_UPDATE_DOCS").is_some() {
            std::fs::write(path, &now).unwrap();
        }
        let written = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            written == now,
            "docs/cli.md differs from the help texts; run PSMR_UPDATE_DOCS=1 cargo test -p psmr --bin psmr cli_reference"
        );
    }

    #[test]
    fn sched_bench_help_names_every_scheduler() {
        let mut cli = Cli::command();
        let help = cli.find_subcommand_mut("sched-bench").expect("the subcommand").render_long_help().to_string();
        let names: String = help.split_whitespace().collect::<Vec<_>>().join(" ");
        for kind in psmr_sched::SchedulerKind::ALL {
            assert!(names.contains(&format!(" {},", kind.name())), "{} is missing", kind.name());
        }
    }
}
