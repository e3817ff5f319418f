//! An application on Python's redis-py (`tests/redis_app.py`: a cache with
//! TTLs, counters, a profile in a hash, a job queue, a leaderboard, tags,
//! pipelines, a watched transaction, a scan) runs against Debian's
//! `redis-server` 7.0 and against psmr's Redis port, and must see the same
//! at every step; then three copies of it, one per replica, increment one
//! counter in watched transactions and lose no increment.
//! `scripts/setup.sh` installs `python3-redis` for the system's
//! `/usr/bin/python3`.

use psmr::replica::LocalCluster;
use psmr::services::kv::KvRedis;
use psmr::services::{KvApp, ServiceConfig};
use std::net::SocketAddr;
use std::process::Command;

mod common;

const APP: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/redis_app.py");

/// The system's Python, which the system's `python3-redis` serves.
const PYTHON: &str = "/usr/bin/python3";

/// Runs the application in `mode` against `addr` with `more` arguments:
/// the lines it printed, one per step.
fn app(mode: &str, addr: SocketAddr, more: &[&str]) -> Vec<String> {
    let out = Command::new(PYTHON)
        .arg(APP)
        .args([mode, &addr.ip().to_string(), &addr.port().to_string()])
        .args(more)
        .output()
        .unwrap_or_else(|e| panic!("{PYTHON} does not run ({e}): scripts/setup.sh installs python3-redis"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "the application failed against {addr} after:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout.lines().map(str::to_string).collect()
}

fn cluster() -> LocalCluster {
    LocalCluster::builder()
        .start_with_redis(|_| KvApp::new(&ServiceConfig::default()).expect("the default kv"), |_| KvRedis)
        .expect("a local cluster")
}

#[test]
fn a_redis_py_application_sees_on_psmr_what_it_sees_on_redis() {
    let redis = common::RedisServer::start();
    let cluster = cluster();
    let theirs = app("steps", redis.addr, &[]);
    // Through a follower's port as well as the leader's: any replica.
    let ours = app("steps", cluster.redis_addrs()[1], &[]);
    assert!(theirs.len() > 40, "the application ran its steps: {theirs:?}");
    let differ: Vec<String> =
        theirs.iter().zip(&ours).filter(|(a, b)| a != b).map(|(a, b)| format!("redis: {a}\npsmr:  {b}")).collect();
    assert!(differ.is_empty() && theirs.len() == ours.len(), "steps that differ:\n{}", differ.join("\n"));
}

#[test]
fn redis_py_transactions_from_every_replica_lose_no_increment() {
    let cluster = cluster();
    let addrs = cluster.redis_addrs();
    std::thread::scope(|s| {
        for &addr in &addrs {
            s.spawn(move || app("counter", addr, &["25", "counter"]));
        }
    });
    let mut con = redis::Client::open(format!("redis://{}/", addrs[0])).unwrap().get_connection().unwrap();
    let n: i64 = redis::cmd("GET").arg("counter").query(&mut con).unwrap();
    assert_eq!(n, 25 * addrs.len() as i64);
}
