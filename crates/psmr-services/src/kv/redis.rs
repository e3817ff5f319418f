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
//!
//! Connection commands (`PING`, `HELLO`, ...) belong to the server and never
//! reach this table. Key expiry (`EX`, `PX`, `EXAT`, `PXAT`, `KEEPTTL`) is
//! refused: it would need a clock every replica agrees on.

use super::{parse_integer, KvError, KvOp, KvReply, SetWhen, KEY_MAX, OP_KEYS_MAX, VALUE_MAX};
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
    if a.len() % 2 == 0 {
        return Err(wrong_arity("mset"));
    }
    let rest = &a[1..];
    check_key_count(rest.len() / 2)?;
    let pairs = rest.chunks_exact(2).map(|kv| Ok((key(&kv[0])?, value(&kv[1])?))).collect::<Result<_, Reply>>()?;
    Ok(KvOp::MSet { pairs })
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
