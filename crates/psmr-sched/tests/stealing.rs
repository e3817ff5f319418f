//! Work stealing really happens, and only where it may.
//!
//! In each test a command blocks until a command queued *behind* it has
//! executed. Without stealing that is a deadlock; with it, another worker
//! takes the queued command and runs it. The waits are bounded (a stuck
//! test fails instead of hanging).

use psmr_model::{Batch, ClassId, ClassModel, ClientId, Command, Digest, Mapping, Service, SnapshotError};
use psmr_sched::{build, CollectSink, SchedConfig, SchedulerKind, Victims};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// Commands whose sequence number is in `blocked` wait until command
/// `release` has run; every command replies with its sequence number.
struct Handshake {
    blocked: Vec<u64>,
    release: u64,
    state: Mutex<(usize, bool)>, // (blocked commands started, release ran)
    cvar: Condvar,
    /// Which worker ran each command, by sequence number.
    workers: Mutex<Vec<(u64, usize)>>,
}

impl Handshake {
    fn new(blocked: &[u64], release: u64) -> Self {
        Self {
            blocked: blocked.to_vec(),
            release,
            state: Mutex::new((0, false)),
            cvar: Condvar::new(),
            workers: Mutex::new(Vec::new()),
        }
    }

    /// The worker that ran command `seq`, from its thread's name.
    fn ran_by(&self, seq: u64) -> Option<usize> {
        self.workers.lock().unwrap().iter().find(|e| e.0 == seq).map(|e| e.1)
    }

    /// Waits until every blocked command is executing.
    fn wait_blocked(&self) {
        let st = self.state.lock().unwrap();
        let n = self.blocked.len();
        let (st, timeout) = self.cvar.wait_timeout_while(st, Duration::from_secs(20), |s| s.0 < n).unwrap();
        assert!(!timeout.timed_out() && st.0 == n, "the blocked commands never started");
    }
}

impl Service for Handshake {
    type Op = ();
    type Reply = u64;
    fn execute(&self, c: &Command<()>) -> u64 {
        let me = std::thread::current().name().and_then(|n| n.strip_prefix("psmr-ws-")?.parse().ok());
        self.workers.lock().unwrap().push((c.seq, me.expect("a work-stealing worker")));
        let mut st = self.state.lock().unwrap();
        if self.blocked.contains(&c.seq) {
            st.0 += 1;
            self.cvar.notify_all();
            let (st, timeout) = self.cvar.wait_timeout_while(st, Duration::from_secs(20), |s| !s.1).unwrap();
            assert!(!timeout.timed_out() && st.1, "command {} never ran: nobody stole it", self.release);
        } else if c.seq == self.release {
            st.1 = true;
            self.cvar.notify_all();
        }
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

fn command(seq: u64, class: u16) -> Command<()> {
    Command {
        client: ClientId(1),
        seq,
        class: ClassId(class),
        reads: [seq].into_iter().collect(),
        writes: Default::default(),
        op: (),
    }
}

fn read(seq: u64) -> Command<()> {
    command(seq, 0)
}

#[test]
fn an_idle_worker_steals_a_blocked_workers_queue() {
    for (kind, victims) in [
        (SchedulerKind::EarlyWsQueue, Victims::First),
        (SchedulerKind::EarlyWsQueue, Victims::Random),
        (SchedulerKind::EarlyWsQueue, Victims::Next),
        (SchedulerKind::EarlyWsSemi, Victims::First),
        (SchedulerKind::EarlyWsSemi, Victims::Next),
        (SchedulerKind::EarlyWsNonBlocking, Victims::First),
        (SchedulerKind::EarlyWsNonBlocking, Victims::Random),
        (SchedulerKind::EarlyWsOptimistic, Victims::Next),
        (SchedulerKind::EarlyWsOptimistic, Victims::First),
    ] {
        let model =
            ClassModel::builder("rw").class("R").class("W").conflict("R", "W").conflict("W", "W").build().unwrap();
        let mapping = Mapping::from_spec(&model, 2, "R=conc:0,1;W=seq:0,1").unwrap();
        let mut config = SchedConfig::new(kind, 2).with_mapping(mapping);
        config.victims = Some(victims);
        config.metrics = true;
        let service = Arc::new(Handshake::new(&[0], 2));
        let sink = Arc::new(CollectSink::new(2));
        let mut s = build(&config, service.clone(), &model, sink.clone()).unwrap();
        let metrics = s.metrics().expect("work stealing keeps metrics");
        // Round-robin: command 0 to worker 0, command 1 to worker 1.
        s.submit(Batch::new(vec![read(0), read(1)], 64)).unwrap();
        // Wait until worker 0 is inside command 0, so that the next batch
        // lands in its ready queue rather than in the batch it executes.
        service.wait_blocked();
        // Command 2 to worker 0 (behind the blocked command 0), 3 to worker 1.
        s.submit(Batch::new(vec![read(2), read(3)], 64)).unwrap();
        s.finish().unwrap();
        let (replies, dups) = sink.take();
        assert_eq!(replies.len(), 4, "{kind} {victims}");
        assert!(dups.is_empty());
        let steals: u64 = metrics.snapshot().iter().map(|w| w.steals_ok).sum();
        assert!(steals >= 1, "{kind} {victims}: no steal recorded");
        assert!(metrics.snapshot()[1].steals_ok >= 1, "{kind} {victims}: worker 1 should be the stealer");
    }
}

/// Worker 1 waits for worker 0 at a sequential command `W2`; worker 0 is
/// stuck in `R0` until `X3` runs, and `X3` sits in the ready queue of
/// worker 2, itself stuck in `X1` until `X3` runs. Only a worker that
/// steals while it waits for a sequential command (000 Alg. 11 and 13)
/// gets everybody out: worker 1 takes `X3`, whose class does not conflict
/// with `W`. (`early-ws-queue` would stay stuck until the service's
/// timeout, so it is not among the kinds.)
///
/// An idle worker may steal `R0` or `X1` before its owner takes it; then
/// the scene differs (and must end all the same), so the test runs it
/// again until it has played out as described, and checks the steal then.
#[test]
fn a_worker_waiting_for_a_sequential_command_steals() {
    for kind in [SchedulerKind::EarlyWsSemi, SchedulerKind::EarlyWsNonBlocking, SchedulerKind::EarlyWsOptimistic] {
        let mut played = 0;
        for _ in 0..200 {
            let model = ClassModel::builder("rwx")
                .class("R")
                .class("W")
                .class("X")
                .conflict("R", "W")
                .conflict("W", "W")
                .build()
                .unwrap();
            let mapping = Mapping::from_spec(&model, 3, "R=conc:0;W=seq:0,1;X=conc:2").unwrap();
            let mut config = SchedConfig::new(kind, 3).with_mapping(mapping);
            config.metrics = true;
            let service = Arc::new(Handshake::new(&[0, 1], 3));
            let sink = Arc::new(CollectSink::new(3));
            let mut s = build(&config, service.clone(), &model, sink.clone()).unwrap();
            let metrics = s.metrics().expect("work stealing keeps metrics");
            s.submit(Batch::new(vec![command(0, 0), command(1, 2), command(2, 1)], 64)).unwrap();
            service.wait_blocked();
            s.submit(Batch::new(vec![command(3, 2)], 64)).unwrap();
            s.finish().unwrap();
            let (replies, dups) = sink.take();
            assert_eq!(replies.len(), 4, "{kind}");
            assert!(dups.is_empty());
            let m = metrics.snapshot();
            if service.ran_by(0) != Some(0) || service.ran_by(1) != Some(2) {
                continue; // an idle worker stole R0 or X1
            }
            played += 1;
            assert_eq!(service.ran_by(3), Some(1), "{kind}: worker 1 runs X3 while it waits at W2");
            assert_eq!(m[1].steals_ok, 1, "{kind}");
            assert_eq!(m[0].executed, 2, "{kind}: R0, and W2 as the last to arrive");
            if played == 3 {
                break;
            }
        }
        assert!(played > 0, "{kind}: the scene never played out as described in 200 runs");
    }
}

#[test]
fn victim_policies_parse() {
    for v in [Victims::First, Victims::Random, Victims::Next] {
        assert_eq!(v.name().parse::<Victims>().unwrap(), v);
    }
    let e = "smart".parse::<Victims>().unwrap_err().to_string();
    assert!(e.contains("unknown victim policy \"smart\" (known: first, random, next)"), "{e}");
}
