//! `psmr bench` end to end: the scenario list, bad input, and a real run
//! against a local cluster whose report files hold what they promise and
//! whose history is linearizable.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn psmr(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_psmr")).args(args).output().expect("psmr runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn fails_with(args: &[&str], needle: &str) {
    let o = psmr(args);
    let err = text(&o.stderr);
    assert!(!o.status.success(), "{args:?} should fail");
    assert!(err.contains(needle), "{args:?}: stderr should mention {needle:?}, got:\n{err}");
    assert!(!err.contains("panicked"), "{args:?} panicked:\n{err}");
}

fn test_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("psmr-bench-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn list_names_every_scenario_once() {
    let o = psmr(&["bench", "--list"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let names: Vec<String> =
        text(&o.stdout).lines().map(|l| l.split_whitespace().next().unwrap_or("").to_string()).collect();
    for want in ["schedulers", "latency-throughput", "workers", "write-ratio", "clientio", "client-batching", "storage"]
    {
        assert_eq!(names.iter().filter(|n| *n == want).count(), 1, "{want} in {names:?}");
    }
    assert_eq!(names[0], "schedulers", "the default scenario comes first");
}

#[test]
fn bad_input_is_a_clear_error() {
    fails_with(&["bench", "--scenario", "fig99"], "unknown scenario \"fig99\"");
    fails_with(&["bench", "--sweep", "workers"], "malformed sweep \"workers\"");
    fails_with(&["bench", "--sweep", "workers=1,,2"], "malformed sweep");
    fails_with(&["bench", "--sweep", "cores=1,2"], "unknown parameter \"cores\"");
    fails_with(&["bench", "--sweep", "workers=two"], "bad value \"two\" for workers");
    fails_with(&["bench", "--sweep", "clients=1", "--sweep", "clients=2"], "clients is swept twice");
    fails_with(&["bench", "--set", "clients"], "malformed --set");
    fails_with(&["bench", "--nemesis", "partition,flood"], "unknown nemesis \"flood\"");
    fails_with(&["bench", "--nemesis", "kill", "--set", "storage=memory"], "memory storage cannot");
    fails_with(&["bench", "--set", "clients=0"], "--clients must be between 1 and 4096");
    fails_with(&["bench", "--sweep", "scheduler=early,fastest"], "unknown scheduler \"fastest\"");
    fails_with(&["bench", "--cluster", "127.0.0.1:1"], "no replica of --cluster answered");
    fails_with(&["bench", "--cluster", "127.0.0.1:1", "--sweep", "workers=1,2"], "workers cannot be swept");
    fails_with(&["bench", "--cluster", "not an address"], "bad replica address");
    fails_with(&["bench", "--scenario", "bitmap-false-positives", "--sweep", "clients=1"], "is a simulation");
    fails_with(&["bench", "--set", "batch_max_commands=10"], "per_request 50 is above batch_max_commands 10");
    fails_with(&["bench", "--repeat", "0"], "0 is not in 1..=100");
    fails_with(&["bench", "--repeat", "2", "--history", "/tmp/h.jsonl"], "run with --repeat 1");
    fails_with(&["bench", "--scenario", "peers", "--repeat", "2"], "scenario peers runs each case once");
}

#[test]
fn a_repeated_run_reports_each_point_by_its_median_run_and_sets_auto_against_the_fixed_ones() {
    let dir = test_dir("repeat");
    let out = dir.join("out");
    let o = psmr(&[
        "bench",
        "--scenario",
        "client-batching",
        "--sweep",
        "per_request=5",
        "--sweep",
        "scheduler=sequential,auto",
        "--set",
        "clients=2",
        "--set",
        "warmup_s=0.2",
        "--set",
        "duration_s=1",
        "--repeat",
        "2",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let stderr = text(&o.stderr);
    for round in ["run 1/2", "run 2/2"] {
        for point in ["per_request=5 scheduler=sequential", "per_request=5 scheduler=auto"] {
            assert_eq!(stderr.matches(&format!("] {round}: {point}:")).count(), 1, "{stderr}");
        }
    }
    let points = read_json(&out.join("results.json"))["points"].as_array().unwrap().clone();
    assert_eq!(points.len(), 2, "one result per point, not per run");
    for p in &points {
        let runs: Vec<f64> = p["runs"].as_array().unwrap().iter().map(|r| r.as_f64().unwrap()).collect();
        assert_eq!(runs.len(), 2, "{p}");
        let median = p["commands_per_s"].as_f64().unwrap();
        assert_eq!(median, runs.iter().copied().fold(f64::INFINITY, f64::min), "the lower of two runs: {p}");
    }
    for run in ["run-1", "run-2"] {
        assert!(out.join("logs").join(run).join("point-1").is_dir(), "{run}'s replica logs");
    }
    let stdout = text(&o.stdout);
    assert!(stdout.contains("x the best fixed scheduler (per_request=5 scheduler=sequential"), "{stdout}");
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(
        report.contains("## `auto` against the fixed schedulers") && report.contains("Each point ran 2 times"),
        "{report}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

fn read_json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))).unwrap()
}

#[test]
fn a_run_writes_its_report_and_a_linearizable_history() {
    let dir = test_dir("run");
    let out = dir.join("out");
    let history = dir.join("h.jsonl");
    let o = psmr(&[
        "bench",
        "--scenario",
        "client-batching",
        "--sweep",
        "per_request=1,5",
        "--set",
        "clients=3",
        "--set",
        "warmup_s=0.2",
        "--set",
        "duration_s=1",
        "--set",
        "keys=20",
        "--set",
        "write_pct=50",
        "--out",
        out.to_str().unwrap(),
        "--history",
        history.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let results = read_json(&out.join("results.json"));
    assert_eq!(results["scenario"], "client-batching");
    let points = results["points"].as_array().unwrap();
    assert_eq!(points.len(), 2);
    for (p, per) in points.iter().zip(["1", "5"]) {
        assert_eq!(p["label"]["per_request"], per);
        assert_eq!(p["params"]["clients"], "3");
        assert!(p["commands_per_s"].as_f64().unwrap() > 0.0, "{p}");
        let request = &p["latency_us"]["request"];
        assert!(request["count"].as_u64().unwrap() > 0, "{p}");
        let q = |k: &str| request[k].as_u64().unwrap();
        assert!(q("p50") <= q("p90") && q("p90") <= q("p99") && q("p99") <= q("p999") && q("p999") <= q("max"));
        let reads = p["latency_us"]["read"]["count"].as_u64().unwrap();
        let writes = p["latency_us"]["write"]["count"].as_u64().unwrap();
        let per: u64 = per.parse().unwrap();
        assert_eq!(reads + writes, request["count"].as_u64().unwrap() * per, "one sample per command");
        let timeline: u64 = p["timeline"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).sum();
        let commands = (p["commands_per_s"].as_f64().unwrap() * 1.0).round() as u64;
        assert_eq!(timeline, commands, "the timeline adds up to the commands measured");
        assert!(!p["stages"].as_array().unwrap().is_empty(), "stage busy times of the replicas");
        // Every replica's CPU per command, from its own process, one of
        // them the leader.
        let cpu = p["cpu"].as_array().unwrap();
        assert_eq!(cpu.len(), 3, "{p}");
        assert_eq!(cpu.iter().filter(|c| c["role"] == "leader").count(), 1, "{cpu:?}");
        for c in cpu {
            assert!(c["pid"].as_u64().unwrap() > 0 && c["us_per_command"].as_f64().unwrap() > 0.0, "{c}");
        }
    }
    let csv = std::fs::read_to_string(out.join("results.csv")).unwrap();
    assert_eq!(csv.lines().count(), 3);
    assert!(csv.lines().next().unwrap().contains("cpu_us_per_cmd_leader,cpu_us_per_cmd_followers_mean"));
    let stdout = text(&o.stdout);
    assert!(stdout.contains("cpu µs/cmd leader"), "{stdout}");
    for svg in ["throughput.svg", "latency.svg"] {
        let s = std::fs::read_to_string(out.join(svg)).unwrap();
        assert!(s.starts_with("<svg") && s.matches("<circle").count() == 2, "{svg}:\n{s}");
    }
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(report.contains("| per_request=1 |") && report.contains("| per_request=5 |"), "{report}");
    assert!(report.contains("cpu µs/cmd leader | cpu µs/cmd followers (mean / max) |"), "{report}");
    for i in 0..2 {
        let h = dir.join(format!("h.{i}.jsonl"));
        let check = psmr(&["check-history", h.to_str().unwrap()]);
        assert!(check.status.success(), "{}{}", text(&check.stdout), text(&check.stderr));
        assert!(text(&check.stdout).starts_with("linearizable"), "{}", text(&check.stdout));
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bad_fault_flags_are_clear_errors() {
    fails_with(&["bench", "--at", "1s"], "--kill-replica");
    fails_with(&["bench", "--kill-leader-every", "fast"], "bad duration \"fast\"");
    fails_with(&["bench", "--kill-leader-every", "0s"], "must be above 0");
    fails_with(&["bench", "--kill-replica", "9"], "--kill-replica 9: point");
    fails_with(&["bench", "--kill-replica", "1", "--set", "storage=memory"], "memory storage cannot");
    fails_with(&["bench", "--kill-replica", "1", "--cluster", "127.0.0.1:1"], "drop --cluster");
}

#[test]
fn killing_the_leader_under_load_loses_nothing() {
    let dir = test_dir("faults");
    let out = dir.join("out");
    let history = dir.join("h.jsonl");
    let o = psmr(&[
        "bench",
        "--scenario",
        "client-batching",
        "--sweep",
        "per_request=3",
        "--set",
        "clients=4",
        "--set",
        "keys=20",
        "--set",
        "write_pct=50",
        "--set",
        "warmup_s=0.2",
        "--set",
        "duration_s=3",
        "--kill-leader-every",
        "1s",
        "--restart-after",
        "500ms",
        "--out",
        out.to_str().unwrap(),
        "--history",
        history.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let results = read_json(&out.join("results.json"));
    let point = &results["points"][0];
    assert_eq!(point["params"]["storage"], "disk", "faults run on disk storage");
    let events = point["events"].as_array().unwrap();
    let kills = events.iter().filter(|e| e["action"] == "kill leader" && e["error"].is_null()).count();
    let restarts = events.iter().filter(|e| e["action"] == "restart" && e["error"].is_null()).count();
    assert!(kills >= 2 && restarts >= 2, "{events:?}");
    assert!(point["commands_per_s"].as_f64().unwrap() > 0.0, "the cluster served through the faults");
    // The leader of the window's start was killed in it: no CPU figure
    // for it, and no panic.
    let cpu = point["cpu"].as_array().unwrap();
    let leader = cpu.iter().find(|c| c["role"] == "leader").expect("a leader at the start");
    assert!(leader["us_per_command"].is_null() && leader["error"].is_string(), "{cpu:?}");
    assert!(out.join("logs/point-0/replica-1.log").exists());
    // Every acknowledged operation, across three leaders, fits one order.
    let check = psmr(&["check-history", history.to_str().unwrap()]);
    assert!(check.status.success(), "{}{}", text(&check.stdout), text(&check.stderr));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn the_list_runs_end_to_end_with_an_optimal_mapping() {
    let dir = test_dir("list");
    let out = dir.join("out");
    let o = psmr(&[
        "bench",
        "--scenario",
        "list-skewed",
        "--sweep",
        "skew=0.33/0.67",
        "--sweep",
        "mapping=optimal",
        "--set",
        "clients=4",
        "--set",
        "cost=light",
        "--set",
        "warmup_s=0.2",
        "--set",
        "duration_s=1",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let results = read_json(&out.join("results.json"));
    let p = &results["points"][0];
    assert_eq!(p["params"]["service"], "list");
    assert_eq!((p["params"]["skew"].as_str(), p["params"]["write_skew"].as_str()), (Some("0.33"), Some("0.67")));
    for kind in ["local-read", "local-write", "global-read", "global-write"] {
        assert!(p["latency_us"][kind]["count"].as_u64().unwrap() > 0, "{kind}: {p}");
    }
    assert_eq!(p["failed_requests"], 0);
    // Every replica reports its 4 early workers (000 §5.3 metrics), for
    // the window and for its one second.
    let workers = p["workers"].as_array().unwrap();
    assert_eq!(workers.len(), 12, "{workers:?}");
    assert_eq!(p["worker_timeline"].as_array().unwrap().len(), 1);
    assert_eq!(p["worker_timeline"][0].as_array().unwrap().len(), 12);
    assert!(out.join("workers-0.svg").exists());
    assert!(workers.iter().map(|w| w["executed"].as_u64().unwrap()).sum::<u64>() > 0);
    for w in workers {
        let idle = w["sync_idle"].as_f64().unwrap() + w["queue_idle"].as_f64().unwrap();
        assert!((0.0..=1.05).contains(&idle), "{w}");
    }
    // The optimizer's mapping for 4 workers covers every class of the model.
    let spec = p["mapping_spec"].as_str().expect("the mapping that ran");
    for class in ["R1=", "R2=", "W1=", "W2=", "Rg=", "Wg="] {
        assert!(spec.contains(class), "{spec}");
    }
    std::fs::remove_dir_all(&dir).ok();
    fails_with(
        &["bench", "--scenario", "list-rw", "--history", "/tmp/h.jsonl"],
        "histories are of key-value operations",
    );
    fails_with(&["bench", "--set", "service=list", "--set", "model=sharded"], "sharded");
    fails_with(&["bench", "--set", "mapping=R=conc:0"], "scheduler.mapping");
}
