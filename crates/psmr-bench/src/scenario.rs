//! Named end-to-end scenarios of `psmr bench` and the sweeps over their
//! parameters.
//!
//! A scenario is a base set of [`Params`] (cluster and load) plus sweeps:
//! each sweep names a parameter and its values, and the scenario runs once
//! per point of their cartesian product. `psmr bench --sweep KEY=V1,V2`
//! replaces a scenario's sweep over KEY or adds one.

use std::fmt;
use thiserror::Error;

/// Most points one invocation runs (each starts a cluster).
pub const POINTS_MAX: usize = 256;

/// Bad scenario names, sweeps and parameter values.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ScenarioError {
    /// No scenario has that name.
    #[error("unknown scenario {name:?} (known: {known}; `psmr bench --list` describes them)")]
    Unknown {
        /// The name given.
        name: String,
        /// The names there are.
        known: String,
    },
    /// A sweep is not `KEY=V1,V2,...`.
    #[error("malformed sweep {0:?}: expected KEY=V1,V2,... such as workers=1,2,4")]
    SweepFormat(String),
    /// A sweep or parameter names no parameter.
    #[error("unknown parameter {key:?} (known: {known})")]
    UnknownKey {
        /// The key given.
        key: String,
        /// The keys there are.
        known: String,
    },
    /// A value does not parse or is out of range.
    #[error("bad value {value:?} for {key}: {why}")]
    BadValue {
        /// The parameter.
        key: String,
        /// The value given.
        value: String,
        /// What is expected.
        why: String,
    },
    /// The same parameter is swept twice.
    #[error("{0} is swept twice")]
    DuplicateSweep(String),
    /// The sweeps multiply to too many points.
    #[error("the sweeps make {got} points, more than {max}", max = POINTS_MAX)]
    TooManyPoints {
        /// Points the sweeps make.
        got: usize,
    },
}

/// Every parameter of one end-to-end run: the cluster and the load.
#[derive(Clone, Debug, PartialEq)]
pub struct Params {
    /// `kv` or `list`.
    pub service: String,
    /// Class model (kv: readers-writers, sharded; list: readers-writers,
    /// sharded-snapshot, sharded-global).
    pub model: String,
    /// Shards of the list or of the kv key space.
    pub shards: usize,
    /// Execution cost: light, moderate, heavy.
    pub cost: String,
    /// List: the α-β-γ workload (kv: `write_pct` instead).
    pub workload: String,
    /// Share of local operations sent to the first shard (0: balanced).
    /// Set as `R/W` it also sets `write_skew` (reads R, writes W).
    pub skew: f64,
    /// Share of local writes sent to the first shard, when it differs
    /// from `skew` (`none`: the same).
    pub write_skew: Option<f64>,
    /// Early schedulers: `default`, `optimal`, `optimal:total`, `naive`
    /// (for the workload's class frequencies) or a spec.
    pub mapping: String,
    /// Replicas (2f+1).
    pub replicas: u64,
    /// Execution scheduler of every replica.
    pub scheduler: String,
    /// Worker threads per replica.
    pub workers: usize,
    /// `memory` or `disk`.
    pub storage: String,
    /// ClientIO threads per replica.
    pub client_io_threads: usize,
    /// Most commands in one log entry (the batch the late schedulers
    /// analyze as one unit).
    pub batch_max_commands: usize,
    /// Longest a request waits for its log entry to fill while earlier
    /// entries are in flight, µs.
    pub batch_delay_us: u64,
    /// Log entries in flight.
    pub pipeline: usize,
    /// Every this many log entries each replica snapshots its state and
    /// compacts its log.
    pub snapshot_every: u64,
    /// Replicas without peer authentication (plain TCP) instead of mutual
    /// TLS: for measuring what TLS costs.
    pub insecure_peers: bool,
    /// How clients say who they are: `none` (`insecure_clients`) or
    /// `password` (the cluster's users; the load runs as its data user).
    pub auth: String,
    /// TLS on the ports clients reach (`[client_tls]` with the replicas'
    /// certificates; the load checks them against the cluster's CA): for
    /// measuring what client TLS costs.
    pub client_tls: bool,
    /// How read-only requests are served: `index` (the leader, with raft's
    /// ReadIndex, no log entry) or `log` (a log entry like writes).
    pub reads: String,
    /// Closed-loop clients.
    pub clients: usize,
    /// Commands per client request.
    pub per_request: usize,
    /// Percentage of writes.
    pub write_pct: u8,
    /// Keys the load touches.
    pub keys: u64,
    /// Bytes of every value a kv put writes (the load's random number in
    /// decimal, padded with zeros); `None` (`decimal`): the number as it
    /// is, 1 to 20 bytes.
    pub value_bytes: Option<usize>,
    /// Warm-up, seconds.
    pub warmup_s: f64,
    /// Measured time, seconds.
    pub duration_s: f64,
    /// How the workload shifts during the measured window: the later
    /// phases, each a `+`-joined list of workload settings (`workload`,
    /// `skew`, `write_skew`, `write_pct`, `keys`, `value_bytes`) applied to
    /// the point's own, phases separated by `;`. The window is cut into
    /// equal parts, the first (and the warm-up) running the point's own
    /// workload. Empty (`none`): one phase.
    pub phases: Vec<String>,
}

/// `value` if it is one of `choices`, else why not.
fn one_of(key: &str, value: &str, choices: &[&str]) -> Result<String, ScenarioError> {
    match choices.iter().find(|c| **c == value.trim()) {
        Some(c) => Ok(c.to_string()),
        None => {
            let why = match choices {
                [.., last] if choices.len() > 1 => format!("{} or {last}", choices[..choices.len() - 1].join(", ")),
                _ => choices.join(""),
            };
            Err(ScenarioError::BadValue { key: key.into(), value: value.into(), why })
        }
    }
}

impl Default for Params {
    fn default() -> Self {
        Self {
            service: "kv".into(),
            model: "readers-writers".into(),
            shards: 1,
            cost: "light".into(),
            workload: "0-0-0".into(),
            skew: 0.0,
            write_skew: None,
            mapping: "default".into(),
            replicas: 3,
            scheduler: "early".into(),
            workers: 2,
            storage: "memory".into(),
            client_io_threads: 2,
            batch_max_commands: 1000,
            batch_delay_us: 200,
            pipeline: 8,
            snapshot_every: 10_000,
            insecure_peers: false,
            auth: "none".into(),
            client_tls: false,
            reads: "index".into(),
            clients: 64,
            per_request: 50,
            write_pct: 15,
            keys: 10_000,
            value_bytes: None,
            warmup_s: 1.0,
            duration_s: 5.0,
            phases: Vec::new(),
        }
    }
}

/// Parameters that shape the cluster rather than the load: they cannot
/// vary against an existing cluster (`--cluster`).
pub const CLUSTER_KEYS: [&str; 18] = [
    "service",
    "model",
    "shards",
    "cost",
    "mapping",
    "replicas",
    "scheduler",
    "workers",
    "storage",
    "client_io_threads",
    "batch_max_commands",
    "batch_delay_us",
    "pipeline",
    "snapshot_every",
    "insecure_peers",
    "auth",
    "client_tls",
    "reads",
];

/// Parameters of the load alone.
pub const LOAD_KEYS: [&str; 11] = [
    "workload",
    "skew",
    "write_skew",
    "clients",
    "per_request",
    "write_pct",
    "keys",
    "value_bytes",
    "warmup_s",
    "duration_s",
    "phases",
];

/// The settings a phase of [`Params::phases`] may change: what the
/// commands are, not how many clients send them or for how long.
pub const PHASE_KEYS: [&str; 6] = ["workload", "skew", "write_skew", "write_pct", "keys", "value_bytes"];

/// Every parameter a sweep or `--set` may name: the cluster's, then the
/// load's.
pub fn keys() -> impl Iterator<Item = &'static str> {
    CLUSTER_KEYS.into_iter().chain(LOAD_KEYS)
}

fn num<T: std::str::FromStr>(key: &str, value: &str, why: &str) -> Result<T, ScenarioError> {
    value.trim().parse().map_err(|_| ScenarioError::BadValue { key: key.into(), value: value.into(), why: why.into() })
}

impl Params {
    /// Sets `key` (a name of [`keys`]; `-` may stand for `_`) to `value`.
    /// Only the syntax is checked here; ranges are the cluster's and the
    /// load's to check, with their own messages.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), ScenarioError> {
        let key = key.trim().replace('-', "_");
        let count = "a whole number";
        let share = |v: &str| -> Result<f64, ScenarioError> {
            let f: f64 = num(&key, v, "a share between 0 and 1")?;
            if (0.0..=1.0).contains(&f) {
                Ok(f)
            } else {
                Err(ScenarioError::BadValue {
                    key: key.clone(),
                    value: v.into(),
                    why: "a share between 0 and 1".into(),
                })
            }
        };
        match key.as_str() {
            "service" => self.service = one_of(&key, value, &["kv", "list"])?,
            "model" => self.model = value.trim().to_string(),
            "shards" => self.shards = num(&key, value, count)?,
            "cost" => self.cost = one_of(&key, value, &["light", "moderate", "heavy"])?,
            "workload" => {
                value.trim().parse::<psmr_services::Mix>().map_err(|e| ScenarioError::BadValue {
                    key: key.clone(),
                    value: value.into(),
                    why: e.to_string(),
                })?;
                self.workload = value.trim().to_string();
            }
            // `R/W`: reads and writes skewed apart (003 §6.5 Workload 3).
            "skew" => match value.split_once('/') {
                Some((r, w)) => {
                    self.skew = share(r)?;
                    self.write_skew = Some(share(w)?);
                }
                None => {
                    self.skew = share(value)?;
                    self.write_skew = None;
                }
            },
            "write_skew" => self.write_skew = if value.trim() == "none" { None } else { Some(share(value)?) },
            k if self.set_cluster(k, value)? => {}
            "clients" => self.clients = num(&key, value, count)?,
            "per_request" => self.per_request = num(&key, value, count)?,
            "write_pct" => self.write_pct = num(&key, value, "a percentage 0-100")?,
            "keys" => self.keys = num(&key, value, count)?,
            "value_bytes" => {
                self.value_bytes =
                    if value.trim() == "decimal" { None } else { Some(num(&key, value, "decimal or a byte count")?) }
            }
            "warmup_s" | "duration_s" => {
                let s: f64 = num(&key, value, "seconds")?;
                if !(0.0..=3600.0).contains(&s) || (key == "duration_s" && s == 0.0) {
                    return Err(ScenarioError::BadValue { key, value: value.into(), why: "seconds, 0-3600".into() });
                }
                if key == "warmup_s" {
                    self.warmup_s = s;
                } else {
                    self.duration_s = s;
                }
            }
            "phases" => {
                let phases: Vec<String> = match value.trim() {
                    "none" | "" => Vec::new(),
                    v => v.split(';').map(|p| p.trim().to_string()).collect(),
                };
                let mut probe = self.clone();
                for phase in &phases {
                    probe.apply_phase(phase)?;
                }
                self.phases = phases;
            }
            _ => return Err(ScenarioError::UnknownKey { key, known: keys().collect::<Vec<_>>().join(", ") }),
        }
        Ok(())
    }

    /// Sets `key` if it is one of the cluster's settable as they are read;
    /// false if it is not one of those.
    fn set_cluster(&mut self, key: &str, value: &str) -> Result<bool, ScenarioError> {
        let count = "a whole number";
        match key {
            "mapping" => self.mapping = value.trim().to_string(),
            "replicas" => self.replicas = num(key, value, count)?,
            "scheduler" => self.scheduler = value.trim().to_string(),
            "workers" => self.workers = num(key, value, count)?,
            "storage" => self.storage = one_of(key, value, &["memory", "disk"])?,
            "client_io_threads" => self.client_io_threads = num(key, value, count)?,
            "batch_max_commands" => self.batch_max_commands = num(key, value, count)?,
            "batch_delay_us" => self.batch_delay_us = num(key, value, count)?,
            "pipeline" => self.pipeline = num(key, value, count)?,
            "snapshot_every" => self.snapshot_every = num(key, value, count)?,
            "insecure_peers" => self.insecure_peers = num(key, value, "true or false")?,
            "auth" => self.auth = one_of(key, value, &["none", "password"])?,
            "client_tls" => self.client_tls = num(key, value, "true or false")?,
            "reads" => self.reads = one_of(key, value, &["index", "log"])?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Applies one phase of [`Params::phases`]: `KEY=VALUE+KEY=VALUE`
    /// over [`PHASE_KEYS`].
    pub fn apply_phase(&mut self, phase: &str) -> Result<(), ScenarioError> {
        let malformed = || ScenarioError::BadValue {
            key: "phases".into(),
            value: phase.into(),
            why: format!("a phase is KEY=VALUE+KEY=VALUE... over {}", PHASE_KEYS.join(", ")),
        };
        for setting in phase.split('+') {
            let (key, value) = setting.split_once('=').ok_or_else(malformed)?;
            let key = key.trim().replace('-', "_");
            if !PHASE_KEYS.contains(&key.as_str()) {
                return Err(malformed());
            }
            self.set(&key, value)?;
        }
        Ok(())
    }

    /// The parameters of each phase of the measured window, the first
    /// being `self` as it is.
    pub fn phase_params(&self) -> Result<Vec<Params>, ScenarioError> {
        let mut out = vec![Params { phases: Vec::new(), ..self.clone() }];
        for phase in &self.phases {
            let mut p = out[0].clone();
            p.apply_phase(phase)?;
            out.push(p);
        }
        Ok(out)
    }

    /// The value of `key` as text, as [`Params::set`] reads it.
    pub fn get(&self, key: &str) -> Option<String> {
        Some(match key {
            "service" => self.service.clone(),
            "model" => self.model.clone(),
            "shards" => self.shards.to_string(),
            "cost" => self.cost.clone(),
            "workload" => self.workload.clone(),
            "skew" => self.skew.to_string(),
            "write_skew" => self.write_skew.map_or("none".to_string(), |w| w.to_string()),
            "mapping" => self.mapping.clone(),
            "replicas" => self.replicas.to_string(),
            "scheduler" => self.scheduler.clone(),
            "workers" => self.workers.to_string(),
            "storage" => self.storage.clone(),
            "client_io_threads" => self.client_io_threads.to_string(),
            "batch_max_commands" => self.batch_max_commands.to_string(),
            "batch_delay_us" => self.batch_delay_us.to_string(),
            "pipeline" => self.pipeline.to_string(),
            "snapshot_every" => self.snapshot_every.to_string(),
            "insecure_peers" => self.insecure_peers.to_string(),
            "auth" => self.auth.clone(),
            "client_tls" => self.client_tls.to_string(),
            "reads" => self.reads.clone(),
            "clients" => self.clients.to_string(),
            "per_request" => self.per_request.to_string(),
            "write_pct" => self.write_pct.to_string(),
            "keys" => self.keys.to_string(),
            "value_bytes" => self.value_bytes.map_or("decimal".to_string(), |b| b.to_string()),
            "warmup_s" => self.warmup_s.to_string(),
            "duration_s" => self.duration_s.to_string(),
            "phases" => match self.phases.is_empty() {
                true => "none".to_string(),
                false => self.phases.join(";"),
            },
            _ => return None,
        })
    }
}

/// One swept parameter and its values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sweep {
    /// The parameter (a name of [`keys`]).
    pub key: String,
    /// Its values, in order.
    pub values: Vec<String>,
}

impl std::str::FromStr for Sweep {
    type Err = ScenarioError;

    /// `KEY=V1,V2,...`; every value is checked against the key.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (key, values) = s.split_once('=').ok_or_else(|| ScenarioError::SweepFormat(s.to_string()))?;
        let key = key.trim().replace('-', "_");
        let values: Vec<String> = values.split(',').map(|v| v.trim().to_string()).collect();
        if key.is_empty() || values.iter().any(String::is_empty) {
            return Err(ScenarioError::SweepFormat(s.to_string()));
        }
        let mut probe = Params::default();
        for v in &values {
            probe.set(&key, v)?;
        }
        Ok(Sweep { key, values })
    }
}

impl fmt::Display for Sweep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.key, self.values.join(","))
    }
}

/// How a scenario runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScenarioKind {
    /// A local cluster per point (or an existing one) under closed-loop load.
    Cluster,
    /// The bitmap false-positive simulation of 004 Table I: no cluster, no
    /// sweeps ([`crate::simulate`]).
    BitmapSimulation,
    /// psmr next to etcd and Redis on this machine ([`crate::peers`]): its
    /// one sweep is the number of closed-loop clients.
    Peers,
    /// A state of `keys` values filled, then a replica added and a follower
    /// stopped and restarted under load ([`crate::catch_up`]): one run, no
    /// sweeps.
    CatchUp,
    /// A cluster under load and every kind of the nemesis's faults at
    /// once unless `--nemesis` names others, judged at the end
    /// ([`psmr_harness::verdict`]): one point, no sweeps.
    Nemesis,
}

/// A named end-to-end experiment.
#[derive(Clone, Debug)]
pub struct Scenario {
    /// How it runs.
    pub kind: ScenarioKind,
    /// Its name on the command line.
    pub name: &'static str,
    /// The figure or table of the papers it follows, if any.
    pub source: &'static str,
    /// One line: what it shows.
    pub about: &'static str,
    /// The base parameters.
    pub base: Params,
    /// Its sweeps; the first one is the x axis of the throughput plot.
    pub sweeps: Vec<Sweep>,
}

fn sweep(key: &str, values: &[&str]) -> Sweep {
    Sweep { key: key.into(), values: values.iter().map(|v| v.to_string()).collect() }
}

/// Every scenario, the default (`schedulers`) first.
pub fn scenarios() -> Vec<Scenario> {
    let base = Params::default();
    vec![
        Scenario {
            kind: ScenarioKind::Cluster,
            name: "schedulers",
            source: "003 Fig. 2-3, 000 Fig. 7.1 (end to end, kv)",
            about: "every kind of scheduler end to end, and auto choosing among them: 3 kv replicas, 64 clients x 50 commands, 15 % writes",
            base: base.clone(),
            sweeps: vec![sweep(
                "scheduler",
                &["sequential", "late-batch-bitmap", "early", "early-busywait", "early-ws-optimistic", "auto"],
            )],
        },
        Scenario {
            kind: ScenarioKind::Cluster,
            name: "latency-throughput",
            source: "003 Fig. 3 (latency against throughput)",
            about: "more and more closed-loop clients, sequential against early: latency as load grows",
            base: Params { per_request: 1, ..base.clone() },
            sweeps: vec![sweep("clients", &["1", "4", "16", "64"]), sweep("scheduler", &["sequential", "early"])],
        },
        Scenario {
            kind: ScenarioKind::Cluster,
            name: "workers",
            source: "003 Fig. 2, 004 Fig. 4 (throughput against workers)",
            about: "worker threads per replica, early against late-batch-bitmap",
            base: base.clone(),
            sweeps: vec![sweep("workers", &["1", "2", "4"]), sweep("scheduler", &["early", "late-batch-bitmap"])],
        },
        Scenario {
            kind: ScenarioKind::Cluster,
            name: "write-ratio",
            source: "003 Fig. 2(d-f), 004 Fig. 5 (conflict rates)",
            about: "share of writes (conflicting commands), sequential against early, late-batch-bitmap and auto",
            base: base.clone(),
            sweeps: vec![
                sweep("write_pct", &["0", "15", "50", "100"]),
                sweep("scheduler", &["sequential", "early", "late-batch-bitmap", "auto"]),
            ],
        },
        Scenario {
            kind: ScenarioKind::Cluster,
            name: "batch-bitmap",
            source: "004 Fig. 4 (batch size and bitmaps, contention-free)",
            about: "commands per log entry for the late schedulers (CBASE, batches compared key by key, by bitmap); 256 clients writing single commands to 10^6 keys",
            base: Params { keys: 1_000_000, write_pct: 100, clients: 256, per_request: 1, ..base.clone() },
            sweeps: vec![
                sweep("batch_max_commands", &["1", "100", "200"]),
                sweep("scheduler", &["late-cbase", "late-batch-keys", "late-batch-bitmap"]),
            ],
        },
        Scenario {
            kind: ScenarioKind::Cluster,
            name: "clientio",
            source: "002 Fig. 9 (number of ClientIO threads)",
            about: "ClientIO threads per replica with 64 clients sending one command per request",
            base: Params { per_request: 1, scheduler: "sequential".into(), ..base.clone() },
            sweeps: vec![sweep("client_io_threads", &["1", "2", "4"])],
        },
        Scenario {
            kind: ScenarioKind::Cluster,
            name: "client-batching",
            source: "004 §VI, 003 §6.1 (client proxies that batch)",
            about: "commands per client request, 64 clients",
            base: Params { scheduler: "sequential".into(), ..base.clone() },
            sweeps: vec![sweep("per_request", &["1", "10", "50"])],
        },
        Scenario {
            kind: ScenarioKind::Cluster,
            name: "storage",
            source: "the durability issue (disk against memory)",
            about: "raft log in memory against synced on disk, 8 and 64 clients",
            base: Params { scheduler: "sequential".into(), ..base.clone() },
            sweeps: vec![sweep("clients", &["8", "64"]), sweep("storage", &["memory", "disk"])],
        },
        Scenario {
            kind: ScenarioKind::Cluster,
            name: "reads",
            source: "reads without the log (raft's ReadIndex, Raft thesis §6.4)",
            about: "read-only kv load, one read per request, 8 and 64 clients: reads through the log against the leader's ReadIndex, with the log on disk (synced) and in memory",
            base: Params { per_request: 1, write_pct: 0, scheduler: "sequential".into(), ..base.clone() },
            sweeps: vec![
                sweep("clients", &["8", "64"]),
                sweep("reads", &["log", "index"]),
                sweep("storage", &["disk", "memory"]),
            ],
        },
        Scenario {
            kind: ScenarioKind::Cluster,
            name: "list-rw",
            source: "003 Fig. 2-3 (readers and writers on the list)",
            about: "the list with one reader and one writer class: costs light, moderate, heavy; read-only and 15 % writes",
            base: Params { service: "list".into(), per_request: 50, ..base.clone() },
            sweeps: vec![
                sweep("cost", &["light", "moderate", "heavy"]),
                sweep("workload", &["0-0-0", "15-0-0"]),
                sweep("scheduler", &["sequential", "early", "late-batch-bitmap"]),
            ],
        },
        Scenario {
            kind: ScenarioKind::Cluster,
            name: "list-shards",
            source: "003 Fig. 5 (1 to 8 shards)",
            about: "the sharded list (sharded-global), moderate cost, Workload 1 spread over 1 to 8 shards, early against late-batch-bitmap",
            base: Params {
                service: "list".into(),
                model: "sharded-global".into(),
                cost: "moderate".into(),
                workload: "14.25-5-15".into(),
                ..base.clone()
            },
            sweeps: vec![sweep("shards", &["1", "2", "4", "8"]), sweep("scheduler", &["early", "late-batch-bitmap"])],
        },
        Scenario {
            kind: ScenarioKind::Cluster,
            name: "list-skewed",
            source: "003 Fig. 6 (skewed Workloads 1-3, optimizer against naive mapping)",
            about: "2 shards, moderate cost, 4 workers: Workloads 1 (balanced), 2 (67 % to shard 1), 3 (writes 67 %, reads 33 % to shard 1), with the naive, optimal and default mappings",
            base: Params {
                service: "list".into(),
                model: "sharded-global".into(),
                shards: 2,
                cost: "moderate".into(),
                workload: "14.25-5-15".into(),
                workers: 4,
                ..base.clone()
            },
            sweeps: vec![sweep("skew", &["0", "0.67", "0.33/0.67"]), sweep("mapping", &["naive", "optimal", "default"])],
        },
        Scenario {
            kind: ScenarioKind::Cluster,
            name: "list-stealing",
            source: "000 Figs. 7.1-7.5 (busy-wait and work stealing)",
            about: "the sharded list, 2 shards, light cost, skewed 0.8 to shard 1, workloads 0-0-0 to 75-10-75: early, busy-wait and the four work-stealing schedulers",
            base: Params {
                service: "list".into(),
                model: "sharded-global".into(),
                shards: 2,
                workload: "25-5-25".into(),
                skew: 0.8,
                ..base.clone()
            },
            sweeps: vec![
                sweep("workload", &["0-0-0", "15-1-15", "25-5-25", "75-10-75"]),
                sweep(
                    "scheduler",
                    &[
                        "early",
                        "early-busywait",
                        "early-ws-queue",
                        "early-ws-semi",
                        "early-ws-nonblocking",
                        "early-ws-optimistic",
                    ],
                ),
            ],
        },
        Scenario {
            kind: ScenarioKind::Cluster,
            name: "worker-metrics",
            source: "000 Fig. 5.3 (per-worker metrics over time)",
            about: "each early worker's synchronization and queue idleness second by second: the sharded list, 2 shards skewed 0.8, 4 workers, early against early-ws-optimistic",
            base: Params {
                service: "list".into(),
                model: "sharded-global".into(),
                shards: 2,
                workload: "25-5-25".into(),
                skew: 0.8,
                workers: 4,
                ..base.clone()
            },
            sweeps: vec![sweep("scheduler", &["early", "early-ws-optimistic"])],
        },
        Scenario {
            kind: ScenarioKind::Cluster,
            name: "adaptive",
            source: "003 §6.8 lesson 3 (adapting on the fly), 000 §7",
            about: "a workload that shifts during the window, the sharded list with 2 shards at moderate cost: read-only, then 50 % local writes, then those writes 90 % on one shard, then read-only again; auto against each fixed scheduler second by second, auto's decisions marked",
            base: Params {
                service: "list".into(),
                model: "sharded-global".into(),
                shards: 2,
                cost: "moderate".into(),
                workload: "0-0-0".into(),
                phases: ["workload=50-0-0", "workload=50-0-0+skew=0.9", "workload=0-0-0"].map(String::from).to_vec(),
                duration_s: 20.0,
                ..base
            },
            sweeps: vec![sweep("scheduler", &["sequential", "late-batch-bitmap", "early", "auto"])],
        },
        Scenario {
            kind: ScenarioKind::Peers,
            name: "peers",
            source: "the replicated path at the speed of the hardware (etcd 3.4 and Redis 7.0 side by side)",
            about: "3-member etcd (fsync, no fsync) against 3-replica psmr (disk, memory) with 1, 8 and 64 clients putting one 64 B value per request, and redis-benchmark -P 50 -c 8 against psmr with 8 clients x 50 puts; needs scripts/peers.sh",
            base: crate::peers::base_params(),
            sweeps: vec![sweep("clients", &["1", "8", "64"])],
        },
        Scenario {
            kind: ScenarioKind::CatchUp,
            name: "catch-up",
            source: "state of any size: streamed snapshots, chunked catch-up, bounded memory",
            about: "a 3-replica disk cluster filled with `keys` random values of 1 KiB (256 MiB; --set keys=2097152 for 2 GiB), then 64 clients x 50 writes in windows with and without a snapshot being taken, a replica added and a follower stopped for 3 snapshots under that load; transfer rate, stalls, writes during the transfer and every replica's RSS every 100 ms",
            base: Params {
                storage: "disk".into(),
                scheduler: "sequential".into(),
                workers: 1,
                keys: 1 << 18,
                value_bytes: Some(1024),
                write_pct: 100,
                snapshot_every: 1 << 40,
                warmup_s: 0.0,
                duration_s: 3.0,
                ..Params::default()
            },
            sweeps: Vec::new(),
        },
        Scenario {
            kind: ScenarioKind::Nemesis,
            name: "nemesis",
            source: "Jepsen's nemesis against the real processes",
            about: "a 3-replica disk cluster, 8 clients x 10 commands (half writes) over 10 000 keys, under every kind of fault of --nemesis all, two at a time, on a schedule from --seed; each fault's cost, and at the end a final read of every acknowledged key, the history checked for linearizability and the replicas' digests (--set duration_s=1800 for the 30-minute soak)",
            base: Params {
                storage: "disk".into(),
                scheduler: "auto".into(),
                clients: 8,
                per_request: 10,
                write_pct: 50,
                duration_s: 60.0,
                ..Params::default()
            },
            sweeps: Vec::new(),
        },
        Scenario {
            kind: ScenarioKind::BitmapSimulation,
            name: "bitmap-false-positives",
            source: "004 Table I (a simulation, no cluster)",
            about: "how often batch bitmaps of 100k and 1M bits report conflicts between batches of 100 and 200 keys that share none",
            base: Params::default(),
            sweeps: Vec::new(),
        },
    ]
}

/// The scenario called `name`.
pub fn find(name: &str) -> Result<Scenario, ScenarioError> {
    let all = scenarios();
    let known = all.iter().map(|s| s.name).collect::<Vec<_>>().join(", ");
    all.into_iter().find(|s| s.name == name).ok_or(ScenarioError::Unknown { name: name.into(), known })
}

/// `sweeps` with each of `overrides` replacing the sweep over its key, or
/// appended when the key is not swept yet. Two overrides of one key are an
/// error.
pub fn merge(sweeps: &[Sweep], overrides: &[Sweep]) -> Result<Vec<Sweep>, ScenarioError> {
    let mut out = sweeps.to_vec();
    for (i, o) in overrides.iter().enumerate() {
        if overrides[..i].iter().any(|p| p.key == o.key) {
            return Err(ScenarioError::DuplicateSweep(o.key.clone()));
        }
        match out.iter_mut().find(|s| s.key == o.key) {
            Some(s) => s.values = o.values.clone(),
            None => out.push(o.clone()),
        }
    }
    Ok(out)
}

/// One point of a sweep: its parameters and the swept values that made it.
#[derive(Clone, Debug, PartialEq)]
pub struct Point {
    /// The full parameters.
    pub params: Params,
    /// `(key, value)` of every sweep, in sweep order.
    pub label: Vec<(String, String)>,
}

impl Point {
    /// `scheduler=early workers=2`, or `base` when nothing is swept.
    pub fn name(&self) -> String {
        if self.label.is_empty() {
            return "base".into();
        }
        self.label.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" ")
    }
}

/// The cartesian product of `sweeps` over `base`, the last sweep varying
/// fastest.
pub fn expand(base: &Params, sweeps: &[Sweep]) -> Result<Vec<Point>, ScenarioError> {
    let count = sweeps.iter().try_fold(1usize, |n, s| n.checked_mul(s.values.len()));
    match count {
        Some(n) if n <= POINTS_MAX => {}
        other => return Err(ScenarioError::TooManyPoints { got: other.unwrap_or(usize::MAX) }),
    }
    let mut points = vec![Point { params: base.clone(), label: Vec::new() }];
    for s in sweeps {
        let mut next = Vec::with_capacity(points.len() * s.values.len());
        for p in &points {
            for v in &s.values {
                let mut q = p.clone();
                q.params.set(&s.key, v)?;
                q.label.push((s.key.clone(), v.clone()));
                next.push(q);
            }
        }
        points = next;
    }
    Ok(points)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweeps_parse_and_reject_bad_input() {
        let s: Sweep = "workers=1, 2,4".parse().unwrap();
        assert_eq!(s, sweep("workers", &["1", "2", "4"]));
        assert_eq!(s.to_string(), "workers=1,2,4");
        assert_eq!("per-request=1".parse::<Sweep>().unwrap().key, "per_request");
        assert!(matches!("workers".parse::<Sweep>(), Err(ScenarioError::SweepFormat(_))));
        assert!(matches!("workers=1,,2".parse::<Sweep>(), Err(ScenarioError::SweepFormat(_))));
        assert!(matches!("=1".parse::<Sweep>(), Err(ScenarioError::SweepFormat(_))));
        assert!(matches!("cores=1".parse::<Sweep>(), Err(ScenarioError::UnknownKey { .. })));
        assert!(matches!("workers=two".parse::<Sweep>(), Err(ScenarioError::BadValue { .. })));
        assert!(matches!("storage=tape".parse::<Sweep>(), Err(ScenarioError::BadValue { .. })));
        assert!(matches!("insecure_peers=yes".parse::<Sweep>(), Err(ScenarioError::BadValue { .. })));
        let tls: Sweep = "insecure-peers=false,true".parse().unwrap();
        assert_eq!(tls, sweep("insecure_peers", &["false", "true"]));
        assert!(matches!("duration_s=0".parse::<Sweep>(), Err(ScenarioError::BadValue { .. })));
        assert!(matches!("write_pct=300".parse::<Sweep>(), Err(ScenarioError::BadValue { .. })));
        assert!(matches!("skew=1.5".parse::<Sweep>(), Err(ScenarioError::BadValue { .. })));
        assert!(matches!("skew=0.3/2".parse::<Sweep>(), Err(ScenarioError::BadValue { .. })));
        assert!(matches!("workload=25-5".parse::<Sweep>(), Err(ScenarioError::BadValue { .. })));
        assert!(matches!("service=queue".parse::<Sweep>(), Err(ScenarioError::BadValue { .. })));
        assert!(matches!("value_bytes=big".parse::<Sweep>(), Err(ScenarioError::BadValue { .. })));
        let v: Sweep = "value-bytes=decimal,64".parse().unwrap();
        assert_eq!(v, sweep("value_bytes", &["decimal", "64"]));
        let phases: Sweep = "phases=none,workload=1-0-0;skew=0.5/0.2+write_pct=10".parse().unwrap();
        assert_eq!(phases.values.len(), 2);
        let mut p = Params::default();
        p.set("phases", &phases.values[1]).unwrap();
        let each = p.phase_params().unwrap();
        assert_eq!(each.len(), 3);
        assert_eq!(
            (each[1].workload.as_str(), each[2].skew, each[2].write_skew, each[2].write_pct),
            ("1-0-0", 0.5, Some(0.2), 10)
        );
        assert_eq!(
            (each[2].workload.as_str(), each[0].phases.len()),
            ("0-0-0", 0),
            "each phase changes the point's own"
        );
        assert_eq!(p.get("phases").unwrap(), "workload=1-0-0;skew=0.5/0.2+write_pct=10");
        for bad in ["clients=4", "workload", "workload=1-0-0+duration_s=3", "skew=2", "phases=none"] {
            assert!(Params::default().set("phases", bad).is_err(), "{bad}");
        }
        let mut p = Params::default();
        p.set("skew", "0.33/0.67").unwrap();
        assert_eq!((p.skew, p.write_skew), (0.33, Some(0.67)));
        p.set("skew", "0.5").unwrap();
        assert_eq!((p.skew, p.write_skew), (0.5, None));
    }

    #[test]
    fn expand_makes_the_cartesian_product_in_order() {
        let sweeps = [sweep("workers", &["1", "2"]), sweep("scheduler", &["a", "b", "c"])];
        let points = expand(&Params::default(), &sweeps).unwrap();
        assert_eq!(points.len(), 6);
        assert_eq!(points[0].name(), "workers=1 scheduler=a");
        assert_eq!(points[5].name(), "workers=2 scheduler=c");
        assert_eq!((points[4].params.workers, points[4].params.scheduler.as_str()), (2, "b"));
        assert_eq!(keys().count(), 29);
        for key in keys() {
            assert!(Params::default().get(key).is_some(), "{key}");
            let mut p = Params::default();
            p.set(key, &Params::default().get(key).unwrap()).unwrap();
            assert_eq!(p, Params::default(), "{key} round-trips");
        }
        assert_eq!(expand(&Params::default(), &[]).unwrap()[0].name(), "base");
        let big = [sweep("clients", &["1"; 20]), sweep("keys", &["1"; 20])];
        assert_eq!(expand(&Params::default(), &big), Err(ScenarioError::TooManyPoints { got: 400 }));
    }

    #[test]
    fn overrides_replace_or_add_sweeps() {
        let base = [sweep("workers", &["1", "2"])];
        let merged = merge(&base, &[sweep("workers", &["4"]), sweep("clients", &["8"])]).unwrap();
        assert_eq!(merged, [sweep("workers", &["4"]), sweep("clients", &["8"])]);
        assert_eq!(
            merge(&base, &[sweep("clients", &["8"]), sweep("clients", &["9"])]),
            Err(ScenarioError::DuplicateSweep("clients".into()))
        );
    }

    #[test]
    fn every_scenario_expands_and_names_are_unique() {
        let all = scenarios();
        assert_eq!(all[0].name, "schedulers");
        for (i, s) in all.iter().enumerate() {
            assert!(all[..i].iter().all(|t| t.name != s.name), "{} twice", s.name);
            let points = expand(&s.base, &s.sweeps).unwrap();
            // `--quick` must finish in under two minutes: about 4 s a point.
            assert!(!points.is_empty() && points.len() <= 24, "{}: {} points", s.name, points.len());
            // The simulation and the catch-up are one run each, unswept.
            let one_run =
                matches!(s.kind, ScenarioKind::BitmapSimulation | ScenarioKind::CatchUp | ScenarioKind::Nemesis);
            assert_eq!(one_run, s.sweeps.is_empty(), "{}", s.name);
            assert_eq!(find(s.name).unwrap().name, s.name);
        }
        assert!(matches!(find("fig9"), Err(ScenarioError::Unknown { .. })));
    }
}
