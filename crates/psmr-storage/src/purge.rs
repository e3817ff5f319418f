//! Purging the log files behind a compaction, off the thread that
//! compacts.
//!
//! raft-engine deletes, and may rewrite, whole files when it purges: at a
//! gigabyte of compacted log that took about a second here, and the
//! protocol thread, which compacts the log behind every snapshot, would
//! hold every command that long. One thread per store purges instead,
//! when asked; asks that come while it is busy fold into one.

use crate::private::Engine;
use std::sync::mpsc::{self, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;

/// The purging thread of one store; dropping it lets the thread finish
/// the purge it is on and waits for it (so the engine, and its directory
/// lock, are gone once the store is).
pub(crate) struct Purger {
    wake: Option<SyncSender<()>>,
    engine: Arc<Engine>,
    thread: Option<JoinHandle<()>>,
}

impl Purger {
    /// Starts the thread; if it cannot start, purges run on the caller.
    pub(crate) fn start(engine: Arc<Engine>) -> Self {
        let (wake, asked) = mpsc::sync_channel::<()>(1);
        let e = engine.clone();
        let thread = std::thread::Builder::new().name("psmr-purge".into()).spawn(move || {
            for () in asked {
                purge(&e);
            }
        });
        match thread {
            Ok(t) => Self { wake: Some(wake), engine, thread: Some(t) },
            Err(err) => {
                tracing::warn!("cannot start the log purging thread, purging inline: {err}");
                Self { wake: None, engine, thread: None }
            }
        }
    }

    /// Asks for a purge, without waiting for it.
    pub(crate) fn request(&self) {
        match self.wake.as_ref().map(|w| w.try_send(())) {
            Some(Ok(())) | Some(Err(TrySendError::Full(()))) => {}
            Some(Err(TrySendError::Disconnected(()))) | None => purge(&self.engine),
        }
    }
}

impl Drop for Purger {
    fn drop(&mut self) {
        self.wake = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn purge(engine: &Engine) {
    if let Err(e) = engine.purge_expired_files() {
        tracing::warn!("cannot purge the compacted log files: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Asks never block, however many come while a purge runs, and the
    /// thread is gone once the purger is dropped: the engine's directory
    /// opens again at once.
    #[test]
    fn asks_fold_and_dropping_waits_for_the_thread() {
        let dir = tempfile::tempdir().unwrap();
        let config = raft_engine::Config { dir: dir.path().display().to_string(), ..Default::default() };
        let engine = Arc::new(crate::private::open(config.clone()).unwrap());
        let purger = Purger::start(engine.clone());
        for _ in 0..1000 {
            purger.request();
        }
        drop(purger);
        assert_eq!(Arc::strong_count(&engine), 1, "the thread let go of the engine");
        drop(engine);
        crate::private::open(config).expect("the directory is free again");
    }
}
