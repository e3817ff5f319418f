//! Where replies go.

use crossbeam::utils::CachePadded;
use parking_lot::Mutex;
use psmr_model::{ClientId, Digest, StableHasher, UnorderedDigest};
use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};

/// The reply to one command, addressed by the command's client and sequence
/// number so that a replica can route it to the connection it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply<R> {
    /// Client of the command.
    pub client: ClientId,
    /// Sequence number of the command.
    pub seq: u64,
    /// What the service returned.
    pub value: R,
}

/// Receives replies from the workers. `worker` is the id of the calling
/// worker (0 for `sequential`), so a sink can keep per-worker state that no
/// other thread writes.
pub trait ReplySink<R>: Send + Sync {
    /// Takes one reply. Called from worker threads; must not block for long.
    fn deliver(&self, worker: usize, reply: Reply<R>);

    /// Execution failed (a service or a worker panicked): the state is no
    /// longer trusted. Called once, at once, from the failing thread, so
    /// that an owner can stop instead of waiting for replies that will
    /// never come; the error is also returned by the scheduler's next call.
    fn failed(&self, _error: &crate::SchedError) {}
}

/// Drops every reply.
#[derive(Debug, Default, Clone, Copy)]
pub struct NullSink;

impl<R> ReplySink<R> for NullSink {
    fn deliver(&self, _worker: usize, _reply: Reply<R>) {}
}

/// Folds replies into an order-independent digest, one accumulator per
/// worker (cache-padded, so workers never share a line).
///
/// Two runs produce the same reply digest exactly when they produced the
/// same (client, seq, reply) multiset, whichever worker replied.
#[derive(Debug)]
pub struct DigestSink {
    parts: Vec<CachePadded<Mutex<UnorderedDigest>>>,
}

impl DigestSink {
    /// A sink for workers `0..workers` (at least one).
    pub fn new(workers: usize) -> Self {
        Self { parts: (0..workers.max(1)).map(|_| CachePadded::new(Mutex::new(UnorderedDigest::new()))).collect() }
    }

    /// Digest of every reply delivered so far, and how many there were.
    pub fn digest(&self) -> (Digest, u64) {
        let mut all = UnorderedDigest::new();
        for p in &self.parts {
            all.merge(&p.lock());
        }
        (all.finish(), all.count())
    }
}

impl<R: Hash> ReplySink<R> for DigestSink {
    fn deliver(&self, worker: usize, reply: Reply<R>) {
        let mut h = StableHasher::new();
        reply.client.0.hash(&mut h);
        reply.seq.hash(&mut h);
        reply.value.hash(&mut h);
        self.parts[worker % self.parts.len()].lock().add_hash(h.finish());
    }
}

/// Keeps every reply, for tests and tools that compare them one by one.
#[derive(Debug)]
pub struct CollectSink<R> {
    parts: Vec<CachePadded<Mutex<Vec<Reply<R>>>>>,
}

impl<R> CollectSink<R> {
    /// A sink for workers `0..workers` (at least one).
    pub fn new(workers: usize) -> Self {
        Self { parts: (0..workers.max(1)).map(|_| CachePadded::new(Mutex::new(Vec::new()))).collect() }
    }

    /// Every reply delivered so far, keyed by (client, seq). A duplicate
    /// reply for the same command is returned in the second map.
    #[allow(clippy::type_complexity)]
    pub fn take(&self) -> (HashMap<(ClientId, u64), R>, Vec<Reply<R>>) {
        let mut map = HashMap::new();
        let mut dups = Vec::new();
        for p in &self.parts {
            for r in p.lock().drain(..) {
                match map.entry((r.client, r.seq)) {
                    Entry::Occupied(_) => dups.push(r),
                    Entry::Vacant(v) => {
                        v.insert(r.value);
                    }
                }
            }
        }
        (map, dups)
    }
}

impl<R: Send> ReplySink<R> for CollectSink<R> {
    fn deliver(&self, worker: usize, reply: Reply<R>) {
        self.parts[worker % self.parts.len()].lock().push(reply);
    }
}
