//! The queues between a replica's stages are bounded in bytes as well as
//! items: a follower whose execution stalls holds at most about
//! `queue_bytes_max` of committed entries waiting for its service manager
//! and of peer messages waiting for its protocol thread, not `queue_depth`
//! items of any size; once execution resumes it catches up.

mod common;

use parking_lot::{Condvar, Mutex};
use psmr_client::{Client, ClientConfig};
use psmr_model::{Access, ClassModel, Command, Refused, Service, SnapshotError};
use psmr_replica::{App, LocalCluster};
use psmr_services::kv::{KvCodec, KvOp, KvReply};
use psmr_services::KvApp;
use std::sync::Arc;
use std::time::Duration;

/// Closed, execution waits at it.
#[derive(Default)]
struct Gate {
    closed: Mutex<bool>,
    opened: Condvar,
}

impl Gate {
    fn set(&self, closed: bool) {
        *self.closed.lock() = closed;
        self.opened.notify_all();
    }
}

/// Opens every gate when dropped.
struct OpenOnDrop(Vec<Arc<Gate>>);

impl Drop for OpenOnDrop {
    fn drop(&mut self) {
        for g in &self.0 {
            g.set(false);
        }
    }
}

/// The kv store, executing only while its gate is open.
struct Gated {
    kv: KvApp,
    gate: Arc<Gate>,
}

impl Service for Gated {
    type Op = KvOp;
    type Reply = KvReply;
    fn execute(&self, c: &Command<KvOp>) -> KvReply {
        let mut closed = self.gate.closed.lock();
        while *closed {
            self.gate.opened.wait(&mut closed);
        }
        drop(closed);
        self.kv.execute(c)
    }
    fn snapshot(&self) -> Vec<u8> {
        self.kv.snapshot()
    }
    fn restore(&self, s: &[u8]) -> Result<(), SnapshotError> {
        self.kv.restore(s)
    }
}

impl App for Gated {
    type Codec = KvCodec;
    fn class_model(&self) -> ClassModel {
        self.kv.class_model()
    }
    fn access(&self, op: &KvOp) -> Result<Access, Refused> {
        self.kv.access(op)
    }
}

const QUEUE_BYTES: usize = 64 << 10;
const VALUE_BYTES: usize = 4 << 10;
const PUTS: usize = 400;

#[test]
fn a_stalled_follower_queues_a_bounded_number_of_bytes_and_catches_up() {
    let gates: Vec<Arc<Gate>> = (0..3).map(|_| Arc::default()).collect();
    let cluster = LocalCluster::builder()
        .replicas(3)
        .scheduler("sequential", 1)
        .configure(|c| {
            c.queue_bytes_max = QUEUE_BYTES;
            // Peer messages of at most 64 KiB of entries, entries of at
            // most 32 KiB: the largest single item that may pass alone.
            c.frame_max = 64 << 10;
            c.peer_frame_max = 256 << 10;
            c.batch_max_bytes = 32 << 10;
            c.snapshot_every = 1 << 40;
        })
        .start(|id| Gated { kv: KvApp::new(&Default::default()).unwrap(), gate: gates[id as usize - 1].clone() })
        .unwrap();
    // Dropped before the cluster: a failed assertion must not leave a
    // replica's thread waiting at its gate while the cluster stops.
    let _open = OpenOnDrop(gates.clone());
    let leader = cluster.wait_for_leader(Duration::from_secs(20)).unwrap();
    let stalled = if leader == 3 { 2 } else { 3 };
    gates[stalled as usize - 1].set(true);

    let mut cc = ClientConfig::new(cluster.client_addrs());
    cc.deadline = Duration::from_secs(30);
    let mut client = Client::new(cc).unwrap();
    for i in 0..PUTS {
        let put = KvOp::Put { key: i.to_string().into_bytes(), value: vec![b'v'; VALUE_BYTES] };
        assert!(client.call(&KvCodec, &[put]).unwrap()[0].is_ok());
    }
    let written = PUTS * VALUE_BYTES;

    let text = cluster.replica(stalled).unwrap().metrics_text();
    let scrape = psmr_replica::metrics::Scrape::parse(&text);
    let peak = |name: &str| scrape.value(name).unwrap_or_else(|| panic!("no {name} in {text}")) as usize;
    // The largest item that passes an empty queue alone: a peer message
    // of 64 KiB of entries plus one entry, with their overheads.
    let largest = (64 << 10) + (32 << 10) + 4096;
    let (apply, peer) = (peak("psmr_queue_apply_peak_bytes"), peak("psmr_queue_peer_peak_bytes"));
    assert!(apply <= QUEUE_BYTES.max(largest), "{apply} bytes of committed entries queued");
    assert!(peer <= QUEUE_BYTES.max(largest), "{peer} bytes of peer messages queued");
    assert!(written > 10 * QUEUE_BYTES.max(largest), "the load would have overrun the bound");
    assert!(apply >= QUEUE_BYTES / 2, "the apply queue filled up ({apply} bytes): the follower was stalled");

    gates[stalled as usize - 1].set(false);
    let st =
        common::converged(&cluster.client_addrs(), Duration::from_secs(60), "the stalled follower never caught up");
    assert!(st.applied as usize >= PUTS, "{st:?}");
}
