//! Model checks, with loom, of psmr-rt's protocols between threads: a
//! worker that goes to sleep misses no task queued from outside or by
//! another worker (parking), the task waiting in a worker's slot is run
//! (slot), and a task yielding while it waits for another cannot keep
//! that one from running, nor hide it from the other workers (yield).
//! Each model ends with
//! [`Pool::shutdown`], which runs what is queued; loom reports a deadlock
//! if a worker sleeps through a task.
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test -p psmr-rt --test loom_rt --release`
//! (`scripts/test.sh` does). Without `--cfg loom` this file compiles to nothing.
#![cfg(loom)]

use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use psmr_rt::{yield_now, Policy, Pool, PoolConfig};

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(3);
    builder.check(f);
}

fn pool(policy: Policy, workers: usize) -> Pool {
    Pool::start(PoolConfig { policy, ..PoolConfig::new("loom", workers) }).unwrap()
}

/// A job queued from outside while the worker may be going to sleep.
#[test]
fn a_sleeping_worker_misses_no_task_from_outside() {
    model(|| {
        let pool = pool(Policy::Fifo, 1);
        let ran = Arc::new(AtomicUsize::new(0));
        let r = ran.clone();
        pool.spawn_fn(move || {
            r.fetch_add(1, Ordering::SeqCst);
        });
        pool.shutdown().unwrap();
        assert_eq!(ran.load(Ordering::SeqCst), 1);
    });
}

/// A job queued by one worker while the other may be going to sleep: it
/// runs once, on either (stolen or not).
#[test]
fn a_task_queued_by_a_worker_is_run_once() {
    model(|| {
        let pool = pool(Policy::Lifo, 2);
        let ran = Arc::new(AtomicUsize::new(0));
        let (h, r) = (pool.handle(), ran.clone());
        pool.spawn_fn(move || {
            let r2 = r.clone();
            h.spawn_fn(move || {
                r2.fetch_add(1, Ordering::SeqCst);
            });
            r.fetch_add(1, Ordering::SeqCst);
        });
        pool.shutdown().unwrap();
        assert_eq!(ran.load(Ordering::SeqCst), 2);
    });
}

/// The slot's task cannot be stolen; the one it displaced can. Both run.
#[test]
fn the_slot_and_the_task_it_displaced_both_run() {
    model(|| {
        let pool = pool(Policy::FifoSlot, 2);
        let ran = Arc::new(AtomicUsize::new(0));
        let (h, r) = (pool.handle(), ran.clone());
        pool.spawn_fn(move || {
            for _ in 0..2 {
                let r = r.clone();
                h.spawn_fn(move || {
                    r.fetch_add(1, Ordering::SeqCst);
                });
            }
        });
        pool.shutdown().unwrap();
        assert_eq!(ran.load(Ordering::SeqCst), 2);
    });
}

/// One worker: a task yields until a job queued behind it has run.
#[test]
fn a_yielding_task_lets_the_task_it_waits_for_run() {
    model(|| {
        let pool = pool(Policy::Fifo, 1);
        let flag = Arc::new(AtomicUsize::new(0));
        let (h, f) = (pool.handle(), flag.clone());
        pool.spawn_fn(move || {
            let f2 = f.clone();
            h.spawn(async move {
                while f2.load(Ordering::SeqCst) == 0 {
                    yield_now().await;
                }
                f2.store(2, Ordering::SeqCst);
            });
            h.spawn_fn(move || f.store(1, Ordering::SeqCst));
        });
        pool.shutdown().unwrap();
        assert_eq!(flag.load(Ordering::SeqCst), 2);
    });
}

/// Two workers: a task yields into its worker's soft-yield slot, then that
/// worker finds a job queued behind it and moves the yielded task to the
/// yield queue, while the other worker may be going to sleep. Both run
/// once.
#[test]
fn a_soft_yielded_task_moved_to_the_yield_queue_runs_once() {
    model(|| {
        let pool = pool(Policy::Fifo, 2);
        let ran = Arc::new(AtomicUsize::new(0));
        let (h, r) = (pool.handle(), ran.clone());
        pool.spawn_fn(move || {
            let (r1, r2) = (r.clone(), r.clone());
            drop(h.spawn(async move {
                yield_now().await;
                r1.fetch_add(1, Ordering::SeqCst);
            }));
            h.spawn_fn(move || {
                r2.fetch_add(1, Ordering::SeqCst);
            });
        });
        pool.shutdown().unwrap();
        assert_eq!(ran.load(Ordering::SeqCst), 2);
    });
}
