//! Early scheduling with work stealing (000 §6.2), in four steps:
//!
//! * `early-ws-queue` (000 Alg. 6-8): a worker whose queue is empty steals;
//!   sequential classes synchronize at barriers as in `early`.
//! * `early-ws-semi` (000 Alg. 9-11): a thread that arrives at a
//!   sequential command before the others also steals, work free of the
//!   classes that conflict with that command, until the last thread has
//!   arrived and executed it; then they all meet at the class barrier.
//! * `early-ws-nonblocking` (000 Alg. 12-13): the same without any barrier:
//!   the threads of a sequential class meet on two-cycle counters
//!   ([`crate::CycleCounters`]), and the waiters steal until the reset.
//! * `early-ws-optimistic` (000 Alg. 14): `early-ws-nonblocking` whose
//!   stealers first check a victim's steal conditions on lock-free hints
//!   and take its lock only when the check passes, then check again under
//!   the lock. Stealers no longer queue up on the locks of victims that
//!   have nothing to give, which is most of them most of the time; the
//!   victims need those locks to take their own work.
//!
//! Each worker has a *ready* queue, filled by the scheduler, and an *exec*
//! batch it is working through. A worker moves its whole ready queue to its
//! exec batch at once. A worker that finds its ready queue empty tries to
//! steal: it takes the concurrent commands at the front of a victim's
//! ready queue, up to its first sequential command (000 takes the whole
//! queue and only when it holds no sequential command; see
//! [`WsQueue::try_steal`](crate::WsQueue::try_steal)), but only when the
//! batch the victim is executing holds no sequential command
//! (`exec_flag`), and it raises the victim's `marker` for itself until the
//! stolen commands have executed.
//!
//! Why this keeps the order of conflicting commands: concurrent commands
//! never conflict with each other (R.3), and a sequential command that
//! conflicts with a stolen concurrent one has every thread of the
//! concurrent class among its own (R.4), the victim included. So it sits in
//! the victim's queue too: before the stolen ones (then the flags forbid the
//! steal) or after them, and then the victim waits until its markers are
//! down before it takes part in that command. 000 Alg. 8 makes only the
//! class's lowest thread wait (lines 14-16); psmr makes every thread of the
//! class wait for its own stealers, which is what the safety argument of
//! §6.2.1.1 needs when the victim is not the lowest thread.
//!
//! In the three variants that steal while they synchronize, that wait for
//! the markers is part of the synchronization and the thread steals during
//! it too, under the same condition (no class conflicting with the
//! sequential command's). Without that, a thread could wait for a stealer
//! that is stuck on work only the waiting thread is free to run; stolen
//! work is concurrent, never synchronizes, and so never waits in turn.
//!
//! Waiting follows [`crate::SchedConfig::spin`]: spin, then yield, then
//! nap, polling between steps, and back to spinning after each steal. The
//! workers, their queues and their meetings are those of every early
//! scheduler ([`crate::early`]); this module holds what stealing adds.
//!
//! The queue protocol lives in [`WsQueue`](crate::WsQueue) and is
//! model-checked with loom in `tests/loom_steal.rs` (idle stealing,
//! markers, flags) and `tests/loom_semi.rs` (stealing while waiting on
//! two-cycle counters, with and without a conflicting class).

use crate::early::{execute_entry, Shared};
use crate::metrics::WorkerCounters;
use crate::sync::{AdaptiveSpin, Naps, Signal};
use crate::SchedError;
use psmr_model::{ClassModel, Service};
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// How a stealer picks its victims (000 §6.2.2.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Victims {
    /// By id, from the smallest.
    #[default]
    First,
    /// From a random id (per-worker generator seeded by the worker id), then
    /// in id order.
    Random,
    /// From the id after the stealer's, wrapping around (the thesis's
    /// "smart" choice: stealers start at different victims).
    Next,
}

impl Victims {
    /// The name accepted by `FromStr`.
    pub fn name(self) -> &'static str {
        match self {
            Victims::First => "first",
            Victims::Random => "random",
            Victims::Next => "next",
        }
    }
}

impl fmt::Display for Victims {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Victims {
    type Err = SchedError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [Victims::First, Victims::Random, Victims::Next]
            .into_iter()
            .find(|v| v.name() == s)
            .ok_or_else(|| SchedError::Config(format!("unknown victim policy {s:?} (known: first, random, next)")))
    }
}

/// A worker's own state: its id, where it starts looking for victims and
/// its cycle bit per class (000 Alg. 13 `cycles`).
pub(crate) struct Thief {
    pub(crate) me: usize,
    rng: u64,
    pub(crate) cycles: Vec<usize>,
    pub(crate) backoff: StealBackoff,
    /// The spin budget of its waits for other threads.
    pub(crate) spin: AdaptiveSpin,
    /// The spin budget of its waits for work (at most 200 rounds: the
    /// scheduler thread sends work per batch, far apart).
    pub(crate) idle: AdaptiveSpin,
}

impl Thief {
    pub(crate) fn new(me: usize, classes: usize, spin: u32, retry_max: Duration) -> Self {
        // Seeded by the worker id: victim choice changes timing, never
        // results.
        Self {
            me,
            rng: 0x9E37_79B9_7F4A_7C15u64 ^ (me as u64 + 1),
            cycles: vec![0; classes],
            backoff: StealBackoff::new(retry_max),
            spin: AdaptiveSpin::new(spin),
            idle: AdaptiveSpin::new(spin.min(200)),
        }
    }

    fn start(&mut self, victims: Victims, workers: usize) -> usize {
        match victims {
            Victims::First => 0,
            Victims::Next => (self.me + 1) % workers,
            Victims::Random => {
                self.rng ^= self.rng << 13;
                self.rng ^= self.rng >> 7;
                self.rng ^= self.rng << 17;
                (self.rng % workers as u64) as usize
            }
        }
    }
}

/// Tries each victim once, in the order of the victim policy, skipping
/// those whose hints say no when stealing optimistically; executes the
/// first haul. Returns `None` if it stole nothing, else the nanoseconds
/// spent executing the haul (0 unless metrics are timed), which are not
/// idle time for a worker that steals while it waits.
pub(crate) fn steal_once<S: Service>(thief: &mut Thief, shared: &Shared<S>, avoid: &[u64]) -> Option<u64> {
    let stealing = shared.stealing.as_ref()?;
    let (me, n) = (thief.me, shared.queues.len());
    let counters = shared.metrics.worker(me);
    let start = thief.start(stealing.victims, n);
    for v in victim_order(me, n, start) {
        WorkerCounters::add(&counters.steals_tried, 1);
        let victim = &shared.queues[v];
        if stealing.optimistic && !victim.may_steal(avoid) {
            continue;
        }
        if let Some(entries) = victim.try_steal_avoiding(me, avoid) {
            let began = shared.clock();
            for d in &entries {
                execute_entry(thief, v, d, shared);
                d.done(&shared.credits, v);
            }
            victim.steal_done(me);
            WorkerCounters::add(&counters.steals_ok, 1);
            return Some(began.map_or(0, |t| t.elapsed().as_nanos() as u64));
        }
    }
    None
}

/// The first pause after a fruitless steal round.
pub const STEAL_RETRY_FIRST: Duration = Duration::from_micros(4);
/// The longest pause between fruitless steal rounds, by default
/// ([`crate::SchedConfig::steal_retry_max`]).
pub const STEAL_RETRY_MAX: Duration = Duration::from_millis(32);

/// When a worker may try to steal again: after a fruitless round it
/// leaves the victims alone for [`STEAL_RETRY_FIRST`], then twice as long
/// after each further one, up to [`STEAL_RETRY_MAX`]; a steal that
/// succeeds starts over.
///
/// Why: a steal chance appears when a victim's ready queue holds
/// concurrent work and the batch it executes holds no sequential command.
/// Where batches carry sequential commands (most of a kv store's write
/// mix) that almost never holds, and a stealer that retried whenever a
/// hint said "ready" tried 146 million times in 5 s for one success,
/// taking victims' locks and the cores their owners needed. A round costs
/// a lock per victim, about a microsecond when contended, so retrying
/// after 4 µs at first keeps a stealer that does find work as quick as
/// before (a free worker gets the next concurrent run within a few
/// rounds), and the doubling bounds fruitless rounds to about
/// log2(32 ms / 4 µs) = 13 plus one per 32 ms: about 30 a second per
/// worker where stealing never pays, instead of millions.
#[derive(Debug)]
pub(crate) struct StealBackoff {
    pause: Duration,
    max: Duration,
    not_before: Option<std::time::Instant>,
}

impl StealBackoff {
    /// Pauses of at most `max` (zero: none).
    pub(crate) fn new(max: Duration) -> Self {
        Self { pause: STEAL_RETRY_FIRST.min(max), max, not_before: None }
    }

    /// Whether the pause after the last fruitless round is over.
    pub(crate) fn may_try(&self) -> bool {
        self.not_before.map_or(true, |t| std::time::Instant::now() >= t)
    }

    /// The round found nothing: pause, longer each time.
    pub(crate) fn failed(&mut self) {
        if self.max.is_zero() {
            return;
        }
        self.not_before = Some(std::time::Instant::now() + self.pause);
        self.pause = (self.pause * 2).min(self.max);
    }

    /// The round stole: the next may come at once.
    pub(crate) fn succeeded(&mut self) {
        *self = Self::new(self.max);
    }

    /// How long a sleeping stealer may nap at most: until its next
    /// round is due, and never less than `floor`.
    pub(crate) fn nap_cap(&self, floor: Duration) -> Duration {
        self.pause.max(floor)
    }
}

/// A steal round ([`steal_once`]) if `thief`'s backoff allows one.
pub(crate) fn steal_round<S: Service>(thief: &mut Thief, shared: &Shared<S>, avoid: &[u64]) -> Option<u64> {
    if !thief.backoff.may_try() {
        return None;
    }
    let stolen = steal_once(thief, shared, avoid);
    match stolen {
        Some(_) => thief.backoff.succeeded(),
        None => thief.backoff.failed(),
    }
    stolen
}

/// Waits until `done` holds, stealing work free of the classes in `avoid`
/// meanwhile (000 Alg. 11 and 13), as often as `thief`'s backoff allows;
/// between rounds it spins, yields, then naps on `signal`, which whoever
/// makes `done` true notifies. A chance to steal wakes nobody, so the
/// naps end by themselves, and it tries again; where the cores are
/// contended they start longer (every nap that ends without a
/// notification costs a wake-up on a core other threads are queued for),
/// but they still end: the stealing is what gets the threads out when
/// the others wait for work only this one is free to run (000 Alg. 11;
/// `tests/stealing.rs` stages it). Returns the nanoseconds spent
/// executing stolen work.
pub(crate) fn steal_until<S: Service>(
    thief: &mut Thief,
    shared: &Shared<S>,
    avoid: &[u64],
    signal: &Signal,
    done: impl Fn() -> bool,
) -> u64 {
    let mut busy = 0;
    let contended = crate::cpus::contended();
    let mut patience = thief.spin.patience_if(contended);
    let first = if contended { Duration::from_micros(256) } else { Duration::from_micros(8) };
    while !done() && !signal.abandoned() {
        match steal_round(thief, shared, avoid) {
            Some(ns) => {
                busy += ns;
                patience.reset();
            }
            None => {
                // A chance to steal wakes nobody: nap until the next round
                // is due (`done` still ends a nap at once).
                let naps = Naps::Capped { first, cap: thief.backoff.nap_cap(first) };
                patience.snooze(signal, naps, &done);
            }
        }
    }
    thief.spin.learn(&patience);
    busy
}

/// The classes that conflict with `class`, as a bit set: what a thread
/// waiting for a command of `class` must not steal.
pub(crate) fn conflicting(model: &ClassModel, class: psmr_model::ClassId) -> Vec<u64> {
    let mut set = vec![0u64; model.len().div_ceil(64)];
    for other in model.class_ids().filter(|&o| model.conflicts(class, o)) {
        set[other.index() / 64] |= 1 << (other.index() % 64);
    }
    set
}

/// The order in which stealer `me` visits victims, starting at `start`.
fn victim_order(me: usize, workers: usize, start: usize) -> impl Iterator<Item = usize> {
    (0..workers).map(move |i| (start + i) % workers).filter(move |&v| v != me)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn fruitless_steal_rounds_pause_twice_as_long_each_time_up_to_the_cap() {
        let mut b = StealBackoff::new(STEAL_RETRY_MAX);
        assert!(b.may_try(), "the first round goes at once");
        let mut rounds = 0;
        while b.pause < STEAL_RETRY_MAX {
            let before = b.pause;
            b.failed();
            assert!(b.not_before.is_some());
            assert_eq!(b.pause, (before * 2).min(STEAL_RETRY_MAX));
            rounds += 1;
        }
        // 4 µs doubled 13 times is past 32 ms.
        assert_eq!(rounds, 13);
        b.failed();
        assert_eq!(b.pause, STEAL_RETRY_MAX, "capped");
        assert_eq!(b.nap_cap(Duration::from_millis(1)), STEAL_RETRY_MAX);
        b.succeeded();
        assert!(b.may_try(), "a steal starts over");
        assert_eq!(b.pause, STEAL_RETRY_FIRST);
        assert_eq!(b.nap_cap(Duration::from_millis(1)), Duration::from_millis(1));
    }

    #[test]
    fn victims_are_visited_once_each_and_never_the_stealer() {
        let order: Vec<usize> = victim_order(2, 4, 3).collect();
        assert_eq!(order, vec![3, 0, 1]);
        let mut thief = Thief::new(1, 0, 0, STEAL_RETRY_MAX);
        assert_eq!(thief.start(Victims::First, 4), 0);
        assert_eq!(thief.start(Victims::Next, 4), 2);
        for _ in 0..10 {
            assert!(thief.start(Victims::Random, 4) < 4);
        }
    }
}
