//! `psmr cluster --metrics` and `psmr client status` as separate
//! processes: every replica gets a Prometheus endpoint, and status prints
//! the same numbers.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A running `psmr cluster`, stopped with SIGTERM when dropped.
struct Cluster {
    child: Child,
    addrs: String,
    dir: std::path::PathBuf,
}

impl Cluster {
    fn start(dir: &std::path::Path) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_psmr"))
            .args(["cluster", "--replicas", "3", "--storage", "memory", "--metrics", "--data-dir"])
            .arg(dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("psmr cluster starts");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut addrs = Vec::new();
        while addrs.len() < 3 {
            // replica N listening on HOST:PORT pid PID
            let line = lines.next().expect("a line per replica").unwrap();
            addrs.push(line.split_whitespace().nth(4).expect("an address").to_string());
        }
        Self { child, addrs: addrs.join(","), dir: dir.to_path_buf() }
    }

    fn client(&self, args: &[&str]) -> Output {
        let mut all = vec!["client", "--cluster", &self.addrs];
        all.extend_from_slice(args);
        Command::new(env!("CARGO_BIN_EXE_psmr")).args(&all).output().expect("psmr runs")
    }

    /// The metrics addresses the cluster's configuration gives.
    fn metrics_addrs(&self) -> Vec<String> {
        let config = std::fs::read_to_string(self.dir.join("cluster.toml")).unwrap();
        let table: toml::Table = config.parse().unwrap();
        let replicas = table["replicas"].as_array().unwrap();
        replicas.iter().map(|r| r["metrics"].as_str().expect("a metrics address").to_string()).collect()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new("kill").arg("-TERM").arg(self.child.id().to_string()).status();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn scrape(addr: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

#[test]
fn status_prints_the_numbers_every_endpoint_serves() {
    let dir = std::env::temp_dir().join(format!("psmr-metrics-cli-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let cluster = Cluster::start(&dir);
    let o = cluster.client(&["put", "1", "one"]);
    assert!(o.status.success(), "{}", text(&o.stderr));

    let metrics = cluster.metrics_addrs();
    assert_eq!(metrics.len(), 3);
    for addr in &metrics {
        let got = scrape(addr);
        assert!(got.starts_with("HTTP/1.1 200 OK\r\n"), "{got}");
        assert!(got.contains("\npsmr_raft_term "), "{got}");
    }

    // Followers learn the commit index from the next heartbeat: wait
    // until every replica has applied the put.
    let deadline = Instant::now() + Duration::from_secs(30);
    let st = loop {
        let o = cluster.client(&["status", "--json"]);
        assert!(o.status.success(), "{}", text(&o.stderr));
        let st: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let reps = st["replicas"].as_array().unwrap().clone();
        if reps.iter().all(|r| r["metrics"]["applied"].as_u64().is_some_and(|a| a >= 2)) {
            break st;
        }
        assert!(Instant::now() < deadline, "replicas never applied the put: {st}");
        std::thread::sleep(Duration::from_millis(50));
    };
    let leader = st["leader"].as_u64().unwrap();
    let reps = st["replicas"].as_array().unwrap();
    let term = &reps[0]["metrics"]["term"];
    for r in reps {
        let m = &r["metrics"];
        assert_eq!(&m["term"], term, "{st}");
        assert_eq!(m["leader"].as_u64(), Some(leader), "{st}");
        assert!(m["commit"].as_u64().unwrap() >= 2, "{st}");
        // Every replica answered the redirects it counted as refusals
        // (the client tries them in turn until one leads); the leader also
        // answered the put.
        let is_leader = r["id"].as_u64() == Some(leader);
        let redirects = m["refused_client"].as_u64().unwrap();
        assert_eq!(m["requests"].as_u64(), Some(redirects + u64::from(is_leader)), "{st}");
        if is_leader {
            assert_eq!(m["entries_proposed"].as_u64(), Some(1), "{st}");
            assert!(m["request_latency_p99_s"].as_f64().is_some(), "{st}");
        }
    }

    let o = cluster.client(&["status"]);
    let table = text(&o.stdout);
    assert!(table.contains("p99 ms") && table.contains("commit"), "{table}");
}
