//! Closed-loop load against a kv cluster, shared by `psmr client load` and
//! `psmr bench`: client threads, latency histograms per command kind, a
//! throughput timeline, the replicas' per-stage busy time, each replica
//! process's CPU time per command, and the optional history of every
//! operation.

use anyhow::{anyhow, bail, Context, Result};
use hdrhistogram::Histogram;
use psmr_bench::cpu::{CpuSample, Reading as CpuReading, ReplicaCpu, Role};
use psmr_bench::kv_stream::{self, XorShift};
use psmr_bench::report::{StageRow, WorkerRow};
use psmr_client::ReplicaStats;
use psmr_client::{Client, ClientConfig};
use psmr_model::wire::{OpCodec, Outcome};
use psmr_services::kv::{KvCodec, KvOp, KvReply};
use psmr_services::list::{ListCodec, ListModel, ListOp, OpStream};
use psmr_services::WorkloadConfig;
use std::collections::btree_map::Entry;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Longest latency the histograms hold, in µs (a minute); longer ones are
/// clamped to it rather than lost.
const LATENCY_MAX_US: u64 = 60_000_000;

/// Most closed-loop clients (one thread each).
pub const CLIENTS_MAX: usize = 4096;

/// Largest value a sized kv load writes, bytes.
pub const VALUE_BYTES_MAX: usize = 4096;

/// The commands a load sends.
#[derive(Clone, Debug)]
pub enum Ops {
    /// Key-value store: puts (`write_pct` %) and reads of keys `0..keys`.
    Kv {
        /// Keys the commands touch.
        keys: u64,
        /// Percentage of writes.
        write_pct: u8,
        /// Bytes of every value written, 1 to [`VALUE_BYTES_MAX`]: the
        /// random number in decimal, padded with zeros on the left (or its
        /// last `value_bytes` digits). None: the number's own digits.
        value_bytes: Option<usize>,
    },
    /// Sharded list: the α-β-γ workload of `workload` (its mix, shards,
    /// skew, write skew and spread; its seed is replaced per client).
    List {
        /// The list's class model (for checking the workload).
        model: ListModel,
        /// The workload.
        workload: WorkloadConfig,
        /// Entries per shard (values are drawn from twice that).
        list_size: usize,
    },
}

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
    /// What the commands are.
    pub ops: Ops,
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
        match &self.ops {
            Ops::Kv { keys, write_pct, value_bytes } => {
                check_kv(*keys, *write_pct)?;
                if value_bytes.is_some_and(|n| !(1..=VALUE_BYTES_MAX).contains(&n)) {
                    let value_bytes = value_bytes.unwrap_or_default();
                    bail!("value_bytes must be between 1 and {VALUE_BYTES_MAX}, got {value_bytes}");
                }
            }
            Ops::List { model, workload, list_size } => {
                if self.history.is_some() {
                    bail!("histories are of key-value operations; the list load cannot write one");
                }
                OpStream::new(*model, workload, *list_size)?;
            }
        }
        if self.duration.is_zero() {
            bail!("the measured duration must be positive");
        }
        Ok(())
    }
}

fn check_kv(keys: u64, write_pct: u8) -> Result<()> {
    if keys == 0 {
        bail!("--keys must be at least 1");
    }
    if write_pct > 100 {
        bail!("--write-pct must be at most 100, got {write_pct}");
    }
    Ok(())
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
    /// Request latency, µs, one sample per command, by command kind (kv:
    /// `read`, `write`; list: `local-read`, `local-write`, `global-read`,
    /// `global-write`).
    pub latency: BTreeMap<&'static str, Histogram<u64>>,
    /// Request latency, µs, one sample per request.
    pub request_latency: Histogram<u64>,
    /// Commands completed in each second of the window.
    pub timeline: Vec<u64>,
    /// Per replica and stage: busy, waiting for a CPU, blocked.
    pub stages: Vec<StageRow>,
    /// Per replica and execution worker (early schedulers).
    pub workers: Vec<WorkerRow>,
    /// The same for each second of the window.
    pub worker_timeline: Vec<Vec<WorkerRow>>,
    /// Each replica process's CPU time over the window (see [`CpuSource`]).
    pub cpu: Vec<ReplicaCpu>,
    /// Why `cpu` is empty or its roles uncertain, if they are.
    pub cpu_note: Option<String>,
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
    latency: BTreeMap<&'static str, Histogram<u64>>,
    request: Histogram<u64>,
    timeline: Vec<u64>,
}

/// One client's source of commands.
enum Generator {
    /// `value_bytes`: `None` for the number in decimal as it is.
    Kv {
        keys: u64,
        write_pct: u64,
        value_bytes: Option<usize>,
        x: XorShift,
    },
    List(Box<OpStream>),
}

/// One request's commands, encoded, with their kinds (and the kv
/// operations, for the history).
struct Request {
    encoded: Vec<Vec<u8>>,
    kinds: Vec<&'static str>,
    kv: Vec<KvOp>,
}

impl Generator {
    fn new(ops: &Ops, seed: u64, client: usize) -> Result<Self> {
        // Each client its own stream, the same seed the same streams.
        let mixed = kv_stream::client_seed(seed, client);
        Ok(match ops {
            Ops::Kv { keys, write_pct, value_bytes } => Generator::Kv {
                keys: *keys,
                write_pct: u64::from(*write_pct),
                value_bytes: *value_bytes,
                x: XorShift::new(mixed),
            },
            Ops::List { model, workload, list_size } => {
                let cfg = WorkloadConfig { seed: mixed, ..workload.clone() };
                Generator::List(Box::new(OpStream::new(*model, &cfg, *list_size)?))
            }
        })
    }

    fn request(&mut self, n: usize) -> Request {
        let mut r = Request { encoded: Vec::with_capacity(n), kinds: Vec::with_capacity(n), kv: Vec::new() };
        match self {
            Generator::Kv { keys, write_pct, value_bytes, x } => {
                // The etcd driver of the peers scenario draws the same
                // three numbers per put: keep them in step.
                let mut next = || x.next();
                for _ in 0..n {
                    let key = next() % *keys;
                    let op = if next() % 100 < *write_pct {
                        let n = next();
                        let value =
                            value_bytes.map_or_else(|| n.to_string().into_bytes(), |b| kv_stream::sized_value(n, b));
                        KvOp::Put { key, value }
                    } else {
                        KvOp::Read { key }
                    };
                    r.kinds.push(if matches!(op, KvOp::Read { .. }) { "read" } else { "write" });
                    r.encoded.push(KvCodec.encode_op(&op));
                    r.kv.push(op);
                }
            }
            Generator::List(stream) => {
                for _ in 0..n {
                    let op = stream.next_op();
                    r.kinds.push(match op {
                        ListOp::Contains { .. } => "local-read",
                        ListOp::Add { .. } => "local-write",
                        ListOp::ContainsAll { .. } => "global-read",
                        ListOp::AddAll { .. } => "global-write",
                    });
                    r.encoded.push(ListCodec.encode_op(&op));
                }
            }
        }
        r
    }
}

/// Runs `spec` against the replicas at `addrs`, measuring their CPU time
/// when they are `psmr` processes of this machine ([`CpuSource::IfLocal`]).
pub fn run(addrs: &[SocketAddr], config: impl Fn() -> ClientConfig, spec: &LoadSpec) -> Result<LoadResult> {
    run_with_cpu(addrs, config, spec, &CpuSource::IfLocal)
}

/// Runs `spec` against the replicas at `addrs`; `cpu` says whose CPU time
/// to measure.
pub fn run_with_cpu(
    addrs: &[SocketAddr],
    config: impl Fn() -> ClientConfig,
    spec: &LoadSpec,
    cpu: &CpuSource,
) -> Result<LoadResult> {
    spec.validate()?;
    // Before the clients start, so that finding the replicas costs the
    // load nothing.
    let watch = CpuWatch::locate(addrs, cpu);
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
        let per = spec.per_request;
        let mut generator = Generator::new(&spec.ops, spec.seed, i)?;
        let recorder = recorder.clone();
        handles.push(std::thread::spawn(move || -> Result<ClientTally> {
            let mut tally = ClientTally {
                errors: 0,
                commands: 0,
                requests: 0,
                latency: BTreeMap::new(),
                request: histogram()?,
                timeline: vec![0; buckets],
            };
            loop {
                let now = Instant::now();
                if now >= measure_to {
                    return Ok(tally);
                }
                let Request { encoded, kinds, kv } = generator.request(per);
                let outcome = client.submit(encoded);
                let done = Instant::now();
                if let Some(r) = &recorder {
                    let shown = outcome
                        .as_ref()
                        .map(|outcomes| {
                            outcomes
                                .iter()
                                .map(|o| match o {
                                    Outcome::Ok(b) => KvCodec.decode_reply(b).map_err(|e| e.to_string()),
                                    Outcome::Rejected(m) => Err(m.clone()),
                                })
                                .collect()
                        })
                        .map_err(|e| e.to_string());
                    r.request(client.id(), &kv, &shown, now, done)?;
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
                    for kind in kinds {
                        let h = match tally.latency.entry(kind) {
                            Entry::Occupied(e) => e.into_mut(),
                            Entry::Vacant(e) => e.insert(histogram()?),
                        };
                        h.record(us)?;
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
    let read = || -> Vec<Reading> { addrs.iter().map(|&a| probe.stats_of(a, Duration::from_secs(3)).ok()).collect() };
    let cpu_before = watch.sample();
    let before = read();
    // The workers are read every second too, for their timeline (000
    // Fig. 5.3); a replica that does not answer leaves a gap.
    let mut worker_timeline = Vec::with_capacity(buckets);
    let mut last = before.clone();
    let mut cpu_after = Vec::new();
    for second in 1..=buckets {
        let tick = (measure_from + Duration::from_secs(second as u64)).min(measure_to);
        std::thread::sleep(tick.saturating_duration_since(Instant::now()));
        if second == buckets {
            cpu_after = watch.sample();
        }
        let now = read();
        worker_timeline.push(worker_shares(addrs, &last, &now));
        last = now;
    }
    let after = last;
    let mut result = LoadResult {
        seconds: spec.duration.as_secs_f64(),
        commands: 0,
        requests: 0,
        errors: 0,
        latency: BTreeMap::new(),
        request_latency: histogram()?,
        timeline: vec![0; buckets],
        stages: stage_shares(addrs, &before, &after),
        workers: worker_shares(addrs, &before, &after),
        worker_timeline,
        cpu: Vec::new(),
        cpu_note: watch.note.clone(),
    };
    for h in handles {
        let t = h.join().map_err(|_| anyhow!("a client thread panicked"))??;
        result.commands += t.commands;
        result.requests += t.requests;
        result.errors += t.errors;
        for (kind, h) in t.latency {
            match result.latency.entry(kind) {
                Entry::Occupied(mut e) => e.get_mut().add(&h)?,
                Entry::Vacant(e) => {
                    e.insert(h);
                }
            }
        }
        result.request_latency.add(&t.request)?;
        for (sum, n) in result.timeline.iter_mut().zip(&t.timeline) {
            *sum += n;
        }
    }
    if let Some(r) = recorder {
        use std::io::Write as _;
        r.out.lock().map_err(|_| anyhow!("a client thread panicked"))?.flush()?;
    }
    result.cpu = watch.rows(&cpu_before, &cpu_after, result.commands);
    if let Some(change) = watch.leader_change() {
        result.cpu_note = Some(change);
    }
    Ok(result)
}

/// Whose CPU time a load measures: the replica processes, found by the
/// pid each reports in its status.
#[derive(Clone, Debug)]
pub enum CpuSource {
    /// None; the reason goes in the report (`n/a`).
    Off(String),
    /// The replicas are processes this one started: their pids are ours
    /// to read.
    Local,
    /// Only replicas on a loopback address whose pid is a `psmr` process
    /// here (a cluster started by hand next to the client); `n/a` for the
    /// others.
    IfLocal,
}

/// A replica whose CPU time a load reads.
struct Watched {
    id: u64,
    addr: SocketAddr,
    pid: u32,
    role: Role,
}

/// The replicas a load reads the CPU time of, found before it starts.
struct CpuWatch {
    replicas: Vec<Watched>,
    leader: u64,
    addrs: Vec<SocketAddr>,
    note: Option<String>,
}

/// How long a replica may take to tell its status.
const STATUS_TIMEOUT: Duration = Duration::from_secs(1);

impl CpuWatch {
    /// Asks every replica for its pid and the leader.
    fn locate(addrs: &[SocketAddr], source: &CpuSource) -> Self {
        let mut watch = CpuWatch { replicas: Vec::new(), leader: 0, addrs: addrs.to_vec(), note: None };
        if let CpuSource::Off(why) = source {
            watch.note = Some(why.clone());
            return watch;
        }
        let statuses = statuses(addrs);
        watch.leader = leader_of(&statuses);
        let mut foreign = Vec::new();
        for (addr, status) in addrs.iter().zip(statuses) {
            let Some(s) = status else { continue };
            if matches!(source, CpuSource::IfLocal) && !is_local_psmr(addr, s.pid) {
                foreign.push(addr.to_string());
                continue;
            }
            let role = if s.id == watch.leader { Role::Leader } else { Role::Follower };
            watch.replicas.push(Watched { id: s.id, addr: *addr, pid: s.pid, role });
        }
        if !foreign.is_empty() {
            watch.note = Some(format!("n/a for {}: not a psmr process of this machine", foreign.join(", ")));
        } else if watch.replicas.is_empty() {
            watch.note = Some("n/a: no replica told its pid".into());
        }
        watch
    }

    /// One reading per watched replica, in order; errors as text.
    fn sample(&self) -> Vec<CpuReading> {
        self.replicas.iter().map(|r| CpuSample::read(r.pid).map_err(|e| e.to_string())).collect()
    }

    /// Each watched replica's CPU over the window and per command.
    fn rows(&self, before: &[CpuReading], after: &[CpuReading], commands: u64) -> Vec<ReplicaCpu> {
        let missing: CpuReading = Err("not read".into());
        self.replicas
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let (b, a) = (before.get(i).unwrap_or(&missing), after.get(i).unwrap_or(&missing));
                ReplicaCpu::measured(r.id, r.addr.to_string(), r.pid, r.role, b, a, commands)
            })
            .collect()
    }

    /// A note when the leader after the window is another than before.
    fn leader_change(&self) -> Option<String> {
        if self.replicas.is_empty() {
            return None;
        }
        let now = leader_of(&statuses(&self.addrs));
        (now != self.leader).then(|| {
            format!(
                "the leader changed during the window (replica {} before, {now} after): roles are those before",
                self.leader
            )
        })
    }
}

/// Every replica's status, `None` for those that do not answer.
fn statuses(addrs: &[SocketAddr]) -> Vec<Option<psmr_model::wire::ReplicaStatus>> {
    let Ok(probe) = Client::new(ClientConfig::new(addrs.to_vec())) else { return vec![None; addrs.len()] };
    addrs.iter().map(|&a| probe.status_of(a, STATUS_TIMEOUT).ok()).collect()
}

/// The leader as the answering replicas see it (the highest term wins);
/// 0 for none.
fn leader_of(statuses: &[Option<psmr_model::wire::ReplicaStatus>]) -> u64 {
    statuses.iter().flatten().filter(|s| s.leader != 0).max_by_key(|s| s.term).map_or(0, |s| s.leader)
}

/// Whether `pid`, reported by the replica at `addr`, is a `psmr` process
/// of this machine: the address is loopback (this host's network) and the
/// process there is named `psmr`.
fn is_local_psmr(addr: &SocketAddr, pid: u32) -> bool {
    addr.ip().is_loopback() && psmr_bench::cpu::comm(pid).is_ok_and(|c| c == "psmr")
}

type Reading = Option<ReplicaStats>;

/// Per replica and thread name (threads of one name summed, then divided
/// by their number): shares of the interval on a CPU and waiting for one.
fn stage_shares(addrs: &[SocketAddr], before: &[Reading], after: &[Reading]) -> Vec<StageRow> {
    let mut out = Vec::new();
    for ((addr, b), a) in addrs.iter().zip(before).zip(after) {
        let (Some(b), Some(a)) = (b, a) else { continue };
        let wall = a.at_ns.saturating_sub(b.at_ns).max(1) as f64;
        let (b, a) = (&b.threads, &a.threads);
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
            let (busy, waiting_cpu) = (busy / n as f64, runq / n as f64);
            let blocked = (1.0 - busy - waiting_cpu).max(0.0);
            out.push(StageRow { replica: addr.to_string(), stage, busy, waiting_cpu, blocked });
        }
    }
    out
}

/// Per replica and worker: what the scheduler's counters say about the
/// window.
fn worker_shares(addrs: &[SocketAddr], before: &[Reading], after: &[Reading]) -> Vec<WorkerRow> {
    let mut out = Vec::new();
    for ((addr, b), a) in addrs.iter().zip(before).zip(after) {
        let (Some(b), Some(a)) = (b, a) else { continue };
        let wall = a.at_ns.saturating_sub(b.at_ns).max(1) as f64;
        for (worker, (wa, wb)) in a.workers.iter().zip(&b.workers).enumerate() {
            let dequeues = wa.dequeues.saturating_sub(wb.dequeues);
            let dequeued = wa.dequeued_commands.saturating_sub(wb.dequeued_commands);
            out.push(WorkerRow {
                replica: addr.to_string(),
                worker,
                sync_idle: wa.sync_idle_ns.saturating_sub(wb.sync_idle_ns) as f64 / wall,
                queue_idle: wa.queue_idle_ns.saturating_sub(wb.queue_idle_ns) as f64 / wall,
                executed: wa.executed.saturating_sub(wb.executed),
                queue_size: if dequeues == 0 { 0.0 } else { dequeued as f64 / dequeues as f64 },
                steals_tried: wa.steals_tried.saturating_sub(wb.steals_tried),
                steals_ok: wa.steals_ok.saturating_sub(wb.steals_ok),
            });
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sized_loads_put_values_of_exactly_their_size() {
        let mut g = Generator::new(&Ops::Kv { keys: 10, write_pct: 100, value_bytes: Some(64) }, 1, 0).unwrap();
        let r = g.request(20);
        assert!(r.kv.iter().all(|op| matches!(op, KvOp::Put { key, value } if *key < 10 && value.len() == 64)));
    }

    #[test]
    fn sized_loads_check_their_value_size() {
        let spec = |value_bytes| LoadSpec {
            clients: 1,
            per_request: 1,
            warmup: Duration::ZERO,
            duration: Duration::from_secs(1),
            ops: Ops::Kv { keys: 10, write_pct: 100, value_bytes: Some(value_bytes) },
            history: None,
            seed: 1,
        };
        assert!(spec(64).validate().is_ok());
        assert!(spec(0).validate().unwrap_err().to_string().contains("value_bytes must be between 1 and 4096"));
        assert!(spec(VALUE_BYTES_MAX + 1).validate().is_err());
    }
}
