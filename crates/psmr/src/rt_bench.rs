//! `psmr rt-bench`: psmr-rt's task pools next to tokio.

use anyhow::{Context, Result};
use clap::Args;
use psmr_bench::rt_bench::{self, RtBenchConfig, Workload};
use psmr_rt::{Full, Policy, Steal, Victims};
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct RtBenchArgs {
    /// Workload (repeatable or comma-separated): spawn, yield, packet,
    /// packet-cache, packet-bimodal, options, or all.
    #[arg(long = "workload", value_delimiter = ',', default_value = "packet")]
    workloads: Vec<String>,
    /// Worker threads of every runtime.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Tasks per run: packets, options, spawns or turns (default: the
    /// workload's, e.g. 50000 packets; 001 also ran packet with 1000000).
    #[arg(long)]
    tasks: Option<usize>,
    /// psmr-rt policies (comma-separated): fifo, lifo, fifo-slot,
    /// lifo-reverse[:N], lifo-alternate, lifo-stochastic[:P], or all.
    #[arg(long = "policy", value_delimiter = ',', default_value = "all")]
    policies: Vec<String>,
    /// psmr-rt's steals: half or one.
    #[arg(long, default_value = "half")]
    steal: String,
    /// psmr-rt's victims: random or neighbourhood:K.
    #[arg(long, default_value = "random")]
    victims: String,
    /// What a full psmr-rt local queue does: overflow (half goes to the
    /// injector) or resize (default: resize for options, whose FIFO and
    /// LIFO orders it keeps; overflow for the others).
    #[arg(long)]
    full: Option<String>,
    /// psmr-rt's local queue capacity (default: 001's for the workload).
    #[arg(long)]
    capacity: Option<usize>,
    /// Spawner tasks of the packet workloads (default: 001's).
    #[arg(long)]
    spawners: Option<usize>,
    /// packet-bimodal: psmr-rt runs the heavy tasks on a pool of their own.
    #[arg(long)]
    staged: bool,
    /// mixer: conferences, each a mixer task and 4 call-leg tasks (comma-
    /// separated for several; `double` doubles from 1 until the best
    /// psmr-rt policy breaches the 10 ms deadline for more than 1 % of its
    /// mixes, at most 4096).
    #[arg(long, value_delimiter = ',', default_value = "8")]
    conferences: Vec<String>,
    /// mixer: psmr-rt runs this many pools, the workers split among them,
    /// each conference in one (001's siloed "10S").
    #[arg(long, default_value_t = 1)]
    silos: usize,
    /// Runs of each runtime; the one of median throughput is reported.
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// Seed of the packets, the choices and the pools (printed).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print the runs as JSON instead of tables.
    #[arg(long)]
    json: bool,
    /// Also write results.json, report.md and one SVG per workload (and
    /// per mixer load) into this directory.
    #[arg(long)]
    out: Option<PathBuf>,
}

/// Where each run goes: the terminal's table, the plot, the report and
/// the JSON.
struct Report<'a> {
    args: &'a RtBenchArgs,
    json: Vec<serde_json::Value>,
    markdown: String,
}

impl<'a> Report<'a> {
    fn new(args: &'a RtBenchArgs) -> Self {
        let markdown = format!(
            "# psmr rt-bench\n\npsmr-rt's pools next to tokio's multi-thread runtime, {} workers, seed {}, `--repeat {}` (the run of median throughput).\n",
            args.workers, args.seed, args.repeat
        );
        Report { args, json: Vec::new(), markdown }
    }

    /// Records one configuration's runs; `name` names its plot.
    fn record(&mut self, name: &str, config: &RtBenchConfig, runs: &[rt_bench::RtRun]) -> Result<()> {
        let table = rt_bench::format_table(config, runs);
        if !self.args.json {
            println!("{table}");
        }
        if let Some(dir) = &self.args.out {
            std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
            let file = dir.join(format!("{name}.svg"));
            std::fs::write(&file, rt_bench::svg(config, runs))
                .with_context(|| format!("cannot write {}", file.display()))?;
            self.markdown.push_str(&format!("\n## {name}\n\n```\n{table}```\n\n![{name}]({name}.svg)\n"));
        }
        let mut value = serde_json::json!({ "workload": config.workload, "workers": config.workers, "tasks": config.tasks, "full": config.full().to_string(), "runs": runs });
        if config.workload == Workload::Mixer {
            value["conferences"] = config.conferences.into();
        }
        self.json.push(value);
        Ok(())
    }

    /// Prints the JSON if asked, and writes results.json and report.md.
    fn finish(self) -> Result<()> {
        let json = serde_json::to_string_pretty(&self.json)?;
        if self.args.json {
            println!("{json}");
        }
        if let Some(dir) = &self.args.out {
            for (name, text) in [("results.json", json + "\n"), ("report.md", self.markdown)] {
                let file = dir.join(name);
                std::fs::write(&file, text).with_context(|| format!("cannot write {}", file.display()))?;
                eprintln!("wrote {}", file.display());
            }
        }
        Ok(())
    }
}

/// The mixer at each conference count asked for, or doubling until the
/// best psmr-rt policy breaches for more than 1 % of its mixes.
fn mixer_sweep(
    report: &mut Report,
    policies: &[Policy],
    (steal, victims, full): (Steal, Victims, Option<Full>),
) -> Result<()> {
    let args = report.args;
    let doubling = args.conferences.iter().any(|c| c == "double");
    let mut counts: Vec<usize> = if doubling {
        vec![1]
    } else {
        args.conferences
            .iter()
            .map(|c| c.parse().with_context(|| format!("bad --conferences {c:?}")))
            .collect::<Result<_>>()?
    };
    let mut i = 0;
    while i < counts.len() {
        let config = RtBenchConfig {
            workers: args.workers,
            tasks: args.tasks.unwrap_or(Workload::Mixer.default_tasks()),
            policies: policies.to_vec(),
            steal,
            victims,
            full,
            capacity: args.capacity,
            conferences: counts[i],
            silos: args.silos,
            repeat: args.repeat,
            seed: args.seed,
            ..RtBenchConfig::new(Workload::Mixer)
        };
        let runs = rt_bench::run(&config).with_context(|| format!("rt-bench mixer with {} conferences", counts[i]))?;
        report.record(&format!("mixer-{}", counts[i]), &config, &runs)?;
        let best = runs.iter().filter(|r| r.runtime != "tokio").filter_map(|r| r.breaches).fold(f64::MAX, f64::min);
        if doubling && best <= 0.01 && counts[i] < 4096 {
            counts.push(counts[i] * 2);
        }
        i += 1;
    }
    Ok(())
}

fn policies(names: &[String]) -> Result<Vec<Policy>> {
    if names.iter().any(|n| n == "all") {
        return Ok(Policy::ALL.to_vec());
    }
    names.iter().map(|n| n.parse::<Policy>().map_err(Into::into)).collect()
}

pub fn rt_bench(args: RtBenchArgs) -> Result<()> {
    let workloads: Vec<Workload> = if args.workloads.iter().any(|w| w == "all") {
        Workload::ALL.to_vec()
    } else {
        args.workloads.iter().map(|w| w.parse()).collect::<Result<_, _>>()?
    };
    let policies = policies(&args.policies)?;
    let full: Option<Full> = args.full.as_deref().map(str::parse).transpose()?;
    let (steal, victims): (Steal, Victims) = (args.steal.parse()?, args.victims.parse()?);
    eprintln!("rt-bench: seed {} (pass --seed to replay), {} workers", args.seed, args.workers);
    let mut report = Report::new(&args);
    for workload in workloads {
        if workload == Workload::Mixer {
            mixer_sweep(&mut report, &policies, (steal, victims, full))?;
            continue;
        }
        let config = RtBenchConfig {
            workers: args.workers,
            tasks: args.tasks.unwrap_or(workload.default_tasks()),
            spawners: args.spawners,
            capacity: args.capacity,
            policies: policies.clone(),
            steal,
            victims,
            full,
            staged: args.staged,
            repeat: args.repeat,
            seed: args.seed,
            ..RtBenchConfig::new(workload)
        };
        let runs = rt_bench::run(&config).with_context(|| format!("rt-bench {workload}"))?;
        report.record(&workload.to_string(), &config, &runs)?;
    }
    report.finish()
}
