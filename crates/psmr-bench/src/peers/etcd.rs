//! etcd for the peers scenario: a local 3-member cluster (loopback, free
//! ports, a scratch data directory) and a closed-loop load against its v3
//! HTTP/JSON gateway, shaped like psmr's own load: N clients, each one put
//! at a time on its own keep-alive connection to the leader, a warm-up,
//! a measured window, HdrHistogram latencies.

use super::http::{HttpConn, Response};
use super::process::{free_ports, log_tail, wait_until, ChildGuard, Scratch};
use super::{PeerLoad, PeersError, Row, KEY_BYTES};
use hdrhistogram::Histogram;
use psmr_harness::cpu::{CpuSample, Reading, ReplicaCpu, Role};
use psmr_harness::kv_stream::{client_seed, sized_value, XorShift};
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// Members of the cluster.
pub const MEMBERS: usize = 3;
/// Largest value the driver writes, bytes.
pub const VALUE_BYTES_MAX: usize = 4096;
/// How long a fresh cluster may take to elect a leader.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long one request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest latency the histograms hold, µs (a minute).
const LATENCY_MAX_US: u64 = 60_000_000;

/// Standard base64 with padding (RFC 4648), which etcd's gateway expects
/// for `bytes` fields.
pub fn base64(data: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Key `k` as etcd stores it: 16 decimal digits.
pub fn key_of(k: u64) -> String {
    format!("{k:0width$}", width = KEY_BYTES)
}

/// The JSON body of a put.
pub fn put_body(key: &[u8], value: &[u8]) -> Vec<u8> {
    format!(r#"{{"key":"{}","value":"{}"}}"#, base64(key), base64(value)).into_bytes()
}

/// One client's puts: the same three draws per put as psmr's load (key,
/// the write coin, the value), so that one seed gives both the same keys
/// and values.
struct PutStream {
    rng: XorShift,
    keys: u64,
    value_bytes: usize,
}

impl PutStream {
    fn next_body(&mut self) -> Vec<u8> {
        let key = self.rng.next() % self.keys;
        let _write_coin = self.rng.next();
        let value = sized_value(self.rng.next(), self.value_bytes);
        put_body(key_of(key).as_bytes(), &value)
    }
}

/// Whether a put succeeded: status 200 and a response header with a
/// revision; otherwise etcd's message, or the start of what came back.
pub fn put_outcome(r: &Response) -> Result<(), String> {
    let json: Option<serde_json::Value> = serde_json::from_slice(&r.body).ok();
    if r.status == 200 {
        let revision = json.as_ref().and_then(|j| j.pointer("/header/revision"));
        return revision.map(|_| ()).ok_or_else(|| format!("200 without a revision: {}", excerpt(&r.body)));
    }
    let message = json
        .as_ref()
        .and_then(|j| j.get("message").or_else(|| j.get("error")))
        .and_then(|m| m.as_str())
        .map_or_else(|| excerpt(&r.body), str::to_string);
    Err(format!("status {}: {message}", r.status))
}

/// The first 200 bytes of a body, for messages.
fn excerpt(body: &[u8]) -> String {
    String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned()
}

/// A member's status: its id and the leader's (etcd writes uint64s as JSON
/// strings); `None` for the leader when there is none ("0").
pub fn parse_status(body: &[u8]) -> Result<(String, Option<String>), String> {
    let json: serde_json::Value = serde_json::from_slice(body).map_err(|e| format!("status is not JSON: {e}"))?;
    let field = |p: &str| json.pointer(p).and_then(|v| v.as_str()).map(str::to_string);
    let member = field("/header/member_id").ok_or_else(|| format!("status without member_id: {}", excerpt(body)))?;
    let leader = field("/leader").filter(|l| l != "0");
    Ok((member, leader))
}

/// One member's status, asked on a fresh connection.
fn status_of(addr: SocketAddr) -> Result<(String, Option<String>), String> {
    let mut conn = HttpConn::connect(addr, Duration::from_secs(2)).map_err(|e| e.to_string())?;
    let r = conn.post_json("/v3/maintenance/status", b"{}").map_err(|e| e.to_string())?;
    if r.status != 200 {
        return Err(format!("status {}: {}", r.status, excerpt(&r.body)));
    }
    parse_status(&r.body)
}

/// The flags of member `i` (0-based) of a cluster whose members listen on
/// `clients` and `peers`, with data under `data`.
pub fn member_args(i: usize, clients: &[SocketAddr], peers: &[SocketAddr], data: &Path, fsync: bool) -> Vec<String> {
    let url = |a: &SocketAddr| format!("http://{a}");
    let initial: Vec<String> = peers.iter().enumerate().map(|(j, p)| format!("m{}={}", j + 1, url(p))).collect();
    let mut args = vec![
        format!("--name=m{}", i + 1),
        format!("--data-dir={}", data.join(format!("m{}", i + 1)).display()),
        format!("--listen-client-urls={}", url(&clients[i])),
        format!("--advertise-client-urls={}", url(&clients[i])),
        format!("--listen-peer-urls={}", url(&peers[i])),
        format!("--initial-advertise-peer-urls={}", url(&peers[i])),
        format!("--initial-cluster={}", initial.join(",")),
        "--initial-cluster-token=psmr-peers".into(),
        "--initial-cluster-state=new".into(),
        "--logger=zap".into(),
        "--log-outputs=stderr".into(),
        "--log-level=warn".into(),
    ];
    if !fsync {
        args.push("--unsafe-no-fsync".into());
    }
    args
}

/// The flags every member runs with, for the report (ports and paths
/// elided).
pub fn flags_summary(fsync: bool) -> String {
    let mut s = String::from(
        "--listen-client-urls/--listen-peer-urls http://127.0.0.1:<free port> --initial-cluster m1..m3 \
         --initial-cluster-state=new --logger=zap --log-level=warn, other flags at their defaults \
         (--snapshot-count 100000, --heartbeat-interval 100 ms, --election-timeout 1000 ms)",
    );
    if !fsync {
        s.push_str(" --unsafe-no-fsync");
    }
    s
}

/// A running 3-member etcd cluster; dropping it kills the members and
/// removes their data.
pub struct EtcdCluster {
    members: Vec<ChildGuard>,
    /// Client addresses, by member.
    pub clients: Vec<SocketAddr>,
    /// The leader's index in `members`, once known.
    pub leader: usize,
    // Dropped after the members (fields drop in order), so that no etcd
    // writes into a removed directory.
    _data: Scratch,
}

impl EtcdCluster {
    /// Starts the members, their logs in `logs`, and waits for a leader.
    pub fn start(etcd: &Path, fsync: bool, logs: &Path) -> Result<Self, PeersError> {
        let data = Scratch::new("etcd")?;
        std::fs::create_dir_all(logs)
            .map_err(|source| PeersError::Io { what: format!("cannot create {}", logs.display()), source })?;
        let ports = free_ports(2 * MEMBERS)?;
        let (clients, peers) = ports.split_at(MEMBERS);
        let mut members = Vec::with_capacity(MEMBERS);
        for i in 0..MEMBERS {
            let mut command = Command::new(etcd);
            command.args(member_args(i, clients, peers, &data.path, fsync));
            // ETCD_* variables are flags too: only ours count.
            for (name, _) in std::env::vars_os().filter(|(n, _)| n.to_string_lossy().starts_with("ETCD_")) {
                command.env_remove(name);
            }
            let log = logs.join(format!("etcd-{}.log", i + 1));
            members.push(ChildGuard::spawn(command, &format!("etcd member {}", i + 1), &log)?);
        }
        let mut cluster = Self { members, clients: clients.to_vec(), leader: 0, _data: data };
        cluster.leader = cluster.wait_leader()?;
        Ok(cluster)
    }

    /// Waits until every member answers and names the same leader; returns
    /// the leader's index.
    fn wait_leader(&mut self) -> Result<usize, PeersError> {
        let mut leader = None;
        let clients = self.clients.clone();
        let members = &mut self.members;
        wait_until(
            "the etcd cluster",
            READY_TIMEOUT,
            || members.iter_mut().try_for_each(ChildGuard::check_running),
            || {
                leader = find_leader(&clients);
                leader.is_some()
            },
        )?;
        leader.ok_or_else(|| PeersError::Setting("no etcd leader".into()))
    }

    /// The pids of the members.
    pub fn pids(&self) -> Vec<u32> {
        self.members.iter().map(ChildGuard::pid).collect()
    }

    /// An error if a member has exited.
    pub fn check_running(&mut self) -> Result<(), PeersError> {
        self.members.iter_mut().try_for_each(ChildGuard::check_running)
    }

    /// The leader's index now, if the members agree on one.
    pub fn current_leader(&self) -> Option<usize> {
        find_leader(&self.clients)
    }

    /// The end of member `i`'s log.
    pub fn log_tail(&self, i: usize) -> String {
        self.members.get(i).map_or_else(String::new, |m| log_tail(&m.log))
    }
}

/// The index of the member every member names as leader, if they agree.
fn find_leader(clients: &[SocketAddr]) -> Option<usize> {
    let statuses: Vec<(String, Option<String>)> = clients.iter().map(|&a| status_of(a).ok()).collect::<Option<_>>()?;
    let leader = statuses[0].1.clone()?;
    if statuses.iter().any(|(_, l)| l.as_deref() != Some(leader.as_str())) {
        return None;
    }
    statuses.iter().position(|(id, _)| *id == leader)
}

/// What one client brings back.
struct Tally {
    puts: u64,
    errors: u64,
    latency: Histogram<u64>,
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_MAX_US, 3).expect("constant bounds are valid")
}

/// One closed-loop client: puts to `target` until `to`, recording those
/// that complete inside `[from, to]`.
fn client(target: SocketAddr, load: &PeerLoad, index: usize, from: Instant, to: Instant) -> Tally {
    let mut stream =
        PutStream { rng: XorShift::new(client_seed(load.seed, index)), keys: load.keys, value_bytes: load.value_bytes };
    let mut tally = Tally { puts: 0, errors: 0, latency: histogram() };
    let mut conn: Option<HttpConn> = None;
    loop {
        let start = Instant::now();
        if start >= to {
            return tally;
        }
        let body = stream.next_body();
        let outcome = put(&mut conn, target, &body);
        let done = Instant::now();
        if let Err(e) = outcome {
            // A failed connection is not reused; a new one is made for the
            // next put, and an immediate failure does not spin.
            tracing::debug!(client = index, "etcd put failed: {e}");
            conn = None;
            tally.errors += 1;
            std::thread::sleep(Duration::from_millis(10));
            continue;
        }
        if start >= from && done <= to {
            let us = done.duration_since(start).as_micros().clamp(1, u128::from(LATENCY_MAX_US)) as u64;
            tally.latency.saturating_record(us);
            tally.puts += 1;
        }
    }
}

/// One put on `conn` (connected first if need be).
fn put(conn: &mut Option<HttpConn>, target: SocketAddr, body: &[u8]) -> Result<(), String> {
    if conn.as_ref().map_or(true, HttpConn::is_closed) {
        *conn = Some(HttpConn::connect(target, REQUEST_TIMEOUT).map_err(|e| e.to_string())?);
    }
    let c = conn.as_mut().ok_or("no connection")?;
    let response = c.post_json("/v3/kv/put", body).map_err(|e| e.to_string())?;
    put_outcome(&response)
}

/// What a load measured, with the CPU readings of the window.
pub struct Measured {
    /// Length of the window, s.
    pub seconds: f64,
    /// Puts completed in the window.
    pub puts: u64,
    /// Failed puts, warm-up included.
    pub errors: u64,
    /// Latency of the window's puts, µs.
    pub latency: Histogram<u64>,
    /// CPU readings of `pids` at the window's start and end.
    pub cpu: (Vec<Reading>, Vec<Reading>),
}

/// Runs `load` against `target`, reading the CPU time of `pids` at the
/// start and end of the measured window.
pub fn drive(target: SocketAddr, load: &PeerLoad, pids: &[u32]) -> Measured {
    let start = Instant::now();
    let (from, to) = (start + load.warmup, start + load.warmup + load.duration);
    let sample = || pids.iter().map(|&p| CpuSample::read(p).map_err(|e| e.to_string())).collect::<Vec<_>>();
    std::thread::scope(|scope| {
        let handles: Vec<_> =
            (0..load.clients).map(|i| scope.spawn(move || client(target, load, i, from, to))).collect();
        std::thread::sleep(from.saturating_duration_since(Instant::now()));
        let before = sample();
        std::thread::sleep(to.saturating_duration_since(Instant::now()));
        let after = sample();
        let mut m = Measured {
            seconds: load.duration.as_secs_f64(),
            puts: 0,
            errors: 0,
            latency: histogram(),
            cpu: (before, after),
        };
        for h in handles {
            // A client cannot panic short of a bug; its tally is then lost,
            // not the run.
            if let Ok(t) = h.join() {
                m.puts += t.puts;
                m.errors += t.errors;
                let _ = m.latency.add(&t.latency);
            }
        }
        m
    })
}

/// Runs one etcd case: a fresh cluster, `load` against its leader, the
/// cluster stopped and its data removed.
pub fn run(etcd: &Path, version: &str, fsync: bool, load: &PeerLoad, logs: &Path) -> Result<Row, PeersError> {
    let mut cluster = EtcdCluster::start(etcd, fsync, logs)?;
    let target = cluster.clients[cluster.leader];
    let pids = cluster.pids();
    let m = drive(target, load, &pids);
    cluster.check_running()?;
    let cpu: Vec<ReplicaCpu> = (0..MEMBERS)
        .map(|i| {
            let role = if i == cluster.leader { Role::Leader } else { Role::Follower };
            let addr = cluster.clients[i].to_string();
            ReplicaCpu::measured(i as u64 + 1, addr, pids[i], role, &m.cpu.0[i], &m.cpu.1[i], m.puts)
        })
        .collect();
    let cpu_note = match cluster.current_leader() {
        Some(l) if l == cluster.leader => None,
        other => Some(format!(
            "the leader changed during the window (member {} before, {} after): roles are those before",
            cluster.leader + 1,
            other.map_or("none".to_string(), |l| (l + 1).to_string())
        )),
    };
    if m.puts == 0 {
        return Err(PeersError::Peer {
            what: "etcd".into(),
            why: format!("no put completed in the window ({} failed); {}", m.errors, cluster.log_tail(cluster.leader)),
        });
    }
    Ok(Row {
        system: "etcd".into(),
        setup: super::fsync_name(fsync).into(),
        clients: load.clients,
        per_request: 1,
        puts_per_s: m.puts as f64 / m.seconds,
        p50_us: m.latency.value_at_quantile(0.5),
        p99_us: m.latency.value_at_quantile(0.99),
        max_us: m.latency.max(),
        failed_requests: m.errors,
        cpu,
        cpu_note,
        ran: format!(
            "etcd {version}, {MEMBERS} members: {}; {} clients, each its own HTTP/1.1 keep-alive connection to the leader's JSON gateway, POST /v3/kv/put, one put at a time",
            flags_summary(fsync),
            load.clients
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::super::http::tests::fake_server;
    use super::*;

    #[test]
    fn base64_matches_rfc_4648() {
        for (plain, encoded) in
            [("", ""), ("f", "Zg=="), ("fo", "Zm8="), ("foo", "Zm9v"), ("foob", "Zm9vYg=="), ("foobar", "Zm9vYmFy")]
        {
            assert_eq!(base64(plain.as_bytes()), encoded);
        }
        assert_eq!(base64(&[0xff, 0xfe, 0x00]), "//4A");
    }

    #[test]
    fn puts_have_16_byte_keys_and_the_asked_value_size() {
        assert_eq!(key_of(1234), "0000000000001234");
        let mut s = PutStream { rng: XorShift::new(client_seed(1, 0)), keys: 10, value_bytes: 64 };
        let body: serde_json::Value = serde_json::from_slice(&s.next_body()).unwrap();
        assert_eq!(body["key"].as_str().unwrap().len(), 24, "16 bytes in base64");
        assert_eq!(body["value"].as_str().unwrap().len(), 88, "64 bytes in base64");
    }

    fn response(status: u16, body: &str) -> Response {
        Response { status, body: body.as_bytes().to_vec() }
    }

    #[test]
    fn put_answers_are_classified() {
        let ok = r#"{"header":{"cluster_id":"1","member_id":"2","revision":"7","raft_term":"2"}}"#;
        assert_eq!(put_outcome(&response(200, ok)), Ok(()));
        assert!(put_outcome(&response(200, "{}")).unwrap_err().contains("without a revision"));
        assert!(put_outcome(&response(200, "not json")).is_err());
        let busy = r#"{"error":"etcdserver: leader changed","message":"etcdserver: leader changed","code":14}"#;
        assert_eq!(put_outcome(&response(503, busy)), Err("status 503: etcdserver: leader changed".into()));
        assert_eq!(put_outcome(&response(502, "<html>")), Err("status 502: <html>".into()));
    }

    #[test]
    fn statuses_name_the_member_and_the_leader() {
        let s = r#"{"header":{"member_id":"13668033151171901709"},"version":"3.4.23","leader":"13668033151171901709"}"#;
        assert_eq!(
            parse_status(s.as_bytes()),
            Ok(("13668033151171901709".into(), Some("13668033151171901709".into())))
        );
        assert_eq!(parse_status(br#"{"header":{"member_id":"5"},"leader":"0"}"#), Ok(("5".into(), None)));
        assert!(parse_status(b"{}").is_err());
        assert!(parse_status(b"\xff").is_err());
    }

    #[test]
    fn a_put_goes_over_http_and_a_refusal_is_an_error() {
        let ok = r#"{"header":{"revision":"2"}}"#;
        let answer = |status: &str, body: &str| {
            format!(
                "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
            .into_bytes()
        };
        let refused = r#"{"message":"etcdserver: too many requests"}"#;
        let (addr, server) = fake_server(vec![answer("200 OK", ok), answer("429 Too Many Requests", refused)]);
        let mut conn = None;
        let body = put_body(b"0000000000000001", b"v");
        assert_eq!(put(&mut conn, addr, &body), Ok(()));
        assert_eq!(put(&mut conn, addr, &body), Err("status 429: etcdserver: too many requests".into()));
        let seen = server.join().unwrap();
        assert!(seen[0].head.starts_with("POST /v3/kv/put HTTP/1.1"));
        let sent: serde_json::Value = serde_json::from_slice(&seen[1].body).unwrap();
        assert_eq!(sent["key"], "MDAwMDAwMDAwMDAwMDAwMQ==");
        assert_eq!(sent["value"], "dg==");
    }

    #[test]
    fn members_get_their_own_urls_and_no_fsync_only_when_asked() {
        let a = |p: u16| SocketAddr::from(([127, 0, 0, 1], p));
        let (clients, peers) = ([a(1), a(2), a(3)], [a(4), a(5), a(6)]);
        let args = member_args(1, &clients, &peers, Path::new("/d"), true);
        assert!(args.contains(&"--name=m2".into()));
        assert!(args.contains(&"--listen-client-urls=http://127.0.0.1:2".into()));
        assert!(args.contains(&"--data-dir=/d/m2".into()));
        assert!(args
            .contains(&"--initial-cluster=m1=http://127.0.0.1:4,m2=http://127.0.0.1:5,m3=http://127.0.0.1:6".into()));
        assert!(!args.iter().any(|f| f.contains("fsync")));
        assert!(member_args(0, &clients, &peers, Path::new("/d"), false).contains(&"--unsafe-no-fsync".into()));
    }
}
