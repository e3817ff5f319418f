//! Helpers shared by the integration tests of the `psmr` crate.

// Each test binary includes this module and uses part of it.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// Sends `request` (inline commands) to a Redis port and reads until the
/// replies hold `lines` lines (waiting at most `wait` for each read).
pub fn resp_exchange(addr: SocketAddr, request: &str, lines: usize, wait: Duration) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(wait)).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut out = String::new();
    let mut buf = [0u8; 4096];
    while out.matches("\r\n").count() < lines {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "closed after {out:?}");
        out.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    out
}

/// The installed tool `name` (`scripts/setup.sh` installs redis-tools).
pub fn tool(name: &str) -> std::path::PathBuf {
    let found =
        std::env::var_os("PATH").and_then(|p| std::env::split_paths(&p).map(|d| d.join(name)).find(|f| f.is_file()));
    found.unwrap_or_else(|| panic!("{name} is not installed: scripts/setup.sh installs redis-tools"))
}

/// A `redis-server` of its own on a free loopback port, with no
/// persistence (`scripts/setup.sh` installs it; its service is never
/// started), stopped when dropped: what psmr's Redis port is compared with.
pub struct RedisServer {
    child: std::process::Child,
    /// Where it listens.
    pub addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl RedisServer {
    /// Starts one and waits until it listens.
    pub fn start() -> Self {
        let bin = tool("redis-server");
        let dir = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = std::process::Command::new(bin)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(dir.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("redis-server starts");
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(addr).is_err() {
            assert!(std::time::Instant::now() < deadline, "redis-server did not listen on {addr}");
            // Paces the poll; its listening is what is waited for.
            std::thread::sleep(Duration::from_millis(20));
        }
        Self { child, addr, _dir: dir }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
