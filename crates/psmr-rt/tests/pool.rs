//! psmr-rt's pools, policy by policy: every task runs exactly once, one
//! worker runs its own tasks in its policy's order, full queues overflow
//! or grow, yields cannot livelock, pools compose, panics are reported.
#![cfg(not(loom))]

use psmr_rt::{yield_now, Full, Handle, Policy, Pool, PoolConfig, RtError, Runtime, Steal, Victims, SLOT_BUDGET};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

fn config(policy: Policy, workers: usize) -> PoolConfig {
    PoolConfig { policy, ..PoolConfig::new("test", workers) }
}

/// Spawns `n` jobs from outside, each of which spawns a chain of `depth`
/// more from inside; counts runs.
fn run_all(config: PoolConfig, n: u64, depth: u64) -> (u64, psmr_rt::PoolStats) {
    fn chain(h: Handle, left: u64, runs: Arc<AtomicU64>) {
        runs.fetch_add(1, Ordering::Relaxed);
        if left > 0 {
            let next = h.clone();
            h.spawn_fn(move || chain(next, left - 1, runs));
        }
    }
    let pool = Pool::start(config).unwrap();
    let runs = Arc::new(AtomicU64::new(0));
    for _ in 0..n {
        let (h, r) = (pool.handle(), runs.clone());
        pool.spawn_fn(move || chain(h, depth, r));
    }
    let stats = pool.shutdown().unwrap();
    (runs.load(Ordering::Relaxed), stats)
}

#[test]
fn every_policy_runs_every_task_exactly_once() {
    for policy in Policy::ALL {
        for steal in [Steal::Half, Steal::One] {
            for victims in [Victims::Random, Victims::Neighbourhood(1)] {
                for full in [Full::Overflow, Full::Resize] {
                    let c = PoolConfig { steal, victims, full, capacity: 8, ..config(policy, 3) };
                    let (runs, stats) = run_all(c, 500, 4);
                    assert_eq!(runs, 2_500, "{policy} {steal} {victims} {full}");
                    let total = stats.total();
                    assert_eq!(total.tasks_run, 2_500);
                    // One task in 8 queued by each of the 4 threads
                    // (the test's and the workers').
                    let timed = stats.queue_wait_ns.len();
                    assert!((2_500 / 8 - 4..=2_500 / 8 + 4).contains(&timed), "{timed} queue waits timed");
                    assert!(total.steals_ok <= total.steals_tried);
                }
            }
        }
    }
}

/// The order one worker runs the jobs a root job spawned, all queued
/// before the first runs.
fn order(policy: Policy, n: u32) -> Vec<u32> {
    let pool = Pool::start(config(policy, 1)).unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (h, s) = (pool.handle(), seen.clone());
    pool.spawn_fn(move || {
        for i in 1..=n {
            let s = s.clone();
            h.spawn_fn(move || s.lock().unwrap().push(i));
        }
    });
    pool.shutdown().unwrap();
    let v = seen.lock().unwrap().clone();
    v
}

#[test]
fn one_worker_runs_its_tasks_in_its_policys_order() {
    assert_eq!(order(Policy::Fifo, 5), [1, 2, 3, 4, 5]);
    assert_eq!(order(Policy::Lifo, 5), [5, 4, 3, 2, 1]);
    assert_eq!(order(Policy::FifoSlot, 4), [4, 1, 2, 3], "the last spawned waits in the slot");
    // Turns that take nothing (the root came from the injector) do not
    // count: the first turn that takes a task is an oldest-first one.
    assert_eq!(order(Policy::LifoAlternate, 6), [1, 6, 2, 5, 3, 4]);
    assert_eq!(order(Policy::LifoStochastic(0.0), 4), [4, 3, 2, 1]);
    assert_eq!(order(Policy::LifoStochastic(1.0), 4), [1, 2, 3, 4]);
    // The second turn that takes a task starts a reversal: the 3 left
    // come oldest first.
    assert_eq!(order(Policy::LifoReverse(2), 4), [4, 1, 2, 3]);
}

#[test]
fn the_slot_gives_way_to_the_queue_after_its_budget() {
    // One worker: a job queued first, then a chain that always refills
    // the slot. The queued job runs after at most SLOT_BUDGET chain links.
    let pool = Pool::start(config(Policy::FifoSlot, 1)).unwrap();
    let links = Arc::new(AtomicU64::new(0));
    let at = Arc::new(AtomicU64::new(u64::MAX));
    let (h, l, a) = (pool.handle(), links.clone(), at.clone());
    pool.spawn_fn(move || {
        let (l2, a2) = (l.clone(), a.clone());
        h.spawn_fn(move || a2.store(l2.load(Ordering::SeqCst), Ordering::SeqCst));
        fn link(h: Handle, l: Arc<AtomicU64>, left: u32) {
            l.fetch_add(1, Ordering::SeqCst);
            if left > 0 {
                let h2 = h.clone();
                h.spawn_fn(move || link(h2, l, left - 1));
            }
        }
        let h2 = h.clone();
        h.spawn_fn(move || link(h2, l, 20));
    });
    pool.shutdown().unwrap();
    assert_eq!(links.load(Ordering::SeqCst), 21);
    assert!(at.load(Ordering::SeqCst) <= u64::from(SLOT_BUDGET), "queued job ran after {:?} links", at);
}

#[test]
fn full_queues_overflow_or_grow() {
    for (full, capacity) in [(Full::Overflow, 4), (Full::Resize, 4)] {
        let pool = Pool::start(PoolConfig { full, capacity, ..config(Policy::Fifo, 1) }).unwrap();
        let runs = Arc::new(AtomicU64::new(0));
        let (h, r) = (pool.handle(), runs.clone());
        pool.spawn_fn(move || {
            for _ in 0..20 {
                let r = r.clone();
                h.spawn_fn(move || {
                    r.fetch_add(1, Ordering::Relaxed);
                });
            }
        });
        let t = pool.shutdown().unwrap().total();
        assert_eq!(runs.load(Ordering::Relaxed), 20);
        match full {
            Full::Overflow => assert!(t.overflows > 0 && t.overflowed >= t.overflows && t.resizes == 0, "{t:?}"),
            Full::Resize => assert!(t.resizes > 0 && t.overflows == 0, "{t:?}"),
        }
    }
}

/// Spins (yielding the CPU) until `flag` is set.
fn wait_for(flag: &AtomicBool) {
    while !flag.load(Ordering::SeqCst) {
        std::thread::yield_now();
    }
}

#[test]
fn a_thief_takes_half_of_a_long_queue_not_a_fixed_batch() {
    // Worker B is held by `hold` while `root` on worker A queues 200
    // children; then B is let go, steals once from A (A is still in
    // `root`), and its first child holds it until `root` has read the
    // counters: exactly one steal has happened by then.
    let pool = Pool::start(PoolConfig { full: Full::Resize, capacity: 8, ..config(Policy::Fifo, 2) }).unwrap();
    let [held, release, started, gate] = [(); 4].map(|_| Arc::new(AtomicBool::new(false)));
    let (h, r) = (held.clone(), release.clone());
    pool.spawn_fn(move || {
        h.store(true, Ordering::SeqCst);
        wait_for(&r);
    });
    wait_for(&held);
    let stolen = Arc::new(AtomicU64::new(0));
    let (h, s, st, g) = (pool.handle(), stolen.clone(), started.clone(), gate.clone());
    pool.spawn_fn(move || {
        for _ in 0..200 {
            let (st, g) = (st.clone(), g.clone());
            h.spawn_fn(move || {
                st.store(true, Ordering::SeqCst);
                wait_for(&g);
            });
        }
        release.store(true, Ordering::SeqCst);
        wait_for(&st);
        s.store(h.stats().total().stolen, Ordering::SeqCst);
        g.store(true, Ordering::SeqCst);
    });
    let total = pool.shutdown().unwrap().total();
    assert_eq!(total.tasks_run, 202);
    assert_eq!(stolen.load(Ordering::SeqCst), 100, "one steal takes half of the 200 queued");
}

#[test]
fn futures_return_values_and_run_without_an_awaiter() {
    for policy in Policy::ALL {
        let pool = Pool::start(config(policy, 2)).unwrap();
        let task = pool.spawn(async {
            let h = Handle::current().expect("on a worker");
            let parts: Vec<_> = (1..=10u64).map(|i| h.spawn(async move { i })).collect();
            let mut sum = 0;
            for p in parts {
                sum += p.await.unwrap();
            }
            sum
        });
        assert_eq!(task.wait().unwrap(), 55, "{policy}");
        let ran = Arc::new(AtomicBool::new(false));
        let r = ran.clone();
        drop(pool.spawn(async move { r.store(true, Ordering::SeqCst) }));
        pool.shutdown().unwrap();
        assert!(ran.load(Ordering::SeqCst), "an eager promise runs without its awaiter");
    }
}

#[test]
fn a_task_yielding_for_another_cannot_keep_it_from_running() {
    for policy in Policy::ALL {
        // One worker: the waiter yields until the setter, queued behind
        // it, has run.
        let pool = Pool::start(config(policy, 1)).unwrap();
        let flag = Arc::new(AtomicBool::new(false));
        let yields = Arc::new(AtomicU64::new(0));
        let (h, f, y) = (pool.handle(), flag.clone(), yields.clone());
        let done = pool.spawn(async move {
            let f2 = f.clone();
            let waiter = h.spawn(async move {
                while !f2.load(Ordering::SeqCst) {
                    y.fetch_add(1, Ordering::Relaxed);
                    yield_now().await;
                }
            });
            h.spawn_fn(move || f.store(true, Ordering::SeqCst));
            waiter.await
        });
        done.wait().unwrap().unwrap();
        assert!(flag.load(Ordering::SeqCst));
        assert!(yields.load(Ordering::Relaxed) <= 2, "{policy}: {} yields", yields.load(Ordering::Relaxed));
        pool.shutdown().unwrap();
    }
}

#[test]
fn a_yielded_task_is_not_hidden_behind_its_workers_next_task() {
    for policy in Policy::ALL {
        // The task yields on its worker, which then runs a job that blocks
        // until the yielded task runs again: only the other worker can run
        // it, so the worker must not keep it to itself. The timeout only
        // stops a broken pool from hanging the test.
        let pool = Pool::start(config(policy, 2)).unwrap();
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let h = pool.handle();
        let blocked = Arc::new(AtomicBool::new(false));
        let b = blocked.clone();
        drop(pool.spawn(async move {
            h.spawn_fn(move || {
                let got = rx.recv_timeout(std::time::Duration::from_secs(60));
                b.store(got.is_ok(), Ordering::SeqCst);
            });
            yield_now().await;
            tx.send(()).unwrap();
        }));
        pool.shutdown().unwrap();
        assert!(blocked.load(Ordering::SeqCst), "{policy}: the yielded task stayed behind the blocking job");
    }
}

#[test]
fn tasks_taking_turns_by_yielding_finish_on_one_and_on_two_workers() {
    for workers in [1, 2] {
        for policy in Policy::ALL {
            let pool = Pool::start(config(policy, workers)).unwrap();
            let turn = Arc::new(AtomicU64::new(0));
            let players: Vec<_> = (0..3u64)
                .map(|me| {
                    let t = turn.clone();
                    pool.spawn(async move {
                        for _ in 0..1000 {
                            while t.load(Ordering::Acquire) % 3 != me {
                                yield_now().await;
                            }
                            t.fetch_add(1, Ordering::AcqRel);
                        }
                    })
                })
                .collect();
            for p in players {
                p.wait().unwrap();
            }
            assert_eq!(turn.load(Ordering::SeqCst), 3000, "{policy} on {workers}");
            pool.shutdown().unwrap();
        }
    }
}

#[test]
fn yielding_tasks_run_in_turn_and_none_keeps_its_worker_to_itself() {
    for policy in Policy::ALL {
        // One worker, three tasks that each yield 20 times: each yield
        // must let the others run before the yielder runs again.
        let pool = Pool::start(config(policy, 1)).unwrap();
        let runs = Arc::new(std::sync::Mutex::new(Vec::new()));
        let tasks: Vec<_> = (0..3u64)
            .map(|me| {
                let runs = runs.clone();
                pool.spawn(async move {
                    for _ in 0..20 {
                        runs.lock().unwrap().push(me);
                        yield_now().await;
                    }
                })
            })
            .collect();
        for t in tasks {
            t.wait().unwrap();
        }
        pool.shutdown().unwrap();
        let runs = runs.lock().unwrap();
        let longest = runs.chunk_by(|a, b| a == b).map(<[u64]>::len).max().unwrap_or(0);
        assert!(longest <= 2, "{policy}: a task ran {longest} times in a row while others waited: {runs:?}");
    }
}

#[test]
fn pools_compose_by_name() {
    let rt = Runtime::start(vec![PoolConfig::new("net", 1), config(Policy::Lifo, 2)]).unwrap();
    let (net, test) = (rt.pool("net").unwrap(), rt.pool("test").unwrap());
    let where_ = net.spawn(async move {
        let inner = test.spawn(async { std::thread::current().name().unwrap_or("").to_string() });
        let here = std::thread::current().name().unwrap_or("").to_string();
        (here, inner.await.unwrap())
    });
    let (outer, inner) = where_.wait().unwrap();
    assert!(outer.starts_with("rt-net-") && inner.starts_with("rt-test-"), "{outer} {inner}");
    assert!(rt.pool("disk").is_none());
    assert_eq!(rt.shutdown().unwrap().len(), 2);
    let twice = Runtime::start(vec![PoolConfig::new("a", 1), PoolConfig::new("a", 1)]);
    assert!(matches!(twice, Err(RtError::Config { .. })));
}

#[test]
fn panics_are_reported_and_waiting_on_ones_own_worker_is_refused() {
    let pool = Pool::start(config(Policy::Fifo, 2)).unwrap();
    pool.spawn_fn(|| panic!("job went wrong"));
    let task = pool.spawn(async { panic!("future went wrong") });
    assert!(matches!(task.wait(), Err(RtError::Cancelled { .. })));
    let h = pool.handle();
    let refused = pool.spawn(async move { h.spawn(async {}).wait() });
    assert!(matches!(refused.wait().unwrap(), Err(RtError::WaitOnWorker { .. })));
    match pool.shutdown() {
        Err(RtError::Panicked { messages, .. }) => {
            assert_eq!(messages.len(), 2);
            assert!(messages.iter().any(|m| m == "job went wrong"), "{messages:?}");
        }
        other => panic!("expected the panics, got {other:?}"),
    }
}

#[test]
fn a_stopped_pool_refuses_spawns_from_outside() {
    let pool = Pool::start(config(Policy::Fifo, 1)).unwrap();
    let h = pool.handle();
    pool.shutdown().unwrap();
    let task = h.spawn(async { 1 });
    assert!(matches!(task.wait(), Err(RtError::Cancelled { .. })));
    h.spawn_fn(|| {});
    assert_eq!(h.stats().rejected, 2);
}
