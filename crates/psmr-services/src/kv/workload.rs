//! Workloads of the key-value store: the create/read/update/delete mix of
//! 004 §VI ([`generate`]) and one of every Redis operation
//! ([`generate_redis`]), with keys drawn by a skew-aware [`KeyPicker`].

use super::{
    command, key_bytes, nth_key_hash, shard_of, Combine, Deadline, ExpireCond, HashCmd, KvModel, KvOp, LexBound,
    ListCmd, Score, ScoreBound, SetCmd, SetWhen, Ttl, TtlCmd, ZAddFlags, ZBy, ZCmd,
};
use crate::workload::{Draws, Kind};
use crate::{WorkloadConfig, WorkloadError};
use psmr_model::Command;
use rand::Rng;

/// Key space sizes up to which a skewed generator lists the keys of each
/// shard (at most 8 MiB) instead of rejection sampling.
pub(super) const ENUMERATE_KEYS_MAX: u64 = 1 << 20;

/// Rejection-sampling attempts per key before a skewed generator gives up.
/// A shard of a key space above [`ENUMERATE_KEYS_MAX`] with at most
/// `SHARDS_MAX` shards is hit with probability about `1/1024` per attempt,
/// so giving up means that shard has (almost) no key.
const REJECTION_TRIES: u32 = 1 << 16;

/// Attempts to find another key of a multi-key operation's shard before
/// naming the first key again.
const SAME_SHARD_TRIES: u32 = 64;

/// Draws key numbers (`n` names [`key_bytes`]`(n)`), honouring the skew:
/// with `shards > 1` and a skew above 0 (for reads `cfg.skew`, for writes
/// `cfg.write_skew` when set) a key of the first shard with that
/// probability, otherwise a key of another. A key's shard is [`shard_of`]
/// its conflict key.
enum KeyPicker {
    Uniform(u64),
    /// The keys of the first shard and of the others, listed.
    Listed {
        keys: u64,
        first: Vec<u64>,
        rest: Vec<u64>,
    },
    /// Uniform draws kept when they fall on the wanted side: expected
    /// `shards` attempts for the first shard, under two for the others.
    Rejection {
        keys: u64,
        shards: usize,
    },
}

impl KeyPicker {
    fn new(cfg: &WorkloadConfig) -> Result<Self, WorkloadError> {
        let (keys, shards) = (cfg.keys, cfg.shards);
        let skews: Vec<f64> = [Some(cfg.skew), cfg.write_skew].into_iter().flatten().filter(|&s| s > 0.0).collect();
        if shards <= 1 || skews.is_empty() {
            return Ok(KeyPicker::Uniform(keys));
        }
        if keys > ENUMERATE_KEYS_MAX {
            return Ok(KeyPicker::Rejection { keys, shards });
        }
        let (first, rest): (Vec<u64>, Vec<u64>) = (0..keys).partition(|&n| shard_of(nth_key_hash(n), shards) == 0);
        let unreachable = |skew, target| WorkloadError::SkewUnreachable { skew, target, keys, shards };
        if first.is_empty() {
            return Err(unreachable(skews[0], "the first shard"));
        }
        if let Some(&skew) = skews.iter().find(|&&s| s < 1.0) {
            if rest.is_empty() {
                return Err(unreachable(skew, "the other shards"));
            }
        }
        Ok(KeyPicker::Listed { keys, first, rest })
    }

    fn draw(&self, draws: &mut Draws, write: bool) -> Result<u64, WorkloadError> {
        let skewed = draws.skew(write) > 0.0;
        match self {
            KeyPicker::Uniform(keys) => Ok(draws.rng.gen_range(0..*keys)),
            KeyPicker::Listed { keys, .. } | KeyPicker::Rejection { keys, .. } if !skewed => {
                Ok(draws.rng.gen_range(0..*keys))
            }
            KeyPicker::Listed { first, rest, .. } => {
                let side = if draws.picks_first_shard(write) { first } else { rest };
                Ok(side[draws.rng.gen_range(0..side.len())])
            }
            KeyPicker::Rejection { keys, shards } => {
                let want_first = draws.picks_first_shard(write);
                for _ in 0..REJECTION_TRIES {
                    let n = draws.rng.gen_range(0..*keys);
                    if (shard_of(nth_key_hash(n), *shards) == 0) == want_first {
                        return Ok(n);
                    }
                }
                Err(WorkloadError::SkewUnreachable {
                    skew: draws.skew(write),
                    target: if want_first { "the first shard" } else { "the other shards" },
                    keys: *keys,
                    shards: *shards,
                })
            }
        }
    }
}

/// What an operation-drawing function gets: the generator's draws, the
/// first key (drawn with the skew), and how to draw more keys.
struct Pick<'a> {
    draws: &'a mut Draws,
    model: KvModel,
    cfg: &'a WorkloadConfig,
    read: bool,
    first: u64,
}

impl Pick<'_> {
    fn key(&self) -> Vec<u8> {
        key_bytes(self.first)
    }

    /// An 8-byte value from the generator.
    fn value(&mut self) -> Vec<u8> {
        self.draws.rng.gen::<u64>().to_le_bytes().to_vec()
    }

    /// `1..=4` keys starting with the first; under the sharded model all in
    /// its shard, since the model refuses operations across shards.
    fn keys(&mut self) -> Vec<Vec<u8>> {
        let n = self.draws.rng.gen_range(1..=4);
        let mut keys = vec![self.key()];
        while keys.len() < n {
            keys.push(key_bytes(self.another()));
        }
        keys
    }

    fn another(&mut self) -> u64 {
        if self.model == KvModel::ReadersWriters || self.cfg.shards <= 1 {
            return self.draws.rng.gen_range(0..self.cfg.keys);
        }
        let shard = shard_of(nth_key_hash(self.first), self.cfg.shards);
        for _ in 0..SAME_SHARD_TRIES {
            let n = self.draws.rng.gen_range(0..self.cfg.keys);
            if shard_of(nth_key_hash(n), self.cfg.shards) == shard {
                return n;
            }
        }
        self.first
    }
}

/// Generates `cfg.commands` key-value commands for `model`, reproducibly
/// from `cfg.seed`.
///
/// Writes (α%) are placed among reads following `cfg.spread` (see
/// [`crate::Spread`]) and are creates, updates and deletes with equal
/// probability, with 8-byte values drawn from the generator. Keys are
/// [`key_bytes`] of numbers uniform over `0..cfg.keys`; with skew, a key of
/// the first shard ([`shard_of`] with `cfg.shards`) with probability
/// `cfg.skew` (for writes `cfg.write_skew` when set) and a key of another
/// shard otherwise.
///
/// Errors: an invalid `cfg`, global operations (`β > 0`, which the store
/// does not have), or a skew towards shards that own no key of a small key
/// space.
pub fn generate(model: KvModel, cfg: &WorkloadConfig) -> Result<Vec<Command<KvOp>>, WorkloadError> {
    generate_with(model, cfg, crud_op)
}

/// Like [`generate`], with every operation of the store: reads are `Read`,
/// `Strlen`, `MGet` and `Exists`; writes are the paper's three, `Put`,
/// `Set` in every form, `Incr`, `Append`, `MSet` and `Del`, and under the
/// readers-writers model now and then `DbSize` or `FlushDb`. Multi-key
/// operations name one to four keys, all in one shard under the sharded
/// model. Values are 8 random bytes or a small decimal number, so that
/// `Incr` both succeeds and fails.
pub fn generate_redis(model: KvModel, cfg: &WorkloadConfig) -> Result<Vec<Command<KvOp>>, WorkloadError> {
    generate_with(model, cfg, redis_op)
}

fn generate_with(
    model: KvModel,
    cfg: &WorkloadConfig,
    op_of: fn(&mut Pick<'_>) -> KvOp,
) -> Result<Vec<Command<KvOp>>, WorkloadError> {
    cfg.validate()?;
    if cfg.mix.global_pct > 0.0 {
        return Err(WorkloadError::NoGlobalOps(cfg.mix.global_pct));
    }
    let picker = KeyPicker::new(cfg)?;
    let mut draws = Draws::new(cfg);
    let mut out = Vec::with_capacity(cfg.commands);
    for j in 0..cfg.commands {
        let read = draws.kind() == Kind::LocalRead;
        let first = picker.draw(&mut draws, !read)?;
        let op = op_of(&mut Pick { draws: &mut draws, model, cfg, read, first });
        let (client, seq) = cfg.ids(j);
        out.push(command(model, cfg.shards, client, seq, op)?);
    }
    Ok(out)
}

/// The paper's operations: a read, or a create, update or delete.
fn crud_op(p: &mut Pick<'_>) -> KvOp {
    let key = p.key();
    if p.read {
        return KvOp::Read { key };
    }
    match p.draws.rng.gen_range(0..3) {
        0 => KvOp::Create { key, value: p.value() },
        1 => KvOp::Update { key, value: p.value() },
        _ => KvOp::Delete { key },
    }
}

fn redis_op(p: &mut Pick<'_>) -> KvOp {
    let key = p.key();
    if p.read {
        return redis_read(p, key);
    }
    let whole_store = p.model == KvModel::ReadersWriters && p.draws.rng.gen_range(0..50) == 0;
    if whole_store {
        return whole(p);
    }
    redis_write(p, key)
}

/// A Redis read of `key` (and keys of its shard).
fn redis_read(p: &mut Pick<'_>, key: Vec<u8>) -> KvOp {
    match p.draws.rng.gen_range(0..15) {
        14 => KvOp::Time,
        13 => KvOp::Versions { keys: p.keys() },
        12 => KvOp::Sorted { key, cmd: zset_read(p) },
        0 => KvOp::Read { key },
        9 => KvOp::Ttl { key, ms: p.draws.rng.gen(), absolute: p.draws.rng.gen() },
        10 => KvOp::GetRange { key, start: index(p), end: index(p) },
        11 => KvOp::Encoding { key },
        1 => KvOp::Strlen { key },
        2 => KvOp::MGet { keys: p.keys() },
        3 => KvOp::Exists { keys: p.keys() },
        4 => KvOp::Type { key },
        5 => KvOp::Hash { key, cmd: hash_read(p) },
        6 => KvOp::List { key, cmd: list_read(p) },
        7 => KvOp::Members { key, cmd: set_read(p) },
        _ => KvOp::Combine { how: combination(p), keys: p.keys(), store: None },
    }
}

/// A Redis write of `key` (and keys of its shard).
fn redis_write(p: &mut Pick<'_>, key: Vec<u8>) -> KvOp {
    match p.draws.rng.gen_range(0..32) {
        31 => exec(p, key),
        28 | 29 => KvOp::Sorted { key, cmd: zset_write(p) },
        30 => {
            let mut keys = p.keys();
            keys.insert(0, key);
            KvOp::BPop { keys, left: p.draws.rng.gen() }
        }
        0 => KvOp::Create { key, value: redis_value(p) },
        1 => KvOp::Update { key, value: redis_value(p) },
        2 => KvOp::Delete { key },
        3 => KvOp::Put { key, value: redis_value(p) },
        4 => {
            let when = [SetWhen::Always, SetWhen::IfAbsent, SetWhen::IfPresent][p.draws.rng.gen_range(0..3)];
            KvOp::Set { key, value: redis_value(p), when, get: p.draws.rng.gen(), ttl: Ttl::Clear }
        }
        5 => KvOp::Incr { key, by: p.draws.rng.gen_range(-3..=3) },
        6 => KvOp::Append { key, value: redis_value(p) },
        7 => KvOp::MSet { pairs: p.keys().into_iter().map(|k| (k, redis_value(p))).collect() },
        8 | 9 => KvOp::Hash { key, cmd: hash_write(p) },
        10 | 11 => KvOp::List { key, cmd: list_write(p) },
        12 => {
            // Both keys in the first one's shard, as multi-key commands are.
            let to = p.keys().pop().unwrap_or_else(|| key.clone());
            KvOp::LMove { from: key, to, from_left: p.draws.rng.gen(), to_left: p.draws.rng.gen() }
        }
        13 | 14 => KvOp::Members { key, cmd: set_write(p) },
        15 => {
            let keys = p.keys();
            KvOp::Combine { how: combination(p), keys, store: Some(key) }
        }
        16 => {
            let to = p.keys().pop().unwrap_or_else(|| key.clone());
            KvOp::SMove { from: key, to, member: member(p) }
        }
        18 => {
            let ttl = if p.draws.rng.gen() { Ttl::Keep } else { Ttl::Expire(deadline(p)) };
            KvOp::Set { key, value: redis_value(p), when: SetWhen::Always, get: p.draws.rng.gen(), ttl }
        }
        19 | 20 => {
            let cond =
                [ExpireCond::Always, ExpireCond::Nx, ExpireCond::Xx, ExpireCond::Gt, ExpireCond::Lt, ExpireCond::XxLt]
                    [p.draws.rng.gen_range(0..6)];
            KvOp::Expire { key, deadline: deadline(p), cond, cmd: TtlCmd::PExpire }
        }
        21 => KvOp::Persist { key },
        22 => {
            let ttl = [Ttl::Keep, Ttl::Clear, Ttl::Expire(deadline(p))][p.draws.rng.gen_range(0..3)];
            KvOp::GetEx { key, ttl }
        }
        23 => KvOp::GetDel { key },
        24 => KvOp::SetRange { key, offset: p.draws.rng.gen_range(0..8), value: redis_value(p) },
        25 => KvOp::IncrByFloat { key, by: [&b"0.5"[..], b"-1.25", b"3"][p.draws.rng.gen_range(0..3)].to_vec() },
        26 => KvOp::MSetNx { pairs: p.keys().into_iter().map(|k| (k, redis_value(p))).collect() },
        27 => {
            let to = p.keys().pop().unwrap_or_else(|| key.clone());
            if p.draws.rng.gen() {
                KvOp::Rename { from: key, to, nx: p.draws.rng.gen() }
            } else {
                KvOp::Copy { from: key, to, replace: p.draws.rng.gen() }
            }
        }
        _ => KvOp::Del { keys: p.keys() },
    }
}

/// A transaction of one to three reads and writes of keys of `key`'s
/// shard, watching none of them or some that must not exist (version 0):
/// it runs or not depending on the state.
fn exec(p: &mut Pick<'_>, key: Vec<u8>) -> KvOp {
    let watched = if p.draws.rng.gen() { p.keys() } else { Vec::new() };
    let versions = vec![0; watched.len()];
    let mut ops = Vec::new();
    while ops.len() < p.draws.rng.gen_range(1..=3) {
        let op = if p.draws.rng.gen() { redis_read(p, key.clone()) } else { redis_write(p, key.clone()) };
        if !matches!(op, KvOp::Exec { .. }) {
            ops.push(op);
        }
    }
    KvOp::Exec { watched, versions, ops }
}

/// An operation on the whole store.
fn whole(p: &mut Pick<'_>) -> KvOp {
    match p.draws.rng.gen_range(0..6) {
        0 => KvOp::DbSize,
        1 => KvOp::FlushDb,
        2 => KvOp::Keys { pattern: [&b"*"[..], b"1*", b"?"][p.draws.rng.gen_range(0..3)].to_vec() },
        3 | 4 => {
            let cursor = if p.draws.rng.gen() { 0 } else { p.draws.rng.gen_range(0..super::store::SLOTS) };
            let pattern = p.draws.rng.gen::<bool>().then(|| b"*1*".to_vec());
            KvOp::Scan { cursor, pattern, count: p.draws.rng.gen_range(1..20), kind: None }
        }
        _ => KvOp::RandomKey,
    }
}

/// A deadline a few hundred ms around the command's time (its log entry's,
/// in a check that stamps commands a few ms apart), now and then past.
fn deadline(p: &mut Pick<'_>) -> Deadline {
    Deadline::In(p.draws.rng.gen_range(-20..300))
}

/// A score among a few, so that members tie now and then.
fn score(p: &mut Pick<'_>) -> Score {
    Score::new([0.0, 0.5, 1.0, -2.0, 3.25][p.draws.rng.gen_range(0..5)]).expect("not NaN")
}

/// A range of a sorted set, by rank, score or member.
fn zrange(p: &mut Pick<'_>) -> ZBy {
    let bound = |p: &mut Pick<'_>| ScoreBound { score: score(p), open: p.draws.rng.gen() };
    match p.draws.rng.gen_range(0..3) {
        0 => ZBy::Rank(index(p), index(p)),
        1 => ZBy::Score(bound(p), bound(p)),
        _ => {
            let lo = [LexBound::Min, LexBound::Closed(member(p)), LexBound::Open(member(p))];
            let lo = lo[p.draws.rng.gen_range(0..3)].clone();
            let hi = [LexBound::Max, LexBound::Closed(member(p)), LexBound::Open(member(p))];
            ZBy::Lex(lo, hi[p.draws.rng.gen_range(0..3)].clone())
        }
    }
}

fn zset_read(p: &mut Pick<'_>) -> ZCmd {
    match p.draws.rng.gen_range(0..6) {
        0 => ZCmd::Score(member(p)),
        1 => ZCmd::MScore(vec![member(p), member(p)]),
        2 => ZCmd::Card,
        3 => ZCmd::Rank { member: member(p), rev: p.draws.rng.gen() },
        4 => match zrange(p) {
            ZBy::Score(lo, hi) => ZCmd::Count(lo, hi),
            ZBy::Lex(lo, hi) => ZCmd::LexCount(lo, hi),
            ZBy::Rank(..) => ZCmd::Card,
        },
        _ => {
            let by = zrange(p);
            let limit = (!matches!(by, ZBy::Rank(..)) && p.draws.rng.gen())
                .then(|| (p.draws.rng.gen_range(-1..3), p.draws.rng.gen_range(-1..3)));
            let with_scores = !matches!(by, ZBy::Lex(..)) && p.draws.rng.gen();
            ZCmd::Range { by, rev: p.draws.rng.gen(), limit, with_scores }
        }
    }
}

fn zset_write(p: &mut Pick<'_>) -> ZCmd {
    match p.draws.rng.gen_range(0..6) {
        0 | 1 => {
            let flags = ZAddFlags {
                nx: p.draws.rng.gen_bool(0.2),
                ch: p.draws.rng.gen(),
                gt: p.draws.rng.gen_bool(0.2),
                ..ZAddFlags::default()
            };
            let flags = ZAddFlags { gt: flags.gt && !flags.nx, ..flags };
            ZCmd::Add { flags, pairs: vec![(score(p), member(p)), (score(p), member(p))] }
        }
        2 => ZCmd::IncrBy(score(p), member(p)),
        3 => ZCmd::Rem(vec![member(p)]),
        4 => ZCmd::Pop { max: p.draws.rng.gen(), count: [None, Some(2)][p.draws.rng.gen_range(0..2)] },
        _ => ZCmd::RemRange(zrange(p)),
    }
}

/// A member among a few, so that sets share members.
fn member(p: &mut Pick<'_>) -> Vec<u8> {
    format!("m{}", p.draws.rng.gen_range(0..4)).into_bytes()
}

fn combination(p: &mut Pick<'_>) -> Combine {
    [Combine::Inter, Combine::Union, Combine::Diff][p.draws.rng.gen_range(0..3)]
}

fn set_read(p: &mut Pick<'_>) -> SetCmd {
    match p.draws.rng.gen_range(0..5) {
        4 => SetCmd::RandMember([None, Some(2), Some(-3)][p.draws.rng.gen_range(0..3)]),
        0 => SetCmd::Members,
        1 => SetCmd::IsMember(member(p)),
        2 => SetCmd::MIsMember(vec![member(p), member(p)]),
        _ => SetCmd::Card,
    }
}

fn set_write(p: &mut Pick<'_>) -> SetCmd {
    match p.draws.rng.gen_range(0..4) {
        0 | 1 => SetCmd::Add(vec![member(p), member(p)]),
        2 => SetCmd::Pop([None, Some(2)][p.draws.rng.gen_range(0..2)]),
        _ => SetCmd::Rem(vec![member(p)]),
    }
}

/// A small index, negative from the tail half the time.
fn index(p: &mut Pick<'_>) -> i64 {
    p.draws.rng.gen_range(-4..4)
}

fn list_read(p: &mut Pick<'_>) -> ListCmd {
    match p.draws.rng.gen_range(0..4) {
        0 => ListCmd::Range(index(p), index(p)),
        1 => ListCmd::Len,
        2 => ListCmd::Index(index(p)),
        _ => {
            let rank = [1, 2, -1][p.draws.rng.gen_range(0..3)];
            let count = [None, Some(0), Some(2)][p.draws.rng.gen_range(0..3)];
            ListCmd::Pos { element: redis_value(p), rank, count, maxlen: p.draws.rng.gen_range(0..3) }
        }
    }
}

fn list_write(p: &mut Pick<'_>) -> ListCmd {
    match p.draws.rng.gen_range(0..7) {
        0 | 1 => ListCmd::Push { left: p.draws.rng.gen(), values: vec![redis_value(p), redis_value(p)] },
        2 => ListCmd::Pop { left: p.draws.rng.gen(), count: [None, Some(0), Some(2)][p.draws.rng.gen_range(0..3)] },
        3 => ListCmd::Set(index(p), redis_value(p)),
        4 => ListCmd::Rem(index(p), redis_value(p)),
        5 => ListCmd::Trim(index(p), index(p)),
        _ => ListCmd::Insert { before: p.draws.rng.gen(), pivot: redis_value(p), value: redis_value(p) },
    }
}

/// A field among a few, so that hashes share fields.
fn field(p: &mut Pick<'_>) -> Vec<u8> {
    format!("f{}", p.draws.rng.gen_range(0..4)).into_bytes()
}

fn hash_read(p: &mut Pick<'_>) -> HashCmd {
    match p.draws.rng.gen_range(0..8) {
        0 => HashCmd::Get(field(p)),
        1 => HashCmd::MGet(vec![field(p), field(p)]),
        2 => HashCmd::GetAll,
        3 => HashCmd::Keys,
        4 => HashCmd::Vals,
        5 => HashCmd::Len,
        6 => HashCmd::Exists(field(p)),
        _ => HashCmd::Strlen(field(p)),
    }
}

fn hash_write(p: &mut Pick<'_>) -> HashCmd {
    match p.draws.rng.gen_range(0..6) {
        0 => HashCmd::Set(vec![(field(p), redis_value(p)), (field(p), redis_value(p))]),
        1 => HashCmd::MSet(vec![(field(p), redis_value(p))]),
        2 => HashCmd::SetNx(field(p), redis_value(p)),
        3 => HashCmd::Del(vec![field(p)]),
        4 => HashCmd::IncrBy(field(p), p.draws.rng.gen_range(-3..=3)),
        _ => HashCmd::IncrByFloat(field(p), [&b"0.5"[..], b"-1.25", b"3"][p.draws.rng.gen_range(0..3)].to_vec()),
    }
}

/// 8 random bytes, or a small decimal number that `Incr` accepts.
fn redis_value(p: &mut Pick<'_>) -> Vec<u8> {
    if p.draws.rng.gen() {
        p.value()
    } else {
        p.draws.rng.gen_range(-100i64..100).to_string().into_bytes()
    }
}

#[cfg(test)]
mod tests;
