//! The Redis protocol, so that psmr replicas can serve real Redis clients
//! (`redis-cli`, `redis-benchmark`, the `redis` crate).
//!
//! This crate is the codec (bytes in, [`Request`]s out; [`Reply`]s in, bytes
//! out) and the [`Commands`] trait through which a service maps Redis
//! commands onto its operations. Sockets and the `HELLO` handshake that
//! picks a [`Version`] belong to the caller.
//!
//! # Hostile input
//!
//! Everything a client sends is treated as hostile. [`Limits`] bounds what a
//! request may *declare*, and a declaration over a bound fails at once, before
//! its data arrives; memory grows with the bytes actually received, never with
//! a declared count. A [`ProtocolError`] displays the message Redis itself
//! sends (two cases Redis has no message for get psmr's); like Redis, the
//! caller replies with it and closes the connection, since the stream cannot
//! be resynchronised.
//!
//! # Cost
//!
//! [`RequestParser`] remembers its progress between calls, so feeding a
//! request in pieces costs time linear in its size in total: a call looks
//! only at bytes it has not seen, and while a declared bulk is still short
//! it costs O(1). [`parse_request`] is stateless and re-scans the buffer from
//! its start, O(buffered bytes) per call; it suits complete buffers and tools.
//!
//! # Why not `redis-protocol`
//!
//! The `redis-protocol` crate decodes general frames statelessly: it bounds no
//! declared length (`$1099511627776` just waits for more bytes), recurses into
//! nested arrays without a depth limit, re-scans from the buffer's start on
//! every call and has no inline commands, so request parsing is written here.
//!
//! In the guide: `docs/design.md` places this crate among the others;
//! `docs/redis.md`: the Redis port.

mod commands;
mod inline;
mod reply;
mod request;

pub use commands::{unknown_command, wrong_arity, Commands};
pub use reply::{Reply, Version};
pub use request::{encode_request, parse_integer, parse_request, Limits, ProtocolError, Request, RequestParser};
