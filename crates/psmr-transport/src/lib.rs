//! # psmr-transport: how a replica talks to the world
//!
//! The IO of a replica around its core (`psmr-core`), and nothing that
//! decides: what comes in from sockets becomes the core's events, what
//! the core decides goes out.
//!
//! * [`peer`]: the links between replicas (ReplicaIO, 002 §V-B): blocking
//!   sockets authenticated by mutual TLS ([`tls`]), a sender thread per
//!   peer and a receiver thread per authenticated peer, every limit a
//!   hostile process could push on bounded.
//! * [`client`]: the client port (ClientIO, 002 §V-A): framed, versioned
//!   requests on a tokio runtime of its own, checked and queued for the
//!   protocol, answered through the [`router`]; [`local`]: the same port
//!   for a front end inside the replica (the Redis gateway), no socket.
//! * [`queue`] and [`msg`]: the queues between a replica's stages, bounded
//!   in items and bytes, and the messages they carry.
//! * [`life`] and [`view`]: what every thread of a replica shares — its
//!   life (running, stopping, failed), and what it knows of the cluster
//!   (who leads, the members) — as narrow handles rather than one shared
//!   state.
//! * [`metrics`]: the lock-free primitives the replica records with.
//!
//! In the guide: `docs/design.md` places this crate among the others;
//! `docs/design.md`: the stages a command passes through.

pub mod client;
pub mod clock;
pub mod life;
pub mod local;
pub mod metrics;
pub mod msg;
pub mod peer;
pub mod queue;
pub mod router;
pub mod tls;
pub mod view;
