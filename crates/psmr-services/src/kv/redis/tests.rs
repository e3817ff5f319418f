use super::*;
use crate::kv::{access, command, key_bytes, key_hash, shard_of, AccessError, KvModel, KvService, ALL};
use crate::{Cost, KvApp, ServiceConfig};
use psmr_model::{App, ClientId, Service};
use psmr_resp::Version;

fn args(words: &[&[u8]]) -> Vec<Bytes> {
    words.iter().map(|w| Bytes::copy_from_slice(w)).collect()
}

/// Parses `words`, executes the operation on `store` through the
/// readers-writers model, and says the reply in RESP2.
fn exec_bytes(store: &KvService, words: &[&[u8]]) -> String {
    let reply = match KvRedis.operation(&args(words)) {
        Ok(op) => {
            let c = command(KvModel::ReadersWriters, 1, ClientId(1), 1, op.clone()).unwrap();
            KvRedis.reply(&op, store.execute(&c))
        }
        Err(reply) => reply,
    };
    String::from_utf8(reply.to_bytes(Version::Resp2)).unwrap()
}

fn exec(store: &KvService, line: &str) -> String {
    let words: Vec<&[u8]> = line.split(' ').map(str::as_bytes).collect();
    exec_bytes(store, &words)
}

/// [`exec`] by a command of the log stamped `time_ms` (and seed 7).
fn exec_at(store: &KvService, time_ms: u64, line: &str) -> String {
    let words: Vec<Bytes> = line.split(' ').map(|w| Bytes::copy_from_slice(w.as_bytes())).collect();
    let reply = match KvRedis.operation(&words) {
        Ok(op) => {
            let c = command(KvModel::ReadersWriters, 1, ClientId(1), 1, op.clone()).unwrap();
            let c = psmr_model::Command { stamp: psmr_model::Stamp { time_ms, seed: 7 }, ..c };
            KvRedis.reply(&op, store.execute(&c))
        }
        Err(reply) => reply,
    };
    String::from_utf8(reply.to_bytes(Version::Resp2)).unwrap()
}

fn parse(line: &str) -> KvOp {
    let words: Vec<&[u8]> = line.split(' ').map(str::as_bytes).collect();
    KvRedis.operation(&args(&words)).unwrap()
}

fn store() -> KvService {
    KvService::new(0, Cost::Light)
}

const OK: &str = "+OK\r\n";
const NIL: &str = "$-1\r\n";
const NOT_INTEGER: &str = "-ERR value is not an integer or out of range\r\n";
const SYNTAX: &str = "-ERR syntax error\r\n";
const WRONGTYPE: &str = "-WRONGTYPE Operation against a key holding the wrong kind of value\r\n";

fn bulk(s: &str) -> String {
    format!("${}\r\n{s}\r\n", s.len())
}

fn arity(name: &str) -> String {
    format!("-ERR wrong number of arguments for '{name}' command\r\n")
}

#[test]
fn get_and_set() {
    let s = store();
    assert_eq!(exec(&s, "GET k"), NIL);
    assert_eq!(exec(&s, "SET k v"), OK);
    assert_eq!(exec(&s, "get k"), bulk("v"));
    assert_eq!(exec(&s, "SeT k w"), OK);
    assert_eq!(exec(&s, "GET k"), bulk("w"));
    assert_eq!(exec(&s, "SET k x NX"), NIL);
    assert_eq!(exec(&s, "SET m x xx"), NIL);
    assert_eq!(exec(&s, "GET m"), NIL);
    assert_eq!(exec(&s, "SET m x nx"), OK);
    assert_eq!(exec(&s, "SET m y XX"), OK);
    assert_eq!(exec(&s, "SET m z GET"), bulk("y"));
    assert_eq!(exec(&s, "SET n z get"), NIL);
    assert_eq!(exec(&s, "GET n"), bulk("z"));
    assert_eq!(exec(&s, "SET m q NX GET"), bulk("z"));
    assert_eq!(exec(&s, "GET m"), bulk("z"));
    assert_eq!(exec(&s, "SET o q GET XX"), NIL);
    assert_eq!(exec(&s, "GET o"), NIL);
    // Repeating an option is fine, as in Redis.
    assert_eq!(exec(&s, "SET k v NX NX"), NIL);
    assert_eq!(exec(&s, "SET k v GET GET"), bulk("w"));
    // Empty values and binary keys.
    assert_eq!(exec_bytes(&s, &[b"SET", b"\0\r\n", b""]), OK);
    assert_eq!(exec_bytes(&s, &[b"GET", b"\0\r\n"]), "$0\r\n\r\n");
}

#[test]
fn set_syntax_and_bad_deadlines_are_refused_without_executing() {
    let s = store();
    for line in [
        "SET k v NX XX",
        "SET k v XX NX",
        "SET k v FOO",
        "SET k v GET NX FOO",
        "SET k v NXX",
        "SET k v EX",
        "SET k v EX 10 PX 10",
        "SET k v KEEPTTL EX 1",
        "SET k v PXAT 5 KEEPTTL",
    ] {
        assert_eq!(exec(&s, line), SYNTAX, "{line}");
    }
    for line in ["SET k v EX 0", "SET k v px -1", "SET k v EXAT 9223372036854776", "SET k v PXAT 0"] {
        assert_eq!(exec(&s, line), "-ERR invalid expire time in 'set' command\r\n", "{line}");
    }
    assert_eq!(exec(&s, "SET k v EX ten"), NOT_INTEGER);
    assert_eq!(exec(&s, "SETEX k 0 v"), "-ERR invalid expire time in 'setex' command\r\n");
    assert_eq!(exec(&s, "PSETEX k -5 v"), "-ERR invalid expire time in 'psetex' command\r\n");
    assert_eq!(exec(&s, "GETEX k EX 0"), "-ERR invalid expire time in 'getex' command\r\n");
    assert_eq!(exec(&s, "GETEX k PERSIST EX 1"), SYNTAX);
    assert!(s.is_empty());
}

#[test]
fn getset() {
    let s = store();
    assert_eq!(exec(&s, "GETSET k a"), NIL);
    assert_eq!(exec(&s, "GETSET k b"), bulk("a"));
    assert_eq!(exec(&s, "GET k"), bulk("b"));
    assert_eq!(
        parse("getset k b"),
        KvOp::Set { key: b"k".to_vec(), value: b"b".to_vec(), when: SetWhen::Always, get: true, ttl: Ttl::Clear }
    );
}

#[test]
fn del_and_exists_count_as_redis() {
    let s = store();
    assert_eq!(exec(&s, "MSET a 1 b 2 c 3"), OK);
    assert_eq!(exec(&s, "EXISTS a a x b"), ":3\r\n");
    assert_eq!(exec(&s, "EXISTS x"), ":0\r\n");
    assert_eq!(exec(&s, "DEL a a x b"), ":2\r\n");
    assert_eq!(exec(&s, "DEL a"), ":0\r\n");
    assert_eq!(exec(&s, "EXISTS a b c"), ":1\r\n");
}

#[test]
fn incr_family() {
    let s = store();
    assert_eq!(exec(&s, "INCR n"), ":1\r\n");
    assert_eq!(exec(&s, "INCRBY n 10"), ":11\r\n");
    assert_eq!(exec(&s, "decr n"), ":10\r\n");
    assert_eq!(exec(&s, "DECRBY n 20"), ":-10\r\n");
    assert_eq!(exec(&s, "INCRBY n -5"), ":-15\r\n");
    assert_eq!(exec(&s, "GET n"), bulk("-15"));
    assert_eq!(exec(&s, "INCRBY m -9223372036854775808"), ":-9223372036854775808\r\n");
    assert_eq!(exec(&s, "DECR m"), "-ERR increment or decrement would overflow\r\n");
    assert_eq!(exec(&s, "GET m"), bulk("-9223372036854775808"));
    assert_eq!(exec(&s, "SET m 9223372036854775807"), OK);
    assert_eq!(exec(&s, "INCR m"), "-ERR increment or decrement would overflow\r\n");
    assert_eq!(exec(&s, "DECRBY m -1"), "-ERR increment or decrement would overflow\r\n");
    assert_eq!(exec(&s, "DECRBY m -9223372036854775808"), "-ERR decrement would overflow\r\n");
    // Arguments parse as string2ll: no sign, spaces, zeros or fractions.
    for by in ["abc", "+1", "-0", "007", "1.5", "", "9223372036854775808", "1e3"] {
        assert_eq!(exec_bytes(&s, &[b"INCRBY", b"n", by.as_bytes()]), NOT_INTEGER, "{by:?}");
        assert_eq!(exec_bytes(&s, &[b"DECRBY", b"n", by.as_bytes()]), NOT_INTEGER, "{by:?}");
    }
    assert_eq!(exec_bytes(&s, &[b"INCRBY", b"n", b" 1"]), NOT_INTEGER);
    assert_eq!(exec(&s, "INCRBY n 0"), ":-15\r\n");
    // Stored values too, and a refusal leaves the value.
    for stored in ["-0", "007", "+1", "x", "1.0", "", "99999999999999999999"] {
        assert_eq!(exec_bytes(&s, &[b"SET", b"v", stored.as_bytes()]), OK);
        assert_eq!(exec(&s, "INCR v"), NOT_INTEGER, "{stored:?}");
        assert_eq!(exec(&s, "GET v"), bulk(stored));
    }
    for (stored, after) in [("0", "1"), ("-1", "0"), ("10", "11"), ("-10", "-9")] {
        assert_eq!(exec_bytes(&s, &[b"SET", b"v", stored.as_bytes()]), OK);
        assert_eq!(exec(&s, "INCR v"), format!(":{after}\r\n"));
        assert_eq!(exec(&s, "GET v"), bulk(after));
    }
}

#[test]
fn mget_and_mset() {
    let s = store();
    assert_eq!(exec(&s, "MSET a 1 b 2 a 3"), OK);
    assert_eq!(exec(&s, "MGET a x b a"), "*4\r\n$1\r\n3\r\n$-1\r\n$1\r\n2\r\n$1\r\n3\r\n");
    assert_eq!(exec(&s, "mget x"), "*1\r\n$-1\r\n");
    assert_eq!(exec(&s, "DBSIZE"), ":2\r\n");
}

#[test]
fn append_and_strlen() {
    let s = store();
    assert_eq!(exec(&s, "STRLEN k"), ":0\r\n");
    assert_eq!(exec(&s, "APPEND k hello"), ":5\r\n");
    assert_eq!(exec(&s, "APPEND k _world"), ":11\r\n");
    assert_eq!(exec(&s, "STRLEN k"), ":11\r\n");
    assert_eq!(exec(&s, "GET k"), bulk("hello_world"));
    let big = vec![b'x'; VALUE_MAX - 11];
    assert_eq!(exec_bytes(&s, &[b"APPEND", b"k", &big]), format!(":{VALUE_MAX}\r\n"));
    let too_large = format!("-ERR string exceeds maximum allowed size ({VALUE_MAX} bytes)\r\n");
    assert_eq!(exec(&s, "APPEND k !"), too_large);
    assert_eq!(exec(&s, "STRLEN k"), format!(":{VALUE_MAX}\r\n"));
}

#[test]
fn dbsize_and_flushdb() {
    let s = KvService::new(5, Cost::Light);
    assert_eq!(exec(&s, "DBSIZE"), ":5\r\n");
    assert_eq!(exec(&s, "GET 3"), bulk("\x03\0\0\0\0\0\0\0"));
    assert_eq!(exec(&s, "FLUSHDB"), OK);
    assert_eq!(exec(&s, "dbsize"), ":0\r\n");
    assert_eq!(exec(&s, "SET a 1"), OK);
    assert_eq!(exec(&s, "FLUSHDB async"), OK);
    assert_eq!(exec(&s, "SET a 1"), OK);
    assert_eq!(exec(&s, "FLUSHDB SYNC"), OK);
    assert_eq!(exec(&s, "DBSIZE"), ":0\r\n");
    assert_eq!(exec(&s, "FLUSHDB now"), SYNTAX);
    assert_eq!(exec(&s, "FLUSHDB async sync"), SYNTAX);
}

#[test]
fn arity_errors_name_the_command() {
    let s = store();
    for (line, name) in [
        ("GET", "get"),
        ("GET a b", "get"),
        ("SET k", "set"),
        ("GETSET k", "getset"),
        ("GETSET k v w", "getset"),
        ("DEL", "del"),
        ("EXISTS", "exists"),
        ("INCR", "incr"),
        ("INCR a b", "incr"),
        ("DECR", "decr"),
        ("INCRBY k", "incrby"),
        ("DECRBY k 1 2", "decrby"),
        ("MGET", "mget"),
        ("MSET k", "mset"),
        ("MSET k v k2", "mset"),
        ("APPEND k", "append"),
        ("STRLEN", "strlen"),
        ("STRLEN a b", "strlen"),
        ("DBSIZE x", "dbsize"),
    ] {
        assert_eq!(exec(&s, line), arity(name), "{line}");
    }
}

#[test]
fn unknown_commands_and_connection_commands_are_not_this_tables() {
    let s = store();
    assert_eq!(exec(&s, "FOO a b"), "-ERR unknown command 'FOO', with args beginning with: 'a' 'b' \r\n");
    for name in ["PING", "HELLO", "XADD", "EVAL", "BZPOPMIN", "WAIT"] {
        assert!(exec(&s, name).starts_with(&format!("-ERR unknown command '{name}'")), "{name}");
    }
}

#[test]
fn oversized_keys_values_and_key_lists_are_refused() {
    let s = store();
    let long_key = vec![b'k'; KEY_MAX + 1];
    let key_error = format!("-ERR key exceeds maximum allowed size ({KEY_MAX} bytes)\r\n");
    assert_eq!(exec_bytes(&s, &[b"GET", &long_key]), key_error);
    assert_eq!(exec_bytes(&s, &[b"MSET", b"a", b"1", &long_key, b"2"]), key_error);
    assert_eq!(exec_bytes(&s, &[b"DEL", b"a", &long_key]), key_error);
    assert_eq!(exec_bytes(&s, &[b"SET", &vec![b'k'; KEY_MAX], b"v"]), OK);
    let long_value = vec![b'v'; VALUE_MAX + 1];
    let value_error = format!("-ERR string exceeds maximum allowed size ({VALUE_MAX} bytes)\r\n");
    assert_eq!(exec_bytes(&s, &[b"SET", b"k", &long_value]), value_error);
    assert_eq!(exec_bytes(&s, &[b"APPEND", b"k", &long_value]), value_error);
    assert_eq!(exec_bytes(&s, &[b"GETSET", b"k", &long_value]), value_error);
    let mut many: Vec<&[u8]> = vec![b"MGET"];
    many.extend(std::iter::repeat(&b"a"[..]).take(OP_KEYS_MAX + 1));
    assert_eq!(exec_bytes(&s, &many), format!("-ERR psmr takes at most {OP_KEYS_MAX} keys per command, got 4097\r\n"));
    assert_eq!(s.len(), 1);
}

#[test]
fn paper_operations_reply_with_integers() {
    let put = KvOp::Put { key: b"k".to_vec(), value: vec![] };
    assert_eq!(KvRedis.reply(&put, KvReply::Done(true)), Reply::integer(1));
    assert_eq!(KvRedis.reply(&put, KvReply::Done(false)), Reply::integer(0));
}

/// Two keys in different shards of 2.
fn keys_in_two_shards() -> (String, String) {
    let of = |want| {
        (0..).map(|n| String::from_utf8(key_bytes(n)).unwrap()).find(|k| shard_of(key_hash(k.as_bytes()), 2) == want)
    };
    (of(0).unwrap(), of(1).unwrap())
}

#[test]
fn the_sharded_model_refuses_crossslot_and_whole_store_commands() {
    let (a, b) = keys_in_two_shards();
    let app = KvApp::new(&ServiceConfig { model: "sharded".into(), shards: 2, ..ServiceConfig::default() }).unwrap();
    for line in
        [format!("MGET {a} {b}"), format!("MSET {a} 1 {b} 2"), format!("DEL {b} {a}"), format!("EXISTS {a} {a} {b}")]
    {
        let op = parse(&line);
        assert_eq!(access(KvModel::Sharded, 2, &op), Err(AccessError::CrossSlot), "{line}");
        let e = app.access(&op).unwrap_err().to_string();
        assert!(e.contains("CROSSSLOT Keys in request don't hash to the same slot"), "{line}: {e}");
    }
    for line in [format!("MGET {a} {a}"), format!("MSET {b} 1 {b} 2"), format!("DEL {a}"), format!("EXISTS {b} {b}")] {
        assert!(app.access(&parse(&line)).is_ok(), "{line}");
    }
    for line in ["DBSIZE", "FLUSHDB", "FLUSHDB ASYNC"] {
        let e = app.access(&parse(line)).unwrap_err().to_string();
        assert!(e.contains("touches every shard") && e.contains("readers-writers model"), "{line}: {e}");
    }
}

#[test]
fn dbsize_and_flushdb_conflict_with_everything() {
    let lines = [
        "GET a",
        "SET a 1",
        "SET b 1 NX GET",
        "GETSET a 1",
        "DEL a b",
        "EXISTS c",
        "INCR a",
        "DECRBY b 2",
        "MGET a b c",
        "MSET a 1 c 2",
        "APPEND c x",
        "STRLEN z",
        "DBSIZE",
        "FLUSHDB",
    ];
    let rw = |line: &str| command(KvModel::ReadersWriters, 1, ClientId(1), 1, parse(line)).unwrap();
    for whole in ["DBSIZE", "FLUSHDB"] {
        let w = rw(whole);
        assert_eq!((w.reads.len(), w.writes.to_vec(), w.class.index()), (0, vec![ALL], 1));
        for line in lines {
            assert!(w.conflicts_with(&rw(line)) && rw(line).conflicts_with(&w), "{whole} vs {line}");
        }
    }
    // Without them, commands on other keys stay apart, reads together.
    assert!(!rw("SET a 1").conflicts_with(&rw("GET b")));
    assert!(!rw("GET a").conflicts_with(&rw("MGET a b")));
    assert!(rw("MGET a b").conflicts_with(&rw("INCR b")));
    assert!(rw("EXISTS c").conflicts_with(&rw("APPEND c x")));
}

fn int(n: i64) -> String {
    format!(":{n}\r\n")
}

#[test]
fn keys_expire_at_their_deadline_on_the_logs_clock() {
    let s = store();
    let t = 1_000_000;
    assert_eq!(exec_at(&s, t, "SET k v EX 10"), OK);
    assert_eq!(exec_at(&s, t, "TTL k"), int(10));
    assert_eq!(exec_at(&s, t + 4_400, "TTL k"), int(6), "rounded to the nearest second");
    assert_eq!(exec_at(&s, t + 4_400, "PTTL k"), int(5_600));
    assert_eq!(exec_at(&s, t, "EXPIRETIME k"), int(1_010));
    assert_eq!(exec_at(&s, t, "PEXPIRETIME k"), int(1_010_000));
    assert_eq!(exec_at(&s, t + 10_000, "GET k"), bulk("v"), "alive at its deadline");
    assert_eq!(exec_at(&s, t + 10_001, "GET k"), NIL, "gone past it");
    assert_eq!(exec_at(&s, t + 10_001, "EXISTS k"), int(0));
    assert_eq!(exec_at(&s, t + 10_001, "TTL k"), int(-2));
    assert_eq!(s.len(), 1, "a read leaves the expired key for a write to reclaim");
    assert_eq!(exec_at(&s, t + 10_001, "APPEND k w"), int(1), "a write sees it gone");
    assert_eq!(exec_at(&s, t + 10_001, "TTL k"), int(-1));
    assert_eq!(exec_at(&s, t, "SET p v PX 1500"), OK);
    assert_eq!(exec_at(&s, t, "PTTL p"), int(1_500));
    assert_eq!(exec_at(&s, t, "SET a v EXAT 2000"), OK);
    assert_eq!(exec_at(&s, t, "TTL a"), int(1_000));
    assert_eq!(exec_at(&s, t, "SET b v PXAT 1000500"), OK);
    assert_eq!(exec_at(&s, t, "PTTL b"), int(500));
    assert_eq!(exec_at(&s, t, "SET b w EXAT 1"), OK, "a deadline in the past sets a key already gone");
    assert_eq!(exec_at(&s, t, "GET b"), NIL);
}

#[test]
fn writes_keep_or_clear_deadlines_as_redis_does() {
    let s = store();
    let t = 5_000;
    assert_eq!(exec_at(&s, t, "SET n 1 EX 100"), OK);
    assert_eq!(exec_at(&s, t, "INCR n"), int(2));
    assert_eq!(exec_at(&s, t, "APPEND n 0"), int(2));
    assert_eq!(exec_at(&s, t, "SETRANGE n 0 3"), int(2));
    assert_eq!(exec_at(&s, t, "INCRBYFLOAT n 1.5"), bulk("31.5"));
    assert_eq!(exec_at(&s, t, "TTL n"), int(100), "changes keep the deadline");
    assert_eq!(exec_at(&s, t, "SET n 1 KEEPTTL"), OK);
    assert_eq!(exec_at(&s, t, "TTL n"), int(100));
    assert_eq!(exec_at(&s, t, "SET n 1"), OK);
    assert_eq!(exec_at(&s, t, "TTL n"), int(-1), "SET replaces the deadline too");
    assert_eq!(exec_at(&s, t, "SETEX n 100 x"), OK);
    assert_eq!(exec_at(&s, t, "GETSET n y"), bulk("x"));
    assert_eq!(exec_at(&s, t, "TTL n"), int(-1));
    assert_eq!(exec_at(&s, t, "PSETEX n 2500 x"), OK);
    assert_eq!(exec_at(&s, t, "MSET n z"), OK);
    assert_eq!(exec_at(&s, t, "TTL n"), int(-1));
    assert_eq!(exec_at(&s, t, "RPUSH l a"), int(1));
    assert_eq!(exec_at(&s, t, "EXPIRE l 50"), int(1));
    assert_eq!(exec_at(&s, t, "RPUSH l b"), int(2));
    assert_eq!(exec_at(&s, t, "TTL l"), int(50));
    assert_eq!(exec_at(&s, t, "RENAME l m"), OK);
    assert_eq!(exec_at(&s, t, "TTL m"), int(50), "a deadline moves with its key");
    assert_eq!(exec_at(&s, t, "COPY m c"), int(1));
    assert_eq!(exec_at(&s, t, "TTL c"), int(50));
    assert_eq!(exec_at(&s, t, "PERSIST c"), int(1));
    assert_eq!(exec_at(&s, t, "PERSIST c"), int(0));
    assert_eq!(exec_at(&s, t, "TTL c"), int(-1));
    assert_eq!(exec_at(&s, t, "TTL m"), int(50), "a copy's deadline is its own");
}

#[test]
fn expire_options_and_deadlines_in_the_past() {
    let s = store();
    let t = 10_000;
    assert_eq!(exec_at(&s, t, "EXPIRE k 10"), int(0), "no key");
    assert_eq!(exec_at(&s, t, "SET k v"), OK);
    assert_eq!(exec_at(&s, t, "EXPIRE k 10 XX"), int(0));
    assert_eq!(exec_at(&s, t, "EXPIRE k 10 GT"), int(0), "no deadline is an infinite one");
    assert_eq!(exec_at(&s, t, "EXPIRE k 10 XX LT"), int(0));
    assert_eq!(exec_at(&s, t, "EXPIRE k 10 LT"), int(1));
    assert_eq!(exec_at(&s, t, "EXPIRE k 20 NX"), int(0));
    assert_eq!(exec_at(&s, t, "EXPIRE k 20 GT"), int(1));
    assert_eq!(exec_at(&s, t, "EXPIRE k 15 GT"), int(0));
    assert_eq!(exec_at(&s, t, "PEXPIRE k 15000 XX LT"), int(1));
    assert_eq!(exec_at(&s, t, "PTTL k"), int(15_000));
    assert_eq!(exec_at(&s, t, "EXPIREAT k 30"), int(1));
    assert_eq!(exec_at(&s, t, "TTL k"), int(20));
    assert_eq!(exec_at(&s, t, "PEXPIREAT k 40000"), int(1));
    assert_eq!(exec_at(&s, t, "TTL k"), int(30));
    assert_eq!(
        exec_at(&s, t, "EXPIRE k 10 NX XX"),
        "-ERR NX and XX, GT or LT options at the same time are not compatible\r\n"
    );
    assert_eq!(exec_at(&s, t, "EXPIRE k 10 GT LT"), "-ERR GT and LT options at the same time are not compatible\r\n");
    assert_eq!(exec_at(&s, t, "EXPIRE k 10 FOO"), "-ERR Unsupported option FOO\r\n");
    assert_eq!(exec_at(&s, t, "EXPIRE k ten"), NOT_INTEGER);
    assert_eq!(exec_at(&s, t, "EXPIRE k 9223372036854776"), "-ERR invalid expire time in 'expire' command\r\n");
    assert_eq!(exec_at(&s, t, "PEXPIRE k 9223372036854775807"), "-ERR invalid expire time in 'pexpire' command\r\n");
    assert_eq!(exec_at(&s, t, "EXPIRE k -1"), int(1), "a deadline in the past removes the key");
    assert_eq!(exec_at(&s, t, "EXISTS k"), int(0));
    assert!(s.is_empty());
}

#[test]
fn getex_getdel_getrange_setrange_incrbyfloat_msetnx() {
    let s = store();
    let t = 1_000;
    assert_eq!(exec_at(&s, t, "GETEX k"), NIL);
    assert_eq!(exec_at(&s, t, "SET k v"), OK);
    assert_eq!(exec_at(&s, t, "GETEX k EX 5"), bulk("v"));
    assert_eq!(exec_at(&s, t, "TTL k"), int(5));
    assert_eq!(exec_at(&s, t, "GETEX k"), bulk("v"));
    assert_eq!(exec_at(&s, t, "TTL k"), int(5));
    assert_eq!(exec_at(&s, t, "GETEX k PERSIST"), bulk("v"));
    assert_eq!(exec_at(&s, t, "TTL k"), int(-1));
    assert_eq!(exec_at(&s, t, "GETEX k PXAT 500"), bulk("v"), "read, then gone");
    assert_eq!(exec_at(&s, t, "GET k"), NIL);
    assert_eq!(exec_at(&s, t, "RPUSH l a"), int(1));
    assert_eq!(exec_at(&s, t, "GETEX l"), WRONGTYPE);
    assert_eq!(exec_at(&s, t, "GETDEL l"), WRONGTYPE);
    assert_eq!(exec_at(&s, t, "SET g hello"), OK);
    assert_eq!(exec_at(&s, t, "GETDEL g"), bulk("hello"));
    assert_eq!(exec_at(&s, t, "GETDEL g"), NIL);
    assert_eq!(exec_at(&s, t, "SET r This_is_a_string"), OK);
    for (range, want) in [("0 3", "This"), ("-3 -1", "ing"), ("0 -1", "This_is_a_string"), ("10 100", "string")] {
        assert_eq!(exec_at(&s, t, &format!("GETRANGE r {range}")), bulk(want), "{range}");
    }
    for range in ["5 3", "100 200", "-1 -5"] {
        assert_eq!(exec_at(&s, t, &format!("GETRANGE r {range}")), "$0\r\n\r\n", "{range}");
    }
    assert_eq!(exec_at(&s, t, "GETRANGE none 0 -1"), "$0\r\n\r\n");
    assert_eq!(exec_at(&s, t, "SET w Hello_World"), OK);
    assert_eq!(exec_at(&s, t, "SETRANGE w 6 Redis"), int(11));
    assert_eq!(exec_at(&s, t, "GET w"), bulk("Hello_Redis"));
    assert_eq!(exec_at(&s, t, "SETRANGE pad 3 x"), int(4));
    assert_eq!(exec_at(&s, t, "GET pad"), "$4\r\n\0\0\0x\r\n");
    assert_eq!(exec_at(&s, t, "SETRANGE empty 3 "), int(0), "an empty value makes no key");
    assert_eq!(exec_at(&s, t, "EXISTS empty"), int(0));
    assert_eq!(exec_at(&s, t, "SETRANGE w -1 x"), "-ERR offset is out of range\r\n");
    assert_eq!(exec_at(&s, t, "SETRANGE l 0 x"), WRONGTYPE);
    assert_eq!(exec_at(&s, t, "SET f 10.50"), OK);
    assert_eq!(exec_at(&s, t, "INCRBYFLOAT f 0.1"), bulk("10.6"));
    assert_eq!(exec_at(&s, t, "INCRBYFLOAT f -5"), bulk("5.6"));
    assert_eq!(exec_at(&s, t, "SET e 5.0e3"), OK);
    assert_eq!(exec_at(&s, t, "INCRBYFLOAT e 2.0e2"), bulk("5200"));
    assert_eq!(exec_at(&s, t, "INCRBYFLOAT w 1"), "-ERR value is not a valid float\r\n");
    assert_eq!(exec_at(&s, t, "INCRBYFLOAT f x"), "-ERR value is not a valid float\r\n");
    assert_eq!(exec_at(&s, t, "INCRBYFLOAT f inf"), "-ERR increment would produce NaN or Infinity\r\n");
    assert_eq!(exec_at(&s, t, "MSETNX m1 a m2 b"), int(1));
    assert_eq!(exec_at(&s, t, "MSETNX m2 c m3 d"), int(0));
    assert_eq!(exec_at(&s, t, "MGET m1 m2 m3"), "*3\r\n$1\r\na\r\n$1\r\nb\r\n$-1\r\n");
    assert_eq!(exec_at(&s, t, "MSETNX m1"), "-ERR wrong number of arguments for 'msetnx' command\r\n");
    assert_eq!(exec_at(&s, t, "SETNX m1 z"), int(0));
    assert_eq!(exec_at(&s, t, "SETNX m9 z"), int(1));
}

#[test]
fn rename_copy_keys_randomkey_and_encodings() {
    let s = store();
    let t = 1_000;
    assert_eq!(exec_at(&s, t, "RENAME a b"), "-ERR no such key\r\n");
    assert_eq!(exec_at(&s, t, "MSET a 1 b 2 user:1 x user:2 y"), OK);
    assert_eq!(exec_at(&s, t, "RENAMENX a b"), int(0));
    assert_eq!(exec_at(&s, t, "RENAME a a"), OK);
    assert_eq!(exec_at(&s, t, "RENAMENX a a"), int(0));
    assert_eq!(exec_at(&s, t, "RENAME a b"), OK);
    assert_eq!(exec_at(&s, t, "MGET a b"), "*2\r\n$-1\r\n$1\r\n1\r\n");
    assert_eq!(exec_at(&s, t, "RENAMENX b c"), int(1));
    assert_eq!(exec_at(&s, t, "COPY c c"), "-ERR source and destination objects are the same\r\n");
    assert_eq!(exec_at(&s, t, "COPY c user:1"), int(0));
    assert_eq!(exec_at(&s, t, "COPY c user:1 REPLACE"), int(1));
    assert_eq!(exec_at(&s, t, "GET user:1"), bulk("1"));
    assert_eq!(exec_at(&s, t, "COPY none d"), int(0));
    assert_eq!(exec_at(&s, t, "COPY c d DB 1"), "-ERR psmr has one database, 0\r\n");
    assert_eq!(exec_at(&s, t, "KEYS user:*"), "*2\r\n$6\r\nuser:1\r\n$6\r\nuser:2\r\n");
    assert_eq!(exec_at(&s, t, "KEYS *"), "*3\r\n$1\r\nc\r\n$6\r\nuser:1\r\n$6\r\nuser:2\r\n");
    assert_eq!(exec_at(&s, t, "EXPIRE c 1"), int(1));
    assert_eq!(exec_at(&s, t + 1_001, "KEYS ?"), "*0\r\n", "expired keys are not listed");
    let drawn = exec_at(&s, t, "RANDOMKEY");
    assert!(["c", "user:1", "user:2"].iter().any(|k| drawn == bulk(k)), "{drawn}");
    assert_eq!(exec_at(&s, t, "RANDOMKEY"), drawn, "the same seed draws the same key");
    assert_eq!(exec_at(&s, t, "OBJECT ENCODING user:1"), bulk("int"));
    assert_eq!(exec_at(&s, t, "OBJECT ENCODING user:2"), bulk("embstr"));
    assert_eq!(exec_at(&s, t, "OBJECT ENCODING none"), NIL);
    assert_eq!(exec_at(&s, t, "SADD s 1 2 3"), int(3));
    assert_eq!(exec_at(&s, t, "OBJECT ENCODING s"), bulk("intset"));
    assert_eq!(exec_at(&s, t, "HSET h f v"), int(1));
    assert_eq!(exec_at(&s, t, "OBJECT ENCODING h"), bulk("listpack"));
    assert_eq!(exec_at(&s, t, "OBJECT FREQ h"), "-ERR unknown subcommand 'FREQ'. Try OBJECT HELP.\r\n");
    assert_eq!(exec_at(&s, t, "FLUSHALL"), OK);
    assert_eq!(exec_at(&s, t, "RANDOMKEY"), NIL);
    assert_eq!(exec_at(&s, t, "DBSIZE"), int(0));
}

/// Every key a full `SCAN` returns, and the number of calls it took.
fn scan_all(s: &KvService, options: &str) -> (Vec<String>, usize) {
    let (mut cursor, mut keys, mut calls) = ("0".to_string(), Vec::new(), 0);
    loop {
        let words: Vec<Bytes> = format!("SCAN {cursor} {options}")
            .split_whitespace()
            .map(|w| Bytes::copy_from_slice(w.as_bytes()))
            .collect();
        let op = KvRedis.operation(&words).unwrap();
        let c = command(KvModel::ReadersWriters, 1, ClientId(1), 1, op).unwrap();
        let KvReply::Values(vs) = s.execute(&c) else { panic!("a scan") };
        calls += 1;
        cursor = String::from_utf8(vs[0].clone().unwrap()).unwrap();
        keys.extend(vs[1..].iter().map(|k| String::from_utf8(k.clone().unwrap()).unwrap()));
        if cursor == "0" {
            return (keys, calls);
        }
    }
}

#[test]
fn scan_returns_every_key_once_and_its_cursor_does_not_depend_on_the_layout() {
    // One store grew past the size at which its stripes split and shrank
    // back; the other never grew: their layouts differ, their scans not.
    let grown = store();
    for i in 0..100_000 {
        exec(&grown, &format!("SET big{i} v"));
    }
    exec(&grown, "FLUSHDB");
    let fresh = store();
    for s in [&grown, &fresh] {
        for i in 0..500 {
            exec(s, &format!("SET k{i} v"));
        }
        exec(s, "RPUSH list a");
    }
    // FLUSHDB replaces the stripes: grow one again and delete.
    for i in 0..70_000 {
        exec(&grown, &format!("SET big{i} v"));
    }
    for i in 0..70_000 {
        exec(&grown, &format!("DEL big{i}"));
    }
    let (a, calls) = scan_all(&grown, "COUNT 7");
    let (b, _) = scan_all(&fresh, "COUNT 7");
    assert_eq!(a, b, "the same keys give the same scan");
    let mut sorted = a.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!((sorted.len(), a.len()), (501, 501), "every key once");
    assert!(calls > 50, "a small COUNT takes many calls: {calls}");
    let (matched, _) = scan_all(&fresh, "MATCH k1* COUNT 1000");
    assert_eq!(matched.len(), 111, "k1, k10..k19, k100..k199");
    let (lists, _) = scan_all(&fresh, "TYPE list");
    assert_eq!(lists, vec!["list".to_string()]);
    assert_eq!(exec(&fresh, "SCAN x"), "-ERR invalid cursor\r\n");
    assert_eq!(exec(&fresh, "SCAN 0 COUNT 0"), SYNTAX);
    assert_eq!(exec(&fresh, "SCAN 0 MATCH"), SYNTAX);
}

#[test]
fn spop_and_srandmember_draw_from_the_commands_seed() {
    let s = store();
    let t = 1_000;
    assert_eq!(exec_at(&s, t, "SPOP none"), NIL);
    assert_eq!(exec_at(&s, t, "SPOP none 3"), "*0\r\n");
    assert_eq!(exec_at(&s, t, "SRANDMEMBER none"), NIL);
    assert_eq!(exec_at(&s, t, "SRANDMEMBER none 3"), "*0\r\n");
    assert_eq!(exec_at(&s, t, "SADD s a b c d e"), int(5));
    let one = exec_at(&s, t, "SRANDMEMBER s");
    assert_eq!(exec_at(&s, t, "SRANDMEMBER s"), one, "same seed, same draw");
    assert!(exec_at(&s, t, "SRANDMEMBER s 3").starts_with("*3\r\n"));
    assert!(exec_at(&s, t, "SRANDMEMBER s 10").starts_with("*5\r\n"));
    assert!(exec_at(&s, t, "SRANDMEMBER s -8").starts_with("*8\r\n"));
    assert_eq!(exec_at(&s, t, "SRANDMEMBER s 0"), "*0\r\n");
    assert_eq!(exec_at(&s, t, "SPOP s -1"), "-ERR value is out of range, must be positive\r\n");
    let popped = exec_at(&s, t, "SPOP s 2");
    assert!(popped.starts_with("*2\r\n"), "{popped}");
    assert_eq!(exec_at(&s, t, "SCARD s"), int(3));
    assert!(exec_at(&s, t, "SPOP s").starts_with("$1\r\n"));
    assert!(exec_at(&s, t, "SPOP s 5").starts_with("*2\r\n"));
    assert_eq!(exec_at(&s, t, "EXISTS s"), int(0), "the set goes with its last member");
    assert_eq!(exec_at(&s, t, "SET str x"), OK);
    assert_eq!(exec_at(&s, t, "SPOP str"), WRONGTYPE);
    assert_eq!(exec_at(&s, t, "SRANDMEMBER str"), WRONGTYPE);
}

#[test]
fn sorted_sets_add_score_count_and_rank_as_redis_7_0() {
    let s = store();
    assert_eq!(exec(&s, "ZADD z 1 a 2 b 3 c"), int(3));
    assert_eq!(exec(&s, "ZADD z 1 a 5 b"), int(0), "b changed, nothing added");
    assert_eq!(exec(&s, "ZADD z CH 1 a 6 b 0.1 d"), int(2));
    assert_eq!(exec(&s, "ZSCORE z d"), bulk("0.10000000000000001"));
    assert_eq!(exec(&s, "ZSCORE z none"), NIL);
    assert_eq!(exec(&s, "ZMSCORE z a none b"), "*3\r\n$1\r\n1\r\n$-1\r\n$1\r\n6\r\n");
    assert_eq!(exec(&s, "ZCARD z"), int(4));
    assert_eq!(exec(&s, "ZADD z NX 9 a 4 e"), int(1));
    assert_eq!(exec(&s, "ZADD z XX 9 f 2 a"), int(0));
    assert_eq!(exec(&s, "ZSCORE z a"), bulk("2"));
    assert_eq!(exec(&s, "ZADD z GT CH 1 a 3 a"), int(1), "GT: only up");
    assert_eq!(exec(&s, "ZADD z LT CH 5 a"), int(0));
    assert_eq!(exec(&s, "ZADD z INCR 2.5 a"), bulk("5.5"));
    assert_eq!(exec(&s, "ZADD z NX INCR 1 a"), NIL);
    assert_eq!(exec(&s, "ZINCRBY z -0.5 a"), bulk("5"));
    assert_eq!(exec(&s, "ZINCRBY z 1 new"), bulk("1"));
    assert_eq!(exec(&s, "ZADD z INCR +inf x"), bulk("inf"));
    assert_eq!(exec(&s, "ZINCRBY z -inf x"), "-ERR resulting score is not a number (NaN)\r\n");
    assert_eq!(exec(&s, "ZADD z NX XX 1 a"), "-ERR XX and NX options at the same time are not compatible\r\n");
    assert_eq!(exec(&s, "ZADD z GT LT 1 a"), "-ERR GT, LT, and/or NX options at the same time are not compatible\r\n");
    assert_eq!(exec(&s, "ZADD z INCR 1 a 2 b"), "-ERR INCR option supports a single increment-element pair\r\n");
    assert_eq!(exec(&s, "ZADD z 1 a 2"), SYNTAX);
    assert_eq!(exec(&s, "ZADD z nan a"), "-ERR value is not a valid float\r\n");
    assert_eq!(exec(&s, "ZADD z one a"), "-ERR value is not a valid float\r\n");
    // z: d 0.1, new 1, c 3, e 4, a 5, b 6, x inf
    assert_eq!(exec(&s, "ZRANK z c"), int(2));
    assert_eq!(exec(&s, "ZREVRANK z c"), int(4));
    assert_eq!(exec(&s, "ZRANK z none"), NIL);
    assert_eq!(exec(&s, "ZCOUNT z 1 5"), int(4));
    assert_eq!(exec(&s, "ZCOUNT z (1 (5"), int(2));
    assert_eq!(exec(&s, "ZCOUNT z -inf +inf"), int(7));
    assert_eq!(exec(&s, "ZCOUNT z 5 1"), int(0));
    assert_eq!(exec(&s, "ZCOUNT z x 1"), "-ERR min or max is not a float\r\n");
    assert_eq!(exec(&s, "ZREM z a none b"), int(2));
    assert_eq!(exec(&s, "SET str v"), OK);
    assert_eq!(exec(&s, "ZADD str 1 a"), WRONGTYPE);
    assert_eq!(exec(&s, "ZSCORE str a"), WRONGTYPE);
    assert_eq!(exec(&s, "TYPE z"), "+zset\r\n");
    assert_eq!(exec(&s, "OBJECT ENCODING z"), bulk("listpack"));
}

/// A list reply of `items` in RESP2.
fn list(items: &[&str]) -> String {
    let mut out = format!("*{}\r\n", items.len());
    for i in items {
        out.push_str(&bulk(i));
    }
    out
}

#[test]
fn sorted_set_ranges_by_rank_score_and_member() {
    let s = store();
    assert_eq!(exec(&s, "ZADD z 1 a 2 b 3 c 4 d 5 e"), int(5));
    assert_eq!(exec(&s, "ZRANGE z 0 -1"), list(&["a", "b", "c", "d", "e"]));
    assert_eq!(exec(&s, "ZRANGE z 1 2 WITHSCORES"), list(&["b", "2", "c", "3"]));
    assert_eq!(exec(&s, "ZRANGE z 0 1 REV"), list(&["e", "d"]));
    assert_eq!(exec(&s, "ZREVRANGE z 0 1 WITHSCORES"), list(&["e", "5", "d", "4"]));
    assert_eq!(exec(&s, "ZRANGE z 5 10"), "*0\r\n");
    assert_eq!(exec(&s, "ZRANGE z (1 3 BYSCORE"), list(&["b", "c"]));
    assert_eq!(exec(&s, "ZRANGE z 3 (1 BYSCORE REV"), list(&["c", "b"]));
    assert_eq!(exec(&s, "ZRANGE z -inf +inf BYSCORE LIMIT 1 2"), list(&["b", "c"]));
    assert_eq!(exec(&s, "ZRANGE z -inf +inf BYSCORE LIMIT 3 -1"), list(&["d", "e"]));
    assert_eq!(exec(&s, "ZRANGE z -inf +inf BYSCORE LIMIT -1 2"), "*0\r\n");
    assert_eq!(exec(&s, "ZRANGEBYSCORE z 2 4 WITHSCORES LIMIT 0 1"), list(&["b", "2"]));
    assert_eq!(exec(&s, "ZREVRANGEBYSCORE z 4 2"), list(&["d", "c", "b"]));
    assert_eq!(
        exec(&s, "ZRANGE z 0 1 LIMIT 0 1"),
        "-ERR syntax error, LIMIT is only supported in combination with either BYSCORE or BYLEX\r\n"
    );
    assert_eq!(
        exec(&s, "ZRANGE z - + BYLEX WITHSCORES"),
        "-ERR syntax error, WITHSCORES not supported in combination with BYLEX\r\n"
    );
    assert_eq!(exec(&s, "ZRANGEBYSCORE z 1 2 REV"), SYNTAX);
    assert_eq!(exec(&s, "ZRANGE z 0 1 BYSCORE BYLEX"), SYNTAX);
    assert_eq!(exec(&s, "ZRANGE z a 1"), NOT_INTEGER);
    // One score: ranges by member.
    assert_eq!(exec(&s, "ZADD l 0 a 0 b 0 c 0 d"), int(4));
    assert_eq!(exec(&s, "ZRANGE l [b (d BYLEX"), list(&["b", "c"]));
    assert_eq!(exec(&s, "ZRANGE l (c - BYLEX REV"), list(&["b", "a"]));
    assert_eq!(exec(&s, "ZRANGEBYLEX l - + LIMIT 1 2"), list(&["b", "c"]));
    assert_eq!(exec(&s, "ZREVRANGEBYLEX l + [c"), list(&["d", "c"]));
    assert_eq!(exec(&s, "ZLEXCOUNT l - +"), int(4));
    assert_eq!(exec(&s, "ZLEXCOUNT l a +"), "-ERR min or max not valid string range item\r\n");
    // Pops and removal by range.
    assert_eq!(exec(&s, "ZPOPMIN z"), list(&["a", "1"]));
    assert_eq!(exec(&s, "ZPOPMAX z 2"), list(&["e", "5", "d", "4"]));
    assert_eq!(exec(&s, "ZPOPMIN none"), "*0\r\n");
    assert_eq!(exec(&s, "ZPOPMIN z -1"), "-ERR value is out of range, must be positive\r\n");
    assert_eq!(exec(&s, "ZREMRANGEBYSCORE l -inf +inf"), int(4));
    assert_eq!(exec(&s, "EXISTS l"), int(0), "a sorted set goes with its last member");
    assert_eq!(exec(&s, "ZADD r 1 a 2 b 3 c 4 d"), int(4));
    assert_eq!(exec(&s, "ZREMRANGEBYRANK r 0 1"), int(2));
    assert_eq!(exec(&s, "ZREMRANGEBYLEX r [c [c"), int(1));
    assert_eq!(exec(&s, "ZRANGE r 0 -1 WITHSCORES"), list(&["d", "4"]));
}

#[test]
fn sorted_set_scores_are_floats_in_resp3() {
    let s = store();
    let resp3 = |line: &str| {
        let words: Vec<Bytes> = line.split(' ').map(|w| Bytes::copy_from_slice(w.as_bytes())).collect();
        let op = KvRedis.operation(&words).unwrap();
        let c = command(KvModel::ReadersWriters, 1, ClientId(1), 1, op.clone()).unwrap();
        String::from_utf8(KvRedis.reply(&op, s.execute(&c)).to_bytes(Version::Resp3)).unwrap()
    };
    assert_eq!(resp3("ZADD z 1.5 a 2 b"), ":2\r\n");
    assert_eq!(resp3("ZSCORE z a"), ",1.5\r\n");
    assert_eq!(resp3("ZRANGE z 0 -1 WITHSCORES"), "*2\r\n*2\r\n$1\r\na\r\n,1.5\r\n*2\r\n$1\r\nb\r\n,2\r\n");
    assert_eq!(resp3("ZPOPMIN z"), "*2\r\n$1\r\na\r\n,1.5\r\n");
    assert_eq!(resp3("ZSCORE z none"), "_\r\n");
}

#[test]
fn sweeps_name_expired_keys_only_and_reclaim_them_when_they_execute() {
    let s = store();
    for i in 0..300 {
        exec_at(&s, 1_000, &format!("SET k{i} v PX {}", if i % 3 == 0 { 1_000_000 } else { 50 }));
    }
    exec_at(&s, 1_000, "SET forever v");
    assert_eq!(s.sweep(1_000), None, "nothing is past its deadline yet");
    let (mut named, mut reclaimed) = (std::collections::BTreeSet::new(), 0);
    // The sweeps go round the key space, a bounded part at a time.
    for _ in 0..10_000 {
        let Some(op) = s.sweep(2_000) else { continue };
        let KvOp::Sweep { keys } = &op else { panic!("a sweep: {op:?}") };
        assert!(keys.len() <= 128);
        named.extend(keys.iter().cloned());
        let c = command(KvModel::ReadersWriters, 1, ClientId(0), 1, op.clone()).unwrap();
        assert!(c.writes.len() <= 128 && !c.writes.contains(&ALL), "a sweep conflicts with its keys only");
        let c = psmr_model::Command { stamp: psmr_model::Stamp { time_ms: 2_000, seed: 0 }, ..c };
        let KvReply::Int(n) = s.execute(&c) else { panic!("a count") };
        reclaimed += n;
        if s.len() == 101 {
            break;
        }
    }
    assert_eq!((named.len(), reclaimed), (200, 200));
    assert!(named.iter().all(|k| k.starts_with(b"k")));
    assert_eq!(s.len(), 101, "the live keys stay");
    assert_eq!(exec_at(&s, 2_000, "GET forever"), bulk("v"));
    // Executed again, or where a key lives on: nothing happens.
    let again = KvOp::Sweep { keys: vec![b"k0".to_vec(), b"k1".to_vec(), b"forever".to_vec()] };
    let c = command(KvModel::ReadersWriters, 1, ClientId(0), 2, again).unwrap();
    let c = psmr_model::Command { stamp: psmr_model::Stamp { time_ms: 2_000, seed: 0 }, ..c };
    assert_eq!(s.execute(&c), KvReply::Int(0));
    assert_eq!(s.len(), 101);
}

/// Reads change nothing, an expired key included: the late schedulers run
/// reads of later entries (later stamps) beside reads of earlier ones, and
/// a read that reclaimed a key would take it from under an earlier read.
#[test]
fn a_read_past_a_deadline_leaves_the_key_for_earlier_reads() {
    let s = store();
    for line in ["HSET h f v", "RPUSH l a", "SADD s m", "ZADD z 1 m", "SET k v"] {
        exec_at(&s, 1_000, line);
    }
    for key in ["h", "l", "s", "z", "k"] {
        assert_eq!(exec_at(&s, 1_000, &format!("PEXPIRE {key} 100")), int(1));
    }
    let reads = ["HGET h f", "HGETALL h", "LRANGE l 0 -1", "LLEN l", "LPOS l a", "SMEMBERS s", "ZSCORE z m", "GET k"];
    let late: Vec<String> = reads.iter().map(|r| exec_at(&s, 5_000, r)).collect();
    assert!(late.iter().all(|r| r == NIL || r == "*0\r\n" || r == ":0\r\n"), "{late:?}");
    assert_eq!(s.len(), 5, "no read reclaimed a key");
    assert_eq!(exec_at(&s, 1_050, "HGET h f"), bulk("v"));
    assert_eq!(exec_at(&s, 1_050, "LRANGE l 0 -1"), "*1\r\n$1\r\na\r\n");
    assert_eq!(exec_at(&s, 1_050, "GET k"), bulk("v"));
}
