//! The reply cache: each (client, sequence number) executes once, however
//! often the client sends it and whichever replica led when it did.
//!
//! It is replicated state: the service manager consults it in log order
//! (so every replica makes the same decisions), and it travels in
//! snapshots. Workers fill in replies as commands execute.
//!
//! Bounded twice: per client it remembers the `window` highest sequence
//! numbers it admitted (a command at or below the highest one forgotten is
//! *stale* and refused, never executed again), and it remembers at most
//! `clients` clients, forgetting the one whose last command is oldest in
//! the log first. A forgotten client starts afresh; only a client silent
//! for that long could then see a very old retry execute twice. Clients
//! are spread over shards by id so that workers filling replies for
//! different clients rarely meet on a lock; each shard holds its share of
//! the client bound, which keeps eviction a function of the log alone.

use parking_lot::Mutex;
use psmr_model::wire::{Decoder, Encoder, Outcome, WireError};
use std::collections::{BTreeMap, BTreeSet, HashMap};

const SHARDS: usize = 16;

/// What to do with a command the log delivers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Admit {
    /// Never seen: execute it (it is now recorded as pending).
    New,
    /// Executed already: here is its outcome.
    Done(Outcome),
    /// Admitted earlier and still executing: its reply is on its way.
    Pending,
    /// Older than anything remembered for this client: refuse it.
    Stale,
}

#[derive(Default, Debug)]
struct Client {
    /// Admitted sequence numbers and their outcomes once known.
    seqs: BTreeMap<u64, Option<Outcome>>,
    /// Highest sequence number forgotten (0: none).
    floor: u64,
    /// Log index of the client's latest admitted command.
    last_index: u64,
}

#[derive(Default, Debug)]
struct Shard {
    clients: HashMap<u64, Client>,
    /// `(last_index, client)`, oldest first.
    by_age: BTreeSet<(u64, u64)>,
}

/// See the module documentation.
#[derive(Debug)]
pub struct ReplyCache {
    shards: Vec<Mutex<Shard>>,
    window: u64,
    clients_per_shard: usize,
}

impl ReplyCache {
    /// A cache remembering `window` sequence numbers per client and about
    /// `clients` clients.
    pub fn new(window: u64, clients: usize) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            window: window.max(1),
            clients_per_shard: clients.div_ceil(SHARDS).max(1),
        }
    }

    fn shard(&self, client: u64) -> &Mutex<Shard> {
        // Client ids are random or chosen by users: mix before picking.
        let h = client.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 60;
        &self.shards[h as usize % SHARDS]
    }

    /// Decides about command `seq` of `client`, delivered at log `index`.
    /// Called in log order by one thread.
    pub fn admit(&self, client: u64, seq: u64, index: u64) -> Admit {
        let mut shard = self.shard(client).lock();
        let shard = &mut *shard;
        if let Some(c) = shard.clients.get_mut(&client) {
            shard.by_age.remove(&(c.last_index, client));
            c.last_index = index;
            shard.by_age.insert((index, client));
            if let Some(outcome) = c.seqs.get(&seq) {
                return outcome.clone().map_or(Admit::Pending, Admit::Done);
            }
            if seq <= c.floor {
                return Admit::Stale;
            }
            c.seqs.insert(seq, None);
            while c.seqs.len() as u64 > self.window {
                let (old, _) = c.seqs.pop_first().expect("more than the window");
                c.floor = c.floor.max(old);
            }
            return Admit::New;
        }
        if shard.clients.len() >= self.clients_per_shard {
            if let Some((_, old)) = shard.by_age.pop_first() {
                shard.clients.remove(&old);
            }
        }
        let mut c = Client { last_index: index, ..Client::default() };
        c.seqs.insert(seq, None);
        shard.clients.insert(client, c);
        shard.by_age.insert((index, client));
        Admit::New
    }

    /// Records the outcome of an admitted command (from any thread).
    pub fn fill(&self, client: u64, seq: u64, outcome: Outcome) {
        let mut shard = self.shard(client).lock();
        if let Some(slot) = shard.clients.get_mut(&client).and_then(|c| c.seqs.get_mut(&seq)) {
            *slot = Some(outcome);
        }
    }

    /// Clients remembered.
    pub fn clients(&self) -> usize {
        self.shards.iter().map(|s| s.lock().clients.len()).sum()
    }

    /// The cache as bytes, in a deterministic order. Every admitted command
    /// must have its outcome (the caller waits for execution first).
    pub fn snapshot(&self) -> Vec<u8> {
        struct Saved {
            id: u64,
            floor: u64,
            last: u64,
            seqs: Vec<(u64, Outcome)>,
        }
        let mut all = Vec::new();
        for shard in &self.shards {
            for (&id, c) in &shard.lock().clients {
                let seqs = c.seqs.iter().filter_map(|(&s, o)| o.clone().map(|o| (s, o))).collect();
                all.push(Saved { id, floor: c.floor, last: c.last_index, seqs });
            }
        }
        all.sort_unstable_by_key(|c| c.id);
        let mut e = Encoder::new();
        e.u64(all.len() as u64);
        for Saved { id, floor, last, seqs } in all {
            e.u64(id).u64(floor).u64(last).u32(seqs.len() as u32);
            for (seq, outcome) in seqs {
                e.u64(seq).outcome(&outcome);
            }
        }
        e.finish()
    }

    /// Replaces the contents with a snapshot's; on error nothing changes.
    pub fn restore(&self, bytes: &[u8]) -> Result<(), WireError> {
        let mut d = Decoder::new(bytes, "reply cache snapshot");
        let n = d.u64()?;
        let mut shards: Vec<Shard> = (0..SHARDS).map(|_| Shard::default()).collect();
        for _ in 0..n {
            let (id, floor, last_index) = (d.u64()?, d.u64()?, d.u64()?);
            let k = d.count(usize::MAX, 13)?;
            let mut seqs = BTreeMap::new();
            for _ in 0..k {
                let seq = d.u64()?;
                seqs.insert(seq, Some(d.outcome()?));
            }
            let h = id.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 60;
            let shard = &mut shards[h as usize % SHARDS];
            shard.by_age.insert((last_index, id));
            shard.clients.insert(id, Client { seqs, floor, last_index });
        }
        d.end()?;
        for (slot, fresh) in self.shards.iter().zip(shards) {
            *slot.lock() = fresh;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_executes_once() {
        let c = ReplyCache::new(4, 100);
        assert_eq!(c.admit(1, 1, 10), Admit::New);
        assert_eq!(c.admit(1, 1, 11), Admit::Pending, "a retry before the reply");
        c.fill(1, 1, Outcome::Ok(vec![7]));
        assert_eq!(c.admit(1, 1, 12), Admit::Done(Outcome::Ok(vec![7])));
        assert_eq!(c.admit(2, 1, 13), Admit::New, "another client");
    }

    #[test]
    fn old_sequence_numbers_are_forgotten_and_then_refused() {
        let c = ReplyCache::new(2, 100);
        for seq in 1..=3 {
            assert_eq!(c.admit(1, seq, seq), Admit::New);
            c.fill(1, seq, Outcome::Ok(vec![]));
        }
        assert_eq!(c.admit(1, 1, 9), Admit::Stale, "forgotten: never executed again");
        assert_eq!(c.admit(1, 2, 9), Admit::Done(Outcome::Ok(vec![])));
        // Out of order but above the floor: fine.
        assert_eq!(c.admit(1, 5, 10), Admit::New);
        assert_eq!(c.admit(1, 4, 11), Admit::New);
    }

    #[test]
    fn the_least_recently_active_client_goes_first() {
        let c = ReplyCache::new(4, 1); // one client per shard
        assert_eq!(c.admit(1, 1, 1), Admit::New);
        // Find another client of the same shard.
        let other = (2..).find(|&id| std::ptr::eq(c.shard(id), c.shard(1))).unwrap();
        assert_eq!(c.admit(other, 1, 2), Admit::New);
        assert_eq!(c.clients(), 1);
        assert_eq!(c.admit(1, 1, 3), Admit::New, "client 1 was forgotten");
    }

    #[test]
    fn snapshots_round_trip_and_bad_bytes_change_nothing() {
        let c = ReplyCache::new(8, 100);
        for client in 1..20 {
            for seq in 1..4 {
                c.admit(client, seq, client * 10 + seq);
                c.fill(
                    client,
                    seq,
                    if seq == 2 { Outcome::Rejected("no".into()) } else { Outcome::Ok(vec![seq as u8]) },
                );
            }
        }
        let snap = c.snapshot();
        let d = ReplyCache::new(8, 100);
        d.restore(&snap).unwrap();
        assert_eq!(d.snapshot(), snap);
        assert_eq!(d.admit(5, 2, 999), Admit::Done(Outcome::Rejected("no".into())));
        for cut in [1, snap.len() / 2, snap.len() - 1] {
            assert!(d.restore(&snap[..cut]).is_err());
        }
        assert_eq!(d.clients(), 19);
    }
}
