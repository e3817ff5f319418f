//! The raft guard end to end: a running replica receives raft messages on
//! its peer port from a test that introduces itself as replica 2 (plain TCP,
//! `insecure_peers`). A forged heartbeat that would panic raft-rs is
//! refused and counted, and the replica runs on and still follows an honest
//! one; a panic inside raft (injected, `failpoints` feature) stops the
//! replica with a message naming the message and its sender.

mod common;

use protobuf::Message as _;
use psmr_model::wire::{frame_bytes, read_frame, Encoder};
use psmr_replica::{Config, Member, Replica};
use psmr_services::KvApp;
use raft::prelude::{Message, MessageType};
use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

const K_HELLO: u8 = 64;
const K_ACK: u8 = 65;
const K_RAFT: u8 = 67;

/// Three members on free local ports; only replica 1 is started.
fn three_members() -> Config {
    let held: Vec<TcpListener> = (0..6).map(|_| TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    let addr = |i: usize| held[i].local_addr().unwrap();
    let replicas = (0..3).map(|i| Member::new(i as u64 + 1, addr(2 * i), addr(2 * i + 1))).collect();
    drop(held);
    common::memory_config(replicas, |_| {})
}

/// Connects to `peer` as replica `id` and waits for the welcome.
fn impersonate(peer: SocketAddr, id: u64) -> TcpStream {
    let mut stream = TcpStream::connect(peer).unwrap();
    let mut hello = Encoder::new();
    hello.u64(id).u64(42);
    stream.write_all(&frame_bytes(K_HELLO, &hello.finish())).unwrap();
    let answer = read_frame(&mut stream, 1 << 16).unwrap();
    assert_eq!(answer.kind, K_ACK, "the replica did not welcome replica {id}");
    stream
}

fn send(stream: &mut TcpStream, msg: &Message) {
    stream.write_all(&frame_bytes(K_RAFT, &msg.write_to_bytes().unwrap())).unwrap();
}

/// A heartbeat from replica 2, leader of term 1, to replica 1.
fn heartbeat(commit: u64) -> Message {
    let mut m = Message { from: 2, to: 1, term: 1, commit, ..Default::default() };
    m.set_msg_type(MessageType::MsgHeartbeat);
    m
}

/// Waits (bounded) until `done` holds.
fn eventually(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_forged_heartbeat_is_refused_and_the_replica_runs_on() {
    // Fault injection is process-wide: keep the other test's out of here.
    let _no_faults = fail::FailScenario::setup();
    let config = three_members();
    let replica = Replica::start(config.clone(), 1, KvApp::new(&config.service_section().unwrap()).unwrap()).unwrap();
    let mut link = impersonate(config.replicas[0].peer, 2);
    // The heartbeat that panicked a follower inside raft-rs: commit 10^9.
    send(&mut link, &heartbeat(1_000_000_000));
    eventually("the forged heartbeat is refused", || replica.stats().peer_refused == 1);
    // An honest one from the same leader is followed.
    send(&mut link, &heartbeat(0));
    eventually("replica 2 is followed as the leader", || replica.leader() == 2);
    assert_eq!(replica.term(), 1);
    assert_eq!(replica.stats().peer_in, 2);
    assert_eq!(replica.stats().peer_refused, 1);
    assert!(!replica.stopping(), "the replica stopped");
    replica.stop();
}

#[cfg(feature = "failpoints")]
#[test]
fn a_panic_inside_raft_stops_the_replica() {
    let stopped = |replica: &Replica| {
        eventually("the replica stops by itself", || replica.stopping());
        replica.wait().expect_err("stopped with an error").to_string()
    };

    // While stepping a message.
    let scenario = fail::FailScenario::setup();
    fail::cfg("protocol-step", "panic(injected)").unwrap();
    let config = three_members();
    let replica = Replica::start(config.clone(), 1, KvApp::new(&config.service_section().unwrap()).unwrap()).unwrap();
    let mut link = impersonate(config.replicas[0].peer, 2);
    send(&mut link, &heartbeat(0));
    let why = stopped(&replica);
    assert!(why.contains("raft panicked stepping MsgHeartbeat from replica 2: injected"), "{why}");
    replica.stop();
    scenario.teardown();

    // While handling a ready (a lone replica elects itself: it has one).
    let scenario = fail::FailScenario::setup();
    fail::cfg("protocol-ready", "panic(injected)").unwrap();
    let mut config = three_members();
    config.replicas.truncate(1);
    let replica = Replica::start(config.clone(), 1, KvApp::new(&config.service_section().unwrap()).unwrap()).unwrap();
    let why = stopped(&replica);
    assert!(why.contains("raft panicked handling a ready") && why.contains("injected"), "{why}");
    replica.stop();
    scenario.teardown();
}
