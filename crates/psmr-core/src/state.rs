//! A snapshot of a replica's state: what the apply loop freezes, how it is
//! encoded, and how it becomes durable.
//!
//! A snapshot holds the index and term of the last entry it covers, the
//! membership at that index ([`Membership::encode`]), the service's
//! snapshot and the reply cache's. The apply loop only *freezes* the state
//! ([`Taken`]: execution pauses for the copy); encoding and writing happen
//! in [`persist`], on a side pool in a threaded replica, inline in the
//! simulator.

use crate::membership::Membership;
use crate::store::Store;
use psmr_model::wire::{Decoder, Encoder, WireError};
use psmr_model::Frozen;
use raft::prelude::{ConfState, Snapshot};
use std::time::Duration;

/// Encodes a snapshot's state.
pub fn encode(index: u64, term: u64, members: &[u8], service: &[u8], cache: &[u8]) -> Vec<u8> {
    let mut enc = Encoder::new();
    enc.u64(index).u64(term).bytes(members).bytes(service).bytes(cache);
    enc.finish()
}

/// What [`encode`] wrote, borrowed from the snapshot.
pub struct State<'a> {
    /// The index of the last entry the snapshot covers.
    pub index: u64,
    /// The membership at that index.
    pub members: &'a [u8],
    /// The service's snapshot.
    pub service: &'a [u8],
    /// The reply cache's.
    pub cache: &'a [u8],
}

/// Reads what [`encode`] wrote.
pub fn decode(bytes: &[u8]) -> Result<State<'_>, WireError> {
    let mut d = Decoder::new(bytes, "state snapshot");
    let (index, _term) = (d.u64()?, d.u64()?);
    let (members, service, cache) = (d.bytes()?, d.bytes()?, d.bytes()?);
    d.end()?;
    Ok(State { index, members, service, cache })
}

/// The membership a snapshot holds.
pub fn membership(snap: &Snapshot) -> Result<Membership, String> {
    let index = snap.get_metadata().index;
    let state = decode(&snap.data).map_err(|e| format!("the snapshot at {index}: {e}"))?;
    Membership::decode(state.members).map_err(|e| format!("the snapshot at {index}: {e}"))
}

/// What the apply loop took while execution paused.
pub struct Taken {
    /// The last entry the snapshot covers.
    pub index: u64,
    /// Its term.
    pub term: u64,
    /// The membership at `index`, encoded.
    pub members: Vec<u8>,
    /// Raft's view of it.
    pub conf: ConfState,
    /// The service's state, to be encoded.
    pub service: Frozen,
    /// The reply cache, to be encoded.
    pub cache: Frozen,
    /// How long execution paused for it.
    pub paused: Duration,
    /// How much of that went to waiting for what was submitted to finish.
    pub drained: Duration,
}

/// What became of a snapshot handed to [`persist`].
pub enum Persisted {
    /// Durable: keep it and compact the log behind it. Its size in bytes.
    Kept(Snapshot, usize),
    /// A snapshot as new is kept already.
    Stale,
}

/// Encodes `taken` and makes it durable in `store`. An error leaves the
/// log uncompacted (and the last snapshot kept); the replica goes on.
pub fn persist(taken: Taken, store: &impl Store) -> Result<Persisted, String> {
    let Taken { index, term, members, conf, service, cache, .. } = taken;
    let data = encode(index, term, &members, &service(), &cache());
    let bytes = data.len();
    let mut snapshot = Snapshot { data: data.into(), ..Default::default() };
    let meta = snapshot.mut_metadata();
    meta.index = index;
    meta.term = term;
    meta.set_conf_state(conf);
    match store.persist(&snapshot) {
        Ok(true) => Ok(Persisted::Kept(snapshot, bytes)),
        Ok(false) => Ok(Persisted::Stale),
        Err(e) => Err(format!("cannot write the snapshot at {index}, the log is not compacted: {e}")),
    }
}
