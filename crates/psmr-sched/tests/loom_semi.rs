//! Model checks, with loom, of stealing while waiting for a sequential
//! command (000 Alg. 11 and 13), in its barrier-free form
//! (`early-ws-nonblocking`, `early-ws-optimistic`): the threads of the
//! sequential class meet on two-cycle counters, and a thread that arrives
//! before the others steals until the command has executed.
//!
//! Worker 0's queue holds a concurrent command `A` and then a sequential
//! command `W` of a class on workers 0 and 1; worker 1's queue holds `W`.
//! Worker 1 may reach `W` first and steal `A` from worker 0 while it
//! waits, or worker 0 may run `A` itself. In every interleaving: `A` runs
//! exactly once, `W` runs exactly once, after `A` is over and after both
//! workers have arrived, and both workers finish. A second model gives `A`
//! a class that conflicts with `W`'s: then worker 1 must not steal it.
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test -p psmr-sched --test loom_semi --release`
//! (`.ci/run` does). Without `--cfg loom` this file compiles to nothing.
#![cfg(loom)]

use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;
use psmr_sched::{CycleCounters, Role, WsQueue};

const A: u32 = 1;
const W: u32 = 2;
/// Class bit sets: `A`'s class is class 0, `W`'s class 1.
const A_CLASS: u64 = 0b01;
const W_CLASS: u64 = 0b10;

/// What happened, shared by the workers.
#[derive(Default)]
struct Log {
    /// 0: not run; 1: running; 2: done.
    a_state: AtomicUsize,
    a_runs: AtomicUsize,
    w_runs: AtomicUsize,
    /// Workers that arrived at `W`.
    arrived: AtomicUsize,
    /// Steals of `A` by worker 1.
    steals: AtomicUsize,
}

impl Log {
    fn run_a(&self) {
        self.a_runs.fetch_add(1, Ordering::Relaxed);
        self.a_state.store(1, Ordering::Relaxed);
        self.a_state.store(2, Ordering::Relaxed);
    }

    fn run_w(&self) {
        assert_eq!(self.arrived.load(Ordering::Relaxed), 2, "W ran before both workers arrived");
        assert_eq!(self.a_state.load(Ordering::Relaxed), 2, "W ran before A was over");
        self.w_runs.fetch_add(1, Ordering::Relaxed);
    }
}

/// Worker `me` reaches `W`: waits for its stealers, arrives, then executes
/// (last to arrive) or steals from `victim` until `W` has executed.
fn sequential(
    me: usize,
    own: &WsQueue<u32>,
    victim: Option<&WsQueue<u32>>,
    avoid: &[u64],
    marks: &CycleCounters,
    log: &Log,
) {
    while !own.no_stealers() {
        thread::yield_now();
    }
    log.arrived.fetch_add(1, Ordering::Relaxed);
    let mut cycle = 0;
    match marks.arrive(&mut cycle) {
        Role::Execute => {
            log.run_w();
            marks.done(cycle);
        }
        Role::Wait => {
            while !marks.released(cycle) {
                let stolen = victim.filter(|v| v.may_steal(avoid)).and_then(|v| v.try_steal_avoiding(me, avoid));
                match stolen {
                    Some(entries) => {
                        for e in entries {
                            assert_eq!(e, A, "a sequential command was stolen");
                            log.steals.fetch_add(1, Ordering::Relaxed);
                            log.run_a();
                        }
                        victim.expect("stolen from a victim").steal_done(me);
                    }
                    None => thread::yield_now(),
                }
            }
        }
    }
}

fn model(avoid: &'static [u64]) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(3);
    builder.check(move || {
        let queues = Arc::new([WsQueue::<u32>::new(2), WsQueue::<u32>::new(2)]);
        queues[0].push_with_classes(A, false, &[A_CLASS]);
        queues[0].push_with_classes(W, true, &[W_CLASS]);
        queues[1].push_with_classes(W, true, &[W_CLASS]);
        let marks = Arc::new(CycleCounters::new(2));
        let log = Arc::new(Log::default());

        let (q, m, l) = (queues.clone(), marks.clone(), log.clone());
        let victim = thread::spawn(move || {
            // `[A, W]`, or `[W]` if worker 1 stole `A` first.
            for (e, is_sequential) in q[0].take_all() {
                if is_sequential {
                    assert_eq!(e, W);
                    sequential(0, &q[0], None, &[], &m, &l);
                } else {
                    assert_eq!(e, A);
                    l.run_a();
                }
            }
            assert!(l.arrived.load(Ordering::Relaxed) > 0, "worker 0 never reached W");
        });

        let (q, m, l) = (queues.clone(), marks.clone(), log.clone());
        let stealer = thread::spawn(move || {
            let batch = q[1].take_all();
            assert_eq!(batch, vec![(W, true)]);
            sequential(1, &q[1], Some(&q[0]), avoid, &m, &l);
        });

        victim.join().unwrap();
        stealer.join().unwrap();
        assert_eq!(log.a_runs.load(Ordering::Relaxed), 1, "A ran twice or never");
        assert_eq!(log.w_runs.load(Ordering::Relaxed), 1, "W ran twice or never");
        if avoid.iter().any(|&c| c & A_CLASS != 0) {
            assert_eq!(log.steals.load(Ordering::Relaxed), 0, "A was stolen though its class conflicts");
        }
    });
}

#[test]
fn a_waiting_worker_steals_without_breaking_the_order() {
    model(&[W_CLASS]);
}

#[test]
fn a_waiting_worker_never_steals_a_conflicting_class() {
    model(&[A_CLASS | W_CLASS]);
}
