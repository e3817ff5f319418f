//! Busy-wait synchronization with two cycles per class (000 Alg. 4-5).
//!
//! Instead of a barrier, the threads of a sequential class meet on an
//! atomic counter: each increments it when it reaches the command; the one
//! whose increment completes the count executes and resets the counter to
//! zero; the others wait for the reset. No lock, no system call while the
//! threads arrive close together.
//!
//! One counter per class is not enough (000 §6.1): a waiter that has not yet
//! seen the reset of command `k` while the executor already arrived for
//! command `k + 1` of the same class sees the counter at one, not zero, and
//! waits forever, while the executor waits for it. Two counters, used in
//! alternation (each thread flips its own cycle bit per command of the
//! class), fix it: the counter of command `k + 1` is not the one the slow
//! waiter watches, and command `k + 2`, which reuses it, cannot start before
//! the slow waiter has arrived for `k + 1`. The unit tests replay the
//! §6.1 interleaving step by step against both variants, and
//! `tests/loom_cycles.rs` model-checks the two-cycle protocol.

use crate::sync::{AtomicUsize, Naps, Patience, Signal};
use crossbeam::utils::CachePadded;
use std::sync::atomic::Ordering;

/// The counters of one sequential class.
#[derive(Debug)]
pub struct CycleCounters {
    marks: [CachePadded<AtomicUsize>; 2],
    parties: usize,
    /// 2 for the algorithm; 1 only in tests that show why 2 are needed.
    cycles: usize,
    /// Where waiters sleep once they have spun and yielded long enough.
    signal: Signal,
}

/// What a thread does after arriving.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Its increment completed the count: it executes the command, then
    /// calls [`CycleCounters::done`].
    Execute,
    /// It waits until [`CycleCounters::released`] is true.
    Wait,
}

impl CycleCounters {
    /// Counters for a class of `parties` threads (at least one).
    pub fn new(parties: usize) -> Self {
        Self::with_cycles(parties, 2)
    }

    fn with_cycles(parties: usize, cycles: usize) -> Self {
        Self {
            marks: [CachePadded::new(AtomicUsize::new(0)), CachePadded::new(AtomicUsize::new(0))],
            parties: parties.max(1),
            cycles,
            signal: Signal::new(),
        }
    }

    /// Number of threads that must arrive.
    pub fn parties(&self) -> usize {
        self.parties
    }

    /// A thread arrives for the next command of the class. `cycle` is the
    /// thread's own cycle bit for this class (start at 0); it is flipped
    /// here and must be passed back to `done` or `released`.
    pub fn arrive(&self, cycle: &mut usize) -> Role {
        *cycle = (*cycle + 1) % self.cycles;
        // AcqRel: the executor's increment reads the counter written by the
        // others' increments (a release sequence), so everything they did
        // before arriving happens-before the execution.
        if self.marks[*cycle].fetch_add(1, Ordering::AcqRel) + 1 == self.parties {
            Role::Execute
        } else {
            Role::Wait
        }
    }

    /// The executor is done: release the waiters of `cycle`.
    pub fn done(&self, cycle: usize) {
        self.marks[cycle].store(0, Ordering::Release);
        self.signal.notify_all();
    }

    /// A waiter waits for the command of `cycle`, with `patience`, then
    /// sleeping until `done` wakes it.
    /// Returns the patience, which says how the wait ended.
    pub fn wait(&self, cycle: usize, patience: Patience) -> Patience {
        self.signal.wait_until(patience, Naps::Notified, || self.released(cycle))
    }

    /// A party died and will never arrive or execute: every wait on these
    /// counters, now or later, returns at once.
    pub fn abandon(&self) {
        self.signal.abandon();
    }

    /// Where waiters sleep: a waiter that does something else while it
    /// waits (steals) naps here between its attempts, and `done` ends the
    /// nap.
    pub fn signal(&self) -> &Signal {
        &self.signal
    }

    /// True once the command of `cycle` has executed (pairs with `done`'s
    /// release: the execution happens-before whatever follows).
    pub fn released(&self, cycle: usize) -> bool {
        self.marks[cycle].load(Ordering::Acquire) == 0
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// Replays the interleaving of 000 §6.1 with two threads and two
    /// commands of one class. Returns true when both commands executed,
    /// false when the threads are stuck (each waits for the other).
    fn replay_section_6_1(c: &CycleCounters) -> bool {
        let (mut cycle1, mut cycle2) = (0usize, 0usize);
        // Command 1: t2 arrives first, t1 completes the count.
        assert_eq!(c.arrive(&mut cycle2), Role::Wait);
        let t2_waits_on = cycle2;
        assert_eq!(c.arrive(&mut cycle1), Role::Execute);
        // t1 executes and resets, but t2 is preempted before it looks.
        c.done(cycle1);
        // t1 arrives for command 2 of the same class first.
        assert_eq!(c.arrive(&mut cycle1), Role::Wait);
        let t1_waits_on = cycle1;
        // t2 finally looks at its counter.
        if !c.released(t2_waits_on) {
            // t2 still waits for command 1, t1 waits for t2 on command 2.
            assert!(!c.released(t1_waits_on));
            return false;
        }
        // t2 moves on to command 2 and completes it.
        assert_eq!(c.arrive(&mut cycle2), Role::Execute);
        c.done(cycle2);
        assert!(c.released(t1_waits_on));
        true
    }

    #[test]
    fn one_counter_loses_the_reset_as_section_6_1_describes() {
        assert!(!replay_section_6_1(&CycleCounters::with_cycles(2, 1)));
    }

    #[test]
    fn two_cycles_do_not() {
        assert!(replay_section_6_1(&CycleCounters::new(2)));
    }

    #[test]
    fn counters_are_reusable_for_many_commands() {
        let c = CycleCounters::new(3);
        let mut cycles = [0usize; 3];
        for round in 0..10 {
            let roles: Vec<Role> = (0..3).map(|t| c.arrive(&mut cycles[(t + round) % 3])).collect();
            assert_eq!(roles.iter().filter(|&&r| r == Role::Execute).count(), 1);
            assert_eq!(roles[2], Role::Execute, "the last arrival executes");
            assert!(!c.released(cycles[0]));
            c.done(cycles[0]);
            assert!(c.released(cycles[0]));
        }
    }
}
