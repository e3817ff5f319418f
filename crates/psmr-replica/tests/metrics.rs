//! The Prometheus endpoint of a running cluster: three replicas with
//! `/metrics`, writes through `psmr_client`, scrapes over plain TCP, and
//! the same text through the client protocol.

use psmr_client::{Client, ClientConfig};
use psmr_replica::metrics::{Scrape, CONTENT_TYPE};
use psmr_replica::{LocalCluster, Storage};
use psmr_services::kv::{KvCodec, KvOp};
use psmr_services::{KvApp, ServiceConfig};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// Writes sent to the leader.
const WRITES: u64 = 20;

fn cluster() -> LocalCluster {
    let _ = tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).try_init();
    LocalCluster::builder()
        .metrics(true)
        .scheduler("early", 2)
        .start(|_| KvApp::new(&ServiceConfig::default()).expect("the default kv service"))
        .expect("the cluster starts")
}

/// `GET /metrics` over a plain socket: the status line, the headers and
/// the body.
fn scrape_http(addr: SocketAddr) -> (String, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: psmr\r\n\r\n").unwrap();
    let mut response = String::new();
    s.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").expect("a head and a body");
    (head.to_string(), body.to_string())
}

fn scrape(addr: SocketAddr) -> Scrape {
    let (head, body) = scrape_http(addr);
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    assert!(head.contains(&format!("Content-Type: {CONTENT_TYPE}")), "{head}");
    assert!(body.ends_with("# EOF\n"), "{body}");
    Scrape::parse(&body)
}

fn value(s: &Scrape, name: &str) -> f64 {
    s.value(name).unwrap_or_else(|| panic!("{name} missing"))
}

/// Scrapes every replica until `ready` holds for all of them (followers
/// learn the commit index from the next heartbeat), or fails after a
/// generous deadline.
fn scrape_until(addrs: &[SocketAddr], ready: impl Fn(&Scrape) -> bool) -> Vec<Scrape> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let all: Vec<Scrape> = addrs.iter().map(|&a| scrape(a)).collect();
        if all.iter().all(&ready) {
            return all;
        }
        assert!(Instant::now() < deadline, "metrics never got there");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A client of `addrs` that waits long for each answer: a retry would
/// send a request twice and spoil the counts.
fn client(addrs: Vec<SocketAddr>) -> Client {
    let mut config = ClientConfig::new(addrs);
    config.attempt_timeout = Duration::from_secs(30);
    config.deadline = Duration::from_secs(60);
    Client::new(config).unwrap()
}

fn put(addrs: Vec<SocketAddr>, key: u64) {
    let mut client = client(addrs);
    let op = KvOp::Put { key: format!("k{key}").into_bytes(), value: b"v".to_vec() };
    let replies = client.call(&KvCodec, &[op]).unwrap();
    assert!(replies[0].is_ok(), "{replies:?}");
}

#[test]
fn every_replica_serves_its_metrics() {
    let cluster = cluster();
    let leader = cluster.wait_for_leader(Duration::from_secs(30)).unwrap();
    let clients = cluster.client_addrs();
    let metrics = cluster.metrics_addrs();
    assert_eq!(metrics.len(), 3);
    let at = |id: u64| (id - 1) as usize;
    let follower = (1..=3).find(|&id| id != leader).unwrap();

    // One client, connected to the leader only: one request per write.
    let mut client = client(vec![clients[at(leader)]]);
    for key in 0..WRITES {
        let replies =
            client.call(&KvCodec, &[KvOp::Put { key: format!("k{key}").into_bytes(), value: b"v".to_vec() }]).unwrap();
        assert!(replies[0].is_ok(), "{replies:?}");
    }
    // One more through a follower: it redirects (a request answered
    // there), and the client sends it again to the leader.
    put(vec![clients[at(follower)]], 1_000);
    let to_leader = WRITES + 1;

    // Every write and the election's empty entry.
    let applied = |s: &Scrape| {
        value(s, "psmr_raft_commit_index") > to_leader as f64 && value(s, "psmr_raft_applied_index") > to_leader as f64
    };
    let all = scrape_until(&metrics, applied);
    let term = value(&all[0], "psmr_raft_term");
    for (i, s) in all.iter().enumerate() {
        let id = i as u64 + 1;
        assert_eq!(value(s, "psmr_replica_id"), id as f64);
        assert_eq!(value(s, "psmr_raft_term"), term, "replica {id} is in another term");
        assert_eq!(value(s, "psmr_raft_leader"), leader as f64, "replica {id}");
        assert!(value(s, "psmr_raft_commit_index") > 0.0, "replica {id}");
        let requests = value(s, "psmr_request_latency_seconds_count");
        let redirected = s.get("psmr_client_refused_total", &[("reason", "not_leader")]).unwrap();
        if id == leader {
            assert_eq!(value(s, "psmr_raft_is_leader"), 1.0);
            assert_eq!(requests, to_leader as f64, "one latency per request sent to the leader");
            assert_eq!(redirected, 0.0);
            // A lone client's entries hold one command each (and the
            // election's empty entry is raft's, not a proposal).
            assert_eq!(value(s, "psmr_entries_proposed_total"), to_leader as f64);
            assert_eq!(value(s, "psmr_commands_proposed_total"), to_leader as f64);
            assert_eq!(value(s, "psmr_entry_commands_count"), to_leader as f64);
            assert!(value(s, "psmr_entry_bytes_sum") > 0.0);
            let p99 = s.quantile("psmr_request_latency_seconds", 0.99).expect("latencies");
            assert!(p99 > 0.0);
        } else {
            assert_eq!(value(s, "psmr_raft_is_leader"), 0.0);
            assert_eq!(value(s, "psmr_entries_proposed_total"), 0.0);
            let sent = if id == follower { 1.0 } else { 0.0 };
            assert_eq!(requests, sent, "replica {id}: only the redirected request");
            assert_eq!(redirected, sent, "replica {id}");
        }
        assert!(s.value("psmr_reply_cache_clients").unwrap() >= 1.0, "replica {id}");
        assert!(s.get("psmr_worker_executed_total", &[("worker", "0")]).is_some(), "replica {id}");
        assert_eq!(s.sum("psmr_peer_refused_total"), 0.0, "replica {id}");
    }

    // The client protocol serves the same numbers (`psmr client status`
    // reads them so).
    let text = client.metrics_of(clients[at(leader)], Duration::from_secs(30)).unwrap();
    let s = Scrape::parse(&text);
    assert_eq!(value(&s, "psmr_raft_term"), term);
    assert_eq!(value(&s, "psmr_request_latency_seconds_count"), to_leader as f64, "a metrics request is no request");
    assert!(text.ends_with("# EOF\n"));
}

#[test]
fn syncs_and_snapshots_are_timed() {
    let cluster = LocalCluster::builder()
        .metrics(true)
        .configure(|c| {
            c.storage = Storage::Disk;
            c.snapshot_every = 5;
        })
        .start(|_| KvApp::new(&ServiceConfig::default()).expect("the default kv service"))
        .expect("the cluster starts");
    let leader = cluster.wait_for_leader(Duration::from_secs(30)).unwrap();
    let mut client = client(vec![cluster.client_addrs()[(leader - 1) as usize]]);
    // Every replica takes a snapshot every 5 entries, or a few entries
    // later when the last one is still being written (a slow disk): the
    // writes go on until each has taken two, which 12 entries would do on
    // an idle machine.
    let metrics = cluster.metrics_addrs();
    let two = |s: &Scrape| value(s, "psmr_snapshot_seconds_count") >= 2.0;
    for key in 0..=u8::MAX {
        let replies = client.call(&KvCodec, &[KvOp::Put { key: vec![key], value: b"v".to_vec() }]).unwrap();
        assert!(replies[0].is_ok(), "{replies:?}");
        if key >= 12 && metrics.iter().all(|&a| two(&scrape(a))) {
            break;
        }
    }
    let all = scrape_until(&metrics, two);
    for s in &all {
        assert!(value(s, "psmr_log_sync_seconds_count") > 0.0);
        assert!(value(s, "psmr_log_sync_seconds_sum") > 0.0);
        assert!(value(s, "psmr_snapshot_last_bytes") > 0.0);
    }
}

#[test]
fn the_endpoint_refuses_what_is_not_a_scrape() {
    let cluster = cluster();
    let addr = cluster.metrics_addrs()[0];
    let ask = |request: &[u8]| {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        s.write_all(request).unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    };
    assert!(ask(b"GET /other HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404 "));
    assert!(ask(b"DELETE /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405 "));
    assert!(ask(b"\x16\x03\x01 tls hello\r\n\r\n").starts_with("HTTP/1.1 400 "));
    // Still serving.
    assert!(value(&scrape(addr), "psmr_replica_id") == 1.0);
}

/// The metric families of the reference table in `src/metrics.rs`'s module
/// documentation, named as `# TYPE` lines name them (a counter without
/// `_total`).
fn documented() -> std::collections::BTreeSet<String> {
    let source = include_str!("../src/metrics.rs");
    let mut names = std::collections::BTreeSet::new();
    for row in source.lines().filter_map(|l| l.strip_prefix("//! | `psmr_")) {
        let cells: Vec<&str> = row.split(" | ").collect();
        let counter = cells.get(1).is_some_and(|t| t.trim() == "counter");
        for name in format!("`psmr_{}", cells[0]).split(", ") {
            let name = name.trim_matches('`');
            let name = name.split('{').next().unwrap();
            let name = if counter { name.strip_suffix("_total").unwrap_or(name) } else { name };
            names.insert(name.to_string());
        }
    }
    names
}

#[test]
fn the_reference_lists_every_metric_the_endpoint_serves_and_no_other() {
    let cluster = cluster();
    let leader = cluster.wait_for_leader(Duration::from_secs(30)).unwrap();
    put(cluster.client_addrs(), 1);
    let (_, body) = scrape_http(cluster.metrics_addrs()[(leader - 1) as usize]);
    let served: std::collections::BTreeSet<String> = body
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .map(String::from)
        .collect();
    let documented = documented();
    assert!(documented.len() > 30, "the table did not parse: {documented:?}");
    let undocumented: Vec<&String> = served.difference(&documented).collect();
    let absent: Vec<&String> = documented.difference(&served).collect();
    assert!(undocumented.is_empty(), "served but not in the reference of src/metrics.rs: {undocumented:?}");
    assert!(absent.is_empty(), "in the reference but not served: {absent:?}");
}

/// The psmr metrics a PromQL expression names, each checked to be a
/// family a replica serves (or a sample of one: a counter's `_total`, a
/// histogram's `_bucket`, `_sum` and `_count`); how many.
fn check_expr(expr: &str, documented: &std::collections::BTreeSet<String>, place: &str) -> usize {
    let names = expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).filter(|w| w.starts_with("psmr_"));
    let mut n = 0;
    for name in names {
        let family = ["_total", "_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s).filter(|f| documented.contains(*f)))
            .unwrap_or(name);
        assert!(documented.contains(family), "{name} in {place} is not a metric psmr serves");
        n += 1;
    }
    n
}

#[test]
fn the_dashboard_asks_only_for_metrics_a_replica_serves() {
    let dashboard: serde_json::Value =
        serde_json::from_str(include_str!("../../../deploy/grafana-dashboard.json")).expect("the dashboard is JSON");
    let documented = documented();
    let mut asked = 0;
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().expect("targets") {
            let expr = target["expr"].as_str().expect("an expression");
            asked += check_expr(expr, &documented, &format!("panel {:?}", panel["title"]));
        }
    }
    assert!(asked >= 12, "the dashboard asks for {asked} metrics");
}

#[test]
fn the_alerts_name_only_metrics_a_replica_serves() {
    let rules = include_str!("../../../deploy/prometheus-alerts.yml");
    let documented = documented();
    let (mut alerts, mut asked) = (0, 0);
    for line in rules.lines().map(str::trim) {
        if let Some(expr) = line.strip_prefix("expr:") {
            asked += check_expr(expr, &documented, &format!("alert {alerts}"));
        }
        alerts += usize::from(line.starts_with("- alert:"));
    }
    assert!(alerts >= 8 && asked >= alerts, "{alerts} alerts naming {asked} metrics");
}
