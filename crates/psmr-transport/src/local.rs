//! The client port without a socket: a front end that runs inside the
//! replica (the Redis gateway) queues its requests for the protocol thread
//! as a client connection does ([`crate::client`]) — the same checks, the
//! same byte budget, the same back-pressure — and takes its replies from
//! an outbox of its own in the [`Router`](crate::router::Router), without
//! a loopback hop, a frame to encode or a second parse.
//!
//! Only the leader takes requests. On a follower, or when the leader loses
//! its leadership or does not answer within the session's patience, a
//! submission ends [`LocalError::Elsewhere`]: its caller sends the same
//! commands, with the same sequence numbers, over the network
//! (`psmr_client::AsyncClient::resume`), and the reply cache answers any
//! that executed meanwhile.

use crate::client::ClientIo;
use crate::router::{Outbox, OutboxRx, Outgoing};
use psmr_model::wire::{Outcome, ServerMsg};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use thiserror::Error;

/// Why an in-process submission did not finish.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum LocalError {
    /// Not here: this replica does not lead, stopped leading, is stopping,
    /// or did not answer in time. Send the commands again over the network.
    #[error("not served here: {0}")]
    Elsewhere(String),
    /// Refused, as a client would be told (too large, empty, reserved id).
    #[error("{0}")]
    Refused(String),
    /// Replies to this session were dropped because its outbox was full
    /// (its caller took them too slowly): ask again, here, for the commands
    /// whose outcomes are still missing.
    #[error("replies dropped: the session's outbox was full")]
    Dropped,
}

/// One in-process client of the replica: its id, and its outbox in the
/// router for as long as it lives.
pub struct LocalSession {
    io: Arc<ClientIo>,
    client: u64,
    conn: u64,
    outbox: Outbox,
    rx: OutboxRx,
    /// When the request queued last was read (for its latency).
    read_at: Option<Instant>,
    /// Replies the outbox had dropped when that request was queued.
    dropped: u64,
}

impl ClientIo {
    /// A session of client `client` inside this replica.
    pub fn local_session(self: &Arc<Self>, client: u64) -> LocalSession {
        let conn = self.next_conn.fetch_add(1, Ordering::Relaxed);
        let (outbox, rx) = self.port.router.outbox(self.port.config.queue_depth);
        LocalSession { io: self.clone(), client, conn, outbox, rx, read_at: None, dropped: 0 }
    }
}

impl LocalSession {
    /// The session's client id.
    pub fn id(&self) -> u64 {
        self.client
    }

    /// Queues `commands` (sequence number, operation) of this client as
    /// one request; their replies come from [`LocalSession::next`].
    pub async fn queue<'a>(
        &mut self,
        commands: impl ExactSizeIterator<Item = (u64, &'a [u8])> + Clone,
    ) -> Result<(), LocalError> {
        let read_at = Instant::now();
        // Replies to an earlier request that went elsewhere.
        while self.rx.try_recv().is_some() {}
        if let Some(msg) = self.io.check(self.client, commands.clone().map(|(_, op)| op.len())) {
            self.io.port.metrics.request_latency.observe_since(read_at);
            return Err(refusal(msg));
        }
        let held = commands.clone().map(|(_, op)| op.len() + 20).sum::<usize>();
        let held = held.min(self.io.port.config.client_buffer_bytes_max);
        let permits = u32::try_from(held).unwrap_or(u32::MAX);
        let Ok(held) = self.io.buffered.clone().acquire_many_owned(permits).await else {
            return Err(LocalError::Elsewhere("the replica is stopping".into()));
        };
        self.io.port.router.register(self.client, self.conn, &self.outbox);
        let (request, ..) = self.io.encode(self.client, commands, held);
        if self.io.port.requests.send(request).await.is_err() {
            return Err(LocalError::Elsewhere("the replica is stopping".into()));
        }
        self.read_at = Some(read_at);
        self.dropped = self.rx.dropped();
        Ok(())
    }

    /// The next reply to this client: its command's sequence number and
    /// outcome, in the order replies come. Ends [`LocalError::Elsewhere`]
    /// when none comes within `patience`, or the protocol sends this client
    /// elsewhere. A reply not taken stays in the session's outbox, bounded
    /// in bytes; beyond that the router drops it, and once the outbox is
    /// empty this ends [`LocalError::Dropped`]: the commands still missing
    /// must be asked for again.
    pub async fn next(&mut self, patience: Duration) -> Result<(u64, Outcome), LocalError> {
        loop {
            let waiting = self.rx.try_recv();
            if waiting.is_none() && self.rx.dropped() != self.dropped {
                // Nothing more is queued and some replies never will be.
                self.dropped = self.rx.dropped();
                return Err(LocalError::Dropped);
            }
            let item = match waiting {
                Some(item) => Ok(Some(item)),
                None => tokio::time::timeout(patience, self.rx.recv()).await,
            };
            match item {
                Err(_) | Ok(None) => return Err(LocalError::Elsewhere("no answer in time".into())),
                Ok(Some(Outgoing::Reply { client, seq, outcome })) if client == self.client => {
                    return Ok((seq, outcome));
                }
                Ok(Some(Outgoing::Reply { .. })) => {}
                Ok(Some(Outgoing::Msg(msg))) => return Err(refusal(msg)),
            }
        }
    }

    /// The request queued last has every reply it needs (its latency is
    /// recorded as a connection's would be).
    pub fn answered(&mut self) {
        if let Some(at) = self.read_at.take() {
            self.io.port.metrics.request_latency.observe_since(at);
        }
    }
}

/// What a refusal or redirect a connection would be sent means here.
fn refusal(msg: ServerMsg) -> LocalError {
    match msg {
        ServerMsg::Redirect { leader: 0, .. } => LocalError::Elsewhere("no leader elected yet".into()),
        ServerMsg::Redirect { leader, .. } => LocalError::Elsewhere(format!("replica {leader} leads")),
        ServerMsg::Error(m) => LocalError::Refused(m),
        other => LocalError::Refused(format!("unexpected answer {other:?}")),
    }
}

impl Drop for LocalSession {
    fn drop(&mut self) {
        self.io.port.router.unregister(self.client, self.conn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::{BoxFuture, ClientMetrics, ClientPort, Control};
    use crate::life::Life;
    use crate::metrics::{ClientRefusal, CounterSet, Histogram};
    use crate::msg::{request_queue, RequestReceiver};
    use crate::router::Router;
    use crate::view::ClusterView;
    use psmr_core::protocol::View;
    use psmr_core::Config;
    use psmr_model::wire::{MemberChange, ReplicaStatus};
    use raft::StateRole;

    /// A replica whose client port only queues requests.
    struct Queues;

    impl Control for Queues {
        fn status(&self) -> BoxFuture<'_, Result<ReplicaStatus, String>> {
            unreachable!("sessions do not ask")
        }
        fn reconfigure(&self, _: String, _: usize, _: String) -> BoxFuture<'_, ServerMsg> {
            unreachable!("sessions do not ask")
        }
        fn change_membership(&self, _: MemberChange) -> BoxFuture<'_, ServerMsg> {
            unreachable!("sessions do not ask")
        }
        fn metrics(&self) -> String {
            String::new()
        }
        fn stats(&self) -> ServerMsg {
            unreachable!("sessions do not ask")
        }
        fn reads_only(&self, op: &[u8]) -> bool {
            op.first() == Some(&b'r')
        }
        fn privileged(&self, _: &[u8]) -> bool {
            false
        }
        fn snapshot_chunk(&self, _: Vec<u8>, _: u64) -> BoxFuture<'_, ServerMsg> {
            unreachable!("sessions do not ask")
        }
    }

    struct Port {
        io: Arc<ClientIo>,
        requests: RequestReceiver,
        view: Arc<ClusterView>,
        router: Arc<Router>,
    }

    fn port(leader: u64) -> Port {
        let view = Arc::new(ClusterView::new(1, Vec::new(), false));
        let role = if leader == 1 { StateRole::Leader } else { StateRole::Follower };
        view.publish(&View { leader, term: 1, role, commit: 0, last_index: 0, repaired: false });
        let router = Arc::new(Router::new(1 << 20));
        let (tx, requests) = request_queue(8);
        let metrics = ClientMetrics {
            refused: CounterSet::new("reason", ClientRefusal::ALL.iter().map(|r| r.label()).collect()),
            request_latency: Histogram::new(vec![1_000, 1_000_000], 1e9),
        };
        let port = ClientPort {
            config: Arc::new(Config::default()),
            life: Arc::new(Life::new(1)),
            view: view.clone(),
            router: router.clone(),
            requests: tx,
            control: Arc::new(Queues),
            metrics,
            gate: Arc::new(psmr_auth::Gate::insecure()),
            tls: None,
        };
        Port { io: Arc::new(ClientIo::new(port)), requests, view, router }
    }

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap()
    }

    fn ok(b: &[u8]) -> Outcome {
        Outcome::Ok(b.to_vec())
    }

    fn commands(first: u64, ops: &[Vec<u8>]) -> impl ExactSizeIterator<Item = (u64, &[u8])> + Clone {
        ops.iter().enumerate().map(move |(i, op)| (first + i as u64, op.as_slice()))
    }

    #[test]
    fn a_request_is_queued_as_a_connection_would_and_answered_through_the_router() {
        let p = port(1);
        let mut s = p.io.local_session(7);
        let ops = vec![b"w1".to_vec(), b"w2".to_vec()];
        let got = rt().block_on(async {
            s.queue(commands(10, &ops)).await.unwrap();
            let r = p.requests.try_recv().expect("queued at once");
            assert_eq!((r.client, r.count, r.read), (7, 2, false));
            // Another client's reply is passed over; replies come as the
            // router has them, in any order (the caller orders them).
            p.router.reply(8, 10, Outcome::Ok(b"other".to_vec()));
            p.router.reply(7, 11, Outcome::Ok(b"b".to_vec()));
            p.router.reply(7, 10, Outcome::Ok(b"a".to_vec()));
            let patience = Duration::from_secs(1);
            let got = vec![s.next(patience).await.unwrap(), s.next(patience).await.unwrap()];
            s.answered();
            got
        });
        assert_eq!(got, vec![(11, ok(b"b")), (10, ok(b"a"))]);
    }

    #[test]
    fn reads_are_marked_and_a_follower_sends_the_request_elsewhere() {
        let p = port(1);
        let mut s = p.io.local_session(7);
        let rt = rt();
        let ops = vec![b"r".to_vec()];
        let (done, r) = rt.block_on(async {
            s.queue(commands(1, &ops)).await.unwrap();
            (s.next(Duration::from_millis(50)).await, p.requests.try_recv().unwrap())
        });
        assert!(r.read, "a request of reads only is served without the log");
        assert!(matches!(done, Err(LocalError::Elsewhere(_))), "nobody answered: {done:?}");
        p.view.publish(&View {
            leader: 2,
            term: 2,
            role: StateRole::Follower,
            commit: 0,
            last_index: 0,
            repaired: false,
        });
        let done = rt.block_on(s.queue(commands(2, &ops)));
        assert_eq!(done, Err(LocalError::Elsewhere("replica 2 leads".into())));
        assert!(p.requests.try_recv().is_none(), "a follower queues nothing");
    }

    #[test]
    fn a_redirect_from_the_protocol_ends_the_wait_and_a_bad_request_is_refused() {
        let p = port(1);
        let mut s = p.io.local_session(7);
        let rt = rt();
        let ops = [b"w".to_vec()];
        let done = rt.block_on(async {
            s.queue(commands(1, &ops)).await.unwrap();
            p.router.send(7, Outgoing::Msg(ServerMsg::Redirect { leader: 3, addr: "x".into() }));
            s.next(Duration::from_secs(60)).await
        });
        assert_eq!(done, Err(LocalError::Elsewhere("replica 3 leads".into())));
        let done = rt.block_on(s.queue(commands(2, &[])));
        assert!(matches!(done, Err(LocalError::Refused(_))), "an empty request: {done:?}");
        drop(s);
        assert_eq!(p.router.clients(), 0, "a session's route goes with it");
    }

    #[test]
    fn replies_the_outbox_dropped_are_reported_once_the_rest_is_taken() {
        let p = port(1);
        let mut s = p.io.local_session(7);
        let ops = vec![b"r1".to_vec(), b"r2".to_vec()];
        let big = || Outcome::Ok(vec![0; 2 << 20]);
        let got = rt().block_on(async {
            s.queue(commands(1, &ops)).await.unwrap();
            // The router holds 1 MiB for all: the first big reply gets in
            // (an empty budget admits one item), the second is dropped.
            p.router.reply(7, 1, big());
            p.router.reply(7, 2, big());
            let first = s.next(Duration::from_secs(60)).await.map(|(seq, _)| seq);
            (first, s.next(Duration::from_secs(60)).await)
        });
        assert_eq!(got, (Ok(1), Err(LocalError::Dropped)));
        assert_eq!(p.router.dropped.load(Ordering::Relaxed), 1);
    }
}
