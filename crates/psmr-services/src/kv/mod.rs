//! The key-value store of 004 §VI, grown into a small Redis: byte-string
//! keys holding strings, hashes, lists or sets, the create/read/update/
//! delete operations of the paper, and the commands of Redis on those
//! types ([`KvRedis`] maps them). A hash, list or set is one value under
//! one key: a command on it names that key, so it conflicts exactly as a
//! string command on the same key does.
//!
//! # Keys and conflicts
//!
//! Schedulers find conflicts on `u64` keys ([`psmr_model::Key`]). The
//! conflict key of a byte-string key is [`key_hash`], a stable hash, so
//! every replica and every process agrees on it. Two keys whose hashes
//! collide only make commands on them conflict when they did not need to:
//! that costs parallelism, never correctness.
//!
//! `DBSIZE`, `FLUSHDB`, `KEYS`, `SCAN` and `RANDOMKEY` depend on or change
//! every key, including keys no command has named yet
//! ([`KvOp::is_whole`]). The late schedulers decide conflicts on key sets
//! alone, so a command on every key needs a key that every command has: the
//! reserved [`ALL`]. Every operation reads `ALL` besides its own keys, and
//! those operations write it, so they conflict with everything. Reads
//! never conflict with each other, so nothing else conflicts more than it
//! did before `ALL` existed.
//!
//! # Class models
//!
//! Two class models approximate the key-level conflicts ([`KvModel`]):
//! readers-writers (an operation that writes nothing is `R`, any other
//! `W`), and one read and one write class per shard of the key space, a
//! key's shard being [`shard_of`] its conflict key. A multi-key operation
//! of the sharded model must keep to one shard, as in Redis Cluster, and
//! the operations on the whole store are refused there: they would need a class that
//! conflicts with every shard, which the model does not have.
//!
//! # Modules
//!
//! # Time and chance
//!
//! A key may have a deadline. Commands run at their log entry's time and
//! draw from its seed ([`psmr_model::Stamp`]), so every replica expires a
//! key, pops a member or picks a random key at the same point of the log
//! alike. A key past its deadline is gone for every command; a write to it
//! reclaims its memory.
//!
//! The store itself is [`KvService`]; [`KvCodec`] puts operations on the
//! wire; [`generate`] and [`generate_redis`] draw workloads; [`KvRedis`] is
//! the Redis command table.

mod codec;
mod redis;
mod sorted;
mod store;
mod workload;

pub use codec::KvCodec;
pub use redis::KvRedis;
pub use sorted::{format_g17, LexBound, Score, ScoreBound, ZAddFlags, ZBy, ZCmd};
pub use store::KvService;
pub use workload::{generate, generate_redis};

use crate::{clamp_shards, local_classes, local_mappings, readers_writers_mappings, shard_groups, WorkloadError};
use psmr_model::{Access, ClassId, ClassModel, ClientId, Command, Key, KeySet, Mapping, StableHasher};
use std::fmt;
use std::hash::Hasher;
use std::str::FromStr;
use thiserror::Error;

/// Largest key, in bytes. The codec and the Redis table refuse longer ones.
pub const KEY_MAX: usize = 16 * 1024;

/// Largest value, in bytes: what an operation may carry, and what `APPEND`
/// may grow a value to.
pub const VALUE_MAX: usize = 1 << 20;

/// Most keys one operation may name (`MGET`, `MSET`, `DEL`, `EXISTS`).
/// Every key is a conflict key the schedulers compare, so a command on
/// thousands of keys slows down every command that waits behind it.
pub const OP_KEYS_MAX: usize = 4096;

/// Most value bytes one `MGET` reply may hold. Without a bound, naming one
/// large key thousands of times would make every replica build a reply of
/// gigabytes; past it the reply is [`KvError::ReplyTooLarge`].
pub const REPLY_VALUES_MAX: usize = 4 * VALUE_MAX;

/// The conflict key that stands for the whole store: every operation reads
/// it, `DbSize` and `FlushDb` write it (see the module documentation).
/// [`key_hash`] never returns it.
pub const ALL: Key = psmr_model::KEY_ALL;

/// A key and a value, as `MSet` names them.
pub type Pair = (Vec<u8>, Vec<u8>);

/// An operation on the store.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum KvOp {
    /// Insert `key` unless it exists.
    Create {
        /// The key.
        key: Vec<u8>,
        /// Its value.
        value: Vec<u8>,
    },
    /// Get the value of `key` (Redis `GET`).
    Read {
        /// The key.
        key: Vec<u8>,
    },
    /// Replace the value of `key` if it exists.
    Update {
        /// The key.
        key: Vec<u8>,
        /// The new value.
        value: Vec<u8>,
    },
    /// Remove `key` if it exists.
    Delete {
        /// The key.
        key: Vec<u8>,
    },
    /// Set the value of `key`, creating it if needed.
    Put {
        /// The key.
        key: Vec<u8>,
        /// Its new value.
        value: Vec<u8>,
    },
    /// Redis `SET` (and `GETSET`): set `key` when `when` allows it; with
    /// `get`, reply with the value it had.
    Set {
        /// The key.
        key: Vec<u8>,
        /// Its new value.
        value: Vec<u8>,
        /// When to set it.
        when: SetWhen,
        /// Reply with the old value instead of whether it was set.
        get: bool,
        /// What becomes of the key's time to live when it is set.
        ttl: Ttl,
    },
    /// Redis `INCRBY` (and `INCR`, `DECR`, `DECRBY`): add `by` to the
    /// decimal integer stored at `key` (0 when absent).
    Incr {
        /// The key.
        key: Vec<u8>,
        /// The increment.
        by: i64,
    },
    /// Redis `APPEND`: append `value` to the value of `key`, creating it.
    Append {
        /// The key.
        key: Vec<u8>,
        /// The bytes to append.
        value: Vec<u8>,
    },
    /// Redis `STRLEN`: the length of the value of `key` (0 when absent).
    Strlen {
        /// The key.
        key: Vec<u8>,
    },
    /// Redis `MGET`: the values of `keys`.
    MGet {
        /// The keys, in the order of the reply.
        keys: Vec<Vec<u8>>,
    },
    /// Redis `MSET`: set every pair, in order (a later pair wins).
    MSet {
        /// Keys and their new values.
        pairs: Vec<Pair>,
    },
    /// Redis `DEL`: remove `keys`; the reply counts the keys removed.
    Del {
        /// The keys.
        keys: Vec<Vec<u8>>,
    },
    /// Redis `EXISTS`: how many of `keys` exist, a key named twice counted
    /// twice.
    Exists {
        /// The keys.
        keys: Vec<Vec<u8>>,
    },
    /// Redis `DBSIZE`: the number of keys.
    DbSize,
    /// Redis `FLUSHDB`: remove every key.
    FlushDb,
    /// A command on the hash at `key` (Redis `H*`).
    Hash {
        /// The hash's key.
        key: Vec<u8>,
        /// What to do with it.
        cmd: HashCmd,
    },
    /// Redis `TYPE`: the kind of value at `key` (`none` if absent).
    Type {
        /// The key.
        key: Vec<u8>,
    },
    /// A command on the list at `key` (Redis `L*`, `RPUSH`, `RPOP`).
    List {
        /// The list's key.
        key: Vec<u8>,
        /// What to do with it.
        cmd: ListCmd,
    },
    /// A command on the set at `key` (Redis `SADD`, `SMEMBERS`, ...).
    Members {
        /// The set's key.
        key: Vec<u8>,
        /// What to do with it.
        cmd: SetCmd,
    },
    /// Redis `SINTER`, `SUNION`, `SDIFF` (the members, in byte order) and,
    /// with `store`, `SINTERSTORE`, `SUNIONSTORE`, `SDIFFSTORE` (the result
    /// replaces whatever `store` held; the reply is its size). A missing
    /// key is an empty set.
    Combine {
        /// Intersection, union or difference.
        how: Combine,
        /// The sets, in order.
        keys: Vec<Vec<u8>>,
        /// Where to keep the result, if anywhere.
        store: Option<Vec<u8>>,
    },
    /// Redis `SMOVE`: move `member` from the set at `from` to the set at
    /// `to`; 1 if it was in `from`.
    SMove {
        /// The source set.
        from: Vec<u8>,
        /// The destination set.
        to: Vec<u8>,
        /// The member.
        member: Vec<u8>,
    },
    /// Redis `LMOVE` (and `RPOPLPUSH`): pop an element from one end of the
    /// list at `from` and push it onto an end of the list at `to` (the
    /// same list allowed); the element, or nil if `from` is empty.
    LMove {
        /// The source list.
        from: Vec<u8>,
        /// The destination list.
        to: Vec<u8>,
        /// Popped from the source's left (head) end, else its right.
        from_left: bool,
        /// Pushed onto the destination's left end, else its right.
        to_left: bool,
    },
    /// Redis `EXPIRE`, `PEXPIRE`, `EXPIREAT`, `PEXPIREAT`: give `key` a
    /// deadline if `cond` allows; 1 if it did. A deadline not after the
    /// command's time removes the key.
    Expire {
        /// The key.
        key: Vec<u8>,
        /// Its new deadline.
        deadline: Deadline,
        /// When to set it.
        cond: ExpireCond,
        /// Which command it is (for its errors).
        cmd: TtlCmd,
    },
    /// Redis `PERSIST`: remove `key`'s deadline; 1 if it had one.
    Persist {
        /// The key.
        key: Vec<u8>,
    },
    /// Redis `TTL`, `PTTL`, `EXPIRETIME`, `PEXPIRETIME`: -2 if there is no
    /// such key, -1 if it has no deadline, else the time left or the
    /// deadline.
    Ttl {
        /// The key.
        key: Vec<u8>,
        /// In milliseconds, else seconds (rounded as Redis rounds).
        ms: bool,
        /// The deadline itself, else the time left.
        absolute: bool,
    },
    /// Redis `GETEX`: the string at `key`, its time to live changed as
    /// `ttl` says (`Keep`: unchanged).
    GetEx {
        /// The key.
        key: Vec<u8>,
        /// What becomes of its time to live.
        ttl: Ttl,
    },
    /// Redis `GETDEL`: the string at `key`, and the key removed.
    GetDel {
        /// The key.
        key: Vec<u8>,
    },
    /// Redis `GETRANGE`: the bytes of the string at `key` from `start` to
    /// `end`, inclusive, negative counting from the end.
    GetRange {
        /// The key.
        key: Vec<u8>,
        /// The first byte.
        start: i64,
        /// The last byte.
        end: i64,
    },
    /// Redis `SETRANGE`: overwrite the string at `key` from `offset`
    /// (padded with zero bytes); the new length.
    SetRange {
        /// The key.
        key: Vec<u8>,
        /// Where to write.
        offset: u64,
        /// What to write.
        value: Vec<u8>,
    },
    /// Redis `INCRBYFLOAT`: add the decimal float `by` (its text, as given)
    /// to the one at `key` (0 when absent); the new value's text.
    IncrByFloat {
        /// The key.
        key: Vec<u8>,
        /// The increment.
        by: Vec<u8>,
    },
    /// Redis `MSETNX`: set every pair if none of the keys exists; 1 if it
    /// did.
    MSetNx {
        /// Keys and their new values.
        pairs: Vec<Pair>,
    },
    /// Redis `RENAME` and (`nx`) `RENAMENX`: move the value at `from`, its
    /// deadline with it, to `to`.
    Rename {
        /// The key renamed.
        from: Vec<u8>,
        /// Its new name.
        to: Vec<u8>,
        /// Only if `to` does not exist.
        nx: bool,
    },
    /// Redis `COPY`: copy the value at `from`, its deadline with it, to
    /// `to` (replacing it only with `replace`); 1 if copied.
    Copy {
        /// The source.
        from: Vec<u8>,
        /// The destination.
        to: Vec<u8>,
        /// Replace `to` if it exists.
        replace: bool,
    },
    /// Redis `KEYS`: every live key matching the glob `pattern`, in byte
    /// order.
    Keys {
        /// The pattern.
        pattern: Vec<u8>,
    },
    /// Redis `SCAN`: the live keys of the part of the key space `cursor`
    /// names and the parts after it, until about `count` keys; the next
    /// cursor (0 at the end) and the keys. The cursor depends on the keys
    /// alone, so every replica and every restart answers alike.
    Scan {
        /// Where to go on (0: from the start).
        cursor: u64,
        /// Only keys matching this glob.
        pattern: Option<Vec<u8>>,
        /// About how many keys to look at.
        count: u64,
        /// Only keys of this kind (`string`, `hash`, `list`, `set`).
        kind: Option<Vec<u8>>,
    },
    /// Redis `RANDOMKEY`: a live key drawn with the command's seed, or nil.
    RandomKey,
    /// Redis `OBJECT ENCODING`: the name Redis 7.0 gives the encoding of
    /// the value at `key`, or nil.
    Encoding {
        /// The key.
        key: Vec<u8>,
    },
    /// The pop of Redis `BLPOP` (`left`) and `BRPOP`: an element from the
    /// first of `keys` that holds a list, with its key; nil if none does
    /// (a blocking command then waits at the gateway and tries again).
    BPop {
        /// The lists, in order.
        keys: Vec<Vec<u8>>,
        /// From the head, else the tail.
        left: bool,
    },
    /// Reclaims those of `keys` past their deadline at the command's time
    /// (the leader's housekeeping, [`psmr_model::App::sweep`]); the number
    /// reclaimed. A key still live is left alone.
    Sweep {
        /// The keys to look at.
        keys: Vec<Vec<u8>>,
    },
    /// A command on the sorted set at `key` (Redis `Z*`).
    Sorted {
        /// The sorted set's key.
        key: Vec<u8>,
        /// What to do with it.
        cmd: ZCmd,
    },
    /// `WATCH`'s read: the version of each key, 0 for one that does not
    /// exist ([`KvReply::Versions`]). A key's version changes with every
    /// command that may write it.
    Versions {
        /// The keys.
        keys: Vec<Vec<u8>>,
    },
    /// Redis `TIME`: the time the command executes at, ms since the Unix
    /// epoch on the log's clock ([`psmr_model::Stamp`]), as
    /// [`KvReply::Int`].
    Time,
    /// `EXEC` of a transaction that watched keys: if each of `watched` is
    /// still at its version in `versions` (as [`KvOp::Versions`] read
    /// them), `ops` run one after the other, as one command; else none
    /// runs ([`KvReply::Exec`]). It names the keys of every operation, so
    /// no conflicting command runs between them on any replica. An `Exec`
    /// holds no `Exec`.
    Exec {
        /// The keys watched.
        watched: Vec<Vec<u8>>,
        /// Their versions, one per key.
        versions: Vec<u64>,
        /// The transaction's operations, in order.
        ops: Vec<KvOp>,
    },
}

/// Most keys one [`KvOp::Exec`] may name, its operations' and the watched
/// ones together: a transaction is one command, and the schedulers compare
/// its every key.
pub const EXEC_KEYS_MAX: usize = 4 * OP_KEYS_MAX;

/// When a key expires, as a command gives it, in ms: after the command's
/// time (`In`) or since the Unix epoch (`At`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Deadline {
    /// So long after the command's time.
    In(i64),
    /// At this time.
    At(i64),
}

impl Deadline {
    /// The deadline of a command executing at `now` (ms since the epoch),
    /// `None` if it leaves `i64`.
    pub fn at(self, now: u64) -> Option<i64> {
        match self {
            Deadline::In(ms) => ms.checked_add(i64::try_from(now).ok()?),
            Deadline::At(ms) => Some(ms),
        }
    }
}

/// What a write does to its key's time to live.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Ttl {
    /// Removes it (`SET` without options, `GETEX PERSIST`).
    Clear,
    /// Keeps it (`SET ... KEEPTTL`, `GETEX` without options).
    Keep,
    /// Sets it (`EX`, `PX`, `EXAT`, `PXAT`).
    Expire(Deadline),
}

/// When [`KvOp::Expire`] sets its deadline: always, or with Redis's `NX`,
/// `XX`, `GT`, `LT` (a key without a deadline has an infinite one).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ExpireCond {
    /// Always.
    Always,
    /// Only if the key has no deadline.
    Nx,
    /// Only if it has one.
    Xx,
    /// Only if the new one is later.
    Gt,
    /// Only if the new one is earlier.
    Lt,
    /// Only if it has one and the new one is earlier (`XX LT`).
    XxLt,
}

/// The commands that set deadlines, named in their errors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TtlCmd {
    /// `SET`.
    Set,
    /// `SETEX`.
    SetEx,
    /// `PSETEX`.
    PSetEx,
    /// `GETEX`.
    GetEx,
    /// `EXPIRE`.
    Expire,
    /// `PEXPIRE`.
    PExpire,
    /// `EXPIREAT`.
    ExpireAt,
    /// `PEXPIREAT`.
    PExpireAt,
}

impl TtlCmd {
    /// Every one, in the order of their wire bytes.
    pub const ALL: [TtlCmd; 8] = [
        TtlCmd::Set,
        TtlCmd::SetEx,
        TtlCmd::PSetEx,
        TtlCmd::GetEx,
        TtlCmd::Expire,
        TtlCmd::PExpire,
        TtlCmd::ExpireAt,
        TtlCmd::PExpireAt,
    ];

    /// The command's name, in lower case as Redis's errors say it.
    pub fn name(self) -> &'static str {
        match self {
            TtlCmd::Set => "set",
            TtlCmd::SetEx => "setex",
            TtlCmd::PSetEx => "psetex",
            TtlCmd::GetEx => "getex",
            TtlCmd::Expire => "expire",
            TtlCmd::PExpire => "pexpire",
            TtlCmd::ExpireAt => "expireat",
            TtlCmd::PExpireAt => "pexpireat",
        }
    }
}

impl fmt::Display for TtlCmd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A command on a set ([`KvOp::Members`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum SetCmd {
    /// `SADD`: the number of members added.
    Add(Vec<Vec<u8>>),
    /// `SREM`: the number of members removed; the key goes with its last.
    Rem(Vec<Vec<u8>>),
    /// `SMEMBERS`: every member, in byte order.
    Members,
    /// `SISMEMBER`: 1 if a member.
    IsMember(Vec<u8>),
    /// `SMISMEMBER`: 1 or 0 for each.
    MIsMember(Vec<Vec<u8>>),
    /// `SCARD`: the number of members.
    Card,
    /// `SPOP`: one member drawn with the command's seed (`None`), or up to
    /// that many, removed.
    Pop(Option<u64>),
    /// `SRANDMEMBER`: one member drawn with the command's seed (`None`),
    /// that many distinct ones (a count ≥ 0), or that many with repeats (a
    /// count < 0).
    RandMember(Option<i64>),
}

impl SetCmd {
    /// Whether the command changes nothing.
    pub fn is_read(&self) -> bool {
        !matches!(self, SetCmd::Add(_) | SetCmd::Rem(_) | SetCmd::Pop(_))
    }

    /// The Redis command's name, in capitals.
    pub fn name(&self) -> &'static str {
        match self {
            SetCmd::Add(_) => "SADD",
            SetCmd::Rem(_) => "SREM",
            SetCmd::Members => "SMEMBERS",
            SetCmd::IsMember(_) => "SISMEMBER",
            SetCmd::MIsMember(_) => "SMISMEMBER",
            SetCmd::Card => "SCARD",
            SetCmd::Pop(_) => "SPOP",
            SetCmd::RandMember(_) => "SRANDMEMBER",
        }
    }
}

/// How [`KvOp::Combine`] combines its sets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Combine {
    /// `SINTER`: members of every set.
    Inter,
    /// `SUNION`: members of any set.
    Union,
    /// `SDIFF`: members of the first set and of no other.
    Diff,
}

/// A command on a list ([`KvOp::List`]). Indices count from 0 at the head
/// and from -1 at the tail, as in Redis.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ListCmd {
    /// `LPUSH` (left) or `RPUSH`: push each value in order; the new length.
    Push {
        /// At the head, else the tail.
        left: bool,
        /// The values.
        values: Vec<Vec<u8>>,
    },
    /// `LPOP` or `RPOP`: one element (`count` None), or up to `count`.
    Pop {
        /// From the head, else the tail.
        left: bool,
        /// How many, if given.
        count: Option<u64>,
    },
    /// `LRANGE start stop`, inclusive.
    Range(i64, i64),
    /// `LLEN`.
    Len,
    /// `LINDEX index`.
    Index(i64),
    /// `LSET index value`.
    Set(i64, Vec<u8>),
    /// `LREM count value`: from the head if `count` > 0, from the tail if
    /// < 0, every one if 0; the number removed.
    Rem(i64, Vec<u8>),
    /// `LTRIM start stop`: keep that range only.
    Trim(i64, i64),
    /// `LINSERT BEFORE|AFTER pivot value`: the new length, -1 if the pivot
    /// is not there, 0 if the list is not.
    Insert {
        /// Before the pivot, else after it.
        before: bool,
        /// The element to insert next to.
        pivot: Vec<u8>,
        /// The element inserted.
        value: Vec<u8>,
    },
    /// `LPOS element [RANK r] [COUNT n] [MAXLEN m]`.
    Pos {
        /// The element looked for.
        element: Vec<u8>,
        /// Which match first (1 the first from the head, -1 the first from
        /// the tail); never 0.
        rank: i64,
        /// How many matches (0: all), if given: the reply is then a list.
        count: Option<u64>,
        /// How many elements to look at (0: all).
        maxlen: u64,
    },
}

impl ListCmd {
    /// Whether the command changes nothing.
    pub fn is_read(&self) -> bool {
        matches!(self, ListCmd::Range(..) | ListCmd::Len | ListCmd::Index(_) | ListCmd::Pos { .. })
    }

    /// The Redis command's name, in capitals.
    pub fn name(&self) -> &'static str {
        match self {
            ListCmd::Push { left: true, .. } => "LPUSH",
            ListCmd::Push { left: false, .. } => "RPUSH",
            ListCmd::Pop { left: true, .. } => "LPOP",
            ListCmd::Pop { left: false, .. } => "RPOP",
            ListCmd::Range(..) => "LRANGE",
            ListCmd::Len => "LLEN",
            ListCmd::Index(_) => "LINDEX",
            ListCmd::Set(..) => "LSET",
            ListCmd::Rem(..) => "LREM",
            ListCmd::Trim(..) => "LTRIM",
            ListCmd::Insert { .. } => "LINSERT",
            ListCmd::Pos { .. } => "LPOS",
        }
    }
}

/// A command on a hash ([`KvOp::Hash`]). Fields are byte strings of at
/// most [`KEY_MAX`] bytes, values of at most [`VALUE_MAX`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum HashCmd {
    /// `HSET`: set every pair, in order; the reply counts the fields that
    /// are new.
    Set(Vec<Pair>),
    /// `HMSET`: `HSET`, replying `+OK`.
    MSet(Vec<Pair>),
    /// `HSETNX`: set the field unless it exists; 1 if set.
    SetNx(Vec<u8>, Vec<u8>),
    /// `HGET`: the field's value, or nil.
    Get(Vec<u8>),
    /// `HMGET`: each field's value, or nil.
    MGet(Vec<Vec<u8>>),
    /// `HDEL`: remove the fields; the reply counts those removed. The key
    /// goes with its last field.
    Del(Vec<Vec<u8>>),
    /// `HGETALL`: fields and values, by increasing field.
    GetAll,
    /// `HKEYS`: the fields, by increasing field.
    Keys,
    /// `HVALS`: the values, by increasing field.
    Vals,
    /// `HLEN`: the number of fields.
    Len,
    /// `HEXISTS`: 1 if the field exists.
    Exists(Vec<u8>),
    /// `HINCRBY`: add to the field's decimal integer (0 when absent).
    IncrBy(Vec<u8>, i64),
    /// `HINCRBYFLOAT`: add the decimal float (its text, as given) to the
    /// field's (0 when absent); the reply is the new value's text.
    IncrByFloat(Vec<u8>, Vec<u8>),
    /// `HSTRLEN`: the length of the field's value (0 when absent).
    Strlen(Vec<u8>),
}

impl HashCmd {
    /// Whether the command changes nothing.
    pub fn is_read(&self) -> bool {
        !matches!(
            self,
            HashCmd::Set(_)
                | HashCmd::MSet(_)
                | HashCmd::SetNx(..)
                | HashCmd::Del(_)
                | HashCmd::IncrBy(..)
                | HashCmd::IncrByFloat(..)
        )
    }

    /// The Redis command's name, in capitals.
    pub fn name(&self) -> &'static str {
        match self {
            HashCmd::Set(_) => "HSET",
            HashCmd::MSet(_) => "HMSET",
            HashCmd::SetNx(..) => "HSETNX",
            HashCmd::Get(_) => "HGET",
            HashCmd::MGet(_) => "HMGET",
            HashCmd::Del(_) => "HDEL",
            HashCmd::GetAll => "HGETALL",
            HashCmd::Keys => "HKEYS",
            HashCmd::Vals => "HVALS",
            HashCmd::Len => "HLEN",
            HashCmd::Exists(_) => "HEXISTS",
            HashCmd::IncrBy(..) => "HINCRBY",
            HashCmd::IncrByFloat(..) => "HINCRBYFLOAT",
            HashCmd::Strlen(_) => "HSTRLEN",
        }
    }
}

/// When [`KvOp::Set`] sets its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SetWhen {
    /// Always (plain `SET`).
    Always,
    /// Only if the key does not exist (`NX`).
    IfAbsent,
    /// Only if the key exists (`XX`).
    IfPresent,
}

impl KvOp {
    /// The keys the operation names, in order, repeats included (an
    /// `Exec`'s watched keys, then its operations'); none for the
    /// operations on the whole store ([`KvOp::is_whole`]).
    pub fn keys(&self) -> impl Iterator<Item = &[u8]> + '_ {
        let inner: &[KvOp] = match self {
            KvOp::Exec { ops, .. } => ops,
            _ => &[],
        };
        self.own_keys().chain(inner.iter().flat_map(KvOp::own_keys))
    }

    /// The keys the operation itself names (an `Exec`'s watched keys).
    fn own_keys(&self) -> impl Iterator<Item = &[u8]> + '_ {
        let (one, many, pairs): (Option<&Vec<u8>>, &[Vec<u8>], &[Pair]) = match self {
            KvOp::Create { key, .. }
            | KvOp::Read { key }
            | KvOp::Update { key, .. }
            | KvOp::Delete { key }
            | KvOp::Put { key, .. }
            | KvOp::Set { key, .. }
            | KvOp::Incr { key, .. }
            | KvOp::Append { key, .. }
            | KvOp::Strlen { key }
            | KvOp::Hash { key, .. }
            | KvOp::List { key, .. }
            | KvOp::Members { key, .. }
            | KvOp::Type { key }
            | KvOp::Expire { key, .. }
            | KvOp::Persist { key }
            | KvOp::Ttl { key, .. }
            | KvOp::GetEx { key, .. }
            | KvOp::GetDel { key }
            | KvOp::GetRange { key, .. }
            | KvOp::SetRange { key, .. }
            | KvOp::IncrByFloat { key, .. }
            | KvOp::Encoding { key }
            | KvOp::Sorted { key, .. } => (Some(key), &[], &[]),
            KvOp::Rename { from, to, .. } | KvOp::Copy { from, to, .. } => (Some(from), std::slice::from_ref(to), &[]),
            KvOp::Combine { keys, store, .. } => (store.as_ref(), keys, &[]),
            KvOp::SMove { from, to, .. } => (Some(from), std::slice::from_ref(to), &[]),
            KvOp::LMove { from, to, .. } => (Some(from), std::slice::from_ref(to), &[]),
            KvOp::MGet { keys }
            | KvOp::Del { keys }
            | KvOp::Exists { keys }
            | KvOp::Sweep { keys }
            | KvOp::Versions { keys }
            | KvOp::Exec { watched: keys, .. }
            | KvOp::BPop { keys, .. } => (None, keys, &[]),
            KvOp::MSet { pairs } | KvOp::MSetNx { pairs } => (None, &[], pairs),
            KvOp::DbSize | KvOp::FlushDb | KvOp::Keys { .. } | KvOp::Scan { .. } | KvOp::RandomKey | KvOp::Time => {
                (None, &[], &[])
            }
        };
        one.into_iter().chain(many).chain(pairs.iter().map(|(k, _)| k)).map(Vec::as_slice)
    }

    /// True when the operation writes nothing: `Read`, `Strlen`, `MGet`,
    /// `Exists`. `DbSize` changes nothing but is not one: it writes [`ALL`]
    /// so that it excludes every write.
    pub fn is_read(&self) -> bool {
        match self {
            KvOp::Read { .. }
            | KvOp::Strlen { .. }
            | KvOp::MGet { .. }
            | KvOp::Exists { .. }
            | KvOp::Type { .. }
            | KvOp::Ttl { .. }
            | KvOp::GetRange { .. }
            | KvOp::Versions { .. }
            | KvOp::Time
            | KvOp::Encoding { .. } => true,
            KvOp::Exec { ops, .. } => ops.iter().all(KvOp::is_read),
            KvOp::Hash { cmd, .. } => cmd.is_read(),
            KvOp::List { cmd, .. } => cmd.is_read(),
            KvOp::Members { cmd, .. } => cmd.is_read(),
            KvOp::Sorted { cmd, .. } => cmd.is_read(),
            KvOp::Combine { store, .. } => store.is_none(),
            _ => false,
        }
    }

    /// True when the operation depends on or changes every key, named or
    /// not (`DBSIZE`, `FLUSHDB`, `KEYS`, `SCAN`, `RANDOMKEY`): it writes
    /// [`ALL`], so it conflicts with every other operation.
    pub fn is_whole(&self) -> bool {
        match self {
            KvOp::Exec { ops, .. } => ops.iter().any(KvOp::is_whole),
            op => matches!(op, KvOp::DbSize | KvOp::FlushDb | KvOp::Keys { .. } | KvOp::Scan { .. } | KvOp::RandomKey),
        }
    }

    /// The operation's name, in capitals, for messages: the Redis command
    /// it stands for, or the paper's operation.
    pub fn name(&self) -> &'static str {
        match self {
            KvOp::Create { .. } => "CREATE",
            KvOp::Read { .. } => "GET",
            KvOp::Update { .. } => "UPDATE",
            KvOp::Delete { .. } => "DELETE",
            KvOp::Put { .. } => "PUT",
            KvOp::Set { .. } => "SET",
            KvOp::Incr { .. } => "INCRBY",
            KvOp::Append { .. } => "APPEND",
            KvOp::Strlen { .. } => "STRLEN",
            KvOp::MGet { .. } => "MGET",
            KvOp::MSet { .. } => "MSET",
            KvOp::Del { .. } => "DEL",
            KvOp::Exists { .. } => "EXISTS",
            KvOp::DbSize => "DBSIZE",
            KvOp::FlushDb => "FLUSHDB",
            KvOp::Hash { cmd, .. } => cmd.name(),
            KvOp::Type { .. } => "TYPE",
            KvOp::List { cmd, .. } => cmd.name(),
            KvOp::LMove { .. } => "LMOVE",
            KvOp::Members { cmd, .. } => cmd.name(),
            KvOp::SMove { .. } => "SMOVE",
            KvOp::Combine { how, store, .. } => match (how, store.is_some()) {
                (Combine::Inter, false) => "SINTER",
                (Combine::Union, false) => "SUNION",
                (Combine::Diff, false) => "SDIFF",
                (Combine::Inter, true) => "SINTERSTORE",
                (Combine::Union, true) => "SUNIONSTORE",
                (Combine::Diff, true) => "SDIFFSTORE",
            },
            KvOp::Expire { cmd, .. } => match cmd {
                TtlCmd::PExpire => "PEXPIRE",
                TtlCmd::ExpireAt => "EXPIREAT",
                TtlCmd::PExpireAt => "PEXPIREAT",
                _ => "EXPIRE",
            },
            KvOp::Persist { .. } => "PERSIST",
            KvOp::Ttl { ms, absolute, .. } => match (ms, absolute) {
                (false, false) => "TTL",
                (true, false) => "PTTL",
                (false, true) => "EXPIRETIME",
                (true, true) => "PEXPIRETIME",
            },
            KvOp::GetEx { .. } => "GETEX",
            KvOp::GetDel { .. } => "GETDEL",
            KvOp::GetRange { .. } => "GETRANGE",
            KvOp::SetRange { .. } => "SETRANGE",
            KvOp::IncrByFloat { .. } => "INCRBYFLOAT",
            KvOp::MSetNx { .. } => "MSETNX",
            KvOp::Rename { nx: false, .. } => "RENAME",
            KvOp::Rename { nx: true, .. } => "RENAMENX",
            KvOp::Copy { .. } => "COPY",
            KvOp::Keys { .. } => "KEYS",
            KvOp::Scan { .. } => "SCAN",
            KvOp::RandomKey => "RANDOMKEY",
            KvOp::Encoding { .. } => "OBJECT",
            KvOp::Sorted { cmd, .. } => cmd.name(),
            KvOp::Sweep { .. } => "SWEEP",
            KvOp::Versions { .. } => "WATCH",
            KvOp::Time => "TIME",
            KvOp::Exec { .. } => "EXEC",
            KvOp::BPop { left: true, .. } => "BLPOP",
            KvOp::BPop { left: false, .. } => "BRPOP",
        }
    }
}

/// The reply to a [`KvOp`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum KvReply {
    /// `Read`, and `Set` with `get`: the value, if the key exists.
    Value(Option<Vec<u8>>),
    /// `Create`: false if the key existed. `Update`, `Delete`, `Put`: false
    /// if it did not. `Set` without `get`: whether it set the key. `MSet`,
    /// `FlushDb`: true.
    Done(bool),
    /// `Incr`: the new value. `Append`, `Strlen`: the length. `Del`: keys
    /// removed. `Exists`: keys found. `DbSize`: keys stored.
    Int(i64),
    /// `MGet`: each key's value, if it exists.
    Values(Vec<Option<Vec<u8>>>),
    /// `Versions`: each key's version, 0 if it does not exist.
    Versions(Vec<u64>),
    /// `Exec`: the replies of its operations, in order; none if a watched
    /// key had changed and nothing ran.
    Exec(Option<Vec<KvReply>>),
    /// The operation failed and changed nothing.
    Error(KvError),
}

/// Why an operation failed. Each is a function of the state, so every
/// replica fails the same way; each displays as Redis's message.
#[derive(Clone, Copy, Debug, Error, PartialEq, Eq, Hash)]
pub enum KvError {
    /// `Incr` on a value that is not a decimal integer in `i64`.
    #[error("ERR value is not an integer or out of range")]
    NotInteger,
    /// `Incr` whose result leaves `i64`.
    #[error("ERR increment or decrement would overflow")]
    Overflow,
    /// `Append` that would grow a value past [`VALUE_MAX`].
    #[error("ERR string exceeds maximum allowed size ({max} bytes)", max = VALUE_MAX)]
    TooLarge,
    /// `MGet` whose values add up to more than [`REPLY_VALUES_MAX`].
    #[error("ERR MGET reply would exceed {max} bytes of values; ask for fewer keys", max = REPLY_VALUES_MAX)]
    ReplyTooLarge,
    /// A command on a key that holds another kind of value.
    #[error("WRONGTYPE Operation against a key holding the wrong kind of value")]
    WrongType,
    /// `HINCRBY` on a field whose value is not a decimal integer.
    #[error("ERR hash value is not an integer")]
    HashNotInteger,
    /// `HINCRBYFLOAT` on a field whose value is not a float.
    #[error("ERR hash value is not a float")]
    HashNotFloat,
    /// `HINCRBYFLOAT` by an increment that is not a float.
    #[error("ERR value is not a valid float")]
    NotFloat,
    /// `HINCRBYFLOAT` whose result is not finite.
    #[error("ERR increment would produce NaN or Infinity")]
    NotFinite,
    /// A reply of a whole hash over [`REPLY_VALUES_MAX`] bytes.
    #[error("ERR reply would exceed {max} bytes; the hash is too large to read whole", max = REPLY_VALUES_MAX)]
    HashTooLarge,
    /// `LSET` on a key that does not exist.
    #[error("ERR no such key")]
    NoSuchKey,
    /// `LSET` at an index beyond the list.
    #[error("ERR index out of range")]
    IndexOutOfRange,
    /// A list reply over [`REPLY_VALUES_MAX`] bytes.
    #[error("ERR reply would exceed {max} bytes; ask for a smaller range", max = REPLY_VALUES_MAX)]
    ListTooLarge,
    /// A deadline that leaves the range of a 64-bit count of ms.
    #[error("ERR invalid expire time in '{0}' command")]
    InvalidExpire(TtlCmd),
    /// `ZINCRBY` (or `ZADD INCR`) whose sum is not a number.
    #[error("ERR resulting score is not a number (NaN)")]
    ScoreNaN,
    /// `COPY` of a key onto itself.
    #[error("ERR source and destination objects are the same")]
    SameObject,
    /// A `KEYS` reply over [`REPLY_VALUES_MAX`] bytes.
    #[error("ERR reply would exceed {max} bytes; list the keys a part at a time with SCAN", max = REPLY_VALUES_MAX)]
    KeysTooLarge,
}

/// An operation the class model cannot class: [`access`] refuses it.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum AccessError {
    /// A sharded-model operation on keys of several shards (Redis Cluster's
    /// message).
    #[error("CROSSSLOT Keys in request don't hash to the same slot")]
    CrossSlot,
    /// A sharded-model operation on every key.
    #[error("ERR {0} touches every shard, and the sharded model has no class that conflicts with every shard: run the store with the readers-writers model")]
    EveryShard(&'static str),
}

/// The conflict key of `key`: its stable hash, the same in every process
/// (see the module documentation). Collisions only add false conflicts,
/// which is safe. Never [`ALL`].
pub fn key_hash(key: &[u8]) -> Key {
    let mut h = StableHasher::new();
    // The length first: `write` pads the last word, so without it keys
    // differing only in trailing zero bytes could collide by construction.
    h.write_u64(key.len() as u64);
    h.write(key);
    match h.finish() {
        ALL => ALL - 1,
        hash => hash,
    }
}

/// The `n`-th key of workloads and preloaded stores: `n` in decimal, so
/// that `psmr client get 17` and `redis-cli GET 17` name the same key.
pub fn key_bytes(n: u64) -> Vec<u8> {
    decimal(n, &mut [0; 20]).to_vec()
}

/// `n` in decimal, written into `buf`: [`key_bytes`] without allocating.
fn decimal(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut start = buf.len();
    loop {
        start -= 1;
        buf[start] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[start..];
        }
    }
}

/// The conflict key of the `n`-th key, without allocating it.
fn nth_key_hash(n: u64) -> Key {
    key_hash(decimal(n, &mut [0; 20]))
}

pub(crate) use psmr_resp::parse_integer;

/// The class models of the key-value store.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KvModel {
    /// `R`, `W` with `R-W` and `W-W`: any write excludes everything.
    ReadersWriters,
    /// `R1..RS`, `W1..WS` with `Ri-Wi` and `Wi-Wi`: a command's class is
    /// that of its keys' shard ([`shard_of`]).
    Sharded,
}

impl KvModel {
    /// Every model.
    pub const ALL: [KvModel; 2] = [KvModel::ReadersWriters, KvModel::Sharded];

    /// The name accepted by `FromStr` and printed by `Display`.
    pub fn name(self) -> &'static str {
        match self {
            KvModel::ReadersWriters => "readers-writers",
            KvModel::Sharded => "sharded",
        }
    }
}

impl fmt::Display for KvModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for KvModel {
    type Err = WorkloadError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        KvModel::ALL.into_iter().find(|m| m.name() == s).ok_or_else(|| WorkloadError::UnknownName {
            what: "kv model",
            name: s.to_string(),
            valid: "readers-writers, sharded",
        })
    }
}

/// The shard of conflict key `key` (a [`key_hash`]) among `shards`
/// (0 when `shards` is 0 or 1): `key`'s place in `0..2^64` scaled to
/// `0..shards`. Conflict keys are stable hashes already, so hashing them
/// again would add nothing; the scaling reads their top bits, and the
/// store's lock stripes read the bottom ones, so shards do not follow
/// stripes.
pub fn shard_of(key: Key, shards: usize) -> usize {
    if shards <= 1 {
        return 0;
    }
    ((u128::from(key) * shards as u128) >> 64) as usize
}

/// The class model `model` for `shards` shards (clamped to
/// `1..=SHARDS_MAX`; ignored by readers-writers). Class ids follow
/// declaration order: `R`, `W`; or `R1..RS`, `W1..WS`.
pub fn class_model(model: KvModel, shards: usize) -> ClassModel {
    let builder = ClassModel::builder(model.name());
    let builder = match model {
        KvModel::ReadersWriters => builder.class("R").class("W").conflict("R", "W").conflict("W", "W"),
        KvModel::Sharded => local_classes(builder, clamp_shards(shards)),
    };
    builder.build().expect("class names are distinct and every conflict names a declared class")
}

/// A class-to-threads mapping for `model` with `shards` shards (clamped to
/// `1..=SHARDS_MAX`) and `workers` threads that obeys rules R.1-R.5.
///
/// Readers-writers: `R` concurrent and `W` sequential, both on every
/// thread. Sharded: threads are split into one group per shard as for the
/// list ([`crate::list::default_mapping`]); `Ri` is concurrent and `Wi`
/// sequential on group `i`. With `workers == 0` the mapping is returned but
/// does not validate.
pub fn default_mapping(model: KvModel, shards: usize, workers: usize) -> Mapping {
    let classes = match model {
        KvModel::ReadersWriters => readers_writers_mappings(workers),
        KvModel::Sharded => local_mappings(&shard_groups(clamp_shards(shards), workers)),
    };
    Mapping::new(workers, classes)
}

/// The conflict keys `op` reads (and does not write) and writes, each
/// once: its keys' hashes and [`ALL`]. What `execute` touches, so the
/// sanitizer registers exactly these.
pub(crate) fn footprint(op: &KvOp) -> (KeySet, KeySet) {
    let one_all = || -> KeySet { std::iter::once(ALL).collect() };
    if op.is_whole() {
        return (KeySet::new(), one_all());
    }
    let mut keys: KeySet = op.keys().map(key_hash).collect();
    keys.sort_unstable();
    keys.dedup();
    if op.is_read() {
        keys.push(ALL);
        (keys, KeySet::new())
    } else {
        (one_all(), keys)
    }
}

/// The command for `op` under `model` with `shards` shards: its class and
/// the keys it reads and writes; an error when the model cannot class it.
pub fn command(
    model: KvModel,
    shards: usize,
    client: ClientId,
    seq: u64,
    op: KvOp,
) -> Result<Command<KvOp>, AccessError> {
    let Access { class, reads, writes } = access(model, shards, &op)?;
    Ok(Command { client, seq, class, reads, writes, op, stamp: Default::default() })
}

/// What `op` touches under `model` with `shards` shards: its class, the
/// conflict keys of its keys and [`ALL`] (see the module documentation).
///
/// Readers-writers: `R` for an operation that writes nothing, `W` for any
/// other. Sharded: the read or write class of the one shard its keys are
/// in (shard 0 for an operation with no key); keys in several shards are
/// refused with [`AccessError::CrossSlot`], and `DbSize`/`FlushDb` with
/// [`AccessError::EveryShard`].
pub fn access(model: KvModel, shards: usize, op: &KvOp) -> Result<Access, AccessError> {
    let (reads, writes) = footprint(op);
    let write = !writes.is_empty();
    let class = match model {
        KvModel::ReadersWriters => usize::from(write),
        KvModel::Sharded => {
            let shards = clamp_shards(shards);
            let shard = common_shard(op, reads.iter().chain(&writes), shards)?;
            shard + if write { shards } else { 0 }
        }
    };
    // Shards are at most SHARDS_MAX, so every id fits.
    Ok(Access { class: ClassId(class as u16), reads, writes })
}

/// The one shard of conflict keys `keys` ([`ALL`] aside), 0 if there are
/// none.
fn common_shard<'a>(op: &KvOp, keys: impl Iterator<Item = &'a Key>, shards: usize) -> Result<usize, AccessError> {
    if op.is_whole() {
        return Err(AccessError::EveryShard(op.name()));
    }
    let mut shards_seen = keys.filter(|&&k| k != ALL).map(|&k| shard_of(k, shards));
    let first = shards_seen.next().unwrap_or(0);
    if shards_seen.any(|s| s != first) {
        return Err(AccessError::CrossSlot);
    }
    Ok(first)
}

#[cfg(test)]
mod tests;
