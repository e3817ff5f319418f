//! `sequential`: classic SMR, one thread executing the log in order.

use crate::exec::Executor;
use crate::sink::ReplySink;
use crate::{check_classes, SchedError, SchedStats, Scheduler, SchedulerKind};
use psmr_model::{Batch, Service};
use std::sync::Arc;

/// Executes each batch in the caller's thread as it is submitted. No queue,
/// no hand-off: this is the plain loop the parallel schedulers are measured
/// against.
pub(crate) struct Sequential<S: Service> {
    exec: Executor<S>,
    classes: usize,
    executed: u64,
}

impl<S: Service> Sequential<S> {
    pub(crate) fn new(service: Arc<S>, sink: Arc<dyn ReplySink<S::Reply>>, classes: usize) -> Self {
        Self { exec: Executor::new(service, sink), classes, executed: 0 }
    }
}

impl<S: Service> Scheduler<S> for Sequential<S> {
    fn kind(&self) -> SchedulerKind {
        SchedulerKind::Sequential
    }

    fn submit(&mut self, batch: Batch<S::Op>) -> Result<(), SchedError> {
        self.exec.failure.check()?;
        check_classes(&batch, self.classes)?;
        for cmd in batch.commands() {
            if !self.exec.run(0, cmd) {
                break;
            }
            self.executed += 1;
        }
        self.exec.failure.check()
    }

    fn may_conflict(&self, _batch: &Batch<S::Op>) -> bool {
        false
    }

    fn drained(&self) -> bool {
        true
    }

    fn finish(self: Box<Self>) -> Result<SchedStats, SchedError> {
        self.exec.failure.check()?;
        Ok(SchedStats { executed_per_worker: vec![self.executed] })
    }
}
