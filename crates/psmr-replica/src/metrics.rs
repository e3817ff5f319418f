//! Prometheus metrics of one replica: an HTTP endpoint (`GET /metrics` on
//! the member's `metrics` address) and the client protocol's
//! [`ClientMsg::Metrics`](psmr_model::wire::ClientMsg::Metrics), which
//! `psmr client status` reads; both serve the same text, the OpenMetrics
//! exposition of [`crate::Replica::metrics_text`] (encoded with `prometheus-client`).
//!
//! # What is measured, and where
//!
//! Read when scraped, from the counters the stages keep anyway (nothing is
//! counted twice on the hot path):
//!
//! | metric | type | meaning |
//! | --- | --- | --- |
//! | `psmr_replica_id` | gauge | this replica's id |
//! | `psmr_raft_term` | gauge | current raft term |
//! | `psmr_cpus_usable` | gauge | CPUs this replica can keep busy: the smaller of its affinity mask and its cgroup's CPU quota (rounded up) |
//! | `psmr_cpus_affinity` | gauge | CPUs in its affinity mask |
//! | `psmr_cpu_quota` | gauge | its cgroup's CPU quota in CPUs (v2 `cpu.max`, v1 `cpu.cfs_quota_us`); 0: none |
//! | `psmr_raft_leader` | gauge | the leader this replica knows (0: none) |
//! | `psmr_raft_is_leader` | gauge | 1 while this replica leads |
//! | `psmr_raft_commit_index` | gauge | highest log index known committed (published by the protocol thread after every turn) |
//! | `psmr_raft_applied_index` | gauge | last log index handed to the scheduler |
//! | `psmr_entries_proposed_total` | counter | log entries this replica proposed as leader (`rate()` gives entries per second) |
//! | `psmr_commands_proposed_total` | counter | client commands in those entries (proposals per second) |
//! | `psmr_peer_messages_total` | counter | raft messages received from peers |
//! | `psmr_reply_cache_clients` | gauge | clients the reply cache remembers |
//! | `psmr_reply_cache_seqs` | gauge | sequence numbers it remembers |
//! | `psmr_reply_cache_bytes` | gauge | bytes of outcomes it keeps |
//! | `psmr_client_outbox_bytes` | gauge | bytes of replies waiting for client connections and the Redis gateway's sessions (at most `client_buffer_bytes_max`, and 64 MiB per connection) |
//! | `psmr_client_replies_dropped_total` | counter | replies dropped because their connection's outbox was full; the client (or the gateway) asks for them again |
//! | `psmr_thread_cpu_seconds_total{thread}` | counter | CPU time of the threads of that name (a stage: `psmr-protocol`, `psmr-client-io`, a worker...) |
//! | `psmr_thread_runqueue_seconds_total{thread}` | counter | time those threads were ready to run but waited for a CPU |
//! | `psmr_threads{thread}` | gauge | threads of that name |
//! | `psmr_worker_sync_idle_seconds_total{worker}` | counter | time the worker waited for the other threads of a sequential class |
//! | `psmr_worker_queue_idle_seconds_total{worker}` | counter | time the worker waited for its queue |
//! | `psmr_worker_dequeues_total{worker}` | counter | batches the worker took from its queue |
//! | `psmr_worker_dequeued_commands_total{worker}` | counter | commands in those batches (over dequeues: the queue size) |
//! | `psmr_worker_executed_total{worker}` | counter | commands the worker executed |
//! | `psmr_worker_steals_tried_total{worker}` | counter | steal attempts |
//! | `psmr_worker_steals_total{worker}` | counter | successful steals |
//!
//! The thread metrics come from `/proc/self/task` (`stages`):
//! they cover the whole process, which for a [`crate::LocalCluster`] holds
//! several replicas (and is empty off Linux). The worker metrics exist for
//! the early schedulers only.
//!
//! Recorded where they happen:
//!
//! | metric | type | recorded |
//! | --- | --- | --- |
//! | `psmr_request_latency_seconds` | histogram | the client port (`psmr_transport::client`): from a request frame read to its last reply handed to the socket, or to the refusal or redirect queued for the connection; 50 µs to 10 s |
//! | `psmr_entry_commands` | histogram | protocol thread: commands per entry this replica proposed |
//! | `psmr_entry_bytes` | histogram | protocol thread: bytes per entry this replica proposed |
//! | `psmr_log_sync_seconds` | histogram | disk storage (`psmr_storage::disk`): each synced raft-engine write (a ready's entries and hard state, a leader's snapshot); empty with memory storage |
//! | `psmr_snapshot_seconds` | histogram | taking a snapshot, from the service manager waiting for execution until the snapshot side pool has encoded and written it and handed it to the protocol thread (`_count`: snapshots taken) |
//! | `psmr_snapshot_pause_seconds` | histogram | service manager: execution paused for a snapshot, waiting for what was submitted and copying the state |
//! | `psmr_snapshot_last_bytes` | gauge | size of the last snapshot taken |
//! | `psmr_snapshots_restored_total` | counter | snapshots restored (at start from disk, or from the leader) |
//! | `psmr_snapshot_transfer_bytes_total{direction}` | counter | protocol thread: bytes of snapshot files sent to followers (`sent`, chunks queued on the snapshot lane) and received from the leader (`received`, chunks taken) |
//! | `psmr_snapshot_transfer_refused_total` | counter | protocol thread: snapshot transfer messages refused (a chunk damaged, out of place, or of a snapshot not offered; `psmr_core::transfer`) |
//! | `psmr_scheduler_switch_stall_seconds` | histogram | each change of execution scheduler (`psmr client reconfigure`, or a decision of `auto`): how long execution stalled while the old one drained |
//! | `psmr_scheduler_decisions_total` | counter | decisions of the `auto` scheduler (each one logged with its reason; the last one in `psmr client status`) |
//! | `psmr_read_round_requests` | histogram | protocol thread: read requests per ReadIndex round (served without a log entry) |
//! | `psmr_read_clock_entries_total` | counter | protocol thread: entries of no command the leader proposed so that the reads waiting run at a recent log time (one at most per 100 ms while reads come and nothing is written) |
//! | `psmr_client_refused_total{reason}` | counter | client frames, requests and connections refused, by [`ClientRefusal`] |
//! | `psmr_peer_refused_total{rule}` | counter | raft messages the guard (`psmr_core::guard`) refused, by rule ([`Rule::label`]) |
//! | `psmr_queue_peer_bytes`, `psmr_queue_apply_bytes` | gauge | `psmr_transport::queue`: bytes of peer messages waiting for the protocol thread, and of committed entries waiting for the service manager (each bounded by `queue_bytes_max`) |
//! | `psmr_queue_peer_peak_bytes`, `psmr_queue_apply_peak_bytes` | gauge | the most bytes those queues held at once |
//!
//! Every label takes values from a fixed, small set (thread names, worker
//! ids, reasons, rules): never one per client or per key. Recording costs
//! a few relaxed atomic additions (the histograms are lock-free), once per
//! request, per entry, per sync or per snapshot; nothing per command.
//!
//! Request latency is matched per connection by the client port (see
//! `psmr_transport::metrics`).
//!
//! # HTTP
//!
//! A minimal HTTP/1.x server on the replica's ClientIO runtime ([`serve`]):
//! one request per connection (`Connection: close`), `GET` or `HEAD` of
//! `/metrics` (a query string is ignored); 404 for another path, 405 for
//! another method, 400 for a request line that does not parse (at once
//! when the first bytes cannot start one: a client of another protocol at
//! the wrong port learns so without waiting), 431 for a request head over
//! [`HttpLimits::head_max`]. Each connection has
//! [`HttpLimits::timeout`] for the whole exchange, and at most
//! [`HttpLimits::connections`] are open at once: one more pushes out the
//! connection open longest (a scrape takes milliseconds, so that one is
//! idling), so that idle connections cannot lock a scraper out. Scrapers
//! need nothing more, and hostile input cannot make the replica hold more
//! than that.

use crate::error::ReplicaError;
use crate::handles::{Applied, Counters, Scheduling};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::text::{encode_eof, encode_registry};
use prometheus_client::encoding::{DescriptorEncoder, EncodeCounterValue, EncodeGaugeValue, NoLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};
use psmr_core::config::Member;
use psmr_core::guard::Rule;
use psmr_model::wire::WorkerSample;
use psmr_tls::Stream;
use psmr_transport::client::ClientMetrics;
use psmr_transport::metrics::{ClientRefusal, CounterSet, Histogram};
use psmr_transport::peer::Peers;
use psmr_transport::queue::Meter;
use psmr_transport::router::Router;
use psmr_transport::view::ClusterView;
use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::net::TcpListener;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{oneshot, Semaphore};
use tracing::info;

/// The content type of the metrics text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Distinct thread names reported, at most; the rest are summed as
/// `other`.
const THREAD_NAMES_MAX: usize = 64;

/// The metrics one replica records (see the module documentation); those
/// read at scrape time live in the replica's handles and are gathered when
/// scraped.
pub struct Metrics {
    registry: Registry,
    /// The reply cache's clients, sequence numbers and bytes, once the
    /// service manager has one.
    pub(crate) cache: OnceLock<CacheSizes>,
    /// `psmr_request_latency_seconds` and `psmr_client_refused_total`.
    pub client: ClientMetrics,
    /// `psmr_entry_commands`.
    pub entry_commands: Histogram,
    /// `psmr_entry_bytes`.
    pub entry_bytes: Histogram,
    /// `psmr_log_sync_seconds`.
    pub log_sync: Histogram,
    /// Snapshots taken, restored and transferred.
    pub snapshots: SnapshotMetrics,
    /// `psmr_read_round_requests`.
    pub read_round_requests: Histogram,
    /// `psmr_read_clock_entries_total`.
    pub read_clock_entries: Counter,
    /// `psmr_scheduler_switch_stall_seconds`.
    scheduler_switch: Histogram,
    scheduler_decisions: Counter,
    /// `psmr_peer_refused_total`.
    pub peer_refused: CounterSet,
    /// `psmr_queue_peer_bytes` and `psmr_queue_peer_peak_bytes`.
    pub peer_queue: Meter,
    /// `psmr_queue_apply_bytes` and `psmr_queue_apply_peak_bytes`.
    pub apply_queue: Meter,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Every metric at zero, registered.
    pub fn new() -> Self {
        let request_latency = Histogram::seconds(50_000, 10_000_000_000);
        let entry_commands = Histogram::powers(1, 2, 1 << 16);
        let entry_bytes = Histogram::powers(64, 4, 64 << 20);
        let log_sync = Histogram::seconds(10_000, 10_000_000_000);
        let read_round_requests = Histogram::powers(1, 2, 1 << 16);
        let scheduler_switch = Histogram::seconds(10_000, 10_000_000_000);
        let scheduler_decisions = Counter::default();
        let read_clock_entries = Counter::default();
        let client_refused = CounterSet::new("reason", ClientRefusal::ALL.iter().map(|r| r.label()).collect());
        let peer_refused = CounterSet::new("rule", Rule::ALL.iter().map(|r| r.label()).collect());
        let (peer_queue, apply_queue) = (Meter::default(), Meter::default());
        let mut r = Registry::default();
        let seconds = || Unit::Seconds;
        r.register_with_unit(
            "psmr_request_latency",
            "Client requests, from frame read to last reply written",
            seconds(),
            request_latency.clone(),
        );
        r.register("psmr_entry_commands", "Commands per log entry proposed here", entry_commands.clone());
        r.register_with_unit("psmr_entry", "Size of the log entries proposed here", Unit::Bytes, entry_bytes.clone());
        r.register_with_unit("psmr_log_sync", "Synced writes of the raft log", seconds(), log_sync.clone());
        let snapshots = SnapshotMetrics::registered(&mut r);
        r.register(
            "psmr_read_round_requests",
            "Read requests per ReadIndex round (served without a log entry)",
            read_round_requests.clone(),
        );
        r.register(
            "psmr_read_clock_entries",
            "Entries of no command proposed so that reads run at a recent log time",
            read_clock_entries.clone(),
        );
        r.register_with_unit(
            "psmr_scheduler_switch_stall",
            "Execution stalled by a change of scheduler (psmr client reconfigure, or auto)",
            seconds(),
            scheduler_switch.clone(),
        );
        r.register("psmr_scheduler_decisions", "Decisions of the auto scheduler", scheduler_decisions.clone());
        r.register("psmr_client_refused", "Client frames, requests and connections refused", client_refused.clone());
        r.register("psmr_peer_refused", "Raft messages the guard refused", peer_refused.clone());
        for (name, meter, what) in [
            ("psmr_queue_peer", &peer_queue, "peer messages waiting for the protocol thread"),
            ("psmr_queue_apply", &apply_queue, "committed entries waiting for the service manager"),
        ] {
            r.register_with_unit(name, format!("Bytes of {what}"), Unit::Bytes, meter.used.clone());
            r.register_with_unit(
                format!("{name}_peak"),
                format!("The most bytes of {what} at once"),
                Unit::Bytes,
                meter.peak.clone(),
            );
        }
        Self {
            registry: r,
            cache: OnceLock::new(),
            client: ClientMetrics { refused: client_refused, request_latency },
            entry_commands,
            entry_bytes,
            log_sync,
            snapshots,
            scheduler_decisions,
            read_round_requests,
            read_clock_entries,
            scheduler_switch,
            peer_refused,
            peer_queue,
            apply_queue,
        }
    }

    /// The recorded metrics (without those read at scrape time).
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Records a change of execution scheduler that stalled execution for
    /// `stall`.
    pub(crate) fn scheduler_switched(&self, stall: std::time::Duration) {
        self.scheduler_switch.observe_duration(stall);
    }

    /// Records a decision of `auto` and the stall of its switch.
    pub(crate) fn scheduler_decided(&self, stall: std::time::Duration) {
        self.scheduler_decisions.inc();
        self.scheduler_switched(stall);
    }

    /// Counts a peer message the guard refused.
    pub(crate) fn peer_refused(&self, rule: Rule) {
        self.peer_refused.inc(rule.index());
    }

    /// Records an entry this replica proposed.
    pub(crate) fn entry_proposed(&self, commands: u64, bytes: usize) {
        self.entry_commands.observe(commands);
        self.entry_bytes.observe(bytes as u64);
    }
}

/// The metrics of snapshots: taken, restored, transferred.
#[derive(Clone)]
pub struct SnapshotMetrics {
    /// `psmr_snapshot_seconds`.
    pub time: Histogram,
    /// `psmr_snapshot_pause_seconds`.
    pub pause: Histogram,
    bytes: Gauge,
    restored: Counter,
    /// `psmr_snapshot_transfer_bytes_total`: sent, received.
    transfer_bytes: CounterSet,
    transfer_refused: Counter,
}

impl SnapshotMetrics {
    /// The metrics, registered in `r`.
    fn registered(r: &mut Registry) -> Self {
        let m = Self {
            time: Histogram::seconds(1_000_000, 100_000_000_000),
            pause: Histogram::seconds(10_000, 100_000_000_000),
            bytes: Gauge::default(),
            restored: Counter::default(),
            transfer_bytes: CounterSet::new("direction", vec!["sent", "received"]),
            transfer_refused: Counter::default(),
        };
        r.register_with_unit("psmr_snapshot", "Snapshots taken", Unit::Seconds, m.time.clone());
        let pause = "Execution paused for a snapshot (to finish and copy the state)";
        r.register_with_unit("psmr_snapshot_pause", pause, Unit::Seconds, m.pause.clone());
        r.register_with_unit("psmr_snapshot_last", "Size of the last snapshot", Unit::Bytes, m.bytes.clone());
        r.register("psmr_snapshots_restored", "Snapshots restored", m.restored.clone());
        let transfer = "Bytes of snapshot files sent to followers and received from the leader";
        r.register_with_unit("psmr_snapshot_transfer", transfer, Unit::Bytes, m.transfer_bytes.clone());
        let refused = "Snapshot transfer messages refused (damaged, out of place, not offered)";
        r.register("psmr_snapshot_transfer_refused", refused, m.transfer_refused.clone());
        m
    }

    /// Records a snapshot taken in `took`, of `bytes` bytes.
    pub(crate) fn taken(&self, took: Duration, bytes: u64) {
        self.time.observe_duration(took);
        self.bytes.set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }

    /// Records a snapshot restored.
    pub(crate) fn restored(&self) {
        self.restored.inc();
    }

    /// Counts `bytes` of a snapshot file sent (`true`) or received.
    pub(crate) fn transfer_bytes(&self, sent: bool, bytes: usize) {
        self.transfer_bytes.add(usize::from(!sent), bytes as u64);
    }

    /// Counts a snapshot transfer message refused.
    pub(crate) fn transfer_refused(&self) {
        self.transfer_refused.inc();
    }
}

/// What the metrics read of a running replica when scraped.
#[derive(Clone)]
pub(crate) struct Observed {
    pub(crate) id: u64,
    pub(crate) view: Arc<ClusterView>,
    pub(crate) applied: Arc<Applied>,
    pub(crate) counters: Arc<Counters>,
    pub(crate) peers: Arc<Peers>,
    pub(crate) scheduling: Arc<Scheduling>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) router: Arc<Router>,
}

/// The replica's metrics as OpenMetrics text: those read now from its
/// handles, then those recorded.
pub(crate) fn exposition(o: &Observed) -> String {
    let mut out = String::with_capacity(16 << 10);
    let mut now = Registry::default();
    now.register_collector(Box::new(Sample::of(o)));
    // Writing to a String cannot fail, nor can these encoders otherwise.
    let _ = encode_registry(&mut out, &now);
    let _ = encode_registry(&mut out, &o.metrics.registry);
    let _ = encode_eof(&mut out);
    out
}

/// The threads of one name.
#[derive(Debug, Default)]
struct Threads {
    count: u64,
    cpu_ns: u64,
    runq_ns: u64,
}

/// What [`exposition`] reads from the replica's handles, copied at scrape
/// time.
#[derive(Debug)]
struct Sample {
    id: u64,
    term: u64,
    leader: u64,
    is_leader: bool,
    commit: u64,
    applied: u64,
    entries_proposed: u64,
    commands_proposed: u64,
    peer_in: u64,
    /// Bytes of replies queued for clients, and replies dropped.
    outboxes: (usize, u64),
    /// Clients, sequence numbers and bytes of the reply cache.
    cache: Option<(usize, usize, usize)>,
    workers: Vec<WorkerSample>,
    threads: Vec<(String, Threads)>,
}

/// Reads the reply cache's clients, sequence numbers and bytes.
pub(crate) type CacheSizes = Box<dyn Fn() -> (usize, usize, usize) + Send + Sync>;

impl Sample {
    fn of(o: &Observed) -> Self {
        let c = &o.counters;
        Sample {
            id: o.id,
            term: o.view.term(),
            leader: o.view.leader(),
            is_leader: o.view.is_leader(),
            commit: o.view.commit(),
            applied: o.applied.get(),
            entries_proposed: c.entries_proposed.load(Ordering::Acquire),
            commands_proposed: c.commands_proposed.load(Ordering::Acquire),
            peer_in: o.peers.received.load(Ordering::Acquire),
            outboxes: (o.router.queued_bytes(), o.router.dropped.load(Ordering::Relaxed)),
            cache: o.metrics.cache.get().map(|sizes| sizes()),
            workers: o.scheduling.workers(),
            threads: threads_by_name(),
        }
    }
}

/// The process's threads summed by name (at most [`THREAD_NAMES_MAX`]
/// names), in name order.
fn threads_by_name() -> Vec<(String, Threads)> {
    let mut by_name: std::collections::BTreeMap<String, Threads> = std::collections::BTreeMap::new();
    for t in crate::stages::threads() {
        let name =
            if by_name.len() < THREAD_NAMES_MAX || by_name.contains_key(&t.name) { t.name } else { "other".into() };
        let e = by_name.entry(name).or_default();
        e.count += 1;
        e.cpu_ns += t.cpu_ns;
        e.runq_ns += t.runq_ns;
    }
    by_name.into_iter().collect()
}

fn gauge(e: &mut DescriptorEncoder, name: &str, help: &str, v: impl EncodeGaugeValue) -> fmt::Result {
    e.encode_descriptor(name, help, None, MetricType::Gauge)?.encode_gauge(&v)
}

fn counter(e: &mut DescriptorEncoder, name: &str, help: &str, v: impl EncodeCounterValue) -> fmt::Result {
    e.encode_descriptor(name, help, None, MetricType::Counter)?.encode_counter::<NoLabelSet, _, u64>(&v, None)
}

/// One family: a metric per `(label value, value)` of `rows`.
fn family<V>(
    e: &mut DescriptorEncoder,
    (name, help, unit, kind): (&str, &str, Option<&Unit>, MetricType),
    label: &str,
    rows: impl Iterator<Item = (String, V)>,
) -> fmt::Result
where
    V: EncodeCounterValue + EncodeGaugeValue,
{
    let mut m = e.encode_descriptor(name, help, unit, kind)?;
    for (value, v) in rows {
        let labels = [(label, value.as_str())];
        let mut one = m.encode_family(&labels)?;
        match kind {
            MetricType::Counter => one.encode_counter::<NoLabelSet, _, u64>(&v, None)?,
            _ => one.encode_gauge(&v)?,
        }
    }
    Ok(())
}

/// A per-worker metric: name, help and the field of a [`WorkerSample`].
type WorkerField = (&'static str, &'static str, fn(&WorkerSample) -> u64);

impl Sample {
    fn encode_raft(&self, e: &mut DescriptorEncoder) -> fmt::Result {
        gauge(e, "psmr_replica_id", "This replica's id.", self.id)?;
        gauge(e, "psmr_raft_term", "Current raft term.", self.term)?;
        gauge(e, "psmr_raft_leader", "The leader this replica knows (0: none).", self.leader)?;
        gauge(e, "psmr_raft_is_leader", "1 while this replica leads.", u64::from(self.is_leader))?;
        gauge(e, "psmr_raft_commit_index", "Highest log index known committed.", self.commit)?;
        gauge(e, "psmr_raft_applied_index", "Last log index handed to the scheduler.", self.applied)?;
        counter(e, "psmr_entries_proposed", "Log entries proposed as leader.", self.entries_proposed)?;
        counter(e, "psmr_commands_proposed", "Client commands in the entries proposed.", self.commands_proposed)?;
        counter(e, "psmr_peer_messages", "Raft messages received from peers.", self.peer_in)?;
        // Read when scraped: a container's quota can change under it.
        let cpus = psmr_sched::cpus::Cpus::read();
        gauge(e, "psmr_cpus_usable", "CPUs this replica can keep busy: affinity and quota.", cpus.usable as u64)?;
        gauge(e, "psmr_cpus_affinity", "CPUs in this replica's affinity mask.", cpus.affinity as u64)?;
        gauge(e, "psmr_cpu_quota", "This replica's cgroup CPU quota in CPUs (0: none).", cpus.quota.unwrap_or(0.0))
    }

    fn encode_cache(&self, e: &mut DescriptorEncoder) -> fmt::Result {
        let Some((clients, seqs, bytes)) = self.cache else { return Ok(()) };
        gauge(e, "psmr_reply_cache_clients", "Clients the reply cache remembers.", clients)?;
        gauge(e, "psmr_reply_cache_seqs", "Sequence numbers the reply cache remembers.", seqs)?;
        gauge(e, "psmr_reply_cache_bytes", "Bytes of outcomes the reply cache keeps.", bytes)
    }

    fn encode_outboxes(&self, e: &mut DescriptorEncoder) -> fmt::Result {
        let (bytes, dropped) = self.outboxes;
        gauge(e, "psmr_client_outbox_bytes", "Bytes of replies waiting for client connections and sessions.", bytes)?;
        let help = "Replies dropped because their connection's outbox was full (asked for again).";
        counter(e, "psmr_client_replies_dropped", help, dropped)
    }

    fn encode_threads(&self, e: &mut DescriptorEncoder) -> fmt::Result {
        let rows = |f: fn(&Threads) -> u64| self.threads.iter().map(move |(n, t)| (n.clone(), f(t) as f64 / 1e9));
        let help = "CPU time of the threads of this name.";
        let spec = ("psmr_thread_cpu", help, Some(&Unit::Seconds), MetricType::Counter);
        family(e, spec, "thread", rows(|t| t.cpu_ns))?;
        let help = "Time the threads of this name waited for a CPU.";
        let spec = ("psmr_thread_runqueue", help, Some(&Unit::Seconds), MetricType::Counter);
        family(e, spec, "thread", rows(|t| t.runq_ns))?;
        let spec = ("psmr_threads", "Threads of this name.", None, MetricType::Gauge);
        family(e, spec, "thread", self.threads.iter().map(|(n, t)| (n.clone(), t.count)))
    }

    fn encode_workers(&self, e: &mut DescriptorEncoder) -> fmt::Result {
        if self.workers.is_empty() {
            return Ok(());
        }
        let seconds: [WorkerField; 2] = [
            ("psmr_worker_sync_idle", "Time waiting for the other threads of a sequential class.", |w| w.sync_idle_ns),
            ("psmr_worker_queue_idle", "Time waiting for the queue.", |w| w.queue_idle_ns),
        ];
        for (name, help, f) in seconds {
            let rows = self.workers.iter().enumerate().map(|(i, w)| (i.to_string(), f(w) as f64 / 1e9));
            family(e, (name, help, Some(&Unit::Seconds), MetricType::Counter), "worker", rows)?;
        }
        let counts: [WorkerField; 5] = [
            ("psmr_worker_dequeues", "Batches taken from the queue.", |w| w.dequeues),
            ("psmr_worker_dequeued_commands", "Commands in the batches taken.", |w| w.dequeued_commands),
            ("psmr_worker_executed", "Commands executed.", |w| w.executed),
            ("psmr_worker_steals_tried", "Steal attempts.", |w| w.steals_tried),
            ("psmr_worker_steals", "Successful steals.", |w| w.steals_ok),
        ];
        for (name, help, f) in counts {
            let rows = self.workers.iter().enumerate().map(|(i, w)| (i.to_string(), f(w)));
            family(e, (name, help, None, MetricType::Counter), "worker", rows)?;
        }
        Ok(())
    }
}

impl Collector for Sample {
    fn encode(&self, mut e: DescriptorEncoder) -> fmt::Result {
        self.encode_raft(&mut e)?;
        self.encode_cache(&mut e)?;
        self.encode_outboxes(&mut e)?;
        self.encode_threads(&mut e)?;
        self.encode_workers(&mut e)
    }
}

// ---------------------------------------------------------------------------
// HTTP.

/// Bounds of the HTTP endpoint.
#[derive(Clone, Copy, Debug)]
pub struct HttpLimits {
    /// Bytes of request line and headers, at most.
    pub head_max: usize,
    /// Longest a connection may take, from accept to the response sent.
    pub timeout: Duration,
    /// Connections open at once; one more pushes out the oldest.
    pub connections: usize,
}

impl Default for HttpLimits {
    fn default() -> Self {
        Self { head_max: 8 << 10, timeout: Duration::from_secs(5), connections: 64 }
    }
}

/// Bytes of a request body (or of a head past the limit) read and
/// discarded after the response, so that closing does not reset the
/// connection before the client has read the response.
const DRAIN_MAX: usize = 64 << 10;

/// Renders the response body of `/metrics`.
pub type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// The metrics listener of replica `me`: `given` (bound by the caller),
/// else one bound on the configured address, else none.
pub(crate) fn listener(given: Option<TcpListener>, me: &Member) -> Result<Option<TcpListener>, ReplicaError> {
    match (given, me.metrics) {
        (Some(l), _) => Ok(Some(l)),
        (None, Some(addr)) => crate::start::bind(addr).map(Some),
        (None, None) => Ok(None),
    }
}

/// Serves `/metrics` on `listener` (if any) on the current runtime until
/// the replica of `h` stops, in TLS if `[client_tls]` lists `metrics`.
pub(crate) fn spawn(
    runtime: &tokio::runtime::Runtime,
    h: &crate::start::Handles,
    listener: Option<TcpListener>,
) -> std::io::Result<()> {
    let Some(listener) = listener else { return Ok(()) };
    listener.set_nonblocking(true)?;
    let listener = {
        let _guard = runtime.enter();
        tokio::net::TcpListener::from_std(listener)?
    };
    let addr = listener.local_addr()?;
    let o = h.observed();
    let render: Render = Arc::new(move || exposition(&o));
    let life = h.life.clone();
    let counted = h.metrics.client.clone();
    let failed: Failed = Arc::new(move || counted.refused(ClientRefusal::Handshake));
    let tls = h.tls_for(psmr_core::config::FacingPort::Metrics).map(|t| (t, failed));
    let scheme = if tls.is_some() { "https" } else { "http" };
    runtime.spawn(serve(listener, HttpLimits::default(), tls, render, async move { life.stopped().await }));
    info!(id = h.id, "metrics at {scheme}://{addr}/metrics");
    Ok(())
}

/// Told of every TLS handshake that fails or runs out of time.
pub type Failed = Arc<dyn Fn() + Send + Sync>;

/// Serves HTTP on `listener` within `limits` until `stop` completes.
/// With `tls`, every connection is in TLS (HTTPS), its handshake within
/// the connection's time.
pub async fn serve(
    listener: tokio::net::TcpListener,
    limits: HttpLimits,
    tls: Option<(psmr_tls::Acceptor, Failed)>,
    render: Render,
    stop: impl Future<Output = ()>,
) {
    let permits = Arc::new(Semaphore::new(limits.connections.clamp(1, Semaphore::MAX_PERMITS)));
    // Open connections in the order they came, each with what ends it.
    let live: Arc<Mutex<BTreeMap<u64, oneshot::Sender<()>>>> = Arc::default();
    tokio::pin!(stop);
    for id in 0u64.. {
        let stream = tokio::select! {
            r = listener.accept() => match r {
                Ok((s, _)) => s,
                Err(e) => {
                    tracing::debug!("metrics accept failed: {e}");
                    // Out of descriptors, most likely: let some close.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
            _ = &mut stop => return,
        };
        let permit = match permits.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                // At the limit the connection open longest goes: a scrape
                // takes milliseconds, so that is one idling, and a scraper
                // always gets in however many idle connections there are.
                let oldest = live.lock().unwrap_or_else(|p| p.into_inner()).pop_first();
                if let Some((_, end)) = oldest {
                    let _ = end.send(());
                }
                let Ok(p) = permits.clone().acquire_owned().await else { return };
                p
            }
        };
        let (end, ended) = oneshot::channel();
        live.lock().unwrap_or_else(|p| p.into_inner()).insert(id, end);
        let (render, live, tls) = (render.clone(), live.clone(), tls.clone());
        tokio::spawn(async move {
            let mut open = None;
            let served = async {
                let stream = open.insert(secure(stream, tls).await?);
                exchange(stream, &limits, &render).await
            };
            tokio::select! {
                _ = tokio::time::timeout(limits.timeout, served) => {}
                _ = ended => {}
            }
            live.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
            // The slot is free before the client sees the connection end.
            drop(permit);
            drop(open);
        });
    }
}

/// `stream` in TLS if `tls` says so; a failed handshake is counted.
async fn secure(stream: TcpStream, tls: Option<(psmr_tls::Acceptor, Failed)>) -> std::io::Result<Stream> {
    let Some((tls, failed)) = tls else { return Ok(Stream::Plain(stream)) };
    match tls.accept(stream).await {
        Ok((stream, _)) => Ok(stream),
        Err(e) => {
            failed();
            tracing::debug!("metrics connection: {e}");
            Err(std::io::Error::new(std::io::ErrorKind::ConnectionAborted, e))
        }
    }
}

/// What the head of a request came to.
enum Head {
    /// The request line and headers (without the blank line).
    Complete(Vec<u8>),
    /// Longer than the limit.
    TooLarge,
    /// Its first bytes cannot start an HTTP request (another protocol's
    /// client at the wrong port): answered at once, not at the timeout.
    NotHttp,
    /// The client closed first.
    Closed,
}

async fn read_head(stream: &mut Stream, max: usize) -> std::io::Result<Head> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(Head::Closed);
        }
        let from = buf.len().saturating_sub(3);
        buf.extend_from_slice(&chunk[..n]);
        if !may_be_http(&buf) {
            return Ok(Head::NotHttp);
        }
        if let Some(end) = find_blank_line(&buf[from..]) {
            buf.truncate(from + end);
            return Ok(Head::Complete(buf));
        }
        if buf.len() > max {
            return Ok(Head::TooLarge);
        }
    }
}

/// Whether `start` may begin an HTTP request: a method of upper-case
/// letters (at most 16), then a space.
fn may_be_http(start: &[u8]) -> bool {
    let method = start.iter().take(17).position(|&b| !b.is_ascii_uppercase());
    match method {
        None => start.len() <= 16,
        Some(i) => i > 0 && start[i] == b' ',
    }
}

/// Where the blank line ending a head starts (`\r\n\r\n`, or `\n\n`).
fn find_blank_line(b: &[u8]) -> Option<usize> {
    let crlf = b.windows(4).position(|w| w == b"\r\n\r\n");
    let lf = b.windows(2).position(|w| w == b"\n\n");
    match (crlf, lf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// A response: status, content type and body; whether the body is sent
/// (not for `HEAD`).
struct Response {
    status: u16,
    reason: &'static str,
    content_type: &'static str,
    body: String,
    send_body: bool,
}

impl Response {
    fn text(status: u16, reason: &'static str, body: &str) -> Self {
        let body = format!("{body}\n");
        Self { status, reason, content_type: "text/plain; charset=utf-8", body, send_body: true }
    }

    fn bytes(&self) -> Vec<u8> {
        let allow = if self.status == 405 { "Allow: GET, HEAD\r\n" } else { "" };
        let head = format!(
            "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\n{allow}Connection: close\r\n\r\n",
            self.status,
            self.reason,
            self.content_type,
            self.body.len()
        );
        let mut out = head.into_bytes();
        if self.send_body {
            out.extend_from_slice(self.body.as_bytes());
        }
        out
    }
}

/// The response to a request whose head is `head`.
fn route(head: &[u8], render: &Render) -> Response {
    let line_end = head.iter().position(|&b| b == b'\n').unwrap_or(head.len());
    let line = head[..line_end].strip_suffix(b"\r").unwrap_or(&head[..line_end]);
    let Ok(line) = std::str::from_utf8(line) else { return Response::text(400, "Bad Request", "bad request line") };
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) = (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Response::text(400, "Bad Request", "bad request line");
    };
    if !version.starts_with("HTTP/1.") || method.is_empty() || !target.starts_with('/') {
        return Response::text(400, "Bad Request", "bad request line");
    }
    let head_only = match method {
        "GET" => false,
        "HEAD" => true,
        _ => return Response::text(405, "Method Not Allowed", "only GET and HEAD"),
    };
    let path = target.split('?').next().unwrap_or(target);
    if path != "/metrics" {
        return Response::text(404, "Not Found", "metrics are at /metrics");
    }
    Response { status: 200, reason: "OK", content_type: CONTENT_TYPE, body: render(), send_body: !head_only }
}

/// One request and its response on `stream`.
async fn exchange(stream: &mut Stream, limits: &HttpLimits, render: &Render) -> std::io::Result<()> {
    let response = match read_head(stream, limits.head_max).await? {
        Head::Complete(head) => route(&head, render),
        Head::TooLarge => Response::text(431, "Request Header Fields Too Large", "request head too large"),
        Head::NotHttp => Response::text(400, "Bad Request", "not HTTP: this is a replica's metrics port"),
        Head::Closed => return Ok(()),
    };
    stream.write_all(&response.bytes()).await?;
    stream.shutdown().await?;
    let mut sink = [0u8; 1024];
    let mut drained = 0;
    while drained < DRAIN_MAX {
        match stream.read(&mut sink).await? {
            0 => break,
            n => drained += n,
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Reading the text back (for `psmr client status` and tests).

/// One sample of an exposition: name, labels and value.
#[derive(Clone, Debug, PartialEq)]
pub struct Line {
    /// The sample's name (with its `_total`, `_bucket`... suffix).
    pub name: String,
    /// Its labels, in order.
    pub labels: Vec<(String, String)>,
    /// Its value.
    pub value: f64,
}

/// The samples of an exposition, read leniently: a line that does not
/// parse is skipped.
#[derive(Clone, Debug, Default)]
pub struct Scrape {
    /// The samples, in order.
    pub lines: Vec<Line>,
}

impl Scrape {
    /// Reads `text`.
    pub fn parse(text: &str) -> Self {
        Self { lines: text.lines().filter(|l| !l.starts_with('#')).filter_map(parse_line).collect() }
    }

    /// The value of the sample `name` whose labels include `labels`.
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.lines.iter().find(|l| l.name == name && has_labels(l, labels)).map(|l| l.value)
    }

    /// The value of the sample `name` (the first, whatever its labels).
    pub fn value(&self, name: &str) -> Option<f64> {
        self.get(name, &[])
    }

    /// The sum of every sample named `name`.
    pub fn sum(&self, name: &str) -> f64 {
        self.lines.iter().filter(|l| l.name == name).map(|l| l.value).sum()
    }

    /// The `q` quantile (0 to 1) of histogram `name` estimated from its
    /// buckets, as Prometheus's `histogram_quantile` does: linear within
    /// the bucket; the highest finite bound if it falls in the +Inf one.
    /// None without observations.
    pub fn quantile(&self, name: &str, q: f64) -> Option<f64> {
        let bucket = format!("{name}_bucket");
        let mut buckets: Vec<(f64, f64)> = self
            .lines
            .iter()
            .filter(|l| l.name == bucket)
            .filter_map(|l| {
                let le = l.labels.iter().find(|(k, _)| k == "le")?;
                let bound = if le.1 == "+Inf" { f64::INFINITY } else { le.1.parse().ok()? };
                Some((bound, l.value))
            })
            .collect();
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        let total = buckets.last()?.1;
        if total <= 0.0 {
            return None;
        }
        let rank = q.clamp(0.0, 1.0) * total;
        let (mut lower, mut below) = (0.0, 0.0);
        for &(bound, cumulative) in &buckets {
            if cumulative >= rank && cumulative > below {
                if bound.is_infinite() {
                    return Some(lower);
                }
                return Some(lower + (bound - lower) * (rank - below) / (cumulative - below));
            }
            (lower, below) = (if bound.is_finite() { bound } else { lower }, cumulative);
        }
        Some(lower)
    }
}

fn has_labels(l: &Line, want: &[(&str, &str)]) -> bool {
    want.iter().all(|(k, v)| l.labels.iter().any(|(lk, lv)| lk == k && lv == v))
}

/// `name{k="v",...} value [timestamp]`, or `name value`.
fn parse_line(line: &str) -> Option<Line> {
    let line = line.trim();
    let name_end = line.find(['{', ' '])?;
    let name = line[..name_end].to_string();
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(inner) = rest.strip_prefix('{') {
        let (parsed, after) = parse_labels(inner)?;
        labels = parsed;
        rest = after;
    }
    let value = rest.split_whitespace().next()?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    Some(Line { name, labels, value })
}

/// Labels up to the closing brace, and what follows it.
fn parse_labels(mut s: &str) -> Option<(Vec<(String, String)>, &str)> {
    let mut labels = Vec::new();
    loop {
        s = s.trim_start_matches(',');
        if let Some(after) = s.strip_prefix('}') {
            return Some((labels, after));
        }
        let eq = s.find('=')?;
        let key = s[..eq].trim().to_string();
        s = s[eq + 1..].strip_prefix('"')?;
        let mut value = String::new();
        let mut chars = s.char_indices();
        let end = loop {
            match chars.next()? {
                (i, '"') => break i,
                (_, '\\') => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    c => value.push(c),
                },
                (_, c) => value.push(c),
            }
        };
        labels.push((key, value));
        s = &s[end + 1..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use psmr_core::config::Config;
    use psmr_model::wire::WireError;
    use psmr_transport::life::Life;

    fn observed() -> Observed {
        let config = Arc::new(Config::default());
        let view = Arc::new(ClusterView::new(7, config.replicas.clone(), false));
        let life = Arc::new(Life::new(7));
        Observed {
            id: 7,
            peers: Arc::new(Peers::new(7, 1, config, life, view.clone())),
            view,
            applied: Arc::default(),
            counters: Arc::default(),
            scheduling: Arc::default(),
            metrics: Arc::default(),
            router: Arc::new(Router::new(1 << 20)),
        }
    }

    #[test]
    fn the_exposition_names_every_metric_with_its_labels() {
        let s = observed();
        let view = psmr_core::protocol::View {
            leader: 0,
            term: 3,
            role: raft::StateRole::Follower,
            commit: 11,
            last_index: 11,
            repaired: false,
        };
        s.view.publish(&view);
        s.metrics.client.request_latency.observe(70_000);
        s.metrics.client.request_latency.observe(3_000_000);
        s.metrics.entry_proposed(5, 300);
        s.metrics.client.refused(ClientRefusal::NotLeader);
        s.metrics.peer_refused(Rule::Commit);
        for e in [WireError::TooLarge { len: 9, max: 1 }, WireError::Closed] {
            if let Some(why) = ClientRefusal::of(&e) {
                s.metrics.client.refused(why);
            }
        }
        let text = exposition(&s);
        assert!(text.ends_with("# EOF\n"), "{text}");
        for name in [
            "psmr_replica_id 7",
            "psmr_raft_term 3",
            "psmr_cpus_usable ",
            "psmr_cpu_quota ",
            "psmr_raft_commit_index 11",
            "psmr_raft_applied_index 0",
            "psmr_entries_proposed_total 0",
            "psmr_request_latency_seconds_count 2",
            "psmr_request_latency_seconds_bucket{le=\"+Inf\"} 2",
            "psmr_entry_commands_count 1",
            "psmr_entry_bytes_sum 300.0",
            "psmr_log_sync_seconds_count 0",
            "psmr_snapshot_seconds_count 0",
            "psmr_client_refused_total{reason=\"not_leader\"} 1",
            "psmr_client_refused_total{reason=\"frame_too_large\"} 1",
            "psmr_client_refused_total{reason=\"connection_limit\"} 0",
            "psmr_peer_refused_total{rule=\"commit\"} 1",
            "psmr_peer_refused_total{rule=\"vote_floor\"} 0",
            "# TYPE psmr_request_latency_seconds histogram",
            "# UNIT psmr_request_latency_seconds seconds",
        ] {
            assert!(text.contains(name), "{name} missing from:\n{text}");
        }
        if cfg!(target_os = "linux") {
            assert!(text.contains("psmr_thread_cpu_seconds_total{thread="), "{text}");
        }
        assert_eq!(s.metrics.client.refused.get("frame_too_large"), 1);
        assert_eq!(s.metrics.client.refused.get("no such reason"), 0);
        let scrape = Scrape::parse(&text);
        assert_eq!(scrape.value("psmr_raft_term"), Some(3.0));
        assert_eq!(scrape.get("psmr_client_refused_total", &[("reason", "not_leader")]), Some(1.0));
        assert_eq!(scrape.sum("psmr_client_refused_total"), 2.0);
        // Two observations, one at 70 µs and one at 3 ms: the median is in
        // the bucket (50 µs, 100 µs], the maximum in (2.5 ms, 5 ms].
        let p50 = scrape.quantile("psmr_request_latency_seconds", 0.5).unwrap();
        assert!((50e-6..=100e-6).contains(&p50), "{p50}");
        let p99 = scrape.quantile("psmr_request_latency_seconds", 0.99).unwrap();
        assert!((2.5e-3..=5e-3).contains(&p99), "{p99}");
        assert_eq!(scrape.quantile("psmr_log_sync_seconds", 0.5), None);
    }

    #[test]
    fn workers_and_the_reply_cache_appear_once_there() {
        let s = observed();
        let _ = s.metrics.cache.set(Box::new(|| (1, 1, 0)));
        let text = exposition(&s);
        assert!(text.contains("psmr_reply_cache_clients 1"), "{text}");
        assert!(text.contains("psmr_reply_cache_seqs 1"), "{text}");
        assert!(!text.contains("psmr_worker_executed"), "no scheduler metrics yet: {text}");
    }

    #[test]
    fn every_rule_and_reason_has_its_own_counter() {
        for (i, r) in Rule::ALL.iter().enumerate() {
            assert_eq!(r.index(), i, "{r:?} out of order in Rule::ALL");
        }
        for (i, r) in ClientRefusal::ALL.iter().enumerate() {
            assert_eq!(r.index(), i, "{r:?} out of order in ClientRefusal::ALL");
        }
        let labels: std::collections::HashSet<_> = Rule::ALL.iter().map(|r| r.label()).collect();
        assert_eq!(labels.len(), Rule::ALL.len());
        let labels: std::collections::HashSet<_> = ClientRefusal::ALL.iter().map(|r| r.label()).collect();
        assert_eq!(labels.len(), ClientRefusal::ALL.len());
    }

    // --- HTTP ---------------------------------------------------------

    async fn server(limits: HttpLimits) -> (std::net::SocketAddr, tokio::sync::oneshot::Sender<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let render: Render = Arc::new(|| "psmr_raft_term 1\n# EOF\n".to_string());
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(serve(listener, limits, None, render, async move {
            let _ = rx.await;
        }));
        (addr, tx)
    }

    /// Sends `request`, closes the sending side, and reads until the
    /// server closes: what it answered (empty if it closed without
    /// answering; a reset counts as a close).
    async fn ask(addr: std::net::SocketAddr, request: &[u8]) -> String {
        let mut s = TcpStream::connect(addr).await.unwrap();
        let _ = s.write_all(request).await;
        let _ = s.shutdown().await;
        read_all(&mut s).await
    }

    async fn read_all(s: &mut TcpStream) -> String {
        let mut out = Vec::new();
        let read = s.read_to_end(&mut out);
        // Fails the test rather than hanging it if the server never closes.
        let _ = tokio::time::timeout(Duration::from_secs(30), read).await.expect("the server closes");
        String::from_utf8_lossy(&out).into_owned()
    }

    #[tokio::test]
    async fn http_answers_metrics_and_refuses_everything_else() {
        let (addr, _stop) = server(HttpLimits::default()).await;
        let ok = ask(addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
        assert!(ok.contains(&format!("Content-Type: {CONTENT_TYPE}\r\n")), "{ok}");
        assert!(ok.ends_with("\r\n\r\npsmr_raft_term 1\n# EOF\n"), "{ok}");
        let query = ask(addr, b"GET /metrics?x=1 HTTP/1.0\n\n").await;
        assert!(query.starts_with("HTTP/1.1 200 OK\r\n"), "{query}");
        let head = ask(addr, b"HEAD /metrics HTTP/1.1\r\n\r\n").await;
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n") && head.ends_with("\r\n\r\n"), "{head}");
        let cases: [(&[u8], &str); 8] = [
            (b"GET / HTTP/1.1\r\n\r\n", "HTTP/1.1 404 "),
            (b"GET /metricsx HTTP/1.1\r\n\r\n", "HTTP/1.1 404 "),
            (b"POST /metrics HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc", "HTTP/1.1 405 "),
            (b"\x00\x01\xff garbage\r\n\r\n", "HTTP/1.1 400 "),
            // Not HTTP, and no blank line ever: answered at once.
            (b"\x00\x00\x00\x0a\x05\x01", "HTTP/1.1 400 "),
            (b"*1\r\n$4\r\nPING\r\n", "HTTP/1.1 400 "),
            (b"GET /metrics SMTP/1.0\r\n\r\n", "HTTP/1.1 400 "),
            (b"GET  /metrics HTTP/1.1 extra\r\n\r\n", "HTTP/1.1 400 "),
        ];
        for (request, want) in cases {
            let got = ask(addr, request).await;
            assert!(got.starts_with(want), "{:?}: {got}", String::from_utf8_lossy(request));
        }
        assert!(ask(addr, b"POST /metrics HTTP/1.1\r\n\r\n").await.contains("Allow: GET, HEAD\r\n"));
        // A client that closes before finishing its head gets nothing.
        assert_eq!(ask(addr, b"GET /metr").await, "");
    }

    #[tokio::test]
    async fn http_bounds_the_head() {
        let (addr, _stop) = server(HttpLimits { head_max: 1024, ..HttpLimits::default() }).await;
        let big = format!("GET /metrics HTTP/1.1\r\nX-Pad: {}\r\n\r\n", "a".repeat(4096));
        let got = ask(addr, big.as_bytes()).await;
        assert!(got.starts_with("HTTP/1.1 431 "), "{got}");
        // An endless request line: refused at the bound too.
        let endless = format!("GET /{}", "x".repeat(3000));
        let got = ask(addr, endless.as_bytes()).await;
        assert!(got.starts_with("HTTP/1.1 431 "), "{got}");
        // Endless bytes that cannot be HTTP: refused at once.
        let got = ask(addr, &[b'x'; 3000]).await;
        assert!(got.starts_with("HTTP/1.1 400 "), "{got}");
    }

    #[tokio::test]
    async fn http_bounds_the_time_and_the_connections() {
        let limits = HttpLimits { timeout: Duration::from_millis(200), connections: 1, ..HttpLimits::default() };
        let (addr, _stop) = server(limits).await;
        // Slowloris: half a request line, then nothing. The server gives
        // up after its timeout, unanswered.
        let mut slow = TcpStream::connect(addr).await.unwrap();
        slow.write_all(b"GET /metr").await.unwrap();
        assert_eq!(read_all(&mut slow).await, "", "closed at the timeout, unanswered");
        // It holds the one slot allowed; a scraper pushes it out and gets
        // its answer.
        let mut slow = TcpStream::connect(addr).await.unwrap();
        slow.write_all(b"GET /metr").await.unwrap();
        let ok = ask(addr, b"GET /metrics HTTP/1.1\r\n\r\n").await;
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
        assert_eq!(read_all(&mut slow).await, "", "pushed out, unanswered");
        // Many idle connections at once: the last scraper still gets in.
        let limits = HttpLimits { connections: 4, ..HttpLimits::default() };
        let (addr, _stop) = server(limits).await;
        let mut idle = Vec::new();
        for _ in 0..50 {
            idle.push(TcpStream::connect(addr).await.unwrap());
        }
        let ok = ask(addr, b"GET /metrics HTTP/1.1\r\n\r\n").await;
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
    }

    proptest::proptest! {
        /// Any head at all: a response, never a panic.
        #[test]
        fn any_head_gets_a_response(head in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300)) {
            let render: Render = Arc::new(String::new);
            let r = route(&head, &render);
            proptest::prop_assert!([200, 400, 404, 405].contains(&r.status));
        }

        /// Any text at all: read leniently, never a panic.
        #[test]
        fn any_text_parses(text in "[a-z_{}=\",\\\\ .0-9+Inf#\n-]{0,200}") {
            let s = Scrape::parse(&text);
            let _ = s.quantile("a", 0.5);
        }
    }
}
