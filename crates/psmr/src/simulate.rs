//! `psmr simulate`: deterministic simulation testing of a whole cluster
//! (`psmr_sim`, judged by `psmr_sim::dst`): its flags, and what it
//! prints.

use anyhow::{bail, Context, Result};
use clap::Args;
use psmr_sim::dst::{self, DstConfig, SeedResult};
use psmr_sim::{Bug, Faults, SimConfig};
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// `psmr simulate`.
#[derive(Args, Debug)]
pub struct SimulateArgs {
    /// Seeds to run: --first-seed, --first-seed + 1, ...
    #[arg(long, default_value_t = 100)]
    seeds: u64,
    /// The first seed.
    #[arg(long, default_value_t = 0)]
    first_seed: u64,
    /// Run this one seed and print its trace (every event of the run) to
    /// stdout or --trace-out; pass the same --faults, --steps and other
    /// flags as the run that found it.
    #[arg(long, value_name = "SEED")]
    replay: Option<u64>,
    /// Faults: all, none, or a comma-separated list of loss, delay,
    /// duplicate, reorder, partition, one-way, crash, torn, skew,
    /// membership, disk-full, damage, pause.
    #[arg(long, default_value = "all")]
    faults: String,
    /// Simulated milliseconds of load with faults per seed (then a quiet
    /// phase, faults healed, until every replica caught up).
    #[arg(long, value_name = "T", default_value_t = 2_000)]
    steps: u64,
    /// Threads running seeds at once [default: the available cores].
    #[arg(long, value_name = "J")]
    jobs: Option<usize>,
    /// Replicas per cluster (0: 3 or 5, drawn from each seed).
    #[arg(long, default_value_t = 0)]
    replicas: usize,
    /// Simulated clients.
    #[arg(long, default_value_t = 4)]
    clients: usize,
    /// Keys the clients read and write.
    #[arg(long, default_value_t = 4)]
    keys: u64,
    /// How leaders serve reads: `log` (a log entry, like writes), `index`
    /// (raft's ReadIndex, the replicas' default) or `drawn` (either, drawn
    /// from each seed).
    #[arg(long, default_value = "drawn", value_parser = ["log", "index", "drawn"])]
    reads: String,
    /// Plant a known bug in the replicas' core to see the checks catch it
    /// (a testing aid): ack-before-commit, ignore-vote-floor,
    /// no-reply-cache, read-without-round, reorder-commands,
    /// apply-twice-after-restore or reply-before-sync. Two show only with
    /// the faults that expose them: read-without-round with --reads index,
    /// ignore-vote-floor with --replicas 3 --faults
    /// crash,damage,pause,loss,delay.
    #[arg(long, value_name = "BUG")]
    bug: Option<String>,
    /// With --replay: write the trace to FILE instead of stdout.
    #[arg(long, value_name = "FILE")]
    trace_out: Option<PathBuf>,
    /// The linearizability checker's bound on states per key.
    #[arg(long, default_value_t = dst::MAX_STATES_DEFAULT)]
    max_states: usize,
    /// Stop at the first seed with a violation.
    #[arg(long)]
    fail_fast: bool,
    /// Print the report as one JSON object.
    #[arg(long)]
    json: bool,
}

impl SimulateArgs {
    fn sim_config(&self, trace: bool) -> Result<SimConfig> {
        let config = SimConfig {
            replicas: self.replicas,
            clients: self.clients,
            keys: self.keys,
            steps: self.steps,
            faults: Faults::parse(&self.faults)?,
            bug: self.bug.as_deref().map(str::parse::<Bug>).transpose()?,
            reads_through_log: match self.reads.as_str() {
                "log" => Some(true),
                "index" => Some(false),
                _ => None,
            },
            trace,
            ..SimConfig::default()
        };
        config.validate()?;
        Ok(config)
    }

    /// The flags that replay `seed` as this run ran it.
    fn replay_command(&self, seed: u64) -> String {
        let mut cmd = format!("psmr simulate --replay {seed} --faults {} --steps {}", self.faults, self.steps);
        if self.replicas != 0 {
            cmd += &format!(" --replicas {}", self.replicas);
        }
        if self.clients != 4 {
            cmd += &format!(" --clients {}", self.clients);
        }
        if self.keys != 4 {
            cmd += &format!(" --keys {}", self.keys);
        }
        if self.reads != "drawn" {
            cmd += &format!(" --reads {}", self.reads);
        }
        if let Some(bug) = &self.bug {
            cmd += &format!(" --bug {bug}");
        }
        cmd
    }
}

/// Runs `psmr simulate`.
pub fn simulate(args: SimulateArgs) -> Result<()> {
    if let Some(seed) = args.replay {
        return replay(&args, seed);
    }
    if args.seeds == 0 {
        return Err(dst::DstError::NoSeeds.into());
    }
    let config = DstConfig {
        first_seed: args.first_seed,
        seeds: args.seeds,
        jobs: args.jobs.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())).max(1),
        sim: args.sim_config(false)?,
        max_states: args.max_states,
        stop_on_violation: args.fail_fast,
    };
    if !args.json {
        eprintln!(
            "simulating seeds {}..={} on {} threads, faults {}, {} ms of load each",
            config.first_seed,
            config.first_seed.saturating_add(config.seeds - 1),
            config.jobs,
            config.sim.faults,
            config.sim.steps
        );
    }
    let start = Instant::now();
    let every = (config.seeds / 10).clamp(1, 10_000);
    let last_print = AtomicU64::new(0);
    let json = args.json;
    let report = dst::run(&config, |done, result: &SeedResult| {
        if json {
            return;
        }
        for v in &result.violations {
            eprintln!("  seed {}: {}: {}", v.seed, v.kind, v.description);
        }
        if done % every == 0 && last_print.fetch_max(done, Ordering::Relaxed) < done {
            let rate = done as f64 / start.elapsed().as_secs_f64().max(1e-9);
            eprintln!("  {done}/{} seeds, {rate:.1} seeds/s", config.seeds);
        }
    })?;
    if json {
        println!("{}", serde_json::to_string(&report).context("report serializes")?);
    } else {
        print!("{}", report.text());
    }
    if !report.clean() {
        let seeds = report.failed_seeds();
        if !json {
            for &seed in seeds.iter().take(5) {
                println!("replay: {}", args.replay_command(seed));
            }
        }
        bail!("{} of {} seeds failed (first: seed {})", report.failed, report.seeds_run, seeds[0]);
    }
    Ok(())
}

fn replay(args: &SimulateArgs, seed: u64) -> Result<()> {
    let config = args.sim_config(true)?;
    let result = dst::run_seed(seed, &config, args.max_states)?;
    let mut summary = String::new();
    if let Some(o) = &result.outcome {
        let trace = o.trace.join("\n") + "\n";
        match &args.trace_out {
            Some(path) => {
                std::fs::write(path, &trace).with_context(|| format!("cannot write {}", path.display()))?;
                eprintln!("trace of seed {seed}: {} events written to {}", o.trace.len(), path.display());
            }
            None => {
                let mut out = std::io::stdout().lock();
                // A closed stdout (e.g. piped into `head`) ends the trace.
                let _ = out.write_all(trace.as_bytes());
            }
        }
        let s = &o.stats;
        summary += &format!(
            "seed {seed}: {} replicas, {} simulated ms, {} events, trace hash {:016x}; highest term {}, {} entries \
             applied; operations: {} answered, {} writes unknown, {} reads abandoned\n",
            o.replicas, s.sim_ms, s.events, o.trace_hash, s.term, s.applied, s.ops_ok, s.ops_unknown, s.ops_fail
        );
        summary += &format!("faults: {:?}\n", o.faults);
    }
    if result.too_hard {
        summary += "the history was too hard to check within --max-states\n";
    }
    for v in &result.violations {
        summary += &format!("VIOLATION {}: {}\n", v.kind, v.description);
    }
    if args.trace_out.is_some() {
        print!("{summary}");
    } else {
        eprint!("{summary}");
    }
    if !result.violations.is_empty() {
        bail!("seed {seed} fails: {} violation(s)", result.violations.len());
    }
    Ok(())
}
