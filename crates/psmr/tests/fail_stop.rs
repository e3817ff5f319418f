//! A replica process whose thread panics ends (fail-stop) with the reason
//! on its stderr, and `psmr cluster` says which replica stopped and why.
//! Faults are injected with `FAILPOINTS` (the `failpoints` feature, on in
//! `scripts/test.sh`).
#![cfg(feature = "failpoints")]

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn a_panicking_replica_stops_and_the_cluster_reports_it() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_psmr"))
        .args(["cluster", "--replicas", "1", "--storage", "memory"])
        // The leader's first (empty) entry reaches the service manager,
        // which panics.
        .env("FAILPOINTS", "manager-apply=panic(injected)")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("psmr cluster still runs: its replica did not stop after a panic");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert!(!status.success(), "{err}");
    assert!(err.contains("panicked") && err.contains("injected"), "the replica's own message: {err}");
    assert!(
        err.contains("replica 1 exited: a thread panicked and the replica stopped itself (fail-stop)"),
        "psmr cluster's report: {err}"
    );
}
