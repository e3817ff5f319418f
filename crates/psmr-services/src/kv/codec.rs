//! [`KvCodec`]: [`KvOp`]s and [`KvReply`]s on the wire.

use super::{
    Combine, HashCmd, KvError, KvOp, KvReply, ListCmd, Pair, SetCmd, SetWhen, KEY_MAX, OP_KEYS_MAX, REPLY_VALUES_MAX,
    VALUE_MAX,
};
use psmr_model::wire::{Decoder, Encoder, OpCodec, WireError};

/// Puts [`KvOp`]s and [`KvReply`]s on the wire.
///
/// An operation is a tag byte, then its fields in declaration order: keys
/// and values as length-prefixed bytes, lists as a count and their items,
/// `SetWhen` and `get` as one byte each, the increment as a 64-bit
/// integer. A reply is a tag (0 `Value`, 1 `Done`, 2 `Int`, 3 `Values`,
/// 4 `Error`) and its fields; an absent value is 0, a present one 1 and its
/// bytes. Decoding refuses keys over [`KEY_MAX`], values over
/// [`VALUE_MAX`] and lists over [`OP_KEYS_MAX`], never panics, and
/// allocates at most in proportion to the bytes it is given.
#[derive(Clone, Copy, Debug, Default)]
pub struct KvCodec;

/// Operation tags, in [`KvOp`] declaration order.
mod tag {
    pub const CREATE: u8 = 0;
    pub const READ: u8 = 1;
    pub const UPDATE: u8 = 2;
    pub const DELETE: u8 = 3;
    pub const PUT: u8 = 4;
    pub const SET: u8 = 5;
    pub const INCR: u8 = 6;
    pub const APPEND: u8 = 7;
    pub const STRLEN: u8 = 8;
    pub const MGET: u8 = 9;
    pub const MSET: u8 = 10;
    pub const DEL: u8 = 11;
    pub const EXISTS: u8 = 12;
    pub const DBSIZE: u8 = 13;
    pub const FLUSHDB: u8 = 14;
    pub const HASH: u8 = 15;
    pub const TYPE: u8 = 16;
    pub const LIST: u8 = 17;
    pub const LMOVE: u8 = 18;
    pub const MEMBERS: u8 = 19;
    pub const COMBINE: u8 = 20;
    pub const SMOVE: u8 = 21;
}

/// Errors on the wire: their place in this list.
const ERRORS: [KvError; 13] = [
    KvError::NotInteger,
    KvError::Overflow,
    KvError::TooLarge,
    KvError::ReplyTooLarge,
    KvError::WrongType,
    KvError::HashNotInteger,
    KvError::HashNotFloat,
    KvError::NotFloat,
    KvError::NotFinite,
    KvError::HashTooLarge,
    KvError::NoSuchKey,
    KvError::IndexOutOfRange,
    KvError::ListTooLarge,
];

impl OpCodec for KvCodec {
    type Op = KvOp;
    type Reply = KvReply;

    fn encode_op(&self, op: &KvOp) -> Vec<u8> {
        let mut e = Encoder::new();
        match op {
            KvOp::Create { key, value } => e.u8(tag::CREATE).bytes(key).bytes(value),
            KvOp::Read { key } => e.u8(tag::READ).bytes(key),
            KvOp::Update { key, value } => e.u8(tag::UPDATE).bytes(key).bytes(value),
            KvOp::Delete { key } => e.u8(tag::DELETE).bytes(key),
            KvOp::Put { key, value } => e.u8(tag::PUT).bytes(key).bytes(value),
            KvOp::Set { key, value, when, get } => {
                e.u8(tag::SET).bytes(key).bytes(value).u8(when_byte(*when)).u8(u8::from(*get))
            }
            KvOp::Incr { key, by } => e.u8(tag::INCR).bytes(key).u64(*by as u64),
            KvOp::Append { key, value } => e.u8(tag::APPEND).bytes(key).bytes(value),
            KvOp::Strlen { key } => e.u8(tag::STRLEN).bytes(key),
            KvOp::MGet { keys } => encode_keys(e.u8(tag::MGET), keys),
            KvOp::MSet { pairs } => encode_pairs(e.u8(tag::MSET), pairs),
            KvOp::Del { keys } => encode_keys(e.u8(tag::DEL), keys),
            KvOp::Exists { keys } => encode_keys(e.u8(tag::EXISTS), keys),
            KvOp::DbSize => e.u8(tag::DBSIZE),
            KvOp::FlushDb => e.u8(tag::FLUSHDB),
            KvOp::Hash { key, cmd } => encode_hash(e.u8(tag::HASH).bytes(key), cmd),
            KvOp::Type { key } => e.u8(tag::TYPE).bytes(key),
            KvOp::List { key, cmd } => encode_list(e.u8(tag::LIST).bytes(key), cmd),
            KvOp::LMove { from, to, from_left, to_left } => {
                e.u8(tag::LMOVE).bytes(from).bytes(to).u8(u8::from(*from_left)).u8(u8::from(*to_left))
            }
            KvOp::Members { key, cmd } => encode_set(e.u8(tag::MEMBERS).bytes(key), cmd),
            KvOp::Combine { how, keys, store } => {
                let e = encode_keys(e.u8(tag::COMBINE).u8(*how as u8), keys);
                encode_value(e, store.as_deref())
            }
            KvOp::SMove { from, to, member } => e.u8(tag::SMOVE).bytes(from).bytes(to).bytes(member),
        };
        e.finish()
    }

    fn decode_op(&self, bytes: &[u8]) -> Result<KvOp, WireError> {
        let mut d = Decoder::new(bytes, "kv operation");
        let op = match d.u8()? {
            tag::CREATE => KvOp::Create { key: key(&mut d)?, value: value(&mut d)? },
            tag::READ => KvOp::Read { key: key(&mut d)? },
            tag::UPDATE => KvOp::Update { key: key(&mut d)?, value: value(&mut d)? },
            tag::DELETE => KvOp::Delete { key: key(&mut d)? },
            tag::PUT => KvOp::Put { key: key(&mut d)?, value: value(&mut d)? },
            tag::SET => KvOp::Set { key: key(&mut d)?, value: value(&mut d)?, when: when(&mut d)?, get: flag(&mut d)? },
            tag::INCR => KvOp::Incr { key: key(&mut d)?, by: d.u64()? as i64 },
            tag::APPEND => KvOp::Append { key: key(&mut d)?, value: value(&mut d)? },
            tag::STRLEN => KvOp::Strlen { key: key(&mut d)? },
            tag::MGET => KvOp::MGet { keys: keys(&mut d)? },
            tag::MSET => KvOp::MSet { pairs: pairs(&mut d)? },
            tag::DEL => KvOp::Del { keys: keys(&mut d)? },
            tag::EXISTS => KvOp::Exists { keys: keys(&mut d)? },
            tag::DBSIZE => KvOp::DbSize,
            tag::FLUSHDB => KvOp::FlushDb,
            tag::HASH => KvOp::Hash { key: key(&mut d)?, cmd: hash_cmd(&mut d)? },
            tag::TYPE => KvOp::Type { key: key(&mut d)? },
            tag::LIST => KvOp::List { key: key(&mut d)?, cmd: list_cmd(&mut d)? },
            tag::LMOVE => {
                KvOp::LMove { from: key(&mut d)?, to: key(&mut d)?, from_left: flag(&mut d)?, to_left: flag(&mut d)? }
            }
            tag::MEMBERS => KvOp::Members { key: key(&mut d)?, cmd: set_cmd(&mut d)? },
            tag::COMBINE => {
                let how = match d.u8()? {
                    0 => Combine::Inter,
                    1 => Combine::Union,
                    2 => Combine::Diff,
                    b => return Err(d.error(format!("unknown set combination {b}"))),
                };
                let keys = keys(&mut d)?;
                if keys.is_empty() {
                    return Err(d.error("a set combination of no keys".to_string()));
                }
                let store = decode_value(&mut d)?;
                if store.as_ref().is_some_and(|k| k.len() > KEY_MAX) {
                    return Err(d.error(format!("key exceeds {KEY_MAX}")));
                }
                KvOp::Combine { how, keys, store }
            }
            tag::SMOVE => KvOp::SMove { from: key(&mut d)?, to: key(&mut d)?, member: value(&mut d)? },
            t => return Err(d.error(format!("unknown operation tag {t}"))),
        };
        d.end()?;
        Ok(op)
    }

    fn encode_reply(&self, reply: &KvReply) -> Vec<u8> {
        let size = match reply {
            KvReply::Value(v) => v.as_ref().map_or(0, Vec::len),
            KvReply::Values(vs) => vs.iter().map(|v| 5 + v.as_ref().map_or(0, Vec::len)).sum(),
            _ => 0,
        };
        let mut e = Encoder::with_capacity(10 + size);
        match reply {
            KvReply::Value(v) => encode_value(e.u8(0), v.as_deref()),
            KvReply::Done(b) => e.u8(1).u8(u8::from(*b)),
            KvReply::Int(n) => e.u8(2).u64(*n as u64),
            KvReply::Values(vs) => {
                e.u8(3).u32(list_len(vs.len()));
                vs.iter().fold(&mut e, |e, v| encode_value(e, v.as_deref()))
            }
            KvReply::Error(err) => e.u8(4).u8(error_byte(*err)),
        };
        e.finish()
    }

    fn decode_reply(&self, bytes: &[u8]) -> Result<KvReply, WireError> {
        let mut d = Decoder::new(bytes, "kv reply");
        let reply = match d.u8()? {
            0 => KvReply::Value(decode_value(&mut d)?),
            1 => KvReply::Done(flag(&mut d)?),
            2 => KvReply::Int(d.u64()? as i64),
            3 => {
                // A hash's fields or values may be many more than one
                // operation's keys; each takes at least its marker byte.
                let n = d.count(REPLY_VALUES_MAX, 1)?;
                KvReply::Values((0..n).map(|_| decode_value(&mut d)).collect::<Result<_, _>>()?)
            }
            4 => KvReply::Error(error(&mut d)?),
            t => return Err(d.error(format!("unknown reply tag {t}"))),
        };
        d.end()?;
        Ok(reply)
    }
}

/// A list's count as the wire's `u32`. Lists longer than that cannot be
/// built from a frame; saturating keeps encoding total, and the decoder
/// refuses the result.
fn list_len(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

fn encode_keys<'e>(e: &'e mut Encoder, keys: &[Vec<u8>]) -> &'e mut Encoder {
    e.u32(list_len(keys.len()));
    keys.iter().fold(e, |e, k| e.bytes(k))
}

/// A list of pairs, as [`pairs`] reads it.
fn encode_pairs<'e>(e: &'e mut Encoder, pairs: &[Pair]) -> &'e mut Encoder {
    e.u32(list_len(pairs.len()));
    pairs.iter().fold(e, |e, (k, v)| e.bytes(k).bytes(v))
}

fn encode_value<'e>(e: &'e mut Encoder, v: Option<&[u8]>) -> &'e mut Encoder {
    match v {
        None => e.u8(0),
        Some(v) => e.u8(1).bytes(v),
    }
}

fn when_byte(when: SetWhen) -> u8 {
    match when {
        SetWhen::Always => 0,
        SetWhen::IfAbsent => 1,
        SetWhen::IfPresent => 2,
    }
}

fn error_byte(e: KvError) -> u8 {
    ERRORS.iter().position(|&x| x == e).expect("every error is listed") as u8
}

/// A hash command after its key: a sub-tag in [`HashCmd`] declaration
/// order, then its fields.
fn encode_hash<'e>(e: &'e mut Encoder, cmd: &HashCmd) -> &'e mut Encoder {
    match cmd {
        HashCmd::Set(pairs) => encode_pairs(e.u8(0), pairs),
        HashCmd::MSet(pairs) => encode_pairs(e.u8(13), pairs),
        HashCmd::SetNx(f, v) => e.u8(1).bytes(f).bytes(v),
        HashCmd::Get(f) => e.u8(2).bytes(f),
        HashCmd::MGet(fs) => encode_keys(e.u8(3), fs),
        HashCmd::Del(fs) => encode_keys(e.u8(4), fs),
        HashCmd::GetAll => e.u8(5),
        HashCmd::Keys => e.u8(6),
        HashCmd::Vals => e.u8(7),
        HashCmd::Len => e.u8(8),
        HashCmd::Exists(f) => e.u8(9).bytes(f),
        HashCmd::IncrBy(f, by) => e.u8(10).bytes(f).u64(*by as u64),
        HashCmd::IncrByFloat(f, by) => e.u8(11).bytes(f).bytes(by),
        HashCmd::Strlen(f) => e.u8(12).bytes(f),
    }
}

/// A list command after its key: a sub-tag in [`ListCmd`] declaration
/// order, then its fields (an optional count as a flag and the number).
fn encode_list<'e>(e: &'e mut Encoder, cmd: &ListCmd) -> &'e mut Encoder {
    let opt = |e: &'e mut Encoder, n: Option<u64>| e.u8(u8::from(n.is_some())).u64(n.unwrap_or(0));
    match cmd {
        ListCmd::Push { left, values } => encode_keys(e.u8(0).u8(u8::from(*left)), values),
        ListCmd::Pop { left, count } => opt(e.u8(1).u8(u8::from(*left)), *count),
        ListCmd::Range(a, b) => e.u8(2).u64(*a as u64).u64(*b as u64),
        ListCmd::Len => e.u8(3),
        ListCmd::Index(i) => e.u8(4).u64(*i as u64),
        ListCmd::Set(i, v) => e.u8(5).u64(*i as u64).bytes(v),
        ListCmd::Rem(n, v) => e.u8(6).u64(*n as u64).bytes(v),
        ListCmd::Trim(a, b) => e.u8(7).u64(*a as u64).u64(*b as u64),
        ListCmd::Insert { before, pivot, value } => e.u8(8).u8(u8::from(*before)).bytes(pivot).bytes(value),
        ListCmd::Pos { element, rank, count, maxlen } => {
            opt(e.u8(9).bytes(element).u64(*rank as u64), *count).u64(*maxlen)
        }
    }
}

fn list_cmd(d: &mut Decoder<'_>) -> Result<ListCmd, WireError> {
    let opt = |d: &mut Decoder<'_>| -> Result<Option<u64>, WireError> {
        let some = flag(d)?;
        let n = d.u64()?;
        Ok(some.then_some(n))
    };
    Ok(match d.u8()? {
        0 => ListCmd::Push { left: flag(d)?, values: values(d)? },
        1 => ListCmd::Pop { left: flag(d)?, count: opt(d)? },
        2 => ListCmd::Range(d.u64()? as i64, d.u64()? as i64),
        3 => ListCmd::Len,
        4 => ListCmd::Index(d.u64()? as i64),
        5 => ListCmd::Set(d.u64()? as i64, value(d)?),
        6 => ListCmd::Rem(d.u64()? as i64, value(d)?),
        7 => ListCmd::Trim(d.u64()? as i64, d.u64()? as i64),
        8 => ListCmd::Insert { before: flag(d)?, pivot: value(d)?, value: value(d)? },
        9 => {
            let element = value(d)?;
            let rank = d.u64()? as i64;
            if rank == 0 {
                return Err(d.error("LPOS rank 0".to_string()));
            }
            ListCmd::Pos { element, rank, count: opt(d)?, maxlen: d.u64()? }
        }
        t => return Err(d.error(format!("unknown list command {t}"))),
    })
}

/// A set command after its key: a sub-tag in [`SetCmd`] declaration order,
/// then its members.
fn encode_set<'e>(e: &'e mut Encoder, cmd: &SetCmd) -> &'e mut Encoder {
    match cmd {
        SetCmd::Add(ms) => encode_keys(e.u8(0), ms),
        SetCmd::Rem(ms) => encode_keys(e.u8(1), ms),
        SetCmd::Members => e.u8(2),
        SetCmd::IsMember(m) => e.u8(3).bytes(m),
        SetCmd::MIsMember(ms) => encode_keys(e.u8(4), ms),
        SetCmd::Card => e.u8(5),
    }
}

fn set_cmd(d: &mut Decoder<'_>) -> Result<SetCmd, WireError> {
    Ok(match d.u8()? {
        0 => SetCmd::Add(values(d)?),
        1 => SetCmd::Rem(values(d)?),
        2 => SetCmd::Members,
        3 => SetCmd::IsMember(value(d)?),
        4 => SetCmd::MIsMember(values(d)?),
        5 => SetCmd::Card,
        t => return Err(d.error(format!("unknown set command {t}"))),
    })
}

/// A list of values; each takes at least its 4-byte length.
fn values(d: &mut Decoder<'_>) -> Result<Vec<Vec<u8>>, WireError> {
    let n = d.count(OP_KEYS_MAX, 4)?;
    (0..n).map(|_| value(d)).collect()
}

fn hash_cmd(d: &mut Decoder<'_>) -> Result<HashCmd, WireError> {
    Ok(match d.u8()? {
        0 => HashCmd::Set(pairs(d)?),
        1 => HashCmd::SetNx(key(d)?, value(d)?),
        2 => HashCmd::Get(key(d)?),
        3 => HashCmd::MGet(keys(d)?),
        4 => HashCmd::Del(keys(d)?),
        5 => HashCmd::GetAll,
        6 => HashCmd::Keys,
        7 => HashCmd::Vals,
        8 => HashCmd::Len,
        9 => HashCmd::Exists(key(d)?),
        10 => HashCmd::IncrBy(key(d)?, d.u64()? as i64),
        11 => HashCmd::IncrByFloat(key(d)?, value(d)?),
        12 => HashCmd::Strlen(key(d)?),
        13 => HashCmd::MSet(pairs(d)?),
        t => return Err(d.error(format!("unknown hash command {t}"))),
    })
}

fn key(d: &mut Decoder<'_>) -> Result<Vec<u8>, WireError> {
    let k = d.bytes()?;
    if k.len() > KEY_MAX {
        return Err(d.error(format!("key of {} bytes exceeds {KEY_MAX}", k.len())));
    }
    Ok(k.to_vec())
}

fn value(d: &mut Decoder<'_>) -> Result<Vec<u8>, WireError> {
    let v = d.bytes()?;
    if v.len() > VALUE_MAX {
        return Err(d.error(format!("value of {} bytes exceeds {VALUE_MAX}", v.len())));
    }
    Ok(v.to_vec())
}

/// A list of keys; each takes at least its 4-byte length.
fn keys(d: &mut Decoder<'_>) -> Result<Vec<Vec<u8>>, WireError> {
    let n = d.count(OP_KEYS_MAX, 4)?;
    (0..n).map(|_| key(d)).collect()
}

/// A list of pairs; each takes at least its two 4-byte lengths.
fn pairs(d: &mut Decoder<'_>) -> Result<Vec<Pair>, WireError> {
    let n = d.count(OP_KEYS_MAX, 8)?;
    (0..n).map(|_| Ok((key(d)?, value(d)?))).collect()
}

fn flag(d: &mut Decoder<'_>) -> Result<bool, WireError> {
    match d.u8()? {
        0 => Ok(false),
        1 => Ok(true),
        b => Err(d.error(format!("flag byte {b} is neither 0 nor 1"))),
    }
}

fn when(d: &mut Decoder<'_>) -> Result<SetWhen, WireError> {
    match d.u8()? {
        0 => Ok(SetWhen::Always),
        1 => Ok(SetWhen::IfAbsent),
        2 => Ok(SetWhen::IfPresent),
        b => Err(d.error(format!("unknown SET condition {b}"))),
    }
}

fn error(d: &mut Decoder<'_>) -> Result<KvError, WireError> {
    let b = d.u8()?;
    ERRORS.get(usize::from(b)).copied().ok_or_else(|| d.error(format!("unknown error code {b}")))
}

fn decode_value(d: &mut Decoder<'_>) -> Result<Option<Vec<u8>>, WireError> {
    match d.u8()? {
        0 => Ok(None),
        1 => Ok(Some(d.bytes()?.to_vec())),
        b => Err(d.error(format!("value marker {b} is neither 0 nor 1"))),
    }
}

#[cfg(test)]
mod tests;
