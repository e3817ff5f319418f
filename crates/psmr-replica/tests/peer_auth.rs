//! The peer port under attack, with in-process replicas on loopback that
//! authenticate each other with mutual TLS: forged raft messages from a
//! process without a certificate, a certificate from another CA, a valid
//! certificate claiming another replica's id, impostors that connect first
//! to a restarting replica, and a flood of idle connections. None of them
//! may reach raft, stop a replica or grow its threads without bound, and
//! the cluster serves clients throughout.

use protobuf::Message as _;
use psmr_client::{Client, ClientConfig};
use psmr_core::entry::{encode_entry, EntryCommand};
use psmr_model::wire::{frame_bytes, Encoder, OpCodec, ReplicaStatus};
use psmr_replica::config::PeerTls;
use psmr_replica::tls::{self, PeerTlsContext};
use psmr_replica::{Config, Member, Replica, ReplicaError, Storage};
use psmr_services::kv::{key_bytes, KvCodec, KvOp, KvReply};
use psmr_services::KvApp;
use psmr_transport::peer::HANDSHAKES_MAX;
use raft::prelude::{Entry, EntryType, Message, MessageType};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

const K_HELLO: u8 = 64;
const K_ACK: u8 = 65;
const K_RAFT: u8 = 67;

/// A key no client writes: only a forgery could put it in the store.
const FORGED_KEY: u64 = 4_242_424_242;

/// A cluster's configuration with the certificates (and data) it names,
/// removed when dropped.
struct Setup {
    config: Config,
    _certs: tempfile::TempDir,
    _data: tempfile::TempDir,
    // Tests of this file run one at a time: the flood test counts the
    // threads of the whole process.
    _serial: std::sync::MutexGuard<'static, ()>,
}

static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn setup(n: u64, storage: Storage) -> Setup {
    // A test that failed poisons the lock; the others still run.
    let serial = SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let _ = tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).try_init();
    // Every listener stays open until all ports are chosen: a port closed
    // at once may be handed out again.
    let held: Vec<TcpListener> = (0..2 * n).map(|_| TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    let addr = |i: u64| held[i as usize].local_addr().unwrap();
    let replicas = (1..=n).map(|id| Member::new(id, addr(2 * id - 2), addr(2 * id - 1))).collect();
    drop(held);
    let (certs, data) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let ids: Vec<u64> = (1..=n).collect();
    let peer_tls = tls::generate(&certs.path().join("certs"), &ids).unwrap();
    let mut config = Config {
        replicas,
        storage,
        data_dir: data.path().to_path_buf(),
        peer_tls: Some(peer_tls),
        insecure_clients: true,
        ..Config::default()
    };
    config.scheduler.kind = "sequential".into();
    config.scheduler.workers = 1;
    config.client_io_threads = 1;
    config.tick_ms = 20;
    config.validate().unwrap();
    Setup { config, _certs: certs, _data: data, _serial: serial }
}

impl Setup {
    fn start(&self, id: u64) -> Replica {
        // A replica stopped a moment ago may still hold its ports for a
        // few milliseconds (its accept loop notices the stop when it polls).
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match Replica::start(self.config.clone(), id, KvApp::new(&self.config.service_section().unwrap()).unwrap())
            {
                Ok(r) => return r,
                Err(ReplicaError::Bind { .. }) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Err(e) => panic!("replica {id} cannot start: {e}"),
            }
        }
    }

    fn addrs(&self) -> Vec<SocketAddr> {
        self.config.replicas.iter().map(|m| m.client).collect()
    }

    fn peer_addr(&self, id: u64) -> SocketAddr {
        self.config.member(id).unwrap().peer
    }

    fn client(&self, id: u64) -> Client {
        let mut cc = ClientConfig::new(self.addrs());
        cc.id = Some(id);
        cc.attempt_timeout = Duration::from_millis(500);
        Client::new(cc).unwrap()
    }

    /// This cluster's CA trusted, and another CA's certificate and key
    /// presented.
    fn with_identity_of(&self, other: &PeerTls) -> PeerTls {
        PeerTls {
            ca: self.config.peer_tls.as_ref().unwrap().ca.clone(),
            cert: other.cert.clone(),
            key: other.key.clone(),
        }
    }

    fn tls(&self) -> &PeerTls {
        self.config.peer_tls.as_ref().unwrap()
    }
}

/// Writes and reads a few keys of `client`'s own range; panics on a wrong
/// reply.
fn serve_some(setup: &Setup, client: u64, rounds: u64) {
    let mut c = setup.client(client);
    for i in 0..rounds {
        let key = client * 1_000_000 + i;
        let value = format!("v{i}").into_bytes();
        let replies = c
            .call(
                &KvCodec,
                &[KvOp::Put { key: key_bytes(key), value: value.clone() }, KvOp::Read { key: key_bytes(key) }],
            )
            .unwrap();
        assert_eq!(replies[1], Ok(KvReply::Value(Some(value))), "client {client} key {key}");
    }
}

fn statuses(setup: &Setup) -> Result<Vec<ReplicaStatus>, String> {
    let probe = Client::new(ClientConfig::new(setup.addrs())).unwrap();
    setup.addrs().iter().map(|&a| probe.status_of(a, Duration::from_secs(2))).collect()
}

/// Waits until every replica reports the same applied index and digest,
/// with a leader; returns that status.
fn converged(setup: &Setup) -> ReplicaStatus {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let st = statuses(setup);
        if let Ok(st) = &st {
            if st.iter().all(|s| s.leader != 0)
                && st.windows(2).all(|w| w[0].applied == w[1].applied && w[0].digest == w[1].digest)
            {
                return st[0].clone();
            }
        }
        assert!(Instant::now() < deadline, "replicas never converged: {st:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The leader's index in `replicas`, once there is one.
fn leader(replicas: &[Replica]) -> usize {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(i) = replicas.iter().position(|r| r.is_leader()) {
            return i;
        }
        assert!(Instant::now() < deadline, "no leader");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A replica's `Hello` as `peer.rs` sends it: id, incarnation, and the
/// flag of a repaired replica that has not caught up (not set here).
fn hello(from: u64, incarnation: u64) -> Vec<u8> {
    let mut e = Encoder::new();
    e.u64(from).u64(incarnation).u8(0);
    frame_bytes(K_HELLO, &e.finish())
}

fn raft_frame(msg: &Message) -> Vec<u8> {
    frame_bytes(K_RAFT, &msg.write_to_bytes().unwrap())
}

/// What a forger who knows the cluster's state sends to follower `to` in
/// the name of leader `from`: an append of a command nobody proposed,
/// committed at once, and a heartbeat that commits it too.
fn forged_messages(from: u64, to: u64, term: u64, last: u64) -> Vec<u8> {
    let op = KvCodec.encode_op(&KvOp::Put { key: key_bytes(FORGED_KEY), value: b"forged".to_vec() });
    let data = encode_entry(&[EntryCommand { client: 0xf0f0, seq: 1, op }]);
    let mut entry = Entry::default();
    entry.set_entry_type(EntryType::EntryNormal);
    entry.term = term;
    entry.index = last + 1;
    entry.data = data.into();
    let mut append = Message::default();
    append.set_msg_type(MessageType::MsgAppend);
    append.from = from;
    append.to = to;
    append.term = term;
    append.log_term = term;
    append.index = last;
    append.commit = last + 1;
    append.entries = vec![entry].into();
    let mut heartbeat = Message::default();
    heartbeat.set_msg_type(MessageType::MsgHeartbeat);
    heartbeat.from = from;
    heartbeat.to = to;
    heartbeat.term = term;
    heartbeat.commit = last + 1;
    [raft_frame(&append), raft_frame(&heartbeat)].concat()
}

/// Reads what the replica answers until it closes the connection, which
/// it must do within a few seconds, without ever acknowledging a `Hello`.
fn assert_closed_without_ack(stream: &mut impl Read, what: &str) {
    let mut got = Vec::new();
    let end = stream.read_to_end(&mut got);
    if let Err(e) = &end {
        assert!(
            !matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut),
            "{what}: the replica kept the connection open"
        );
    }
    assert!(!got.starts_with(&frame_bytes(K_ACK, &[])), "{what}: the replica acknowledged the hello");
}

fn raw_connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

/// Nothing the forger sent is in the state: every replica agrees, the
/// state digest is the one before the attack (empty entries of a new term
/// may have been applied since), and the forged key does not exist.
fn assert_untouched(setup: &Setup, before: &ReplicaStatus) {
    let after = converged(setup);
    assert_eq!(after.digest, before.digest, "the state changed: {before:?} -> {after:?}");
    let mut c = setup.client(77);
    let read = c.call(&KvCodec, &[KvOp::Read { key: key_bytes(FORGED_KEY) }]).unwrap();
    assert_eq!(read[0], Ok(KvReply::Value(None)), "the forged command was applied");
}

#[test]
fn forged_raft_messages_without_a_certificate_have_no_effect() {
    let setup = setup(3, Storage::Memory);
    let replicas: Vec<Replica> = (1..=3).map(|id| setup.start(id)).collect();
    serve_some(&setup, 1, 5);
    let before = converged(&setup);
    let lead = leader(&replicas) as u64 + 1;
    let follower = lead % 3 + 1;
    let term = replicas[0].term();
    let incarnation = replicas[lead as usize - 1].incarnation();

    // Today's protocol in plain TCP, with the leader's real incarnation.
    let mut s = raw_connect(setup.peer_addr(follower));
    let _ = s.write_all(&[hello(lead, incarnation), forged_messages(lead, follower, term, before.applied)].concat());
    assert_closed_without_ack(&mut s, "plain hello");
    // The same bytes after a TLS ClientHello would need a certificate: a
    // TLS client without one is refused as well.
    let mut s = raw_connect(setup.peer_addr(follower));
    let _ = s.write_all(&[0x16, 0x03, 0x01, 0x00, 0x05, 1, 0, 0, 1, 0]);
    assert_closed_without_ack(&mut s, "truncated client hello");

    assert_untouched(&setup, &before);
    assert!(replicas.iter().all(|r| !r.stopping()), "a replica stopped");
    serve_some(&setup, 2, 5);
    converged(&setup);
}

#[test]
fn a_certificate_from_another_ca_is_refused() {
    let setup = setup(3, Storage::Memory);
    let replicas: Vec<Replica> = (1..=3).map(|id| setup.start(id)).collect();
    serve_some(&setup, 1, 3);
    let before = converged(&setup);
    let lead = leader(&replicas) as u64 + 1;
    let follower = lead % 3 + 1;
    let term = replicas[0].term();
    let incarnation = replicas[lead as usize - 1].incarnation();

    // A CA of the attacker's own, with certificates for the same names.
    let other = tempfile::tempdir().unwrap();
    let foreign = tls::generate(other.path(), &[1, 2, 3]).unwrap();
    // It trusts the real CA, so the server passes its checks; only the
    // server's check of the client can stop it.
    let attacker = PeerTlsContext::load(&setup.with_identity_of(&foreign), lead).unwrap();
    let tcp = raw_connect(setup.peer_addr(follower));
    match attacker.connect(follower, tcp) {
        // TLS 1.3: the client finishes first and hears the verdict next.
        Ok(mut s) => {
            let _ = s.write_all(&hello(lead, incarnation));
            let _ = s.write_all(&forged_messages(lead, follower, term, before.applied));
            let _ = s.flush();
            assert_closed_without_ack(&mut s, "foreign certificate");
        }
        Err(e) => assert!(e.to_string().contains("handshake"), "{e}"),
    }
    assert_untouched(&setup, &before);
    assert!(replicas.iter().all(|r| !r.stopping()), "a replica stopped");
    serve_some(&setup, 2, 3);
}

#[test]
fn a_valid_certificate_cannot_claim_another_id() {
    let setup = setup(3, Storage::Memory);
    let replicas: Vec<Replica> = (1..=3).map(|id| setup.start(id)).collect();
    serve_some(&setup, 1, 3);
    let before = converged(&setup);
    let term = replicas[0].term();
    let one = replicas[0].incarnation();
    let two = replicas[1].incarnation();

    // Replica 2's own certificate and key, claiming to be replica 1 on
    // replica 3's peer port.
    let as_two = PeerTlsContext::load(setup.tls(), 2).unwrap();
    let mut s = as_two.connect(3, raw_connect(setup.peer_addr(3))).unwrap();
    let _ = s.write_all(&hello(1, one));
    let _ = s.write_all(&forged_messages(1, 3, term, before.applied));
    let _ = s.flush();
    assert_closed_without_ack(&mut s, "replica 2 claiming id 1");

    // The same certificate under its own id is accepted (and replaces the
    // real replica 2's connection, which reconnects and replaces it back).
    let mut s = as_two.connect(3, raw_connect(setup.peer_addr(3))).unwrap();
    s.write_all(&hello(2, two)).unwrap();
    s.flush().unwrap();
    let mut ack = vec![0u8; frame_bytes(K_ACK, &[]).len()];
    s.read_exact(&mut ack).unwrap();
    assert_eq!(ack, frame_bytes(K_ACK, &[]), "replica 2's own id is accepted");
    drop(s);

    assert_untouched(&setup, &before);
    assert!(replicas.iter().all(|r| !r.stopping()), "a replica stopped");
    serve_some(&setup, 2, 3);
    converged(&setup);
}

#[test]
fn impostors_first_at_a_restarting_replica_do_not_get_the_real_replicas_refused() {
    let setup = setup(3, Storage::Disk);
    let mut replicas: Vec<Option<Replica>> = (1..=3).map(|id| Some(setup.start(id))).collect();
    serve_some(&setup, 1, 5);
    converged(&setup);
    // Restart a follower from its data directory (same incarnation): the
    // others must take it back.
    let lead = {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(i) = replicas.iter().position(|r| r.as_ref().is_some_and(|r| r.is_leader())) {
                break i as u64 + 1;
            }
            assert!(Instant::now() < deadline, "no leader");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let victim = lead % 3 + 1;
    let others: Vec<u64> = (1..=3).filter(|&id| id != victim).collect();
    replicas[victim as usize - 1].take().unwrap().stop();
    serve_some(&setup, 2, 3);
    replicas[victim as usize - 1] = Some(setup.start(victim));
    // At once, before the real replicas' senders retry: impostors claim
    // their ids with made-up incarnations and hold the connections open.
    let mut impostors = Vec::new();
    for &id in &others {
        for incarnation in [1, 0xdead_beef] {
            let mut s = raw_connect(setup.peer_addr(victim));
            let _ = s.write_all(&hello(id, incarnation));
            impostors.push(s);
        }
    }
    // The restarted replica catches up, the others still run, and the
    // cluster serves clients.
    serve_some(&setup, 3, 5);
    converged(&setup);
    for (i, r) in replicas.iter().enumerate() {
        assert!(!r.as_ref().unwrap().stopping(), "replica {} stopped", i + 1);
    }
    for mut s in impostors {
        assert_closed_without_ack(&mut s, "impostor");
    }
}

/// Threads of this process.
fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

/// Open files this process may have.
fn files_max() -> usize {
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
    limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|n| n.parse().ok())
        .unwrap_or(1024)
}

#[test]
fn a_flood_of_idle_connections_does_not_grow_threads_and_the_cluster_serves() {
    let setup = setup(3, Storage::Memory);
    let replicas: Vec<Replica> = (1..=3).map(|id| setup.start(id)).collect();
    serve_some(&setup, 1, 3);
    converged(&setup);
    let mut client = setup.client(2);
    let baseline = threads();
    // Two files per connection (both ends live in this process) and room
    // for the rest.
    let flood = 2000.min(files_max().saturating_sub(512) / 2);
    assert!(flood >= 500, "too few open files allowed for the test: {}", files_max());
    // Receivers replaced while the flood runs may linger a moment.
    let bound = baseline + replicas.len() * HANDSHAKES_MAX + 8;
    let peers: Vec<SocketAddr> = (1..=3).map(|id| setup.peer_addr(id)).collect();
    let mut idle = Vec::with_capacity(flood);
    let mut most = baseline;
    for i in 0..flood {
        match TcpStream::connect(peers[i % peers.len()]) {
            Ok(s) => idle.push(s),
            Err(e) => panic!("connection {i}: {e}"),
        }
        if i % 50 == 0 {
            most = most.max(threads());
            assert!(most <= bound, "{most} threads after {i} idle connections (baseline {baseline})");
            // The cluster serves meanwhile.
            let key = 2_000_000 + i as u64;
            let r = client.call(&KvCodec, &[KvOp::Put { key: key_bytes(key), value: vec![1] }]).unwrap();
            assert!(r[0].is_ok(), "{r:?}");
        }
    }
    most = most.max(threads());
    assert!(most <= bound, "{most} threads with {flood} idle connections (baseline {baseline})");
    serve_some(&setup, 3, 5);
    converged(&setup);
    assert!(replicas.iter().all(|r| !r.stopping()));
    eprintln!("{flood} idle connections: at most {most} threads (baseline {baseline}, bound {bound})");
    drop(idle);
}
