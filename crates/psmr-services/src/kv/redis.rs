//! [`KvRedis`]: the store's Redis command table.
//!
//! Each supported command maps to exactly one [`KvOp`], so it goes through
//! the log and executes on every replica like any other operation, and its
//! [`KvReply`] is said back as Redis says it:
//!
//! | Command | Operation | Reply |
//! |---|---|---|
//! | `GET k` | `Read` | bulk or nil |
//! | `SET k v [NX\|XX] [GET]` | `Set` | `+OK`, nil if NX/XX stopped it; with GET the old value |
//! | `GETSET k v` | `Set { when: Always, get: true }` | old value or nil |
//! | `DEL k...` | `Del` | integer: keys removed |
//! | `EXISTS k...` | `Exists` | integer: keys found, repeats counted |
//! | `INCR`/`DECR k`, `INCRBY`/`DECRBY k n` | `Incr` | integer: the new value |
//! | `MGET k...` | `MGet` | array of bulk or nil |
//! | `MSET k v ...` | `MSet` | `+OK` |
//! | `APPEND k v` | `Append` | integer: the new length |
//! | `STRLEN k` | `Strlen` | integer |
//! | `DBSIZE` | `DbSize` | integer |
//! | `FLUSHDB [ASYNC\|SYNC]` | `FlushDb` | `+OK` |
//! | `HSET k f v ...`, `HMSET`, `HSETNX` | `Hash` | integer: fields added; `+OK` for `HMSET` |
//! | `HGET`, `HMGET`, `HGETALL`, `HKEYS`, `HVALS` | `Hash` | bulk or nil; arrays (a map in RESP3 for `HGETALL`), in field order |
//! | `HDEL`, `HLEN`, `HEXISTS`, `HSTRLEN`, `HINCRBY` | `Hash` | integer |
//! | `HINCRBYFLOAT k f x` | `Hash` | bulk: the new value |
//! | `LPUSH`/`RPUSH k v...` | `List` | integer: the new length |
//! | `LPOP`/`RPOP k [n]` | `List` | bulk or nil; with `n` an array (nil if no list) |
//! | `LRANGE k a b`, `LINDEX k i`, `LLEN k` | `List` | array; bulk or nil; integer |
//! | `LSET k i v`, `LTRIM k a b` | `List` | `+OK` |
//! | `LREM k n v`, `LINSERT k BEFORE\|AFTER p v` | `List` | integer |
//! | `LPOS k v [RANK r] [COUNT n] [MAXLEN m]` | `List` | integer or nil; with `COUNT` an array |
//! | `LMOVE a b LEFT\|RIGHT LEFT\|RIGHT`, `RPOPLPUSH a b` | `LMove` | bulk or nil |
//! | `SADD`/`SREM k m...`, `SCARD`, `SISMEMBER` | `Members` | integer |
//! | `SMEMBERS k`, `SMISMEMBER k m...` | `Members` | array, in byte order; array of 1 and 0 |
//! | `SINTER`/`SUNION`/`SDIFF k...` | `Combine` | array, in byte order |
//! | `SINTERSTORE`/`SUNIONSTORE`/`SDIFFSTORE d k...` | `Combine` | integer: the size stored |
//! | `SMOVE a b m` | `SMove` | integer |
//! | `TYPE k` | `Type` | `+string`, `+hash`, `+list`, `+set` or `+none` |
//!
//! Connection commands (`PING`, `HELLO`, ...) belong to the server and never
//! reach this table. Key expiry (`EX`, `PX`, `EXAT`, `PXAT`, `KEEPTTL`) is
//! refused: it would need a clock every replica agrees on.

use super::{
    parse_integer, Combine, HashCmd, KvError, KvOp, KvReply, ListCmd, Pair, SetCmd, SetWhen, KEY_MAX, OP_KEYS_MAX,
    VALUE_MAX,
};
use bytes::Bytes;
use psmr_resp::{unknown_command, wrong_arity, Commands, Reply};

/// The key-value store's Redis commands (see the module documentation).
#[derive(Clone, Copy, Debug, Default)]
pub struct KvRedis;

/// One command: its lower-case name, its arity as Redis states it (`n`:
/// exactly `n` arguments counting the name; `-n`: at least `n`), and how
/// its arguments, arity checked, become an operation.
struct Spec {
    name: &'static str,
    arity: i32,
    parse: fn(&[Bytes]) -> Result<KvOp, Reply>,
}

const TABLE: &[Spec] = &[
    Spec { name: "get", arity: 2, parse: |a| Ok(KvOp::Read { key: key(&a[1])? }) },
    Spec { name: "set", arity: -3, parse: set },
    Spec {
        name: "getset",
        arity: 3,
        parse: |a| Ok(KvOp::Set { key: key(&a[1])?, value: value(&a[2])?, when: SetWhen::Always, get: true }),
    },
    Spec { name: "del", arity: -2, parse: |a| Ok(KvOp::Del { keys: keys(&a[1..])? }) },
    Spec { name: "exists", arity: -2, parse: |a| Ok(KvOp::Exists { keys: keys(&a[1..])? }) },
    Spec { name: "incr", arity: 2, parse: |a| Ok(KvOp::Incr { key: key(&a[1])?, by: 1 }) },
    Spec { name: "decr", arity: 2, parse: |a| Ok(KvOp::Incr { key: key(&a[1])?, by: -1 }) },
    Spec { name: "incrby", arity: 3, parse: |a| Ok(KvOp::Incr { key: key(&a[1])?, by: integer(&a[2])? }) },
    Spec { name: "decrby", arity: 3, parse: decrby },
    Spec { name: "mget", arity: -2, parse: |a| Ok(KvOp::MGet { keys: keys(&a[1..])? }) },
    Spec { name: "mset", arity: -3, parse: mset },
    Spec { name: "append", arity: 3, parse: |a| Ok(KvOp::Append { key: key(&a[1])?, value: value(&a[2])? }) },
    Spec { name: "strlen", arity: 2, parse: |a| Ok(KvOp::Strlen { key: key(&a[1])? }) },
    Spec { name: "dbsize", arity: 1, parse: |_| Ok(KvOp::DbSize) },
    Spec { name: "flushdb", arity: -1, parse: flushdb },
    Spec { name: "hset", arity: -4, parse: |a| hash(a, HashCmd::Set(field_pairs(a, "hset")?)) },
    Spec { name: "hmset", arity: -4, parse: |a| hash(a, HashCmd::MSet(field_pairs(a, "hmset")?)) },
    Spec { name: "hsetnx", arity: 4, parse: |a| hash(a, HashCmd::SetNx(key(&a[2])?, value(&a[3])?)) },
    Spec { name: "hget", arity: 3, parse: |a| hash(a, HashCmd::Get(key(&a[2])?)) },
    Spec { name: "hmget", arity: -3, parse: |a| hash(a, HashCmd::MGet(keys(&a[2..])?)) },
    Spec { name: "hdel", arity: -3, parse: |a| hash(a, HashCmd::Del(keys(&a[2..])?)) },
    Spec { name: "hgetall", arity: 2, parse: |a| hash(a, HashCmd::GetAll) },
    Spec { name: "hkeys", arity: 2, parse: |a| hash(a, HashCmd::Keys) },
    Spec { name: "hvals", arity: 2, parse: |a| hash(a, HashCmd::Vals) },
    Spec { name: "hlen", arity: 2, parse: |a| hash(a, HashCmd::Len) },
    Spec { name: "hexists", arity: 3, parse: |a| hash(a, HashCmd::Exists(key(&a[2])?)) },
    Spec { name: "hincrby", arity: 4, parse: |a| hash(a, HashCmd::IncrBy(key(&a[2])?, integer(&a[3])?)) },
    Spec { name: "hincrbyfloat", arity: 4, parse: hincrbyfloat },
    Spec { name: "hstrlen", arity: 3, parse: |a| hash(a, HashCmd::Strlen(key(&a[2])?)) },
    Spec { name: "type", arity: 2, parse: |a| Ok(KvOp::Type { key: key(&a[1])? }) },
    Spec { name: "lpush", arity: -3, parse: |a| list(a, ListCmd::Push { left: true, values: values(&a[2..])? }) },
    Spec { name: "rpush", arity: -3, parse: |a| list(a, ListCmd::Push { left: false, values: values(&a[2..])? }) },
    Spec { name: "lpop", arity: -2, parse: |a| pop(a, true, "lpop") },
    Spec { name: "rpop", arity: -2, parse: |a| pop(a, false, "rpop") },
    Spec { name: "lrange", arity: 4, parse: |a| list(a, ListCmd::Range(integer(&a[2])?, integer(&a[3])?)) },
    Spec { name: "llen", arity: 2, parse: |a| list(a, ListCmd::Len) },
    Spec { name: "lindex", arity: 3, parse: |a| list(a, ListCmd::Index(integer(&a[2])?)) },
    Spec { name: "lset", arity: 4, parse: |a| list(a, ListCmd::Set(integer(&a[2])?, value(&a[3])?)) },
    Spec { name: "lrem", arity: 4, parse: |a| list(a, ListCmd::Rem(integer(&a[2])?, value(&a[3])?)) },
    Spec { name: "ltrim", arity: 4, parse: |a| list(a, ListCmd::Trim(integer(&a[2])?, integer(&a[3])?)) },
    Spec { name: "linsert", arity: 5, parse: linsert },
    Spec { name: "lpos", arity: -3, parse: lpos },
    Spec { name: "lmove", arity: 5, parse: |a| lmove(a, side(&a[3])?, side(&a[4])?) },
    Spec { name: "rpoplpush", arity: 3, parse: |a| lmove(a, false, true) },
    Spec { name: "sadd", arity: -3, parse: |a| members(a, SetCmd::Add(values(&a[2..])?)) },
    Spec { name: "srem", arity: -3, parse: |a| members(a, SetCmd::Rem(values(&a[2..])?)) },
    Spec { name: "smembers", arity: 2, parse: |a| members(a, SetCmd::Members) },
    Spec { name: "sismember", arity: 3, parse: |a| members(a, SetCmd::IsMember(value(&a[2])?)) },
    Spec { name: "smismember", arity: -3, parse: |a| members(a, SetCmd::MIsMember(values(&a[2..])?)) },
    Spec { name: "scard", arity: 2, parse: |a| members(a, SetCmd::Card) },
    Spec { name: "sinter", arity: -2, parse: |a| combine(Combine::Inter, &a[1..], None) },
    Spec { name: "sunion", arity: -2, parse: |a| combine(Combine::Union, &a[1..], None) },
    Spec { name: "sdiff", arity: -2, parse: |a| combine(Combine::Diff, &a[1..], None) },
    Spec { name: "sinterstore", arity: -3, parse: |a| combine(Combine::Inter, &a[2..], Some(&a[1])) },
    Spec { name: "sunionstore", arity: -3, parse: |a| combine(Combine::Union, &a[2..], Some(&a[1])) },
    Spec { name: "sdiffstore", arity: -3, parse: |a| combine(Combine::Diff, &a[2..], Some(&a[1])) },
    Spec {
        name: "smove",
        arity: 4,
        parse: |a| Ok(KvOp::SMove { from: key(&a[1])?, to: key(&a[2])?, member: value(&a[3])? }),
    },
];

impl Commands for KvRedis {
    type Op = KvOp;
    type Reply = KvReply;

    fn operation(&self, args: &[Bytes]) -> Result<KvOp, Reply> {
        let name = args.first().map(|n| n.as_ref()).unwrap_or_default();
        let Some(spec) = TABLE.iter().find(|s| s.name.as_bytes().eq_ignore_ascii_case(name)) else {
            return Err(unknown_command(args));
        };
        let n = args.len();
        let fits = match usize::try_from(spec.arity) {
            Ok(exact) => n == exact,
            Err(_) => n >= spec.arity.unsigned_abs() as usize,
        };
        if !fits {
            return Err(wrong_arity(spec.name));
        }
        (spec.parse)(args)
    }

    fn names(&self) -> Vec<&'static str> {
        TABLE.iter().map(|s| s.name).collect()
    }

    fn reply(&self, op: &KvOp, reply: KvReply) -> Reply {
        match (op, reply) {
            (_, KvReply::Error(e)) => Reply::error(e.to_string()),
            (KvOp::Type { .. }, KvReply::Value(Some(kind))) => Reply::simple(String::from_utf8_lossy(&kind)),
            (KvOp::Hash { cmd: HashCmd::MSet(_), .. }, _) => Reply::ok(),
            (KvOp::List { cmd: ListCmd::Set(..) | ListCmd::Trim(..), .. }, _) => Reply::ok(),
            (KvOp::List { cmd: ListCmd::Pop { count: Some(_), .. }, .. }, KvReply::Value(None)) => Reply::null_array(),
            (KvOp::List { cmd: ListCmd::Pos { .. }, .. }, reply) => integers(reply),
            (KvOp::Members { cmd: SetCmd::MIsMember(_), .. }, reply) => integers(reply),
            (KvOp::Hash { cmd: HashCmd::GetAll, .. }, KvReply::Values(flat)) => Reply::map(
                flat.chunks_exact(2).map(|fv| (bulk_or_nil(fv[0].clone()), bulk_or_nil(fv[1].clone()))).collect(),
            ),
            (_, reply) => plain_reply(op, reply),
        }
    }
}

/// Numbers carried as decimal text (`LPOS`'s positions, `SMISMEMBER`'s
/// answers) as integers.
fn integers(reply: KvReply) -> Reply {
    let int = |p: Vec<u8>| Reply::integer(parse_integer(&p).unwrap_or(-1));
    match reply {
        KvReply::Value(p) => p.map_or_else(Reply::null, int),
        KvReply::Values(ps) => Reply::array(ps.into_iter().flatten().map(int).collect()),
        other => plain_reply(&KvOp::DbSize, other),
    }
}

/// The reply of an operation whose reply says it all.
fn plain_reply(op: &KvOp, reply: KvReply) -> Reply {
    match reply {
        KvReply::Error(e) => Reply::error(e.to_string()),
        KvReply::Value(v) => bulk_or_nil(v),
        KvReply::Int(n) => Reply::integer(n),
        KvReply::Values(vs) => Reply::array(vs.into_iter().map(bulk_or_nil).collect()),
        KvReply::Done(done) => match op {
            KvOp::Set { .. } | KvOp::MSet { .. } | KvOp::FlushDb if done => Reply::ok(),
            KvOp::Set { .. } => Reply::null(),
            // The paper's operations have no Redis command; 1 or 0 says
            // what their boolean does.
            _ => Reply::integer(i64::from(done)),
        },
    }
}

fn bulk_or_nil(v: Option<Vec<u8>>) -> Reply {
    v.map_or_else(Reply::null, Reply::bulk)
}

fn syntax_error() -> Reply {
    Reply::error("ERR syntax error")
}

fn not_an_integer() -> Reply {
    Reply::error(KvError::NotInteger.to_string())
}

/// `SET key value [NX|XX] [GET]`, options in any order, as Redis parses
/// them: repeating an option is allowed, NX with XX is not.
fn set(a: &[Bytes]) -> Result<KvOp, Reply> {
    let (key, value) = (key(&a[1])?, value(&a[2])?);
    let (mut when, mut get) = (SetWhen::Always, false);
    for option in &a[3..] {
        match option.to_ascii_uppercase().as_slice() {
            b"NX" if when != SetWhen::IfPresent => when = SetWhen::IfAbsent,
            b"XX" if when != SetWhen::IfAbsent => when = SetWhen::IfPresent,
            b"GET" => get = true,
            b"EX" | b"PX" | b"EXAT" | b"PXAT" | b"KEEPTTL" => {
                return Err(Reply::error(
                    "ERR psmr does not support key expiry (EX, PX, EXAT, PXAT, KEEPTTL): expiring keys would need \
                     a clock every replica agrees on, and replicas execute the log without one",
                ))
            }
            _ => return Err(syntax_error()),
        }
    }
    Ok(KvOp::Set { key, value, when, get })
}

/// `DECRBY key n`: `INCRBY` by `-n`, which does not exist for `i64::MIN`.
fn decrby(a: &[Bytes]) -> Result<KvOp, Reply> {
    let key = key(&a[1])?;
    let by = integer(&a[2])?.checked_neg().ok_or_else(|| Reply::error("ERR decrement would overflow"))?;
    Ok(KvOp::Incr { key, by })
}

/// `MSET key value [key value ...]`: an odd number of arguments after the
/// name is Redis's arity error.
fn mset(a: &[Bytes]) -> Result<KvOp, Reply> {
    Ok(KvOp::MSet { pairs: pairs_of(&a[1..], "mset")? })
}

/// A hash command `cmd` on the key `a[1]`.
fn hash(a: &[Bytes], cmd: HashCmd) -> Result<KvOp, Reply> {
    Ok(KvOp::Hash { key: key(&a[1])?, cmd })
}

/// The field-value pairs after `name key`: an odd count is Redis's arity
/// error.
fn field_pairs(a: &[Bytes], name: &str) -> Result<Vec<Pair>, Reply> {
    pairs_of(&a[2..], name)
}

/// Name-value pairs (keys or fields, and values) of command `name`: an odd
/// count is Redis's arity error.
fn pairs_of(rest: &[Bytes], name: &str) -> Result<Vec<Pair>, Reply> {
    if rest.len() % 2 != 0 {
        return Err(wrong_arity(name));
    }
    check_key_count(rest.len() / 2)?;
    rest.chunks_exact(2).map(|kv| Ok((key(&kv[0])?, value(&kv[1])?))).collect()
}

/// `HINCRBYFLOAT key field increment`: the increment must read as a float
/// (checked here to answer at once, and again where it executes).
fn hincrbyfloat(a: &[Bytes]) -> Result<KvOp, Reply> {
    if super::store::float(&a[3]).is_none() {
        return Err(Reply::error(KvError::NotFloat.to_string()));
    }
    hash(a, HashCmd::IncrByFloat(key(&a[2])?, value(&a[3])?))
}

/// A set command `cmd` on the key `a[1]`.
fn members(a: &[Bytes], cmd: SetCmd) -> Result<KvOp, Reply> {
    Ok(KvOp::Members { key: key(&a[1])?, cmd })
}

/// Sets `sets` combined `how`, kept at `store` if given.
fn combine(how: Combine, sets: &[Bytes], store: Option<&Bytes>) -> Result<KvOp, Reply> {
    Ok(KvOp::Combine { how, keys: keys(sets)?, store: store.map(key).transpose()? })
}

/// A list command `cmd` on the key `a[1]`.
fn list(a: &[Bytes], cmd: ListCmd) -> Result<KvOp, Reply> {
    Ok(KvOp::List { key: key(&a[1])?, cmd })
}

fn values(args: &[Bytes]) -> Result<Vec<Vec<u8>>, Reply> {
    check_key_count(args.len())?;
    args.iter().map(value).collect()
}

/// `LPOP`/`RPOP key [count]`.
fn pop(a: &[Bytes], left: bool, name: &str) -> Result<KvOp, Reply> {
    let count = match a.len() {
        2 => None,
        3 => Some(positive(&a[2])?),
        _ => return Err(wrong_arity(name)),
    };
    list(a, ListCmd::Pop { left, count })
}

/// A count that must not be negative.
fn positive(arg: &Bytes) -> Result<u64, Reply> {
    let n = integer(arg).map_err(|_| out_of_range())?;
    u64::try_from(n).map_err(|_| out_of_range())
}

fn out_of_range() -> Reply {
    Reply::error("ERR value is out of range, must be positive")
}

/// `LEFT` or `RIGHT`: true for left.
fn side(arg: &Bytes) -> Result<bool, Reply> {
    match arg.to_ascii_uppercase().as_slice() {
        b"LEFT" => Ok(true),
        b"RIGHT" => Ok(false),
        _ => Err(syntax_error()),
    }
}

fn lmove(a: &[Bytes], from_left: bool, to_left: bool) -> Result<KvOp, Reply> {
    Ok(KvOp::LMove { from: key(&a[1])?, to: key(&a[2])?, from_left, to_left })
}

/// `LINSERT key BEFORE|AFTER pivot element`.
fn linsert(a: &[Bytes]) -> Result<KvOp, Reply> {
    let before = match a[2].to_ascii_uppercase().as_slice() {
        b"BEFORE" => true,
        b"AFTER" => false,
        _ => return Err(syntax_error()),
    };
    list(a, ListCmd::Insert { before, pivot: value(&a[3])?, value: value(&a[4])? })
}

/// `LPOS key element [RANK rank] [COUNT num] [MAXLEN len]`, options in any
/// order, as Redis parses them.
fn lpos(a: &[Bytes]) -> Result<KvOp, Reply> {
    let element = value(&a[2])?;
    let (mut rank, mut count, mut maxlen) = (1i64, None, 0u64);
    for option in a[3..].chunks(2) {
        let [name, arg] = option else { return Err(syntax_error()) };
        match name.to_ascii_uppercase().as_slice() {
            b"RANK" => {
                rank = integer(arg)?;
                if rank == 0 {
                    return Err(Reply::error(
                        "ERR RANK can't be zero: use 1 to start from the first match, 2 from the second ... or use \
                         negative to start from the end of the list",
                    ));
                }
                if rank == i64::MIN {
                    return Err(Reply::error(
                        "ERR value is out of range, value must between -9223372036854775807 and 9223372036854775807",
                    ));
                }
            }
            b"COUNT" => {
                count = Some(u64::try_from(integer(arg)?).map_err(|_| Reply::error("ERR COUNT can't be negative"))?)
            }
            b"MAXLEN" => {
                maxlen = u64::try_from(integer(arg)?).map_err(|_| Reply::error("ERR MAXLEN can't be negative"))?
            }
            _ => return Err(syntax_error()),
        }
    }
    list(a, ListCmd::Pos { element, rank, count, maxlen })
}

/// `FLUSHDB [ASYNC|SYNC]`: both flush at once; flushing in the background
/// would let later commands see a half-empty store.
fn flushdb(a: &[Bytes]) -> Result<KvOp, Reply> {
    match a {
        [_] => Ok(KvOp::FlushDb),
        [_, mode] if mode.eq_ignore_ascii_case(b"async") || mode.eq_ignore_ascii_case(b"sync") => Ok(KvOp::FlushDb),
        _ => Err(syntax_error()),
    }
}

fn key(arg: &Bytes) -> Result<Vec<u8>, Reply> {
    if arg.len() > KEY_MAX {
        return Err(Reply::error(format!("ERR key exceeds maximum allowed size ({KEY_MAX} bytes)")));
    }
    Ok(arg.to_vec())
}

fn value(arg: &Bytes) -> Result<Vec<u8>, Reply> {
    if arg.len() > VALUE_MAX {
        return Err(Reply::error(KvError::TooLarge.to_string()));
    }
    Ok(arg.to_vec())
}

fn keys(args: &[Bytes]) -> Result<Vec<Vec<u8>>, Reply> {
    check_key_count(args.len())?;
    args.iter().map(key).collect()
}

fn check_key_count(n: usize) -> Result<(), Reply> {
    if n > OP_KEYS_MAX {
        return Err(Reply::error(format!("ERR psmr takes at most {OP_KEYS_MAX} keys per command, got {n}")));
    }
    Ok(())
}

/// An integer argument, parsed as Redis parses it.
fn integer(arg: &Bytes) -> Result<i64, Reply> {
    parse_integer(arg).ok_or_else(not_an_integer)
}

#[cfg(test)]
mod tests;
