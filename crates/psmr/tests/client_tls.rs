//! TLS on every port clients reach (`[client_tls]`): psmr's client port
//! (the client library checks the replica against the cluster's CA, and a
//! user certificate stands for a password), the Redis ports (`redis-cli
//! --tls`) and the metrics port (HTTPS). Plain clients, clients of another
//! CA and handshakes that never finish are refused, and counted.

use psmr::client::{Access, Client, ClientConfig, Connector, Credentials};
use psmr::replica::LocalCluster;
use psmr::services::kv::{KvCodec, KvOp, KvRedis, KvReply};
use psmr::services::{KvApp, ServiceConfig};
use psmr_auth::{PasswordHash, Role, UserSpec, ITERATIONS_MIN};
use psmr_core::config::ClientTls;
use std::io::Read;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

mod common;

const DATA: &str = "data-secret";
const WAIT: Duration = Duration::from_secs(20);

fn cluster() -> LocalCluster {
    let _ = tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).try_init();
    let user = |name: &str, role| UserSpec {
        name: name.into(),
        password: PasswordHash::new(DATA.as_bytes(), ITERATIONS_MIN).unwrap().to_string(),
        role,
    };
    let cluster = LocalCluster::builder()
        .metrics(true)
        .client_tls(true)
        .configure(|c| {
            c.insecure_clients = false;
            c.users = vec![user("admin", Role::Admin), user("default", Role::Data)];
            let mut tls = ClientTls::new(PathBuf::new(), PathBuf::new());
            tls.handshake_timeout_ms = 200;
            c.client_tls = Some(tls);
        })
        .start_with_redis(|_| KvApp::new(&ServiceConfig::default()).expect("the default kv"), |_| KvRedis)
        .expect("a local cluster");
    cluster.wait_for_leader(WAIT).unwrap();
    cluster
}

fn ca(cluster: &LocalCluster) -> PathBuf {
    cluster.config().client_tls.as_ref().unwrap().ca.clone().unwrap()
}

fn client(cluster: &LocalCluster, tls: Option<Connector>, credentials: Option<Credentials>) -> Client {
    let mut config = ClientConfig::new(cluster.client_addrs());
    config.deadline = Duration::from_secs(3);
    config.attempt_timeout = Duration::from_millis(500);
    config.credentials = credentials;
    config.tls = tls;
    Client::new(config).unwrap()
}

fn put(c: &mut Client, key: &str) -> Result<(), String> {
    let op = KvOp::Put { key: key.into(), value: b"v".to_vec() };
    c.call(&KvCodec, &[op]).map_err(|e| e.to_string())?.pop().unwrap().map(|_| ())
}

#[test]
fn the_client_port_speaks_tls_and_user_certificates_stand_for_passwords() {
    let cluster = cluster();
    let ca = ca(&cluster);
    let data = Some(Credentials::new("default", DATA).unwrap());
    let tls = Connector::load(&ca, None).unwrap();
    put(&mut client(&cluster, Some(tls.clone()), data.clone()), "k").unwrap();

    // Plain TCP to a port in TLS gets nowhere.
    let e = put(&mut client(&cluster, None, data.clone()), "k").unwrap_err();
    assert!(!e.is_empty());

    // An admin's certificate: no password, admin rights.
    let dir = ca.parent().unwrap();
    let (cert, key) = psmr::replica::tls::generate_user(dir, "admin").unwrap();
    let admin_tls = Connector::load(&ca, Some((&cert, &key))).unwrap();
    let mut admin = client(&cluster, Some(admin_tls.clone()), None);
    let flushed = admin.call(&KvCodec, &[KvOp::FlushDb]).unwrap().pop().unwrap();
    assert_eq!(flushed, Ok(KvReply::Done(true)));
    let addr = cluster.client_addrs()[0];
    admin.status_of(addr, Access::from(WAIT).with_tls(Some(admin_tls.clone()))).unwrap();

    // A certificate of a user the cluster does not list names nobody.
    let (cert, key) = psmr::replica::tls::generate_user(dir, "stranger").unwrap();
    let stranger = Connector::load(&ca, Some((&cert, &key))).unwrap();
    let e = put(&mut client(&cluster, Some(stranger), None), "k").unwrap_err();
    assert!(e.contains("NOAUTH"), "{e}");

    // A certificate of another CA is refused in the handshake.
    let other = tempfile::tempdir().unwrap();
    psmr::replica::tls::generate(other.path(), &[1]).unwrap();
    let (cert, key) = psmr::replica::tls::generate_user(other.path(), "admin").unwrap();
    let forged = Connector::load(&ca, Some((&cert, &key))).unwrap();
    assert!(put(&mut client(&cluster, Some(forged), None), "k").is_err());
    // So is a replica whose certificate another CA signed.
    let theirs = Connector::load(&other.path().join("ca.pem"), None).unwrap();
    assert!(put(&mut client(&cluster, Some(theirs), data), "k").is_err());

    // A connection that never starts its handshake is closed at the
    // deadline.
    let mut silent = std::net::TcpStream::connect(addr).unwrap();
    silent.set_read_timeout(Some(WAIT)).unwrap();
    assert_eq!(silent.read(&mut [0u8; 16]).unwrap_or(0), 0);
    let metrics = admin.metrics_of(addr, Access::from(WAIT).with_tls(Some(admin_tls))).unwrap();
    let handshakes = metrics.lines().find(|l| l.starts_with("psmr_client_refused_total{reason=\"tls_handshake\"}"));
    assert!(handshakes.is_some_and(|l| !l.ends_with(" 0")), "{metrics}");
}

fn redis_cli(addr: SocketAddr, ca: &Path, tls: bool, args: &[&str]) -> std::process::Output {
    let mut cmd = std::process::Command::new(common::tool("redis-cli"));
    cmd.args(["-h", &addr.ip().to_string(), "-p", &addr.port().to_string()]);
    if tls {
        cmd.arg("--tls").arg("--cacert").arg(ca);
    }
    cmd.env("REDISCLI_AUTH", DATA).args(args).output().unwrap()
}

#[test]
fn redis_cli_speaks_tls_to_every_replica_and_metrics_are_https() {
    let cluster = cluster();
    let ca = ca(&cluster);
    for addr in cluster.redis_addrs() {
        let out = redis_cli(addr, &ca, true, &["SET", "tls", &addr.to_string()]);
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "OK", "{out:?}");
        let out = redis_cli(addr, &ca, true, &["GET", "tls"]);
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), addr.to_string(), "{out:?}");
    }
    // Plain RESP to a port in TLS: no reply.
    let out = redis_cli(cluster.redis_addrs()[0], &ca, false, &["PING"]);
    assert!(!String::from_utf8_lossy(&out.stdout).contains("PONG"), "{out:?}");

    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let addr = cluster.metrics_addrs()[0];
    let tls = Connector::load(&ca, None).unwrap();
    let response = rt.block_on(async {
        use tokio::io::AsyncReadExt;
        let mut s = Connector::dial(Some(&tls), addr).await.unwrap();
        s.send(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).await.unwrap();
        text
    });
    assert!(response.starts_with("HTTP/1.1 200 OK") && response.contains("psmr_raft_term"), "{response}");
    // Plain HTTP gets no response.
    let plain = rt.block_on(async {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").await.unwrap();
        let mut bytes = Vec::new();
        let _ = s.read_to_end(&mut bytes).await;
        bytes
    });
    assert!(!String::from_utf8_lossy(&plain).contains("200 OK"));
}
