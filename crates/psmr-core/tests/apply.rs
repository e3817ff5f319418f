//! The apply loop stepped by hand, with the key-value store executed by
//! the `sequential` scheduler on the test's own thread: every reply, every
//! admission and every snapshot it hands out is looked at.

use parking_lot::Mutex;
use psmr_core::apply::{Applier, ApplyEvent, ApplyIo, Replies, Setup};
use psmr_core::entry::{encode_command, EntryBuilder};
use psmr_core::request::Request;
use psmr_core::snapfile::FileWriter;
use psmr_core::state::{self, Persisted, Taken};
use psmr_core::store::{MemStore, Store};
use psmr_core::{CacheLimits, Config};
use psmr_model::snapshot::{put_bytes, put_u64};
use psmr_model::wire::{OpCodec, Outcome};
use psmr_model::Service;
use psmr_sched::{SchedConfig, SchedulerKind};
use psmr_services::kv::{KvCodec, KvOp, KvReply};
use psmr_services::{KvApp, ServiceConfig};
use raft::prelude::Entry;
use std::sync::Arc;

/// Every answer, by (client, seq).
#[derive(Default)]
struct Answers(Mutex<Vec<(u64, u64, Outcome)>>);

impl Replies for Answers {
    fn answer(&self, client: u64, seq: u64, outcome: &mut dyn FnMut() -> Outcome) {
        self.0.lock().push((client, seq, outcome()));
    }
}

#[derive(Default)]
struct Io {
    applied: Vec<u64>,
    taken: Vec<Taken>,
    admitted: Vec<(u64, u64, u64, bool)>,
    cache_hits: usize,
    busy: bool,
}

impl ApplyIo for Io {
    fn applied(&mut self, index: u64, _clock: u64) {
        self.applied.push(index);
    }

    fn snapshot_busy(&self) -> bool {
        self.busy
    }

    fn snapshot(&mut self, taken: Taken) {
        self.taken.push(taken);
    }

    fn admitted(&mut self, index: u64, client: u64, seq: u64, write: bool) {
        self.admitted.push((index, client, seq, write));
    }

    fn event(&mut self, event: ApplyEvent) {
        if let ApplyEvent::CacheHit = event {
            self.cache_hits += 1;
        }
    }
}

fn applier(snapshot_every: u64) -> (Applier<KvApp>, Arc<KvApp>, Arc<Answers>) {
    applier_by(snapshot_every, u64::MAX)
}

/// An apply loop that snapshots every `snapshot_every` entries or every
/// `bytes` bytes of entries.
fn applier_by(snapshot_every: u64, bytes: u64) -> (Applier<KvApp>, Arc<KvApp>, Arc<Answers>) {
    let app = Arc::new(KvApp::new(&ServiceConfig::default()).unwrap());
    let answers = Arc::new(Answers::default());
    let setup = Setup {
        app: app.clone(),
        scheduler: SchedConfig::new(SchedulerKind::Sequential, 1),
        cache: CacheLimits::of(&Config::default()),
        snapshot_every,
        snapshot_every_bytes: bytes,
        replies: answers.clone(),
        on_failure: Box::new(|why| panic!("execution failed: {why}")),
    };
    (Applier::new(setup).unwrap(), app, answers)
}

fn put(key: &str, value: &str) -> Vec<u8> {
    KvCodec.encode_op(&KvOp::Put { key: key.into(), value: value.into() })
}

fn get(key: &str) -> Vec<u8> {
    KvCodec.encode_op(&KvOp::Read { key: key.into() })
}

/// An entry at `index` of (client, seq, op) commands.
fn entry(index: u64, commands: &[(u64, u64, Vec<u8>)]) -> Entry {
    let mut b = EntryBuilder::new();
    for (client, seq, op) in commands {
        b.push(*client, *seq, op);
    }
    Entry { index, term: 1, data: b.take().into(), ..Default::default() }
}

fn reply(answers: &Answers, client: u64, seq: u64) -> Vec<KvReply> {
    let decode = |o: &Outcome| match o {
        Outcome::Ok(bytes) => KvCodec.decode_reply(bytes).unwrap(),
        Outcome::Rejected(why) => panic!("rejected: {why}"),
    };
    answers.0.lock().iter().filter(|(c, s, _)| (*c, *s) == (client, seq)).map(|(_, _, o)| decode(o)).collect()
}

#[test]
fn entries_execute_in_log_order_and_a_retry_is_answered_from_the_cache() {
    let (mut a, app, answers) = applier(1_000);
    let mut io = Io::default();
    let first = entry(1, &[(1, 1, put("k", "v1")), (2, 1, get("k"))]);
    a.entries(vec![first], &mut io).unwrap();
    assert_eq!(reply(&answers, 1, 1), vec![KvReply::Done(false)]);
    assert_eq!(reply(&answers, 2, 1), vec![KvReply::Value(Some(b"v1".to_vec()))], "after the write, in log order");
    assert_eq!(io.applied, vec![1]);
    assert_eq!(io.admitted, vec![(1, 1, 1, true), (1, 2, 1, false)]);
    // The same write again, at a later index (a retry after a leader
    // change): answered from the cache, not executed again.
    let digest = app.digest();
    a.entries(vec![entry(2, &[(1, 1, put("k", "v1"))])], &mut io).unwrap();
    assert_eq!(reply(&answers, 1, 1), vec![KvReply::Done(false), KvReply::Done(false)]);
    assert_eq!(io.cache_hits, 1);
    assert_eq!(io.admitted.len(), 2, "not admitted again");
    assert_eq!(app.digest(), digest);
}

#[test]
fn an_operation_that_does_not_decode_is_refused_everywhere_alike() {
    let (mut a, _, answers) = applier(1_000);
    let mut io = Io::default();
    a.entries(vec![entry(1, &[(3, 1, vec![0xff, 0xff])])], &mut io).unwrap();
    let got = answers.0.lock().clone();
    assert!(matches!(&got[..], [(3, 1, Outcome::Rejected(why))] if why.contains("bad operation")), "{got:?}");
    assert!(io.admitted.is_empty());
    assert_eq!(io.applied, vec![1], "the index is applied all the same");
}

#[test]
fn reads_without_the_log_execute_after_what_was_applied_and_change_nothing() {
    let (mut a, app, answers) = applier(1_000);
    let mut io = Io::default();
    a.entries(vec![entry(1, &[(1, 1, put("k", "v1"))])], &mut io).unwrap();
    let digest = app.digest();
    let mut encoded = Vec::new();
    encode_command(&mut encoded, 4, 9, &get("k"));
    a.reads(vec![Request::new(4, 1, encoded, 1, 0)], 0, &mut io).unwrap();
    assert_eq!(reply(&answers, 4, 9), vec![KvReply::Value(Some(b"v1".to_vec()))]);
    assert_eq!(io.admitted.last(), Some(&(0, 4, 9, false)), "index 0: not the log's");
    assert_eq!(app.digest(), digest);
    assert_eq!(io.applied, vec![1]);
}

#[test]
fn a_snapshot_is_frozen_every_so_many_entries_and_restores_elsewhere() {
    let (mut a, app, _) = applier(3);
    let mut io = Io::default();
    for i in 1..=3 {
        a.entries(vec![entry(i, &[(1, i, put(&format!("k{i}"), "v"))])], &mut io).unwrap();
    }
    assert_eq!(io.taken.len(), 1, "one snapshot after 3 entries");
    assert_eq!(io.taken[0].index, 3);
    // Postponed while the last one is still being written.
    io.busy = true;
    for i in 4..=6 {
        a.entries(vec![entry(i, &[(1, i, put(&format!("k{i}"), "v"))])], &mut io).unwrap();
    }
    assert_eq!(io.taken.len(), 1);
    // Written to a store, then restored by another apply loop.
    let store = MemStore::default();
    let taken = io.taken.remove(0);
    let Ok(Persisted::Kept(snap, bytes)) = state::persist(taken, &store) else { panic!("not kept") };
    assert!(bytes > 0 && store.kept().is_some(), "persisted, the log compacted once the protocol installs it");
    let (mut b, other, answers) = applier(1_000);
    let mut io = Io::default();
    b.restore(state::open_kept(&store, &snap).unwrap(), &mut io).unwrap();
    assert_eq!(io.applied, vec![3]);
    assert_eq!(b.applied(), 3);
    // The state of index 3, with its reply cache: the write of index 2
    // retried is answered, not executed.
    let (mut c, _, _) = applier(1_000);
    let mut cio = Io::default();
    for i in 1..=3 {
        c.entries(vec![entry(i, &[(1, i, put(&format!("k{i}"), "v"))])], &mut cio).unwrap();
    }
    assert_eq!(other.digest(), c.status().unwrap().1());
    b.entries(vec![entry(4, &[(1, 2, put("k2", "v"))])], &mut io).unwrap();
    assert_eq!(io.cache_hits, 1);
    assert_eq!(reply(&answers, 1, 2), vec![KvReply::Done(false)]);
    drop(app);
}

#[test]
fn a_snapshot_that_does_not_decode_changes_nothing() {
    let (mut a, app, _) = applier(1_000);
    let mut io = Io::default();
    a.entries(vec![entry(1, &[(1, 1, put("k", "v"))])], &mut io).unwrap();
    let digest = app.digest();
    let mut snap = raft::prelude::Snapshot { data: vec![1, 2, 3].into(), ..Default::default() };
    snap.mut_metadata().index = 9;
    let e = state::open_kept(&MemStore::default(), &snap).err().expect("no descriptor");
    assert!(e.contains("snapshot at 9"), "{e}");
    // A whole file whose membership does not decode.
    let mut w = FileWriter::new(Vec::new(), 9, 2).unwrap();
    put_bytes(&mut w, &[0xff; 5]).unwrap();
    put_bytes(&mut w, &[]).unwrap();
    put_u64(&mut w, 0).unwrap();
    let (bytes, id) = w.finish().unwrap();
    let snap = state::raft_snapshot(id, Vec::new(), Default::default());
    let opened = state::open(&snap, Box::new(bytes)).unwrap();
    let e = a.restore(opened, &mut io).unwrap_err();
    assert!(e.contains("snapshot at index 9"), "{e}");
    assert_eq!((app.digest(), a.applied()), (digest, 1));
}

#[test]
fn a_snapshot_is_frozen_every_so_many_bytes_of_entries_too() {
    let (mut a, _, _) = applier_by(1_000_000, 300);
    let mut io = Io::default();
    let big = "v".repeat(100);
    for i in 1..=8 {
        a.entries(vec![entry(i, &[(1, i, put(&format!("k{i}"), &big))])], &mut io).unwrap();
    }
    let taken: Vec<u64> = io.taken.iter().map(|t| t.index).collect();
    assert!(!taken.is_empty() && taken.len() < 8, "by bytes, not by entries: {taken:?}");
    assert!(taken.windows(2).all(|w| w[1] - w[0] >= 2), "{taken:?}");
}

/// An entry at `index` of (client, seq, op) commands, stamped at `ms`.
fn stamped(index: u64, ms: u64, commands: &[(u64, u64, Vec<u8>)]) -> Entry {
    let mut e = entry(index, commands);
    let mut data = e.data.to_vec();
    psmr_core::entry::stamp(&mut data, psmr_model::Stamp { time_ms: ms, seed: 7 });
    e.data = data.into();
    e
}

#[test]
fn time_never_goes_back_and_travels_in_snapshots() {
    let (mut a, _, _) = applier(3);
    let mut io = Io::default();
    a.entries(vec![stamped(1, 5_000, &[(1, 1, put("k", "v"))])], &mut io).unwrap();
    assert_eq!(a.clock(), 5_000);
    // A leader whose clock was behind, and an entry of a build before
    // stamps: both execute at the time already reached.
    a.entries(vec![stamped(2, 4_000, &[(1, 2, put("k", "w"))]), entry(3, &[(1, 3, get("k"))])], &mut io).unwrap();
    assert_eq!(a.clock(), 5_000);
    let taken = io.taken.pop().expect("a snapshot at 3");
    assert_eq!((taken.index, taken.clock), (3, 5_000));
    let store = MemStore::default();
    let Persisted::Kept(snap, _) = state::persist(taken, &store).unwrap() else { panic!("kept") };
    let (mut b, _, _) = applier(1_000);
    b.restore(state::open_kept(&store, &snap).unwrap(), &mut Io::default()).unwrap();
    assert_eq!((b.applied(), b.clock()), (3, 5_000));
    b.entries(vec![stamped(4, 6_000, &[(1, 4, get("k"))])], &mut Io::default()).unwrap();
    assert_eq!(b.clock(), 6_000);
}
