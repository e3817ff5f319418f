//! What several test files of this crate share.

use psmr_replica::{Config, Member, Storage};
use std::net::TcpListener;

/// A valid configuration of one replica on free loopback ports, in memory,
/// without TLS, ticking every 10 ms, changed by `tune`.
pub fn one_replica_config(tune: impl FnOnce(&mut Config)) -> Config {
    let held: Vec<TcpListener> = (0..2).map(|_| TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    let replicas = vec![Member::new(1, held[0].local_addr().unwrap(), held[1].local_addr().unwrap())];
    drop(held);
    let mut c = Config { replicas, storage: Storage::Memory, insecure_peers: true, ..Config::default() };
    c.tick_ms = 10;
    tune(&mut c);
    c.validate().unwrap();
    c
}
