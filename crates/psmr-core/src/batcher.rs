//! Batching (002 §V-C1) that follows the load: client requests become log
//! entries on the protocol thread, with no timer on the way of a lone
//! request.
//!
//! * The leader proposes at once when no entry of its is in flight (that
//!   is, appended and not yet committed) — an idle replica never waits.
//! * While entries are in flight (the log is syncing, or the followers
//!   have not answered yet) requests wait and the next entry grows. It
//!   goes out when the entries in flight have committed, when it is full
//!   (`batch_max_commands` commands or `batch_max_bytes` bytes), or when
//!   its oldest request has waited `batch_delay_us`, whichever comes
//!   first. So entries are as large as the time the previous ones spend in
//!   flight: 002's batching and group commit, one sync covering every
//!   request that arrived while the previous sync ran.
//! * `pipeline` bounds the entries proposed and not yet applied; at that
//!   bound the entry waits even past its delay.
//!
//! The wait is part of the protocol thread's wait for peer messages: one
//! blocking select with a deadline in microseconds (no timer wheel with a
//! millisecond tick on this path), and no thread hand-off between batching
//! and proposing.
//!
//! A request is never split (ClientIO refuses one above either limit), so
//! an entry holds at most twice the limits. Requests reach the protocol
//! thread through a queue bounded in items (`queue_depth`) and, with the
//! frames' share of ClientIO's budget that each request holds until it is
//! in an entry, in bytes. When the entry is full the protocol thread stops
//! taking requests, the queue fills, ClientIO stops reading sockets, and
//! TCP slows the clients down.

use crate::entry::EntryBuilder;
use crate::request::{Lease, Request};

/// What bounds one entry.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Commands (`batch_max_commands`).
    pub max_commands: usize,
    /// Bytes of operations (`batch_max_bytes`).
    pub max_bytes: usize,
    /// Longest the oldest request waits while entries are in flight
    /// (`batch_delay_us`), ns.
    pub delay_ns: u64,
}

/// The entry being filled and when it is due. Time and the entries in
/// flight are arguments, so the policy is tested by stepping it by hand.
pub struct Batcher {
    limits: Limits,
    entry: EntryBuilder,
    bytes: usize,
    oldest: Option<u64>,
    clients: Vec<u64>,
    /// What the requests in the entry hold until it is proposed.
    held: Vec<Lease>,
    /// Bytes of the last entry taken: the next one starts with room for
    /// as much, so that it rarely grows by copying.
    last_len: usize,
}

impl Batcher {
    /// An empty batcher.
    pub fn new(limits: Limits) -> Self {
        Self {
            limits,
            entry: EntryBuilder::new(),
            bytes: 0,
            oldest: None,
            clients: Vec::new(),
            held: Vec::new(),
            last_len: 0,
        }
    }

    /// The entry may take another request.
    pub fn has_room(&self) -> bool {
        self.entry.len() < self.limits.max_commands && self.bytes < self.limits.max_bytes
    }

    /// No request waits.
    pub fn is_empty(&self) -> bool {
        self.oldest.is_none()
    }

    /// Commands waiting.
    pub fn len(&self) -> usize {
        self.entry.len()
    }

    /// Adds `r` to the entry; its queue slot is given back.
    pub fn push(&mut self, r: Request) {
        self.push_encoded(r, |entry, count, encoded| entry.extend_encoded(count, encoded));
    }

    /// [`Batcher::push`] that lets `append` put the request's commands
    /// into the entry (the simulator's injected bugs reorder them).
    pub(crate) fn push_encoded(&mut self, r: Request, append: impl FnOnce(&mut EntryBuilder, u32, &[u8])) {
        if self.oldest.is_none() {
            self.entry.reserve(self.last_len);
        }
        append(&mut self.entry, r.count, &r.encoded);
        self.bytes += r.bytes;
        self.oldest = Some(self.oldest.map_or(r.at_ns, |t| t.min(r.at_ns)));
        self.clients.push(r.client);
        if r.held.is_held() {
            self.held.push(r.held);
        }
    }

    /// Whether the entry should be proposed now (`now_ns`), with
    /// `in_flight` entries appended and not yet committed.
    pub fn due(&self, in_flight: u64, now_ns: u64) -> bool {
        match self.deadline() {
            None => false,
            Some(deadline) => in_flight == 0 || !self.has_room() || now_ns >= deadline,
        }
    }

    /// Whether a request of `client` waits in the entry.
    pub fn holds(&self, client: u64) -> bool {
        self.clients.contains(&client)
    }

    /// When the oldest request will have waited its longest, ns.
    pub fn deadline(&self) -> Option<u64> {
        self.oldest.map(|t| t.saturating_add(self.limits.delay_ns))
    }

    /// The encoded entry and the clients with a command in it; the batcher
    /// starts over, and what the requests held is given back.
    pub fn take(&mut self) -> (Vec<u8>, Vec<u64>) {
        self.bytes = 0;
        self.oldest = None;
        self.held.clear();
        let entry = self.entry.take();
        self.last_len = entry.len();
        (entry, std::mem::take(&mut self.clients))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entry::{decode_entry, encode_command};

    const LIMITS: Limits = Limits { max_commands: 4, max_bytes: 100, delay_ns: 200_000 };
    const US: u64 = 1_000;

    fn request(client: u64, seq: u64, op_len: usize, at_ns: u64) -> Request {
        let mut encoded = Vec::new();
        encode_command(&mut encoded, client, seq, &vec![7; op_len]);
        Request::new(client, 1, encoded, op_len, at_ns)
    }

    #[test]
    fn an_idle_replica_proposes_a_lone_request_without_waiting() {
        let t0 = 1_000_000;
        let mut b = Batcher::new(LIMITS);
        assert!(!b.due(0, t0), "nothing to propose");
        b.push(request(1, 1, 8, t0));
        assert!(b.due(0, t0), "nothing in flight: at once, at the instant it arrived");
        let (entry, clients) = b.take();
        assert_eq!(decode_entry(&entry).unwrap().len(), 1);
        assert_eq!(clients, vec![1]);
        assert!(b.is_empty() && !b.due(0, t0));
    }

    #[test]
    fn entries_grow_while_earlier_ones_are_in_flight() {
        let t0 = 1_000_000;
        let mut b = Batcher::new(LIMITS);
        // Three requests arrive 10 µs apart while one entry is in flight:
        // they wait, then go together once it commits.
        for i in 0..3 {
            let now = t0 + 10 * US * i;
            b.push(request(i + 1, 1, 8, now));
            assert!(!b.due(1, now), "request {i} waits behind the entry in flight");
        }
        assert!(b.due(0, t0 + 30 * US), "the entry in flight committed");
        assert_eq!(decode_entry(&b.take().0).unwrap().len(), 3);
    }

    #[test]
    fn a_full_entry_or_an_expired_delay_goes_out_while_entries_are_in_flight() {
        let t0 = 1_000_000;
        let mut b = Batcher::new(LIMITS);
        b.push(request(1, 1, 8, t0));
        assert_eq!(b.deadline(), Some(t0 + LIMITS.delay_ns));
        assert!(!b.due(3, t0 + LIMITS.delay_ns - 1));
        assert!(b.due(3, t0 + LIMITS.delay_ns), "the delay is an upper bound");
        for seq in 2..=4 {
            b.push(request(1, seq, 8, t0));
        }
        assert!(!b.has_room());
        assert!(b.due(3, t0), "full: at once");
        let (entry, clients) = b.take();
        assert_eq!(decode_entry(&entry).unwrap().len(), 4);
        assert_eq!(clients, vec![1; 4]);
        b.push(request(2, 1, 100, t0));
        assert!(!b.has_room(), "the byte limit counts too");
    }

    #[test]
    fn the_oldest_request_sets_the_deadline() {
        let t0 = 1_000_000;
        let mut b = Batcher::new(LIMITS);
        b.push(request(1, 1, 1, t0 + 50 * US));
        // Queued earlier, taken later: its wait started when it was queued.
        b.push(request(2, 1, 1, t0));
        assert_eq!(b.deadline(), Some(t0 + LIMITS.delay_ns));
    }

    #[test]
    fn what_a_request_holds_is_given_back_once_its_entry_is_taken() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::sync::Arc;
        struct Held(Arc<AtomicUsize>);
        impl Drop for Held {
            fn drop(&mut self) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let (held, slots) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let mut b = Batcher::new(LIMITS);
        for seq in 1..=2 {
            let mut r = request(1, seq, 1, 0);
            r.held = Lease::new(Held(held.clone()));
            r.slot = Lease::new(Held(slots.clone()));
            b.push(r);
        }
        assert_eq!(slots.load(Ordering::SeqCst), 2, "the queue slots are free once the requests are taken");
        assert_eq!(held.load(Ordering::SeqCst), 0, "the budget is held while the entry waits");
        b.take();
        assert_eq!(held.load(Ordering::SeqCst), 2, "and given back once it is proposed");
    }
}
