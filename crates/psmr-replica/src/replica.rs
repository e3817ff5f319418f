//! A running replica: what it answers about itself, and how it stops.

use crate::error::ReplicaError;
use crate::handles::{Applied, Counters, Stats};
use crate::metrics::{exposition, Observed};
use crate::start::ReplicaBuilder;
use psmr_core::config::Config;
use psmr_model::App;
use psmr_transport::life::Life;
use psmr_transport::peer::Peers;
use psmr_transport::view::ClusterView;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;

/// A running replica.
pub struct Replica {
    pub(crate) id: u64,
    pub(crate) life: Arc<Life>,
    pub(crate) view: Arc<ClusterView>,
    pub(crate) applied: Arc<Applied>,
    pub(crate) counters: Arc<Counters>,
    pub(crate) peers: Arc<Peers>,
    pub(crate) observed: Observed,
    pub(crate) client_addr: SocketAddr,
    pub(crate) threads: Vec<JoinHandle<()>>,
    pub(crate) runtime: Option<tokio::runtime::Runtime>,
    pub(crate) certificates: Certificates,
}

/// The certificates a replica holds, each reloadable in place.
#[derive(Default)]
pub(crate) struct Certificates {
    /// `[peer_tls]`: its own certificate and key, the cluster's CA.
    pub(crate) peer: Option<Arc<psmr_transport::tls::PeerTlsContext>>,
    /// `[client_tls]`: what the client, Redis and metrics ports show.
    pub(crate) client: Option<psmr_tls::Acceptor>,
    /// The CA its Redis gateway trusts to reach the leader's client port.
    pub(crate) forward: Option<psmr_tls::Connector>,
}

impl Replica {
    /// Starts replica `id` of `config` running `app` (see
    /// [`ReplicaBuilder`] for more choices).
    pub fn start<A: App>(config: Config, id: u64, app: A) -> Result<Replica, ReplicaError> {
        ReplicaBuilder::new(app, config, id).start()
    }

    /// Spawns a stage thread. A panic in it stops the replica (fail-stop):
    /// the other stages would otherwise run on without it, a zombie that
    /// still answers `status`.
    pub(crate) fn spawn(&mut self, name: &str, f: impl FnOnce() + Send + 'static) -> std::io::Result<()> {
        let life = self.life.clone();
        let thread = name.to_string();
        let h = std::thread::Builder::new().name(name.into()).spawn(move || life.guard(&thread, f))?;
        self.threads.push(h);
        Ok(())
    }

    /// This replica's id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Where clients connect.
    pub fn client_addr(&self) -> SocketAddr {
        self.client_addr
    }

    /// The leader as this replica knows it (0: none).
    pub fn leader(&self) -> u64 {
        self.view.leader()
    }

    /// The current term.
    pub fn term(&self) -> u64 {
        self.view.term()
    }

    /// This replica leads.
    pub fn is_leader(&self) -> bool {
        self.view.is_leader()
    }

    /// The last log index handed to execution.
    pub fn applied(&self) -> u64 {
        self.applied.get()
    }

    /// Its incarnation: drawn when its data began (see the peer links).
    pub fn incarnation(&self) -> u64 {
        self.peers.incarnation
    }

    /// True once the replica is stopping (by itself, or told to).
    pub fn stopping(&self) -> bool {
        self.life.stopping()
    }

    /// Its counters, read now.
    pub fn stats(&self) -> Stats {
        let c = &self.counters;
        Stats {
            peer_in: self.peers.received.load(Ordering::Acquire),
            peer_refused: c.peer_refused.load(Ordering::Acquire),
            entries_proposed: c.entries_proposed.load(Ordering::Acquire),
            commands_proposed: c.commands_proposed.load(Ordering::Acquire),
        }
    }

    /// Reads every certificate, key and CA file the replica uses again
    /// (`[peer_tls]`, `[client_tls]`), for connections made from now on:
    /// certificates are rotated one replica at a time without a restart
    /// (`psmr replica` does this on SIGHUP). Each set of files is read and
    /// checked before it replaces the one in use; a set that fails (a
    /// missing file, a key that is not the certificate's, a certificate
    /// that is not this replica's) leaves its predecessor in use, the
    /// others are still reloaded, and the error names what failed.
    pub fn reload_certificates(&self) -> Result<(), ReplicaError> {
        let c = &self.certificates;
        let results = [
            ("[peer_tls]", c.peer.as_ref().map(|p| p.reload())),
            ("[client_tls]", c.client.as_ref().map(psmr_tls::Acceptor::reload)),
            ("the CA of the Redis gateway's client", c.forward.as_ref().map(psmr_tls::Connector::reload)),
        ];
        let failed: Vec<String> =
            results.into_iter().filter_map(|(what, r)| Some(format!("{what}: {}", r?.err()?))).collect();
        match failed.is_empty() {
            true => Ok(()),
            false => Err(ReplicaError::Certificates(failed.join("; "))),
        }
    }

    /// Its metrics as OpenMetrics text (what `/metrics` serves).
    pub fn metrics_text(&self) -> String {
        exposition(&self.observed)
    }

    /// Blocks until the replica stops; the error if it failed.
    pub fn wait(&self) -> Result<(), ReplicaError> {
        self.life.wait().map_err(ReplicaError::Failed)
    }

    /// A handle that asks the replica to stop from another thread (a
    /// signal handler): [`Replica::wait`] then returns, and
    /// [`Replica::stop`] finishes the stop.
    pub fn stopper(&self) -> Stopper {
        Stopper(self.life.clone())
    }

    /// Stops every thread and closes every socket and file (the log's
    /// newest file is closed whole, so a restart finds no torn tail).
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.life.stop();
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_timeout(std::time::Duration::from_secs(1));
        }
        for h in self.threads.drain(..) {
            let _ = h.join();
        }
    }
}

/// Asks a replica to stop ([`Replica::stopper`]).
#[derive(Clone)]
pub struct Stopper(Arc<Life>);

impl Stopper {
    /// Asks the replica to stop cleanly (nothing happens if it stopped).
    pub fn stop(&self) {
        self.0.stop();
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.shutdown();
    }
}
