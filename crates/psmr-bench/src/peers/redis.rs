//! Redis for the peers scenario: one `redis-server` without persistence on
//! a free loopback port, and `redis-benchmark` against it, whose CSV
//! output is parsed here.
//!
//! redis-benchmark runs a fixed number of requests, not a duration: a
//! first short run (which also warms the server up) measures the rate,
//! from which the warm-up and measured runs get their request counts.

use super::process::{free_ports, wait_until, ChildGuard, Scratch};
use super::{PeerLoad, PeersError, Row};
use psmr_harness::cpu::{CpuSample, ReplicaCpu, Role};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// Requests of the calibration run.
const CALIBRATION_REQUESTS: u64 = 20_000;
/// Fewest requests of the measured run.
const REQUESTS_MIN: u64 = 1_000;
/// Most requests of one run.
const REQUESTS_MAX: u64 = 1_000_000_000;
/// Largest CSV output read, bytes (a few hundred are expected).
const CSV_BYTES_MAX: u64 = 64 * 1024;
/// How long the server may take to answer PING.
const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// The line of redis-benchmark's CSV for one test (Redis 6.2 and later:
/// a header, then `"SET","729927.06","0.502",...`).
#[derive(Clone, Debug, PartialEq)]
pub struct CsvRow {
    /// The test (`SET`).
    pub test: String,
    /// Requests per second.
    pub rps: f64,
    /// Median latency, ms.
    pub p50_ms: f64,
    /// 99th percentile, ms.
    pub p99_ms: f64,
    /// Largest, ms.
    pub max_ms: f64,
}

/// The `test` row of redis-benchmark's `--csv` output.
pub fn parse_csv(text: &str, test: &str) -> Result<CsvRow, String> {
    let fields =
        |line: &str| -> Vec<String> { line.split(',').map(|f| f.trim().trim_matches('"').to_string()).collect() };
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let header = fields(lines.next().ok_or("no output")?);
    let column = |name: &str| {
        header.iter().position(|h| h == name).ok_or_else(|| {
            format!("no {name:?} column in the header {header:?} (latency columns need redis-benchmark 6.2 or later)")
        })
    };
    let (t, rps, p50, p99, max) = (
        column("test")?,
        column("rps")?,
        column("p50_latency_ms")?,
        column("p99_latency_ms")?,
        column("max_latency_ms")?,
    );
    let row =
        lines.map(fields).find(|r| r.get(t).is_some_and(|v| v == test)).ok_or_else(|| format!("no {test} row"))?;
    let number = |i: usize| -> Result<f64, String> {
        let raw = row.get(i).ok_or_else(|| format!("{test} row has no column {}", header[i]))?;
        raw.parse::<f64>()
            .ok()
            .filter(|v| v.is_finite() && *v >= 0.0)
            .ok_or_else(|| format!("{}: {raw:?} is not a number", header[i]))
    };
    Ok(CsvRow {
        test: test.to_string(),
        rps: number(rps)?,
        p50_ms: number(p50)?,
        p99_ms: number(p99)?,
        max_ms: number(max)?,
    })
}

/// The flags of the server, listening on `port` of loopback, working in
/// `dir`: no RDB snapshots, no append-only file.
pub fn server_args(port: u16, dir: &Path) -> Vec<String> {
    let mut args: Vec<String> =
        ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--daemonize", "no"].map(String::from).to_vec();
    args.extend(["--port".into(), port.to_string(), "--dir".into(), dir.display().to_string()]);
    args
}

/// The flags of one redis-benchmark run of `n` requests.
pub fn benchmark_args(addr: SocketAddr, load: &PeerLoad, pipeline: usize, n: u64) -> Vec<String> {
    let pairs = [
        ("-h", addr.ip().to_string()),
        ("-p", addr.port().to_string()),
        ("-P", pipeline.to_string()),
        ("-c", load.clients.to_string()),
        ("-t", "set".into()),
        ("-n", n.to_string()),
        ("-d", load.value_bytes.to_string()),
        ("-r", load.keys.to_string()),
    ];
    let mut args: Vec<String> = pairs.into_iter().flat_map(|(f, v)| [f.to_string(), v]).collect();
    args.push("--csv".into());
    args
}

/// Whether a server answers PING at `addr`.
fn pong(addr: SocketAddr) -> bool {
    let ask = || -> std::io::Result<bool> {
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
        s.set_read_timeout(Some(Duration::from_secs(1)))?;
        s.write_all(b"PING\r\n")?;
        let mut line = Vec::new();
        BufReader::new(s).take(64).read_until(b'\n', &mut line)?;
        Ok(line.starts_with(b"+PONG"))
    };
    ask().unwrap_or(false)
}

/// A running redis-server; dropping it kills it and removes its directory.
pub struct RedisServer {
    child: ChildGuard,
    /// Where it listens.
    pub addr: SocketAddr,
    // Dropped after the server.
    _dir: Scratch,
}

impl RedisServer {
    /// Starts `redis-server`, its log in `logs`, and waits for PONG.
    pub fn start(bin: &Path, logs: &Path) -> Result<Self, PeersError> {
        let dir = Scratch::new("redis")?;
        std::fs::create_dir_all(logs)
            .map_err(|source| PeersError::Io { what: format!("cannot create {}", logs.display()), source })?;
        let addr = free_ports(1)?[0];
        let mut command = Command::new(bin);
        command.args(server_args(addr.port(), &dir.path));
        let mut server = Self {
            child: ChildGuard::spawn(command, "redis-server", &logs.join("redis-server.log"))?,
            addr,
            _dir: dir,
        };
        let child = &mut server.child;
        wait_until("redis-server", READY_TIMEOUT, || child.check_running(), || pong(addr))?;
        Ok(server)
    }
}

/// One redis-benchmark run of `n` requests: its CSV row and command line.
fn benchmark(
    bin: &Path,
    server: &RedisServer,
    load: &PeerLoad,
    pipeline: usize,
    n: u64,
    logs: &Path,
) -> Result<(CsvRow, String), PeersError> {
    let args = benchmark_args(server.addr, load, pipeline, n);
    let out = logs.join(format!("redis-benchmark-{n}.csv"));
    let _ = std::fs::remove_file(&out);
    let mut command = Command::new(bin);
    command.args(&args);
    let mut child = ChildGuard::spawn_split(command, "redis-benchmark", &out, &logs.join("redis-benchmark.log"))?;
    // Generous: a run is sized to take `duration`, at any rate above a
    // tenth of the calibrated one.
    let timeout = Duration::from_secs(60) + load.duration.saturating_mul(10);
    let status = child.wait_timeout(timeout)?;
    let bench_err = |why: String| PeersError::Peer { what: "redis-benchmark".into(), why };
    if !status.success() {
        return Err(bench_err(format!("{status}; {}", super::process::log_tail(&child.log))));
    }
    let mut text = String::new();
    std::fs::File::open(&out)
        .and_then(|f| f.take(CSV_BYTES_MAX).read_to_string(&mut text))
        .map_err(|e| bench_err(format!("cannot read its output {}: {e}", out.display())))?;
    let row = parse_csv(&text, "SET").map_err(bench_err)?;
    Ok((row, format!("redis-benchmark {}", args.join(" "))))
}

/// Requests that take about `seconds` at `rps`.
fn requests_for(rps: f64, seconds: f64) -> u64 {
    ((rps * seconds) as u64).clamp(REQUESTS_MIN, REQUESTS_MAX)
}

/// Runs the redis case: a fresh server, calibration, warm-up and the
/// measured run, the server's CPU time over the measured run.
pub fn run(
    tools: &super::Tools,
    versions: (&str, &str),
    load: &PeerLoad,
    pipeline: usize,
    logs: &Path,
) -> Result<Row, PeersError> {
    let mut server = RedisServer::start(&tools.redis_server, logs)?;
    let bin = &tools.redis_benchmark;
    let (probe, _) = benchmark(bin, &server, load, pipeline, CALIBRATION_REQUESTS, logs)?;
    let warmup = (probe.rps * load.warmup.as_secs_f64()) as u64;
    if warmup >= REQUESTS_MIN {
        benchmark(bin, &server, load, pipeline, warmup, logs)?;
    }
    let n = requests_for(probe.rps, load.duration.as_secs_f64());
    let pid = server.child.pid();
    let before = CpuSample::read(pid).map_err(|e| e.to_string());
    let (row, command) = benchmark(bin, &server, load, pipeline, n, logs)?;
    let after = CpuSample::read(pid).map_err(|e| e.to_string());
    server.child.check_running()?;
    let cpu = vec![ReplicaCpu::measured(1, server.addr.to_string(), pid, Role::Single, &before, &after, n)];
    let us = |ms: f64| (ms * 1000.0).round() as u64;
    Ok(Row {
        system: "redis".into(),
        setup: format!("pipeline {pipeline}"),
        clients: load.clients,
        per_request: pipeline,
        puts_per_s: row.rps,
        p50_us: us(row.p50_ms),
        p99_us: us(row.p99_ms),
        max_us: us(row.max_ms),
        failed_requests: 0,
        cpu,
        cpu_note: None,
        ran: format!(
            "redis-server {} {} (no persistence); {command} (redis-benchmark {}), after a calibration run of {CALIBRATION_REQUESTS} sets and a warm-up of {warmup}",
            versions.0,
            server_args(server.addr.port(), Path::new("<scratch dir>")).join(" ").replace("--save  ", "--save \"\" "),
            versions.1,
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    // What redis-benchmark 7.0.15 printed on this project's machine.
    const CSV: &str = "\"test\",\"rps\",\"avg_latency_ms\",\"min_latency_ms\",\"p50_latency_ms\",\"p95_latency_ms\",\"p99_latency_ms\",\"max_latency_ms\"\n\
                       \"SET\",\"729927.06\",\"0.502\",\"0.112\",\"0.495\",\"0.823\",\"1.167\",\"4.167\"\n";

    #[test]
    fn csv_of_redis_7_parses() {
        let row = parse_csv(CSV, "SET").unwrap();
        assert_eq!(row, CsvRow { test: "SET".into(), rps: 729927.06, p50_ms: 0.495, p99_ms: 1.167, max_ms: 4.167 });
        // Columns are found by name, wherever they are.
        let shuffled = "\"rps\",\"test\",\"max_latency_ms\",\"p99_latency_ms\",\"p50_latency_ms\"\n\"GET\",\"1\",\"1\",\"1\",\"1\"\n\
                        \"2.5\",\"SET\",\"9\",\"8\",\"7\"\n";
        assert_eq!(parse_csv(shuffled, "SET").unwrap().rps, 2.5);
    }

    #[test]
    fn bad_csv_is_an_error_that_says_why() {
        let old = "\"SET\",\"265252.00\"\n";
        assert!(parse_csv(old, "SET").unwrap_err().contains("6.2 or later"));
        assert_eq!(parse_csv("", "SET"), Err("no output".into()));
        assert!(parse_csv(&CSV.replace("SET", "GET"), "SET").unwrap_err().contains("no SET row"));
        assert!(parse_csv(&CSV.replace("729927.06", "fast"), "SET").unwrap_err().contains("rps"));
        assert!(parse_csv(&CSV.replace("0.495", "-1"), "SET").is_err());
        assert!(parse_csv(&CSV.replace("0.495", "NaN"), "SET").is_err());
        let short = CSV.replace(",\"4.167\"", "");
        assert!(parse_csv(&short, "SET").unwrap_err().contains("max_latency_ms"));
    }

    #[test]
    fn commands_carry_the_flags_the_comparison_needs() {
        let load = PeerLoad {
            clients: 8,
            warmup: Duration::from_secs(1),
            duration: Duration::from_secs(5),
            keys: 10_000,
            value_bytes: 64,
            seed: 1,
        };
        let args = benchmark_args("127.0.0.1:7000".parse().unwrap(), &load, 50, 123).join(" ");
        assert_eq!(args, "-h 127.0.0.1 -p 7000 -P 50 -c 8 -t set -n 123 -d 64 -r 10000 --csv");
        let server = server_args(7000, Path::new("/x")).join(" ");
        assert_eq!(server, "--bind 127.0.0.1 --save  --appendonly no --daemonize no --port 7000 --dir /x");
        assert_eq!(requests_for(700_000.0, 5.0), 3_500_000);
        assert_eq!(requests_for(1.0, 5.0), REQUESTS_MIN);
        assert_eq!(requests_for(f64::INFINITY, 5.0), REQUESTS_MAX);
    }
}
