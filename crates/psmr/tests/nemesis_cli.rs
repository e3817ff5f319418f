//! `psmr bench --scenario nemesis` as CI runs it: a minute of faults of
//! seven kinds, two at a time, against a cluster of real replica processes
//! under load; the run must inject every kind, lose no acknowledged write,
//! stay linearizable, keep expiry on the log's time while clocks jump and
//! end with the replicas agreeing, and its report must say so.

use psmr::harness::launch::ClusterDir;
use std::path::Path;
use std::process::Command;

#[test]
fn a_minute_of_faults_injects_every_kind_and_the_run_passes_its_judgement() {
    let out = ClusterDir::scratch("psmr-nemesis-test-").unwrap();
    let run = Command::new(env!("CARGO_BIN_EXE_psmr"))
        .args(["bench", "--scenario", "nemesis", "--set", "duration_s=60"])
        .args(["--nemesis", "partition,one-way,reset,pause,kill,disk-full,clock", "--seed", "37"])
        .arg("--out")
        .arg(out.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "the nemesis run failed:\n{stderr}");
    let report = std::fs::read_to_string(out.path().join("report.md")).unwrap();
    for kind in ["partition", "one-way", "reset", "pause", "kill", "disk-full", "clock"] {
        assert!(report.contains(&format!("| heal {kind} of ")), "no {kind} healed:\n{report}");
    }
    let judgement = report.split("## Judgement").nth(1).expect("a judgement");
    let row = judgement.lines().find(|l| l.starts_with("| base |")).expect("the point's row");
    let cells: Vec<&str> = row.split('|').map(str::trim).collect();
    // point, operations, keys read, lost, linearizable, agreed after
    assert!(cells[2].parse::<u64>().unwrap() > 1000, "{row}");
    assert_eq!((cells[4], cells[5]), ("0", "yes"), "{row}");
    assert!(cells[6].parse::<u64>().is_ok(), "the replicas agreed: {row}");
    let expiry = judgement.lines().find(|l| l.contains("expiry under moving clocks")).expect("the expiry probe's line");
    assert!(expiry.ends_with("; 0 violations"), "{expiry}");
    let expired: u64 = expiry.split(", ").find_map(|p| p.strip_suffix(" seen expired")?.parse().ok()).unwrap();
    assert!(expired > 5, "keys expired under the probe's eyes: {expiry}");
    assert!(Path::new(&out.path().join("faults-0.svg")).exists());
}

#[test]
fn a_planted_stale_read_in_a_nemesis_history_is_caught() {
    // A nemesis run's history, with one read made stale: the checker that
    // judged the run must reject it.
    let out = ClusterDir::scratch("psmr-nemesis-test-").unwrap();
    let history = out.path().join("history.jsonl");
    let run = Command::new(env!("CARGO_BIN_EXE_psmr"))
        .args(["bench", "--scenario", "nemesis", "--set", "duration_s=8", "--nemesis", "partition,pause"])
        .arg("--history")
        .arg(&history)
        .arg("--out")
        .arg(out.path())
        .output()
        .unwrap();
    // The run may miss a kind in 8 s; its history is what counts here.
    let text = std::fs::read_to_string(&history).unwrap_or_else(|e| {
        panic!("no history ({e}):\n{}", String::from_utf8_lossy(&run.stderr));
    });
    let check = |file: &Path| {
        let out = Command::new(env!("CARGO_BIN_EXE_psmr")).arg("check-history").arg(file).output().unwrap();
        (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let (ok, said) = check(&history);
    assert!(ok, "the run's own history is linearizable: {said}");
    let planted = stale(&text).expect("a read after a write of another value");
    let bad = out.path().join("planted.jsonl");
    std::fs::write(&bad, planted).unwrap();
    let (ok, said) = check(&bad);
    assert!(!ok, "a stale read must be rejected: {said}");
}

/// `history` with one read that completed after an acknowledged write of
/// its key completed, and returned that write's value, changed to
/// return the value before it: a stale read.
fn stale(history: &str) -> Option<String> {
    let mut ops: Vec<serde_json::Value> = history.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let ok = |o: &serde_json::Value| o["status"] == "ok";
    let target = ops.iter().enumerate().find_map(|(i, r)| {
        if !(ok(r) && r["op"] == "read" && r["result"].is_string()) {
            return None;
        }
        // The write it read, acknowledged before the read began, and an
        // earlier acknowledged write of the key with another value.
        let key = &r["key"];
        let wrote = |o: &serde_json::Value, v: &serde_json::Value| {
            ok(o) && o["op"] == "write" && &o["key"] == key && &o["value"] == v
        };
        let read = ops.iter().find(|w| wrote(w, &r["result"]))?;
        let ends = |o: &serde_json::Value| o["complete_ns"].as_u64().unwrap_or(u64::MAX);
        let starts = |o: &serde_json::Value| o["invoke_ns"].as_u64().unwrap_or(0);
        if ends(read) >= starts(r) {
            return None;
        }
        let older = ops.iter().find(|w| {
            ok(w) && w["op"] == "write" && &w["key"] == key && w["value"] != r["result"] && ends(w) < starts(read)
        })?;
        Some((i, older["value"].clone()))
    })?;
    ops[target.0]["result"] = target.1;
    Some(ops.iter().map(|o| o.to_string() + "\n").collect())
}
