//! ClientIO (002 §V-A): non-blocking connections on a pool of
//! `client_io_threads` threads (a tokio runtime that does nothing else).
//!
//! A connection reads frames, at most `frame_max` bytes each. A client
//! request is checked (a follower redirects it to the leader; every
//! operation must decode; size limits), then queued for the Batcher; when
//! that bounded queue is full the connection stops reading until there is
//! room, and TCP slows the client down. A frame that does not decode closes
//! that connection with a logged reason, nothing else. Replies come through
//! the connection's outbox ([`crate::router`]); its writer coalesces the
//! outcomes waiting for one client into one `Replies` frame.

use crate::batcher::Request;
use crate::manager::Decision;
use crate::router::{Outbox, Outgoing};
use crate::store::EntryCommand;
use crate::Shared;
use crossbeam::channel::Sender;
use psmr_model::wire::{read_frame_async, ClientMsg, Outcome, ReplicaStatus, ServerMsg, WireError};
use psmr_model::ClientId;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tracing::{debug, warn};

pub(crate) struct ClientIo {
    pub(crate) shared: Arc<Shared>,
    pub(crate) requests: mpsc::Sender<Request>,
    pub(crate) decisions: Sender<Decision>,
    /// Decodes an operation as the service manager will (the service is
    /// generic; this is not).
    pub(crate) check_op: crate::CheckOp,
    pub(crate) connections: AtomicUsize,
    pub(crate) next_conn: AtomicU64,
}

impl ClientIo {
    pub(crate) async fn serve(self: Arc<Self>, listener: TcpListener) {
        loop {
            let (stream, peer) = tokio::select! {
                r = listener.accept() => match r {
                    Ok(x) => x,
                    Err(e) => {
                        warn!("accept failed: {e}");
                        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                        continue;
                    }
                },
                _ = self.shared.stopped() => return,
            };
            if self.connections.fetch_add(1, Ordering::AcqRel) >= self.shared.config.max_connections {
                self.connections.fetch_sub(1, Ordering::AcqRel);
                warn!(%peer, "refusing a client: {} connections already", self.shared.config.max_connections);
                let mut stream = stream;
                let msg = ServerMsg::Error("too many connections, try later".into()).to_frame();
                let _ = stream.write_all(&msg).await;
                continue;
            }
            let io = self.clone();
            tokio::spawn(async move {
                let conn = io.next_conn.fetch_add(1, Ordering::Relaxed);
                if let Err(e) = io.connection(stream, conn).await {
                    match e {
                        WireError::Closed => debug!(%peer, "client disconnected"),
                        e => warn!(%peer, "closing client connection: {e}"),
                    }
                }
                io.connections.fetch_sub(1, Ordering::AcqRel);
            });
        }
    }

    async fn connection(&self, stream: TcpStream, conn: u64) -> Result<(), WireError> {
        stream.set_nodelay(true)?;
        let (mut rd, wr) = stream.into_split();
        let (outbox, rx) = mpsc::channel(self.shared.config.queue_depth);
        let writer = tokio::spawn(write_loop(wr, rx));
        let mut clients = Vec::new();
        let result = self.read_loop(&mut rd, conn, &outbox, &mut clients).await;
        for c in clients {
            self.shared.router.unregister(c, conn);
        }
        if let Err(e) = &result {
            if !matches!(e, WireError::Closed | WireError::Io(_)) {
                // Tell the client why before closing, if it still listens.
                let _ = outbox.send(Outgoing::Msg(ServerMsg::Error(e.to_string()))).await;
            }
        }
        drop(outbox);
        let _ = writer.await;
        result
    }

    async fn read_loop(
        &self,
        rd: &mut tokio::net::tcp::OwnedReadHalf,
        conn: u64,
        outbox: &Outbox,
        clients: &mut Vec<u64>,
    ) -> Result<(), WireError> {
        let config = &self.shared.config;
        loop {
            let frame = tokio::select! {
                f = read_frame_async(rd, config.frame_max) => f?,
                _ = self.shared.stopped() => return Ok(()),
            };
            match ClientMsg::from_frame(&frame)? {
                ClientMsg::Status => {
                    let status = self.status().await;
                    let msg = match status {
                        Ok(s) => ServerMsg::Status(s),
                        Err(e) => ServerMsg::Error(e),
                    };
                    if outbox.send(Outgoing::Msg(msg)).await.is_err() {
                        return Ok(());
                    }
                }
                ClientMsg::Stats => {
                    let workers = self.shared.worker_metrics.get().map(|m| m.snapshot()).unwrap_or_default();
                    let msg =
                        ServerMsg::Stats { at_ns: crate::stages::now_ns(), threads: crate::stages::threads(), workers };
                    if outbox.send(Outgoing::Msg(msg)).await.is_err() {
                        return Ok(());
                    }
                }
                ClientMsg::Request { client, commands } => {
                    if !clients.contains(&client) {
                        clients.push(client);
                    }
                    self.shared.router.register(client, conn, outbox);
                    if let Some(msg) = self.check(client, &commands) {
                        if outbox.send(Outgoing::Msg(msg)).await.is_err() {
                            return Ok(());
                        }
                        continue;
                    }
                    let mut bytes = 0;
                    let mut checked = Vec::with_capacity(commands.len());
                    for c in commands {
                        if let Err(e) = (self.check_op)(ClientId(client), c.seq, &c.op) {
                            let outcome = Outcome::Rejected(format!("bad operation: {e}"));
                            let _ = outbox.send(Outgoing::Reply { client, seq: c.seq, outcome }).await;
                            continue;
                        }
                        bytes += c.op.len();
                        checked.push(EntryCommand { client, seq: c.seq, op: c.op });
                    }
                    if checked.is_empty() {
                        continue;
                    }
                    // Waits while the batcher is behind: back-pressure.
                    if self.requests.send(Request { commands: checked, bytes }).await.is_err() {
                        return Ok(());
                    }
                }
            }
        }
    }

    /// A whole-request refusal, if any.
    fn check(&self, client: u64, commands: &[psmr_model::wire::WireCommand]) -> Option<ServerMsg> {
        let config = &self.shared.config;
        if !self.shared.is_leader.load(Ordering::Acquire) {
            let leader = self.shared.leader.load(Ordering::Acquire);
            let addr = config.member(leader).map(|m| m.client.to_string()).unwrap_or_default();
            return Some(ServerMsg::Redirect { leader, addr });
        }
        if client == 0 {
            return Some(ServerMsg::Error("client id 0 is reserved".into()));
        }
        if commands.is_empty() {
            return Some(ServerMsg::Error("a request needs at least one command".into()));
        }
        if commands.len() > config.batch_max_commands {
            return Some(ServerMsg::Error(format!(
                "a request holds at most {} commands, this one {}",
                config.batch_max_commands,
                commands.len()
            )));
        }
        let bytes: usize = commands.iter().map(|c| c.op.len()).sum();
        if bytes > config.batch_max_bytes {
            return Some(ServerMsg::Error(format!(
                "a request holds at most {} bytes of operations, this one {bytes}",
                config.batch_max_bytes
            )));
        }
        None
    }

    async fn status(&self) -> Result<ReplicaStatus, String> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.decisions.try_send(Decision::Status(tx)).map_err(|_| "replica busy, try again".to_string())?;
        let (applied, digest) = rx.await.map_err(|_| "replica stopping".to_string())?;
        let me = self.shared.config.member(self.shared.id).map_err(|e| e.to_string())?;
        Ok(ReplicaStatus {
            id: self.shared.id,
            addr: me.client.to_string(),
            pid: std::process::id(),
            leader: self.shared.leader.load(Ordering::Acquire),
            term: self.shared.term.load(Ordering::Acquire),
            applied,
            digest: digest.to_string(),
        })
    }
}

/// Writes a connection's outgoing messages, coalescing the outcomes that
/// are waiting into one `Replies` frame per client.
async fn write_loop(mut wr: tokio::net::tcp::OwnedWriteHalf, mut rx: mpsc::Receiver<Outgoing>) {
    let mut buf = Vec::new();
    let mut replies: Vec<(u64, Vec<(u64, Outcome)>)> = Vec::new();
    while let Some(first) = rx.recv().await {
        let mut next = Some(first);
        let mut taken = 0;
        while let Some(item) = next.take() {
            match item {
                Outgoing::Reply { client, seq, outcome } => match replies.iter_mut().find(|r| r.0 == client) {
                    Some(r) => r.1.push((seq, outcome)),
                    None => replies.push((client, vec![(seq, outcome)])),
                },
                Outgoing::Msg(m) => {
                    flush_replies(&mut replies, &mut buf);
                    buf.extend_from_slice(&m.to_frame());
                }
            }
            taken += 1;
            if taken < 4096 {
                next = rx.try_recv().ok();
            }
        }
        flush_replies(&mut replies, &mut buf);
        if wr.write_all(&buf).await.is_err() {
            return;
        }
        buf.clear();
    }
    let _ = wr.shutdown().await;
}

fn flush_replies(replies: &mut Vec<(u64, Vec<(u64, Outcome)>)>, buf: &mut Vec<u8>) {
    for (client, list) in replies.drain(..) {
        buf.extend_from_slice(&ServerMsg::Replies { client, replies: list }.to_frame());
    }
}
