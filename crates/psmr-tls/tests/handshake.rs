//! Handshakes on loopback between an [`Acceptor`] and a [`Connector`]:
//! who passes, who is refused, and what a client certificate says.

use psmr_tls::{generate, generate_user, Acceptor, Connector, Stream, TlsError, LOOPBACK_HOSTS};
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A server that accepts one connection, echoes five bytes and reports
/// the user its client certificate named.
async fn echo_once(acceptor: Acceptor) -> (SocketAddr, tokio::task::JoinHandle<Result<Option<String>, TlsError>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let (mut stream, user) = acceptor.accept(tcp).await?;
        let mut buf = [0u8; 5];
        stream.read_exact(&mut buf).await.map_err(TlsError::Handshake)?;
        stream.send(&buf).await.map_err(TlsError::Handshake)?;
        Ok(user)
    });
    (addr, task)
}

async fn talk(stream: &mut Stream) -> std::io::Result<[u8; 5]> {
    stream.send(b"hello").await?;
    let mut buf = [0u8; 5];
    stream.read_exact(&mut buf).await?;
    Ok(buf)
}

fn acceptor(dir: &Path, client_ca: bool) -> Acceptor {
    let ca = dir.join("ca.pem");
    let ca = client_ca.then_some(ca.as_path());
    Acceptor::load(&dir.join("replica-1.pem"), &dir.join("replica-1.key"), ca, Duration::from_secs(10)).unwrap()
}

#[tokio::test]
async fn a_client_of_the_ca_talks_and_its_certificate_names_its_user() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    generate(dir, &[1], &LOOPBACK_HOSTS).unwrap();
    let (cert, key) = generate_user(dir, "alice").unwrap();

    // No certificate: talks, names nobody.
    let (addr, server) = echo_once(acceptor(dir, true)).await;
    let plain = Connector::load(&dir.join("ca.pem"), None).unwrap();
    let mut s = Connector::dial(Some(&plain), addr).await.unwrap();
    assert!(s.is_tls());
    assert_eq!(&talk(&mut s).await.unwrap(), b"hello");
    assert_eq!(server.await.unwrap().unwrap(), None);

    // A user certificate names its user.
    let (addr, server) = echo_once(acceptor(dir, true)).await;
    let alice = Connector::load(&dir.join("ca.pem"), Some((&cert, &key))).unwrap();
    let mut s = Connector::dial(Some(&alice), addr).await.unwrap();
    assert_eq!(&talk(&mut s).await.unwrap(), b"hello");
    assert_eq!(server.await.unwrap().unwrap().as_deref(), Some("alice"));

    // A replica's certificate shown by a client names no user.
    let (addr, server) = echo_once(acceptor(dir, true)).await;
    let replica =
        Connector::load(&dir.join("ca.pem"), Some((&dir.join("replica-1.pem"), &dir.join("replica-1.key")))).unwrap();
    let mut s = Connector::dial(Some(&replica), addr).await.unwrap();
    talk(&mut s).await.unwrap();
    assert_eq!(server.await.unwrap().unwrap(), None);

    // By name instead of address.
    let (addr, server) = echo_once(acceptor(dir, false)).await;
    let named = Connector::load(&dir.join("ca.pem"), None).unwrap().with_server_name("localhost").unwrap();
    let mut s = Connector::dial(Some(&named), addr).await.unwrap();
    talk(&mut s).await.unwrap();
    server.await.unwrap().unwrap();
}

#[tokio::test]
async fn another_cas_certificates_are_refused_both_ways() {
    let (ours, theirs) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    generate(ours.path(), &[1], &LOOPBACK_HOSTS).unwrap();
    generate(theirs.path(), &[1], &LOOPBACK_HOSTS).unwrap();
    let (cert, key) = generate_user(theirs.path(), "mallory").unwrap();

    // A client certificate of another CA: the server refuses it.
    let (addr, server) = echo_once(acceptor(ours.path(), true)).await;
    let mallory = Connector::load(&ours.path().join("ca.pem"), Some((&cert, &key))).unwrap();
    if let Ok(mut s) = Connector::dial(Some(&mallory), addr).await {
        // TLS 1.3: the client may finish first and hear of the refusal
        // on its first read.
        assert!(talk(&mut s).await.is_err());
    }
    assert!(matches!(server.await.unwrap(), Err(TlsError::Handshake(_))));

    // A server of another CA: the client refuses it.
    let (addr, server) = echo_once(acceptor(theirs.path(), false)).await;
    let client = Connector::load(&ours.path().join("ca.pem"), None).unwrap();
    let e = Connector::dial(Some(&client), addr).await.unwrap_err();
    assert!(e.to_string().contains("certificate"), "{e}");
    assert!(server.await.unwrap().is_err());

    // A server whose certificate does not name the host dialled.
    let only = tempfile::tempdir().unwrap();
    generate(only.path(), &[1], &["db1.example"]).unwrap();
    let (addr, server) = echo_once(acceptor(only.path(), false)).await;
    let client = Connector::load(&only.path().join("ca.pem"), None).unwrap();
    let e = Connector::dial(Some(&client), addr).await.unwrap_err();
    assert!(e.to_string().contains("certificate"), "{e}");
    assert!(server.await.unwrap().is_err());
}

#[tokio::test]
async fn a_handshake_that_never_finishes_is_cut_at_the_deadline() {
    let tmp = tempfile::tempdir().unwrap();
    generate(tmp.path(), &[1], &LOOPBACK_HOSTS).unwrap();
    let dir = tmp.path();
    let acceptor =
        Acceptor::load(&dir.join("replica-1.pem"), &dir.join("replica-1.key"), None, Duration::from_millis(100))
            .unwrap();
    let (addr, server) = echo_once(acceptor).await;
    // Connected, and silent.
    let mut silent = TcpStream::connect(addr).await.unwrap();
    let e = server.await.unwrap().unwrap_err();
    assert!(matches!(&e, TlsError::Handshake(io) if io.kind() == std::io::ErrorKind::TimedOut), "{e}");
    // The server closed its end.
    let mut buf = [0u8; 16];
    assert_eq!(silent.read(&mut buf).await.unwrap_or(0), 0);

    // Bytes that are not TLS fail at once.
    let acceptor =
        Acceptor::load(&dir.join("replica-1.pem"), &dir.join("replica-1.key"), None, Duration::from_secs(60)).unwrap();
    let (addr, server) = echo_once(acceptor).await;
    let mut plain = TcpStream::connect(addr).await.unwrap();
    plain.write_all(b"*1\r\n$4\r\nPING\r\n").await.unwrap();
    assert!(matches!(server.await.unwrap(), Err(TlsError::Handshake(_))));
}

#[test]
fn files_are_checked_when_loaded() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    generate(dir, &[1], &LOOPBACK_HOSTS).unwrap();
    let (cert, key) = (dir.join("replica-1.pem"), dir.join("replica-1.key"));
    std::fs::write(dir.join("junk.pem"), "junk").unwrap();
    let e = Acceptor::load(&cert, &key, Some(&dir.join("junk.pem")), Duration::from_secs(1)).unwrap_err();
    assert!(e.to_string().contains("no CERTIFICATE"), "{e}");
    let e = Connector::load(&dir.join("nothing.pem"), None).unwrap_err();
    assert!(e.to_string().contains("nothing.pem"), "{e}");
    // The key of another certificate.
    let e = Acceptor::load(&dir.join("ca.pem"), &key, None, Duration::from_secs(1)).unwrap_err();
    assert!(matches!(e, TlsError::Config(_)), "{e}");
    std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    assert!(matches!(Acceptor::load(&cert, &key, None, Duration::from_secs(1)), Err(TlsError::KeyReadable { .. })));
    assert!(Connector::load(&dir.join("ca.pem"), None).unwrap().with_server_name("not a name").is_err());
}

#[tokio::test]
async fn a_reload_takes_rotated_files_and_a_bad_one_keeps_the_old() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    generate(dir, &[1], &LOOPBACK_HOSTS).unwrap();
    let server = acceptor(dir, false);
    let client = Connector::load(&dir.join("ca.pem"), None).unwrap();
    let seen = |server: Acceptor| {
        let client = client.clone();
        async move {
            let (addr, task) = echo_once(server).await;
            let mut s = Connector::dial(Some(&client), addr).await.unwrap();
            talk(&mut s).await.unwrap();
            task.await.unwrap().unwrap();
            s.peer_certificate().expect("the server's certificate")
        }
    };
    let before = seen(server.clone()).await;
    // Rotated: a new certificate of the same CA in the same files.
    std::fs::remove_file(dir.join("replica-1.pem")).unwrap();
    std::fs::remove_file(dir.join("replica-1.key")).unwrap();
    generate(dir, &[1], &LOOPBACK_HOSTS).unwrap();
    assert_eq!(seen(server.clone()).await, before, "nothing changes before the reload");
    server.reload().unwrap();
    let after = seen(server.clone()).await;
    assert_ne!(after, before, "the rotated certificate is shown");
    // A key that is not the certificate's: refused, the old pair stays.
    std::fs::copy(dir.join("ca.key"), dir.join("replica-1.key")).unwrap();
    assert!(matches!(server.reload(), Err(TlsError::Config(_))));
    assert_eq!(seen(server.clone()).await, after);
    client.reload().unwrap();
}
