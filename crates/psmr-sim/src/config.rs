//! What a simulation runs: its faults and its settings.

use crate::outcome::SimError;
use psmr_core::bug::Bug;
use serde::Serialize;
use std::fmt;

/// Which fault kinds a run injects (see the module documentation).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Faults {
    /// Packets are lost.
    pub loss: bool,
    /// Some packets take far longer.
    pub delay: bool,
    /// Packets arrive twice.
    pub duplicate: bool,
    /// Packets of one link overtake each other.
    pub reorder: bool,
    /// Symmetric partitions between replicas.
    pub partition: bool,
    /// One-way partitions.
    pub one_way: bool,
    /// Replicas crash and restart from their disk.
    pub crash: bool,
    /// Crashes in the middle of a ready.
    pub torn: bool,
    /// Replicas' ticks run at different rates.
    pub skew: bool,
    /// Replicas join and leave the cluster.
    pub membership: bool,
    /// A replica's disk fills up for a while.
    pub disk_full: bool,
    /// A crashed replica's log loses synced entries; it is repaired.
    pub damage: bool,
    /// A replica's process stops for a while, then goes on where it was.
    pub pause: bool,
}

impl Faults {
    /// The names [`Faults::parse`] takes, in order.
    pub const NAMES: [&'static str; 13] = [
        "loss",
        "delay",
        "duplicate",
        "reorder",
        "partition",
        "one-way",
        "crash",
        "torn",
        "skew",
        "membership",
        "disk-full",
        "damage",
        "pause",
    ];

    /// Every fault kind.
    pub fn all() -> Self {
        Self {
            loss: true,
            delay: true,
            duplicate: true,
            reorder: true,
            partition: true,
            one_way: true,
            crash: true,
            torn: true,
            skew: true,
            membership: true,
            disk_full: true,
            damage: true,
            pause: true,
        }
    }

    /// No fault at all.
    pub fn none() -> Self {
        Self::default()
    }

    fn flag(&mut self, name: &str) -> Option<&mut bool> {
        Some(match name {
            "loss" => &mut self.loss,
            "delay" => &mut self.delay,
            "duplicate" | "dup" => &mut self.duplicate,
            "reorder" => &mut self.reorder,
            "partition" => &mut self.partition,
            "one-way" | "oneway" => &mut self.one_way,
            "crash" => &mut self.crash,
            "torn" => &mut self.torn,
            "skew" => &mut self.skew,
            "membership" => &mut self.membership,
            "disk-full" => &mut self.disk_full,
            "damage" => &mut self.damage,
            "pause" => &mut self.pause,
            _ => return None,
        })
    }

    /// `all`, `none`, or a comma-separated list of [`Faults::NAMES`].
    pub fn parse(text: &str) -> Result<Self, SimError> {
        match text.trim() {
            "all" => return Ok(Self::all()),
            "none" | "" => return Ok(Self::none()),
            _ => {}
        }
        let mut f = Self::none();
        for name in text.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            *f.flag(name).ok_or_else(|| SimError::Faults(name.to_string()))? = true;
        }
        Ok(f)
    }

    /// The kinds switched on, comma-separated (`none` if none is).
    pub fn names(&self) -> String {
        let mut copy = *self;
        let on: Vec<&str> = Self::NAMES.iter().copied().filter(|n| copy.flag(n).is_some_and(|f| *f)).collect();
        if on.is_empty() {
            "none".into()
        } else if on.len() == Self::NAMES.len() {
            "all".into()
        } else {
            on.join(",")
        }
    }
}

impl fmt::Display for Faults {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.names())
    }
}

/// What to simulate.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// Replicas; 0 draws 3 or 5 from the seed.
    pub replicas: usize,
    /// Clients.
    pub clients: usize,
    /// Keys the clients read and write (few: conflicts).
    pub keys: u64,
    /// Simulated milliseconds of load with faults.
    pub steps: u64,
    /// Longest quiet phase after the load, in simulated milliseconds.
    pub quiet_ms: u64,
    /// Fault kinds injected.
    pub faults: Faults,
    /// Reads through the log (`Some(true)`), without it with raft's
    /// ReadIndex as leaders serve them by default (`Some(false)`, see
    /// `crate::reads`), or either, drawn per seed (`None`).
    pub reads_through_log: Option<bool>,
    /// A bug to inject (testing aid).
    pub bug: Option<Bug>,
    /// Keep the trace as text ([`SimOutcome::trace`](crate::SimOutcome::trace)).
    pub trace: bool,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            replicas: 0,
            clients: 4,
            keys: 4,
            steps: 2_000,
            quiet_ms: 10_000,
            faults: Faults::all(),
            reads_through_log: None,
            bug: None,
            trace: false,
        }
    }
}

impl SimConfig {
    /// Checks the bounds.
    pub fn validate(&self) -> Result<(), SimError> {
        if self.replicas > 9 {
            return Err(SimError::Config(format!("{} replicas: at most 9", self.replicas)));
        }
        if !(1..=64).contains(&self.clients) {
            return Err(SimError::Config(format!("{} clients: between 1 and 64", self.clients)));
        }
        if !(1..=1_000).contains(&self.keys) {
            return Err(SimError::Config(format!("{} keys: between 1 and 1000", self.keys)));
        }
        if self.steps > 3_600_000 || self.quiet_ms > 3_600_000 {
            return Err(SimError::Config("steps and quiet_ms: at most an hour of simulated time".into()));
        }
        Ok(())
    }
}
