//! Mutual TLS between replicas: who may speak raft to a replica.
//!
//! The threat model (docs/design.md, "Trust") is crash faults on a network and
//! a host shared with other processes. Any process that reaches a peer
//! port could otherwise forge raft messages (a forged `MsgAppend` makes a
//! follower apply a command nobody committed) or claim another replica's
//! id. So every replica proves its id with a certificate, both ways:
//!
//! * **One CA per cluster.** [`generate`] makes a self-signed ECDSA P-256
//!   CA and, per replica id `N`, a certificate signed by it whose identity
//!   among replicas is the DNS name `replica-N.psmr` (it also names the
//!   hosts clients dial, see [`psmr_tls::issue`]), usable for server and
//!   client authentication, valid for ten years. Trusting only this CA,
//!   and no system roots, means that no certificate issued for anything
//!   else can pass, however valid it is elsewhere.
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
//! [`crate::peer`]). TLS on the ports clients reach is [`psmr_tls`]'s.
//!
//! [`TlsStream`] runs over any blocking `Read + Write` transport; the
//! caller's transport enforces deadlines (see [`crate::peer`]), so nothing
//! here knows about time.

use parking_lot::RwLock;
use psmr_core::config::PeerTls;
use psmr_tls::pem::{load_identity, load_roots};
use rustls::client::Resumption;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::server::{NoServerSessionStorage, WebPkiClientVerifier};
use rustls::{ClientConfig, ClientConnection, Connection, ServerConfig, ServerConnection};
use std::io::{self, Read, Write};
use std::path::Path;
use std::sync::Arc;

pub use psmr_tls::{generate_user, replica_name, TlsError, LOOPBACK_HOSTS, VALIDITY};

/// Makes the cluster CA (unless `dir` has one) and one certificate per
/// replica id under `dir`, naming the loopback hosts for clients (see
/// [`psmr_tls::generate`]); returns the `[peer_tls]` configuration that
/// points at them, with absolute paths.
pub fn generate(dir: &Path, ids: &[u64]) -> Result<PeerTls, TlsError> {
    generate_for_hosts(dir, ids, &LOOPBACK_HOSTS)
}

/// [`generate`], naming `hosts` for clients.
pub fn generate_for_hosts(dir: &Path, ids: &[u64], hosts: &[&str]) -> Result<PeerTls, TlsError> {
    let files = psmr_tls::generate(dir, ids, hosts)?;
    Ok(PeerTls { ca: files.ca, cert: files.cert, key: files.key })
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
/// and presents this replica's certificate. [`PeerTlsContext::reload`]
/// reads the files again, for connections made from then on.
pub struct PeerTlsContext {
    id: u64,
    files: PeerTls,
    current: RwLock<Configs>,
}

/// The server and the client side.
type Configs = (Arc<ServerConfig>, Arc<ClientConfig>);

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
        let current = RwLock::new(Self::configs(files, id)?);
        Ok(Self { id, files: files.clone(), current })
    }

    /// Reads the CA, certificate and key again (rotated files) and uses
    /// them for every handshake from now on; on an error, including a
    /// certificate that is not this replica's, the files in use stay in
    /// use. Connections already made keep theirs.
    pub fn reload(&self) -> Result<(), TlsError> {
        let fresh = Self::configs(&self.files, self.id)?;
        *self.current.write() = fresh;
        Ok(())
    }

    fn configs(files: &PeerTls, id: u64) -> Result<Configs, TlsError> {
        let (ca_path, cert_path, key_path) =
            (files.ca.clone(), PeerTls::for_replica(&files.cert, id), PeerTls::for_replica(&files.key, id));
        let roots = Arc::new(load_roots(&ca_path)?);
        let (chain, key) = load_identity(&cert_path, &key_path)?;
        cert_is_for(&chain[0], id).map_err(|why| TlsError::NotOwnCertificate {
            path: cert_path.clone(),
            id,
            name: replica_name(id),
            why,
        })?;
        let config_err = |what: &str, e: &dyn std::fmt::Display| TlsError::Config(format!("{what}: {e}"));
        let provider = psmr_tls::provider();
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
        Ok((Arc::new(server), Arc::new(client)))
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
        let server = self.current.read().0.clone();
        let conn = ServerConnection::new(server).map_err(|e| TlsError::Config(e.to_string()))?;
        TlsStream::handshake(conn.into(), sock)
    }

    /// Runs the client side of a handshake with replica `to` over `sock`:
    /// succeeds only if the server proves to be `replica-{to}.psmr`. The
    /// server's verdict on this replica's certificate arrives with its
    /// first answer.
    pub fn connect<S: Read + Write>(&self, to: u64, sock: S) -> Result<TlsStream<S>, TlsError> {
        let client = self.current.read().1.clone();
        let conn = ClientConnection::new(client, dns_name(to)).map_err(|e| TlsError::Config(e.to_string()))?;
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
    use psmr_tls::pem::{parse_certs, parse_key, read_private};
    use std::os::unix::fs::PermissionsExt;
    use std::time::Duration;

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
        assert!(matches!(generate(&other, &[]), Err(TlsError::Names(_))));
        assert!(matches!(generate(&other, &[0]), Err(TlsError::Names(_))));
        assert!(matches!(generate(&other, &[3, 3]), Err(TlsError::Names(_))));
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

    #[test]
    fn a_reload_rotates_the_certificate_and_refuses_another_replicas() {
        let tmp = tempfile::tempdir().unwrap();
        let tls = generate(tmp.path(), &[1, 2]).unwrap();
        let (one, two) = (PeerTlsContext::load(&tls, 1).unwrap(), PeerTlsContext::load(&tls, 2).unwrap());
        let two = Arc::new(two);
        let shown = |two: &Arc<PeerTlsContext>| {
            let (a, b) = pair();
            let server = {
                let two = two.clone();
                std::thread::spawn(move || two.accept(b).map(|_| ()))
            };
            let c = one.connect(2, a).unwrap();
            server.join().unwrap().unwrap();
            c.conn.peer_certificates().unwrap()[0].to_vec()
        };
        let before = shown(&two);
        for ext in ["pem", "key"] {
            std::fs::remove_file(tmp.path().join(format!("replica-2.{ext}"))).unwrap();
        }
        generate(tmp.path(), &[2]).unwrap();
        two.reload().unwrap();
        let after = shown(&two);
        assert_ne!(after, before, "the rotated certificate is shown");
        // Replica 1's certificate in replica 2's files: refused, and the
        // rotated one stays.
        for ext in ["pem", "key"] {
            let to = tmp.path().join(format!("replica-2.{ext}"));
            std::fs::remove_file(&to).unwrap();
            std::fs::copy(tmp.path().join(format!("replica-1.{ext}")), to).unwrap();
        }
        assert!(matches!(two.reload(), Err(TlsError::NotOwnCertificate { id: 2, .. })));
        assert_eq!(shown(&two), after);
    }
}
