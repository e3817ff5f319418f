//! Model checks of the withdrawal gate with loom.
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test -p psmr-sched --test loom_gate --release`
//! (`.ci/run` does). Without `--cfg loom` this file compiles to nothing.
#![cfg(loom)]

use loom::sync::{Arc, RwLock};
use loom::thread;
use psmr_sched::Gate;

/// Two workers ask the gate about batches 1-3 in order (each a batch
/// its queue holds) while a switch closes it. Whatever the interleaving,
/// the gate's answer is the cut it returned: every batch up to it runs,
/// every later one is withdrawn, and both workers agree on each batch, so
/// no batch is split between the old scheduler and the next.
#[test]
fn every_worker_sees_the_same_cut_and_it_is_what_close_returned() {
    loom::model(|| {
        let gate = Arc::new(Gate::new());
        let workers: Vec<_> = (0..2)
            .map(|w| {
                let gate = gate.clone();
                // Worker 1 has no part in batch 1: it may begin batch 2
                // before worker 0 begins batch 1.
                let batches: &[u64] = if w == 0 { &[1, 2, 3] } else { &[2, 3] };
                thread::spawn(move || batches.iter().map(|&n| (n, gate.admit(n))).collect::<Vec<_>>())
            })
            .collect();
        let cut = gate.close();
        let answers: Vec<Vec<(u64, bool)>> = workers.into_iter().map(|h| h.join().unwrap()).collect();
        for (n, admitted) in answers.iter().flatten() {
            assert_eq!(*admitted, *n <= cut, "batch {n} against the cut at {cut}");
        }
        for n in 1..=3 {
            assert_eq!(gate.withdrawn(n), n > cut);
            assert_eq!(gate.admit(n), n <= cut, "asked again after the close");
        }
    });
}

/// A switch takes the commands out of every withdrawn batch at once, under
/// the batch's lock, while workers read the batches the gate admitted
/// (early.rs, `Dispatch::take` and `execute_entry`): a worker reads a batch
/// only after the gate admitted it, so the switch never finds a withdrawn
/// one locked, and never takes one a worker reads.
#[test]
fn the_switch_takes_withdrawn_batches_that_no_worker_reads() {
    loom::model(|| {
        let gate = Arc::new(Gate::new());
        let batches: Arc<Vec<RwLock<Vec<u64>>>> = Arc::new((1..=2).map(|n| RwLock::new(vec![n])).collect());
        let worker = {
            let (gate, batches) = (gate.clone(), batches.clone());
            thread::spawn(move || {
                for n in 1..=2u64 {
                    if gate.admit(n) {
                        let batch = batches[n as usize - 1].read().unwrap();
                        assert_eq!(*batch, [n], "batch {n} was taken while admitted");
                    }
                }
            })
        };
        let cut = gate.close();
        for n in cut + 1..=2 {
            let mut batch = batches[n as usize - 1].try_write().expect("a withdrawn batch is never read");
            batch.clear();
        }
        worker.join().unwrap();
    });
}
