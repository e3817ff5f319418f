use super::*;
use crate::kv::tests::arb_op;
use crate::kv::{Combine, Deadline, ExpireCond, HashCmd, KvModel, ListCmd, SetCmd, ALL};
use proptest::prelude::*;
use psmr_model::{ClassId, ClientId, KeySet, Stamp};

fn cmd(op: KvOp) -> Command<KvOp> {
    Command {
        client: ClientId(1),
        seq: 1,
        class: ClassId(0),
        reads: KeySet::new(),
        writes: KeySet::new(),
        op,
        stamp: Default::default(),
    }
}

fn run(s: &KvService, op: KvOp) -> KvReply {
    s.execute(&cmd(op))
}

fn k(n: u64) -> Vec<u8> {
    key_bytes(n)
}

fn le(x: u64) -> Vec<u8> {
    x.to_le_bytes().to_vec()
}

fn value(s: &KvService, key: &[u8]) -> Option<Vec<u8>> {
    match run(s, KvOp::Read { key: key.to_vec() }) {
        KvReply::Value(v) => v,
        other => panic!("{other:?}"),
    }
}

#[test]
fn crud_semantics() {
    for cost in Cost::ALL {
        let s = KvService::new(4, cost);
        assert_eq!(s.len(), 4);
        assert_eq!(run(&s, KvOp::Read { key: k(3) }), KvReply::Value(Some(le(3))));
        assert_eq!(run(&s, KvOp::Read { key: k(4) }), KvReply::Value(None));
        assert_eq!(run(&s, KvOp::Create { key: k(3), value: vec![9] }), KvReply::Done(false));
        assert_eq!(run(&s, KvOp::Read { key: k(3) }), KvReply::Value(Some(le(3))));
        assert_eq!(run(&s, KvOp::Create { key: k(4), value: vec![9] }), KvReply::Done(true));
        assert_eq!(run(&s, KvOp::Update { key: k(4), value: vec![8] }), KvReply::Done(true));
        assert_eq!(run(&s, KvOp::Read { key: k(4) }), KvReply::Value(Some(vec![8])));
        assert_eq!(run(&s, KvOp::Update { key: k(5), value: vec![8] }), KvReply::Done(false));
        assert_eq!(run(&s, KvOp::Delete { key: k(4) }), KvReply::Done(true));
        assert_eq!(run(&s, KvOp::Delete { key: k(4) }), KvReply::Done(false));
        assert_eq!(run(&s, KvOp::Put { key: k(4), value: vec![7] }), KvReply::Done(false));
        assert_eq!(run(&s, KvOp::Put { key: k(4), value: vec![6] }), KvReply::Done(true));
        assert_eq!(run(&s, KvOp::Read { key: k(4) }), KvReply::Value(Some(vec![6])));
        assert_eq!(s.len(), 5);
    }
}

#[test]
fn keys_are_any_bytes() {
    let s = KvService::new(0, Cost::Light);
    for key in [&b""[..], b"\0", b"\0\0", b"\xff\xfe", b"a b\r\n", &[7u8; 100]] {
        assert_eq!(run(&s, KvOp::Put { key: key.to_vec(), value: key.to_vec() }), KvReply::Done(false), "{key:?}");
    }
    for key in [&b""[..], b"\0", b"\0\0", b"\xff\xfe", b"a b\r\n", &[7u8; 100]] {
        assert_eq!(value(&s, key).as_deref(), Some(key), "{key:?}");
    }
    assert_eq!(s.len(), 6);
}

#[test]
fn set_honours_its_condition_and_get() {
    let s = KvService::new(0, Cost::Light);
    let set = |when, get, v: &str| run(&s, KvOp::Set { key: k(1), value: v.into(), when, get, ttl: Ttl::Clear });
    assert_eq!(set(SetWhen::IfPresent, false, "x"), KvReply::Done(false));
    assert_eq!(value(&s, b"1"), None);
    assert_eq!(set(SetWhen::IfPresent, true, "x"), KvReply::Value(None));
    assert_eq!(value(&s, b"1"), None);
    assert_eq!(set(SetWhen::IfAbsent, false, "a"), KvReply::Done(true));
    assert_eq!(set(SetWhen::IfAbsent, false, "b"), KvReply::Done(false));
    assert_eq!(set(SetWhen::IfAbsent, true, "b"), KvReply::Value(Some(b"a".to_vec())));
    assert_eq!(value(&s, b"1"), Some(b"a".to_vec()));
    assert_eq!(set(SetWhen::IfPresent, true, "c"), KvReply::Value(Some(b"a".to_vec())));
    assert_eq!(set(SetWhen::Always, false, "d"), KvReply::Done(true));
    assert_eq!(set(SetWhen::Always, true, "e"), KvReply::Value(Some(b"d".to_vec())));
    assert_eq!(value(&s, b"1"), Some(b"e".to_vec()));
}

#[test]
fn incr_parses_like_redis_and_refuses_without_changing_anything() {
    let s = KvService::new(1, Cost::Light);
    let incr = |key: &[u8], by| run(&s, KvOp::Incr { key: key.to_vec(), by });
    assert_eq!(incr(b"n", 5), KvReply::Int(5));
    assert_eq!(incr(b"n", -7), KvReply::Int(-2));
    assert_eq!(value(&s, b"n"), Some(b"-2".to_vec()));
    // Key 0 holds eight little-endian bytes, not a decimal.
    assert_eq!(incr(b"0", 1), KvReply::Error(KvError::NotInteger));
    assert_eq!(value(&s, b"0"), Some(le(0)));
    for bad in ["-0", "007", "+1", " 1", "1 ", "", "9223372036854775808", "1.5"] {
        run(&s, KvOp::Put { key: k(9), value: bad.into() });
        assert_eq!(incr(b"9", 1), KvReply::Error(KvError::NotInteger), "{bad:?}");
        assert_eq!(value(&s, b"9"), Some(bad.as_bytes().to_vec()));
    }
    run(&s, KvOp::Put { key: k(9), value: i64::MAX.to_string().into() });
    assert_eq!(incr(b"9", 1), KvReply::Error(KvError::Overflow));
    assert_eq!(incr(b"9", 0), KvReply::Int(i64::MAX));
    run(&s, KvOp::Put { key: k(9), value: i64::MIN.to_string().into() });
    assert_eq!(incr(b"9", -1), KvReply::Error(KvError::Overflow));
    assert_eq!(incr(b"9", i64::MAX), KvReply::Int(-1));
    assert_eq!(value(&s, b"9"), Some(b"-1".to_vec()));
}

#[test]
fn append_strlen_and_the_size_bound() {
    let s = KvService::new(0, Cost::Light);
    assert_eq!(run(&s, KvOp::Strlen { key: k(1) }), KvReply::Int(0));
    assert_eq!(run(&s, KvOp::Append { key: k(1), value: b"ab".to_vec() }), KvReply::Int(2));
    assert_eq!(run(&s, KvOp::Append { key: k(1), value: b"cd".to_vec() }), KvReply::Int(4));
    assert_eq!(run(&s, KvOp::Strlen { key: k(1) }), KvReply::Int(4));
    assert_eq!(value(&s, b"1"), Some(b"abcd".to_vec()));
    let fill = vec![0u8; VALUE_MAX - 4];
    assert_eq!(run(&s, KvOp::Append { key: k(1), value: fill }), KvReply::Int(VALUE_MAX as i64));
    assert_eq!(run(&s, KvOp::Append { key: k(1), value: vec![1] }), KvReply::Error(KvError::TooLarge));
    assert_eq!(run(&s, KvOp::Append { key: k(2), value: vec![1; VALUE_MAX + 1] }), KvReply::Error(KvError::TooLarge));
    assert_eq!(run(&s, KvOp::Strlen { key: k(1) }), KvReply::Int(VALUE_MAX as i64));
    assert_eq!(s.len(), 1);
}

#[test]
fn multi_key_operations_count_as_redis_does() {
    let s = KvService::new(3, Cost::Moderate);
    let keys = |ns: &[u64]| ns.iter().map(|&n| k(n)).collect::<Vec<_>>();
    assert_eq!(run(&s, KvOp::Exists { keys: keys(&[0, 0, 1, 7]) }), KvReply::Int(3));
    assert_eq!(run(&s, KvOp::MGet { keys: keys(&[2, 7, 2]) }), KvReply::Values(vec![Some(le(2)), None, Some(le(2))]));
    let pairs = vec![(k(7), b"x".to_vec()), (k(8), b"y".to_vec()), (k(7), b"z".to_vec())];
    assert_eq!(run(&s, KvOp::MSet { pairs }), KvReply::Done(true));
    assert_eq!(value(&s, b"7"), Some(b"z".to_vec()));
    assert_eq!(run(&s, KvOp::DbSize), KvReply::Int(5));
    assert_eq!(run(&s, KvOp::Del { keys: keys(&[0, 0, 8, 9]) }), KvReply::Int(2));
    assert_eq!(run(&s, KvOp::DbSize), KvReply::Int(3));
    assert_eq!(run(&s, KvOp::FlushDb), KvReply::Done(true));
    assert_eq!(run(&s, KvOp::DbSize), KvReply::Int(0));
    assert!(s.is_empty());
    assert_eq!(s.digest(), KvService::new(0, Cost::Light).digest());
}

#[test]
fn mget_replies_are_bounded() {
    let s = KvService::new(0, Cost::Light);
    run(&s, KvOp::Put { key: k(1), value: vec![0; VALUE_MAX] });
    let n = REPLY_VALUES_MAX / VALUE_MAX;
    let within = run(&s, KvOp::MGet { keys: vec![k(1); n] });
    assert!(matches!(within, KvReply::Values(v) if v.len() == n));
    assert_eq!(run(&s, KvOp::MGet { keys: vec![k(1); n + 1] }), KvReply::Error(KvError::ReplyTooLarge));
}

#[test]
fn digest_depends_on_the_state_only() {
    // The same writes in another order, on stores hashing keys alike or
    // not: the same keys, values and versions.
    let a = KvService::with_hash_seed(0, Cost::Light, 7);
    let b = KvService::new(0, Cost::Heavy);
    for n in 0..10 {
        run(&a, KvOp::Create { key: k(n), value: le(n) });
    }
    for n in (0..10).rev() {
        run(&b, KvOp::Create { key: k(n), value: le(n) });
    }
    assert_eq!(a.digest(), b.digest());
    // A write that leaves the value as it was still changes the version,
    // which `EXEC` compares.
    let c = KvService::new(0, Cost::Light);
    for n in 0..10 {
        run(&c, KvOp::Create { key: k(n), value: le(n) });
    }
    run_as(&c, 2, KvOp::Put { key: k(3), value: le(3) });
    assert_ne!(a.digest(), c.digest());
    run(&b, KvOp::Create { key: k(99), value: vec![] });
    run(&b, KvOp::Delete { key: k(99) });
    assert_eq!(a.digest(), b.digest());
    run(&b, KvOp::Update { key: k(0), value: vec![0] });
    assert_ne!(a.digest(), b.digest());
    // Where the bytes split between key and value counts.
    let c = KvService::new(0, Cost::Light);
    let d = KvService::new(0, Cost::Light);
    run(&c, KvOp::Put { key: b"ab".to_vec(), value: b"c".to_vec() });
    run(&d, KvOp::Put { key: b"a".to_vec(), value: b"bc".to_vec() });
    assert_ne!(c.digest(), d.digest());
}

proptest! {
    /// Snapshot then restore reproduces the state and the bytes; every
    /// strict prefix and any trailing byte is refused, leaving the state.
    #[test]
    fn snapshot_round_trips_and_bad_bytes_change_nothing(
        ops in proptest::collection::vec(arb_op(), 0..40),
        keys in 0u64..10,
    ) {
        let s = KvService::new(keys, Cost::Light);
        for op in ops {
            run(&s, op);
        }
        let snap = s.snapshot();
        let fresh = KvService::new(3, Cost::Moderate);
        fresh.restore(&snap).unwrap();
        prop_assert_eq!(fresh.digest(), s.digest());
        prop_assert_eq!(fresh.snapshot(), snap.clone());
        let other = KvService::new(5, Cost::Light);
        let before = other.digest();
        for cut in 0..snap.len() {
            prop_assert!(matches!(other.restore(&snap[..cut]), Err(SnapshotError::Truncated(_))), "cut {}", cut);
        }
        let mut long = snap;
        long.push(1);
        prop_assert!(matches!(other.restore(&long), Err(SnapshotError::Malformed(_))));
        prop_assert_eq!(other.digest(), before);
    }

    /// A frozen copy encodes the state as it was when frozen, whatever
    /// ran since: the snapshot the state then had.
    #[test]
    fn a_frozen_copy_encodes_the_state_it_was_taken_from(
        before in proptest::collection::vec(arb_op(), 0..40),
        after in proptest::collection::vec(arb_op(), 1..20),
    ) {
        let s = KvService::new(8, Cost::Light);
        for op in before {
            run(&s, op);
        }
        let expected = s.snapshot();
        let frozen = s.freeze();
        for op in after {
            run(&s, op);
        }
        let mut written = Vec::new();
        frozen(&mut written).unwrap();
        prop_assert_eq!(written, expected);
    }

    /// Random bytes never panic and, when refused, change nothing.
    #[test]
    fn garbage_is_refused(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
        let s = KvService::new(3, Cost::Light);
        let before = s.digest();
        if s.restore(&bytes).is_err() {
            prop_assert_eq!(s.digest(), before);
        }
    }

    /// Random operations never panic, and a replica that executes the
    /// same ones ends in the same state with the same replies.
    #[test]
    fn execution_is_deterministic(ops in proptest::collection::vec(arb_op(), 0..40)) {
        let (a, b) = (KvService::new(4, Cost::Light), KvService::new(4, Cost::Moderate));
        for op in ops {
            prop_assert_eq!(run(&a, op.clone()), run(&b, op));
        }
        prop_assert_eq!(a.digest(), b.digest());
        prop_assert_eq!(a.snapshot(), b.snapshot());
    }
}

#[test]
fn restore_refuses_unordered_keys_old_versions_and_other_services() {
    let s = KvService::new(2, Cost::Light);
    let before = s.digest();
    let mut snap = s.snapshot();
    // Entries are key "0" then key "1", each a 4-byte length and one byte
    // followed by an 8-byte value: make both key "1".
    assert_eq!(&snap[14..19], b"\x01\0\0\0\x30");
    snap[18] = b'1';
    assert!(s.restore(&snap).unwrap_err().to_string().contains("\"1\" out of order or repeated"));
    let list = crate::list::ListService::new(1, 1).snapshot();
    assert!(s.restore(&list).unwrap_err().to_string().contains("not a key-value snapshot"));
    let mut huge = s.snapshot();
    huge[6..14].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(s.restore(&huge), Err(SnapshotError::Truncated(_))));
    // A version 1 snapshot of key 0: count 1, key (u64), value.
    let mut v1 = b"PSKV\x01\0".to_vec();
    v1.extend_from_slice(&1u64.to_le_bytes());
    v1.extend_from_slice(&0u64.to_le_bytes());
    v1.extend_from_slice(&8u32.to_le_bytes());
    v1.extend_from_slice(&le(0));
    let e = s.restore(&v1).unwrap_err().to_string();
    assert!(e.contains("version 1 has numeric (u64) keys") && e.contains("version 2"), "{e}");
    assert_eq!(s.digest(), before);
}

/// A source that yields at most `step` bytes a read, so that a decoder
/// sees fields cut at every boundary.
struct Trickle<'a> {
    bytes: &'a [u8],
    step: usize,
}

impl std::io::Read for Trickle<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.step.min(buf.len()).min(self.bytes.len());
        buf[..n].copy_from_slice(&self.bytes[..n]);
        self.bytes = &self.bytes[n..];
        Ok(n)
    }
}

proptest! {
    /// A streamed restore, however the source cuts the bytes, reaches the
    /// state a restore from the whole vector reaches; a cut stream is
    /// refused.
    #[test]
    fn a_streamed_restore_equals_a_whole_one(
        ops in proptest::collection::vec(arb_op(), 0..40),
        step in 1usize..9,
    ) {
        let s = KvService::new(6, Cost::Light);
        for op in ops {
            run(&s, op);
        }
        let snap = s.snapshot();
        let streamed = KvService::new(2, Cost::Light);
        streamed.restore_from(&mut Trickle { bytes: &snap, step }).unwrap();
        prop_assert_eq!(streamed.digest(), s.digest());
        prop_assert_eq!(streamed.snapshot(), snap.clone());
        let cut = KvService::new(2, Cost::Light);
        let short = &snap[..snap.len() - 1];
        let refused = cut.restore_from(&mut Trickle { bytes: short, step });
        prop_assert!(matches!(refused, Err(SnapshotError::Truncated(_))), "{:?}", refused);
    }
}

#[test]
fn a_streamed_restore_of_another_service_keeps_the_state() {
    let s = KvService::new(4, Cost::Light);
    let before = s.digest();
    let list = crate::list::ListService::new(1, 1).snapshot();
    let e = s.restore_from(&mut Trickle { bytes: &list, step: 3 }).unwrap_err();
    assert!(e.to_string().contains("not a key-value snapshot"), "{e}");
    let mut v6 = b"PSKV\x06\0".to_vec();
    v6.extend_from_slice(&0u64.to_le_bytes());
    let e = s.restore_from(&mut Trickle { bytes: &v6, step: 3 }).unwrap_err();
    assert!(e.to_string().contains("version 6 is not supported"), "{e}");
    assert_eq!(s.digest(), before);
}

#[test]
fn the_preloaded_store_names_keys_in_decimal() {
    let s = KvService::new(12, Cost::Light);
    assert_eq!(value(&s, b"11"), Some(le(11)));
    assert_eq!(value(&s, b"12"), None);
    assert_eq!(value(&s, &11u64.to_le_bytes()), None);
}

/// The sanitizer registers an operation on exactly the conflict keys its
/// command declares.
#[test]
fn the_footprint_is_the_access() {
    let op = KvOp::MSet { pairs: vec![(k(1), vec![]), (k(2), vec![])] };
    let c = crate::kv::command(KvModel::ReadersWriters, 1, ClientId(1), 1, op.clone()).unwrap();
    assert_eq!(crate::kv::footprint(&op), (c.reads.clone(), c.writes.clone()));
    assert_eq!(c.reads.to_vec(), vec![ALL]);
}

/// Every bucket's map, in order.
fn buckets(s: &KvService) -> Vec<Arc<Map>> {
    s.stripes.iter().flat_map(|st| st.read().to_vec()).collect()
}

#[test]
fn a_write_during_a_snapshot_copies_one_bucket_and_no_value() {
    let s = KvService::new(100_000, Cost::Light);
    let frozen = s.freeze();
    let before = buckets(&s);
    run(&s, KvOp::Put { key: k(7), value: b"new".to_vec() });
    let after = buckets(&s);
    let copied: Vec<usize> = (0..before.len()).filter(|&i| !Arc::ptr_eq(&before[i], &after[i])).collect();
    assert_eq!(copied.len(), 1, "one bucket copied, not the stripe");
    {
        let (old, new) = (&before[copied[0]], &after[copied[0]]);
        assert!(old.len() > 1);
        for (key, v) in old.iter().filter(|(key, _)| **key != k(7)) {
            assert!(Arc::ptr_eq(&v.obj, &new[key].obj), "the other values are shared, not copied");
        }
    }
    // A second write to the bucket copies nothing more.
    let copy = Arc::as_ptr(&after[copied[0]]);
    drop(after);
    run(&s, KvOp::Put { key: k(7), value: b"newer".to_vec() });
    assert_eq!(Arc::as_ptr(&buckets(&s)[copied[0]]), copy);
    let mut written = Vec::new();
    frozen(&mut written).unwrap();
    let restored = KvService::new(0, Cost::Light);
    restored.restore(&written).unwrap();
    assert_eq!(value(&restored, &k(7)), Some(le(7)), "the snapshot holds the state at the freeze");
}

/// A small store keeps one bucket per stripe; one that grows splits its
/// stripes, and a snapshot frozen before the split still writes the state
/// it was taken from, whose values the split shares rather than copies.
#[test]
fn stripes_split_as_they_grow_and_a_frozen_copy_survives_the_split() {
    let s = KvService::new(STRIPES as u64, Cost::Light);
    assert_eq!(buckets(&s).len(), STRIPES, "one bucket per stripe while small");
    let expected = s.snapshot();
    let frozen = s.freeze();
    let value = |n: u64| format!("value {n}").into_bytes();
    for n in 0..(STRIPES * SPLIT_AT * 2) as u64 {
        run(&s, KvOp::Put { key: key_bytes(n), value: value(n) });
    }
    let split = s.stripes.iter().filter(|st| st.read().len() == BUCKETS).count();
    assert!(split > STRIPES / 2, "{split} of {STRIPES} stripes split");
    assert!(s.stripes.iter().all(|st| matches!(st.read().len(), 1 | BUCKETS)));
    let mut written = Vec::new();
    frozen(&mut written).unwrap();
    assert_eq!(written, expected);
    for n in [0, 1, 4095, (STRIPES * SPLIT_AT * 2) as u64 - 1] {
        let got = s.read_str(0, &key_bytes(n), |v| v.map(<[u8]>::to_vec)).unwrap();
        assert_eq!(got, Some(value(n)), "key {n} found after the split");
    }
    let copy = KvService::new(0, Cost::Light);
    copy.restore(&s.snapshot()).unwrap();
    assert_eq!(copy.digest(), s.digest());
    assert_eq!(copy.len(), s.len());
}

/// A status request's digest is the state's when it was asked for, however
/// many writes execute before it is computed.
#[test]
fn a_frozen_digest_is_of_the_state_at_the_freeze() {
    let s = KvService::new(10_000, Cost::Light);
    let at_freeze = s.digest();
    let frozen = s.freeze_digest();
    for n in 0..5_000 {
        run(&s, KvOp::Put { key: key_bytes(n), value: b"later".to_vec() });
    }
    assert_ne!(s.digest(), at_freeze, "the writes changed the state");
    assert_eq!(frozen(), at_freeze);
}

fn h(key: &str, cmd: HashCmd) -> KvOp {
    KvOp::Hash { key: key.into(), cmd }
}

fn f(name: &str) -> Vec<u8> {
    name.as_bytes().to_vec()
}

fn pairs(list: &[(&str, &str)]) -> Vec<(Vec<u8>, Vec<u8>)> {
    list.iter().map(|(a, b)| (f(a), f(b))).collect()
}

fn some(items: &[&str]) -> KvReply {
    KvReply::Values(items.iter().map(|i| Some(f(i))).collect())
}

#[test]
fn hashes_answer_as_redis_and_go_with_their_last_field() {
    let s = KvService::new(0, Cost::Light);
    assert_eq!(run(&s, h("h", HashCmd::Set(pairs(&[("b", "2"), ("a", "1"), ("b", "3")])))), KvReply::Int(2));
    assert_eq!(run(&s, h("h", HashCmd::Get(f("b")))), KvReply::Value(Some(f("3"))));
    assert_eq!(run(&s, h("h", HashCmd::GetAll)), some(&["a", "1", "b", "3"]), "by field");
    assert_eq!(run(&s, h("h", HashCmd::Keys)), some(&["a", "b"]));
    assert_eq!(run(&s, h("h", HashCmd::Vals)), some(&["1", "3"]));
    let mget = run(&s, h("h", HashCmd::MGet(vec![f("a"), f("zz")])));
    assert_eq!(mget, KvReply::Values(vec![Some(f("1")), None]));
    assert_eq!(run(&s, h("h", HashCmd::SetNx(f("a"), f("9")))), KvReply::Int(0));
    assert_eq!(run(&s, h("h", HashCmd::Strlen(f("a")))), KvReply::Int(1));
    assert_eq!(run(&s, KvOp::Type { key: f("h") }), KvReply::Value(Some(f("hash"))));
    assert_eq!(run(&s, KvOp::Type { key: f("nothing") }), KvReply::Value(Some(f("none"))));
    // The other kind of value, both ways.
    assert_eq!(run(&s, KvOp::Read { key: f("h") }), KvReply::Error(KvError::WrongType));
    assert_eq!(run(&s, KvOp::Incr { key: f("h"), by: 1 }), KvReply::Error(KvError::WrongType));
    assert_eq!(run(&s, KvOp::MGet { keys: vec![f("h")] }), KvReply::Values(vec![None]), "MGET says nil");
    run(&s, KvOp::Put { key: f("s"), value: f("x") });
    assert_eq!(run(&s, h("s", HashCmd::Get(f("a")))), KvReply::Error(KvError::WrongType));
    assert_eq!(run(&s, h("s", HashCmd::Set(pairs(&[("a", "1")])))), KvReply::Error(KvError::WrongType));
    assert_eq!(value(&s, b"s"), Some(f("x")), "a refused write changes nothing");
    // SET replaces a hash; SET ... GET on one is refused.
    let set_get = KvOp::Set { key: f("h"), value: f("v"), when: SetWhen::Always, get: true, ttl: Ttl::Clear };
    assert_eq!(run(&s, set_get), KvReply::Error(KvError::WrongType));
    assert_eq!(run(&s, h("h", HashCmd::Del(vec![f("a"), f("b"), f("c")]))), KvReply::Int(2));
    assert_eq!(run(&s, KvOp::Exists { keys: vec![f("h")] }), KvReply::Int(0), "gone with its last field");
    assert_eq!(run(&s, h("h", HashCmd::Len)), KvReply::Int(0));
    assert_eq!(run(&s, h("h", HashCmd::Del(vec![f("a")]))), KvReply::Int(0));
    assert_eq!(run(&s, KvOp::DbSize), KvReply::Int(1), "a read or a failed delete makes no hash");
}

#[test]
fn hash_counters_parse_and_overflow_as_redis() {
    let s = KvService::new(0, Cost::Light);
    assert_eq!(run(&s, h("h", HashCmd::IncrBy(f("n"), 5))), KvReply::Int(5));
    assert_eq!(run(&s, h("h", HashCmd::IncrBy(f("n"), i64::MAX))), KvReply::Error(KvError::Overflow));
    run(&s, h("h", HashCmd::Set(pairs(&[("t", "abc"), ("x", "10.50")]))));
    assert_eq!(run(&s, h("h", HashCmd::IncrBy(f("t"), 1))), KvReply::Error(KvError::HashNotInteger));
    assert_eq!(run(&s, h("h", HashCmd::IncrByFloat(f("x"), f("0.1")))), KvReply::Value(Some(f("10.6"))));
    assert_eq!(run(&s, h("h", HashCmd::IncrByFloat(f("n"), f("-5")))), KvReply::Value(Some(f("0"))));
    assert_eq!(run(&s, h("h", HashCmd::IncrByFloat(f("y"), f("3e2")))), KvReply::Value(Some(f("300"))));
    assert_eq!(run(&s, h("h", HashCmd::IncrByFloat(f("t"), f("1")))), KvReply::Error(KvError::HashNotFloat));
    assert_eq!(run(&s, h("h", HashCmd::IncrByFloat(f("x"), f("nope")))), KvReply::Error(KvError::NotFloat));
    assert_eq!(run(&s, h("h", HashCmd::IncrByFloat(f("x"), f("inf")))), KvReply::Error(KvError::NotFinite));
    assert_eq!(run(&s, h("h", HashCmd::Get(f("x")))), KvReply::Value(Some(f("10.6"))), "errors change nothing");
}

#[test]
fn hashes_travel_in_snapshots_and_version_2_still_reads() {
    let s = KvService::new(3, Cost::Light);
    run(&s, h("h", HashCmd::Set(pairs(&[("b", "2"), ("a", "1")]))));
    let copy = KvService::new(0, Cost::Light);
    copy.restore(&s.snapshot()).unwrap();
    assert_eq!(copy.digest(), s.digest());
    assert_eq!(run(&copy, h("h", HashCmd::GetAll)), some(&["a", "1", "b", "2"]));
    let mut streamed = Vec::new();
    s.freeze()(&mut streamed).unwrap();
    assert_eq!(streamed, s.snapshot());
    // Version 2: strings only, no kind byte.
    let mut v2 = b"PSKV\x02\0".to_vec();
    v2.extend_from_slice(&1u64.to_le_bytes());
    for bytes in [&b"k"[..], b"v"] {
        v2.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        v2.extend_from_slice(bytes);
    }
    let old = KvService::new(0, Cost::Light);
    old.restore(&v2).unwrap();
    assert_eq!(value(&old, b"k"), Some(f("v")));
    // A hash with its fields out of order, or empty, is refused.
    let mut bad = s.snapshot();
    let at = bad.windows(5).rposition(|w| w == [1, 0, 0, 0, b'a']).expect("field a");
    bad[at + 4] = b'c';
    assert!(KvService::new(0, Cost::Light).restore(&bad).is_err());
}

fn l(key: &str, cmd: ListCmd) -> KvOp {
    KvOp::List { key: key.into(), cmd }
}

fn push(key: &str, left: bool, items: &[&str]) -> KvOp {
    l(key, ListCmd::Push { left, values: items.iter().map(|i| f(i)).collect() })
}

#[test]
fn lists_answer_as_redis_and_go_with_their_last_element() {
    let s = KvService::new(0, Cost::Light);
    assert_eq!(run(&s, push("q", false, &["a", "b", "c"])), KvReply::Int(3));
    assert_eq!(run(&s, push("q", true, &["y", "z"])), KvReply::Int(5), "z y a b c");
    assert_eq!(run(&s, l("q", ListCmd::Range(0, -1))), some(&["z", "y", "a", "b", "c"]));
    assert_eq!(run(&s, l("q", ListCmd::Range(-2, 100))), some(&["b", "c"]));
    assert_eq!(run(&s, l("q", ListCmd::Range(3, 1))), some(&[]));
    assert_eq!(run(&s, l("q", ListCmd::Index(-1))), KvReply::Value(Some(f("c"))));
    assert_eq!(run(&s, l("q", ListCmd::Index(9))), KvReply::Value(None));
    assert_eq!(run(&s, l("q", ListCmd::Set(9, f("x")))), KvReply::Error(KvError::IndexOutOfRange));
    assert_eq!(run(&s, l("nope", ListCmd::Set(0, f("x")))), KvReply::Error(KvError::NoSuchKey));
    let before = ListCmd::Insert { before: true, pivot: f("a"), value: f("a") };
    assert_eq!(run(&s, l("q", before)), KvReply::Int(6), "z y a a b c");
    assert_eq!(run(&s, l("q", ListCmd::Insert { before: false, pivot: f("?"), value: f("x") })), KvReply::Int(-1));
    let pos = |rank, count, maxlen| l("q", ListCmd::Pos { element: f("a"), rank, count, maxlen });
    assert_eq!(run(&s, pos(1, None, 0)), KvReply::Value(Some(f("2"))));
    assert_eq!(run(&s, pos(-1, None, 0)), KvReply::Value(Some(f("3"))));
    assert_eq!(run(&s, pos(1, Some(0), 0)), some(&["2", "3"]));
    assert_eq!(run(&s, pos(1, None, 2)), KvReply::Value(None), "MAXLEN 2 looks at z y only");
    assert_eq!(run(&s, l("q", ListCmd::Rem(-1, f("a")))), KvReply::Int(1), "the last a");
    assert_eq!(run(&s, l("q", ListCmd::Range(0, -1))), some(&["z", "y", "a", "b", "c"]));
    assert_eq!(run(&s, l("q", ListCmd::Trim(1, -2))), KvReply::Done(true));
    assert_eq!(run(&s, l("q", ListCmd::Range(0, -1))), some(&["y", "a", "b"]));
    assert_eq!(run(&s, l("q", ListCmd::Pop { left: true, count: None })), KvReply::Value(Some(f("y"))));
    assert_eq!(run(&s, l("q", ListCmd::Pop { left: false, count: Some(5) })), some(&["b", "a"]));
    assert_eq!(run(&s, KvOp::Type { key: f("q") }), KvReply::Value(Some(f("none"))), "gone with its last element");
    assert_eq!(run(&s, l("q", ListCmd::Pop { left: false, count: Some(1) })), KvReply::Value(None));
    run(&s, KvOp::Put { key: f("s"), value: f("x") });
    assert_eq!(run(&s, push("s", true, &["a"])), KvReply::Error(KvError::WrongType));
    assert_eq!(run(&s, l("s", ListCmd::Len)), KvReply::Error(KvError::WrongType));
}

#[test]
fn lmove_moves_one_element_and_a_refusal_moves_none() {
    let s = KvService::new(0, Cost::Light);
    run(&s, push("a", false, &["1", "2"]));
    let mv = |from: &str, to: &str, from_left, to_left| {
        run(&s, KvOp::LMove { from: f(from), to: f(to), from_left, to_left })
    };
    assert_eq!(mv("a", "b", false, true), KvReply::Value(Some(f("2"))));
    assert_eq!(mv("a", "a", true, false), KvReply::Value(Some(f("1"))), "a rotation");
    assert_eq!(mv("empty", "b", true, true), KvReply::Value(None));
    run(&s, KvOp::Put { key: f("s"), value: f("x") });
    assert_eq!(mv("a", "s", true, true), KvReply::Error(KvError::WrongType));
    assert_eq!(run(&s, l("a", ListCmd::Len)), KvReply::Int(1), "nothing popped for a refused move");
    assert_eq!(mv("a", "b", true, false), KvReply::Value(Some(f("1"))));
    assert_eq!(run(&s, l("b", ListCmd::Range(0, -1))), some(&["2", "1"]));
    assert_eq!(run(&s, KvOp::Exists { keys: vec![f("a")] }), KvReply::Int(0));
    let copy = KvService::new(0, Cost::Light);
    copy.restore(&s.snapshot()).unwrap();
    assert_eq!(copy.digest(), s.digest());
    assert_eq!(run(&copy, l("b", ListCmd::Range(0, -1))), some(&["2", "1"]));
}

fn members(key: &str, cmd: SetCmd) -> KvOp {
    KvOp::Members { key: key.into(), cmd }
}

fn fs(items: &[&str]) -> Vec<Vec<u8>> {
    items.iter().map(|i| f(i)).collect()
}

#[test]
fn sets_combine_store_and_move_as_redis() {
    let s = KvService::new(0, Cost::Light);
    assert_eq!(run(&s, members("a", SetCmd::Add(fs(&["x", "y", "z", "x"])))), KvReply::Int(3));
    assert_eq!(run(&s, members("b", SetCmd::Add(fs(&["y", "w"])))), KvReply::Int(2));
    assert_eq!(run(&s, members("a", SetCmd::Members)), some(&["x", "y", "z"]));
    assert_eq!(run(&s, members("a", SetCmd::MIsMember(fs(&["x", "q"])))), some(&["1", "0"]));
    let combine = |how, keys: &[&str], store: Option<&str>| KvOp::Combine { how, keys: fs(keys), store: store.map(f) };
    assert_eq!(run(&s, combine(Combine::Inter, &["a", "b"], None)), some(&["y"]));
    assert_eq!(run(&s, combine(Combine::Union, &["a", "b", "none"], None)), some(&["w", "x", "y", "z"]));
    assert_eq!(run(&s, combine(Combine::Diff, &["a", "b"], None)), some(&["x", "z"]));
    assert_eq!(run(&s, combine(Combine::Inter, &["a", "none"], None)), some(&[]));
    assert_eq!(run(&s, combine(Combine::Diff, &["a", "b"], Some("d"))), KvReply::Int(2));
    assert_eq!(run(&s, members("d", SetCmd::Members)), some(&["x", "z"]));
    run(&s, KvOp::Put { key: f("str"), value: f("v") });
    assert_eq!(run(&s, combine(Combine::Union, &["a", "str"], None)), KvReply::Error(KvError::WrongType));
    // A store replaces whatever was there; an empty result removes it.
    assert_eq!(run(&s, combine(Combine::Inter, &["a", "none"], Some("str"))), KvReply::Int(0));
    assert_eq!(run(&s, KvOp::Type { key: f("str") }), KvReply::Value(Some(f("none"))));
    let smove = |from: &str, to: &str, m: &str| KvOp::SMove { from: f(from), to: f(to), member: f(m) };
    assert_eq!(run(&s, smove("a", "b", "x")), KvReply::Int(1));
    assert_eq!(run(&s, smove("a", "b", "q")), KvReply::Int(0));
    assert_eq!(run(&s, smove("a", "a", "y")), KvReply::Int(1), "to itself: there, nothing moves");
    assert_eq!(run(&s, members("b", SetCmd::Members)), some(&["w", "x", "y"]));
    run(&s, KvOp::Put { key: f("s2"), value: f("v") });
    assert_eq!(run(&s, smove("a", "s2", "y")), KvReply::Error(KvError::WrongType));
    assert_eq!(run(&s, members("a", SetCmd::Card)), KvReply::Int(2), "a refused move takes nothing");
    assert_eq!(run(&s, members("a", SetCmd::Rem(fs(&["y", "z", "q"])))), KvReply::Int(2));
    assert_eq!(run(&s, KvOp::Exists { keys: fs(&["a"]) }), KvReply::Int(0), "gone with its last member");
    assert_eq!(run(&s, members("s2", SetCmd::IsMember(f("v")))), KvReply::Error(KvError::WrongType));
    let copy = KvService::new(0, Cost::Light);
    copy.restore(&s.snapshot()).unwrap();
    assert_eq!(copy.digest(), s.digest());
    assert_eq!(run(&copy, members("b", SetCmd::Members)), some(&["w", "x", "y"]));
}

/// `op` as command `seq` of client 1.
fn run_as(s: &KvService, seq: u64, op: KvOp) -> KvReply {
    s.execute(&Command { seq, ..cmd(op) })
}

fn versions(s: &KvService, keys: &[&[u8]]) -> Vec<u64> {
    match run(s, KvOp::Versions { keys: keys.iter().map(|k| k.to_vec()).collect() }) {
        KvReply::Versions(v) => v,
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_key_changes_version_with_every_write_and_never_with_a_read() {
    let s = KvService::new(1, Cost::Light);
    let (a, b) = (&b"a"[..], &b"b"[..]);
    assert_eq!(versions(&s, &[a, &k(0)]), [0, FIRST_VERSION], "absent; preloaded");
    run_as(&s, 1, KvOp::Put { key: a.to_vec(), value: b"1".to_vec() });
    let first = versions(&s, &[a])[0];
    assert_ne!(first, 0);
    run_as(&s, 2, KvOp::Read { key: a.to_vec() });
    run_as(&s, 3, KvOp::Hash { key: b.to_vec(), cmd: HashCmd::Len });
    assert_eq!(versions(&s, &[a, b]), [first, 0], "reads change nothing");
    run_as(&s, 4, KvOp::Append { key: a.to_vec(), value: b"2".to_vec() });
    let second = versions(&s, &[a])[0];
    assert!(second != first && second != 0);
    run_as(&s, 5, KvOp::Rename { from: a.to_vec(), to: b.to_vec(), nx: false });
    let renamed = versions(&s, &[a, b]);
    assert!(renamed[0] == 0 && renamed[1] != second && renamed[1] != 0, "{renamed:?}");
    // An expired key is absent for WATCH too.
    let at = |ms| Stamp { time_ms: ms, seed: 9 };
    let expire =
        KvOp::Expire { key: b.to_vec(), deadline: Deadline::At(100), cond: ExpireCond::Always, cmd: TtlCmd::PExpireAt };
    s.execute(&Command { stamp: at(50), ..cmd(expire) });
    let watch = KvOp::Versions { keys: vec![b.to_vec()] };
    assert_ne!(s.execute(&Command { stamp: at(100), ..cmd(watch.clone()) }), KvReply::Versions(vec![0]));
    assert_eq!(s.execute(&Command { stamp: at(101), ..cmd(watch) }), KvReply::Versions(vec![0]));
}

#[test]
fn exec_runs_its_operations_only_if_no_watched_key_changed() {
    let s = KvService::new(0, Cost::Light);
    let (w, x) = (b"w".to_vec(), b"x".to_vec());
    run_as(&s, 1, KvOp::Put { key: w.clone(), value: b"1".to_vec() });
    let seen = versions(&s, &[&w, &x]);
    let exec = |versions: Vec<u64>| KvOp::Exec {
        watched: vec![w.clone(), x.clone()],
        versions,
        ops: vec![KvOp::Incr { key: x.clone(), by: 5 }, KvOp::Read { key: w.clone() }],
    };
    let ran = KvReply::Exec(Some(vec![KvReply::Int(5), KvReply::Value(Some(b"1".to_vec()))]));
    assert_eq!(run_as(&s, 2, exec(seen.clone())), ran);
    // It wrote x: the versions read before no longer hold, and nothing runs.
    assert_eq!(run_as(&s, 3, exec(seen)), KvReply::Exec(None));
    assert_eq!(value(&s, &x), Some(b"5".to_vec()));
    // Versions that do hold, and none watched at all.
    assert_eq!(
        run_as(&s, 4, exec(versions(&s, &[&w, &x]))).to_owned(),
        KvReply::Exec(Some(vec![KvReply::Int(10), KvReply::Value(Some(b"1".to_vec()))]))
    );
    let unwatched = KvOp::Exec { watched: vec![], versions: vec![], ops: vec![KvOp::Del { keys: vec![w.clone()] }] };
    assert_eq!(run_as(&s, 5, unwatched), KvReply::Exec(Some(vec![KvReply::Int(1)])));
}

#[test]
fn an_exec_names_every_key_of_its_operations() {
    let op = KvOp::Exec {
        watched: vec![b"w".to_vec()],
        versions: vec![0],
        ops: vec![KvOp::Read { key: b"r".to_vec() }, KvOp::Put { key: b"p".to_vec(), value: vec![] }],
    };
    let keys: Vec<&[u8]> = op.keys().collect();
    assert_eq!(keys, [&b"w"[..], b"r", b"p"]);
    assert!(!op.is_read() && !op.is_whole());
    let (reads, writes) = crate::kv::footprint(&op);
    assert_eq!(reads.as_slice(), [ALL]);
    let mut expected: Vec<u64> = [b"w", b"r", b"p"].iter().map(|k| key_hash(*k)).collect();
    expected.sort_unstable();
    assert_eq!(writes.as_slice(), expected.as_slice());
    let whole = KvOp::Exec { watched: vec![], versions: vec![], ops: vec![KvOp::DbSize] };
    assert!(whole.is_whole());
    let reads_only = KvOp::Exec { watched: vec![], versions: vec![], ops: vec![KvOp::Read { key: b"r".to_vec() }] };
    assert!(reads_only.is_read());
}

#[test]
fn a_version_4_snapshot_restores_keys_as_written_by_no_command() {
    let s = KvService::new(0, Cost::Light);
    run_as(&s, 3, KvOp::Put { key: b"a".to_vec(), value: b"b".to_vec() });
    let mut snap = s.snapshot();
    assert_eq!(&snap[4..6], [5, 0]);
    // Version 4 ends each entry at its deadline: no version after it.
    snap[4] = 4;
    snap.truncate(snap.len() - 8);
    let restored = KvService::new(0, Cost::Light);
    restored.restore(&snap).unwrap();
    assert_eq!(value(&restored, b"a"), Some(b"b".to_vec()));
    assert_eq!(versions(&restored, &[b"a"]), [FIRST_VERSION]);
    // A version 5 entry of version 0 would read as an absent key.
    let mut zero = s.snapshot();
    let at = zero.len() - 8;
    zero[at..].copy_from_slice(&[0; 8]);
    assert!(restored.restore(&zero).unwrap_err().to_string().contains("of version 0"));
}
