//! Taking back what a scheduler holds and has not begun, so that a switch
//! ([`crate::Switchable`]) waits only for the batches already executing.
//!
//! An early scheduler dispatches each batch to its workers' queues, where
//! it may wait behind several others. Draining all of that before the next
//! scheduler starts is a stall as long as the queues. Instead, at a switch,
//! the batches no worker has begun are *withdrawn*: the switch takes them
//! out of the queues and their commands out of the batches (a worker that
//! already took one from its queue skips it), and they go to the next
//! scheduler, in order, ahead of the batches that follow.
//!
//! Which batches may still begin is decided by one atomic word, the
//! [`Gate`]: before a worker begins any part of batch `n` (batches are
//! numbered from 1 in submission order) it raises the word to at least `n`;
//! a switch closes the word, and the value it closes at, `h`, splits the
//! batches once and for all: `1..=h` are executed by the old scheduler,
//! every later one is withdrawn, and no worker has begun any of those.
//! That is a cut of the log: what runs on the old scheduler is a prefix,
//! so no withdrawn command precedes a command left behind, and the next
//! scheduler executes the rest in log order, each command once nothing it
//! depends on is left on the old one. (A finer cut, per worker, could leave
//! less behind when one worker runs ahead of another; the prefix is what
//! one word can decide.)
//!
//! When the old one has finished is told by the batches themselves: after
//! the close, each reports on a channel as its last reference goes
//! ([`Returns`]), and a worker lets go of a batch only after executing its
//! part. So a wait for what was begun ends exactly when it has executed,
//! woken by the worker that finishes it, not when every worker has woken
//! up. Meanwhile the next scheduler already runs the withdrawn and later
//! batches that conflict with nothing the old one began
//! ([`crate::Scheduler::may_conflict`]).

use crate::exec::Failure;
use crate::sync::{AtomicU64, AtomicUsize};
use crate::SchedError;
use crossbeam::channel::{Receiver, RecvTimeoutError, Sender};
use psmr_model::Batch;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// The bit of the gate's word that says it is closed.
const CLOSED: u64 = 1 << 63;

/// Which dispatched batches workers may still begin (see the module
/// documentation). Model-checked in `tests/loom_gate.rs`.
#[derive(Debug, Default)]
pub struct Gate {
    /// The highest batch any worker began, with [`CLOSED`] once closed.
    word: AtomicU64,
}

impl Gate {
    /// An open gate: every batch may begin.
    pub fn new() -> Self {
        Self::default()
    }

    /// Worker side, before it begins any part of batch `n` (from 1): true
    /// if the batch is to be executed, false if it was withdrawn. Every
    /// worker gets the same answer for the same batch.
    pub fn admit(&self, n: u64) -> bool {
        let mut word = self.word.load(Ordering::Acquire);
        loop {
            if word & CLOSED != 0 {
                return n <= word & !CLOSED;
            }
            if word >= n {
                return true;
            }
            match self.word.compare_exchange_weak(word, n, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return true,
                Err(now) => word = now,
            }
        }
    }

    /// Closes the gate: returns the last batch that still executes; every
    /// later one is withdrawn. Closing again returns the same.
    pub fn close(&self) -> u64 {
        self.word.fetch_or(CLOSED, Ordering::AcqRel) & !CLOSED
    }

    /// Whether the gate is closed.
    pub fn closed(&self) -> bool {
        self.word.load(Ordering::Acquire) & CLOSED != 0
    }

    /// Whether batch `n` was withdrawn (the gate is closed below it).
    pub fn withdrawn(&self, n: u64) -> bool {
        let word = self.word.load(Ordering::Acquire);
        word & CLOSED != 0 && n > word & !CLOSED
    }
}

/// How the batches held at a switch tell that they are done; shared by a
/// scheduler and every batch it dispatched.
///
/// After the gate closes, every dispatched batch reports on the channel as
/// its last reference goes. The scheduler counts the batches it still held
/// at the close, so once that many have reported, everything admitted has
/// executed (a worker or thief lets go of a batch only after executing its
/// part).
pub(crate) struct Returns {
    pub(crate) gate: Gate,
    tx: Sender<()>,
    /// Batches whose last reference went after the gate closed.
    gone: AtomicUsize,
}

impl Returns {
    /// An open gate and the channel batches report on. The channel holds
    /// at most the batches the scheduler held at the switch.
    pub(crate) fn new() -> (Arc<Self>, Receiver<()>) {
        let (tx, rx) = crossbeam::channel::unbounded();
        (Arc::new(Self { gate: Gate::new(), tx, gone: AtomicUsize::new(0) }), rx)
    }

    /// Batches whose last reference went since the gate closed.
    pub(crate) fn gone(&self) -> usize {
        self.gone.load(Ordering::Acquire)
    }

    /// Called as the last reference to a batch goes: once the gate is
    /// closed, reports it.
    pub(crate) fn dropped(&self) {
        if !self.gate.closed() {
            return;
        }
        self.gone.fetch_add(1, Ordering::Release);
        // The receiver may be gone (the switch failed): nothing to do.
        let _ = self.tx.send(());
    }
}

/// The batches a scheduler gave back at a switch
/// ([`crate::Scheduler::withdraw`]), taken out at the close
/// ([`Withdrawal::back`]), and a report of every batch it still held:
/// [`Withdrawal::wait`] returns once everything it admitted has executed.
pub struct Withdrawal<O> {
    /// The withdrawn batches, in log order, until taken.
    back: Vec<Batch<O>>,
    /// Batches and commands withdrawn.
    batches: usize,
    commands: u64,
    rx: Receiver<()>,
    /// Batches held at the close, each of which reports once, and the
    /// reports received so far.
    reports: usize,
    received: usize,
    failure: Arc<Failure>,
}

/// How often a wait for what was begun looks at the scheduler's failure.
const FAILURE_POLL: Duration = Duration::from_millis(10);

impl<O> Withdrawal<O> {
    /// `back`: the withdrawn batches, in log order; `reports`: the batches
    /// held at the close, which report on `rx`.
    pub(crate) fn new(back: Vec<Batch<O>>, rx: Receiver<()>, reports: usize, failure: Arc<Failure>) -> Self {
        let commands = back.iter().map(|b| b.len() as u64).sum();
        Self { batches: back.len(), commands, back, rx, reports, received: 0, failure }
    }

    /// Batches withdrawn.
    pub fn len(&self) -> usize {
        self.batches
    }

    /// Whether nothing was withdrawn.
    pub fn is_empty(&self) -> bool {
        self.batches == 0
    }

    /// Commands withdrawn: the scheduler will not execute them.
    pub fn commands(&self) -> u64 {
        self.commands
    }

    /// The withdrawn batches, in log order (once; then none), while the
    /// scheduler may still execute what it had begun.
    pub fn back(&mut self) -> Vec<Batch<O>> {
        std::mem::take(&mut self.back)
    }

    /// Waits until every batch held at the close has reported: everything
    /// the scheduler admitted has executed. Fails if it failed meanwhile.
    pub fn wait(&mut self) -> Result<(), SchedError> {
        while self.received < self.reports {
            match self.rx.recv_timeout(FAILURE_POLL) {
                Ok(()) => self.received += 1,
                Err(RecvTimeoutError::Timeout) => self.failure.check()?,
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(SchedError::WithdrawnLost { held: self.reports, lost: self.reports - self.received });
                }
            }
        }
        Ok(())
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_closed_gate_admits_exactly_the_batches_up_to_the_highest_begun() {
        let gate = Gate::new();
        assert!(gate.admit(1) && gate.admit(3) && gate.admit(2));
        assert!(!gate.withdrawn(4));
        assert_eq!(gate.close(), 3);
        assert_eq!(gate.close(), 3, "closing twice changes nothing");
        assert!(gate.admit(1) && gate.admit(2) && gate.admit(3));
        assert!(!gate.admit(4) && !gate.admit(9));
        assert!(!gate.withdrawn(3) && gate.withdrawn(4));
    }

    #[test]
    fn an_unused_gate_withdraws_everything() {
        let gate = Gate::new();
        assert_eq!(gate.close(), 0);
        assert!(!gate.admit(1));
    }
}
