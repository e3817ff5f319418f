use super::*;
use crate::kv::tests::arb_op;
use proptest::prelude::*;

fn arb_reply() -> impl Strategy<Value = KvReply> {
    let value = || proptest::option::of(proptest::collection::vec(any::<u8>(), 0..12));
    prop_oneof![
        value().prop_map(KvReply::Value),
        any::<bool>().prop_map(KvReply::Done),
        any::<i64>().prop_map(KvReply::Int),
        proptest::collection::vec(value(), 0..4).prop_map(KvReply::Values),
        prop_oneof![
            Just(KvError::NotInteger),
            Just(KvError::Overflow),
            Just(KvError::TooLarge),
            Just(KvError::ReplyTooLarge)
        ]
        .prop_map(KvReply::Error),
        proptest::collection::vec(any::<u64>(), 0..4).prop_map(KvReply::Versions),
        proptest::option::of(proptest::collection::vec(any::<i64>().prop_map(KvReply::Int), 0..3))
            .prop_map(KvReply::Exec),
    ]
}

proptest! {
    /// Operations and replies survive the wire; any bytes decode to an
    /// error or to something that encodes back to the same bytes.
    #[test]
    fn codec_round_trips_and_never_panics(
        op in arb_op(),
        reply in arb_reply(),
        junk in proptest::collection::vec(any::<u8>(), 0..40),
    ) {
        let c = KvCodec;
        prop_assert_eq!(c.decode_op(&c.encode_op(&op)).unwrap(), op);
        prop_assert_eq!(c.decode_reply(&c.encode_reply(&reply)).unwrap(), reply);
        if let Ok(op) = c.decode_op(&junk) {
            prop_assert_eq!(c.encode_op(&op), junk.clone());
        }
        if let Ok(r) = c.decode_reply(&junk) {
            prop_assert_eq!(c.encode_reply(&r), junk);
        }
    }

    /// Garbage after a valid tag, where the decoders branch, never panics.
    #[test]
    fn garbage_after_every_tag_never_panics(tag in 0u8..48, junk in proptest::collection::vec(any::<u8>(), 0..40)) {
        let mut bytes = vec![tag];
        bytes.extend(junk);
        let _ = KvCodec.decode_op(&bytes);
        let _ = KvCodec.decode_reply(&bytes);
    }
}

#[test]
fn oversized_keys_values_and_lists_are_refused() {
    let c = KvCodec;
    let long_key = KvOp::Read { key: vec![b'k'; KEY_MAX + 1] };
    let e = c.decode_op(&c.encode_op(&long_key)).unwrap_err().to_string();
    assert!(e.contains(&format!("key of {} bytes exceeds {KEY_MAX}", KEY_MAX + 1)), "{e}");
    let ok_key = KvOp::Read { key: vec![b'k'; KEY_MAX] };
    assert_eq!(c.decode_op(&c.encode_op(&ok_key)).unwrap(), ok_key);
    let long_value = KvOp::Append { key: vec![], value: vec![0; VALUE_MAX + 1] };
    assert!(c.decode_op(&c.encode_op(&long_value)).unwrap_err().to_string().contains("value of"));
    let in_mset = KvOp::MSet { pairs: vec![(vec![], vec![]), (vec![0; KEY_MAX + 1], vec![])] };
    assert!(c.decode_op(&c.encode_op(&in_mset)).is_err());
    let many = KvOp::Del { keys: vec![vec![]; OP_KEYS_MAX + 1] };
    assert!(c.decode_op(&c.encode_op(&many)).unwrap_err().to_string().contains("more than the limit"));
}

#[test]
fn a_lying_count_allocates_nothing() {
    // MGET claiming OP_KEYS_MAX keys in 4 bytes.
    let mut bytes = vec![tag::MGET];
    bytes.extend_from_slice(&(OP_KEYS_MAX as u32).to_be_bytes());
    bytes.extend_from_slice(&[0; 4]);
    assert!(KvCodec.decode_op(&bytes).unwrap_err().to_string().contains("cannot fit"));
    let mut reply = vec![3u8];
    reply.extend_from_slice(&u32::MAX.to_be_bytes());
    assert!(KvCodec.decode_reply(&reply).is_err());
}

#[test]
fn replies_keep_their_old_encoding() {
    // Value and Done replies are byte-for-byte what version 1 sent.
    assert_eq!(KvCodec.encode_reply(&KvReply::Value(None)), [0, 0]);
    assert_eq!(KvCodec.encode_reply(&KvReply::Done(true)), [1, 1]);
    assert_eq!(KvCodec.encode_reply(&KvReply::Value(Some(vec![7]))), [0, 1, 0, 0, 0, 1, 7]);
    assert_eq!(KvCodec.encode_op(&KvOp::DbSize), [tag::DBSIZE]);
}

#[test]
fn an_exec_holds_no_exec_and_a_version_per_watched_key() {
    let c = KvCodec;
    let inner = KvOp::Exec { watched: vec![], versions: vec![], ops: vec![KvOp::DbSize] };
    let nested = KvOp::Exec { watched: vec![], versions: vec![], ops: vec![inner] };
    let e = c.decode_op(&c.encode_op(&nested)).unwrap_err().to_string();
    assert!(e.contains("an EXEC inside an EXEC"), "{e}");
    let lopsided = KvOp::Exec { watched: vec![b"a".to_vec()], versions: vec![], ops: vec![] };
    let e = c.decode_op(&c.encode_op(&lopsided)).unwrap_err().to_string();
    assert!(e.contains("0 versions for 1 watched keys"), "{e}");
    let reply = KvReply::Exec(Some(vec![KvReply::Exec(None)]));
    assert!(c.decode_reply(&c.encode_reply(&reply)).unwrap_err().to_string().contains("inside an EXEC reply"));
    let keys = vec![vec![b'k']; OP_KEYS_MAX];
    let wide = KvOp::Exec {
        watched: vec![],
        versions: vec![],
        ops: (0..=EXEC_KEYS_MAX / OP_KEYS_MAX).map(|_| KvOp::Del { keys: keys.clone() }).collect(),
    };
    let e = c.decode_op(&c.encode_op(&wide)).unwrap_err().to_string();
    assert!(e.contains(&format!("over {EXEC_KEYS_MAX}")), "{e}");
}
