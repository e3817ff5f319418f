//! Model checks of the class barrier with loom.
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test -p psmr-sched --test loom_barrier --release`
//! (`.ci/run` does). Without `--cfg loom` this file compiles to nothing.
#![cfg(loom)]

use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;
use psmr_sched::Barrier;

/// Explores every interleaving with at most four preemptions, which covers
/// the barrier's races (arrive while the last party advances the round,
/// leave while the next round starts) at a cost CI can afford.
fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(4);
    builder.check(f);
}

/// The early worker protocol for one sequential command, twice in a row on
/// the same barrier: the executor's write before the second wait is seen by
/// the other party after it, and a fast thread re-entering the barrier for
/// the next round never releases a slow thread of the previous round early.
#[test]
fn executor_effects_are_visible_and_rounds_do_not_mix() {
    model(|| {
        let barrier = Arc::new(Barrier::new(2));
        let state = Arc::new(AtomicUsize::new(0));
        let (b, s) = (barrier.clone(), state.clone());
        let other = thread::spawn(move || {
            for round in 1..=2 {
                b.wait(); // signal the executor
                b.wait(); // wait for the execution
                assert_eq!(s.load(Ordering::Relaxed), round, "round {round} not executed before release");
            }
        });
        for round in 1..=2 {
            barrier.wait();
            assert_eq!(state.load(Ordering::Relaxed), round - 1, "executed before every party arrived");
            state.store(round, Ordering::Relaxed);
            barrier.wait();
        }
        other.join().unwrap();
    });
}

/// Three parties: nobody leaves round one before all three arrived.
#[test]
fn three_parties_leave_only_together() {
    model(|| {
        let barrier = Arc::new(Barrier::new(3));
        let arrived = Arc::new(AtomicUsize::new(0));
        let handles: Vec<_> = (0..2)
            .map(|_| {
                let (b, a) = (barrier.clone(), arrived.clone());
                thread::spawn(move || {
                    a.fetch_add(1, Ordering::Relaxed);
                    b.wait();
                    assert_eq!(a.load(Ordering::Relaxed), 3);
                })
            })
            .collect();
        arrived.fetch_add(1, Ordering::Relaxed);
        barrier.wait();
        assert_eq!(arrived.load(Ordering::Relaxed), 3);
        for h in handles {
            h.join().unwrap();
        }
    });
}
