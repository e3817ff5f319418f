//! `psmr bench --scenario peers`: a clear error without etcd and Redis
//! (always checked, with an empty PATH), and, where scripts/peers.sh has
//! installed them, a very short real run with every system side by side.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn test_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("psmr-peers-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn bench(args: &[&str], path: Option<&Path>) -> (Output, u32) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_psmr"));
    command.arg("bench").args(args);
    if let Some(p) = path {
        command.env("PATH", p);
    }
    let child = command.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().unwrap();
    let pid = child.id();
    (child.wait_with_output().unwrap(), pid)
}

/// The programs the scenario runs that are not on `path` (this process's
/// PATH if `None`), in the order the error names them.
fn missing(path: Option<&Path>) -> Vec<&'static str> {
    let path = path.map_or_else(|| std::env::var_os("PATH").unwrap_or_default(), |p| p.as_os_str().to_owned());
    ["etcd", "redis-server", "redis-benchmark"]
        .into_iter()
        .filter(|name| !std::env::split_paths(&path).any(|dir| dir.join(name).is_file()))
        .collect()
}

/// Whether every program the scenario runs is on PATH.
fn peers_installed() -> bool {
    missing(None).is_empty()
}

fn assert_not_installed_error(o: &Output, path: Option<&Path>) {
    let err = text(&o.stderr);
    assert!(!o.status.success(), "must fail without the peers:\n{err}");
    // A machine may have some of them (redis-tools without the server).
    assert!(err.contains(&format!("not installed: {}", missing(path).join(", "))), "{err}");
    assert!(err.contains("run scripts/peers.sh"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn without_etcd_and_redis_the_error_says_to_run_peers_sh() {
    let dir = test_dir("missing");
    let empty = dir.join("empty-path");
    std::fs::create_dir_all(&empty).unwrap();
    let out = dir.join("out");
    let (o, _) = bench(&["--scenario", "peers", "--quick", "--out", out.to_str().unwrap()], Some(&empty));
    assert_not_installed_error(&o, Some(&empty));
    assert!(!out.join("results.json").exists(), "nothing ran");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn flags_that_do_not_fit_the_peers_are_refused() {
    for (args, needle) in [
        (&["--scenario", "peers", "--sweep", "storage=disk"][..], "sweeps only clients"),
        (&["--scenario", "peers", "--cluster", "127.0.0.1:1"][..], "do not apply"),
        (&["--scenario", "peers", "--kill-replica", "1"][..], "do not apply"),
    ] {
        let (o, _) = bench(args, None);
        let err = text(&o.stderr);
        assert!(!o.status.success() && err.contains(needle), "{args:?}: {err}");
    }
}

fn read_json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))).unwrap()
}

/// Checks one row of the results: a positive rate, ordered latencies, and
/// `servers` CPU figures, one of them the leader's (or the single
/// server's).
fn check_row(row: &Value, servers: usize) {
    assert!(row["puts_per_s"].as_f64().unwrap() > 0.0, "{row}");
    let (p50, p99, max) =
        (row["p50_us"].as_u64().unwrap(), row["p99_us"].as_u64().unwrap(), row["max_us"].as_u64().unwrap());
    assert!(p50 <= p99 && p99 <= max, "{row}");
    let cpu = row["cpu"].as_array().unwrap();
    assert_eq!(cpu.len(), servers, "{row}");
    assert_eq!(cpu.iter().filter(|c| c["role"] != "follower").count(), 1, "{row}");
    assert!(cpu.iter().all(|c| c["us_per_command"].as_f64().unwrap() > 0.0), "{row}");
}

#[test]
fn a_short_run_puts_every_system_side_by_side() {
    let dir = test_dir("run");
    let out = dir.join("out");
    let args =
        ["--scenario", "peers", "--sweep", "clients=2", "--set", "warmup_s=0.2", "--set", "duration_s=0.5", "--out"];
    let (o, pid) = bench(&[&args[..], &[out.to_str().unwrap()]].concat(), None);
    if !peers_installed() {
        eprintln!("etcd or Redis is not installed (scripts/peers.sh installs them): only the error is checked");
        assert_not_installed_error(&o, None);
        std::fs::remove_dir_all(&dir).ok();
        return;
    }
    assert!(o.status.success(), "{}", text(&o.stderr));
    let results = read_json(&out.join("results.json"));
    let rows = results["rows"].as_array().unwrap();
    let systems: Vec<(String, String, u64)> = rows
        .iter()
        .map(|r| {
            (
                r["system"].as_str().unwrap().into(),
                r["setup"].as_str().unwrap().into(),
                r["per_request"].as_u64().unwrap(),
            )
        })
        .collect();
    let want = [
        ("etcd", "fsync", 1),
        ("psmr", "disk", 1),
        ("etcd", "no fsync", 1),
        ("psmr", "memory", 1),
        ("redis", "pipeline 50", 50),
        ("psmr", "memory", 50),
    ];
    assert_eq!(systems, want.map(|(a, b, c)| (a.to_string(), b.to_string(), c)).to_vec());
    for row in rows {
        check_row(row, if row["system"] == "redis" { 1 } else { 3 });
    }
    let comparisons = results["comparisons"].as_array().unwrap();
    assert_eq!(comparisons.len(), 3);
    assert!(comparisons.iter().all(|c| c["puts_ratio"].as_f64().unwrap() > 0.0));
    assert!(results["setup"]["etcd_version"].as_str().unwrap().starts_with("3."));
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    for needle in [
        "## Side by side",
        "| etcd fsync | 2 x 1 |",
        "| redis pipeline 50 | 8 x 50 |",
        "--unsafe-no-fsync",
        "-P 50 -c 8 -t set",
    ] {
        assert!(report.contains(needle), "{needle}:\n{report}");
    }
    // The etcd and redis data directories are gone with their servers.
    let leftovers: Vec<_> = std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&format!("psmr-peers-{pid}-")))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    std::fs::remove_dir_all(&dir).ok();
}
