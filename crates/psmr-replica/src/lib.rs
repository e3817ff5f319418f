//! # psmr-replica: one replica of a psmr cluster, on threads
//!
//! The threaded runtime of a replica: it runs the replica's core
//! (`psmr-core`: the protocol and the apply loop, which decide everything
//! without IO) on threads, with real sockets, a real clock and a store on
//! disk or in memory (`psmr-storage`). The threads follow the staged
//! architecture of 002 §V, stages joined by queues bounded in items, and
//! those that carry log entries in bytes too (`psmr_transport::queue`);
//! the messages between them live in `psmr_transport::msg`:
//!
//! ```text
//! clients ─▶ ClientIO (tokio, N threads) ─▶ protocol thread ─▶ service manager ─▶ scheduler workers
//!               ▲                                ▲      │                                     │
//!               └──────── replies (router) ◀─────┼──────┼─────────────────────────────────────┘
//!                         ReplicaIO receivers ───┘      └▶ ReplicaIO senders (one per peer)
//! ```
//!
//! * ClientIO (`psmr_transport::client`): framed, versioned client
//!   protocol ([`psmr_model::wire`]); a follower *redirects* clients to the
//!   leader (it does not forward: a redirect costs one round trip once per
//!   leader change, forwarding would cost a hop on every request).
//! * The protocol thread drives `psmr_core::protocol::Protocol`: batching,
//!   raft, reads without the log, membership changes; every peer message
//!   passes the guard first.
//! * ReplicaIO (`psmr_transport::peer`): blocking sockets authenticated by
//!   mutual TLS, a sender thread per peer and a receiver thread per
//!   authenticated peer (handshakes in a bounded pool); never blocks the
//!   protocol thread.
//! * The Redis port (`psmr-gateway`), if the application speaks Redis: a
//!   client of the cluster in the replica's process.
//! * The service manager thread drives `psmr_core::apply::Applier`: the
//!   reply cache, the execution scheduler, snapshots; a side pool of one
//!   psmr-rt worker encodes and writes the snapshots, so execution pauses
//!   only to copy the state.
//!
//! The deterministic simulator (`psmr-sim`) runs the same core on a
//! simulated clock, network and disk.
//!
//! Each stage holds the narrow handles it needs (`handles` and the
//! transport's life and cluster view), never one shared state; a running
//! [`Replica`] answers what it is (leader, term, applied index, counters)
//! through its accessors.
//!
//! Fail-stop: a panic in any thread of a replica (a stage, a ClientIO task,
//! an execution worker) stops the whole replica with the reason
//! ([`Replica::wait`] returns it); it never runs on without that thread.
//!
//! In the guide: `docs/design.md` places this crate among the others;
//! `docs/cluster.md`: running replicas; docs/config.md for every configuration key.

mod control;
mod error;
mod gateway;
mod handles;
pub mod local;
mod manager;
pub mod metrics;
mod protocol;
mod replica;
mod snapshot;
mod stages;
mod start;
mod sweeper;

pub use error::ReplicaError;
pub use handles::Stats;
pub use local::{LocalCluster, LocalClusterBuilder};
pub use psmr_core::config::{self, Config, ConfigError, Member, Storage};
pub use psmr_core::membership;
pub use psmr_model::App;
pub use psmr_transport::tls;
pub use replica::{Replica, Stopper};
pub use start::ReplicaBuilder;
pub use start::MAPPING_TIME_LIMIT;
