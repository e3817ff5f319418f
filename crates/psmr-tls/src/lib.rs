//! # psmr-tls: TLS for psmr
//!
//! One certificate authority per cluster (`psmr certs` makes it, see
//! [`issue`]) and two uses of it:
//!
//! * **Between replicas.** Every replica proves its id with a certificate
//!   named `replica-N.psmr`, both ways (`psmr_transport::tls` runs that
//!   handshake over the peer port's blocking sockets; this crate issues and
//!   reads the files).
//! * **On the ports clients reach** (the client port, the Redis ports, the
//!   metrics port), where `[client_tls]` turns it on: the replica shows the
//!   same certificate, which also names the hosts clients dial (loopback by
//!   default, `psmr certs --hosts` for more), and a client may show a user
//!   certificate, named `NAME.user.psmr` ([`user_name`]), to prove that it
//!   is user `NAME` without a password ([`Acceptor`], [`Connector`],
//!   [`Stream`]).
//!
//! The rules are the same everywhere: TLS 1.3 only, the `ring` provider,
//! no session resumption (every connection shows its certificates, so the
//! identity read from them is always the peer's own), only the cluster CA
//! trusted (no system roots: a certificate issued for anything else does
//! not pass, however valid it is elsewhere), key files readable by their
//! owner only (a replica refuses a key that group or others may read, as
//! ssh does), certificate and key files at most [`pem::PEM_FILE_MAX`]
//! bytes. A handshake has a deadline on every port.
//!
//! `tokio-rustls` drives the handshakes of the async ports: the state
//! machine is rustls's, and its glue is what every tokio server uses.
//!
//! In the guide: `docs/design.md` places this crate among the others;
//! `docs/security.md`: TLS for peers and clients, and the threat model.

pub mod connect;
pub mod issue;
pub mod pem;
pub mod serve;
pub mod stream;

pub use connect::Connector;
pub use issue::{generate, generate_user, replica_name, user_name, ReplicaFiles, LOOPBACK_HOSTS, VALIDITY};
pub use serve::Acceptor;
pub use stream::{ReadHalf, Stream, WriteHalf};

use std::io;
use std::path::PathBuf;
use thiserror::Error;

/// Errors making, loading or using certificates.
#[derive(Debug, Error)]
pub enum TlsError {
    /// [`generate`] would overwrite a file.
    #[error("{0} exists; refusing to overwrite it (remove it or choose another directory)")]
    Exists(PathBuf),
    /// A file or directory cannot be read, created or written.
    #[error("cannot {what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// A file holds no usable PEM certificate or key.
    #[error("{path}: {why}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        why: String,
    },
    /// A private key file may be read by others than its owner.
    #[error(
        "private key {path} is readable by group or others (mode {mode:03o}); \
         run `chmod 600 {path}` and keep it private"
    )]
    KeyReadable {
        /// The key file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// The replica ids, user or host names given to [`generate`] or
    /// [`generate_user`] are unusable.
    #[error("{0}")]
    Names(String),
    /// Certificate generation failed.
    #[error("cannot make certificates: {0}")]
    Generate(#[from] rcgen::Error),
    /// The certificates and key do not make a TLS configuration.
    #[error("TLS configuration: {0}")]
    Config(String),
    /// This replica's own certificate is not for its id.
    #[error("{path} is not a certificate of {name} (replica {id}): {why}")]
    NotOwnCertificate {
        /// The certificate file.
        path: PathBuf,
        /// The replica.
        id: u64,
        /// The name it must carry.
        name: String,
        /// What webpki found.
        why: String,
    },
    /// The TLS handshake failed (a peer without a valid certificate, a
    /// certificate from another CA, a broken connection or a timeout).
    #[error("TLS handshake failed: {0}")]
    Handshake(io::Error),
    /// The peer's certificate is not the one of the replica it claims to
    /// be.
    #[error("peer claims to be replica {claimed} but its certificate is not for {name}: {why}")]
    WrongPeer {
        /// The id claimed in the `Hello`.
        claimed: u64,
        /// The name the certificate must carry.
        name: String,
        /// What was wrong.
        why: String,
    },
}

/// The TLS versions psmr speaks.
pub(crate) const VERSIONS: [&rustls::SupportedProtocolVersion; 1] = [&rustls::version::TLS13];

/// The crypto provider psmr uses.
pub fn provider() -> std::sync::Arc<rustls::crypto::CryptoProvider> {
    std::sync::Arc::new(rustls::crypto::ring::default_provider())
}

/// `TlsError::Config` for `what` failing with `e`.
pub(crate) fn config_err(what: &str, e: &dyn std::fmt::Display) -> TlsError {
    TlsError::Config(format!("{what}: {e}"))
}
