//! # psmr-storage: where a replica keeps its log
//!
//! The production [`Store`](psmr_core::store::Store)s of `psmr-core`: the raft log and hard state
//! on disk with raft-engine (TiKV's log store for raft-rs), the latest
//! snapshot in a checksummed file beside it and a sync record that tells
//! a torn tail from damage ([`disk`], [`synced`]); or in memory
//! ([`psmr_core::store::MemStore`], the papers' crash-stop model). A
//! replica picks one by its configuration ([`Log`]).
//!
//! In the guide: `docs/design.md` places this crate among the others;
//! `docs/cluster.md`: storage, snapshots and repair.

pub mod disk;
mod log;
pub(crate) mod private;
mod purge;
mod restore;
pub(crate) mod snapfiles;
pub mod synced;

pub use disk::{DiskError, DiskOptions, DiskStore, RepairReport};
pub use log::{Log, SyncTimer};
pub use snapfiles::DiskFile;
