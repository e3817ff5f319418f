//! The Batcher thread (002 §V-C1): turns client requests into log entries
//! and hands them to the protocol thread through a queue of `pipeline`
//! entries. An entry stops taking requests once it holds
//! `batch_max_commands` commands or `batch_max_bytes` bytes of operations,
//! or `batch_delay_us` after its first request; a request is never split
//! (ClientIO refuses requests above either limit), so an entry holds at
//! most twice the limits. When that queue is full the batcher stops taking requests, the
//! request queue fills, ClientIO stops reading sockets, and TCP slows the
//! clients down.

use crate::protocol::Proposal;
use crate::store::{encode_entry, EntryCommand};
use crate::Shared;
use crossbeam::channel::Sender;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// One client request, checked by ClientIO.
pub struct Request {
    /// Its commands.
    pub commands: Vec<EntryCommand>,
    /// Bytes of operations in it.
    pub bytes: usize,
    /// The frame's share of ClientIO's memory budget, released when the
    /// Batcher has copied the request into a log entry.
    pub held: Option<tokio::sync::OwnedSemaphorePermit>,
}

pub(crate) fn run(shared: &Arc<Shared>, mut requests: mpsc::Receiver<Request>, proposals: &Sender<Proposal>) {
    let rt = match tokio::runtime::Builder::new_current_thread().enable_time().build() {
        Ok(rt) => rt,
        Err(e) => {
            shared.fail(format!("cannot start the batcher's timer: {e}"));
            return;
        }
    };
    let config = &shared.config;
    let delay = Duration::from_micros(config.batch_delay_us);
    loop {
        let entry = rt.block_on(async {
            let first = requests.recv().await?;
            let deadline = tokio::time::Instant::now() + delay;
            let (mut commands, mut bytes) = (first.commands, first.bytes);
            while commands.len() < config.batch_max_commands && bytes < config.batch_max_bytes {
                // Whatever is already queued joins without waiting.
                let next = match requests.try_recv() {
                    Ok(r) => Some(r),
                    Err(mpsc::error::TryRecvError::Disconnected) => None,
                    Err(mpsc::error::TryRecvError::Empty) if delay.is_zero() => None,
                    Err(mpsc::error::TryRecvError::Empty) => {
                        tokio::time::timeout_at(deadline, requests.recv()).await.ok().flatten()
                    }
                };
                let Some(r) = next else { break };
                // A request never splits across entries: its commands are
                // ordered together.
                commands.extend(r.commands);
                bytes += r.bytes;
            }
            Some(commands)
        });
        let Some(commands) = entry else { return };
        if proposals.send(Proposal { data: encode_entry(&commands) }).is_err() {
            return;
        }
    }
}
