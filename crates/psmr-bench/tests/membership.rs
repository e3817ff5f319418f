//! Membership change under load: an in-process cluster of the key-value
//! store grows from 3 replicas to 5 and shrinks back to 3 (the leader
//! removed first) while closed-loop clients write and read a few shared
//! keys. No request fails, the clients' history is linearizable, the
//! removed replicas stop, and the remaining ones end in the same state.

use psmr_client::{Client, ClientConfig};
use psmr_harness::history::{self, OpKind, Operation, Status, Verdict};
use psmr_model::wire::{MemberChange, MemberInfo};
use psmr_replica::LocalCluster;
use psmr_services::kv::{KvCodec, KvOp, KvReply};
use psmr_services::KvApp;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const CLIENTS: u64 = 4;
const KEYS: u64 = 6;
/// Answers the clients must get between two steps of the test: every
/// change happens while the load is under way, however fast the machine.
const ANSWERS_PER_STEP: u64 = 150;

fn kv() -> KvApp {
    KvApp::new(&Default::default()).unwrap()
}

/// Clients writing unique values and reading, recording every operation.
struct Load {
    stopping: AtomicBool,
    answered: AtomicU64,
    failed: AtomicU64,
    history: Mutex<Vec<Operation>>,
    start: Instant,
}

impl Load {
    /// Waits (bounded, not timed) until the clients had `ANSWERS_PER_STEP`
    /// more answers.
    fn under_way(&self) {
        let from = self.answered.load(Ordering::Relaxed);
        poll_until(Duration::from_secs(120), || {
            let answered = self.answered.load(Ordering::Relaxed) - from;
            (answered >= ANSWERS_PER_STEP).then_some(()).ok_or_else(|| format!("the clients got {answered} answers"))
        });
    }

    fn run_client(&self, id: u64, addrs: Vec<SocketAddr>) {
        let mut config = ClientConfig::new(addrs);
        config.deadline = Duration::from_secs(30);
        let mut c = Client::new(config).unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(id);
        let mut n = 0u64;
        while !self.stopping.load(Ordering::Relaxed) {
            let key = rng.gen_range(0..KEYS).to_string();
            let write = rng.gen_bool(0.5);
            n += 1;
            let value = format!("{id}-{n}");
            let op = match write {
                true => KvOp::Put { key: key.clone().into_bytes(), value: value.clone().into_bytes() },
                false => KvOp::Read { key: key.clone().into_bytes() },
            };
            let invoke_ns = self.start.elapsed().as_nanos() as u64;
            let reply = c.call(&KvCodec, &[op]).map(|mut r| r.pop().expect("one reply"));
            let complete_ns = self.start.elapsed().as_nanos() as u64;
            let (status, result) = match reply {
                Ok(Ok(KvReply::Done(existed))) if write => (Status::Ok, serde_json::json!(existed)),
                Ok(Ok(KvReply::Value(v))) if !write => {
                    (Status::Ok, serde_json::json!(v.map(|v| String::from_utf8(v).unwrap())))
                }
                other => {
                    eprintln!("client {id}: {other:?}");
                    self.failed.fetch_add(1, Ordering::Relaxed);
                    (Status::Unknown, serde_json::Value::Null)
                }
            };
            let kind = if write { OpKind::Write } else { OpKind::Read };
            let value = write.then_some(value);
            let op = Operation { client: id, op: kind, key, value, result, invoke_ns, complete_ns, status };
            self.history.lock().unwrap().push(op);
            self.answered.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn change(addrs: &[SocketAddr], change: MemberChange) -> Vec<MemberInfo> {
    let c = Client::new(ClientConfig::new(addrs.to_vec())).unwrap();
    c.change_membership(addrs, change.clone(), Duration::from_secs(120)).unwrap_or_else(|e| panic!("{change:?}: {e}"))
}

fn voters(members: &[MemberInfo]) -> Vec<u64> {
    members.iter().filter(|m| m.voter).map(|m| m.id).collect()
}

#[test]
fn a_cluster_grows_to_five_and_shrinks_to_three_under_load() {
    // Snapshots every 20 entries, and the log compacted 20 entries behind
    // them: by the time a replica joins, the log no longer reaches back to
    // the founding entries, and the new replica catches up from a snapshot,
    // sent in chunks of 512 bytes on the snapshot lane (TLS), two at a time.
    let mut cluster = LocalCluster::builder()
        .configure(|c| {
            c.snapshot_every = 20;
            c.snapshot_chunk_bytes = 512;
            c.snapshot_window_chunks = 2;
            c.snapshot_sync_bytes = 2048;
        })
        .start(|_| kv())
        .unwrap();
    cluster.wait_for_leader(Duration::from_secs(10)).unwrap();
    let founders = cluster.client_addrs();
    let load = Arc::new(Load {
        stopping: AtomicBool::new(false),
        answered: AtomicU64::new(0),
        failed: AtomicU64::new(0),
        history: Mutex::new(Vec::new()),
        start: Instant::now(),
    });
    let clients: Vec<_> = (1..=CLIENTS)
        .map(|id| {
            let (load, addrs) = (load.clone(), founders.clone());
            std::thread::spawn(move || load.run_client(id, addrs))
        })
        .collect();
    load.under_way();

    for expected in [vec![1, 2, 3, 4], vec![1, 2, 3, 4, 5]] {
        let id = cluster.join(kv()).unwrap();
        let m = cluster.config().member(id).unwrap().clone();
        let add = MemberChange::Add { id, client: m.client.to_string(), peer: m.peer.to_string() };
        assert_eq!(voters(&change(&cluster.client_addrs(), add.clone())), expected);
        // The same request again is answered at once: the goal is met.
        assert_eq!(voters(&change(&cluster.client_addrs(), add)), expected);
        assert!(counter(m.client, "psmr_snapshots_restored_total ") >= 1, "replica {id} caught up without a snapshot");
        let received = counter(m.client, "psmr_snapshot_transfer_bytes_total{direction=\"received\"} ");
        assert!(received > 2 * 512, "replica {id} received {received} bytes of snapshots: not in chunks");
        load.under_way();
    }

    // The leader first, then another founder.
    let leader = cluster.wait_for_leader(Duration::from_secs(10)).unwrap();
    let other = (1..=3).find(|&id| id != leader).unwrap();
    let mut removed = Vec::new();
    for id in [leader, other] {
        let members = change(&cluster.client_addrs(), MemberChange::Remove { id });
        assert!(!members.iter().any(|m| m.id == id), "{members:?}");
        removed.push(id);
        load.under_way();
    }
    load.stopping.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().unwrap();
    }

    let survivors: Vec<u64> = (1..=5).filter(|id| !removed.contains(id)).collect();
    let members = change(&cluster.client_addrs(), MemberChange::Remove { id: removed[0] });
    assert_eq!(voters(&members), survivors, "{members:?}");
    for &id in &removed {
        poll_until(Duration::from_secs(60), || {
            let stopped = cluster.replica(id).unwrap().stopping();
            stopped.then_some(()).ok_or_else(|| format!("removed replica {id} still runs"))
        });
    }
    converged(&cluster, &survivors);

    assert_eq!(load.failed.load(Ordering::Relaxed), 0, "no request failed");
    let ops = load.history.lock().unwrap().clone();
    assert!(ops.len() as u64 >= 5 * ANSWERS_PER_STEP);
    assert_eq!(history::check_linearizable(&ops, history::MAX_STATES_DEFAULT), Verdict::Linearizable);
}

/// The value of the counter whose line starts with `name` (with its
/// labels) in the metrics of the replica at `addr`.
fn counter(addr: SocketAddr, name: &str) -> u64 {
    let c = Client::new(ClientConfig::new(vec![addr])).unwrap();
    let text = c.metrics_of(addr, Duration::from_secs(5)).unwrap();
    let line = text.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("no {name} in\n{text}"));
    line.split_whitespace().last().unwrap().parse().unwrap()
}

/// Polls `done` (what it says: why it is not done yet) until it is done;
/// fails with its last word after `bound`. The 5 ms between polls paces
/// the polling, it stands for no event.
fn poll_until(bound: Duration, mut done: impl FnMut() -> Result<(), String>) {
    let deadline = Instant::now() + bound;
    loop {
        match done() {
            Ok(()) => return,
            Err(why) => assert!(Instant::now() < deadline, "after {bound:?}: {why}"),
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Waits until `ids` report the same applied index and state digest.
fn converged(cluster: &LocalCluster, ids: &[u64]) {
    let probe = Client::new(ClientConfig::new(cluster.client_addrs())).unwrap();
    poll_until(Duration::from_secs(60), || {
        let seen: Vec<(u64, String)> = ids
            .iter()
            .map(|&id| {
                let addr = cluster.config().member(id).unwrap().client;
                let st = probe.status_of(addr, Duration::from_secs(2));
                st.map(|s| (s.applied, s.digest)).unwrap_or_default()
            })
            .collect();
        let same = seen.windows(2).all(|w| w[0] == w[1]) && seen[0].0 > 0;
        same.then_some(()).ok_or_else(|| format!("the remaining replicas differ: {seen:?}"))
    });
}
