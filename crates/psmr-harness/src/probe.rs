//! Asking a running cluster about itself through the client protocol:
//! every replica's status (id, pid, term, leader, applied index, digest),
//! its per-thread and per-worker counters, and the key numbers of its
//! Prometheus metrics. `psmr client status` prints what [`Probe::status`]
//! returns; the load, the process launcher and the fault injector find the
//! leader and the replicas' pids with the same probe.

use psmr_client::{Client, ClientConfig, ClientError, ReplicaStats};
use psmr_model::wire::ReplicaStatus;
use std::fmt::Write as _;
use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;
use thiserror::Error;

/// Why a cluster cannot be reached.
#[derive(Debug, Error)]
pub enum ProbeError {
    /// An address does not resolve.
    #[error(transparent)]
    Resolve(#[from] ResolveError),
    /// The probe's client cannot start.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// No replica answered; why, for each.
    #[error("no replica of --cluster answered ({0})")]
    NoAnswer(String),
}

/// A replica address that does not resolve.
#[derive(Debug, Error)]
pub enum ResolveError {
    /// The text is not `HOST:PORT`, or the host is unknown.
    #[error("bad replica address {addr:?}: {source}")]
    Bad {
        /// The address given.
        addr: String,
        /// Why it does not resolve.
        source: std::io::Error,
    },
    /// The host resolves to no address.
    #[error("address {0:?} resolves to nothing")]
    Empty(String),
}

/// The first address each of `list` (`HOST:PORT`) resolves to, in order.
pub fn resolve(list: &[String]) -> Result<Vec<SocketAddr>, ResolveError> {
    list.iter()
        .map(|a| {
            let mut addrs = a.to_socket_addrs().map_err(|source| ResolveError::Bad { addr: a.clone(), source })?;
            addrs.next().ok_or_else(|| ResolveError::Empty(a.clone()))
        })
        .collect()
}

/// The replicas at `list` (`HOST:PORT`), resolved, once one of them at
/// least answers as `access` asks (who, in TLS or not, within its
/// timeout); the error says why each did not.
pub fn reachable(list: &[String], access: psmr_client::Access) -> Result<Vec<SocketAddr>, ProbeError> {
    let addrs = resolve(list)?;
    let answers = Probe::new(&addrs)?.as_user(access.credentials).with_tls(access.tls).statuses(access.timeout);
    if answers.iter().all(Result::is_err) {
        let why: Vec<String> =
            addrs.iter().zip(&answers).filter_map(|(a, r)| Some(format!("{a}: {}", r.as_ref().err()?))).collect();
        return Err(ProbeError::NoAnswer(why.join("; ")));
    }
    Ok(addrs)
}

/// The leader the answering replicas know of: the one named by the
/// replica of the highest term among those that name one; 0 for none.
pub fn leader_of<'a>(statuses: impl IntoIterator<Item = &'a ReplicaStatus>) -> u64 {
    statuses.into_iter().filter(|s| s.leader != 0).max_by_key(|s| s.term).map_or(0, |s| s.leader)
}

/// A client that asks each replica of a cluster about itself, one replica
/// at a time (no leader needed).
pub struct Probe {
    client: Client,
    addrs: Vec<SocketAddr>,
    /// Who asks (replicas with users answer status to data users).
    credentials: Option<psmr_client::Credentials>,
    /// TLS to client ports in TLS.
    tls: Option<psmr_client::Connector>,
}

impl Probe {
    /// A probe of the replicas at `addrs` (client addresses).
    pub fn new(addrs: &[SocketAddr]) -> Result<Self, ClientError> {
        let client = Client::new(ClientConfig::new(addrs.to_vec()))?;
        Ok(Self { client, addrs: addrs.to_vec(), credentials: None, tls: None })
    }

    /// The same probe, asking as `credentials`.
    pub fn as_user(mut self, credentials: Option<psmr_client::Credentials>) -> Self {
        self.credentials = credentials;
        self
    }

    /// The same probe, in TLS with `tls` (None: plain TCP).
    pub fn with_tls(mut self, tls: Option<psmr_client::Connector>) -> Self {
        self.tls = tls;
        self
    }

    fn access(&self, timeout: Duration) -> psmr_client::Access {
        psmr_client::Access::new(timeout, self.credentials.clone()).with_tls(self.tls.clone())
    }

    /// The addresses probed, in order.
    pub fn addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// Every replica's status, in order; why, for those that do not answer
    /// within `timeout`.
    pub fn statuses(&self, timeout: Duration) -> Vec<Result<ReplicaStatus, String>> {
        self.addrs.iter().map(|&a| self.client.status_of(a, self.access(timeout))).collect()
    }

    /// The leader the answering replicas know of ([`leader_of`]), if any.
    pub fn leader(&self, timeout: Duration) -> Option<u64> {
        Some(leader_of(self.statuses(timeout).iter().flatten())).filter(|&l| l != 0)
    }

    /// Every replica's thread and worker counters, in order; `None` for
    /// those that do not answer.
    pub fn stats(&self, timeout: Duration) -> Vec<Option<ReplicaStats>> {
        self.addrs.iter().map(|&a| self.client.stats_of(a, self.access(timeout)).ok()).collect()
    }

    /// Every replica's status and the key numbers of its metrics.
    pub fn status(&self, timeout: Duration) -> ClusterStatus {
        let replicas: Vec<ReplicaReport> = self
            .addrs
            .iter()
            .zip(self.statuses(timeout))
            .map(|(&addr, status)| ReplicaReport {
                addr,
                status,
                numbers: self.client.metrics_of(addr, self.access(timeout)).map(|t| KeyNumbers::of(&t)),
            })
            .collect();
        // The newest term's view, even when it knows no leader yet (an
        // election under way), rather than an older term's leader.
        let answered = replicas.iter().filter_map(|r| r.status.as_ref().ok());
        let leader = answered.max_by_key(|s| s.term).map_or(0, |s| s.leader);
        ClusterStatus { leader, replicas }
    }
}

/// What one replica told a [`Probe::status`].
#[derive(Clone, Debug)]
pub struct ReplicaReport {
    /// Its client address.
    pub addr: SocketAddr,
    /// Its status, or why it did not answer.
    pub status: Result<ReplicaStatus, String>,
    /// The key numbers of its metrics, or why they could not be read.
    pub numbers: Result<KeyNumbers, String>,
}

/// A cluster as [`Probe::status`] found it.
#[derive(Clone, Debug)]
pub struct ClusterStatus {
    /// The leader as the answering replica of the highest term sees it (0:
    /// none known).
    pub leader: u64,
    /// Every replica probed, in order.
    pub replicas: Vec<ReplicaReport>,
}

impl ClusterStatus {
    /// Whether any replica told its status.
    pub fn any_answered(&self) -> bool {
        self.replicas.iter().any(|r| r.status.is_ok())
    }

    /// `{"leader": N, "replicas": [{"id", "addr", "pid", "applied",
    /// "digest", "term", "leader", "scheduler", "decision", "transfers", "metrics":
    /// {...}} or {"addr",
    /// "error"}, ...]}` (`psmr client status --json`).
    pub fn to_json(&self) -> serde_json::Value {
        let replicas: Vec<serde_json::Value> = self
            .replicas
            .iter()
            .map(|r| {
                let mut v = match &r.status {
                    Ok(s) => serde_json::json!({"id": s.id, "addr": s.addr, "pid": s.pid, "applied": s.applied,
                        "digest": s.digest, "term": s.term, "leader": s.leader, "scheduler": s.scheduler,
                        "decision": s.decision, "transfers": s.transfers, "cpus": s.cpus}),
                    Err(e) => serde_json::json!({"addr": r.addr.to_string(), "error": e}),
                };
                v["metrics"] = match &r.numbers {
                    Ok(n) => n.to_json(),
                    Err(e) => serde_json::json!({"error": e}),
                };
                v
            })
            .collect();
        serde_json::json!({"leader": self.leader, "replicas": replicas})
    }

    /// Readable tables: every replica's status, then the key numbers of
    /// its metrics (`psmr client status`).
    pub fn format_table(&self) -> String {
        let mut out = format!("leader {}\n", self.leader);
        let _ = writeln!(out, "{:>3} {:<22} {:>8} {:>6} {:>9}  digest", "id", "addr", "pid", "term", "applied");
        for r in &self.replicas {
            let _ = match &r.status {
                Ok(s) => writeln!(
                    out,
                    "{:>3} {:<22} {:>8} {:>6} {:>9}  {}",
                    s.id, s.addr, s.pid, s.term, s.applied, s.digest
                ),
                Err(e) => writeln!(out, "  ? {:<22} error: {e}", r.addr),
            };
        }
        let _ = writeln!(out, "\n{:>3} {:<40} usable CPUs", "id", "scheduler");
        for s in self.replicas.iter().filter_map(|r| r.status.as_ref().ok()) {
            let _ = writeln!(out, "{:>3} {:<40} {}", s.id, s.scheduler, s.cpus);
            if !s.decision.is_empty() {
                let _ = writeln!(out, "    last decision: {}", s.decision);
            }
        }
        for s in self.replicas.iter().filter_map(|r| r.status.as_ref().ok()).filter(|s| !s.transfers.is_empty()) {
            let _ = writeln!(out, "\n{:>3} {}", s.id, s.transfers);
        }
        let _ = writeln!(
            out,
            "\n{:<22} {:>6} {:>6} {:>9} {:>9} {:>9} {:>10} {:>9} {:>9} {:>8} {:>8}",
            "addr",
            "term",
            "leader",
            "commit",
            "applied",
            "entries",
            "commands",
            "requests",
            "p50 ms",
            "p99 ms",
            "refused"
        );
        let ms = |v: Option<f64>| v.map_or("-".to_string(), |s| format!("{:.3}", s * 1e3));
        for r in &self.replicas {
            let _ = match &r.numbers {
                Ok(n) => writeln!(
                    out,
                    "{:<22} {:>6} {:>6} {:>9} {:>9} {:>9} {:>10} {:>9} {:>9} {:>8} {:>8}",
                    r.addr.to_string(),
                    n.term,
                    n.leader,
                    n.commit,
                    n.applied,
                    n.entries_proposed,
                    n.commands_proposed,
                    n.requests,
                    ms(n.latency_p50),
                    ms(n.latency_p99),
                    n.refused_client + n.refused_peer
                ),
                Err(e) => writeln!(out, "{:<22} metrics: {e}", r.addr),
            };
        }
        out
    }
}

/// What `psmr client status` shows of a replica's metrics (the text of
/// its Prometheus endpoint, read through the client protocol).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KeyNumbers {
    /// Raft term.
    pub term: u64,
    /// The leader it follows (0: none).
    pub leader: u64,
    /// Raft commit index.
    pub commit: u64,
    /// Raft applied index.
    pub applied: u64,
    /// Log entries proposed.
    pub entries_proposed: u64,
    /// Commands proposed.
    pub commands_proposed: u64,
    /// Requests answered (`psmr_request_latency_seconds_count`).
    pub requests: u64,
    /// Median request latency in seconds, estimated from the buckets.
    pub latency_p50: Option<f64>,
    /// 99th percentile of the request latency in seconds.
    pub latency_p99: Option<f64>,
    /// Client frames, requests and connections refused.
    pub refused_client: u64,
    /// Peer messages the guard refused.
    pub refused_peer: u64,
}

impl KeyNumbers {
    /// The numbers in a Prometheus exposition; 0 (or `None`) for those
    /// missing.
    pub fn of(text: &str) -> Self {
        let s = psmr_replica::metrics::Scrape::parse(text);
        let int = |name: &str| s.value(name).unwrap_or(0.0) as u64;
        let latency = "psmr_request_latency_seconds";
        KeyNumbers {
            term: int("psmr_raft_term"),
            leader: int("psmr_raft_leader"),
            commit: int("psmr_raft_commit_index"),
            applied: int("psmr_raft_applied_index"),
            entries_proposed: int("psmr_entries_proposed_total"),
            commands_proposed: int("psmr_commands_proposed_total"),
            requests: int("psmr_request_latency_seconds_count"),
            latency_p50: s.quantile(latency, 0.5),
            latency_p99: s.quantile(latency, 0.99),
            refused_client: s.sum("psmr_client_refused_total") as u64,
            refused_peer: s.sum("psmr_peer_refused_total") as u64,
        }
    }

    /// The numbers as one JSON object (`psmr client status --json`).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({"term": self.term, "leader": self.leader, "commit": self.commit,
            "applied": self.applied, "entries_proposed": self.entries_proposed,
            "commands_proposed": self.commands_proposed, "requests": self.requests,
            "request_latency_p50_s": self.latency_p50, "request_latency_p99_s": self.latency_p99,
            "refused_client": self.refused_client, "refused_peer": self.refused_peer})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_reads_the_key_numbers_of_an_exposition() {
        let text = "# TYPE psmr_raft_term gauge\npsmr_raft_term 4\npsmr_raft_leader 2\n\
            psmr_raft_commit_index 30\npsmr_raft_applied_index 29\npsmr_entries_proposed_total 12\n\
            psmr_commands_proposed_total 40\npsmr_request_latency_seconds_count 10\n\
            psmr_request_latency_seconds_bucket{le=\"0.001\"} 5\npsmr_request_latency_seconds_bucket{le=\"0.002\"} 10\n\
            psmr_request_latency_seconds_bucket{le=\"+Inf\"} 10\n\
            psmr_client_refused_total{reason=\"not_leader\"} 2\npsmr_client_refused_total{reason=\"version\"} 1\n\
            psmr_peer_refused_total{rule=\"commit\"} 3\n# EOF\n";
        let n = KeyNumbers::of(text);
        assert_eq!((n.term, n.leader, n.commit, n.applied), (4, 2, 30, 29));
        assert_eq!((n.entries_proposed, n.commands_proposed, n.requests), (12, 40, 10));
        assert_eq!((n.refused_client, n.refused_peer), (3, 3));
        assert_eq!(n.latency_p50, Some(0.001));
        let p99 = n.latency_p99.unwrap();
        assert!((0.001..=0.002).contains(&p99), "{p99}");
        assert_eq!(KeyNumbers::of("garbage\n{{{"), KeyNumbers::default());
    }

    fn status(id: u64, term: u64, leader: u64) -> ReplicaStatus {
        ReplicaStatus {
            id,
            addr: String::new(),
            pid: 1,
            leader,
            term,
            applied: 0,
            digest: String::new(),
            scheduler: String::new(),
            decision: String::new(),
            transfers: String::new(),
            cpus: String::new(),
        }
    }

    #[test]
    fn the_leader_is_the_newest_term_that_names_one() {
        assert_eq!(leader_of(&[status(1, 3, 2), status(2, 4, 0), status(3, 2, 1)]), 2);
        assert_eq!(leader_of(&[status(1, 3, 0)]), 0);
        assert_eq!(leader_of(&[] as &[ReplicaStatus]), 0);
        assert_eq!(resolve(&["127.0.0.1:7".into()]).unwrap(), vec!["127.0.0.1:7".parse().unwrap()]);
        assert!(resolve(&["nowhere".into()]).unwrap_err().to_string().starts_with("bad replica address \"nowhere\""));
    }
}
