//! Queues between stages, bounded in items and in bytes.
//!
//! A bound in items alone does not bound memory: one raft message from a
//! peer may carry up to a quarter of `peer_frame_max` of entries, and one
//! decision the committed entries of a whole ready, so `queue_depth` of
//! them could hold gigabytes while the stage behind is slow (a follower's
//! service manager falling behind its protocol thread). Each queue here is
//! a crossbeam channel (the bound in items) with a byte budget in front: a
//! sender waits until what the queue holds plus its item fits in
//! `queue_bytes_max`. An item always fits in an empty queue, so one larger
//! than the budget (a snapshot) still passes, alone. The receiver gives the
//! bytes back as it takes items, and when it is dropped, senders waiting
//! for room stop waiting and fail as a send to a closed channel does.
//!
//! What an item weighs is [`Weigh::weight`]: the bytes it holds that grow
//! with its contents (entries, snapshot data), plus a constant for the
//! rest.

use crossbeam::channel::{self, RecvError, Select, SelectedOperation, SendError, SendTimeoutError, TryRecvError};
use parking_lot::{Condvar, Mutex};
use prometheus_client::metrics::gauge::Gauge;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Weight of an item beyond the bytes it carries: the enum, the boxes,
/// the channel slot.
pub const ITEM_OVERHEAD: usize = 64;

/// What an item of a bounded queue holds, in bytes.
pub trait Weigh {
    /// The item's weight; must not change while it is queued.
    fn weight(&self) -> usize;
}

/// The bytes a queue holds, and the most it has held, as metrics.
#[derive(Clone, Debug, Default)]
pub struct Meter {
    /// Bytes queued now.
    pub used: Gauge,
    /// The most bytes queued at once since the replica started.
    pub peak: Gauge,
}

impl Meter {
    fn record(&self, used: usize) {
        let used = i64::try_from(used).unwrap_or(i64::MAX);
        self.used.set(used);
        if used > self.peak.get() {
            self.peak.set(used);
        }
    }
}

/// Bytes queued, against a bound.
#[derive(Debug)]
struct Budget {
    state: Mutex<State>,
    room: Condvar,
    max: usize,
    meter: Meter,
}

#[derive(Debug, Default)]
struct State {
    used: usize,
    /// The receiver is gone: nothing will be given back.
    closed: bool,
    /// Senders waiting for room (tests watch it).
    waiting: usize,
}

impl Budget {
    /// Takes `n` bytes, waiting until they fit or `deadline` passes; false
    /// if the deadline passed or the receiver is gone.
    fn take(&self, n: usize, deadline: Option<Instant>) -> bool {
        let mut s = self.state.lock();
        while !s.closed && s.used > 0 && s.used.saturating_add(n) > self.max {
            s.waiting += 1;
            let timed_out = match deadline {
                Some(d) => self.room.wait_until(&mut s, d).timed_out(),
                None => {
                    self.room.wait(&mut s);
                    false
                }
            };
            s.waiting -= 1;
            if timed_out {
                return false;
            }
        }
        if s.closed {
            return false;
        }
        s.used += n;
        self.meter.record(s.used);
        true
    }

    /// Takes `n` bytes if they fit now.
    fn try_take(&self, n: usize) -> bool {
        let mut s = self.state.lock();
        if s.closed || (s.used > 0 && s.used.saturating_add(n) > self.max) {
            return false;
        }
        s.used += n;
        self.meter.record(s.used);
        true
    }

    fn give(&self, n: usize) {
        let mut s = self.state.lock();
        s.used = s.used.saturating_sub(n);
        self.meter.record(s.used);
        let wake = s.waiting > 0;
        drop(s);
        if wake {
            self.room.notify_all();
        }
    }

    fn close(&self) {
        self.state.lock().closed = true;
        self.room.notify_all();
    }
}

/// A queue of at most `items` items and `bytes` bytes (see the module
/// documentation), whose bytes `meter` shows.
pub fn bounded<T: Weigh>(items: usize, bytes: usize, meter: Meter) -> (Sender<T>, Receiver<T>) {
    let (tx, rx) = channel::bounded(items);
    let budget = Arc::new(Budget { state: Mutex::new(State::default()), room: Condvar::new(), max: bytes, meter });
    (Sender { tx, budget: budget.clone() }, Receiver { rx, budget })
}

/// The sending side of a [`bounded`] queue. Cheap to clone.
#[derive(Debug)]
pub struct Sender<T> {
    tx: channel::Sender<T>,
    budget: Arc<Budget>,
}

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Self {
        Self { tx: self.tx.clone(), budget: self.budget.clone() }
    }
}

impl<T: Weigh> Sender<T> {
    /// Queues `item`, waiting for room in bytes and items. Err (with the
    /// item) once the receiver is gone.
    pub fn send(&self, item: T) -> Result<(), SendError<T>> {
        let n = item.weight();
        if !self.budget.take(n, None) {
            return Err(SendError(item));
        }
        self.tx.send(item).inspect_err(|_| self.budget.give(n))
    }

    /// Queues `item` if there is room now.
    pub fn try_send(&self, item: T) -> Result<(), channel::TrySendError<T>> {
        let n = item.weight();
        if !self.budget.try_take(n) {
            return Err(channel::TrySendError::Full(item));
        }
        self.tx.try_send(item).inspect_err(|_| self.budget.give(n))
    }

    /// Queues `item`, waiting at most `timeout` for room.
    pub fn send_timeout(&self, item: T, timeout: Duration) -> Result<(), SendTimeoutError<T>> {
        let deadline = Instant::now() + timeout;
        let n = item.weight();
        if !self.budget.take(n, Some(deadline)) {
            return Err(match self.budget.state.lock().closed {
                true => SendTimeoutError::Disconnected(item),
                false => SendTimeoutError::Timeout(item),
            });
        }
        self.tx.send_deadline(item, deadline).inspect_err(|_| self.budget.give(n))
    }
}

/// The receiving side of a [`bounded`] queue: gives the bytes of what it
/// takes back, and lets waiting senders fail when dropped.
#[derive(Debug)]
pub struct Receiver<T> {
    rx: channel::Receiver<T>,
    budget: Arc<Budget>,
}

impl<T: Weigh> Receiver<T> {
    /// The next item, waiting for one; Err once every sender is gone.
    pub fn recv(&self) -> Result<T, RecvError> {
        self.rx.recv().map(|item| self.taken(item))
    }

    /// The next item if one is queued.
    pub fn try_recv(&self) -> Result<T, TryRecvError> {
        self.rx.try_recv().map(|item| self.taken(item))
    }

    /// The next item, waiting at most `timeout` for one.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<T, channel::RecvTimeoutError> {
        self.rx.recv_timeout(timeout).map(|item| self.taken(item))
    }

    /// Adds a receive from this queue to `sel`; finish it with
    /// [`Receiver::complete`].
    pub fn select<'a>(&'a self, sel: &mut Select<'a>) -> usize {
        sel.recv(&self.rx)
    }

    /// Completes a receive [`Receiver::select`] added and `sel` chose.
    pub fn complete(&self, op: SelectedOperation<'_>) -> Result<T, RecvError> {
        op.recv(&self.rx).map(|item| self.taken(item))
    }

    /// Bytes queued now.
    pub fn bytes(&self) -> usize {
        self.budget.state.lock().used
    }

    fn taken(&self, item: T) -> T {
        self.budget.give(item.weight());
        item
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        self.budget.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Blob(usize);

    impl Weigh for Blob {
        fn weight(&self) -> usize {
            self.0
        }
    }

    /// Waits (bounded) until a sender waits for room.
    fn until_a_sender_waits<T>(rx: &Receiver<T>) {
        for _ in 0..1_000_000 {
            if rx.budget.state.lock().waiting > 0 {
                return;
            }
            std::thread::yield_now();
        }
        panic!("no sender came to wait for room");
    }

    #[test]
    fn items_fit_within_the_bytes_and_one_large_item_passes_alone() {
        let meter = Meter::default();
        let (tx, rx) = bounded::<Blob>(100, 1000, meter.clone());
        tx.send(Blob(600)).unwrap();
        assert!(tx.try_send(Blob(500)).is_err(), "1100 bytes would exceed 1000");
        tx.try_send(Blob(400)).unwrap();
        assert_eq!(rx.bytes(), 1000);
        rx.recv().unwrap();
        rx.recv().unwrap();
        assert_eq!(rx.bytes(), 0);
        assert_eq!((meter.used.get(), meter.peak.get()), (0, 1000));
        tx.try_send(Blob(5000)).expect("an item larger than the budget passes an empty queue");
        assert!(tx.try_send(Blob(1)).is_err(), "nothing joins it");
    }

    #[test]
    fn a_sender_waits_for_the_receiver_to_take_bytes() {
        let (tx, rx) = bounded::<Blob>(100, 1000, Meter::default());
        tx.send(Blob(900)).unwrap();
        let sender = std::thread::spawn(move || tx.send(Blob(200)).is_ok());
        until_a_sender_waits(&rx);
        assert_eq!(rx.bytes(), 900, "the waiting item is not counted yet");
        assert_eq!(rx.recv().unwrap().0, 900);
        assert!(sender.join().unwrap());
        assert_eq!(rx.recv().unwrap().0, 200);
    }

    #[test]
    fn a_waiting_sender_fails_when_the_receiver_goes() {
        let (tx, rx) = bounded::<Blob>(100, 1000, Meter::default());
        tx.send(Blob(900)).unwrap();
        let tx2 = tx.clone();
        let sender = std::thread::spawn(move || tx2.send(Blob(200)).is_err());
        until_a_sender_waits(&rx);
        drop(rx);
        assert!(sender.join().unwrap(), "the send fails instead of waiting forever");
        assert!(matches!(tx.send_timeout(Blob(1), Duration::from_secs(60)), Err(SendTimeoutError::Disconnected(_))));
    }

    #[test]
    fn a_send_with_a_timeout_gives_the_item_back_when_there_is_no_room() {
        let (tx, rx) = bounded::<Blob>(100, 1000, Meter::default());
        tx.send(Blob(900)).unwrap();
        match tx.send_timeout(Blob(200), Duration::from_millis(1)) {
            Err(SendTimeoutError::Timeout(b)) => assert_eq!(b.0, 200),
            other => panic!("expected a timeout, got {:?}", other.map_err(|_| ())),
        }
        assert_eq!(rx.bytes(), 900);
    }

    #[test]
    fn the_bound_in_items_still_holds() {
        let (tx, _rx) = bounded::<Blob>(2, 1 << 20, Meter::default());
        tx.try_send(Blob(1)).unwrap();
        tx.try_send(Blob(1)).unwrap();
        assert!(tx.try_send(Blob(1)).is_err());
    }

    #[test]
    fn a_select_receive_gives_the_bytes_back() {
        let (tx, rx) = bounded::<Blob>(10, 1000, Meter::default());
        tx.send(Blob(700)).unwrap();
        let mut sel = Select::new();
        let i = rx.select(&mut sel);
        let op = sel.select();
        assert_eq!(op.index(), i);
        assert_eq!(rx.complete(op).unwrap().0, 700);
        assert_eq!(rx.bytes(), 0);
    }
}
