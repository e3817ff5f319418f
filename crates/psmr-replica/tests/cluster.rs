//! Replicated clusters on loopback with real sockets: replies against a
//! sequential model, equal digests on every replica, leader failure under
//! load, catch-up through a snapshot, and garbage on every port.
//!
//! Each client works on keys of its own, so the sequential model of its
//! replies is its own history, whatever the order in which the log
//! interleaves the clients. Seeds are printed; `PSMR_TEST_SEED` replays.

mod common;

use psmr_client::{Client, ClientConfig, Reconfiguration};
use psmr_model::wire::{frame_bytes, Outcome};
use psmr_replica::{Config, Member, Replica, Storage};
use psmr_sched::SchedulerKind;
use psmr_services::kv::{key_bytes, KvCodec, KvOp, KvReply};
use psmr_services::KvApp;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn seed() -> u64 {
    // `RUST_LOG=debug` shows the replicas' logs.
    let _ = tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).try_init();
    let s = std::env::var("PSMR_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand::random);
    eprintln!("PSMR_TEST_SEED={s}");
    s
}

fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

/// A configuration and the certificates it names, removed when dropped.
/// It derefs to the configuration.
struct TestConfig {
    config: Config,
    _certs: tempfile::TempDir,
}

impl std::ops::Deref for TestConfig {
    type Target = Config;
    fn deref(&self) -> &Config {
        &self.config
    }
}

impl std::ops::DerefMut for TestConfig {
    fn deref_mut(&mut self) -> &mut Config {
        &mut self.config
    }
}

/// `n` replicas on loopback, authenticated with certificates of a fresh
/// cluster CA.
fn config(n: u64, kind: SchedulerKind, workers: usize) -> TestConfig {
    // Every listener stays open until all ports are chosen: a port closed
    // at once may be handed out again.
    let held: Vec<TcpListener> = (0..2 * n).map(|_| TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    let addr = |i: u64| held[i as usize].local_addr().unwrap();
    let replicas = (1..=n).map(|id| Member::new(id, addr(2 * id - 2), addr(2 * id - 1))).collect();
    drop(held);
    let certs = tempfile::tempdir().unwrap();
    let ids: Vec<u64> = (1..=n).collect();
    let peer_tls = psmr_replica::tls::generate(&certs.path().join("certs"), &ids).unwrap();
    let mut c = Config {
        replicas,
        storage: Storage::Memory,
        peer_tls: Some(peer_tls),
        insecure_clients: true,
        ..Config::default()
    };
    c.scheduler.kind = kind.name().into();
    c.scheduler.workers = workers;
    c.tick_ms = 20;
    c.client_io_threads = 1;
    c.validate().unwrap();
    TestConfig { config: c, _certs: certs }
}

fn start(config: &Config, id: u64) -> Replica {
    Replica::start(config.clone(), id, KvApp::new(&config.service_section().unwrap()).unwrap()).unwrap()
}

fn addrs(config: &Config) -> Vec<SocketAddr> {
    config.replicas.iter().map(|m| m.client).collect()
}

fn client(config: &Config, id: u64) -> Client {
    let mut cc = ClientConfig::new(addrs(config));
    cc.id = Some(id);
    cc.attempt_timeout = Duration::from_millis(500);
    Client::new(cc).unwrap()
}

/// A client's own sequential model of the store, on its own keys.
#[derive(Default)]
struct Model(HashMap<Vec<u8>, Vec<u8>>);

impl Model {
    fn apply(&mut self, op: &KvOp) -> KvReply {
        match op {
            KvOp::Read { key } => KvReply::Value(self.0.get(key).cloned()),
            KvOp::Create { key, value } => KvReply::Done(if self.0.contains_key(key) {
                false
            } else {
                self.0.insert(key.clone(), value.clone());
                true
            }),
            KvOp::Update { key, value } => KvReply::Done(match self.0.get_mut(key) {
                Some(v) => {
                    v.clone_from(value);
                    true
                }
                None => false,
            }),
            KvOp::Delete { key } => KvReply::Done(self.0.remove(key).is_some()),
            KvOp::Put { key, value } => KvReply::Done(self.0.insert(key.clone(), value.clone()).is_some()),
            other => panic!("the test sends no {other:?}"),
        }
    }
}

fn random_op(rng: &mut ChaCha8Rng, base: u64) -> KvOp {
    let key = key_bytes(base + rng.gen_range(0..8));
    let value = rng.gen::<u32>().to_le_bytes().to_vec();
    match rng.gen_range(0..5) {
        0 => KvOp::Read { key },
        1 => KvOp::Create { key, value },
        2 => KvOp::Update { key, value },
        3 => KvOp::Delete { key },
        _ => KvOp::Put { key, value },
    }
}

/// Clients running together: told to stop, and counting their answers.
#[derive(Default)]
struct Load {
    stopping: AtomicBool,
    answered: AtomicU64,
}

impl Load {
    /// Waits (bounded) until the clients have had `more` answers beyond
    /// `from`: the load is under way, whatever the machine's speed.
    fn under_way(&self, from: u64, more: u64) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.answered.load(Ordering::Relaxed) < from + more {
            assert!(Instant::now() < deadline, "the clients got no answers");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// Runs `requests` requests of `per` random commands for client `id`,
/// checking every reply against the model. Stops early once `load` is
/// stopping.
fn run_client(config: &Config, id: u64, seed: u64, requests: usize, per: usize, load: &Load) -> usize {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ id);
    let mut c = client(config, id);
    let mut model = Model::default();
    let base = id * 1_000_000;
    let mut done = 0;
    for _ in 0..requests {
        if load.stopping.load(Ordering::Relaxed) {
            break;
        }
        let ops: Vec<KvOp> = (0..per).map(|_| random_op(&mut rng, base)).collect();
        let replies = c.call(&KvCodec, &ops).unwrap_or_else(|e| panic!("client {id}: {e}"));
        for (op, reply) in ops.iter().zip(replies) {
            let want = model.apply(op);
            assert_eq!(reply, Ok(want), "client {id}: {op:?}");
        }
        load.answered.fetch_add(1, Ordering::Relaxed);
        done += 1;
    }
    // Every acknowledged write is in the state, once: read back every key
    // of this client's range.
    let keys: Vec<KvOp> = (0..8).map(|k| KvOp::Read { key: key_bytes(base + k) }).collect();
    let replies = c.call(&KvCodec, &keys).unwrap_or_else(|e| panic!("client {id}: {e}"));
    for (op, reply) in keys.iter().zip(replies) {
        assert_eq!(reply, Ok(model.apply(op)), "client {id}: final {op:?}");
    }
    done
}

/// Waits until the replicas at `addrs` report the same applied index and
/// digest; returns it.
fn converged(addrs: &[SocketAddr]) -> (u64, String) {
    let st = common::converged(addrs, Duration::from_secs(30), "replicas never converged");
    (st.applied, st.digest)
}

fn client_for_status() -> Client {
    Client::new(ClientConfig::new(vec![free_addr()])).unwrap()
}

fn leader(config: &Config, replicas: &[Option<Replica>]) -> usize {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        for (i, r) in replicas.iter().enumerate() {
            if r.as_ref().is_some_and(|r| r.is_leader()) {
                return i;
            }
        }
        assert!(Instant::now() < deadline, "no leader among {:?}", addrs(config));
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn every_scheduler_replies_like_the_model_and_replicas_agree() {
    let seed = seed();
    for kind in SchedulerKind::ALL {
        let config = config(3, kind, 2);
        let replicas: Vec<Replica> = (1..=3).map(|id| start(&config, id)).collect();
        let stop = Load::default();
        std::thread::scope(|s| {
            for id in 1..=6u64 {
                let (config, stop) = (&config, &stop);
                s.spawn(move || run_client(config, id, seed, 20, if id % 2 == 0 { 50 } else { 1 }, stop));
            }
        });
        let (applied, digest) = converged(&addrs(&config));
        assert!(applied > 0, "{kind}");
        eprintln!("{kind}: applied {applied}, digest {digest}");
        drop(replicas);
    }
}

/// Each replica switches its scheduler and worker count under load, one
/// after another and more than once: every reply stays what the clients'
/// models say, every replica ends in the same state, and a request for a
/// scheduler that does not exist leaves the running one.
#[test]
fn replicas_switch_schedulers_under_load_and_stay_equal() {
    let seed = seed();
    let config = config(3, SchedulerKind::Early, 2);
    let replicas: Vec<Option<Replica>> = (1..=3).map(|id| Some(start(&config, id))).collect();
    leader(&config, &replicas);
    let load = Arc::new(Load::default());
    let handles: Vec<_> = (1..=6u64)
        .map(|id| {
            let (config, load) = (config.clone(), load.clone());
            std::thread::spawn(move || run_client(&config, id, seed, 100_000, 1 + (id % 3) as usize * 10, &load))
        })
        .collect();
    load.under_way(0, 20);
    let probe = client_for_status();
    let plan = [
        ("late-batch-bitmap", 2),
        ("sequential", 1),
        ("early-ws-optimistic", 3),
        ("late-cbase", 2),
        ("early-busywait", 2),
        ("early", 1),
        ("auto", 2),
    ];
    for (i, (kind, workers)) in plan.into_iter().enumerate() {
        let addr = config.replicas[i % 3].client;
        let change = Reconfiguration { scheduler: kind.into(), workers, mapping: String::new() };
        let done = probe.reconfigure_of(addr, change, Duration::from_secs(30)).unwrap();
        assert_eq!((done.scheduler.as_str(), done.workers), (kind, workers));
        load.under_way(load.answered.load(Ordering::Relaxed), 10);
    }
    let bad = Reconfiguration { scheduler: "fastest".into(), workers: 2, mapping: String::new() };
    let why = probe.reconfigure_of(config.replicas[0].client, bad, Duration::from_secs(30)).unwrap_err();
    assert!(why.contains("unknown scheduler"), "{why}");
    load.under_way(load.answered.load(Ordering::Relaxed), 10);
    load.stopping.store(true, Ordering::Relaxed);
    for h in handles {
        h.join().expect("a client saw a wrong reply");
    }
    converged(&addrs(&config));
    // Replica 1 switched three times (and `auto` may have since).
    let text = probe.metrics_of(config.replicas[0].client, Duration::from_secs(5)).unwrap();
    let count = |name: &str| -> u64 {
        let line = text.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("no {name} in {text}"));
        line.rsplit(' ').next().and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{line}"))
    };
    let decisions = count("psmr_scheduler_decisions_total ");
    assert_eq!(count("psmr_scheduler_switch_stall_seconds_count "), 3 + decisions, "{text}");
    let status = probe.status_of(config.replicas[0].client, Duration::from_secs(5)).unwrap();
    assert!(status.scheduler.starts_with("auto: "), "{status:?}");
    let other = probe.status_of(config.replicas[1].client, Duration::from_secs(5)).unwrap();
    assert_eq!(other.scheduler, "early-busywait with 2 workers", "{other:?}");
}

/// Entries proposed by the replica that leads, and requests they held.
fn proposed(replicas: &[Option<Replica>], leader: usize) -> (u64, u64) {
    let stats = replicas[leader].as_ref().unwrap().stats();
    (stats.entries_proposed, stats.commands_proposed)
}

/// Batching follows the load (`psmr_replica::batcher`): with the longest
/// delay allowed, a lone client's requests still go out at once, each its
/// own entry (waiting for the delay would make every attempt time out);
/// with 16 clients at once, entries hold several requests.
#[test]
fn a_lone_request_goes_out_at_once_and_entries_grow_under_load() {
    let seed = seed();
    let mut config = config(3, SchedulerKind::Sequential, 1);
    config.batch_delay_us = 1_000_000;
    // A short pipeline: the protocol thread also waits for the service
    // manager to apply an entry, and must be woken when it does.
    config.pipeline = 2;
    // Every request an entry, reads too: this counts entries.
    config.reads_through_log = true;
    config.validate().unwrap();
    let replicas: Vec<Option<Replica>> = (1..=3).map(|id| Some(start(&config, id))).collect();
    let l = leader(&config, &replicas);
    let stop = Load::default();
    // 20 single-command requests and the 8-command read-back, one by one.
    run_client(&config, 1, seed, 20, 1, &stop);
    let (entries, commands) = proposed(&replicas, l);
    assert_eq!((entries, commands), (21, 28), "one entry per request");
    std::thread::scope(|s| {
        for id in 2..=17u64 {
            let (config, stop) = (&config, &stop);
            s.spawn(move || run_client(config, id, seed, 30, 1, stop));
        }
    });
    let (all_entries, _) = proposed(&replicas, l);
    let requests = 16 * 31;
    assert!(
        all_entries - entries < requests,
        "{} entries for {requests} requests from 16 clients at once",
        all_entries - entries
    );
    converged(&addrs(&config));
}

/// Reads without the log (`psmr_replica::reads`): a read-only request
/// makes no log entry, yet sees every write acknowledged before it was
/// sent, whichever client wrote it; with `reads_through_log` it is an
/// entry again.
#[test]
fn reads_skip_the_log_and_see_every_write_acknowledged_before_them() {
    for through_log in [false, true] {
        let mut config = config(3, SchedulerKind::Early, 2);
        config.reads_through_log = through_log;
        let replicas: Vec<Option<Replica>> = (1..=3).map(|id| Some(start(&config, id))).collect();
        let l = leader(&config, &replicas);
        let (mut writer, mut reader) = (client(&config, 1), client(&config, 2));
        let key = key_bytes(7);
        let (mut read_entries, mut reads) = (0, 0);
        for i in 0..50u32 {
            let value = i.to_le_bytes().to_vec();
            let put = KvOp::Put { key: key.clone(), value: value.clone() };
            writer.call(&KvCodec, &[put]).unwrap();
            let before = proposed(&replicas, l).0;
            let got = reader.call(&KvCodec, &[KvOp::Read { key: key.clone() }]).unwrap();
            assert_eq!(got, vec![Ok(KvReply::Value(Some(value)))], "read {i} (reads through the log: {through_log})");
            read_entries += proposed(&replicas, l).0 - before;
            reads += 1;
        }
        if through_log {
            assert_eq!(read_entries, reads, "one entry per read through the log");
        } else {
            assert_eq!(read_entries, 0, "no entry for a read without the log");
        }
        converged(&addrs(&config));
    }
}

/// A client that pipelines (sends requests without waiting for replies,
/// as the wire protocol allows) sees each read after its earlier writes
/// and before its later ones, whether the read skips the log or not. Each
/// burst starts with a read while nothing of the client is pending, so
/// that read skips the log and the writes behind it must wait for it.
#[test]
fn pipelined_reads_keep_their_place_among_their_clients_writes() {
    use psmr_model::wire::{read_frame, ClientMsg, OpCodec, ServerMsg, WireCommand};
    let config = config(3, SchedulerKind::Sequential, 1);
    let replicas: Vec<Option<Replica>> = (1..=3).map(|id| Some(start(&config, id))).collect();
    let l = leader(&config, &replicas);
    let mut conn = TcpStream::connect(config.replicas[l].client).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let key = key_bytes(3);
    let value = |i: u64| KvReply::Value((i > 0).then(|| i.to_le_bytes().to_vec()));
    let (bursts, per_burst) = (20u64, 10u64);
    // Command 2i+1 reads (and must see put i, none before the first);
    // command 2i+2 puts i+1.
    for burst in 0..bursts {
        let mut frames = Vec::new();
        for i in burst * per_burst..(burst + 1) * per_burst {
            let put = KvOp::Put { key: key.clone(), value: (i + 1).to_le_bytes().to_vec() };
            for (seq, op) in [(2 * i + 1, KvOp::Read { key: key.clone() }), (2 * i + 2, put)] {
                let commands = vec![WireCommand { seq, op: KvCodec.encode_op(&op) }];
                frames.extend(ClientMsg::Request { client: 9, commands }.to_frame());
            }
        }
        conn.write_all(&frames).unwrap();
        let mut answered = 0;
        while answered < 2 * per_burst {
            let frame = read_frame(&mut conn, 1 << 20).unwrap();
            let ServerMsg::Replies { replies, .. } = ServerMsg::from_frame(&frame).unwrap() else {
                panic!("the leader answers with replies");
            };
            for (seq, outcome) in replies {
                answered += 1;
                let Outcome::Ok(bytes) = outcome else { panic!("command {seq}: {outcome:?}") };
                if seq % 2 == 1 {
                    let i = seq / 2;
                    assert_eq!(KvCodec.decode_reply(&bytes).unwrap(), value(i), "the read after put {i}");
                }
            }
        }
    }
    let text = replicas[l].as_ref().unwrap().metrics_text();
    let skipped = psmr_replica::metrics::Scrape::parse(&text).value("psmr_read_round_requests_sum").unwrap();
    assert!(
        skipped >= bursts as f64,
        "every burst's first read skips the log: {skipped} of {} did",
        bursts * per_burst
    );
}

#[test]
fn the_leader_dies_under_load_and_nothing_acknowledged_is_lost_or_doubled() {
    let seed = seed();
    let config = config(3, SchedulerKind::Early, 2);
    let mut replicas: Vec<Option<Replica>> = (1..=3).map(|id| Some(start(&config, id))).collect();
    let first = leader(&config, &replicas);
    let stop = Arc::new(Load::default());
    let handles: Vec<_> = (1..=8u64)
        .map(|id| {
            let (config, stop) = (config.clone(), stop.clone());
            std::thread::spawn(move || run_client(&config, id, seed, 100_000, 10, &stop))
        })
        .collect();
    stop.under_way(0, 20);
    let killed = Instant::now();
    replicas[first].take().expect("the leader runs").stop();
    let second = leader(&config, &replicas);
    let takeover = killed.elapsed();
    eprintln!("leader {} stopped; replica {} took over after {takeover:?}", first + 1, second + 1);
    assert_ne!(first, second);
    // Clients go on with the new leader before they stop.
    stop.under_way(stop.answered.load(Ordering::Relaxed), 20);
    stop.stopping.store(true, Ordering::Relaxed);
    let done: usize = handles.into_iter().map(|h| h.join().expect("client failed")).sum();
    assert!(done > 0);
    let alive: Vec<SocketAddr> =
        config.replicas.iter().enumerate().filter(|(i, _)| *i != first).map(|(_, m)| m.client).collect();
    converged(&alive);
}

#[test]
fn five_replicas_survive_two_failures() {
    let seed = seed();
    let config = config(5, SchedulerKind::EarlyWsOptimistic, 2);
    let mut replicas: Vec<Option<Replica>> = (1..=5).map(|id| Some(start(&config, id))).collect();
    let stop = Load::default();
    std::thread::scope(|s| {
        for id in 1..=4u64 {
            let (config, stop) = (&config, &stop);
            s.spawn(move || run_client(config, id, seed, 30, 10, stop));
        }
        stop.under_way(0, 10);
        // The leader and one more.
        let first = leader(&config, &replicas);
        replicas[first].take().unwrap().stop();
        let other = (first + 1) % 5;
        replicas[other].take().unwrap().stop();
    });
    let alive: Vec<SocketAddr> =
        replicas.iter().zip(&config.replicas).filter(|(r, _)| r.is_some()).map(|(_, m)| m.client).collect();
    assert_eq!(alive.len(), 3);
    converged(&alive);
}

#[test]
fn a_late_replica_catches_up_through_a_snapshot() {
    let seed = seed();
    let mut config = config(3, SchedulerKind::LateBatchBitmap, 2);
    config.snapshot_every = 20;
    let first_two: Vec<Replica> = (1..=2).map(|id| start(&config, id)).collect();
    let stop = Load::default();
    std::thread::scope(|s| {
        for id in 1..=4u64 {
            let (config, stop) = (&config, &stop);
            s.spawn(move || run_client(config, id, seed, 40, 5, stop));
        }
    });
    // Far past the snapshot and the log slack: the newcomer cannot catch
    // up from the log alone.
    let third = start(&config, 3);
    let (applied, _) = converged(&addrs(&config));
    assert!(applied > 40, "applied {applied}");
    drop((first_two, third));
}

#[test]
fn garbage_and_oversized_frames_close_one_connection_only() {
    let mut config = config(3, SchedulerKind::Sequential, 1);
    config.frame_max = 1 << 12;
    config.batch_max_bytes = 1 << 10;
    let replicas: Vec<Replica> = (1..=3).map(|id| start(&config, id)).collect();
    let stop = Load::default();
    let targets: Vec<SocketAddr> = config.replicas.iter().flat_map(|m| [m.client, m.peer]).collect();
    for addr in &targets {
        for junk in [
            b"GET / HTTP/1.1\r\n\r\n".to_vec(),
            vec![0xff; 64],
            [&((1u32 << 30).to_be_bytes())[..], &[1, 1, 0, 0]].concat(),
            frame_bytes(1, &[0xde, 0xad]),
            frame_bytes(99, &[]),
        ] {
            let mut s = TcpStream::connect(addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let _ = s.write_all(&junk);
            // The replica closes the connection (possibly after an error
            // frame): reading ends.
            let mut sink = Vec::new();
            let _ = s.read_to_end(&mut sink);
        }
    }
    // Everything still works.
    run_client(&config, 77, 1, 5, 3, &stop);
    converged(&addrs(&config));
    let mut c = client(&config, 78);
    let err = c.submit(vec![vec![0xff]; 1]).unwrap();
    assert!(matches!(&err[0], Outcome::Rejected(m) if m.contains("bad operation")), "{err:?}");
    drop(replicas);
}
