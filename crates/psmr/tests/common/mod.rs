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
