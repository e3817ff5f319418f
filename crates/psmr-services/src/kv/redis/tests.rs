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
fn set_syntax_and_expiry_are_refused_without_executing() {
    let s = store();
    for line in ["SET k v NX XX", "SET k v XX NX", "SET k v FOO", "SET k v GET NX FOO", "SET k v NXX"] {
        assert_eq!(exec(&s, line), SYNTAX, "{line}");
    }
    for line in ["SET k v EX 10", "SET k v px 10", "SET k v EXAT 1", "SET k v PXAT 1", "SET k v KEEPTTL", "SET k v EX"]
    {
        let reply = exec(&s, line);
        assert!(reply.starts_with("-ERR psmr does not support key expiry"), "{line}: {reply}");
        assert!(reply.contains("clock every replica agrees on"), "{reply}");
    }
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
        KvOp::Set { key: b"k".to_vec(), value: b"b".to_vec(), when: SetWhen::Always, get: true }
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
    assert_eq!(exec(&s, "FOO a b"), "-ERR unknown command 'FOO', with args beginning with: 'a' 'b'\r\n");
    for name in ["PING", "HELLO", "EXPIRE", "KEYS", "SETEX", "GETDEL"] {
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
