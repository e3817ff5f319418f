//! A replica's life: running, stopping, or stopped by a failure. Every
//! thread and task of a replica holds the same [`Life`]: it looks whether
//! the replica stops, and stops it, with the reason, when something goes
//! wrong that the replica must not run on after (fail-stop).

use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicBool, Ordering};
use tracing::{error, info};

/// See the module documentation.
pub struct Life {
    id: u64,
    stopping: AtomicBool,
    stop_tx: tokio::sync::watch::Sender<bool>,
    failure: Mutex<Option<String>>,
    stopped: Condvar,
}

impl Life {
    /// The life of replica `id`, running.
    pub fn new(id: u64) -> Self {
        let (stop_tx, _) = tokio::sync::watch::channel(false);
        Self { id, stopping: AtomicBool::new(false), stop_tx, failure: Mutex::new(None), stopped: Condvar::new() }
    }

    /// True once the replica is stopping.
    pub fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }

    /// Completes when the replica stops.
    pub async fn stopped(&self) {
        let mut rx = self.stop_tx.subscribe();
        let _ = rx.wait_for(|&s| s).await;
    }

    /// Stops the replica because of `why` (the first reason wins).
    pub fn fail(&self, why: String) {
        let mut f = self.failure.lock();
        if f.is_none() {
            error!("{why}");
            *f = Some(why);
        }
        self.stopped.notify_all();
        drop(f);
        self.stop();
    }

    /// Stops the replica because it is no longer a member of the cluster
    /// (`why` says how it learned that): a clean stop, not a failure.
    pub fn stop_removed(&self, why: &str) {
        if !self.stopping() {
            info!(id = self.id, "{why}: this replica is no longer a member of the cluster and stops");
            self.stop();
        }
    }

    /// Stops the replica (cleanly, unless it failed already).
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::Release);
        self.stop_tx.send_replace(true);
        let _f = self.failure.lock();
        self.stopped.notify_all();
    }

    /// Blocks until the replica stops; the reason if it failed.
    pub fn wait(&self) -> Result<(), String> {
        let mut f = self.failure.lock();
        while f.is_none() && !self.stopping() {
            self.stopped.wait(&mut f);
        }
        match f.clone() {
            Some(why) => Err(why),
            None => Ok(()),
        }
    }

    /// Runs `f`, a thread's whole work: a panic in it stops the replica
    /// (the other threads would otherwise run on without this one, a
    /// zombie that still answers clients).
    pub fn guard(&self, thread: &str, f: impl FnOnce()) {
        if let Err(payload) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
            self.fail(format!("thread {thread} panicked: {}", psmr_sched::panic_message(payload.as_ref())));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn the_first_failure_is_the_reason_and_a_clean_stop_has_none() {
        let life = Life::new(1);
        assert!(!life.stopping());
        life.fail("one".into());
        life.fail("two".into());
        assert!(life.stopping());
        assert_eq!(life.wait(), Err("one".into()));
        let clean = Life::new(2);
        clean.stop_removed("removed at 9");
        assert_eq!(clean.wait(), Ok(()));
    }

    #[test]
    fn a_panicking_thread_stops_the_replica_with_its_message() {
        let life = Arc::new(Life::new(1));
        let l = life.clone();
        std::thread::spawn(move || l.guard("psmr-test", || panic!("boom"))).join().unwrap();
        let why = life.wait().unwrap_err();
        assert!(why.contains("thread psmr-test panicked: boom"), "{why}");
    }
}
