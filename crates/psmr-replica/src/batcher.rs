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

use crate::store::EntryBuilder;
use crossbeam::channel::{Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// One client request, checked by ClientIO, its commands already in the
/// log entry encoding.
#[derive(Debug)]
pub struct Request {
    /// The client.
    pub client: u64,
    /// Its commands.
    pub count: u32,
    /// The commands, encoded by [`crate::store::encode_command`].
    pub encoded: Vec<u8>,
    /// Bytes of operations in it.
    pub bytes: usize,
    /// When ClientIO queued it.
    pub at: Instant,
    /// Every command only reads: the leader may serve it without a log
    /// entry ([`crate::reads`]).
    pub read: bool,
    /// The frame's share of ClientIO's memory budget, released once the
    /// request is in a proposed entry.
    pub held: Option<OwnedSemaphorePermit>,
    /// Its place in the request queue.
    slot: Option<OwnedSemaphorePermit>,
}

impl Request {
    /// A request of `client` with `count` commands encoded in `encoded`.
    pub fn new(client: u64, count: u32, encoded: Vec<u8>, bytes: usize, held: Option<OwnedSemaphorePermit>) -> Self {
        Self { client, count, encoded, bytes, at: Instant::now(), read: false, held, slot: None }
    }
}

/// ClientIO's end of the request queue.
#[derive(Clone)]
pub struct RequestSender {
    tx: Sender<Request>,
    slots: Arc<Semaphore>,
}

/// The protocol thread's end of the request queue; dropping it lets
/// waiting senders go.
pub struct RequestReceiver {
    pub(crate) rx: Receiver<Request>,
    slots: Arc<Semaphore>,
}

/// A queue of at most `depth` requests from async ClientIO tasks to the
/// protocol thread, which selects on it together with peer messages.
pub fn request_queue(depth: usize) -> (RequestSender, RequestReceiver) {
    // The channel itself is unbounded; the slots bound it, and a sender
    // waits for a slot without blocking its ClientIO thread.
    let (tx, rx) = crossbeam::channel::unbounded();
    let slots = Arc::new(Semaphore::new(depth.min(Semaphore::MAX_PERMITS)));
    (RequestSender { tx, slots: slots.clone() }, RequestReceiver { rx, slots })
}

impl RequestSender {
    /// Queues `r`, waiting for room; gives it back if the protocol thread
    /// is gone.
    pub async fn send(&self, mut r: Request) -> Result<(), Box<Request>> {
        match self.slots.clone().acquire_owned().await {
            Ok(slot) => r.slot = Some(slot),
            Err(_) => return Err(Box::new(r)),
        }
        self.tx.send(r).map_err(|e| Box::new(e.0))
    }
}

impl Drop for RequestReceiver {
    fn drop(&mut self) {
        self.slots.close();
    }
}

/// What bounds one entry.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Commands (`batch_max_commands`).
    pub max_commands: usize,
    /// Bytes of operations (`batch_max_bytes`).
    pub max_bytes: usize,
    /// Longest the oldest request waits while entries are in flight
    /// (`batch_delay_us`).
    pub delay: Duration,
}

/// The entry being filled and when it is due. Pure: time and the entries
/// in flight are arguments, so the policy is tested with a fake clock.
pub struct Batcher {
    limits: Limits,
    entry: EntryBuilder,
    bytes: usize,
    oldest: Option<Instant>,
    clients: Vec<u64>,
    held: Option<OwnedSemaphorePermit>,
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
            held: None,
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

    /// Adds `r` to the entry; its queue slot is free again.
    pub fn push(&mut self, mut r: Request) {
        if self.oldest.is_none() {
            self.entry.reserve(self.last_len);
        }
        self.entry.extend_encoded(r.count, &r.encoded);
        self.bytes += r.bytes;
        self.oldest = Some(self.oldest.map_or(r.at, |t| t.min(r.at)));
        self.clients.push(r.client);
        match (&mut self.held, r.held.take()) {
            (Some(held), Some(more)) => held.merge(more),
            (held @ None, more) => *held = more,
            (Some(_), None) => {}
        }
    }

    /// Whether the entry should be proposed now, with `in_flight` entries
    /// appended and not yet committed.
    pub fn due(&self, in_flight: u64, now: Instant) -> bool {
        match self.deadline() {
            None => false,
            Some(deadline) => in_flight == 0 || !self.has_room() || now >= deadline,
        }
    }

    /// Whether a request of `client` waits in the entry.
    pub fn holds(&self, client: u64) -> bool {
        self.clients.contains(&client)
    }

    /// When the oldest request will have waited its longest.
    pub fn deadline(&self) -> Option<Instant> {
        self.oldest.map(|t| t + self.limits.delay)
    }

    /// The encoded entry and the clients with a command in it; the batcher
    /// starts over, and the requests' bytes leave ClientIO's budget.
    pub fn take(&mut self) -> (Vec<u8>, Vec<u64>) {
        self.bytes = 0;
        self.oldest = None;
        self.held = None;
        let entry = self.entry.take();
        self.last_len = entry.len();
        (entry, std::mem::take(&mut self.clients))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{decode_entry, encode_command};

    const LIMITS: Limits = Limits { max_commands: 4, max_bytes: 100, delay: Duration::from_micros(200) };

    fn request(client: u64, seq: u64, op_len: usize, at: Instant) -> Request {
        let mut encoded = Vec::new();
        encode_command(&mut encoded, client, seq, &vec![7; op_len]);
        Request { at, ..Request::new(client, 1, encoded, op_len, None) }
    }

    #[test]
    fn an_idle_replica_proposes_a_lone_request_without_waiting() {
        let t0 = Instant::now();
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
        let t0 = Instant::now();
        let mut b = Batcher::new(LIMITS);
        // Three requests arrive 10 µs apart while one entry is in flight:
        // they wait, then go together once it commits.
        for i in 0..3 {
            let now = t0 + Duration::from_micros(10 * i);
            b.push(request(i + 1, 1, 8, now));
            assert!(!b.due(1, now), "request {i} waits behind the entry in flight");
        }
        assert!(b.due(0, t0 + Duration::from_micros(30)), "the entry in flight committed");
        assert_eq!(decode_entry(&b.take().0).unwrap().len(), 3);
    }

    #[test]
    fn a_full_entry_or_an_expired_delay_goes_out_while_entries_are_in_flight() {
        let t0 = Instant::now();
        let mut b = Batcher::new(LIMITS);
        b.push(request(1, 1, 8, t0));
        assert_eq!(b.deadline(), Some(t0 + LIMITS.delay));
        assert!(!b.due(3, t0 + LIMITS.delay - Duration::from_micros(1)));
        assert!(b.due(3, t0 + LIMITS.delay), "the delay is an upper bound");
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
        let t0 = Instant::now();
        let mut b = Batcher::new(LIMITS);
        b.push(request(1, 1, 1, t0 + Duration::from_micros(50)));
        // Queued earlier, taken later: its wait started when it was queued.
        b.push(request(2, 1, 1, t0));
        assert_eq!(b.deadline(), Some(t0 + LIMITS.delay));
    }

    #[test]
    fn the_queue_bounds_requests_and_frees_a_slot_once_a_request_is_taken() {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let (tx, rx) = request_queue(2);
        let t0 = Instant::now();
        rt.block_on(async {
            tx.send(request(1, 1, 1, t0)).await.unwrap();
            tx.send(request(1, 2, 1, t0)).await.unwrap();
            let third = tx.send(request(1, 3, 1, t0));
            tokio::pin!(third);
            assert!(futures_poll_once(third.as_mut()).is_none(), "full: the third waits for a slot");
            let mut b = Batcher::new(LIMITS);
            b.push(rx.rx.try_recv().unwrap());
            assert!(futures_poll_once(third.as_mut()).is_some(), "a slot is free once a request is taken");
            drop(rx);
            assert!(tx.send(request(1, 4, 1, t0)).await.is_err(), "the protocol thread is gone");
        });
    }

    struct NoWake;

    impl std::task::Wake for NoWake {
        fn wake(self: Arc<Self>) {}
    }

    /// Polls `f` once, with a waker that does nothing.
    fn futures_poll_once<F: std::future::Future + ?Sized>(f: std::pin::Pin<&mut F>) -> Option<F::Output> {
        let waker = std::task::Waker::from(Arc::new(NoWake));
        let mut cx = std::task::Context::from_waker(&waker);
        match f.poll(&mut cx) {
            std::task::Poll::Ready(v) => Some(v),
            std::task::Poll::Pending => None,
        }
    }
}
