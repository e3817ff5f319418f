//! The peers scenario's report: every run, the side-by-side ratios, and
//! what each side ran.

use super::Row;
use crate::report::chart;
use psmr_harness::cpu;
use serde::Serialize;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// What ran, for the report: versions, flags, the load.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Setup {
    /// `etcd --version`.
    pub etcd_version: String,
    /// `redis-server --version`.
    pub redis_version: String,
    /// `redis-benchmark --version`.
    pub redis_benchmark_version: String,
    /// Keys drawn uniformly from `0..keys`.
    pub keys: u64,
    /// etcd and redis key size, bytes.
    pub key_bytes: usize,
    /// Value size, bytes.
    pub value_bytes: usize,
    /// Warm-up per point, s.
    pub warmup_s: f64,
    /// Measured time per point, s.
    pub duration_s: f64,
    /// Seed of the clients' keys and values.
    pub seed: u64,
    /// The psmr side's cluster and load, in words.
    pub psmr: String,
    /// Where the data directories were, with their file system.
    pub data_dir: String,
    /// Cores of the machine.
    pub cores: usize,
    /// The machine's 1-minute load average before and after the runs.
    pub load_average: String,
}

/// One psmr row next to the peer row it is compared with.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Comparison {
    /// `psmr disk vs etcd fsync`.
    pub pair: String,
    /// Closed-loop clients (redis: connections).
    pub clients: usize,
    /// Puts per request (redis: pipeline depth).
    pub per_request: usize,
    /// Index of the psmr row.
    pub psmr: usize,
    /// Index of the peer's row.
    pub peer: usize,
    /// psmr puts/s over the peer's.
    pub puts_ratio: f64,
    /// psmr p50 over the peer's.
    pub p50_ratio: f64,
    /// psmr p99 over the peer's.
    pub p99_ratio: f64,
}

/// Which psmr setup each peer setup is compared with.
const PAIRS: [(&str, &str, &str); 3] =
    [("disk", "etcd", "fsync"), ("memory", "etcd", "no fsync"), ("memory", "redis", "")];

/// Every psmr row paired with the peer row of the same clients and puts
/// per request: disk with etcd fsync, memory with etcd without fsync and
/// with redis.
pub fn compare(rows: &[Row]) -> Vec<Comparison> {
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::NAN };
    let mut out = Vec::new();
    for (peer, r) in rows.iter().enumerate() {
        let Some(&(storage, _, _)) =
            PAIRS.iter().find(|(_, system, setup)| r.system == *system && (setup.is_empty() || r.setup == *setup))
        else {
            continue;
        };
        let twin = rows.iter().position(|p| {
            p.system == "psmr" && p.setup == storage && p.clients == r.clients && p.per_request == r.per_request
        });
        if let Some(psmr) = twin {
            let p = &rows[psmr];
            out.push(Comparison {
                pair: format!("psmr {storage} vs {} {}", r.system, r.setup),
                clients: r.clients,
                per_request: r.per_request,
                psmr,
                peer,
                puts_ratio: ratio(p.puts_per_s, r.puts_per_s),
                p50_ratio: ratio(p.p50_us as f64, r.p50_us as f64),
                p99_ratio: ratio(p.p99_us as f64, r.p99_us as f64),
            });
        }
    }
    out
}

#[derive(Serialize)]
struct Results<'a> {
    scenario: &'a str,
    about: &'a str,
    setup: &'a Setup,
    rows: &'a [Row],
    comparisons: &'a [Comparison],
}

/// Writes `results.json`, `results.csv`, `throughput.svg` and `report.md`
/// into `dir`; returns the files.
pub fn write(dir: &Path, about: &str, setup: &Setup, rows: &[Row]) -> std::io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let comparisons = compare(rows);
    let results = Results { scenario: "peers", about, setup, rows, comparisons: &comparisons };
    let files = [
        ("results.json", serde_json::to_string_pretty(&results).map_err(std::io::Error::other)? + "\n"),
        ("results.csv", csv(rows)),
        ("throughput.svg", throughput_svg(rows)),
        ("report.md", markdown(about, setup, rows, &comparisons)),
    ];
    crate::report::write_files(dir, files.into())
}

/// One line per run.
pub fn csv(rows: &[Row]) -> String {
    let mut s = String::from(
        "system,setup,clients,per_request,puts_per_s,p50_us,p99_us,max_us,failed_requests,cpu_us_per_put_leader,cpu_us_per_put_followers_mean,cpu_us_per_put_followers_max\n",
    );
    let figure = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v:.2}"));
    for r in rows {
        let followers = cpu::followers_us(&r.cpu);
        let _ = writeln!(
            s,
            "{},{},{},{},{:.1},{},{},{},{},{},{},{}",
            r.system,
            r.setup,
            r.clients,
            r.per_request,
            r.puts_per_s,
            r.p50_us,
            r.p99_us,
            r.max_us,
            r.failed_requests,
            figure(cpu::leader_us(&r.cpu)),
            figure(followers.map(|f| f.0)),
            figure(followers.map(|f| f.1))
        );
    }
    s
}

/// Puts/s against clients, one line per system and setup (one put per
/// request only).
fn throughput_svg(rows: &[Row]) -> String {
    let mut lines: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    for r in rows.iter().filter(|r| r.per_request == 1) {
        let name = format!("{} {}", r.system, r.setup);
        let point = (r.clients as f64, r.puts_per_s);
        match lines.iter_mut().find(|(n, _)| *n == name) {
            Some((_, pts)) => pts.push(point),
            None => lines.push((name, vec![point])),
        }
    }
    chart("peers: puts/s, one put per request", "closed-loop clients", "puts/s", &lines, &[])
}

/// Every row and the ratios of each psmr row to its peer as readable
/// tables (what `psmr bench --scenario peers` prints).
pub fn format_table(rows: &[Row]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<8} {:<12} {:>7} {:>7} {:>12} {:>9} {:>9} {:>18} {:>20}",
        "system",
        "setup",
        "clients",
        "per req",
        "puts/s",
        "p50 ms",
        "p99 ms",
        "cpu µs/put leader",
        "followers mean/max"
    );
    for r in rows {
        let (leader, followers) = cpu::cells(&r.cpu);
        let _ = writeln!(
            out,
            "{:<8} {:<12} {:>7} {:>7} {:>12.0} {:>9.2} {:>9.2} {:>18} {:>20}",
            r.system,
            r.setup,
            r.clients,
            r.per_request,
            r.puts_per_s,
            r.p50_us as f64 / 1e3,
            r.p99_us as f64 / 1e3,
            leader,
            followers
        );
    }
    let _ = writeln!(out, "\n{:<32} {:>14} {:>10} {:>10} {:>10}", "psmr/peer", "clients x req", "puts/s", "p50", "p99");
    for c in compare(rows) {
        let _ = writeln!(
            out,
            "{:<32} {:>14} {:>9.2}x {:>9.2}x {:>9.2}x",
            c.pair,
            format!("{} x {}", c.clients, c.per_request),
            c.puts_ratio,
            c.p50_ratio,
            c.p99_ratio
        );
    }
    out
}

fn ms(us: u64) -> String {
    format!("{:.2}", us as f64 / 1000.0)
}

fn times(v: f64) -> String {
    if v.is_finite() {
        format!("{v:.2}x")
    } else {
        "-".into()
    }
}

/// The report in Markdown.
pub fn markdown(about: &str, setup: &Setup, rows: &[Row], comparisons: &[Comparison]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# psmr bench: peers\n\n{about}.\n");
    side_by_side(&mut s, rows, comparisons);
    every_run(&mut s, rows);
    what_ran(&mut s, setup, rows);
    s
}

fn side_by_side(s: &mut String, rows: &[Row], comparisons: &[Comparison]) {
    let _ = writeln!(s, "## Side by side\n");
    let _ = writeln!(
        s,
        "Ratios are psmr over the peer: above 1 for puts/s, psmr does more; above 1 for latency, psmr is slower.\n"
    );
    let _ = writeln!(s, "| psmr vs | clients x puts/request | puts/s psmr | peer | psmr/peer | p50 ms psmr | peer | psmr/peer | p99 ms psmr | peer | psmr/peer | cpu µs/put leader psmr | peer |");
    let _ = writeln!(s, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for c in comparisons {
        let (p, r) = (&rows[c.psmr], &rows[c.peer]);
        let _ = writeln!(
            s,
            "| {} {} | {} x {} | {:.0} | {:.0} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.system,
            r.setup,
            c.clients,
            c.per_request,
            p.puts_per_s,
            r.puts_per_s,
            times(c.puts_ratio),
            ms(p.p50_us),
            ms(r.p50_us),
            times(c.p50_ratio),
            ms(p.p99_us),
            ms(r.p99_us),
            times(c.p99_ratio),
            cpu::cells(&p.cpu).0,
            cpu::cells(&r.cpu).0
        );
    }
    let _ = writeln!(s, "\n![throughput](throughput.svg)\n");
}

fn every_run(s: &mut String, rows: &[Row]) {
    let _ = writeln!(s, "## Every run\n");
    let _ = writeln!(s, "| system | setup | clients | puts/request | puts/s | p50 ms | p99 ms | max ms | failed requests | cpu µs/put leader | cpu µs/put followers (mean / max) |");
    let _ = writeln!(s, "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for r in rows {
        let (leader, followers) = cpu::cells(&r.cpu);
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {:.0} | {} | {} | {} | {} | {leader} | {followers} |",
            r.system,
            r.setup,
            r.clients,
            r.per_request,
            r.puts_per_s,
            ms(r.p50_us),
            ms(r.p99_us),
            ms(r.max_us),
            r.failed_requests
        );
    }
    let _ = writeln!(
        s,
        "\nCPU µs per put: each server process's CPU time over the measured window (`/proc`, all its threads), divided by the puts completed in it; the leader is the one at the start of the window; redis has one server (its figure is under leader). The load generators' own CPU is not counted; they share the machine's cores with the servers."
    );
    for r in rows {
        if let Some(note) = &r.cpu_note {
            let _ = writeln!(s, "- {} {}, {} clients: {note}", r.system, r.setup, r.clients);
        }
        for c in r.cpu.iter().filter(|c| c.error.is_some()) {
            let _ = writeln!(s, "- {} {}: server {}: {}", r.system, r.setup, c.id, c.error.as_deref().unwrap_or(""));
        }
    }
}

fn what_ran(s: &mut String, setup: &Setup, rows: &[Row]) {
    let _ = writeln!(s, "\n## What ran\n");
    let _ = writeln!(
        s,
        "- Machine: {} cores; every server and load generator on it, over loopback; 1-minute load average {}. Data directories: {}.",
        setup.cores, setup.load_average, setup.data_dir
    );
    let _ = writeln!(
        s,
        "- Load: 100 % puts, values of {} B (a random number in decimal, zero-padded), keys drawn uniformly from {} keys; etcd and redis keys are {} B strings (etcd: 16 decimal digits; redis-benchmark: `key:` and 12 digits), psmr keys are the keys' decimal text (1 to {} B). Closed-loop clients, warm-up {} s, then {} s measured per point; seed {}.",
        setup.value_bytes,
        setup.keys,
        setup.key_bytes,
        setup.keys.saturating_sub(1).max(1).to_string().len(),
        setup.warmup_s,
        setup.duration_s,
        setup.seed
    );
    let _ = writeln!(
        s,
        "- etcd {}: the psmr bench driver (HTTP/1.1 over std TcpStream, the v3 JSON gateway); each client sends to the leader, as psmr's clients do. The gateway is part of every etcd member's client port, but in 3.4 it hands each request on to the member's own gRPC server over a loopback connection: etcd's figures include that hop, which a native gRPC client (etcd's `benchmark` tool) would not pay.",
        setup.etcd_version
    );
    let _ = writeln!(s, "- psmr: {}.", setup.psmr);
    let _ = writeln!(
        s,
        "- Redis {} (redis-benchmark {}): latency is redis-benchmark's, per command from the moment its pipeline was written, against psmr's per request of 50 puts; redis-benchmark reports no failures.",
        setup.redis_version, setup.redis_benchmark_version
    );
    let _ = writeln!(s, "\nEach run exactly:\n");
    for r in rows {
        let _ = writeln!(s, "- {} {}, {} x {}: {}", r.system, r.setup, r.clients, r.per_request, r.ran);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use psmr_harness::cpu::{ReplicaCpu, Role};

    fn row(system: &str, setup: &str, clients: usize, per_request: usize, puts: f64, p50: u64) -> Row {
        Row {
            system: system.into(),
            setup: setup.into(),
            clients,
            per_request,
            puts_per_s: puts,
            p50_us: p50,
            p99_us: 2 * p50,
            max_us: 4 * p50,
            failed_requests: 0,
            cpu: vec![ReplicaCpu {
                id: 1,
                addr: "a".into(),
                pid: Some(1),
                role: Role::Leader,
                cpu_s: Some(1.0),
                us_per_command: Some(12.5),
                error: None,
            }],
            cpu_note: None,
            ran: format!("{system} ran"),
        }
    }

    fn rows() -> Vec<Row> {
        vec![
            row("etcd", "fsync", 8, 1, 1000.0, 4000),
            row("psmr", "disk", 8, 1, 3000.0, 2000),
            row("etcd", "no fsync", 8, 1, 2000.0, 1000),
            row("psmr", "memory", 8, 1, 8000.0, 1000),
            row("redis", "pipeline 50", 8, 50, 700_000.0, 500),
            row("psmr", "memory", 8, 50, 350_000.0, 1000),
        ]
    }

    #[test]
    fn every_peer_row_meets_its_psmr_twin() {
        let c = compare(&rows());
        assert_eq!(c.len(), 3);
        assert_eq!((c[0].pair.as_str(), c[0].psmr, c[0].peer), ("psmr disk vs etcd fsync", 1, 0));
        assert_eq!((c[0].puts_ratio, c[0].p50_ratio, c[0].p99_ratio), (3.0, 0.5, 0.5));
        assert_eq!((c[1].psmr, c[1].peer, c[1].puts_ratio), (3, 2, 4.0));
        assert_eq!((c[2].psmr, c[2].peer, c[2].puts_ratio, c[2].p50_ratio), (5, 4, 0.5, 2.0));
        // A peer without a psmr twin (a failed run) is left out.
        assert_eq!(compare(&rows()[..1]), vec![]);
    }

    #[test]
    fn the_report_shows_ratios_cpu_and_what_ran() {
        let setup = Setup { etcd_version: "3.4.23".into(), keys: 10_000, value_bytes: 64, ..Setup::default() };
        let r = rows();
        let md = markdown("about", &setup, &r, &compare(&r));
        assert!(md.contains("| etcd fsync | 8 x 1 | 3000 | 1000 | 3.00x | 2.00 | 4.00 | 0.50x |"), "{md}");
        assert!(md.contains("| redis | pipeline 50 | 8 | 50 | 700000 |"));
        assert!(md.contains("| 12.5 | n/a |"), "leader figure; no followers measured");
        assert!(md.contains("etcd 3.4.23") && md.contains("10000 keys") && md.contains("values of 64 B"));
        assert!(md.contains("- redis pipeline 50, 8 x 50: redis ran"));
        let text = csv(&r);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 7);
        assert!(lines[1].starts_with("etcd,fsync,8,1,1000.0,4000,8000,16000,0,12.50,,"));
        let svg = throughput_svg(&r);
        assert_eq!(svg.matches("<polyline").count(), 4, "redis and pipelined psmr are not on the clients axis");
    }
}
