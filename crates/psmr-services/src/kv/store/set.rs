//! Set commands ([`SetCmd`]) on the value at a key, as Redis 7 runs them:
//! a set is made by its first member and goes with its last; a command on
//! a key of another kind is `WRONGTYPE`; members are listed in byte
//! order, so every replica replies alike.

use super::{count, kind, Map, Obj, Value};
use crate::kv::{Combine, KvError, KvReply, SetCmd};
use std::collections::BTreeSet;
use std::sync::Arc;

/// The members of a set.
pub(super) type Members = BTreeSet<Vec<u8>>;

/// Runs the read `cmd` on the value `v` of a key.
pub(super) fn read(v: Option<&Obj>, cmd: &SetCmd) -> KvReply {
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
        _ => unreachable!("{} writes", cmd.name()),
    }
}

/// Runs the write `cmd` on the set at `key` in `m`.
pub(super) fn write(m: &mut Map, key: &[u8], cmd: &SetCmd) -> KvReply {
    if let Err(e) = members(m.get(key)) {
        return KvReply::Error(e);
    }
    match cmd {
        SetCmd::Add(ms) => {
            let value = m.entry(key.to_vec()).or_insert_with(|| Arc::new(Obj::Set(BTreeSet::new())));
            let Obj::Set(set) = Arc::make_mut(value) else { unreachable!("checked to be a set") };
            KvReply::Int(count(ms.iter().filter(|m| set.insert((*m).clone())).count()))
        }
        SetCmd::Rem(ms) => {
            let Some(value) = m.get_mut(key) else { return KvReply::Int(0) };
            let Obj::Set(set) = Arc::make_mut(value) else { unreachable!("checked to be a set") };
            let removed = ms.iter().filter(|m| set.remove(*m)).count();
            if set.is_empty() {
                m.remove(key);
            }
            KvReply::Int(count(removed))
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
