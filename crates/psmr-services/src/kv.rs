//! The key-value store of 004 §VI: create, read, update and delete on
//! `u64` keys with byte-string values.
//!
//! A command on key `k` reads `[k]` (read) or writes `[k]` (everything
//! else), so commands conflict exactly when they share a key and one of them
//! writes. Two class models approximate that ([`KvModel`]): readers-writers,
//! and one read and one write class per shard of the key space, a key's
//! shard being [`shard_of`].

use crate::workload::{Draws, Kind};
use crate::{
    clamp_shards, local_classes, local_mappings, readers_writers_mappings, shard_groups, Cost, Reader, WorkloadConfig,
    WorkloadError,
};
use parking_lot::RwLock;
use psmr_model::wire::{Decoder, Encoder, OpCodec, WireError};
use psmr_model::{
    ClassId, ClassModel, ClientId, Command, Digest, Key, KeySet, Mapping, Service, SnapshotError, StableHasher,
    UnorderedDigest,
};
use rand::Rng;
use std::collections::HashMap;
use std::fmt;
use std::hash::Hasher;
use std::str::FromStr;

const SNAPSHOT_MAGIC: &[u8; 4] = b"PSKV";
const SNAPSHOT_VERSION: u16 = 1;

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

/// Key space sizes up to which a skewed generator lists the keys of each
/// shard (at most 8 MiB) instead of rejection sampling.
const ENUMERATE_KEYS_MAX: u64 = 1 << 20;

/// Rejection-sampling attempts per key before a skewed generator gives up.
/// A shard of a key space above [`ENUMERATE_KEYS_MAX`] with at most
/// `SHARDS_MAX` shards is hit with probability about `1/1024` per attempt,
/// so giving up means that shard has (almost) no key.
const REJECTION_TRIES: u32 = 1 << 16;

/// An operation on the store.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum KvOp {
    /// Insert `key` unless it exists.
    Create {
        /// The key.
        key: Key,
        /// Its value.
        value: Vec<u8>,
    },
    /// Get the value of `key`.
    Read {
        /// The key.
        key: Key,
    },
    /// Replace the value of `key` if it exists.
    Update {
        /// The key.
        key: Key,
        /// The new value.
        value: Vec<u8>,
    },
    /// Remove `key` if it exists.
    Delete {
        /// The key.
        key: Key,
    },
    /// Set the value of `key`, creating it if needed.
    Put {
        /// The key.
        key: Key,
        /// Its new value.
        value: Vec<u8>,
    },
}

impl KvOp {
    /// The key the operation is on.
    pub fn key(&self) -> Key {
        match *self {
            KvOp::Create { key, .. }
            | KvOp::Read { key }
            | KvOp::Update { key, .. }
            | KvOp::Delete { key }
            | KvOp::Put { key, .. } => key,
        }
    }

    /// True for `Read`, the only operation that does not write.
    pub fn is_read(&self) -> bool {
        matches!(self, KvOp::Read { .. })
    }
}

/// The reply to a [`KvOp`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum KvReply {
    /// `Read`: the value, if the key exists.
    Value(Option<Vec<u8>>),
    /// `Create`: false if the key existed. `Update`, `Delete`, `Put`: false
    /// if it did not.
    Done(bool),
}

type Map = HashMap<Key, Vec<u8>, KeyHashBuilder>;
type Stripe = RwLock<Map>;

/// Hashes the store's `u64` keys with one multiply and one shift, seeded
/// per process. std's default SipHash costs more than the rest of a light
/// command's lookup; a per-process seed keeps chosen-key collisions out of
/// reach of clients, and nothing observable depends on it (snapshots sort
/// by key, digests are order-independent).
#[derive(Clone)]
struct KeyHashBuilder {
    seed: u64,
}

impl Default for KeyHashBuilder {
    fn default() -> Self {
        use std::hash::BuildHasher;
        static SEED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
        Self { seed: *SEED.get_or_init(|| std::collections::hash_map::RandomState::new().hash_one(0u64) | 1) }
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
}

/// The key-value store service.
///
/// Keys are spread over lock stripes by hash, so commands on different keys
/// rarely wait for each other and a scheduler bug can give wrong answers
/// but never a data race.
pub struct KvService {
    stripes: Box<[Stripe]>,
    rounds: u32,
    #[cfg(feature = "sanitizer")]
    regions: crate::sanitizer::Regions,
}

impl KvService {
    /// A store holding keys `0..keys`, each with its little-endian bytes as
    /// value, whose commands cost `cost`.
    ///
    /// Every key is allocated up front (about 64 bytes each); workloads
    /// bound `keys` by [`crate::KEYS_MAX`].
    pub fn new(keys: u64, cost: Cost) -> Self {
        let mut stripes: Box<[Stripe]> = (0..STRIPES).map(|_| RwLock::default()).collect();
        for key in 0..keys {
            stripes[stripe_index(key)].get_mut().insert(key, key.to_le_bytes().to_vec());
        }
        Self {
            stripes,
            rounds: match cost {
                Cost::Light => 0,
                Cost::Moderate => MODERATE_ROUNDS,
                Cost::Heavy => 10 * MODERATE_ROUNDS,
            },
            #[cfg(feature = "sanitizer")]
            regions: crate::sanitizer::Regions::new("key"),
        }
    }

    /// Number of keys stored.
    pub fn len(&self) -> usize {
        self.stripes.iter().map(|s| s.read().len()).sum()
    }

    /// True when no key is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn stripe(&self, key: Key) -> &Stripe {
        &self.stripes[stripe_index(key)]
    }

    /// Registers `command` with the conflict sanitizer on its key, as
    /// `execute` does, until the returned guard is dropped; panics, naming
    /// both commands, if a conflicting command is on that key. Lets tests
    /// hold a key busy to check that the sanitizer reports overlaps.
    #[cfg(feature = "sanitizer")]
    pub fn occupy(&self, command: &Command<KvOp>) -> crate::Occupancy<'_> {
        self.regions.enter(command, !command.op.is_read(), [command.op.key()])
    }
}

fn stripe_index(key: Key) -> usize {
    // Fibonacci hashing: the top bits of the product are well mixed even
    // for consecutive keys.
    (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58) as usize % STRIPES
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

impl Service for KvService {
    type Op = KvOp;
    type Reply = KvReply;

    fn execute(&self, command: &Command<KvOp>) -> KvReply {
        // Registered before the data lock, which would hide the overlap.
        #[cfg(feature = "sanitizer")]
        let _occupancy = self.occupy(command);
        let key = command.op.key();
        // Outside the stripe lock: two commands on different keys of one
        // stripe do not conflict, and must not wait for each other's cost.
        burn(key, self.rounds);
        let stripe = self.stripe(key);
        match &command.op {
            KvOp::Read { .. } => KvReply::Value(stripe.read().get(&key).cloned()),
            KvOp::Create { value, .. } => {
                let mut map = stripe.write();
                let created = !map.contains_key(&key);
                if created {
                    map.insert(key, value.clone());
                }
                KvReply::Done(created)
            }
            KvOp::Update { value, .. } => KvReply::Done(match stripe.write().get_mut(&key) {
                Some(v) => {
                    v.clone_from(value);
                    true
                }
                None => false,
            }),
            KvOp::Delete { .. } => KvReply::Done(stripe.write().remove(&key).is_some()),
            KvOp::Put { value, .. } => KvReply::Done(stripe.write().insert(key, value.clone()).is_some()),
        }
    }

    /// `"PSKV"`, version (u16), entry count (u64), then the entries by
    /// increasing key: key (u64), value length (u32), value bytes; all
    /// little-endian. The store has no shards of its own (class-model
    /// shards are a view of the key space, stripes an internal detail), so
    /// the encoding has none and equal states give equal bytes.
    fn snapshot(&self) -> Vec<u8> {
        let mut entries: Vec<(Key, Vec<u8>)> = Vec::new();
        for stripe in self.stripes.iter() {
            entries.extend(stripe.read().iter().map(|(k, v)| (*k, v.clone())));
        }
        entries.sort_unstable_by_key(|(k, _)| *k);
        let mut out = Vec::with_capacity(14 + entries.iter().map(|(_, v)| 12 + v.len()).sum::<usize>());
        out.extend_from_slice(SNAPSHOT_MAGIC);
        out.extend_from_slice(&SNAPSHOT_VERSION.to_le_bytes());
        out.extend_from_slice(&(entries.len() as u64).to_le_bytes());
        for (k, v) in &entries {
            out.extend_from_slice(&k.to_le_bytes());
            out.extend_from_slice(&(v.len() as u32).to_le_bytes());
            out.extend_from_slice(v);
        }
        out
    }

    /// Decodes the whole snapshot (keys must be strictly increasing) before
    /// replacing anything, so a bad snapshot leaves the state unchanged.
    fn restore(&self, snapshot: &[u8]) -> Result<(), SnapshotError> {
        let mut r = Reader::open(snapshot, SNAPSHOT_MAGIC, SNAPSHOT_VERSION, "key-value")?;
        let count = r.count(12)?;
        let mut maps: Vec<Map> = vec![Map::default(); STRIPES];
        let mut last = None;
        for _ in 0..count {
            let key = r.u64()?;
            if last.is_some_and(|l| l >= key) {
                return Err(SnapshotError::Malformed(format!("key {key} out of order or repeated")));
            }
            last = Some(key);
            let len = r.u32()? as usize;
            let value = r.take(len)?.to_vec();
            maps[stripe_index(key)].insert(key, value);
        }
        r.finish()?;
        for (stripe, map) in self.stripes.iter().zip(maps) {
            *stripe.write() = map;
        }
        Ok(())
    }

    /// Entries hashed one by one (key, length, bytes) and combined without
    /// order, so the digest does not depend on how keys are striped.
    fn digest(&self) -> Digest {
        let mut digest = UnorderedDigest::new();
        for stripe in self.stripes.iter() {
            for (k, v) in stripe.read().iter() {
                let mut h = StableHasher::new();
                h.write_u64(*k);
                h.write_u64(v.len() as u64);
                h.write(v);
                digest.add_hash(h.finish());
            }
        }
        digest.finish()
    }
}

/// The class models of the key-value store.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KvModel {
    /// `R`, `W` with `R-W` and `W-W`: any write excludes everything.
    ReadersWriters,
    /// `R1..RS`, `W1..WS` with `Ri-Wi` and `Wi-Wi`: a command's class is
    /// that of its key's shard ([`shard_of`]).
    Sharded,
}

impl KvModel {
    /// Every model.
    pub const ALL: [KvModel; 2] = [KvModel::ReadersWriters, KvModel::Sharded];

    /// The name accepted by `FromStr` and printed by `Display`.
    pub fn name(self) -> &'static str {
        match self {
            KvModel::ReadersWriters => "readers-writers",
            KvModel::Sharded => "sharded",
        }
    }
}

impl fmt::Display for KvModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for KvModel {
    type Err = WorkloadError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        KvModel::ALL.into_iter().find(|m| m.name() == s).ok_or_else(|| WorkloadError::UnknownName {
            what: "kv model",
            name: s.to_string(),
            valid: "readers-writers, sharded",
        })
    }
}

/// The shard of `key` among `shards`: its stable hash modulo `shards`
/// (0 when `shards` is 0 or 1). Hashing, not `key % shards`, so that
/// ranges of keys spread over all shards.
pub fn shard_of(key: Key, shards: usize) -> usize {
    if shards <= 1 {
        return 0;
    }
    let mut h = StableHasher::new();
    h.write_u64(key);
    (h.finish() % shards as u64) as usize
}

/// The class model `model` for `shards` shards (clamped to
/// `1..=SHARDS_MAX`; ignored by readers-writers). Class ids follow
/// declaration order: `R`, `W`; or `R1..RS`, `W1..WS`.
pub fn class_model(model: KvModel, shards: usize) -> ClassModel {
    let builder = ClassModel::builder(model.name());
    let builder = match model {
        KvModel::ReadersWriters => builder.class("R").class("W").conflict("R", "W").conflict("W", "W"),
        KvModel::Sharded => local_classes(builder, clamp_shards(shards)),
    };
    builder.build().expect("class names are distinct and every conflict names a declared class")
}

/// A class-to-threads mapping for `model` with `shards` shards (clamped to
/// `1..=SHARDS_MAX`) and `workers` threads that obeys rules R.1-R.5.
///
/// Readers-writers: `R` concurrent and `W` sequential, both on every
/// thread. Sharded: threads are split into one group per shard as for the
/// list ([`crate::list::default_mapping`]); `Ri` is concurrent and `Wi`
/// sequential on group `i`. With `workers == 0` the mapping is returned but
/// does not validate.
pub fn default_mapping(model: KvModel, shards: usize, workers: usize) -> Mapping {
    let classes = match model {
        KvModel::ReadersWriters => readers_writers_mappings(workers),
        KvModel::Sharded => local_mappings(&shard_groups(clamp_shards(shards), workers)),
    };
    Mapping::new(workers, classes)
}

/// Draws keys, honouring the skew: with `shards > 1` and a skew above 0 (for
/// reads `cfg.skew`, for writes `cfg.write_skew` when set) a key of the
/// first shard with that probability, otherwise a key of another.
enum KeyPicker {
    Uniform(u64),
    /// The keys of the first shard and of the others, listed.
    Listed {
        keys: u64,
        first: Vec<Key>,
        rest: Vec<Key>,
    },
    /// Uniform draws kept when they fall on the wanted side: expected
    /// `shards` attempts for the first shard, under two for the others.
    Rejection {
        keys: u64,
        shards: usize,
    },
}

impl KeyPicker {
    fn new(cfg: &WorkloadConfig) -> Result<Self, WorkloadError> {
        let (keys, shards) = (cfg.keys, cfg.shards);
        let skews: Vec<f64> = [Some(cfg.skew), cfg.write_skew].into_iter().flatten().filter(|&s| s > 0.0).collect();
        if shards <= 1 || skews.is_empty() {
            return Ok(KeyPicker::Uniform(keys));
        }
        if keys > ENUMERATE_KEYS_MAX {
            return Ok(KeyPicker::Rejection { keys, shards });
        }
        let (first, rest): (Vec<Key>, Vec<Key>) = (0..keys).partition(|&k| shard_of(k, shards) == 0);
        let unreachable = |skew, target| WorkloadError::SkewUnreachable { skew, target, keys, shards };
        if first.is_empty() {
            return Err(unreachable(skews[0], "the first shard"));
        }
        if let Some(&skew) = skews.iter().find(|&&s| s < 1.0) {
            if rest.is_empty() {
                return Err(unreachable(skew, "the other shards"));
            }
        }
        Ok(KeyPicker::Listed { keys, first, rest })
    }

    fn draw(&self, draws: &mut Draws, write: bool) -> Result<Key, WorkloadError> {
        let skewed = draws.skew(write) > 0.0;
        match self {
            KeyPicker::Uniform(keys) => Ok(draws.rng.gen_range(0..*keys)),
            KeyPicker::Listed { keys, .. } | KeyPicker::Rejection { keys, .. } if !skewed => {
                Ok(draws.rng.gen_range(0..*keys))
            }
            KeyPicker::Listed { first, rest, .. } => {
                let side = if draws.picks_first_shard(write) { first } else { rest };
                Ok(side[draws.rng.gen_range(0..side.len())])
            }
            KeyPicker::Rejection { keys, shards } => {
                let want_first = draws.picks_first_shard(write);
                for _ in 0..REJECTION_TRIES {
                    let k = draws.rng.gen_range(0..*keys);
                    if (shard_of(k, *shards) == 0) == want_first {
                        return Ok(k);
                    }
                }
                Err(WorkloadError::SkewUnreachable {
                    skew: draws.skew(write),
                    target: if want_first { "the first shard" } else { "the other shards" },
                    keys: *keys,
                    shards: *shards,
                })
            }
        }
    }
}

/// Generates `cfg.commands` key-value commands for `model`, reproducibly
/// from `cfg.seed`.
///
/// Writes (α%) are placed among reads following `cfg.spread` (see
/// [`crate::Spread`]) and are creates, updates and deletes with equal
/// probability, with 8-byte values drawn from the generator. Keys are
/// uniform over `0..cfg.keys`; with skew, a key of the first shard
/// ([`shard_of`] with `cfg.shards`) with probability `cfg.skew` (for writes
/// `cfg.write_skew` when set) and a key of another shard otherwise.
///
/// Errors: an invalid `cfg`, global operations (`β > 0`, which the store
/// does not have), or a skew towards shards that own no key of a small key
/// space.
pub fn generate(model: KvModel, cfg: &WorkloadConfig) -> Result<Vec<Command<KvOp>>, WorkloadError> {
    cfg.validate()?;
    if cfg.mix.global_pct > 0.0 {
        return Err(WorkloadError::NoGlobalOps(cfg.mix.global_pct));
    }
    let picker = KeyPicker::new(cfg)?;
    let shards = cfg.shards;
    let mut draws = Draws::new(cfg);
    let mut out = Vec::with_capacity(cfg.commands);
    for j in 0..cfg.commands {
        let read = draws.kind() == Kind::LocalRead;
        let key = picker.draw(&mut draws, !read)?;
        let op = if read {
            KvOp::Read { key }
        } else {
            match draws.rng.gen_range(0..3) {
                0 => KvOp::Create { key, value: draws.rng.gen::<u64>().to_le_bytes().to_vec() },
                1 => KvOp::Update { key, value: draws.rng.gen::<u64>().to_le_bytes().to_vec() },
                _ => KvOp::Delete { key },
            }
        };
        let (client, seq) = cfg.ids(j);
        out.push(command(model, shards, client, seq, op));
    }
    Ok(out)
}

/// The command for `op` under `model` with `shards` shards: its class and
/// the key it reads or writes.
pub fn command(model: KvModel, shards: usize, client: ClientId, seq: u64, op: KvOp) -> Command<KvOp> {
    let key = op.key();
    let read = op.is_read();
    let shards = clamp_shards(shards);
    let class = match model {
        KvModel::ReadersWriters => usize::from(!read),
        KvModel::Sharded => shard_of(key, shards) + if read { 0 } else { shards },
    };
    let one: KeySet = std::iter::once(key).collect();
    let (reads, writes) = if read { (one, KeySet::new()) } else { (KeySet::new(), one) };
    // Shards are at most SHARDS_MAX, so every id fits.
    Command { client, seq, class: ClassId(class as u16), reads, writes, op }
}

/// Puts [`KvOp`]s and [`KvReply`]s on the wire: a tag byte, the key, then
/// the value for operations that carry one; a reply is `Value` (tag 0,
/// then 0 for none or 1 and the bytes) or `Done` (tag 1, then 0 or 1).
#[derive(Clone, Copy, Debug, Default)]
pub struct KvCodec;

/// Largest value a kv operation may carry over the wire, in bytes.
pub const VALUE_MAX: usize = 1 << 20;

impl OpCodec for KvCodec {
    type Op = KvOp;
    type Reply = KvReply;

    fn encode_op(&self, op: &KvOp) -> Vec<u8> {
        let mut e = Encoder::new();
        match op {
            KvOp::Create { key, value } => e.u8(0).u64(*key).bytes(value),
            KvOp::Read { key } => e.u8(1).u64(*key),
            KvOp::Update { key, value } => e.u8(2).u64(*key).bytes(value),
            KvOp::Delete { key } => e.u8(3).u64(*key),
            KvOp::Put { key, value } => e.u8(4).u64(*key).bytes(value),
        };
        e.finish()
    }

    fn decode_op(&self, bytes: &[u8]) -> Result<KvOp, WireError> {
        let mut d = Decoder::new(bytes, "kv operation");
        let tag = d.u8()?;
        let key = d.u64()?;
        let value = |d: &mut Decoder<'_>| -> Result<Vec<u8>, WireError> {
            let v = d.bytes()?;
            if v.len() > VALUE_MAX {
                return Err(d.error(format!("value of {} bytes exceeds {VALUE_MAX}", v.len())));
            }
            Ok(v.to_vec())
        };
        let op = match tag {
            0 => KvOp::Create { key, value: value(&mut d)? },
            1 => KvOp::Read { key },
            2 => KvOp::Update { key, value: value(&mut d)? },
            3 => KvOp::Delete { key },
            4 => KvOp::Put { key, value: value(&mut d)? },
            t => return Err(d.error(format!("unknown operation tag {t}"))),
        };
        d.end()?;
        Ok(op)
    }

    fn encode_reply(&self, reply: &KvReply) -> Vec<u8> {
        let value_len = match reply {
            KvReply::Value(Some(v)) => v.len(),
            _ => 0,
        };
        let mut e = Encoder::with_capacity(6 + value_len);
        match reply {
            KvReply::Value(None) => e.u8(0).u8(0),
            KvReply::Value(Some(v)) => e.u8(0).u8(1).bytes(v),
            KvReply::Done(b) => e.u8(1).u8(u8::from(*b)),
        };
        e.finish()
    }

    fn decode_reply(&self, bytes: &[u8]) -> Result<KvReply, WireError> {
        let mut d = Decoder::new(bytes, "kv reply");
        let reply = match (d.u8()?, d.u8()?) {
            (0, 0) => KvReply::Value(None),
            (0, 1) => KvReply::Value(Some(d.bytes()?.to_vec())),
            (1, b @ (0 | 1)) => KvReply::Done(b == 1),
            (t, v) => return Err(d.error(format!("unknown reply tag {t}/{v}"))),
        };
        d.end()?;
        Ok(reply)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Spread, KEYS_MAX, SHARDS_MAX};
    use proptest::prelude::*;
    use psmr_model::ClientId;

    fn cmd(op: KvOp) -> Command<KvOp> {
        Command { client: ClientId(1), seq: 1, class: ClassId(0), reads: KeySet::new(), writes: KeySet::new(), op }
    }

    fn run(s: &KvService, op: KvOp) -> KvReply {
        s.execute(&cmd(op))
    }

    fn bytes(x: u64) -> Vec<u8> {
        x.to_le_bytes().to_vec()
    }

    #[test]
    fn crud_semantics() {
        for cost in Cost::ALL {
            let s = KvService::new(4, cost);
            assert_eq!(s.len(), 4);
            assert_eq!(run(&s, KvOp::Read { key: 3 }), KvReply::Value(Some(bytes(3))));
            assert_eq!(run(&s, KvOp::Read { key: 4 }), KvReply::Value(None));
            assert_eq!(run(&s, KvOp::Create { key: 3, value: vec![9] }), KvReply::Done(false));
            assert_eq!(run(&s, KvOp::Read { key: 3 }), KvReply::Value(Some(bytes(3))));
            assert_eq!(run(&s, KvOp::Create { key: 4, value: vec![9] }), KvReply::Done(true));
            assert_eq!(run(&s, KvOp::Update { key: 4, value: vec![8] }), KvReply::Done(true));
            assert_eq!(run(&s, KvOp::Read { key: 4 }), KvReply::Value(Some(vec![8])));
            assert_eq!(run(&s, KvOp::Update { key: 5, value: vec![8] }), KvReply::Done(false));
            assert_eq!(run(&s, KvOp::Delete { key: 4 }), KvReply::Done(true));
            assert_eq!(run(&s, KvOp::Delete { key: 4 }), KvReply::Done(false));
            assert_eq!(run(&s, KvOp::Put { key: 4, value: vec![7] }), KvReply::Done(false));
            assert_eq!(run(&s, KvOp::Put { key: 4, value: vec![6] }), KvReply::Done(true));
            assert_eq!(run(&s, KvOp::Read { key: 4 }), KvReply::Value(Some(vec![6])));
            assert_eq!(s.len(), 5);
        }
    }

    #[test]
    fn commands_carry_class_and_key() {
        let put = command(KvModel::Sharded, 2, ClientId(1), 9, KvOp::Put { key: 5, value: vec![] });
        assert_eq!(put.class.index(), 2 + shard_of(5, 2));
        assert!(put.reads.is_empty() && put.writes.iter().eq([&5]));
        let get = command(KvModel::ReadersWriters, 1, ClientId(1), 10, KvOp::Read { key: 5 });
        assert_eq!(get.class.index(), 0);
        assert!(get.writes.is_empty() && get.reads.iter().eq([&5]));
    }

    #[test]
    fn digest_depends_on_the_state_only() {
        let a = KvService::new(10, Cost::Light);
        let b = KvService::new(0, Cost::Heavy);
        for k in (0..10).rev() {
            run(&b, KvOp::Create { key: k, value: bytes(k) });
        }
        assert_eq!(a.digest(), b.digest());
        run(&b, KvOp::Create { key: 99, value: vec![] });
        run(&b, KvOp::Delete { key: 99 });
        assert_eq!(a.digest(), b.digest());
        run(&b, KvOp::Update { key: 0, value: vec![0] });
        assert_ne!(a.digest(), b.digest());
    }

    fn arb_op() -> impl Strategy<Value = KvOp> {
        let value = proptest::collection::vec(any::<u8>(), 0..12);
        prop_oneof![
            (0u64..30, value.clone()).prop_map(|(key, value)| KvOp::Create { key, value }),
            (0u64..30).prop_map(|key| KvOp::Read { key }),
            (0u64..30, value).prop_map(|(key, value)| KvOp::Update { key, value }),
            (0u64..30).prop_map(|key| KvOp::Delete { key }),
            (0u64..30, proptest::collection::vec(any::<u8>(), 0..4)).prop_map(|(key, value)| KvOp::Put { key, value }),
        ]
    }

    proptest! {
        /// Operations and replies survive the wire; any bytes decode to an
        /// error or to something that encodes back to the same bytes.
        #[test]
        fn codec_round_trips_and_never_panics(op in arb_op(), junk in proptest::collection::vec(any::<u8>(), 0..40)) {
            let c = KvCodec;
            prop_assert_eq!(c.decode_op(&c.encode_op(&op)).unwrap(), op);
            for r in [KvReply::Value(None), KvReply::Value(Some(junk.clone())), KvReply::Done(true)] {
                prop_assert_eq!(c.decode_reply(&c.encode_reply(&r)).unwrap(), r);
            }
            if let Ok(op) = c.decode_op(&junk) {
                prop_assert_eq!(c.encode_op(&op), junk.clone());
            }
            if let Ok(r) = c.decode_reply(&junk) {
                prop_assert_eq!(c.encode_reply(&r), junk);
            }
        }

        /// Snapshot then restore reproduces the state and the bytes; every
        /// strict prefix and any trailing byte is refused, leaving the state.
        #[test]
        fn snapshot_round_trips_and_bad_bytes_change_nothing(
            ops in proptest::collection::vec(arb_op(), 0..40),
            keys in 0u64..10,
        ) {
            let s = KvService::new(keys, Cost::Light);
            for op in ops {
                run(&s, op);
            }
            let snap = s.snapshot();
            let fresh = KvService::new(3, Cost::Moderate);
            fresh.restore(&snap).unwrap();
            prop_assert_eq!(fresh.digest(), s.digest());
            prop_assert_eq!(fresh.snapshot(), snap.clone());
            let other = KvService::new(5, Cost::Light);
            let before = other.digest();
            for cut in 0..snap.len() {
                prop_assert!(matches!(other.restore(&snap[..cut]), Err(SnapshotError::Truncated(_))), "cut {}", cut);
            }
            let mut long = snap;
            long.push(1);
            prop_assert!(matches!(other.restore(&long), Err(SnapshotError::Malformed(_))));
            prop_assert_eq!(other.digest(), before);
        }

        /// Random bytes never panic and, when refused, change nothing.
        #[test]
        fn garbage_is_refused(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let s = KvService::new(3, Cost::Light);
            let before = s.digest();
            if s.restore(&bytes).is_err() {
                prop_assert_eq!(s.digest(), before);
            }
        }
    }

    #[test]
    fn restore_refuses_unordered_keys_and_other_services() {
        let s = KvService::new(2, Cost::Light);
        let before = s.digest();
        let mut snap = s.snapshot();
        // Entries are key 0 then key 1, 8 bytes each: make both key 1.
        snap[14..22].copy_from_slice(&1u64.to_le_bytes());
        assert!(s.restore(&snap).unwrap_err().to_string().contains("out of order or repeated"));
        let list = crate::list::ListService::new(1, 1).snapshot();
        assert!(s.restore(&list).unwrap_err().to_string().contains("not a key-value snapshot"));
        let mut huge = s.snapshot();
        huge[6..14].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(s.restore(&huge), Err(SnapshotError::Truncated(_))));
        assert_eq!(s.digest(), before);
    }

    #[test]
    fn shards_and_models() {
        assert_eq!(shard_of(7, 0), 0);
        assert_eq!(shard_of(7, 1), 0);
        let mut seen = [0usize; 5];
        for k in 0..5_000 {
            seen[shard_of(k, 5)] += 1;
        }
        assert!(seen.iter().all(|&n| (800..1200).contains(&n)), "{seen:?}");
        for m in KvModel::ALL {
            assert_eq!(m.to_string().parse::<KvModel>(), Ok(m));
        }
        assert!("sharded-global"
            .parse::<KvModel>()
            .unwrap_err()
            .to_string()
            .contains("valid: readers-writers, sharded"));
        let m = class_model(KvModel::Sharded, 2);
        let names: Vec<_> = m.class_ids().map(|c| m.class_name(c)).collect();
        assert_eq!(names, ["R1", "R2", "W1", "W2"]);
        assert!(m.conflicts(ClassId(0), ClassId(2)) && m.self_conflicting(ClassId(3)));
        assert!(!m.conflicts(ClassId(0), ClassId(3)) && !m.conflicts(ClassId(2), ClassId(3)));
        for model in KvModel::ALL {
            for shards in [1, 2, 3, 5, 8, 64, SHARDS_MAX] {
                for workers in [1, 2, 3, 4, 8, 13, 64] {
                    default_mapping(model, shards, workers)
                        .validate(&class_model(model, shards))
                        .unwrap_or_else(|e| panic!("{model} {shards} shards {workers} workers: {e}"));
                }
            }
        }
    }

    fn cfg(shards: usize, write_pct: f64, spread: Spread, seed: u64) -> WorkloadConfig {
        WorkloadConfig {
            commands: 6_000,
            seed,
            shards,
            spread,
            mix: crate::Mix::writes(write_pct),
            keys: 1_000,
            clients: 5,
            ..WorkloadConfig::default()
        }
    }

    #[test]
    fn workloads_are_reproducible_and_respect_the_mix() {
        let c = cfg(3, 30.0, Spread::Uniform, 4);
        let a = generate(KvModel::Sharded, &c).unwrap();
        assert_eq!(a, generate(KvModel::Sharded, &c).unwrap());
        assert_ne!(a, generate(KvModel::Sharded, &WorkloadConfig { seed: 5, ..c.clone() }).unwrap());
        let reads = a.iter().filter(|x| x.op.is_read()).count();
        assert_eq!(reads, 4_200);
        let count = |f: fn(&KvOp) -> bool| a.iter().filter(|x| f(&x.op)).count() as f64;
        for n in [
            count(|o| matches!(o, KvOp::Create { .. })),
            count(|o| matches!(o, KvOp::Update { .. })),
            count(|o| matches!(o, KvOp::Delete { .. })),
        ] {
            assert!((n - 600.0).abs() < 90.0, "{n}");
        }
        for (j, x) in a.iter().enumerate() {
            let k = x.op.key();
            assert!(k < 1_000);
            assert_eq!((x.client, x.seq), (ClientId(j as u64 % 5), j as u64 / 5 + 1));
            let one = vec![k];
            if x.op.is_read() {
                assert_eq!((x.reads.to_vec(), x.writes.len(), x.class.index()), (one, 0, shard_of(k, 3)));
            } else {
                assert_eq!((x.reads.len(), x.writes.to_vec(), x.class.index()), (0, one, 3 + shard_of(k, 3)));
            }
        }
        let e = generate(KvModel::ReadersWriters, &cfg(1, 30.0, Spread::Exponential, 1)).unwrap();
        let writes = e.iter().filter(|x| !x.op.is_read()).count() as f64;
        assert!((writes - 1_800.0).abs() < 150.0, "{writes}");
        assert!(e.iter().all(|x| x.class.index() == usize::from(!x.op.is_read())));
    }

    #[test]
    fn class_models_cover_every_conflict_and_a_wrong_one_is_caught() {
        for model in KvModel::ALL {
            for shards in [1, 2, 5] {
                for keys in [3, 1_000] {
                    let c = WorkloadConfig { keys, ..cfg(shards, 40.0, Spread::Exponential, 8) };
                    let cmds = generate(model, &c).unwrap();
                    class_model(model, shards).check_commands(&cmds).unwrap();
                }
            }
        }
        // Classes by a shard count other than the model's: two commands on
        // one key land in non-conflicting classes.
        let cmds = generate(KvModel::Sharded, &cfg(3, 40.0, Spread::Uniform, 8)).unwrap();
        assert!(class_model(KvModel::Sharded, 4).check_commands(&cmds).is_err());
    }

    #[test]
    fn skew_targets_the_first_shard() {
        for keys in [1_000, ENUMERATE_KEYS_MAX + 1] {
            let c = WorkloadConfig { skew: 0.7, keys, ..cfg(4, 20.0, Spread::Uniform, 2) };
            let cmds = generate(KvModel::Sharded, &c).unwrap();
            let first = cmds.iter().filter(|x| shard_of(x.op.key(), 4) == 0).count() as f64 / cmds.len() as f64;
            assert!((first - 0.7).abs() < 0.03, "{keys} keys: {first}");
        }
        // Key 0 alone maps to shard 2 of 2: the first shard owns nothing.
        assert_eq!(shard_of(0, 2), 1);
        let c = WorkloadConfig { skew: 0.5, keys: 1, ..cfg(2, 20.0, Spread::Uniform, 2) };
        let e = generate(KvModel::Sharded, &c).unwrap_err();
        assert!(e.to_string().contains("sends commands to the first shard, but none of the 1 keys"), "{e}");
    }

    #[test]
    fn global_operations_are_refused() {
        let c = WorkloadConfig { mix: "10-5-0".parse().unwrap(), ..cfg(1, 0.0, Spread::Uniform, 1) };
        let e = generate(KvModel::ReadersWriters, &c).unwrap_err();
        assert_eq!(e.to_string(), "the key-value store has no global operations: β must be 0, got 5");
        let c = WorkloadConfig { keys: KEYS_MAX + 1, ..cfg(1, 0.0, Spread::Uniform, 1) };
        assert_eq!(generate(KvModel::ReadersWriters, &c).unwrap_err(), WorkloadError::Keys(KEYS_MAX + 1));
    }
}
