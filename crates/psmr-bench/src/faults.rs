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
//! let ((), events) = faults::during(&cluster, &faults, None, || std::thread::sleep(Duration::from_secs(10)));
//! println!("{events:?}");
//! # }
//! ```

use crate::report::Event;
use crate::scenario::Point;
use psmr_harness::launch::ProcessCluster;
use psmr_harness::nemesis::{self, Drawn, Kind, Window};
use psmr_harness::relay::Links;
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
        self.kill_leader_every.is_some() || self.kill_replica.is_some() || self.nemesis.contains(&Kind::Kill)
    }

    /// Checks that the faults fit `point`: restarts need disk storage, and
    /// the replica to kill must be one of its replicas.
    pub fn check(&self, point: &Point) -> Result<(), FaultsError> {
        let p = &point.params;
        if self.restarts() && p.storage == "memory" {
            return Err(FaultsError::MemoryStorage { point: point.name() });
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
/// and the faults drawn for them ([`psmr_harness::nemesis::schedule`]).
pub struct Nemesis<'a> {
    /// The relays' links.
    pub links: &'a Links,
    /// The replicas' ids.
    pub replicas: Vec<u64>,
    /// The faults, times after the load's start.
    pub drawn: Vec<Drawn>,
}

/// Runs `work` on this thread while others inject `faults` and the
/// `nemesis`'s into `cluster`, from now until `work` returns; returns what
/// `work` returned and what the injectors did, in order of time.
pub fn during<T>(
    cluster: &Mutex<ProcessCluster>,
    faults: &Faults,
    nemesis: Option<Nemesis<'_>>,
    work: impl FnOnce() -> T,
) -> (T, Vec<Event>) {
    let stop = AtomicBool::new(false);
    let start = Instant::now();
    let kills = Faults { nemesis: Vec::new(), ..faults.clone() };
    std::thread::scope(|scope| {
        let injector = kills.any().then(|| scope.spawn(|| inject(cluster, &kills, start, &stop)));
        let hurting = nemesis.as_ref().map(|n| {
            let run = || nemesis::run(cluster, n.links, &n.replicas, &n.drawn, (start, &stop));
            scope.spawn(run)
        });
        let result = work();
        stop.store(true, Ordering::SeqCst);
        let mut events = injector.map(|h| h.join().unwrap_or_default()).unwrap_or_default();
        let windows = hurting.map(|h| h.join().unwrap_or_default()).unwrap_or_default();
        events.extend(windows.into_iter().flat_map(window_events));
        events.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
        (result, events)
    })
}

/// A nemesis fault as the report's events: its start, and its heal.
fn window_events(w: Window) -> [Event; 2] {
    let start = Event { at_s: w.start_s, action: format!("{}: {}", w.kind, w.what), replica: 0, error: None };
    let heal = Event { at_s: w.end_s, action: format!("heal {}", w.kind), replica: 0, error: w.error };
    [start, heal]
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
        if !wait_until(start + at, stop) {
            break;
        }
        // A poisoned lock: the load's side panicked, nothing to serve.
        let Ok(mut cluster) = cluster.lock() else { break };
        injector.apply(&mut cluster, at, action);
    }
    injector.events
}

/// Sleeps until `deadline`; false if `stop` was set first.
fn wait_until(deadline: Instant, stop: &AtomicBool) -> bool {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return true;
        }
        if stop.load(Ordering::SeqCst) {
            return false;
        }
        std::thread::sleep(left.min(Duration::from_millis(10)));
    }
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
        self.events.push(Event { at_s, action: action.into(), replica, error: result.err() });
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
    fn waiting_stops_when_asked() {
        let stop = AtomicBool::new(true);
        assert!(!wait_until(Instant::now() + Duration::from_secs(60), &stop));
        assert!(wait_until(Instant::now(), &stop));
    }
}
