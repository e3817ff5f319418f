//! `psmr mapping` and `psmr sched-bench --mapping optimal|naive|FILE` end to
//! end: the JSON is what the issue promises and what sched-bench reads back,
//! the optimum is never worse than the naive mapping, and bad input is one
//! clear error line.

use serde_json::Value;
use std::path::PathBuf;
use std::process::{Command, Output};

fn psmr(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_psmr")).args(args).output().expect("psmr runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    assert!(o.status.success(), "psmr failed:\n{}", stderr(o));
    String::from_utf8(o.stdout.clone()).expect("utf-8")
}

fn json(args: &[&str]) -> Value {
    serde_json::from_str(stdout(&psmr(args)).trim()).expect("one JSON object")
}

fn fails_with(args: &[&str], needle: &str) {
    let o = psmr(args);
    let err = stderr(&o);
    assert!(!o.status.success(), "{args:?} should fail");
    assert!(err.contains(needle), "{args:?}: stderr should mention {needle:?}, got:\n{err}");
    assert!(!err.contains("panicked"), "{args:?} panicked:\n{err}");
    // Errors of psmr itself are one line; clap adds a usage hint to its own.
    if err.starts_with("psmr: error:") {
        assert_eq!(err.lines().count(), 1, "{args:?}: one error line, got:\n{err}");
    }
}

fn temp_file(name: &str, text: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("psmr-mapping-test-{}-{name}", std::process::id()));
    std::fs::write(&path, text).expect("temp file");
    path
}

/// 003 §6.5 Workload 1: 85% reads, 15% writes, 95% local, even shards.
const WORKLOAD1: &str = "R1=0.40375,R2=0.40375,W1=0.07125,W2=0.07125,Rg=0.0425,Wg=0.0075";

#[test]
fn json_has_every_class_and_the_terms_add_up() {
    for weighting in ["as-written", "total"] {
        let v = json(&[
            "mapping",
            "--shards",
            "2",
            "--threads",
            "4",
            "--weights",
            WORKLOAD1,
            "--weighting",
            weighting,
            "--json",
        ]);
        let classes = v["classes"].as_array().expect("classes");
        let names: Vec<&str> = classes.iter().map(|c| c["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["R1", "R2", "W1", "W2", "Rg", "Wg"]);
        for c in classes {
            assert!(["sequential", "concurrent"].contains(&c["mode"].as_str().unwrap()), "{c}");
            let threads = c["threads"].as_array().unwrap();
            assert!(!threads.is_empty() && threads.iter().all(|t| t.as_u64().unwrap() < 4), "{c}");
        }
        // Wg conflicts with everything, itself included: sequential; with
        // total weighting every thread serves some concurrent read class,
        // so Wg is on all of them (003 Fig. 4).
        assert_eq!(classes[5]["mode"], "sequential");
        if weighting == "total" {
            assert_eq!(classes[5]["threads"].as_array().unwrap().len(), 4, "{v}");
        }
        let t = &v["terms"];
        let sum: f64 = ["o1a", "o1b", "o2", "o3"].iter().map(|k| t[k].as_f64().unwrap()).sum();
        assert!((sum - v["objective"].as_f64().unwrap()).abs() < 1e-9, "{v}");
        assert_eq!(v["search"]["proven_optimal"], true);
        assert_eq!(v["weighting"], weighting);
    }
}

#[test]
fn the_optimum_is_never_worse_than_the_naive_mapping() {
    for weights in [WORKLOAD1, "R1=0.54,R2=0.27,W1=0.095,W2=0.048,Rg=0.0425,Wg=0.0075"] {
        let base = ["mapping", "--shards", "2", "--threads", "4", "--weights", weights, "--json"];
        let optimal = json(&base);
        let naive = json(&[&base[..], &["--naive"]].concat());
        let (o, n) = (optimal["objective"].as_f64().unwrap(), naive["objective"].as_f64().unwrap());
        assert!(o <= n + 1e-9, "optimal {o} worse than naive {n}");
        // The naive mapping shares threads between independent writers.
        assert!(naive["terms"]["o3"].as_f64().unwrap() > 0.0, "{naive}");
        assert_eq!(naive["mapping"], "naive");
        assert!(naive.get("search").is_none());
    }
}

#[test]
fn the_table_shows_modes_threads_and_terms() {
    let out = stdout(&psmr(&["mapping", "--model", "readers-writers", "--threads", "3"]));
    assert!(out.contains("class  mode        t0  t1  t2"), "{out}");
    assert!(out.contains("R      concurrent   x   x   x"), "{out}");
    assert!(out.contains("W      sequential   x   x   x"), "{out}");
    for term in ["objective", "O.1a", "O.1b", "O.2", "O.3", "proven optimal", "spec: R=conc:0-2;W=seq:0-2"] {
        assert!(out.contains(term), "missing {term:?}:\n{out}");
    }
}

#[test]
fn sched_bench_runs_the_mapping_it_is_given() {
    let v =
        json(&["mapping", "--shards", "2", "--threads", "4", "--weights", WORKLOAD1, "--weighting", "total", "--json"]);
    let file = temp_file("w1.json", &v.to_string());
    let out = stdout(&psmr(&[
        "sched-bench",
        "--service",
        "list",
        "--model",
        "sharded-global",
        "--shards",
        "2",
        "--workload",
        "14.25-5-15",
        "--skew",
        "0.67",
        "--commands",
        "20000",
        "--scheduler",
        "early,early-ws-optimistic",
        "--workers",
        "4",
        "--mapping",
        "naive,optimal:total",
        "--mapping",
        file.to_str().unwrap(),
        "--json",
    ]));
    std::fs::remove_file(&file).ok();
    let runs: Vec<Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let labels: Vec<&str> = runs.iter().map(|r| r["mapping"].as_str().unwrap()).collect();
    let f = file.to_str().unwrap();
    assert_eq!(labels, ["naive", "optimal:total", f, "naive", "optimal:total", f]);
    assert!(runs.iter().all(|r| r["digest"] == runs[0]["digest"] && r["reply_digest"] == runs[0]["reply_digest"]));
    // The file's mapping is the one that ran.
    let spec = |label: &str| runs.iter().find(|r| r["mapping"] == label).unwrap()["mapping_spec"].as_str().unwrap();
    let from_file: Vec<String> = v["classes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let threads: Vec<u64> = c["threads"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap()).collect();
            let mode = if c["mode"] == "sequential" { "seq" } else { "conc" };
            format!("{}={mode}:{threads:?}", c["name"].as_str().unwrap())
        })
        .collect();
    let ran: Vec<String> = spec(f)
        .split(';')
        .map(|part| {
            let (head, threads) = part.rsplit_once(':').unwrap();
            let mut ids = Vec::new();
            for run in threads.split(',') {
                let (a, b) = run.split_once('-').unwrap_or((run, run));
                ids.extend(a.parse::<u64>().unwrap()..=b.parse::<u64>().unwrap());
            }
            format!("{head}:{ids:?}")
        })
        .collect();
    assert_eq!(ran, from_file);
    // Naive and optimal differ on this workload (the naive one shares a
    // thread between W1 and W2).
    assert_ne!(spec("naive"), spec("optimal:total"));
}

#[test]
fn write_skew_changes_the_workload() {
    let digest = |extra: &[&str]| {
        let base = [
            "sched-bench",
            "--service",
            "list",
            "--model",
            "sharded-global",
            "--shards",
            "2",
            "--workload",
            "14.25-5-15",
            "--commands",
            "5000",
            "--scheduler",
            "sequential",
            "--json",
            "--skew",
            "0.33",
        ];
        let out = stdout(&psmr(&[&base[..], extra].concat()));
        let v: Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
        (v["reply_digest"].as_str().unwrap().to_string(), v.get("write_skew").cloned())
    };
    let (plain, none) = digest(&[]);
    let (same, _) = digest(&["--write-skew", "0.33"]);
    let (skewed, w) = digest(&["--write-skew", "0.67"]);
    assert_eq!(none, None);
    assert_eq!(w, Some(serde_json::json!(0.67)));
    assert_eq!(plain, same, "--write-skew equal to --skew changes nothing");
    assert_ne!(plain, skewed);
}

#[test]
fn bad_input_is_a_clear_error() {
    fails_with(&["mapping", "--threads", "0"], "at least one thread");
    fails_with(&["mapping", "--threads", "65"], "65");
    fails_with(&["mapping", "--shards", "0"], "--shards must be between 1 and 1024, got 0");
    fails_with(&["mapping", "--model", "nope"], "unknown class model \"nope\"");
    fails_with(&["mapping", "--weights", "R1=1,R2=1,W1=1,W2=1,Rg=1,Wx=1"], "Wx");
    fails_with(&["mapping", "--weights", "R1=1,R2=1,W1=1,W2=1,Rg=1,Wg=-1"], "-1");
    fails_with(&["mapping", "--weights", "R1=1,R2=1,W1=1,W2=1,Rg=1,Wg=heavy"], "Wg=heavy");
    fails_with(&["mapping", "--weights", "R1=1,R2=1"], "W1,W2,Rg,Wg");
    fails_with(&["mapping", "--weights", "R1=1,R1=2,R2=1,W1=1,W2=1,Rg=1,Wg=1"], "R1");
    fails_with(&["mapping", "--weights", "R1=0,R2=0,W1=0,W2=0,Rg=0,Wg=0"], "zero");
    fails_with(&["mapping", "--weighting", "fair"], "fair");
    for (bad, why) in [
        ("-1", "must be a finite number of seconds > 0, got -1"),
        ("0", "must be a finite number of seconds > 0, got 0"),
        ("NaN", "must be a finite number of seconds > 0, got NaN"),
        ("inf", "must be a finite number of seconds > 0, got inf"),
        ("abc", "\"abc\" is not a number of seconds"),
        ("", "is not a number of seconds"),
    ] {
        fails_with(&["mapping", "--time-limit", bad], why);
    }
    let bad_model = temp_file("bad-model.json", r#"{"classes":["A","B"],"conflicts":[["A","C"]]}"#);
    fails_with(&["mapping", "--model", bad_model.to_str().unwrap()], "conflict names unknown class \"C\"");
    let garbage = temp_file("garbage.json", "classes: A, B");
    fails_with(&["mapping", "--model", garbage.to_str().unwrap()], "bad class model JSON");
    std::fs::remove_file(bad_model).ok();
    std::fs::remove_file(garbage).ok();
    fails_with(&["sched-bench", "--write-skew", "1.5"], "skew must be in 0..=1");
    fails_with(
        &["sched-bench", "--scheduler", "early", "--mapping", "optimal:fair"],
        "unknown mapping \"optimal:fair\"",
    );
}

#[test]
fn a_model_file_is_optimized_like_a_built_in_one() {
    // Readers-writers written out by hand.
    let file = temp_file("rw.json", r#"{"name":"mine","classes":["R","W"],"conflicts":[["R","W"],["W","W"]]}"#);
    let from_file = json(&["mapping", "--model", file.to_str().unwrap(), "--threads", "3", "--json"]);
    std::fs::remove_file(&file).ok();
    let built_in = json(&["mapping", "--model", "readers-writers", "--threads", "3", "--json"]);
    assert_eq!(from_file["classes"], built_in["classes"]);
    assert_eq!(from_file["objective"], built_in["objective"]);
    assert_eq!(from_file["model"], "mine");
}

#[test]
fn the_time_limit_bounds_the_search_and_reports_the_gap() {
    let base = ["mapping", "--model", "sharded-global", "--shards", "8", "--threads", "4"];
    // Generous: proven optimal, gap 0.
    let v = json(&[&base[..], &["--time-limit", "30", "--json"]].concat());
    assert_eq!(v["optimal"], true, "{v}");
    assert_eq!(v["gap"], 0.0, "{v}");
    assert_eq!(v["lower_bound"], v["objective"], "{v}");
    assert_eq!(v["mapping"], "optimal");
    // A limit that passes before the first integer program: the best
    // mapping found (the naive one), valid, with its proven gap.
    let tiny = ["--time-limit", "1e-9"];
    let v = json(&[&base[..], &tiny, &["--json"]].concat());
    assert_eq!(v["optimal"], false, "{v}");
    assert_eq!(v["search"]["proven_optimal"], false, "{v}");
    assert_eq!(v["mapping"], "best found");
    let (objective, bound, gap) =
        (v["objective"].as_f64().unwrap(), v["lower_bound"].as_f64().unwrap(), v["gap"].as_f64().unwrap());
    assert!(gap > 0.0 && (objective - bound - gap).abs() < 1e-9, "{v}");
    let out = stdout(&psmr(&[&base[..], &tiny].concat()));
    assert!(out.contains("NOT proven optimal: the time limit of 0.000000001 s ran out; gap"), "{out}");
    assert!(out.contains("best found mapping of sharded-global"), "{out}");
}
