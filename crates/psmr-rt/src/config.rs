//! What a pool is made of: its policy, its stealing, what a full local
//! queue does, and how each is named on a command line.

use crate::RtError;
use std::fmt;
use std::str::FromStr;

/// Most workers of one pool.
pub const WORKERS_MAX: usize = 1024;

/// Largest local queue capacity.
pub const CAPACITY_MAX: usize = 1 << 20;

/// The order in which a worker takes the tasks of its own queue (001
/// §4.3, §5.3.3). Thieves always take the oldest.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Policy {
    /// Each worker a FIFO queue: the oldest task first (latency).
    Fifo,
    /// Each worker a stack: the newest task first (locality, §4.3.1).
    Lifo,
    /// FIFO, plus a one-task slot holding the task the worker spawned or
    /// woke last, run next (tokio's LIFO slot). The slot cannot be stolen,
    /// and at most [`SLOT_BUDGET`](crate::SLOT_BUDGET) slot tasks run in a
    /// row, so that two tasks feeding each other cannot starve the queue.
    FifoSlot,
    /// LIFO, and every `n` tasks as many FIFO removals as the stack holds
    /// then (§5.3.3 "reverse"): nothing lingers at the bottom for long.
    LifoReverse(u32),
    /// LIFO and FIFO removals in turn (§5.3.3 "alternating").
    LifoAlternate,
    /// LIFO, with a FIFO removal (a steal from itself) with probability
    /// `p` (§5.3.3 "stochastic self-steal").
    LifoStochastic(f64),
}

impl Policy {
    /// The policies with no parameter, and each heuristic with its
    /// default: what `psmr rt-bench` runs by default.
    pub const ALL: [Policy; 6] = [
        Policy::Fifo,
        Policy::Lifo,
        Policy::FifoSlot,
        Policy::LifoReverse(256),
        Policy::LifoAlternate,
        Policy::LifoStochastic(0.2),
    ];

    /// Whether the local queue is a stack.
    pub fn is_lifo(self) -> bool {
        !matches!(self, Policy::Fifo | Policy::FifoSlot)
    }

    /// Whether a worker runs the task it queued last before the older ones
    /// it queued: from its slot (`fifo-slot`) or the top of its stack (the
    /// LIFO policies, on their LIFO turns). Only `fifo` runs the oldest
    /// first.
    pub fn runs_newest_first(self) -> bool {
        self != Policy::Fifo
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Policy::Fifo => f.write_str("fifo"),
            Policy::Lifo => f.write_str("lifo"),
            Policy::FifoSlot => f.write_str("fifo-slot"),
            Policy::LifoReverse(n) => write!(f, "lifo-reverse:{n}"),
            Policy::LifoAlternate => f.write_str("lifo-alternate"),
            Policy::LifoStochastic(p) => write!(f, "lifo-stochastic:{p}"),
        }
    }
}

impl FromStr for Policy {
    type Err = RtError;

    /// `fifo`, `lifo`, `fifo-slot`, `lifo-reverse[:N]` (256),
    /// `lifo-alternate`, `lifo-stochastic[:P]` (0.2).
    fn from_str(s: &str) -> Result<Self, RtError> {
        let bad = |why: &str| RtError::Parse { what: "policy", value: s.to_string(), why: why.to_string() };
        let (name, arg) = s.trim().split_once(':').map_or((s.trim(), None), |(n, a)| (n, Some(a)));
        let policy = match (name, arg) {
            ("fifo", None) => Policy::Fifo,
            ("lifo", None) => Policy::Lifo,
            ("fifo-slot", None) => Policy::FifoSlot,
            ("lifo-alternate", None) => Policy::LifoAlternate,
            ("lifo-reverse", None) => Policy::LifoReverse(256),
            ("lifo-reverse", Some(n)) => match n.parse() {
                Ok(n) if n >= 1 => Policy::LifoReverse(n),
                _ => return Err(bad("lifo-reverse:N takes a whole number N >= 1")),
            },
            ("lifo-stochastic", None) => Policy::LifoStochastic(0.2),
            ("lifo-stochastic", Some(p)) => match p.parse::<f64>() {
                Ok(p) if (0.0..=1.0).contains(&p) => Policy::LifoStochastic(p),
                _ => return Err(bad("lifo-stochastic:P takes a probability 0 <= P <= 1")),
            },
            _ => {
                return Err(bad("known: fifo, lifo, fifo-slot, lifo-reverse[:N], lifo-alternate, lifo-stochastic[:P]"))
            }
        };
        Ok(policy)
    }
}

/// How much a thief takes from a victim (001 §5.6).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Steal {
    /// Half of the victim's tasks, one of them run at once: stolen tasks
    /// spread in hops. With `Full::Overflow` no more than the thief's
    /// queue holds; from the injector crossbeam-deque's batch (at most 32).
    Half,
    /// One task (Domainslib's).
    One,
}

impl fmt::Display for Steal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Steal::Half => "half",
            Steal::One => "one",
        })
    }
}

impl FromStr for Steal {
    type Err = RtError;

    fn from_str(s: &str) -> Result<Self, RtError> {
        match s.trim() {
            "half" => Ok(Steal::Half),
            "one" => Ok(Steal::One),
            _ => Err(RtError::Parse { what: "steal", value: s.into(), why: "half or one".into() }),
        }
    }
}

/// Whom a thief tries (001 §5.3.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Victims {
    /// Every other worker, from a random one on.
    Random,
    /// Only the `k` nearest workers in the ring (`+1, -1, +2, -2, ...`),
    /// from a random one of them on: less contention on hot queues.
    Neighbourhood(usize),
}

impl fmt::Display for Victims {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Victims::Random => f.write_str("random"),
            Victims::Neighbourhood(k) => write!(f, "neighbourhood:{k}"),
        }
    }
}

impl FromStr for Victims {
    type Err = RtError;

    /// `random` or `neighbourhood:K` (`neighborhood` too).
    fn from_str(s: &str) -> Result<Self, RtError> {
        let bad =
            || RtError::Parse { what: "victims", value: s.into(), why: "random or neighbourhood:K (K >= 1)".into() };
        match s.trim().split_once(':') {
            None if s.trim() == "random" => Ok(Victims::Random),
            Some(("neighbourhood" | "neighborhood", k)) => match k.parse() {
                Ok(k) if k >= 1 => Ok(Victims::Neighbourhood(k)),
                _ => Err(bad()),
            },
            _ => Err(bad()),
        }
    }
}

/// What an insertion into a full local queue does (001 §4.5.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Full {
    /// Half of the queue, the oldest tasks, goes to the pool's shared
    /// injector first (tokio's and Go's overflow).
    Overflow,
    /// The queue grows: the spawner never pays for distribution, thieves
    /// do.
    Resize,
}

impl fmt::Display for Full {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Full::Overflow => "overflow",
            Full::Resize => "resize",
        })
    }
}

impl FromStr for Full {
    type Err = RtError;

    fn from_str(s: &str) -> Result<Self, RtError> {
        match s.trim() {
            "overflow" => Ok(Full::Overflow),
            "resize" => Ok(Full::Resize),
            _ => Err(RtError::Parse { what: "full", value: s.into(), why: "overflow or resize".into() }),
        }
    }
}

/// A pool's settings.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolConfig {
    /// Its name: its threads are `rt-NAME-I` (at most 15 bytes in all, as
    /// Linux keeps them), and other pools reach it by it.
    pub name: String,
    /// Worker threads.
    pub workers: usize,
    /// The order of each worker's own tasks.
    pub policy: Policy,
    /// How much a thief takes.
    pub steal: Steal,
    /// Whom a thief tries.
    pub victims: Victims,
    /// Tasks a local queue holds before it is full.
    pub capacity: usize,
    /// What a full local queue does.
    pub full: Full,
    /// Seed of the workers' random choices (victims, self-steals).
    pub seed: u64,
}

impl PoolConfig {
    /// A pool called `name` with `workers` workers and the defaults:
    /// `fifo`, steal half from random victims, local queues of 256 that
    /// overflow.
    pub fn new(name: &str, workers: usize) -> Self {
        Self {
            name: name.to_string(),
            workers,
            policy: Policy::Fifo,
            steal: Steal::Half,
            victims: Victims::Random,
            capacity: 256,
            full: Full::Overflow,
            seed: 0x5eed,
        }
    }

    /// Checks the ranges.
    pub fn validate(&self) -> Result<(), RtError> {
        let bad = |why: String| Err(RtError::Config { pool: self.name.clone(), why });
        if self.name.is_empty() || self.name.len() > 8 || !self.name.bytes().all(|b| b.is_ascii_graphic()) {
            return bad("a pool's name is 1 to 8 printable ASCII characters".into());
        }
        if !(1..=WORKERS_MAX).contains(&self.workers) {
            return bad(format!("workers must be between 1 and {WORKERS_MAX}, got {}", self.workers));
        }
        if !(2..=CAPACITY_MAX).contains(&self.capacity) {
            return bad(format!("capacity must be between 2 and {CAPACITY_MAX}, got {}", self.capacity));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_bad_ones_are_refused() {
        for p in Policy::ALL {
            assert_eq!(p.to_string().parse::<Policy>().unwrap(), p);
        }
        assert_eq!("lifo-reverse".parse::<Policy>().unwrap(), Policy::LifoReverse(256));
        for bad in ["lifo-reverse:0", "lifo-stochastic:2", "fifo:3", "stack", ""] {
            assert!(bad.parse::<Policy>().is_err(), "{bad}");
        }
        assert_eq!("neighborhood:4".parse::<Victims>().unwrap(), Victims::Neighbourhood(4));
        assert!("neighbourhood:0".parse::<Victims>().is_err());
        assert_eq!("one".parse::<Steal>().unwrap(), Steal::One);
        assert_eq!("resize".parse::<Full>().unwrap().to_string(), "resize");
        assert!(PoolConfig::new("cpu", 2).validate().is_ok());
        assert!(PoolConfig::new("much-too-long", 2).validate().is_err());
        assert!(PoolConfig::new("cpu", 0).validate().is_err());
        assert!(PoolConfig { capacity: 1, ..PoolConfig::new("cpu", 1) }.validate().is_err());
    }
}
