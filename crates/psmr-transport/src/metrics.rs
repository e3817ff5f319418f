//! The metric primitives a replica records with: lock-free histograms and
//! counter sets that `prometheus-client` encodes, and the client port's
//! request latency, matched per connection.
//!
//! Request latency is matched per connection: the client port notes each
//! request (client, sequence numbers, when it was read) in the
//! connection's [`PendingRequests`] before queueing it, and the
//! connection's writer checks the replies off. A request whose replies
//! never come to this connection (dropped for a full outbox, or redirected
//! after the leader lost its leadership) is forgotten when the connection
//! closes or when [`PENDING_MAX`] newer ones push it out; it is then not
//! observed.

use parking_lot::Mutex;
use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use psmr_model::wire::WireError;
use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Requests one connection keeps waiting for their replies, at most (see
/// the module documentation): about 48 KiB a connection. A client that
/// pipelines more loses the latency of its oldest requests, not more.
pub const PENDING_MAX: usize = 1024;

/// A histogram with fixed bucket bounds, updated with relaxed atomic
/// additions only (`prometheus-client`'s own takes a lock per
/// observation). Values are integers in a base unit (nanoseconds, bytes,
/// commands); `divisor` turns them into the exposed unit.
#[derive(Clone, Debug)]
pub struct Histogram(Arc<HistogramInner>);

#[derive(Debug)]
struct HistogramInner {
    /// Upper bounds, ascending, in the base unit.
    bounds: Box<[u64]>,
    /// One per bound, and the last for +Inf.
    buckets: Box<[AtomicU64]>,
    sum: AtomicU64,
    divisor: f64,
}

impl Histogram {
    /// A histogram with these upper bounds (base unit, ascending).
    pub fn new(bounds: Vec<u64>, divisor: f64) -> Self {
        let buckets = (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect();
        Self(Arc::new(HistogramInner { bounds: bounds.into(), buckets, sum: AtomicU64::new(0), divisor }))
    }

    /// Seconds, observed in nanoseconds: the 1-2.5-5 steps from `from_ns`
    /// up to `to_ns`.
    pub fn seconds(from_ns: u64, to_ns: u64) -> Self {
        let mut bounds = Vec::new();
        let mut decade = 1u64;
        while decade * 10 <= from_ns {
            decade *= 10;
        }
        'out: loop {
            for step in [10, 25, 50] {
                let b = decade * step / 10;
                if b > to_ns {
                    break 'out;
                }
                if b >= from_ns {
                    bounds.push(b);
                }
            }
            decade *= 10;
        }
        Self::new(bounds, 1e9)
    }

    /// Powers of `base` from `from` to `to`.
    pub fn powers(from: u64, base: u64, to: u64) -> Self {
        let bounds = std::iter::successors(Some(from), |&b| b.checked_mul(base)).take_while(|&b| b <= to).collect();
        Self::new(bounds, 1.0)
    }

    /// Counts one value.
    #[inline]
    pub fn observe(&self, value: u64) {
        let i = self.0.bounds.partition_point(|&b| b < value);
        self.0.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.0.sum.fetch_add(value, Ordering::Relaxed);
    }

    /// Counts the time since `start`, for a histogram of seconds.
    #[inline]
    pub fn observe_since(&self, start: Instant) {
        self.observe_duration(start.elapsed());
    }

    /// Counts a duration, for a histogram of seconds.
    #[inline]
    pub fn observe_duration(&self, d: std::time::Duration) {
        self.observe(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    }

    /// Values counted so far.
    pub fn count(&self) -> u64 {
        self.0.buckets.iter().map(|b| b.load(Ordering::Relaxed)).sum()
    }
}

impl EncodeMetric for Histogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), fmt::Error> {
        let h = &self.0;
        let buckets: Vec<(f64, u64)> = h
            .buckets
            .iter()
            .enumerate()
            .map(|(i, b)| (h.bounds.get(i).map_or(f64::INFINITY, |&u| u as f64 / h.divisor), b.load(Ordering::Relaxed)))
            .collect();
        // The count is the buckets' sum, so that the two always agree.
        let count = buckets.iter().map(|b| b.1).sum();
        let sum = h.sum.load(Ordering::Relaxed) as f64 / h.divisor;
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// Counters for a fixed set of values of one label, each a plain atomic.
#[derive(Clone, Debug)]
pub struct CounterSet(Arc<CounterSetInner>);

#[derive(Debug)]
struct CounterSetInner {
    label: &'static str,
    values: Box<[&'static str]>,
    counts: Box<[AtomicU64]>,
}

impl CounterSet {
    /// Counters labelled `label`, one per value of `values`.
    pub fn new(label: &'static str, values: Vec<&'static str>) -> Self {
        let counts = values.iter().map(|_| AtomicU64::new(0)).collect();
        Self(Arc::new(CounterSetInner { label, values: values.into(), counts }))
    }

    /// Counts one more of value `i`.
    pub fn inc(&self, i: usize) {
        self.add(i, 1);
    }

    /// Counts `n` more of value `i`.
    pub fn add(&self, i: usize, n: u64) {
        if let Some(c) = self.0.counts.get(i) {
            c.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// The count of label value `value` (0 if it is not one of the set).
    pub fn get(&self, value: &str) -> u64 {
        let i = self.0.values.iter().position(|&v| v == value);
        i.map_or(0, |i| self.0.counts[i].load(Ordering::Relaxed))
    }
}

impl EncodeMetric for CounterSet {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), fmt::Error> {
        let s = &self.0;
        for (value, count) in s.values.iter().zip(s.counts.iter()) {
            let labels = [(s.label, *value)];
            encoder
                .encode_family(&labels)?
                .encode_counter::<NoLabelSet, _, u64>(&count.load(Ordering::Relaxed), None)?;
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Counter
    }
}

/// Why ClientIO refused a client's frame, request or connection: the
/// `reason` label of `psmr_client_refused_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientRefusal {
    /// A frame longer than `frame_max`.
    FrameTooLarge,
    /// A frame too short for a version and a kind.
    FrameTooShort,
    /// Another protocol version.
    Version,
    /// No message of that kind.
    UnknownKind,
    /// A body that does not decode.
    Malformed,
    /// A frame that did not arrive whole within `frame_timeout_ms`.
    FrameTimeout,
    /// A request to a follower, redirected to the leader.
    NotLeader,
    /// A request of client id 0.
    ReservedClient,
    /// A request without commands.
    EmptyRequest,
    /// A request with more than `batch_max_commands` commands.
    RequestCommands,
    /// A request with more than `batch_max_bytes` bytes of operations.
    RequestBytes,
    /// A connection refused at `max_connections`, all of them busy.
    ConnectionLimit,
    /// A message from a client that has not authenticated.
    NoAuth,
    /// A wrong user name or password.
    WrongPass,
    /// A message the client's user has no rights to.
    NoPerm,
    /// An authentication refused because too many were attempted.
    AuthBusy,
    /// A TLS handshake that failed (a certificate from another CA, not
    /// TLS at all) or did not finish within `handshake_timeout_ms`.
    Handshake,
}

impl ClientRefusal {
    /// Every reason, in label order.
    pub const ALL: [ClientRefusal; 17] = [
        ClientRefusal::FrameTooLarge,
        ClientRefusal::FrameTooShort,
        ClientRefusal::Version,
        ClientRefusal::UnknownKind,
        ClientRefusal::Malformed,
        ClientRefusal::FrameTimeout,
        ClientRefusal::NotLeader,
        ClientRefusal::ReservedClient,
        ClientRefusal::EmptyRequest,
        ClientRefusal::RequestCommands,
        ClientRefusal::RequestBytes,
        ClientRefusal::ConnectionLimit,
        ClientRefusal::NoAuth,
        ClientRefusal::WrongPass,
        ClientRefusal::NoPerm,
        ClientRefusal::AuthBusy,
        ClientRefusal::Handshake,
    ];

    /// The label value.
    pub fn label(self) -> &'static str {
        match self {
            ClientRefusal::FrameTooLarge => "frame_too_large",
            ClientRefusal::FrameTooShort => "frame_too_short",
            ClientRefusal::Version => "version",
            ClientRefusal::UnknownKind => "unknown_kind",
            ClientRefusal::Malformed => "malformed",
            ClientRefusal::FrameTimeout => "frame_timeout",
            ClientRefusal::NotLeader => "not_leader",
            ClientRefusal::ReservedClient => "reserved_client",
            ClientRefusal::EmptyRequest => "empty_request",
            ClientRefusal::RequestCommands => "request_commands",
            ClientRefusal::RequestBytes => "request_bytes",
            ClientRefusal::ConnectionLimit => "connection_limit",
            ClientRefusal::NoAuth => "noauth",
            ClientRefusal::WrongPass => "wrongpass",
            ClientRefusal::NoPerm => "noperm",
            ClientRefusal::AuthBusy => "auth_busy",
            ClientRefusal::Handshake => "tls_handshake",
        }
    }

    /// The reason counted for an authentication or permission refusal.
    pub fn of_auth(refusal: &psmr_auth::Refusal) -> Self {
        use psmr_auth::Refusal;
        match refusal {
            Refusal::NoAuth => ClientRefusal::NoAuth,
            Refusal::WrongPass | Refusal::NoUsers => ClientRefusal::WrongPass,
            Refusal::NoPerm { .. } => ClientRefusal::NoPerm,
            Refusal::Busy => ClientRefusal::AuthBusy,
        }
    }

    /// The reason a connection ended with `e`, if it was a refused frame
    /// (not a closed or failed socket).
    pub fn of(e: &WireError) -> Option<Self> {
        Some(match e {
            WireError::TooLarge { .. } | WireError::OtherProtocol(_) => ClientRefusal::FrameTooLarge,
            WireError::TooShort(_) => ClientRefusal::FrameTooShort,
            WireError::Version(_) => ClientRefusal::Version,
            WireError::UnknownKind(_) => ClientRefusal::UnknownKind,
            // ClientIO's `read_frame` reports a late body as the "frame".
            WireError::Malformed { what: "frame", .. } => ClientRefusal::FrameTimeout,
            WireError::Malformed { .. } => ClientRefusal::Malformed,
            WireError::Io(_) | WireError::Closed => return None,
        })
    }

    /// Its place in [`ClientRefusal::ALL`] (its declaration order).
    pub fn index(self) -> usize {
        self as usize
    }
}

// ---------------------------------------------------------------------------
// Request latency: requests waiting for their replies, per connection.

/// A request waiting for replies.
#[derive(Debug)]
struct Waiting {
    client: u64,
    first: u64,
    last: u64,
    left: u32,
    read_at: Instant,
}

/// The requests of one client connection whose replies have not all been
/// handed to the socket (see the module documentation), oldest first.
/// ClientIO's reader adds each request before queueing it; the
/// connection's writer checks the replies off, once per batch of replies
/// it writes. Replies come back about in the order of the requests, so
/// the one a reply completes is found near the front; the queue keeps its
/// memory, so a closed-loop client costs no allocation per request.
#[derive(Debug, Default)]
pub struct Pending {
    waiting: VecDeque<Waiting>,
}

/// A connection's [`Pending`], shared by its reader and its writer.
pub type PendingRequests = Arc<Mutex<Pending>>;

impl Pending {
    /// Notes a request of `client` read at `read_at`: `count` commands with
    /// sequence numbers from `first` to `last`. At [`PENDING_MAX`] the
    /// oldest is forgotten.
    pub fn expect(&mut self, client: u64, first: u64, last: u64, count: u32, read_at: Instant) {
        if count == 0 {
            return;
        }
        if self.waiting.len() >= PENDING_MAX {
            self.waiting.pop_front();
        }
        self.waiting.push_back(Waiting { client, first, last, left: count, read_at });
    }

    /// Checks off the reply to command `seq` of `client`; the time its
    /// request was read if that was its last reply.
    pub fn replied(&mut self, client: u64, seq: u64) -> Option<Instant> {
        let i = self.waiting.iter().position(|w| w.client == client && w.first <= seq && seq <= w.last)?;
        let w = &mut self.waiting[i];
        w.left -= 1;
        if w.left > 0 {
            return None;
        }
        self.waiting.remove(i).map(|w| w.read_at)
    }

    /// Requests waiting.
    pub fn len(&self) -> usize {
        self.waiting.len()
    }

    /// No request waits.
    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }
}

/// The writer's side of request latency: the replies of one batch, checked
/// off together (one lock per batch, not per reply).
pub struct ReplyClock {
    pending: PendingRequests,
    latency: Histogram,
    replied: Vec<(u64, u64)>,
}

impl ReplyClock {
    /// A clock over `pending` that observes into `latency`.
    pub fn new(pending: PendingRequests, latency: Histogram) -> Self {
        Self { pending, latency, replied: Vec::new() }
    }

    /// Notes a reply about to be written.
    #[inline]
    pub fn note(&mut self, client: u64, seq: u64) {
        self.replied.push((client, seq));
    }

    /// The noted replies go to the socket now: observes the requests they
    /// complete.
    pub fn settle(&mut self) {
        if self.replied.is_empty() {
            return;
        }
        let mut pending = self.pending.lock();
        for (client, seq) in self.replied.drain(..) {
            if let Some(read_at) = pending.replied(client, seq) {
                self.latency.observe_since(read_at);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_hold_values_up_to_their_bound() {
        let h = Histogram::new(vec![10, 20], 1.0);
        for v in [0, 10, 11, 20, 21, u64::MAX / 4] {
            h.observe(v);
        }
        let counts: Vec<u64> = h.0.buckets.iter().map(|b| b.load(Ordering::Relaxed)).collect();
        assert_eq!(counts, vec![2, 2, 2]);
        assert_eq!(h.count(), 6);
        let s = Histogram::seconds(50_000, 10_000_000_000);
        assert_eq!(s.0.bounds.first(), Some(&50_000));
        assert_eq!(s.0.bounds.last(), Some(&10_000_000_000));
        assert!(s.0.bounds.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn pending_requests_complete_on_their_last_reply() {
        let mut p = Pending::default();
        let t0 = Instant::now();
        p.expect(1, 1, 3, 3, t0);
        p.expect(1, 4, 4, 1, t0);
        p.expect(2, 1, 1, 1, t0);
        assert_eq!(p.replied(1, 4), Some(t0));
        assert_eq!(p.replied(1, 2), None);
        assert_eq!(p.replied(1, 1), None);
        assert_eq!(p.replied(9, 1), None, "unknown client");
        assert_eq!(p.replied(1, 3), Some(t0));
        assert_eq!(p.replied(1, 3), None, "already complete");
        assert_eq!(p.len(), 1);
        assert_eq!(p.replied(2, 1), Some(t0));
        assert!(p.is_empty());
        for i in 0..PENDING_MAX as u64 + 10 {
            p.expect(3, i, i, 1, t0);
        }
        assert_eq!(p.len(), PENDING_MAX);
        assert_eq!(p.replied(3, 0), None, "the oldest were forgotten");
        assert_eq!(p.replied(3, PENDING_MAX as u64 + 9), Some(t0));
    }
}
