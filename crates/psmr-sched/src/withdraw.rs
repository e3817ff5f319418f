//! Taking back what a scheduler holds and has not begun, so that a switch
//! ([`crate::Switchable`]) waits only for the batches already executing.
//!
//! An early scheduler dispatches each batch to its workers' queues, where
//! it may wait behind several others. Draining all of that before the next
//! scheduler starts is a stall as long as the queues. Instead, at a switch,
//! the batches no worker has begun are *withdrawn*: the switch takes them
//! out of the queues, a worker that already took one skips it, and they go
//! to the next scheduler, in order, ahead of the batches that follow.
//!
//! Which batches may still begin is decided by one atomic word, the
//! [`Gate`]: before a worker begins any part of batch `n` (batches are
//! numbered from 1 in submission order) it raises the word to at least `n`;
//! a switch closes the word, and the value it closes at, `h`, splits the
//! batches once and for all: `1..=h` are executed by the old scheduler,
//! every later one is withdrawn, and no worker has begun any of those.
//! That is a cut of the log: what runs on the old scheduler is a prefix,
//! so no withdrawn command precedes a command left behind, and the next
//! scheduler, which begins once the old one has finished its part,
//! executes the rest in log order. (A finer cut, per worker, could leave
//! less behind when one worker runs ahead of another; the prefix is what
//! one word can decide.)
//!
//! When the old one has finished is told by the batches themselves: after
//! the close, each reports on a channel as its last reference goes
//! ([`Returns`]), and a worker lets go of a batch only after executing its
//! part. So the switch waits for exactly what was begun, woken by the
//! worker that finishes it, and not for every worker to wake up.

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

/// Where withdrawn batches go once the last reference to them goes;
/// shared by a scheduler and every batch it dispatched.
///
/// After the gate closes, every dispatched batch reports on the channel as
/// its last reference goes: a withdrawn one with its commands, one that ran
/// empty. The scheduler counts the batches it still held at the close, so
/// once that many have reported, everything admitted has executed (a worker
/// or thief lets go of a batch only after executing its part) and every
/// withdrawn batch is back.
pub(crate) struct Returns<O> {
    pub(crate) gate: Gate,
    tx: Sender<(u64, Batch<O>)>,
    /// Batches whose last reference went after the gate closed.
    gone: AtomicUsize,
}

impl<O> Returns<O> {
    /// An open gate and the channel batches report on. The channel holds
    /// at most the batches the scheduler held at the switch.
    pub(crate) fn new() -> (Arc<Self>, Receiver<(u64, Batch<O>)>) {
        let (tx, rx) = crossbeam::channel::unbounded();
        (Arc::new(Self { gate: Gate::new(), tx, gone: AtomicUsize::new(0) }), rx)
    }

    /// Batches whose last reference went since the gate closed.
    pub(crate) fn gone(&self) -> usize {
        self.gone.load(Ordering::Acquire)
    }

    /// Called as the last reference to batch `n` goes: once the gate is
    /// closed, reports it, with its commands if it was withdrawn.
    pub(crate) fn dropped(&self, n: u64, batch: &mut Batch<O>) {
        if !self.gate.closed() {
            return;
        }
        let batch = match self.gate.withdrawn(n) {
            true => std::mem::replace(batch, Batch::new(Vec::new(), 0)),
            false => Batch::new(Vec::new(), 0),
        };
        self.gone.fetch_add(1, Ordering::Release);
        // The receiver may be gone (the switch failed): nothing to do.
        let _ = self.tx.send((n, batch));
    }
}

/// The batches a scheduler gave back at a switch
/// ([`crate::Scheduler::withdraw`]), which arrive as its workers let go of
/// them, with a report of every batch it still held: [`Withdrawal::wait`]
/// returns once everything it admitted has executed.
pub struct Withdrawal<O> {
    rx: Receiver<(u64, Batch<O>)>,
    /// Batches withdrawn.
    count: usize,
    /// Batches held at the close, each of which reports once.
    reports: usize,
    commands: u64,
    failure: Arc<Failure>,
}

/// How often a wait for withdrawn batches looks at the scheduler's failure.
const FAILURE_POLL: Duration = Duration::from_millis(10);

impl<O> Withdrawal<O> {
    pub(crate) fn new(
        rx: Receiver<(u64, Batch<O>)>,
        count: usize,
        reports: usize,
        commands: u64,
        failure: Arc<Failure>,
    ) -> Self {
        Self { rx, count, reports, commands, failure }
    }

    /// Batches withdrawn.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether nothing was withdrawn.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Commands withdrawn: the scheduler will not execute them.
    pub fn commands(&self) -> u64 {
        self.commands
    }

    /// Waits until every batch held at the close has reported (everything
    /// admitted has executed) and returns the withdrawn ones in log order.
    /// Fails if the scheduler failed meanwhile.
    pub fn wait(self) -> Result<Vec<Batch<O>>, SchedError> {
        let expected = self.reports;
        let mut back = Vec::with_capacity(expected);
        while back.len() < expected {
            match self.rx.recv_timeout(FAILURE_POLL) {
                Ok(b) => back.push(b),
                Err(RecvTimeoutError::Timeout) => self.failure.check()?,
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(SchedError::WithdrawnLost { held: expected, lost: expected - back.len() });
                }
            }
        }
        back.sort_unstable_by_key(|(n, _)| *n);
        // The batches that ran report empty.
        Ok(back.into_iter().map(|(_, b)| b).filter(|b| !b.is_empty()).collect())
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
