//! The nemesis: faults against a local cluster of real replica processes,
//! one after another on a schedule drawn from a seed, as Jepsen's nemesis
//! does. The links between replicas are cut, stalled, reset and slowed
//! through their relays ([`crate::relay`]); processes are paused with
//! SIGSTOP and killed with SIGKILL.
//!
//! [`schedule`] draws the faults (pure: the same seed and replicas give the
//! same schedule, so a run that found a violation replays), and [`run`]
//! carries them out against a cluster, healing each before the next, and
//! returns the [`Window`] of every fault for the report.

use crate::launch::ProcessCluster;
use crate::relay::{Fault, Links};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use thiserror::Error;

/// The kinds of fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// Replicas split into sides that cannot reach each other: one
    /// replica (or the leader) alone, or a minority and a majority.
    Partition,
    /// One direction of one link stalls (from or to the leader, or
    /// between two followers); the other carries on.
    OneWay,
    /// Every connection between two replicas is reset mid-stream.
    Reset,
    /// Every link of one replica slowed by tens of milliseconds.
    Delay,
    /// One replica (or the leader) stopped with SIGSTOP, then SIGCONT.
    Pause,
    /// One replica (or the leader) killed with SIGKILL, then restarted
    /// from its data (disk storage only).
    Kill,
}

impl Kind {
    /// Every kind, in order.
    pub const ALL: [Kind; 6] = [Kind::Partition, Kind::OneWay, Kind::Reset, Kind::Delay, Kind::Pause, Kind::Kill];

    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Partition => "partition",
            Kind::OneWay => "one-way",
            Kind::Reset => "reset",
            Kind::Delay => "delay",
            Kind::Pause => "pause",
            Kind::Kill => "kill",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A list of kinds that does not parse.
#[derive(Debug, Error, PartialEq, Eq)]
#[error("unknown nemesis {0:?} (known: all, partition, one-way, reset, delay, pause, kill)")]
pub struct UnknownKind(pub String);

/// Parses `all` or a comma-separated list of kinds.
pub fn parse_kinds(s: &str) -> Result<Vec<Kind>, UnknownKind> {
    if s.trim() == "all" {
        return Ok(Kind::ALL.to_vec());
    }
    let mut kinds: Vec<Kind> = s.split(',').map(str::parse).collect::<Result<_, _>>()?;
    kinds.sort();
    kinds.dedup();
    Ok(kinds)
}

impl FromStr for Kind {
    type Err = UnknownKind;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Kind::ALL.into_iter().find(|k| k.name() == s.trim()).ok_or_else(|| UnknownKind(s.to_string()))
    }
}

/// Whom a fault hits: a replica drawn by the schedule, or whichever leads
/// when the fault starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// The leader at the fault's start.
    Leader,
    /// This replica.
    Replica(u64),
}

/// One fault as drawn, before it meets the cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// `alone` cut off from every other replica, both ways.
    Isolate(Target),
    /// `minority` and the rest cut off from each other.
    Split(Vec<u64>),
    /// Link `from → to` held; `to → from` carries on.
    OneWay(Target, Target),
    /// The connections between two replicas reset.
    Reset(u64, u64),
    /// Every link from and to a replica delayed by this many ms.
    Delay(u64, u64),
    /// A replica stopped.
    Pause(Target),
    /// A replica killed, restarted at the heal.
    Kill(Target),
}

impl Step {
    /// Its kind.
    pub fn kind(&self) -> Kind {
        match self {
            Step::Isolate(_) | Step::Split(_) => Kind::Partition,
            Step::OneWay(..) => Kind::OneWay,
            Step::Reset(..) => Kind::Reset,
            Step::Delay(..) => Kind::Delay,
            Step::Pause(_) => Kind::Pause,
            Step::Kill(_) => Kind::Kill,
        }
    }
}

/// A fault of the schedule: when it starts (after the run's start), how
/// long it lasts, and what it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Drawn {
    /// Its start.
    pub at: Duration,
    /// Its length.
    pub hold: Duration,
    /// What it does.
    pub step: Step,
}

/// How faults are drawn.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// The kinds to draw from.
    pub kinds: Vec<Kind>,
    /// The seed (printed, and accepted back to replay a schedule).
    pub seed: u64,
    /// A fault lasts between these two.
    pub hold: (Duration, Duration),
    /// Between two faults, quiet for between these two.
    pub quiet: (Duration, Duration),
}

impl Plan {
    /// `kinds` from `seed`: faults of 1 to 4 s, 1 to 3 s apart.
    pub fn new(kinds: Vec<Kind>, seed: u64) -> Self {
        let s = Duration::from_secs;
        Self { kinds, seed, hold: (s(1), s(4)), quiet: (s(1), s(3)) }
    }
}

fn between(rng: &mut ChaCha8Rng, (lo, hi): (Duration, Duration)) -> Duration {
    if hi <= lo {
        return lo;
    }
    Duration::from_millis(rng.gen_range(lo.as_millis() as u64..=hi.as_millis() as u64))
}

/// The faults of `plan` against `replicas` (ids) within `horizon`, in
/// order of their starts, none overlapping; the first after a quiet spell.
pub fn schedule(plan: &Plan, replicas: &[u64], horizon: Duration) -> Vec<Drawn> {
    let mut rng = ChaCha8Rng::seed_from_u64(plan.seed);
    let mut out = Vec::new();
    let mut at = between(&mut rng, plan.quiet);
    while !plan.kinds.is_empty() && replicas.len() >= 2 {
        let hold = between(&mut rng, plan.hold);
        if at + hold > horizon {
            break;
        }
        let kind = plan.kinds[rng.gen_range(0..plan.kinds.len())];
        out.push(Drawn { at, hold, step: draw(&mut rng, kind, replicas) });
        at += hold + between(&mut rng, plan.quiet);
    }
    out
}

/// One step of `kind` against `replicas` (at least two).
fn draw(rng: &mut ChaCha8Rng, kind: Kind, replicas: &[u64]) -> Step {
    let pick = |rng: &mut ChaCha8Rng| *replicas.choose(rng).expect("replicas");
    let target = |rng: &mut ChaCha8Rng| if rng.gen_bool(0.5) { Target::Leader } else { Target::Replica(pick(rng)) };
    match kind {
        Kind::Partition if replicas.len() >= 5 && rng.gen_bool(0.5) => {
            let mut shuffled = replicas.to_vec();
            shuffled.shuffle(rng);
            shuffled.truncate((replicas.len() - 1) / 2);
            shuffled.sort_unstable();
            Step::Split(shuffled)
        }
        Kind::Partition => Step::Isolate(target(rng)),
        Kind::OneWay => {
            let from = target(rng);
            let to = loop {
                let to = pick(rng);
                if from != Target::Replica(to) {
                    break to;
                }
            };
            Step::OneWay(from, Target::Replica(to))
        }
        Kind::Reset => {
            let mut two = replicas.to_vec();
            two.shuffle(rng);
            Step::Reset(two[0], two[1])
        }
        Kind::Delay => Step::Delay(pick(rng), rng.gen_range(20..=200)),
        Kind::Pause => Step::Pause(target(rng)),
        Kind::Kill => Step::Kill(target(rng)),
    }
}

/// A fault as it happened.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Window {
    /// Its kind.
    pub kind: Kind,
    /// What it did, for people (`isolate 2 (leader)`).
    pub what: String,
    /// When it started and healed, in seconds after the run's start.
    pub start_s: f64,
    /// When it healed.
    pub end_s: f64,
    /// Why it could not be done, if it could not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Carries out `drawn` (times after `start`) against `cluster` and its
/// `links`, each fault healed before the next, until done or `stop`; what
/// happened. Every link is up and every replica running when it returns.
pub fn run(
    cluster: &Mutex<ProcessCluster>,
    links: &Links,
    replicas: &[u64],
    drawn: &[Drawn],
    (start, stop): (Instant, &AtomicBool),
) -> Vec<Window> {
    let mut windows = Vec::new();
    for d in drawn {
        if !sleep_until(start + d.at, stop) {
            break;
        }
        let Ok(mut guard) = cluster.lock() else { break };
        let started = start.elapsed().as_secs_f64();
        let applied = apply(&mut guard, links, replicas, &d.step);
        drop(guard);
        let what = applied.as_ref().map_or_else(|e| format!("{:?}", d.step) + ": " + e, |h| h.what.clone());
        let _ = sleep_until(start + d.at + d.hold, stop);
        let healed = match applied {
            Ok(h) => heal(cluster, links, h.undo),
            Err(e) => Err(e),
        };
        let end_s = start.elapsed().as_secs_f64();
        windows.push(Window { kind: d.step.kind(), what, start_s: started, end_s, error: healed.err() });
    }
    links.heal();
    windows
}

/// What a heal undoes besides the links.
enum Undo {
    Links,
    Resume(u64),
    Restart(u64),
}

struct Applied {
    what: String,
    undo: Undo,
}

fn apply(cluster: &mut ProcessCluster, links: &Links, replicas: &[u64], step: &Step) -> Result<Applied, String> {
    // Whether a fault hit the leader is what its cost depends on: said
    // even of a replica drawn by id.
    let leader = cluster.leader();
    let who = |id: u64| if leader == Some(id) { " (leader)".to_string() } else { String::new() };
    let resolve = |t: Target| match t {
        Target::Replica(id) => Ok((id, who(id))),
        Target::Leader => leader.map(|id| (id, who(id))).ok_or("no leader".to_string()),
    };
    let applied = |what: String, undo| Ok(Applied { what, undo });
    match step {
        Step::Isolate(t) => {
            let (id, who) = resolve(*t)?;
            cut(links, &[id], replicas);
            applied(format!("isolate {id}{who}"), Undo::Links)
        }
        Step::Split(minority) => {
            cut(links, minority, replicas);
            applied(format!("split {minority:?} from the rest"), Undo::Links)
        }
        Step::OneWay(from, to) => {
            let ((from, fw), (mut to, mut tw)) = (resolve(*from)?, resolve(*to)?);
            if from == to {
                // The leader drawn is the replica drawn: another one.
                to = replicas.iter().copied().find(|&r| r != from).ok_or("one replica: no link")?;
                tw = String::new();
            }
            links.set(from, to, Fault::Held);
            applied(format!("hold {from}{fw} -> {to}{tw}"), Undo::Links)
        }
        Step::Reset(a, b) => {
            let n = links.reset(*a, *b);
            applied(format!("reset {n} connections between {a} and {b}"), Undo::Links)
        }
        Step::Delay(id, ms) => {
            for &other in replicas.iter().filter(|&&o| o != *id) {
                links.set(*id, other, Fault::Delay(Duration::from_millis(*ms)));
                links.set(other, *id, Fault::Delay(Duration::from_millis(*ms)));
            }
            applied(format!("delay {id} by {ms} ms"), Undo::Links)
        }
        Step::Pause(t) => {
            let (id, who) = resolve(*t)?;
            cluster.signal(id, "STOP").map_err(|e| e.to_string())?;
            applied(format!("pause {id}{who}"), Undo::Resume(id))
        }
        Step::Kill(t) => {
            let (id, who) = resolve(*t)?;
            cluster.kill(id).map_err(|e| e.to_string())?;
            applied(format!("kill {id}{who}"), Undo::Restart(id))
        }
    }
}

/// Holds every link between `side` and the other replicas, both ways.
fn cut(links: &Links, side: &[u64], replicas: &[u64]) {
    for &a in side {
        for &b in replicas.iter().filter(|b| !side.contains(b)) {
            links.set(a, b, Fault::Held);
            links.set(b, a, Fault::Held);
        }
    }
}

fn heal(cluster: &Mutex<ProcessCluster>, links: &Links, undo: Undo) -> Result<(), String> {
    links.heal();
    let mut cluster = cluster.lock().map_err(|_| "the cluster's lock is poisoned".to_string())?;
    match undo {
        Undo::Links => Ok(()),
        Undo::Resume(id) => cluster.signal(id, "CONT").map_err(|e| e.to_string()),
        Undo::Restart(id) => cluster.restart(id).map_err(|e| e.to_string()),
    }
}

/// Sleeps until `deadline`; false if `stop` was set first (within 10 ms).
pub fn sleep_until(deadline: Instant, stop: &AtomicBool) -> bool {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sleeping_stops_when_asked() {
        let stop = AtomicBool::new(true);
        assert!(!sleep_until(Instant::now() + Duration::from_secs(60), &stop));
        assert!(sleep_until(Instant::now(), &stop));
    }

    #[test]
    fn kinds_parse_and_unknown_ones_are_named() {
        assert_eq!(parse_kinds("all").unwrap(), Kind::ALL.to_vec());
        assert_eq!(parse_kinds("pause,partition,pause").unwrap(), vec![Kind::Partition, Kind::Pause]);
        assert_eq!(parse_kinds("partition,flood"), Err(UnknownKind("flood".into())));
    }

    #[test]
    fn a_seed_gives_one_schedule_of_the_kinds_asked_within_the_horizon() {
        let plan = Plan::new(Kind::ALL.to_vec(), 42);
        let horizon = Duration::from_secs(300);
        let a = schedule(&plan, &[1, 2, 3, 4, 5], horizon);
        assert_eq!(a, schedule(&plan, &[1, 2, 3, 4, 5], horizon), "the same seed, the same schedule");
        assert_ne!(a, schedule(&Plan::new(Kind::ALL.to_vec(), 43), &[1, 2, 3, 4, 5], horizon));
        let kinds: std::collections::BTreeSet<Kind> = a.iter().map(|d| d.step.kind()).collect();
        assert_eq!(kinds.len(), Kind::ALL.len(), "five minutes draw every kind: {a:?}");
        for w in a.windows(2) {
            assert!(w[0].at + w[0].hold < w[1].at, "faults do not overlap: {w:?}");
        }
        let last = a.last().unwrap();
        assert!(last.at + last.hold <= horizon);
        for d in &a {
            match &d.step {
                Step::Split(minority) => assert!(minority.len() == 2, "a minority of five: {minority:?}"),
                Step::OneWay(from, to) => assert_ne!(from, to),
                Step::Reset(x, y) => assert_ne!(x, y),
                _ => {}
            }
        }
        let only = schedule(&Plan::new(vec![Kind::Pause], 7), &[1, 2, 3], horizon);
        assert!(!only.is_empty() && only.iter().all(|d| d.step.kind() == Kind::Pause));
    }
}
