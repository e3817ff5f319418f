//! Model checks of the two-cycle busy-wait protocol of `early-busywait`
//! (000 Alg. 5) with loom: two threads of one sequential class run three
//! commands in a row; each command executes exactly once, after both
//! threads arrived, alone, in order, and nobody is left waiting, though
//! waiters sleep until the executor's `done` wakes them.
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test -p psmr-sched --test loom_cycles --release`
//! (`.ci/run` does). Without `--cfg loom` this file compiles to nothing.
#![cfg(loom)]

use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;
use psmr_sched::{CycleCounters, Patience, Role};

const COMMANDS: usize = 3;

/// One worker's loop over the class's commands, as in the scheduler.
fn worker(counters: &CycleCounters, arrived: &[AtomicUsize; COMMANDS], executed: &AtomicUsize) {
    let mut cycle = 0;
    for k in 0..COMMANDS {
        arrived[k].fetch_add(1, Ordering::Relaxed);
        match counters.arrive(&mut cycle) {
            Role::Execute => {
                assert_eq!(arrived[k].load(Ordering::Relaxed), 2, "command {k} executed before both arrived");
                assert_eq!(executed.load(Ordering::Relaxed), k, "command {k} executed out of order or twice");
                executed.store(k + 1, Ordering::Relaxed);
                counters.done(cycle);
            }
            Role::Wait => {
                // The scheduler's wait: active, then asleep until `done`
                // notifies (a lost wake-up is a deadlock loom reports).
                counters.wait(cycle, Patience::new(0));
                assert!(executed.load(Ordering::Relaxed) > k, "released before command {k} executed");
            }
        }
    }
}

#[test]
fn two_cycles_execute_each_command_once_in_order() {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(4);
    builder.check(|| {
        let counters = Arc::new(CycleCounters::new(2));
        let arrived = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0), AtomicUsize::new(0)]);
        let executed = Arc::new(AtomicUsize::new(0));
        let (c, a, e) = (counters.clone(), arrived.clone(), executed.clone());
        let other = thread::spawn(move || worker(&c, &a, &e));
        worker(&counters, &arrived, &executed);
        other.join().unwrap();
        assert_eq!(executed.load(Ordering::Relaxed), COMMANDS);
    });
}
