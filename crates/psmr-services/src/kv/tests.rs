use super::*;
use crate::SHARDS_MAX;
use proptest::prelude::*;

fn k(s: &str) -> Vec<u8> {
    s.as_bytes().to_vec()
}

/// Keys of shard 0 and of shard 1 of `shards`, found by search.
fn keys_in_shards(shards: usize) -> (Vec<u8>, Vec<u8>) {
    let of = |want: usize| (0..).map(key_bytes).find(|key| shard_of(key_hash(key), shards) == want).unwrap();
    (of(0), of(1))
}

#[test]
fn key_hashes_are_stable_length_aware_and_never_all() {
    // Pinned: every replica and every build must agree on conflict keys.
    assert_eq!(key_hash(b"17"), key_hash(&key_bytes(17)));
    assert_ne!(key_hash(b"ab"), key_hash(b"ab\0"));
    assert_ne!(key_hash(b""), key_hash(b"\0"));
    let eight_zeros = [0u8; 8];
    assert_ne!(key_hash(b""), key_hash(&eight_zeros));
    assert!((0..10_000).map(key_bytes).all(|key| key_hash(&key) != ALL));
    assert_eq!(key_bytes(0), b"0");
    assert_eq!(key_bytes(17), b"17");
    assert_eq!(key_bytes(u64::MAX), u64::MAX.to_string().as_bytes());
    assert_eq!(nth_key_hash(12_345), key_hash(b"12345"));
}

#[test]
fn integers_parse_as_redis_string2ll() {
    for (text, want) in [
        ("0", Some(0)),
        ("17", Some(17)),
        ("-17", Some(-17)),
        ("9223372036854775807", Some(i64::MAX)),
        ("-9223372036854775808", Some(i64::MIN)),
        ("9223372036854775808", None),
        ("-9223372036854775809", None),
        ("-0", None),
        ("007", None),
        ("00", None),
        ("+1", None),
        (" 1", None),
        ("1 ", None),
        ("", None),
        ("-", None),
        ("1.0", None),
        ("1e3", None),
        ("0x10", None),
    ] {
        assert_eq!(parse_integer(text.as_bytes()), want, "{text:?}");
    }
}

#[test]
fn commands_carry_class_and_keys() {
    let put = command(KvModel::Sharded, 2, ClientId(1), 9, KvOp::Put { key: k("5"), value: vec![] }).unwrap();
    assert_eq!(put.class.index(), 2 + shard_of(key_hash(b"5"), 2));
    assert_eq!((put.reads.to_vec(), put.writes.to_vec()), (vec![ALL], vec![key_hash(b"5")]));
    let get = command(KvModel::ReadersWriters, 1, ClientId(1), 10, KvOp::Read { key: k("5") }).unwrap();
    assert_eq!(get.class.index(), 0);
    assert!(get.writes.is_empty());
    assert_eq!(get.reads.to_vec(), {
        let mut v = vec![key_hash(b"5"), ALL];
        v.sort_unstable();
        v.dedup();
        v
    });
}

#[test]
fn every_operation_reads_all_and_whole_store_operations_write_it() {
    let ops = [
        KvOp::Read { key: k("a") },
        KvOp::Strlen { key: k("a") },
        KvOp::MGet { keys: vec![k("a"), k("b"), k("a")] },
        KvOp::Exists { keys: vec![k("a"), k("a")] },
        KvOp::Create { key: k("a"), value: vec![] },
        KvOp::Update { key: k("a"), value: vec![] },
        KvOp::Delete { key: k("a") },
        KvOp::Put { key: k("a"), value: vec![] },
        KvOp::Set { key: k("a"), value: vec![], when: SetWhen::IfAbsent, get: true, ttl: Ttl::Clear },
        KvOp::Incr { key: k("a"), by: 1 },
        KvOp::Append { key: k("a"), value: vec![] },
        KvOp::MSet { pairs: vec![(k("a"), vec![]), (k("a"), vec![1])] },
        KvOp::Del { keys: vec![k("a"), k("b")] },
    ];
    let rw = |op: &KvOp| command(KvModel::ReadersWriters, 1, ClientId(1), 1, op.clone()).unwrap();
    let dbsize = rw(&KvOp::DbSize);
    let flush = rw(&KvOp::FlushDb);
    assert_eq!((dbsize.reads.len(), dbsize.writes.to_vec(), dbsize.class.index()), (0, vec![ALL], 1));
    assert_eq!((flush.reads.len(), flush.writes.to_vec(), flush.class.index()), (0, vec![ALL], 1));
    for op in &ops {
        let c = rw(op);
        assert!(c.reads.contains(&ALL) && !c.writes.contains(&ALL), "{op:?}");
        assert_eq!(c.class.index(), usize::from(!op.is_read()), "{op:?}");
        // Each key once, whatever the repeats.
        let mut all: Vec<_> = c.reads.iter().chain(&c.writes).collect();
        let n = all.len();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), n, "{op:?}");
        assert!(dbsize.conflicts_with(&c) && c.conflicts_with(&flush), "{op:?}");
    }
    // Reads of ALL alone make no conflict: operations on other keys stay
    // apart, and reads of one key stay together.
    let on_b = rw(&KvOp::Put { key: k("b"), value: vec![] });
    assert!(!rw(&ops[0]).conflicts_with(&on_b) && !rw(&ops[4]).conflicts_with(&on_b));
    assert!(!rw(&ops[0]).conflicts_with(&rw(&ops[2])));
    assert!(rw(&ops[2]).conflicts_with(&on_b), "MGET of b must wait for a write of b");
}

#[test]
fn the_sharded_model_refuses_cross_slot_and_whole_store_operations() {
    let (a, b) = keys_in_shards(2);
    let same = KvOp::MGet { keys: vec![a.clone(), a.clone()] };
    let c = access(KvModel::Sharded, 2, &same).unwrap();
    assert_eq!(c.class.index(), 0);
    let mset = KvOp::MSet { pairs: vec![(b.clone(), vec![]), (b.clone(), vec![])] };
    assert_eq!(access(KvModel::Sharded, 2, &mset).unwrap().class.index(), 2 + 1);
    for op in [
        KvOp::MGet { keys: vec![a.clone(), b.clone()] },
        KvOp::Exists { keys: vec![b.clone(), a.clone()] },
        KvOp::Del { keys: vec![a.clone(), b.clone()] },
        KvOp::MSet { pairs: vec![(a.clone(), vec![]), (b.clone(), vec![])] },
    ] {
        let e = access(KvModel::Sharded, 2, &op).unwrap_err();
        assert_eq!(e.to_string(), "CROSSSLOT Keys in request don't hash to the same slot");
        // The readers-writers model has no shards to cross.
        assert!(access(KvModel::ReadersWriters, 2, &op).is_ok());
    }
    for (op, name) in [(KvOp::DbSize, "DBSIZE"), (KvOp::FlushDb, "FLUSHDB")] {
        let e = access(KvModel::Sharded, 2, &op).unwrap_err().to_string();
        assert!(e.starts_with(&format!("ERR {name} touches every shard")), "{e}");
        assert!(e.contains("readers-writers"), "{e}");
        // With one shard there is still no class for it: refused alike.
        assert!(access(KvModel::Sharded, 1, &op).is_err());
    }
    // An operation with no key, which Redis never sends, takes shard 0,
    // and writes nothing.
    let none = access(KvModel::Sharded, 4, &KvOp::Del { keys: vec![] }).unwrap();
    assert_eq!((none.class.index(), none.reads.to_vec(), none.writes.len()), (0, vec![ALL], 0));
}

#[test]
fn shards_and_models() {
    assert_eq!(shard_of(7, 0), 0);
    assert_eq!(shard_of(7, 1), 0);
    assert_eq!((shard_of(0, 5), shard_of(ALL - 1, 5), shard_of(u64::MAX / 2, 2)), (0, 4, 0));
    let mut seen = [0usize; 5];
    for n in 0..5_000 {
        seen[shard_of(nth_key_hash(n), 5)] += 1;
    }
    assert!(seen.iter().all(|&n| (800..1200).contains(&n)), "{seen:?}");
    for m in KvModel::ALL {
        assert_eq!(m.to_string().parse::<KvModel>(), Ok(m));
    }
    assert!("sharded-global".parse::<KvModel>().unwrap_err().to_string().contains("valid: readers-writers, sharded"));
    let m = class_model(KvModel::Sharded, 2);
    let names: Vec<_> = m.class_ids().map(|c| m.class_name(c)).collect();
    assert_eq!(names, ["R1", "R2", "W1", "W2"]);
    assert!(m.conflicts(ClassId(0), ClassId(2)) && m.self_conflicting(ClassId(3)));
    assert!(!m.conflicts(ClassId(0), ClassId(3)) && !m.conflicts(ClassId(2), ClassId(3)));
    for model in KvModel::ALL {
        for shards in [1, 2, 3, 5, 8, 64, SHARDS_MAX] {
            for workers in [1, 2, 3, 4, 8, 13, 64] {
                default_mapping(model, shards, workers)
                    .validate(&class_model(model, shards))
                    .unwrap_or_else(|e| panic!("{model} {shards} shards {workers} workers: {e}"));
            }
        }
    }
}

fn arb_key() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![(0u64..30).prop_map(key_bytes), proptest::collection::vec(any::<u8>(), 0..5)]
}

/// Any operation, on few keys so that they meet; now and then a
/// transaction of them.
pub(in crate::kv) fn arb_op() -> impl Strategy<Value = KvOp> {
    // A watched key's version: mostly 0 (it must not exist), which a
    // state can meet, else any (it changed: nothing runs).
    let version = prop_oneof![4 => Just(0u64), 1 => any::<u64>()];
    let watched = proptest::collection::vec((arb_key(), version), 0..3);
    let exec = (watched, proptest::collection::vec(arb_plain_op(), 0..4)).prop_map(|(watched, ops)| {
        let (watched, versions) = watched.into_iter().unzip();
        KvOp::Exec { watched, versions, ops }
    });
    prop_oneof![
        12 => arb_plain_op(),
        1 => exec,
        1 => proptest::collection::vec(arb_key(), 0..4).prop_map(|keys| KvOp::Versions { keys }),
    ]
}

/// Any operation but a transaction.
fn arb_plain_op() -> impl Strategy<Value = KvOp> {
    let value = || proptest::collection::vec(any::<u8>(), 0..12);
    let keys = || proptest::collection::vec(arb_key(), 0..4);
    prop_oneof![
        (arb_key(), value()).prop_map(|(key, value)| KvOp::Create { key, value }),
        arb_key().prop_map(|key| KvOp::Read { key }),
        (arb_key(), value()).prop_map(|(key, value)| KvOp::Update { key, value }),
        arb_key().prop_map(|key| KvOp::Delete { key }),
        (arb_key(), value()).prop_map(|(key, value)| KvOp::Put { key, value }),
        (arb_key(), value(), 0..3usize, any::<bool>()).prop_map(|(key, value, w, get)| {
            let when = [SetWhen::Always, SetWhen::IfAbsent, SetWhen::IfPresent][w];
            KvOp::Set { key, value, when, get, ttl: Ttl::Clear }
        }),
        (arb_key(), prop_oneof![-3i64..3, any::<i64>()]).prop_map(|(key, by)| KvOp::Incr { key, by }),
        (arb_key(), value()).prop_map(|(key, value)| KvOp::Append { key, value }),
        arb_key().prop_map(|key| KvOp::Strlen { key }),
        keys().prop_map(|keys| KvOp::MGet { keys }),
        proptest::collection::vec((arb_key(), value()), 0..4).prop_map(|pairs| KvOp::MSet { pairs }),
        keys().prop_map(|keys| KvOp::Del { keys }),
        keys().prop_map(|keys| KvOp::Exists { keys }),
        Just(KvOp::DbSize),
        Just(KvOp::FlushDb),
        (arb_key(), arb_hash_cmd()).prop_map(|(key, cmd)| KvOp::Hash { key, cmd }),
        (arb_key(), arb_list_cmd()).prop_map(|(key, cmd)| KvOp::List { key, cmd }),
        (arb_key(), arb_set_cmd()).prop_map(|(key, cmd)| KvOp::Members { key, cmd }),
        (0..3usize, proptest::collection::vec(arb_key(), 1..3), proptest::option::of(arb_key())).prop_map(
            |(how, keys, store)| KvOp::Combine {
                how: [Combine::Inter, Combine::Union, Combine::Diff][how],
                keys,
                store
            }
        ),
        (arb_key(), arb_key(), (0..3u8).prop_map(|m| vec![b'm', m])).prop_map(|(from, to, member)| KvOp::SMove {
            from,
            to,
            member
        }),
        (arb_key(), arb_key(), any::<bool>(), any::<bool>()).prop_map(|(from, to, from_left, to_left)| KvOp::LMove {
            from,
            to,
            from_left,
            to_left
        }),
        arb_key().prop_map(|key| KvOp::Type { key }),
        arb_more_op(),
    ]
}

/// A deadline around a command's time, now and then past.
fn arb_deadline() -> impl Strategy<Value = Deadline> {
    prop_oneof![(-20i64..300).prop_map(Deadline::In), any::<i64>().prop_map(Deadline::At)]
}

/// The operations that came with deadlines, and the keyspace commands.
fn arb_more_op() -> impl Strategy<Value = KvOp> {
    let value = || proptest::collection::vec(any::<u8>(), 0..12);
    let ttl = || prop_oneof![Just(Ttl::Clear), Just(Ttl::Keep), arb_deadline().prop_map(Ttl::Expire)];
    let pattern = || proptest::collection::vec(prop_oneof![Just(b'*'), Just(b'?'), Just(b'1'), Just(b'a')], 0..4);
    prop_oneof![
        (arb_key(), value(), ttl()).prop_map(|(key, value, ttl)| KvOp::Set {
            key,
            value,
            when: SetWhen::Always,
            get: false,
            ttl
        }),
        (arb_key(), arb_deadline(), 0..6usize, 0..8usize).prop_map(|(key, deadline, c, cmd)| KvOp::Expire {
            key,
            deadline,
            cond: [
                ExpireCond::Always,
                ExpireCond::Nx,
                ExpireCond::Xx,
                ExpireCond::Gt,
                ExpireCond::Lt,
                ExpireCond::XxLt
            ][c],
            cmd: TtlCmd::ALL[cmd],
        }),
        arb_key().prop_map(|key| KvOp::Persist { key }),
        Just(KvOp::Time),
        (arb_key(), any::<bool>(), any::<bool>()).prop_map(|(key, ms, absolute)| KvOp::Ttl { key, ms, absolute }),
        (arb_key(), ttl()).prop_map(|(key, ttl)| KvOp::GetEx { key, ttl }),
        arb_key().prop_map(|key| KvOp::GetDel { key }),
        (arb_key(), -5i64..5, -5i64..5).prop_map(|(key, start, end)| KvOp::GetRange { key, start, end }),
        (arb_key(), 0u64..16, value()).prop_map(|(key, offset, value)| KvOp::SetRange { key, offset, value }),
        (arb_key(), prop_oneof![Just(b"1.5".to_vec()), value()]).prop_map(|(key, by)| KvOp::IncrByFloat { key, by }),
        proptest::collection::vec((arb_key(), value()), 0..4).prop_map(|pairs| KvOp::MSetNx { pairs }),
        (arb_key(), arb_key(), any::<bool>()).prop_map(|(from, to, nx)| KvOp::Rename { from, to, nx }),
        (arb_key(), arb_key(), any::<bool>()).prop_map(|(from, to, replace)| KvOp::Copy { from, to, replace }),
        pattern().prop_map(|pattern| KvOp::Keys { pattern }),
        (0u64..20_000, proptest::option::of(pattern()), 1u64..30, proptest::option::of(Just(b"set".to_vec())))
            .prop_map(|(cursor, pattern, count, kind)| KvOp::Scan { cursor, pattern, count, kind }),
        Just(KvOp::RandomKey),
        arb_key().prop_map(|key| KvOp::Encoding { key }),
        (arb_key(), arb_zcmd()).prop_map(|(key, cmd)| KvOp::Sorted { key, cmd }),
        (proptest::collection::vec(arb_key(), 1..3), any::<bool>()).prop_map(|(keys, left)| KvOp::BPop { keys, left }),
    ]
}

/// Sorted set commands over a few members and scores, so that they meet.
fn arb_zcmd() -> impl Strategy<Value = ZCmd> {
    let member = || (0..3u8).prop_map(|m| vec![b'z', m]);
    let score =
        || prop_oneof![(-3i32..3).prop_map(f64::from), Just(f64::INFINITY)].prop_map(|x| Score::new(x).unwrap());
    let sb = move || (score(), any::<bool>()).prop_map(|(score, open)| ScoreBound { score, open });
    let lb = move || {
        prop_oneof![
            Just(LexBound::Min),
            Just(LexBound::Max),
            member().prop_map(LexBound::Closed),
            member().prop_map(LexBound::Open)
        ]
    };
    let by = move || {
        prop_oneof![
            (-4i64..4, -4i64..4).prop_map(|(a, b)| ZBy::Rank(a, b)),
            (sb(), sb()).prop_map(|(a, b)| ZBy::Score(a, b)),
            (lb(), lb()).prop_map(|(a, b)| ZBy::Lex(a, b))
        ]
    };
    prop_oneof![
        (any::<[bool; 6]>(), proptest::collection::vec((score(), member()), 1..3)).prop_map(|(f, pairs)| ZCmd::Add {
            flags: ZAddFlags { nx: f[0], xx: f[1], gt: f[2], lt: f[3], ch: f[4], incr: f[5] },
            pairs
        }),
        (score(), member()).prop_map(|(s, m)| ZCmd::IncrBy(s, m)),
        member().prop_map(ZCmd::Score),
        proptest::collection::vec(member(), 1..3).prop_map(ZCmd::MScore),
        proptest::collection::vec(member(), 1..3).prop_map(ZCmd::Rem),
        Just(ZCmd::Card),
        (sb(), sb()).prop_map(|(a, b)| ZCmd::Count(a, b)),
        (lb(), lb()).prop_map(|(a, b)| ZCmd::LexCount(a, b)),
        (member(), any::<bool>()).prop_map(|(member, rev)| ZCmd::Rank { member, rev }),
        (by(), any::<bool>(), proptest::option::of((-1i64..3, -1i64..3)), any::<bool>())
            .prop_map(|(by, rev, limit, with_scores)| ZCmd::Range { by, rev, limit, with_scores }),
        (any::<bool>(), proptest::option::of(0u64..3)).prop_map(|(max, count)| ZCmd::Pop { max, count }),
        by().prop_map(ZCmd::RemRange),
    ]
}

/// Set commands over a few members, so that they meet.
fn arb_set_cmd() -> impl Strategy<Value = SetCmd> {
    let member = || (0..3u8).prop_map(|m| vec![b'm', m]);
    let members = move || proptest::collection::vec(member(), 1..3);
    prop_oneof![
        members().prop_map(SetCmd::Add),
        members().prop_map(SetCmd::Rem),
        Just(SetCmd::Members),
        member().prop_map(SetCmd::IsMember),
        members().prop_map(SetCmd::MIsMember),
        Just(SetCmd::Card),
        proptest::option::of(0u64..4).prop_map(SetCmd::Pop),
        proptest::option::of(-4i64..4).prop_map(SetCmd::RandMember),
    ]
}

/// List commands over a few values and small indices, so that they meet.
fn arb_list_cmd() -> impl Strategy<Value = ListCmd> {
    let value = || (0..3u8).prop_map(|v| vec![b'v', v]);
    let index = || -4i64..4;
    prop_oneof![
        (any::<bool>(), proptest::collection::vec(value(), 1..3))
            .prop_map(|(left, values)| ListCmd::Push { left, values }),
        (any::<bool>(), proptest::option::of(0u64..3)).prop_map(|(left, count)| ListCmd::Pop { left, count }),
        (index(), index()).prop_map(|(a, b)| ListCmd::Range(a, b)),
        Just(ListCmd::Len),
        index().prop_map(ListCmd::Index),
        (index(), value()).prop_map(|(i, v)| ListCmd::Set(i, v)),
        (index(), value()).prop_map(|(n, v)| ListCmd::Rem(n, v)),
        (index(), index()).prop_map(|(a, b)| ListCmd::Trim(a, b)),
        (any::<bool>(), value(), value()).prop_map(|(before, pivot, value)| ListCmd::Insert { before, pivot, value }),
        (value(), prop_oneof![Just(1i64), Just(-1), Just(2)], proptest::option::of(0u64..3), 0u64..3)
            .prop_map(|(element, rank, count, maxlen)| ListCmd::Pos { element, rank, count, maxlen }),
    ]
}

/// Hash commands over a few fields, so that they meet.
fn arb_hash_cmd() -> impl Strategy<Value = HashCmd> {
    let field = || (0..3u8).prop_map(|f| vec![b'f', f]);
    let value = || {
        prop_oneof![proptest::collection::vec(any::<u8>(), 0..6), (-5i64..5).prop_map(|n| n.to_string().into_bytes())]
    };
    let fields = move || proptest::collection::vec(field(), 1..3);
    let pairs = move || proptest::collection::vec((field(), value()), 1..3);
    prop_oneof![
        pairs().prop_map(HashCmd::Set),
        pairs().prop_map(HashCmd::MSet),
        (field(), value()).prop_map(|(f, v)| HashCmd::SetNx(f, v)),
        field().prop_map(HashCmd::Get),
        fields().prop_map(HashCmd::MGet),
        fields().prop_map(HashCmd::Del),
        Just(HashCmd::GetAll),
        Just(HashCmd::Keys),
        Just(HashCmd::Vals),
        Just(HashCmd::Len),
        field().prop_map(HashCmd::Exists),
        (field(), -3i64..3).prop_map(|(f, by)| HashCmd::IncrBy(f, by)),
        (field(), prop_oneof![Just(b"1.5".to_vec()), Just(b"-2".to_vec()), Just(b"x".to_vec())])
            .prop_map(|(f, by)| HashCmd::IncrByFloat(f, by)),
        field().prop_map(HashCmd::Strlen),
    ]
}
