//! Model checks of the work-stealing queue protocol of `early-ws-queue`
//! (000 Alg. 6-8: ready and exec flags, markers) with loom.
//!
//! A victim's queue receives a concurrent command `A` and then a sequential
//! command `Q` that conflicts with it. A stealer tries to take the victim's
//! ready queue while the victim works. In every interleaving: `Q` is never
//! stolen, `A` executes exactly once, and `Q` executes after `A` is over,
//! whoever ran `A`.
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test -p psmr-sched --test loom_steal --release`
//! (`.ci/run` does). Without `--cfg loom` this file compiles to nothing.
#![cfg(loom)]

use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;
use psmr_sched::WsQueue;

const A: u32 = 1;
const Q: u32 = 2;
const STEALER: usize = 1;

#[test]
fn sequential_commands_wait_for_stolen_ones_and_are_never_stolen() {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(3);
    builder.check(|| {
        let queue = Arc::new(WsQueue::<u32>::new(2));
        // 0: A not run; 1: A running; 2: A done. Counts runs of A too.
        let a_state = Arc::new(AtomicUsize::new(0));
        let a_runs = Arc::new(AtomicUsize::new(0));
        let run_a = |state: &AtomicUsize, runs: &AtomicUsize| {
            runs.fetch_add(1, Ordering::Relaxed);
            state.store(1, Ordering::Relaxed);
            state.store(2, Ordering::Relaxed);
        };
        queue.push(A, false);

        let (q, s, r) = (queue.clone(), a_state.clone(), a_runs.clone());
        let stealer = thread::spawn(move || {
            for _ in 0..2 {
                if let Some(stolen) = q.try_steal(STEALER) {
                    for e in stolen {
                        assert_eq!(e, A, "a sequential command was stolen");
                        run_a(&s, &r);
                    }
                    q.steal_done(STEALER);
                    return;
                }
                thread::yield_now();
            }
        });

        let (q, s, r) = (queue.clone(), a_state.clone(), a_runs.clone());
        let victim = thread::spawn(move || {
            let mut q_done = false;
            while !q_done {
                let batch = q.take_all();
                if batch.is_empty() {
                    thread::yield_now();
                }
                for (e, sequential) in batch {
                    if sequential {
                        assert_eq!(e, Q);
                        while !q.no_stealers() {
                            thread::yield_now();
                        }
                        assert_eq!(s.load(Ordering::Relaxed), 2, "Q executed before A was over");
                        q_done = true;
                    } else {
                        assert_eq!(e, A);
                        run_a(&s, &r);
                    }
                }
            }
        });

        queue.push(Q, true);
        stealer.join().unwrap();
        victim.join().unwrap();
        assert_eq!(a_runs.load(Ordering::Relaxed), 1, "A ran twice or never");
    });
}
