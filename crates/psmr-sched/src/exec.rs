//! Executing one command: catching service panics, emitting the reply.

use crate::sink::{Reply, ReplySink};
use crate::{SchedError, SchedStats};
use parking_lot::Mutex;
use psmr_model::{Command, Service};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// The first service panic, shared by a scheduler and its workers.
#[derive(Debug, Default)]
pub(crate) struct Failure {
    failed: AtomicBool,
    first: Mutex<Option<(u64, u64, u16, String)>>,
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

    /// The error to report, if a command panicked.
    pub(crate) fn error(&self) -> Option<SchedError> {
        self.first.lock().as_ref().map(|(client, seq, class, message)| SchedError::ServicePanicked {
            client: *client,
            seq: *seq,
            class: *class,
            message: message.clone(),
        })
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

    /// A job of worker `id` panicked outside the service: see
    /// [`worker_panicked`].
    pub(crate) fn job_panicked(&self, id: usize, payload: &(dyn std::any::Any + Send)) {
        worker_panicked(&*self.sink, id, payload);
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
    /// it at the next barrier, so the sink hears of it at once; the panic
    /// then goes on, and joining the thread reports it as
    /// [`SchedError::WorkerPanicked`].
    pub(crate) fn spawn_worker(
        &self,
        name: String,
        id: usize,
        body: impl FnOnce() -> u64 + Send + 'static,
    ) -> Result<std::thread::JoinHandle<u64>, SchedError> {
        let sink = self.sink.clone();
        std::thread::Builder::new()
            .name(name)
            .spawn(move || match catch_unwind(AssertUnwindSafe(body)) {
                Ok(executed) => executed,
                Err(payload) => {
                    worker_panicked(&*sink, id, payload.as_ref());
                    std::panic::resume_unwind(payload)
                }
            })
            .map_err(|e| SchedError::Spawn(e.to_string()))
    }
}

/// Reports a panic of worker `id` outside the service (a bug in psmr):
/// logged, and the sink hears of it at once, so that its owner stops
/// instead of waiting for commands that will never execute.
pub(crate) fn worker_panicked<R>(sink: &dyn ReplySink<R>, id: usize, payload: &(dyn std::any::Any + Send)) {
    tracing::error!(worker = id, "worker panicked: {}", panic_message(payload));
    sink.failed(&SchedError::WorkerPanicked(id));
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
        joined.into_iter().map(|r| r.map_err(SchedError::WorkerPanicked)).collect::<Result<_, _>>()?;
    failure.check()?;
    Ok(SchedStats { executed_per_worker })
}
