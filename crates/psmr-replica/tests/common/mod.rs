//! What several test files of this crate share.
// Each test file uses what it needs of this module.
#![allow(dead_code)]

use psmr_client::{Client, ClientConfig};
use psmr_model::wire::ReplicaStatus;
use psmr_replica::{Config, Member, Storage};
use std::net::{SocketAddr, TcpListener};
use std::time::{Duration, Instant};

/// A valid configuration of one replica on free loopback ports, in memory,
/// without TLS, ticking every 10 ms, changed by `tune`.
pub fn one_replica_config(tune: impl FnOnce(&mut Config)) -> Config {
    let held: Vec<TcpListener> = (0..2).map(|_| TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    let replicas = vec![Member::new(1, held[0].local_addr().unwrap(), held[1].local_addr().unwrap())];
    drop(held);
    memory_config(replicas, tune)
}

/// A valid configuration of `replicas`, in memory, without TLS or users,
/// ticking every 10 ms, changed by `tune`.
pub fn memory_config(replicas: Vec<Member>, tune: impl FnOnce(&mut Config)) -> Config {
    let mut c = Config {
        replicas,
        storage: Storage::Memory,
        insecure_peers: true,
        insecure_clients: true,
        ..Config::default()
    };
    c.tick_ms = 10;
    tune(&mut c);
    c.validate().unwrap();
    c
}

/// Polls the replicas at `addrs` until they report the same applied index
/// and digest, for at most `bound`; returns that status. `what` says, in a
/// failure, what never happened.
pub fn converged(addrs: &[SocketAddr], bound: Duration, what: &str) -> ReplicaStatus {
    let probe = Client::new(ClientConfig::new(addrs.to_vec())).unwrap();
    let deadline = Instant::now() + bound;
    loop {
        let st: Result<Vec<_>, _> = addrs.iter().map(|&a| probe.status_of(a, Duration::from_secs(2))).collect();
        if let Ok(st) = &st {
            if st.windows(2).all(|w| w[0].applied == w[1].applied && w[0].digest == w[1].digest) {
                return st[0].clone();
            }
        }
        assert!(Instant::now() < deadline, "{what}: {st:?}");
        // Paces the poll; the condition above is what is waited for.
        std::thread::sleep(Duration::from_millis(50));
    }
}
