//! Running the points of a cluster scenario ([`crate::scenario`]): each
//! point's cluster and load from its [`Params`], a fresh cluster of
//! replica processes per point ([`psmr_harness::launch`]) or an existing one, the
//! faults injected while the load runs ([`crate::faults`]), and the
//! measurements as a [`PointResult`] for [`crate::report`].
//!
//! ```no_run
//! use psmr_bench::faults::Faults;
//! use psmr_bench::runner::{self, Runner, Target};
//! use psmr_bench::scenario;
//!
//! let scenario = scenario::find("client-batching")?;
//! let plan = runner::plan(&scenario, &[], false, &Faults::default())?;
//! let runner = Runner { target: Target::Local { exe: "target/debug/psmr".into() }, faults: Faults::default(), seed: 1 };
//! for point in scenario::expand(&plan.base, &plan.sweeps)? {
//!     runner::check_point(&point, false, &runner.faults, runner.seed)?;
//!     let result = runner.run(&point, None, std::path::Path::new("logs"))?;
//!     println!("{}: {:.0} commands/s", result.name, result.commands_per_s);
//! }
//! # Ok::<(), psmr_bench::runner::RunError>(())
//! ```

use crate::faults::{self, Faults, FaultsError};
use crate::peers::PeersError;
use crate::report::{Event, Percentiles, PointResult};
use crate::scenario::{self, Params, Point, Scenario, ScenarioError, Sweep, CLUSTER_KEYS};
use hdrhistogram::Histogram;
use psmr_client::ClientConfig;
use psmr_harness::clock::{self, Clocks, TtlReport};
use psmr_harness::disk::{self, SmallDisks};
use psmr_harness::history::{self, MAX_STATES_DEFAULT};
use psmr_harness::launch::{self, ClusterDir, ClusterSpec, LaunchError, ProcessCluster, Spawn};
use psmr_harness::load::{self, CpuSource, LoadError, LoadResult, LoadSpec, Ops};
use psmr_harness::nemesis::{self, Kind};
use psmr_harness::relay::Relays;
use psmr_harness::verdict::{self, Judgement};
use psmr_model::ClassModel;
use psmr_sched_bench::{class_frequencies, computed_mapping, BenchError, MappingSource};
use psmr_services::kv::{self, KvModel};
use psmr_services::list::{self, ListModel};
use psmr_services::{Cost, Mix, ServiceConfig, WorkloadConfig, WorkloadError};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;
use thiserror::Error;

/// How long a fresh cluster may take to elect a leader.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// Commands of the point's workload whose class frequencies weigh the
/// optimizer's mapping.
const MAPPING_SAMPLE: usize = 100_000;

/// Why a scenario's points cannot run, or one failed.
#[derive(Debug, Error)]
pub enum RunError {
    /// A bad scenario, sweep or parameter.
    #[error(transparent)]
    Scenario(#[from] ScenarioError),
    /// A bad workload parameter.
    #[error(transparent)]
    Workload(#[from] WorkloadError),
    /// The point's mapping cannot be computed.
    #[error(transparent)]
    Mapping(#[from] BenchError),
    /// The load refused its spec, or failed.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// The cluster cannot be configured or started.
    #[error(transparent)]
    Launch(#[from] LaunchError),
    /// The faults do not fit a point.
    #[error(transparent)]
    Faults(#[from] FaultsError),
    /// A peer of the peers scenario failed.
    #[error(transparent)]
    Peers(#[from] PeersError),
    /// One point is wrong.
    #[error("point {point}: {source}")]
    Point {
        /// The point's name.
        point: String,
        /// What is wrong with it.
        source: Box<RunError>,
    },
    /// A cluster parameter swept against an existing cluster.
    #[error("--cluster drives an existing cluster, whose {0} cannot be swept")]
    SweptExisting(String),
    /// Faults asked of an existing cluster.
    #[error("faults kill and restart replica processes, which psmr bench can do only to clusters it started (drop --cluster)")]
    FaultsExisting,
    /// Requests larger than a log entry.
    #[error("per_request {per_request} is above batch_max_commands {batch_max_commands}, and replicas refuse requests larger than a log entry")]
    PerRequest {
        /// Commands per request.
        per_request: usize,
        /// Most commands in a log entry.
        batch_max_commands: usize,
    },
    /// A replica process exited on its own during the run.
    #[error("replica {id} exited during the run: {status}")]
    Exited {
        /// The replica.
        id: u64,
        /// How it ended.
        status: ExitStatus,
    },
    /// The fault injector panicked.
    #[error("the fault thread panicked")]
    FaultThread,
    /// The nemesis's small disks cannot be set up.
    #[error("{0}")]
    Disks(psmr_harness::disk::DiskError),
    /// A nemesis run cannot be judged (its history, its final reads).
    #[error("judging the run: {0}")]
    Judge(String),
    /// The nemesis's relays cannot be set up.
    #[error("the nemesis's relays: {0}")]
    Relays(std::io::Error),
}

/// What a scenario runs: its sweeps merged with the overrides, and its
/// base parameters.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The sweeps to expand.
    pub sweeps: Vec<Sweep>,
    /// The scenario's sweeps over cluster parameters, dropped because the
    /// cluster exists already (its own settings apply).
    pub dropped: Vec<Sweep>,
    /// The base parameters of every point: the scenario's, on disk storage
    /// when there are faults (a replica restarted from memory would have
    /// forgotten its log).
    pub base: Params,
}

/// The plan of `scenario` with the sweeps `overrides` (replacing its own
/// over the same keys), against an `existing` cluster or fresh ones, with
/// `faults`.
pub fn plan(scenario: &Scenario, overrides: &[Sweep], existing: bool, faults: &Faults) -> Result<Plan, RunError> {
    let (own, dropped) = if existing {
        if let Some(s) = overrides.iter().find(|s| CLUSTER_KEYS.contains(&s.key.as_str())) {
            return Err(RunError::SweptExisting(s.key.clone()));
        }
        scenario.sweeps.iter().cloned().partition(|s| !CLUSTER_KEYS.contains(&s.key.as_str()))
    } else {
        (scenario.sweeps.clone(), Vec::new())
    };
    let sweeps = scenario::merge(&own, overrides)?;
    let mut base = scenario.base.clone();
    if faults.any() {
        if existing {
            return Err(RunError::FaultsExisting);
        }
        base.storage = "disk".into();
    }
    Ok(Plan { sweeps, dropped, base })
}

/// Checks that `p` can run, against an `existing` cluster or a fresh one,
/// before anything runs: its load, and its cluster's configuration
/// (without making certificates).
pub fn check_params(p: &Params, existing: bool, seed: u64) -> Result<(), RunError> {
    load_spec(p, None, seed)?.validate()?;
    if existing {
        return Ok(());
    }
    // Without peer TLS and users: making a point's certificates and
    // passwords is its run's job (in its own directory), not the check's.
    let check = Params { insecure_peers: true, auth: "none".into(), client_tls: false, ..p.clone() };
    cluster_spec(&check)?.config(&std::env::temp_dir())?;
    if p.per_request > p.batch_max_commands {
        return Err(RunError::PerRequest { per_request: p.per_request, batch_max_commands: p.batch_max_commands });
    }
    Ok(())
}

/// [`check_params`] for `point`, and that `faults` fit it.
pub fn check_point(point: &Point, existing: bool, faults: &Faults, seed: u64) -> Result<(), RunError> {
    check_params(&point.params, existing, seed)
        .map_err(|e| RunError::Point { point: point.name(), source: Box::new(e) })?;
    Ok(faults.check(point)?)
}

/// The load of `p`, its operations written to `history` if given.
pub fn load_spec(p: &Params, history: Option<PathBuf>, seed: u64) -> Result<LoadSpec, RunError> {
    let mut phases = p.phase_params()?.iter().map(ops).collect::<Result<Vec<Ops>, RunError>>()?;
    Ok(LoadSpec {
        seed,
        clients: p.clients,
        per_request: p.per_request,
        warmup: Duration::from_secs_f64(p.warmup_s),
        duration: Duration::from_secs_f64(p.duration_s),
        ops: phases.remove(0),
        phases,
        history,
    })
}

/// The commands of `p`'s workload.
fn ops(p: &Params) -> Result<Ops, RunError> {
    Ok(match p.service.as_str() {
        "list" => {
            let cost: Cost = p.cost.parse()?;
            Ops::List { model: p.model.parse()?, workload: list_workload(p)?, list_size: cost.list_size() }
        }
        _ => Ops::Kv { keys: p.keys, write_pct: p.write_pct, value_bytes: p.value_bytes, prefix: String::new() },
    })
}

/// The list workload of `p` (its mix, shards and skews).
pub fn list_workload(p: &Params) -> Result<WorkloadConfig, RunError> {
    let mix: Mix = p.workload.parse()?;
    Ok(WorkloadConfig { shards: p.shards, skew: p.skew, write_skew: p.write_skew, mix, ..WorkloadConfig::default() })
}

/// The fresh local cluster of `p`, on loopback.
pub fn cluster_spec(p: &Params) -> Result<ClusterSpec, RunError> {
    let mut spec = ClusterSpec {
        replicas: p.replicas,
        service: ServiceConfig {
            kind: p.service.clone(),
            model: p.model.clone(),
            shards: p.shards,
            keys: 0,
            cost: p.cost.clone(),
        },
        client_tls: p.client_tls,
        ..ClusterSpec::default()
    };
    let base = &mut spec.base;
    base.scheduler.kind = p.scheduler.clone();
    base.scheduler.workers = p.workers;
    base.scheduler.mapping = mapping_spec(p)?;
    base.storage = launch::parse_storage(&p.storage)?;
    base.client_io_threads = p.client_io_threads;
    base.batch_max_commands = p.batch_max_commands;
    base.batch_delay_us = p.batch_delay_us;
    base.pipeline = p.pipeline;
    base.snapshot_every = p.snapshot_every;
    base.insecure_peers = p.insecure_peers;
    base.insecure_clients = p.auth == "none";
    base.reads_through_log = p.reads == "log";
    Ok(spec)
}

/// The mapping a replica runs for `p`: `default`, a spec as given, or the
/// optimizer's or the naive one for the class frequencies of
/// 100,000 commands of the point's workload.
pub fn mapping_spec(p: &Params) -> Result<String, RunError> {
    let source: MappingSource = p.mapping.parse()?;
    if !matches!(source, MappingSource::Optimal(_) | MappingSource::Naive) {
        return Ok(p.mapping.clone());
    }
    let (model, weights) = class_weights(p)?;
    Ok(match computed_mapping(&source, &model, &weights, p.workers)? {
        Some(mapping) => mapping.to_spec(&model),
        None => p.mapping.clone(),
    })
}

/// The class model of `p` and each class's share of a sample of its
/// workload.
fn class_weights(p: &Params) -> Result<(ClassModel, Vec<f64>), RunError> {
    Ok(match p.service.as_str() {
        "list" => {
            let model: ListModel = p.model.parse()?;
            let cost: Cost = p.cost.parse()?;
            let cfg = WorkloadConfig { commands: MAPPING_SAMPLE, ..list_workload(p)? };
            let classes = list::class_model(model, p.shards);
            let weights = class_frequencies(&classes, &list::generate(model, &cfg, cost.list_size())?);
            (classes, weights)
        }
        _ => {
            let model: KvModel = p.model.parse()?;
            let cfg = WorkloadConfig {
                commands: MAPPING_SAMPLE,
                shards: p.shards,
                keys: p.keys,
                mix: Mix::writes(f64::from(p.write_pct)),
                ..WorkloadConfig::default()
            };
            let classes = kv::class_model(model, p.shards);
            let weights = class_frequencies(&classes, &kv::generate(model, &cfg)?);
            (classes, weights)
        }
    })
}

/// Where a scenario's points run.
#[derive(Clone, Debug)]
pub enum Target {
    /// A fresh cluster of replica processes per point, each started as
    /// `exe replica ...` (the `psmr` executable), removed after the point.
    Local {
        /// The `psmr` executable.
        exe: PathBuf,
    },
    /// An existing cluster at these client addresses, reached as this
    /// user (if any): only load parameters apply.
    Existing(Vec<SocketAddr>, psmr_client::Access),
}

/// Runs points: where, with which faults, and the seed of their loads.
#[derive(Clone, Debug)]
pub struct Runner {
    /// Where the points run.
    pub target: Target,
    /// Faults injected into every point (local clusters only).
    pub faults: Faults,
    /// Seed of the clients' random operations.
    pub seed: u64,
}

impl Runner {
    /// Runs `point`: its cluster (unless the target exists), its load with
    /// its history written to `history` if given, its faults; the
    /// replicas' logs go to `logs`. A nemesis run always records its
    /// history (into `logs` unless given) and is judged by it.
    pub fn run(&self, point: &Point, history: Option<PathBuf>, logs: &Path) -> Result<PointResult, RunError> {
        let judged = !self.faults.nemesis.is_empty() && matches!(self.target, Target::Local { .. });
        let history = match history {
            None if judged => {
                std::fs::create_dir_all(logs).map_err(|e| RunError::Judge(format!("{}: {e}", logs.display())))?;
                Some(logs.join("history.jsonl"))
            }
            h => h,
        };
        // `load::run` checks the spec again; `check_point` checked it first.
        let spec = load_spec(&point.params, history, self.seed)?;
        let (load, local) = match &self.target {
            Target::Existing(addrs, access) => {
                // Another machine's pids, or ours by chance: not guessed at.
                let cpu = CpuSource::Off("n/a: the replicas of --cluster are not processes psmr bench started".into());
                let (credentials, tls) = (access.credentials.clone(), access.tls.clone());
                let client = || ClientConfig {
                    credentials: credentials.clone(),
                    tls: tls.clone(),
                    ..ClientConfig::new(addrs.clone())
                };
                let load = load::run_with_cpu(addrs, client, &spec, &cpu)?;
                let running = running(addrs, access.clone());
                (load, Local { running, ..Local::default() })
            }
            Target::Local { exe } => self.run_local(exe, &point.params, &spec, logs)?,
        };
        let mut result = to_result(point, &load);
        result.running = local.running;
        result.events = local.events;
        result.mapping_spec = local.mapping.filter(|m| m != "default");
        result.judgement = local.judgement;
        Ok(result)
    }

    /// A fresh cluster for `p`, `spec` against it with the faults, the
    /// cluster stopped and its data removed; with what happened to it.
    fn run_local(&self, exe: &Path, p: &Params, spec: &LoadSpec, logs: &Path) -> Result<(LoadResult, Local), RunError> {
        // Dropped last: the cluster stops, then its disks go, then its data.
        let dir = ClusterDir::scratch("psmr-bench-")?;
        let mut cluster_spec = cluster_spec(p)?;
        let hurt = !self.faults.nemesis.is_empty();
        if hurt {
            // The relays tell replicas apart by address: one each.
            cluster_spec.hosts = (1..=p.replicas).map(|i| format!("127.0.0.{}", 10 + i)).collect();
        }
        let config = cluster_spec.config(dir.path())?;
        let file = dir.write(&config)?;
        let ids: Vec<u64> = config.replicas.iter().map(|m| m.id).collect();
        let disks = match self.faults.nemesis.contains(&Kind::DiskFull) {
            true => Some(SmallDisks::mount(&config.data_dir, &ids, disk::DISK_BYTES).map_err(RunError::Disks)?),
            false => None,
        };
        let relays = hurt.then(|| Relays::new(&config.replicas)).transpose().map_err(RunError::Relays)?;
        let peer_listen = relays.as_ref().map(Relays::listen).unwrap_or_default();
        let clocks = match self.faults.nemesis.contains(&Kind::Clock) {
            true => Some(Clocks::new(&dir.path().join("clocks")).map_err(LaunchError::from)?),
            false => None,
        };
        let spawn = Spawn { logs: Some(logs.to_path_buf()), peer_listen, clocks: clocks.clone() };
        let mut cluster = ProcessCluster::start_with(exe, (&file, &config), spawn)?;
        cluster.wait_ready(READY_TIMEOUT)?;
        let addrs = cluster.addrs().to_vec();
        // The load runs as the data user where the cluster has users.
        let user = cluster.user(psmr_auth::DEFAULT_USER);
        let tls = cluster.tls();
        let cluster = Mutex::new(cluster);
        let nemesis = relays.as_ref().map(|r| {
            let plan = nemesis::Plan::new(self.faults.nemesis.clone(), self.seed);
            let drawn = nemesis::schedule(&plan, &ids, spec.warmup + spec.duration);
            faults::Nemesis {
                links: r.links(),
                disks: disks.as_ref(),
                clocks: clocks.as_ref(),
                replicas: ids.clone(),
                drawn,
            }
        });
        let client =
            || ClientConfig { credentials: user.clone(), tls: tls.clone(), ..ClientConfig::new(addrs.clone()) };
        let (result, events, windows) = faults::during(&cluster, &self.faults, nemesis, || {
            let probe = clocks.as_ref().map(|_| client());
            with_expiry_probe(probe, self.seed, || load::run_with_cpu(&addrs, client, spec, &CpuSource::Local))
        });
        let (result, expiry) = result;
        let result = result?;
        let history = match (hurt, &spec.history) {
            (true, Some(file)) => read_history(file)?,
            _ => Vec::new(),
        };
        let events = faults::with_windows(events, windows, &result.completed, &history);
        let judgement = match hurt {
            true => Some(Judgement {
                expiry,
                ..verdict::judge((&addrs, user.as_ref()), history, MAX_STATES_DEFAULT, SETTLE)
                    .map_err(|e| RunError::Judge(e.to_string()))?
            }),
            false => None,
        };
        let running = running(&addrs, psmr_client::Access::new(Duration::from_secs(2), user).with_tls(tls));
        let mut cluster = cluster.into_inner().map_err(|_| RunError::FaultThread)?;
        if let Some((id, status)) = cluster.exited().into_iter().next() {
            return Err(RunError::Exited { id, status });
        }
        // The mapping the replicas ran, computed once for their configuration.
        let mapping = Some(config.scheduler.mapping);
        Ok((result, Local { events, mapping, running, judgement }))
    }
}

/// Runs `work` with the expiry probe ([`clock::probe_ttl`]) beside it
/// through `client`, if given: what `work` returned and what the probe
/// found.
fn with_expiry_probe<T>(client: Option<ClientConfig>, seed: u64, work: impl FnOnce() -> T) -> (T, Option<TtlReport>) {
    let Some(client) = client else { return (work(), None) };
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let probe = s.spawn(|| clock::probe_ttl(client, seed, &stop));
        let out = work();
        stop.store(true, Ordering::SeqCst);
        let report = probe.join().unwrap_or_else(|_| TtlReport {
            violations: vec!["the expiry probe panicked".into()],
            ..TtlReport::default()
        });
        (out, Some(report))
    })
}

/// What a run of a local cluster adds to its load's result.
#[derive(Default)]
struct Local {
    events: Vec<Event>,
    mapping: Option<String>,
    running: Vec<String>,
    judgement: Option<Judgement>,
}

/// How long a judged run waits for its replicas to agree once the load
/// is over.
const SETTLE: Duration = Duration::from_secs(60);

fn read_history(file: &Path) -> Result<Vec<history::Operation>, RunError> {
    let judge = |e: String| RunError::Judge(format!("{}: {e}", file.display()));
    let f = std::fs::File::open(file).map_err(|e| judge(e.to_string()))?;
    history::read(std::io::BufReader::new(f)).map_err(|e| judge(e.to_string()))
}

/// What each replica at `addrs` executes with now, as its status says
/// (`1: auto: sequential`), with `auto`'s last decision; a replica that
/// does not answer is left out.
fn running(addrs: &[SocketAddr], access: psmr_client::Access) -> Vec<String> {
    let Ok(probe) = psmr_client::Client::new(ClientConfig::new(addrs.to_vec())) else { return Vec::new() };
    addrs
        .iter()
        .filter_map(|&a| probe.status_of(a, access.clone()).ok())
        .map(|s| match s.decision.is_empty() {
            true => format!("{}: {}", s.id, s.scheduler),
            false => format!("{}: {} (last decision {})", s.id, s.scheduler, s.decision),
        })
        .collect()
}

/// Where point `point` of `points` writes its history when every point's
/// goes to `file`: `file` itself for a single point, else `file` with
/// `.N` before its extension.
pub fn history_path(file: &Path, point: usize, points: usize) -> PathBuf {
    if points == 1 {
        return file.to_path_buf();
    }
    let stem = file.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let name = match file.extension() {
        Some(ext) => format!("{stem}.{point}.{}", ext.to_string_lossy()),
        None => format!("{stem}.{point}"),
    };
    file.with_file_name(name)
}

fn percentiles(h: &Histogram<u64>) -> Percentiles {
    Percentiles {
        count: h.len(),
        p50: h.value_at_quantile(0.5),
        p90: h.value_at_quantile(0.9),
        p99: h.value_at_quantile(0.99),
        p999: h.value_at_quantile(0.999),
        max: h.max(),
    }
}

/// `load`'s measurements as the result of `point`.
fn to_result(point: &Point, load: &LoadResult) -> PointResult {
    let mut r = PointResult::new(point);
    r.commands_per_s = load.commands_per_s();
    r.requests_per_s = load.requests_per_s();
    r.failed_requests = load.errors;
    for (kind, h) in &load.latency {
        r.latency_us.insert(kind.to_string(), percentiles(h));
    }
    r.latency_us.insert("request".into(), percentiles(&load.request_latency));
    r.timeline = load.timeline.clone();
    r.workers = load.workers.clone();
    r.worker_timeline = load.worker_timeline.clone();
    r.switches = load.switches.clone();
    r.stages = load.stages.clone();
    r.cpu = load.cpu.clone();
    r.cpu_note = load.cpu_note.clone();
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_existing_cluster_keeps_its_own_settings() {
        let scenario = scenario::find("latency-throughput").unwrap();
        let clients: Sweep = "clients=1,2".parse().unwrap();
        let existing = plan(&scenario, std::slice::from_ref(&clients), true, &Faults::default()).unwrap();
        assert!(existing.sweeps.iter().all(|s| !CLUSTER_KEYS.contains(&s.key.as_str())));
        assert!(existing.dropped.iter().any(|s| s.key == "scheduler"));
        let workers: Sweep = "workers=1,2".parse().unwrap();
        let err = plan_err(&scenario, &workers, true, Faults::default());
        assert_eq!(err, "--cluster drives an existing cluster, whose workers cannot be swept");
        let faults = Faults { kill_replica: Some((1, Duration::from_secs(1))), ..Faults::default() };
        assert!(plan_err(&scenario, &clients, true, faults.clone()).contains("drop --cluster"));
        let local = plan(&scenario, &[], false, &faults).unwrap();
        assert_eq!((local.base.storage.as_str(), local.dropped.len()), ("disk", 0));
    }

    fn plan_err(scenario: &Scenario, sweep: &Sweep, existing: bool, faults: Faults) -> String {
        plan(scenario, std::slice::from_ref(sweep), existing, &faults).unwrap_err().to_string()
    }

    #[test]
    fn points_are_checked_with_their_name() {
        let point = |p: Params| Point { params: p, label: vec![("clients".into(), "0".into())] };
        let err = |p, existing| check_point(&point(p), existing, &Faults::default(), 1).unwrap_err().to_string();
        assert!(err(Params { clients: 0, ..Params::default() }, true).starts_with("point clients=0: --clients"));
        let big = Params { per_request: 50, batch_max_commands: 10, ..Params::default() };
        assert!(err(big.clone(), false).contains("per_request 50 is above batch_max_commands 10"));
        assert!(check_point(&point(big), true, &Faults::default(), 1).is_ok(), "the existing cluster decides");
        // Checking a point with users makes no password files: twice is
        // as good as once.
        let users = Params { auth: "password".into(), ..Params::default() };
        for _ in 0..2 {
            check_point(&point(users.clone()), false, &Faults::default(), 1).unwrap();
        }
    }

    #[test]
    fn history_files_are_numbered_per_point() {
        let f = Path::new("/tmp/h.jsonl");
        assert_eq!(history_path(f, 0, 1), PathBuf::from("/tmp/h.jsonl"));
        assert_eq!(history_path(f, 3, 5), PathBuf::from("/tmp/h.3.jsonl"));
        assert_eq!(history_path(Path::new("h"), 1, 2), PathBuf::from("h.1"));
    }

    #[test]
    fn mappings_are_computed_for_the_workload() {
        let p = Params { mapping: "naive".into(), workers: 4, ..Params::default() };
        assert!(mapping_spec(&p).unwrap().contains("R="));
        let spec = Params { mapping: "R=conc:0".into(), ..Params::default() };
        assert_eq!(mapping_spec(&spec).unwrap(), "R=conc:0");
        let c = cluster_spec(&Params { storage: "disk".into(), ..Params::default() }).unwrap();
        assert_eq!(
            (c.replicas, c.base.storage, c.base.scheduler.kind.as_str()),
            (3, psmr_replica::Storage::Disk, "early")
        );
    }
}
