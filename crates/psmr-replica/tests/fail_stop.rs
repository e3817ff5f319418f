//! Fail-stop: a replica whose thread panics stops, with the reason, instead
//! of running on without that thread (a zombie that still answers
//! `status`). A panicking service is the path every user's service can
//! take; a fault injected into the service manager stands for a bug in a
//! stage thread (`failpoints` feature, on in `scripts/test.sh`).

mod common;

use psmr_client::{Client, ClientConfig};
use psmr_model::{Access, ClassModel, Command, Mapping, Refused, Service, SnapshotError};
use psmr_replica::{App, Config, Replica};
use psmr_services::kv::{KvCodec, KvOp, KvReply};
use psmr_services::KvApp;
use std::time::{Duration, Instant};

const POISON: &[u8] = b"666";

/// The kv store, except that writing key 666 panics.
struct Poisoned(KvApp);

impl Service for Poisoned {
    type Op = KvOp;
    type Reply = KvReply;
    fn execute(&self, c: &Command<KvOp>) -> KvReply {
        if matches!(&c.op, KvOp::Put { key, .. } if key == POISON) {
            panic!("poisoned key");
        }
        self.0.execute(c)
    }
    fn snapshot(&self) -> Vec<u8> {
        self.0.snapshot()
    }
    fn restore(&self, s: &[u8]) -> Result<(), SnapshotError> {
        self.0.restore(s)
    }
}

impl App for Poisoned {
    type Codec = KvCodec;
    fn class_model(&self) -> ClassModel {
        self.0.class_model()
    }
    fn access(&self, op: &KvOp) -> Result<Access, Refused> {
        self.0.access(op)
    }
    fn default_mapping(&self, workers: usize) -> Option<Mapping> {
        self.0.default_mapping(workers)
    }
}

fn one_replica(scheduler: &str) -> Config {
    common::one_replica_config(|c| c.scheduler.kind = scheduler.into())
}

/// Waits (bounded) for the replica to stop by itself; its error.
fn stopped_by_itself(replica: &Replica) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !replica.stopping() {
        assert!(Instant::now() < deadline, "the replica ran on after a panic (a zombie)");
        std::thread::sleep(Duration::from_millis(5));
    }
    replica.wait().expect_err("stopped with an error").to_string()
}

#[test]
fn a_service_panic_stops_the_replica_at_once() {
    // Fault injection is process-wide: keep the other test's out of here.
    let _no_faults = fail::FailScenario::setup();
    for scheduler in ["sequential", "early", "late-batch-bitmap", "early-ws-optimistic"] {
        let config = one_replica(scheduler);
        let kv = KvApp::new(&config.service_section().unwrap()).unwrap();
        let replica = Replica::start(config.clone(), 1, Poisoned(kv)).unwrap();
        let mut cc = ClientConfig::new(vec![replica.client_addr()]);
        cc.deadline = Duration::from_secs(20);
        let mut client = Client::new(cc).unwrap();
        let ok = client.call(&KvCodec, &[KvOp::Put { key: b"1".to_vec(), value: b"one".to_vec() }]).unwrap();
        assert!(ok[0].is_ok(), "{scheduler}: {ok:?}");
        // No reply comes for the poisoned write; the replica stops instead.
        let mut cc = ClientConfig::new(vec![replica.client_addr()]);
        cc.deadline = Duration::from_millis(300);
        let _ = Client::new(cc).unwrap().call(&KvCodec, &[KvOp::Put { key: POISON.to_vec(), value: vec![] }]);
        let why = stopped_by_itself(&replica);
        assert!(why.contains("poisoned key") && why.contains("no longer trusted"), "{scheduler}: {why}");
        replica.stop();
    }
}

#[cfg(feature = "failpoints")]
#[test]
fn a_panic_in_a_stage_thread_stops_the_replica() {
    let scenario = fail::FailScenario::setup();
    fail::cfg("manager-apply", "panic(injected)").unwrap();
    let config = one_replica("early");
    let replica = Replica::start(config.clone(), 1, KvApp::new(&config.service_section().unwrap()).unwrap()).unwrap();
    // The leader's first (empty) entry reaches the manager, which panics.
    let why = stopped_by_itself(&replica);
    assert!(why.contains("thread psmr-manager panicked: injected"), "{why}");
    replica.stop();
    scenario.teardown();
}

/// A panic on an execution thread outside the service (a bug in psmr,
/// injected where a worker hands a reply on) stops the replica with the
/// reason under every scheduler, and its stop returns: no scheduler wait
/// outlives the dead worker (for `sequential` the thread is the
/// manager's own). The whole check runs on a thread of its own so that a
/// hang fails with the scheduler's name.
#[cfg(feature = "failpoints")]
#[test]
fn a_dead_execution_thread_stops_the_replica_under_every_scheduler() {
    let scenario = fail::FailScenario::setup();
    for kind in psmr_sched::SchedulerKind::ALL {
        fail::remove("sched-deliver");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let config = common::one_replica_config(|c| {
                c.scheduler.kind = kind.name().into();
                c.scheduler.workers = 2;
            });
            let kv = KvApp::new(&config.service_section().unwrap()).unwrap();
            let replica = Replica::start(config, 1, kv).unwrap();
            let mut cc = ClientConfig::new(vec![replica.client_addr()]);
            cc.deadline = Duration::from_secs(20);
            let put = |k: &str| vec![KvOp::Put { key: k.as_bytes().to_vec(), value: b"v".to_vec() }];
            let ok = Client::new(cc).unwrap().call(&KvCodec, &put("1")).unwrap();
            assert!(ok[0].is_ok(), "{kind}: {ok:?}");
            fail::cfg("sched-deliver", "panic(injected)").unwrap();
            let mut cc = ClientConfig::new(vec![replica.client_addr()]);
            cc.deadline = Duration::from_millis(300);
            let mut client = Client::new(cc).unwrap();
            // Several commands, so that every worker has one to hand on.
            let _ = client.call(&KvCodec, &(0..8).flat_map(|i| put(&format!("k{i}"))).collect::<Vec<_>>());
            let why = stopped_by_itself(&replica);
            replica.stop();
            let _ = tx.send(why);
        });
        let why = rx
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("{kind}: the replica did not stop after its execution thread died"));
        // A worker's death is the scheduler's to report; `sequential` (and
        // `auto` while it runs sequentially) execute on the manager thread.
        assert!(
            why.contains("worker thread") && why.contains("panicked: injected")
                || why.contains("thread psmr-manager panicked: injected"),
            "{kind}: {why}"
        );
    }
    scenario.teardown();
}
