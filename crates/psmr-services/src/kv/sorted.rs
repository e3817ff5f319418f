//! The operations on sorted sets ([`ZCmd`]) and the numbers they carry:
//! scores ([`Score`]) and the bounds of score and lexical ranges.

use std::cmp::Ordering;
use std::hash::{Hash, Hasher};

/// A sorted set's score: a float that is never NaN, with `-0` taken as
/// `0`, so that it compares, equals and hashes by value.
#[derive(Clone, Copy, Debug, Default)]
pub struct Score(f64);

impl Score {
    /// `x` as a score; `None` for NaN.
    pub fn new(x: f64) -> Option<Self> {
        if x.is_nan() {
            return None;
        }
        Some(Score(if x == 0.0 { 0.0 } else { x }))
    }

    /// The number.
    pub fn get(self) -> f64 {
        self.0
    }

    /// The text Redis 7.0 replies with (`%.17g`; `inf`, `-inf`).
    pub fn text(self) -> String {
        format_g17(self.0)
    }
}

impl PartialEq for Score {
    fn eq(&self, other: &Self) -> bool {
        self.0.to_bits() == other.0.to_bits()
    }
}

impl Eq for Score {}

impl Hash for Score {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.to_bits().hash(state);
    }
}

impl PartialOrd for Score {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Score {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// `x` as C's `printf("%.17g")` writes it, which Redis 7.0 replies scores
/// with: 17 significant digits, trailing zeros dropped, an exponent below
/// 1e-4 and from 1e17.
pub fn format_g17(x: f64) -> String {
    if x.is_infinite() {
        return if x > 0.0 { "inf".into() } else { "-inf".into() };
    }
    if x == 0.0 {
        return "0".into();
    }
    let sci = format!("{x:.16e}");
    let (mantissa, exp) = sci.split_once('e').expect("an exponent");
    let exp: i32 = exp.parse().expect("a number");
    let trim = |s: &str| -> String {
        match s.contains('.') {
            true => s.trim_end_matches('0').trim_end_matches('.').to_string(),
            false => s.to_string(),
        }
    };
    if !(-4..17).contains(&exp) {
        let sign = if exp < 0 { '-' } else { '+' };
        return format!("{}e{sign}{:02}", trim(mantissa), exp.unsigned_abs());
    }
    trim(&format!("{x:.*}", (16 - exp) as usize))
}

/// One end of a score range: `x` or, open, `(x`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ScoreBound {
    /// The score.
    pub score: Score,
    /// Excludes the score itself.
    pub open: bool,
}

impl ScoreBound {
    /// Whether `s` is at or above this bound, taken as a minimum.
    pub fn below(&self, s: Score) -> bool {
        if self.open {
            s > self.score
        } else {
            s >= self.score
        }
    }

    /// Whether `s` is at or below this bound, taken as a maximum.
    pub fn above(&self, s: Score) -> bool {
        if self.open {
            s < self.score
        } else {
            s <= self.score
        }
    }
}

/// One end of a lexical range: `-`, `+`, `[member` or `(member`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum LexBound {
    /// Below every member.
    Min,
    /// Above every member.
    Max,
    /// From or to this member, included.
    Closed(Vec<u8>),
    /// From or to this member, excluded.
    Open(Vec<u8>),
}

impl LexBound {
    /// Whether `m` is at or above this bound, taken as a minimum.
    pub fn below(&self, m: &[u8]) -> bool {
        match self {
            LexBound::Min => true,
            LexBound::Max => false,
            LexBound::Closed(b) => m >= b.as_slice(),
            LexBound::Open(b) => m > b.as_slice(),
        }
    }

    /// Whether `m` is at or below this bound, taken as a maximum.
    pub fn above(&self, m: &[u8]) -> bool {
        match self {
            LexBound::Min => false,
            LexBound::Max => true,
            LexBound::Closed(b) => m <= b.as_slice(),
            LexBound::Open(b) => m < b.as_slice(),
        }
    }
}

/// What a range of a sorted set is taken by.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ZBy {
    /// Ranks, inclusive, negative counting from the end.
    Rank(i64, i64),
    /// Scores, from the minimum to the maximum.
    Score(ScoreBound, ScoreBound),
    /// Members, for members of one score, from the minimum to the maximum.
    Lex(LexBound, LexBound),
}

/// How `ZADD` adds: Redis's `NX`, `XX`, `GT`, `LT`, `CH` and `INCR`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ZAddFlags {
    /// Only new members.
    pub nx: bool,
    /// Only members already there.
    pub xx: bool,
    /// Only to a higher score (new members too).
    pub gt: bool,
    /// Only to a lower score (new members too).
    pub lt: bool,
    /// Count the members changed, not only those added.
    pub ch: bool,
    /// Add to the score (one pair only); reply with the new score.
    pub incr: bool,
}

/// A command on a sorted set ([`super::KvOp::Sorted`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ZCmd {
    /// `ZADD`: the members added (or changed, with `CH`); with `INCR` the
    /// new score, or nil if a flag stopped it.
    Add {
        /// The flags.
        flags: ZAddFlags,
        /// Scores and members, in order.
        pairs: Vec<(Score, Vec<u8>)>,
    },
    /// `ZINCRBY`: the new score.
    IncrBy(Score, Vec<u8>),
    /// `ZSCORE`: the score, or nil.
    Score(Vec<u8>),
    /// `ZMSCORE`: each score, or nil.
    MScore(Vec<Vec<u8>>),
    /// `ZREM`: the members removed; the key goes with its last.
    Rem(Vec<Vec<u8>>),
    /// `ZCARD`.
    Card,
    /// `ZCOUNT`: members with a score in the range.
    Count(ScoreBound, ScoreBound),
    /// `ZLEXCOUNT`: members in the lexical range.
    LexCount(LexBound, LexBound),
    /// `ZRANK` (`rev`: `ZREVRANK`): the member's rank, or nil.
    Rank {
        /// The member.
        member: Vec<u8>,
        /// Counted from the highest score.
        rev: bool,
    },
    /// `ZRANGE` and its older forms: members in the range, from the lowest
    /// score (from the highest with `rev`), after `limit`'s offset and at
    /// most its count (all if negative), with their scores if asked.
    Range {
        /// The range.
        by: ZBy,
        /// From the highest.
        rev: bool,
        /// Offset and count.
        limit: Option<(i64, i64)>,
        /// Scores after each member.
        with_scores: bool,
    },
    /// `ZPOPMIN` (`max`: `ZPOPMAX`): one member (`None`) or up to `n`,
    /// removed, each with its score.
    Pop {
        /// From the highest score.
        max: bool,
        /// How many, if given.
        count: Option<u64>,
    },
    /// `ZREMRANGEBYRANK`, `ZREMRANGEBYSCORE`, `ZREMRANGEBYLEX`: the members
    /// removed.
    RemRange(ZBy),
}

impl ZCmd {
    /// Whether the command changes nothing.
    pub fn is_read(&self) -> bool {
        !matches!(self, ZCmd::Add { .. } | ZCmd::IncrBy(..) | ZCmd::Rem(_) | ZCmd::Pop { .. } | ZCmd::RemRange(_))
    }

    /// The Redis command's name, in capitals.
    pub fn name(&self) -> &'static str {
        match self {
            ZCmd::Add { .. } => "ZADD",
            ZCmd::IncrBy(..) => "ZINCRBY",
            ZCmd::Score(_) => "ZSCORE",
            ZCmd::MScore(_) => "ZMSCORE",
            ZCmd::Rem(_) => "ZREM",
            ZCmd::Card => "ZCARD",
            ZCmd::Count(..) => "ZCOUNT",
            ZCmd::LexCount(..) => "ZLEXCOUNT",
            ZCmd::Rank { rev: false, .. } => "ZRANK",
            ZCmd::Rank { rev: true, .. } => "ZREVRANK",
            ZCmd::Range { .. } => "ZRANGE",
            ZCmd::Pop { max: false, .. } => "ZPOPMIN",
            ZCmd::Pop { max: true, .. } => "ZPOPMAX",
            ZCmd::RemRange(ZBy::Rank(..)) => "ZREMRANGEBYRANK",
            ZCmd::RemRange(ZBy::Score(..)) => "ZREMRANGEBYSCORE",
            ZCmd::RemRange(ZBy::Lex(..)) => "ZREMRANGEBYLEX",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scores_are_written_as_redis_7_0_writes_them() {
        for (x, want) in [
            (0.0, "0"),
            (-0.0, "0"),
            (1.0, "1"),
            (1.5, "1.5"),
            (-2.25, "-2.25"),
            (0.1, "0.10000000000000001"),
            (100.0, "100"),
            (1e20, "1e+20"),
            (1.5e-7, "1.4999999999999999e-07"),
            (123456789012345678.0, "1.2345678901234568e+17"),
            (0.0001, "0.0001"),
            (f64::INFINITY, "inf"),
            (f64::NEG_INFINITY, "-inf"),
        ] {
            assert_eq!(Score::new(x).unwrap().text(), want, "{x}");
        }
        assert!(Score::new(f64::NAN).is_none());
        assert_eq!(Score::new(-0.0), Score::new(0.0));
    }
}
