//! What a worker of the early schedulers does with each class, and how the
//! threads of a sequential class meet: one plan and one handshake per kind
//! of meeting, for `early`, `early-busywait` and the stealing schedulers.

use crate::barrier::Barrier;
use crate::cycles::{CycleCounters, Role};
use crate::sync::{AtomicUsize, Signal};
use crossbeam::utils::CachePadded;
use psmr_model::{Mapping, Mode};

/// How the threads of a sequential class mapped to several threads meet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Meeting {
    /// At the class barrier, twice; the lowest thread executes in between
    /// (003 Alg. 2: `early`, `early-ws-queue`).
    Barrier,
    /// On two-cycle counters; the last to arrive executes (000 Alg. 5 and
    /// 13: `early-busywait`, `early-ws-nonblocking`, `early-ws-optimistic`).
    Cycles,
    /// Arrivals counted, the last executes, the others steal until it is
    /// done, then everybody meets at the barrier (000 Alg. 11:
    /// `early-ws-semi`).
    Semi,
}

/// What a worker needs to know about a class.
pub(crate) enum ClassPlan {
    /// A concurrent class: one thread runs each command; the stealing
    /// schedulers may move it to another thread.
    Concurrent,
    /// A sequential class on one thread: no meeting, never stolen.
    Alone,
    /// See [`Meeting::Barrier`]; `executor` is the class's lowest thread.
    Barrier { barrier: Barrier, executor: usize },
    /// See [`Meeting::Cycles`].
    Cycles(CycleCounters),
    /// See [`Meeting::Semi`]; the executor notifies `signal` once it has
    /// run the command, which ends the others' stealing waits.
    Semi { barrier: Barrier, mark: CachePadded<AtomicUsize>, parties: usize, signal: Signal },
}

impl ClassPlan {
    /// The plan of every class of `mapping`.
    pub(crate) fn all(mapping: &Mapping, meeting: Meeting) -> Vec<ClassPlan> {
        mapping
            .classes()
            .iter()
            .map(|c| match (c.mode, c.threads.len(), meeting) {
                (Mode::Concurrent, _, _) => ClassPlan::Concurrent,
                (Mode::Sequential, 1, _) => ClassPlan::Alone,
                (Mode::Sequential, n, Meeting::Barrier) => {
                    ClassPlan::Barrier { barrier: Barrier::new(n), executor: c.threads[0] }
                }
                (Mode::Sequential, n, Meeting::Cycles) => ClassPlan::Cycles(CycleCounters::new(n)),
                (Mode::Sequential, n, Meeting::Semi) => ClassPlan::Semi {
                    barrier: Barrier::new(n),
                    mark: CachePadded::new(AtomicUsize::new(0)),
                    parties: n,
                    signal: Signal::new(),
                },
            })
            .collect()
    }

    /// True for the classes whose commands stay on their own threads.
    pub(crate) fn sequential(&self) -> bool {
        !matches!(self, ClassPlan::Concurrent)
    }
}

/// 003 Alg. 2 for one sequential command: every thread of the class
/// arrives at the barrier, the executor runs the command, and a second
/// barrier releases the others after it.
pub(crate) fn at_barrier(barrier: &Barrier, executes: bool, run: impl FnOnce()) {
    barrier.wait();
    if executes {
        run();
    }
    barrier.wait();
}

/// 000 Alg. 5 for one sequential command: the thread whose arrival
/// completes the count runs the command and releases the others; the
/// others `wait` for the release of their cycle.
pub(crate) fn on_cycles(counters: &CycleCounters, cycle: &mut usize, run: impl FnOnce(), wait: impl FnOnce(usize)) {
    match counters.arrive(cycle) {
        Role::Execute => {
            run();
            counters.done(*cycle);
        }
        Role::Wait => wait(*cycle),
    }
}
