//! An overlapped switch (`Switchable::switch_overlapped`): the next
//! scheduler takes a batch that conflicts with nothing the old one still
//! holds while the old one executes, and the late schedulers tell which
//! batches those are from their graph. A switch away from an early
//! scheduler takes back what its workers have not begun
//! (`Scheduler::withdraw`). Command 1 blocks at a gate, so "still
//! executing" is a state the test holds, not a race it hopes for. The gate
//! also holds a late pool's job while others queue behind it, to show
//! which of the nodes it frees its worker runs next.

use psmr_model::{Batch, ClassId, ClassModel, ClientId, Command, Digest, Mapping, Service, SnapshotError};
use psmr_rt::Policy;
use psmr_sched::{build, CollectSink, SchedConfig, Scheduler, SchedulerKind, Switchable};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// How long a step may take before the test fails instead of hanging.
const PATIENCE: Duration = Duration::from_secs(20);

/// Command `op` writes key `op`; command 1 waits until the gate opens.
/// Records which commands have started and finished.
#[derive(Default)]
struct Gated {
    state: Mutex<Progress>,
    changed: Condvar,
}

#[derive(Default)]
struct Progress {
    open: bool,
    started: Vec<u64>,
    finished: Vec<u64>,
}

impl Gated {
    fn wait_for(&self, what: &str, done: impl Fn(&Progress) -> bool) {
        let st = self.state.lock().unwrap();
        let (_st, timeout) = self.changed.wait_timeout_while(st, PATIENCE, |s| !done(s)).unwrap();
        assert!(!timeout.timed_out(), "{what} never happened");
    }

    fn open(&self) {
        self.state.lock().unwrap().open = true;
        self.changed.notify_all();
    }

    fn finished(&self) -> Vec<u64> {
        self.state.lock().unwrap().finished.clone()
    }
}

impl Service for Gated {
    type Op = u64;
    type Reply = u64;
    fn execute(&self, c: &Command<u64>) -> u64 {
        let mut st = self.state.lock().unwrap();
        st.started.push(c.seq);
        self.changed.notify_all();
        if c.seq == 1 {
            let (next, timeout) = self.changed.wait_timeout_while(st, PATIENCE, |s| !s.open).unwrap();
            assert!(!timeout.timed_out(), "the gate never opened");
            st = next;
        }
        st.finished.push(c.seq);
        self.changed.notify_all();
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

/// A batch of one command, `seq`, writing key `key`.
fn write(seq: u64, key: u64) -> Batch<u64> {
    let cmd = Command {
        client: ClientId(1),
        seq,
        class: ClassId(0),
        reads: Default::default(),
        writes: [key].into_iter().collect(),
        op: key,
        stamp: Default::default(),
    };
    Batch::new(vec![cmd], 64)
}

/// A batch of one command, `seq`, reading key `key`.
fn read(seq: u64, key: u64) -> Batch<u64> {
    let cmd = Command {
        client: ClientId(1),
        seq,
        class: ClassId(0),
        reads: [key].into_iter().collect(),
        writes: Default::default(),
        op: key,
        stamp: Default::default(),
    };
    Batch::new(vec![cmd], 64)
}

/// One class of writes, each in conflict with the others.
fn model() -> ClassModel {
    ClassModel::builder("w").class("W").conflict("W", "W").build().unwrap()
}

/// `kind` on `workers` early workers that all run every write.
fn early(kind: SchedulerKind, workers: usize) -> SchedConfig {
    let spec = format!("W=seq:0-{}", workers - 1);
    SchedConfig {
        mapping: Some(Mapping::from_spec(&model(), workers, &spec).unwrap()),
        ..SchedConfig::new(kind, workers)
    }
}

#[test]
fn a_late_scheduler_knows_which_batches_conflict_with_what_it_still_executes() {
    for kind in [
        SchedulerKind::LateCbase,
        SchedulerKind::LateBatchKeys,
        SchedulerKind::LateBatchBitmap,
        SchedulerKind::LateCbasePool,
        SchedulerKind::LateBatchBitmapPool,
    ] {
        let service = Arc::new(Gated::default());
        let sink = Arc::new(CollectSink::new(2));
        let mut late = build(&SchedConfig::new(kind, 2), service.clone(), &model(), sink).unwrap();
        assert!(late.drained(), "{kind}: nothing given, nothing held");
        late.submit(write(1, 7)).unwrap();
        service.wait_for("command 1 starting", |s| s.started.contains(&1));
        assert!(late.may_conflict(&write(2, 7)), "{kind}: same key as the running command");
        assert!(!late.may_conflict(&write(2, 8)), "{kind}: another key");
        assert!(!late.drained(), "{kind}: command 1 runs");
        service.open();
        service.wait_for("command 1 finishing", |s| s.finished.contains(&1));
        late.finish().unwrap();
    }
}

#[test]
fn a_late_pool_worker_runs_the_oldest_node_its_job_freed_next() {
    // On the policies whose worker runs its newest task first, spawning
    // the freed nodes in age order would run command 4 next.
    for policy in [Policy::Fifo, Policy::Lifo, Policy::FifoSlot] {
        let service = Arc::new(Gated::default());
        let config = SchedConfig { pool: policy, ..SchedConfig::new(SchedulerKind::LateBatchBitmapPool, 1) };
        let mut late = build(&config, service.clone(), &model(), Arc::new(CollectSink::new(1))).unwrap();
        late.submit(write(1, 7)).unwrap();
        service.wait_for("command 1 starting", |s| s.started.contains(&1));
        // Each reads what command 1 writes, and none conflicts with
        // another: command 1's end frees all three at once.
        for seq in 2..=4 {
            late.submit(read(seq, 7)).unwrap();
        }
        service.open();
        assert_eq!(late.finish().unwrap().executed(), 4, "{policy}");
        let finished = service.finished();
        assert_eq!(finished[..2], [1, 2], "{policy}: {finished:?}");
    }
}

#[test]
fn after_an_overlapped_switch_an_independent_batch_runs_while_the_old_scheduler_still_executes() {
    let service = Arc::new(Gated::default());
    let sink = Arc::new(CollectSink::new(2));
    let config = SchedConfig::new(SchedulerKind::LateBatchBitmap, 2);
    let mut s = Switchable::new(config, service.clone(), &model(), sink.clone()).unwrap();
    s.submit(write(1, 7)).unwrap();
    service.wait_for("command 1 starting", |s| s.started.contains(&1));

    s.switch_overlapped(SchedConfig::new(SchedulerKind::Sequential, 1)).unwrap();
    assert!(s.overlapping());
    // Sequential executes in `submit`: had the switch drained the old
    // scheduler, it would still be waiting at the gate.
    s.submit(write(2, 8)).unwrap();
    assert_eq!(service.finished(), [2], "command 2 ran while command 1 still executes");
    assert_eq!(s.overlap_ended(), None, "the old scheduler has not finished");

    service.open();
    // Command 3 writes command 1's key: it runs after command 1, and the
    // overlap ends with one batch taken by the next scheduler.
    s.submit(write(3, 7)).unwrap();
    assert_eq!(service.finished(), [2, 1, 3]);
    let overlap = s.overlap_ended().expect("the old scheduler finished");
    assert_eq!(overlap.batches, 1);
    let stats = Box::new(s).finish().unwrap();
    assert_eq!(stats.executed(), 3);
}

#[test]
fn a_switch_after_an_overlapped_one_waits_for_the_old_scheduler_first() {
    let service = Arc::new(Gated::default());
    let sink = Arc::new(CollectSink::new(2));
    let config = SchedConfig::new(SchedulerKind::LateBatchBitmap, 2);
    let mut s = Switchable::new(config.clone(), service.clone(), &model(), sink).unwrap();
    s.submit(write(1, 7)).unwrap();
    service.wait_for("command 1 starting", |s| s.started.contains(&1));
    s.switch_overlapped(SchedConfig::new(SchedulerKind::Sequential, 1)).unwrap();
    let opener = {
        let service = service.clone();
        std::thread::spawn(move || {
            service.wait_for("command 2 finishing", |s| s.finished.contains(&2));
            service.open();
        })
    };
    s.submit(write(2, 8)).unwrap();
    // The first scheduler drains before a third one starts: at most one
    // scheduler drains behind the running one.
    s.switch_overlapped(config).unwrap();
    assert!(service.finished().contains(&1), "the first scheduler finished before the third started");
    assert!(s.overlap_ended().is_some());
    opener.join().unwrap();
    s.submit(write(3, 7)).unwrap();
    Box::new(s).finish().unwrap();
    assert_eq!(service.finished(), [2, 1, 3]);
}

#[test]
fn an_overlapped_switch_away_from_a_scheduler_holding_nothing_does_not_overlap() {
    let service = Arc::new(Gated::default());
    service.open();
    let sink = Arc::new(CollectSink::new(2));
    let config = SchedConfig::new(SchedulerKind::LateBatchBitmap, 2);
    let mut s = Switchable::new(config, service.clone(), &model(), sink).unwrap();
    s.submit(write(1, 7)).unwrap();
    // Command 1 has finished in the service a moment before its worker
    // takes it out of the graph: wait for the scheduler to say so.
    let since = std::time::Instant::now();
    while !s.drained() {
        assert!(since.elapsed() < PATIENCE, "the scheduler never drained");
        std::thread::yield_now();
    }
    s.switch_overlapped(SchedConfig::new(SchedulerKind::Sequential, 1)).unwrap();
    assert!(!s.overlapping(), "nothing to overlap");
    assert_eq!(s.overlap_ended(), None, "no overlap to report");
    Box::new(s).finish().unwrap();
}

#[test]
fn an_early_scheduler_gives_back_the_batches_its_workers_have_not_begun() {
    for kind in [SchedulerKind::Early, SchedulerKind::EarlyBusyWait, SchedulerKind::EarlyWsOptimistic] {
        let service = Arc::new(Gated::default());
        let sink = Arc::new(CollectSink::new(2));
        let mut early = build(&early(kind, 1), service.clone(), &model(), sink.clone()).unwrap();
        for (seq, key) in [(1, 7), (2, 8), (3, 7), (4, 9)] {
            early.submit(write(seq, key)).unwrap();
        }
        service.wait_for("command 1 starting", |s| s.started.contains(&1));
        let mut withdrawal = early.withdraw().expect("early schedulers withdraw");
        assert_eq!((withdrawal.len(), withdrawal.commands()), (3, 3), "{kind}: commands 2-4 were not begun");
        // Back while command 1 still runs.
        let back = withdrawal.back();
        let seqs: Vec<u64> = back.iter().flat_map(|b| b.commands().iter().map(|c| c.seq)).collect();
        assert_eq!(seqs, [2, 3, 4], "{kind}: given back in log order");
        assert!(!early.drained(), "{kind}: command 1 has not finished");
        assert!(early.may_conflict(&write(5, 7)), "{kind}: key 7 is command 1's");
        assert!(!early.may_conflict(&write(5, 8)), "{kind}: nothing it kept touches key 8");
        service.open();
        withdrawal.wait().unwrap();
        assert_eq!(service.finished(), [1], "{kind}: the withdrawn commands did not run");
        assert!(early.drained(), "{kind}: every batch it held has reported back");
        assert!(!early.may_conflict(&write(5, 7)), "{kind}: command 1 is done");
        assert_eq!(early.finish().unwrap().executed(), 1);

        // The next scheduler executes them, then what follows.
        let mut next = build(&SchedConfig::new(SchedulerKind::Sequential, 1), service.clone(), &model(), sink).unwrap();
        back.into_iter().chain([write(5, 7)]).for_each(|b| next.submit(b).unwrap());
        assert_eq!(service.finished(), [1, 2, 3, 4, 5]);
        next.finish().unwrap();
    }
}

#[test]
fn a_switch_away_from_an_early_scheduler_runs_what_does_not_depend_on_what_it_began_at_once() {
    for kind in [SchedulerKind::Early, SchedulerKind::EarlyWsOptimistic] {
        let service = Arc::new(Gated::default());
        let sink = Arc::new(CollectSink::new(2));
        let mut s = Switchable::new(early(kind, 1), service.clone(), &model(), sink.clone()).unwrap();
        for (seq, key) in [(1, 7), (2, 8), (3, 7), (4, 9)] {
            s.submit(write(seq, key)).unwrap();
        }
        service.wait_for("command 1 starting", |s| s.started.contains(&1));
        // Command 3 waits for command 1, so the switch itself does: the gate
        // opens once command 2, on the next scheduler, has finished.
        let opener = {
            let service = service.clone();
            std::thread::spawn(move || {
                service.wait_for("command 2 finishing", |s| s.finished.contains(&2));
                service.open();
            })
        };
        s.switch_overlapped(SchedConfig::new(SchedulerKind::Sequential, 1)).unwrap();
        opener.join().unwrap();
        assert_eq!(s.withdrawn(), 3, "{kind}");
        // Command 3 ended the overlap while the switch gave the batches
        // back: that wait is the switch's.
        assert!(!s.overlapping(), "{kind}");
        let overlap = s.overlap_ended().expect("the old scheduler overlapped the next");
        assert_eq!((overlap.switch, s.switches()), (1, 1), "{kind}");
        assert_eq!(overlap.batches, 1, "{kind}: command 2 ran beside command 1");
        s.submit(write(5, 9)).unwrap();
        assert_eq!(service.finished(), [2, 1, 3, 4, 5], "{kind}");
        assert_eq!(Box::new(s).finish().unwrap().executed(), 5, "{kind}");
        assert_eq!(sink.take().0.len(), 5, "{kind}");
    }
}

#[test]
fn a_switch_away_from_an_early_scheduler_runs_what_it_took_back_on_the_next_one() {
    let service = Arc::new(Gated::default());
    service.open();
    let sink = Arc::new(CollectSink::new(2));
    let mut s = Switchable::new(early(SchedulerKind::Early, 2), service.clone(), &model(), sink.clone()).unwrap();
    for seq in 1..=40 {
        s.submit(write(seq, seq % 3)).unwrap();
    }
    s.switch_overlapped(SchedConfig::new(SchedulerKind::Sequential, 1)).unwrap();
    assert!(s.withdrawn() <= 40);
    s.submit(write(41, 41 % 3)).unwrap();
    let finished = service.finished();
    assert_eq!(finished.len(), 41, "each command ran once");
    // Commands on one key ran in log order, whoever ran them.
    for key in 0..3 {
        let on_key: Vec<u64> = finished.iter().copied().filter(|q| q % 3 == key).collect();
        assert!(on_key.windows(2).all(|w| w[0] < w[1]), "key {key}: {on_key:?}");
    }
    assert_eq!(Box::new(s).finish().unwrap().executed(), 41);
    assert_eq!(sink.take().0.len(), 41);
}
