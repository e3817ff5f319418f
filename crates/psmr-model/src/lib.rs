//! # psmr-model: the vocabulary every other psmr crate speaks
//!
//! This crate holds the data that flows through a psmr replica and the rules
//! that say which parts of it may run at the same time. It has no threads and
//! no I/O, so everything in it is cheap to test exhaustively.
//!
//! * [`Command`]: one client command: who sent it ([`ClientId`] and sequence
//!   number), which class it belongs to ([`ClassId`]), the keys it reads and
//!   writes, and the service operation itself.
//! * [`Batch`]: commands in log order plus a [`BatchSummary`] of their keys,
//!   exact (sorted key lists) and approximate (one-hash [`KeyBitmap`]s), so
//!   that the late schedulers can decide whether two batches conflict with
//!   one comparison. Bitmaps have false positives but never false negatives.
//! * [`ClassModel`]: request classes and the conflicts between them
//!   (Def. 2 of "Early Scheduling in Parallel SMR"), with a checker that finds
//!   command conflicts a class model forgot (Def. 3).
//! * [`Mapping`]: the class-to-threads mapping of the early scheduler
//!   (Def. 4), with a validator for rules R.1-R.5 that names the rule broken.
//! * [`Service`]: a deterministic state machine whose independent commands
//!   may execute at the same time, plus snapshots ([`snapshot`]: streamed,
//!   whatever the state's size) and a state [`Digest`].
//! * [`App`]: what a replica needs from a service besides executing: its
//!   class model, the [`Access`] (class, keys) of each operation, and the
//!   codec of its operations ([`SerdeCodec`] for serde types).
//! * [`wire`]: the framed, versioned wire format replicas and clients
//!   share, and the [`wire::OpCodec`] that puts a service's operations on it;
//!   [`ratelog`], the rate-limited warnings of everything that reads it
//!   from the network.
//!
//! Conflicts are defined once, on keys: two commands conflict when one
//! writes a key the other reads or writes. Everything else (class models,
//! batch bitmaps, the schedulers' dependency graphs) is a conservative
//! approximation of that relation and is tested against it.
//!
//! In the guide: `docs/design.md` places this crate among the others;
//! `docs/design.md`: the path of a command and the glossary.

mod app;
mod batch;
mod bitmap;
mod class;
mod command;
mod digest;
mod mapping;
pub mod ratelog;
mod service;
pub mod snapshot;
pub mod wire;

pub use app::{decode_snapshot, encode_snapshot, Access, App, Refused, SerdeCodec};
pub use batch::{sorted_intersect, Batch, BatchSummary, BITMAP_BITS_DEFAULT, BITMAP_BITS_MAX};
pub use bitmap::KeyBitmap;
pub use class::{ClassModel, ClassModelBuilder, ClassModelError, CommandRef, MissedConflict};
pub use command::{ClassId, ClientId, Command, Key, KeySet, Stamp, KEY_ALL};
pub use digest::{Digest, StableHasher, UnorderedDigest};
pub use mapping::{ClassMapping, Mapping, MappingError, Mode, WORKERS_MAX};
pub use service::Service;
pub use snapshot::{Frozen, FrozenDigest, SnapshotError};
