//! The protocol stepped by hand: no thread, no socket, no clock but the
//! one the test passes. A small "network" moves raft messages between
//! protocols; every effect is recorded and looked at.

use psmr_core::config::{Config, Member};
use psmr_core::entry::{encode_command, entry_commands};
use psmr_core::guard::Refusal;
use psmr_core::membership::Membership;
use psmr_core::protocol::{Apply, Options, Protocol, ProtocolIo, Stop};
use psmr_core::request::{Lease, Request};
use psmr_core::snapfile::{FileWriter, SnapshotFile};
use psmr_core::store::{descriptor_id, found, MemStore, Store};
use psmr_core::transfer::SnapMsg;
use psmr_model::wire::{MemberChange, ServerMsg};
use raft::prelude::{Entry, EntryType, Message, MessageType};
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, VecDeque};
use std::io::Write;
use std::net::SocketAddr;
use std::rc::Rc;

/// Everything a protocol asked for.
#[derive(Default)]
struct Effects {
    sent: Vec<Message>,
    applied: Vec<Apply>,
    told: Vec<(u64, ServerMsg)>,
    answers: Vec<(u64, ServerMsg)>,
    refused: Vec<String>,
    peers: Vec<BTreeMap<u64, SocketAddr>>,
    proposed: Vec<u64>,
    snap_sent: Vec<(u64, SnapMsg)>,
    snap_refused: Vec<String>,
    /// `apply` answers false: the apply loop is gone.
    apply_gone: bool,
    /// Entries of no command proposed for reads.
    clock_entries: usize,
}

impl ProtocolIo for Effects {
    fn send(&mut self, msg: Message) -> bool {
        self.sent.push(msg);
        true
    }

    fn send_snapshot(&mut self, to: u64, msg: SnapMsg) -> bool {
        self.snap_sent.push((to, msg));
        true
    }

    fn transfer_refused(&mut self, peer: u64, why: &str) {
        self.snap_refused.push(format!("from {peer}: {why}"));
    }

    fn apply(&mut self, work: Apply) -> bool {
        self.applied.push(work);
        !self.apply_gone
    }

    fn tell(&mut self, client: u64, msg: ServerMsg) {
        self.told.push((client, msg));
    }

    fn membership(&mut self, _membership: &Membership, peers: &BTreeMap<u64, SocketAddr>) {
        self.peers.push(peers.clone());
    }

    fn answer(&mut self, ticket: u64, msg: ServerMsg) {
        self.answers.push((ticket, msg));
    }

    fn refused(&mut self, _msg: &Message, why: &Refusal) {
        self.refused.push(why.to_string());
    }

    fn proposed(&mut self, commands: u64, _bytes: usize) {
        self.proposed.push(commands);
    }

    fn clock_entry_proposed(&mut self) {
        self.clock_entries += 1;
    }
}

impl Effects {
    /// The entries handed to the apply loop that carry commands.
    fn batches(&self) -> Vec<Entry> {
        let entries = self.applied.iter().filter_map(|a| match a {
            Apply::Entries(e) => Some(e.clone()),
            _ => None,
        });
        entries.flatten().filter(|e| e.get_entry_type() == EntryType::EntryNormal && !e.data.is_empty()).collect()
    }

    /// The reads handed to the apply loop, by client.
    fn reads(&self) -> Vec<u64> {
        let reads = self.applied.iter().filter_map(|a| match a {
            Apply::Reads(r, _) => Some(r.iter().map(|r| r.client).collect::<Vec<_>>()),
            _ => None,
        });
        reads.flatten().collect()
    }
}

fn member(id: u64) -> Member {
    Member::new(id, ([127, 0, 0, 1], 7000 + id as u16).into(), ([127, 0, 0, 1], 8000 + id as u16).into())
}

fn config(replicas: u64) -> Config {
    Config { replicas: (1..=replicas).map(member).collect(), batch_delay_us: 1_000, ..Config::default() }
}

/// A founded replica `id` of `config`, over a fresh memory log.
fn replica(config: &Config, id: u64) -> (Protocol<MemStore>, Effects) {
    let store = MemStore::default();
    found(&store, &config.replicas).unwrap();
    let mut protocol = Protocol::new(config, id, store, Options::new(id).quiet()).unwrap();
    let mut io = Effects::default();
    protocol.start(&mut io);
    (protocol, io)
}

/// A request of one write (a byte the test picks) of `client`.
fn request(client: u64, seq: u64, at_ns: u64) -> Request {
    let mut encoded = Vec::new();
    encode_command(&mut encoded, client, seq, &[seq as u8]);
    Request::new(client, 1, encoded, 1, at_ns)
}

/// A read request of `client`.
fn read(client: u64, seq: u64, at_ns: u64) -> Request {
    Request { read: true, ..request(client, seq, at_ns) }
}

/// Ticks a lone replica until it leads (it elects itself).
fn lead(p: &mut Protocol<MemStore>, io: &mut Effects) {
    for _ in 0..100 {
        p.tick().unwrap();
        p.turn(0, io).unwrap();
        if p.view().is_leader() {
            return;
        }
    }
    panic!("a lone replica did not elect itself");
}

#[test]
fn a_lone_replica_elects_itself_and_proposes_a_request_at_once() {
    let config = config(1);
    let (mut p, mut io) = replica(&config, 1);
    assert_eq!(io.peers, vec![BTreeMap::new()], "no peer to link to");
    lead(&mut p, &mut io);
    let before = io.batches().len();
    p.request(request(5, 1, 0));
    p.turn(0, &mut io).unwrap();
    assert_eq!(io.proposed, vec![1], "nothing in flight: proposed at once");
    let batches = io.batches();
    assert_eq!(batches.len(), before + 1, "committed and handed to the apply loop");
    let (_, commands) = entry_commands(&batches.last().unwrap().data).unwrap();
    assert_eq!((commands[0].client, commands[0].seq, commands[0].op), (5, 1, &[1u8][..]));
}

#[test]
fn the_entry_grows_while_one_is_in_flight_and_goes_out_when_its_delay_is_over() {
    let mut c = Three::new();
    c.run(60);
    let leader = c.replicas.iter().position(|(p, _)| p.view().is_leader()).expect("a leader");
    let (p, io) = &mut c.replicas[leader];
    io.proposed.clear();
    // Nothing in flight: at once. Its messages are not delivered, so the
    // entry stays in flight.
    p.request(request(5, 1, 10_000_000));
    p.turn(10_000_000, io).unwrap();
    assert_eq!(io.proposed, vec![1]);
    // Now requests wait for more, until the oldest's delay (1 ms) is over.
    p.request(request(6, 1, 10_100_000));
    p.turn(10_100_000, io).unwrap();
    assert_eq!(io.proposed, vec![1], "waits while an entry is in flight");
    assert_eq!(p.due(10_100_000), Some(11_100_000), "due when its delay is over");
    p.request(request(7, 1, 10_500_000));
    p.turn(11_000_000, io).unwrap();
    assert_eq!(io.proposed, vec![1], "not yet");
    p.turn(11_100_000, io).unwrap();
    assert_eq!(io.proposed, vec![1, 2], "both requests in one entry");
}

#[test]
fn a_follower_sends_requests_and_reads_to_the_leader() {
    let config = config(3);
    let (mut p, mut io) = replica(&config, 2);
    // Replica 1 leads: its heartbeat says so.
    let mut heartbeat = Message { to: 2, from: 1, term: 2, ..Default::default() };
    heartbeat.set_msg_type(MessageType::MsgHeartbeat);
    p.step(heartbeat, &mut io).unwrap();
    p.request(request(5, 1, 0));
    p.request(read(6, 1, 0));
    p.turn(0, &mut io).unwrap();
    assert_eq!(p.view().leader, 1);
    let told: Vec<u64> = io.told.iter().map(|(client, _)| *client).collect();
    assert_eq!(told.len(), 2, "{:?}", io.told);
    assert!(told.contains(&5) && told.contains(&6));
    for (_, msg) in &io.told {
        assert_eq!(*msg, ServerMsg::Redirect { leader: 1, addr: member(1).client.to_string() });
    }
    assert!(io.proposed.is_empty() && io.batches().is_empty());
}

#[test]
fn reads_skip_the_log_and_wait_for_their_index_to_be_applied() {
    let config = config(1);
    let (mut p, mut io) = replica(&config, 1);
    lead(&mut p, &mut io);
    let last = p.view().last_index;
    // Nothing applied yet: the read's round answers at once (one voter),
    // but the read waits for the log up to the round's index.
    p.set_applied(0);
    p.request(read(7, 1, 0));
    p.turn(0, &mut io).unwrap();
    assert!(io.reads().is_empty(), "the entries before the read are not applied");
    assert!(p.waits_for_applied(), "the driver must be nudged when the apply loop applies more");
    p.set_applied(last);
    assert_eq!(p.due(5), Some(5), "due at once now");
    p.turn(5, &mut io).unwrap();
    assert_eq!(io.reads(), vec![7], "served without a log entry");
    assert!(!p.waits_for_applied());
    assert_eq!(io.batches().len(), 0, "no entry for the read");
}

/// The times of the reads handed to the apply loop, in order.
fn read_times(io: &Effects) -> Vec<u64> {
    io.applied.iter().filter_map(|a| if let Apply::Reads(_, t) = a { Some(*t) } else { None }).collect()
}

#[test]
fn reads_run_at_the_logs_time_which_a_clock_jumping_back_does_not_move() {
    let config = config(1);
    let (mut p, mut io) = replica(&config, 1);
    lead(&mut p, &mut io);
    let now = 1_700_000_000_000;
    p.set_wall_clock(now);
    let last = p.view().last_index;
    p.set_applied(last);
    p.set_applied_clock(last, 0);

    // The log's time lags the clock: the read waits for an entry of no
    // command, stamped now, and runs once it is applied.
    p.request(read(7, 1, 0));
    p.turn(0, &mut io).unwrap();
    assert!(io.reads().is_empty(), "the read waits for the log's time");
    let tick = p.view().last_index;
    assert_eq!((tick, io.clock_entries), (last + 1, 1), "one entry proposed for it");
    p.set_applied(tick);
    p.turn(1, &mut io).unwrap();
    assert!(io.reads().is_empty(), "until the apply loop says what time its clock reached");
    let entry = io.applied.iter().rev().find_map(|a| match a {
        Apply::Entries(e) => e.iter().find(|e| e.index == tick).cloned(),
        _ => None,
    });
    let entry = entry.expect("the tick is committed");
    let (stamp, commands) = entry_commands(&entry.data).unwrap();
    assert_eq!((stamp.time_ms, commands.len()), (now, 0));
    p.set_applied_clock(tick, now);
    p.turn(2, &mut io).unwrap();
    assert_eq!((io.reads(), read_times(&io)), (vec![7], vec![now]));

    // The clock jumps 20 s back, then a little forward: reads run at the
    // log's time, at once, and it does not go back.
    for (wall, client) in [(now - 20_000, 8), (now + 50, 9)] {
        p.set_wall_clock(wall);
        p.request(read(client, 1, 0));
        p.turn(3, &mut io).unwrap();
        assert_eq!(p.view().last_index, tick, "no entry for a read while the log's time is recent");
        assert_eq!(read_times(&io).last(), Some(&now), "read at {wall}");
    }
    assert_eq!((io.reads(), io.clock_entries), (vec![7, 8, 9], 1));
}

#[test]
fn a_read_after_its_clients_waiting_write_goes_through_the_log_with_it() {
    let config = Config { batch_delay_us: 1_000_000, pipeline: 1, ..config(1) };
    let (mut p, mut io) = replica(&config, 1);
    lead(&mut p, &mut io);
    // The pipeline is full (the leader's entry is not applied): the
    // write waits in the batcher, and the client's read goes with it.
    p.set_applied(0);
    p.request(request(8, 1, 0));
    p.request(read(8, 2, 0));
    p.turn(0, &mut io).unwrap();
    assert!(io.proposed.is_empty(), "the pipeline is full");
    p.set_applied(p.view().last_index);
    p.turn(1, &mut io).unwrap();
    assert_eq!(io.proposed, vec![2], "the read went into the entry, after the write");
    assert!(io.reads().is_empty());
}

#[test]
fn what_a_request_holds_is_given_back_once_it_is_proposed() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    struct Held(Arc<AtomicUsize>);
    impl Drop for Held {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    let config = config(1);
    let (mut p, mut io) = replica(&config, 1);
    lead(&mut p, &mut io);
    let back = Arc::new(AtomicUsize::new(0));
    let mut r = request(5, 1, 0);
    r.held = Lease::new(Held(back.clone()));
    p.request(r);
    assert_eq!(back.load(Ordering::SeqCst), 0);
    p.turn(0, &mut io).unwrap();
    assert_eq!(back.load(Ordering::SeqCst), 1);
}

#[test]
fn a_forged_message_is_refused_and_never_reaches_raft() {
    let config = config(3);
    let (mut p, mut io) = replica(&config, 1);
    // A heartbeat that commits beyond this replica's log (3 entries).
    let mut forged = Message { to: 1, from: 2, term: 5, commit: 1_000, ..Default::default() };
    forged.set_msg_type(MessageType::MsgHeartbeat);
    p.step(forged, &mut io).unwrap();
    assert_eq!(io.refused.len(), 1, "{:?}", io.refused);
    assert!(io.refused[0].contains("commit"), "{:?}", io.refused);
    assert_eq!(p.view().term, 1, "raft did not see it");
}

#[test]
fn a_lone_leader_adds_a_learner_and_answers_when_it_is_a_voter() {
    let config = config(1);
    let (mut p, mut io) = replica(&config, 1);
    lead(&mut p, &mut io);
    let m = member(2);
    let add = MemberChange::Add { id: 2, client: m.client.to_string(), peer: m.peer.to_string() };
    p.admin(7, add, &mut io).unwrap();
    p.turn(0, &mut io).unwrap();
    assert!(p.membership().contains(2) && !p.membership().is_voter(2), "a learner first");
    assert!(io.answers.is_empty(), "not a voter yet");
    assert!(io.peers.last().unwrap().contains_key(&2), "a link to the learner");
    // A second change waits for the first.
    p.admin(8, MemberChange::Remove { id: 2 }, &mut io).unwrap();
    assert!(matches!(&io.answers[..], [(8, ServerMsg::Error(why))] if why.contains("another membership change")));
    // The learner catches up: its acknowledgement of the whole log.
    let last = p.view().last_index;
    let mut ack = Message { to: 1, from: 2, term: p.view().term, index: last, ..Default::default() };
    ack.set_msg_type(MessageType::MsgAppendResponse);
    p.step(ack, &mut io).unwrap();
    p.turn(0, &mut io).unwrap();
    // Promoted: the voter entry needs the new voter's acknowledgement too.
    let mut ack = Message { to: 1, from: 2, term: p.view().term, index: p.view().last_index, ..Default::default() };
    ack.set_msg_type(MessageType::MsgAppendResponse);
    p.step(ack, &mut io).unwrap();
    p.turn(0, &mut io).unwrap();
    assert!(p.membership().is_voter(2), "{:?}", p.membership().info());
    assert!(matches!(io.answers.last(), Some((7, ServerMsg::Members(m))) if m.len() == 2), "{:?}", io.answers);
}

#[test]
fn an_apply_loop_that_is_gone_stops_the_protocol() {
    let config = config(1);
    let (mut p, mut io) = replica(&config, 1);
    io.apply_gone = true;
    let mut stop = None;
    for _ in 0..100 {
        p.tick().unwrap();
        if let Err(s) = p.turn(0, &mut io) {
            stop = Some(s);
            break;
        }
    }
    assert!(matches!(&stop, Some(Stop::Failed(why)) if why.contains("apply loop")), "{stop:?}");
}

#[test]
fn a_snapshot_taken_here_compacts_the_log_behind_it() {
    let config = Config { snapshot_every: 2, ..config(1) };
    let (mut p, mut io) = replica(&config, 1);
    lead(&mut p, &mut io);
    for seq in 1..=4 {
        p.request(request(5, seq, 0));
        p.turn(0, &mut io).unwrap();
    }
    let last = p.view().last_index;
    take_snapshot(&mut p, last, &[]);
    use raft::Storage;
    assert_eq!(p.store().first_index().unwrap(), last - 2, "the slack (snapshot_every entries) stays");
    assert_eq!(p.store().kept().unwrap().get_metadata().index, last);
}

/// Takes a snapshot at `index` of `p` (a state of `service` bytes), as
/// the apply loop and the snapshot pool do, and compacts the log.
fn take_snapshot(p: &mut Protocol<MemStore>, index: u64, service: &[u8]) -> raft::prelude::Snapshot {
    // The apply loop applied what it snapshots, and says so first.
    p.set_applied_clock(index, 0);
    let term = raft::Storage::term(p.store(), index).unwrap();
    let members = p.membership().encode();
    let mut w = FileWriter::new(p.store().snapshot_writer().unwrap(), index, term).unwrap();
    // An empty reply cache (no clients), the clock at 0.
    psmr_core::state::put_front(&mut w, &members, &0u32.to_le_bytes(), 0).unwrap();
    w.write_all(service).unwrap();
    let (sink, id) = w.finish().unwrap();
    sink.finish().unwrap();
    let snap = psmr_core::state::raft_snapshot(id, members, p.membership().conf_state());
    assert!(p.store().persist(&snap).unwrap());
    p.snapshot_persisted(snap.clone());
    snap
}

/// A message on its way between replicas stepped by hand.
enum Packet {
    Raft(Message),
    Snap { from: u64, to: u64, msg: SnapMsg },
}

/// What the network does to a snapshot message on its way: passes it
/// (true), perhaps changed, or drops it.
type SnapFault = Box<dyn FnMut(u64, u64, &mut SnapMsg) -> bool>;

/// Three replicas stepped by hand, messages delivered in order.
struct Three {
    config: Config,
    replicas: Vec<(Protocol<MemStore>, Effects)>,
    net: VecDeque<Packet>,
    /// A replica cut off from the others.
    isolated: Option<u64>,
    snap_fault: Option<SnapFault>,
    now_ns: u64,
}

impl Three {
    fn new() -> Self {
        Self::with(config(3))
    }

    fn with(config: Config) -> Self {
        let replicas = (1..=3).map(|id| replica(&config, id)).collect();
        Self { config, replicas, net: VecDeque::new(), isolated: None, snap_fault: None, now_ns: 0 }
    }

    /// Delivers what is in flight and ticks, `rounds` times; a round is
    /// 100 ms on the protocols' clock.
    fn run(&mut self, rounds: usize) {
        for round in 0..rounds {
            self.now_ns += 100_000_000;
            for i in 0..self.replicas.len() {
                let (p, io) = &mut self.replicas[i];
                if round % 3 == 0 {
                    p.tick().unwrap();
                }
                p.turn(self.now_ns, io).unwrap();
                self.collect(i);
            }
            while let Some(packet) = self.net.pop_front() {
                self.deliver(packet);
            }
        }
    }

    fn collect(&mut self, i: usize) {
        let io = &mut self.replicas[i].1;
        let from = i as u64 + 1;
        self.net.extend(io.sent.drain(..).map(Packet::Raft));
        self.net.extend(io.snap_sent.drain(..).map(|(to, msg)| Packet::Snap { from, to, msg }));
    }

    fn deliver(&mut self, packet: Packet) {
        let (from, to) = match &packet {
            Packet::Raft(m) => (m.from, m.to),
            Packet::Snap { from, to, .. } => (*from, *to),
        };
        if self.isolated.is_some_and(|x| x == from || x == to) {
            return;
        }
        let i = (to - 1) as usize;
        match packet {
            Packet::Raft(m) => {
                let (p, io) = &mut self.replicas[i];
                p.step(m, io).unwrap();
            }
            Packet::Snap { from, mut msg, .. } => {
                if let Some(fault) = self.snap_fault.as_mut() {
                    if !fault(from, to, &mut msg) {
                        return;
                    }
                }
                let (p, io) = &mut self.replicas[i];
                p.snapshot_msg(from, msg, self.now_ns, io).unwrap();
            }
        }
        let (p, io) = &mut self.replicas[i];
        p.turn(self.now_ns, io).unwrap();
        self.collect(i);
    }

    /// Restarts replica `i` over what its store holds.
    fn restart(&mut self, i: usize) {
        let id = i as u64 + 1;
        let store = self.replicas[i].0.store().clone();
        let mut p = Protocol::new(&self.config, id, store, Options::new(id + 100).quiet()).unwrap();
        let mut io = Effects::default();
        p.start(&mut io);
        self.replicas[i] = (p, io);
    }

    fn leader(&self) -> usize {
        self.replicas.iter().position(|(p, _)| p.view().is_leader()).expect("a leader")
    }
}

#[test]
fn three_replicas_agree_on_the_entries_they_apply() {
    let mut c = Three::new();
    c.run(60);
    let leader = c.replicas.iter().position(|(p, _)| p.view().is_leader()).expect("a leader");
    for seq in 1..=5 {
        c.replicas[leader].0.request(request(9, seq, 0));
        c.run(2);
    }
    c.run(10);
    let batches: Vec<Vec<Vec<u8>>> =
        c.replicas.iter().map(|(_, io)| io.batches().iter().map(|e| e.data.to_vec()).collect()).collect();
    assert!(!batches[0].is_empty());
    assert_eq!(batches[0], batches[1]);
    assert_eq!(batches[1], batches[2]);
    for (p, io) in &c.replicas {
        assert!(io.refused.is_empty(), "replica {} refused honest messages: {:?}", p.view().leader, io.refused);
    }
}

fn pre_vote(from: u64, term: u64, log: (u64, u64)) -> Message {
    let mut m = Message { to: 2, from, term, log_term: log.0, index: log.1, ..Default::default() };
    m.set_msg_type(MessageType::MsgRequestPreVote);
    m
}

/// A repaired replica never campaigns below its floor, but its leader's
/// lease runs out as its peers' does: it then votes again, for a log that
/// reaches its floor only.
#[test]
fn a_repaired_replica_votes_again_once_its_leaders_lease_runs_out() {
    let config = config(3);
    let store = MemStore::default();
    found(&store, &config.replicas).unwrap();
    let hs = raft::prelude::HardState { term: 2, ..Default::default() };
    store.append(&[], Some(&hs)).unwrap();
    let mut p = Protocol::new(&config, 2, store.with_vote_floor((2, 10)), Options::new(2).quiet()).unwrap();
    let mut io = Effects::default();
    p.start(&mut io);
    assert!(p.view().repaired);
    let mut heartbeat = Message { to: 2, from: 1, term: 2, ..Default::default() };
    heartbeat.set_msg_type(MessageType::MsgHeartbeat);
    p.step(heartbeat, &mut io).unwrap();
    p.turn(0, &mut io).unwrap();
    io.sent.clear();
    let granted =
        |io: &Effects| io.sent.iter().any(|m| m.get_msg_type() == MessageType::MsgRequestPreVoteResponse && !m.reject);
    // Within the lease of leader 1: no vote, even for a long enough log.
    p.step(pre_vote(3, 3, (2, 12)), &mut io).unwrap();
    p.turn(0, &mut io).unwrap();
    assert!(!granted(&io), "{:?}", io.sent);
    for _ in 0..config.election_ticks * 3 {
        p.tick().unwrap();
        p.turn(0, &mut io).unwrap();
    }
    let campaigns = io.sent.iter().filter(|m| m.get_msg_type() == MessageType::MsgRequestPreVote).count();
    assert_eq!(campaigns, 0, "no campaign below the floor");
    // The lease ran out: a log behind the floor is refused by the guard, one
    // that reaches it gets the vote.
    p.step(pre_vote(3, 3, (2, 5)), &mut io).unwrap();
    assert!(io.refused.iter().any(|r| r.contains("floor")), "{:?}", io.refused);
    p.step(pre_vote(3, 3, (2, 12)), &mut io).unwrap();
    p.turn(0, &mut io).unwrap();
    assert!(granted(&io), "{:?}", io.sent);
}

// ----- snapshot transfers -----

fn transfer_config(chunk: usize) -> Config {
    Config {
        snapshot_chunk_bytes: chunk,
        snapshot_window_chunks: 3,
        snapshot_sync_bytes: 2 * chunk as u64,
        snapshot_every: 1,
        snapshot_stall_ms: 5_000,
        ..config(3)
    }
}

/// The bytes of a file a store keeps.
fn file_bytes(file: &dyn SnapshotFile) -> Vec<u8> {
    let mut bytes = vec![0; file.len() as usize];
    assert_eq!(file.read_at(0, &mut bytes).unwrap(), bytes.len());
    bytes
}

/// Three replicas, of which one (returned) was cut off while the leader
/// committed and took a snapshot of `state` bytes, compacting its log
/// past what the cut off one holds; the bytes of the snapshot's file.
fn behind(config: Config, state: &[u8]) -> (Three, usize, Vec<u8>) {
    let mut c = Three::with(config);
    c.run(60);
    let l = c.leader();
    let f = (l + 1) % 3;
    c.isolated = Some(f as u64 + 1);
    for seq in 1..=5 {
        c.replicas[l].0.request(request(9, seq, 0));
        c.run(2);
    }
    let p = &mut c.replicas[l].0;
    let snap = take_snapshot(p, p.view().commit, state);
    let id = descriptor_id(&snap).unwrap();
    let bytes = file_bytes(&*p.store().open_snapshot(&id).unwrap());
    c.isolated = None;
    (c, f, bytes)
}

/// The file of the snapshot replica `i` handed its apply loop, if any.
fn restored(c: &Three, i: usize) -> Option<Vec<u8>> {
    c.replicas[i].1.applied.iter().find_map(|a| match a {
        Apply::Snapshot(_, file) => Some(file_bytes(&**file)),
        _ => None,
    })
}

/// Runs until replica `f` restored a snapshot; its file.
fn until_restored(c: &mut Three, f: usize) -> Vec<u8> {
    for _ in 0..400 {
        if let Some(bytes) = restored(c, f) {
            return bytes;
        }
        c.run(1);
    }
    let transfers: Vec<_> = c.replicas.iter().map(|(p, _)| p.transfers()).collect();
    let io = &c.replicas[f].1;
    panic!("replica {} never restored a snapshot: {transfers:?} {:?} {:?}", f + 1, io.refused, io.snap_refused);
}

/// Counts the chunks delivered (and their offsets); once `cut_at` of
/// them passed, the lane is blocked (every snapshot message dropped)
/// until the test unblocks it.
#[derive(Clone)]
struct Lane {
    offsets: Rc<RefCell<Vec<u64>>>,
    blocked: Rc<Cell<bool>>,
    /// Cut once, then `usize::MAX`.
    cut_at: Rc<Cell<usize>>,
}

impl Lane {
    fn cut_at(chunks: usize) -> Self {
        Self { offsets: Rc::default(), blocked: Rc::default(), cut_at: Rc::new(Cell::new(chunks)) }
    }

    fn open() -> Self {
        Self::cut_at(usize::MAX)
    }

    fn fault(&self) -> SnapFault {
        let lane = self.clone();
        Box::new(move |_, _, msg| {
            if lane.blocked.get() {
                return false;
            }
            if let SnapMsg::Chunk { offset, .. } = msg {
                if lane.chunks() == lane.cut_at.get() {
                    lane.cut_at.set(usize::MAX);
                    lane.blocked.set(true);
                    return false;
                }
                lane.offsets.borrow_mut().push(*offset);
            }
            true
        })
    }

    /// Runs `c` until the lane is cut.
    fn run_to_cut(&self, c: &mut Three) {
        for _ in 0..100 {
            if self.blocked.get() {
                return;
            }
            c.run(1);
        }
        panic!("the lane was never cut");
    }

    fn chunks(&self) -> usize {
        self.offsets.borrow().len()
    }
}

#[test]
fn a_follower_behind_the_compacted_log_catches_up_from_a_snapshot_in_chunks() {
    let (mut c, f, bytes) = behind(transfer_config(100), &[7; 2_000]);
    let lane = Lane::open();
    c.snap_fault = Some(lane.fault());
    assert_eq!(until_restored(&mut c, f), bytes);
    assert!(lane.chunks() >= bytes.len() / 100, "{} chunks for {} bytes", lane.chunks(), bytes.len());
    let l = c.leader();
    assert_eq!(c.replicas[f].0.store().kept(), c.replicas[l].0.store().kept(), "kept as the leader keeps it");
    c.run(10);
    assert!(c.replicas[l].0.transfers().is_empty() && c.replicas[f].0.transfers().is_empty());
    assert_eq!(c.replicas[f].0.view().commit, c.replicas[l].0.view().commit);
    for (p, io) in &c.replicas {
        assert!(
            io.refused.is_empty() && io.snap_refused.is_empty(),
            "replica {}: {:?} {:?}",
            p.view().leader,
            io.refused,
            io.snap_refused
        );
    }
}

#[test]
fn a_transfer_cut_at_any_chunk_resumes_where_the_follower_is() {
    let chunks = behind(transfer_config(100), &[7; 1_000]).2.len().div_ceil(100);
    for cut in 0..chunks {
        let (mut c, f, bytes) = behind(transfer_config(100), &[7; 1_000]);
        let lane = Lane::cut_at(cut);
        c.snap_fault = Some(lane.fault());
        lane.run_to_cut(&mut c);
        c.run(20);
        lane.blocked.set(false);
        assert_eq!(until_restored(&mut c, f), bytes, "cut after {cut} chunks");
        let resumed = lane.offsets.borrow()[cut];
        assert_eq!(resumed, cut as u64 * 100, "cut after {cut} chunks");
    }
}

#[test]
fn a_follower_restarted_mid_transfer_resumes_from_the_whole_pieces_it_kept() {
    let piece = psmr_core::snapfile::PIECE_BYTES;
    let (mut c, f, bytes) = behind(transfer_config(64 << 10), &vec![3; 2 * piece + 1000]);
    let lane = Lane::cut_at(6);
    c.snap_fault = Some(lane.fault());
    lane.run_to_cut(&mut c);
    c.restart(f);
    c.run(3);
    lane.blocked.set(false);
    assert_eq!(until_restored(&mut c, f), bytes);
    let resumed = lane.offsets.borrow()[6];
    let whole = psmr_core::snapfile::HEADER_BYTES + 8 + piece as u64;
    assert_eq!(resumed, whole, "from the end of the first whole piece");
}

#[test]
fn damaged_and_misplaced_chunks_are_refused_and_the_transfer_goes_on() {
    let (mut c, f, bytes) = behind(transfer_config(100), &[7; 2_000]);
    let seen = Rc::new(Cell::new(0));
    let held: Rc<RefCell<Option<Packet>>> = Rc::default();
    let (s, h) = (seen.clone(), held.clone());
    c.snap_fault = Some(Box::new(move |from, to, msg| {
        let SnapMsg::Chunk { data, .. } = msg else { return true };
        s.set(s.get() + 1);
        match s.get() {
            3 => data[5] ^= 1,
            6 => {
                *h.borrow_mut() = Some(Packet::Snap { from, to, msg: msg.clone() });
                return false;
            }
            _ => {}
        }
        true
    }));
    while held.borrow().is_none() {
        c.run(1);
    }
    c.run(2);
    let late = held.borrow_mut().take().unwrap();
    c.net.push_back(late);
    assert_eq!(until_restored(&mut c, f), bytes);
    let refused = &c.replicas[f].1.snap_refused;
    assert!(refused.iter().any(|r| r.contains("damaged")), "{refused:?}");
}

#[test]
fn chunks_nobody_offered_and_snapshots_on_the_raft_lane_are_refused() {
    let config = transfer_config(100);
    let (mut p, mut io) = replica(&config, 2);
    let (_, id) = FileWriter::new(Vec::new(), 50, 3).unwrap().finish().unwrap();
    p.snapshot_msg(1, SnapMsg::chunk(id, 0, vec![1; 10]), 0, &mut io).unwrap();
    assert_eq!(io.snap_refused.len(), 1, "{:?}", io.snap_refused);
    assert!(matches!(&io.snap_sent[..], [(1, SnapMsg::Refuse { .. })]), "{:?}", io.snap_sent);
    let mut m = Message { to: 2, from: 1, term: 5, ..Default::default() };
    m.set_msg_type(MessageType::MsgSnapshot);
    p.step(m, &mut io).unwrap();
    assert!(io.refused.iter().any(|r| r.contains("snapshot lane")), "{:?}", io.refused);
    assert!(p.store().receiving().is_none() && p.store().kept().is_none(), "nothing stored");
}

#[test]
fn a_leader_change_mid_transfer_leaves_the_follower_whole() {
    let (mut c, f, _) = behind(transfer_config(100), &[7; 2_000]);
    let lane = Lane::cut_at(4);
    c.snap_fault = Some(lane.fault());
    lane.run_to_cut(&mut c);
    lane.blocked.set(false);
    let old = c.leader();
    c.isolated = Some(old as u64 + 1);
    let mut new = old;
    for _ in 0..300 {
        c.run(1);
        new = c.replicas.iter().position(|(p, _)| p.view().is_leader()).filter(|&i| i != old).unwrap_or(old);
        if new != old {
            break;
        }
    }
    assert_ne!(new, old, "a new leader");
    c.replicas[new].0.request(request(9, 100, 0));
    c.run(20);
    assert_eq!(c.replicas[f].0.view().commit, c.replicas[new].0.view().commit, "caught up under the new leader");
    c.isolated = None;
    c.run(40);
    assert!(c.replicas[old].0.transfers().iter().all(|t| !t.sending), "the old leader dropped its transfer");
}

/// A service whose snapshots are of a format this build cannot read.
struct Newer;

impl psmr_model::Service for Newer {
    type Op = ();
    type Reply = ();

    fn execute(&self, _: &psmr_model::Command<()>) {}

    fn snapshot(&self) -> Vec<u8> {
        Vec::new()
    }

    fn restore(&self, _: &[u8]) -> Result<(), psmr_model::snapshot::SnapshotError> {
        Ok(())
    }

    fn check_snapshot(&self, _: &mut dyn std::io::Read) -> Result<(), psmr_model::snapshot::SnapshotError> {
        Err(psmr_model::snapshot::SnapshotError::Malformed("version 9 is newer than this build".into()))
    }
}

#[test]
fn a_snapshot_the_service_cannot_read_is_refused_and_nothing_is_kept() {
    let (mut c, f, _) = behind(transfer_config(100), &[7; 1_000]);
    let id = f as u64 + 1;
    let (store, kept) = (c.replicas[f].0.store().clone(), c.replicas[f].0.store().kept());
    let options = Options::new(id + 100).quiet().checked_by(std::sync::Arc::new(Newer));
    let mut p = Protocol::new(&c.config, id, store, options).unwrap();
    let mut io = Effects::default();
    p.start(&mut io);
    c.replicas[f] = (p, io);
    let told: Rc<RefCell<Vec<String>>> = Rc::default();
    let t = told.clone();
    c.snap_fault = Some(Box::new(move |from, _, msg| {
        if let (true, SnapMsg::Refuse { why, .. }) = (from == id, &msg) {
            t.borrow_mut().push(why.clone());
        }
        true
    }));
    c.run(60);
    let (p, io) = &c.replicas[f];
    assert!(restored(&c, f).is_none(), "nothing handed to the apply loop");
    assert_eq!(p.store().kept(), kept, "the snapshot kept is the one it had");
    assert!(p.store().receiving().is_none_or(|(_, bytes)| bytes == 0), "the partial file is dropped");
    assert!(io.snap_refused.iter().any(|r| r.contains("version 9 is newer")), "{:?}", io.snap_refused);
    let told = told.borrow();
    assert!(told.iter().any(|w| w.contains("cannot be restored")), "the leader is told why: {told:?}");
}

/// A snapshot taken while another is being sent keeps the log from the
/// one being sent: the follower then catches up from the log after it
/// restores, instead of being sent the newer snapshot too (and, were
/// snapshots taken faster than one is sent and restored, for ever).
#[test]
fn a_new_snapshot_keeps_the_log_a_follower_being_sent_one_needs() {
    let (mut c, f, _) = behind(transfer_config(100), &[7; 2_000]);
    let lane = Lane::cut_at(3);
    c.snap_fault = Some(lane.fault());
    lane.run_to_cut(&mut c);
    let l = c.leader();
    let sent = c.replicas[l].0.transfers().into_iter().find(|t| t.sending).expect("a transfer under way").id.index;
    for seq in 6..=10 {
        // Applied as committed: the pipeline lets the next entries go.
        for (p, _) in c.replicas.iter_mut() {
            let commit = p.view().commit;
            p.set_applied(commit);
        }
        let now = c.now_ns;
        c.replicas[l].0.request(request(9, seq, now));
        c.run(2);
    }
    let p = &mut c.replicas[l].0;
    let newer = take_snapshot(p, p.view().commit, &[8; 2_000]).get_metadata().index;
    assert!(newer > sent + 1, "a newer snapshot ({newer} after {sent})");
    let first = raft::Storage::first_index(p.store()).unwrap();
    assert!(first <= sent + 1, "the log from {} is kept, not from {first}", sent + 1);
    lane.blocked.set(false);
    until_restored(&mut c, f);
    c.run(20);
    assert_eq!(c.replicas[f].0.view().commit, c.replicas[l].0.view().commit, "caught up from the log");
    let restores = c.replicas[f].1.applied.iter().filter(|a| matches!(a, Apply::Snapshot(..))).count();
    assert_eq!(restores, 1, "one snapshot, then the log");
}

#[test]
fn stamps_follow_the_wall_clock_but_never_go_back_even_after_a_restart() {
    let config = config(1);
    let (mut p, mut io) = replica(&config, 1);
    lead(&mut p, &mut io);
    let propose = |p: &mut Protocol<MemStore>, io: &mut Effects, wall: u64, seq: u64| {
        p.set_wall_clock(wall);
        p.request(request(5, seq, 0));
        p.turn(0, io).unwrap();
        psmr_core::entry::entry_stamp(&io.batches().last().unwrap().data)
    };
    let first = propose(&mut p, &mut io, 10_000, 1);
    assert_eq!(first.time_ms, 10_000);
    let behind = propose(&mut p, &mut io, 3_000, 2);
    assert_eq!(behind.time_ms, 10_000, "the clock went back, the stamp does not");
    assert_ne!(first.seed, behind.seed, "every entry has a seed of its own");
    assert_eq!(propose(&mut p, &mut io, 12_000, 3).time_ms, 12_000);
    // Restarted over the same log with a clock far behind: the stamp of
    // its first proposal comes from the log.
    let store = p.store().clone();
    drop(p);
    let mut p = Protocol::new(&config, 1, store, Options::new(1).quiet()).unwrap();
    let mut io = Effects::default();
    p.start(&mut io);
    lead(&mut p, &mut io);
    assert_eq!(propose(&mut p, &mut io, 1_000, 4).time_ms, 12_000);
}
