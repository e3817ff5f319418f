//! Failure paths of every scheduler: a panicking service, bad commands, bad
//! configurations. None of them may hang or leave a thread behind.

use psmr_model::{Batch, ClassId, ClassModel, ClientId, Command, Digest, Mapping, Service, SnapshotError};
use psmr_sched::{build, CollectSink, Reply, ReplySink, SchedConfig, SchedError, Scheduler, SchedulerKind};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Counts commands; panics on the command whose sequence number is `boom`.
struct Fragile {
    boom: u64,
    executed: AtomicU64,
}

impl Service for Fragile {
    type Op = ();
    type Reply = u64;
    fn execute(&self, c: &Command<()>) -> u64 {
        if c.seq == self.boom {
            panic!("boom at {}", c.seq);
        }
        self.executed.fetch_add(1, Ordering::Relaxed);
        c.seq
    }
    fn snapshot(&self) -> Vec<u8> {
        Vec::new()
    }
    fn restore(&self, _: &[u8]) -> Result<(), SnapshotError> {
        Ok(())
    }
    fn digest(&self) -> Digest {
        Digest::default()
    }
}

fn model() -> ClassModel {
    ClassModel::builder("readers-writers").class("R").class("W").conflict("R", "W").conflict("W", "W").build().unwrap()
}

fn mapping(workers: usize) -> Mapping {
    let w = workers - 1;
    Mapping::from_spec(&model(), workers, &format!("R=conc:0-{w};W=seq:0-{w}")).unwrap()
}

/// Commands alternating between reads and writes of key 0.
fn batches(n: u64, per_batch: usize, class_of: impl Fn(u64) -> u16) -> Vec<Batch<()>> {
    let cmds: Vec<Command<()>> = (0..n)
        .map(|i| {
            let class = class_of(i);
            let keys: psmr_model::KeySet = [0].into_iter().collect();
            Command {
                client: ClientId(7),
                seq: i,
                class: ClassId(class),
                reads: if class == 0 { keys.clone() } else { Default::default() },
                writes: if class == 1 { keys } else { Default::default() },
                op: (),
                stamp: Default::default(),
            }
        })
        .collect();
    cmds.chunks(per_batch).map(|c| Batch::new(c.to_vec(), 256)).collect()
}

fn config(kind: SchedulerKind, workers: usize) -> SchedConfig {
    SchedConfig::new(kind, workers).with_mapping(mapping(workers))
}

/// Submits 5 000 commands in batches of 10 (a third of them writes);
/// returns the first error, if a submission fails.
fn submit_until_error(s: &mut dyn Scheduler<Fragile>) -> Option<SchedError> {
    batches(5000, 10, |i| (i % 3 == 0) as u16).into_iter().find_map(|b| s.submit(b).err())
}

#[test]
fn a_service_panic_is_reported_with_its_command_and_nothing_hangs() {
    for kind in SchedulerKind::ALL {
        for workers in [1, 2, 4] {
            let service = Arc::new(Fragile { boom: 1234, executed: AtomicU64::new(0) });
            let sink = Arc::new(CollectSink::new(workers));
            let mut s = build(&config(kind, workers), service.clone(), &model(), sink.clone()).unwrap();
            let submit_err = submit_until_error(&mut *s);
            let err = s.finish().expect_err("finish must report the panic");
            match &err {
                SchedError::ServicePanicked { client, seq, message, .. } => {
                    assert_eq!((*client, *seq), (7, 1234), "{kind}/{workers}");
                    assert!(message.contains("boom at 1234"), "{message}");
                }
                other => panic!("{kind}/{workers}: unexpected error {other}"),
            }
            if let Some(e) = submit_err {
                assert!(matches!(e, SchedError::ServicePanicked { seq: 1234, .. }), "{e}");
            }
            // The panicking command produced no reply.
            let (replies, dups) = sink.take();
            assert!(!replies.contains_key(&(ClientId(7), 1234)));
            assert!(dups.is_empty());
            assert!(service.executed.load(Ordering::Relaxed) < 5000);
        }
    }
}

/// A sink that panics on the reply to sequence number `boom`: a panic on
/// a worker outside the service, as a bug in psmr would be (a replica's
/// sink is psmr's own code). Records what it is told of failures.
struct Brittle {
    boom: u64,
    failed: Mutex<Vec<String>>,
}

impl ReplySink<u64> for Brittle {
    fn deliver(&self, _worker: usize, reply: Reply<u64>) {
        assert_ne!(reply.seq, self.boom, "the sink broke");
    }
    fn failed(&self, error: &SchedError) {
        self.failed.lock().unwrap().push(error.to_string());
    }
}

/// A worker of `kind` panics outside the service (its sink breaks on
/// one reply): `submit` or `finish` reports it, the sink hears of it once,
/// and nothing waits for the dead worker: every thread is joined. Run on
/// a thread of its own, so that a hang fails the test with its name
/// instead of stalling the suite (the bound is generous; a run takes
/// milliseconds).
fn a_dead_worker_stops_the_scheduler(kind: SchedulerKind) {
    for workers in [1, 2, 4] {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let service = Arc::new(Fragile { boom: u64::MAX, executed: AtomicU64::new(0) });
            let sink = Arc::new(Brittle { boom: 1234, failed: Mutex::new(Vec::new()) });
            let mut s = build(&config(kind, workers), service, &model(), sink.clone()).unwrap();
            let submit_err = submit_until_error(&mut *s);
            let err = s.finish().expect_err("finish must report the panic");
            let failed = sink.failed.lock().unwrap().clone();
            let _ = tx.send((submit_err, err, failed));
        });
        let (submit_err, err, failed) = rx
            .recv_timeout(std::time::Duration::from_secs(120))
            .unwrap_or_else(|_| panic!("{kind}/{workers}: a wait outlived the dead worker"));
        let broke = |e: &SchedError| matches!(e, SchedError::WorkerPanicked { message, .. } if message.contains("the sink broke"));
        assert!(broke(&err), "{kind}/{workers}: {err}");
        if let Some(e) = submit_err {
            assert!(broke(&e), "{kind}/{workers}: {e}");
        }
        assert_eq!(failed.len(), 1, "{kind}/{workers}: told {failed:?}");
        assert!(failed[0].contains("panicked: assertion") && failed[0].contains("the sink broke"), "{failed:?}");
    }
}

macro_rules! dead_worker_tests {
    ($($name:ident: $kind:ident,)*) => {$(
        #[test]
        fn $name() {
            a_dead_worker_stops_the_scheduler(SchedulerKind::$kind);
        }
    )*};
}

dead_worker_tests! {
    a_dead_worker_stops_late_cbase: LateCbase,
    a_dead_worker_stops_late_batch_keys: LateBatchKeys,
    a_dead_worker_stops_late_batch_bitmap: LateBatchBitmap,
    a_dead_worker_stops_late_cbase_pool: LateCbasePool,
    a_dead_worker_stops_late_batch_bitmap_pool: LateBatchBitmapPool,
    a_dead_worker_stops_early: Early,
    a_dead_worker_stops_early_busywait: EarlyBusyWait,
    a_dead_worker_stops_early_ws_queue: EarlyWsQueue,
    a_dead_worker_stops_early_ws_semi: EarlyWsSemi,
    a_dead_worker_stops_early_ws_nonblocking: EarlyWsNonBlocking,
    a_dead_worker_stops_early_ws_optimistic: EarlyWsOptimistic,
}

/// Every kind that runs workers has its test above (`sequential` runs on
/// the caller's thread, `auto` on one of the others).
#[test]
fn every_kind_with_workers_is_tested_for_a_dead_worker() {
    let tested = 11;
    let with_workers =
        SchedulerKind::ALL.iter().filter(|k| !matches!(k, SchedulerKind::Sequential | SchedulerKind::Auto)).count();
    assert_eq!(with_workers, tested, "a new scheduler kind needs a dead-worker test");
}

#[test]
fn commands_of_unknown_classes_are_rejected_before_scheduling() {
    for kind in SchedulerKind::ALL {
        let service = Arc::new(Fragile { boom: u64::MAX, executed: AtomicU64::new(0) });
        let mut s = build(&config(kind, 2), service.clone(), &model(), Arc::new(CollectSink::new(2))).unwrap();
        let bad = batches(10, 10, |i| if i == 5 { 9 } else { 0 }).remove(0);
        let err = s.submit(bad).unwrap_err();
        assert!(matches!(err, SchedError::UnknownClass { seq: 5, class: 9, .. }), "{kind}: {err}");
        // Nothing of the bad batch ran, and the scheduler still works.
        for b in batches(100, 10, |_| 0) {
            s.submit(b).unwrap();
        }
        assert_eq!(s.finish().unwrap().executed(), 100);
        assert_eq!(service.executed.load(Ordering::Relaxed), 100, "{kind}");
    }
}

#[test]
fn bad_configurations_are_clear_errors() {
    let service = Arc::new(Fragile { boom: u64::MAX, executed: AtomicU64::new(0) });
    let sink = Arc::new(CollectSink::<u64>::new(1));
    let err = |c: SchedConfig| build(&c, service.clone(), &model(), sink.clone()).err().expect("must fail").to_string();
    assert!(err(SchedConfig::new(SchedulerKind::Early, 0)).contains("workers must be between 1 and 64"));
    assert!(err(SchedConfig::new(SchedulerKind::LateCbase, 65)).contains("workers must be between 1 and 64"));
    assert!(err(SchedConfig::new(SchedulerKind::Early, 2)).contains("needs a class-to-threads mapping"));
    assert!(
        err(SchedConfig::new(SchedulerKind::Early, 4).with_mapping(mapping(2))).contains("mapping is for 2 workers")
    );
    let mut c = SchedConfig::new(SchedulerKind::LateCbase, 2);
    c.graph_max = 0;
    assert!(err(c).contains("graph size"));
    let bad = Mapping::new(
        2,
        vec![
            psmr_model::ClassMapping::new(psmr_model::Mode::Concurrent, [0, 1]),
            psmr_model::ClassMapping::new(psmr_model::Mode::Concurrent, [0, 1]),
        ],
    );
    assert!(err(SchedConfig::new(SchedulerKind::Early, 2).with_mapping(bad)).contains("rule R.2 broken: class W"));
    assert!("late-fast".parse::<SchedulerKind>().unwrap_err().to_string().contains("unknown scheduler \"late-fast\""));
    for k in SchedulerKind::ALL {
        assert_eq!(k.name().parse::<SchedulerKind>().unwrap(), k);
    }
}

#[test]
fn dropping_an_unfinished_scheduler_joins_its_workers() {
    for kind in SchedulerKind::ALL {
        let service = Arc::new(Fragile { boom: u64::MAX, executed: AtomicU64::new(0) });
        let mut s = build(&config(kind, 3), service.clone(), &model(), Arc::new(CollectSink::new(3))).unwrap();
        for b in batches(1000, 10, |i| (i % 5 == 0) as u16) {
            s.submit(b).unwrap();
        }
        drop(s);
        // Drop drained the queues and joined: every command ran.
        assert_eq!(service.executed.load(Ordering::Relaxed), 1000, "{kind}");
        // Only the service handle of this test is left.
        assert_eq!(Arc::strong_count(&service), 1, "{kind}: a worker still holds the service");
    }
}

/// A switch to a scheduler that cannot be built leaves the running one in
/// place, still executing; a later good switch drains it and goes on.
#[test]
fn a_switch_that_cannot_be_built_keeps_the_running_scheduler() {
    use psmr_sched::{Scheduler, Switchable};
    let service = Arc::new(Fragile { boom: u64::MAX, executed: AtomicU64::new(0) });
    let sink = Arc::new(CollectSink::new(4));
    let mut s = Switchable::new(config(SchedulerKind::Early, 2), service.clone(), &model(), sink.clone()).unwrap();
    let mut all = batches(300, 10, |i| (i % 3 == 0) as u16).into_iter();
    for b in all.by_ref().take(10) {
        s.submit(b).unwrap();
    }
    let bad = SchedConfig::new(SchedulerKind::Early, 0);
    assert!(matches!(s.switch(bad), Err(psmr_sched::SwitchError::Build(SchedError::Config(_)))));
    assert_eq!((s.kind(), s.config().workers), (SchedulerKind::Early, 2), "the running one stays");
    for b in all.by_ref().take(10) {
        s.submit(b).unwrap();
    }
    s.switch(config(SchedulerKind::LateBatchBitmap, 4)).unwrap();
    // What the early one had begun ran before the switch returned; what it
    // had not, it gave to the next one.
    let executed = service.executed.load(Ordering::Relaxed);
    assert!(executed + s.withdrawn() >= 200, "drained at the switch: {executed} + {} withdrawn", s.withdrawn());
    for b in all {
        s.submit(b).unwrap();
    }
    let stats = Box::new(s).finish().unwrap();
    assert_eq!(stats.executed(), 300);
    assert_eq!(sink.take().0.len(), 300);
}
