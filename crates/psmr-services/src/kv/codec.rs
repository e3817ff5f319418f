//! [`KvCodec`]: [`KvOp`]s and [`KvReply`]s on the wire.

use super::{
    Combine, Deadline, ExpireCond, HashCmd, KvError, KvOp, KvReply, LexBound, ListCmd, Pair, Score, ScoreBound, SetCmd,
    SetWhen, Ttl, TtlCmd, ZAddFlags, ZBy, ZCmd, EXEC_KEYS_MAX, KEY_MAX, OP_KEYS_MAX, REPLY_VALUES_MAX, VALUE_MAX,
};
use psmr_model::wire::{Decoder, Encoder, OpCodec, WireError};

/// Puts [`KvOp`]s and [`KvReply`]s on the wire.
///
/// An operation is a tag byte, then its fields in declaration order: keys
/// and values as length-prefixed bytes, lists as a count and their items,
/// `SetWhen` and `get` as one byte each, the increment as a 64-bit
/// integer. A reply is a tag (0 `Value`, 1 `Done`, 2 `Int`, 3 `Values`,
/// 4 `Error`, 5 `Versions`, 6 `Exec`) and its fields; an absent value is 0, a present one 1 and its
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
    /// `SET` with a deadline or `KEEPTTL`: `SET`'s fields, then the TTL.
    pub const SET_TTL: u8 = 22;
    pub const EXPIRE: u8 = 23;
    pub const PERSIST: u8 = 24;
    pub const TTL: u8 = 25;
    pub const GETEX: u8 = 26;
    pub const GETDEL: u8 = 27;
    pub const GETRANGE: u8 = 28;
    pub const SETRANGE: u8 = 29;
    pub const INCRBYFLOAT: u8 = 30;
    pub const MSETNX: u8 = 31;
    pub const RENAME: u8 = 32;
    pub const COPY: u8 = 33;
    pub const KEYS: u8 = 34;
    pub const SCAN: u8 = 35;
    pub const RANDOMKEY: u8 = 36;
    pub const ENCODING: u8 = 37;
    pub const SORTED: u8 = 38;
    pub const SWEEP: u8 = 39;
    pub const BPOP: u8 = 40;
    pub const VERSIONS: u8 = 41;
    /// The watched keys and their versions, then the operations, each as
    /// its own encoding (never an `EXEC`'s).
    pub const EXEC: u8 = 42;
    pub const TIME: u8 = 43;
}

/// Reply tags.
mod reply_tag {
    pub const VALUE: u8 = 0;
    pub const DONE: u8 = 1;
    pub const INT: u8 = 2;
    pub const VALUES: u8 = 3;
    pub const ERROR: u8 = 4;
    pub const VERSIONS: u8 = 5;
    /// A flag, then the count and each reply as its own encoding (never
    /// an `Exec`'s).
    pub const EXEC: u8 = 6;
}

/// Errors on the wire: their place in this list.
const ERRORS: [KvError; 24] = [
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
    KvError::InvalidExpire(TtlCmd::Set),
    KvError::InvalidExpire(TtlCmd::SetEx),
    KvError::InvalidExpire(TtlCmd::PSetEx),
    KvError::InvalidExpire(TtlCmd::GetEx),
    KvError::InvalidExpire(TtlCmd::Expire),
    KvError::InvalidExpire(TtlCmd::PExpire),
    KvError::InvalidExpire(TtlCmd::ExpireAt),
    KvError::InvalidExpire(TtlCmd::PExpireAt),
    KvError::SameObject,
    KvError::KeysTooLarge,
    KvError::ScoreNaN,
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
            // A SET that clears the deadline keeps the encoding it had
            // before deadlines, so that logs written then still decode.
            KvOp::Set { key, value, when, get, ttl: Ttl::Clear } => {
                e.u8(tag::SET).bytes(key).bytes(value).u8(when_byte(*when)).u8(u8::from(*get))
            }
            KvOp::Set { key, value, when, get, ttl } => {
                let e = e.u8(tag::SET_TTL).bytes(key).bytes(value).u8(when_byte(*when)).u8(u8::from(*get));
                encode_ttl(e, *ttl)
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
            _ => encode_more(&mut e, op),
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
            tag::SET => KvOp::Set {
                key: key(&mut d)?,
                value: value(&mut d)?,
                when: when(&mut d)?,
                get: flag(&mut d)?,
                ttl: Ttl::Clear,
            },
            tag::SET_TTL => KvOp::Set {
                key: key(&mut d)?,
                value: value(&mut d)?,
                when: when(&mut d)?,
                get: flag(&mut d)?,
                ttl: ttl(&mut d)?,
            },
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
            t => decode_more(&mut d, t)?,
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
            KvReply::Value(v) => encode_value(e.u8(reply_tag::VALUE), v.as_deref()),
            KvReply::Done(b) => e.u8(reply_tag::DONE).u8(u8::from(*b)),
            KvReply::Int(n) => e.u8(reply_tag::INT).u64(*n as u64),
            KvReply::Values(vs) => {
                e.u8(reply_tag::VALUES).u32(list_len(vs.len()));
                vs.iter().fold(&mut e, |e, v| encode_value(e, v.as_deref()))
            }
            KvReply::Error(err) => e.u8(reply_tag::ERROR).u8(error_byte(*err)),
            KvReply::Versions(vs) => {
                vs.iter().fold(e.u8(reply_tag::VERSIONS).u32(list_len(vs.len())), |e, v| e.u64(*v))
            }
            KvReply::Exec(None) => e.u8(reply_tag::EXEC).u8(0),
            KvReply::Exec(Some(rs)) => {
                let e = e.u8(reply_tag::EXEC).u8(1).u32(list_len(rs.len()));
                rs.iter().fold(e, |e, r| e.bytes(&self.encode_reply(r)))
            }
        };
        e.finish()
    }

    fn decode_reply(&self, bytes: &[u8]) -> Result<KvReply, WireError> {
        let mut d = Decoder::new(bytes, "kv reply");
        let reply = match d.u8()? {
            reply_tag::VALUE => KvReply::Value(decode_value(&mut d)?),
            reply_tag::DONE => KvReply::Done(flag(&mut d)?),
            reply_tag::INT => KvReply::Int(d.u64()? as i64),
            reply_tag::VALUES => {
                // A hash's fields or values may be many more than one
                // operation's keys; each takes at least its marker byte.
                let n = d.count(REPLY_VALUES_MAX, 1)?;
                KvReply::Values((0..n).map(|_| decode_value(&mut d)).collect::<Result<_, _>>()?)
            }
            reply_tag::ERROR => KvReply::Error(error(&mut d)?),
            reply_tag::VERSIONS => {
                let n = d.count(OP_KEYS_MAX, 8)?;
                KvReply::Versions((0..n).map(|_| d.u64()).collect::<Result<_, _>>()?)
            }
            reply_tag::EXEC => KvReply::Exec(match flag(&mut d)? {
                false => None,
                true => Some(nested(&mut d, "an EXEC reply", reply_tag::EXEC, |bytes| self.decode_reply(bytes))?),
            }),
            t => return Err(d.error(format!("unknown reply tag {t}"))),
        };
        d.end()?;
        Ok(reply)
    }
}

/// Items each in its own encoding (an `Exec`'s operations or replies), at
/// most [`EXEC_KEYS_MAX`], none starting with `refused`: no `Exec` holds
/// another.
fn nested<T>(
    d: &mut Decoder<'_>,
    what: &str,
    refused: u8,
    decode: impl Fn(&[u8]) -> Result<T, WireError>,
) -> Result<Vec<T>, WireError> {
    let n = d.count(EXEC_KEYS_MAX, 5)?;
    let mut items = Vec::with_capacity(n);
    for _ in 0..n {
        let bytes = d.bytes()?;
        if bytes.first() == Some(&refused) {
            return Err(d.error(format!("{what} inside {what}")));
        }
        items.push(decode(bytes)?);
    }
    Ok(items)
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
        SetCmd::Pop(n) => e.u8(6).u8(u8::from(n.is_some())).u64(n.unwrap_or(0)),
        SetCmd::RandMember(n) => e.u8(7).u8(u8::from(n.is_some())).u64(n.unwrap_or(0) as u64),
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
        6 => {
            let some = flag(d)?;
            let n = d.u64()?;
            SetCmd::Pop(some.then_some(n))
        }
        7 => {
            let some = flag(d)?;
            let n = d.u64()? as i64;
            SetCmd::RandMember(some.then_some(n))
        }
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

/// The operations that came with deadlines and the keyspace commands.
fn encode_more<'e>(e: &'e mut Encoder, op: &KvOp) -> &'e mut Encoder {
    match op {
        KvOp::Expire { key, deadline, cond, cmd } => {
            let e = encode_deadline(e.u8(tag::EXPIRE).bytes(key), *deadline);
            e.u8(*cond as u8).u8(ttl_cmd_byte(*cmd))
        }
        KvOp::Persist { key } => e.u8(tag::PERSIST).bytes(key),
        KvOp::Ttl { key, ms, absolute } => e.u8(tag::TTL).bytes(key).u8(u8::from(*ms)).u8(u8::from(*absolute)),
        KvOp::GetEx { key, ttl } => encode_ttl(e.u8(tag::GETEX).bytes(key), *ttl),
        KvOp::GetDel { key } => e.u8(tag::GETDEL).bytes(key),
        KvOp::GetRange { key, start, end } => e.u8(tag::GETRANGE).bytes(key).u64(*start as u64).u64(*end as u64),
        KvOp::SetRange { key, offset, value } => e.u8(tag::SETRANGE).bytes(key).u64(*offset).bytes(value),
        KvOp::IncrByFloat { key, by } => e.u8(tag::INCRBYFLOAT).bytes(key).bytes(by),
        KvOp::MSetNx { pairs } => encode_pairs(e.u8(tag::MSETNX), pairs),
        KvOp::Rename { from, to, nx } => e.u8(tag::RENAME).bytes(from).bytes(to).u8(u8::from(*nx)),
        KvOp::Copy { from, to, replace } => e.u8(tag::COPY).bytes(from).bytes(to).u8(u8::from(*replace)),
        KvOp::Keys { pattern } => e.u8(tag::KEYS).bytes(pattern),
        KvOp::Scan { cursor, pattern, count, kind } => {
            let e = encode_value(e.u8(tag::SCAN).u64(*cursor), pattern.as_deref());
            encode_value(e.u64(*count), kind.as_deref())
        }
        KvOp::RandomKey => e.u8(tag::RANDOMKEY),
        KvOp::Encoding { key } => e.u8(tag::ENCODING).bytes(key),
        KvOp::Sorted { key, cmd } => encode_zcmd(e.u8(tag::SORTED).bytes(key), cmd),
        KvOp::Sweep { keys } => encode_keys(e.u8(tag::SWEEP), keys),
        KvOp::BPop { keys, left } => encode_keys(e.u8(tag::BPOP).u8(u8::from(*left)), keys),
        KvOp::Versions { keys } => encode_keys(e.u8(tag::VERSIONS), keys),
        KvOp::Time => e.u8(tag::TIME),
        KvOp::Exec { watched, versions, ops } => {
            let e = encode_keys(e.u8(tag::EXEC), watched).u32(list_len(versions.len()));
            let e = versions.iter().fold(e, |e, v| e.u64(*v)).u32(list_len(ops.len()));
            ops.iter().fold(e, |e, op| e.bytes(&KvCodec.encode_op(op)))
        }
        _ => unreachable!("{} is encoded by encode_op", op.name()),
    }
}

/// Decodes the operation of tag `t` among those of [`encode_more`].
fn decode_more(d: &mut Decoder<'_>, t: u8) -> Result<KvOp, WireError> {
    Ok(match t {
        tag::EXPIRE => {
            let (key, deadline) = (key(d)?, deadline(d)?);
            let cond = match d.u8()? {
                0 => ExpireCond::Always,
                1 => ExpireCond::Nx,
                2 => ExpireCond::Xx,
                3 => ExpireCond::Gt,
                4 => ExpireCond::Lt,
                5 => ExpireCond::XxLt,
                b => return Err(d.error(format!("unknown EXPIRE condition {b}"))),
            };
            KvOp::Expire { key, deadline, cond, cmd: ttl_cmd(d)? }
        }
        tag::PERSIST => KvOp::Persist { key: key(d)? },
        tag::TTL => KvOp::Ttl { key: key(d)?, ms: flag(d)?, absolute: flag(d)? },
        tag::GETEX => KvOp::GetEx { key: key(d)?, ttl: ttl(d)? },
        tag::GETDEL => KvOp::GetDel { key: key(d)? },
        tag::GETRANGE => KvOp::GetRange { key: key(d)?, start: d.u64()? as i64, end: d.u64()? as i64 },
        tag::SETRANGE => KvOp::SetRange { key: key(d)?, offset: d.u64()?, value: value(d)? },
        tag::INCRBYFLOAT => KvOp::IncrByFloat { key: key(d)?, by: value(d)? },
        tag::MSETNX => KvOp::MSetNx { pairs: pairs(d)? },
        tag::RENAME => KvOp::Rename { from: key(d)?, to: key(d)?, nx: flag(d)? },
        tag::COPY => KvOp::Copy { from: key(d)?, to: key(d)?, replace: flag(d)? },
        tag::KEYS => KvOp::Keys { pattern: value(d)? },
        tag::SCAN => {
            let (cursor, pattern) = (d.u64()?, decode_bounded(d)?);
            KvOp::Scan { cursor, pattern, count: d.u64()?, kind: decode_bounded(d)? }
        }
        tag::RANDOMKEY => KvOp::RandomKey,
        tag::ENCODING => KvOp::Encoding { key: key(d)? },
        tag::SORTED => KvOp::Sorted { key: key(d)?, cmd: zcmd(d)? },
        tag::SWEEP => KvOp::Sweep { keys: keys(d)? },
        tag::BPOP => {
            let left = flag(d)?;
            KvOp::BPop { keys: keys(d)?, left }
        }
        tag::VERSIONS => KvOp::Versions { keys: keys(d)? },
        tag::EXEC => exec(d)?,
        tag::TIME => KvOp::Time,
        t => return Err(d.error(format!("unknown operation tag {t}"))),
    })
}

/// An `Exec` after its tag: within [`EXEC_KEYS_MAX`] keys, one version per
/// watched key, no `Exec` inside.
fn exec(d: &mut Decoder<'_>) -> Result<KvOp, WireError> {
    let watched = keys(d)?;
    let n = d.count(OP_KEYS_MAX, 8)?;
    if n != watched.len() {
        return Err(d.error(format!("{n} versions for {} watched keys", watched.len())));
    }
    let versions = (0..n).map(|_| d.u64()).collect::<Result<Vec<_>, _>>()?;
    let ops = nested(d, "an EXEC", tag::EXEC, |bytes| KvCodec.decode_op(bytes))?;
    let op = KvOp::Exec { watched, versions, ops };
    let named = op.keys().count();
    if named > EXEC_KEYS_MAX {
        return Err(d.error(format!("an EXEC naming {named} keys, over {EXEC_KEYS_MAX}")));
    }
    Ok(op)
}

/// A sorted set command after its key: a sub-tag in [`ZCmd`] declaration
/// order, then its fields.
fn encode_zcmd<'e>(e: &'e mut Encoder, cmd: &ZCmd) -> &'e mut Encoder {
    match cmd {
        ZCmd::Add { flags, pairs } => {
            let f = flags;
            let bits = [f.nx, f.xx, f.gt, f.lt, f.ch, f.incr].iter().rev().fold(0u8, |b, &on| (b << 1) | u8::from(on));
            e.u8(0).u8(bits).u32(list_len(pairs.len()));
            pairs.iter().fold(e, |e, (s, m)| e.u64(s.get().to_bits()).bytes(m))
        }
        ZCmd::IncrBy(s, m) => e.u8(1).u64(s.get().to_bits()).bytes(m),
        ZCmd::Score(m) => e.u8(2).bytes(m),
        ZCmd::MScore(ms) => encode_keys(e.u8(3), ms),
        ZCmd::Rem(ms) => encode_keys(e.u8(4), ms),
        ZCmd::Card => e.u8(5),
        ZCmd::Count(lo, hi) => encode_by(e.u8(6), &ZBy::Score(*lo, *hi)),
        ZCmd::LexCount(lo, hi) => encode_by(e.u8(7), &ZBy::Lex(lo.clone(), hi.clone())),
        ZCmd::Rank { member, rev } => e.u8(8).bytes(member).u8(u8::from(*rev)),
        ZCmd::Range { by, rev, limit, with_scores } => {
            let e = encode_by(e.u8(9), by).u8(u8::from(*rev)).u8(u8::from(limit.is_some()));
            let (o, c) = limit.unwrap_or((0, 0));
            e.u64(o as u64).u64(c as u64).u8(u8::from(*with_scores))
        }
        ZCmd::Pop { max, count } => e.u8(10).u8(u8::from(*max)).u8(u8::from(count.is_some())).u64(count.unwrap_or(0)),
        ZCmd::RemRange(by) => encode_by(e.u8(11), by),
    }
}

fn zcmd(d: &mut Decoder<'_>) -> Result<ZCmd, WireError> {
    Ok(match d.u8()? {
        0 => {
            let bits = d.u8()?;
            let on = |i: u8| bits & (1 << i) != 0;
            let flags = ZAddFlags { nx: on(0), xx: on(1), gt: on(2), lt: on(3), ch: on(4), incr: on(5) };
            let n = d.count(OP_KEYS_MAX, 12)?;
            let pairs = (0..n).map(|_| Ok((score(d)?, value(d)?))).collect::<Result<_, WireError>>()?;
            ZCmd::Add { flags, pairs }
        }
        1 => ZCmd::IncrBy(score(d)?, value(d)?),
        2 => ZCmd::Score(value(d)?),
        3 => ZCmd::MScore(values(d)?),
        4 => ZCmd::Rem(values(d)?),
        5 => ZCmd::Card,
        6 => match by(d)? {
            ZBy::Score(lo, hi) => ZCmd::Count(lo, hi),
            _ => return Err(d.error("ZCOUNT of a range not by score")),
        },
        7 => match by(d)? {
            ZBy::Lex(lo, hi) => ZCmd::LexCount(lo, hi),
            _ => return Err(d.error("ZLEXCOUNT of a range not by member")),
        },
        8 => ZCmd::Rank { member: value(d)?, rev: flag(d)? },
        9 => {
            let (by, rev, limited) = (by(d)?, flag(d)?, flag(d)?);
            let (o, c) = (d.u64()? as i64, d.u64()? as i64);
            ZCmd::Range { by, rev, limit: limited.then_some((o, c)), with_scores: flag(d)? }
        }
        10 => {
            let (max, some) = (flag(d)?, flag(d)?);
            let n = d.u64()?;
            ZCmd::Pop { max, count: some.then_some(n) }
        }
        11 => ZCmd::RemRange(by(d)?),
        t => return Err(d.error(format!("unknown sorted set command {t}"))),
    })
}

/// A range of a sorted set: a sub-tag (rank, score, member), then its ends.
fn encode_by<'e>(e: &'e mut Encoder, by: &ZBy) -> &'e mut Encoder {
    let lex = |e: &'e mut Encoder, b: &LexBound| match b {
        LexBound::Min => e.u8(0),
        LexBound::Max => e.u8(1),
        LexBound::Closed(m) => e.u8(2).bytes(m),
        LexBound::Open(m) => e.u8(3).bytes(m),
    };
    match by {
        ZBy::Rank(a, b) => e.u8(0).u64(*a as u64).u64(*b as u64),
        ZBy::Score(lo, hi) => {
            let e = e.u8(1).u64(lo.score.get().to_bits()).u8(u8::from(lo.open));
            e.u64(hi.score.get().to_bits()).u8(u8::from(hi.open))
        }
        ZBy::Lex(lo, hi) => {
            let e = lex(e.u8(2), lo);
            lex(e, hi)
        }
    }
}

fn by(d: &mut Decoder<'_>) -> Result<ZBy, WireError> {
    let lex = |d: &mut Decoder<'_>| -> Result<LexBound, WireError> {
        Ok(match d.u8()? {
            0 => LexBound::Min,
            1 => LexBound::Max,
            2 => LexBound::Closed(value(d)?),
            3 => LexBound::Open(value(d)?),
            b => return Err(d.error(format!("unknown member bound {b}"))),
        })
    };
    Ok(match d.u8()? {
        0 => ZBy::Rank(d.u64()? as i64, d.u64()? as i64),
        1 => {
            let lo = ScoreBound { score: score(d)?, open: flag(d)? };
            ZBy::Score(lo, ScoreBound { score: score(d)?, open: flag(d)? })
        }
        2 => ZBy::Lex(lex(d)?, lex(d)?),
        b => return Err(d.error(format!("unknown range kind {b}"))),
    })
}

/// A score: never NaN.
fn score(d: &mut Decoder<'_>) -> Result<Score, WireError> {
    let bits = d.u64()?;
    Score::new(f64::from_bits(bits)).ok_or_else(|| d.error("a score that is not a number"))
}

/// A TTL as [`ttl`] reads it.
fn encode_ttl(e: &mut Encoder, ttl: Ttl) -> &mut Encoder {
    match ttl {
        Ttl::Clear => e.u8(0),
        Ttl::Keep => e.u8(1),
        Ttl::Expire(d) => encode_deadline(e.u8(2), d),
    }
}

fn ttl(d: &mut Decoder<'_>) -> Result<Ttl, WireError> {
    match d.u8()? {
        0 => Ok(Ttl::Clear),
        1 => Ok(Ttl::Keep),
        2 => Ok(Ttl::Expire(deadline(d)?)),
        b => Err(d.error(format!("unknown TTL {b}"))),
    }
}

fn encode_deadline(e: &mut Encoder, deadline: Deadline) -> &mut Encoder {
    match deadline {
        Deadline::In(ms) => e.u8(0).u64(ms as u64),
        Deadline::At(ms) => e.u8(1).u64(ms as u64),
    }
}

fn deadline(d: &mut Decoder<'_>) -> Result<Deadline, WireError> {
    match d.u8()? {
        0 => Ok(Deadline::In(d.u64()? as i64)),
        1 => Ok(Deadline::At(d.u64()? as i64)),
        b => Err(d.error(format!("unknown deadline {b}"))),
    }
}

fn ttl_cmd_byte(cmd: TtlCmd) -> u8 {
    TtlCmd::ALL.iter().position(|&c| c == cmd).expect("every command is listed") as u8
}

fn ttl_cmd(d: &mut Decoder<'_>) -> Result<TtlCmd, WireError> {
    let b = d.u8()?;
    TtlCmd::ALL.get(usize::from(b)).copied().ok_or_else(|| d.error(format!("unknown deadline command {b}")))
}

/// An optional pattern or kind, at most a key's length.
fn decode_bounded(d: &mut Decoder<'_>) -> Result<Option<Vec<u8>>, WireError> {
    let v = decode_value(d)?;
    if v.as_ref().is_some_and(|v| v.len() > KEY_MAX) {
        return Err(d.error(format!("pattern exceeds {KEY_MAX}")));
    }
    Ok(v)
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
