//! Sorted sets ([`ZCmd`]) as Redis 7.0 runs them: members ordered by
//! score, then by their bytes; a sorted set is made by its first member and
//! goes with its last; a command on a key of another kind is `WRONGTYPE`;
//! scores are replied as Redis 7.0 writes them (`%.17g`).
//!
//! A member's score is kept twice, by member and by score, so that a
//! member's score is found in `O(log n)` and a range starts in `O(log n)`.
//! Ranks are counted by walking (Redis keeps spans in its skip list for
//! that): `ZRANK` and a range by rank cost the rank reached.

use super::{count, listed, Map, Obj, Value};
use crate::kv::{KvError, KvReply, LexBound, Score, ScoreBound, ZAddFlags, ZBy, ZCmd};
use std::collections::{BTreeMap, BTreeSet};

/// A sorted set.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct ZSet {
    members: BTreeMap<Vec<u8>, Score>,
    by_score: BTreeMap<Score, BTreeSet<Vec<u8>>>,
}

impl ZSet {
    /// Members.
    pub(super) fn len(&self) -> usize {
        self.members.len()
    }

    /// The score of `m`.
    fn score(&self, m: &[u8]) -> Option<Score> {
        self.members.get(m).copied()
    }

    /// Sets `m`'s score; its old one.
    pub(super) fn insert(&mut self, m: Vec<u8>, s: Score) -> Option<Score> {
        let old = self.remove(&m);
        self.by_score.entry(s).or_default().insert(m.clone());
        self.members.insert(m, s);
        old
    }

    /// Removes `m`; its score.
    fn remove(&mut self, m: &[u8]) -> Option<Score> {
        let s = self.members.remove(m)?;
        let same = self.by_score.get_mut(&s).expect("kept both ways");
        same.remove(m);
        if same.is_empty() {
            self.by_score.remove(&s);
        }
        Some(s)
    }

    /// Members and scores, from the lowest score.
    pub(super) fn iter(&self) -> impl DoubleEndedIterator<Item = (&Vec<u8>, Score)> + '_ {
        self.by_score.iter().flat_map(|(&s, ms)| ms.iter().map(move |m| (m, s)))
    }

    /// Members and scores within `lo..=hi` by score (open ends excluded),
    /// from the lowest, or from the highest with `rev`.
    fn by_scores<'a>(
        &'a self,
        lo: &ScoreBound,
        hi: &ScoreBound,
        rev: bool,
    ) -> Box<dyn Iterator<Item = (&'a Vec<u8>, Score)> + 'a> {
        if lo.score > hi.score {
            return Box::new(std::iter::empty());
        }
        let range = self.by_score.range(lo.score..=hi.score);
        let (lo, hi) = (*lo, *hi);
        let keep = move |(&s, _): &(&Score, &BTreeSet<Vec<u8>>)| lo.below(s) && hi.above(s);
        match rev {
            false => Box::new(range.filter(keep).flat_map(|(&s, ms)| ms.iter().map(move |m| (m, s)))),
            true => Box::new(range.rev().filter(keep).flat_map(|(&s, ms)| ms.iter().rev().map(move |m| (m, s)))),
        }
    }

    /// The rank of `m` from the lowest score.
    fn rank(&self, m: &[u8]) -> Option<usize> {
        let s = self.score(m)?;
        let below: usize = self.by_score.range(..s).map(|(_, ms)| ms.len()).sum();
        let before = (std::ops::Bound::Unbounded, std::ops::Bound::Excluded(m));
        Some(below + self.by_score[&s].range::<[u8], _>(before).count())
    }
}

/// Runs the read `cmd` on the value `v` of a key.
pub(super) fn read(v: Option<&Obj>, cmd: &ZCmd) -> KvReply {
    let empty = ZSet::default();
    let z = match v {
        None => &empty,
        Some(Obj::ZSet(z)) => z,
        Some(_) => return KvReply::Error(KvError::WrongType),
    };
    match cmd {
        ZCmd::Score(m) => KvReply::Value(z.score(m).map(|s| s.text().into_bytes())),
        ZCmd::MScore(ms) => KvReply::Values(ms.iter().map(|m| z.score(m).map(|s| s.text().into_bytes())).collect()),
        ZCmd::Card => KvReply::Int(count(z.len())),
        ZCmd::Count(lo, hi) => KvReply::Int(count(z.by_scores(lo, hi, false).count())),
        ZCmd::LexCount(lo, hi) => KvReply::Int(count(by_lex(z, lo, hi, false).count())),
        ZCmd::Rank { member, rev } => KvReply::Int(match z.rank(member) {
            Some(r) if *rev => count(z.len() - 1 - r),
            Some(r) => count(r),
            None => return KvReply::Value(None),
        }),
        ZCmd::Range { by, rev, limit, with_scores } => reply(select(z, by, *rev, *limit), *with_scores),
        _ => unreachable!("{} writes", cmd.name()),
    }
}

/// Runs the write `cmd` on the sorted set at `key` in `m`.
pub(super) fn write(m: &mut Map, key: &[u8], cmd: &ZCmd) -> KvReply {
    match m.get(key).map(|v| &**v) {
        None | Some(Obj::ZSet(_)) => {}
        Some(_) => return KvReply::Error(KvError::WrongType),
    }
    let value = m.entry(key.to_vec()).or_insert_with(|| Value::new(Obj::ZSet(ZSet::default())));
    let Obj::ZSet(z) = value.make_mut() else { unreachable!("checked to be a sorted set") };
    let reply = match cmd {
        ZCmd::Add { flags, pairs } => add(z, *flags, pairs),
        ZCmd::IncrBy(by, member) => add(z, ZAddFlags { incr: true, ..ZAddFlags::default() }, &[(*by, member.clone())]),
        ZCmd::Rem(ms) => KvReply::Int(count(ms.iter().filter(|m| z.remove(m).is_some()).count())),
        ZCmd::Pop { max, count: n } => {
            let n = n.map_or(1, |n| usize::try_from(n).unwrap_or(usize::MAX));
            let taken: Vec<(Vec<u8>, Score)> = match max {
                false => z.iter().take(n).map(|(m, s)| (m.clone(), s)).collect(),
                true => z.iter().rev().take(n).map(|(m, s)| (m.clone(), s)).collect(),
            };
            taken.iter().for_each(|(m, _)| {
                z.remove(m);
            });
            reply(taken.iter().map(|(m, s)| (m, *s)).collect(), true)
        }
        ZCmd::RemRange(by) => {
            let gone: Vec<Vec<u8>> = select(z, by, false, None).into_iter().map(|(m, _)| m.clone()).collect();
            gone.iter().for_each(|m| {
                z.remove(m);
            });
            KvReply::Int(count(gone.len()))
        }
        _ => unreachable!("{} only reads", cmd.name()),
    };
    if z.len() == 0 {
        m.remove(key);
    }
    reply
}

/// `ZADD` as Redis 7 adds: with `INCR` one pair, replying the new score
/// (nil if a flag stopped it); else the members added, or changed with
/// `CH`. A sum that is not a number changes nothing.
fn add(z: &mut ZSet, flags: ZAddFlags, pairs: &[(Score, Vec<u8>)]) -> KvReply {
    let (mut added, mut changed, mut last) = (0usize, 0usize, None);
    for (score, member) in pairs {
        let old = z.score(member);
        if (flags.nx && old.is_some()) || (flags.xx && old.is_none()) {
            continue;
        }
        let new = match (flags.incr, old) {
            (true, Some(o)) => match Score::new(o.get() + score.get()) {
                Some(s) => s,
                None => return KvReply::Error(KvError::ScoreNaN),
            },
            _ => *score,
        };
        let stopped = old.is_some_and(|o| (flags.gt && new <= o) || (flags.lt && new >= o));
        if stopped {
            continue;
        }
        last = Some(new);
        match old {
            None => added += 1,
            Some(o) if o != new => changed += 1,
            Some(_) => {}
        }
        z.insert(member.clone(), new);
    }
    match flags.incr {
        true => KvReply::Value(last.map(|s| s.text().into_bytes())),
        false if flags.ch => KvReply::Int(count(added + changed)),
        false => KvReply::Int(count(added)),
    }
}

/// Members and scores by lexical range, in member order within the order
/// of the set (Redis's `BYLEX`, meant for members of one score).
fn by_lex<'a>(
    z: &'a ZSet,
    lo: &'a LexBound,
    hi: &'a LexBound,
    rev: bool,
) -> Box<dyn Iterator<Item = (&'a Vec<u8>, Score)> + 'a> {
    let keep = move |(m, _): &(&Vec<u8>, Score)| lo.below(m) && hi.above(m);
    match rev {
        false => Box::new(z.iter().skip_while(move |e| !lo.below(e.0)).take_while(move |e| hi.above(e.0)).filter(keep)),
        true => {
            Box::new(z.iter().rev().skip_while(move |e| !hi.above(e.0)).take_while(move |e| lo.below(e.0)).filter(keep))
        }
    }
}

/// The members `by` names, from the lowest (the highest with `rev`), past
/// `limit`'s offset and at most its count (negative: all).
fn select<'a>(z: &'a ZSet, by: &'a ZBy, rev: bool, limit: Option<(i64, i64)>) -> Vec<(&'a Vec<u8>, Score)> {
    let (offset, n) = match limit {
        None => (0, usize::MAX),
        Some((o, _)) if o < 0 => return Vec::new(),
        Some((o, c)) => (o as usize, usize::try_from(c).unwrap_or(usize::MAX)),
    };
    let it: Box<dyn Iterator<Item = (&Vec<u8>, Score)>> = match by {
        ZBy::Rank(a, b) => {
            let Some((start, end)) = ranks(*a, *b, z.len()) else { return Vec::new() };
            let take = end - start + 1;
            match rev {
                false => Box::new(z.iter().skip(start).take(take)),
                true => Box::new(z.iter().rev().skip(start).take(take)),
            }
        }
        ZBy::Score(lo, hi) => z.by_scores(lo, hi, rev),
        ZBy::Lex(lo, hi) => by_lex(z, lo, hi, rev),
    };
    it.skip(offset).take(n).collect()
}

/// The ranks `a..=b` name in a set of `len`, negative from the end, as
/// Redis clamps them; `None` if empty.
fn ranks(a: i64, b: i64, len: usize) -> Option<(usize, usize)> {
    let len = len as i64;
    let norm = |i: i64| if i < 0 { len + i } else { i };
    let (start, end) = (norm(a).max(0), norm(b).min(len - 1));
    (start <= end && start < len).then_some((start as usize, end as usize))
}

/// A list of members, each followed by its score with `with_scores`,
/// bounded like every list.
fn reply(items: Vec<(&Vec<u8>, Score)>, with_scores: bool) -> KvReply {
    let texts: Vec<String> = match with_scores {
        true => items.iter().map(|(_, s)| s.text()).collect(),
        false => Vec::new(),
    };
    let flat = items.iter().enumerate().flat_map(|(i, (m, _))| {
        let score = texts.get(i).map(|t| t.as_bytes());
        std::iter::once(Some(m.as_slice())).chain(score.map(Some))
    });
    listed(flat, KvError::ReplyTooLarge)
}
