//! Commands on keys rather than values, as Redis 7 runs them: `RENAME`,
//! `RENAMENX`, `COPY`, `KEYS`, `SCAN`, `RANDOMKEY`, `OBJECT ENCODING`.
//!
//! Nothing a reply says depends on how this process laid the keys out:
//! `KEYS` lists in byte order, and `SCAN`'s cursor walks a fixed order of
//! the key space: [`SLOTS`] slots, a key's slot given by its conflict key
//! alone (its stripe, then the bucket it has or would have once the stripe
//! splits), keys in byte order within a slot. Every replica, restarted or
//! restored from a snapshot or not, answers a cursor alike, and a key
//! present for a whole scan is returned at least once, whatever is written
//! in between.

use super::{bucket_of, stripe_of, At, Buckets, KvService, Map, Obj, Value, BUCKETS, STRIPES};
use crate::kv::{key_hash, parse_integer, KvError, KvOp, KvReply, REPLY_VALUES_MAX};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Slots `SCAN` walks: one per bucket of a split stripe.
pub(crate) const SLOTS: u64 = (STRIPES * BUCKETS) as u64;

/// Keys one sweep looks at, about (a slot is never cut).
const SWEEP_LOOKS: usize = 2048;

/// Keys one sweep names at most: the command's cost and footprint stay
/// small, and it conflicts with those keys only.
const SWEEP_KEYS: usize = 128;

/// Random slots `RANDOMKEY` tries before it walks from one.
const RANDOM_TRIES: usize = 64;

/// The slot within its stripe of the key with conflict key `hash`: the
/// bucket it is in once its stripe splits.
fn slot_in_stripe(hash: u64) -> usize {
    ((hash / STRIPES as u64) % BUCKETS as u64) as usize
}

/// What `SCAN` keeps of a key.
struct Filter<'a> {
    now: u64,
    pattern: Option<&'a [u8]>,
    kind: Option<&'a [u8]>,
}

impl Filter<'_> {
    fn keeps(&self, key: &[u8], v: &Value) -> bool {
        v.live(self.now)
            && self.pattern.map_or(true, |p| glob(p, key))
            && self.kind.map_or(true, |k| v.kind().eq_ignore_ascii_case(k))
    }
}

impl KvService {
    /// Runs the key command `op` at `at`.
    pub(super) fn keyspace(&self, op: &KvOp, at: At) -> KvReply {
        let now = at.now;
        match op {
            KvOp::Rename { from, to, nx } => self.rename(at, from, to, *nx),
            KvOp::Copy { from, to, replace } => self.copy(at, from, to, *replace),
            KvOp::Keys { pattern } => {
                let filter = Filter { now, pattern: Some(pattern), kind: None };
                let mut keys: Vec<&[u8]> = Vec::new();
                let stripes: Vec<_> = self.stripes.iter().map(|s| s.read()).collect();
                for (k, v) in stripes.iter().flat_map(|b| b.iter()).flat_map(|m| m.iter()) {
                    if filter.keeps(k, v) {
                        keys.push(k);
                    }
                }
                keys.sort_unstable();
                super::listed(keys.into_iter().map(Some), KvError::KeysTooLarge)
            }
            KvOp::Scan { cursor, pattern, count, kind } => {
                let filter = Filter { now, pattern: pattern.as_deref(), kind: kind.as_deref() };
                self.scan(*cursor, *count, &filter)
            }
            KvOp::RandomKey => KvReply::Value(self.random_key(now, at.seed)),
            KvOp::Encoding { key } => KvReply::Value(self.read(now, key, |v| v.map(|v| encoding(v).into()))),
            KvOp::Sweep { keys } => KvReply::Int(super::count(keys.iter().filter(|k| self.reclaim(now, k)).count())),
            _ => unreachable!("{} is not a key command", op.name()),
        }
    }

    /// Removes `key` if it is past its deadline at `now`; whether it did.
    fn reclaim(&self, now: u64, key: &[u8]) -> bool {
        let hash = key_hash(key);
        super::write_bucket(&mut self.stripes[stripe_of(hash)].write(), hash, |m| {
            let dead = m.get(key).is_some_and(|v| !v.live(now));
            if dead {
                m.remove(key);
            }
            dead
        })
    }

    /// The leader's housekeeping ([`psmr_model::App::sweep`]): a `Sweep`
    /// of the keys past their deadline at `now` among those of the next
    /// slots, looking at about 2 048 keys and naming at most 128, each
    /// stripe read-locked for one slot at a time. The slots go round, so
    /// every key is looked at in time, as Redis's active expiry samples
    /// its keys.
    pub fn sweep(&self, now: u64) -> Option<KvOp> {
        use std::sync::atomic::Ordering;
        let mut slot = self.sweep_at.load(Ordering::Relaxed) % SLOTS;
        let (mut looked, mut keys) = (0usize, Vec::new());
        for _ in 0..SLOTS {
            if looked >= SWEEP_LOOKS || keys.len() >= SWEEP_KEYS {
                break;
            }
            let stripe = (slot / BUCKETS as u64) as usize;
            let buckets = self.stripes[stripe].read();
            let found = slot_keys(&buckets, stripe, slot_in_stripe_of(slot));
            looked += found.len();
            let dead = found.into_iter().filter(|(_, v)| !v.live(now)).map(|(k, _)| k.clone());
            keys.extend(dead.take(SWEEP_KEYS - keys.len()));
            slot = (slot + 1) % SLOTS;
        }
        self.sweep_at.store(slot, Ordering::Relaxed);
        (!keys.is_empty()).then_some(KvOp::Sweep { keys })
    }

    /// `RENAME`/`RENAMENX`: the value and its deadline move; the
    /// destination's old value goes. Each key is locked on its own: the
    /// scheduler keeps conflicting commands away from both.
    fn rename(&self, at: At, from: &[u8], to: &[u8], nx: bool) -> KvReply {
        if !self.read(at.now, from, |v| v.is_some()) {
            return KvReply::Error(KvError::NoSuchKey);
        }
        if from == to || (nx && self.read(at.now, to, |v| v.is_some())) {
            return if nx { KvReply::Int(0) } else { KvReply::Done(true) };
        }
        let moved = self.write(at, from, |m| m.remove(from)).expect("read live just now");
        self.write(at, to, |m| m.insert(to.to_vec(), moved));
        if nx {
            KvReply::Int(1)
        } else {
            KvReply::Done(true)
        }
    }

    /// `COPY`: the value (shared until either side changes) and its
    /// deadline.
    fn copy(&self, at: At, from: &[u8], to: &[u8], replace: bool) -> KvReply {
        if from == to {
            return KvReply::Error(KvError::SameObject);
        }
        let Some(value) = self.read_value(at.now, from, |v| v.cloned()) else { return KvReply::Int(0) };
        if !replace && self.read(at.now, to, |v| v.is_some()) {
            return KvReply::Int(0);
        }
        self.write(at, to, |m| m.insert(to.to_vec(), value));
        KvReply::Int(1)
    }

    /// `SCAN`: slots from `cursor` on until `count` keys were looked at (a
    /// slot is never cut); the next cursor first, then the keys kept.
    fn scan(&self, cursor: u64, count: u64, filter: &Filter<'_>) -> KvReply {
        let mut out = vec![None];
        let (mut bytes, mut budget) = (0usize, usize::try_from(count.max(1)).unwrap_or(usize::MAX));
        let mut slot = cursor;
        while slot < SLOTS && budget > 0 && bytes <= REPLY_VALUES_MAX / 2 {
            let stripe = (slot / BUCKETS as u64) as usize;
            let buckets = self.stripes[stripe].read();
            let mut keys = slot_keys(&buckets, stripe, slot_in_stripe_of(slot));
            keys.sort_unstable_by(|a, b| a.0.cmp(b.0));
            budget = budget.saturating_sub(keys.len());
            for (k, v) in keys {
                if filter.keeps(k, v) {
                    bytes = bytes.saturating_add(5 + k.len());
                    out.push(Some(k.clone()));
                }
            }
            slot += 1;
        }
        let next = if slot >= SLOTS { 0 } else { slot };
        out[0] = Some(next.to_string().into_bytes());
        KvReply::Values(out)
    }

    /// `RANDOMKEY`: a live key of a slot drawn with `seed` (a few draws, then
    /// the first slot with one after the last draw); `None` if there is
    /// none. Depends on the keys and the seed alone.
    fn random_key(&self, now: u64, seed: u64) -> Option<Vec<u8>> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let pick = |slot: u64, rng: &mut ChaCha8Rng| {
            let stripe = (slot / BUCKETS as u64) as usize;
            let buckets = self.stripes[stripe].read();
            let mut keys: Vec<&Vec<u8>> = slot_keys(&buckets, stripe, slot_in_stripe_of(slot))
                .into_iter()
                .filter(|(_, v)| v.live(now))
                .map(|(k, _)| k)
                .collect();
            keys.sort_unstable();
            (!keys.is_empty()).then(|| keys[rng.gen_range(0..keys.len())].clone())
        };
        let mut slot = 0;
        for _ in 0..RANDOM_TRIES {
            slot = rng.gen_range(0..SLOTS);
            if let Some(key) = pick(slot, &mut rng) {
                return Some(key);
            }
        }
        (1..=SLOTS).find_map(|i| pick((slot + i) % SLOTS, &mut rng))
    }
}

/// The slot within its stripe of `SCAN` slot `slot`.
fn slot_in_stripe_of(slot: u64) -> usize {
    (slot % BUCKETS as u64) as usize
}

/// The keys of slot `within` of stripe `stripe` (laid out as `buckets`),
/// in no order.
fn slot_keys(buckets: &Buckets, stripe: usize, within: usize) -> Vec<(&Vec<u8>, &Value)> {
    if buckets.len() == BUCKETS {
        return buckets[within].iter().collect();
    }
    let one: &Map = &buckets[0];
    one.iter()
        .filter(|(k, _)| {
            let hash = key_hash(k);
            debug_assert_eq!(stripe_of(hash), stripe);
            debug_assert_eq!(bucket_of(hash, buckets), 0);
            slot_in_stripe(hash) == within
        })
        .collect()
}

/// The name Redis 7.0 gives the encoding of `v` (its small encodings
/// decided by the limits Redis ships with).
fn encoding(v: &Obj) -> &'static [u8] {
    match v {
        Obj::Str(s) if s.len() <= 20 && parse_integer(s).is_some() => b"int",
        Obj::Str(s) if s.len() <= 44 => b"embstr",
        Obj::Str(_) => b"raw",
        Obj::Hash(f) if f.len() <= 128 && f.iter().all(|(k, v)| k.len() <= 64 && v.len() <= 64) => b"listpack",
        Obj::Hash(_) => b"hashtable",
        Obj::List(_) => b"quicklist",
        Obj::Set(m) if m.len() <= 512 && m.iter().all(|m| parse_integer(m).is_some()) => b"intset",
        Obj::Set(_) => b"hashtable",
        Obj::ZSet(z) if z.len() <= 128 && z.iter().all(|(m, _)| m.len() <= 64) => b"listpack",
        Obj::ZSet(_) => b"skiplist",
    }
}

/// Whether `s` matches the glob `pattern` as Redis matches one (`*`, `?`,
/// `[...]` with `^` and ranges, `\` escaping the next byte), byte by byte
/// and case-sensitively. Backtracks to the last `*` only, so it runs in
/// time proportional to the product of the lengths at worst.
pub(crate) fn glob(pattern: &[u8], s: &[u8]) -> bool {
    let (mut p, mut i) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while i < s.len() {
        let step = match pattern.get(p) {
            Some(b'*') => {
                star = Some((p, i));
                p += 1;
                continue;
            }
            Some(b'?') => Some(p + 1),
            Some(b'[') => class(pattern, p + 1, s[i]),
            Some(b'\\') if p + 1 < pattern.len() => (pattern[p + 1] == s[i]).then_some(p + 2),
            Some(&c) => (c == s[i]).then_some(p + 1),
            None => None,
        };
        match (step, star) {
            (Some(next), _) => {
                p = next;
                i += 1;
            }
            (None, Some((sp, si))) => {
                star = Some((sp, si + 1));
                p = sp + 1;
                i = si + 1;
            }
            (None, None) => return false,
        }
    }
    pattern[p.min(pattern.len())..].iter().all(|&c| c == b'*')
}

/// Whether `c` is in the class starting at `pattern[p]` (after its `[`):
/// where the pattern goes on if it is. A class the pattern does not close
/// ends with it, as in Redis.
fn class(pattern: &[u8], mut p: usize, c: u8) -> Option<usize> {
    let not = pattern.get(p) == Some(&b'^');
    if not {
        p += 1;
    }
    let mut matched = false;
    while p < pattern.len() && pattern[p] != b']' {
        if pattern[p] == b'\\' && p + 1 < pattern.len() {
            matched |= pattern[p + 1] == c;
            p += 2;
        } else if p + 2 < pattern.len() && pattern[p + 1] == b'-' {
            let (lo, hi) = (pattern[p].min(pattern[p + 2]), pattern[p].max(pattern[p + 2]));
            matched |= (lo..=hi).contains(&c);
            p += 3;
        } else {
            matched |= pattern[p] == c;
            p += 1;
        }
    }
    (matched != not).then_some(p + 1)
}

#[cfg(test)]
mod tests {
    use super::glob;

    #[test]
    fn globs_match_as_redis_matches_them() {
        let cases: &[(&str, &str, bool)] = &[
            ("*", "", true),
            ("*", "anything", true),
            ("h?llo", "hello", true),
            ("h?llo", "hllo", false),
            ("h*llo", "heeeello", true),
            ("h[ae]llo", "hallo", true),
            ("h[ae]llo", "hillo", false),
            ("h[^e]llo", "hallo", true),
            ("h[^e]llo", "hello", false),
            ("h[a-b]llo", "hbllo", true),
            ("h[b-a]llo", "hallo", true),
            ("h\\*llo", "h*llo", true),
            ("h\\*llo", "hello", false),
            ("a*b*c", "aXXbYYc", true),
            ("a*b*c", "aXXbYY", false),
            ("user:*", "user:1", true),
            ("user:*", "users:1", false),
            ("[abc", "a", true),
            ("\\", "\\", true),
            ("*a", "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbb", false),
        ];
        for &(p, s, want) in cases {
            assert_eq!(glob(p.as_bytes(), s.as_bytes()), want, "{p:?} on {s:?}");
        }
    }
}
