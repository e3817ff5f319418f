//! The server side of the ports clients reach: a replica shows its
//! certificate, and reads the user a client certificate names.

use crate::issue::{user_name, user_of_name};
use crate::pem::{load_identity, load_roots};
use crate::{config_err, provider, Stream, TlsError, VERSIONS};
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::server::{NoServerSessionStorage, WebPkiClientVerifier};
use rustls::ServerConfig;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::net::TcpStream;

/// Accepts TLS connections on a client-facing port. Clones share one
/// configuration, which [`Acceptor::reload`] replaces for all of them.
#[derive(Clone)]
pub struct Acceptor {
    current: Arc<RwLock<tokio_rustls::TlsAcceptor>>,
    files: Arc<Files>,
    deadline: Duration,
}

/// Where an acceptor's certificate, key and client CA come from.
struct Files {
    cert: PathBuf,
    key: PathBuf,
    client_ca: Option<PathBuf>,
}

impl std::fmt::Debug for Acceptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Acceptor").field("deadline", &self.deadline).finish_non_exhaustive()
    }
}

impl Acceptor {
    /// Shows the certificate chain of `cert` with the key of `key` (which
    /// must be private). With `client_ca`, clients may show a certificate
    /// from that CA (one from any other is refused in the handshake);
    /// without, none is asked for. A handshake must finish within
    /// `deadline`.
    pub fn load(cert: &Path, key: &Path, client_ca: Option<&Path>, deadline: Duration) -> Result<Self, TlsError> {
        let files = Files { cert: cert.into(), key: key.into(), client_ca: client_ca.map(Path::to_path_buf) };
        let current = Arc::new(RwLock::new(configure(&files)?));
        Ok(Self { current, files: Arc::new(files), deadline })
    }

    /// Reads the files again (rotated certificates, a new CA) and uses them
    /// for every connection from now on, on every clone; on an error the
    /// files in use stay in use.
    pub fn reload(&self) -> Result<(), TlsError> {
        let fresh = configure(&self.files)?;
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = fresh;
        Ok(())
    }

    /// Runs the server side of a handshake on `tcp` within the deadline;
    /// the connection and the user its client certificate names (None
    /// without one, or with one that names no user).
    pub async fn accept(&self, tcp: TcpStream) -> Result<(Stream, Option<String>), TlsError> {
        let deadline = self.deadline;
        let acceptor = self.current.read().unwrap_or_else(|p| p.into_inner()).clone();
        let tls = tokio::time::timeout(deadline, acceptor.accept(tcp))
            .await
            .map_err(|_| {
                TlsError::Handshake(io::Error::new(io::ErrorKind::TimedOut, format!("not done within {deadline:?}")))
            })?
            .map_err(TlsError::Handshake)?;
        let user = tls.get_ref().1.peer_certificates().and_then(|c| c.first()).and_then(user_of_cert);
        Ok((Stream::Tls(Box::new(tokio_rustls::TlsStream::Server(tls))), user))
    }
}

/// The server configuration of `files`.
fn configure(files: &Files) -> Result<tokio_rustls::TlsAcceptor, TlsError> {
    let (cert, key, client_ca) = (&files.cert, &files.key, files.client_ca.as_deref());
    let (chain, key_der) = load_identity(cert, key)?;
    let provider = provider();
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&VERSIONS)
        .map_err(|e| config_err("server", &e))?;
    let builder = match client_ca {
        Some(ca) => {
            let roots = Arc::new(load_roots(ca)?);
            // Optional: a client may still say who it is with a
            // password.
            let verifier = WebPkiClientVerifier::builder_with_provider(roots, provider)
                .allow_unauthenticated()
                .build()
                .map_err(|e| config_err("client verifier", &e))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(chain, key_der)
        .map_err(|e| config_err(&format!("{} with {}", cert.display(), key.display()), &e))?;
    // No resumption: every connection shows its certificate.
    config.send_tls13_tickets = 0;
    config.session_storage = Arc::new(NoServerSessionStorage {});
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

/// The user a client certificate (already verified against the CA) names.
pub(crate) fn user_of_cert(cert: &CertificateDer<'_>) -> Option<String> {
    let ee = webpki::EndEntityCert::try_from(cert).ok()?;
    let user = ee.valid_dns_names().find_map(user_of_name)?.to_string();
    // Found by scanning; confirmed the way names are meant to be checked.
    let name = ServerName::try_from(user_name(&user)).ok()?;
    ee.verify_is_valid_for_subject_name(&name).ok()?;
    Some(user)
}
