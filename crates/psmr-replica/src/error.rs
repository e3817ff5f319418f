//! What can go wrong starting or running a replica.

use psmr_core::config::ConfigError;
use psmr_transport::tls;
use std::net::SocketAddr;
use thiserror::Error;

/// Errors starting or running a replica.
#[derive(Debug, Error)]
pub enum ReplicaError {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A socket cannot be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The scheduler cannot be built.
    #[error("scheduler: {0}")]
    Scheduler(#[from] psmr_sched::SchedError),
    /// No class-to-threads mapping could be found.
    #[error("mapping: {0}")]
    Optimizer(#[from] psmr_sched::optimizer::OptimizerError),
    /// The protocol refused to start.
    #[error(transparent)]
    Protocol(#[from] psmr_core::protocol::StartError),
    /// The data directory cannot be used.
    #[error(transparent)]
    Storage(#[from] psmr_storage::DiskError),
    /// The peer certificates cannot be used.
    #[error("TLS: {0}")]
    Tls(#[from] tls::TlsError),
    /// Certificates that could not be reloaded (the ones in use stay).
    #[error("certificates not reloaded (the ones in use stay): {0}")]
    Certificates(String),
    /// A thread or runtime cannot start.
    #[error("cannot start: {0}")]
    Start(#[from] std::io::Error),
    /// The users cannot be set up.
    #[error("client authentication: {0}")]
    Auth(#[from] psmr_auth::AuthError),
    /// The replica stopped because of an error.
    #[error("replica stopped: {0}")]
    Failed(String),
}
