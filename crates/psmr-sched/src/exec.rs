//! Executing one command: catching service panics, emitting the reply.

use crate::sink::{Reply, ReplySink};
use crate::{SchedError, SchedStats};
use parking_lot::Mutex;
use psmr_model::{Command, Service};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

/// The first service panic, or the first worker that died outside the
/// service, shared by a scheduler and its workers.
#[derive(Debug, Default)]
pub(crate) struct Failure {
    failed: AtomicBool,
    first: Mutex<Option<(u64, u64, u16, String)>>,
    /// A worker that panicked outside the service (a bug in psmr), with
    /// the panic message: what it held (a graph node, its part of a
    /// barrier, a queue's credits) is never given back, so nobody may wait
    /// for it any more.
    died: OnceLock<(usize, String)>,
}

impl Failure {
    pub(crate) fn is_set(&self) -> bool {
        // Relaxed is enough: the flag only stops further work early; the
        // details are read under the mutex.
        self.failed.load(Ordering::Relaxed)
    }

    /// Records a service panic; true for the first one.
    fn record(&self, client: u64, seq: u64, class: u16, message: String) -> bool {
        let mut first = self.first.lock();
        let is_first = first.is_none();
        if is_first {
            tracing::error!(client, seq, class, %message, "service panicked; skipping the rest of the log");
            *first = Some((client, seq, class, message));
        }
        self.failed.store(true, Ordering::Relaxed);
        is_first
    }

    /// Records that worker `id` died outside the service; true for the
    /// first one. Every later command is skipped, as after a service
    /// panic.
    fn worker_died(&self, id: usize, message: String) -> bool {
        let first = self.died.set((id, message)).is_ok();
        self.failed.store(true, Ordering::Release);
        first
    }

    /// The worker that died outside the service, if one did.
    pub(crate) fn dead_worker(&self) -> Option<usize> {
        self.died.get().map(|(id, _)| *id)
    }

    /// The error for worker `id`'s death.
    fn worker_error(&self, id: usize) -> SchedError {
        let message = match self.died.get() {
            Some((dead, message)) if *dead == id => message.clone(),
            _ => "(its panic was not recorded)".to_string(),
        };
        SchedError::WorkerPanicked { worker: id, message }
    }

    /// The error to report, if a command panicked or a worker died (a
    /// service panic first: it is the cause a user can act on).
    pub(crate) fn error(&self) -> Option<SchedError> {
        let service = self.first.lock().as_ref().map(|(client, seq, class, message)| SchedError::ServicePanicked {
            client: *client,
            seq: *seq,
            class: *class,
            message: message.clone(),
        });
        service.or_else(|| self.dead_worker().map(|id| self.worker_error(id)))
    }

    pub(crate) fn check(&self) -> Result<(), SchedError> {
        if self.is_set() {
            if let Some(e) = self.error() {
                return Err(e);
            }
        }
        Ok(())
    }
}

/// Runs commands against the service and delivers their replies.
pub(crate) struct Executor<S: Service> {
    service: Arc<S>,
    sink: Arc<dyn ReplySink<S::Reply>>,
    pub(crate) failure: Arc<Failure>,
}

impl<S: Service> Clone for Executor<S> {
    fn clone(&self) -> Self {
        Self { service: self.service.clone(), sink: self.sink.clone(), failure: self.failure.clone() }
    }
}

impl<S: Service> Executor<S> {
    pub(crate) fn new(service: Arc<S>, sink: Arc<dyn ReplySink<S::Reply>>) -> Self {
        Self { service, sink, failure: Arc::new(Failure::default()) }
    }

    /// Worker `id` (or a job it ran) panicked outside the service, a bug
    /// in psmr: recorded, so that every later command is skipped and
    /// every wait for it ends; the first such death is logged and the
    /// sink hears of it at once, so that its owner stops instead of
    /// waiting for commands that will never execute. True for the first.
    pub(crate) fn worker_died(&self, id: usize, payload: &(dyn std::any::Any + Send)) -> bool {
        let message = panic_message(payload);
        if !self.failure.worker_died(id, message.clone()) {
            return false;
        }
        tracing::error!(worker = id, "worker panicked: {message}");
        self.sink.failed(&self.failure.worker_error(id));
        true
    }

    /// Executes `cmd` on behalf of `worker` and delivers its reply. Returns
    /// false when it was skipped because an earlier command panicked, or
    /// because this one did.
    #[inline]
    pub(crate) fn run(&self, worker: usize, cmd: &Command<S::Op>) -> bool {
        if self.failure.is_set() {
            return false;
        }
        // The service is only touched through `&self` and guards its own
        // memory; after a panic its state is untrusted and never used again
        // (every later command is skipped), so unwind safety holds.
        match catch_unwind(AssertUnwindSafe(|| self.service.execute(cmd))) {
            Ok(value) => {
                // Stands for a bug in psmr on an execution thread (the
                // fail-stop tests): outside the service, nothing catches it.
                fail::fail_point!("sched-deliver");
                self.sink.deliver(worker, Reply { client: cmd.client, seq: cmd.seq, value });
                true
            }
            Err(payload) => {
                if self.failure.record(cmd.client.0, cmd.seq, cmd.class.0, panic_message(payload.as_ref())) {
                    if let Some(e) = self.failure.error() {
                        self.sink.failed(&e);
                    }
                }
                false
            }
        }
    }

    /// Spawns worker thread `id` running `body`. A panic outside the
    /// service (a bug in psmr) would leave the other workers waiting for
    /// it at the next barrier: it is recorded ([`Executor::worker_died`])
    /// and `abandon` ends every wait of the pool; the panic then goes on,
    /// and joining the thread reports it as [`SchedError::WorkerPanicked`].
    pub(crate) fn spawn_worker(
        &self,
        name: String,
        id: usize,
        body: impl FnOnce() -> u64 + Send + 'static,
        abandon: impl FnOnce() + Send + 'static,
    ) -> Result<std::thread::JoinHandle<u64>, SchedError> {
        let exec = self.clone();
        std::thread::Builder::new()
            .name(name)
            .spawn(move || match catch_unwind(AssertUnwindSafe(body)) {
                Ok(executed) => executed,
                Err(payload) => {
                    exec.worker_died(id, payload.as_ref());
                    abandon();
                    std::panic::resume_unwind(payload)
                }
            })
            .map_err(|e| SchedError::Spawn(e.to_string()))
    }
}

/// The message of a panic payload.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".to_string())
}

/// What a pool of workers reports once joined: each worker's count of
/// executed commands, or the id of a worker that died; then the first
/// service panic, if any.
pub(crate) fn stats_of(joined: Vec<Result<u64, usize>>, failure: &Failure) -> Result<SchedStats, SchedError> {
    let executed_per_worker =
        joined.into_iter().map(|r| r.map_err(|id| failure.worker_error(id))).collect::<Result<_, _>>()?;
    failure.check()?;
    Ok(SchedStats { executed_per_worker })
}
