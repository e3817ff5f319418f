//! The load generator driven from code, against an in-process cluster of
//! the key-value store: it counts what it sent, no command fails, and the
//! history it writes is linearizable.

use psmr_client::ClientConfig;
use psmr_harness::history::{self, Status, Verdict};
use psmr_harness::load::{self, LoadSpec, Ops};
use psmr_replica::LocalCluster;
use psmr_services::KvApp;
use std::time::Duration;

#[test]
fn a_load_counts_the_commands_it_sent_and_none_fails() {
    let cluster = LocalCluster::builder().start(|_| KvApp::new(&Default::default()).unwrap()).unwrap();
    cluster.wait_for_leader(Duration::from_secs(10)).unwrap();
    let addrs = cluster.client_addrs();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("history.jsonl");
    let per_request = 5;
    let spec = LoadSpec {
        clients: 3,
        per_request,
        warmup: Duration::from_millis(200),
        duration: Duration::from_secs(1),
        ops: Ops::Kv { keys: 20, write_pct: 50, value_bytes: None, prefix: String::new() },
        phases: Vec::new(),
        history: Some(path.clone()),
        seed: 7,
    };
    let r = load::run(&addrs, || ClientConfig::new(addrs.clone()), &spec).unwrap();

    assert_eq!(r.errors, 0, "no request failed");
    assert!(r.commands > 0 && r.commands_per_s() > 0.0);
    assert_eq!(r.commands, r.requests * per_request as u64, "every request carries its commands");
    assert_eq!(r.timeline.iter().sum::<u64>(), r.commands, "the timeline adds up");
    assert_eq!(r.request_latency.len(), r.requests);
    let by_kind: u64 = r.latency.values().map(|h| h.len()).sum();
    assert_eq!(by_kind, r.commands, "one latency sample per command");
    assert!(r.latency.keys().all(|k| ["read", "write"].contains(k)), "{:?}", r.latency.keys());
    // Replicas in this process are no `psmr` processes: no CPU figure,
    // and the reason why.
    assert!(r.cpu.is_empty() && r.cpu_note.as_deref().is_some_and(|n| n.contains("not a psmr process")));

    let ops = history::read(std::io::BufReader::new(std::fs::File::open(&path).unwrap())).unwrap();
    assert!(ops.len() as u64 >= r.commands, "the history holds the warm-up too");
    assert!(ops.iter().all(|o| o.status == Status::Ok), "no command failed");
    assert_eq!(history::check_linearizable(&ops, history::MAX_STATES_DEFAULT), Verdict::Linearizable);
}

#[test]
fn a_bad_spec_fails_before_any_client_starts() {
    let spec = LoadSpec {
        clients: 0,
        per_request: 1,
        warmup: Duration::ZERO,
        duration: Duration::from_secs(1),
        ops: Ops::Kv { keys: 1, write_pct: 0, value_bytes: None, prefix: String::new() },
        phases: Vec::new(),
        history: None,
        seed: 1,
    };
    let addrs = vec!["127.0.0.1:1".parse().unwrap()];
    let e = load::run(&addrs, || ClientConfig::new(addrs.clone()), &spec).unwrap_err();
    assert!(matches!(e, load::LoadError::Clients(0)), "{e}");
}
