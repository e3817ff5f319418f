//! The messages between a replica's stages, and the queue that brings
//! client requests to the protocol thread. Every stage that sends or
//! receives one imports it from here, so that no stage depends on another
//! for its messages.

use crate::queue::{Weigh, ITEM_OVERHEAD};
use crossbeam::channel::{Receiver, Sender};
use psmr_core::protocol::Apply;
use psmr_core::request::{Lease, Request};
use psmr_core::transfer::SnapMsg;
use psmr_model::wire::{MemberChange, ServerMsg};
use psmr_model::FrozenDigest;
use psmr_sched::SchedConfig;
use raft::prelude::{Entry, Message, Snapshot};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{oneshot, Semaphore};

/// What the protocol thread receives besides client requests.
pub enum Inbound {
    /// A raft message from a peer.
    Raft(Box<Message>),
    /// A message of a snapshot transfer from peer `peer`, on its lane.
    Snap {
        /// The peer (authenticated).
        peer: u64,
        /// The message.
        msg: Box<SnapMsg>,
    },
    /// A snapshot of the state taken here, made durable on the snapshot
    /// side pool: keep it and compact the log.
    Snapshot(Box<Snapshot>),
    /// Peer `peer`, authenticated and not a member this replica knows of
    /// (it was added by an entry this replica has not seen yet), listens
    /// at `addr`: a sender to it lets this replica answer it.
    PeerListens {
        /// The peer.
        peer: u64,
        /// Its peer address.
        addr: SocketAddr,
    },
    /// A membership change a client asks for, and where its answer goes.
    Admin(MemberChange, oneshot::Sender<ServerMsg>),
    /// Peer `peer` (authenticated, with the incarnation this replica knows)
    /// connected saying it was repaired and has not caught up yet: what it
    /// acknowledged before is gone.
    PeerRepaired {
        /// The peer.
        peer: u64,
    },
    /// The service manager applied an entry while the protocol thread
    /// waited for it.
    Applied,
}

impl Weigh for Inbound {
    /// A peer's raft message weighs what it carries; the rest are small
    /// (a snapshot taken here is moved, not copied, and one is in flight).
    fn weight(&self) -> usize {
        match self {
            Inbound::Raft(msg) => raft_weight(msg),
            Inbound::Snap { msg, .. } => ITEM_OVERHEAD + msg.weight(),
            _ => ITEM_OVERHEAD,
        }
    }
}

impl Weigh for Message {
    /// A peer's send queue is bounded in bytes: a follower that lags
    /// behind gets what fits, and raft sends the rest later.
    fn weight(&self) -> usize {
        raft_weight(self)
    }
}

impl Weigh for SnapMsg {
    fn weight(&self) -> usize {
        ITEM_OVERHEAD + SnapMsg::weight(self)
    }
}

/// The bytes a raft message holds: its entries, snapshot and context.
pub fn raft_weight(msg: &Message) -> usize {
    let entries: usize = msg.entries.iter().map(entry_weight).sum();
    ITEM_OVERHEAD + entries + msg.get_snapshot().data.len() + msg.context.len()
}

/// The bytes a log entry holds.
pub fn entry_weight(e: &Entry) -> usize {
    ITEM_OVERHEAD + e.data.len() + e.context.len()
}

/// What the service manager receives, in order.
pub enum Decision {
    /// The protocol's work: committed entries, a snapshot from the leader,
    /// reads without the log.
    Apply(Apply),
    /// Report the applied index and the state digest (the asker computes
    /// it from a copy) once everything before this request has executed.
    Status(oneshot::Sender<(u64, FrozenDigest)>),
    /// Replace the execution scheduler between two entries; the answer is
    /// the stall, or why the running scheduler stays.
    Reconfigure(SchedConfig, oneshot::Sender<Result<Duration, String>>),
}

impl Weigh for Decision {
    /// Committed entries and a snapshot weigh what they carry; reads keep
    /// their bytes in ClientIO's budget until they execute.
    fn weight(&self) -> usize {
        match self {
            Decision::Apply(Apply::Entries(entries)) => entries.iter().map(entry_weight).sum::<usize>() + ITEM_OVERHEAD,
            Decision::Apply(Apply::Snapshot(snap, _)) => snap.data.len() + ITEM_OVERHEAD,
            Decision::Apply(Apply::Reads(reads, _)) => reads.len() * ITEM_OVERHEAD + ITEM_OVERHEAD,
            Decision::Status(_) | Decision::Reconfigure(..) => ITEM_OVERHEAD,
        }
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
    rx: Receiver<Request>,
    slots: Arc<Semaphore>,
}

/// A queue of at most `depth` requests from async ClientIO tasks to the
/// protocol thread, which selects on it together with peer messages. A
/// request holds its slot ([`Request::slot`]) until the protocol takes it
/// into an entry, or, a read, hands it to execution.
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
            Ok(slot) => r.slot = Lease::new(slot),
            Err(_) => return Err(Box::new(r)),
        }
        self.tx.send(r).map_err(|e| Box::new(e.0))
    }
}

impl RequestSender {
    /// Queues `r` if there is room now; gives it back if not, or if the
    /// protocol thread is gone.
    pub fn try_send(&self, mut r: Request) -> Result<(), Box<Request>> {
        match self.slots.clone().try_acquire_owned() {
            Ok(slot) => r.slot = Lease::new(slot),
            Err(_) => return Err(Box::new(r)),
        }
        self.tx.send(r).map_err(|e| Box::new(e.0))
    }
}

impl RequestReceiver {
    /// A request if one is queued.
    pub fn try_recv(&self) -> Option<Request> {
        self.rx.try_recv().ok()
    }

    /// Adds a receive from this queue to `sel`; finish it with
    /// [`RequestReceiver::complete`].
    pub fn select<'a>(&'a self, sel: &mut crossbeam::channel::Select<'a>) -> usize {
        sel.recv(&self.rx)
    }

    /// Completes a receive [`RequestReceiver::select`] added and `sel`
    /// chose; `None` once every sender is gone.
    pub fn complete(&self, op: crossbeam::channel::SelectedOperation<'_>) -> Option<Request> {
        op.recv(&self.rx).ok()
    }
}

impl Drop for RequestReceiver {
    fn drop(&mut self) {
        self.slots.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(seq: u64) -> Request {
        let mut encoded = Vec::new();
        psmr_core::entry::encode_command(&mut encoded, 1, seq, &[1]);
        Request::new(1, 1, encoded, 1, 0)
    }

    #[test]
    fn the_queue_bounds_requests_and_frees_a_slot_once_a_request_is_taken() {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let (tx, rx) = request_queue(2);
        rt.block_on(async {
            tx.send(request(1)).await.unwrap();
            tx.send(request(2)).await.unwrap();
            let third = tx.send(request(3));
            tokio::pin!(third);
            assert!(poll_once(third.as_mut()).is_none(), "full: the third waits for a slot");
            drop(rx.rx.try_recv().unwrap());
            assert!(poll_once(third.as_mut()).is_some(), "a slot is free once a request is taken");
            drop(rx);
            assert!(tx.send(request(4)).await.is_err(), "the protocol thread is gone");
        });
    }

    struct NoWake;

    impl std::task::Wake for NoWake {
        fn wake(self: Arc<Self>) {}
    }

    /// Polls `f` once, with a waker that does nothing.
    fn poll_once<F: std::future::Future + ?Sized>(f: std::pin::Pin<&mut F>) -> Option<F::Output> {
        let waker = std::task::Waker::from(Arc::new(NoWake));
        let mut cx = std::task::Context::from_waker(&waker);
        match f.poll(&mut cx) {
            std::task::Poll::Ready(v) => Some(v),
            std::task::Poll::Pending => None,
        }
    }
}
