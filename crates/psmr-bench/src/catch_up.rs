//! `psmr bench --scenario catch-up`: a state of a given size, and the
//! replicas that must reach it.
//!
//! One run, in phases, on a fresh cluster of three replicas:
//!
//! 1. **fill**: `keys` values of `value_bytes` random (incompressible)
//!    bytes, written by [`FILL_THREADS`] clients in `MSET`s of
//!    [`FILL_BATCH`];
//! 2. **load**: the saturating load (`clients` × `per_request` writes over
//!    the same keys) in windows of `duration_s`, each marked by whether a
//!    replica was taking a snapshot during it: the longest command with a
//!    snapshot being taken against the longest without is the stall;
//! 3. **join**: replica 4 joins (`--join`, then `add-replica`) while the
//!    load runs on: the bytes the leader sent, the transfer's rate, the
//!    load's rate during it against the load phase's, and replica 4's
//!    digest once it is a voter;
//! 4. **down**: a follower is stopped while the load makes the leader take
//!    three snapshots, then restarted: how long it takes to catch up, and
//!    its digest;
//!
//! with every replica's RSS sampled every [`RSS_EVERY`] throughout and
//! reported per phase against the bound of 1.25 × the state plus 256 MiB.
//! The figures are reported, not judged: a run on a slow machine is not a
//! failure.

use crate::runner::{self, RunError};
use crate::scenario::Params;
use psmr_client::{Client, ClientConfig};
use psmr_harness::launch::{free_ports, ClusterDir, LaunchError, ProcessCluster};
use psmr_harness::load::{self, CpuSource, LoadError, LoadSpec, Ops};
use psmr_model::wire::{MemberChange, ReplicaStatus};
use psmr_replica::metrics::Scrape;
use psmr_replica::Member;
use psmr_services::kv::{key_bytes, KvCodec, KvOp};
use rand::{RngCore, SeedableRng};
use serde::Serialize;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use thiserror::Error;

/// Clients that fill the state, each its own range of keys.
pub const FILL_THREADS: u64 = 16;
/// Keys per `MSET` of the fill.
pub const FILL_BATCH: u64 = 64;
/// How often every replica's RSS is read.
pub const RSS_EVERY: Duration = Duration::from_millis(100);
/// The phases, in order; RSS samples are tagged with them.
pub const PHASES: [&str; 5] = ["start", "fill", "load", "join", "down"];
/// Snapshots the leader takes while a follower is down.
const SNAPSHOTS_WHILE_DOWN: u64 = 3;
/// Most load windows of one phase.
const WINDOWS_MAX: usize = 60;
/// Most load windows while a follower is down.
const DOWN_WINDOWS_MAX: usize = 400;
/// Windows with and without a snapshot the load phase waits for.
const WINDOWS_EACH: usize = 3;
/// The longest a phase waits for replicas to agree.
const AGREE_TIMEOUT: Duration = Duration::from_secs(600);
/// The longest a run waits for a leader to answer.
const LEADER_TIMEOUT: Duration = Duration::from_secs(30);
/// The id of the replica that joins.
const JOINER: u64 = 4;
const MIB: f64 = (1 << 20) as f64;

/// Why the scenario could not run to its end.
#[derive(Debug, Error)]
pub enum CatchUpError {
    /// The cluster could not start or be changed.
    #[error(transparent)]
    Launch(#[from] LaunchError),
    /// A bad parameter.
    #[error(transparent)]
    Run(#[from] RunError),
    /// A load window failed.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// A step failed; the message says which.
    #[error("{0}")]
    Step(String),
}

fn step(what: &str) -> impl FnOnce(String) -> CatchUpError + '_ {
    move |e| CatchUpError::Step(format!("{what}: {e}"))
}

/// One load window.
#[derive(Clone, Debug, Serialize)]
pub struct Window {
    /// The phase it ran in.
    pub phase: &'static str,
    /// Commands per second.
    pub commands_per_s: f64,
    /// The longest request, ms.
    pub max_ms: f64,
    /// The requests' median, ms.
    pub p50_ms: f64,
    /// Their 99th percentile, ms.
    pub p99_ms: f64,
    /// Whether a replica was taking a snapshot during it.
    pub snapshot: bool,
    /// Whether a snapshot was being sent to a replica during it.
    pub transfer: bool,
}

/// One replica's RSS in one phase.
#[derive(Clone, Debug, Serialize)]
pub struct Rss {
    /// The replica.
    pub id: u64,
    /// The phase.
    pub phase: &'static str,
    /// Its largest sample, MiB.
    pub peak_mib: f64,
    /// Its last sample, MiB.
    pub last_mib: f64,
}

/// What a run measured.
#[derive(Clone, Debug, Default, Serialize)]
pub struct CatchUpReport {
    /// Keys filled.
    pub keys: u64,
    /// Bytes of keys and values filled.
    pub state_bytes: u64,
    /// The bound every replica's RSS is held to: 1.25 × the state + 256
    /// MiB.
    pub rss_bound_mib: f64,
    /// Seconds the fill took.
    pub fill_s: f64,
    /// Bytes of the leader's last snapshot file.
    pub snapshot_bytes: u64,
    /// Bytes the leader sent replica 4.
    pub transfer_bytes: u64,
    /// From the first byte sent to the snapshot restored on replica 4, s.
    pub transfer_s: f64,
    /// `add-replica` from its call to its answer (replica 4 a voter), s.
    pub add_s: f64,
    /// Replica 4's digest equals the others' once the load stopped.
    pub joiner_agrees: bool,
    /// Snapshots the leader took while the follower was down.
    pub snapshots_while_down: u64,
    /// The follower stopped, and the seconds it took from its restart to
    /// the leader's applied index and digest.
    pub follower: u64,
    /// See [`CatchUpReport::follower`].
    pub follower_catch_up_s: f64,
    /// Its digest equals the others'.
    pub follower_agrees: bool,
    /// Every load window.
    pub windows: Vec<Window>,
    /// Every replica's RSS, per phase.
    pub rss: Vec<Rss>,
}

/// What to run.
pub struct CatchUpSpec<'a> {
    /// The `psmr` executable.
    pub exe: &'a Path,
    /// The scenario's parameters: `keys`, `value_bytes` (1 KiB unless
    /// set), `clients`, `per_request`, `duration_s` (one window),
    /// `storage`, `scheduler`...
    pub params: &'a Params,
    /// Seed of the values and the load.
    pub seed: u64,
    /// Where the replicas' logs go.
    pub logs: &'a Path,
}

/// The replicas as a run sees them: the processes, a client for status
/// and metrics, and the RSS sampler.
struct Run<'a> {
    spec: &'a CatchUpSpec<'a>,
    cluster: ProcessCluster,
    client: Client,
    rss: Sampler,
    report: CatchUpReport,
}

/// Runs the scenario (see the module doc) and reports what it measured.
pub fn run(spec: &CatchUpSpec) -> Result<CatchUpReport, CatchUpError> {
    let p = spec.params;
    let value_bytes = p.value_bytes.unwrap_or(1024) as u64;
    let key_bytes_total: u64 = (0..p.keys).map(|n| key_bytes(n).len() as u64).sum();
    let state_bytes = p.keys * value_bytes + key_bytes_total;
    let dir = ClusterDir::scratch("psmr-catch-up-")?;
    let mut cluster_spec = runner::cluster_spec(p)?;
    // A snapshot every state's worth of log bytes, at least 256 MiB: the
    // load phase sees windows with one being taken and windows without,
    // also where writing one takes as long as the load needs to write
    // half a state (three replicas under load on two cores).
    cluster_spec.base.snapshot_every_bytes = state_bytes.max(256 << 20);
    let config = cluster_spec.config(dir.path())?;
    let file = dir.write(&config)?;
    let mut cluster = ProcessCluster::start(spec.exe, &file, &config, Some(spec.logs))?;
    cluster.wait_ready(Duration::from_secs(30))?;
    let client = Client::new(ClientConfig::new(cluster.addrs().to_vec())).map_err(|e| step("client")(e.to_string()))?;
    let rss = Sampler::start();
    let report = CatchUpReport {
        keys: p.keys,
        state_bytes,
        rss_bound_mib: 1.25 * state_bytes as f64 / MIB + 256.0,
        ..CatchUpReport::default()
    };
    let mut run = Run { spec, cluster, client, rss, report };
    run.track_pids();
    run.fill(value_bytes)?;
    run.load_phase()?;
    run.join(&dir, &config.replicas)?;
    run.down()?;
    let Run { rss, mut report, .. } = run;
    report.rss = rss.stop();
    Ok(report)
}

impl Run<'_> {
    fn addrs(&self) -> Vec<SocketAddr> {
        self.cluster.addrs().to_vec()
    }

    /// Every replica's status. A status carries the state's digest, which
    /// the replica computes over the whole state while execution waits:
    /// asked only where the load has stopped.
    fn statuses(&self) -> Vec<Option<ReplicaStatus>> {
        let t = Duration::from_secs(30);
        self.addrs().iter().map(|a| self.client.status_of(*a, t).ok()).collect()
    }

    fn scrape(&self, addr: SocketAddr) -> Scrape {
        Scrape::parse(&self.client.metrics_of(addr, Duration::from_secs(2)).unwrap_or_default())
    }

    /// The leader's client address, asked until one answers (a replica
    /// may be busy or electing one) for up to [`LEADER_TIMEOUT`].
    fn leader_addr(&self) -> Result<SocketAddr, CatchUpError> {
        let deadline = Instant::now() + LEADER_TIMEOUT;
        let addrs = self.addrs();
        loop {
            // From the metrics, which cost the replica nothing to answer;
            // replica `id` is `addrs[id - 1]`.
            let leaders: Vec<u64> = addrs.iter().map(|a| leader_of(&self.scrape(*a))).collect();
            let leader = leaders.iter().copied().find(|&l| l != 0 && l as usize <= addrs.len());
            match leader {
                Some(l) => return Ok(addrs[l as usize - 1]),
                None if Instant::now() >= deadline => {
                    return Err(CatchUpError::Step(format!(
                        "no leader known within {} s (leaders the replicas name: {leaders:?})",
                        LEADER_TIMEOUT.as_secs()
                    )));
                }
                None => std::thread::sleep(Duration::from_millis(200)),
            }
        }
    }

    /// Gives the sampler the pid of every replica that answers.
    fn track_pids(&self) {
        let pids = self.statuses().into_iter().flatten().map(|s| (s.id, s.pid)).collect();
        *self.rss.pids.lock().expect("the sampler never panics holding it") = pids;
    }

    /// Writes every key once, with random values.
    fn fill(&mut self, value_bytes: u64) -> Result<(), CatchUpError> {
        self.rss.phase("fill");
        let start = Instant::now();
        let (keys, addrs, seed) = (self.spec.params.keys, self.addrs(), self.spec.seed);
        let per = keys.div_ceil(FILL_THREADS);
        let handles: Vec<JoinHandle<Result<(), String>>> = (0..FILL_THREADS)
            .map(|t| {
                let (addrs, range) = (addrs.clone(), (t * per).min(keys)..((t + 1) * per).min(keys));
                std::thread::spawn(move || fill_range(addrs, range, value_bytes, seed ^ t))
            })
            .collect();
        for h in handles {
            h.join().map_err(|_| CatchUpError::Step("a fill thread panicked".into()))?.map_err(step("fill"))?;
        }
        self.report.fill_s = start.elapsed().as_secs_f64();
        eprintln!(
            "filled {} keys ({:.0} MiB) in {:.1} s",
            keys,
            self.report.state_bytes as f64 / MIB,
            self.report.fill_s
        );
        Ok(())
    }

    /// Load windows until some ran with a snapshot being taken and some
    /// without.
    fn load_phase(&mut self) -> Result<(), CatchUpError> {
        self.rss.phase("load");
        for _ in 0..WINDOWS_MAX {
            let w = self.window("load", None)?;
            log_window(self.report.windows.len(), &w);
            self.report.windows.push(w);
            let with = self.report.windows.iter().filter(|w| w.snapshot).count();
            let without = self.report.windows.len() - with;
            if with >= WINDOWS_EACH && without >= WINDOWS_EACH {
                break;
            }
        }
        self.report.snapshot_bytes =
            self.scrape(self.leader_addr()?).value("psmr_snapshot_last_bytes").unwrap_or(0.0) as u64;
        Ok(())
    }

    /// One window of the saturating load; `transfer` tells whether a
    /// transfer was running through it.
    fn window(&self, phase: &'static str, transfer: Option<&AtomicBool>) -> Result<Window, CatchUpError> {
        let p = self.spec.params;
        let addrs: Vec<SocketAddr> = self.addrs().into_iter().take(3).collect();
        let load = LoadSpec {
            clients: p.clients,
            per_request: p.per_request,
            warmup: Duration::ZERO,
            duration: Duration::from_secs_f64(p.duration_s),
            ops: Ops::Kv {
                keys: p.keys,
                write_pct: 100,
                value_bytes: Some(p.value_bytes.unwrap_or(1024)),
                prefix: String::new(),
            },
            phases: Vec::new(),
            history: None,
            seed: self.spec.seed ^ self.report.windows.len() as u64,
        };
        let before: Vec<(u64, u64)> = addrs.iter().map(|a| snapshots(&self.scrape(*a))).collect();
        let during = transfer.is_some_and(|t| t.load(Ordering::SeqCst));
        let r = load::run_with_cpu(&addrs, || ClientConfig::new(addrs.clone()), &load, &CpuSource::Off("".into()))?;
        let after: Vec<(u64, u64)> = addrs.iter().map(|a| snapshots(&self.scrape(*a))).collect();
        // A snapshot overlapped the window if one started before its end
        // that had not ended before its start.
        let snapshot = before.iter().zip(&after).any(|(&(_, done), &(started, _))| started > done);
        let h = &r.request_latency;
        Ok(Window {
            phase,
            commands_per_s: r.commands_per_s(),
            max_ms: h.max() as f64 / 1e3,
            p50_ms: h.value_at_quantile(0.5) as f64 / 1e3,
            p99_ms: h.value_at_quantile(0.99) as f64 / 1e3,
            snapshot,
            transfer: during || transfer.is_some_and(|t| t.load(Ordering::SeqCst)),
        })
    }

    /// Replica 4 joins under load: the transfer's bytes and time, the
    /// load's rate meanwhile, and its digest once the load stops.
    fn join(&mut self, dir: &ClusterDir, members: &[Member]) -> Result<(), CatchUpError> {
        self.rss.phase("join");
        let ports = free_ports("127.0.0.1", 2)?;
        let mut grown =
            psmr_replica::Config::from_file(&dir.config_file()).map_err(|e| step("config")(e.to_string()))?;
        grown.replicas = members.to_vec();
        grown.replicas.push(Member { id: JOINER, client: ports[0], peer: ports[1], redis: None, metrics: None });
        let file = dir.path().join("grown.toml");
        std::fs::write(&file, grown.to_toml()).map_err(|e| step("writing grown.toml")(e.to_string()))?;
        self.cluster.join(JOINER, &file, ports[0])?;
        let leader = self.leader_addr()?;
        let sent_before = sent(&self.scrape(leader));
        let watch = TransferWatch::start(leader, ports[0], sent_before);
        std::thread::sleep(Duration::from_millis(500));
        self.track_pids();
        let (addrs, start) = (self.addrs()[..3].to_vec(), Instant::now());
        let change = MemberChange::Add { id: JOINER, client: ports[0].to_string(), peer: ports[1].to_string() };
        let add = std::thread::spawn(move || {
            let c = Client::new(ClientConfig::new(addrs.clone())).map_err(|e| e.to_string())?;
            c.change_membership(&addrs, change, AGREE_TIMEOUT).map(|_| ())
        });
        // The load runs until the joiner restored the snapshot; then it
        // stops, so that the joiner, which shares the cores with the
        // others here, can replay the log written meanwhile and become a
        // voter.
        while !add.is_finished() && !watch.restored.load(Ordering::SeqCst) {
            let w = self.window("join", Some(&watch.running))?;
            log_window(self.report.windows.len(), &w);
            self.report.windows.push(w);
        }
        add.join().map_err(|_| CatchUpError::Step("add-replica panicked".into()))?.map_err(step("add-replica"))?;
        self.report.add_s = start.elapsed().as_secs_f64();
        let (bytes, secs) = watch.stop();
        (self.report.transfer_bytes, self.report.transfer_s) = (bytes.saturating_sub(sent_before), secs);
        self.report.joiner_agrees = self.agree()?.is_some();
        Ok(())
    }

    /// Stops a follower while the leader takes three snapshots, restarts
    /// it, and times its catch-up.
    fn down(&mut self) -> Result<(), CatchUpError> {
        self.rss.phase("down");
        let leader_addr = self.leader_addr()?;
        let leader = leader_of(&self.scrape(leader_addr));
        let follower = (1..=3).find(|&id| id != leader).unwrap_or(3);
        self.report.follower = follower;
        let taken = |run: &Self| snapshots(&run.scrape(leader_addr)).1;
        let before = taken(self);
        self.cluster.kill(follower)?;
        // Three snapshots of a large state under load take many windows:
        // each is made once a state's worth of log has been written.
        for _ in 0..DOWN_WINDOWS_MAX {
            if taken(self) >= before + SNAPSHOTS_WHILE_DOWN {
                break;
            }
            let w = self.window("down", None)?;
            log_window(self.report.windows.len(), &w);
            self.report.windows.push(w);
        }
        self.report.snapshots_while_down = taken(self) - before;
        let start = Instant::now();
        self.cluster.restart(follower)?;
        self.report.follower_agrees = self.agree()?.is_some();
        self.report.follower_catch_up_s = start.elapsed().as_secs_f64();
        self.track_pids();
        Ok(())
    }

    /// Waits until every replica answers with one applied index and one
    /// digest; the index, or None if they did not within
    /// [`AGREE_TIMEOUT`].
    fn agree(&mut self) -> Result<Option<u64>, CatchUpError> {
        let deadline = Instant::now() + AGREE_TIMEOUT;
        while Instant::now() < deadline {
            if let Some((id, status)) = self.cluster.exited().into_iter().next() {
                let status = psmr_harness::launch::describe_exit(status);
                return Err(CatchUpError::Step(format!("replica {id} exited: {status}")));
            }
            let s: Vec<Option<ReplicaStatus>> = self.statuses();
            let all: Vec<&ReplicaStatus> = s.iter().flatten().collect();
            let same = all.windows(2).all(|w| w[0].applied == w[1].applied && w[0].digest == w[1].digest);
            if all.len() == s.len() && same {
                return Ok(all.first().map(|s| s.applied));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok(None)
    }
}

/// One line on stderr per window, as the run goes.
fn log_window(i: usize, w: &Window) {
    eprintln!(
        "window {i} ({}): {:.0} writes/s, max {:.1} ms{}{}",
        w.phase,
        w.commands_per_s,
        w.max_ms,
        if w.snapshot { ", snapshot" } else { "" },
        if w.transfer { ", transfer" } else { "" }
    );
}

/// Writes keys `range` with random values, [`FILL_BATCH`] to an `MSET`.
fn fill_range(addrs: Vec<SocketAddr>, range: std::ops::Range<u64>, value_bytes: u64, seed: u64) -> Result<(), String> {
    let mut client = Client::new(ClientConfig::new(addrs)).map_err(|e| e.to_string())?;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let mut n = range.start;
    while n < range.end {
        let pairs: Vec<(Vec<u8>, Vec<u8>)> = (n..(n + FILL_BATCH).min(range.end))
            .map(|k| {
                let mut v = vec![0; value_bytes as usize];
                rng.fill_bytes(&mut v);
                (key_bytes(k), v)
            })
            .collect();
        n += pairs.len() as u64;
        let replies = client.call(&KvCodec, &[KvOp::MSet { pairs }]).map_err(|e| e.to_string())?;
        if let Some(Err(e)) = replies.into_iter().next() {
            return Err(format!("MSET refused: {e}"));
        }
    }
    Ok(())
}

/// A replica's snapshots: (started, written), from its metrics.
fn snapshots(s: &Scrape) -> (u64, u64) {
    let count = |name: &str| s.value(name).unwrap_or(0.0) as u64;
    (count("psmr_snapshot_pause_seconds_count"), count("psmr_snapshot_seconds_count"))
}

/// The leader a replica follows (0: none), from its metrics.
fn leader_of(s: &Scrape) -> u64 {
    s.value("psmr_raft_leader").unwrap_or(0.0) as u64
}

/// Snapshot bytes a replica has sent.
fn sent(s: &Scrape) -> u64 {
    s.get("psmr_snapshot_transfer_bytes_total", &[("direction", "sent")]).unwrap_or(0.0) as u64
}

/// Watches a transfer to the joiner every [`RSS_EVERY`]: running from the
/// leader's first byte sent until the joiner has restored a snapshot.
struct TransferWatch {
    running: Arc<AtomicBool>,
    restored: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<(u64, f64)>>,
}

impl TransferWatch {
    fn start(leader: SocketAddr, joiner: SocketAddr, sent_before: u64) -> Self {
        let (running, stop) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
        let restored = Arc::new(AtomicBool::new(false));
        let (r, st, done) = (running.clone(), stop.clone(), restored.clone());
        let handle = std::thread::spawn(move || {
            let Ok(c) = Client::new(ClientConfig::new(vec![leader])) else { return (0, 0.0) };
            let scrape = |a| Scrape::parse(&c.metrics_of(a, Duration::from_secs(1)).unwrap_or_default());
            let (mut first, mut bytes) = (None, sent_before);
            while !st.load(Ordering::SeqCst) {
                bytes = bytes.max(sent(&scrape(leader)));
                if first.is_none() && bytes > sent_before {
                    first = Some(Instant::now());
                    r.store(true, Ordering::SeqCst);
                }
                if scrape(joiner).value("psmr_snapshots_restored_total").unwrap_or(0.0) >= 1.0 {
                    r.store(false, Ordering::SeqCst);
                    done.store(true, Ordering::SeqCst);
                    return (sent(&scrape(leader)), first.map_or(0.0, |f| f.elapsed().as_secs_f64()));
                }
                std::thread::sleep(RSS_EVERY);
            }
            (bytes, first.map_or(0.0, |f| f.elapsed().as_secs_f64()))
        });
        Self { running, restored, stop, handle: Some(handle) }
    }

    /// The bytes sent in all and the transfer's seconds.
    fn stop(mut self) -> (u64, f64) {
        self.stop.store(true, Ordering::SeqCst);
        self.handle.take().and_then(|h| h.join().ok()).unwrap_or((0, 0.0))
    }
}

/// Lets the thread go if a step failed before [`TransferWatch::stop`].
impl Drop for TransferWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// Reads every tracked replica's RSS every [`RSS_EVERY`], tagged with the
/// phase.
struct Sampler {
    pids: Arc<Mutex<Vec<(u64, u32)>>>,
    phase: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<Vec<(usize, u64, u64)>>>,
}

impl Sampler {
    fn start() -> Self {
        let pids: Arc<Mutex<Vec<(u64, u32)>>> = Arc::default();
        let (phase, stop) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicBool::new(false)));
        let (p, ph, st) = (pids.clone(), phase.clone(), stop.clone());
        let handle = std::thread::spawn(move || {
            let mut samples = Vec::new();
            while !st.load(Ordering::SeqCst) {
                let now = p.lock().map(|v| v.clone()).unwrap_or_default();
                for (id, pid) in now {
                    if let Some(rss) = rss_bytes(pid) {
                        samples.push((ph.load(Ordering::SeqCst), id, rss));
                    }
                }
                std::thread::sleep(RSS_EVERY);
            }
            samples
        });
        Self { pids, phase, stop, handle: Some(handle) }
    }

    fn phase(&self, name: &str) {
        let i = PHASES.iter().position(|p| *p == name).expect("a phase of PHASES");
        self.phase.store(i, Ordering::SeqCst);
    }

    /// Each replica's peak and last RSS per phase.
    fn stop(mut self) -> Vec<Rss> {
        self.stop.store(true, Ordering::SeqCst);
        let samples = self.handle.take().and_then(|h| h.join().ok()).unwrap_or_default();
        let mut rows: Vec<Rss> = Vec::new();
        for (phase, id, rss) in samples {
            let mib = rss as f64 / MIB;
            match rows.iter_mut().find(|r| r.id == id && r.phase == PHASES[phase]) {
                Some(r) => (r.peak_mib, r.last_mib) = (r.peak_mib.max(mib), mib),
                None => rows.push(Rss { id, phase: PHASES[phase], peak_mib: mib, last_mib: mib }),
            }
        }
        rows.sort_by_key(|r| (r.id, PHASES.iter().position(|p| *p == r.phase)));
        rows
    }
}

/// Lets the thread go if a step failed before [`Sampler::stop`].
impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// A process's resident set, from `/proc/PID/status`.
fn rss_bytes(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = text.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

impl CatchUpReport {
    /// The mean rate of the windows of `phase` that `pick` keeps.
    fn rate(&self, phase: &str, pick: impl Fn(&Window) -> bool) -> Option<f64> {
        let w: Vec<f64> =
            self.windows.iter().filter(|w| w.phase == phase && pick(w)).map(|w| w.commands_per_s).collect();
        (!w.is_empty()).then(|| w.iter().sum::<f64>() / w.len() as f64)
    }

    /// The longest request of the load phase's windows that `pick` keeps.
    fn longest(&self, pick: impl Fn(&Window) -> bool) -> Option<f64> {
        self.windows.iter().filter(|w| w.phase == "load" && pick(w)).map(|w| w.max_ms).reduce(f64::max)
    }

    /// The most any request of the load phase's windows that `pick` keeps
    /// waited beyond its window's 99th percentile: a stall shows here even
    /// where the snapshot's CPU slows every request (and so the
    /// percentiles) on a machine without a spare core.
    fn beyond_p99(&self, pick: impl Fn(&Window) -> bool) -> Option<f64> {
        let w = self.windows.iter().filter(|w| w.phase == "load" && pick(w));
        w.map(|w| w.max_ms - w.p99_ms).reduce(f64::max)
    }

    /// The report as Markdown: the figures, then the windows and the RSS.
    pub fn to_markdown(&self) -> String {
        let or_na = |v: Option<f64>, unit: &str| v.map_or("n/a".into(), |v| format!("{v:.1}{unit}"));
        let baseline = self.rate("load", |_| true);
        let during = self.rate("join", |w| w.transfer);
        let ratio = baseline.zip(during).map(|(b, d)| d / b);
        let (with, without) = (self.longest(|w| w.snapshot), self.longest(|w| !w.snapshot));
        let (beyond_with, beyond_without) = (self.beyond_p99(|w| w.snapshot), self.beyond_p99(|w| !w.snapshot));
        let mb_s = (self.transfer_s > 0.0).then(|| self.transfer_bytes as f64 / 1e6 / self.transfer_s);
        let worst = self.rss.iter().map(|r| r.peak_mib).fold(0.0, f64::max);
        let mut out = format!(
            "# catch-up\n\n| figure | value |\n| --- | ---: |\n\
             | state (keys and values) | {} keys, {:.0} MiB |\n| fill | {:.1} s |\n\
             | leader's last snapshot file | {:.0} MiB |\n\
             | transfer to replica {JOINER} | {:.0} MiB in {:.1} s = {} MB/s |\n\
             | add-replica until voter | {:.1} s |\n| replica {JOINER} agrees (applied, digest) | {} |\n\
             | writes/s without a transfer (load phase) | {} |\n| writes/s during the transfer | {} |\n\
             | during / without | {} |\n\
             | longest request, load windows with a snapshot being taken | {} |\n\
             | longest request, load windows without | {} |\n\
             | most beyond the window's p99, with a snapshot / without | {} / {} |\n\
             | follower {} down for {} snapshots: catch-up after restart | {:.1} s, agrees: {} |\n\
             | RSS bound (1.25 × state + 256 MiB) | {:.0} MiB; highest peak {:.0} MiB |\n",
            self.keys,
            self.state_bytes as f64 / MIB,
            self.fill_s,
            self.snapshot_bytes as f64 / MIB,
            self.transfer_bytes as f64 / MIB,
            self.transfer_s,
            or_na(mb_s, ""),
            self.add_s,
            self.joiner_agrees,
            or_na(baseline, ""),
            or_na(during, ""),
            or_na(ratio.map(|r| r * 100.0), " %"),
            or_na(with, " ms"),
            or_na(without, " ms"),
            or_na(beyond_with, " ms"),
            or_na(beyond_without, " ms"),
            self.follower,
            self.snapshots_while_down,
            self.follower_catch_up_s,
            self.follower_agrees,
            self.rss_bound_mib,
            worst,
        );
        out += "\n| window | phase | writes/s | p50 ms | p99 ms | max ms | snapshot | transfer |\n| ---: | --- | ---: | ---: | ---: | ---: | --- | --- |\n";
        for (i, w) in self.windows.iter().enumerate() {
            out += &format!(
                "| {i} | {} | {:.0} | {:.1} | {:.1} | {:.1} | {} | {} |\n",
                w.phase, w.commands_per_s, w.p50_ms, w.p99_ms, w.max_ms, w.snapshot, w.transfer
            );
        }
        out += "\n| replica | phase | peak RSS MiB | last MiB |\n| ---: | --- | ---: | ---: |\n";
        for r in &self.rss {
            out += &format!("| {} | {} | {:.0} | {:.0} |\n", r.id, r.phase, r.peak_mib, r.last_mib);
        }
        out
    }
}
