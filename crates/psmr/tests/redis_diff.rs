//! psmr's Redis port against Debian's `redis-server` 7.0, byte for byte:
//! every case of `tests/redis_cases.txt` goes to both in one run, and
//! every reply must be the same bytes (RESP2). `scripts/setup.sh` installs
//! `redis-server`; this test starts its own on a free loopback port, with
//! no persistence, and stops it at the end.
//!
//! The cases file: groups of commands separated by blank lines, each group
//! run on emptied stores (`FLUSHALL` on both); a command's words are
//! separated by spaces (`\s` in a word is a space, `""` the empty string).
//! A line that starts with `~` compares its reply as a set of lines (for
//! replies whose order Redis leaves to its hash tables); `#` starts a
//! comment line.

use psmr::replica::LocalCluster;
use psmr::services::kv::KvRedis;
use psmr::services::{KvApp, ServiceConfig};
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};

use std::time::Duration;

mod common;

const CASES: &str = include_str!("redis_cases.txt");

/// A connection that sends commands as RESP arrays and reads one whole
/// reply back, as bytes.
struct Conn(BufReader<TcpStream>);

impl Conn {
    fn open(addr: SocketAddr) -> std::io::Result<Self> {
        let s = TcpStream::connect(addr)?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        Ok(Self(BufReader::new(s)))
    }

    fn call(&mut self, words: &[Vec<u8>]) -> Vec<u8> {
        let mut out = format!("*{}\r\n", words.len()).into_bytes();
        for w in words {
            out.extend_from_slice(format!("${}\r\n", w.len()).as_bytes());
            out.extend_from_slice(w);
            out.extend_from_slice(b"\r\n");
        }
        self.0.get_mut().write_all(&out).unwrap();
        let mut reply = Vec::new();
        self.read_reply(&mut reply);
        reply
    }

    /// Reads one RESP2 reply into `out`.
    fn read_reply(&mut self, out: &mut Vec<u8>) {
        let start = out.len();
        self.0.read_until(b'\n', out).unwrap();
        let line = String::from_utf8_lossy(&out[start..]).trim_end().to_string();
        let n: i64 = line.get(1..).and_then(|n| n.parse().ok()).unwrap_or(-1);
        match line.as_bytes().first() {
            Some(b'$') if n >= 0 => {
                let mut body = vec![0u8; n as usize + 2];
                std::io::Read::read_exact(&mut self.0, &mut body).unwrap();
                out.extend_from_slice(&body);
            }
            Some(b'*') => (0..n.max(0)).for_each(|_| self.read_reply(out)),
            Some(_) => {}
            None => panic!("the connection closed"),
        }
    }
}

/// A command line's words.
fn words(line: &str) -> Vec<Vec<u8>> {
    line.split(' ')
        .filter(|w| !w.is_empty())
        .map(|w| if w == "\"\"" { Vec::new() } else { w.replace("\\s", " ").into_bytes() })
        .collect()
}

/// A reply's lines, sorted: for replies in an order Redis does not fix.
fn as_set(reply: &[u8]) -> Vec<String> {
    let mut lines: Vec<String> = String::from_utf8_lossy(reply).split("\r\n").map(str::to_string).collect();
    lines.sort();
    lines
}

#[test]
fn replies_are_redis_7_0s_byte_for_byte() {
    let redis = common::RedisServer::start();
    let cluster = LocalCluster::builder()
        .start_with_redis(|_| KvApp::new(&ServiceConfig::default()).expect("the default kv"), |_| KvRedis)
        .expect("a local cluster");
    let mut theirs = Conn::open(redis.addr).unwrap();
    let mut ours = Conn::open(cluster.redis_addrs()[0]).unwrap();
    let (mut compared, mut differ) = (0, Vec::new());
    for group in CASES.split("\n\n") {
        for conn in [&mut theirs, &mut ours] {
            assert_eq!(conn.call(&words("FLUSHALL")), b"+OK\r\n");
        }
        for line in group.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
            let (unordered, command) = match line.strip_prefix('~') {
                Some(rest) => (true, rest.trim()),
                None => (false, line),
            };
            let w = words(command);
            let (a, b) = (theirs.call(&w), ours.call(&w));
            compared += 1;
            let same = if unordered { as_set(&a) == as_set(&b) } else { a == b };
            if !same {
                differ.push(format!(
                    "{command}\n  redis: {:?}\n  psmr:  {:?}",
                    String::from_utf8_lossy(&a),
                    String::from_utf8_lossy(&b)
                ));
            }
        }
    }
    eprintln!("{compared} commands compared with redis-server, {} differ", differ.len());
    assert!(compared > 300, "only {compared} commands compared");
    assert!(differ.is_empty(), "{} of {compared} replies differ:\n{}", differ.len(), differ.join("\n"));
}
