//! # psmr next to its peers: etcd and Redis on the same machine
//!
//! `psmr bench --scenario peers` runs, in one invocation and on this
//! machine, the systems a user would otherwise reach for, under the same
//! load, and reports them side by side with ratios:
//!
//! * **etcd** (3 members on loopback, data in a scratch directory removed
//!   afterwards), once with fsync and once with `--unsafe-no-fsync`, driven
//!   by [`etcd`]'s closed-loop clients: each client its own keep-alive
//!   HTTP/1.1 connection to the leader's JSON gateway (`POST /v3/kv/put`),
//!   one put at a time, with the same warm-up, measured window and
//!   HdrHistogram latencies as psmr's load. Clients send to the leader, as
//!   psmr's clients do, so that neither side pays a forwarding hop.
//! * **psmr**, 3 replicas, disk and memory storage, under its own load
//!   (ordinary points of [`crate::runner`]; [`cases`] runs every case).
//! * **Redis**: one `redis-server` without persistence on loopback, and
//!   `redis-benchmark -P 50 -c 8 -t set` ([`redis`]) against psmr memory
//!   with 8 clients of 50 puts per request.
//!
//! Every put writes a 64 B value; etcd and redis keys are 16 B strings
//! (psmr's keys are the keys' decimal text, at most 8 B below 10^8 keys);
//! all draw keys uniformly from the same key space. Each server process's
//! CPU time over the measured window is read from `/proc` ([`psmr_harness::cpu`]).
//!
//! A missing program is an error before anything runs, naming what is
//! missing and `scripts/peers.sh`, which installs them.

pub mod cases;
pub mod etcd;
pub mod http;
mod process;
pub mod redis;
mod report;

pub use process::{fs_type, load_average, version_of, which, Tools};
pub use report::{compare, format_table, write, Comparison, Setup};

use crate::scenario::Params;
use psmr_harness::cpu::ReplicaCpu;
use serde::Serialize;
use std::time::Duration;
use thiserror::Error;

/// Bytes of every etcd and redis key (`000000001234`-style digits).
pub const KEY_BYTES: usize = 16;
/// Bytes of every value the scenario writes.
pub const VALUE_BYTES: usize = 64;
/// redis-benchmark's connections.
pub const REDIS_CLIENTS: usize = 8;
/// redis-benchmark's pipeline depth, and psmr's commands per request
/// against it.
pub const REDIS_PIPELINE: usize = 50;

/// What can go wrong running a peer.
#[derive(Debug, Error)]
pub enum PeersError {
    /// A program is not on `PATH`.
    #[error("not installed: {missing} (looked on PATH); run scripts/peers.sh, which installs etcd and Redis (Debian: etcd-server, redis-server, redis-tools)")]
    NotInstalled {
        /// The missing programs.
        missing: String,
    },
    /// A system call failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Why it failed.
        source: std::io::Error,
    },
    /// A server process exited.
    #[error("{what} exited ({status}); {log}")]
    Exited {
        /// Which.
        what: String,
        /// How.
        status: String,
        /// The end of its log.
        log: String,
    },
    /// A server did not become ready in time.
    #[error("{what} was not ready within {secs} s")]
    NotReady {
        /// Which.
        what: String,
        /// The time it had.
        secs: u64,
    },
    /// A peer answered something unexpected.
    #[error("{what}: {why}")]
    Peer {
        /// Which peer or program.
        what: String,
        /// What it did.
        why: String,
    },
    /// A setting the peers cannot run with.
    #[error("{0}")]
    Setting(String),
}

/// One run of the scenario.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Case {
    /// etcd, 3 members, with or without fsync.
    Etcd {
        /// Whether etcd syncs its log (without: `--unsafe-no-fsync`).
        fsync: bool,
        /// Closed-loop clients.
        clients: usize,
    },
    /// psmr, 3 replicas.
    Psmr {
        /// `disk` or `memory`.
        storage: &'static str,
        /// Closed-loop clients.
        clients: usize,
        /// Puts per request.
        per_request: usize,
    },
    /// redis-benchmark against one redis-server.
    Redis {
        /// Connections.
        clients: usize,
        /// Pipeline depth.
        pipeline: usize,
    },
}

impl Case {
    /// `etcd fsync, 8 clients` and the like.
    pub fn name(&self) -> String {
        match self {
            Case::Etcd { fsync, clients } => format!("etcd {}, {clients} clients", fsync_name(*fsync)),
            Case::Psmr { storage, clients, per_request } => {
                format!("psmr {storage}, {clients} clients x {per_request}")
            }
            Case::Redis { clients, pipeline } => format!("redis -P {pipeline}, {clients} clients"),
        }
    }
}

fn fsync_name(fsync: bool) -> &'static str {
    if fsync {
        "fsync"
    } else {
        "no fsync"
    }
}

/// The scenario's psmr parameters: 100 % puts of 64 B values, one per
/// request, sequential execution (all puts conflict under the
/// readers-writers model, and etcd applies in order too), memory storage
/// unless a case says otherwise.
pub fn base_params() -> Params {
    Params {
        scheduler: "sequential".into(),
        write_pct: 100,
        per_request: 1,
        value_bytes: Some(VALUE_BYTES),
        ..Params::default()
    }
}

/// Every case, in run order: etcd with fsync and psmr on disk, etcd
/// without fsync and psmr in memory, each for every client count; then
/// redis and psmr with pipelined requests.
pub fn plan(clients: &[usize]) -> Vec<Case> {
    let mut cases = Vec::new();
    for (fsync, storage) in [(true, "disk"), (false, "memory")] {
        cases.extend(clients.iter().map(|&c| Case::Etcd { fsync, clients: c }));
        cases.extend(clients.iter().map(|&c| Case::Psmr { storage, clients: c, per_request: 1 }));
    }
    cases.push(Case::Redis { clients: REDIS_CLIENTS, pipeline: REDIS_PIPELINE });
    cases.push(Case::Psmr { storage: "memory", clients: REDIS_CLIENTS, per_request: REDIS_PIPELINE });
    cases
}

/// The load every peer runs: the point's parameters that apply to them.
#[derive(Clone, Debug)]
pub struct PeerLoad {
    /// Closed-loop clients (etcd) or connections (redis).
    pub clients: usize,
    /// Warm-up before measuring.
    pub warmup: Duration,
    /// How long to measure.
    pub duration: Duration,
    /// Keys drawn from `0..keys`.
    pub keys: u64,
    /// Bytes of every value.
    pub value_bytes: usize,
    /// Seed of the clients' streams.
    pub seed: u64,
}

impl PeerLoad {
    /// The load of `p` with `clients` clients.
    pub fn of(p: &Params, clients: usize, seed: u64) -> Result<Self, PeersError> {
        // redis-benchmark's keys are `key:` and 12 digits: 16 bytes up to
        // 10^12 keys.
        if p.keys == 0 || p.keys > 1_000_000_000_000 {
            return Err(PeersError::Setting(format!(
                "keys must be between 1 and 10^12 (16-byte keys), got {}",
                p.keys
            )));
        }
        // psmr's `decimal` values vary in size: no peer could match them.
        let Some(value_bytes) = p.value_bytes else {
            return Err(PeersError::Setting("the peers scenario needs a value size: value_bytes=N".into()));
        };
        if !(1..=etcd::VALUE_BYTES_MAX).contains(&value_bytes) || clients == 0 {
            return Err(PeersError::Setting(format!(
                "the peers need 1 to {} value bytes and at least one client",
                etcd::VALUE_BYTES_MAX
            )));
        }
        Ok(Self {
            clients,
            warmup: Duration::from_secs_f64(p.warmup_s),
            duration: Duration::from_secs_f64(p.duration_s),
            keys: p.keys,
            value_bytes,
            seed,
        })
    }
}

/// One measured run, of any system.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Row {
    /// `etcd`, `psmr` or `redis`.
    pub system: String,
    /// `fsync`, `no fsync`, `disk`, `memory`, `pipeline 50`.
    pub setup: String,
    /// Closed-loop clients (redis: connections).
    pub clients: usize,
    /// Puts per request (redis: pipeline depth).
    pub per_request: usize,
    /// Puts completed per second in the measured window.
    pub puts_per_s: f64,
    /// Median request latency, µs.
    pub p50_us: u64,
    /// 99th percentile, µs.
    pub p99_us: u64,
    /// Largest, µs.
    pub max_us: u64,
    /// Requests that failed.
    pub failed_requests: u64,
    /// Each server process's CPU over the window.
    pub cpu: Vec<ReplicaCpu>,
    /// Why `cpu` is incomplete, if it is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_note: Option<String>,
    /// Exactly what ran (flags, command lines).
    pub ran: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_pairs_every_psmr_case_with_a_peer() {
        let cases = plan(&[1, 8, 64]);
        assert_eq!(cases.len(), 14);
        assert_eq!(cases[0], Case::Etcd { fsync: true, clients: 1 });
        assert_eq!(cases[3], Case::Psmr { storage: "disk", clients: 1, per_request: 1 });
        assert_eq!(cases[6], Case::Etcd { fsync: false, clients: 1 });
        assert_eq!(cases[13], Case::Psmr { storage: "memory", clients: 8, per_request: 50 });
        assert_eq!(cases[12].name(), "redis -P 50, 8 clients");
        assert_eq!(cases[7].name(), "etcd no fsync, 8 clients");
    }

    #[test]
    fn loads_check_what_etcd_and_redis_can_take() {
        let p = base_params();
        let load = PeerLoad::of(&p, 8, 1).unwrap();
        assert_eq!((load.clients, load.keys, load.value_bytes), (8, 10_000, 64));
        let huge = Params { keys: u64::MAX, ..p.clone() };
        assert!(PeerLoad::of(&huge, 1, 1).unwrap_err().to_string().contains("keys must be between"));
        assert!(PeerLoad::of(&p, 0, 1).is_err());
        let big = Params { value_bytes: Some(1 << 20), ..p.clone() };
        assert!(PeerLoad::of(&big, 1, 1).is_err());
        let decimal = Params { value_bytes: None, ..p };
        assert!(PeerLoad::of(&decimal, 1, 1).unwrap_err().to_string().contains("value_bytes=N"));
    }
}
