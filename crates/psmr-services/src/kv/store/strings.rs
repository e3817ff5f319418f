//! Deadlines (`EXPIRE` and its kin, `TTL`, `PERSIST`, `GETEX`) and the rest
//! of Redis's string commands (`GETDEL`, `GETRANGE`, `SETRANGE`,
//! `INCRBYFLOAT`, `MSETNX`), as Redis 7 runs them. Time is the command's
//! time on the log's clock ([`psmr_model::Stamp`]), so a key expires at the
//! same point of the log on every replica.

use super::{count, kept_deadline, or_error, put, put_fresh, set_deadline, string, At, KvService, Map, Value};
use crate::kv::{Deadline, ExpireCond, KvError, KvOp, KvReply, Pair, Ttl, TtlCmd, VALUE_MAX};

impl KvService {
    /// Runs the string or deadline command `op` at `now`.
    pub(super) fn strings(&self, op: &KvOp, at: At) -> KvReply {
        let now = at.now;
        match op {
            KvOp::Expire { key, deadline, cond, cmd } => {
                self.write(at, key, |m| expire(m, key, (*deadline, *cond, *cmd), now))
            }
            KvOp::Persist { key } => self.write(at, key, |m| match m.get_mut(key.as_slice()) {
                Some(v) if v.expires != 0 => {
                    v.expires = 0;
                    KvReply::Int(1)
                }
                _ => KvReply::Int(0),
            }),
            KvOp::Ttl { key, ms, absolute } => self.read_value(now, key, |v| KvReply::Int(ttl(v, now, *ms, *absolute))),
            KvOp::GetEx { key, ttl } => self.write(at, key, |m| get_ex(m, key, *ttl, now)),
            KvOp::GetDel { key } => self.write(at, key, |m| match string(m, key) {
                Err(e) => KvReply::Error(e),
                Ok(None) => KvReply::Value(None),
                Ok(Some(_)) => KvReply::Value(m.remove(key.as_slice()).and_then(|v| match &*v.obj {
                    super::Obj::Str(bytes) => Some(bytes.clone()),
                    _ => None,
                })),
            }),
            KvOp::GetRange { key, start, end } => {
                or_error(self.read_str(now, key, |v| KvReply::Value(Some(range(v.unwrap_or(&[]), *start, *end)))))
            }
            KvOp::SetRange { key, offset, value } => self.write(at, key, |m| set_range(m, key, *offset, value)),
            KvOp::IncrByFloat { key, by } => self.write(at, key, |m| incr_by_float(m, key, by)),
            KvOp::MSetNx { pairs } => self.mset_nx(at, pairs),
            _ => unreachable!("{} is not a string command", op.name()),
        }
    }

    /// `MSETNX`: every key checked before any is set.
    fn mset_nx(&self, at: At, pairs: &[Pair]) -> KvReply {
        if pairs.iter().any(|(k, _)| self.read(at.now, k, |v| v.is_some())) {
            return KvReply::Int(0);
        }
        for (key, value) in pairs {
            self.write(at, key, |m| put_fresh(m, key, value));
        }
        KvReply::Int(1)
    }
}

/// `EXPIRE` and its kin at `now`: 1 if the deadline was set (or the key
/// removed, the deadline being past), 0 if there is no key or `cond`
/// stopped it.
fn expire(m: &mut Map, key: &[u8], (deadline, cond, cmd): (Deadline, ExpireCond, TtlCmd), now: u64) -> KvReply {
    let Some(at) = deadline.at(now) else { return KvReply::Error(KvError::InvalidExpire(cmd)) };
    let Some(v) = m.get_mut(key) else { return KvReply::Int(0) };
    // No deadline is an infinite one.
    let current = (v.expires != 0).then_some(v.expires as i64);
    let allowed = match cond {
        ExpireCond::Always => true,
        ExpireCond::Nx => current.is_none(),
        ExpireCond::Xx => current.is_some(),
        ExpireCond::Gt => current.is_some_and(|c| at > c),
        ExpireCond::Lt => current.map_or(true, |c| at < c),
        ExpireCond::XxLt => current.is_some_and(|c| at < c),
    };
    if !allowed {
        return KvReply::Int(0);
    }
    if at <= now as i64 {
        m.remove(key);
    } else {
        v.expires = kept_deadline(at);
    }
    KvReply::Int(1)
}

/// `TTL` and its kin: -2 without a key, -1 without a deadline; seconds
/// rounded to the nearest, as Redis rounds.
fn ttl(v: Option<&Value>, now: u64, ms: bool, absolute: bool) -> i64 {
    let Some(v) = v else { return -2 };
    if v.expires == 0 {
        return -1;
    }
    let expires = i64::try_from(v.expires).unwrap_or(i64::MAX);
    let t = if absolute { expires } else { expires.saturating_sub(now as i64).max(0) };
    if ms {
        t
    } else {
        t.saturating_add(500) / 1000
    }
}

/// `GETEX`: the string, its deadline changed as `ttl` says; a deadline
/// already past removes the key (after reading it).
fn get_ex(m: &mut Map, key: &[u8], ttl: Ttl, now: u64) -> KvReply {
    let at = match ttl {
        Ttl::Expire(d) => match d.at(now) {
            Some(at) => Some(at),
            None => return KvReply::Error(KvError::InvalidExpire(TtlCmd::GetEx)),
        },
        _ => None,
    };
    let value = match string(m, key) {
        Err(e) => return KvReply::Error(e),
        Ok(None) => return KvReply::Value(None),
        Ok(Some(v)) => v.clone(),
    };
    match (ttl, at) {
        (Ttl::Clear, _) => set_deadline(m, key, 0),
        (_, Some(at)) if at <= now as i64 => {
            m.remove(key);
        }
        (_, Some(at)) => set_deadline(m, key, kept_deadline(at)),
        _ => {}
    }
    KvReply::Value(Some(value))
}

/// `GETRANGE`'s bytes: `start` and `end` inclusive, negative from the end,
/// clamped to the string; empty when the range is.
fn range(v: &[u8], start: i64, end: i64) -> Vec<u8> {
    let len = v.len() as i64;
    let from_end = |i: i64| if i < 0 { len + i } else { i };
    let (start, end) = (from_end(start).max(0), from_end(end).min(len - 1));
    if start > end || len == 0 {
        return Vec::new();
    }
    v[start as usize..=end as usize].to_vec()
}

/// `SETRANGE`: the string overwritten from `offset`, zero bytes before it
/// if it is past the end; the new length. An empty `value` changes
/// nothing (and makes no key).
fn set_range(m: &mut Map, key: &[u8], offset: u64, value: &[u8]) -> KvReply {
    let current = match string(m, key) {
        Err(e) => return KvReply::Error(e),
        Ok(v) => v.map_or(0, Vec::len),
    };
    if value.is_empty() {
        return KvReply::Int(count(current));
    }
    let end = usize::try_from(offset).ok().and_then(|o| o.checked_add(value.len()));
    let Some(end) = end.filter(|&e| e <= VALUE_MAX) else { return KvReply::Error(KvError::TooLarge) };
    if current == 0 {
        put(m, key, &[]);
    }
    let Some(super::Obj::Str(bytes)) = m.get_mut(key).map(Value::make_mut) else { unreachable!("a string is there") };
    if bytes.len() < end {
        bytes.resize(end, 0);
    }
    bytes[end - value.len()..end].copy_from_slice(value);
    KvReply::Int(count(bytes.len()))
}

/// `INCRBYFLOAT`: as `HINCRBYFLOAT` adds, on a string; keeps the deadline.
fn incr_by_float(m: &mut Map, key: &[u8], by: &[u8]) -> KvReply {
    let Some(by) = super::float(by) else { return KvReply::Error(KvError::NotFloat) };
    let current = match string(m, key) {
        Err(e) => return KvReply::Error(e),
        Ok(None) => 0.0,
        Ok(Some(v)) => match super::float(v) {
            Some(x) => x,
            None => return KvReply::Error(KvError::NotFloat),
        },
    };
    let sum = current + by;
    if !sum.is_finite() {
        return KvReply::Error(KvError::NotFinite);
    }
    let text = super::hash::format_float(sum).into_bytes();
    put(m, key, &text);
    KvReply::Value(Some(text))
}
