//! # psmr-core: a replica's decisions, without IO
//!
//! The part of psmr that decides what a replica does, as state machines
//! that take events and hand out effects. They own no thread, socket,
//! file or clock: a replica's threads turn IO into events and effects into
//! IO (`psmr-replica`), and the deterministic simulator drives the very
//! same code with a simulated network, clock and disk (`psmr-sim`). What
//! the simulator checks is what ships.
//!
//! Two machines, joined by the work the first hands the second:
//!
//! * [`protocol::Protocol`]: the raft node (raft-rs) and everything around
//!   it — every peer message through the [`guard`], batching requests into
//!   entries (its batcher), reads without the log (raft's ReadIndex), membership
//!   changes ([`membership`], asked for by clients), readies stored through
//!   a [`store::Store`] before what they promise leaves.
//! * [`apply::Applier`]: the apply loop — entries in log order through the
//!   reply cache (each client command executes once) to an
//!   execution scheduler (`psmr-sched`), snapshots frozen and handed out
//!   to be written ([`state`]).
//!
//! ## The usage loop
//!
//! A driver of the protocol repeats, for as long as the replica runs:
//!
//! ```text
//! wait for an event, or until protocol.due(now) or the next tick
//! protocol.step(msg, io)        for each peer message that came
//! protocol.snapshot_msg(from, m, now, io)   for each message of the snapshot lane
//! protocol.request(r)           for each client request, while protocol.has_room()
//! protocol.tick()               when a tick is due
//! protocol.set_applied(i)       with what the apply loop applied
//! protocol.turn(now, io)        proposes, starts reads, handles readies, serves reads
//! publish protocol.view()       leader, term, role, commit
//! ```
//!
//! and implements [`protocol::ProtocolIo`]: `send` a raft message to a peer,
//! `send_snapshot` a message of a snapshot transfer on the peer's snapshot
//! lane ([`transfer`]: a snapshot's file goes in chunks, resumable),
//! `apply` work (committed entries, a snapshot from the leader, reads) to
//! the apply loop in order, `tell` a client where the leader is, follow a
//! `membership` change with its links. A driver of the apply loop feeds it
//! that work in the same order ([`apply::Applier::entries`],
//! [`apply::Applier::restore`], [`apply::Applier::reads`]) and implements
//! [`apply::ApplyIo`]: report the applied index back to the protocol,
//! write the snapshots it freezes ([`state::persist`], then
//! [`protocol::Protocol::snapshot_persisted`]).
//!
//! Snapshots are files of checksummed pieces ([`snapfile`]), written and
//! read as streams: neither a replica nor a transfer ever holds the
//! encoded state whole.
//!
//! Requests come in already checked and encoded ([`request`],
//! [`entry`]); answers to clients leave through [`apply::Replies`], from
//! the execution workers' threads.
//!
//! In the guide: `docs/design.md` places this crate among the others;
//! `docs/cluster.md`: what a replica does: batching, reads, snapshots, membership; docs/config.md for every key.

pub mod apply;
mod batcher;
pub mod bug;
mod cache;
pub mod config;
pub mod entry;
pub mod guard;
pub mod membership;
pub mod protocol;
mod reads;
pub mod request;
pub mod snapfile;
pub mod state;
pub mod store;
pub mod transfer;

pub use cache::Limits as CacheLimits;
pub use config::{Config, ConfigError, Member};
pub use entry::decode_proto;
