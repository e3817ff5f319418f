//! List commands ([`ListCmd`], [`KvOp::LMove`]) as Redis 7 runs them: a
//! list is made by its first push and goes with its last element; a
//! command on a key of another kind is `WRONGTYPE`; indices count from 0
//! at the head and from -1 at the tail, and ranges clamp to the list.

use super::{count, kind, Map, Obj, Value};
use crate::kv::{KvError, KvReply, ListCmd};
use std::collections::VecDeque;

type Items = VecDeque<Vec<u8>>;

/// Runs the read `cmd` on the value `v` of a key.
pub(super) fn read_value(v: Option<&Obj>, cmd: &ListCmd) -> KvReply {
    let list = match v {
        None => None,
        Some(Obj::List(items)) => Some(items),
        Some(_) => return KvReply::Error(KvError::WrongType),
    };
    read(list.unwrap_or(&VecDeque::new()), cmd)
}

/// Runs the write `cmd` on the list at `key` in `m`.
pub(super) fn run(m: &mut Map, key: &[u8], cmd: &ListCmd) -> KvReply {
    debug_assert!(!cmd.is_read(), "reads go through read_value");
    let list = match items(m.get(key)) {
        Err(e) => return KvReply::Error(e),
        Ok(list) => list,
    };
    let Some(_) = list else { return absent(m, key, cmd) };
    let value = m.get_mut(key).expect("checked to exist");
    let Obj::List(items) = value.make_mut() else { unreachable!("checked to be a list") };
    let reply = write(items, cmd);
    if items.is_empty() {
        m.remove(key);
    }
    reply
}

/// A write to a list that does not exist: a push makes it, the rest
/// answer as Redis does for a missing key.
fn absent(m: &mut Map, key: &[u8], cmd: &ListCmd) -> KvReply {
    match cmd {
        ListCmd::Push { left, values } => {
            let mut items = VecDeque::new();
            push(&mut items, *left, values.iter().cloned());
            let n = items.len();
            m.insert(key.to_vec(), Value::new(Obj::List(items)));
            KvReply::Int(count(n))
        }
        ListCmd::Pop { .. } => KvReply::Value(None),
        ListCmd::Set(..) => KvReply::Error(KvError::NoSuchKey),
        ListCmd::Trim(..) => KvReply::Done(true),
        ListCmd::Rem(..) | ListCmd::Insert { .. } => KvReply::Int(0),
        _ => unreachable!("{} only reads", cmd.name()),
    }
}

/// The list `v` holds, if any.
fn items(v: Option<&Value>) -> Result<Option<&Items>, KvError> {
    kind(v, |o| match o {
        Obj::List(items) => Some(items),
        _ => None,
    })
}

fn push(items: &mut Items, left: bool, values: impl Iterator<Item = Vec<u8>>) {
    for v in values {
        if left {
            items.push_front(v);
        } else {
            items.push_back(v);
        }
    }
}

/// `index` (negative from the tail) as a position in a list of `len`.
fn position(index: i64, len: usize) -> Option<usize> {
    let len = i64::try_from(len).ok()?;
    let i = if index < 0 { len + index } else { index };
    (0..len).contains(&i).then_some(i as usize)
}

/// The positions `start..=stop` clamp to in a list of `len`, as `LRANGE`
/// and `LTRIM` read them; None if the range is empty.
fn range(start: i64, stop: i64, len: usize) -> Option<(usize, usize)> {
    let n = i64::try_from(len).ok()?;
    let start = if start < 0 { (n + start).max(0) } else { start };
    let stop = if stop < 0 { n + stop } else { stop.min(n - 1) };
    (start <= stop && start < n).then_some((start as usize, stop as usize))
}

fn read(items: &Items, cmd: &ListCmd) -> KvReply {
    match cmd {
        ListCmd::Range(start, stop) => match range(*start, *stop, items.len()) {
            Some((a, b)) => listed(items.range(a..=b)),
            None => KvReply::Values(Vec::new()),
        },
        ListCmd::Len => KvReply::Int(count(items.len())),
        ListCmd::Index(i) => KvReply::Value(position(*i, items.len()).map(|p| items[p].clone())),
        ListCmd::Pos { element, rank, count: n, maxlen } => pos(items, element, *rank, *n, *maxlen),
        _ => unreachable!("{} writes", cmd.name()),
    }
}

/// A list of elements, bounded.
fn listed<'a>(elements: impl Iterator<Item = &'a Vec<u8>>) -> KvReply {
    super::listed(elements.map(|e| Some(e.as_slice())), KvError::ListTooLarge)
}

/// `LPOS`: the positions of `element`, from the `rank`th match (negative:
/// from the tail), at most `n` of them (0: all; None: the first alone, as
/// a number), among the first `maxlen` elements looked at (0: all).
fn pos(items: &Items, element: &[u8], rank: i64, n: Option<u64>, maxlen: u64) -> KvReply {
    let len = items.len();
    let order: Box<dyn Iterator<Item = usize>> = if rank > 0 { Box::new(0..len) } else { Box::new((0..len).rev()) };
    let looked = if maxlen == 0 { len } else { usize::try_from(maxlen).unwrap_or(usize::MAX) };
    let skip = usize::try_from(rank.unsigned_abs() - 1).unwrap_or(usize::MAX);
    let want = match n {
        None => 1,
        Some(0) => usize::MAX,
        Some(k) => usize::try_from(k).unwrap_or(usize::MAX),
    };
    let found: Vec<i64> =
        order.take(looked).filter(|&i| items[i] == element).skip(skip).take(want).map(|i| i as i64).collect();
    match n {
        None => KvReply::Value(found.first().map(|i| i.to_string().into_bytes())),
        Some(_) => KvReply::Values(found.into_iter().map(|i| Some(i.to_string().into_bytes())).collect()),
    }
}

fn write(items: &mut Items, cmd: &ListCmd) -> KvReply {
    match cmd {
        ListCmd::Push { left, values } => {
            push(items, *left, values.iter().cloned());
            KvReply::Int(count(items.len()))
        }
        ListCmd::Pop { left, count: None } => KvReply::Value(pop(items, *left)),
        ListCmd::Pop { left, count: Some(n) } => {
            let n = usize::try_from(*n).unwrap_or(usize::MAX).min(items.len());
            KvReply::Values((0..n).map(|_| pop(items, *left)).collect())
        }
        ListCmd::Set(i, v) => match position(*i, items.len()) {
            Some(p) => {
                items[p] = v.clone();
                KvReply::Done(true)
            }
            None => KvReply::Error(KvError::IndexOutOfRange),
        },
        ListCmd::Rem(n, v) => KvReply::Int(count(rem(items, *n, v))),
        ListCmd::Trim(start, stop) => {
            match range(*start, *stop, items.len()) {
                Some((a, b)) => {
                    items.truncate(b + 1);
                    items.drain(..a);
                }
                None => items.clear(),
            }
            KvReply::Done(true)
        }
        ListCmd::Insert { before, pivot, value } => match items.iter().position(|e| e == pivot) {
            Some(p) => {
                items.insert(if *before { p } else { p + 1 }, value.clone());
                KvReply::Int(count(items.len()))
            }
            None => KvReply::Int(-1),
        },
        _ => unreachable!("{} only reads", cmd.name()),
    }
}

fn pop(items: &mut Items, left: bool) -> Option<Vec<u8>> {
    if left {
        items.pop_front()
    } else {
        items.pop_back()
    }
}

/// Removes up to `|n|` elements equal to `v` (all if `n` is 0), from the
/// head if `n` > 0, else from the tail; how many went.
fn rem(items: &mut Items, n: i64, v: &[u8]) -> usize {
    let limit = if n == 0 { usize::MAX } else { usize::try_from(n.unsigned_abs()).unwrap_or(usize::MAX) };
    let mut hits: Vec<usize> = items.iter().enumerate().filter(|(_, e)| *e == v).map(|(i, _)| i).collect();
    if n < 0 {
        hits.reverse();
    }
    hits.truncate(limit);
    hits.sort_unstable();
    for &i in hits.iter().rev() {
        items.remove(i);
    }
    hits.len()
}
