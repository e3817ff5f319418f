//! The repair path end to end, on a 3-replica in-process cluster with disk
//! storage: a follower whose raft log is damaged refuses to start (naming
//! the file and the byte), `DiskStore::repair` rebuilds it, and it catches
//! up from the leader's snapshot without anything acknowledged being lost;
//! the same with two of three replicas damaged.
//!
//! Nothing here sleeps in place of synchronization: every wait polls a
//! condition with a bound. Seeds are printed; `PSMR_TEST_SEED` replays.

use psmr_client::{Client, ClientConfig};
use psmr_replica::{Config, Member, Replica, ReplicaError, Storage};
use psmr_services::kv::{key_bytes, KvCodec, KvOp, KvReply};
use psmr_services::KvApp;
use psmr_storage::disk::{DiskError, DiskStore};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn seed() -> u64 {
    // `RUST_LOG=debug` shows the replicas' logs.
    let _ = tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).try_init();
    let s = std::env::var("PSMR_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand::random);
    eprintln!("PSMR_TEST_SEED={s}");
    s
}

/// Polls `done` every 20 ms until it holds, for at most `bound`.
fn wait_for(what: &str, bound: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + bound;
    while !done() {
        assert!(Instant::now() < deadline, "timed out after {bound:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Three replicas on loopback with disk storage under a temporary
/// directory, compacting their logs often (so that a replica that lost its
/// log can only catch up from a snapshot).
struct Cluster {
    config: Config,
    replicas: Vec<Option<Replica>>,
    client: Client,
    rng: ChaCha8Rng,
    /// Every acknowledged write: key → value.
    acked: BTreeMap<u64, Vec<u8>>,
    next_key: u64,
    _data: tempfile::TempDir,
}

impl Cluster {
    fn new(seed: u64) -> Cluster {
        // Every listener stays open until all ports are chosen.
        let held: Vec<TcpListener> = (0..6).map(|_| TcpListener::bind("127.0.0.1:0").unwrap()).collect();
        let addr = |i: u64| held[i as usize].local_addr().unwrap();
        let replicas = (1..=3).map(|id| Member::new(id, addr(2 * id - 2), addr(2 * id - 1))).collect();
        drop(held);
        let data = tempfile::tempdir().unwrap();
        let mut config = Config {
            replicas,
            storage: Storage::Disk,
            data_dir: data.path().to_path_buf(),
            insecure_peers: true,
            insecure_clients: true,
            ..Config::default()
        };
        config.snapshot_every = 10;
        config.tick_ms = 20;
        config.client_io_threads = 1;
        config.scheduler.workers = 2;
        config.validate().unwrap();
        let mut cc = ClientConfig::new(config.replicas.iter().map(|m| m.client).collect());
        cc.id = Some(seed | 1);
        cc.attempt_timeout = Duration::from_millis(500);
        let client = Client::new(cc).unwrap();
        let mut cluster = Cluster {
            config,
            replicas: Vec::new(),
            client,
            rng: ChaCha8Rng::seed_from_u64(seed),
            acked: BTreeMap::new(),
            next_key: 1,
            _data: data,
        };
        cluster.replicas = (1..=3).map(|id| Some(cluster.start(id).unwrap())).collect();
        cluster
    }

    fn start(&self, id: u64) -> Result<Replica, ReplicaError> {
        Replica::start(self.config.clone(), id, KvApp::new(&self.config.service_section().unwrap()).unwrap())
    }

    fn restart(&mut self, id: u64) {
        assert!(self.replicas[id as usize - 1].is_none(), "replica {id} runs");
        self.replicas[id as usize - 1] = Some(self.start(id).unwrap_or_else(|e| panic!("replica {id}: {e}")));
    }

    fn stop(&mut self, id: u64) {
        self.replicas[id as usize - 1].take().expect("it runs").stop();
    }

    fn dir(&self, id: u64) -> PathBuf {
        self.config.replica_dir(id)
    }

    fn addr(&self, id: u64) -> SocketAddr {
        self.config.member(id).unwrap().client
    }

    fn running(&self) -> Vec<u64> {
        (1..=3).filter(|&id| self.replicas[id as usize - 1].is_some()).collect()
    }

    /// The replica that leads, among the running ones (waits for one).
    fn leader(&self) -> u64 {
        let mut found = 0;
        wait_for("a leader", Duration::from_secs(10), || {
            found = self.leading().unwrap_or(0);
            found != 0
        });
        found
    }

    fn leading(&self) -> Option<u64> {
        self.running().into_iter().find(|&id| self.replicas[id as usize - 1].as_ref().unwrap().is_leader())
    }

    /// Writes `n` new keys, one request (one log entry) each; every one must
    /// be acknowledged as a new key.
    fn write(&mut self, n: usize) {
        for _ in 0..n {
            let key = self.next_key;
            self.next_key += 1;
            let value = self.rng.gen::<u64>().to_le_bytes().to_vec();
            let replies = self
                .client
                .call(&KvCodec, &[KvOp::Put { key: key_bytes(key), value: value.clone() }])
                .unwrap_or_else(|e| panic!("put {key}: {e}"));
            assert_eq!(replies, vec![Ok(KvReply::Done(false))], "put {key}");
            self.acked.insert(key, value);
        }
    }

    /// Every acknowledged key reads back with its value.
    fn read_back(&mut self) {
        let keys: Vec<u64> = self.acked.keys().copied().collect();
        for chunk in keys.chunks(64) {
            let ops: Vec<KvOp> = chunk.iter().map(|&key| KvOp::Read { key: key_bytes(key) }).collect();
            let replies = self.client.call(&KvCodec, &ops).unwrap_or_else(|e| panic!("read back: {e}"));
            for (key, reply) in chunk.iter().zip(replies) {
                assert_eq!(reply, Ok(KvReply::Value(Some(self.acked[key].clone()))), "key {key}");
            }
        }
    }

    /// Waits until the running replicas report the same applied index and
    /// digest (over their client ports); returns it.
    fn converged(&self) -> (u64, String) {
        let probe = Client::new(ClientConfig::new(vec![self.addr(1)])).unwrap();
        let ids = self.running();
        let mut last = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let st: Result<Vec<_>, _> =
                ids.iter().map(|&id| probe.status_of(self.addr(id), Duration::from_secs(2))).collect();
            if let Ok(st) = st {
                if st.windows(2).all(|w| w[0].applied == w[1].applied && w[0].digest == w[1].digest) {
                    return (st[0].applied, st[0].digest.clone());
                }
                last = st.iter().map(|s| (s.applied, s.digest.clone())).collect();
            }
            assert!(Instant::now() < deadline, "replicas {ids:?} never converged: {last:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// raft-engine's append-queue files of `dir`, oldest first.
fn log_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir.join("log"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "raftlog"))
        .collect();
    files.sort();
    files
}

fn newest(dir: &Path) -> (PathBuf, u64) {
    let file = log_files(dir).pop().expect("a log file");
    let len = std::fs::metadata(&file).unwrap().len();
    (file, len)
}

/// Damage the replicas `ids` (followers, running, caught up) the same way:
/// each is stopped, restarted, given `more` entries, stopped again, and 4
/// bytes are flipped in the middle of what its newest log file gained in
/// between. Those records hold the newest entries, which no compaction has
/// dropped yet (raft-engine checks an entry block only when it is read, so
/// damage to an entry compacted away would go unnoticed, harmlessly), and
/// synced entries follow them (so this is not a torn tail that a crash
/// could leave). Returns, per replica, the file and the flipped byte.
fn damage(c: &mut Cluster, ids: &[u64], more: usize) -> Vec<(PathBuf, u64)> {
    let mut before = Vec::new();
    for &id in ids {
        c.stop(id);
        // A clean close leaves the file ending at its last record.
        before.push(newest(&c.dir(id)));
    }
    for &id in ids {
        c.restart(id);
    }
    c.write(more);
    c.converged();
    let mut flipped = Vec::new();
    for (&id, (file1, len1)) in ids.iter().zip(before) {
        c.stop(id);
        let (file, len) = newest(&c.dir(id));
        let start = if file == file1 { len1 } else { 0 };
        assert!(len > start + 64, "replica {id}: {} grew from {start} to {len} bytes only", file.display());
        let mid = (start + len) / 2;
        let mut bytes = std::fs::read(&file).unwrap();
        for b in &mut bytes[mid as usize..mid as usize + 4] {
            *b ^= 0xff;
        }
        std::fs::write(&file, &bytes).unwrap();
        eprintln!("replica {id}: flipped bytes {mid}..{} of {} ({len} bytes)", mid + 4, file.display());
        flipped.push((file, mid));
    }
    flipped
}

/// Replica `id` refuses to start, naming `file` and a byte at or before
/// `flipped` (where the record holding it starts).
fn assert_refused(c: &Cluster, id: u64, file: &Path, flipped: u64) {
    let e = c.start(id).err().unwrap_or_else(|| panic!("replica {id} started on a damaged log"));
    let message = e.to_string();
    eprintln!("replica {id} refused: {message}");
    let ReplicaError::Storage(DiskError::LogDamaged { file: named, offset, .. }) = e else {
        panic!("replica {id}: not a damaged log: {message}")
    };
    assert_eq!(Path::new(&named), file, "{message}");
    assert!(offset > 0 && offset <= flipped, "the record holding byte {flipped} starts at {offset}: {message}");
    assert!(message.contains(&format!("{} is damaged at byte {offset}", file.display())), "{message}");
}

fn repair(c: &Cluster, id: u64, file: &Path) {
    let report = DiskStore::repair(&c.dir(id)).unwrap_or_else(|e| panic!("repair {id}: {e}"));
    eprintln!("{report}");
    let damage = report.damage.as_deref().expect("it could not start");
    assert!(damage.contains(&file.display().to_string()), "{damage}");
    assert!(report.vote_floor.is_some(), "{report}");
    assert!(report.moved_to.as_deref().is_some_and(Path::exists), "{report}");
}

#[test]
fn a_repaired_follower_catches_up_from_the_snapshot_and_nothing_is_lost() {
    let mut c = Cluster::new(seed());
    let leader = c.leader();
    c.write(40);
    c.converged();
    let follower = [1, 2, 3].into_iter().find(|&id| id != leader).unwrap();
    let flipped = damage(&mut c, &[follower], 12);
    let (file, at) = &flipped[0];

    // The other two keep serving while it cannot start; far past its log
    // and several snapshots.
    c.write(30);
    assert_refused(&c, follower, file, *at);
    c.write(30);
    c.converged();

    repair(&c, follower, file);
    c.restart(follower);
    let (applied, digest) = c.converged();
    eprintln!("converged after the repair at applied {applied}, digest {digest}");
    c.read_back();
    c.write(20);
    let (after, _) = c.converged();
    assert!(after > applied, "{after} > {applied}");
    c.read_back();
}

/// Without writes after the damage, nothing but the repaired replica's
/// reconnection tells the leader that it lost its log: the leader's
/// progress for it still says it holds everything up to the old `matched`,
/// so its heartbeats commit up to there, which the repaired replica's guard
/// drops (a heartbeat must not commit beyond the receiver's log), and no
/// append ever goes out. Before the peer `Hello` said "repaired" (and the
/// leader reset its progress on hearing it), the replica stayed at applied
/// index 0 here until the leader changed.
#[test]
fn a_repaired_follower_of_an_idle_cluster_catches_up_without_a_leader_change() {
    let mut c = Cluster::new(seed());
    let leader = c.leader();
    c.write(40);
    c.converged();
    let follower = [1, 2, 3].into_iter().rev().find(|&id| id != leader).unwrap();
    let flipped = damage(&mut c, &[follower], 12);
    let (file, at) = &flipped[0];
    assert_refused(&c, follower, file, *at);
    repair(&c, follower, file);
    c.restart(follower);
    let (applied, _) = c.converged();
    assert_eq!(c.leading(), Some(leader), "the same leader throughout");
    assert!(applied >= 52, "applied {applied}");
    c.write(5);
    c.converged();
    c.read_back();
}

#[test]
fn two_damaged_replicas_both_refuse_and_after_repair_nothing_acknowledged_is_lost() {
    let mut c = Cluster::new(seed());
    let leader = c.leader();
    c.write(40);
    c.converged();
    let damaged: Vec<u64> = [1, 2, 3].into_iter().filter(|&id| id != leader).collect();
    let flipped = damage(&mut c, &damaged, 12);
    for (&id, (file, at)) in damaged.iter().zip(&flipped) {
        assert_refused(&c, id, file, *at);
    }
    for (&id, (file, _)) in damaged.iter().zip(&flipped) {
        repair(&c, id, file);
    }

    // Without the intact replica no leader can be elected, and that is
    // right: the repaired two never campaign below their vote floors (they
    // may have acknowledged entries that only their lost logs held), and
    // neither votes for the other's empty log. The intact one is stopped
    // too to show it; it is bounded, a few election timeouts.
    c.stop(leader);
    for &id in &damaged {
        c.restart(id);
    }
    let timeouts = c.config.tick() * c.config.election_ticks as u32 * 10;
    let deadline = Instant::now() + timeouts;
    while Instant::now() < deadline {
        assert_eq!(c.leading(), None, "a replica below its vote floor was elected");
        std::thread::sleep(Duration::from_millis(20));
    }

    // With the intact replica back, it is elected and both catch up from
    // its snapshot.
    c.restart(leader);
    assert_eq!(c.leader(), leader, "only the intact replica can lead");
    c.converged();
    c.read_back();
    c.write(20);
    c.converged();
    c.read_back();
}
