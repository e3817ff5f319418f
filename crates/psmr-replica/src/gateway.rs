//! The Redis port of a replica: `psmr-gateway`, submitting in-process
//! while this replica leads ([`psmr_transport::local`]) and through the
//! cluster's client protocol otherwise.

use crate::error::ReplicaError;
use crate::start::Handles;
use psmr_client::{AsyncClient, ClientConfig, ClientError, Deliver, InOrder, Round, Session, Submit};
use psmr_gateway::{Gateway, GatewayLimits, Info, Serve};
use psmr_model::App;
use psmr_transport::client::ClientIo;
use psmr_transport::life::Life;
use psmr_transport::local::{LocalError, LocalSession};
use psmr_transport::view::ClusterView;
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

/// Sessions of this replica's cluster as it knows it now.
struct Cluster {
    me: SocketAddr,
    view: Arc<ClusterView>,
    frame_max: usize,
    io: Arc<ClientIo>,
    /// TLS to the client ports, if they are in TLS.
    tls: Option<psmr_client::Connector>,
}

impl Submit for Cluster {
    type Session = Both;

    /// A session that queues its requests here while this replica leads,
    /// and otherwise sends them as an [`AsyncClient`] that tries this
    /// replica first (a follower redirects it to the leader at once).
    fn session(&self) -> Result<Both, ClientError> {
        let mut cluster = vec![self.me];
        cluster.extend(self.view.members().iter().map(|m| m.client).filter(|&a| a != self.me));
        let mut config = ClientConfig::new(cluster);
        config.frame_max = self.frame_max.max(psmr_model::wire::FRAME_MAX_DEFAULT);
        config.tls = self.tls.clone();
        let patience = config.attempt_timeout;
        let net = AsyncClient::new(config)?;
        let local = self.io.local_session(net.id());
        Ok(Both { local, net, patience })
    }
}

/// One gateway connection's client: the in-process way and the network
/// way, one client id and one sequence of commands between them.
struct Both {
    local: LocalSession,
    net: AsyncClient,
    /// How long a request queued here may wait for its replies before it
    /// goes the network way (the network client's wait per attempt).
    patience: Duration,
}

impl Session for Both {
    fn id(&self) -> u64 {
        self.net.id()
    }

    async fn submit<D: Deliver>(&mut self, ops: Vec<Vec<u8>>, to: &mut D) -> Result<(), ClientError> {
        let mut order = InOrder::new(self.net.reserve(ops.len()), ops.len());
        match self.here(&ops, &mut order, to).await {
            Ok(()) => return Ok(()),
            Err(LocalError::Refused(why)) => return Err(ClientError::Refused(why)),
            Err(LocalError::Elsewhere(_) | LocalError::Dropped) => {}
        }
        self.net.resume(&ops, &mut order, to).await
    }

    /// The gateway checked the user's rights before it submits here; over
    /// the network the replica that takes the request checks them again.
    fn identify(&mut self, credentials: psmr_client::Credentials) {
        self.net.identify(credentials);
    }
}

impl Both {
    /// Serves the request in this replica: queues the commands whose
    /// outcomes `order` misses, and again any it had to forget, until
    /// every outcome is delivered.
    async fn here<D: Deliver>(&mut self, ops: &[Vec<u8>], order: &mut InOrder, to: &mut D) -> Result<(), LocalError> {
        while !order.done() {
            let first = order.first();
            let asking = order.to_ask();
            self.local.queue(asking.iter().map(|&i| (first + i as u64, ops[i].as_slice()))).await?;
            let mut round = Round::new(asking.len());
            while round.unanswered() > 0 {
                // Patience counts from the last reply: a receiver that
                // takes its time over each does not send the request away.
                let (seq, outcome) = match self.local.next(self.patience).await {
                    Ok(reply) => reply,
                    Err(LocalError::Dropped) if round.kept() > 0 => break,
                    // Not one outcome got through (the replica's replies to
                    // all clients are at their bound): the network way
                    // paces its retries.
                    Err(e) => return Err(e),
                };
                round.take(order, seq, outcome, to);
                order.flush(to).await;
            }
            order.asked(round.kept(), round.unanswered() == 0);
        }
        self.local.answered();
        Ok(())
    }
}

/// The gateway of a replica running `app`, its Redis commands mapped by
/// `commands`, its clients served at `me`.
pub(crate) fn make<A, C>(h: &Handles, io: Arc<ClientIo>, me: SocketAddr, app: Arc<A>, commands: C) -> Arc<dyn Serve>
where
    A: App,
    C: psmr_resp::Commands<Op = A::Op, Reply = A::Reply>,
{
    let config = &h.config;
    let limits = GatewayLimits {
        max_connections: config.max_connections,
        buffered_max: config.client_buffer_bytes_max,
        frame_max: config.frame_max,
        batch_max_commands: config.batch_max_commands,
        batch_max_bytes: config.batch_max_bytes,
        idle_timeout: Duration::from_millis(config.client_idle_timeout_ms),
        frame_timeout: Duration::from_millis(config.frame_timeout_ms),
    };
    let client_metrics = h.metrics.client.clone();
    let refused: psmr_gateway::Refused =
        Arc::new(move |r| client_metrics.refused(psmr_transport::metrics::ClientRefusal::of_auth(r)));
    let counted = h.metrics.client.clone();
    let failed: psmr_gateway::HandshakeFailed =
        Arc::new(move || counted.refused(psmr_transport::metrics::ClientRefusal::Handshake));
    let tls = h.tls_for(psmr_core::config::FacingPort::Redis).map(|t| (t, failed));
    let auth = psmr_gateway::Auth { gate: io.gate().clone(), refused, tls };
    let (view, tls) = (h.view.clone(), h.forward_tls.clone());
    let submit = Cluster { me, view, frame_max: config.frame_max, io, tls };
    let (id, view, applied) = (h.id, h.view.clone(), h.applied.clone());
    let info: Info = Arc::new(move || psmr_gateway::Replica {
        id,
        leader: view.leader(),
        is_leader: view.is_leader(),
        term: view.term(),
        applied: applied.get(),
    });
    Arc::new(Gateway::new(limits, submit, app, commands, info, auth))
}

/// Serves `gateway` on `listener` until the replica stops; a panicking
/// connection task stops the replica.
pub(crate) fn spawn(
    runtime: &tokio::runtime::Runtime,
    h: &Handles,
    gateway: Arc<dyn Serve>,
    listener: TcpListener,
) -> Result<(), ReplicaError> {
    listener.set_nonblocking(true)?;
    let listener = {
        let _guard = runtime.enter();
        tokio::net::TcpListener::from_std(listener)?
    };
    let life: Arc<Life> = h.life.clone();
    let stop_life = life.clone();
    let stop: psmr_gateway::Stop = Arc::new(move || {
        let life = stop_life.clone();
        Box::pin(async move { life.stopped().await })
    });
    let fail: psmr_gateway::Fail = Arc::new(move |why| life.fail(why));
    runtime.spawn(gateway.serve(listener, stop, fail));
    Ok(())
}
