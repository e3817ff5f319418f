//! `auto`: each replica picks its own scheduler, worker count and mapping,
//! and changes its mind when the workload or the machine does.
//!
//! Every scheduler gives the replies and state of sequential execution, so
//! the choice is a local performance decision ([`crate::Switchable`] makes
//! it at a batch boundary). A [`Controller`] looks at one window of
//! execution at a time ([`Window`]: what the scheduler thread already
//! sees, plus the time the process's threads spent runnable without a
//! CPU) and picks among three candidates ([`Choice`]):
//!
//! * `sequential` when parallel workers cannot gain: the machine has one
//!   core;
//! * otherwise, while execution is the bottleneck (the scheduler thread is
//!   busy in `submit` most of the window), it measures each candidate for
//!   the current workload — `sequential`, `late-batch-bitmap` (unless
//!   nearly every sampled pair of batches conflicts), `early` with a
//!   mapping optimized for the observed class frequencies (unless that
//!   mapping synchronizes more than [`EARLY_SYNC_MAX`] of the commands) —
//!   and keeps the fastest. When execution is not the bottleneck, no choice can gain and
//!   nothing changes.
//!
//! A machine short of cores is measured, not guessed at: where the
//! replicas' threads wait for CPUs, parallel workers may lose (they take
//! cores from each other) or win (a process with more runnable threads
//! gets a larger share of contended cores, and the scheduler's stages
//! overlap), and only the measurement tells. The running choice's rate is
//! measured again every window, so when something else starts taking the
//! cores and it slows down, a choice measured faster takes over, and is
//! measured again in turn.
//!
//! The workload is summarized by its class frequencies and its share of
//! writes ([`Signature`]); when it shifts, the measurements are forgotten
//! and the candidates measured again, unless the workload is one seen
//! before ([`WORKLOADS_KEPT`]), whose measurements come back with it.
//! Hysteresis keeps the controller from flapping: a shifted workload must
//! hold for [`STABLE_WINDOWS`] windows before anything is measured or
//! decided, a parallel candidate must beat `sequential` by [`GAIN`],
//! and a decision is followed by [`DWELL_WINDOWS`] windows without
//! another. Every decision carries its reason.
//!
//! A window's throughput counts the commands executed in it (replies
//! delivered), not those submitted: a parallel choice fills its queues as
//! it starts. Measuring a candidate costs what it is slower than the best
//! choice for as long as its trial lasts, so a trial is kept short: a
//! switch to it that stalled nothing (from `sequential`, say) skips the
//! dwell window and is measured in the window right after, and a
//! candidate that runs at less than [`TRIAL_CUTOFF`] of the best rate
//! measured for the workload is given up once [`TRIAL_MIN_PART`] of its
//! window has passed. A trial is finished even if the workload shifts
//! during it, and once one candidate of a workload is measured the others
//! are too, whatever the scheduler thread's load: a parallel candidate
//! that keeps up leaves that thread idle, which must not leave it running
//! unmeasured.
//!
//! Every switch overlaps ([`Switchable::switch_overlapped`]), at the
//! batch boundary where it is decided. A switch away from
//! `late-batch-bitmap` lets the next choice take the batches that follow
//! at once, each as soon as nothing the old one still holds conflicts with
//! it, so execution stalls only as long as the workload really depends on
//! what the old one holds. A switch away from `early` takes back the
//! batches no worker has begun ([`crate::Withdrawal`]) and hands them to
//! the next choice at once, and then the same holds: a batch waits only if
//! it conflicts with one the workers had begun, never for what waited in
//! their queues. `early` runs with at most [`EARLY_QUEUE_DEPTH`] batches
//! queued per worker, which bounds how far one worker can run ahead of
//! another, and so what is begun. A decision is recorded once its switch
//! is complete, with the whole stall.

use crate::optimizer::{naive, Problem};
use crate::{ReplySink, SchedConfig, SchedError, SchedStats, Scheduler, SchedulerKind, Switchable};
use psmr_model::{Batch, BatchSummary, ClassModel, Mapping, Service};
use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Length of one observation window.
pub const WINDOW: Duration = Duration::from_millis(100);
/// Windows a shifted workload must hold before the controller acts on it.
pub const STABLE_WINDOWS: u32 = 2;
/// Windows after a decision during which no other is taken and nothing
/// is measured: the window holding the switch's stall.
pub const DWELL_WINDOWS: u32 = 1;
/// Batches `auto` lets `early` hold per worker (`queue_depth`): a switch
/// away from `early` waits for the batches begun, and one worker can have
/// begun at most this many more than another.
pub const EARLY_QUEUE_DEPTH: usize = 8;
/// Workloads whose measurements are remembered, so that a workload that
/// comes back goes straight to its best choice.
pub const WORKLOADS_KEPT: usize = 8;
/// How much faster a parallel candidate must be measured than `sequential`
/// to be chosen.
pub const GAIN: f64 = 0.08;
/// How much faster than the running choice another must have been
/// measured to replace it (on top of [`GAIN`] where `sequential` is
/// replaced): single windows are noisy.
pub const MARGIN: f64 = 0.05;
/// Share of a window the scheduler thread spends in `submit` above which
/// execution is the bottleneck.
pub const SATURATED: f64 = 0.6;
/// Windows after which measurements are taken again even if the workload
/// looks the same (the machine around it may have changed).
pub const REMEASURE_WINDOWS: u64 = 300;
/// Decisions kept for [`Scheduler::decisions`].
pub const DECISIONS_KEPT: usize = 32;
/// One batch in this many has its keys compared with the previous sampled
/// one, for the conflict share of a window.
pub const SAMPLE_EVERY: u64 = 8;
/// Share of sampled batch pairs that conflict above which late scheduling
/// is not tried: nearly every batch would wait for the one before it in
/// the dependency graph.
pub const LATE_CONFLICTS_MAX: f64 = 0.9;
/// Share of the best rate measured for the workload under which a
/// candidate on trial is given up before its window is over
/// ([`Controller::trial_cutoff`]): it cannot win, and every further
/// moment of its trial is lost throughput.
pub const TRIAL_CUTOFF: f64 = 0.5;
/// Part of a window a trial runs at least before it may be cut short: a
/// shorter one says too little.
pub const TRIAL_MIN_PART: f64 = 0.25;
/// Share of a window above which a switch's stall keeps the window after
/// it from measuring the choice switched to.
pub const STALL_SHARE_MAX: f64 = 0.05;
/// Share of commands that `early`'s mapping for the workload synchronizes
/// all of a class's threads for (sequential classes on several threads)
/// above which `early` is not tried: a barrier every few commands costs
/// more than the workers gain (003 §6.3).
pub const EARLY_SYNC_MAX: f64 = 0.1;

/// What the controller may run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Choice {
    /// `sequential`.
    Sequential,
    /// `late-batch-bitmap` with this many workers.
    Late(usize),
    /// `early` with this many workers and a mapping for the observed
    /// class frequencies.
    Early(usize),
}

impl Choice {
    /// Worker threads besides the scheduler thread (0 for `sequential`).
    pub fn workers(self) -> usize {
        match self {
            Choice::Sequential => 0,
            Choice::Late(w) | Choice::Early(w) => w,
        }
    }
}

impl fmt::Display for Choice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Choice::Sequential => f.write_str("sequential"),
            Choice::Late(w) => write!(f, "late-batch-bitmap with {w} workers"),
            Choice::Early(w) => write!(f, "early with {w} workers"),
        }
    }
}

/// What one window of execution showed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Window {
    /// Wall time of the window.
    pub elapsed: Duration,
    /// Commands submitted.
    pub commands: u64,
    /// Commands executed (replies delivered): what the window's
    /// throughput counts. Not the commands submitted, which a parallel
    /// choice also counts as it fills its queues when it starts.
    pub executed: u64,
    /// Commands that write.
    pub writes: u64,
    /// Commands per class.
    pub classes: Vec<u64>,
    /// Time the scheduler thread spent in `submit`: executing
    /// (`sequential`), dispatching, or blocked on full queues.
    pub submitting: Duration,
    /// Time the process's threads spent runnable without a CPU, summed
    /// over the threads (`None` where the kernel does not say).
    pub runnable: Option<Duration>,
    /// Sampled pairs of batches (see [`SAMPLE_EVERY`]) whose keys were
    /// compared.
    pub pairs: u64,
    /// Of `pairs`, those that conflict.
    pub conflicting_pairs: u64,
}

impl Window {
    fn share(&self, part: Duration) -> f64 {
        part.as_secs_f64() / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// Commands executed per second.
    pub fn throughput(&self) -> f64 {
        self.executed as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// The workload of a window, as far as the choice depends on it.
#[derive(Clone, Debug, PartialEq)]
pub struct Signature {
    /// Share of each class among the commands.
    pub classes: Vec<f64>,
    /// Share of commands that write.
    pub writes: f64,
    /// Share of sampled batch pairs that conflict (`None`: none sampled).
    pub conflicts: Option<f64>,
}

impl Signature {
    fn of(w: &Window) -> Option<Self> {
        let n = w.commands as f64;
        (w.commands > 0).then(|| Self {
            classes: w.classes.iter().map(|&c| c as f64 / n).collect(),
            writes: w.writes as f64 / n,
            conflicts: (w.pairs > 0).then(|| w.conflicting_pairs as f64 / w.pairs as f64),
        })
    }

    /// True when `other` is a different workload: the class shares moved
    /// by more than 0.2 in total, the write share by more than 0.1, or the
    /// conflict share by more than 0.2.
    fn differs(&self, other: &Signature) -> bool {
        let moved: f64 = self.classes.iter().zip(&other.classes).map(|(a, b)| (a - b).abs()).sum();
        let conflicts = match (self.conflicts, other.conflicts) {
            (Some(a), Some(b)) => (a - b).abs() > 0.2,
            _ => false,
        };
        moved > 0.2 || (self.writes - other.writes).abs() > 0.1 || conflicts
    }
}

/// A decision of the controller.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    /// The window it was taken after (counted from 1).
    pub window: u64,
    /// What ran until then.
    pub from: Choice,
    /// What runs from now on.
    pub to: Choice,
    /// Why, in words.
    pub reason: String,
    /// How long execution stalled for the previous choice: the switch
    /// itself, and batches that waited for commands it still executed.
    pub stall: Duration,
    /// Commands the previous choice still held when the switch began.
    pub held: u64,
    /// Of those, commands no worker had begun, which the previous choice
    /// gave back to the next one ([`crate::Withdrawal`]).
    pub withdrawn: u64,
    /// Batches the next choice took while the previous one still executed
    /// (an overlapped switch).
    pub overlapped: u64,
}

/// The decision logic, apart from the schedulers it drives (see the module
/// documentation); deterministic for a given sequence of windows.
#[derive(Debug)]
pub struct Controller {
    cores: usize,
    workers: usize,
    current: Choice,
    signature: Option<Signature>,
    /// Windows the current signature has held.
    stable: u32,
    /// Throughput of each candidate measured for the current signature.
    measured: Vec<(Choice, f64)>,
    /// Earlier workloads and their measurements, most recent last.
    known: VecDeque<(Signature, Vec<(Choice, f64)>)>,
    /// Windows to wait before the next decision.
    dwell: u32,
    /// Share of the workload's commands `early`'s mapping synchronizes
    /// (see [`Controller::set_synchronized`]).
    synchronized: Option<f64>,
    /// The running choice was picked as the fastest (not merely being
    /// measured).
    chosen: bool,
    /// The running choice was switched to in order to measure it, and has
    /// not been measured yet. Kept across a shift of the workload: a
    /// candidate that leaves the scheduler thread idle would otherwise
    /// never be measured, and run on unmeasured.
    trial: bool,
    window: u64,
    measured_at: u64,
}

impl Controller {
    /// A controller for a machine with `cores` cores, using at most
    /// `workers` workers; it starts with `sequential`.
    pub fn new(cores: usize, workers: usize) -> Self {
        Self {
            cores: cores.max(1),
            workers: workers.max(1),
            current: Choice::Sequential,
            signature: None,
            stable: 0,
            measured: Vec::new(),
            known: VecDeque::new(),
            dwell: 0,
            synchronized: None,
            chosen: false,
            trial: false,
            window: 0,
            measured_at: 0,
        }
    }

    /// What runs now.
    pub fn current(&self) -> Choice {
        self.current
    }

    /// The signature of the current workload, once a window has shown it.
    pub fn signature(&self) -> Option<&Signature> {
        self.signature.as_ref()
    }

    /// The candidates worth measuring: parallel ones with as many workers
    /// as there are cores, at most the configured count; late scheduling
    /// only while batches rarely conflict, early only while its mapping
    /// rarely synchronizes.
    fn candidates(&self) -> Vec<Choice> {
        let w = self.workers.min(self.cores);
        if w < 2 {
            return vec![Choice::Sequential];
        }
        let conflicts = self.signature.as_ref().and_then(|s| s.conflicts).unwrap_or(0.0);
        let mut out = vec![Choice::Sequential];
        if conflicts < LATE_CONFLICTS_MAX {
            out.push(Choice::Late(w));
        }
        if self.synchronized.unwrap_or(0.0) <= EARLY_SYNC_MAX {
            out.push(Choice::Early(w));
        }
        out
    }

    /// The throughput under which the candidate on trial may be given up
    /// before its window is over ([`TRIAL_CUTOFF`] of the best rate
    /// measured for the workload); `None` when no trial is measured now.
    /// The window cut short is taken in by [`Controller::observe`] like
    /// any other.
    pub fn trial_cutoff(&self) -> Option<f64> {
        if self.dwell > 0 || !self.trial {
            return None;
        }
        self.measured.iter().map(|&(_, r)| r).reduce(f64::max).map(|best| TRIAL_CUTOFF * best)
    }

    /// The switch to the candidate on trial stalled execution for next to
    /// nothing ([`STALL_SHARE_MAX`] of a window, with nothing of the old
    /// choice left to wait for): the window after it measures the
    /// candidate, with no window of dwell. A switch that chose the fastest
    /// keeps its dwell, against flapping.
    pub fn switch_was_free(&mut self) {
        if self.trial {
            self.dwell = 0;
        }
    }

    /// Tells the share of the current workload's commands that `early`'s
    /// mapping for it synchronizes (`None`: unknown, `early` is tried).
    pub fn set_synchronized(&mut self, share: Option<f64>) {
        self.synchronized = share;
    }

    /// Takes in one window; returns the decision it leads to, if any.
    pub fn observe(&mut self, w: &Window) -> Option<Decision> {
        self.window += 1;
        let settling = self.dwell > 0;
        self.track_signature(w);
        let busy = w.share(w.submitting);
        // A candidate on trial is measured whatever the scheduler thread's
        // load: one that leaves it idle (a parallel scheduler taking
        // batches faster than anything downstream) would otherwise never
        // be measured, and the trial never end.
        if !settling && (busy >= SATURATED || self.trial) && self.stable >= STABLE_WINDOWS {
            self.record(w.throughput());
        }
        if settling {
            self.dwell -= 1;
            return None;
        }
        if self.cores < 2 {
            return self.go(Choice::Sequential, "one core: parallel workers cannot gain".into());
        }
        if self.stable < STABLE_WINDOWS {
            return None;
        }
        let best = self.known_best();
        self.chosen = best == Some(self.current);
        if let Some(best) = best.filter(|&b| b != self.current) {
            self.chosen = true;
            let rates: Vec<String> = self.measured.iter().map(|(c, r)| format!("{c}: {r:.0}")).collect();
            let why = format!(
                "fastest for this workload ({}), commands/s: {}{}",
                self.describe(),
                rates.join(", "),
                starved(w, self.cores)
            );
            return self.go(best, why);
        }
        // Measuring begins only while execution is the bottleneck, but a
        // measurement begun is finished: a parallel candidate that keeps up
        // leaves the scheduler thread idle, and the choice must still be
        // made between it and the others.
        if busy < SATURATED && self.measured.is_empty() {
            return None;
        }
        if let Some(next) = self.candidates().into_iter().find(|c| !self.measured.iter().any(|(m, _)| m == c)) {
            let why = format!("measuring {next} for this workload ({}){}", self.describe(), starved(w, self.cores));
            let decision = self.go(next, why);
            self.trial = decision.is_some();
            return decision;
        }
        None
    }

    /// Follows the workload: a shift restarts the stability count and
    /// swaps the measurements for those of the new workload, if it ran
    /// before; age forgets them.
    fn track_signature(&mut self, w: &Window) {
        let Some(sig) = Signature::of(w) else { return };
        match &mut self.signature {
            Some(old) if !old.differs(&sig) => {
                self.stable = self.stable.saturating_add(1);
                // The first windows of a run may sample no pair of
                // batches: the conflict share is filled in, and follows
                // the windows after.
                if let Some(c) = sig.conflicts {
                    old.conflicts = Some(old.conflicts.map_or(c, |o| (o + c) / 2.0));
                }
            }
            _ => {
                if let Some(old) = self.signature.take() {
                    self.remember(old);
                }
                let seen = self.known.iter().position(|(s, _)| !s.differs(&sig));
                self.measured = seen.and_then(|i| self.known.remove(i)).map(|(_, m)| m).unwrap_or_default();
                self.signature = Some(sig);
                self.stable = 1;
            }
        }
        if self.window - self.measured_at > REMEASURE_WINDOWS {
            self.measured.clear();
            self.known.clear();
            self.measured_at = self.window;
        }
    }

    fn remember(&mut self, signature: Signature) {
        if self.measured.is_empty() {
            return;
        }
        if self.known.len() == WORKLOADS_KEPT {
            self.known.pop_front();
        }
        self.known.push_back((signature, std::mem::take(&mut self.measured)));
    }

    /// The fastest choice measured for this workload, once every candidate
    /// has been. A parallel choice must beat `sequential` by [`GAIN`]: it
    /// costs more CPU for what it gains; and once a choice was picked as
    /// the fastest, another must beat it by [`MARGIN`] to replace it.
    fn known_best(&self) -> Option<Choice> {
        let candidates = self.candidates();
        let rates: Option<Vec<f64>> = candidates.iter().map(|&c| self.rate(c)).collect();
        let score = |c: Choice, r: f64| {
            let r = if c == Choice::Sequential { r * (1.0 + GAIN) } else { r };
            if c == self.current && self.chosen {
                r * (1.0 + MARGIN)
            } else {
                r
            }
        };
        let scored = candidates.iter().zip(rates?).map(|(&c, r)| (c, score(c, r)));
        scored
            .fold(None, |a: Option<(Choice, f64)>, b| match a {
                Some(a) if a.1 >= b.1 => Some(a),
                _ => Some(b),
            })
            .map(|(c, _)| c)
    }

    fn record(&mut self, rate: f64) {
        self.trial = false;
        self.set_rate(self.current, rate);
        self.measured_at = self.window;
    }

    /// `c`'s rate for this workload, replacing any earlier one.
    fn set_rate(&mut self, c: Choice, rate: f64) {
        self.measured.retain(|(m, _)| *m != c);
        self.measured.push((c, rate));
    }

    fn rate(&self, c: Choice) -> Option<f64> {
        self.measured.iter().find(|(m, _)| *m == c).map(|(_, r)| *r)
    }

    /// The switch to `refused` failed and `running` still runs: the
    /// refused choice counts as measured at nothing for this workload.
    pub fn refused(&mut self, refused: Choice, running: Choice) {
        self.current = running;
        self.trial = false;
        self.set_rate(refused, 0.0);
    }

    fn go(&mut self, to: Choice, reason: String) -> Option<Decision> {
        if to == self.current {
            return None;
        }
        let from = std::mem::replace(&mut self.current, to);
        self.dwell = DWELL_WINDOWS;
        self.trial = false;
        let (stall, held, withdrawn, overlapped) = (Duration::ZERO, 0, 0, 0);
        Some(Decision { window: self.window, from, to, reason, stall, held, withdrawn, overlapped })
    }

    fn describe(&self) -> String {
        let Some(s) = &self.signature else { return String::new() };
        match s.conflicts {
            Some(c) => format!("{:.0} % writes, {:.0} % of sampled batch pairs conflict", 100.0 * s.writes, 100.0 * c),
            None => format!("{:.0} % writes", 100.0 * s.writes),
        }
    }
}

/// Reads the time this process's threads have spent runnable without a
/// CPU, summed over the threads (`None` where it cannot be known).
pub type RunnableProbe = fn() -> Option<Duration>;

/// The `auto` scheduler: a [`Switchable`] driven by a [`Controller`]
/// (built by [`crate::build`] for [`SchedulerKind::Auto`]).
pub struct Auto<S: Service> {
    inner: Switchable<S>,
    controller: Controller,
    base: SchedConfig,
    model: ClassModel,
    window: Window,
    started: Instant,
    runnable_at_start: Option<Duration>,
    decisions: VecDeque<Decision>,
    made: u64,
    probe: RunnableProbe,
    /// Batches submitted, and the keys of the last sampled one.
    batches: u64,
    sampled: Option<BatchSummary>,
    /// `early`'s mapping for each recent workload and the share of its
    /// commands it synchronizes, computed once the workload is seen (the
    /// optimizer runs then, once, not at every switch).
    mappings: VecDeque<(Signature, Mapping, f64)>,
    /// Replies delivered and commands submitted: how much the running
    /// scheduler still holds.
    replies: Arc<Counted<S::Reply>>,
    submitted: u64,
    /// Replies delivered when the window began.
    executed_at_start: u64,
    /// A decision to act on before the next batch.
    pending: Option<Pending>,
    /// Decisions whose switch may overlap the old choice's last commands,
    /// with the number of their switch ([`Switchable::switches`]).
    overlapping: VecDeque<(u64, Decision)>,
}

/// A switch decided and not yet made.
struct Pending {
    decision: Decision,
    /// What ran when it was decided.
    before: Choice,
}

/// Forwards replies and counts them.
struct Counted<R> {
    inner: Arc<dyn ReplySink<R>>,
    done: AtomicU64,
    /// Execution failed: replies still missing will never come.
    failed: AtomicBool,
}

impl<R> ReplySink<R> for Counted<R> {
    fn deliver(&self, worker: usize, reply: crate::Reply<R>) {
        self.inner.deliver(worker, reply);
        self.done.fetch_add(1, Ordering::Release);
    }

    fn failed(&self, error: &SchedError) {
        self.failed.store(true, Ordering::Release);
        self.inner.failed(error);
    }
}

impl<S: Service> Auto<S> {
    /// `auto` over `service`, starting with `sequential`; `config.workers`
    /// bounds the workers it may use.
    pub fn new(
        config: &SchedConfig,
        service: Arc<S>,
        model: &ClassModel,
        sink: Arc<dyn ReplySink<S::Reply>>,
    ) -> Result<Self, SchedError> {
        Self::with_probe(config, service, model, sink, runnable)
    }

    /// Like [`Auto::new`], reading the time runnable without a CPU from
    /// `probe` instead of the kernel (tests use it to fake an idle or a
    /// busy machine).
    pub fn with_probe(
        config: &SchedConfig,
        service: Arc<S>,
        model: &ClassModel,
        sink: Arc<dyn ReplySink<S::Reply>>,
        probe: RunnableProbe,
    ) -> Result<Self, SchedError> {
        // The CPUs it can keep busy, quota included: no more threads.
        let cores = crate::cpus::Cpus::read().usable;
        let controller = Controller::new(cores, config.workers);
        let first = SchedConfig { kind: SchedulerKind::Sequential, workers: 1, mapping: None, ..config.clone() };
        let replies = Arc::new(Counted { inner: sink, done: AtomicU64::new(0), failed: AtomicBool::new(false) });
        Ok(Self {
            inner: Switchable::new(first, service, model, replies.clone())?,
            replies,
            submitted: 0,
            executed_at_start: 0,
            pending: None,
            overlapping: VecDeque::new(),
            controller,
            base: config.clone(),
            model: model.clone(),
            window: Window { classes: vec![0; model.len()], ..Window::default() },
            started: Instant::now(),
            runnable_at_start: probe(),
            decisions: VecDeque::new(),
            made: 0,
            probe,
            batches: 0,
            sampled: None,
            mappings: VecDeque::new(),
        })
    }

    /// The configuration of `choice` for the workload seen last.
    fn config_of(&self, choice: Choice) -> SchedConfig {
        let base = SchedConfig { mapping: None, ..self.base.clone() };
        match choice {
            Choice::Sequential => SchedConfig { kind: SchedulerKind::Sequential, workers: 1, ..base },
            Choice::Late(w) => SchedConfig { kind: SchedulerKind::LateBatchBitmap, workers: w, ..base },
            Choice::Early(w) => {
                let mapping = self.cached_mapping().filter(|(m, _)| m.workers() == w).map(|(m, _)| m.clone());
                let mapping = mapping.or_else(|| self.mapping_for(w));
                let queue_depth = base.queue_depth.min(EARLY_QUEUE_DEPTH);
                SchedConfig { kind: SchedulerKind::Early, workers: w, mapping, queue_depth, ..base }
            }
        }
    }

    /// A mapping for `workers` weighted by the observed class frequencies:
    /// the optimizer's, within a short time limit, or the naive one.
    fn mapping_for(&self, workers: usize) -> Option<Mapping> {
        let weights = self.controller.signature().map(|s| s.classes.iter().map(|&c| c.max(1e-3)).collect::<Vec<_>>());
        let problem = Problem::new(self.model.clone(), workers).ok()?;
        let problem = match weights {
            Some(w) => problem.clone().with_weights(w).unwrap_or(problem),
            None => problem,
        };
        #[cfg(feature = "optimizer")]
        if let Ok(s) = crate::optimizer::optimize_with(&problem, crate::optimizer::Limits { time: OPTIMIZER_TIME }) {
            return Some(s.mapping);
        }
        Some(naive(&problem))
    }

    /// Whether the window is over: its time is up, or it measures a
    /// candidate on trial that has run long enough to show it is far
    /// slower than the best choice measured ([`Controller::trial_cutoff`]).
    fn window_over(&self) -> bool {
        let (elapsed, window) = (self.started.elapsed(), self.base.auto_window);
        if elapsed >= window {
            return true;
        }
        let rate = self.executed_in_window() as f64 / elapsed.as_secs_f64().max(1e-9);
        elapsed >= window.mul_f64(TRIAL_MIN_PART) && self.controller.trial_cutoff().is_some_and(|cut| rate < cut)
    }

    /// Replies delivered since the window began.
    fn executed_in_window(&self) -> u64 {
        self.replies.done.load(Ordering::Acquire).saturating_sub(self.executed_at_start)
    }

    /// Closes the window, asks the controller, and keeps its decision for
    /// [`Auto::switch_pending`].
    fn end_window(&mut self) {
        let now = (self.probe)();
        self.window.runnable = now.zip(self.runnable_at_start).map(|(b, a)| b.saturating_sub(a));
        self.window.elapsed = self.started.elapsed();
        self.window.executed = self.executed_in_window();
        self.executed_at_start += self.window.executed;
        let w = &self.window;
        tracing::debug!(
            running = %self.controller.current(),
            commands_per_s = w.throughput() as u64,
            submitting = w.share(w.submitting),
            runnable = w.runnable.map_or(0.0, |r| w.share(r)),
            "auto: window"
        );
        let before = self.controller.current();
        // A window that ran while a switch waited measured the previous
        // choice, not the one the controller believes runs: not shown to it.
        let decision = match self.pending {
            Some(_) => None,
            None => self.controller.observe(&self.window),
        };
        self.follow_signature();
        self.window = Window { classes: vec![0; self.model.len()], ..Window::default() };
        self.started = Instant::now();
        self.runnable_at_start = now;
        if let Some(decision) = decision {
            self.pending = Some(Pending { decision, before });
        }
    }

    /// Makes the pending switch, if any, at this batch boundary.
    fn switch_pending(&mut self) -> Result<(), SchedError> {
        let Some(Pending { mut decision, before }) = self.pending.take() else { return Ok(()) };
        decision.held = self.submitted.saturating_sub(self.replies.done.load(Ordering::Acquire));
        let config = self.config_of(decision.to);
        // A failed scheduler reports its failure as it finishes.
        let switched = match self.replies.failed.load(Ordering::Acquire) {
            true => self.inner.switch(config),
            false => self.inner.switch_overlapped(config),
        };
        match switched {
            Ok(stall) => {
                if !self.inner.overlapping()
                    && stall.as_secs_f64() <= STALL_SHARE_MAX * self.base.auto_window.as_secs_f64()
                {
                    self.controller.switch_was_free();
                }
                decision.stall = stall;
                decision.withdrawn = self.inner.withdrawn();
                // A switch ends the overlap of the one before, and its own
                // may have ended as it began.
                self.overlapping.push_back((self.inner.switches(), decision));
                self.overlap_ended();
                if !self.inner.overlapping() {
                    // It did not overlap at all.
                    while let Some((_, decision)) = self.overlapping.pop_front() {
                        self.record(decision);
                    }
                }
                Ok(())
            }
            Err(crate::SwitchError::Build(e)) => {
                tracing::warn!(to = %decision.to, "auto: cannot start the chosen scheduler, keeping the running one: {e}");
                self.controller.refused(decision.to, before);
                Ok(())
            }
            Err(e) => Err(e.into()),
        }
    }
}

impl<S: Service> Auto<S> {
    /// Records the overlapping decision once its old choice has finished,
    /// with what waiting for it cost.
    fn overlap_ended(&mut self) {
        while let Some(overlap) = self.inner.overlap_ended() {
            // Overlaps end in the order their switches were made.
            while let Some((switch, mut decision)) = self.overlapping.pop_front() {
                if switch == overlap.switch {
                    decision.stall += overlap.stall;
                    decision.overlapped = overlap.batches;
                    self.record(decision);
                    break;
                }
                // Its switch did not overlap.
                self.record(decision);
            }
        }
    }

    /// A switch made: logged and kept.
    fn record(&mut self, decision: Decision) {
        self.made += 1;
        let mapping = self.inner.config().mapping.as_ref().map(|m| m.to_spec(&self.model));
        tracing::info!(
            to = %decision.to,
            mapping = mapping.as_deref().unwrap_or("-"),
            stall_us = decision.stall.as_micros() as u64,
            held = decision.held,
            withdrawn = decision.withdrawn,
            overlapped = decision.overlapped,
            reason = %decision.reason,
            "auto: switched"
        );
        if self.decisions.len() == DECISIONS_KEPT {
            self.decisions.pop_front();
        }
        self.decisions.push_back(decision);
    }

    /// Solves `early`'s mapping for a workload the controller has not
    /// seen before, and tells it how much of the workload that mapping
    /// synchronizes.
    fn follow_signature(&mut self) {
        if let Some((_, share)) = self.cached_mapping() {
            self.controller.set_synchronized(Some(share));
            return;
        }
        let Some(sig) = self.controller.signature().cloned() else { return };
        let workers = self.base.workers.min(self.controller.cores).max(2);
        let Some(mapping) = self.mapping_for(workers) else { return };
        let synchronized: f64 = mapping
            .classes()
            .iter()
            .zip(&sig.classes)
            .filter(|(c, _)| c.mode == psmr_model::Mode::Sequential && c.threads.len() > 1)
            .map(|(_, share)| share)
            .sum();
        self.controller.set_synchronized(Some(synchronized));
        if self.mappings.len() == WORKLOADS_KEPT {
            self.mappings.pop_front();
        }
        self.mappings.push_back((sig, mapping, synchronized));
    }

    /// The mapping computed for the current workload, and the share of it
    /// that mapping synchronizes.
    fn cached_mapping(&self) -> Option<(&Mapping, f64)> {
        let sig = self.controller.signature()?;
        self.mappings.iter().find(|(s, _, _)| !s.differs(sig)).map(|(_, m, share)| (m, *share))
    }

    /// Compares one batch in [`SAMPLE_EVERY`] with the one sampled before
    /// it (the summary is cached in the batch, and `late-batch-bitmap`
    /// reuses it).
    fn sample(&mut self, batch: &Batch<S::Op>) {
        self.batches += 1;
        if self.batches % SAMPLE_EVERY != 0 || batch.is_empty() {
            return;
        }
        let summary = batch.summary();
        if let Some(before) = &self.sampled {
            self.window.pairs += 1;
            self.window.conflicting_pairs += u64::from(before.keys_conflict(summary));
        }
        self.sampled = Some(summary.clone());
    }
}

/// How long `auto` lets the optimizer search for a mapping: it runs on the
/// scheduler thread, between two batches.
#[cfg(feature = "optimizer")]
const OPTIMIZER_TIME: Duration = Duration::from_millis(50);

/// Time this process's threads have spent runnable without a CPU, summed:
/// the second field of each `/proc/self/task/*/schedstat`. `None` where
/// the kernel does not provide it.
/// `; threads runnable without a CPU: N on average, on C cores` when the
/// window's threads waited for CPUs, for a decision's reason.
fn starved(w: &Window, cores: usize) -> String {
    match w.runnable.map(|r| w.share(r)).filter(|&s| s >= 0.05) {
        Some(s) => format!("; threads runnable without a CPU: {s:.2} on average, on {cores} cores"),
        None => String::new(),
    }
}

fn runnable() -> Option<Duration> {
    let threads = psmr_rt::schedstat::own_threads();
    (!threads.is_empty()).then(|| Duration::from_nanos(threads.iter().map(|t| t.stat.runq_ns).sum()))
}

impl<S: Service> Scheduler<S> for Auto<S> {
    fn kind(&self) -> SchedulerKind {
        SchedulerKind::Auto
    }

    fn submit(&mut self, batch: Batch<S::Op>) -> Result<(), SchedError> {
        self.sample(&batch);
        let w = &mut self.window;
        w.commands += batch.len() as u64;
        for cmd in batch.commands() {
            w.writes += u64::from(!cmd.is_read_only());
            if let Some(c) = w.classes.get_mut(cmd.class.index()) {
                *c += 1;
            }
        }
        self.switch_pending()?;
        self.submitted += batch.len() as u64;
        let began = Instant::now();
        let result = self.inner.submit(batch);
        self.window.submitting += began.elapsed();
        result?;
        self.overlap_ended();
        if self.window_over() {
            self.end_window();
        }
        Ok(())
    }

    fn metrics(&self) -> Option<Arc<crate::Metrics>> {
        self.inner.metrics()
    }

    fn decisions(&self) -> Vec<Decision> {
        self.decisions.iter().cloned().collect()
    }

    fn running(&self) -> SchedulerKind {
        self.inner.kind()
    }

    fn decisions_made(&self) -> u64 {
        self.made
    }

    fn describe(&self) -> String {
        format!("auto: {}", self.controller.current())
    }

    fn finish(self: Box<Self>) -> Result<SchedStats, SchedError> {
        Box::new(self.inner).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A window of 100 ms with `commands` commands, half of class 0, a
    /// share `writes` of them writes, the scheduler thread busy `busy` of
    /// it, and `waiting` threads runnable without a CPU on average.
    fn window(commands: u64, writes: f64, busy: f64, waiting: f64) -> Window {
        let elapsed = Duration::from_millis(100);
        Window {
            elapsed,
            commands,
            executed: commands,
            writes: (commands as f64 * writes) as u64,
            classes: vec![commands / 2, commands - commands / 2],
            submitting: elapsed.mul_f64(busy),
            runnable: Some(elapsed.mul_f64(waiting)),
            pairs: 0,
            conflicting_pairs: 0,
        }
    }

    /// Feeds windows whose throughput depends on what runs, as `rate` says;
    /// returns the decisions.
    fn run(c: &mut Controller, windows: usize, writes: f64, rate: impl Fn(Choice) -> u64) -> Vec<Decision> {
        (0..windows).filter_map(|_| c.observe(&window(rate(c.current()), writes, 0.9, 0.0))).collect()
    }

    #[test]
    fn measures_each_candidate_then_keeps_the_fastest() {
        let mut c = Controller::new(4, 4);
        let rates = |ch: Choice| match ch {
            Choice::Sequential => 10_000,
            Choice::Late(_) => 30_000,
            Choice::Early(_) => 20_000,
        };
        let decisions = run(&mut c, 30, 0.15, rates);
        let tos: Vec<Choice> = decisions.iter().map(|d| d.to).collect();
        assert_eq!(tos, vec![Choice::Late(4), Choice::Early(4), Choice::Late(4)], "{decisions:#?}");
        assert_eq!(c.current(), Choice::Late(4));
    }

    #[test]
    fn late_scheduling_is_not_tried_when_batches_nearly_always_conflict() {
        let mut c = Controller::new(4, 4);
        let decisions: Vec<_> = (0..30)
            .filter_map(|_| {
                let w = Window { pairs: 10, conflicting_pairs: 10, ..window(1000, 0.15, 0.9, 0.0) };
                c.observe(&w)
            })
            .collect();
        assert!(decisions.iter().all(|d| !matches!(d.to, Choice::Late(_))), "{decisions:#?}");
        assert!(decisions.iter().any(|d| d.to == Choice::Early(4)), "{decisions:#?}");
        assert!(decisions[0].reason.contains("100 % of sampled batch pairs conflict"), "{}", decisions[0].reason);
    }

    #[test]
    fn early_is_not_tried_when_its_mapping_synchronizes_often() {
        let mut c = Controller::new(4, 4);
        c.set_synchronized(Some(0.15));
        let decisions = run(&mut c, 30, 0.15, |ch| if matches!(ch, Choice::Early(_)) { 9_000 } else { 1_000 });
        assert!(decisions.iter().all(|d| !matches!(d.to, Choice::Early(_))), "{decisions:#?}");
        assert!(decisions.iter().any(|d| matches!(d.to, Choice::Late(_))), "late is still measured: {decisions:#?}");
        let mut c = Controller::new(4, 4);
        c.set_synchronized(Some(0.02));
        run(&mut c, 30, 0.15, |ch| if matches!(ch, Choice::Early(_)) { 9_000 } else { 1_000 });
        assert_eq!(c.current(), Choice::Early(4));
    }

    #[test]
    fn the_conflict_share_is_learned_after_the_first_window() {
        let mut c = Controller::new(4, 4);
        c.observe(&window(1000, 0.15, 0.9, 0.0));
        assert_eq!(c.signature().unwrap().conflicts, None);
        let decisions: Vec<_> = (0..30)
            .filter_map(|_| c.observe(&Window { pairs: 4, conflicting_pairs: 4, ..window(1000, 0.15, 0.9, 0.0) }))
            .collect();
        assert_eq!(c.signature().unwrap().conflicts, Some(1.0));
        assert!(decisions.iter().all(|d| !matches!(d.to, Choice::Late(_))), "{decisions:#?}");
    }

    #[test]
    fn a_trial_ends_even_when_the_candidate_leaves_the_scheduler_thread_idle() {
        // Sequential keeps the scheduler thread busy; early takes batches
        // at once (the thread idles) but delivers a third of the rate.
        let mut c = Controller::new(2, 2);
        for _ in 0..40 {
            let (rate, busy) = if c.current() == Choice::Sequential { (3000, 0.9) } else { (1000, 0.2) };
            c.observe(&Window { pairs: 4, conflicting_pairs: 4, ..window(rate, 0.15, busy, 0.0) });
        }
        assert_eq!(c.current(), Choice::Sequential, "the trial of early ended and sequential came back");
    }

    #[test]
    fn a_trial_that_stalled_nothing_is_measured_at_once_and_a_hopeless_one_is_cut_short() {
        // Every sampled pair conflicts: early is the one candidate.
        let conflicting = |commands| Window { pairs: 4, conflicting_pairs: 4, ..window(commands, 0.15, 0.9, 0.0) };
        let mut c = Controller::new(2, 2);
        let first = (0..10).find_map(|_| c.observe(&conflicting(4000))).expect("early is measured");
        assert_eq!(first.to, Choice::Early(2), "{first:?}");
        assert_eq!(c.trial_cutoff(), None, "the window after a switch holds its stall");
        c.switch_was_free();
        let cutoff = c.trial_cutoff().expect("a trial measured now");
        assert!((cutoff - TRIAL_CUTOFF * 40_000.0).abs() < 1e-6, "half of sequential's 40 000/s: {cutoff}");
        // A quarter window at a tenth of sequential's rate ends the trial.
        let short = Window { elapsed: Duration::from_millis(25), executed: 100, ..conflicting(100) };
        let back = c.observe(&short).expect("back to the fastest");
        assert_eq!(back.to, Choice::Sequential, "{back:?}");
        assert!(back.reason.contains("early with 2 workers: 4000"), "{}", back.reason);
        assert_eq!(c.trial_cutoff(), None, "no trial once everything is measured");
        // A switch to the fastest keeps its dwell, whatever it stalled.
        c.switch_was_free();
        assert_eq!(c.dwell, DWELL_WINDOWS);
    }

    #[test]
    fn a_trial_ends_even_when_the_workload_shifts_during_it() {
        // Late scheduling takes batches at once (the scheduler thread
        // idles) and runs at half of sequential's rate; while it is on
        // trial the sampled conflict share jumps, which is a new workload.
        let mut c = Controller::new(2, 2);
        c.set_synchronized(Some(0.5));
        let at = |c: &Controller, conflicts: u64| {
            let (rate, busy) = if c.current() == Choice::Sequential { (4000, 0.9) } else { (2000, 0.2) };
            Window { pairs: 10, conflicting_pairs: conflicts, ..window(rate, 0.0, busy, 0.0) }
        };
        let first = (0..10).find_map(|_| c.observe(&at(&c, 0))).expect("late is measured");
        assert_eq!(first.to, Choice::Late(2));
        c.observe(&at(&c, 0));
        c.observe(&at(&c, 5));
        let after: Vec<Decision> = (0..10).filter_map(|_| c.observe(&at(&c, 5))).collect();
        assert_eq!(c.current(), Choice::Sequential, "the trial was measured and lost: {after:#?}");
    }

    #[test]
    fn stays_sequential_when_it_is_fastest() {
        let mut c = Controller::new(2, 2);
        let rates = |ch: Choice| if ch == Choice::Sequential { 50_000 } else { 30_000 };
        run(&mut c, 40, 0.15, rates);
        assert_eq!(c.current(), Choice::Sequential);
    }

    #[test]
    fn a_small_gain_is_not_worth_a_switch() {
        let mut c = Controller::new(2, 2);
        let rates = |ch: Choice| if ch == Choice::Sequential { 50_000 } else { 52_000 };
        run(&mut c, 40, 0.15, rates);
        assert_eq!(c.current(), Choice::Sequential, "4 % is within the hysteresis");
    }

    #[test]
    fn a_choice_that_slows_down_gives_way_to_one_measured_faster() {
        let mut c = Controller::new(4, 4);
        run(&mut c, 30, 0.15, |ch| if ch == Choice::Sequential { 1000 } else { 2000 });
        assert_ne!(c.current(), Choice::Sequential);
        // Something else takes the cores: the parallel choices now run at
        // half of what sequential was measured at.
        let d: Vec<_> = (0..10)
            .filter_map(|_| {
                let rate = if c.current() == Choice::Sequential { 1000 } else { 500 };
                c.observe(&window(rate, 0.15, 0.9, 2.0))
            })
            .collect();
        assert_eq!(c.current(), Choice::Sequential, "{d:#?}");
        assert!(d.last().unwrap().reason.contains("runnable without a CPU"), "{d:#?}");
    }

    #[test]
    fn a_machine_short_of_cores_is_measured_not_guessed_at() {
        // Threads wait for CPUs whatever runs; parallel is measured slower
        // and sequential stays, or faster and it runs.
        for (parallel_rate, parallel_wins) in [(800, false), (1500, true)] {
            let mut c = Controller::new(2, 2);
            for _ in 0..40 {
                let rate = if c.current() == Choice::Sequential { 1000 } else { parallel_rate };
                c.observe(&window(rate, 0.15, 0.9, 1.5));
            }
            assert_eq!(c.current() != Choice::Sequential, parallel_wins, "parallel at {parallel_rate}");
        }
        // Two workers and the scheduler thread on two cores keep one
        // thread waiting: that is the choice itself, not a busy machine.
        let mut c = Controller::new(2, 2);
        let d: Vec<_> = (0..30)
            .filter_map(|_| {
                let parallel = c.current() != Choice::Sequential;
                c.observe(&window(if parallel { 2000 } else { 1000 }, 0.15, 0.9, if parallel { 1.0 } else { 0.0 }))
            })
            .collect();
        assert_ne!(c.current(), Choice::Sequential, "{d:#?}");
    }

    #[test]
    fn one_core_or_an_idle_replica_never_goes_parallel() {
        let mut c = Controller::new(1, 8);
        assert!(run(&mut c, 30, 0.15, |_| 1000).is_empty());
        let mut c = Controller::new(8, 8);
        let idle: Vec<_> = (0..30).filter_map(|_| c.observe(&window(1000, 0.0, 0.1, 0.0))).collect();
        assert!(idle.is_empty(), "execution is not the bottleneck: {idle:?}");
    }

    #[test]
    fn a_flapping_workload_does_not_make_it_oscillate() {
        let mut c = Controller::new(4, 4);
        // The write share jumps every window: never stable long enough.
        let decisions: Vec<_> =
            (0..200).filter_map(|i| c.observe(&window(1000, if i % 2 == 0 { 0.0 } else { 0.9 }, 0.9, 0.0))).collect();
        assert!(decisions.is_empty(), "{decisions:?}");
        // Two workloads taking turns every 10 windows, one best run by
        // `late-batch-bitmap`, the other by `sequential`: once both are
        // measured, each turn costs at most one switch, and decisions are
        // never closer than the dwell allows.
        let mut c = Controller::new(4, 4);
        let decisions: Vec<_> = (0..300)
            .filter_map(|i| {
                let reads = (i / 10) % 2 == 0;
                let rate = match (reads, c.current()) {
                    (true, Choice::Late(_)) | (false, Choice::Sequential) => 3000,
                    _ => 1000,
                };
                c.observe(&window(rate, if reads { 0.0 } else { 0.9 }, 0.9, 0.0))
            })
            .collect();
        let windows: Vec<u64> = decisions.iter().map(|d| d.window).collect();
        assert!(windows.windows(2).all(|p| p[1] - p[0] > u64::from(DWELL_WINDOWS)), "{windows:?}");
        let late_turns = windows.iter().filter(|&&w| w > 100).count();
        assert!(late_turns <= 20, "{late_turns} decisions in 20 turns: {decisions:#?}");
        assert!(late_turns >= 10, "the controller stopped following the workload: {decisions:#?}");
    }

    #[test]
    fn a_workload_shift_measures_again() {
        let mut c = Controller::new(4, 4);
        let fast_late = |ch: Choice| if matches!(ch, Choice::Late(_)) { 3000 } else { 1000 };
        run(&mut c, 30, 0.0, fast_late);
        assert_eq!(c.current(), Choice::Late(4));
        let fast_seq = |ch: Choice| if ch == Choice::Sequential { 3000 } else { 1000 };
        run(&mut c, 40, 0.5, fast_seq);
        assert_eq!(c.current(), Choice::Sequential);
    }
}
