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
        Ok(Self { current, config, service, model: model.clone(), sink, executed_before, retiring })
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
        if old.kind() == SchedulerKind::Sequential {
            // No threads to wait for: faster here than a thread's spawn.
            self.retire_here(old)?;
            return Ok(started.elapsed());
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
        Ok(started.elapsed())
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

    /// Finishes the running scheduler; the counts cover every scheduler
    /// this one ran, per worker id.
    fn finish(mut self: Box<Self>) -> Result<SchedStats, SchedError> {
        self.collect_retired(true)?;
        let mut executed = self.executed_before;
        merge(&mut executed, &self.current.finish()?.executed_per_worker);
        Ok(SchedStats { executed_per_worker: executed })
    }
}
