//! Mutual TLS between replicas: who may speak raft to a replica.
//!
//! The threat model (DESIGN.md, "Trust") is crash faults on a network and
//! a host shared with other processes. Any process that reaches a peer
//! port could otherwise forge raft messages (a forged `MsgAppend` makes a
//! follower apply a command nobody committed) or claim another replica's
//! id. So every replica proves its id with a certificate, both ways:
//!
//! * **One CA per cluster.** [`generate`] makes a self-signed ECDSA P-256
//!   CA and, per replica id `N`, a certificate signed by it whose only
//!   identity is the DNS name `replica-N.psmr` (the subject alternative
//!   name; the common name repeats it for people reading the file), usable
//!   for server and client authentication, valid for ten years. Trusting
//!   only this CA, and no system roots, means that no certificate issued
//!   for anything else can pass, however valid it is elsewhere.
//! * **Both ends authenticate.** The connecting replica checks that the
//!   server is `replica-{to}.psmr` (rustls's usual server name check); the
//!   accepting replica requires a client certificate from the cluster CA
//!   and then checks that the id the connection claims in its `Hello`
//!   matches the certificate ([`TlsStream::verify_peer_is`]): a valid
//!   certificate of replica 2 cannot speak for replica 1.
//! * **TLS 1.3 only, ring provider, no session resumption.** Every
//!   connection runs a full handshake with certificates, so the identity
//!   check always sees the peer's own certificate, and no ticket keys live
//!   in memory.
//! * **Private files.** Key files are created readable by their owner only
//!   and, like ssh, a replica refuses to load a key that group or others
//!   may read.
//!
//! TLS covers the peer port only: it authenticates replicas to each other
//! and keeps raft traffic confidential and unaltered. It does not protect
//! against a replica whose key was stolen, nor against a flood of
//! connections (the peer port bounds handshakes for that, see
//! [`crate::peer`]). Clients are not authenticated here.
//!
//! [`TlsStream`] runs over any blocking `Read + Write` transport; the
//! caller's transport enforces deadlines (see [`crate::peer`]), so nothing
//! here knows about time.

use psmr_core::config::PeerTls;
use rustls::client::Resumption;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::{NoServerSessionStorage, WebPkiClientVerifier};
use rustls::{ClientConfig, ClientConnection, Connection, RootCertStore, ServerConfig, ServerConnection};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use thiserror::Error;

/// How long generated certificates are valid.
pub const VALIDITY: Duration = Duration::from_secs(3653 * 24 * 3600);

/// Generated certificates are valid from this long before they are made,
/// so that a replica whose clock is somewhat behind accepts them at once.
const BACKDATE: Duration = Duration::from_secs(24 * 3600);

/// Errors making, loading or using the peer certificates.
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
    /// The replica ids given to [`generate`] are unusable.
    #[error("replica ids: {0}")]
    Ids(String),
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

/// The only name in replica `id`'s certificate.
pub fn replica_name(id: u64) -> String {
    format!("replica-{id}.psmr")
}

fn io_err<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> TlsError + 'a {
    move |source| TlsError::Io { what, path: path.to_path_buf(), source }
}

/// Makes one certificate per replica id under `dir` (`replica-N.pem`,
/// `replica-N.key`), signed by the cluster CA there (`ca.pem`, `ca.key`),
/// which is made first if neither file exists: so a replica added later
/// gets its certificate from the CA the others trust. The directory is
/// created readable by its owner only (an existing one is left as it
/// is), key files are created with mode 0600; no existing file is
/// overwritten. Returns the `[peer_tls]` configuration that points at
/// them, with absolute paths.
pub fn generate(dir: &Path, ids: &[u64]) -> Result<PeerTls, TlsError> {
    check_ids(ids)?;
    let (ca_pem, ca_key_path) = (dir.join("ca.pem"), dir.join("ca.key"));
    let existing = ca_pem.exists() && ca_key_path.exists();
    let mut files = Vec::new();
    if !existing {
        files.extend([(ca_pem.clone(), false), (ca_key_path.clone(), true)]);
    }
    for id in ids {
        files.push((dir.join(format!("replica-{id}.pem")), false));
        files.push((dir.join(format!("replica-{id}.key")), true));
    }
    // Checked before anything is made, so that a refusal leaves nothing
    // half-written; `create_new` below still refuses a file that appears
    // in between.
    if let Some((path, _)) = files.iter().find(|(p, _)| p.symlink_metadata().is_ok()) {
        return Err(TlsError::Exists(path.clone()));
    }
    let now = SystemTime::now();
    let validity = (now.checked_sub(BACKDATE).unwrap_or(now), now.checked_add(VALIDITY).unwrap_or(now));
    let (ca, ca_key, mut contents) = match existing {
        true => {
            let (ca, key) = existing_ca(&ca_pem, &ca_key_path, validity)?;
            (ca, key, Vec::new())
        }
        false => {
            let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
            let ca = ca_params(validity)?.self_signed(&key)?;
            let contents = vec![ca.pem(), key.serialize_pem()];
            (ca, key, contents)
        }
    };
    for &id in ids {
        let (cert, key) = replica_cert(id, &ca, &ca_key, validity)?;
        contents.extend([cert, key]);
    }
    create_private_dir(dir)?;
    for ((path, secret), text) in files.iter().zip(&contents) {
        write_new(path, text.as_bytes(), if *secret { 0o600 } else { 0o644 })?;
    }
    let dir = dir.canonicalize().map_err(io_err("resolve", dir))?;
    Ok(PeerTls { ca: dir.join("ca.pem"), cert: dir.join("replica-{id}.pem"), key: dir.join("replica-{id}.key") })
}

fn check_ids(ids: &[u64]) -> Result<(), TlsError> {
    if ids.is_empty() {
        return Err(TlsError::Ids("no replica ids given".into()));
    }
    if ids.contains(&0) {
        return Err(TlsError::Ids("replica ids start at 1".into()));
    }
    let mut sorted = ids.to_vec();
    sorted.sort_unstable();
    match sorted.windows(2).find(|w| w[0] == w[1]) {
        Some(w) => Err(TlsError::Ids(format!("id {} is given twice", w[0]))),
        None => Ok(()),
    }
}

/// Not before, not after.
type Validity = (SystemTime, SystemTime);

/// The cluster CA's own certificate: its name alone identifies it as the
/// issuer of the replicas' certificates.
fn ca_params((not_before, not_after): Validity) -> Result<rcgen::CertificateParams, TlsError> {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.distinguished_name.push(rcgen::DnType::CommonName, "psmr cluster CA");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
    params.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign, rcgen::KeyUsagePurpose::CrlSign];
    params.not_before = not_before.into();
    params.not_after = not_after.into();
    Ok(params)
}

/// The CA of `ca.pem` and its key `ca.key` (private, as every key psmr
/// reads), as an issuer: its name and key are what signing needs. A key
/// that is not `ca.pem`'s is refused.
fn existing_ca(pem: &Path, key: &Path, validity: Validity) -> Result<(rcgen::Certificate, rcgen::KeyPair), TlsError> {
    let text = String::from_utf8(read_private(key)?)
        .map_err(|_| TlsError::Parse { path: key.to_path_buf(), why: "not PEM text".into() })?;
    let ca_key =
        rcgen::KeyPair::from_pem(&text).map_err(|e| TlsError::Parse { path: key.to_path_buf(), why: e.to_string() })?;
    let cert = parse_certs(pem, &read_file(pem)?)?;
    let public = ca_key.public_key_raw();
    if !cert[0].as_ref().windows(public.len()).any(|w| w == public) {
        return Err(TlsError::Parse { path: key.to_path_buf(), why: format!("not the key of {}", pem.display()) });
    }
    Ok((ca_params(validity)?.self_signed(&ca_key)?, ca_key))
}

/// Replica `id`'s certificate and key, PEM, signed by `ca`.
fn replica_cert(
    id: u64,
    ca: &rcgen::Certificate,
    ca_key: &rcgen::KeyPair,
    (not_before, not_after): Validity,
) -> Result<(String, String), TlsError> {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
    let mut params = rcgen::CertificateParams::new(vec![replica_name(id)])?;
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.distinguished_name.push(rcgen::DnType::CommonName, replica_name(id));
    params.is_ca = rcgen::IsCa::ExplicitNoCa;
    params.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages =
        vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth, rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    params.use_authority_key_identifier_extension = true;
    params.not_before = not_before.into();
    params.not_after = not_after.into();
    let cert = params.signed_by(&key, ca, ca_key)?;
    Ok((cert.pem(), key.serialize_pem()))
}

fn create_private_dir(dir: &Path) -> Result<(), TlsError> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir).map_err(io_err("create directory", dir))
}

/// Writes a file that must not exist yet, created with `mode` (never wider
/// for a moment, as a chmod afterwards would be).
fn write_new(path: &Path, bytes: &[u8], mode: u32) -> Result<(), TlsError> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, mode);
    #[cfg(not(unix))]
    let _ = mode;
    let mut file = options.open(path).map_err(|source| match source.kind() {
        io::ErrorKind::AlreadyExists => TlsError::Exists(path.to_path_buf()),
        _ => TlsError::Io { what: "create", path: path.to_path_buf(), source },
    })?;
    file.write_all(bytes).and_then(|()| file.sync_all()).map_err(io_err("write", path))
}

/// Longest certificate or key file read. A CA bundle of a few hundred
/// certificates fits many times over; a huge file is a mistake, not a
/// reason to fill memory.
const PEM_FILE_MAX: u64 = 1 << 20;

fn read_file(path: &Path) -> Result<Vec<u8>, TlsError> {
    let file = std::fs::File::open(path).map_err(io_err("read", path))?;
    read_bounded(path, file)
}

fn read_bounded(path: &Path, file: std::fs::File) -> Result<Vec<u8>, TlsError> {
    let mut bytes = Vec::new();
    file.take(PEM_FILE_MAX + 1).read_to_end(&mut bytes).map_err(io_err("read", path))?;
    if bytes.len() as u64 > PEM_FILE_MAX {
        return Err(TlsError::Parse {
            path: path.to_path_buf(),
            why: format!("longer than {PEM_FILE_MAX} bytes: not a PEM certificate or key"),
        });
    }
    Ok(bytes)
}

/// Reads a private key file, refusing one that group or others may read.
/// The mode is checked on the opened file, so the file checked is the
/// file read.
fn read_private(path: &Path) -> Result<Vec<u8>, TlsError> {
    let file = std::fs::File::open(path).map_err(io_err("read", path))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = file.metadata().map_err(io_err("inspect", path))?.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(TlsError::KeyReadable { path: path.to_path_buf(), mode });
        }
    }
    read_bounded(path, file)
}

fn parse_certs(path: &Path, bytes: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Parse { path: path.to_path_buf(), why: format!("not a PEM certificate: {e}") })?;
    if certs.is_empty() {
        return Err(TlsError::Parse { path: path.to_path_buf(), why: "no CERTIFICATE block in the file".into() });
    }
    Ok(certs)
}

fn parse_key(path: &Path, bytes: &[u8]) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_slice(bytes)
        .map_err(|e| TlsError::Parse { path: path.to_path_buf(), why: format!("not a PEM private key: {e}") })
}

fn dns_name(id: u64) -> ServerName<'static> {
    // `replica-N.psmr` is always a valid DNS name.
    ServerName::try_from(replica_name(id)).expect("replica names are DNS names")
}

/// Checks that `cert` carries the name of replica `id`.
fn cert_is_for(cert: &CertificateDer<'_>, id: u64) -> Result<(), String> {
    let ee = webpki::EndEntityCert::try_from(cert).map_err(|e| format!("unparsable certificate: {e}"))?;
    ee.verify_is_valid_for_subject_name(&dns_name(id)).map_err(|e| e.to_string())
}

/// One replica's TLS settings: a server side that requires a certificate
/// from the cluster CA, and a client side that trusts only the cluster CA
/// and presents this replica's certificate.
pub struct PeerTlsContext {
    id: u64,
    server: Arc<ServerConfig>,
    client: Arc<ClientConfig>,
}

impl std::fmt::Debug for PeerTlsContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerTlsContext").field("id", &self.id).finish_non_exhaustive()
    }
}

impl PeerTlsContext {
    /// Loads the CA, certificate and key of replica `id` (`{id}` in the
    /// paths stands for it) and checks that the certificate is this
    /// replica's.
    pub fn load(files: &PeerTls, id: u64) -> Result<Self, TlsError> {
        let (ca_path, cert_path, key_path) =
            (files.ca.clone(), PeerTls::for_replica(&files.cert, id), PeerTls::for_replica(&files.key, id));
        let cas = parse_certs(&ca_path, &read_file(&ca_path)?)?;
        let chain = parse_certs(&cert_path, &read_file(&cert_path)?)?;
        let key = parse_key(&key_path, &read_private(&key_path)?)?;
        cert_is_for(&chain[0], id).map_err(|why| TlsError::NotOwnCertificate {
            path: cert_path.clone(),
            id,
            name: replica_name(id),
            why,
        })?;

        let config_err = |what: &str, e: &dyn std::fmt::Display| TlsError::Config(format!("{what}: {e}"));
        let mut roots = RootCertStore::empty();
        for ca in cas {
            roots.add(ca).map_err(|e| config_err(&format!("CA certificate {}", ca_path.display()), &e))?;
        }
        let roots = Arc::new(roots);
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let versions = [&rustls::version::TLS13];
        let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
            .build()
            .map_err(|e| config_err("client verifier", &e))?;
        let mut server = ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&versions)
            .map_err(|e| config_err("server", &e))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain.clone(), key.clone_key())
            .map_err(|e| config_err(&format!("{} with {}", cert_path.display(), key_path.display()), &e))?;
        // No resumption: every connection shows its certificate.
        server.send_tls13_tickets = 0;
        server.session_storage = Arc::new(NoServerSessionStorage {});
        let mut client = ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&versions)
            .map_err(|e| config_err("client", &e))?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)
            .map_err(|e| config_err(&format!("{} with {}", cert_path.display(), key_path.display()), &e))?;
        client.resumption = Resumption::disabled();
        Ok(Self { id, server: Arc::new(server), client: Arc::new(client) })
    }

    /// This replica's id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Runs the server side of a handshake over `sock`: succeeds only for a
    /// client with a certificate from the cluster CA. Which replica it is
    /// is for the caller to check ([`TlsStream::verify_peer_is`]) against
    /// the id the client claims.
    pub fn accept<S: Read + Write>(&self, sock: S) -> Result<TlsStream<S>, TlsError> {
        let conn = ServerConnection::new(self.server.clone()).map_err(|e| TlsError::Config(e.to_string()))?;
        TlsStream::handshake(conn.into(), sock)
    }

    /// Runs the client side of a handshake with replica `to` over `sock`:
    /// succeeds only if the server proves to be `replica-{to}.psmr`. The
    /// server's verdict on this replica's certificate arrives with its
    /// first answer.
    pub fn connect<S: Read + Write>(&self, to: u64, sock: S) -> Result<TlsStream<S>, TlsError> {
        let conn =
            ClientConnection::new(self.client.clone(), dns_name(to)).map_err(|e| TlsError::Config(e.to_string()))?;
        TlsStream::handshake(conn.into(), sock)
    }
}

/// A TLS connection over a blocking transport `S`, readable and writable
/// as a plain stream once the handshake is done.
///
/// Written for the replicas' traffic: reads pull TLS records only when no
/// plaintext is buffered, and writes encrypt and send at once (so put a
/// `BufWriter` in front to make one record of a burst of small frames).
/// Unlike `rustls::Stream`, a write never waits to read, so a sender that
/// never reads cannot block on a quiet peer.
pub struct TlsStream<S> {
    conn: Connection,
    sock: S,
}

impl<S> std::fmt::Debug for TlsStream<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsStream").finish_non_exhaustive()
    }
}

impl<S: Read + Write> TlsStream<S> {
    fn handshake(mut conn: Connection, mut sock: S) -> Result<Self, TlsError> {
        while conn.is_handshaking() {
            match conn.complete_io(&mut sock) {
                // A round without progress would repeat forever.
                Ok((0, 0)) => {
                    return Err(TlsError::Handshake(io::Error::new(io::ErrorKind::InvalidData, "handshake stalled")))
                }
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(TlsError::Handshake(e)),
            }
        }
        Ok(Self { conn, sock })
    }

    /// Checks that the peer's certificate is replica `id`'s. The chain was
    /// checked against the cluster CA during the handshake; this checks
    /// the name.
    pub fn verify_peer_is(&self, id: u64) -> Result<(), TlsError> {
        let wrong = |why: String| TlsError::WrongPeer { claimed: id, name: replica_name(id), why };
        let cert = self
            .conn
            .peer_certificates()
            .and_then(|c| c.first())
            .ok_or_else(|| wrong("it presented no certificate".into()))?;
        cert_is_for(cert, id).map_err(wrong)
    }

    /// The transport.
    pub fn get_ref(&self) -> &S {
        &self.sock
    }

    /// The transport, e.g. to change its deadlines.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.sock
    }

    /// Sends whatever TLS records are queued.
    fn send_queued(&mut self) -> io::Result<()> {
        while self.conn.wants_write() {
            match self.conn.write_tls(&mut self.sock) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

impl<S: Read + Write> Read for TlsStream<S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            match self.conn.reader().read(buf) {
                // No plaintext buffered and the connection is open.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                // Ok(0) after the peer's close_notify; UnexpectedEof after
                // a bare end of stream.
                other => return other,
            }
            // At end of stream this returns 0 and marks the connection, so
            // the reader answers on the next round.
            self.conn.read_tls(&mut self.sock)?;
            if let Err(e) = self.conn.process_new_packets() {
                // Tell the peer why (the alert rustls queued), best effort.
                let _ = self.send_queued();
                return Err(io::Error::new(io::ErrorKind::InvalidData, e));
            }
            // Answers rustls owes the peer, such as a key update.
            self.send_queued()?;
        }
    }
}

impl<S: Read + Write> Write for TlsStream<S> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        // Sent before and after: rustls takes no more plaintext while its
        // outgoing buffer is full.
        self.send_queued()?;
        let n = self.conn.writer().write(buf)?;
        self.send_queued()?;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.conn.writer().flush()?;
        self.send_queued()?;
        self.sock.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn generated_files_parse_are_private_and_load() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("certs");
        let tls = generate(&dir, &[1, 2, 3]).unwrap();
        assert!(tls.ca.is_absolute() && tls.cert.is_absolute() && tls.key.is_absolute());
        assert_eq!(mode(&dir), 0o700);
        for name in ["ca.key", "replica-1.key", "replica-2.key", "replica-3.key"] {
            assert_eq!(mode(&dir.join(name)), 0o600, "{name}");
        }
        for name in ["ca.pem", "replica-1.pem", "replica-3.pem"] {
            let path = dir.join(name);
            assert_eq!(parse_certs(&path, &std::fs::read(&path).unwrap()).unwrap().len(), 1, "{name}");
        }
        let cert = parse_certs(&dir.join("replica-2.pem"), &std::fs::read(dir.join("replica-2.pem")).unwrap()).unwrap();
        assert!(cert_is_for(&cert[0], 2).is_ok());
        assert!(cert_is_for(&cert[0], 1).is_err());
        parse_key(&dir.join("ca.key"), &read_private(&dir.join("ca.key")).unwrap()).unwrap();
        for id in 1..=3 {
            assert_eq!(PeerTlsContext::load(&tls, id).unwrap().id(), id);
        }
        // Replica 4 has no files: the error names the file.
        let e = PeerTlsContext::load(&tls, 4).unwrap_err().to_string();
        assert!(e.contains("replica-4.pem"), "{e}");
    }

    #[test]
    fn existing_files_are_never_overwritten() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        std::fs::write(dir.join("replica-2.key"), b"mine").unwrap();
        let e = generate(dir, &[1, 2]).unwrap_err();
        assert!(matches!(&e, TlsError::Exists(p) if p.ends_with("replica-2.key")), "{e}");
        assert!(e.to_string().contains("refusing to overwrite"), "{e}");
        // Nothing was written, and the file is untouched.
        assert!(!dir.join("ca.pem").exists());
        assert_eq!(std::fs::read(dir.join("replica-2.key")).unwrap(), b"mine");
        // A second run for the same replica is refused too, and the CA
        // is kept.
        let other = dir.join("other");
        generate(&other, &[1]).unwrap();
        let before = std::fs::read(other.join("ca.key")).unwrap();
        assert!(matches!(generate(&other, &[1]), Err(TlsError::Exists(_))));
        assert_eq!(std::fs::read(other.join("ca.key")).unwrap(), before);
        // Half a CA is not one to sign with.
        let half = dir.join("half");
        generate(&half, &[1]).unwrap();
        std::fs::remove_file(half.join("ca.key")).unwrap();
        assert!(matches!(generate(&half, &[2]), Err(TlsError::Exists(p)) if p.ends_with("ca.pem")));
        assert!(matches!(generate(&other, &[]), Err(TlsError::Ids(_))));
        assert!(matches!(generate(&other, &[0]), Err(TlsError::Ids(_))));
        assert!(matches!(generate(&other, &[3, 3]), Err(TlsError::Ids(_))));
    }

    #[test]
    fn a_key_readable_by_others_is_refused_with_the_fix() {
        let tmp = tempfile::tempdir().unwrap();
        let tls = generate(tmp.path(), &[1]).unwrap();
        let key = tmp.path().join("replica-1.key");
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = PeerTlsContext::load(&tls, 1).unwrap_err();
        assert!(matches!(e, TlsError::KeyReadable { mode: 0o644, .. }), "{e}");
        let msg = e.to_string();
        assert!(msg.contains(&format!("chmod 600 {}", key.canonicalize().unwrap().display())), "{msg}");
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o640)).unwrap();
        assert!(PeerTlsContext::load(&tls, 1).is_err());
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o400)).unwrap();
        PeerTlsContext::load(&tls, 1).unwrap();
    }

    #[test]
    fn garbage_files_are_clear_errors() {
        let tmp = tempfile::tempdir().unwrap();
        let tls = generate(tmp.path(), &[1, 2]).unwrap();
        std::fs::write(tmp.path().join("ca.pem"), b"not pem at all").unwrap();
        let e = PeerTlsContext::load(&tls, 1).unwrap_err().to_string();
        assert!(e.contains("ca.pem") && e.contains("no CERTIFICATE"), "{e}");
        // Replica 2's certificate under replica 1's name.
        let tmp = tempfile::tempdir().unwrap();
        let tls = generate(tmp.path(), &[1, 2]).unwrap();
        let two = std::fs::read(tmp.path().join("replica-2.pem")).unwrap();
        std::fs::remove_file(tmp.path().join("replica-1.pem")).unwrap();
        std::fs::write(tmp.path().join("replica-1.pem"), two).unwrap();
        let e = PeerTlsContext::load(&tls, 1).unwrap_err().to_string();
        assert!(e.contains("not a certificate of replica-1.psmr"), "{e}");
    }

    /// A pair of connected sockets on loopback.
    fn pair() -> (std::net::TcpStream, std::net::TcpStream) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let a = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        for s in [&a, &b] {
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        }
        (a, b)
    }

    #[test]
    fn a_replica_added_later_is_signed_by_the_same_ca() {
        let tmp = tempfile::tempdir().unwrap();
        let tls = generate(tmp.path(), &[1]).unwrap();
        let ca = std::fs::read(tmp.path().join("ca.pem")).unwrap();
        generate(tmp.path(), &[2]).unwrap();
        assert_eq!(std::fs::read(tmp.path().join("ca.pem")).unwrap(), ca, "the CA is kept");
        let (one, two) = (PeerTlsContext::load(&tls, 1).unwrap(), PeerTlsContext::load(&tls, 2).unwrap());
        let (a, b) = pair();
        let server = std::thread::spawn(move || two.accept(b).and_then(|s| s.verify_peer_is(1)));
        one.connect(2, a).unwrap();
        server.join().unwrap().unwrap();
        // Another CA's key beside this CA's certificate is refused.
        let other = tempfile::tempdir().unwrap();
        generate(other.path(), &[1]).unwrap();
        std::fs::copy(other.path().join("ca.key"), tmp.path().join("ca.key")).unwrap();
        let e = generate(tmp.path(), &[3]).unwrap_err().to_string();
        assert!(e.contains("not the key of"), "{e}");
        assert!(!tmp.path().join("replica-3.pem").exists());
    }

    #[test]
    fn replicas_of_one_ca_talk_and_names_are_checked() {
        let tmp = tempfile::tempdir().unwrap();
        let tls = generate(tmp.path(), &[1, 2]).unwrap();
        let (one, two) = (PeerTlsContext::load(&tls, 1).unwrap(), PeerTlsContext::load(&tls, 2).unwrap());
        let (a, b) = pair();
        let server = std::thread::spawn(move || {
            let mut s = two.accept(b).unwrap();
            s.verify_peer_is(1).unwrap();
            assert!(matches!(s.verify_peer_is(2), Err(TlsError::WrongPeer { claimed: 2, .. })));
            let mut buf = [0u8; 5];
            s.read_exact(&mut buf).unwrap();
            s.write_all(&buf).unwrap();
            s.flush().unwrap();
        });
        let mut c = one.connect(2, a).unwrap();
        c.write_all(b"hello").unwrap();
        c.flush().unwrap();
        let mut buf = [0u8; 5];
        c.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"hello");
        server.join().unwrap();

        // Replica 1 expecting replica 1 on the other end: the name check of
        // the client side fails.
        let one_again = PeerTlsContext::load(&tls, 1).unwrap();
        let two = PeerTlsContext::load(&tls, 2).unwrap();
        let (a, b) = pair();
        let server = std::thread::spawn(move || two.accept(b).map(|_| ()));
        assert!(matches!(one_again.connect(1, a), Err(TlsError::Handshake(_))));
        assert!(server.join().unwrap().is_err());
    }
}
