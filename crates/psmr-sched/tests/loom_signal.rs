//! Model checks, with loom, of the one way psmr-sched's threads wait
//! ([`psmr_sched::Signal`] with [`psmr_sched::Patience`]): a waiter that
//! goes to sleep is always woken by the notification that ends its wait,
//! whatever the interleaving, and a notification with nobody asleep is
//! harmless.
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test -p psmr-sched --test loom_signal --release`
//! (`scripts/test.sh` does). Without `--cfg loom` this file compiles to nothing.
#![cfg(loom)]

use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;
use psmr_sched::{Naps, Patience, Signal, WsQueue};

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(3);
    builder.check(f);
}

/// One waiter, one notifier: the waiter sleeps without a timeout (loom
/// reports a deadlock if a wake-up is lost) and sees the value published
/// before the notification.
#[test]
fn no_wake_up_is_lost() {
    model(|| {
        let signal = Arc::new(Signal::new());
        let value = Arc::new(AtomicUsize::new(0));
        let (s, v) = (signal.clone(), value.clone());
        let waiter = thread::spawn(move || {
            s.wait_until(Patience::new(0), Naps::Notified, || v.load(Ordering::Relaxed) == 1);
        });
        value.store(1, Ordering::Relaxed);
        signal.notify_one();
        waiter.join().unwrap();
    });
}

/// Two waiters on one signal, woken by one `notify_all`.
#[test]
fn notify_all_wakes_every_sleeper() {
    model(|| {
        let signal = Arc::new(Signal::new());
        let value = Arc::new(AtomicUsize::new(0));
        let waiters: Vec<_> = (0..2)
            .map(|_| {
                let (s, v) = (signal.clone(), value.clone());
                thread::spawn(move || {
                    s.wait_until(Patience::brief(), Naps::Notified, || v.load(Ordering::Relaxed) == 1);
                })
            })
            .collect();
        value.store(1, Ordering::Relaxed);
        signal.notify_all();
        for w in waiters {
            w.join().unwrap();
        }
    });
}

/// A waiter whose condition never holds is woken by the signal's
/// abandonment (its notifier died) and knows why its wait ended; a wait
/// that starts after the abandonment does not sleep at all.
#[test]
fn an_abandoned_signal_ends_every_wait() {
    model(|| {
        let signal = Arc::new(Signal::new());
        let s = signal.clone();
        let waiter = thread::spawn(move || {
            s.wait_until(Patience::new(0), Naps::Notified, || false);
            assert!(s.abandoned());
        });
        signal.abandon();
        waiter.join().unwrap();
        signal.wait_until(Patience::new(0), Naps::Notified, || false);
    });
}

/// A waiter woken for a change that does not end its wait sleeps again,
/// and the second notification ends it.
#[test]
fn a_wake_up_for_something_else_is_not_the_end_of_the_wait() {
    model(|| {
        let signal = Arc::new(Signal::new());
        let value = Arc::new(AtomicUsize::new(0));
        let (s, v) = (signal.clone(), value.clone());
        let waiter = thread::spawn(move || {
            s.wait_until(Patience::new(0), Naps::Notified, || v.load(Ordering::Relaxed) == 2);
        });
        value.store(1, Ordering::Relaxed);
        signal.notify_one();
        value.store(2, Ordering::Relaxed);
        signal.notify_one();
        waiter.join().unwrap();
    });
}

/// The idle wait of every early worker: it empties its queue, sleeps on
/// the queue's signal until something arrives or the queue is closed, and
/// leaves once it is closed and empty. The scheduler pushes two entries and
/// closes; the worker gets both, in order, and leaves.
#[test]
fn an_idle_worker_wakes_for_each_push_and_for_the_close() {
    model(|| {
        let queue = Arc::new(WsQueue::<u32>::new(1));
        let q = queue.clone();
        let worker = thread::spawn(move || {
            let mut got = Vec::new();
            loop {
                got.extend(q.take_all().into_iter().map(|(e, _)| e));
                if q.drained() {
                    return got;
                }
                q.signal().wait_until(Patience::new(0), Naps::Notified, || q.has_ready() || q.drained());
            }
        });
        queue.push(1, false);
        queue.push(2, false);
        queue.close();
        assert_eq!(worker.join().unwrap(), vec![1, 2]);
    });
}
