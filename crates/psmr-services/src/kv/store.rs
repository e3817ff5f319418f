//! [`KvService`]: the store, its execution of every [`KvOp`], and its
//! snapshots and digest.

mod hash;
pub(crate) mod keyspace;
mod list;
mod set;
mod strings;
mod zset;

pub(crate) use hash::float;
pub(crate) use keyspace::SLOTS;

use super::{
    key_bytes, key_hash, parse_integer, KvError, KvOp, KvReply, Score, SetWhen, Ttl, TtlCmd, KEY_MAX, REPLY_VALUES_MAX,
    VALUE_MAX,
};
use crate::Cost;
use parking_lot::RwLock;
use psmr_model::snapshot::{put_bytes, put_header, put_u64, SnapshotReader};
use psmr_model::{Command, Digest, Frozen, FrozenDigest, Key, Service, SnapshotError, StableHasher, UnorderedDigest};
use std::collections::BTreeMap;
use std::collections::HashMap;
use std::hash::Hasher;
use std::io::{Read, Write};
use std::sync::Arc;

const SNAPSHOT_MAGIC: &[u8; 4] = b"PSKV";
/// Version 5: typed values with deadlines and versions. Version 4 (no
/// versions), 3 (typed values, no deadlines) and 2 (strings only) are
/// still read; version 1 had `u64` keys.
const SNAPSHOT_VERSION: u16 = 5;

/// Lock stripes. Enough that threads on unrelated keys rarely share a lock
/// on machines with up to a few dozen cores.
const STRIPES: usize = 64;

/// Rounds of the mixing function that make a moderate command: about as
/// long as a full scan of a 1 000-entry `LinkedList<i64>`. Measured roughly
/// in a release build on the project's 2-core AMD EPYC machines: the scan
/// takes about 1.2 µs and a round about 3.6 ns. Heavy uses ten times more,
/// like a 10 000-entry list. Re-measure with
/// `cargo bench -p psmr-services --bench cost`, which times a moderate and a
/// heavy read of each service side by side.
const MODERATE_ROUNDS: u32 = 340;

/// Buckets per stripe once it holds more than [`SPLIT_AT`] keys:
/// [`STRIPES`] × this many maps in all.
const BUCKETS: usize = 256;

/// Keys a stripe holds in one bucket before it splits into [`BUCKETS`]: a
/// small store (the simulator's, a test's) then costs 64 maps to copy,
/// digest or drop rather than 16 384, and a snapshot's first write to a
/// small stripe copies at most this many keys (tens of µs).
const SPLIT_AT: usize = 1024;

/// What a key holds.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Obj {
    /// A string (Redis's strings, the paper's values).
    Str(Vec<u8>),
    /// A hash: fields and values, ordered by field so that every replica
    /// replies and snapshots alike.
    Hash(BTreeMap<Vec<u8>, Vec<u8>>),
    /// A list, its head first.
    List(std::collections::VecDeque<Vec<u8>>),
    /// A set, in byte order.
    Set(std::collections::BTreeSet<Vec<u8>>),
    /// A sorted set.
    ZSet(zset::ZSet),
}

impl Obj {
    /// Redis's name for the kind of value (`TYPE`).
    fn kind(&self) -> &'static [u8] {
        match self {
            Obj::Str(_) => b"string",
            Obj::Hash(_) => b"hash",
            Obj::List(_) => b"list",
            Obj::Set(_) => b"set",
            Obj::ZSet(_) => b"zset",
        }
    }
}

/// A key's value and its deadline. The object is shared between the
/// store and the snapshot being written. A string's bytes live in a
/// buffer of their own rather than after the reference counts
/// (`Arc<[u8]>`): size-class allocators round a 1 KiB value plus 16 bytes
/// of counts up to 1.25 KiB, a quarter more memory for the common
/// power-of-two value sizes, while the buffer alone fits its class exactly
/// and the counts and the kind take 48 bytes apart.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Value {
    obj: Arc<Obj>,
    /// When the key expires, ms since the Unix epoch on the log's clock
    /// ([`psmr_model::Stamp`]); 0: never. A key is gone once a command's
    /// time is past it, on every replica at the same point of the log.
    expires: u64,
    /// The last command that wrote the key ([`At::version`]), for `WATCH`:
    /// never 0, which stands for an absent key.
    version: u64,
}

impl Value {
    /// A value with no deadline, written by no command yet.
    fn new(obj: Obj) -> Self {
        Self { obj: Arc::new(obj), expires: 0, version: FIRST_VERSION }
    }

    /// The object, to change: copied first if a snapshot shares it.
    fn make_mut(&mut self) -> &mut Obj {
        Arc::make_mut(&mut self.obj)
    }

    /// Whether the key still exists for a command at `now` (Redis keeps a
    /// key until its time is past its deadline).
    fn live(&self, now: u64) -> bool {
        self.expires == 0 || now <= self.expires
    }
}

impl std::ops::Deref for Value {
    type Target = Obj;

    fn deref(&self) -> &Obj {
        &self.obj
    }
}
type Map = HashMap<Vec<u8>, Value, KeyHashBuilder>;
/// A stripe: its keys spread over one map or, past [`SPLIT_AT`] keys,
/// [`BUCKETS`] maps, each shared with the snapshot being written, if any.
/// The first write after [`Service::freeze`] to a bucket copies that
/// bucket alone: its keys and pointers to its values, about 1/16 384th of
/// a large store's entries, never the values. So a snapshot costs memory
/// and time in proportion to the buckets written while it is written, and
/// no command waits for more than one bucket's copy (RwLock: readers of
/// the stripe wait while it is made).
type Stripe = RwLock<Buckets>;
type Buckets = Box<[Arc<Map>]>;

/// A stripe with no keys: one empty bucket.
fn empty_stripe(hasher: &KeyHashBuilder) -> Buckets {
    Box::new([Arc::new(Map::with_hasher(hasher.clone()))])
}

/// The bucket of a key with conflict key `hash` in a stripe of `buckets`.
fn bucket_of(hash: Key, buckets: &Buckets) -> usize {
    // Conflict keys are well mixed. Their bottom bits pick the stripe and
    // the bucket; `shard_of` reads the top ones.
    ((hash / STRIPES as u64) % buckets.len() as u64) as usize
}

/// Runs `f` on the bucket of `hash` (copied first if a snapshot shares
/// it), then splits a stripe that has outgrown one bucket.
fn write_bucket<R>(buckets: &mut Buckets, hash: Key, f: impl FnOnce(&mut Map) -> R) -> R {
    let b = bucket_of(hash, buckets);
    let r = f(Arc::make_mut(&mut buckets[b]));
    if buckets.len() == 1 && buckets[0].len() > SPLIT_AT {
        split(buckets);
    }
    r
}

/// Spreads a one-bucket stripe over [`BUCKETS`]: moves the entries if no
/// snapshot shares the bucket, else copies keys and value pointers.
fn split(buckets: &mut Buckets) {
    let hasher = buckets[0].hasher().clone();
    let one = std::mem::replace(&mut buckets[0], Arc::new(Map::with_hasher(hasher.clone())));
    let mut spread: Buckets = (0..BUCKETS).map(|_| Arc::new(Map::with_hasher(hasher.clone()))).collect();
    let mut put = |k: Vec<u8>, v: Value| {
        let b = bucket_of(key_hash(&k), &spread);
        Arc::get_mut(&mut spread[b]).expect("fresh buckets are not shared").insert(k, v);
    };
    match Arc::try_unwrap(one) {
        Ok(map) => map.into_iter().for_each(|(k, v)| put(k, v)),
        Err(shared) => shared.iter().for_each(|(k, v)| put(k.clone(), v.clone())),
    }
    *buckets = spread;
}

/// Hashes the store's keys a word at a time with one multiply and one
/// rotation, seeded per process. std's default SipHash costs more than the
/// rest of a light command's lookup; the per-process seed keeps casual
/// chosen-key collisions out of reach of clients (it is not a keyed PRF),
/// and nothing observable depends on it (snapshots sort by key, digests are
/// order-independent).
#[derive(Clone)]
struct KeyHashBuilder {
    seed: u64,
}

impl Default for KeyHashBuilder {
    fn default() -> Self {
        use std::hash::BuildHasher;
        static SEED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
        Self::seeded(*SEED.get_or_init(|| std::collections::hash_map::RandomState::new().hash_one(0u64)))
    }
}

impl KeyHashBuilder {
    fn seeded(seed: u64) -> Self {
        Self { seed: seed | 1 }
    }
}

impl std::hash::BuildHasher for KeyHashBuilder {
    type Hasher = KeyHasher;
    fn build_hasher(&self) -> KeyHasher {
        KeyHasher { state: self.seed }
    }
}

/// See [`KeyHashBuilder`].
struct KeyHasher {
    state: u64,
}

impl std::hash::Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        let x = self.state.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        x ^ (x >> 29)
    }

    /// Pads the last word with zeros: `Vec<u8>` hashes its length first, so
    /// keys that differ only in trailing zeros still differ.
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
    }

    fn write_u64(&mut self, i: u64) {
        self.state = (self.state ^ i).wrapping_mul(0xBF58_476D_1CE4_E5B9).rotate_left(31);
    }

    fn write_usize(&mut self, i: usize) {
        self.write_u64(i as u64);
    }
}

/// When a command executes: its time (ms since the epoch, the log's
/// clock) and its seed ([`psmr_model::Stamp`]).
#[derive(Clone, Copy, Debug)]
struct At {
    now: u64,
    seed: u64,
}

/// The version of a key no command has written: one preloaded or restored
/// from a snapshot of before versions.
const FIRST_VERSION: u64 = 1;

impl At {
    /// The version a write at this point gives its keys: the command's
    /// seed, odd so that it is never 0 (an absent key). Every replica
    /// draws the same seed for a command, and two commands draw the same
    /// one with probability 2^-63: `EXEC` compares versions for equality,
    /// so a watched key changed in between goes unnoticed only then.
    fn version(self) -> u64 {
        self.seed | 1
    }
}

/// The key-value store service.
///
/// Keys are spread over lock stripes by their conflict key
/// ([`key_hash`]), so commands on different keys rarely wait for each
/// other, and a scheduler bug can give wrong answers but never a data race.
/// A multi-key command locks one stripe at a time: the scheduler, not the
/// locks, keeps conflicting commands apart.
pub struct KvService {
    stripes: Box<[Stripe]>,
    /// How the maps hash keys (see [`KeyHashBuilder`]).
    hasher: KeyHashBuilder,
    /// Where the next sweep looks (a `SCAN` slot): this replica's own, not
    /// part of the state ([`KvService::sweep`]).
    sweep_at: std::sync::atomic::AtomicU64,
    rounds: u32,
    #[cfg(feature = "sanitizer")]
    regions: crate::sanitizer::Regions,
}

impl KvService {
    /// A store holding keys [`key_bytes`]`(0..keys)`, key `n` with the
    /// little-endian bytes of `n` as value, whose commands cost `cost`.
    ///
    /// Every key is allocated up front (about 100 bytes each); workloads
    /// bound `keys` by [`crate::KEYS_MAX`].
    pub fn new(keys: u64, cost: Cost) -> Self {
        Self::build(keys, cost, KeyHashBuilder::default())
    }

    /// [`KvService::new`] whose maps hash keys with `hash_seed` rather than
    /// the process's seed: tests build stores that iterate in different
    /// orders to check that no reply or digest depends on the order.
    pub fn with_hash_seed(keys: u64, cost: Cost, hash_seed: u64) -> Self {
        Self::build(keys, cost, KeyHashBuilder::seeded(hash_seed))
    }

    fn build(keys: u64, cost: Cost, hasher: KeyHashBuilder) -> Self {
        let mut stripes: Box<[Stripe]> = (0..STRIPES).map(|_| RwLock::new(empty_stripe(&hasher))).collect();
        for n in 0..keys {
            let key = key_bytes(n);
            let hash = key_hash(&key);
            write_bucket(stripes[stripe_of(hash)].get_mut(), hash, |m| m.insert(key, shared(&n.to_le_bytes())));
        }
        Self {
            stripes,
            hasher,
            sweep_at: std::sync::atomic::AtomicU64::new(0),
            rounds: match cost {
                Cost::Light => 0,
                Cost::Moderate => MODERATE_ROUNDS,
                Cost::Heavy => 10 * MODERATE_ROUNDS,
            },
            #[cfg(feature = "sanitizer")]
            regions: crate::sanitizer::Regions::new("conflict key"),
        }
    }

    /// Number of keys stored.
    pub fn len(&self) -> usize {
        self.stripes.iter().map(|s| s.read().iter().map(|b| b.len()).sum::<usize>()).sum()
    }

    /// True when no key is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Registers `command` with the conflict sanitizer on the conflict keys
    /// its operation reads and writes, as `execute` does, until the
    /// returned guard is dropped; panics, naming both commands, if a
    /// conflicting command is on one of them. Lets tests hold a key busy to
    /// check that the sanitizer reports overlaps.
    #[cfg(feature = "sanitizer")]
    pub fn occupy(&self, command: &Command<KvOp>) -> crate::Occupancy<'_> {
        let (reads, writes) = super::footprint(&command.op);
        let regions = reads.into_iter().map(|k| (k, false)).chain(writes.into_iter().map(|k| (k, true)));
        self.regions.enter_each(command, regions)
    }

    /// The value at `key` for a command at `now` handed to `f` (none if it
    /// expired).
    fn read<R>(&self, now: u64, key: &[u8], f: impl FnOnce(Option<&Obj>) -> R) -> R {
        self.read_value(now, key, |v| f(v.map(|v| &*v.obj)))
    }

    /// [`KvService::read`] with the deadline.
    fn read_value<R>(&self, now: u64, key: &[u8], f: impl FnOnce(Option<&Value>) -> R) -> R {
        let hash = key_hash(key);
        let buckets = self.stripes[stripe_of(hash)].read();
        f(buckets[bucket_of(hash, &buckets)].get(key).filter(|v| v.live(now)))
    }

    /// The string at `key` handed to `f`; a key that holds another kind of
    /// value is [`KvError::WrongType`].
    fn read_str<R>(&self, now: u64, key: &[u8], f: impl FnOnce(Option<&[u8]>) -> R) -> Result<R, KvError> {
        self.read(now, key, |v| match v {
            None => Ok(f(None)),
            Some(Obj::Str(bytes)) => Ok(f(Some(bytes))),
            Some(_) => Err(KvError::WrongType),
        })
    }

    /// Runs `f` on the bucket of `key`, copied first if a snapshot shares
    /// it, for a command at `at`: a key that expired is removed first, so
    /// `f` sees it gone. Every replica removes it at the same command.
    /// The key, if `f` leaves it, takes the command's version: any write
    /// counts as a change for `WATCH`, even one that changed nothing (Redis
    /// counts only real changes: a watched transaction may abort where
    /// Redis's would not, never the other way).
    fn write<R>(&self, at: At, key: &[u8], f: impl FnOnce(&mut Map) -> R) -> R {
        let hash = key_hash(key);
        write_bucket(&mut self.stripes[stripe_of(hash)].write(), hash, |m| {
            if m.get(key).is_some_and(|v| !v.live(at.now)) {
                m.remove(key);
            }
            let r = f(m);
            if let Some(v) = m.get_mut(key) {
                v.version = at.version();
            }
            r
        })
    }

    /// The version of each of `keys` at `now`, 0 for a key that does not
    /// exist (`WATCH`).
    fn versions(&self, now: u64, keys: &[Vec<u8>]) -> Vec<u64> {
        keys.iter().map(|k| self.read_value(now, k, |v| v.map_or(0, |v| v.version))).collect()
    }

    /// The cost of `op`: [`burn`] once per key it names (once for an
    /// operation on every key), so that `MGET` of ten keys costs as much as
    /// ten `GET`s.
    fn burn_for(&self, op: &KvOp) {
        if self.rounds == 0 {
            return;
        }
        let mut named = false;
        for key in op.keys() {
            burn(key_hash(key), self.rounds);
            named = true;
        }
        if !named {
            burn(super::ALL, self.rounds);
        }
    }

    /// Executes `op` at `at`; the command's cost is paid by the caller.
    fn apply(&self, op: &KvOp, at: At) -> KvReply {
        match op {
            KvOp::Hash { .. }
            | KvOp::List { .. }
            | KvOp::LMove { .. }
            | KvOp::Members { .. }
            | KvOp::Combine { .. }
            | KvOp::SMove { .. }
            | KvOp::Sorted { .. }
            | KvOp::BPop { .. }
            | KvOp::Type { .. } => self.typed(op, at),
            KvOp::Expire { .. }
            | KvOp::Persist { .. }
            | KvOp::Ttl { .. }
            | KvOp::GetEx { .. }
            | KvOp::GetDel { .. }
            | KvOp::GetRange { .. }
            | KvOp::SetRange { .. }
            | KvOp::IncrByFloat { .. }
            | KvOp::MSetNx { .. } => self.strings(op, at),
            KvOp::Rename { .. }
            | KvOp::Copy { .. }
            | KvOp::Keys { .. }
            | KvOp::Scan { .. }
            | KvOp::RandomKey
            | KvOp::Sweep { .. }
            | KvOp::Encoding { .. } => self.keyspace(op, at),
            KvOp::Versions { keys } => KvReply::Versions(self.versions(at.now, keys)),
            KvOp::Time => KvReply::Int(i64::try_from(at.now).unwrap_or(i64::MAX)),
            KvOp::Exec { watched, versions, ops } => self.exec(at, watched, versions, ops),
            _ => self.basic(op, at),
        }
    }

    /// `Exec`: the operations, if no watched key changed since `Versions`
    /// read it. They run as one command: the scheduler keeps every command
    /// on their keys out meanwhile.
    fn exec(&self, at: At, watched: &[Vec<u8>], versions: &[u64], ops: &[KvOp]) -> KvReply {
        if self.versions(at.now, watched) != versions {
            return KvReply::Exec(None);
        }
        KvReply::Exec(Some(ops.iter().map(|op| self.apply(op, at)).collect()))
    }

    /// The paper's operations and the first string commands.
    fn basic(&self, op: &KvOp, at: At) -> KvReply {
        let now = at.now;
        match op {
            KvOp::Read { key } => or_error(self.read_str(now, key, |v| KvReply::Value(v.map(<[u8]>::to_vec)))),
            KvOp::Create { key, value } => KvReply::Done(self.write(at, key, |m| {
                let absent = !m.contains_key(key.as_slice());
                if absent {
                    m.insert(key.clone(), shared(value));
                }
                absent
            })),
            KvOp::Update { key, value } => KvReply::Done(self.write(at, key, |m| match m.get_mut(key.as_slice()) {
                Some(v) => {
                    overwrite(v, value);
                    true
                }
                None => false,
            })),
            KvOp::Delete { key } => KvReply::Done(self.write(at, key, |m| m.remove(key.as_slice()).is_some())),
            KvOp::Put { key, value } => KvReply::Done(self.write(at, key, |m| put(m, key, value))),
            KvOp::Set { key, value, when, get, ttl } => {
                self.write(at, key, |m| set(m, key, value, (*when, *get, *ttl), now))
            }
            KvOp::Incr { key, by } => self.write(at, key, |m| incr(m, key, *by)),
            KvOp::Append { key, value } => self.write(at, key, |m| append(m, key, value)),
            KvOp::Strlen { key } => {
                or_error(self.read_str(now, key, |v| KvReply::Int(count(v.map_or(0, <[u8]>::len)))))
            }
            KvOp::MGet { keys } => self.mget(now, keys),
            KvOp::MSet { pairs } => {
                for (key, value) in pairs {
                    self.write(at, key, |m| put_fresh(m, key, value));
                }
                KvReply::Done(true)
            }
            KvOp::Del { keys } => KvReply::Int(count(
                keys.iter().filter(|k| self.write(at, k, |m| m.remove(k.as_slice()).is_some())).count(),
            )),
            KvOp::Exists { keys } => {
                KvReply::Int(count(keys.iter().filter(|k| self.read(now, k, |v| v.is_some())).count()))
            }
            KvOp::DbSize => KvReply::Int(count(self.len())),
            KvOp::FlushDb => {
                for stripe in self.stripes.iter() {
                    // Replaced, not cleared, so that the memory goes too.
                    *stripe.write() = empty_stripe(&self.hasher);
                }
                KvReply::Done(true)
            }
            _ => unreachable!("{} is not a basic operation", op.name()),
        }
    }

    /// Hashes, lists, sets and `TYPE`.
    fn typed(&self, op: &KvOp, at: At) -> KvReply {
        let now = at.now;
        match op {
            // Reads go through `read`, never `write`: a write reclaims
            // an expired key, and a read must change nothing (reads run
            // side by side, stamped at different times).
            KvOp::Hash { key, cmd } if cmd.is_read() => self.read(now, key, |v| hash::read_value(v, cmd)),
            KvOp::Hash { key, cmd } => self.write(at, key, |m| hash::run(m, key, cmd)),
            KvOp::Type { key } => {
                KvReply::Value(Some(self.read(now, key, |v| v.map_or(&b"none"[..], Obj::kind).to_vec())))
            }
            KvOp::List { key, cmd } if cmd.is_read() => self.read(now, key, |v| list::read_value(v, cmd)),
            KvOp::List { key, cmd } => self.write(at, key, |m| list::run(m, key, cmd)),
            KvOp::LMove { from, to, from_left, to_left } => self.lmove(at, from, to, *from_left, *to_left),
            KvOp::BPop { keys, left } => self.bpop(at, keys, *left),
            KvOp::Members { key, cmd } if cmd.is_read() => self.read(now, key, |v| set::read(v, cmd, at.seed)),
            KvOp::Members { key, cmd } => self.write(at, key, |m| set::write(m, key, cmd, at.seed)),
            KvOp::Combine { how, keys, store } => self.combine(at, *how, keys, store.as_deref()),
            KvOp::SMove { from, to, member } => self.smove(at, from, to, member),
            KvOp::Sorted { key, cmd } if cmd.is_read() => self.read(now, key, |v| zset::read(v, cmd)),
            KvOp::Sorted { key, cmd } => self.write(at, key, |m| zset::write(m, key, cmd)),
            _ => unreachable!("{} is not on a typed value", op.name()),
        }
    }

    /// `Combine`: every set read (a key of another kind refused before
    /// anything is written), combined, then listed or stored.
    fn combine(&self, at: At, how: super::Combine, keys: &[Vec<u8>], store: Option<&[u8]>) -> KvReply {
        let mut sets = Vec::with_capacity(keys.len());
        for key in keys {
            match self.read(at.now, key, |v| match v {
                None => Ok(None),
                Some(Obj::Set(s)) => Ok(Some(s.clone())),
                Some(_) => Err(KvError::WrongType),
            }) {
                Ok(s) => sets.push(s),
                Err(e) => return KvReply::Error(e),
            }
        }
        let result = set::combine(how, sets);
        let Some(dest) = store else { return set::listed(result.iter()) };
        let n = result.len();
        self.write(at, dest, |m| {
            if result.is_empty() {
                m.remove(dest);
            } else {
                m.insert(dest.to_vec(), Value::new(Obj::Set(result)));
            }
        });
        KvReply::Int(count(n))
    }

    /// `SMove`: both keys' kinds checked before anything changes.
    fn smove(&self, at: At, from: &[u8], to: &[u8], member: &[u8]) -> KvReply {
        let is_set = |v: Option<&Obj>| matches!(v, None | Some(Obj::Set(_)));
        if !self.read(at.now, to, is_set) || !self.read(at.now, from, is_set) {
            return KvReply::Error(KvError::WrongType);
        }
        let there = self.read(at.now, from, |v| matches!(v, Some(Obj::Set(s)) if s.contains(member)));
        if !there || from == to {
            return KvReply::Int(i64::from(there));
        }
        let member = vec![member.to_vec()];
        self.write(at, from, |m| set::write(m, from, &super::SetCmd::Rem(member.clone()), 0));
        self.write(at, to, |m| set::write(m, to, &super::SetCmd::Add(member), 0));
        KvReply::Int(1)
    }

    /// `LMove`: the destination's kind is checked before the source's
    /// element is popped, so a refusal changes nothing. The keys are in
    /// stripes of their own, locked one at a time: the scheduler, not the
    /// locks, keeps conflicting commands away from both.
    fn lmove(&self, at: At, from: &[u8], to: &[u8], from_left: bool, to_left: bool) -> KvReply {
        if !self.read(at.now, to, |v| matches!(v, None | Some(Obj::List(_)))) {
            return KvReply::Error(KvError::WrongType);
        }
        let pop = super::ListCmd::Pop { left: from_left, count: None };
        let popped = self.write(at, from, |m| list::run(m, from, &pop));
        let KvReply::Value(Some(element)) = popped else { return popped };
        let push = super::ListCmd::Push { left: to_left, values: vec![element.clone()] };
        self.write(at, to, |m| list::run(m, to, &push));
        KvReply::Value(Some(element))
    }

    /// `BPop`: the first key that holds something decides: a list gives
    /// an element, another kind is [`KvError::WrongType`], as Redis checks
    /// them in order.
    fn bpop(&self, at: At, keys: &[Vec<u8>], left: bool) -> KvReply {
        for key in keys {
            let kind = self.read(at.now, key, |v| v.map(|v| matches!(v, Obj::List(_))));
            match kind {
                None => continue,
                Some(false) => return KvReply::Error(KvError::WrongType),
                Some(true) => {
                    let pop = super::ListCmd::Pop { left, count: None };
                    let popped = self.write(at, key, |m| list::run(m, key, &pop));
                    let KvReply::Value(element) = popped else { return popped };
                    return KvReply::Values(vec![Some(key.clone()), element]);
                }
            }
        }
        KvReply::Value(None)
    }

    /// `MGet`, refused as a whole when its values would exceed
    /// [`REPLY_VALUES_MAX`] bytes.
    fn mget(&self, now: u64, keys: &[Vec<u8>]) -> KvReply {
        let mut bytes = 0usize;
        let mut values = Vec::with_capacity(keys.len());
        for key in keys {
            // A key of another kind reads as nil, as in Redis.
            let value = self.read(now, key, |v| match v {
                Some(Obj::Str(bytes)) => Some(bytes.clone()),
                _ => None,
            });
            bytes = bytes.saturating_add(value.as_ref().map_or(0, Vec::len));
            if bytes > REPLY_VALUES_MAX {
                return KvReply::Error(KvError::ReplyTooLarge);
            }
            values.push(value);
        }
        KvReply::Values(values)
    }
}

/// Sets `key` to `value`, keeping its deadline (as `INCR` and `SETRANGE`
/// do); true if it existed. Allocates a key only when it is new.
fn put(m: &mut Map, key: &[u8], value: &[u8]) -> bool {
    match m.get_mut(key) {
        Some(v) => {
            overwrite(v, value);
            true
        }
        None => {
            m.insert(key.to_vec(), shared(value));
            false
        }
    }
}

/// Replaces `v` with the string `value`: in place if no snapshot shares
/// it and it is a string of the same length (no allocation), else with a
/// new value.
fn overwrite(v: &mut Value, value: &[u8]) {
    match Arc::get_mut(&mut v.obj) {
        Some(Obj::Str(bytes)) if bytes.len() == value.len() => bytes.copy_from_slice(value),
        _ => v.obj = Arc::new(Obj::Str(value.to_vec())),
    }
}

/// Sets `key` to `value` with no deadline (as `SET` and `MSET` do); true
/// if it existed.
fn put_fresh(m: &mut Map, key: &[u8], value: &[u8]) -> bool {
    let existed = put(m, key, value);
    set_deadline(m, key, 0);
    existed
}

/// Sets the deadline of `key`, if it exists (0: none).
fn set_deadline(m: &mut Map, key: &[u8], expires: u64) {
    if let Some(v) = m.get_mut(key) {
        v.expires = expires;
    }
}

/// A deadline as the store keeps it: a time in ms after the epoch, at
/// least 1 (0 means none; a deadline before the epoch has passed).
fn kept_deadline(at: i64) -> u64 {
    u64::try_from(at).unwrap_or(0).max(1)
}

/// A new value holding the string `bytes`.
fn shared(bytes: &[u8]) -> Value {
    Value::new(Obj::Str(bytes.to_vec()))
}

/// A list reply of `items`, refused with `too_large` past
/// [`REPLY_VALUES_MAX`] bytes (each item counted with its 5 bytes of
/// framing): no command builds a reply of unbounded size.
fn listed<'a>(items: impl Iterator<Item = Option<&'a [u8]>>, too_large: KvError) -> KvReply {
    let mut bytes = 0usize;
    let mut out = Vec::new();
    for item in items {
        bytes = bytes.saturating_add(5 + item.map_or(0, <[u8]>::len));
        if bytes > REPLY_VALUES_MAX {
            return KvReply::Error(too_large);
        }
        out.push(item.map(<[u8]>::to_vec));
    }
    KvReply::Values(out)
}

/// What `pick` finds in the value `v`: none if there is no value,
/// [`KvError::WrongType`] if `pick` finds nothing there.
fn kind<'a, T>(v: Option<&'a Value>, pick: impl FnOnce(&'a Obj) -> Option<&'a T>) -> Result<Option<&'a T>, KvError> {
    match v {
        None => Ok(None),
        Some(v) => pick(v).map(Some).ok_or(KvError::WrongType),
    }
}

/// The reply of `r`, or its error.
fn or_error(r: Result<KvReply, KvError>) -> KvReply {
    r.unwrap_or_else(KvReply::Error)
}

/// The string at `key` in `m`, if any; another kind is
/// [`KvError::WrongType`].
fn string<'m>(m: &'m Map, key: &[u8]) -> Result<Option<&'m Vec<u8>>, KvError> {
    match m.get(key).map(|v| &**v) {
        None => Ok(None),
        Some(Obj::Str(bytes)) => Ok(Some(bytes)),
        Some(_) => Err(KvError::WrongType),
    }
}

/// `SET` at `now`: the deadline is worked out before anything changes, so
/// that one out of range changes nothing.
fn set(m: &mut Map, key: &[u8], value: &[u8], (when, get, ttl): (SetWhen, bool, Ttl), now: u64) -> KvReply {
    let expires = match ttl {
        Ttl::Clear => Some(0),
        Ttl::Keep => None,
        Ttl::Expire(d) => match d.at(now) {
            Some(at) => Some(kept_deadline(at)),
            None => return KvReply::Error(KvError::InvalidExpire(TtlCmd::Set)),
        },
    };
    // With GET, a key of another kind is an error and nothing is set;
    // without, SET replaces whatever the key holds.
    let old = match (get, string(m, key)) {
        (true, Err(e)) => return KvReply::Error(e),
        (_, Ok(old)) => old,
        (false, Err(_)) => None,
    };
    let exists = m.contains_key(key);
    let apply = match when {
        SetWhen::Always => true,
        SetWhen::IfAbsent => !exists,
        SetWhen::IfPresent => exists,
    };
    let reply = if get { KvReply::Value(old.map(|v| v.to_vec())) } else { KvReply::Done(apply) };
    if apply {
        put(m, key, value);
        if let Some(expires) = expires {
            set_deadline(m, key, expires);
        }
    }
    reply
}

/// Adds `by` to the integer at `key` (0 when absent) and stores the sum in
/// decimal, as Redis does; the value must parse as Redis's `string2ll`
/// parses it.
fn incr(m: &mut Map, key: &[u8], by: i64) -> KvReply {
    let current = match string(m, key) {
        Err(e) => return KvReply::Error(e),
        Ok(None) => 0,
        Ok(Some(v)) => match parse_integer(v) {
            Some(n) => n,
            None => return KvReply::Error(KvError::NotInteger),
        },
    };
    let Some(sum) = current.checked_add(by) else {
        return KvReply::Error(KvError::Overflow);
    };
    put(m, key, sum.to_string().as_bytes());
    KvReply::Int(sum)
}

fn append(m: &mut Map, key: &[u8], value: &[u8]) -> KvReply {
    let current = match string(m, key) {
        Err(e) => return KvReply::Error(e),
        Ok(v) => v.map_or(0, Vec::len),
    };
    if current.saturating_add(value.len()) > VALUE_MAX {
        return KvReply::Error(KvError::TooLarge);
    }
    match m.get_mut(key).map(Value::make_mut) {
        Some(Obj::Str(bytes)) => bytes.extend_from_slice(value),
        _ => {
            m.insert(key.to_vec(), shared(value));
        }
    }
    KvReply::Int(count(current + value.len()))
}

/// A count as Redis's integer reply; no store holds `i64::MAX` of anything.
fn count(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The stripe of a key with conflict key `hash` (see [`bucket_of`]).
fn stripe_of(hash: Key) -> usize {
    (hash % STRIPES as u64) as usize
}

/// The cost of a command: `rounds` of a mixing function that the compiler
/// may not skip. Depends on the key only, so it is deterministic.
fn burn(key: Key, rounds: u32) {
    let mut x = key;
    for _ in 0..rounds {
        x = std::hint::black_box(mix(x));
    }
    std::hint::black_box(x);
}

/// SplitMix64's finalizer.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Writes the snapshot of the entries of `maps`, by increasing key. Only
/// references are sorted: the bytes go to `w` as they are written.
fn write_sorted(maps: &[Arc<Map>], w: &mut dyn Write) -> std::io::Result<()> {
    let mut entries: Vec<(&Vec<u8>, &Value)> = maps.iter().flat_map(|m| m.iter()).collect();
    entries.sort_unstable_by_key(|&(k, _)| k);
    put_header(w, SNAPSHOT_MAGIC, SNAPSHOT_VERSION)?;
    put_u64(w, entries.len() as u64)?;
    for (k, v) in entries {
        put_bytes(w, k)?;
        match &**v {
            Obj::Str(bytes) => {
                w.write_all(&[KIND_STR])?;
                put_bytes(w, bytes)?;
            }
            Obj::Hash(fields) => {
                w.write_all(&[KIND_HASH])?;
                put_u64(w, fields.len() as u64)?;
                for (f, v) in fields {
                    put_bytes(w, f)?;
                    put_bytes(w, v)?;
                }
            }
            Obj::List(items) => {
                w.write_all(&[KIND_LIST])?;
                put_u64(w, items.len() as u64)?;
                for item in items {
                    put_bytes(w, item)?;
                }
            }
            Obj::Set(members) => {
                w.write_all(&[KIND_SET])?;
                put_u64(w, members.len() as u64)?;
                for m in members {
                    put_bytes(w, m)?;
                }
            }
            Obj::ZSet(z) => {
                w.write_all(&[KIND_ZSET])?;
                put_u64(w, z.len() as u64)?;
                for (m, s) in z.iter() {
                    put_bytes(w, m)?;
                    put_u64(w, s.get().to_bits())?;
                }
            }
        }
        put_u64(w, v.expires)?;
        put_u64(w, v.version)?;
    }
    Ok(())
}

/// The kind byte of a version 3 or 4 snapshot's entry.
const KIND_STR: u8 = 0;
const KIND_HASH: u8 = 1;
const KIND_LIST: u8 = 2;
const KIND_SET: u8 = 3;
const KIND_ZSET: u8 = 4;

/// Opens a key-value snapshot; a version 1 snapshot, from builds with
/// `u64` keys, gets an error that says why rather than the generic
/// version mismatch.
fn open(src: &mut dyn Read) -> Result<(SnapshotReader<'_>, u16), SnapshotError> {
    let mut r = SnapshotReader::new(src);
    if &r.array::<4>()? != SNAPSHOT_MAGIC {
        return Err(SnapshotError::Malformed("not a key-value snapshot (bad magic)".into()));
    }
    match r.u16()? {
        v @ (2..=SNAPSHOT_VERSION) => Ok((r, v)),
        1 => Err(SnapshotError::Malformed(
            "key-value snapshot version 1 has numeric (u64) keys, which this build no longer reads: its store has \
             byte-string keys (snapshot version 2); restore from a replica running this build"
                .into(),
        )),
        v => Err(SnapshotError::Malformed(format!(
            "key-value snapshot version {v} is not supported (2 to {SNAPSHOT_VERSION} are)"
        ))),
    }
}

/// Reads the entries after the header of a snapshot of `version`, each
/// handed to `insert`; keys (and a hash's fields) must be strictly
/// increasing, and the source must end with the last.
fn read_entries(
    (mut r, version): (SnapshotReader<'_>, u16),
    mut insert: impl FnMut(Vec<u8>, Value),
) -> Result<(), SnapshotError> {
    let count = r.u64()?;
    let mut last: Option<Vec<u8>> = None;
    for _ in 0..count {
        let key = r.bytes(KEY_MAX, "a key")?;
        if last.as_ref().is_some_and(|l| *l >= key) {
            return Err(out_of_order("key", &key));
        }
        let kind = if version == 2 { KIND_STR } else { r.array::<1>()?[0] };
        let value = match kind {
            KIND_STR => Obj::Str(r.bytes(VALUE_MAX, "a value")?),
            KIND_HASH => Obj::Hash(read_hash(&mut r)?),
            KIND_LIST => Obj::List(read_elements(&mut r, "list element", false)?.into()),
            KIND_SET => Obj::Set(read_elements(&mut r, "set member", true)?.into_iter().collect()),
            KIND_ZSET if version >= 4 => Obj::ZSet(read_zset(&mut r)?),
            k => return Err(SnapshotError::Malformed(format!("unknown kind of value {k}"))),
        };
        let expires = if version >= 4 { r.u64()? } else { 0 };
        let written = if version >= 5 { r.u64()? } else { FIRST_VERSION };
        if written == 0 {
            return Err(SnapshotError::Malformed(format!("key {:?} of version 0", String::from_utf8_lossy(&key))));
        }
        last = Some(key.clone());
        insert(key, Value { obj: Arc::new(value), expires, version: written });
    }
    r.finish()
}

/// A hash's fields and values, fields strictly increasing (an empty hash
/// is never kept).
fn read_hash(r: &mut SnapshotReader<'_>) -> Result<BTreeMap<Vec<u8>, Vec<u8>>, SnapshotError> {
    let n = r.u64()?;
    if n == 0 {
        return Err(SnapshotError::Malformed("an empty hash".into()));
    }
    let mut fields = BTreeMap::new();
    for _ in 0..n {
        let field = r.bytes(KEY_MAX, "a field")?;
        if fields.last_key_value().is_some_and(|(l, _): (&Vec<u8>, _)| *l >= field) {
            return Err(out_of_order("field", &field));
        }
        let value = r.bytes(VALUE_MAX, "a value")?;
        fields.insert(field, value);
    }
    Ok(fields)
}

/// The elements of a list or a set (`what`): a count, never 0 (an empty
/// one is never kept), then each; with `ordered`, strictly increasing.
fn read_elements(r: &mut SnapshotReader<'_>, what: &str, ordered: bool) -> Result<Vec<Vec<u8>>, SnapshotError> {
    let n = r.u64()?;
    if n == 0 {
        return Err(SnapshotError::Malformed(format!("an empty {what}")));
    }
    let mut out: Vec<Vec<u8>> = Vec::new();
    for _ in 0..n {
        let e = r.bytes(VALUE_MAX, what)?;
        if ordered && out.last().is_some_and(|l| *l >= e) {
            return Err(out_of_order(what, &e));
        }
        out.push(e);
    }
    Ok(out)
}

/// A sorted set's members and scores, in the set's order, never empty,
/// no score NaN, no member twice.
fn read_zset(r: &mut SnapshotReader<'_>) -> Result<zset::ZSet, SnapshotError> {
    let n = r.u64()?;
    if n == 0 {
        return Err(SnapshotError::Malformed("an empty sorted set".into()));
    }
    let mut z = zset::ZSet::default();
    for _ in 0..n {
        let m = r.bytes(VALUE_MAX, "a sorted set member")?;
        let s = Score::new(f64::from_bits(r.u64()?))
            .ok_or_else(|| SnapshotError::Malformed("a sorted set score that is not a number".into()))?;
        if z.insert(m.clone(), s).is_some() {
            return Err(out_of_order("sorted set member", &m));
        }
    }
    Ok(z)
}

fn out_of_order(what: &str, bytes: &[u8]) -> SnapshotError {
    let shown = String::from_utf8_lossy(&bytes[..bytes.len().min(64)]).into_owned();
    SnapshotError::Malformed(format!("{what} {shown:?} out of order or repeated"))
}

impl Service for KvService {
    type Op = KvOp;
    type Reply = KvReply;

    fn execute(&self, command: &Command<KvOp>) -> KvReply {
        // Registered before the data locks, which would hide the overlap.
        #[cfg(feature = "sanitizer")]
        let _occupancy = self.occupy(command);
        // Outside the stripe locks: two commands on different keys of one
        // stripe do not conflict, and must not wait for each other's cost.
        self.burn_for(&command.op);
        let stamp = command.stamp;
        self.apply(&command.op, At { now: stamp.time_ms, seed: stamp.seed_for(command.client, command.seq) })
    }

    /// `"PSKV"`, version 5 (u16), entry count (u64), then the entries by
    /// increasing key bytes: key length (u32) and key, a kind byte (string,
    /// hash, list, set), the value (a string's length (u32) and bytes; a
    /// container's count (u64) and each element, a hash's fields before
    /// their values), then the deadline (u64 ms, 0 for none) and the
    /// version (u64, never 0: the last write's, for `WATCH`); all
    /// little-endian. The store has no shards of its own
    /// (class-model shards are a view of the key space, stripes an internal
    /// detail), so the encoding has none and equal states give equal bytes.
    fn snapshot(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.freeze()(&mut out).expect("a vector takes every write");
        out
    }

    /// The copy is every bucket's map shared, not copied: execution pauses
    /// for at most 16 384 reference counts, and a bucket is copied (its keys and
    /// pointers to its values) when a command first writes to it while the
    /// snapshot is being written.
    fn freeze(&self) -> Frozen {
        let maps: Vec<Arc<Map>> = self.stripes.iter().flat_map(|s| s.read().to_vec()).collect();
        Box::new(move |w| write_sorted(&maps, w))
    }

    /// Decodes the whole snapshot (keys must be strictly increasing) before
    /// replacing anything, so a bad snapshot leaves the state unchanged.
    fn restore(&self, mut snapshot: &[u8]) -> Result<(), SnapshotError> {
        let mut stripes: Vec<Buckets> = (0..STRIPES).map(|_| empty_stripe(&self.hasher)).collect();
        read_entries(open(&mut snapshot)?, |k, v| {
            let hash = key_hash(&k);
            write_bucket(&mut stripes[stripe_of(hash)], hash, |m| m.insert(k, v));
        })?;
        for (stripe, fresh) in self.stripes.iter().zip(stripes) {
            *stripe.write() = fresh;
        }
        Ok(())
    }

    /// Decodes as it reads, into the emptied store: the old state goes
    /// before the new one comes, so memory never holds both. A snapshot of
    /// another service or version is refused before anything is dropped.
    fn restore_from(&self, source: &mut dyn Read) -> Result<(), SnapshotError> {
        let r = open(source)?;
        for stripe in self.stripes.iter() {
            *stripe.write() = empty_stripe(&self.hasher);
        }
        read_entries(r, |k, v| {
            let hash = key_hash(&k);
            write_bucket(&mut self.stripes[stripe_of(hash)].write(), hash, |m| m.insert(k, v));
        })
    }

    /// The header only: the magic and the version.
    fn check_snapshot(&self, source: &mut dyn Read) -> Result<(), SnapshotError> {
        open(source).map(|_| ())
    }

    /// Entries hashed one by one (key length, key, value length, value) and
    /// combined without order, so the digest does not depend on how keys
    /// are striped.
    fn digest(&self) -> Digest {
        self.freeze_digest()()
    }

    /// The buckets' maps shared, as [`Service::freeze`] shares them: a
    /// write copies a bucket while the digest reads the old one.
    fn freeze_digest(&self) -> FrozenDigest {
        let maps: Vec<Arc<Map>> = self.stripes.iter().flat_map(|s| s.read().to_vec()).collect();
        Box::new(move || {
            let mut digest = UnorderedDigest::new();
            for (k, v) in maps.iter().flat_map(|m| m.iter()) {
                let mut h = StableHasher::new();
                let mut put = |bytes: &[u8]| {
                    h.write_u64(bytes.len() as u64);
                    h.write(bytes);
                };
                put(k);
                match &**v {
                    // As before hashes existed: a store of strings keeps
                    // its digest.
                    Obj::Str(bytes) => put(bytes),
                    Obj::Hash(fields) => {
                        put(b"\xffhash");
                        fields.iter().for_each(|(f, v)| {
                            put(f);
                            put(v);
                        });
                    }
                    Obj::List(items) => {
                        put(b"\xfflist");
                        items.iter().for_each(|e| put(e));
                    }
                    Obj::Set(members) => {
                        put(b"\xffset");
                        members.iter().for_each(|m| put(m));
                    }
                    Obj::ZSet(z) => {
                        put(b"\xffzset");
                        z.iter().for_each(|(m, s)| {
                            put(m);
                            put(&s.get().to_bits().to_le_bytes());
                        });
                    }
                }
                if v.expires != 0 {
                    // Only then: a store without deadlines keeps its digest.
                    put(b"\xffexpires");
                    put(&v.expires.to_le_bytes());
                }
                if v.version != FIRST_VERSION {
                    // Replicas that agree on the values but not on the
                    // versions would answer `EXEC` differently.
                    put(b"\xffversion");
                    put(&v.version.to_le_bytes());
                }
                digest.add_hash(h.finish());
            }
            digest.finish()
        })
    }
}

#[cfg(test)]
mod tests;
