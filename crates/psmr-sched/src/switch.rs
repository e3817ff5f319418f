//! Changing the scheduler between two batches (003 §6.8, lesson 3: both
//! techniques need a reconfiguration protocol to adapt the number of
//! workers on the fly).
//!
//! Every scheduler gives the replies and the final state of sequential
//! execution, so which one runs, with how many workers and which mapping,
//! is a local choice of each replica that nobody else can observe. A
//! [`Switchable`] makes the choice changeable: [`Switchable::switch`] builds
//! the next scheduler over the same service, class model and reply sink,
//! drains the running one (every command it was given executed, its threads
//! joined) and hands every later batch to the next. Between the last batch
//! of the old one and the first of the new one nothing runs.
//!
//! What the old one must finish is only what it has begun: the early
//! schedulers give back the batches still waiting in their workers' queues
//! ([`Scheduler::withdraw`], [`crate::Withdrawal`]), and the next scheduler
//! executes them first, in log order. So a switch away from one waits at
//! most for the batches its workers were executing, not for its queues.
//!
//! [`Switchable::switch_overlapped`] does not drain at all: the old
//! scheduler goes on executing what it holds while the next one takes the
//! batches that follow, each as soon as the old one says nothing it still
//! holds conflicts with it ([`Scheduler::may_conflict`]). Commands that do
//! not conflict commute, so the replies and the state are those of
//! sequential execution still; conflicting ones keep their log order
//! because the first batch that conflicts waits for the old scheduler to
//! finish. The late schedulers answer from their dependency graph, so a
//! switch away from one stalls only as long as the next batches really
//! depend on what it holds. The early schedulers, once they have withdrawn,
//! answer exactly from the key summaries of the batches they began, so
//! the withdrawn batches, and those that follow, wait only if they depend
//! on those; their workers' threads are then joined elsewhere. Any other
//! scheduler answers "may conflict", and the first batch after the switch
//! waits for it to drain.

use crate::{build, ReplySink, SchedConfig, SchedError, SchedStats, Scheduler, SchedulerKind, Withdrawal};
use crossbeam::channel::{Receiver, Sender};
use psmr_model::{Batch, ClassModel, Service};
use std::collections::VecDeque;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A scheduler that can be replaced between two batches (see the module
/// documentation).
pub struct Switchable<S: Service> {
    current: Box<dyn Scheduler<S>>,
    config: SchedConfig,
    service: Arc<S>,
    model: ClassModel,
    sink: Arc<dyn ReplySink<S::Reply>>,
    /// What the schedulers switched away from executed.
    executed_before: Vec<u64>,
    /// Schedulers switched away from after they executed everything,
    /// finishing on a thread of their own.
    retiring: Retiring<S>,
    /// A scheduler switched away from by [`Switchable::switch_overlapped`]
    /// that may still be executing, and what the overlap has cost so far.
    draining: Option<Draining<S>>,
    /// Overlaps that ended, oldest first, until
    /// [`Switchable::overlap_ended`] takes them: at most two, the one
    /// before a switch and the switch's own, which ends as it begins when
    /// the first batch it gave back conflicts.
    ended: VecDeque<Overlap>,
    /// Switches made.
    switches: u64,
    /// See [`Switchable::withdrawn`].
    withdrawn: u64,
}

/// The scheduler switched away from, when the stall began, and what it
/// withdrew.
type Replaced<S> = (Box<dyn Scheduler<S>>, Instant, Option<Withdrawal<<S as Service>::Op>>);

/// A scheduler switched away from that may still be executing.
struct Draining<S: Service> {
    old: Box<dyn Scheduler<S>>,
    overlap: Overlap,
    /// Its withdrawal, which tells when what it began has executed.
    withdrawn: Option<Withdrawal<S::Op>>,
}

/// What an overlapped switch cost after it returned.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Overlap {
    /// The switch, counted from 1 ([`Switchable::switches`]).
    pub switch: u64,
    /// How long batches waited for the old scheduler: the part of the
    /// switch's stall that came after [`Switchable::switch_overlapped`].
    pub stall: Duration,
    /// Batches the next scheduler took while the old one still executed.
    pub batches: u64,
}

impl<S: Service> Switchable<S> {
    /// Builds the scheduler `config` describes, as [`build`] does.
    pub fn new(
        config: SchedConfig,
        service: Arc<S>,
        model: &ClassModel,
        sink: Arc<dyn ReplySink<S::Reply>>,
    ) -> Result<Self, SchedError> {
        let current = build(&config, service.clone(), model, sink.clone())?;
        let (executed_before, retiring) = (Vec::new(), Retiring::new());
        let (draining, ended) = (None, VecDeque::new());
        let model = model.clone();
        Ok(Self {
            current,
            config,
            service,
            model,
            sink,
            executed_before,
            retiring,
            draining,
            ended,
            switches: 0,
            withdrawn: 0,
        })
    }

    /// The configuration of the scheduler running now.
    pub fn config(&self) -> &SchedConfig {
        &self.config
    }

    /// Replaces the running scheduler by the one `config` describes, after
    /// every command given so far has executed. Returns how long the
    /// switch stalled execution. If the next scheduler cannot be built the
    /// running one stays ([`SwitchError::Build`]); if the running one fails
    /// while it drains, the error is its failure ([`SwitchError::Drain`]).
    pub fn switch(&mut self, config: SchedConfig) -> Result<Duration, SwitchError> {
        let (old, started, mut withdrawn) = self.replace(config)?;
        self.retire_here(old)?;
        let back = self.take_back(&mut withdrawn);
        let stall = started.elapsed();
        self.resubmit(back)?;
        Ok(stall)
    }

    /// Replaces the running scheduler by the one `config` describes at
    /// once, without draining it (see the module documentation). Returns
    /// how long the switch stalled execution: building the next scheduler
    /// is done first, so little more than the swap, plus the wait for a
    /// scheduler still draining from the switch before. What later batches
    /// wait for the old one is reported by [`Switchable::overlap_ended`].
    ///
    /// A scheduler that withdraws what it has not begun
    /// ([`Scheduler::withdraw`]) gives those batches back at once, and the
    /// next one executes them first, each as soon as nothing the old one
    /// began conflicts with it. Schedulers switched away from are joined
    /// on a thread of their own (whose result a later switch or
    /// [`Scheduler::finish`] collects), so that the switch does not wait
    /// for their threads to be scheduled and exit.
    pub fn switch_overlapped(&mut self, config: SchedConfig) -> Result<Duration, SwitchError> {
        self.collect_retired(false).map_err(SwitchError::Drain)?;
        let (old, started, mut withdrawn) = self.replace(config)?;
        let back = self.take_back(&mut withdrawn);
        if old.drained() {
            self.retire_elsewhere(old)?;
        } else {
            let overlap = Overlap { switch: self.switches, ..Overlap::default() };
            self.draining = Some(Draining { old, overlap, withdrawn });
        }
        let stall = started.elapsed();
        self.resubmit(back)?;
        Ok(stall)
    }

    /// Commands the last switch took back from the scheduler it replaced
    /// and gave to the next one ([`Scheduler::withdraw`]).
    pub fn withdrawn(&self) -> u64 {
        self.withdrawn
    }

    /// Whether a scheduler switched away from by
    /// [`Switchable::switch_overlapped`] may still be executing (it held
    /// something at the switch, and has not been seen to finish).
    pub fn overlapping(&self) -> bool {
        self.draining.is_some()
    }

    /// The cost of the oldest overlap not yet taken, once its old
    /// scheduler has finished executing; `None` before that, for a switch
    /// that did not overlap (the old one held nothing), and once taken.
    pub fn overlap_ended(&mut self) -> Option<Overlap> {
        self.ended.pop_front()
    }

    /// Switches made so far; [`Overlap::switch`] names one of them.
    pub fn switches(&self) -> u64 {
        self.switches
    }

    /// Before `batch` runs on the next scheduler: retires a draining
    /// scheduler that is done, or waits for it if `batch` may conflict
    /// with what it still holds.
    fn overlap(&mut self, batch: &Batch<S::Op>) -> Result<(), SchedError> {
        let Some(Draining { old, overlap, .. }) = &mut self.draining else { return Ok(()) };
        if !old.drained() && !old.may_conflict(batch) {
            overlap.batches += 1;
            return Ok(());
        }
        self.end_overlap(true).map_err(SchedError::from)
    }

    /// Finishes the draining scheduler, if any: on a thread of its own if
    /// it is done, or once its withdrawal says it is, else here. Waiting
    /// counts as the overlap's stall if something `stalls` meanwhile (a
    /// batch, or a switch), not when all is finishing.
    fn end_overlap(&mut self, stalls: bool) -> Result<(), SwitchError> {
        let Some(Draining { old, mut overlap, withdrawn }) = self.draining.take() else { return Ok(()) };
        let waited = Instant::now();
        let done = match (old.drained(), withdrawn) {
            (true, _) => Some(old),
            (false, Some(mut withdrawn)) => {
                withdrawn.wait().map_err(SwitchError::Drain)?;
                Some(old)
            }
            (false, None) => {
                self.retire_here(old)?;
                None
            }
        };
        if stalls {
            overlap.stall += waited.elapsed();
        }
        // Its threads are joined elsewhere: no part of the stall.
        done.map_or(Ok(()), |old| self.retire_elsewhere(old))?;
        self.ended.push_back(overlap);
        Ok(())
    }

    /// Finishes `old`, which has executed everything, without waiting for
    /// its threads: the retiring thread joins them.
    fn retire_elsewhere(&mut self, old: Box<dyn Scheduler<S>>) -> Result<(), SwitchError> {
        if old.kind() == SchedulerKind::Sequential {
            // No threads to wait for.
            return self.retire_here(old);
        }
        match self.retiring.take(old) {
            Ok(()) => Ok(()),
            // No retiring thread could start: the old one finishes here.
            Err(old) => self.retire_here(old),
        }
    }

    /// Builds the scheduler `config` describes, withdraws what the running
    /// one has not begun, and puts the next one in its place; returns the
    /// old one, the moment the stall began and what it withdrew. Built
    /// first: a configuration that cannot run leaves the running scheduler
    /// untouched.
    fn replace(&mut self, config: SchedConfig) -> Result<Replaced<S>, SwitchError> {
        let next = build(&config, self.service.clone(), &self.model, self.sink.clone()).map_err(SwitchError::Build)?;
        // Its start is no part of the stall.
        self.retiring.start();
        let started = Instant::now();
        // At most one scheduler drains behind the running one.
        self.end_overlap(true)?;
        self.switches += 1;
        let withdrawn = self.current.withdraw();
        self.config = config;
        Ok((std::mem::replace(&mut self.current, next), started, withdrawn))
    }

    /// Takes back the batches the old scheduler withdrew.
    fn take_back(&mut self, withdrawn: &mut Option<Withdrawal<S::Op>>) -> Vec<Batch<S::Op>> {
        self.withdrawn = withdrawn.as_ref().map_or(0, Withdrawal::commands);
        withdrawn.as_mut().map_or_else(Vec::new, Withdrawal::back)
    }

    /// Gives the withdrawn batches to the running scheduler, ahead of any
    /// later batch (executing them is not stall).
    fn resubmit(&mut self, back: Vec<Batch<S::Op>>) -> Result<(), SwitchError> {
        back.into_iter().try_for_each(|batch| Scheduler::submit(self, batch)).map_err(SwitchError::Drain)
    }

    /// Finishes `old` on this thread and counts what it executed.
    fn retire_here(&mut self, old: Box<dyn Scheduler<S>>) -> Result<(), SwitchError> {
        let stats = old.finish().map_err(SwitchError::Drain)?;
        merge(&mut self.executed_before, &stats.executed_per_worker);
        Ok(())
    }

    /// Merges what retired schedulers executed: those already finished, or
    /// all of them (`wait`). A retired scheduler's failure is returned.
    fn collect_retired(&mut self, wait: bool) -> Result<(), SchedError> {
        for stats in self.retiring.collect(wait) {
            merge(&mut self.executed_before, &stats?.executed_per_worker);
        }
        Ok(())
    }
}

/// The thread that finishes the schedulers switched away from, started at
/// the first switch (before its stall begins): a switch hands one over and
/// goes on, instead of waiting for its threads to be scheduled and exit,
/// or for a thread to start.
struct Retiring<S: Service> {
    /// Schedulers to finish; `None` until the thread starts.
    to_finish: Option<Sender<Box<dyn Scheduler<S>>>>,
    finished: Receiver<Result<SchedStats, SchedError>>,
    results: Sender<Result<SchedStats, SchedError>>,
    thread: Option<JoinHandle<()>>,
}

impl<S: Service> Retiring<S> {
    fn new() -> Self {
        let (results, finished) = crossbeam::channel::unbounded();
        Self { to_finish: None, finished, results, thread: None }
    }

    /// Starts the thread, unless it runs; if it cannot start, schedulers
    /// are finished where they are retired.
    fn start(&mut self) {
        if self.to_finish.is_some() {
            return;
        }
        let (tx, rx) = crossbeam::channel::unbounded::<Box<dyn Scheduler<S>>>();
        let results = self.results.clone();
        let body = move || {
            for old in rx {
                // The switch that collects this has gone if the send fails.
                let _ = results.send(old.finish());
            }
        };
        if let Ok(handle) = std::thread::Builder::new().name("psmr-retire".into()).spawn(body) {
            (self.to_finish, self.thread) = (Some(tx), Some(handle));
        }
    }

    /// Hands `old` to the retiring thread; gives it back if the thread
    /// does not run. The channels hold at most one scheduler per switch
    /// not yet collected.
    fn take(&mut self, old: Box<dyn Scheduler<S>>) -> Result<(), Box<dyn Scheduler<S>>> {
        match &self.to_finish {
            Some(tx) => tx.send(old).map_err(|e| e.into_inner()),
            None => Err(old),
        }
    }

    /// The results of the schedulers finished so far; with `wait`, of all
    /// of them, once the thread has finished them and exited.
    fn collect(&mut self, wait: bool) -> Vec<Result<SchedStats, SchedError>> {
        if wait {
            self.to_finish = None;
            if let Some(Err(p)) = self.thread.take().map(JoinHandle::join) {
                return vec![Err(SchedError::Retired(crate::panic_message(p.as_ref())))];
            }
        }
        self.finished.try_iter().collect()
    }
}

/// Why a [`Switchable::switch`] failed.
#[derive(Debug, thiserror::Error)]
pub enum SwitchError {
    /// The next scheduler cannot be built; the running one stays.
    #[error("the new scheduler cannot start, the running one stays: {0}")]
    Build(SchedError),
    /// The running scheduler failed while it drained: execution failed.
    #[error("execution failed while the scheduler drained: {0}")]
    Drain(SchedError),
}

impl From<SwitchError> for SchedError {
    fn from(e: SwitchError) -> Self {
        match e {
            SwitchError::Build(e) | SwitchError::Drain(e) => e,
        }
    }
}

fn merge(into: &mut Vec<u64>, counts: &[u64]) {
    if into.len() < counts.len() {
        into.resize(counts.len(), 0);
    }
    for (total, n) in into.iter_mut().zip(counts) {
        *total += n;
    }
}

impl<S: Service> Scheduler<S> for Switchable<S> {
    fn kind(&self) -> SchedulerKind {
        self.current.kind()
    }

    fn submit(&mut self, batch: Batch<S::Op>) -> Result<(), SchedError> {
        self.overlap(&batch)?;
        self.current.submit(batch)
    }

    fn metrics(&self) -> Option<Arc<crate::Metrics>> {
        self.current.metrics()
    }

    fn running(&self) -> SchedulerKind {
        self.current.running()
    }

    fn decisions(&self) -> Vec<crate::auto::Decision> {
        self.current.decisions()
    }

    fn decisions_made(&self) -> u64 {
        self.current.decisions_made()
    }

    fn describe(&self) -> String {
        match self.current.kind() {
            SchedulerKind::Auto => self.current.describe(),
            SchedulerKind::Sequential => "sequential".to_string(),
            kind => format!("{kind} with {} workers", self.config.workers),
        }
    }

    fn may_conflict(&self, batch: &Batch<S::Op>) -> bool {
        self.draining.as_ref().is_some_and(|d| d.old.may_conflict(batch)) || self.current.may_conflict(batch)
    }

    fn drained(&self) -> bool {
        self.draining.as_ref().map_or(true, |d| d.old.drained()) && self.current.drained()
    }

    /// Finishes the running scheduler; the counts cover every scheduler
    /// this one ran, per worker id.
    fn finish(mut self: Box<Self>) -> Result<SchedStats, SchedError> {
        self.end_overlap(false)?;
        self.collect_retired(true)?;
        let mut executed = self.executed_before;
        merge(&mut executed, &self.current.finish()?.executed_per_worker);
        Ok(SchedStats { executed_per_worker: executed })
    }
}
