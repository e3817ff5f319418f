//! `psmr mapping`: the class-to-threads optimizer (003 Alg. 3) and the naive
//! mapping of 003 §6.5 on the command line.

use anyhow::{bail, Context, Result};
use clap::Args;
use psmr_model::ClassModel;
use psmr_sched::optimizer::{self, Limits, Problem, Solution, Weighting};
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
    /// Seconds the optimizer may search (a number > 0, e.g. 0.5). If it
    /// cannot prove a mapping optimal in time, it prints the best mapping
    /// found with its proven gap to the optimum.
    #[arg(long, value_name = "SECS", default_value_t = optimizer::DEFAULT_TIME_LIMIT.as_secs_f64(),
          allow_hyphen_values = true, value_parser = parse_time_limit)]
    time_limit: f64,
    /// Print JSON: {"classes":[{"name","mode","threads"}],"objective":X,...},
    /// which `psmr sched-bench --mapping FILE` reads back.
    #[arg(long)]
    json: bool,
}

fn parse_weighting(s: &str) -> Result<Weighting, String> {
    s.parse().map_err(|e: optimizer::OptimizerError| e.to_string())
}

/// Seconds as a number > 0; checked here so that `-1`, `NaN` and `abc`
/// get one clear message each.
fn parse_time_limit(s: &str) -> Result<f64, String> {
    let seconds: f64 = s.trim().parse().map_err(|_| format!("{s:?} is not a number of seconds (e.g. 2.5)"))?;
    Limits::seconds(seconds).map(|_| seconds).map_err(|e| e.to_string())
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
    let (mapping, solution) = if args.naive {
        (optimizer::naive(&problem), None)
    } else {
        let solution = optimizer::optimize_with(&problem, Limits::seconds(args.time_limit)?)?;
        (solution.mapping.clone(), Some(solution))
    };
    // Both constructions promise R.1-R.5; a broken promise must not be
    // printed as a usable mapping.
    mapping.validate(model).context("the mapping breaks R.1-R.5 (a bug)")?;
    let objective = optimizer::evaluate(&problem, &mapping);
    let kind = if args.naive {
        "naive"
    } else if solution.as_ref().is_some_and(|s| s.optimal) {
        "optimal"
    } else {
        "best found"
    };
    if args.json {
        print_json(&problem, &mapping, &objective, kind, solution.as_ref());
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
    if let Some(s) = &solution {
        println!("{}", search_summary(s, args.time_limit));
    }
    println!("spec: {}", mapping.to_spec(model));
    Ok(())
}

fn print_json(
    problem: &Problem,
    mapping: &psmr_model::Mapping,
    objective: &optimizer::Objective,
    kind: &str,
    solution: Option<&Solution>,
) {
    let model = problem.model();
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
    if let Some(s) = solution {
        out["optimal"] = json!(s.optimal);
        out["gap"] = json!(s.gap());
        out["lower_bound"] = json!(s.lower_bound);
        let st = &s.stats;
        out["search"] = json!({
            "cases": st.cases,
            "orbits": st.orbits,
            "pruned": st.pruned,
            "solves": st.solves,
            "patterns_max": st.patterns_max,
            "restricted": st.restricted,
            "elapsed_s": st.elapsed.as_secs_f64(),
            "timed_out": st.timed_out,
            "too_large": st.too_large,
            "unresolved": st.unresolved,
            "proven_optimal": s.optimal,
        });
    }
    println!("{out}");
}

/// One line on how the search went: proven optimal, or the gap left when
/// the time limit stopped it.
fn search_summary(s: &Solution, time_limit: f64) -> String {
    let st = &s.stats;
    let work = format!(
        "{} sequential/concurrent cases ({} up to symmetry, {} pruned by bounds), {} integer programs (at most {} \
         patterns{}) in {:.3} s",
        st.cases,
        st.orbits,
        st.pruned,
        st.solves,
        st.patterns_max,
        if st.restricted { ", restricted" } else { "" },
        st.elapsed.as_secs_f64()
    );
    if s.optimal {
        return format!("proven optimal: {work}");
    }
    let why = if st.timed_out {
        format!("the time limit of {time_limit} s ran out")
    } else {
        format!("{} case(s) need more than {} thread patterns", st.unresolved, optimizer::PATTERNS_MAX)
    };
    format!("NOT proven optimal: {why}; gap {:.6} (lower bound {:.6}); {work}", s.gap(), s.lower_bound)
}
