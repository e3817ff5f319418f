//! Routes replies to the client connections they belong to.
//!
//! Every replica executes every command, but only the replica a client is
//! connected to answers it. ClientIO registers a client's connection when
//! the client sends a request; the workers (through the reply sink) and the
//! service manager hand outcomes to [`Router::reply`], which puts them on
//! that connection's bounded outbox without waiting. A client that does not
//! read its replies fills its outbox; further replies to it are dropped
//! (and counted), and it gets them from the reply cache when it retries.

use parking_lot::Mutex;
use psmr_model::wire::{Outcome, ServerMsg};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::sync::mpsc;

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

/// A connection's outbox.
pub type Outbox = mpsc::Sender<Outgoing>;

struct Route {
    conn: u64,
    outbox: Outbox,
}

/// See the module documentation.
pub struct Router {
    shards: Vec<Mutex<HashMap<u64, Route>>>,
    /// Replies dropped because an outbox was full or gone.
    pub dropped: AtomicU64,
}

impl Default for Router {
    fn default() -> Self {
        Self { shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(), dropped: AtomicU64::new(0) }
    }
}

impl Router {
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

    /// Sends a message to `client` if it is connected here.
    pub fn send(&self, client: u64, item: Outgoing) {
        let shard = self.shard(client).lock();
        if let Some(route) = shard.get(&client) {
            if route.outbox.try_send(item).is_err() {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Connected clients.
    pub fn clients(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }
}
