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
//! | `SET k v ... EX\|PX\|EXAT\|PXAT n\|KEEPTTL`, `SETEX`, `PSETEX` | `Set` with a [`Ttl`] | as `SET` |
//! | `SETNX k v` | `Create` | integer: 1 if set |
//! | `EXPIRE`/`PEXPIRE`/`EXPIREAT`/`PEXPIREAT k n [NX\|XX\|GT\|LT]` | `Expire` | integer |
//! | `TTL`, `PTTL`, `EXPIRETIME`, `PEXPIRETIME`, `PERSIST` | `Ttl`, `Persist` | integer |
//! | `GETEX k [EX\|PX\|EXAT\|PXAT n\|PERSIST]`, `GETDEL`, `GETRANGE` | `GetEx`, `GetDel`, `GetRange` | bulk or nil |
//! | `SETRANGE`, `MSETNX` | `SetRange`, `MSetNx` | integer |
//! | `INCRBYFLOAT` | `IncrByFloat` | bulk: the new value |
//! | `RENAME`, `RENAMENX`, `COPY` | `Rename`, `Copy` | `+OK`; integer |
//! | `KEYS p`, `SCAN c [MATCH p] [COUNT n] [TYPE t]` | `Keys`, `Scan` | array; the next cursor and an array |
//! | `RANDOMKEY`, `OBJECT ENCODING k` | `RandomKey`, `Encoding` | bulk or nil |
//! | `SPOP`, `SRANDMEMBER k [n]` | `Members` | bulk or nil; with `n` an array |
//! | `FLUSHALL`, `UNLINK` | `FlushDb`, `Del` | as `FLUSHDB`, `DEL` |
//! | `TIME` | `Time` | the log's time: seconds and microseconds |
//!
//! `WATCH k...` reads the keys' versions (`Versions`), and `EXEC` after it
//! is one `Exec` of the queued operations, which runs them only if no
//! watched key changed (a nil array otherwise); the gateway keeps the
//! versions and queues the commands.
//!
//! Connection commands (`PING`, `HELLO`, ...) belong to the server and never
//! reach this table. Deadlines are on the log's clock
//! ([`psmr_model::Stamp`]).

use super::{
    parse_integer, Combine, Deadline, ExpireCond, HashCmd, KvError, KvOp, KvReply, ListCmd, Pair, SetCmd, SetWhen, Ttl,
    TtlCmd, ZCmd, EXEC_KEYS_MAX, KEY_MAX, OP_KEYS_MAX, VALUE_MAX,
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
        parse: |a| {
            Ok(KvOp::Set { key: key(&a[1])?, value: value(&a[2])?, when: SetWhen::Always, get: true, ttl: Ttl::Clear })
        },
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
    Spec { name: "spop", arity: -2, parse: spop },
    Spec { name: "srandmember", arity: -2, parse: srandmember },
    Spec { name: "setnx", arity: 3, parse: |a| Ok(KvOp::Create { key: key(&a[1])?, value: value(&a[2])? }) },
    Spec { name: "setex", arity: 4, parse: |a| setex(a, TtlCmd::SetEx, 1000) },
    Spec { name: "psetex", arity: 4, parse: |a| setex(a, TtlCmd::PSetEx, 1) },
    Spec { name: "getex", arity: -2, parse: getex },
    Spec { name: "getdel", arity: 2, parse: |a| Ok(KvOp::GetDel { key: key(&a[1])? }) },
    Spec {
        name: "getrange",
        arity: 4,
        parse: |a| Ok(KvOp::GetRange { key: key(&a[1])?, start: integer(&a[2])?, end: integer(&a[3])? }),
    },
    Spec { name: "setrange", arity: 4, parse: setrange },
    Spec { name: "incrbyfloat", arity: 3, parse: incrbyfloat },
    Spec { name: "msetnx", arity: -3, parse: |a| Ok(KvOp::MSetNx { pairs: pairs_of(&a[1..], "msetnx")? }) },
    Spec { name: "expire", arity: -3, parse: |a| expire(a, TtlCmd::Expire) },
    Spec { name: "pexpire", arity: -3, parse: |a| expire(a, TtlCmd::PExpire) },
    Spec { name: "expireat", arity: -3, parse: |a| expire(a, TtlCmd::ExpireAt) },
    Spec { name: "pexpireat", arity: -3, parse: |a| expire(a, TtlCmd::PExpireAt) },
    Spec { name: "persist", arity: 2, parse: |a| Ok(KvOp::Persist { key: key(&a[1])? }) },
    Spec { name: "ttl", arity: 2, parse: |a| Ok(KvOp::Ttl { key: key(&a[1])?, ms: false, absolute: false }) },
    Spec { name: "pttl", arity: 2, parse: |a| Ok(KvOp::Ttl { key: key(&a[1])?, ms: true, absolute: false }) },
    Spec { name: "expiretime", arity: 2, parse: |a| Ok(KvOp::Ttl { key: key(&a[1])?, ms: false, absolute: true }) },
    Spec { name: "pexpiretime", arity: 2, parse: |a| Ok(KvOp::Ttl { key: key(&a[1])?, ms: true, absolute: true }) },
    Spec { name: "rename", arity: 3, parse: |a| Ok(KvOp::Rename { from: key(&a[1])?, to: key(&a[2])?, nx: false }) },
    Spec { name: "renamenx", arity: 3, parse: |a| Ok(KvOp::Rename { from: key(&a[1])?, to: key(&a[2])?, nx: true }) },
    Spec { name: "copy", arity: -3, parse: copy },
    Spec { name: "keys", arity: 2, parse: |a| Ok(KvOp::Keys { pattern: key(&a[1])? }) },
    Spec { name: "scan", arity: -2, parse: scan },
    Spec { name: "randomkey", arity: 1, parse: |_| Ok(KvOp::RandomKey) },
    Spec { name: "time", arity: 1, parse: |_| Ok(KvOp::Time) },
    Spec { name: "flushall", arity: -1, parse: flushdb },
    Spec { name: "unlink", arity: -2, parse: |a| Ok(KvOp::Del { keys: keys(&a[1..])? }) },
    Spec { name: "object", arity: -2, parse: object },
    Spec { name: "blpop", arity: -3, parse: |a| bpop(a, true) },
    Spec { name: "brpop", arity: -3, parse: |a| bpop(a, false) },
    Spec { name: "blmove", arity: 6, parse: |a| blocking(a, |a| lmove(a, side(&a[3])?, side(&a[4])?)) },
    Spec { name: "brpoplpush", arity: 4, parse: |a| blocking(a, |a| lmove(a, false, true)) },
    Spec { name: "zadd", arity: -4, parse: sorted::zadd },
    Spec { name: "zincrby", arity: 4, parse: sorted::zincrby },
    Spec { name: "zscore", arity: 3, parse: sorted::zscore },
    Spec { name: "zmscore", arity: -3, parse: sorted::zmscore },
    Spec { name: "zrem", arity: -3, parse: sorted::zrem },
    Spec { name: "zcard", arity: 2, parse: |a| Ok(KvOp::Sorted { key: key(&a[1])?, cmd: ZCmd::Card }) },
    Spec { name: "zcount", arity: 4, parse: sorted::zcount },
    Spec { name: "zlexcount", arity: 4, parse: sorted::zlexcount },
    Spec { name: "zrank", arity: 3, parse: |a| sorted::zrank(a, false) },
    Spec { name: "zrevrank", arity: 3, parse: |a| sorted::zrank(a, true) },
    Spec { name: "zrange", arity: -4, parse: sorted::zrange },
    Spec { name: "zrangebyscore", arity: -4, parse: sorted::zrangebyscore },
    Spec { name: "zrevrangebyscore", arity: -4, parse: sorted::zrevrangebyscore },
    Spec { name: "zrevrange", arity: -4, parse: sorted::zrevrange },
    Spec { name: "zrangebylex", arity: -4, parse: sorted::zrangebylex },
    Spec { name: "zrevrangebylex", arity: -4, parse: sorted::zrevrangebylex },
    Spec { name: "zpopmin", arity: -2, parse: |a| sorted::zpop(a, false, "zpopmin") },
    Spec { name: "zpopmax", arity: -2, parse: |a| sorted::zpop(a, true, "zpopmax") },
    Spec { name: "zremrangebyrank", arity: 4, parse: |a| sorted::zremrange(a, "rank") },
    Spec { name: "zremrangebyscore", arity: 4, parse: |a| sorted::zremrange(a, "score") },
    Spec { name: "zremrangebylex", arity: 4, parse: |a| sorted::zremrange(a, "lex") },
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

    fn waits(&self, args: &[Bytes]) -> Option<Result<Option<std::time::Duration>, Reply>> {
        let name = args.first()?.to_ascii_lowercase();
        let at = match name.as_slice() {
            b"blpop" | b"brpop" | b"blmove" | b"brpoplpush" => args.len().checked_sub(1)?,
            _ => return None,
        };
        (at > 0).then(|| timeout(&args[at]))
    }

    fn watch(&self, keys: &[Bytes]) -> Result<KvOp, Reply> {
        Ok(KvOp::Versions { keys: self::keys(keys)? })
    }

    fn versions(&self, reply: KvReply) -> Result<Vec<u64>, Reply> {
        match reply {
            KvReply::Versions(versions) => Ok(versions),
            KvReply::Error(e) => Err(Reply::error(e.to_string())),
            other => Err(Reply::error(format!("ERR unexpected reply to WATCH: {other:?}"))),
        }
    }

    fn exec(&self, watched: Vec<(Bytes, u64)>, ops: Vec<KvOp>) -> Result<KvOp, Reply> {
        let (keys, versions): (Vec<Bytes>, Vec<u64>) = watched.into_iter().unzip();
        let op = KvOp::Exec { watched: self::keys(&keys)?, versions, ops };
        let named = op.keys().count();
        if named > EXEC_KEYS_MAX {
            let why = format!(
                "ERR a transaction names at most {EXEC_KEYS_MAX} keys, its commands and WATCH's; this one {named}"
            );
            return Err(Reply::error(why));
        }
        Ok(op)
    }

    fn nothing_yet(&self, op: &KvOp, reply: &KvReply) -> bool {
        matches!(op, KvOp::BPop { .. } | KvOp::LMove { .. }) && *reply == KvReply::Value(None)
    }

    fn reply(&self, op: &KvOp, reply: KvReply) -> Reply {
        match (op, reply) {
            (_, KvReply::Error(e)) => Reply::error(e.to_string()),
            (KvOp::Sorted { cmd, .. }, reply) => sorted::reply(cmd, reply),
            (KvOp::Time, KvReply::Int(ms)) => {
                Reply::array(vec![Reply::bulk((ms / 1000).to_string()), Reply::bulk((ms % 1000 * 1000).to_string())])
            }
            (KvOp::Exec { ops, .. }, KvReply::Exec(Some(replies))) => {
                Reply::array(ops.iter().zip(replies).map(|(op, r)| self.reply(op, r)).collect())
            }
            (KvOp::BPop { .. }, KvReply::Value(None)) => Reply::null_array(),
            (KvOp::Type { .. }, KvReply::Value(Some(kind))) => Reply::simple(String::from_utf8_lossy(&kind)),
            (KvOp::Scan { .. }, KvReply::Values(mut vs)) if !vs.is_empty() => {
                let keys = vs.split_off(1);
                Reply::array(vec![
                    bulk_or_nil(vs.pop().flatten()),
                    Reply::array(keys.into_iter().map(bulk_or_nil).collect()),
                ])
            }
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
        KvReply::Versions(vs) => Reply::array(vs.into_iter().map(|v| Reply::integer(v as i64)).collect()),
        KvReply::Exec(None) => Reply::null_array(),
        KvReply::Exec(Some(rs)) => Reply::array(rs.into_iter().map(|r| plain_reply(&KvOp::DbSize, r)).collect()),
        KvReply::Done(done) => match op {
            KvOp::Set { .. } | KvOp::MSet { .. } | KvOp::FlushDb | KvOp::Rename { .. } if done => Reply::ok(),
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

/// `SET key value [NX|XX] [GET] [EX s|PX ms|EXAT s|PXAT ms|KEEPTTL]`,
/// options in any order, as Redis parses them: repeating an option is
/// allowed, NX with XX is not, nor two kinds of deadline.
fn set(a: &[Bytes]) -> Result<KvOp, Reply> {
    let (key, value) = (key(&a[1])?, value(&a[2])?);
    let (mut when, mut get, mut ttl) = (SetWhen::Always, false, Ttl::Clear);
    let mut options = a[3..].iter();
    while let Some(option) = options.next() {
        let upper = option.to_ascii_uppercase();
        match upper.as_slice() {
            b"NX" if when != SetWhen::IfPresent => when = SetWhen::IfAbsent,
            b"XX" if when != SetWhen::IfAbsent => when = SetWhen::IfPresent,
            b"GET" => get = true,
            b"KEEPTTL" if matches!(ttl, Ttl::Clear | Ttl::Keep) => ttl = Ttl::Keep,
            b"EX" | b"PX" | b"EXAT" | b"PXAT" if ttl == Ttl::Clear => {
                let arg = options.next().ok_or_else(syntax_error)?;
                ttl = Ttl::Expire(deadline_of(&upper, arg, TtlCmd::Set)?);
            }
            _ => return Err(syntax_error()),
        }
    }
    Ok(KvOp::Set { key, value, when, get, ttl })
}

/// The deadline `EX`, `PX`, `EXAT` or `PXAT` (`unit`) with argument `arg`
/// gives a command `cmd` of the `SET` family: a positive integer, in ms
/// within `i64`.
fn deadline_of(unit: &[u8], arg: &Bytes, cmd: TtlCmd) -> Result<Deadline, Reply> {
    let n = integer(arg)?;
    let seconds = matches!(unit, b"EX" | b"EXAT");
    let ms = if seconds { n.checked_mul(1000) } else { Some(n) };
    let invalid = || Reply::error(KvError::InvalidExpire(cmd).to_string());
    let ms = ms.filter(|_| n > 0).ok_or_else(invalid)?;
    Ok(if unit.ends_with(b"AT") { Deadline::At(ms) } else { Deadline::In(ms) })
}

/// `SETEX key seconds value`, `PSETEX key ms value` (`scale` ms per unit).
fn setex(a: &[Bytes], cmd: TtlCmd, scale: i64) -> Result<KvOp, Reply> {
    let n = integer(&a[2])?;
    let ms = n.checked_mul(scale).filter(|_| n > 0);
    let ms = ms.ok_or_else(|| Reply::error(KvError::InvalidExpire(cmd).to_string()))?;
    let ttl = Ttl::Expire(Deadline::In(ms));
    Ok(KvOp::Set { key: key(&a[1])?, value: value(&a[3])?, when: SetWhen::Always, get: false, ttl })
}

/// `GETEX key [EX s|PX ms|EXAT s|PXAT ms|PERSIST]`.
fn getex(a: &[Bytes]) -> Result<KvOp, Reply> {
    let key = key(&a[1])?;
    let ttl = match &a[2..] {
        [] => Ttl::Keep,
        [p] if p.eq_ignore_ascii_case(b"PERSIST") => Ttl::Clear,
        [unit, arg] => {
            let unit = unit.to_ascii_uppercase();
            if !matches!(unit.as_slice(), b"EX" | b"PX" | b"EXAT" | b"PXAT") {
                return Err(syntax_error());
            }
            Ttl::Expire(deadline_of(&unit, arg, TtlCmd::GetEx)?)
        }
        _ => return Err(syntax_error()),
    };
    Ok(KvOp::GetEx { key, ttl })
}

/// `EXPIRE key n [NX|XX|GT|LT]` and its kin (`cmd`), as Redis 7 parses
/// them: the options first, then the number; a deadline in seconds must
/// stay within `i64` once in ms.
fn expire(a: &[Bytes], cmd: TtlCmd) -> Result<KvOp, Reply> {
    let key = key(&a[1])?;
    let (mut nx, mut xx, mut gt, mut lt) = (false, false, false, false);
    for option in &a[3..] {
        match option.to_ascii_uppercase().as_slice() {
            b"NX" => nx = true,
            b"XX" => xx = true,
            b"GT" => gt = true,
            b"LT" => lt = true,
            _ => return Err(Reply::error(format!("ERR Unsupported option {}", String::from_utf8_lossy(option)))),
        }
    }
    if nx && (xx || gt || lt) {
        return Err(Reply::error("ERR NX and XX, GT or LT options at the same time are not compatible"));
    }
    if gt && lt {
        return Err(Reply::error("ERR GT and LT options at the same time are not compatible"));
    }
    // GT implies a deadline already (none is an infinite one), so XX adds
    // nothing to it; to LT it does.
    let cond = match (nx, xx, gt, lt) {
        (true, ..) => ExpireCond::Nx,
        (_, _, true, _) => ExpireCond::Gt,
        (_, true, _, true) => ExpireCond::XxLt,
        (_, false, _, true) => ExpireCond::Lt,
        (_, true, ..) => ExpireCond::Xx,
        _ => ExpireCond::Always,
    };
    let n = integer(&a[2])?;
    let seconds = matches!(cmd, TtlCmd::Expire | TtlCmd::ExpireAt);
    let ms = if seconds { n.checked_mul(1000) } else { Some(n) };
    let ms = ms.ok_or_else(|| Reply::error(KvError::InvalidExpire(cmd).to_string()))?;
    let deadline =
        if matches!(cmd, TtlCmd::ExpireAt | TtlCmd::PExpireAt) { Deadline::At(ms) } else { Deadline::In(ms) };
    Ok(KvOp::Expire { key, deadline, cond, cmd })
}

/// `SETRANGE key offset value`.
fn setrange(a: &[Bytes]) -> Result<KvOp, Reply> {
    let offset = integer(&a[2])?;
    let offset = u64::try_from(offset).map_err(|_| Reply::error("ERR offset is out of range"))?;
    Ok(KvOp::SetRange { key: key(&a[1])?, offset, value: value(&a[3])? })
}

/// `INCRBYFLOAT key increment`: the increment must read as a float.
fn incrbyfloat(a: &[Bytes]) -> Result<KvOp, Reply> {
    if super::store::float(&a[2]).is_none() {
        return Err(Reply::error(KvError::NotFloat.to_string()));
    }
    Ok(KvOp::IncrByFloat { key: key(&a[1])?, by: value(&a[2])? })
}

/// `COPY source destination [DB 0] [REPLACE]`: psmr has database 0 only.
fn copy(a: &[Bytes]) -> Result<KvOp, Reply> {
    let (from, to) = (key(&a[1])?, key(&a[2])?);
    let mut replace = false;
    let mut options = a[3..].iter();
    while let Some(option) = options.next() {
        match option.to_ascii_uppercase().as_slice() {
            b"REPLACE" => replace = true,
            b"DB" => {
                let db = integer(options.next().ok_or_else(syntax_error)?)?;
                if db != 0 {
                    return Err(Reply::error("ERR psmr has one database, 0"));
                }
            }
            _ => return Err(syntax_error()),
        }
    }
    Ok(KvOp::Copy { from, to, replace })
}

/// `SCAN cursor [MATCH pattern] [COUNT n] [TYPE kind]`.
fn scan(a: &[Bytes]) -> Result<KvOp, Reply> {
    let cursor = std::str::from_utf8(&a[1])
        .ok()
        .and_then(|c| c.parse::<u64>().ok())
        .ok_or_else(|| Reply::error("ERR invalid cursor"))?;
    let (mut pattern, mut count, mut kind) = (None, 10u64, None);
    for option in a[2..].chunks(2) {
        let [name, arg] = option else { return Err(syntax_error()) };
        match name.to_ascii_uppercase().as_slice() {
            b"MATCH" => pattern = Some(key(arg)?),
            b"COUNT" => {
                count = u64::try_from(integer(arg)?).ok().filter(|&n| n >= 1).ok_or_else(syntax_error)?;
            }
            b"TYPE" => kind = Some(key(arg)?),
            _ => return Err(syntax_error()),
        }
    }
    Ok(KvOp::Scan { cursor, pattern, count, kind })
}

/// `OBJECT ENCODING key`; the other subcommands are not kept.
fn object(a: &[Bytes]) -> Result<KvOp, Reply> {
    match a {
        [_, sub, k] if sub.eq_ignore_ascii_case(b"ENCODING") => Ok(KvOp::Encoding { key: key(k)? }),
        [_, sub, ..] => {
            Err(Reply::error(format!("ERR unknown subcommand '{}'. Try OBJECT HELP.", String::from_utf8_lossy(sub))))
        }
        _ => Err(wrong_arity("object")),
    }
}

/// A waiting command's timeout, in seconds (fractions allowed; 0: for
/// ever), as Redis 7 reads it.
fn timeout(arg: &Bytes) -> Result<Option<std::time::Duration>, Reply> {
    let secs = std::str::from_utf8(arg)
        .ok()
        .filter(|t| !t.is_empty() && !t.starts_with(char::is_whitespace))
        .and_then(|t| t.parse::<f64>().ok())
        .filter(|s| s.is_finite() && s.abs() < 1e15)
        .ok_or_else(|| Reply::error("ERR timeout is not a float or out of range"))?;
    if secs < 0.0 {
        return Err(Reply::error("ERR timeout is negative"));
    }
    Ok((secs > 0.0).then(|| std::time::Duration::from_secs_f64(secs)))
}

/// A waiting command's operation, its timeout checked first (Redis
/// refuses a bad timeout before it looks at the keys).
fn blocking(a: &[Bytes], op: impl FnOnce(&[Bytes]) -> Result<KvOp, Reply>) -> Result<KvOp, Reply> {
    timeout(&a[a.len() - 1])?;
    op(a)
}

/// `BLPOP`/`BRPOP key [key ...] timeout`.
fn bpop(a: &[Bytes], left: bool) -> Result<KvOp, Reply> {
    blocking(a, |a| Ok(KvOp::BPop { keys: keys(&a[1..a.len() - 1])?, left }))
}

/// `SPOP key [count]`.
fn spop(a: &[Bytes]) -> Result<KvOp, Reply> {
    let count = match a.len() {
        2 => None,
        3 => Some(positive(&a[2])?),
        _ => return Err(syntax_error()),
    };
    members(a, SetCmd::Pop(count))
}

/// `SRANDMEMBER key [count]` (a negative count repeats).
fn srandmember(a: &[Bytes]) -> Result<KvOp, Reply> {
    let count = match a.len() {
        2 => None,
        3 => Some(integer(&a[2])?),
        _ => return Err(syntax_error()),
    };
    members(a, SetCmd::RandMember(count))
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

mod sorted;

#[cfg(test)]
mod tests;
