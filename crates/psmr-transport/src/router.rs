//! Routes replies to the client connections they belong to.
//!
//! Every replica executes every command, but only the replica a client is
//! connected to answers it. ClientIO registers a client's connection when
//! the client sends a request; the workers (through the reply sink) and the
//! service manager hand outcomes to [`Router::reply`], which puts them on
//! that connection's bounded outbox without waiting. A client that does not
//! read its replies fills its outbox; further replies to it are dropped
//! (and counted), and it gets them from the reply cache when it retries.
//!
//! Outboxes are bounded in items and in bytes: per connection
//! ([`OUTBOX_BYTES_MAX`]) and over all connections (the router's budget),
//! so that a client that asks for large values and never reads them cannot
//! make the replica hold them.

use parking_lot::Mutex;
use psmr_model::wire::{Outcome, ServerMsg};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::mpsc;

/// Bytes of outgoing messages one connection may have queued.
pub const OUTBOX_BYTES_MAX: usize = 64 << 20;

const SHARDS: usize = 16;

/// What a connection's writer sends.
#[derive(Debug)]
pub enum Outgoing {
    /// One command's outcome, coalesced with others into `Replies` frames.
    Reply {
        /// The client.
        client: u64,
        /// The command.
        seq: u64,
        /// Its outcome.
        outcome: Outcome,
    },
    /// A whole message.
    Msg(ServerMsg),
}

impl Outgoing {
    /// Bytes this item holds, roughly (what the byte bounds count).
    fn size(&self) -> usize {
        match self {
            Outgoing::Reply { outcome, .. } => 24 + outcome.payload_len(),
            Outgoing::Msg(_) => 256,
        }
    }
}

/// Bytes queued, against a bound.
#[derive(Debug)]
struct Budget {
    used: AtomicUsize,
    max: usize,
    /// Items refused for want of room.
    dropped: AtomicU64,
}

impl Budget {
    fn new(max: usize) -> Arc<Self> {
        Arc::new(Self { used: AtomicUsize::new(0), max, dropped: AtomicU64::new(0) })
    }

    fn take(&self, n: usize) -> bool {
        let before = self.used.fetch_add(n, Ordering::AcqRel);
        if before + n > self.max && before > 0 {
            self.used.fetch_sub(n, Ordering::AcqRel);
            return false;
        }
        true
    }

    fn give(&self, n: usize) {
        self.used.fetch_sub(n, Ordering::AcqRel);
    }
}

/// A connection's outbox: the send side, bounded in items and bytes.
#[derive(Clone, Debug)]
pub struct Outbox {
    tx: mpsc::Sender<Outgoing>,
    mine: Arc<Budget>,
    all: Arc<Budget>,
}

/// The receive side of an [`Outbox`], read by the connection's writer.
#[derive(Debug)]
pub struct OutboxRx {
    rx: mpsc::Receiver<Outgoing>,
    mine: Arc<Budget>,
    all: Arc<Budget>,
}

impl Outbox {
    /// Queues `item` if there is room in items and bytes; false if not.
    pub fn try_send(&self, item: Outgoing) -> bool {
        let n = item.size();
        let sent = if !self.mine.take(n) {
            false
        } else if !self.all.take(n) {
            self.mine.give(n);
            false
        } else if self.tx.try_send(item).is_err() {
            self.mine.give(n);
            self.all.give(n);
            false
        } else {
            true
        };
        if !sent {
            self.mine.dropped.fetch_add(1, Ordering::Relaxed);
        }
        sent
    }

    /// Queues `item`, waiting for room in items (ClientIO's own small
    /// messages; the byte bound lets a message through when the queue is
    /// empty of bytes). Err when the connection's writer is gone.
    pub async fn send(&self, item: Outgoing) -> Result<(), ()> {
        let n = item.size();
        self.mine.used.fetch_add(n, Ordering::AcqRel);
        self.all.used.fetch_add(n, Ordering::AcqRel);
        if self.tx.send(item).await.is_err() {
            self.mine.give(n);
            self.all.give(n);
            return Err(());
        }
        Ok(())
    }
}

impl OutboxRx {
    fn taken(&self, item: Option<Outgoing>) -> Option<Outgoing> {
        if let Some(i) = &item {
            let n = i.size();
            self.mine.give(n);
            self.all.give(n);
        }
        item
    }

    /// The next item; None once every sender is gone.
    pub async fn recv(&mut self) -> Option<Outgoing> {
        let item = self.rx.recv().await;
        self.taken(item)
    }

    /// The next item if one is waiting.
    pub fn try_recv(&mut self) -> Option<Outgoing> {
        let item = self.rx.try_recv().ok();
        self.taken(item)
    }

    /// Items this outbox has refused so far, for want of room.
    pub fn dropped(&self) -> u64 {
        self.mine.dropped.load(Ordering::Relaxed)
    }
}

struct Route {
    conn: u64,
    outbox: Outbox,
}

/// See the module documentation.
pub struct Router {
    shards: Vec<Mutex<HashMap<u64, Route>>>,
    /// Bytes queued in all outboxes.
    queued: Arc<Budget>,
    /// Replies dropped because an outbox was full or gone.
    pub dropped: AtomicU64,
}

impl Router {
    /// A router whose outboxes hold at most `bytes_max` bytes together.
    pub fn new(bytes_max: usize) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            queued: Budget::new(bytes_max),
            dropped: AtomicU64::new(0),
        }
    }

    /// A new connection's outbox of at most `items` items.
    pub fn outbox(&self, items: usize) -> (Outbox, OutboxRx) {
        let (tx, rx) = mpsc::channel(items);
        let mine = Budget::new(OUTBOX_BYTES_MAX);
        (Outbox { tx, mine: mine.clone(), all: self.queued.clone() }, OutboxRx { rx, mine, all: self.queued.clone() })
    }

    /// Bytes queued in all outboxes.
    pub fn queued_bytes(&self) -> usize {
        self.queued.used.load(Ordering::Acquire)
    }

    fn shard(&self, client: u64) -> &Mutex<HashMap<u64, Route>> {
        let h = client.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 60;
        &self.shards[h as usize % SHARDS]
    }

    /// Replies to `client` go to connection `conn` from now on.
    pub fn register(&self, client: u64, conn: u64, outbox: &Outbox) {
        let mut shard = self.shard(client).lock();
        match shard.get(&client) {
            Some(r) if r.conn == conn => {}
            _ => {
                shard.insert(client, Route { conn, outbox: outbox.clone() });
            }
        }
    }

    /// Connection `conn` closed: forget its clients.
    pub fn unregister(&self, client: u64, conn: u64) {
        let mut shard = self.shard(client).lock();
        if shard.get(&client).is_some_and(|r| r.conn == conn) {
            shard.remove(&client);
        }
    }

    /// Sends an outcome to `client` if it is connected here.
    pub fn reply(&self, client: u64, seq: u64, outcome: Outcome) {
        self.send(client, Outgoing::Reply { client, seq, outcome });
    }

    /// Sends an outcome made by `outcome` to `client` if it is connected
    /// here; otherwise `outcome` is not called (every replica executes
    /// every command, and most replies have nobody to go to).
    pub fn reply_with(&self, client: u64, seq: u64, outcome: impl FnOnce() -> Outcome) {
        self.send_with(client, || Outgoing::Reply { client, seq, outcome: outcome() });
    }

    /// Sends a message to `client` if it is connected here.
    pub fn send(&self, client: u64, item: Outgoing) {
        self.send_with(client, || item);
    }

    fn send_with(&self, client: u64, item: impl FnOnce() -> Outgoing) {
        let shard = self.shard(client).lock();
        if let Some(route) = shard.get(&client) {
            if !route.outbox.try_send(item()) {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Connected clients.
    pub fn clients(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }
}

impl psmr_core::apply::Replies for Router {
    fn answer(&self, client: u64, seq: u64, outcome: &mut dyn FnMut() -> Outcome) {
        self.reply_with(client, seq, outcome);
    }
}
