//! Clients who belong: on a cluster with users, nobody reads, writes or
//! changes the cluster without credentials; a data user reads and writes
//! and is refused membership changes, reconfiguration and `FLUSHDB`; an
//! admin may do all of it. On psmr's protocol and on the Redis ports of
//! the leader and of a follower (whose gateway reaches the leader as the
//! Redis user, never with rights of its own).

use psmr::client::{Access, Client, ClientConfig, ClientError, Credentials, Reconfiguration};
use psmr::model::wire::MemberChange;
use psmr::replica::LocalCluster;
use psmr::services::kv::{KvCodec, KvOp, KvRedis, KvReply};
use psmr::services::{KvApp, ServiceConfig};
use psmr_auth::{PasswordHash, Role, UserSpec, ITERATIONS_MIN};
use std::net::SocketAddr;
use std::time::Duration;

mod common;

const ADMIN: &str = "admin-secret";
const DATA: &str = "data-secret";
const WAIT: Duration = Duration::from_secs(20);

fn users() -> Vec<UserSpec> {
    let user = |name: &str, password: &str, role| UserSpec {
        name: name.into(),
        password: PasswordHash::new(password.as_bytes(), ITERATIONS_MIN).unwrap().to_string(),
        role,
    };
    vec![user("admin", ADMIN, Role::Admin), user("default", DATA, Role::Data)]
}

fn cluster() -> LocalCluster {
    let _ = tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).try_init();
    let cluster = LocalCluster::builder()
        .configure(|c| {
            c.insecure_clients = false;
            c.users = users();
        })
        .start_with_redis(|_| KvApp::new(&ServiceConfig::default()).expect("the default kv"), |_| KvRedis)
        .expect("a local cluster");
    cluster.wait_for_leader(WAIT).unwrap();
    cluster
}

fn who(user: &str, password: &str) -> Option<Credentials> {
    Some(Credentials::new(user, password).unwrap())
}

fn client(cluster: &LocalCluster, credentials: Option<Credentials>) -> Client {
    let mut config = ClientConfig::new(cluster.client_addrs());
    config.deadline = WAIT;
    config.credentials = credentials;
    Client::new(config).unwrap()
}

/// One command's outcome: its reply, or the client's error as text.
fn call(c: &mut Client, op: KvOp) -> Result<KvReply, String> {
    match c.call(&KvCodec, &[op]) {
        Ok(mut replies) => replies.pop().unwrap(),
        Err(e) => Err(e.to_string()),
    }
}

fn put(key: &str) -> KvOp {
    KvOp::Put { key: key.into(), value: b"v".to_vec() }
}

fn members(c: &Client, cluster: &LocalCluster) -> usize {
    c.members_of(cluster.client_addrs()[0], Duration::from_secs(5)).unwrap().len()
}

#[test]
fn psmr_protocol_anonymous_clients_list_members_and_nothing_else() {
    let cluster = cluster();
    let mut anon = client(&cluster, None);
    assert_eq!(members(&anon, &cluster), 3);
    let e = call(&mut anon, put("k")).unwrap_err();
    assert!(e.contains("NOAUTH"), "{e}");
    let e = anon.status_of(cluster.client_addrs()[0], Duration::from_secs(5)).unwrap_err();
    assert!(e.contains("NOAUTH"), "{e}");
    let e = anon.change_membership(&cluster.client_addrs(), MemberChange::Remove { id: 2 }, WAIT).unwrap_err();
    assert!(e.contains("NOAUTH"), "{e}");
    assert_eq!(members(&anon, &cluster), 3, "the membership is unchanged");
    let mut wrong = client(&cluster, who("admin", "guess"));
    match wrong.call(&KvCodec, &[put("k")]) {
        Err(ClientError::Denied(m)) => assert!(m.starts_with("WRONGPASS"), "{m}"),
        other => panic!("a wrong password got {other:?}"),
    }
}

#[test]
fn psmr_protocol_data_users_read_and_write_and_only_admins_administer() {
    let cluster = cluster();
    let addrs = cluster.client_addrs();
    let mut data = client(&cluster, who("default", DATA));
    assert!(matches!(call(&mut data, put("k")), Ok(KvReply::Done(false))));
    assert_eq!(call(&mut data, KvOp::Read { key: b"k".to_vec() }), Ok(KvReply::Value(Some(b"v".to_vec()))));
    let e = call(&mut data, KvOp::FlushDb).unwrap_err();
    assert!(e.contains("NOPERM"), "{e}");
    let as_data = Access::new(WAIT, who("default", DATA));
    let e = data.change_membership(&addrs, MemberChange::Remove { id: 3 }, as_data.clone()).unwrap_err();
    assert!(e.contains("NOPERM") && e.contains("remove-replica"), "{e}");
    let change = Reconfiguration { scheduler: "sequential".into(), workers: 1, mapping: String::new() };
    let e = data.reconfigure_of(addrs[0], change.clone(), as_data.clone()).unwrap_err();
    assert!(e.contains("NOPERM"), "{e}");
    assert!(data.status_of(addrs[0], as_data).is_ok(), "data users watch the replicas");
    assert_eq!(members(&data, &cluster), 3);

    let mut admin = client(&cluster, who("admin", ADMIN));
    let as_admin = Access::new(WAIT, who("admin", ADMIN));
    assert_eq!(call(&mut admin, KvOp::FlushDb), Ok(KvReply::Done(true)));
    assert_eq!(call(&mut data, KvOp::Read { key: b"k".to_vec() }), Ok(KvReply::Value(None)));
    assert!(admin.reconfigure_of(addrs[0], change, as_admin.clone()).is_ok());
    let metrics = admin.metrics_of(addrs[0], as_admin.clone()).unwrap();
    assert!(metrics
        .lines()
        .any(|l| l.starts_with("psmr_client_refused_total{reason=\"noperm\"}") && !l.ends_with(" 0")));
    let left = admin.change_membership(&addrs, MemberChange::Remove { id: 3 }, as_admin).unwrap();
    assert_eq!(left.len(), 2);
}

fn redis(addr: SocketAddr, request: &str, replies: usize) -> String {
    common::resp_exchange(addr, request, replies, WAIT)
}

fn redis_checks(addr: SocketAddr) {
    let out = redis(addr, "PING\r\nSET k v\r\nHELLO 3\r\nAUTH nope\r\n", 4);
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("-NOAUTH") && lines[1].starts_with("-NOAUTH"), "{out}");
    assert!(lines[2].starts_with("-NOAUTH HELLO must be called"), "{out}");
    assert!(lines[3].starts_with("-WRONGPASS"), "{out}");
    let data = format!("AUTH {DATA}\r\nSET k v\r\nGET k\r\nFLUSHDB\r\nCONFIG GET save\r\nACL WHOAMI\r\n");
    let out = redis(addr, &data, 8);
    assert!(out.starts_with("+OK\r\n+OK\r\n$1\r\nv\r\n-NOPERM"), "{out}");
    assert!(out.contains("'flushdb'") && out.contains("-NOPERM User default has no permissions to run the 'config'"));
    assert!(out.ends_with("$7\r\ndefault\r\n"), "{out}");
    let admin = format!("AUTH admin {ADMIN}\r\nFLUSHDB\r\nGET k\r\nACL WHOAMI\r\n");
    assert_eq!(redis(addr, &admin, 5), "+OK\r\n+OK\r\n$-1\r\n$5\r\nadmin\r\n");
    // Every command queued in a transaction is checked as it is queued.
    let out = redis(addr, &format!("AUTH {DATA}\r\nMULTI\r\nSET k x\r\nFLUSHDB\r\nEXEC\r\nGET k\r\n"), 6);
    assert!(out.starts_with("+OK\r\n+OK\r\n+QUEUED\r\n-NOPERM"), "{out}");
    assert!(out.ends_with("-EXECABORT Transaction discarded because of previous errors.\r\n$-1\r\n"), "{out}");
    let out = redis(addr, &format!("HELLO 3 AUTH default {DATA}\r\nSET k w\r\n"), 27);
    assert!(out.starts_with("%7\r\n") && out.ends_with("+OK\r\n"), "{out}");
}

#[test]
fn redis_ports_of_the_leader_and_a_follower_check_who_and_what() {
    let cluster = cluster();
    let leader = cluster.wait_for_leader(WAIT).unwrap();
    let addrs = cluster.redis_addrs();
    let follower = if leader == 1 { 2 } else { 1 };
    redis_checks(addrs[leader as usize - 1]);
    redis_checks(addrs[follower as usize - 1]);
    // redis-rs (as applications use it) with a user in its URL.
    let url = format!("redis://default:{DATA}@{}/", addrs[follower as usize - 1]);
    let mut con = redis::Client::open(url).unwrap().get_connection().unwrap();
    let _: () = redis::cmd("SET").arg("app").arg("1").query(&mut con).unwrap();
    let got: String = redis::cmd("GET").arg("app").query(&mut con).unwrap();
    assert_eq!(got, "1");
    let metrics = client(&cluster, who("admin", ADMIN))
        .metrics_of(cluster.client_addrs()[0], Access::new(WAIT, who("admin", ADMIN)))
        .unwrap();
    assert!(metrics
        .lines()
        .any(|l| l.starts_with("psmr_client_refused_total{reason=\"noauth\"}") && !l.ends_with(" 0")));
}
