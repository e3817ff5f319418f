//! [`App`]: everything a replica needs from the service it replicates.
//!
//! A user's service is two small impls: [`Service`] (execute, snapshot,
//! restore; the digest has a default) and [`App`]: its codec
//! ([`SerdeCodec`] when the operations derive serde), its class model, and
//! the [`Access`] of each operation (class, keys read and keys written).
//! The replica and the tools are generic over `App`; the built-in
//! key-value store and list plug in exactly the same way.

use crate::command::{ClassId, ClientId, Command, KeySet};
use crate::wire::{OpCodec, WireError};
use crate::{ClassModel, Mapping, Service, SnapshotError};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::marker::PhantomData;

/// What one operation touches: the request class the early schedulers
/// route it by, and the keys the late schedulers find conflicts on. Both
/// must cover what `execute` really touches (the differential harness,
/// `psmr_sched::check`, finds where they do not).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Access {
    /// The request class.
    pub class: ClassId,
    /// Keys read and not written.
    pub reads: KeySet,
    /// Keys written (and perhaps read).
    pub writes: KeySet,
}

impl Access {
    /// An operation of `class` that reads `keys`.
    pub fn read(class: ClassId, keys: impl IntoIterator<Item = u64>) -> Self {
        Self { class, reads: keys.into_iter().collect(), writes: KeySet::new() }
    }

    /// An operation of `class` that writes `keys`.
    pub fn write(class: ClassId, keys: impl IntoIterator<Item = u64>) -> Self {
        Self { class, reads: KeySet::new(), writes: keys.into_iter().collect() }
    }
}

/// A service as psmr replicates it: besides executing, how its operations
/// travel and what each operation touches.
///
/// [`App::class_model`] is called once when a replica starts;
/// [`App::access`] once per command on every replica, so it must be
/// deterministic (a function of the operation alone).
pub trait App: Service {
    /// How operations and replies are encoded for the wire.
    type Codec: OpCodec<Op = Self::Op, Reply = Self::Reply> + Default;

    /// The request classes and which of them conflict.
    fn class_model(&self) -> ClassModel;

    /// What `op` touches; an error refuses the operation (the client is
    /// told why, identically by every replica).
    fn access(&self, op: &Self::Op) -> Result<Access, Refused>;

    /// The class-to-threads mapping for `workers` threads when the
    /// configuration asks for `default`; `None` lets the replica find one
    /// with the optimizer (every class equally frequent).
    fn default_mapping(&self, workers: usize) -> Option<Mapping> {
        let _ = workers;
        None
    }

    /// Whether `op` needs a client with the admin role (flushing the whole
    /// state, say): data users are refused it on the client and Redis
    /// ports. None by default.
    fn privileged(&self, op: &Self::Op) -> bool {
        let _ = op;
        false
    }

    /// The service's own housekeeping as of `now_ms` (ms since the Unix
    /// epoch): an operation that reclaims what nobody can see any more
    /// (keys past their deadline), found by looking at a bounded part of
    /// the state; `None` if there is nothing to reclaim there. The leader
    /// asks now and then and proposes the operation through the log as
    /// client 0 (reserved for the replica itself), so every replica
    /// executes it in the same place: what it reclaims must be decided
    /// when it executes, at its entry's time, so that executing it twice,
    /// or on a state that moved on, is harmless. None by default.
    fn sweep(&self, now_ms: u64) -> Option<Self::Op> {
        let _ = now_ms;
        None
    }

    /// The command for operation bytes `op` from a client: decoded with
    /// `codec`, then classified. An error for bytes that do not decode or
    /// an operation [`App::access`] refuses.
    fn command(
        &self,
        codec: &Self::Codec,
        client: ClientId,
        seq: u64,
        op: &[u8],
    ) -> Result<Command<Self::Op>, Refused> {
        let op = codec.decode_op(op)?;
        let Access { class, reads, writes } = self.access(&op)?;
        Ok(Command { client, seq, class, reads, writes, op, stamp: Default::default() })
    }
}

/// Why a service refuses an operation (see [`App::access`]). The text goes
/// to the client as it is; a Redis client sees it as the error, so a text
/// that starts with an upper-case code (`CROSSSLOT ...`) keeps it, and any
/// other gets `ERR` in front.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Refused(pub String);

impl From<WireError> for Refused {
    fn from(e: WireError) -> Self {
        Refused(e.to_string())
    }
}

/// A snapshot of `state` in postcard's format, for
/// [`Service::snapshot`] of services whose state (or a copy of it) derives
/// serde's `Serialize`.
pub fn encode_snapshot<T: Serialize>(state: &T) -> Vec<u8> {
    encode(state)
}

/// The state in a snapshot made by [`encode_snapshot`], for
/// [`Service::restore`].
pub fn decode_snapshot<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, SnapshotError> {
    decode(bytes, "snapshot").map_err(|e| SnapshotError::Malformed(e.to_string()))
}

/// An [`OpCodec`] for operations and replies that derive serde's
/// `Serialize` and `Deserialize`, in postcard's compact format.
///
/// Decoding allocates at most in proportion to the bytes it is given
/// (postcard reads from the slice and serde caps collection
/// preallocation), so hostile bytes cannot make it reserve more.
pub struct SerdeCodec<Op, Reply>(PhantomData<fn() -> (Op, Reply)>);

impl<Op, Reply> SerdeCodec<Op, Reply> {
    /// The codec.
    pub const fn new() -> Self {
        Self(PhantomData)
    }
}

impl<Op, Reply> Default for SerdeCodec<Op, Reply> {
    fn default() -> Self {
        Self::new()
    }
}

impl<Op, Reply> OpCodec for SerdeCodec<Op, Reply>
where
    Op: Serialize + DeserializeOwned + 'static,
    Reply: Serialize + DeserializeOwned + 'static,
{
    type Op = Op;
    type Reply = Reply;

    fn encode_op(&self, op: &Op) -> Vec<u8> {
        encode(op)
    }

    fn decode_op(&self, bytes: &[u8]) -> Result<Op, WireError> {
        decode(bytes, "operation")
    }

    fn encode_reply(&self, reply: &Reply) -> Vec<u8> {
        encode(reply)
    }

    fn decode_reply(&self, bytes: &[u8]) -> Result<Reply, WireError> {
        decode(bytes, "reply")
    }
}

fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    // Serializing plain data into a Vec fails only for types serde cannot
    // describe to postcard (e.g. maps with non-serializable keys), which is
    // a bug in the app's types, found at its first operation.
    postcard::to_allocvec(value).expect("postcard serializes every serde data type")
}

fn decode<T: DeserializeOwned>(bytes: &[u8], what: &'static str) -> Result<T, WireError> {
    let (value, rest) =
        postcard::take_from_bytes(bytes).map_err(|e| WireError::Malformed { what, why: e.to_string() })?;
    if !rest.is_empty() {
        return Err(WireError::Malformed { what, why: format!("{} bytes after the end", rest.len()) });
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde::Deserialize;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    enum Op {
        Put { key: String, value: Vec<u8> },
        Add(u64, i64),
    }

    #[test]
    fn serde_codec_round_trips_and_refuses_trailing_bytes() {
        let c = SerdeCodec::<Op, Option<i64>>::new();
        for op in [Op::Put { key: "k".into(), value: vec![1, 2, 3] }, Op::Add(7, -3)] {
            let mut bytes = c.encode_op(&op);
            assert_eq!(c.decode_op(&bytes).unwrap(), op);
            bytes.push(0);
            assert!(c.decode_op(&bytes).unwrap_err().to_string().contains("1 bytes after the end"));
        }
        assert_eq!(c.decode_reply(&c.encode_reply(&Some(-5))).unwrap(), Some(-5));
        assert!(c.decode_op(&[]).is_err());
        assert!(c.decode_op(&[9]).is_err());
    }

    proptest! {
        #[test]
        fn serde_codec_never_panics_on_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let c = SerdeCodec::<Op, Vec<String>>::new();
            let _ = c.decode_op(&bytes);
            let _ = c.decode_reply(&bytes);
        }
    }

    #[test]
    fn a_huge_declared_length_is_refused_without_reserving_it() {
        // Variant 0, then a string length of 2^63 as a varint.
        let mut bytes = vec![0u8];
        bytes.extend([0xff; 9]);
        bytes.push(0x01);
        assert!(SerdeCodec::<Op, ()>::new().decode_op(&bytes).is_err());
        let vec_len = [0xff, 0xff, 0xff, 0xff, 0x0f];
        assert!(SerdeCodec::<(), Vec<String>>::new().decode_reply(&vec_len).is_err());
    }
}
