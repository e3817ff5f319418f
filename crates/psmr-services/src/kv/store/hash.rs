//! Hash commands ([`HashCmd`]) on the value at a key, as Redis 7 runs
//! them: a command on a key that holds a string is `WRONGTYPE`; a hash
//! is created by its first field and goes with its last; replies that
//! list a hash are in field order, so every replica says the same.

use super::{count, kind, Map, Obj, Value};
use crate::kv::{parse_integer, HashCmd, KvError, KvReply};
use std::collections::BTreeMap;

type Fields = BTreeMap<Vec<u8>, Vec<u8>>;

/// Runs the read `cmd` on the value `v` of a key.
pub(super) fn read_value(v: Option<&Obj>, cmd: &HashCmd) -> KvReply {
    let f = match v {
        None => None,
        Some(Obj::Hash(f)) => Some(f),
        Some(_) => return KvReply::Error(KvError::WrongType),
    };
    read(f.unwrap_or(&BTreeMap::new()), cmd)
}

/// Runs the write `cmd` on the hash at `key` in `m`.
pub(super) fn run(m: &mut Map, key: &[u8], cmd: &HashCmd) -> KvReply {
    debug_assert!(!cmd.is_read(), "reads go through read_value");
    if let Err(e) = fields(m.get(key)) {
        return KvReply::Error(e);
    }
    let value = m.entry(key.to_vec()).or_insert_with(|| Value::new(Obj::Hash(BTreeMap::new())));
    let Obj::Hash(fields) = value.make_mut() else { unreachable!("checked to be a hash") };
    let reply = write(fields, cmd);
    if fields.is_empty() {
        // A hash goes with its last field (or was never made).
        m.remove(key);
    }
    reply
}

/// The hash `v` holds, if any.
fn fields(v: Option<&Value>) -> Result<Option<&Fields>, KvError> {
    kind(v, |o| match o {
        Obj::Hash(fields) => Some(fields),
        _ => None,
    })
}

fn read(f: &Fields, cmd: &HashCmd) -> KvReply {
    match cmd {
        HashCmd::Get(field) => KvReply::Value(f.get(field).cloned()),
        HashCmd::MGet(names) => listed(names.iter().map(|n| f.get(n).map(Vec::as_slice))),
        HashCmd::GetAll => listed(f.iter().flat_map(|(k, v)| [Some(k.as_slice()), Some(v.as_slice())])),
        HashCmd::Keys => listed(f.keys().map(|k| Some(k.as_slice()))),
        HashCmd::Vals => listed(f.values().map(|v| Some(v.as_slice()))),
        HashCmd::Len => KvReply::Int(count(f.len())),
        HashCmd::Exists(field) => KvReply::Int(i64::from(f.contains_key(field))),
        HashCmd::Strlen(field) => KvReply::Int(count(f.get(field).map_or(0, Vec::len))),
        _ => unreachable!("{} writes", cmd.name()),
    }
}

/// A list of fields or values, bounded.
fn listed<'a>(items: impl Iterator<Item = Option<&'a [u8]>>) -> KvReply {
    super::listed(items, KvError::HashTooLarge)
}

fn write(f: &mut Fields, cmd: &HashCmd) -> KvReply {
    match cmd {
        HashCmd::Set(pairs) | HashCmd::MSet(pairs) => {
            let new = pairs.iter().filter(|(k, v)| f.insert(k.clone(), v.clone()).is_none()).count();
            KvReply::Int(count(new))
        }
        HashCmd::SetNx(field, value) => {
            let absent = !f.contains_key(field);
            if absent {
                f.insert(field.clone(), value.clone());
            }
            KvReply::Int(i64::from(absent))
        }
        HashCmd::Del(names) => KvReply::Int(count(names.iter().filter(|n| f.remove(*n).is_some()).count())),
        HashCmd::IncrBy(field, by) => incr_by(f, field, *by),
        HashCmd::IncrByFloat(field, by) => incr_by_float(f, field, by),
        _ => unreachable!("{} only reads", cmd.name()),
    }
}

fn incr_by(f: &mut Fields, field: &[u8], by: i64) -> KvReply {
    let current = match f.get(field) {
        None => 0,
        Some(v) => match parse_integer(v) {
            Some(n) => n,
            None => return KvReply::Error(KvError::HashNotInteger),
        },
    };
    let Some(sum) = current.checked_add(by) else { return KvReply::Error(KvError::Overflow) };
    f.insert(field.to_vec(), sum.to_string().into_bytes());
    KvReply::Int(sum)
}

/// Adds as Redis does, in binary floating point, and stores the result as
/// the shortest decimal text that reads back as the same number.
fn incr_by_float(f: &mut Fields, field: &[u8], by: &[u8]) -> KvReply {
    let Some(by) = float(by) else { return KvReply::Error(KvError::NotFloat) };
    let current = match f.get(field) {
        None => 0.0,
        Some(v) => match float(v) {
            Some(x) => x,
            None => return KvReply::Error(KvError::HashNotFloat),
        },
    };
    let sum = current + by;
    if !sum.is_finite() {
        return KvReply::Error(KvError::NotFinite);
    }
    let text = format_float(sum).into_bytes();
    f.insert(field.to_vec(), text.clone());
    KvReply::Value(Some(text))
}

/// A decimal float as Redis reads one: no spaces, not NaN; infinities
/// parse (an increment by one is refused as not finite).
pub(crate) fn float(bytes: &[u8]) -> Option<f64> {
    let text = std::str::from_utf8(bytes).ok()?;
    if text.is_empty() || text.starts_with(|c: char| c.is_whitespace()) || text.ends_with(|c: char| c.is_whitespace()) {
        return None;
    }
    text.parse::<f64>().ok().filter(|x| !x.is_nan())
}

/// The shortest decimal text of `x` (never an exponent; `-0` as `0`).
pub(super) fn format_float(x: f64) -> String {
    if x == 0.0 {
        return "0".into();
    }
    format!("{x}")
}
