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
//! of the old one and the first of the new one nothing runs: the stall is
//! the time the old one needs to finish what it holds, at most the batches
//! in its queues. A caller that knows the old one has executed everything
//! ([`Switchable::switch_drained`], used by `auto`, which counts replies)
//! does not wait for its threads to exit either: another thread joins
//! them.
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
//! depend on what it holds; every other scheduler answers "may conflict",
//! and the first batch after the switch waits for it to drain.

use crate::{build, ReplySink, SchedConfig, SchedError, SchedStats, Scheduler, SchedulerKind};
use parking_lot::Mutex;
use psmr_model::{Batch, ClassModel, Service};
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
    /// finishing on threads of their own.
    retiring: Vec<JoinHandle<Result<SchedStats, SchedError>>>,
    /// A scheduler switched away from by [`Switchable::switch_overlapped`]
    /// that may still be executing, and what the overlap has cost so far.
    draining: Option<(Box<dyn Scheduler<S>>, Overlap)>,
    /// The last overlap, once it ended, until [`Switchable::overlap_ended`]
    /// takes it.
    ended: Option<Overlap>,
}

/// What an overlapped switch cost after it returned.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Overlap {
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
        let (executed_before, retiring) = (Vec::new(), Vec::new());
        let (draining, ended) = (None, None);
        Ok(Self { current, config, service, model: model.clone(), sink, executed_before, retiring, draining, ended })
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
        let (old, started) = self.replace(config, || {})?;
        self.retire_here(old)?;
        Ok(started.elapsed())
    }

    /// [`Switchable::switch`] for a caller that can tell when every
    /// command given so far has executed: once the next scheduler is
    /// built, `drained` waits for that, and the old scheduler's threads
    /// are joined on a thread of their own (whose result a later switch or
    /// [`Scheduler::finish`] collects), so that the switch does not wait
    /// for them to be scheduled and exit. Returns how long it stalled
    /// execution: `drained`'s wait and the swap.
    pub fn switch_drained(&mut self, config: SchedConfig, drained: impl FnOnce()) -> Result<Duration, SwitchError> {
        self.collect_retired(false).map_err(SwitchError::Drain)?;
        let (old, started) = self.replace(config, drained)?;
        self.retire_elsewhere(old)?;
        Ok(started.elapsed())
    }

    /// Replaces the running scheduler by the one `config` describes at
    /// once, without draining it (see the module documentation). Returns
    /// how long the switch stalled execution: building the next scheduler
    /// is done first, so little more than the swap, plus the wait for a
    /// scheduler still draining from the switch before. What later batches
    /// wait for the old one is reported by [`Switchable::overlap_ended`].
    pub fn switch_overlapped(&mut self, config: SchedConfig) -> Result<Duration, SwitchError> {
        let (old, started) = self.replace(config, || {})?;
        match old.drained() {
            true => self.retire_elsewhere(old)?,
            false => self.draining = Some((old, Overlap::default())),
        }
        Ok(started.elapsed())
    }

    /// Whether a scheduler switched away from by
    /// [`Switchable::switch_overlapped`] may still be executing (it held
    /// something at the switch, and has not been seen to finish).
    pub fn overlapping(&self) -> bool {
        self.draining.is_some()
    }

    /// The cost of the last overlap, once its old scheduler has finished
    /// executing; `None` before that, for a switch that did not overlap
    /// (the old one held nothing), and once taken.
    pub fn overlap_ended(&mut self) -> Option<Overlap> {
        self.ended.take()
    }

    /// Before `batch` runs on the next scheduler: retires a draining
    /// scheduler that is done, or waits for it if `batch` may conflict
    /// with what it still holds.
    fn overlap(&mut self, batch: &Batch<S::Op>) -> Result<(), SchedError> {
        let Some((old, overlap)) = &mut self.draining else { return Ok(()) };
        if !old.drained() && !old.may_conflict(batch) {
            overlap.batches += 1;
            return Ok(());
        }
        self.end_overlap().map_err(SchedError::from)
    }

    /// Finishes the draining scheduler, if any: on a thread of its own if
    /// it is done, else here, counting the wait as stall.
    fn end_overlap(&mut self) -> Result<(), SwitchError> {
        let Some((old, mut overlap)) = self.draining.take() else { return Ok(()) };
        if old.drained() {
            self.retire_elsewhere(old)?;
        } else {
            let waited = Instant::now();
            self.retire_here(old)?;
            overlap.stall += waited.elapsed();
        }
        self.ended = Some(overlap);
        Ok(())
    }

    /// Finishes `old`, which has executed everything, without waiting for
    /// its threads: they are joined on a thread of their own.
    fn retire_elsewhere(&mut self, old: Box<dyn Scheduler<S>>) -> Result<(), SwitchError> {
        if old.kind() == SchedulerKind::Sequential {
            // No threads to wait for: faster here than a thread's spawn.
            return self.retire_here(old);
        }
        // If no thread can be spawned, the old one finishes here.
        let slot = Arc::new(Mutex::new(Some(old)));
        let theirs = slot.clone();
        let retire = move || theirs.lock().take().map_or(Ok(SchedStats::default()), |old| old.finish());
        match std::thread::Builder::new().name("psmr-retire".into()).spawn(retire) {
            Ok(handle) => self.retiring.push(handle),
            Err(_) => {
                if let Some(old) = slot.lock().take() {
                    self.retire_here(old)?;
                }
            }
        }
        Ok(())
    }

    /// Builds the scheduler `config` describes, waits for `drained`, and
    /// puts it in place of the running one, which it returns with the
    /// moment the stall began. Built first: a configuration that cannot
    /// run leaves the running scheduler untouched.
    fn replace(
        &mut self,
        config: SchedConfig,
        drained: impl FnOnce(),
    ) -> Result<(Box<dyn Scheduler<S>>, Instant), SwitchError> {
        let next = build(&config, self.service.clone(), &self.model, self.sink.clone()).map_err(SwitchError::Build)?;
        let started = Instant::now();
        // At most one scheduler drains behind the running one.
        self.end_overlap()?;
        drained();
        self.config = config;
        Ok((std::mem::replace(&mut self.current, next), started))
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
        let (done, running): (Vec<_>, Vec<_>) =
            std::mem::take(&mut self.retiring).into_iter().partition(|h| wait || h.is_finished());
        self.retiring = running;
        for handle in done {
            let stats = handle.join().map_err(|p| SchedError::Retired(crate::panic_message(p.as_ref())))??;
            merge(&mut self.executed_before, &stats.executed_per_worker);
        }
        Ok(())
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
        self.draining.as_ref().is_some_and(|(old, _)| old.may_conflict(batch)) || self.current.may_conflict(batch)
    }

    fn drained(&self) -> bool {
        self.draining.as_ref().map_or(true, |(old, _)| old.drained()) && self.current.drained()
    }

    /// Finishes the running scheduler; the counts cover every scheduler
    /// this one ran, per worker id.
    fn finish(mut self: Box<Self>) -> Result<SchedStats, SchedError> {
        self.end_overlap()?;
        self.collect_retired(true)?;
        let mut executed = self.executed_before;
        merge(&mut executed, &self.current.finish()?.executed_per_worker);
        Ok(SchedStats { executed_per_worker: executed })
    }
}
