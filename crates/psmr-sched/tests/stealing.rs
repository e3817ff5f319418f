//! Work stealing really happens, and only where it may.
//!
//! The first command of worker 0 blocks until a command queued *behind* it
//! on worker 0 has executed. Without stealing that is a deadlock; with it,
//! idle worker 1 takes worker 0's ready queue and runs the command. The
//! wait is bounded (a stuck test fails instead of hanging).

use psmr_model::{Batch, ClassId, ClassModel, ClientId, Command, Digest, Mapping, Service, SnapshotError};
use psmr_sched::{build, CollectSink, SchedConfig, SchedulerKind, Victims};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// Command 0 waits for command 2; every command records that it ran.
#[derive(Default)]
struct Handshake {
    state: Mutex<(bool, bool)>, // (command 0 started, command 2 ran)
    cvar: Condvar,
}

impl Service for Handshake {
    type Op = ();
    type Reply = u64;
    fn execute(&self, c: &Command<()>) -> u64 {
        let mut st = self.state.lock().unwrap();
        match c.seq {
            0 => {
                st.0 = true;
                self.cvar.notify_all();
                let (st, timeout) = self.cvar.wait_timeout_while(st, Duration::from_secs(20), |s| !s.1).unwrap();
                assert!(!timeout.timed_out() && st.1, "command 2 never ran: nobody stole it");
            }
            2 => {
                st.1 = true;
                self.cvar.notify_all();
            }
            _ => {}
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

fn read(seq: u64) -> Command<()> {
    Command {
        client: ClientId(1),
        seq,
        class: ClassId(0),
        reads: [seq].into_iter().collect(),
        writes: Default::default(),
        op: (),
    }
}

#[test]
fn an_idle_worker_steals_a_blocked_workers_queue() {
    for (kind, victims) in [
        (SchedulerKind::EarlyWsQueue, Victims::First),
        (SchedulerKind::EarlyWsQueue, Victims::Random),
        (SchedulerKind::EarlyWsQueue, Victims::Next),
        (SchedulerKind::EarlyWsSemi, Victims::First),
        (SchedulerKind::EarlyWsSemi, Victims::Next),
    ] {
        let model =
            ClassModel::builder("rw").class("R").class("W").conflict("R", "W").conflict("W", "W").build().unwrap();
        let mapping = Mapping::from_spec(&model, 2, "R=conc:0,1;W=seq:0,1").unwrap();
        let mut config = SchedConfig::new(kind, 2).with_mapping(mapping);
        config.victims = victims;
        config.metrics = true;
        let service = Arc::new(Handshake::default());
        let sink = Arc::new(CollectSink::new(2));
        let mut s = build(&config, service.clone(), &model, sink.clone()).unwrap();
        let metrics = s.metrics().expect("work stealing keeps metrics");
        // Round-robin: command 0 to worker 0, command 1 to worker 1.
        s.submit(Batch::new(vec![read(0), read(1)], 64)).unwrap();
        // Wait until worker 0 is inside command 0, so that the next batch
        // lands in its ready queue rather than in the batch it executes.
        {
            let st = service.state.lock().unwrap();
            let (st, timeout) = service.cvar.wait_timeout_while(st, Duration::from_secs(20), |s| !s.0).unwrap();
            assert!(!timeout.timed_out() && st.0);
        }
        // Command 2 to worker 0 (behind the blocked command 0), 3 to worker 1.
        s.submit(Batch::new(vec![read(2), read(3)], 64)).unwrap();
        s.finish().unwrap();
        let (replies, dups) = sink.take();
        assert_eq!(replies.len(), 4, "{victims}");
        assert!(dups.is_empty());
        let steals: u64 = metrics.snapshot().iter().map(|w| w.steals_ok).sum();
        assert!(steals >= 1, "{victims}: no steal recorded");
        assert!(metrics.snapshot()[1].steals_ok >= 1, "{victims}: worker 1 should be the stealer");
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
