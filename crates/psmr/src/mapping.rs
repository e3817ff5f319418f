//! `psmr mapping`: the class-to-threads optimizer (003 Alg. 3) and the naive
//! mapping of 003 §6.5 on the command line.

use anyhow::{bail, Context, Result};
use clap::Args;
use psmr_model::ClassModel;
use psmr_sched::optimizer::{self, Problem, Weighting};
use psmr_services::{kv, list, SHARDS_MAX};
use serde_json::json;

#[derive(Args, Debug)]
pub struct MappingArgs {
    /// Class model: readers-writers, sharded-snapshot, sharded-global (the
    /// list's models), sharded (the kv store's), or a JSON file
    /// `{"name":..,"classes":["A",..],"conflicts":[["A","B"],..]}`.
    #[arg(long, default_value = "sharded-global")]
    model: String,
    /// Shards of the built-in sharded models (ignored for files and
    /// readers-writers).
    #[arg(long, default_value_t = 2)]
    shards: usize,
    /// Worker threads to map the classes to.
    #[arg(long, default_value_t = 4)]
    threads: usize,
    /// Class weights `CLASS=W,...` (every class, each W >= 0, not all 0),
    /// e.g. the share of the workload each class has. Default: all equal.
    #[arg(long)]
    weights: Option<String>,
    /// How O.1 weighs a class's threads: as-written (Alg. 3: by weight
    /// within the sequential, or the concurrent, classes) or total (by
    /// weight among all classes).
    #[arg(long, default_value = "as-written", value_parser = parse_weighting)]
    weighting: Weighting,
    /// Print the naive mapping of 003 §6.5 instead of the optimal one.
    #[arg(long)]
    naive: bool,
    /// Print JSON: {"classes":[{"name","mode","threads"}],"objective":X,...},
    /// which `psmr sched-bench --mapping FILE` reads back.
    #[arg(long)]
    json: bool,
}

fn parse_weighting(s: &str) -> Result<Weighting, String> {
    s.parse().map_err(|e: optimizer::OptimizerError| e.to_string())
}

/// The class model named `name`: a built-in model or a JSON file.
pub fn class_model(name: &str, shards: usize) -> Result<ClassModel> {
    if !(1..=SHARDS_MAX).contains(&shards) {
        bail!("--shards must be between 1 and {SHARDS_MAX}, got {shards}");
    }
    if let Ok(model) = name.parse::<list::ListModel>() {
        return Ok(list::class_model(model, shards));
    }
    if let Ok(model) = name.parse::<kv::KvModel>() {
        return Ok(kv::class_model(model, shards));
    }
    let path = std::path::Path::new(name);
    if !path.exists() {
        bail!(
            "unknown class model {name:?}: neither readers-writers, sharded-snapshot, sharded-global, sharded \
             nor an existing JSON file"
        );
    }
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read class model file {name}"))?;
    ClassModel::from_json(&text).with_context(|| format!("class model file {name}"))
}

pub fn mapping(args: MappingArgs) -> Result<()> {
    let model = class_model(&args.model, args.shards)?;
    let mut problem = Problem::new(model, args.threads)?.with_weighting(args.weighting);
    if let Some(text) = &args.weights {
        problem = problem.with_weights_text(text)?;
    }
    let model = problem.model();
    let (mapping, stats) = if args.naive {
        (optimizer::naive(&problem), None)
    } else {
        let solution = optimizer::optimize(&problem)?;
        (solution.mapping, Some(solution.stats))
    };
    // Both constructions promise R.1-R.5; a broken promise must not be
    // printed as a usable mapping.
    mapping.validate(model).context("the mapping breaks R.1-R.5 (a bug)")?;
    let objective = optimizer::evaluate(&problem, &mapping);
    let kind = if args.naive { "naive" } else { "optimal" };
    if args.json {
        let classes: Vec<_> = model
            .class_ids()
            .map(|c| {
                let m = mapping.class(c);
                json!({
                    "name": model.class_name(c),
                    "mode": m.mode,
                    "threads": m.threads,
                })
            })
            .collect();
        let weights: serde_json::Map<String, serde_json::Value> =
            model.class_ids().map(|c| (model.class_name(c).to_string(), json!(problem.weights()[c.index()]))).collect();
        let mut out = json!({
            "classes": classes,
            "objective": objective.total(),
            "terms": {"o1a": objective.o1a, "o1b": objective.o1b, "o2": objective.o2, "o3": objective.o3},
            "model": model.name(),
            "threads": problem.threads(),
            "weights": weights,
            "weighting": problem.weighting().name(),
            "mapping": kind,
        });
        if let Some(s) = &stats {
            out["search"] = json!({
                "cases": s.cases,
                "solves": s.solves,
                "patterns_max": s.patterns_max,
                "restricted": s.restricted,
                "elapsed_s": s.elapsed.as_secs_f64(),
                "proven_optimal": true,
            });
        }
        println!("{out}");
        return Ok(());
    }
    println!(
        "{kind} mapping of {} ({} classes) on {} threads, weighting {}",
        model.name(),
        model.len(),
        problem.threads(),
        problem.weighting()
    );
    let weights: Vec<String> =
        model.class_ids().map(|c| format!("{}={}", model.class_name(c), problem.weights()[c.index()])).collect();
    println!("weights: {}", weights.join(","));
    print!("{}", mapping.table(model));
    println!("objective {objective}");
    if let Some(s) = &stats {
        println!(
            "proven optimal: {} sequential/concurrent cases, {} integer programs (at most {} patterns{}) in {:.3} s",
            s.cases,
            s.solves,
            s.patterns_max,
            if s.restricted { ", restricted" } else { "" },
            s.elapsed.as_secs_f64()
        );
    }
    println!("spec: {}", mapping.to_spec(model));
    Ok(())
}
