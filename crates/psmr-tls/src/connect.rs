//! The client side: psmr's client library and tools reach a replica's
//! client port in TLS, checking that the replica is one of the cluster's
//! CA, and may show a user certificate.

use crate::pem::{load_identity, load_roots};
use crate::{config_err, provider, Stream, TlsError, VERSIONS};
use rustls::client::Resumption;
use rustls::pki_types::ServerName;
use rustls::ClientConfig;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use tokio::net::TcpStream;

/// Makes TLS connections to replicas. Clones share one configuration,
/// which [`Connector::reload`] replaces for all of them.
#[derive(Clone)]
pub struct Connector {
    current: Arc<RwLock<tokio_rustls::TlsConnector>>,
    /// The CA, and the certificate and key shown, if any.
    files: Arc<(PathBuf, Option<(PathBuf, PathBuf)>)>,
    /// The name the server must have; None: the address dialled.
    server_name: Option<ServerName<'static>>,
}

impl std::fmt::Debug for Connector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connector").field("server_name", &self.server_name).finish_non_exhaustive()
    }
}

impl Connector {
    /// Trusts the CA certificates of `ca` only; with `identity` (a
    /// certificate and its private key), shows that certificate.
    pub fn load(ca: &Path, identity: Option<(&Path, &Path)>) -> Result<Self, TlsError> {
        let files = (ca.to_path_buf(), identity.map(|(c, k)| (c.to_path_buf(), k.to_path_buf())));
        let current = Arc::new(RwLock::new(configure(&files)?));
        Ok(Self { current, files: Arc::new(files), server_name: None })
    }

    /// Reads the files again (a new CA, a rotated certificate) and uses
    /// them for every connection from now on, on every clone; on an error
    /// the files in use stay in use.
    pub fn reload(&self) -> Result<(), TlsError> {
        let fresh = configure(&self.files)?;
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = fresh;
        Ok(())
    }

    /// Expects every server to be `name` (a DNS name or an IP address its
    /// certificate carries) instead of the address dialled.
    pub fn with_server_name(mut self, name: &str) -> Result<Self, TlsError> {
        let name = ServerName::try_from(name.to_string())
            .map_err(|e| TlsError::Names(format!("server name {name:?}: {e}")))?;
        self.server_name = Some(name);
        Ok(self)
    }

    /// Runs the client side of a handshake on `tcp`, connected to `addr`.
    /// The caller bounds the time it takes.
    pub async fn connect(&self, addr: SocketAddr, tcp: TcpStream) -> Result<Stream, TlsError> {
        let name = self.server_name.clone().unwrap_or_else(|| ServerName::IpAddress(addr.ip().into()));
        let connector = self.current.read().unwrap_or_else(|p| p.into_inner()).clone();
        let tls = connector.connect(name, tcp).await.map_err(TlsError::Handshake)?;
        Ok(Stream::Tls(Box::new(tokio_rustls::TlsStream::Client(tls))))
    }

    /// Connects to `addr`, in TLS if `tls` is given; the caller bounds the
    /// time it takes.
    pub async fn dial(tls: Option<&Connector>, addr: SocketAddr) -> io::Result<Stream> {
        let tcp = TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        match tls {
            None => Ok(Stream::Plain(tcp)),
            Some(c) => c.connect(addr, tcp).await.map_err(|e| io::Error::new(io::ErrorKind::ConnectionRefused, e)),
        }
    }
}

/// The client configuration of `(ca, identity)`.
fn configure((ca, identity): &(PathBuf, Option<(PathBuf, PathBuf)>)) -> Result<tokio_rustls::TlsConnector, TlsError> {
    let roots = load_roots(ca)?;
    let builder = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&VERSIONS)
        .map_err(|e| config_err("client", &e))?
        .with_root_certificates(roots);
    let mut config = match identity {
        Some((cert, key)) => {
            let (chain, key_der) = load_identity(cert, key)?;
            builder
                .with_client_auth_cert(chain, key_der)
                .map_err(|e| config_err(&format!("{} with {}", cert.display(), key.display()), &e))?
        }
        None => builder.with_no_client_auth(),
    };
    config.resumption = Resumption::disabled();
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}
