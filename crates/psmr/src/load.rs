//! Closed-loop load against a kv cluster, shared by `psmr client load` and
//! `psmr bench`: client threads, latency histograms per command kind, a
//! throughput timeline, the replicas' per-stage busy time, and the optional
//! history of every operation.

use anyhow::{anyhow, bail, Context, Result};
use hdrhistogram::Histogram;
use psmr_client::{Client, ClientConfig};
use psmr_model::wire::ThreadStat;
use psmr_services::kv::{KvCodec, KvOp, KvReply};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Longest latency the histograms hold, in µs (a minute); longer ones are
/// clamped to it rather than lost.
const LATENCY_MAX_US: u64 = 60_000_000;

/// Most closed-loop clients (one thread each).
pub const CLIENTS_MAX: usize = 4096;

/// What load to run.
#[derive(Clone, Debug)]
pub struct LoadSpec {
    /// Closed-loop clients, one thread each.
    pub clients: usize,
    /// Commands per client request.
    pub per_request: usize,
    /// Warm-up before measuring.
    pub warmup: Duration,
    /// How long to measure.
    pub duration: Duration,
    /// Keys the commands touch (`0..keys`).
    pub keys: u64,
    /// Percentage of writes (puts); the rest are reads.
    pub write_pct: u8,
    /// Where to write every operation (the `psmr check-history` schema).
    pub history: Option<PathBuf>,
    /// Seed of the clients' random keys, operations and values.
    pub seed: u64,
}

impl LoadSpec {
    /// Checks the ranges; the error names the flag.
    pub fn validate(&self) -> Result<()> {
        if !(1..=CLIENTS_MAX).contains(&self.clients) {
            bail!("--clients must be between 1 and {CLIENTS_MAX}, got {}", self.clients);
        }
        if !(1..=psmr_model::wire::REQUEST_COMMANDS_MAX).contains(&self.per_request) {
            bail!(
                "--per-request must be between 1 and {}, got {}",
                psmr_model::wire::REQUEST_COMMANDS_MAX,
                self.per_request
            );
        }
        if self.keys == 0 {
            bail!("--keys must be at least 1");
        }
        if self.write_pct > 100 {
            bail!("--write-pct must be at most 100, got {}", self.write_pct);
        }
        if self.duration.is_zero() {
            bail!("the measured duration must be positive");
        }
        Ok(())
    }
}

/// Busy time of one stage of one replica over the measured window.
#[derive(Clone, Debug)]
pub struct StageShare {
    /// The replica's client address.
    pub replica: SocketAddr,
    /// The stage (thread name without its number).
    pub stage: String,
    /// Share of the window on a CPU (averaged over the stage's threads).
    pub busy: f64,
    /// Share of the window runnable but waiting for a CPU.
    pub waiting_cpu: f64,
}

impl StageShare {
    /// The rest of the window: blocked (waiting for work or I/O).
    pub fn blocked(&self) -> f64 {
        (1.0 - self.busy - self.waiting_cpu).max(0.0)
    }
}

/// What one load run measured.
pub struct LoadResult {
    /// Length of the measured window, seconds.
    pub seconds: f64,
    /// Commands completed in the window.
    pub commands: u64,
    /// Requests completed in the window.
    pub requests: u64,
    /// Requests that failed (timed out or refused) over the whole run.
    pub errors: u64,
    /// Request latency, µs, one sample per read command.
    pub read_latency: Histogram<u64>,
    /// Request latency, µs, one sample per write command.
    pub write_latency: Histogram<u64>,
    /// Request latency, µs, one sample per request.
    pub request_latency: Histogram<u64>,
    /// Commands completed in each second of the window.
    pub timeline: Vec<u64>,
    /// Per replica and stage: busy, waiting for a CPU, blocked.
    pub stages: Vec<StageShare>,
}

impl LoadResult {
    /// Commands per second over the window.
    pub fn commands_per_s(&self) -> f64 {
        self.commands as f64 / self.seconds
    }
}

fn histogram() -> Result<Histogram<u64>> {
    Ok(Histogram::new_with_bounds(1, LATENCY_MAX_US, 3)?)
}

/// What one client thread brings back.
struct ClientTally {
    errors: u64,
    commands: u64,
    requests: u64,
    read: Histogram<u64>,
    write: Histogram<u64>,
    request: Histogram<u64>,
    timeline: Vec<u64>,
}

/// Runs `spec` against the replicas at `addrs`.
pub fn run(addrs: &[SocketAddr], config: impl Fn() -> ClientConfig, spec: &LoadSpec) -> Result<LoadResult> {
    spec.validate()?;
    let start = Instant::now();
    let (measure_from, measure_to) = (start + spec.warmup, start + spec.warmup + spec.duration);
    let buckets = (spec.duration.as_secs_f64().ceil() as usize).max(1);
    let recorder = match &spec.history {
        Some(path) => {
            let file = std::fs::File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
            Some(Arc::new(Recorder { out: std::sync::Mutex::new(std::io::BufWriter::new(file)), origin: start }))
        }
        None => None,
    };
    let mut handles = Vec::new();
    for i in 0..spec.clients {
        let mut client = Client::new(config())?;
        let (per, keys, write_pct, seed) = (spec.per_request, spec.keys, u64::from(spec.write_pct), spec.seed);
        let recorder = recorder.clone();
        handles.push(std::thread::spawn(move || -> Result<ClientTally> {
            let mut tally = ClientTally {
                errors: 0,
                commands: 0,
                requests: 0,
                read: histogram()?,
                write: histogram()?,
                request: histogram()?,
                timeline: vec![0; buckets],
            };
            // xorshift seeded by the seed and the client's index: each
            // client its own stream, the same seed the same streams (never
            // the all-zero state, which xorshift cannot leave).
            let mut x =
                (seed ^ (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)).wrapping_mul(0xBF58_476D_1CE4_E5B9) | 1;
            let mut next = || {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x
            };
            loop {
                let now = Instant::now();
                if now >= measure_to {
                    return Ok(tally);
                }
                let ops: Vec<KvOp> = (0..per)
                    .map(|_| {
                        let key = next() % keys;
                        if next() % 100 < write_pct {
                            KvOp::Put { key, value: next().to_string().into_bytes() }
                        } else {
                            KvOp::Read { key }
                        }
                    })
                    .collect();
                let outcome = client.call(&KvCodec, &ops);
                let done = Instant::now();
                if let Some(r) = &recorder {
                    let shown = outcome.as_ref().map(Clone::clone).map_err(|e| e.to_string());
                    r.request(client.id(), &ops, &shown, now, done)?;
                }
                if let Err(e) = outcome {
                    // The cluster may be changing leaders or be down (a
                    // fault on purpose, or not): count it, go on, and do
                    // not spin if the failure is immediate.
                    tracing::debug!(client = client.id(), "request failed: {e}");
                    tally.errors += 1;
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
                if now >= measure_from && done <= measure_to {
                    let us = done.duration_since(now).as_micros().clamp(1, u128::from(LATENCY_MAX_US)) as u64;
                    tally.commands += per as u64;
                    tally.requests += 1;
                    tally.request.record(us)?;
                    for op in &ops {
                        match op {
                            KvOp::Read { .. } => tally.read.record(us)?,
                            _ => tally.write.record(us)?,
                        }
                    }
                    // `done == measure_to` would fall one past the end.
                    let second = (done.duration_since(measure_from).as_secs() as usize).min(buckets - 1);
                    tally.timeline[second] += per as u64;
                }
            }
        }));
    }
    let probe = Client::new(ClientConfig::new(addrs.to_vec()))?;
    std::thread::sleep(measure_from.saturating_duration_since(Instant::now()));
    let before: Vec<_> = addrs.iter().map(|&a| probe.stats_of(a, Duration::from_secs(3)).ok()).collect();
    std::thread::sleep(measure_to.saturating_duration_since(Instant::now()));
    let after: Vec<_> = addrs.iter().map(|&a| probe.stats_of(a, Duration::from_secs(3)).ok()).collect();
    let mut result = LoadResult {
        seconds: spec.duration.as_secs_f64(),
        commands: 0,
        requests: 0,
        errors: 0,
        read_latency: histogram()?,
        write_latency: histogram()?,
        request_latency: histogram()?,
        timeline: vec![0; buckets],
        stages: stage_shares(addrs, &before, &after),
    };
    for h in handles {
        let t = h.join().map_err(|_| anyhow!("a client thread panicked"))??;
        result.commands += t.commands;
        result.requests += t.requests;
        result.errors += t.errors;
        result.read_latency.add(&t.read)?;
        result.write_latency.add(&t.write)?;
        result.request_latency.add(&t.request)?;
        for (sum, n) in result.timeline.iter_mut().zip(&t.timeline) {
            *sum += n;
        }
    }
    if let Some(r) = recorder {
        use std::io::Write as _;
        r.out.lock().map_err(|_| anyhow!("a client thread panicked"))?.flush()?;
    }
    Ok(result)
}

type Reading = Option<(u64, Vec<ThreadStat>)>;

/// Per replica and thread name (threads of one name summed, then divided
/// by their number): shares of the interval on a CPU and waiting for one.
fn stage_shares(addrs: &[SocketAddr], before: &[Reading], after: &[Reading]) -> Vec<StageShare> {
    let mut out = Vec::new();
    for ((addr, b), a) in addrs.iter().zip(before).zip(after) {
        let (Some((t0, b)), Some((t1, a))) = (b, a) else { continue };
        let wall = t1.saturating_sub(*t0).max(1) as f64;
        let mut groups: std::collections::BTreeMap<String, (f64, f64, usize)> = Default::default();
        // The process's main thread only waits for the others.
        for t in a.iter().filter(|t| t.name.starts_with("psmr-")) {
            if let Some(old) = b.iter().find(|o| o.tid == t.tid) {
                let g = groups.entry(stage_of(&t.name)).or_default();
                g.0 += t.cpu_ns.saturating_sub(old.cpu_ns) as f64 / wall;
                g.1 += t.runq_ns.saturating_sub(old.runq_ns) as f64 / wall;
                g.2 += 1;
            }
        }
        for (stage, (busy, runq, n)) in groups {
            out.push(StageShare { replica: *addr, stage, busy: busy / n as f64, waiting_cpu: runq / n as f64 });
        }
    }
    out
}

/// Threads of one stage share a name up to a trailing number.
fn stage_of(name: &str) -> String {
    name.trim_end_matches(|c: char| c.is_ascii_digit()).trim_end_matches('-').to_string()
}

/// Where the load's client threads append their operations.
struct Recorder {
    out: std::sync::Mutex<std::io::BufWriter<std::fs::File>>,
    origin: Instant,
}

impl Recorder {
    fn ns(&self, t: Instant) -> u64 {
        t.duration_since(self.origin).as_nanos() as u64
    }

    /// Records one request: its operations, their outcomes (or why the
    /// request as a whole failed) and its times.
    fn request(
        &self,
        client: u64,
        ops: &[KvOp],
        outcome: &std::result::Result<Vec<std::result::Result<KvReply, String>>, String>,
        invoked: Instant,
        completed: Instant,
    ) -> Result<()> {
        use psmr_bench::history::{OpKind, Operation, Status};
        use std::io::Write as _;
        let mut lines = String::new();
        for (i, op) in ops.iter().enumerate() {
            let (kind, key, value) = match op {
                KvOp::Read { key } => (OpKind::Read, *key, None),
                KvOp::Put { key, value } => (OpKind::Write, *key, Some(String::from_utf8_lossy(value).into_owned())),
                KvOp::Delete { key } => (OpKind::Delete, *key, None),
                other => bail!("the load does not issue {other:?}"),
            };
            let (status, result) = match outcome.as_ref().map(|r| &r[i]) {
                Ok(Ok(KvReply::Value(v))) => (
                    Status::Ok,
                    v.as_ref().map_or(serde_json::Value::Null, |v| String::from_utf8_lossy(v).into_owned().into()),
                ),
                Ok(Ok(KvReply::Done(existed))) => (Status::Ok, (*existed).into()),
                Ok(Err(_refused)) => (Status::Fail, serde_json::Value::Null),
                Err(_) => (Status::Unknown, serde_json::Value::Null),
            };
            let record = Operation {
                client,
                op: kind,
                key,
                value,
                result,
                invoke_ns: self.ns(invoked),
                complete_ns: if status == Status::Ok { self.ns(completed) } else { 0 },
                status,
            };
            lines.push_str(&serde_json::to_string(&record)?);
            lines.push('\n');
        }
        let mut out = self.out.lock().map_err(|_| anyhow!("a client thread panicked"))?;
        out.write_all(lines.as_bytes())?;
        Ok(())
    }
}
