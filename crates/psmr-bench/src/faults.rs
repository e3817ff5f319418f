//! Fault injection into a cluster of replica processes
//! ([`psmr_harness::launch::ProcessCluster`]) while a load runs: kill the leader
//! with SIGKILL every so often, or one replica at a given time, and start
//! each killed replica again from its data a while later (`psmr bench
//! --kill-leader-every`, `--kill-replica`, `--at`, `--restart-after`).
//! What was done, and what could not be, comes back as [`Event`]s for the
//! report.
//!
//! ```no_run
//! use psmr_bench::faults::{self, Faults};
//! # fn demo(cluster: psmr_harness::launch::ProcessCluster) {
//! use std::time::Duration;
//!
//! let faults = Faults {
//!     kill_leader_every: Some(Duration::from_secs(2)),
//!     restart_after: Duration::from_secs(1),
//!     ..Faults::default()
//! };
//! let cluster = std::sync::Mutex::new(cluster);
//! let ((), events, _) = faults::during(&cluster, &faults, None, || std::thread::sleep(Duration::from_secs(10)));
//! println!("{events:?}");
//! # }
//! ```

use crate::report::Event;
use crate::scenario::Point;
use psmr_harness::clock::Clocks;
use psmr_harness::disk::SmallDisks;
use psmr_harness::history::Operation;
use psmr_harness::launch::ProcessCluster;
use psmr_harness::nemesis::{self, Drawn, Kind, Victims, Window};
use psmr_harness::relay::Links;
use psmr_harness::verdict;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use thiserror::Error;

/// Faults that do not fit a point. The messages name the `psmr bench`
/// flags.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum FaultsError {
    /// A replica restarted from memory would have forgotten its log.
    #[error("point {point}: faults restart replicas, which memory storage cannot (it forgets the log)")]
    MemoryStorage {
        /// The point's name.
        point: String,
    },
    /// The replica to kill is not one of the point's.
    #[error("--kill-replica {id}: point {point} has replicas 1 to {replicas}")]
    NoSuchReplica {
        /// The replica to kill.
        id: u64,
        /// The point's name.
        point: String,
        /// Its replicas.
        replicas: u64,
    },
    /// The nemesis's judge reads over plain client ports.
    #[error(
        "point {point}: the nemesis judges its runs over plain client ports; client_tls=true is measured without it"
    )]
    NemesisTls {
        /// The point's name.
        point: String,
    },
    /// The clock fault's probe sets keys with TTLs, which only the kv
    /// store has.
    #[error("point {point}: the clock nemesis checks expiry with keys of the kv store; service={service} has none")]
    ClockNeedsKv {
        /// The point's name.
        point: String,
        /// Its service.
        service: String,
    },
}

/// The faults to inject into every point.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Faults {
    /// Kill the leader every this long (the first time after as long).
    pub kill_leader_every: Option<Duration>,
    /// Kill this replica (its id) at this time after the load starts.
    pub kill_replica: Option<(u64, Duration)>,
    /// How long a killed replica stays down before it restarts.
    pub restart_after: Duration,
    /// The nemesis's kinds of fault, drawn on a schedule from the run's
    /// seed (`--nemesis`; [`psmr_harness::nemesis`]); empty: none.
    pub nemesis: Vec<Kind>,
}

impl Faults {
    /// Whether there is any fault to inject.
    pub fn any(&self) -> bool {
        self.kill_leader_every.is_some() || self.kill_replica.is_some() || !self.nemesis.is_empty()
    }

    /// Whether replicas are killed and restarted, which memory storage
    /// cannot survive.
    fn restarts(&self) -> bool {
        self.kill_leader_every.is_some() || self.kill_replica.is_some() || self.nemesis.iter().any(|k| k.restarts())
    }

    /// Checks that the faults fit `point`: restarts need disk storage, and
    /// the replica to kill must be one of its replicas.
    pub fn check(&self, point: &Point) -> Result<(), FaultsError> {
        let p = &point.params;
        if self.restarts() && p.storage == "memory" {
            return Err(FaultsError::MemoryStorage { point: point.name() });
        }
        if !self.nemesis.is_empty() && p.client_tls {
            return Err(FaultsError::NemesisTls { point: point.name() });
        }
        if self.nemesis.contains(&Kind::Clock) && p.service != "kv" {
            return Err(FaultsError::ClockNeedsKv { point: point.name(), service: p.service.clone() });
        }
        match self.kill_replica {
            Some((id, _)) if id == 0 || id > p.replicas => {
                Err(FaultsError::NoSuchReplica { id, point: point.name(), replicas: p.replicas })
            }
            _ => Ok(()),
        }
    }
}

/// The nemesis of a run: the links of a relayed cluster, its replicas,
/// their small disks and clocks if they have them, and the faults drawn
/// for them ([`psmr_harness::nemesis::schedule`]).
pub struct Nemesis<'a> {
    /// The relays' links.
    pub links: &'a Links,
    /// The replicas' small disks (`disk-full`).
    pub disks: Option<&'a SmallDisks>,
    /// The replicas' clocks (`clock`).
    pub clocks: Option<&'a Clocks>,
    /// The replicas' ids.
    pub replicas: Vec<u64>,
    /// The faults, times after the load's start.
    pub drawn: Vec<Drawn>,
}

/// Runs `work` on this thread while others inject `faults` and the
/// `nemesis`'s into `cluster`, from now until `work` returns; returns what
/// `work` returned, what the kills did and the nemesis's faults.
pub fn during<T>(
    cluster: &Mutex<ProcessCluster>,
    faults: &Faults,
    nemesis: Option<Nemesis<'_>>,
    work: impl FnOnce() -> T,
) -> (T, Vec<Event>, Vec<Window>) {
    let stop = AtomicBool::new(false);
    let start = Instant::now();
    let kills = Faults { nemesis: Vec::new(), ..faults.clone() };
    std::thread::scope(|scope| {
        let injector = kills.any().then(|| scope.spawn(|| inject(cluster, &kills, start, &stop)));
        let hurting = nemesis.as_ref().map(|n| {
            let victims = Victims { cluster, links: n.links, disks: n.disks, clocks: n.clocks, replicas: &n.replicas };
            let stop = &stop;
            scope.spawn(move || nemesis::run(&victims, &n.drawn, (start, stop)))
        });
        let result = work();
        stop.store(true, Ordering::SeqCst);
        let events = injector.map(|h| h.join().unwrap_or_default()).unwrap_or_default();
        let windows = hurting.map(|h| h.join().unwrap_or_default()).unwrap_or_default();
        (result, events, windows)
    })
}

/// How long after a heal the clients' longest wait for an answer still
/// counts against the fault.
pub const AFTER_HEAL: Duration = Duration::from_secs(5);

/// `events` with the nemesis's `windows` as events of their own, its start
/// and its heal, in order of time. The heal says the longest the clients
/// went without an answer from the fault's start to [`AFTER_HEAL`] after
/// it (or to the next fault's start, if sooner), from `completed`
/// (requests completed per [`psmr_harness::load::TICK`] since the load's
/// start); the p99 latency of the operations of `history` that completed
/// during the fault and in the [`AFTER_HEAL`] after it; and how long the
/// replicas took to catch up.
pub fn with_windows(
    mut events: Vec<Event>,
    mut windows: Vec<Window>,
    completed: &[u32],
    history: &[Operation],
) -> Vec<Event> {
    windows.sort_by(|a, b| a.start_s.total_cmp(&b.start_s));
    let next_starts: Vec<f64> = windows.iter().skip(1).map(|w| w.start_s).chain([f64::INFINITY]).collect();
    let ns = |s: f64| (s * 1e9) as u64;
    let ms = |us: Option<u64>| us.map(|us| us as f64 / 1e3);
    for (w, next) in windows.into_iter().zip(next_starts) {
        // Up to the next fault's start, whose wait is its own.
        let until = (w.end_s + AFTER_HEAL.as_secs_f64()).min(next.max(w.end_s));
        let (from, to) = (Duration::from_secs_f64(w.start_s), Duration::from_secs_f64(until));
        let gap = psmr_harness::load::longest_gap(completed, from, to);
        let action = format!("{}: {}", w.kind, w.what);
        events.push(Event { at_s: w.start_s, action, ..Event::default() });
        events.push(Event {
            at_s: w.end_s,
            action: format!("heal {} of {:.1} s", w.kind, w.start_s),
            error: w.error,
            gap_ms: Some(gap.as_secs_f64() * 1e3),
            p99_during_ms: ms(verdict::p99_between(history, ns(w.start_s), ns(w.end_s))),
            p99_after_ms: ms(verdict::p99_between(history, ns(w.end_s), ns(w.end_s + AFTER_HEAL.as_secs_f64()))),
            converged_ms: w.converged_ms,
            ..Event::default()
        });
    }
    events.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
    events
}

/// What keeps a nemesis run from passing: a fault of `kinds` that could
/// not be injected (or a kind never injected), and the judgement's
/// findings, one line each; empty when it passed.
pub fn nemesis_failures(kinds: &[Kind], events: &[Event], judgement: Option<&verdict::Judgement>) -> Vec<String> {
    let mut out: Vec<String> =
        events.iter().filter_map(|e| e.error.as_ref().map(|err| format!("{}: {err}", e.action))).collect();
    for kind in kinds {
        let heal = format!("heal {kind} of ");
        let injected = events.iter().any(|e| e.error.is_none() && e.action.starts_with(&heal));
        if !injected {
            out.push(format!("no {kind} fault was injected"));
        }
    }
    match judgement {
        None => out.push("the run was not judged".into()),
        Some(j) => {
            out.extend(j.lost.iter().cloned());
            if j.linearizable != "yes" {
                out.push(format!("linearizable: {}", j.linearizable));
            }
            if j.converged_ms.is_none() {
                out.push(format!("the replicas did not converge: {}", j.replicas.join(", ")));
            }
            if let Some(expiry) = &j.expiry {
                out.extend(expiry.violations.iter().map(|v| format!("expiry: {v}")));
            }
        }
    }
    out
}

/// Injects `faults` into `cluster`, times counted from `start`, until
/// `stop` is set or nothing is left to do; returns what it did.
pub fn inject(cluster: &Mutex<ProcessCluster>, faults: &Faults, start: Instant, stop: &AtomicBool) -> Vec<Event> {
    let mut injector = Injector { faults, start, pending: Vec::new(), events: Vec::new() };
    if let Some(every) = faults.kill_leader_every {
        injector.pending.push((every, Action::KillLeader));
    }
    if let Some((id, at)) = faults.kill_replica {
        injector.pending.push((at, Action::Kill(id)));
    }
    while let Some((at, action)) = injector.next() {
        if !nemesis::sleep_until(start + at, stop) {
            break;
        }
        // A poisoned lock: the load's side panicked, nothing to serve.
        let Ok(mut cluster) = cluster.lock() else { break };
        injector.apply(&mut cluster, at, action);
    }
    injector.events
}

/// What the injector does next.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Action {
    KillLeader,
    Kill(u64),
    Restart(u64),
}

/// The injector's plan and record.
struct Injector<'a> {
    faults: &'a Faults,
    start: Instant,
    /// Actions to come, each at a time after `start`.
    pending: Vec<(Duration, Action)>,
    events: Vec<Event>,
}

impl Injector<'_> {
    /// The earliest pending action.
    fn next(&mut self) -> Option<(Duration, Action)> {
        self.pending.sort_by_key(|p| std::cmp::Reverse(p.0));
        self.pending.pop()
    }

    /// Does `action`, planned for `at`, and plans what follows from it.
    fn apply(&mut self, cluster: &mut ProcessCluster, at: Duration, action: Action) {
        match action {
            Action::KillLeader => {
                if let Some(every) = self.faults.kill_leader_every {
                    self.pending.push((at + every, Action::KillLeader));
                }
                match cluster.leader() {
                    Some(id) => self.kill(cluster, "kill leader", id),
                    None => self.record("kill leader", 0, Err("no leader to kill".into())),
                }
            }
            Action::Kill(id) => self.kill(cluster, "kill", id),
            Action::Restart(id) => {
                let result = cluster.restart(id).map_err(|e| e.to_string());
                self.record("restart", id, result);
            }
        }
    }

    /// Kills replica `id` and, if it died, plans its restart.
    fn kill(&mut self, cluster: &mut ProcessCluster, action: &str, id: u64) {
        let result = cluster.kill(id).map_err(|e| e.to_string());
        let killed = result.is_ok();
        self.record(action, id, result);
        if killed {
            tracing::info!(replica = id, "killed; restarting in {:?}", self.faults.restart_after);
            self.pending.push((self.start.elapsed() + self.faults.restart_after, Action::Restart(id)));
        }
    }

    fn record(&mut self, action: &str, replica: u64, result: Result<(), String>) {
        let at_s = self.start.elapsed().as_secs_f64();
        self.events.push(Event { at_s, action: action.into(), replica, error: result.err(), ..Event::default() });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::Params;

    #[test]
    fn faults_must_fit_the_point() {
        let point = |storage: &str| Point {
            params: Params { storage: storage.into(), replicas: 3, ..Params::default() },
            label: Vec::new(),
        };
        let kill = |id| Faults { kill_replica: Some((id, Duration::from_secs(1))), ..Faults::default() };
        assert_eq!(kill(3).check(&point("disk")), Ok(()));
        assert!(matches!(kill(4).check(&point("disk")), Err(FaultsError::NoSuchReplica { id: 4, .. })));
        assert!(matches!(kill(0).check(&point("disk")), Err(FaultsError::NoSuchReplica { id: 0, .. })));
        assert!(matches!(kill(1).check(&point("memory")), Err(FaultsError::MemoryStorage { .. })));
        assert_eq!(Faults::default().check(&point("memory")), Ok(()));
        let nemesis = |kinds: Vec<Kind>| Faults { nemesis: kinds, ..Faults::default() };
        assert_eq!(nemesis(vec![Kind::Partition, Kind::Pause]).check(&point("memory")), Ok(()));
        assert!(matches!(nemesis(vec![Kind::Kill]).check(&point("memory")), Err(FaultsError::MemoryStorage { .. })));
    }

    #[test]
    fn a_heal_says_how_long_the_clients_went_without_an_answer() {
        // Answers every 10 ms tick but 100-159 and 700-719.
        let mut completed = vec![3u32; 1_000];
        completed[10..16].fill(0);
        completed[70..72].fill(0);
        let window = |start_s, end_s| Window {
            kind: Kind::Pause,
            what: "pause 2".into(),
            start_s,
            end_s,
            error: None,
            converged_ms: Some(7),
        };
        let kill = Event { at_s: 0.5, action: "kill".into(), replica: 1, ..Event::default() };
        // One slow operation during the first fault, fast ones after it.
        let op = |invoke_ms: u64, took_ms: u64| psmr_harness::history::Operation {
            client: 1,
            op: psmr_harness::history::OpKind::Read,
            key: "1".into(),
            value: None,
            result: serde_json::Value::Null,
            invoke_ns: invoke_ms * 1_000_000,
            complete_ns: (invoke_ms + took_ms) * 1_000_000,
            status: psmr_harness::history::Status::Ok,
        };
        let history = [op(10, 60), op(100, 2), op(101, 3)];
        let events = with_windows(vec![kill], vec![window(1.2, 1.3), window(0.05, 0.08)], &completed, &history);
        let actions: Vec<&str> = events.iter().map(|e| e.action.as_str()).collect();
        assert_eq!(actions, ["pause: pause 2", "heal pause of 0.1 s", "kill", "pause: pause 2", "heal pause of 1.2 s"]);
        assert_eq!((events[1].p99_during_ms, events[1].p99_after_ms), (Some(60.0), Some(3.0)));
        assert_eq!((events[4].p99_during_ms, events[1].converged_ms), (None, Some(7)));
        // The first window reaches the silence at 100-159 within 5 s of
        // its heal; the second ends before the one at 700.
        assert_eq!(events[1].gap_ms, Some(60.0));
        assert_eq!(events[4].gap_ms, Some(0.0));
        assert_eq!(events[2].gap_ms, None);
        // A fault whose heal the next one follows closely does not take
        // the next one's silence.
        let events = with_windows(Vec::new(), vec![window(0.05, 0.08), window(0.09, 0.2)], &completed, &[]);
        assert_eq!((events[1].gap_ms, events[3].gap_ms), (Some(0.0), Some(60.0)));
    }

    #[test]
    fn a_nemesis_run_fails_on_a_fault_not_injected_a_kind_missing_or_a_bad_judgement() {
        let heal = |kind: &str, error: Option<&str>| Event {
            action: format!("heal {kind} of 1.0 s"),
            error: error.map(str::to_string),
            ..Event::default()
        };
        let good = verdict::Judgement {
            operations: 10,
            keys_read: 2,
            lost: Vec::new(),
            linearizable: "yes".into(),
            converged_ms: Some(5),
            replicas: Vec::new(),
            expiry: Some(Default::default()),
        };
        let kinds = [Kind::Pause, Kind::Kill];
        let both = [heal("pause", None), heal("kill", None)];
        assert!(nemesis_failures(&kinds, &both, Some(&good)).is_empty());
        let failed = nemesis_failures(&kinds, &[heal("pause", None), heal("kill", Some("no leader"))], Some(&good));
        assert_eq!(failed, ["heal kill of 1.0 s: no leader", "no kill fault was injected"]);
        assert_eq!(nemesis_failures(&kinds, &both, None), ["the run was not judged"]);
        let bad = verdict::Judgement {
            lost: vec!["key \"1\": gone".into()],
            linearizable: "no: key \"1\"".into(),
            converged_ms: None,
            ..good.clone()
        };
        assert_eq!(nemesis_failures(&kinds, &both, Some(&bad)).len(), 3);
        let expiry = psmr_harness::clock::TtlReport { violations: vec!["k gone early".into()], ..Default::default() };
        let early = verdict::Judgement { expiry: Some(expiry), ..good };
        assert_eq!(nemesis_failures(&kinds, &both, Some(&early)), ["expiry: k gone early"]);
    }
}
