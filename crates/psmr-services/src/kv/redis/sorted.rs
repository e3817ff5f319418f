//! The sorted set commands of the Redis table: their arguments parsed as
//! Redis 7.0 parses them (options first, then numbers; the same errors),
//! and their replies, scores as floats in RESP3.

use super::{integer, key, positive, syntax_error, value, values, wrong_arity};
use crate::kv::{KvOp, KvReply, LexBound, Score, ScoreBound, ZAddFlags, ZBy, ZCmd};
use bytes::Bytes;
use psmr_resp::Reply;

fn sorted(a: &[Bytes], cmd: ZCmd) -> Result<KvOp, Reply> {
    Ok(KvOp::Sorted { key: key(&a[1])?, cmd })
}

/// A float argument, as Redis reads one (`inf` included, NaN not).
fn float(arg: &Bytes, error: &str) -> Result<Score, Reply> {
    crate::kv::store::float(arg).and_then(Score::new).ok_or_else(|| Reply::error(error))
}

const NOT_FLOAT: &str = "ERR value is not a valid float";

/// `ZADD key [NX|XX] [GT|LT] [CH] [INCR] score member [score member ...]`.
pub(super) fn zadd(a: &[Bytes]) -> Result<KvOp, Reply> {
    let mut flags = ZAddFlags::default();
    let mut at = 2;
    while let Some(option) = a.get(at) {
        match option.to_ascii_uppercase().as_slice() {
            b"NX" => flags.nx = true,
            b"XX" => flags.xx = true,
            b"GT" => flags.gt = true,
            b"LT" => flags.lt = true,
            b"CH" => flags.ch = true,
            b"INCR" => flags.incr = true,
            _ => break,
        }
        at += 1;
    }
    let rest = &a[at..];
    if rest.is_empty() || rest.len() % 2 != 0 {
        return Err(syntax_error());
    }
    if flags.nx && flags.xx {
        return Err(Reply::error("ERR XX and NX options at the same time are not compatible"));
    }
    if (flags.nx && (flags.gt || flags.lt)) || (flags.gt && flags.lt) {
        return Err(Reply::error("ERR GT, LT, and/or NX options at the same time are not compatible"));
    }
    if flags.incr && rest.len() > 2 {
        return Err(Reply::error("ERR INCR option supports a single increment-element pair"));
    }
    super::check_key_count(rest.len() / 2)?;
    let scores: Vec<Score> = rest.chunks_exact(2).map(|p| float(&p[0], NOT_FLOAT)).collect::<Result<_, _>>()?;
    let members: Vec<Vec<u8>> = rest.chunks_exact(2).map(|p| value(&p[1])).collect::<Result<_, _>>()?;
    sorted(a, ZCmd::Add { flags, pairs: scores.into_iter().zip(members).collect() })
}

/// `ZINCRBY key increment member`.
pub(super) fn zincrby(a: &[Bytes]) -> Result<KvOp, Reply> {
    sorted(a, ZCmd::IncrBy(float(&a[2], NOT_FLOAT)?, value(&a[3])?))
}

/// One end of a score range: `x`, `(x`, `-inf`, `+inf`.
fn score_bound(arg: &Bytes) -> Result<ScoreBound, Reply> {
    let (open, text) = match arg.strip_prefix(b"(") {
        Some(rest) => (true, Bytes::copy_from_slice(rest)),
        None => (false, arg.clone()),
    };
    Ok(ScoreBound { score: float(&text, "ERR min or max is not a float")?, open })
}

/// One end of a lexical range: `-`, `+`, `[member`, `(member`.
fn lex_bound(arg: &Bytes) -> Result<LexBound, Reply> {
    match arg.first() {
        Some(b'-') if arg.len() == 1 => Ok(LexBound::Min),
        Some(b'+') if arg.len() == 1 => Ok(LexBound::Max),
        Some(b'[') => Ok(LexBound::Closed(value(&arg.slice(1..))?)),
        Some(b'(') => Ok(LexBound::Open(value(&arg.slice(1..))?)),
        _ => Err(Reply::error("ERR min or max not valid string range item")),
    }
}

/// `ZCOUNT key min max`.
pub(super) fn zcount(a: &[Bytes]) -> Result<KvOp, Reply> {
    sorted(a, ZCmd::Count(score_bound(&a[2])?, score_bound(&a[3])?))
}

/// `ZLEXCOUNT key min max`.
pub(super) fn zlexcount(a: &[Bytes]) -> Result<KvOp, Reply> {
    sorted(a, ZCmd::LexCount(lex_bound(&a[2])?, lex_bound(&a[3])?))
}

/// What a range is taken by, before its ends are read.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Rank,
    Score,
    Lex,
}

/// The range `a[2]` to `a[3]` of `kind`, the ends swapped for a reverse
/// range by score or member (given highest first).
fn range_of(a: &[Bytes], kind: Kind, rev: bool) -> Result<ZBy, Reply> {
    let (lo, hi) = if rev && kind != Kind::Rank { (&a[3], &a[2]) } else { (&a[2], &a[3]) };
    Ok(match kind {
        Kind::Rank => ZBy::Rank(integer(lo)?, integer(hi)?),
        Kind::Score => ZBy::Score(score_bound(lo)?, score_bound(hi)?),
        Kind::Lex => ZBy::Lex(lex_bound(lo)?, lex_bound(hi)?),
    })
}

/// `ZRANGE` and its older forms (`kind` and `rev` given by the name; `None`
/// for `ZRANGE`, which takes `BYSCORE`, `BYLEX` and `REV`), options as
/// Redis 7.0 reads them.
fn zrange_generic(a: &[Bytes], preset: Option<(Kind, bool)>) -> Result<KvOp, Reply> {
    let (mut kind, mut rev) = (None, None);
    if let Some((k, r)) = preset {
        (kind, rev) = (Some(k), Some(r));
    }
    let (mut with_scores, mut limit) = (false, None);
    let mut j = 4;
    while j < a.len() {
        let left = a.len() - j - 1;
        match a[j].to_ascii_uppercase().as_slice() {
            b"WITHSCORES" => with_scores = true,
            b"LIMIT" if left >= 2 => {
                limit = Some((integer(&a[j + 1])?, integer(&a[j + 2])?));
                j += 2;
            }
            b"REV" if rev.is_none() => rev = Some(true),
            b"BYLEX" if kind.is_none() => kind = Some(Kind::Lex),
            b"BYSCORE" if kind.is_none() => kind = Some(Kind::Score),
            _ => return Err(syntax_error()),
        }
        j += 1;
    }
    let (kind, rev) = (kind.unwrap_or(Kind::Rank), rev.unwrap_or(false));
    if kind == Kind::Rank && limit.is_some_and(|(_, count)| count != -1) {
        return Err(Reply::error(
            "ERR syntax error, LIMIT is only supported in combination with either BYSCORE or BYLEX",
        ));
    }
    if with_scores && kind == Kind::Lex {
        return Err(Reply::error("ERR syntax error, WITHSCORES not supported in combination with BYLEX"));
    }
    let limit = limit.filter(|_| kind != Kind::Rank);
    sorted(a, ZCmd::Range { by: range_of(a, kind, rev)?, rev, limit, with_scores })
}

/// `ZRANGE key start stop [BYSCORE|BYLEX] [REV] [LIMIT offset count]
/// [WITHSCORES]`.
pub(super) fn zrange(a: &[Bytes]) -> Result<KvOp, Reply> {
    zrange_generic(a, None)
}

/// `ZRANGEBYSCORE key min max ...`.
pub(super) fn zrangebyscore(a: &[Bytes]) -> Result<KvOp, Reply> {
    zrange_generic(a, Some((Kind::Score, false)))
}

/// `ZREVRANGEBYSCORE key max min ...`.
pub(super) fn zrevrangebyscore(a: &[Bytes]) -> Result<KvOp, Reply> {
    zrange_generic(a, Some((Kind::Score, true)))
}

/// `ZREVRANGE key start stop [WITHSCORES]`.
pub(super) fn zrevrange(a: &[Bytes]) -> Result<KvOp, Reply> {
    zrange_generic(a, Some((Kind::Rank, true)))
}

/// `ZRANGEBYLEX key min max [LIMIT offset count]`.
pub(super) fn zrangebylex(a: &[Bytes]) -> Result<KvOp, Reply> {
    zrange_generic(a, Some((Kind::Lex, false)))
}

/// `ZREVRANGEBYLEX key max min [LIMIT offset count]`.
pub(super) fn zrevrangebylex(a: &[Bytes]) -> Result<KvOp, Reply> {
    zrange_generic(a, Some((Kind::Lex, true)))
}

/// `ZPOPMIN`/`ZPOPMAX key [count]`.
pub(super) fn zpop(a: &[Bytes], max: bool, name: &str) -> Result<KvOp, Reply> {
    let count = match a.len() {
        2 => None,
        3 => Some(positive(&a[2])?),
        _ => return Err(wrong_arity(name)),
    };
    sorted(a, ZCmd::Pop { max, count })
}

/// `ZREMRANGEBYRANK`, `ZREMRANGEBYSCORE`, `ZREMRANGEBYLEX key a b`.
pub(super) fn zremrange(a: &[Bytes], kind: &str) -> Result<KvOp, Reply> {
    let kind = match kind {
        "rank" => Kind::Rank,
        "score" => Kind::Score,
        _ => Kind::Lex,
    };
    sorted(a, ZCmd::RemRange(range_of(a, kind, false)?))
}

/// `ZSCORE`, `ZMSCORE`, `ZREM`, `ZCARD`, `ZRANK`, `ZREVRANK`.
pub(super) fn zscore(a: &[Bytes]) -> Result<KvOp, Reply> {
    sorted(a, ZCmd::Score(value(&a[2])?))
}

/// See [`zscore`].
pub(super) fn zmscore(a: &[Bytes]) -> Result<KvOp, Reply> {
    sorted(a, ZCmd::MScore(values(&a[2..])?))
}

/// See [`zscore`].
pub(super) fn zrem(a: &[Bytes]) -> Result<KvOp, Reply> {
    sorted(a, ZCmd::Rem(values(&a[2..])?))
}

/// See [`zscore`].
pub(super) fn zrank(a: &[Bytes], rev: bool) -> Result<KvOp, Reply> {
    sorted(a, ZCmd::Rank { member: value(&a[2])?, rev })
}

/// The reply of a sorted set command: scores as floats (RESP3 says so),
/// member-score lists as pairs in RESP3 where Redis 7.0 pairs them.
pub(super) fn reply(cmd: &ZCmd, reply: KvReply) -> Reply {
    let double = |t: Vec<u8>| Reply::double(String::from_utf8_lossy(&t).into_owned());
    let pairs = |flat: Vec<Option<Vec<u8>>>| -> Reply {
        let items = flat.chunks(2).map(|p| {
            let member = p[0].clone().map_or_else(Reply::null, Reply::bulk);
            (member, p.get(1).cloned().flatten().map_or_else(Reply::null, double))
        });
        Reply::pairs(items.collect())
    };
    match (cmd, reply) {
        (_, KvReply::Error(e)) => Reply::error(e.to_string()),
        (ZCmd::Add { .. } | ZCmd::IncrBy(..) | ZCmd::Score(_), KvReply::Value(v)) => v.map_or_else(Reply::null, double),
        (ZCmd::MScore(_), KvReply::Values(vs)) => {
            Reply::array(vs.into_iter().map(|v| v.map_or_else(Reply::null, double)).collect())
        }
        (ZCmd::Range { with_scores: true, .. } | ZCmd::Pop { count: Some(_), .. }, KvReply::Values(flat)) => {
            pairs(flat)
        }
        (ZCmd::Pop { count: None, .. }, KvReply::Values(flat)) => Reply::array(
            flat.into_iter()
                .enumerate()
                .map(|(i, v)| match (i % 2, v) {
                    (_, None) => Reply::null(),
                    (0, Some(m)) => Reply::bulk(m),
                    (_, Some(s)) => double(s),
                })
                .collect(),
        ),
        (_, KvReply::Value(v)) => v.map_or_else(Reply::null, Reply::bulk),
        (_, KvReply::Int(n)) => Reply::integer(n),
        (_, KvReply::Values(vs)) => {
            Reply::array(vs.into_iter().map(|v| v.map_or_else(Reply::null, Reply::bulk)).collect())
        }
        (_, other) => super::plain_reply(&KvOp::DbSize, other),
    }
}
