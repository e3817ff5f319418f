//! Set commands ([`SetCmd`]) on the value at a key, as Redis 7 runs them:
//! a set is made by its first member and goes with its last; a command on
//! a key of another kind is `WRONGTYPE`; members are listed in byte
//! order, so every replica replies alike.

use super::{count, kind, Map, Obj, Value};
use crate::kv::{Combine, KvError, KvReply, SetCmd, REPLY_VALUES_MAX};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::BTreeSet;

/// The members of a set.
pub(super) type Members = BTreeSet<Vec<u8>>;

/// Runs the read `cmd` on the value `v` of a key, drawing from `seed`.
pub(super) fn read(v: Option<&Obj>, cmd: &SetCmd, seed: u64) -> KvReply {
    let set = match v {
        None => None,
        Some(Obj::Set(set)) => Some(set),
        Some(_) => return KvReply::Error(KvError::WrongType),
    };
    match cmd {
        SetCmd::Members => listed(set.into_iter().flatten()),
        SetCmd::IsMember(member) => KvReply::Int(i64::from(set.is_some_and(|s| s.contains(member)))),
        SetCmd::MIsMember(ms) => {
            let found = |m: &Vec<u8>| set.is_some_and(|s| s.contains(m));
            KvReply::Values(ms.iter().map(|m| Some(if found(m) { b"1".to_vec() } else { b"0".to_vec() })).collect())
        }
        SetCmd::Card => KvReply::Int(count(set.map_or(0, BTreeSet::len))),
        SetCmd::RandMember(n) => rand_member(set, *n, seed),
        _ => unreachable!("{} writes", cmd.name()),
    }
}

/// Runs the write `cmd` on the set at `key` in `m`, drawing from `seed`.
pub(super) fn write(m: &mut Map, key: &[u8], cmd: &SetCmd, seed: u64) -> KvReply {
    if let Err(e) = members(m.get(key)) {
        return KvReply::Error(e);
    }
    match cmd {
        SetCmd::Add(ms) => {
            let value = m.entry(key.to_vec()).or_insert_with(|| Value::new(Obj::Set(BTreeSet::new())));
            let Obj::Set(set) = value.make_mut() else { unreachable!("checked to be a set") };
            KvReply::Int(count(ms.iter().filter(|m| set.insert((*m).clone())).count()))
        }
        SetCmd::Rem(ms) => {
            let Some(value) = m.get_mut(key) else { return KvReply::Int(0) };
            let Obj::Set(set) = value.make_mut() else { unreachable!("checked to be a set") };
            let removed = ms.iter().filter(|m| set.remove(*m)).count();
            if set.is_empty() {
                m.remove(key);
            }
            KvReply::Int(count(removed))
        }
        SetCmd::Pop(n) => {
            let Some(value) = m.get_mut(key) else {
                return if n.is_some() { KvReply::Values(Vec::new()) } else { KvReply::Value(None) };
            };
            let Obj::Set(set) = value.make_mut() else { unreachable!("checked to be a set") };
            let popped = pop(set, *n, seed);
            if set.is_empty() {
                m.remove(key);
            }
            popped
        }
        _ => unreachable!("{} only reads", cmd.name()),
    }
}

/// The set `v` holds, if any.
fn members(v: Option<&Value>) -> Result<Option<&Members>, KvError> {
    kind(v, |o| match o {
        Obj::Set(s) => Some(s),
        _ => None,
    })
}

/// The sets `sets` (missing ones empty) combined `how`.
pub(super) fn combine(how: Combine, sets: Vec<Option<Members>>) -> Members {
    let mut sets = sets.into_iter().map(Option::unwrap_or_default);
    let first = sets.next().unwrap_or_default();
    sets.fold(first, |acc, s| match how {
        Combine::Inter => acc.intersection(&s).cloned().collect(),
        Combine::Union => acc.union(&s).cloned().collect(),
        Combine::Diff => acc.difference(&s).cloned().collect(),
    })
}

/// A list of members, bounded.
pub(super) fn listed<'a>(members: impl Iterator<Item = &'a Vec<u8>>) -> KvReply {
    super::listed(members.map(|m| Some(m.as_slice())), KvError::ReplyTooLarge)
}

/// The generator of a command's draws: every replica draws alike from the
/// seed of the command's log entry.
fn draws(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed)
}

/// `SPOP`: one member (`None`) or up to `n`, drawn and removed. Members
/// are drawn by rank in byte order, so a draw depends on the members and
/// the seed alone.
fn pop(set: &mut Members, n: Option<u64>, seed: u64) -> KvReply {
    let mut rng = draws(seed);
    let n = match n {
        None => {
            let ranks = [rng.gen_range(0..set.len())];
            let m = at_ranks(set, &ranks).pop().expect("one rank");
            set.remove(&m);
            return KvReply::Value(Some(m));
        }
        Some(n) => usize::try_from(n).unwrap_or(usize::MAX).min(set.len()),
    };
    if n == set.len() {
        return listed_owned(std::mem::take(set).into_iter().collect());
    }
    let popped = at_ranks(set, &distinct_ranks(&mut rng, set.len(), n));
    for m in &popped {
        set.remove(m);
    }
    listed_owned(popped)
}

/// `SRANDMEMBER`: one member (`None`), up to `n` distinct ones (`n` ≥ 0,
/// in byte order), or `-n` with repeats (in the order drawn).
fn rand_member(set: Option<&Members>, n: Option<i64>, seed: u64) -> KvReply {
    let empty = Members::new();
    let set = set.unwrap_or(&empty);
    let mut rng = draws(seed);
    match n {
        None if set.is_empty() => KvReply::Value(None),
        None => KvReply::Value(at_ranks(set, &[rng.gen_range(0..set.len())]).pop()),
        Some(_) if set.is_empty() => KvReply::Values(Vec::new()),
        Some(n) if n >= 0 => {
            let n = usize::try_from(n).unwrap_or(usize::MAX);
            if n >= set.len() {
                return listed(set.iter());
            }
            listed_owned(at_ranks(set, &distinct_ranks(&mut rng, set.len(), n)))
        }
        Some(n) => {
            // Bounded like any reply, before anything is drawn.
            let n = usize::try_from(n.unsigned_abs()).unwrap_or(usize::MAX);
            let largest = set.iter().map(Vec::len).max().unwrap_or(0);
            if n.saturating_mul(5 + largest) > REPLY_VALUES_MAX {
                return KvReply::Error(KvError::ReplyTooLarge);
            }
            let ranks: Vec<usize> = (0..n).map(|_| rng.gen_range(0..set.len())).collect();
            listed_owned(at_ranks(set, &ranks))
        }
    }
}

/// `n` distinct ranks below `len`, in increasing order (Floyd's sampling:
/// `n` draws, whatever `n` is).
fn distinct_ranks(rng: &mut ChaCha8Rng, len: usize, n: usize) -> Vec<usize> {
    let mut picked = BTreeSet::new();
    for j in len - n..len {
        let t = rng.gen_range(0..=j);
        if !picked.insert(t) {
            picked.insert(j);
        }
    }
    picked.into_iter().collect()
}

/// The members at `ranks` (in byte order, repeats allowed), in the order
/// of `ranks`: one pass over the set.
fn at_ranks(set: &Members, ranks: &[usize]) -> Vec<Vec<u8>> {
    let mut order: Vec<(usize, usize)> = ranks.iter().enumerate().map(|(i, &r)| (r, i)).collect();
    order.sort_unstable();
    let mut out = vec![Vec::new(); ranks.len()];
    let mut members = set.iter().enumerate();
    let mut current = members.next();
    for (rank, slot) in order {
        while let Some((r, _)) = current {
            if r >= rank {
                break;
            }
            current = members.next();
        }
        if let Some((_, m)) = current {
            out[slot] = m.clone();
        }
    }
    out
}

/// Members drawn, as a list reply (bounded like every list).
fn listed_owned(members: Vec<Vec<u8>>) -> KvReply {
    listed(members.iter())
}
