//! Redis clients against a replicated kv store: the `redis` crate through
//! every replica's Redis port, pipelines as client batches, hostile RESP,
//! `redis-cli` and `redis-benchmark` themselves (installed by
//! `scripts/setup.sh`), and linearizable histories recorded through the
//! Redis port while leaders are killed. Seeds are printed;
//! `PSMR_TEST_SEED` replays.

use psmr::replica::LocalCluster;
use psmr::services::kv::KvRedis;
use psmr::services::{KvApp, ServiceConfig};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::Ordering;
use std::time::Duration;

mod common;

fn cluster() -> LocalCluster {
    let _ = tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).try_init();
    LocalCluster::builder()
        .start_with_redis(|_| KvApp::new(&ServiceConfig::default()).expect("the default kv"), |_| KvRedis)
        .expect("a local cluster")
}

fn connect(addr: SocketAddr) -> redis::Connection {
    redis::Client::open(format!("redis://{addr}/")).unwrap().get_connection().unwrap()
}

/// Connections to two replicas' Redis ports.
fn two(addrs: &[SocketAddr], i: usize, j: usize) -> (redis::Connection, redis::Connection) {
    (connect(addrs[i]), connect(addrs[j]))
}

fn cmd<T: redis::FromRedisValue>(con: &mut redis::Connection, args: &[&str]) -> redis::RedisResult<T> {
    let mut c = redis::cmd(args[0]);
    for a in &args[1..] {
        c.arg(*a);
    }
    c.query(con)
}

#[test]
fn every_replica_serves_the_command_set() {
    let cluster = cluster();
    let addrs = cluster.redis_addrs();
    assert_eq!(addrs.len(), 3);
    let mut cons: Vec<redis::Connection> = addrs.iter().map(|&a| connect(a)).collect();
    let (a, b) = cons.split_at_mut(1);
    let (a, b) = (&mut a[0], &mut b[0]);
    assert_eq!(cmd::<String>(a, &["PING"]).unwrap(), "PONG");
    assert_eq!(cmd::<String>(a, &["ECHO", "hi"]).unwrap(), "hi");
    assert_eq!(cmd::<String>(a, &["SET", "user:1", "ada"]).unwrap(), "OK");
    // Written through one replica, read through another: one log.
    assert_eq!(cmd::<String>(b, &["GET", "user:1"]).unwrap(), "ada");
    assert_eq!(cmd::<Option<String>>(b, &["GET", "nobody"]).unwrap(), None);
    assert_eq!(cmd::<Option<String>>(a, &["SET", "user:1", "x", "NX"]).unwrap(), None);
    assert_eq!(cmd::<Option<String>>(a, &["SET", "user:1", "bob", "XX", "GET"]).unwrap(), Some("ada".into()));
    assert_eq!(cmd::<Option<String>>(b, &["GETSET", "user:1", "cy"]).unwrap(), Some("bob".into()));
    assert_eq!(cmd::<i64>(a, &["INCR", "n"]).unwrap(), 1);
    assert_eq!(cmd::<i64>(b, &["INCRBY", "n", "41"]).unwrap(), 42);
    assert_eq!(cmd::<i64>(a, &["DECR", "n"]).unwrap(), 41);
    assert!(cmd::<i64>(a, &["INCR", "user:1"]).unwrap_err().to_string().contains("not an integer"));
    assert_eq!(cmd::<String>(a, &["MSET", "k1", "v1", "k2", "v2"]).unwrap(), "OK");
    let got: Vec<Option<String>> = cmd(b, &["MGET", "k1", "k2", "k3"]).unwrap();
    assert_eq!(got, vec![Some("v1".into()), Some("v2".into()), None]);
    assert_eq!(cmd::<i64>(a, &["APPEND", "k1", "+"]).unwrap(), 3);
    assert_eq!(cmd::<i64>(b, &["STRLEN", "k1"]).unwrap(), 3);
    assert_eq!(cmd::<i64>(a, &["EXISTS", "k1", "k2", "k9"]).unwrap(), 2);
    assert_eq!(cmd::<i64>(b, &["DEL", "k1", "k9"]).unwrap(), 1);
    assert_eq!(cmd::<i64>(a, &["DBSIZE"]).unwrap(), 3);
    assert_eq!(cmd::<String>(b, &["FLUSHDB"]).unwrap(), "OK");
    assert_eq!(cmd::<i64>(a, &["DBSIZE"]).unwrap(), 0);
    assert_eq!(cmd::<String>(a, &["SELECT", "0"]).unwrap(), "OK");
    assert!(cmd::<String>(a, &["SELECT", "1"]).is_err());
    assert_eq!(cmd::<String>(a, &["CLIENT", "SETNAME", "me"]).unwrap(), "OK");
    assert!(cmd::<String>(a, &["INFO"]).unwrap().contains("psmr_leader:"));
    assert_eq!(cmd::<String>(a, &["SET", "k", "v", "EX", "100"]).unwrap(), "OK");
    assert!((99..=100).contains(&cmd::<i64>(b, &["TTL", "k"]).unwrap()));
}

#[test]
fn a_pipeline_is_a_client_batch_and_keeps_its_order() {
    let cluster = cluster();
    let leader = cluster.wait_for_leader(Duration::from_secs(20)).unwrap();
    let mut con = connect(cluster.redis_addrs()[0]);
    let proposed = |c: &LocalCluster| c.replica(leader).unwrap().stats().commands_proposed;
    let entries = |c: &LocalCluster| c.replica(leader).unwrap().stats().entries_proposed;
    let (commands_before, entries_before) = (proposed(&cluster), entries(&cluster));
    let mut pipe = redis::pipe();
    for i in 0..300 {
        pipe.cmd("SET").arg(format!("p{i}")).arg(i).ignore();
        pipe.cmd("PING");
        pipe.cmd("INCR").arg("counter");
    }
    let replies: Vec<redis::Value> = pipe.query(&mut con).unwrap();
    assert_eq!(replies.len(), 600);
    for (i, pair) in replies.chunks(2).enumerate() {
        assert_eq!(pair[0], redis::Value::SimpleString("PONG".into()));
        assert_eq!(pair[1], redis::Value::Int(i as i64 + 1));
    }
    // 600 commands went through the log in far fewer entries than one each
    // (the PINGs never reach the log).
    assert_eq!(proposed(&cluster) - commands_before, 600);
    assert!(entries(&cluster) - entries_before <= 10, "{} entries", entries(&cluster) - entries_before);
}

#[test]
fn transactions_run_whole_and_a_refused_command_aborts_them() {
    let cluster = cluster();
    let leader = cluster.wait_for_leader(Duration::from_secs(20)).unwrap();
    let follower = cluster.redis_addrs()[if leader == 1 { 1 } else { 0 }];
    let wait = Duration::from_secs(20);
    let run = |request: &str, lines| common::resp_exchange(follower, request, lines, wait);
    let out = run("MULTI\r\nSET t 1\r\nINCR t\r\nPING\r\nGET t\r\nEXEC\r\n", 10);
    assert_eq!(out, "+OK\r\n+QUEUED\r\n+QUEUED\r\n+QUEUED\r\n+QUEUED\r\n*4\r\n+OK\r\n:2\r\n+PONG\r\n$1\r\n2\r\n");
    let out = run("MULTI\r\nSET t 9\r\nNOSUCH\r\nEXEC\r\nGET t\r\n", 6);
    assert!(out.starts_with("+OK\r\n+QUEUED\r\n-ERR unknown command"), "{out}");
    assert!(out.ends_with("-EXECABORT Transaction discarded because of previous errors.\r\n$1\r\n2\r\n"), "{out}");
    let out = run("EXEC\r\nMULTI\r\nMULTI\r\nDISCARD\r\nDISCARD\r\nMULTI\r\nEXEC\r\nWATCH t\r\nUNWATCH\r\n", 9);
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("-ERR EXEC without MULTI") && lines[2].contains("nested"), "{out}");
    assert_eq!(&lines[3..7], ["+OK", "-ERR DISCARD without MULTI", "+OK", "*0"], "{out}");
    assert_eq!(&lines[7..9], ["+OK", "+OK"], "{out}");

    // redis-rs's atomic pipelines are MULTI/EXEC; writers through every
    // replica never let a reader see one key of a transaction moved
    // without the other.
    let mut con = connect(follower);
    let (set, n): (String, i64) = redis::pipe().atomic().set("p", 1).incr("p", 1).query(&mut con).unwrap();
    assert_eq!((set.as_str(), n), ("OK", 2));
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let writers: Vec<_> = cluster
            .redis_addrs()
            .into_iter()
            .map(|addr| {
                s.spawn(move || {
                    let mut con = connect(addr);
                    for _ in 0..100 {
                        let _: (i64, i64) = redis::pipe().atomic().incr("x", 1).incr("y", 1).query(&mut con).unwrap();
                    }
                })
            })
            .collect();
        let reader = s.spawn(|| {
            let mut con = connect(follower);
            let mut reads = 0;
            while !done.load(Ordering::SeqCst) || reads == 0 {
                let (x, y): (Option<i64>, Option<i64>) =
                    redis::pipe().atomic().get("x").get("y").query(&mut con).unwrap();
                assert_eq!(x, y, "a transaction seen half done");
                reads += 1;
            }
        });
        for w in writers {
            w.join().unwrap();
        }
        done.store(true, Ordering::SeqCst);
        reader.join().unwrap();
    });
    assert_eq!(cmd::<i64>(&mut con, &["GET", "x"]).unwrap(), 300);
}

#[test]
fn watched_transactions_run_only_if_nothing_they_watched_changed() {
    let cluster = cluster();
    cluster.wait_for_leader(Duration::from_secs(20)).unwrap();
    let addrs = cluster.redis_addrs();
    let (mut a, mut b) = two(&addrs, 0, 1);
    let query = |con: &mut redis::Connection, args: &[&str]| cmd::<redis::Value>(con, args).unwrap();
    let nil = redis::Value::Nil;
    let ok = redis::Value::Okay;

    // Another client's write in between: nothing runs.
    assert_eq!(query(&mut a, &["WATCH", "w", "other"]), ok);
    assert_eq!(query(&mut b, &["SET", "w", "1"]), ok);
    query(&mut a, &["MULTI"]);
    query(&mut a, &["SET", "w", "2"]);
    assert_eq!(query(&mut a, &["EXEC"]), nil);
    assert_eq!(cmd::<String>(&mut a, &["GET", "w"]).unwrap(), "1");

    // EXEC forgot the watch: the same transaction now runs, a reply
    // answered at the gateway in its place.
    query(&mut a, &["MULTI"]);
    query(&mut a, &["INCR", "w"]);
    query(&mut a, &["PING"]);
    assert_eq!(
        query(&mut a, &["EXEC"]),
        redis::Value::Array(vec![redis::Value::Int(2), redis::Value::SimpleString("PONG".into())])
    );

    // Watched and unchanged (others' writes elsewhere do not count).
    query(&mut a, &["WATCH", "w"]);
    query(&mut b, &["SET", "elsewhere", "1"]);
    query(&mut a, &["MULTI"]);
    query(&mut a, &["INCR", "w"]);
    assert_eq!(query(&mut a, &["EXEC"]), redis::Value::Array(vec![redis::Value::Int(3)]));

    // The connection's own write counts; so does a delete; UNWATCH forgets.
    for change in [&["SET", "w", "5"][..], &["DEL", "w"]] {
        query(&mut a, &["WATCH", "w"]);
        query(&mut a, change);
        query(&mut a, &["MULTI"]);
        query(&mut a, &["GET", "w"]);
        assert_eq!(query(&mut a, &["EXEC"]), nil, "after {change:?}");
    }
    query(&mut a, &["WATCH", "w"]);
    query(&mut b, &["SET", "w", "7"]);
    assert_eq!(query(&mut a, &["UNWATCH"]), ok);
    query(&mut a, &["MULTI"]);
    query(&mut a, &["GET", "w"]);
    assert_eq!(query(&mut a, &["EXEC"]), redis::Value::Array(vec![redis::Value::BulkString(b"7".to_vec())]));

    // Optimistic increments from every replica: redis-rs's `transaction`
    // watches, reads, and retries while EXEC says nil. No increment is lost.
    std::thread::scope(|s| {
        for &addr in &addrs {
            s.spawn(move || {
                let mut con = connect(addr);
                for _ in 0..30 {
                    let _: () = redis::transaction(&mut con, &["counter"], |con, pipe| {
                        let n: Option<i64> = redis::cmd("GET").arg("counter").query(con)?;
                        pipe.set("counter", n.unwrap_or(0) + 1).ignore().query(con)
                    })
                    .unwrap();
                }
            });
        }
    });
    assert_eq!(cmd::<i64>(&mut a, &["GET", "counter"]).unwrap(), 30 * addrs.len() as i64);
}

#[test]
fn hashes_work_through_any_replica_as_redis_clients_use_them() {
    let cluster = cluster();
    let addrs = cluster.redis_addrs();
    let (mut a, mut b) = two(&addrs, 0, 1);
    assert_eq!(cmd::<i64>(&mut a, &["HSET", "user:1", "name", "ada", "lang", "rust"]).unwrap(), 2);
    assert_eq!(cmd::<String>(&mut b, &["HGET", "user:1", "name"]).unwrap(), "ada");
    let all: std::collections::HashMap<String, String> = cmd(&mut b, &["HGETALL", "user:1"]).unwrap();
    assert_eq!(all.len(), 2);
    assert_eq!(cmd::<Vec<String>>(&mut a, &["HKEYS", "user:1"]).unwrap(), ["lang", "name"]);
    assert_eq!(cmd::<i64>(&mut a, &["HINCRBY", "user:1", "visits", "3"]).unwrap(), 3);
    assert_eq!(cmd::<String>(&mut a, &["HINCRBYFLOAT", "user:1", "score", "1.5"]).unwrap(), "1.5");
    assert_eq!(cmd::<String>(&mut a, &["HMSET", "user:2", "a", "1"]).unwrap(), "OK");
    assert_eq!(cmd::<String>(&mut a, &["TYPE", "user:1"]).unwrap(), "hash");
    let e = cmd::<String>(&mut a, &["GET", "user:1"]).unwrap_err().to_string();
    assert!(e.contains("WRONGTYPE"), "{e}");
    let e = cmd::<i64>(&mut a, &["HSET", "user:1", "odd"]).unwrap_err().to_string();
    assert!(e.contains("wrong number of arguments"), "{e}");
    let e = cmd::<String>(&mut a, &["HINCRBYFLOAT", "user:1", "score", "x"]).unwrap_err().to_string();
    assert!(e.contains("not a valid float"), "{e}");
    assert_eq!(cmd::<i64>(&mut b, &["HDEL", "user:2", "a"]).unwrap(), 1);
    assert_eq!(cmd::<String>(&mut b, &["TYPE", "user:2"]).unwrap(), "none", "gone with its last field");
    // RESP3: HGETALL is a map.
    let (out, _) = raw(addrs[2], b"HELLO 3\r\nHGETALL user:2\r\nHGETALL user:1\r\n");
    assert!(out.contains("%0\r\n%4\r\n"), "{out}");
}

#[test]
fn lists_make_a_job_queue_through_any_replica() {
    let cluster = cluster();
    let (mut a, mut b) = two(&cluster.redis_addrs(), 0, 2);
    assert_eq!(cmd::<i64>(&mut a, &["RPUSH", "jobs", "j1", "j2", "j3"]).unwrap(), 3);
    assert_eq!(cmd::<i64>(&mut b, &["LPUSH", "jobs", "j0"]).unwrap(), 4);
    assert_eq!(cmd::<Vec<String>>(&mut b, &["LRANGE", "jobs", "0", "-1"]).unwrap(), ["j0", "j1", "j2", "j3"]);
    assert_eq!(cmd::<String>(&mut a, &["LMOVE", "jobs", "doing", "LEFT", "RIGHT"]).unwrap(), "j0");
    assert_eq!(cmd::<String>(&mut a, &["RPOPLPUSH", "jobs", "doing"]).unwrap(), "j3");
    assert_eq!(cmd::<i64>(&mut b, &["LREM", "doing", "0", "j0"]).unwrap(), 1);
    assert_eq!(cmd::<Vec<String>>(&mut b, &["LPOP", "jobs", "5"]).unwrap(), ["j1", "j2"]);
    assert_eq!(cmd::<Option<String>>(&mut b, &["RPOP", "jobs"]).unwrap(), None);
    assert_eq!(cmd::<Option<Vec<String>>>(&mut b, &["RPOP", "jobs", "2"]).unwrap(), None, "nil array: no list");
    assert_eq!(cmd::<String>(&mut a, &["TYPE", "doing"]).unwrap(), "list");
    assert_eq!(cmd::<i64>(&mut a, &["LPOS", "doing", "j3"]).unwrap(), 0);
    assert_eq!(cmd::<Vec<i64>>(&mut a, &["LPOS", "doing", "j3", "COUNT", "0"]).unwrap(), [0]);
    assert_eq!(cmd::<String>(&mut a, &["LSET", "doing", "0", "x"]).unwrap(), "OK");
    for (args, needle) in [
        (&["LSET", "nolist", "0", "x"][..], "no such key"),
        (&["LSET", "doing", "9", "x"], "index out of range"),
        (&["LPOS", "doing", "x", "RANK", "0"], "RANK can't be zero"),
        (&["LPOP", "doing", "-1"], "must be positive"),
        (&["LINSERT", "doing", "AROUND", "x", "y"], "syntax error"),
        (&["LMOVE", "doing", "d", "UP", "LEFT"], "syntax error"),
        (&["LRANGE", "doing", "a", "1"], "not an integer"),
    ] {
        let e = cmd::<String>(&mut a, args).unwrap_err().to_string();
        assert!(e.contains(needle), "{args:?}: {e}");
    }
    assert_eq!(cmd::<i64>(&mut a, &["LPUSH", "queue", "v"]).unwrap(), 1);
    let e = cmd::<String>(&mut a, &["GET", "queue"]).unwrap_err().to_string();
    assert!(e.contains("WRONGTYPE"), "{e}");
}

#[test]
fn sets_work_through_any_replica() {
    let cluster = cluster();
    let (mut a, mut b) = two(&cluster.redis_addrs(), 1, 2);
    assert_eq!(cmd::<i64>(&mut a, &["SADD", "tags:1", "rust", "smr", "rust"]).unwrap(), 2);
    assert_eq!(cmd::<i64>(&mut b, &["SADD", "tags:2", "smr", "raft"]).unwrap(), 2);
    assert_eq!(cmd::<Vec<String>>(&mut b, &["SMEMBERS", "tags:1"]).unwrap(), ["rust", "smr"]);
    assert_eq!(cmd::<Vec<String>>(&mut a, &["SINTER", "tags:1", "tags:2"]).unwrap(), ["smr"]);
    assert_eq!(cmd::<Vec<String>>(&mut a, &["SUNION", "tags:1", "tags:2"]).unwrap(), ["raft", "rust", "smr"]);
    assert_eq!(cmd::<i64>(&mut a, &["SDIFFSTORE", "only:1", "tags:1", "tags:2"]).unwrap(), 1);
    assert_eq!(cmd::<Vec<i64>>(&mut b, &["SMISMEMBER", "only:1", "rust", "smr"]).unwrap(), [1, 0]);
    assert_eq!(cmd::<i64>(&mut b, &["SMOVE", "tags:2", "tags:1", "raft"]).unwrap(), 1);
    assert_eq!(cmd::<i64>(&mut b, &["SCARD", "tags:1"]).unwrap(), 3);
    assert_eq!(cmd::<i64>(&mut b, &["SISMEMBER", "tags:2", "raft"]).unwrap(), 0);
    assert_eq!(cmd::<String>(&mut a, &["TYPE", "tags:1"]).unwrap(), "set");
    let e = cmd::<i64>(&mut a, &["SADD", "tags:1"]).unwrap_err().to_string();
    assert!(e.contains("wrong number of arguments"), "{e}");
    cmd::<String>(&mut a, &["SET", "plain", "v"]).unwrap();
    let e = cmd::<Vec<String>>(&mut a, &["SUNION", "tags:1", "plain"]).unwrap_err().to_string();
    assert!(e.contains("WRONGTYPE"), "{e}");
}

#[test]
fn the_command_reference_matches_the_code_both_ways() {
    use psmr::resp::Commands;
    let doc = include_str!("../../../docs/redis.md");
    let table = &doc[doc.find("## Commands").expect("a Commands section")..];
    let table = &table[..table[3..].find("\n## ").map_or(table.len(), |i| i + 3)];
    let mut documented: Vec<String> = table
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .flat_map(|row| row.split(" | ").next().unwrap().split(", ").map(|c| c.trim_matches('`').to_string()))
        .collect();
    documented.sort();
    let mut known: Vec<String> = KvRedis.names().iter().map(|n| n.to_ascii_uppercase()).collect();
    known.extend(psmr::gateway::CONNECTION_COMMANDS.iter().map(|c| c.to_string()));
    known.sort();
    assert_eq!(documented, known, "docs/redis.md's table against the code");

    // Every command the gateway says it answers is answered, not unknown.
    let cluster = cluster();
    let addr = cluster.redis_addrs()[0];
    let wait = Duration::from_secs(20);
    for name in psmr::gateway::CONNECTION_COMMANDS.iter().filter(|&&c| c != "QUIT") {
        let out = common::resp_exchange(addr, &format!("{name}\r\n"), 1, wait);
        assert!(!out.contains("unknown command"), "{name}: {out}");
    }
}

/// Sends `bytes` on a fresh connection and returns what comes back
/// before the server closes or goes quiet (bounded by a read timeout).
fn raw(addr: SocketAddr, bytes: &[u8]) -> (String, bool) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    s.write_all(bytes).unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let closed = loop {
        match s.read(&mut buf) {
            Ok(0) => break true,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(_) => break false,
        }
    };
    (String::from_utf8_lossy(&out).into_owned(), closed)
}

#[test]
fn hostile_resp_gets_errors_never_a_panic() {
    let cluster = cluster();
    let addr = cluster.redis_addrs()[1];
    // A bulk length of 2^40 is refused as soon as it is declared.
    let (out, closed) = raw(addr, b"*1\r\n$1099511627776\r\n");
    assert!(out.starts_with("-ERR Protocol error: invalid bulk length") && closed, "{out}");
    let (out, closed) = raw(addr, b"*2\r\n:12\r\n");
    assert!(out.starts_with("-ERR Protocol error: expected '$'") && closed, "{out}");
    // The requests before the error are served first, as Redis serves them.
    let (out, closed) = raw(addr, b"SET before 1\r\nPING\r\n*2\r\n:12\r\n");
    assert!(out.starts_with("+OK\r\n+PONG\r\n-ERR Protocol error: expected '$'") && closed, "{out}");
    // An unterminated line longer than Redis's inline limit.
    let (out, closed) = raw(addr, &vec![b'a'; 70_000]);
    assert!(out.starts_with("-ERR Protocol error: too big inline request") && closed, "{out}");
    // 10 000 empty strings: a command with an empty name, unknown; the
    // connection lives on.
    let mut many = b"*10000\r\n".to_vec();
    for _ in 0..10_000 {
        many.extend_from_slice(b"$0\r\n\r\n");
    }
    many.extend_from_slice(b"PING\r\n");
    let (out, closed) = raw(addr, &many);
    assert!(out.starts_with("-ERR unknown command ''") && out.ends_with("+PONG\r\n") && !closed, "{out}");
    let (out, closed) = raw(addr, b"NOSUCH a b\r\nGET\r\nGET a b\r\nPING\r\n");
    assert_eq!(out.matches("-ERR").count(), 3, "{out}");
    assert!(out.contains("unknown command 'NOSUCH'") && out.contains("wrong number of arguments for 'get'"));
    assert!(out.ends_with("+PONG\r\n") && !closed, "{out}");
    // The replicas are all still there.
    for r in 1..=3 {
        assert!(!cluster.replica(r).unwrap().stopping());
    }
}

#[test]
fn hello_3_switches_to_resp3() {
    let cluster = cluster();
    let (out, _) = raw(cluster.redis_addrs()[2], b"HELLO 3\r\nGET missing\r\nHELLO 2\r\nGET missing\r\nHELLO 4\r\n");
    assert!(out.starts_with("%7\r\n"), "{out}");
    // RESP3's null, then the second HELLO's map as a RESP2 flat array.
    assert!(out.contains("_\r\n*14\r\n"), "{out}");
    assert!(out.contains("$-1\r\n-NOPROTO"), "{out}");
}

#[test]
fn redis_cli_and_redis_benchmark_work_against_any_replica() {
    let cluster = cluster();
    for addr in cluster.redis_addrs() {
        let cli = |args: &[&str]| {
            let out = std::process::Command::new(common::tool("redis-cli"))
                .args(["-h", &addr.ip().to_string(), "-p", &addr.port().to_string()])
                .args(args)
                .output()
                .unwrap();
            assert!(out.status.success(), "{:?}", out);
            String::from_utf8_lossy(&out.stdout).trim().to_string()
        };
        assert_eq!(cli(&["SET", "tool", &addr.to_string()]), "OK");
        assert_eq!(cli(&["GET", "tool"]), addr.to_string());
    }
    let addr = cluster.redis_addrs()[1];
    let out = std::process::Command::new(common::tool("redis-benchmark"))
        .args(["-h", &addr.ip().to_string(), "-p", &addr.port().to_string()])
        .args(["-t", "set,get", "-n", "2000", "-c", "8", "-P", "10", "-q", "--csv"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("\"SET\"") && text.contains("\"GET\""), "{out:?}");
}

#[test]
fn the_sharded_model_refuses_cross_slot_commands_as_redis_cluster_does() {
    let service = ServiceConfig { model: "sharded".into(), shards: 4, ..ServiceConfig::default() };
    let cluster = LocalCluster::builder()
        .start_with_redis(|_| KvApp::new(&service).expect("a sharded kv"), |_| KvRedis)
        .expect("a local cluster");
    let mut con = connect(cluster.redis_addrs()[0]);
    // Among 20 keys, two land in different shards.
    let keys: Vec<String> = (0..20).map(|i| format!("key{i}")).collect();
    let mut args = vec!["MSET"];
    for k in &keys {
        args.extend([k.as_str(), "v"]);
    }
    let e = cmd::<String>(&mut con, &args).unwrap_err();
    assert_eq!(e.code(), Some("CROSSSLOT"), "{e}");
    let e = cmd::<i64>(&mut con, &["DBSIZE"]).unwrap_err().to_string();
    assert!(e.contains("readers-writers"), "{e}");
    assert_eq!(cmd::<String>(&mut con, &["SET", "one", "1"]).unwrap(), "OK");
}

fn seed() -> u64 {
    let s = std::env::var("PSMR_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand::random);
    eprintln!("PSMR_TEST_SEED={s}");
    s
}

/// One client of the history test: random reads, writes and deletes of a
/// few keys through the Redis ports, moving to the next port when its
/// replica dies; an operation without an answer is `unknown`.
fn redis_client(
    client: u64,
    seed: u64,
    ports: Vec<SocketAddr>,
    start: std::time::Instant,
    stop: &std::sync::atomic::AtomicBool,
    answered: &std::sync::atomic::AtomicU64,
) -> Vec<psmr::harness::history::Operation> {
    use psmr::harness::history::{OpKind, Operation, Status};
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed ^ client);
    let mut port = client as usize;
    let mut con: Option<redis::Connection> = None;
    let mut history = Vec::new();
    let now = || start.elapsed().as_nanos() as u64;
    for n in 0.. {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        if con.is_none() {
            port += 1;
            let addr = ports[port % ports.len()];
            let c = redis::Client::open(format!("redis://{addr}/")).unwrap();
            con = c.get_connection_with_timeout(Duration::from_secs(1)).ok();
            if let Some(c) = &mut con {
                c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            }
            continue;
        }
        let key = format!("h{}", rng.gen_range(0..6));
        let value = format!("c{client}-{n}");
        let (op, request) = match rng.gen_range(0..10) {
            0..=3 => (OpKind::Read, redis::cmd("GET").arg(&key).clone()),
            4..=8 => (OpKind::Write, redis::cmd("SET").arg(&key).arg(&value).arg("GET").clone()),
            _ => (OpKind::Delete, redis::cmd("DEL").arg(&key).clone()),
        };
        let invoke_ns = now();
        let answer: redis::RedisResult<redis::Value> = request.query(con.as_mut().unwrap());
        let complete_ns = now();
        let (status, result) = match answer {
            Ok(v) => {
                answered.fetch_add(1, Ordering::Relaxed);
                (Status::Ok, history_result(op, v))
            }
            Err(_) => {
                con = None;
                (Status::Unknown, serde_json::Value::Null)
            }
        };
        let value = (op == OpKind::Write).then_some(value);
        history.push(Operation { client, op, key, value, result, invoke_ns, complete_ns, status });
    }
    history
}

/// A Redis reply as the history's result: reads the value, writes and
/// deletes whether the key existed.
fn history_result(op: psmr::harness::history::OpKind, v: redis::Value) -> serde_json::Value {
    use psmr::harness::history::OpKind;
    match (op, v) {
        (OpKind::Read, redis::Value::BulkString(b)) => String::from_utf8_lossy(&b).into_owned().into(),
        (OpKind::Read, redis::Value::Nil) => serde_json::Value::Null,
        (OpKind::Write, redis::Value::BulkString(_)) => true.into(),
        (OpKind::Write, redis::Value::Nil) => false.into(),
        (OpKind::Delete, redis::Value::Int(n)) => (n > 0).into(),
        (op, v) => panic!("{op:?} answered {v:?}"),
    }
}

#[test]
fn histories_through_redis_are_linearizable_while_leaders_die() {
    use psmr::harness::history::{check_linearizable, Verdict, MAX_STATES_DEFAULT};
    let seed = seed();
    let mut cluster = LocalCluster::builder()
        .replicas(5)
        .start_with_redis(|_| KvApp::new(&ServiceConfig::default()).expect("the default kv"), |_| KvRedis)
        .expect("a local cluster");
    let ports = cluster.redis_addrs();
    let start = std::time::Instant::now();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let answered = std::sync::atomic::AtomicU64::new(0);
    // Each phase lasts until the clients have had 1000 more answers: the
    // load is under way around every kill, whatever the machine's speed.
    let under_way = |from: u64| {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while answered.load(Ordering::Relaxed) < from + 1000 {
            assert!(std::time::Instant::now() < deadline, "the clients got no answers");
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    let histories = std::thread::scope(|s| {
        let clients: Vec<_> = (0..6u64)
            .map(|c| {
                let (ports, stop, answered) = (ports.clone(), &stop, &answered);
                s.spawn(move || redis_client(c, seed, ports, start, stop, answered))
            })
            .collect();
        // Two leaders die, one after the other, under load; three of five
        // replicas remain, a majority.
        for _ in 0..2 {
            under_way(answered.load(Ordering::Relaxed));
            let leader = cluster.wait_for_leader(Duration::from_secs(30)).unwrap();
            eprintln!("stopping leader {leader}");
            assert!(cluster.stop(leader));
        }
        under_way(answered.load(Ordering::Relaxed));
        stop.store(true, Ordering::Relaxed);
        clients.into_iter().flat_map(|c| c.join().unwrap()).collect::<Vec<_>>()
    });
    let ok = histories.iter().filter(|o| o.status == psmr::harness::history::Status::Ok).count();
    eprintln!("{} operations, {ok} answered", histories.len());
    assert!(ok > 100, "too few answered operations to mean anything: {ok}");
    assert_eq!(check_linearizable(&histories, MAX_STATES_DEFAULT), Verdict::Linearizable);
}

#[test]
fn pipelines_are_split_at_the_batch_byte_limit_and_larger_commands_refused() {
    let cluster = LocalCluster::builder()
        .configure(|c| c.batch_max_bytes = 4096)
        .start_with_redis(|_| KvApp::new(&ServiceConfig::default()).expect("the default kv"), |_| KvRedis)
        .expect("a local cluster");
    let mut con = connect(cluster.redis_addrs()[0]);
    let value = "v".repeat(1000);
    let mut pipe = redis::pipe();
    for i in 0..20 {
        pipe.cmd("SET").arg(format!("big{i}")).arg(&value);
    }
    pipe.cmd("DBSIZE");
    let replies: Vec<redis::Value> = pipe.query(&mut con).unwrap();
    assert!(replies[..20].iter().all(|r| *r == redis::Value::Okay), "{replies:?}");
    assert_eq!(replies[20], redis::Value::Int(20));
    let e = cmd::<String>(&mut con, &["SET", "huge", &"v".repeat(5000)]).unwrap_err().to_string();
    assert!(e.contains("command too large") && e.contains("batch_max_bytes"), "{e}");
    assert_eq!(cmd::<String>(&mut con, &["PING"]).unwrap(), "PONG");
}

/// The value of metric `name` (no labels) in an exposition.
fn metric(text: &str, name: &str) -> f64 {
    let line = text.lines().find(|l| l.split(' ').next() == Some(name)).unwrap_or_else(|| panic!("no {name}"));
    line.split(' ').nth(1).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("bad line {line}"))
}

/// Reads one RESP bulk string reply.
fn read_bulk(r: &mut impl std::io::BufRead) -> Vec<u8> {
    let mut head = String::new();
    r.read_line(&mut head).unwrap();
    let len: usize =
        head.strip_prefix('$').and_then(|n| n.trim_end().parse().ok()).unwrap_or_else(|| panic!("{head:?}"));
    let mut body = vec![0; len + 2];
    r.read_exact(&mut body).unwrap();
    body.truncate(len);
    body
}

#[test]
fn a_slow_reader_of_big_replies_is_held_within_the_reply_bounds_and_gets_them_all_in_order() {
    slow_reader(true);
}

#[test]
fn a_slow_reader_through_a_follower_gets_every_big_reply_in_order() {
    slow_reader(false);
}

/// A pipeline of big replies read only once the replica whose replies
/// they are (the leader: `here` or behind a follower's gateway) has had to
/// drop some.
fn slow_reader(here: bool) {
    const BUDGET: usize = 16 << 20;
    let _ = tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).try_init();
    let cluster = LocalCluster::builder()
        .configure(|c| c.client_buffer_bytes_max = BUDGET)
        .start_with_redis(|_| KvApp::new(&ServiceConfig::default()).expect("the default kv"), |_| KvRedis)
        .expect("a local cluster");
    let leader = cluster.wait_for_leader(Duration::from_secs(20)).unwrap();
    // The leader's gateway submits in-process; a follower's over the
    // network, to the leader's client port.
    let port = if here { leader } else { leader % 3 + 1 };
    let addr = cluster.redis_addrs()[port as usize - 1];
    let (count, size) = (300, 256 << 10);
    let mut con = connect(addr);
    for (i, key) in ["a", "b"].iter().enumerate() {
        let value = vec![b'0' + i as u8; size];
        redis::cmd("SET").arg(*key).arg(value).query::<()>(&mut con).unwrap();
    }
    // 300 GETs of 256 KiB (75 MiB of replies), alternating two keys, and
    // nothing read until the leader has had to drop replies.
    let mut raw = TcpStream::connect(addr).unwrap();
    let key = |i: usize| if i % 2 == 0 { "a" } else { "b" };
    let pipeline: String = (0..count).map(|i| format!("*2\r\n$3\r\nGET\r\n$1\r\n{}\r\n", key(i))).collect();
    raw.write_all(pipeline.as_bytes()).unwrap();
    let replica = cluster.replica(leader).unwrap();
    let mut text = replica.metrics_text();
    for _ in 0..6000 {
        if metric(&text, "psmr_client_replies_dropped_total") > 0.0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
        text = replica.metrics_text();
    }
    assert!(metric(&text, "psmr_client_replies_dropped_total") > 0.0, "the replies never reached their bound");
    let queued = metric(&text, "psmr_client_outbox_bytes") as usize;
    assert!(queued <= BUDGET + size + 64, "{queued} bytes of replies queued, over the {BUDGET} bound");
    // Every reply comes, in order, whole.
    let mut r = std::io::BufReader::new(raw);
    for i in 0..count {
        let got = read_bulk(&mut r);
        assert_eq!((got.len(), got[0]), (size, b'0' + (i % 2) as u8), "reply {i}");
    }
    assert_eq!(cmd::<String>(&mut con, &["PING"]).unwrap(), "PONG");
}

/// Keys past their deadline that nobody touches go all the same: the
/// leader's sweeps reclaim them through the log, on every replica.
#[test]
fn expired_keys_nobody_touches_are_reclaimed_on_every_replica() {
    let cluster = cluster();
    let addrs = cluster.redis_addrs();
    let mut a = connect(addrs[0]);
    let mut pipe = redis::pipe();
    for i in 0..500 {
        pipe.cmd("SET").arg(format!("cache:{i}")).arg("v").arg("PX").arg(100).ignore();
    }
    pipe.cmd("SET").arg("kept").arg("v").ignore();
    pipe.query::<()>(&mut a).unwrap();
    // DBSIZE counts keys past their deadline until they are reclaimed;
    // nothing here touches them again.
    {
        let mut c = connect(addrs[1]);
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let n: i64 = cmd(&mut c, &["DBSIZE"]).unwrap();
            if n == 1 {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "{n} keys left");
            // Paces the poll; the condition above is what is waited for.
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    assert_eq!(cmd::<String>(&mut a, &["GET", "kept"]).unwrap(), "v");
    // Every replica reclaimed them: the same state at the same index.
    let probe = psmr::client::Client::new(psmr::client::ClientConfig::new(cluster.client_addrs())).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let st: Result<Vec<_>, _> =
            cluster.client_addrs().iter().map(|&c| probe.status_of(c, Duration::from_secs(2))).collect();
        if st
            .as_ref()
            .is_ok_and(|st| st.windows(2).all(|w| (w[0].applied, &w[0].digest) == (w[1].applied, &w[1].digest)))
        {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "replicas never converged: {st:?}");
        // Paces the poll; the condition above is what is waited for.
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A job queue on a list with blocking pops: workers wait at their
/// gateways, through any replica, and every job is taken exactly once.
#[test]
fn blocking_pops_wait_for_jobs_and_time_out_with_nil() {
    let cluster = cluster();
    let addrs = cluster.redis_addrs();
    let workers: Vec<_> = (0..3)
        .map(|i| {
            let addr = addrs[i % addrs.len()];
            std::thread::spawn(move || {
                let mut c = connect(addr);
                let mut got = Vec::new();
                loop {
                    let job: Option<(String, String)> = cmd(&mut c, &["BLPOP", "jobs", "other", "2"]).unwrap();
                    match job {
                        Some((_, j)) if j == "stop" => return got,
                        Some((key, j)) => {
                            assert_eq!(key, "jobs");
                            got.push(j);
                        }
                        None => {}
                    }
                }
            })
        })
        .collect();
    let mut producer = connect(addrs[1]);
    for j in 0..60 {
        let _: i64 = cmd(&mut producer, &["RPUSH", "jobs", &format!("job{j}")]).unwrap();
    }
    for _ in 0..3 {
        let _: i64 = cmd(&mut producer, &["RPUSH", "jobs", "stop"]).unwrap();
    }
    let mut all: Vec<String> = workers.into_iter().flat_map(|w| w.join().unwrap()).collect();
    all.sort();
    let mut want: Vec<String> = (0..60).map(|j| format!("job{j}")).collect();
    want.sort();
    assert_eq!(all, want, "every job taken once");
    let mut c = connect(addrs[2]);
    let none: Option<(String, String)> = cmd(&mut c, &["BRPOP", "empty", "0.05"]).unwrap();
    assert_eq!(none, None, "a timeout answers nil");
    let moved: Option<String> = cmd(&mut c, &["BLMOVE", "empty", "dst", "LEFT", "RIGHT", "0.05"]).unwrap();
    assert_eq!(moved, None);
    let _: i64 = cmd(&mut c, &["RPUSH", "src", "x"]).unwrap();
    let moved: Option<String> = cmd(&mut c, &["BRPOPLPUSH", "src", "dst", "0"]).unwrap();
    assert_eq!(moved.as_deref(), Some("x"));
    let e = cmd::<Option<String>>(&mut c, &["BLPOP", "q", "-1"]).unwrap_err().to_string();
    assert!(e.contains("timeout is negative"), "{e}");
    let e = cmd::<Option<String>>(&mut c, &["BLPOP", "q", "soon"]).unwrap_err().to_string();
    assert!(e.contains("timeout is not a float"), "{e}");
}
