//! The protocol stepped by hand: no thread, no socket, no clock but the
//! one the test passes. A small "network" moves raft messages between
//! protocols; every effect is recorded and looked at.

use psmr_core::config::{Config, Member};
use psmr_core::entry::{encode_command, entry_commands};
use psmr_core::guard::Refusal;
use psmr_core::membership::Membership;
use psmr_core::protocol::{Apply, Options, Protocol, ProtocolIo, Stop};
use psmr_core::request::{Lease, Request};
use psmr_core::store::{found, MemStore, Store};
use psmr_model::wire::{MemberChange, ServerMsg};
use raft::prelude::{Entry, EntryType, Message, MessageType};
use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;

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
    /// `apply` answers false: the apply loop is gone.
    apply_gone: bool,
}

impl ProtocolIo for Effects {
    fn send(&mut self, msg: Message) -> bool {
        self.sent.push(msg);
        true
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
            Apply::Reads(r) => Some(r.iter().map(|r| r.client).collect::<Vec<_>>()),
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
    let commands = entry_commands(&batches.last().unwrap().data).unwrap();
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
    let mut snap = raft::prelude::Snapshot::default();
    let members = p.membership().clone();
    snap.data = psmr_core::state::encode(last, p.view().term, &members.encode(), &[], &[]).into();
    snap.mut_metadata().index = last;
    snap.mut_metadata().term = p.view().term;
    snap.mut_metadata().set_conf_state(members.conf_state());
    assert!(p.store().persist(&snap).unwrap());
    p.snapshot_persisted(snap);
    use raft::Storage;
    assert_eq!(p.store().first_index().unwrap(), last - 2, "the slack (snapshot_every entries) stays");
    assert_eq!(p.store().kept().unwrap().get_metadata().index, last);
}

/// Three replicas stepped by hand, messages delivered in order.
struct Three {
    replicas: Vec<(Protocol<MemStore>, Effects)>,
    net: VecDeque<Message>,
}

impl Three {
    fn new() -> Self {
        let config = config(3);
        Self { replicas: (1..=3).map(|id| replica(&config, id)).collect(), net: VecDeque::new() }
    }

    /// Delivers what is in flight and ticks, `rounds` times.
    fn run(&mut self, rounds: usize) {
        for round in 0..rounds {
            for (p, io) in &mut self.replicas {
                if round % 3 == 0 {
                    p.tick().unwrap();
                }
                p.turn(round as u64 * 1_000_000, io).unwrap();
                self.net.extend(io.sent.drain(..));
            }
            while let Some(m) = self.net.pop_front() {
                let (p, io) = &mut self.replicas[(m.to - 1) as usize];
                p.step(m, io).unwrap();
                p.turn(round as u64 * 1_000_000, io).unwrap();
                self.net.extend(io.sent.drain(..));
            }
        }
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

/// A memory log repaired after it lost entries: a vote floor.
#[derive(Clone)]
struct Repaired(MemStore, (u64, u64));

impl Store for Repaired {
    fn append(&self, entries: &[Entry], hs: Option<&raft::prelude::HardState>) -> raft::Result<()> {
        self.0.append(entries, hs)
    }
    fn set_commit(&self, commit: u64) -> raft::Result<()> {
        self.0.set_commit(commit)
    }
    fn persist(&self, snapshot: &raft::prelude::Snapshot) -> raft::Result<bool> {
        self.0.persist(snapshot)
    }
    fn install(&self, snapshot: raft::prelude::Snapshot, keep_from: u64) -> raft::Result<()> {
        self.0.install(snapshot, keep_from)
    }
    fn apply_snapshot(&self, snapshot: raft::prelude::Snapshot) -> raft::Result<()> {
        self.0.apply_snapshot(snapshot)
    }
    fn kept(&self) -> Option<raft::prelude::Snapshot> {
        self.0.kept()
    }
    fn vote_floor(&self) -> Option<(u64, u64)> {
        Some(self.1)
    }
}

impl raft::Storage for Repaired {
    fn initial_state(&self) -> raft::Result<raft::RaftState> {
        self.0.initial_state()
    }
    fn entries(
        &self,
        low: u64,
        high: u64,
        max: impl Into<Option<u64>>,
        ctx: raft::GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        self.0.entries(low, high, max, ctx)
    }
    fn term(&self, idx: u64) -> raft::Result<u64> {
        self.0.term(idx)
    }
    fn first_index(&self) -> raft::Result<u64> {
        self.0.first_index()
    }
    fn last_index(&self) -> raft::Result<u64> {
        self.0.last_index()
    }
    fn snapshot(&self, request_index: u64, to: u64) -> raft::Result<raft::prelude::Snapshot> {
        self.0.snapshot(request_index, to)
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
    let mut p = Protocol::new(&config, 2, Repaired(store, (2, 10)), Options::new(2).quiet()).unwrap();
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
