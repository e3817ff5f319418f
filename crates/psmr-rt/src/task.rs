//! Tasks: the promise a spawn returns (001 §4.5.4), yielding to the
//! pool (§4.5.3), and blocking a thread outside the pools on a future.

use crate::pool::Shared;
use crate::RtError;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

/// When a task was last queued, ns since its pool started: its queue wait
/// is measured from it.
#[derive(Debug, Default)]
pub(crate) struct Stamp(AtomicU64);

impl Stamp {
    pub(crate) fn set(&self, ns: u64) {
        self.0.store(ns, Ordering::Relaxed);
    }

    pub(crate) fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// The result of a spawned future: await it from a task, or
/// [`Task::wait`] for it from a thread outside the pool. The task runs
/// whether or not anybody awaits it; dropping this only forgets the
/// result.
pub struct Task<T> {
    inner: Option<async_task::FallibleTask<T, Stamp>>,
    pool: Arc<Shared>,
}

impl<T> Task<T> {
    pub(crate) fn new(task: async_task::Task<T, Stamp>, pool: Arc<Shared>) -> Self {
        Task { inner: Some(task.fallible()), pool }
    }

    /// Blocks the calling thread until the task is done. Refused on a
    /// worker of the task's own pool, which could wait for itself.
    pub fn wait(self) -> Result<T, RtError> {
        if self.pool.on_worker() {
            return Err(RtError::WaitOnWorker { pool: self.pool.config.name.clone() });
        }
        block_on(self)
    }
}

impl<T> Future for Task<T> {
    /// The task's output; [`RtError::Cancelled`] if it panicked or its
    /// pool stopped before it finished.
    type Output = Result<T, RtError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let name = self.pool.config.name.clone();
        let Some(inner) = self.inner.as_mut() else { return Poll::Ready(Err(RtError::Cancelled { pool: name })) };
        match Pin::new(inner).poll(cx) {
            Poll::Ready(out) => {
                self.inner = None;
                Poll::Ready(out.ok_or(RtError::Cancelled { pool: name }))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<T> Drop for Task<T> {
    fn drop(&mut self) {
        // An eager promise: the task goes on without its awaiter.
        if let Some(inner) = self.inner.take() {
            inner.detach();
        }
    }
}

/// Gives the pool's other tasks a turn: the task goes to its pool's yield
/// queue, which every worker looks at every few tasks and when it has
/// nothing else, so a task that yields while it waits for another cannot
/// keep that one from running (001 §4.5.3).
pub fn yield_now() -> YieldNow {
    YieldNow { yielded: false }
}

/// The future of [`yield_now`].
#[derive(Debug)]
#[must_use = "a yield does nothing unless awaited"]
pub struct YieldNow {
    yielded: bool,
}

impl Future for YieldNow {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.yielded {
            return Poll::Ready(());
        }
        self.yielded = true;
        // Woken while it runs: its pool takes that for a yield.
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

struct Unparker(crate::shim::Thread);

impl Wake for Unparker {
    fn wake(self: Arc<Self>) {
        crate::shim::unpark(&self.0);
    }

    fn wake_by_ref(self: &Arc<Self>) {
        crate::shim::unpark(&self.0);
    }
}

/// Runs `future` on the calling thread, parking it while the future
/// waits. For threads outside the pools (a pool's own worker would stop
/// running its other tasks).
pub fn block_on<F: Future>(future: F) -> F::Output {
    let waker = Waker::from(Arc::new(Unparker(crate::shim::current())));
    let mut cx = Context::from_waker(&waker);
    let mut future = std::pin::pin!(future);
    loop {
        if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
        crate::shim::park();
    }
}
