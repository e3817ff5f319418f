//! The reply cache: each (client, sequence number) executes once, however
//! often the client sends it and whichever replica led when it did.
//!
//! It is replicated state: the service manager consults it in log order,
//! and it travels in snapshots. Workers fill in outcomes as commands
//! execute.
//!
//! Only writes are remembered, and the reads that a later write of the
//! same client follows in the same log entry. Any other read changes
//! nothing and nothing of its client came after it, so executing it again
//! when retried is as good as answering it from memory, and its reply
//! (possibly a large value) is never kept. Should such a read come back
//! after a later write of its client after all (a client that pipelines
//! requests), it is refused rather than shown that write.
//!
//! Bounds, in items and in bytes:
//! * per client the `window` highest write sequence numbers admitted (a
//!   command at or below the highest one forgotten is *stale* and refused,
//!   never executed again);
//! * at most `clients` clients and `seqs_max` sequence numbers in all; the
//!   client whose last command is oldest in the log is forgotten first (a
//!   forgotten client starts afresh: only a client silent for that long
//!   could see a very old retry execute twice);
//! * outcomes: `bytes_per_client` per client and `bytes_max` in all. An
//!   outcome over budget is *dropped*, oldest first (the least recently
//!   active client's first when the total is exceeded): its sequence number
//!   stays, so the command is still never executed again, and a retry
//!   learns that it executed but that its reply was not kept.
//!
//! Whether a command executes depends only on the log: admission, the
//! window and the client and sequence-number bounds are decided in log
//! order by one thread. Which outcomes are dropped depends on when workers
//! fill them in, so a retry of a command whose reply was large may get the
//! reply from one replica and the "not kept" answer from another; the
//! state is the same on both.
//!
//! Clients are spread over shards by id so that workers filling replies for
//! different clients rarely meet on a lock; each shard holds its share of
//! every bound, which keeps eviction a function of the log alone.

use parking_lot::Mutex;
use psmr_model::wire::{Decoder, Encoder, Outcome, WireError};
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

const SHARDS: usize = 16;

/// What to do with a command the log delivers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Admit {
    /// Never seen (or a read): execute it (a write is now recorded as
    /// pending).
    New,
    /// Executed already: here is its outcome.
    Done(Outcome),
    /// Admitted earlier and still executing: its reply is on its way.
    Pending,
    /// Older than anything remembered for this client: refuse it.
    Stale,
    /// A read not remembered, retried after a later write of its client
    /// was admitted: executing it now would show it that write. Refuse it
    /// (a read has no effect, so the client may simply issue it again).
    Superseded,
}

/// Bounds of the reply cache.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Write sequence numbers remembered per client.
    pub window: u64,
    /// Clients remembered.
    pub clients: usize,
    /// Sequence numbers remembered over all clients.
    pub seqs_max: usize,
    /// Bytes of outcomes kept per client.
    pub bytes_per_client: usize,
    /// Bytes of outcomes kept in all.
    pub bytes_max: usize,
}

impl Limits {
    /// The limits a replica configuration sets.
    pub fn of(config: &crate::Config) -> Self {
        Self {
            window: config.reply_window,
            clients: config.reply_clients,
            seqs_max: config.reply_seqs_max,
            bytes_per_client: config.reply_bytes_per_client,
            bytes_max: config.reply_bytes_max,
        }
    }
}

/// A remembered write.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Slot {
    /// Admitted, not executed yet.
    Pending,
    /// Executed, with its outcome.
    Done(Outcome),
    /// Executed; its outcome (this many bytes) was dropped to bound memory.
    Dropped(u64),
}

/// A client's remembered sequence numbers, in order. Clients number their
/// commands upwards, so nearly every insertion is at the end and nearly
/// every removal at the front: a sorted ring, searched from its newest end
/// ([`Seqs::find`]), does both in constant time and keeps the window in one
/// block of memory.
#[derive(Clone, Default, Debug)]
struct Seqs(VecDeque<(u64, Slot)>);

impl Seqs {
    /// Where `seq` is (`Ok`), or would be inserted (`Err`). Most often
    /// asked for: a newer number (the next command), or one of the newest
    /// (a write in flight, whose reply fills its slot). So the search
    /// gallops from the back, probing 1, 2, 4, ... entries back, and
    /// bisects only the span it ends in: a few probes on the cache lines
    /// last written, where a bisection of the whole window (1 024 writes
    /// by default) would miss the cache at each of its ten probes.
    fn find(&self, seq: u64) -> Result<usize, usize> {
        let len = self.0.len();
        let (mut lo, mut hi, mut step) = (0, len, 1);
        while step <= len {
            let probe = len - step;
            if self.0[probe].0 <= seq {
                lo = probe;
                break;
            }
            hi = probe;
            step *= 2;
        }
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match self.0[mid].0.cmp(&seq) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Equal => return Ok(mid),
                std::cmp::Ordering::Greater => hi = mid,
            }
        }
        Err(lo)
    }

    fn get(&self, seq: u64) -> Option<&Slot> {
        self.find(seq).ok().map(|i| &self.0[i].1)
    }

    fn get_mut(&mut self, seq: u64) -> Option<&mut Slot> {
        self.find(seq).ok().map(|i| &mut self.0[i].1)
    }

    /// Inserts or replaces `seq`'s slot.
    fn insert(&mut self, seq: u64, slot: Slot) {
        match self.find(seq) {
            Ok(i) => self.0[i].1 = slot,
            Err(i) => self.0.insert(i, (seq, slot)),
        }
    }

    /// Some sequence number above `seq` is remembered.
    fn any_after(&self, seq: u64) -> bool {
        self.0.back().is_some_and(|&(last, _)| last > seq)
    }

    fn pop_first(&mut self) -> Option<(u64, Slot)> {
        self.0.pop_front()
    }

    fn len(&self) -> usize {
        self.0.len()
    }

    fn iter(&self) -> impl Iterator<Item = (u64, &Slot)> {
        self.0.iter().map(|(q, s)| (*q, s))
    }

    fn slots_mut(&mut self) -> impl Iterator<Item = &mut Slot> {
        self.0.iter_mut().map(|(_, s)| s)
    }
}

#[derive(Clone, Default, Debug)]
struct Client {
    seqs: Seqs,
    /// Highest sequence number forgotten (0: none).
    floor: u64,
    /// Log index of the client's latest admitted command.
    last_index: u64,
    /// Bytes of the outcomes in `seqs`.
    bytes: usize,
}

impl Client {
    /// Drops outcomes, oldest first, until at most `budget` bytes remain;
    /// returns the bytes freed.
    fn shed(&mut self, budget: usize) -> usize {
        let mut freed = 0;
        for slot in self.seqs.slots_mut() {
            if self.bytes <= budget {
                break;
            }
            if let Slot::Done(o) = slot {
                let n = o.payload_len();
                *slot = Slot::Dropped(n as u64);
                self.bytes -= n;
                freed += n;
            }
        }
        freed
    }
}

#[derive(Default, Debug)]
struct Shard {
    /// Shared with the snapshot being written, if any: the first change
    /// to a client while it is written copies that client alone, so that
    /// [`ReplyCache::freeze`] pauses execution only to count references.
    clients: HashMap<u64, Arc<Client>>,
    /// `(last_index, client)`, oldest first.
    by_age: BTreeSet<(u64, u64)>,
    /// Sequence numbers remembered.
    seqs: usize,
    /// Bytes of outcomes kept.
    bytes: usize,
}

impl Shard {
    /// Forgets the least recently active client if its last command came
    /// before log index `before`; false if there is none such. A client of
    /// the entry being admitted is never forgotten: its pending commands
    /// would execute again on a retry.
    fn forget_oldest(&mut self, before: u64) -> bool {
        match self.by_age.first() {
            Some(&(last, old)) if last < before => {
                self.by_age.remove(&(last, old));
                if let Some(c) = self.clients.remove(&old) {
                    self.seqs -= c.seqs.len();
                    self.bytes -= c.bytes;
                }
                true
            }
            _ => false,
        }
    }

    fn touch(&mut self, client: u64, index: u64) {
        if let Some(c) = self.clients.get_mut(&client) {
            if c.last_index == index {
                // The client's earlier command in the same entry did it.
                return;
            }
            self.by_age.remove(&(c.last_index, client));
            Arc::make_mut(c).last_index = index;
            self.by_age.insert((index, client));
        }
    }
}

/// See the module documentation.
#[derive(Debug)]
pub struct ReplyCache {
    shards: Vec<Mutex<Shard>>,
    limits: Limits,
}

/// A frozen copy of the reply cache that encodes when called: the cache is
/// bounded in bytes (`reply_bytes_max`), so its encoding is one vector.
pub type FrozenCache = Box<dyn FnOnce() -> Vec<u8> + Send>;

impl ReplyCache {
    /// Its bounds.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// A cache within `limits` (each shard holds its share of the totals).
    pub fn new(limits: Limits) -> Self {
        let share = |n: usize| n.div_ceil(SHARDS).max(1);
        let limits = Limits {
            window: limits.window.max(1),
            clients: share(limits.clients),
            seqs_max: share(limits.seqs_max),
            bytes_per_client: limits.bytes_per_client,
            bytes_max: limits.bytes_max / SHARDS,
        };
        Self { shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(), limits }
    }

    fn shard_of(client: u64) -> usize {
        // Client ids are random or chosen by users: mix before picking.
        (client.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 60) as usize % SHARDS
    }

    fn shard(&self, client: u64) -> &Mutex<Shard> {
        &self.shards[Self::shard_of(client)]
    }

    /// Decides about command `seq` of `client`, delivered at log `index`;
    /// `remember` is false for a read whose outcome need not be kept (see
    /// the module documentation). Called in log order by one thread.
    pub fn admit(&self, client: u64, seq: u64, index: u64, remember: bool) -> Admit {
        let mut shard = self.shard(client).lock();
        let shard = &mut *shard;
        shard.touch(client, index);
        if let Some(c) = shard.clients.get_mut(&client) {
            match c.seqs.get(seq) {
                Some(Slot::Pending) => return Admit::Pending,
                Some(Slot::Done(o)) => return Admit::Done(o.clone()),
                Some(Slot::Dropped(n)) => {
                    return Admit::Done(Outcome::Rejected(format!(
                        "already executed; its reply ({n} bytes) was not kept (reply cache byte budget)"
                    )))
                }
                None if seq <= c.floor => return Admit::Stale,
                None if !remember && c.seqs.any_after(seq) => return Admit::Superseded,
                None if !remember => return Admit::New,
                None => {}
            }
            let c = Arc::make_mut(c);
            c.seqs.insert(seq, Slot::Pending);
            shard.seqs += 1;
            while c.seqs.len() as u64 > self.limits.window {
                let (old, slot) = c.seqs.pop_first().expect("more than the window");
                if let Slot::Done(o) = slot {
                    c.bytes -= o.payload_len();
                    shard.bytes -= o.payload_len();
                }
                shard.seqs -= 1;
                c.floor = c.floor.max(old);
            }
        } else {
            if !remember {
                return Admit::New;
            }
            if shard.clients.len() >= self.limits.clients {
                shard.forget_oldest(index);
            }
            let mut c = Client { last_index: index, ..Client::default() };
            c.seqs.insert(seq, Slot::Pending);
            shard.clients.insert(client, Arc::new(c));
            shard.by_age.insert((index, client));
            shard.seqs += 1;
        }
        while shard.seqs > self.limits.seqs_max && shard.forget_oldest(index) {}
        Admit::New
    }

    /// Records the outcome of an admitted write (from any thread); outcomes
    /// of reads are not kept (nor copied).
    #[cfg(test)]
    pub fn fill(&self, client: u64, seq: u64, outcome: &Outcome) {
        self.fill_with(client, seq, || outcome.clone());
    }

    /// Records the outcome of an admitted write (from any thread), made by
    /// `outcome` only if it is kept: `outcome` is not called for a command
    /// the cache does not remember (a read).
    pub fn fill_with(&self, client: u64, seq: u64, outcome: impl FnOnce() -> Outcome) {
        let mut shard = self.shard(client).lock();
        let shard = &mut *shard;
        let Some(c) = shard.clients.get_mut(&client) else { return };
        // A client shared with a snapshot is copied only for a slot it
        // holds; one not shared (the usual case) is searched once.
        if Arc::get_mut(c).is_none() && c.seqs.get(seq).is_none() {
            return;
        }
        let c = Arc::make_mut(c);
        let Some(slot) = c.seqs.get_mut(seq) else { return };
        let outcome = outcome();
        let n = outcome.payload_len();
        *slot = Slot::Done(outcome);
        c.bytes += n;
        shard.bytes += n;
        if c.bytes > self.limits.bytes_per_client {
            shard.bytes -= c.shed(self.limits.bytes_per_client);
        }
        if shard.bytes > self.limits.bytes_max {
            self.shed_shard(shard);
        }
    }

    /// Drops outcomes of the least recently active clients first until the
    /// shard is within its byte budget.
    fn shed_shard(&self, shard: &mut Shard) {
        let oldest: Vec<u64> = shard.by_age.iter().map(|&(_, id)| id).collect();
        for id in oldest {
            if shard.bytes <= self.limits.bytes_max {
                break;
            }
            if let Some(c) = shard.clients.get_mut(&id) {
                let excess = shard.bytes - self.limits.bytes_max;
                let budget = c.bytes.saturating_sub(excess);
                shard.bytes -= Arc::make_mut(c).shed(budget);
            }
        }
    }

    /// Clients remembered.
    pub fn clients(&self) -> usize {
        self.shards.iter().map(|s| s.lock().clients.len()).sum()
    }

    /// Sequence numbers remembered and bytes of outcomes kept.
    pub fn size(&self) -> (usize, usize) {
        self.shards.iter().map(|s| s.lock()).fold((0, 0), |(n, b), s| (n + s.seqs, b + s.bytes))
    }

    /// The cache as bytes, in a deterministic order. Every admitted command
    /// must have its outcome (the caller waits for execution first).
    pub fn snapshot(&self) -> Vec<u8> {
        self.freeze()()
    }

    /// [`ReplyCache::snapshot`] in two steps: each client shared now
    /// (copied later by the first change to it), and encoded, in order of
    /// id, when the returned closure runs (off the execution path, see
    /// [`crate::state`]).
    pub fn freeze(&self) -> FrozenCache {
        let mut shared: Vec<(u64, Arc<Client>)> = Vec::new();
        for shard in &self.shards {
            shared.extend(shard.lock().clients.iter().map(|(&id, c)| (id, c.clone())));
        }
        Box::new(move || {
            shared.sort_unstable_by_key(|c| c.0);
            let mut e = Encoder::new();
            e.u32(shared.len() as u32);
            let mut out = e.finish();
            for (id, c) in shared {
                let mut e = Encoder::new();
                let seqs: Vec<_> = c.seqs.iter().filter(|(_, s)| **s != Slot::Pending).collect();
                e.u64(id).u64(c.floor).u64(c.last_index).u32(seqs.len() as u32);
                for (seq, slot) in seqs {
                    e.u64(seq);
                    match slot {
                        Slot::Done(o) => e.u8(0).outcome(o),
                        Slot::Dropped(n) => e.u8(1).u64(*n),
                        Slot::Pending => unreachable!("filtered out above"),
                    };
                }
                out.extend_from_slice(&e.finish());
            }
            out
        })
    }

    /// Replaces the contents with a snapshot's; on error nothing changes.
    #[cfg(test)]
    pub fn restore(&self, bytes: &[u8]) -> Result<(), WireError> {
        let decoded = Self::decode(bytes)?;
        self.install(decoded);
        Ok(())
    }

    /// Replaces the contents with what [`ReplyCache::decode`] read.
    pub fn install(&self, decoded: Decoded) {
        for (slot, fresh) in self.shards.iter().zip(decoded.0) {
            *slot.lock() = fresh;
        }
    }

    /// Reads a snapshot of the cache, to [`ReplyCache::install`] it later.
    pub fn decode(bytes: &[u8]) -> Result<Decoded, WireError> {
        let mut d = Decoder::new(bytes, "reply cache snapshot");
        let n = d.u32()? as usize;
        if n.saturating_mul(28) > bytes.len() {
            return Err(d.error(format!("{n} clients cannot fit in {} bytes", bytes.len())));
        }
        let mut shards: Vec<Shard> = (0..SHARDS).map(|_| Shard::default()).collect();
        for _ in 0..n {
            let (id, floor, last_index) = (d.u64()?, d.u64()?, d.u64()?);
            let k = d.count(usize::MAX, 9)?;
            let mut c = Client { floor, last_index, ..Client::default() };
            for _ in 0..k {
                let seq = d.u64()?;
                let slot = match d.u8()? {
                    0 => Slot::Done(d.outcome()?),
                    1 => Slot::Dropped(d.u64()?),
                    t => return Err(d.error(format!("unknown reply slot tag {t}"))),
                };
                if let Slot::Done(o) = &slot {
                    c.bytes += o.payload_len();
                }
                c.seqs.insert(seq, slot);
            }
            let shard = &mut shards[Self::shard_of(id)];
            shard.seqs += c.seqs.len();
            shard.bytes += c.bytes;
            shard.by_age.insert((last_index, id));
            shard.clients.insert(id, Arc::new(c));
        }
        d.end()?;
        Ok(Decoded(shards))
    }
}

/// A reply cache snapshot, decoded and not yet installed.
pub struct Decoded(Vec<Shard>);

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(window: u64, clients: usize) -> Limits {
        Limits { window, clients, seqs_max: 1 << 20, bytes_per_client: 1 << 20, bytes_max: 1 << 30 }
    }

    fn ok(n: usize) -> Outcome {
        Outcome::Ok(vec![7; n])
    }

    #[test]
    fn a_command_executes_once() {
        let c = ReplyCache::new(limits(4, 100));
        assert_eq!(c.admit(1, 1, 10, true), Admit::New);
        assert_eq!(c.admit(1, 1, 11, true), Admit::Pending, "a retry before the reply");
        c.fill(1, 1, &Outcome::Ok(vec![7]));
        assert_eq!(c.admit(1, 1, 12, true), Admit::Done(Outcome::Ok(vec![7])));
        assert_eq!(c.admit(2, 1, 13, true), Admit::New, "another client");
    }

    /// A frozen cache writes what it held when frozen, whatever was
    /// admitted, filled, shed or forgotten since; the clients changed
    /// since are copies, the others still shared.
    #[test]
    fn a_frozen_cache_encodes_what_it_held() {
        let c = ReplyCache::new(limits(2, 100));
        for client in 1..=40 {
            for seq in 1..=2 {
                c.admit(client, seq, client * 10 + seq, true);
                c.fill(client, seq, &ok(client as usize));
            }
        }
        let expected = c.snapshot();
        let frozen = c.freeze();
        for client in (1..=40).step_by(3) {
            c.admit(client, 3, 1_000 + client, true);
            c.fill(client, 3, &ok(9));
        }
        c.admit(99, 1, 2_000, true);
        let shard = c.shard(2).lock();
        assert_eq!(Arc::strong_count(&shard.clients[&2]), 2, "an unchanged client is shared");
        drop(shard);
        let shard = c.shard(1).lock();
        assert_eq!(Arc::strong_count(&shard.clients[&1]), 1, "a changed one is a copy");
        drop(shard);
        assert_eq!(frozen(), expected);
        assert_ne!(c.snapshot(), expected, "the cache itself moved on");
    }

    #[test]
    fn reads_are_kept_only_when_a_write_follows() {
        let c = ReplyCache::new(limits(4, 100));
        // 500 reads of a large value leave nothing behind.
        for seq in 1..=500 {
            assert_eq!(c.admit(1, seq, seq, false), Admit::New);
            c.fill(1, seq, &ok(1 << 20));
        }
        assert_eq!(c.size(), (0, 0));
        assert_eq!(c.clients(), 0);
        // A retried read executes again; a write is remembered.
        assert_eq!(c.admit(1, 3, 600, false), Admit::New);
        assert_eq!(c.admit(1, 501, 601, true), Admit::New);
        assert_eq!(c.admit(1, 501, 602, false), Admit::Pending, "the sequence number is a write's");
        // A read retried after a later write of its client is refused.
        assert_eq!(c.admit(1, 3, 603, false), Admit::Superseded);
        assert_eq!(c.admit(1, 502, 604, false), Admit::New, "a read after every write runs again");
    }

    #[test]
    fn old_sequence_numbers_are_forgotten_and_then_refused() {
        let c = ReplyCache::new(limits(2, 100));
        for seq in 1..=3 {
            assert_eq!(c.admit(1, seq, seq, true), Admit::New);
            c.fill(1, seq, &Outcome::Ok(vec![]));
        }
        assert_eq!(c.admit(1, 1, 9, true), Admit::Stale, "forgotten: never executed again");
        assert_eq!(c.admit(1, 1, 9, false), Admit::Stale, "reads below the floor too");
        assert_eq!(c.admit(1, 2, 9, true), Admit::Done(Outcome::Ok(vec![])));
        // Out of order but above the floor: fine.
        assert_eq!(c.admit(1, 5, 10, true), Admit::New);
        assert_eq!(c.admit(1, 4, 11, true), Admit::New);
    }

    #[test]
    fn the_least_recently_active_client_goes_first() {
        let c = ReplyCache::new(limits(4, 1)); // one client per shard
        assert_eq!(c.admit(1, 1, 1, true), Admit::New);
        // Find another client of the same shard.
        let other = (2..).find(|&id| ReplyCache::shard_of(id) == ReplyCache::shard_of(1)).unwrap();
        assert_eq!(c.admit(other, 1, 2, true), Admit::New);
        assert_eq!(c.clients(), 1);
        assert_eq!(c.admit(1, 1, 3, true), Admit::New, "client 1 was forgotten");
    }

    #[test]
    fn clients_of_the_entry_being_admitted_are_never_forgotten() {
        let mut l = limits(4, 1);
        l.seqs_max = 1;
        let c = ReplyCache::new(l);
        let other = (2..).find(|&id| ReplyCache::shard_of(id) == ReplyCache::shard_of(1)).unwrap();
        // Both in the same log entry: neither may be forgotten now.
        assert_eq!(c.admit(1, 1, 5, true), Admit::New);
        assert_eq!(c.admit(other, 1, 5, true), Admit::New);
        assert_eq!(c.admit(1, 1, 5, true), Admit::Pending);
        assert_eq!(c.admit(other, 1, 5, true), Admit::Pending);
        // The next entry may forget them.
        let third = (other + 1..).find(|&id| ReplyCache::shard_of(id) == ReplyCache::shard_of(1)).unwrap();
        assert_eq!(c.admit(third, 1, 6, true), Admit::New);
        assert_eq!(c.size().0, 1);
    }

    #[test]
    fn outcomes_over_the_byte_budget_are_dropped_but_never_executed_again() {
        let l = Limits { window: 100, clients: 100, seqs_max: 1000, bytes_per_client: 3000, bytes_max: 1 << 30 };
        let c = ReplyCache::new(l);
        for seq in 1..=5 {
            assert_eq!(c.admit(1, seq, seq, true), Admit::New);
            c.fill(1, seq, &ok(1000));
        }
        assert!(c.size().1 <= 3000, "{:?}", c.size());
        // The oldest went first; the newest are kept.
        assert!(matches!(c.admit(1, 1, 9, true), Admit::Done(Outcome::Rejected(m)) if m.contains("already executed")));
        assert_eq!(c.admit(1, 5, 9, true), Admit::Done(ok(1000)));
        // In total too: many clients, each under its own budget.
        let l =
            Limits { window: 100, clients: 10_000, seqs_max: 100_000, bytes_per_client: 1 << 20, bytes_max: 160_000 };
        let c = ReplyCache::new(l);
        for client in 1..=1000 {
            assert_eq!(c.admit(client, 1, client, true), Admit::New);
            c.fill(client, 1, &ok(1000));
        }
        assert!(c.size().1 <= 160_000, "{:?}", c.size());
        assert_eq!(c.size().0, 1000, "every sequence number is still remembered");
        assert_eq!(c.admit(1000, 1, 2000, true), Admit::Done(ok(1000)), "the most recent client keeps its reply");
    }

    #[test]
    fn snapshots_round_trip_and_bad_bytes_change_nothing() {
        let l = Limits { window: 8, clients: 100, seqs_max: 1000, bytes_per_client: 2, bytes_max: 1 << 20 };
        let c = ReplyCache::new(l);
        for client in 1..20 {
            for seq in 1..4 {
                c.admit(client, seq, client * 10 + seq, true);
                c.fill(
                    client,
                    seq,
                    &if seq == 2 { Outcome::Rejected("no".into()) } else { Outcome::Ok(vec![seq as u8]) },
                );
            }
        }
        let snap = c.snapshot();
        let d = ReplyCache::new(l);
        d.restore(&snap).unwrap();
        assert_eq!(d.snapshot(), snap);
        assert_eq!(d.size(), c.size());
        assert_eq!(d.admit(5, 3, 999, true), Admit::Done(Outcome::Ok(vec![3])));
        assert!(matches!(d.admit(5, 1, 999, true), Admit::Done(Outcome::Rejected(_))), "dropped, remembered");
        for cut in [1, snap.len() / 2, snap.len() - 1] {
            assert!(d.restore(&snap[..cut]).is_err());
        }
        assert_eq!(d.clients(), 19);
    }

    proptest::proptest! {
        /// The sorted ring behaves as an ordered map, whatever the order
        /// sequence numbers come in.
        #[test]
        fn seqs_behave_as_an_ordered_map(ops in proptest::collection::vec((0u8..4, 0u64..40), 0..200)) {
            let mut seqs = Seqs::default();
            let mut model = std::collections::BTreeMap::new();
            for (op, seq) in ops {
                match op {
                    0 | 1 => {
                        seqs.insert(seq, Slot::Dropped(seq));
                        model.insert(seq, Slot::Dropped(seq));
                    }
                    2 => proptest::prop_assert_eq!(seqs.pop_first(), model.pop_first()),
                    _ => proptest::prop_assert_eq!(seqs.any_after(seq), model.range(seq + 1..).next().is_some()),
                }
                proptest::prop_assert_eq!(seqs.get(seq), model.get(&seq));
                proptest::prop_assert_eq!(seqs.len(), model.len());
                let listed: Vec<u64> = seqs.iter().map(|(q, _)| q).collect();
                proptest::prop_assert_eq!(listed, model.keys().copied().collect::<Vec<_>>());
            }
        }
    }
}
