//! The sharded linked list of 003 §6.2 and 000 §5.2.
//!
//! The state is `S` shards, each a linked list of integers. Single-shard
//! operations are `contains(i)` and `add(i)` (append `i` if absent);
//! multi-shard ones are `containsAll(i)` and `addAll(i)`, the same on every
//! shard. The length of the lists is the execution cost: every operation
//! walks a list node by node, which is why this uses
//! [`std::collections::LinkedList`] and not a vector or a set.
//!
//! The key of shard `i` is `i`: local operations read or write one key,
//! global ones every key. Three class models describe the same conflicts
//! with more or less precision (003 Fig. 1): [`ListModel`].

use crate::workload::{Draws, Kind};
use crate::{
    clamp_shards, group_heads, local_classes, local_mappings, readers_writers_mappings, shard_groups, WorkloadConfig,
    WorkloadError,
};
use parking_lot::RwLock;
use psmr_model::snapshot::{put_header, put_u32, put_u64, SnapshotReader};
use psmr_model::wire::{Decoder, Encoder, OpCodec, WireError};
use psmr_model::{
    Access, ClassId, ClassMapping, ClassModel, ClientId, Command, Digest, Mapping, Mode, Service, SnapshotError,
    StableHasher, UnorderedDigest,
};
use rand::Rng;
use std::collections::LinkedList;
use std::fmt;
use std::hash::Hasher;
use std::str::FromStr;
use thiserror::Error;

/// Largest list size a workload may ask for: values are drawn from
/// `0..2 * list_size`, so a shard holds at most twice this many entries.
pub const LIST_SIZE_MAX: usize = 1 << 24;

const SNAPSHOT_MAGIC: &[u8; 4] = b"PSLL";
const SNAPSHOT_VERSION: u16 = 1;

/// An operation on the sharded list.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ListOp {
    /// Is `value` in shard `shard`?
    Contains {
        /// Shard index, from 0.
        shard: u32,
        /// The value looked for.
        value: i64,
    },
    /// Append `value` to shard `shard` unless it is there already.
    Add {
        /// Shard index, from 0.
        shard: u32,
        /// The value added.
        value: i64,
    },
    /// In how many shards is `value`?
    ContainsAll {
        /// The value looked for.
        value: i64,
    },
    /// Add `value` to every shard that lacks it.
    AddAll {
        /// The value added.
        value: i64,
    },
}

/// The reply to a [`ListOp`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ListReply {
    /// `Contains`: whether the value is there. `Add`: whether it was added
    /// (false: it was there already).
    Found(bool),
    /// `ContainsAll`: shards holding the value. `AddAll`: shards it was
    /// added to.
    Count(u32),
    /// The operation named a shard the service does not have; nothing
    /// changed.
    BadShard(u32),
}

/// The sharded linked list service.
///
/// Each shard sits behind its own reader-writer lock, so concurrent reads
/// of a shard proceed together and a scheduler bug can produce wrong
/// answers but never a data race.
pub struct ListService {
    shards: Box<[RwLock<LinkedList<i64>>]>,
    #[cfg(feature = "sanitizer")]
    regions: crate::sanitizer::Regions,
}

impl ListService {
    /// `shards` lists, each holding `0..list_size` in order.
    ///
    /// Memory is about 32 bytes per entry; workloads bound `list_size` by
    /// [`LIST_SIZE_MAX`] and generated adds at most double it.
    pub fn new(shards: usize, list_size: usize) -> Self {
        let initial = 0..i64::try_from(list_size).unwrap_or(i64::MAX);
        Self {
            shards: (0..shards).map(|_| RwLock::new(initial.clone().collect())).collect(),
            #[cfg(feature = "sanitizer")]
            regions: crate::sanitizer::Regions::new("shard"),
        }
    }

    /// Number of shards.
    pub fn shards(&self) -> usize {
        self.shards.len()
    }

    /// The shards an operation touches, and whether it writes them. Empty
    /// for a shard out of range, which touches nothing.
    #[cfg(feature = "sanitizer")]
    fn footprint(&self, op: &ListOp) -> (bool, std::ops::Range<u64>) {
        let local = |shard: u32| {
            let s = u64::from(shard);
            if (shard as usize) < self.shards.len() {
                s..s + 1
            } else {
                0..0
            }
        };
        let all = 0..self.shards.len() as u64;
        match *op {
            ListOp::Contains { shard, .. } => (false, local(shard)),
            ListOp::Add { shard, .. } => (true, local(shard)),
            ListOp::ContainsAll { .. } => (false, all),
            ListOp::AddAll { .. } => (true, all),
        }
    }

    /// Registers `command` with the conflict sanitizer in the shards its
    /// operation touches, as `execute` does, until the returned guard is
    /// dropped; panics, naming both commands, if a conflicting command is
    /// inside one of them. Lets tests hold a shard busy to check that the
    /// sanitizer reports overlaps.
    #[cfg(feature = "sanitizer")]
    pub fn occupy(&self, command: &Command<ListOp>) -> crate::Occupancy<'_> {
        let (writer, shards) = self.footprint(&command.op);
        self.regions.enter(command, writer, shards)
    }
}

/// Appends `value` unless present; true when it was appended.
fn add(list: &mut LinkedList<i64>, value: i64) -> bool {
    let absent = !list.contains(&value);
    if absent {
        list.push_back(value);
    }
    absent
}

impl ListService {
    /// Writes the snapshot (see [`Service::snapshot`]) to `w`.
    fn write_to(&self, w: &mut dyn std::io::Write) -> std::io::Result<()> {
        put_header(w, SNAPSHOT_MAGIC, SNAPSHOT_VERSION)?;
        put_u32(w, self.shards.len() as u32)?;
        for shard in self.shards.iter() {
            let list = shard.read();
            put_u64(w, list.len() as u64)?;
            for v in list.iter() {
                w.write_all(&v.to_le_bytes())?;
            }
        }
        Ok(())
    }

    /// Reads a snapshot of as many shards as this service has.
    fn read_from(&self, src: &mut dyn std::io::Read) -> Result<Vec<LinkedList<i64>>, SnapshotError> {
        let mut r = SnapshotReader::open(src, SNAPSHOT_MAGIC, SNAPSHOT_VERSION, "linked-list")?;
        let shards = r.u32()? as usize;
        if shards != self.shards.len() {
            return Err(SnapshotError::Malformed(format!(
                "snapshot has {shards} shards, this service has {}",
                self.shards.len()
            )));
        }
        let mut lists = Vec::with_capacity(shards);
        for _ in 0..shards {
            let len = r.u64()?;
            let mut list = LinkedList::new();
            for _ in 0..len {
                list.push_back(i64::from_le_bytes(r.array()?));
            }
            lists.push(list);
        }
        r.finish()?;
        Ok(lists)
    }
}

impl Service for ListService {
    type Op = ListOp;
    type Reply = ListReply;

    fn execute(&self, command: &Command<ListOp>) -> ListReply {
        // Registered before any data lock: the locks would otherwise hide
        // the overlap the sanitizer looks for.
        #[cfg(feature = "sanitizer")]
        let _occupancy = self.occupy(command);
        let shard = |s: u32| self.shards.get(s as usize);
        match command.op {
            ListOp::Contains { shard: s, value } => match shard(s) {
                Some(list) => ListReply::Found(list.read().contains(&value)),
                None => ListReply::BadShard(s),
            },
            ListOp::Add { shard: s, value } => match shard(s) {
                Some(list) => ListReply::Found(add(&mut list.write(), value)),
                None => ListReply::BadShard(s),
            },
            // One shard lock at a time: a scheduler never runs a global
            // operation beside a conflicting one, so holding all locks would
            // only add waiting, and taking them one by one cannot deadlock.
            ListOp::ContainsAll { value } => {
                ListReply::Count(self.shards.iter().filter(|l| l.read().contains(&value)).count() as u32)
            }
            ListOp::AddAll { value } => {
                ListReply::Count(self.shards.iter().filter(|l| add(&mut l.write(), value)).count() as u32)
            }
        }
    }

    /// `"PSLL"`, version (u16), shard count (u32), then per shard its length
    /// (u64) and its values (i64) in list order; all little-endian.
    fn snapshot(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.write_to(&mut out).expect("a vector takes every write");
        out
    }

    /// Restores a snapshot with the same shard count as this service; a
    /// different count is an error rather than a silent change of layout,
    /// because the class model and mapping in use were built for this
    /// count. The whole snapshot is decoded before anything is replaced.
    fn restore(&self, mut snapshot: &[u8]) -> Result<(), SnapshotError> {
        let lists = self.read_from(&mut snapshot)?;
        for (shard, list) in self.shards.iter().zip(lists) {
            *shard.write() = list;
        }
        Ok(())
    }

    /// Decodes as it reads; the lists replace the state once all of them
    /// decoded (a list holds at most a few thousand values, so the copy
    /// is small).
    fn restore_from(&self, source: &mut dyn std::io::Read) -> Result<(), SnapshotError> {
        let lists = self.read_from(source)?;
        for (shard, list) in self.shards.iter().zip(lists) {
            *shard.write() = list;
        }
        Ok(())
    }

    /// The whole snapshot decoded and dropped: a list's state is small.
    fn check_snapshot(&self, source: &mut dyn std::io::Read) -> Result<(), SnapshotError> {
        self.read_from(source).map(|_| ())
    }

    /// Order within a shard is part of the state (it decides scan costs
    /// and snapshots), so each shard's sequence is hashed in order, with
    /// the shard's index, and the shards are combined.
    fn digest(&self) -> Digest {
        let mut digest = UnorderedDigest::new();
        for (i, shard) in self.shards.iter().enumerate() {
            let list = shard.read();
            let mut h = StableHasher::new();
            h.write_u64(i as u64);
            h.write_u64(list.len() as u64);
            for &v in list.iter() {
                h.write_u64(v as u64);
            }
            digest.add_hash(h.finish());
        }
        digest.finish()
    }
}

/// The class models of 003 Fig. 1 for the sharded list.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ListModel {
    /// Fig. 1(a): `R`, `W` with `R-W` and `W-W`. Shards are ignored: every
    /// write conflicts with every other command.
    ReadersWriters,
    /// Fig. 1(b): `R1..RS`, `W1..WS`, `S` with `Ri-Wi`, `Wi-Wi` and `S-Wi`.
    /// `S` (snapshots, i.e. `containsAll`) only reads, so it does not
    /// conflict with itself. There are no global writes.
    ShardedSnapshot,
    /// Fig. 1(c): `R1..RS`, `W1..WS`, `Rg`, `Wg` with `Ri-Wi`, `Wi-Wi`,
    /// `Wi-Rg`, and `Wg` conflicting with every class, itself included.
    ShardedGlobal,
}

impl ListModel {
    /// Every model.
    pub const ALL: [ListModel; 3] = [ListModel::ReadersWriters, ListModel::ShardedSnapshot, ListModel::ShardedGlobal];

    /// The name accepted by `FromStr` and printed by `Display`.
    pub fn name(self) -> &'static str {
        match self {
            ListModel::ReadersWriters => "readers-writers",
            ListModel::ShardedSnapshot => "sharded-snapshot",
            ListModel::ShardedGlobal => "sharded-global",
        }
    }
}

impl fmt::Display for ListModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ListModel {
    type Err = WorkloadError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ListModel::ALL.into_iter().find(|m| m.name() == s).ok_or_else(|| WorkloadError::UnknownName {
            what: "list model",
            name: s.to_string(),
            valid: "readers-writers, sharded-snapshot, sharded-global",
        })
    }
}

/// The class model `model` for `shards` shards (clamped to
/// `1..=SHARDS_MAX`). Class ids follow declaration order: `R`, `W`; or
/// `R1..RS`, `W1..WS` then `S`, or then `Rg`, `Wg`.
pub fn class_model(model: ListModel, shards: usize) -> ClassModel {
    let s = clamp_shards(shards);
    let builder = ClassModel::builder(model.name());
    let builder = match model {
        ListModel::ReadersWriters => builder.class("R").class("W").conflict("R", "W").conflict("W", "W"),
        ListModel::ShardedSnapshot => {
            (1..=s).fold(local_classes(builder, s).class("S"), |b, i| b.conflict("S", format!("W{i}")))
        }
        ListModel::ShardedGlobal => {
            let b = local_classes(builder, s).class("Rg").class("Wg").conflict("Wg", "Wg").conflict("Wg", "Rg");
            (1..=s).fold(b, |b, i| {
                b.conflict("Rg", format!("W{i}")).conflict("Wg", format!("R{i}")).conflict("Wg", format!("W{i}"))
            })
        }
    };
    builder.build().expect("class names are distinct and every conflict names a declared class")
}

/// A class-to-threads mapping for `model` with `shards` shards (clamped to
/// `1..=SHARDS_MAX`) and `workers` threads that obeys rules R.1-R.5.
///
/// Threads are split into one group per shard: with at least as many
/// workers as shards, group `g` is every thread `t` with `t % shards == g`;
/// with fewer, shard `i` uses thread `i % workers`. Then:
///
/// * readers-writers: `R` concurrent on every thread, `W` sequential on
///   every thread;
/// * sharded-snapshot: `Ri` concurrent and `Wi` sequential on group `i`,
///   `S` sequential on the lowest thread of each group (one thread in common
///   with each `Wi`, the least synchronization R.5 allows);
/// * sharded-global: as sharded-snapshot, with `Rg` where `S` was and `Wg`
///   sequential on every thread.
///
/// For 2 shards and 4 workers this is 000 Table 4.1 except that `Rg` uses
/// `{t0, t1}` instead of `{t0, t3}`; both are valid. With `workers == 0`
/// the mapping is returned but does not validate.
pub fn default_mapping(model: ListModel, shards: usize, workers: usize) -> Mapping {
    let groups = shard_groups(clamp_shards(shards), workers);
    let heads = || ClassMapping::new(Mode::Sequential, group_heads(&groups));
    let classes = match model {
        ListModel::ReadersWriters => readers_writers_mappings(workers),
        ListModel::ShardedSnapshot => {
            let mut m = local_mappings(&groups);
            m.push(heads());
            m
        }
        ListModel::ShardedGlobal => {
            let mut m = local_mappings(&groups);
            m.push(heads());
            m.push(ClassMapping::new(Mode::Sequential, 0..workers));
            m
        }
    };
    Mapping::new(workers, classes)
}

/// The class of a command of `kind` (on `shard` when local) under `model`.
fn class_of(model: ListModel, shards: usize, kind: Kind, shard: usize) -> ClassId {
    let id = match (model, kind) {
        (ListModel::ReadersWriters, Kind::LocalRead | Kind::GlobalRead) => 0,
        (ListModel::ReadersWriters, Kind::LocalWrite | Kind::GlobalWrite) => 1,
        (_, Kind::LocalRead) => shard,
        (_, Kind::LocalWrite) => shards + shard,
        (_, Kind::GlobalRead) => 2 * shards,
        (_, Kind::GlobalWrite) => 2 * shards + 1,
    };
    // Shards are at most SHARDS_MAX, so every id fits.
    ClassId(id as u16)
}

/// A command the list cannot take from a client.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum CommandError {
    /// The operation names a shard the list does not have.
    #[error("shard {shard} does not exist (the list has {shards})")]
    Shard {
        /// The shard named.
        shard: u32,
        /// Shards there are.
        shards: usize,
    },
    /// The class model has no class for the operation.
    #[error("the {model} model has no class for {op}")]
    NoClass {
        /// The model.
        model: &'static str,
        /// The operation's name.
        op: &'static str,
    },
}

/// The command for `op` under `model` with `shards` shards: its class and
/// the shards it reads or writes. An operation on a shard outside
/// `0..shards`, or a global write under [`ListModel::ShardedSnapshot`], is
/// refused: it has no class, and a wrong class would let it run beside
/// commands it conflicts with.
pub fn command(
    model: ListModel,
    shards: usize,
    client: ClientId,
    seq: u64,
    op: ListOp,
) -> Result<Command<ListOp>, CommandError> {
    let Access { class, reads, writes } = access(model, shards, &op)?;
    Ok(Command { client, seq, class, reads, writes, op, stamp: Default::default() })
}

/// What `op` touches under `model` with `shards` shards: its class and the
/// shards it reads or writes; an error for an operation the model has no
/// class for or a shard out of range.
pub fn access(model: ListModel, shards: usize, op: &ListOp) -> Result<Access, CommandError> {
    let shards = clamp_shards(shards);
    let (kind, shard) = match *op {
        ListOp::Contains { shard, .. } => (Kind::LocalRead, Some(shard)),
        ListOp::Add { shard, .. } => (Kind::LocalWrite, Some(shard)),
        ListOp::ContainsAll { .. } => (Kind::GlobalRead, None),
        ListOp::AddAll { .. } => (Kind::GlobalWrite, None),
    };
    if let Some(s) = shard.filter(|&s| s as usize >= shards) {
        return Err(CommandError::Shard { shard: s, shards });
    }
    if model == ListModel::ShardedSnapshot && kind == Kind::GlobalWrite {
        return Err(CommandError::NoClass { model: model.name(), op: "addAll" });
    }
    let class = class_of(model, shards, kind, shard.unwrap_or(0) as usize);
    let all = 0..shards as u64;
    Ok(match (kind, shard) {
        (Kind::LocalRead, Some(s)) => Access::read(class, [u64::from(s)]),
        (Kind::LocalWrite, Some(s)) => Access::write(class, [u64::from(s)]),
        (Kind::GlobalRead, _) => Access::read(class, all),
        _ => Access::write(class, all),
    })
}

/// An endless stream of list operations following a workload: the draws
/// of [`generate`], in the same order, so the same configuration gives the
/// same operations. Clients of a cluster each run one (with their own
/// seed).
pub struct OpStream {
    draws: Draws,
    values: i64,
}

impl OpStream {
    /// A stream for `model` on lists of `list_size` entries per shard.
    ///
    /// Errors: an invalid `cfg`, `list_size` outside `1..=LIST_SIZE_MAX`, or
    /// global writes with [`ListModel::ShardedSnapshot`].
    pub fn new(model: ListModel, cfg: &WorkloadConfig, list_size: usize) -> Result<Self, WorkloadError> {
        cfg.validate()?;
        if !(1..=LIST_SIZE_MAX).contains(&list_size) {
            return Err(WorkloadError::ListSize(list_size));
        }
        let mix = cfg.mix;
        if model == ListModel::ShardedSnapshot && mix.global_pct > 0.0 && mix.global_write_pct > 0.0 {
            return Err(WorkloadError::NoGlobalWrites { model: model.name(), global_write_pct: mix.global_write_pct });
        }
        Ok(Self { draws: Draws::new(cfg), values: 2 * list_size as i64 })
    }

    /// The next operation.
    pub fn next_op(&mut self) -> ListOp {
        let kind = self.draws.kind();
        let shard = match kind {
            Kind::LocalRead => self.draws.local_shard(false),
            Kind::LocalWrite => self.draws.local_shard(true),
            Kind::GlobalRead | Kind::GlobalWrite => 0,
        } as u32;
        let value = self.draws.rng.gen_range(0..self.values);
        match kind {
            Kind::LocalRead => ListOp::Contains { shard, value },
            Kind::LocalWrite => ListOp::Add { shard, value },
            Kind::GlobalRead => ListOp::ContainsAll { value },
            Kind::GlobalWrite => ListOp::AddAll { value },
        }
    }
}

/// Generates `cfg.commands` list commands for `model`, reproducibly from
/// `cfg.seed`, on lists of `list_size` entries.
///
/// Which positions hold conflicting commands (local writes and global
/// operations) follows `cfg.spread` (see [`crate::Spread`]); each
/// conflicting position is a local write, a global write or a global read
/// in the proportions `α : β·γ : β·(1-γ)`, by a random draw; the other
/// positions are local reads. Local operations go to a shard drawn with
/// `cfg.skew` (writes with `cfg.write_skew` when set); values are drawn
/// from `0..2 * list_size`, so about half of the adds add something and a
/// list at most doubles.
///
/// Errors: those of [`OpStream::new`].
pub fn generate(
    model: ListModel,
    cfg: &WorkloadConfig,
    list_size: usize,
) -> Result<Vec<Command<ListOp>>, WorkloadError> {
    let mut ops = OpStream::new(model, cfg, list_size)?;
    let mut out = Vec::with_capacity(cfg.commands);
    for j in 0..cfg.commands {
        let (client, seq) = cfg.ids(j);
        let op = ops.next_op();
        // The stream only makes operations on existing shards, with a
        // class in the model (checked by `OpStream::new`).
        let c = command(model, cfg.shards, client, seq, op).expect("generated operations have a class");
        out.push(c);
    }
    Ok(out)
}

/// The wire form of list operations and replies (`psmr_model::wire`).
#[derive(Clone, Copy, Debug, Default)]
pub struct ListCodec;

impl OpCodec for ListCodec {
    type Op = ListOp;
    type Reply = ListReply;

    fn encode_op(&self, op: &ListOp) -> Vec<u8> {
        let mut e = Encoder::new();
        match *op {
            ListOp::Contains { shard, value } => e.u8(0).u32(shard).u64(value as u64),
            ListOp::Add { shard, value } => e.u8(1).u32(shard).u64(value as u64),
            ListOp::ContainsAll { value } => e.u8(2).u64(value as u64),
            ListOp::AddAll { value } => e.u8(3).u64(value as u64),
        };
        e.finish()
    }

    fn decode_op(&self, bytes: &[u8]) -> Result<ListOp, WireError> {
        let mut d = Decoder::new(bytes, "list operation");
        let op = match d.u8()? {
            0 => ListOp::Contains { shard: d.u32()?, value: d.u64()? as i64 },
            1 => ListOp::Add { shard: d.u32()?, value: d.u64()? as i64 },
            2 => ListOp::ContainsAll { value: d.u64()? as i64 },
            3 => ListOp::AddAll { value: d.u64()? as i64 },
            t => return Err(d.error(format!("unknown operation tag {t}"))),
        };
        d.end()?;
        Ok(op)
    }

    fn encode_reply(&self, reply: &ListReply) -> Vec<u8> {
        let mut e = Encoder::new();
        match *reply {
            ListReply::Found(b) => e.u8(0).u8(u8::from(b)),
            ListReply::Count(n) => e.u8(1).u32(n),
            ListReply::BadShard(s) => e.u8(2).u32(s),
        };
        e.finish()
    }

    fn decode_reply(&self, bytes: &[u8]) -> Result<ListReply, WireError> {
        let mut d = Decoder::new(bytes, "list reply");
        let reply = match d.u8()? {
            0 => match d.u8()? {
                b @ (0 | 1) => ListReply::Found(b == 1),
                b => return Err(d.error(format!("bad boolean {b}"))),
            },
            1 => ListReply::Count(d.u32()?),
            2 => ListReply::BadShard(d.u32()?),
            t => return Err(d.error(format!("unknown reply tag {t}"))),
        };
        d.end()?;
        Ok(reply)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Mix, Spread, SHARDS_MAX};
    use proptest::prelude::*;
    use psmr_model::KeySet;

    proptest! {
        #[test]
        fn the_codec_round_trips(tag in 0u8..4, shard in any::<u32>(), value in any::<i64>(), n in any::<u32>()) {
            let op = [
                ListOp::Contains { shard, value },
                ListOp::Add { shard, value },
                ListOp::ContainsAll { value },
                ListOp::AddAll { value },
            ][tag as usize];
            prop_assert_eq!(ListCodec.decode_op(&ListCodec.encode_op(&op)).unwrap(), op);
            for reply in [ListReply::Found(shard % 2 == 0), ListReply::Count(n), ListReply::BadShard(shard)] {
                prop_assert_eq!(ListCodec.decode_reply(&ListCodec.encode_reply(&reply)).unwrap(), reply);
            }
        }

        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..24)) {
            let _ = ListCodec.decode_op(&bytes);
            let _ = ListCodec.decode_reply(&bytes);
        }
    }

    #[test]
    fn commands_from_clients_are_checked() {
        let c = command(ListModel::ShardedGlobal, 2, ClientId(1), 1, ListOp::Add { shard: 1, value: 3 }).unwrap();
        assert_eq!((c.class, c.writes.len(), c.reads.len()), (ClassId(3), 1, 0));
        assert_eq!(
            command(ListModel::ShardedGlobal, 2, ClientId(1), 1, ListOp::Contains { shard: 2, value: 3 }),
            Err(CommandError::Shard { shard: 2, shards: 2 })
        );
        assert!(matches!(
            command(ListModel::ShardedSnapshot, 2, ClientId(1), 1, ListOp::AddAll { value: 3 }),
            Err(CommandError::NoClass { .. })
        ));
        assert!(ListCodec.decode_op(&[9]).is_err());
        assert!(ListCodec.decode_op(&[]).is_err());
        let mut long = ListCodec.encode_op(&ListOp::AddAll { value: 1 });
        long.push(0);
        assert!(ListCodec.decode_op(&long).is_err(), "trailing bytes");
    }

    #[test]
    fn the_stream_makes_what_generate_makes() {
        let cfg = WorkloadConfig {
            commands: 500,
            shards: 3,
            skew: 0.5,
            mix: Mix { local_write_pct: 20.0, global_pct: 10.0, global_write_pct: 50.0 },
            ..WorkloadConfig::default()
        };
        let generated: Vec<ListOp> =
            generate(ListModel::ShardedGlobal, &cfg, 10).unwrap().into_iter().map(|c| c.op).collect();
        let mut stream = OpStream::new(ListModel::ShardedGlobal, &cfg, 10).unwrap();
        let streamed: Vec<ListOp> = (0..500).map(|_| stream.next_op()).collect();
        assert_eq!(generated, streamed);
    }

    fn cmd(op: ListOp) -> Command<ListOp> {
        Command {
            client: ClientId(1),
            seq: 1,
            class: ClassId(0),
            reads: KeySet::new(),
            writes: KeySet::new(),
            op,
            stamp: Default::default(),
        }
    }

    fn run(s: &ListService, op: ListOp) -> ListReply {
        s.execute(&cmd(op))
    }

    #[test]
    fn operations_follow_the_paper() {
        let s = ListService::new(2, 3);
        assert_eq!(run(&s, ListOp::Contains { shard: 0, value: 2 }), ListReply::Found(true));
        assert_eq!(run(&s, ListOp::Contains { shard: 1, value: 3 }), ListReply::Found(false));
        assert_eq!(run(&s, ListOp::Add { shard: 1, value: 3 }), ListReply::Found(true));
        assert_eq!(run(&s, ListOp::Add { shard: 1, value: 3 }), ListReply::Found(false));
        assert_eq!(run(&s, ListOp::ContainsAll { value: 3 }), ListReply::Count(1));
        assert_eq!(run(&s, ListOp::AddAll { value: 3 }), ListReply::Count(1));
        assert_eq!(run(&s, ListOp::ContainsAll { value: 3 }), ListReply::Count(2));
        assert_eq!(run(&s, ListOp::AddAll { value: -1 }), ListReply::Count(2));
    }

    #[test]
    fn a_shard_out_of_range_is_an_error_reply_not_a_panic() {
        let s = ListService::new(2, 3);
        let before = s.digest();
        assert_eq!(run(&s, ListOp::Contains { shard: 2, value: 0 }), ListReply::BadShard(2));
        assert_eq!(run(&s, ListOp::Add { shard: u32::MAX, value: 9 }), ListReply::BadShard(u32::MAX));
        assert_eq!(s.digest(), before);
        let empty = ListService::new(0, 3);
        assert_eq!(run(&empty, ListOp::AddAll { value: 1 }), ListReply::Count(0));
    }

    #[test]
    fn digest_sees_order_within_a_shard_and_which_shard() {
        let a = ListService::new(2, 0);
        let b = ListService::new(2, 0);
        run(&a, ListOp::Add { shard: 0, value: 1 });
        run(&a, ListOp::Add { shard: 0, value: 2 });
        run(&b, ListOp::Add { shard: 0, value: 2 });
        run(&b, ListOp::Add { shard: 0, value: 1 });
        assert_ne!(a.digest(), b.digest());
        let c = ListService::new(2, 0);
        run(&c, ListOp::Add { shard: 1, value: 1 });
        run(&c, ListOp::Add { shard: 1, value: 2 });
        assert_ne!(a.digest(), c.digest());
        let d = ListService::new(2, 0);
        run(&d, ListOp::Add { shard: 0, value: 1 });
        run(&d, ListOp::Add { shard: 0, value: 2 });
        assert_eq!(a.digest(), d.digest());
    }

    fn arb_op(shards: u32) -> impl Strategy<Value = ListOp> {
        prop_oneof![
            (0..shards + 1, -5i64..20).prop_map(|(shard, value)| ListOp::Contains { shard, value }),
            (0..shards + 1, -5i64..20).prop_map(|(shard, value)| ListOp::Add { shard, value }),
            (-5i64..20).prop_map(|value| ListOp::ContainsAll { value }),
            (-5i64..20).prop_map(|value| ListOp::AddAll { value }),
        ]
    }

    proptest! {
        /// Snapshot then restore into a fresh service reproduces the state;
        /// every strict prefix of the snapshot, and the snapshot with bytes
        /// appended, is refused without touching the state.
        #[test]
        fn snapshot_round_trips_and_bad_bytes_change_nothing(
            ops in proptest::collection::vec(arb_op(3), 0..40),
            size in 0usize..6,
        ) {
            let s = ListService::new(3, size);
            for op in ops {
                run(&s, op);
            }
            let snap = s.snapshot();
            let fresh = ListService::new(3, 1);
            fresh.restore(&snap).unwrap();
            prop_assert_eq!(fresh.digest(), s.digest());
            prop_assert_eq!(fresh.snapshot(), snap.clone());
            let other = ListService::new(3, 2);
            let before = other.digest();
            for cut in 0..snap.len() {
                prop_assert!(matches!(other.restore(&snap[..cut]), Err(SnapshotError::Truncated(_))), "cut {}", cut);
                prop_assert_eq!(other.digest(), before);
            }
            let mut long = snap.clone();
            long.push(0);
            prop_assert!(matches!(other.restore(&long), Err(SnapshotError::Malformed(_))));
            prop_assert_eq!(other.digest(), before);
        }

        /// Random bytes never restore (except, vanishingly, a valid
        /// snapshot) and never change the state or panic.
        #[test]
        fn garbage_is_refused(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let s = ListService::new(2, 3);
            let before = s.digest();
            if s.restore(&bytes).is_err() {
                prop_assert_eq!(s.digest(), before);
            }
        }
    }

    #[test]
    fn restore_refuses_other_services_versions_and_layouts() {
        let s = ListService::new(2, 3);
        let before = s.digest();
        let three = ListService::new(3, 3).snapshot();
        let e = s.restore(&three).unwrap_err();
        assert_eq!(e, SnapshotError::Malformed("snapshot has 3 shards, this service has 2".into()));
        let mut v2 = s.snapshot();
        v2[4] = 2;
        assert!(s.restore(&v2).unwrap_err().to_string().contains("version 2"));
        let kv = crate::kv::KvService::new(3, crate::Cost::Light).snapshot();
        assert!(s.restore(&kv).unwrap_err().to_string().contains("not a linked-list snapshot"));
        // A length field claiming more entries than bytes follow.
        let mut huge = s.snapshot();
        huge[10..18].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(s.restore(&huge), Err(SnapshotError::Truncated(_))));
        assert_eq!(s.digest(), before);
    }

    #[test]
    fn model_names_round_trip() {
        for m in ListModel::ALL {
            assert_eq!(m.to_string().parse::<ListModel>(), Ok(m));
        }
        let e = "sharded".parse::<ListModel>().unwrap_err().to_string();
        assert_eq!(e, "unknown list model \"sharded\" (valid: readers-writers, sharded-snapshot, sharded-global)");
    }

    #[test]
    fn class_models_follow_fig_1() {
        let a = class_model(ListModel::ReadersWriters, 3);
        let names = |m: &ClassModel| m.class_ids().map(|c| m.class_name(c).to_string()).collect::<Vec<_>>();
        assert_eq!(names(&a), ["R", "W"]);
        assert!(
            a.conflicts(ClassId(0), ClassId(1)) && a.self_conflicting(ClassId(1)) && !a.self_conflicting(ClassId(0))
        );

        let b = class_model(ListModel::ShardedSnapshot, 2);
        assert_eq!(names(&b), ["R1", "R2", "W1", "W2", "S"]);
        let id = |m: &ClassModel, n: &str| m.class_id(n).unwrap();
        let conflict = |m: &ClassModel, x: &str, y: &str| m.conflicts(id(m, x), id(m, y));
        assert!(
            conflict(&b, "R1", "W1") && conflict(&b, "W2", "W2") && conflict(&b, "S", "W1") && conflict(&b, "S", "W2")
        );
        assert!(
            !conflict(&b, "R1", "W2")
                && !conflict(&b, "S", "S")
                && !conflict(&b, "S", "R1")
                && !conflict(&b, "W1", "W2")
        );

        let c = class_model(ListModel::ShardedGlobal, 2);
        assert_eq!(names(&c), ["R1", "R2", "W1", "W2", "Rg", "Wg"]);
        assert!(conflict(&c, "Rg", "W2") && !conflict(&c, "Rg", "Rg") && !conflict(&c, "Rg", "R1"));
        for x in names(&c) {
            assert!(conflict(&c, "Wg", &x), "Wg-{x}");
        }
        assert_eq!(class_model(ListModel::ShardedGlobal, 0), class_model(ListModel::ShardedGlobal, 1));
        assert_eq!(class_model(ListModel::ShardedGlobal, usize::MAX).len(), 2 * SHARDS_MAX + 2);
    }

    const TABLE_4_1: &str = "R1=conc:0,2; R2=conc:1,3; W1=seq:0,2; W2=seq:1,3; Rg=seq:0,3; Wg=seq:0-3";
    /// 000 Table 5.1 as printed: `Rg` shares no thread with `W3`.
    const TABLE_5_1_PRINTED: &str = "R1=conc:2,4; R2=conc:0,6; R3=conc:3,5; R4=conc:1,7; \
        W1=seq:2,4; W2=seq:0,6; W3=seq:3,5; W4=seq:1,7; Rg=seq:0,4,6,7; Wg=seq:0-7";
    /// Table 5.1 with `Rg` taking one thread of each shard, as in Tables 4.1
    /// and 5.2 (t5 for the printed t6, which duplicated shard 2's t0).
    const TABLE_5_1: &str = "R1=conc:2,4; R2=conc:0,6; R3=conc:3,5; R4=conc:1,7; \
        W1=seq:2,4; W2=seq:0,6; W3=seq:3,5; W4=seq:1,7; Rg=seq:0,4,5,7; Wg=seq:0-7";

    fn table_5_2() -> String {
        let mut spec = String::new();
        for (kind, mode) in [("R", "conc"), ("W", "seq")] {
            for i in 1..=8 {
                spec.push_str(&format!("{kind}{i}={mode}:{},{}; ", 2 * i - 2, 2 * i - 1));
            }
        }
        spec + "Rg=seq:0,2,4,6,8,10,12,14; Wg=seq:0-15"
    }

    #[test]
    fn thesis_tables_validate_against_the_sharded_global_model() {
        let model = |s| class_model(ListModel::ShardedGlobal, s);
        Mapping::from_spec(&model(2), 4, TABLE_4_1).unwrap();
        Mapping::from_spec(&model(4), 8, TABLE_5_1).unwrap();
        Mapping::from_spec(&model(8), 16, &table_5_2()).unwrap();
        let e = Mapping::from_spec(&model(4), 8, TABLE_5_1_PRINTED).unwrap_err();
        assert_eq!(e, psmr_model::MappingError::R5 { a: "W3".into(), b: "Rg".into() });
    }

    #[test]
    fn default_mappings_validate_for_every_model_and_size() {
        for model in ListModel::ALL {
            for shards in [1, 2, 3, 4, 5, 8, 16, 17, 64, SHARDS_MAX] {
                let classes = class_model(model, shards);
                for workers in [1, 2, 3, 4, 5, 7, 8, 16, 33, 64] {
                    let m = default_mapping(model, shards, workers);
                    m.validate(&classes).unwrap_or_else(|e| panic!("{model} {shards} shards {workers} workers: {e}"));
                }
                assert!(default_mapping(model, shards, 0).validate(&classes).is_err());
            }
        }
        let m = default_mapping(ListModel::ShardedGlobal, 2, 4);
        let spec = "R1=conc:0,2; R2=conc:1,3; W1=seq:0,2; W2=seq:1,3; Rg=seq:0,1; Wg=seq:0-3";
        assert_eq!(m, Mapping::from_spec(&class_model(ListModel::ShardedGlobal, 2), 4, spec).unwrap());
    }

    fn cfg(shards: usize, mix: &str, spread: Spread, seed: u64) -> WorkloadConfig {
        WorkloadConfig {
            commands: 5_000,
            seed,
            shards,
            spread,
            mix: mix.parse().unwrap(),
            clients: 7,
            ..WorkloadConfig::default()
        }
    }

    #[test]
    fn workloads_are_reproducible_from_the_seed() {
        let c = cfg(3, "25-5-25", Spread::Exponential, 9);
        let a = generate(ListModel::ShardedGlobal, &c, 100).unwrap();
        assert_eq!(a, generate(ListModel::ShardedGlobal, &c, 100).unwrap());
        assert_ne!(a, generate(ListModel::ShardedGlobal, &WorkloadConfig { seed: 10, ..c }, 100).unwrap());
    }

    #[test]
    fn generated_commands_are_consistent() {
        let c = cfg(4, "30-10-40", Spread::Uniform, 5);
        let cmds = generate(ListModel::ShardedGlobal, &c, 50).unwrap();
        assert_eq!(cmds.len(), 5_000);
        let model = class_model(ListModel::ShardedGlobal, 4);
        let mut counts = [0usize; 4];
        for (j, x) in cmds.iter().enumerate() {
            assert_eq!((x.client, x.seq), (ClientId(j as u64 % 7), j as u64 / 7 + 1));
            let name = model.class_name(x.class);
            let (kind, keys) = match x.op {
                ListOp::Contains { shard, value } => {
                    assert!((0..100).contains(&value));
                    assert_eq!(name, format!("R{}", shard + 1));
                    (0, (vec![u64::from(shard)], vec![]))
                }
                ListOp::Add { shard, .. } => {
                    assert_eq!(name, format!("W{}", shard + 1));
                    (1, (vec![], vec![u64::from(shard)]))
                }
                ListOp::ContainsAll { .. } => {
                    assert_eq!(name, "Rg");
                    (2, ((0..4).collect(), vec![]))
                }
                ListOp::AddAll { .. } => {
                    assert_eq!(name, "Wg");
                    (3, (vec![], (0..4).collect()))
                }
            };
            counts[kind] += 1;
            assert_eq!((x.reads.to_vec(), x.writes.to_vec()), keys);
        }
        // Uniform spread: exactly 40% conflicting.
        assert_eq!(counts[0], 3_000);
        assert!((counts[1] as f64 - 1_500.0).abs() < 120.0, "{counts:?}");
        assert!((counts[3] as f64 - 200.0).abs() < 60.0, "{counts:?}");
    }

    #[test]
    fn class_models_cover_every_conflict_of_generated_workloads() {
        let mixes = [
            (ListModel::ReadersWriters, "30-10-50"),
            (ListModel::ShardedSnapshot, "25-5-0"),
            (ListModel::ShardedSnapshot, "50-20-0"),
            (ListModel::ShardedGlobal, "25-5-25"),
            (ListModel::ShardedGlobal, "10-60-90"),
        ];
        for (model, mix) in mixes {
            for shards in [1, 2, 3, 8] {
                for spread in [Spread::Uniform, Spread::Exponential] {
                    let c = WorkloadConfig { skew: 0.5, ..cfg(shards, mix, spread, shards as u64) };
                    let cmds = generate(model, &c, 10).unwrap();
                    class_model(model, shards).check_commands(&cmds).unwrap_or_else(|e| panic!("{model} {mix}: {e}"));
                }
            }
        }
    }

    #[test]
    fn a_model_missing_a_conflict_is_caught() {
        let cmds = generate(ListModel::ShardedGlobal, &cfg(2, "25-5-25", Spread::Uniform, 1), 10).unwrap();
        // Fig. 1(c) without `Wg-R1`: global writes and local reads of shard 1
        // do conflict, on key 0.
        let mut b = ClassModel::builder("wrong");
        for c in ["R1", "R2", "W1", "W2", "Rg", "Wg"] {
            b = b.class(c);
        }
        let wrong = b
            .conflict("R1", "W1")
            .conflict("R2", "W2")
            .conflict("W1", "W1")
            .conflict("W2", "W2")
            .conflict("Rg", "W1")
            .conflict("Rg", "W2")
            .conflict("Wg", "Wg")
            .conflict("Wg", "R2")
            .conflict("Wg", "W1")
            .conflict("Wg", "W2")
            .conflict("Wg", "Rg")
            .build()
            .unwrap();
        let e = wrong.check_commands(&cmds).unwrap_err();
        assert_eq!(e.key, 0);
        let mut classes = [e.first.class.as_str(), e.second.class.as_str()];
        classes.sort_unstable();
        assert_eq!(classes, ["R1", "Wg"]);
    }

    #[test]
    fn invalid_list_workloads_are_refused() {
        let ok = cfg(2, "25-5-0", Spread::Uniform, 1);
        let e =
            generate(ListModel::ShardedSnapshot, &WorkloadConfig { mix: "25-5-25".parse().unwrap(), ..ok.clone() }, 10)
                .unwrap_err();
        assert_eq!(e, WorkloadError::NoGlobalWrites { model: "sharded-snapshot", global_write_pct: 25.0 });
        assert!(e.to_string().contains("γ must be 0"), "{e}");
        // γ without global operations writes nothing globally.
        let no_global = Mix { local_write_pct: 25.0, global_pct: 0.0, global_write_pct: 25.0 };
        assert!(generate(ListModel::ShardedSnapshot, &WorkloadConfig { mix: no_global, ..ok.clone() }, 10).is_ok());
        let e = generate(ListModel::ShardedGlobal, &ok, 0).unwrap_err();
        assert_eq!(e.to_string(), format!("list size must be in 1..={LIST_SIZE_MAX}, got 0"));
        assert!(generate(ListModel::ShardedGlobal, &WorkloadConfig { shards: 0, ..ok }, 10).is_err());
    }

    #[test]
    fn concurrent_readers_and_disjoint_writers_agree_with_sequential() {
        // Shard-disjoint writers on two threads, then compare with a
        // sequential run: the locks keep the service sound under threads.
        let c = cfg(2, "100-0-0", Spread::Uniform, 3);
        let cmds = generate(ListModel::ShardedSnapshot, &c, 20).unwrap();
        let seq = ListService::new(2, 20);
        let want: Vec<_> = cmds.iter().map(|x| seq.execute(x)).collect();
        let par = ListService::new(2, 20);
        let got: Vec<Vec<(usize, ListReply)>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..2u32)
                .map(|shard| {
                    let (par, cmds) = (&par, &cmds);
                    s.spawn(move || {
                        cmds.iter()
                            .enumerate()
                            .filter(|(_, x)| matches!(x.op, ListOp::Add { shard: s, .. } if s == shard))
                            .map(|(i, x)| (i, par.execute(x)))
                            .collect()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (i, reply) in got.into_iter().flatten() {
            assert_eq!(reply, want[i]);
        }
        assert_eq!(par.digest(), seq.digest());
    }
}
