//! `psmr rt-bench`: psmr-rt's pools, policy by policy, next to tokio's
//! multi-thread runtime with the same worker count, on the workloads of
//! 001 (§4.2, §5.3, §5.5) and two micro-benchmarks, with identical task
//! bodies on both (the [`Exec`] trait is all a body sees of its runtime).
//!
//! Each run prints throughput, latency percentiles (HdrHistogram, µs) and
//! psmr-rt's counters (steals, overflows, parks); tokio keeps none that
//! its stable API shows.

use crate::report::chart;
use hdrhistogram::Histogram;
use psmr_rt::{Full, Handle, Policy, PoolConfig, Runtime, Steal, Victims, WorkerStats};
use serde::Serialize;
use std::fmt;
use std::future::Future;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use thiserror::Error;

/// Why a run cannot be made.
#[derive(Debug, Error)]
pub enum RtBenchError {
    /// A bad setting.
    #[error("{0}")]
    Config(String),
    /// A pool would not start, or its tasks panicked.
    #[error(transparent)]
    Rt(#[from] psmr_rt::RtError),
    /// tokio's runtime would not start.
    #[error("cannot start tokio's runtime: {0}")]
    Tokio(std::io::Error),
}

/// The workloads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    /// Spawn-and-run of empty tasks by one spawner: ns per task.
    Spawn,
    /// Two tasks taking turns, each yielding until it is its turn: ns per
    /// turn.
    Yield,
    /// 001 §4.2.1, §5.3.1: spawners copy a random 2-3 KiB packet and spawn
    /// a task that counts its newlines.
    Packet,
    /// 001 §5.3.2: each packet task then spawns a chain of 10 tasks, each
    /// reading 20 random bytes of the packet.
    PacketCache,
    /// 001 §5.3.3: chains of 3; with probability 0.1 % the chain's end
    /// spawns two 20 ms tasks (on their own pool with `--staged`).
    PacketBimodal,
    /// 001 §4.2.3, §5.5: binomial option prices, 99.5 % with 20 time steps
    /// and 0.5 % with 2 000, one task per time step; latency from the
    /// start of the workload.
    Options,
    /// 001 §4.2.2, §5.4: conferences of a mixer task and 4 call-leg tasks
    /// exchanging 1600-byte frames through one-frame slots, yielding while
    /// they wait; a mix finished more than 10 ms after its oldest input is
    /// a breach.
    Mixer,
}

impl Workload {
    /// Every workload, in the order `--workload all` runs them.
    pub const ALL: [Workload; 7] = [
        Workload::Spawn,
        Workload::Yield,
        Workload::Packet,
        Workload::PacketCache,
        Workload::PacketBimodal,
        Workload::Options,
        Workload::Mixer,
    ];

    fn name(self) -> &'static str {
        match self {
            Workload::Spawn => "spawn",
            Workload::Yield => "yield",
            Workload::Packet => "packet",
            Workload::PacketCache => "packet-cache",
            Workload::PacketBimodal => "packet-bimodal",
            Workload::Options => "options",
            Workload::Mixer => "mixer",
        }
    }

    /// Tasks (packets, options, spawns, turns) a run makes by default.
    pub fn default_tasks(self) -> usize {
        match self {
            Workload::Spawn | Workload::Yield => 1_000_000,
            Workload::Packet => 50_000,
            Workload::PacketCache | Workload::PacketBimodal => 100_000,
            Workload::Options => 30_000,
            Workload::Mixer => 10_000,
        }
    }

    /// 001's local queue capacity and spawners for the workload, and what
    /// a full local queue does. Options' queues grow (001 §5.5 speaks of
    /// its queues growing with more spawners), so that `fifo` and `lifo`
    /// keep their order; overflowing half of a spawner's queue into the
    /// injector, which a worker looks at only now and then, would run the
    /// newer options ahead of the older ones under either policy.
    fn shape(self) -> (usize, usize, Full) {
        match self {
            Workload::PacketCache => (1024, 5, Full::Overflow),
            Workload::PacketBimodal => (1024, 1, Full::Overflow),
            Workload::Options => (128, 1, Full::Resize),
            _ => (128, 1, Full::Overflow),
        }
    }
}

impl fmt::Display for Workload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Workload {
    type Err = RtBenchError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Workload::ALL.into_iter().find(|w| w.name() == s.trim()).ok_or_else(|| {
            let known: Vec<&str> = Workload::ALL.iter().map(|w| w.name()).collect();
            RtBenchError::Config(format!("unknown workload {s:?} (known: {})", known.join(", ")))
        })
    }
}

/// What `psmr rt-bench` runs.
#[derive(Clone, Debug)]
pub struct RtBenchConfig {
    /// The workload.
    pub workload: Workload,
    /// Worker threads of every runtime.
    pub workers: usize,
    /// Tasks (packets, options, spawns, turns) per run.
    pub tasks: usize,
    /// Spawner tasks (packet workloads; default 001's).
    pub spawners: Option<usize>,
    /// psmr-rt's local queue capacity (default 001's for the workload).
    pub capacity: Option<usize>,
    /// The psmr-rt policies, each a run.
    pub policies: Vec<Policy>,
    /// psmr-rt's stealing.
    pub steal: Steal,
    /// psmr-rt's victims.
    pub victims: Victims,
    /// psmr-rt's full queues (default: the workload's, as 001 ran it).
    pub full: Option<Full>,
    /// packet-bimodal: the heavy tasks on a pool of their own (one worker)
    /// for psmr-rt; tokio runs them inline.
    pub staged: bool,
    /// mixer: conferences (each a mixer and 4 legs; `tasks` frames each).
    pub conferences: usize,
    /// mixer: psmr-rt runs this many pools (silos), the workers split
    /// among them, each conference in one (001 §5.4 "10S"); 1: one pool.
    pub silos: usize,
    /// Runs of each runtime; the one of median throughput is reported.
    pub repeat: usize,
    /// Seed of the packets, the spawners' choices and the pools'.
    pub seed: u64,
}

impl RtBenchConfig {
    /// What psmr-rt's full local queues do in this run.
    pub fn full(&self) -> Full {
        self.full.unwrap_or(self.workload.shape().2)
    }

    /// The defaults for `workload`: 2 workers, every policy, 001's queue
    /// sizes and spawners.
    pub fn new(workload: Workload) -> Self {
        Self {
            workload,
            workers: 2,
            tasks: workload.default_tasks(),
            spawners: None,
            capacity: None,
            policies: Policy::ALL.to_vec(),
            steal: Steal::Half,
            victims: Victims::Random,
            full: None,
            staged: false,
            conferences: 8,
            silos: 1,
            repeat: 1,
            seed: 1,
        }
    }

    fn validate(&self) -> Result<(), RtBenchError> {
        let bad = |s: String| Err(RtBenchError::Config(s));
        if !(1..=256).contains(&self.workers) {
            return bad(format!("--workers must be between 1 and 256, got {}", self.workers));
        }
        if !(1..=100_000_000).contains(&self.tasks) {
            return bad(format!("--tasks must be between 1 and 100000000, got {}", self.tasks));
        }
        if self.spawners.is_some_and(|s| !(1..=64).contains(&s)) {
            return bad("--spawners must be between 1 and 64".into());
        }
        if !(1..=4096).contains(&self.conferences) {
            return bad(format!("--conferences must be between 1 and 4096, got {}", self.conferences));
        }
        if !(1..=self.workers).contains(&self.silos) {
            return bad(format!("--silos must be between 1 and the workers ({}), got {}", self.workers, self.silos));
        }
        if !(1..=100).contains(&self.repeat) {
            return bad(format!("--repeat must be between 1 and 100, got {}", self.repeat));
        }
        Ok(())
    }
}

/// Latency percentiles, µs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Tail {
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th.
    pub p999: f64,
    /// 99.99th.
    pub p9999: f64,
}

/// One runtime's run.
#[derive(Clone, Debug, Serialize)]
pub struct RtRun {
    /// `psmr-rt fifo`, `tokio`, ...
    pub runtime: String,
    /// Tasks (packets, options, spawns, turns) completed.
    pub tasks: u64,
    /// Wall time, seconds.
    pub seconds: f64,
    /// Tasks per second.
    pub per_s: f64,
    /// Nanoseconds per task.
    pub ns_per_task: f64,
    /// Latency of each task (packets: from its copy to its end; options:
    /// from the start of the workload), µs; none for the micro-benchmarks.
    pub latency_us: Option<Tail>,
    /// psmr-rt's counters summed over its workers.
    pub counters: Option<Counters>,
    /// mixer: the share of mixes finished more than 10 ms after their
    /// oldest input.
    pub breaches: Option<f64>,
}

/// psmr-rt's counters of a run, summed over the workers.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Counters {
    /// Steal attempts.
    pub steals_tried: u64,
    /// Steals that took something.
    pub steals_ok: u64,
    /// Full-queue overflows.
    pub overflows: u64,
    /// Full-queue growths.
    pub resizes: u64,
    /// Parks.
    pub parks: u64,
    /// Queue wait p99, µs.
    pub queue_wait_p99_us: f64,
}

/// What a task body sees of its runtime.
pub trait Exec: Clone + Send + Sync + 'static {
    /// Spawns `future`, detached.
    fn spawn<F: Future<Output = ()> + Send + 'static>(&self, future: F);
    /// Gives the runtime's other tasks a turn.
    fn yield_now() -> impl Future<Output = ()> + Send;
}

impl Exec for Handle {
    fn spawn<F: Future<Output = ()> + Send + 'static>(&self, future: F) {
        drop(Handle::spawn(self, future));
    }

    fn yield_now() -> impl Future<Output = ()> + Send {
        psmr_rt::yield_now()
    }
}

/// tokio's multi-thread runtime, through its handle.
#[derive(Clone)]
pub struct Tokio(tokio::runtime::Handle);

impl Exec for Tokio {
    fn spawn<F: Future<Output = ()> + Send + 'static>(&self, future: F) {
        drop(self.0.spawn(future));
    }

    fn yield_now() -> impl Future<Output = ()> + Send {
        tokio::task::yield_now()
    }
}

/// Counts completions down to zero and wakes the waiter then: the end of a
/// run, without polling.
struct Latch {
    left: AtomicUsize,
    done: Mutex<bool>,
    cv: Condvar,
}

impl Latch {
    fn new(n: usize) -> Arc<Self> {
        Arc::new(Latch { left: AtomicUsize::new(n), done: Mutex::new(n == 0), cv: Condvar::new() })
    }

    fn count_down(&self) {
        if self.left.fetch_sub(1, Ordering::AcqRel) == 1 {
            *self.done.lock().unwrap_or_else(|e| e.into_inner()) = true;
            self.cv.notify_all();
        }
    }

    fn wait(&self) {
        let mut done = self.done.lock().unwrap_or_else(|e| e.into_inner());
        while !*done {
            done = self.cv.wait(done).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// What every task of a run shares: when it started, the end latch, each
/// task's latency slot.
struct Run {
    start: Instant,
    latch: Arc<Latch>,
    latency_ns: Vec<AtomicU64>,
}

impl Run {
    fn new(tasks: usize, latched: usize) -> Arc<Self> {
        Arc::new(Run {
            start: Instant::now(),
            latch: Latch::new(latched),
            latency_ns: (0..tasks).map(|_| AtomicU64::new(0)).collect(),
        })
    }

    fn done(&self, task: usize, since: Instant) {
        self.latency_ns[task].store(since.elapsed().as_nanos() as u64, Ordering::Relaxed);
        self.latch.count_down();
    }

    fn tail(&self) -> Tail {
        let mut h = Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3).expect("static bounds");
        for l in &self.latency_ns {
            h.saturating_record((l.load(Ordering::Relaxed) / 1000).max(1));
        }
        tail(&h)
    }
}

/// The percentiles of `h` (µs).
fn tail(h: &Histogram<u64>) -> Tail {
    let q = |p| h.value_at_quantile(p) as f64;
    Tail { p50: q(0.5), p99: q(0.99), p999: q(0.999), p9999: q(0.9999) }
}

/// What a workload leaves for its result.
struct Outcome {
    run: Arc<Run>,
    /// Tasks (packets, options, spawns, turns, mixes) completed.
    tasks: u64,
    /// The mixer's delays and breaches.
    mix: Option<Arc<MixStats>>,
}

/// xorshift64: the spawners' choices, from the seed.
struct Rng(u64);

impl Rng {
    fn new(seed: u64, stream: usize) -> Self {
        Rng((seed ^ (stream as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// 64 packets of 2 to 3 KiB, about one byte in 64 a newline.
fn packets(seed: u64) -> Arc<Vec<Vec<u8>>> {
    let mut rng = Rng::new(seed, 1_000);
    let packets = (0..64)
        .map(|_| {
            let len = 2048 + (rng.next() % 1024) as usize;
            (0..len).map(|_| if rng.next() % 64 == 0 { b'\n' } else { (rng.next() % 255) as u8 + 1 }).collect()
        })
        .collect();
    Arc::new(packets)
}

/// Busy for `d` (a task that hogs its worker, 001 §5.3.3).
fn spin_for(d: Duration) {
    let until = Instant::now() + d;
    while Instant::now() < until {
        std::hint::spin_loop();
    }
}

/// Runs `config.workload` on `exec` (and `heavy` for the bimodal heavy
/// tasks, `silos` for the mixer's conferences); returns when every task is
/// done.
fn workload<E: Exec>(exec: &E, heavy: &E, silos: &[E], config: &RtBenchConfig) -> Outcome {
    let n = config.tasks;
    match config.workload {
        Workload::Spawn => {
            let run = Run::new(0, n);
            let (e, r) = (exec.clone(), run.clone());
            exec.spawn(async move {
                for _ in 0..n {
                    let r = r.clone();
                    e.spawn(async move { r.latch.count_down() });
                }
            });
            run.latch.wait();
            Outcome { run, tasks: n as u64, mix: None }
        }
        Workload::Yield => {
            let run = Run::new(0, 2);
            let turn = Arc::new(AtomicBool::new(false));
            for me in [false, true] {
                let (r, t) = (run.clone(), turn.clone());
                exec.spawn(async move {
                    for _ in 0..n / 2 {
                        while t.load(Ordering::Acquire) != me {
                            E::yield_now().await;
                        }
                        t.store(!me, Ordering::Release);
                    }
                    r.latch.count_down();
                });
            }
            run.latch.wait();
            Outcome { run, tasks: n as u64, mix: None }
        }
        Workload::Packet | Workload::PacketCache | Workload::PacketBimodal => packet_family(exec, heavy, config),
        Workload::Options => options(exec, config),
        Workload::Mixer => mixer(silos, config),
    }
}

fn packet_family<E: Exec>(exec: &E, heavy: &E, config: &RtBenchConfig) -> Outcome {
    let n = config.tasks;
    let spawners = config.spawners.unwrap_or(config.workload.shape().1);
    let chain = match config.workload {
        Workload::PacketCache => 10,
        Workload::PacketBimodal => 3,
        _ => 0,
    };
    // The heavy tasks of the bimodal chains, decided up front.
    let mut rng = Rng::new(config.seed, 999);
    let heavy_chains: Vec<bool> =
        (0..n).map(|_| config.workload == Workload::PacketBimodal && rng.next() % 1000 == 0).collect();
    let heavy_tasks = 2 * heavy_chains.iter().filter(|&&h| h).count();
    let run = Run::new(n, n + heavy_tasks);
    let heavy_chains = Arc::new(heavy_chains);
    let packets = packets(config.seed);
    for s in 0..spawners {
        let (e, h, r, p, hc) = (exec.clone(), heavy.clone(), run.clone(), packets.clone(), heavy_chains.clone());
        let seed = config.seed;
        exec.spawn(async move {
            let mut rng = Rng::new(seed, s);
            for i in (s..n).step_by(spawners) {
                let packet: Arc<Vec<u8>> = Arc::new(p[(rng.next() % 64) as usize].clone());
                let born = Instant::now();
                let (e2, h2, r2, heavy) = (e.clone(), h.clone(), r.clone(), hc[i]);
                e.spawn(async move {
                    std::hint::black_box(packet.iter().filter(|&&b| b == b'\n').count());
                    if chain == 0 {
                        finish(&h2, &r2, i, born, heavy);
                    } else {
                        let e3 = e2.clone();
                        e2.spawn(async move { link(e3, h2, r2, packet, i, born, chain, heavy, rng_seed(seed, i)) });
                    }
                });
            }
        });
    }
    run.latch.wait();
    Outcome { run, tasks: n as u64, mix: None }
}

fn rng_seed(seed: u64, i: usize) -> u64 {
    seed.wrapping_add(i as u64).wrapping_mul(0x2545_f491_4f6c_dd1d) | 1
}

/// The end of packet `i`'s chain: its latency, and for a heavy chain the
/// two heavy tasks.
fn finish<E: Exec>(h: &E, run: &Arc<Run>, i: usize, born: Instant, heavy: bool) {
    if heavy {
        for _ in 0..2 {
            let r = run.clone();
            h.spawn(async move {
                spin_for(Duration::from_millis(20));
                r.latch.count_down();
            });
        }
    }
    run.done(i, born);
}

/// One link of a packet's chain of `left` more: reads 20 random bytes of
/// the packet and spawns the next link, or ends the chain.
#[allow(clippy::too_many_arguments)]
fn link<E: Exec>(
    e: E,
    h: E,
    run: Arc<Run>,
    packet: Arc<Vec<u8>>,
    i: usize,
    born: Instant,
    left: u32,
    heavy: bool,
    seed: u64,
) {
    let mut rng = Rng(seed);
    let mut sum = 0u64;
    for _ in 0..20 {
        sum = sum.wrapping_add(u64::from(packet[(rng.next() % packet.len() as u64) as usize]));
    }
    std::hint::black_box(sum);
    if left <= 1 {
        finish(&h, &run, i, born, heavy);
        return;
    }
    let next = rng.0;
    let e2 = e.clone();
    e.spawn(async move { link(e2, h, run, packet, i, born, left - 1, heavy, next) });
}

fn options<E: Exec>(exec: &E, config: &RtBenchConfig) -> Outcome {
    let n = config.tasks;
    let run = Run::new(n, n);
    let (e, r, seed) = (exec.clone(), run.clone(), config.seed);
    exec.spawn(async move {
        let mut rng = Rng::new(seed, 7);
        for i in 0..n {
            let steps = if rng.next() % 1000 < 5 { 2000 } else { 20 };
            let strike = 90.0 + (rng.next() % 20) as f64;
            let (e2, r2) = (e.clone(), r.clone());
            e.spawn(async move { step(e2, r2, i, Lattice::new(100.0, strike, steps)) });
        }
    });
    run.latch.wait();
    Outcome { run, tasks: n as u64, mix: None }
}

/// An American put's binomial lattice, walked backwards one time step at
/// a time. Early exercise is why such options are priced on a lattice at
/// all (a European one has a closed form), and it makes every node look at
/// the underlying's price there: a few flops and a multiplication chain per
/// node, so that a 2 000-step option weighs what it does in practice
/// against the per-task cost of the 20-step ones.
struct Lattice {
    spot: f64,
    strike: f64,
    /// The option's values at the nodes of the time step reached.
    values: Vec<f64>,
}

impl Lattice {
    /// Up move per step; a down move is its inverse.
    const UP: f64 = 1.01;
    /// Probability of an up move.
    const P: f64 = 0.5;
    /// Discount per step.
    const DISCOUNT: f64 = 0.9999;

    /// The payoffs at the leaves, `steps` steps from now.
    fn new(spot: f64, strike: f64, steps: usize) -> Lattice {
        let values = (0..=steps).map(|j| (strike - Self::price(spot, j, steps)).max(0.0)).collect();
        Lattice { spot, strike, values }
    }

    /// The underlying's price at node `j` of time step `t`.
    fn price(spot: f64, j: usize, t: usize) -> f64 {
        spot * Self::UP.powi(2 * j as i32 - t as i32)
    }

    /// Time steps left before the root.
    fn steps(&self) -> usize {
        self.values.len() - 1
    }

    /// One step backwards: each node holds the larger of its discounted
    /// expectation and exercising there. The root has no step behind it.
    fn back(&mut self) {
        let Some(t) = self.steps().checked_sub(1) else { return };
        let mut s = Self::price(self.spot, 0, t);
        for j in 0..=t {
            let hold = Self::DISCOUNT * (Self::P * self.values[j + 1] + (1.0 - Self::P) * self.values[j]);
            self.values[j] = hold.max(self.strike - s);
            s *= Self::UP * Self::UP;
        }
        self.values.truncate(t + 1);
    }
}

/// One time step of an option's lattice; the next step is the next task.
fn step<E: Exec>(e: E, run: Arc<Run>, i: usize, mut lattice: Lattice) {
    lattice.back();
    if lattice.steps() == 0 {
        std::hint::black_box(lattice.values[0]);
        run.done(i, run.start);
        return;
    }
    let e2 = e.clone();
    e.spawn(async move { step(e2, run, i, lattice) });
}

/// A one-frame slot between two tasks of a conference.
#[derive(Default)]
struct Slot(Mutex<Option<(Instant, Vec<i16>)>>);

impl Slot {
    /// Puts `frame` in, or hands it back if the slot is full.
    fn put(&self, frame: (Instant, Vec<i16>)) -> Result<(), (Instant, Vec<i16>)> {
        let mut s = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match s.is_some() {
            true => Err(frame),
            false => {
                *s = Some(frame);
                Ok(())
            }
        }
    }

    fn take(&self) -> Option<(Instant, Vec<i16>)> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    /// Puts `frame` in, yielding while the slot is full.
    async fn send<E: Exec>(&self, frame: (Instant, Vec<i16>)) {
        let mut frame = Some(frame);
        while let Some(f) = frame.take() {
            if let Err(f) = self.put(f) {
                frame = Some(f);
                E::yield_now().await;
            }
        }
    }

    /// Takes the frame, yielding while there is none.
    async fn recv<E: Exec>(&self) -> (Instant, Vec<i16>) {
        loop {
            if let Some(f) = self.take() {
                return f;
            }
            E::yield_now().await;
        }
    }
}

/// 16-bit samples of a frame: 1600 bytes, as 001's mixer sends every
/// 20 ms.
const FRAME_SAMPLES: usize = 800;

/// A codec's work on a frame: a few filter passes.
fn codec(frame: &mut [i16]) -> i64 {
    for _ in 0..4 {
        for i in 1..frame.len() {
            frame[i] = frame[i].wrapping_add(frame[i - 1] >> 1);
        }
    }
    frame.iter().map(|&s| i64::from(s)).sum()
}

/// What the mixers of a run count.
struct MixStats {
    breaches: AtomicU64,
    delays_us: Mutex<Histogram<u64>>,
}

fn mixer<E: Exec>(silos: &[E], config: &RtBenchConfig) -> Outcome {
    let frames = config.tasks;
    let run = Run::new(0, config.conferences * 5);
    let stats = Arc::new(MixStats {
        breaches: AtomicU64::new(0),
        delays_us: Mutex::new(Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("static bounds")),
    });
    for c in 0..config.conferences {
        let exec = &silos[c % silos.len()];
        let ups: Vec<Arc<Slot>> = (0..4).map(|_| Arc::default()).collect();
        let downs: Vec<Arc<Slot>> = (0..4).map(|_| Arc::default()).collect();
        for (up, down) in ups.iter().cloned().zip(downs.iter().cloned()) {
            let r = run.clone();
            exec.spawn(async move {
                for f in 0..frames {
                    let mut frame: Vec<i16> = (0..FRAME_SAMPLES).map(|i| ((i + f) % 251) as i16).collect();
                    codec(&mut frame);
                    up.send::<E>((Instant::now(), frame)).await;
                    let (_, mut mixed) = down.recv::<E>().await;
                    std::hint::black_box(codec(&mut mixed));
                }
                r.latch.count_down();
            });
        }
        let (r, st) = (run.clone(), stats.clone());
        exec.spawn(async move {
            let mut delays = Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3).expect("static bounds");
            for _ in 0..frames {
                let mut mix = vec![0i16; FRAME_SAMPLES];
                let mut oldest: Option<Instant> = None;
                for up in &ups {
                    let (at, frame) = up.recv::<E>().await;
                    oldest = Some(oldest.map_or(at, |o| o.min(at)));
                    for (m, s) in mix.iter_mut().zip(&frame) {
                        *m = m.wrapping_add(*s);
                    }
                }
                let delay = oldest.map_or(Duration::ZERO, |o| o.elapsed());
                delays.saturating_record((delay.as_micros() as u64).max(1));
                if delay > Duration::from_millis(10) {
                    st.breaches.fetch_add(1, Ordering::Relaxed);
                }
                for down in &downs {
                    down.send::<E>((Instant::now(), mix.clone())).await;
                }
            }
            let _ = st.delays_us.lock().unwrap_or_else(|e| e.into_inner()).add(&delays);
            r.latch.count_down();
        });
    }
    run.latch.wait();
    let tasks = (config.conferences * frames) as u64;
    Outcome { run, tasks, mix: Some(stats) }
}

/// The pools of a psmr-rt run: `bench` (or, for a siloed mixer, `s0`,
/// `s1`, ... sharing the workers), and `heavy` for a staged bimodal run.
fn pools(config: &RtBenchConfig, policy: Policy) -> Vec<PoolConfig> {
    let pool = |name: &str, workers: usize| PoolConfig {
        policy,
        steal: config.steal,
        victims: config.victims,
        full: config.full(),
        capacity: config.capacity.unwrap_or(config.workload.shape().0),
        seed: config.seed,
        ..PoolConfig::new(name, workers)
    };
    let silos = if config.workload == Workload::Mixer { config.silos } else { 1 };
    let mut pools: Vec<PoolConfig> = match silos {
        1 => vec![pool("bench", config.workers)],
        n => (0..n).map(|i| pool(&format!("s{i}"), config.workers / n + usize::from(i < config.workers % n))).collect(),
    };
    if config.staged && config.workload == Workload::PacketBimodal {
        pools.push(PoolConfig { policy: Policy::Fifo, ..PoolConfig::new("heavy", 1) });
    }
    pools
}

/// One psmr-rt run with `policy`.
fn run_psmr(config: &RtBenchConfig, policy: Policy) -> Result<RtRun, RtBenchError> {
    let configs = pools(config, policy);
    let name = match (configs.iter().any(|c| c.name == "heavy"), config.workload == Workload::Mixer && config.silos > 1)
    {
        (true, _) => format!("psmr-rt {policy} staged"),
        (_, true) => format!("psmr-rt {policy} {}S", config.silos),
        _ => format!("psmr-rt {policy}"),
    };
    let rt = Runtime::start(configs)?;
    let silos: Vec<Handle> = rt.handles().into_iter().filter(|h| h.name() != "heavy").collect();
    let main = silos[0].clone();
    let heavy = rt.pool("heavy").unwrap_or_else(|| main.clone());
    let began = Instant::now();
    let outcome = workload(&main, &heavy, &silos, config);
    let seconds = began.elapsed().as_secs_f64();
    let stats = rt.shutdown()?;
    let mut total = WorkerStats::default();
    let mut waits = stats[0].queue_wait_ns.clone();
    for pool in &stats {
        for w in &pool.workers {
            total += w;
        }
        if pool.name != stats[0].name {
            let _ = waits.add(&pool.queue_wait_ns);
        }
    }
    let counters = Counters {
        steals_tried: total.steals_tried,
        steals_ok: total.steals_ok,
        overflows: total.overflows,
        resizes: total.resizes,
        parks: total.parks,
        queue_wait_p99_us: waits.value_at_quantile(0.99) as f64 / 1000.0,
    };
    Ok(result(name, &outcome, seconds, Some(counters)))
}

/// One tokio run.
fn run_tokio(config: &RtBenchConfig) -> Result<RtRun, RtBenchError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(config.workers)
        .build()
        .map_err(RtBenchError::Tokio)?;
    let exec = Tokio(rt.handle().clone());
    let began = Instant::now();
    let outcome = workload(&exec, &exec, std::slice::from_ref(&exec), config);
    let seconds = began.elapsed().as_secs_f64();
    rt.shutdown_timeout(Duration::from_secs(10));
    Ok(result("tokio".into(), &outcome, seconds, None))
}

fn result(runtime: String, outcome: &Outcome, seconds: f64, counters: Option<Counters>) -> RtRun {
    let tasks = outcome.tasks;
    let (latency_us, breaches) = match &outcome.mix {
        Some(m) => {
            let delays = m.delays_us.lock().unwrap_or_else(|e| e.into_inner());
            (Some(tail(&delays)), Some(m.breaches.load(Ordering::Relaxed) as f64 / tasks.max(1) as f64))
        }
        None => ((!outcome.run.latency_ns.is_empty()).then(|| outcome.run.tail()), None),
    };
    RtRun {
        runtime,
        tasks,
        seconds,
        per_s: tasks as f64 / seconds.max(1e-9),
        ns_per_task: seconds * 1e9 / tasks.max(1) as f64,
        latency_us,
        counters,
        breaches,
    }
}

/// The run of median throughput among `repeat` runs of `f`.
fn median_of(repeat: usize, mut f: impl FnMut() -> Result<RtRun, RtBenchError>) -> Result<RtRun, RtBenchError> {
    let mut runs = (0..repeat).map(|_| f()).collect::<Result<Vec<_>, _>>()?;
    runs.sort_by(|a, b| a.per_s.total_cmp(&b.per_s));
    Ok(runs.swap_remove(runs.len() / 2))
}

/// Runs every policy of `config` and tokio, interleaved per repeat so
/// that drifts of the machine hit all alike; tokio last.
pub fn run(config: &RtBenchConfig) -> Result<Vec<RtRun>, RtBenchError> {
    config.validate()?;
    let mut out = Vec::new();
    for &policy in &config.policies {
        out.push(median_of(config.repeat, || run_psmr(config, policy))?);
    }
    out.push(median_of(config.repeat, || run_tokio(config))?);
    Ok(out)
}

/// The runs as a table, with each run's throughput and p99 as a ratio to
/// tokio's.
pub fn format_table(config: &RtBenchConfig, runs: &[RtRun]) -> String {
    let tokio = runs.iter().find(|r| r.runtime == "tokio");
    let mut s = format!(
        "{} on {} workers, {} tasks{}, full queues {}\n{:<28} {:>12} {:>9} {:>9} {:>9} {:>9} {:>10} {:>8} {:>8} {:>13} {:>9}\n",
        config.workload,
        config.workers,
        config.tasks,
        if config.workload == Workload::Mixer {
            format!(" per mixer, {} conferences", config.conferences)
        } else {
            String::new()
        },
        config.full(),
        "runtime",
        "tasks/s",
        "ns/task",
        "p50 µs",
        "p99 µs",
        "p99.9 µs",
        "p99.99 µs",
        "vs tokio",
        "p99 vs",
        "steals ok/try",
        "overflows"
    );
    for r in runs {
        let l = r.latency_us.unwrap_or_default();
        let vs = tokio.map_or("-".into(), |t| format!("{:.2}x", r.per_s / t.per_s));
        let p99 = match (tokio.and_then(|t| t.latency_us), r.latency_us) {
            (Some(t), Some(m)) if t.p99 > 0.0 => format!("{:.2}x", m.p99 / t.p99),
            _ => "-".into(),
        };
        let (steals, overflows) = r.counters.as_ref().map_or(("-".into(), "-".into()), |c| {
            (format!("{}/{}", c.steals_ok, c.steals_tried), (c.overflows + c.resizes).to_string())
        });
        s.push_str(&format!(
            "{:<28} {:>12.0} {:>9.0} {:>9.0} {:>9.0} {:>9.0} {:>10.0} {:>8} {:>8} {:>13} {:>9}",
            r.runtime, r.per_s, r.ns_per_task, l.p50, l.p99, l.p999, l.p9999, vs, p99, steals, overflows
        ));
        if let Some(b) = r.breaches {
            s.push_str(&format!("  breaches {:.3} %", 100.0 * b));
        }
        s.push('\n');
    }
    s
}

/// Throughput and p99 of every run, as two lines over the runtimes.
pub fn svg(config: &RtBenchConfig, runs: &[RtRun]) -> String {
    let categories: Vec<String> = runs.iter().map(|r| r.runtime.clone()).collect();
    let best = runs.iter().map(|r| r.per_s).fold(1.0, f64::max);
    let worst_p99 = runs.iter().filter_map(|r| r.latency_us.map(|l| l.p99)).fold(1.0, f64::max);
    let tput = runs.iter().enumerate().map(|(i, r)| (i as f64, 100.0 * r.per_s / best)).collect();
    let p99 = runs
        .iter()
        .enumerate()
        .filter_map(|(i, r)| r.latency_us.map(|l| (i as f64, 100.0 * l.p99 / worst_p99)))
        .collect();
    let lines = vec![("throughput, % of the best".to_string(), tput), ("p99, % of the worst".to_string(), p99)];
    chart(&format!("rt-bench {} on {} workers", config.workload, config.workers), "", "%", &lines, &categories)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small(workload: Workload) -> RtBenchConfig {
        RtBenchConfig {
            tasks: 2_000,
            policies: vec![Policy::Fifo, Policy::Lifo, Policy::FifoSlot],
            ..RtBenchConfig::new(workload)
        }
    }

    #[test]
    fn every_workload_completes_on_every_runtime() {
        for w in Workload::ALL {
            let mut c = small(w);
            if w == Workload::PacketBimodal {
                c.staged = true;
            }
            if w == Workload::Mixer {
                (c.tasks, c.conferences, c.silos) = (500, 4, 2);
            }
            let runs = run(&c).unwrap();
            assert_eq!(runs.len(), 4, "{w}");
            assert_eq!(runs.last().unwrap().runtime, "tokio");
            for r in &runs {
                assert_eq!(r.tasks, 2_000, "{w} {}", r.runtime);
                assert_eq!(r.breaches.is_some(), w == Workload::Mixer, "{w} {}", r.runtime);
                let latency = !matches!(w, Workload::Spawn | Workload::Yield);
                assert_eq!(r.latency_us.is_some(), latency, "{w} {}", r.runtime);
                if let Some(l) = r.latency_us {
                    assert!(l.p50 >= 1.0 && l.p50 <= l.p99 && l.p99 <= l.p9999, "{w} {}: {l:?}", r.runtime);
                }
            }
            assert!(format_table(&c, &runs).contains("vs tokio"));
            assert!(svg(&c, &runs).contains("<polyline"));
        }
    }

    #[test]
    fn bad_settings_are_refused() {
        assert!("packets".parse::<Workload>().unwrap_err().to_string().contains("packet-cache"));
        assert!(run(&RtBenchConfig { workers: 0, ..small(Workload::Spawn) }).is_err());
        assert!(run(&RtBenchConfig { repeat: 0, ..small(Workload::Spawn) }).is_err());
    }

    #[test]
    fn an_american_put_is_priced_by_hand_and_exercised_early() {
        // Two steps by hand: up 1.01, p = 0.5, discount 0.9999.
        let (u, d) = (1.01f64, 0.9999f64);
        let leaf = |j: i32| (100.0 - 100.0 * u.powi(2 * j - 2)).max(0.0);
        let down = (d * 0.5 * (leaf(1) + leaf(0))).max(100.0 - 100.0 / u);
        let up = (d * 0.5 * (leaf(2) + leaf(1))).max(100.0 - 100.0 * u);
        let root = (d * 0.5 * (up + down)).max(0.0);
        let mut l = Lattice::new(100.0, 100.0, 2);
        l.back();
        assert!((l.values[0] - down).abs() < 1e-9 && (l.values[1] - up).abs() < 1e-9, "{:?}", l.values);
        l.back();
        assert_eq!(l.steps(), 0);
        assert!((l.values[0] - root).abs() < 1e-9, "{} {root}", l.values[0]);
        // Deep in the money the put is worth exercising at once: its
        // value is the exercise value, above what holding would give.
        let mut deep = Lattice::new(100.0, 150.0, 20);
        while deep.steps() > 0 {
            deep.back();
        }
        assert!((deep.values[0] - 50.0).abs() < 1e-9, "{}", deep.values[0]);
        // The root is the end: a step more changes nothing.
        let root = deep.values.clone();
        deep.back();
        assert_eq!(deep.values, root);
    }
}
