//! The nemesis: faults against a local cluster of real replica processes,
//! on a schedule drawn from a seed, as Jepsen's nemesis does. The links
//! between replicas are cut, stalled, reset and slowed through their
//! relays ([`crate::relay`]); processes are paused with SIGSTOP and killed
//! with SIGKILL; a replica's disk fills up ([`crate::disk`]); a replica's
//! wall clock jumps ([`crate::clock`]).
//!
//! [`schedule`] draws the faults (pure: the same seed and replicas give the
//! same schedule, so a run that found a violation replays) in one or more
//! *lanes*: a lane's faults follow one another, each healed before the
//! next, while faults of different lanes overlap (several kinds at once).
//! [`run`] carries them out against a cluster and returns the [`Window`] of
//! every fault for the report, with how long the replicas took to catch
//! up after its heal.

use crate::clock::Clocks;
use crate::disk::SmallDisks;
use crate::launch::ProcessCluster;
use crate::probe::Probe;
use crate::relay::{Fault, Links};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use std::collections::BTreeSet;
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
    /// replica (or the leader) alone; a minority and a majority; two
    /// halves joined only through a bridge replica; a ring of overlapping
    /// majorities.
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
    /// One replica's (or the leader's) disk filled to the last byte; it
    /// stops on its next write, and is emptied and restarted at the heal
    /// (disk storage on [`SmallDisks`] only).
    DiskFull,
    /// One replica's (or the leader's) wall clock jumps seconds forward
    /// or back, and back to the true time at the heal (replicas on
    /// [`Clocks`] only).
    Clock,
}

impl Kind {
    /// Every kind, in order.
    pub const ALL: [Kind; 8] =
        [Kind::Partition, Kind::OneWay, Kind::Reset, Kind::Delay, Kind::Pause, Kind::Kill, Kind::DiskFull, Kind::Clock];

    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Partition => "partition",
            Kind::OneWay => "one-way",
            Kind::Reset => "reset",
            Kind::Delay => "delay",
            Kind::Pause => "pause",
            Kind::Kill => "kill",
            Kind::DiskFull => "disk-full",
            Kind::Clock => "clock",
        }
    }

    /// Whether it restarts replicas from their data, which needs disk
    /// storage.
    pub fn restarts(self) -> bool {
        matches!(self, Kind::Kill | Kind::DiskFull)
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A list of kinds that does not parse.
#[derive(Debug, Error, PartialEq, Eq)]
#[error("unknown nemesis {0:?} (known: all, partition, one-way, reset, delay, pause, kill, disk-full, clock)")]
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
    /// The two sides cut off from each other, the bridge (in neither)
    /// reaching both.
    Bridge {
        /// The replica in the middle.
        bridge: u64,
        /// One side.
        left: Vec<u64>,
        /// The other.
        right: Vec<u64>,
    },
    /// Replicas in this order around a ring, each reaching only those
    /// within `reach` places of it: every one sees a majority, no two the
    /// same one.
    Ring {
        /// The ring.
        order: Vec<u64>,
        /// How far each reaches.
        reach: usize,
    },
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
    /// A replica's disk filled, emptied at the heal.
    FillDisk(Target),
    /// A replica's wall clock this many seconds off, true again at the
    /// heal.
    Clock(Target, i64),
}

impl Step {
    /// Its kind.
    pub fn kind(&self) -> Kind {
        match self {
            Step::Isolate(_) | Step::Split(_) | Step::Bridge { .. } | Step::Ring { .. } => Kind::Partition,
            Step::OneWay(..) => Kind::OneWay,
            Step::Reset(..) => Kind::Reset,
            Step::Delay(..) => Kind::Delay,
            Step::Pause(_) => Kind::Pause,
            Step::Kill(_) => Kind::Kill,
            Step::FillDisk(_) => Kind::DiskFull,
            Step::Clock(..) => Kind::Clock,
        }
    }
}

/// A fault of the schedule: its lane, when it starts (after the run's
/// start), how long it lasts, and what it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Drawn {
    /// Its lane: faults of one lane never overlap.
    pub lane: usize,
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
    /// Between two faults of a lane, quiet for between these two.
    pub quiet: (Duration, Duration),
    /// Lanes: how many faults may be under way at once.
    pub lanes: usize,
}

impl Plan {
    /// `kinds` from `seed`: faults of 1 to 4 s, 1 to 3 s apart; two lanes
    /// when there are several kinds, so that they also come together.
    pub fn new(kinds: Vec<Kind>, seed: u64) -> Self {
        let s = Duration::from_secs;
        let lanes = if kinds.len() > 1 { 2 } else { 1 };
        Self { kinds, seed, hold: (s(1), s(4)), quiet: (s(1), s(3)), lanes }
    }
}

fn between(rng: &mut ChaCha8Rng, (lo, hi): (Duration, Duration)) -> Duration {
    if hi <= lo {
        return lo;
    }
    Duration::from_millis(rng.gen_range(lo.as_millis() as u64..=hi.as_millis() as u64))
}

/// The faults of `plan` against `replicas` (ids) within `horizon`, in
/// order of their starts. Each lane starts after a quiet spell and deals
/// its kinds like cards, every kind once in a shuffled round, so that a
/// run of as many faults as kinds has them all.
pub fn schedule(plan: &Plan, replicas: &[u64], horizon: Duration) -> Vec<Drawn> {
    let mut out = Vec::new();
    for lane in 0..plan.lanes.max(1) {
        // Lane 0 draws from the seed itself: one lane replays as before.
        let mut rng = ChaCha8Rng::seed_from_u64(plan.seed ^ (lane as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let mut deck: Vec<Kind> = Vec::new();
        let mut at = between(&mut rng, plan.quiet);
        while !plan.kinds.is_empty() && replicas.len() >= 2 {
            let hold = between(&mut rng, plan.hold);
            if at + hold > horizon {
                break;
            }
            if deck.is_empty() {
                deck = plan.kinds.clone();
                deck.shuffle(&mut rng);
            }
            let kind = deck.pop().expect("dealt");
            out.push(Drawn { lane, at, hold, step: draw(&mut rng, kind, replicas) });
            at += hold + between(&mut rng, plan.quiet);
        }
    }
    out.sort_by_key(|d| (d.at, d.lane));
    out
}

/// One step of `kind` against `replicas` (at least two).
fn draw(rng: &mut ChaCha8Rng, kind: Kind, replicas: &[u64]) -> Step {
    let pick = |rng: &mut ChaCha8Rng| *replicas.choose(rng).expect("replicas");
    let target = |rng: &mut ChaCha8Rng| if rng.gen_bool(0.5) { Target::Leader } else { Target::Replica(pick(rng)) };
    match kind {
        Kind::Partition => partition(rng, replicas, target),
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
        Kind::DiskFull => Step::FillDisk(target(rng)),
        // Forward or back by 1 to 30 s: far past an election timeout and
        // a TTL, the size of the jumps a misconfigured NTP makes.
        Kind::Clock => {
            let jump = rng.gen_range(1..=30i64);
            Step::Clock(target(rng), if rng.gen_bool(0.5) { jump } else { -jump })
        }
    }
}

/// One of the partitions `replicas` allow: isolating one (any number),
/// a bridge (three or more), a minority against a majority and a ring of
/// majorities (five or more).
fn partition(rng: &mut ChaCha8Rng, replicas: &[u64], target: impl Fn(&mut ChaCha8Rng) -> Target) -> Step {
    let n = replicas.len();
    let shapes = if n >= 5 {
        4
    } else if n >= 3 {
        2
    } else {
        1
    };
    let mut shuffled = replicas.to_vec();
    shuffled.shuffle(rng);
    match rng.gen_range(0..shapes) {
        0 => Step::Isolate(target(rng)),
        1 => {
            let bridge = shuffled.remove(0);
            let right = shuffled.split_off(shuffled.len() / 2);
            Step::Bridge { bridge, left: sorted(shuffled), right: sorted(right) }
        }
        2 => {
            shuffled.truncate((n - 1) / 2);
            Step::Split(sorted(shuffled))
        }
        // Each sees itself and `reach` on either side: a majority.
        _ => Step::Ring { order: shuffled, reach: (n / 2).div_ceil(2) },
    }
}

fn sorted(mut v: Vec<u64>) -> Vec<u64> {
    v.sort_unstable();
    v
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
    /// How long after the heal every replica had applied what the most
    /// advanced one had at the heal, ms; `None` if not within
    /// [`CONVERGE_MAX`] (or the run ended first).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub converged_ms: Option<u64>,
}

/// The longest [`run`] waits for the replicas to catch up after a heal.
pub const CONVERGE_MAX: Duration = Duration::from_secs(30);

/// What the nemesis hurts: a cluster, the links between its replicas, and
/// their small disks if they have them.
pub struct Victims<'a> {
    /// The cluster.
    pub cluster: &'a Mutex<ProcessCluster>,
    /// Its links.
    pub links: &'a Links,
    /// Its replicas' disks, for `disk-full`.
    pub disks: Option<&'a SmallDisks>,
    /// Its replicas' clocks, for `clock`.
    pub clocks: Option<&'a Clocks>,
    /// Its replicas' ids.
    pub replicas: &'a [u64],
}

/// Carries out `drawn` (times after `start`) against `victims`, each
/// lane's faults one after another, until done or `stop`; what happened,
/// in order of start. Every link is up and every replica running when it
/// returns.
pub fn run(victims: &Victims<'_>, drawn: &[Drawn], (start, stop): (Instant, &AtomicBool)) -> Vec<Window> {
    let lanes: BTreeSet<usize> = drawn.iter().map(|d| d.lane).collect();
    // Replicas under a process fault (pause, kill, full disk): another
    // lane's process fault picks someone else.
    let busy = Mutex::new(BTreeSet::new());
    let windows = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for lane in lanes {
            let (busy, windows) = (&busy, &windows);
            scope.spawn(move || {
                // A fault's owner on the links: its place in the schedule.
                for (owner, d) in drawn.iter().enumerate().filter(|(_, d)| d.lane == lane) {
                    if !sleep_until(start + d.at, stop) {
                        break;
                    }
                    let w = one(victims, busy, (owner as u64 + 1, d), (start, stop));
                    windows.lock().unwrap_or_else(|p| p.into_inner()).push(w);
                }
            });
        }
    });
    victims.links.heal();
    let mut windows = windows.into_inner().unwrap_or_else(|p| p.into_inner());
    windows.sort_by(|a, b| a.start_s.total_cmp(&b.start_s));
    windows
}

/// Carries out one fault: applies it, holds it, heals it, and waits for
/// the replicas to catch up.
fn one(
    victims: &Victims<'_>,
    busy: &Mutex<BTreeSet<u64>>,
    (owner, d): (u64, &Drawn),
    clock: (Instant, &AtomicBool),
) -> Window {
    let (start, stop) = clock;
    let started = start.elapsed().as_secs_f64();
    let applied = match victims.cluster.lock() {
        Ok(mut cluster) => apply(&mut cluster, victims, busy, owner, &d.step),
        Err(_) => Err("the cluster's lock is poisoned".to_string()),
    };
    let what = applied.as_ref().map_or_else(|e| format!("{:?}", d.step) + ": " + e, |h| h.what.clone());
    let _ = sleep_until(start + d.at + d.hold, stop);
    let healed = match applied {
        Ok(h) => heal(victims, busy, owner, h.undo),
        Err(e) => Err(e),
    };
    let end_s = start.elapsed().as_secs_f64();
    let (what, error, converged_ms) = match healed {
        Ok(outcome) => (what + &outcome, None, converge(victims.cluster, stop)),
        Err(e) => (what, Some(e), None),
    };
    Window { kind: d.step.kind(), what, start_s: started, end_s, error, converged_ms }
}

/// What a heal undoes besides the fault's links.
enum Undo {
    Links,
    Resume(u64),
    Restart(u64),
    Empty(u64),
    Clock(u64),
}

struct Applied {
    what: String,
    undo: Undo,
}

fn apply(
    cluster: &mut ProcessCluster,
    victims: &Victims<'_>,
    busy: &Mutex<BTreeSet<u64>>,
    owner: u64,
    step: &Step,
) -> Result<Applied, String> {
    let (links, replicas) = (victims.links, victims.replicas);
    // Whether a fault hit the leader is what its cost depends on: said
    // even of a replica drawn by id.
    let leader = cluster.leader();
    let who = |id: u64| if leader == Some(id) { " (leader)".to_string() } else { String::new() };
    // No leader known (an election under way, another fault's doing):
    // the fault still happens, to the first replica.
    let resolve = |t: Target| match (t, leader) {
        (Target::Replica(id), _) | (Target::Leader, Some(id)) => Ok::<_, String>((id, who(id))),
        (Target::Leader, None) => {
            replicas.first().map(|&id| (id, " (no leader known)".to_string())).ok_or_else(|| "no replicas".to_string())
        }
    };
    let applied = |what: String, undo| Ok(Applied { what, undo });
    match step {
        Step::Isolate(t) => {
            let (id, who) = resolve(*t)?;
            cut(links, owner, &[id], replicas);
            applied(format!("isolate {id}{who}"), Undo::Links)
        }
        Step::Split(minority) => {
            cut(links, owner, minority, replicas);
            applied(format!("split {minority:?} from the rest"), Undo::Links)
        }
        Step::Bridge { bridge, left, right } => {
            cut(links, owner, left, right);
            applied(format!("bridge: {left:?} and {right:?} meet only through {bridge}{}", who(*bridge)), Undo::Links)
        }
        Step::Ring { order, reach } => {
            ring(links, owner, order, *reach);
            applied(format!("ring {order:?}, each reaching {reach} either side"), Undo::Links)
        }
        Step::OneWay(from, to) => {
            let ((from, fw), (mut to, mut tw)) = (resolve(*from)?, resolve(*to)?);
            if from == to {
                // The leader drawn is the replica drawn: another one.
                to = replicas.iter().copied().find(|&r| r != from).ok_or("one replica: no link")?;
                tw = String::new();
            }
            links.add(owner, from, to, Fault::Held);
            applied(format!("hold {from}{fw} -> {to}{tw}"), Undo::Links)
        }
        Step::Reset(a, b) => {
            let n = links.reset(*a, *b);
            applied(format!("reset {n} connections between {a} and {b}"), Undo::Links)
        }
        Step::Delay(id, ms) => {
            let delay = Fault::Delay(Duration::from_millis(*ms));
            for &other in replicas.iter().filter(|&&o| o != *id) {
                links.add(owner, *id, other, delay);
                links.add(owner, other, *id, delay);
            }
            applied(format!("delay {id} by {ms} ms"), Undo::Links)
        }
        // One fault at a time pauses, kills, fills or moves the clock of
        // a replica.
        Step::Pause(t) | Step::Kill(t) | Step::FillDisk(t) | Step::Clock(t, _) => {
            let (id, who) = take(busy, resolve(*t)?, replicas, leader)?;
            let done = hurt(cluster, victims, step, id)
                .map(|(verb, undo)| Applied { what: format!("{verb} {id}{who}"), undo });
            if done.is_err() {
                release(busy, id);
            }
            done
        }
    }
}

/// Marks `wanted` busy, or the first replica that is not if another lane
/// has it (with its label redone); an error if every replica is busy.
fn take(
    busy: &Mutex<BTreeSet<u64>>,
    wanted: (u64, String),
    replicas: &[u64],
    leader: Option<u64>,
) -> Result<(u64, String), String> {
    let mut busy = busy.lock().unwrap_or_else(|p| p.into_inner());
    let id = std::iter::once(wanted.0)
        .chain(replicas.iter().copied())
        .find(|id| !busy.contains(id))
        .ok_or("every replica is under another fault")?;
    busy.insert(id);
    let who = if id == wanted.0 {
        wanted.1
    } else if leader == Some(id) {
        " (leader)".into()
    } else {
        String::new()
    };
    Ok((id, who))
}

fn release(busy: &Mutex<BTreeSet<u64>>, id: u64) {
    busy.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
}

/// Pauses, kills, fills the disk of or moves the clock of replica `id`:
/// what it did and what its heal undoes.
fn hurt(cluster: &mut ProcessCluster, victims: &Victims<'_>, step: &Step, id: u64) -> Result<(String, Undo), String> {
    let done = |verb: &str, undo| (verb.to_string(), undo);
    match step {
        Step::Pause(_) => {
            cluster.signal(id, "STOP").map(|_| done("pause", Undo::Resume(id))).map_err(|e| e.to_string())
        }
        Step::Kill(_) => cluster.kill(id).map(|_| done("kill", Undo::Restart(id))).map_err(|e| e.to_string()),
        Step::Clock(_, offset) => {
            let clocks = victims.clocks.ok_or("the replicas do not run on clocks of their own")?;
            clocks.set(id, *offset).map_err(|e| e.to_string())?;
            Ok((format!("move by {offset:+} s the clock of"), Undo::Clock(id)))
        }
        _ => {
            let disks = victims.disks.ok_or("the replicas have no small disks to fill")?;
            disks.fill(id).map_err(|e| format!("cannot fill the disk of {id}: {e}"))?;
            Ok(done("fill the disk of", Undo::Empty(id)))
        }
    }
}

/// Holds every link between a replica of `side` and one of `others` (not
/// in `side`), both ways.
fn cut(links: &Links, owner: u64, side: &[u64], others: &[u64]) {
    for &a in side {
        for &b in others.iter().filter(|b| !side.contains(b)) {
            links.add(owner, a, b, Fault::Held);
            links.add(owner, b, a, Fault::Held);
        }
    }
}

/// Holds the links between replicas more than `reach` places apart on the
/// ring `order`.
fn ring(links: &Links, owner: u64, order: &[u64], reach: usize) {
    let n = order.len();
    for (i, &a) in order.iter().enumerate() {
        for (j, &b) in order.iter().enumerate() {
            let apart = i.abs_diff(j).min(n - i.abs_diff(j));
            if apart > reach {
                links.add(owner, a, b, Fault::Held);
            }
        }
    }
}

/// Heals a fault: its links, and what `undo` says; what the heal found
/// (a full disk's replica stopped, and why), for the window.
fn heal(victims: &Victims<'_>, busy: &Mutex<BTreeSet<u64>>, owner: u64, undo: Undo) -> Result<String, String> {
    victims.links.lift(owner);
    let mut cluster = victims.cluster.lock().map_err(|_| "the cluster's lock is poisoned".to_string())?;
    let done = match undo {
        Undo::Links => return Ok(String::new()),
        Undo::Resume(id) => (id, cluster.signal(id, "CONT").map(|_| String::new()).map_err(|e| e.to_string())),
        Undo::Restart(id) => (id, cluster.restart(id).map(|_| String::new()).map_err(|e| e.to_string())),
        Undo::Empty(id) => (id, refill(&mut cluster, victims.disks, id)),
        Undo::Clock(id) => {
            let clocks = victims.clocks.ok_or("no clocks")?;
            (id, clocks.set(id, 0).map(|_| ": back on time".to_string()).map_err(|e| e.to_string()))
        }
    };
    release(busy, done.0);
    done.1
}

/// Empties replica `id`'s disk and, if the full disk stopped it, restarts
/// it: how it stopped.
fn refill(cluster: &mut ProcessCluster, disks: Option<&SmallDisks>, id: u64) -> Result<String, String> {
    disks.ok_or("no small disks")?.empty(id).map_err(|e| format!("cannot empty the disk of {id}: {e}"))?;
    let Some(status) = cluster.exit_of(id) else {
        // Its log files grow in preallocated steps: writes that fit in
        // the last step succeed on a full disk.
        return Ok(": it carried on (what it wrote fit in space allocated before)".into());
    };
    let why = cluster.last_error(id).unwrap_or_else(|| crate::launch::describe_exit(status));
    cluster.restart(id).map_err(|e| e.to_string())?;
    Ok(format!(": it stopped ({why}) and was restarted"))
}

/// How long until every replica has applied what the most advanced one
/// had applied now, ms; `None` past [`CONVERGE_MAX`] or once `stop` is
/// set.
fn converge(cluster: &Mutex<ProcessCluster>, stop: &AtomicBool) -> Option<u64> {
    let healed = Instant::now();
    let (addrs, admin) = {
        let cluster = cluster.lock().ok()?;
        (cluster.addrs().to_vec(), cluster.user(crate::launch::ADMIN_USER))
    };
    let probe = Probe::new(&addrs).ok()?.as_user(admin);
    let timeout = Duration::from_millis(500);
    let applied = |p: &Probe| p.statuses(timeout).into_iter().map(|s| s.ok().map(|s| s.applied)).collect::<Vec<_>>();
    let target = applied(&probe).into_iter().flatten().max()?;
    while healed.elapsed() < CONVERGE_MAX && !stop.load(Ordering::SeqCst) {
        if applied(&probe).iter().all(|a| a.is_some_and(|a| a >= target)) {
            return Some(healed.elapsed().as_millis() as u64);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
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
        assert_eq!(plan.lanes, 2, "several kinds also come together");
        let horizon = Duration::from_secs(300);
        let five = [1, 2, 3, 4, 5];
        let a = schedule(&plan, &five, horizon);
        assert_eq!(a, schedule(&plan, &five, horizon), "the same seed, the same schedule");
        assert_ne!(a, schedule(&Plan::new(Kind::ALL.to_vec(), 43), &five, horizon));
        for lane in 0..2 {
            let mine: Vec<&Drawn> = a.iter().filter(|d| d.lane == lane).collect();
            // Dealt like cards: each round of seven has every kind.
            let first: BTreeSet<Kind> = mine.iter().take(Kind::ALL.len()).map(|d| d.step.kind()).collect();
            assert_eq!(first.len(), Kind::ALL.len(), "lane {lane}: {mine:?}");
            for w in mine.windows(2) {
                assert!(w[0].at + w[0].hold < w[1].at, "a lane's faults do not overlap: {w:?}");
            }
        }
        let overlap = a.windows(2).any(|w| w[1].at < w[0].at + w[0].hold);
        assert!(overlap, "two lanes overlap somewhere in five minutes");
        assert!(a.windows(2).all(|w| w[0].at <= w[1].at), "in order of start");
        assert!(a.iter().all(|d| d.at + d.hold <= horizon));
        let only = schedule(&Plan::new(vec![Kind::Pause], 7), &[1, 2, 3], horizon);
        assert!(!only.is_empty() && only.iter().all(|d| d.step.kind() == Kind::Pause && d.lane == 0));
    }

    #[test]
    fn partitions_take_every_shape_their_cluster_allows() {
        let shapes = |replicas: &[u64]| {
            let plan = Plan::new(vec![Kind::Partition], 9);
            let drawn = schedule(&plan, replicas, Duration::from_secs(600));
            let mut seen = BTreeSet::new();
            for d in drawn {
                match d.step {
                    Step::Isolate(_) => seen.insert("isolate"),
                    Step::Split(minority) => {
                        assert_eq!(minority.len(), (replicas.len() - 1) / 2, "a minority: {minority:?}");
                        seen.insert("split")
                    }
                    Step::Bridge { bridge, left, right } => {
                        assert!(!left.is_empty() && !right.is_empty() && !left.contains(&bridge));
                        assert_eq!(left.len() + right.len() + 1, replicas.len());
                        seen.insert("bridge")
                    }
                    Step::Ring { order, reach } => {
                        assert_eq!(order.len(), replicas.len());
                        assert!(2 * reach + 1 > replicas.len() / 2, "each sees a majority: {reach}");
                        seen.insert("ring")
                    }
                    other => panic!("not a partition: {other:?}"),
                };
            }
            seen.into_iter().collect::<Vec<_>>()
        };
        assert_eq!(shapes(&[1, 2]), ["isolate"]);
        assert_eq!(shapes(&[1, 2, 3]), ["bridge", "isolate"]);
        assert_eq!(shapes(&[1, 2, 3, 4, 5]), ["bridge", "isolate", "ring", "split"]);
    }

    #[test]
    fn a_busy_replica_passes_a_process_fault_to_the_next_free_one() {
        let busy = Mutex::new(BTreeSet::from([2]));
        assert_eq!(take(&busy, (1, " (leader)".into()), &[1, 2, 3], Some(1)).unwrap(), (1, " (leader)".into()));
        assert_eq!(take(&busy, (2, String::new()), &[1, 2, 3], Some(1)).unwrap(), (3, String::new()));
        assert!(take(&busy, (1, String::new()), &[1, 2, 3], Some(1)).is_err(), "all three busy");
        release(&busy, 1);
        assert_eq!(take(&busy, (3, String::new()), &[1, 2, 3], Some(1)).unwrap(), (1, " (leader)".into()));
    }
}
