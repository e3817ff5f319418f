//! What the client port asks of the replica beyond its requests: status,
//! a scheduler switch, a membership change, metrics and statistics. The
//! port knows the replica only through this
//! ([`psmr_transport::client::Control`]).

use crate::handles::Scheduling;
use crate::metrics::{exposition, Observed};
use psmr_core::snapfile::SnapshotId;
use psmr_core::store::{descriptor_id, Store};
use psmr_model::wire::{MemberChange, ReplicaStatus, ServerMsg, RETRY_LATER, SNAPSHOT_CHUNK_MAX};
use psmr_sched::SchedConfig;
use psmr_storage::Log;
use psmr_transport::client::{BoxFuture, Control};
use psmr_transport::msg::{Decision, Inbound};
use psmr_transport::queue::Sender;
use psmr_transport::view::ClusterView;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::sync::Semaphore;

/// The scheduler configuration for a scheduler name, a worker count and a
/// mapping spec (empty: the default), or why there is none.
pub(crate) type Planner = Arc<dyn Fn(&str, usize, &str) -> Result<SchedConfig, String> + Send + Sync>;

/// A test of encoded operations that the replica's application decides
/// (whether one only reads; whether one needs the admin role).
pub(crate) type OpTest = Arc<dyn Fn(&[u8]) -> bool + Send + Sync>;

/// See the module documentation.
pub(crate) struct ReplicaControl {
    pub(crate) id: u64,
    /// Where clients reach this replica.
    pub(crate) addr: SocketAddr,
    pub(crate) view: Arc<ClusterView>,
    pub(crate) scheduling: Arc<Scheduling>,
    pub(crate) observed: Observed,
    pub(crate) decisions: Sender<Decision>,
    /// To the protocol thread: membership changes.
    pub(crate) protocol: Sender<Inbound>,
    pub(crate) planner: Planner,
    pub(crate) reads_only: OpTest,
    /// Whether an operation needs the admin role.
    pub(crate) privileged: OpTest,
    /// The log and snapshot files, for clients that save a snapshot.
    pub(crate) log: Log,
    /// Snapshot chunks read at once, at most [`SNAPSHOT_READS_MAX`]: each
    /// holds a chunk in memory.
    pub(crate) snapshot_reads: Arc<Semaphore>,
}

/// Snapshot chunks (of [`SNAPSHOT_CHUNK_MAX`] bytes) read for clients at
/// once.
pub(crate) const SNAPSHOT_READS_MAX: usize = 4;

/// Bytes of the snapshot file `log` keeps, for a client that saves it:
/// the newest one (`id` empty) or the one `id` names, from `offset`.
fn read_snapshot_chunk(log: &Log, id: &[u8], offset: u64) -> Result<ServerMsg, String> {
    let id = match id.is_empty() {
        true => {
            let kept = log.kept().ok_or("this replica keeps no snapshot yet")?;
            descriptor_id(&kept).map_err(|e| e.to_string())?
        }
        false => SnapshotId::decode(id)?,
    };
    let file = log
        .open_snapshot(&id)
        .map_err(|e| format!("the snapshot at {} is no longer kept here ({e}): save again", id.index))?;
    let total = file.len();
    if offset > total {
        return Err(format!("offset {offset} beyond the {total} bytes of the snapshot"));
    }
    let mut data = vec![0; (total - offset).min(SNAPSHOT_CHUNK_MAX as u64) as usize];
    let got = file.read_at(offset, &mut data).map_err(|e| e.to_string())?;
    data.truncate(got);
    Ok(ServerMsg::SnapshotChunk { id: id.encode().to_vec(), offset, total, data })
}

impl Control for ReplicaControl {
    fn status(&self) -> BoxFuture<'_, Result<ReplicaStatus, String>> {
        Box::pin(async move {
            let (tx, rx) = tokio::sync::oneshot::channel();
            self.decisions.try_send(Decision::Status(tx)).map_err(|_| "replica busy, try again".to_string())?;
            let (applied, digest) = rx.await.map_err(|_| "replica stopping".to_string())?;
            // A gigabyte state takes seconds to digest: off the async
            // threads, and off the apply loop, which only copied it.
            let digest = tokio::task::spawn_blocking(digest).await.map_err(|e| format!("digest failed: {e}"))?;
            let (scheduler, decision) = self.scheduling.status();
            Ok(ReplicaStatus {
                id: self.id,
                addr: self.addr.to_string(),
                pid: std::process::id(),
                leader: self.view.leader(),
                term: self.view.term(),
                applied,
                digest: digest.to_string(),
                scheduler,
                decision,
                transfers: self.view.transfers_text(),
                cpus: psmr_sched::cpus::Cpus::read().describe(),
            })
        })
    }

    /// Plans the scheduler a client asks for (off the async threads: the
    /// optimizer may run) and has the service manager switch to it
    /// between two entries.
    fn reconfigure(&self, scheduler: String, workers: usize, mapping: String) -> BoxFuture<'_, ServerMsg> {
        Box::pin(async move {
            let planner = self.planner.clone();
            let plan = tokio::task::spawn_blocking(move || planner(&scheduler, workers, &mapping)).await;
            let config = match plan {
                Ok(Ok(config)) => config,
                Ok(Err(why)) => return ServerMsg::Error(why),
                Err(e) => return ServerMsg::Error(format!("planning the scheduler failed: {e}")),
            };
            let (kind, workers) = (config.kind.name().to_string(), config.workers as u32);
            let (reply, answer) = tokio::sync::oneshot::channel();
            if self.decisions.try_send(Decision::Reconfigure(config, reply)).is_err() {
                return ServerMsg::Error("replica busy, try again".into());
            }
            match answer.await {
                Ok(Ok(stall)) => {
                    ServerMsg::Reconfigured { scheduler: kind, workers, stall_ns: stall.as_nanos() as u64 }
                }
                Ok(Err(why)) => ServerMsg::Error(why),
                Err(_) => ServerMsg::Error("the replica is stopping".into()),
            }
        })
    }

    /// Hands a membership change to the protocol thread (the leader's
    /// protocol carries it out) and waits for its answer.
    fn change_membership(&self, change: MemberChange) -> BoxFuture<'_, ServerMsg> {
        Box::pin(async move {
            if !self.view.is_leader() {
                return self.view.redirect();
            }
            let (reply, answer) = tokio::sync::oneshot::channel();
            if self.protocol.try_send(Inbound::Admin(change, reply)).is_err() {
                return ServerMsg::Error(format!("{RETRY_LATER}the protocol thread is busy"));
            }
            answer.await.unwrap_or_else(|_| ServerMsg::Error("the replica is stopping".into()))
        })
    }

    fn metrics(&self) -> String {
        exposition(&self.observed)
    }

    fn stats(&self) -> ServerMsg {
        let workers = self.scheduling.workers();
        let (scheduler, decision) = self.scheduling.status();
        let (at_ns, threads) = (psmr_transport::clock::now_ns(), crate::stages::threads());
        ServerMsg::Stats { at_ns, threads, workers, scheduler, decision }
    }

    fn reads_only(&self, op: &[u8]) -> bool {
        (self.reads_only)(op)
    }

    fn privileged(&self, op: &[u8]) -> bool {
        (self.privileged)(op)
    }

    /// Read off the async threads, a bounded number at once.
    fn snapshot_chunk(&self, id: Vec<u8>, offset: u64) -> BoxFuture<'_, ServerMsg> {
        Box::pin(async move {
            let Ok(permit) = self.snapshot_reads.clone().try_acquire_owned() else {
                return ServerMsg::Error(format!("{RETRY_LATER}{SNAPSHOT_READS_MAX} snapshot reads are running"));
            };
            let log = self.log.clone();
            let read = tokio::task::spawn_blocking(move || {
                let _permit = permit;
                read_snapshot_chunk(&log, &id, offset)
            });
            match read.await {
                Ok(Ok(chunk)) => chunk,
                Ok(Err(why)) => ServerMsg::Error(why),
                Err(e) => ServerMsg::Error(format!("reading the snapshot failed: {e}")),
            }
        })
    }
}
