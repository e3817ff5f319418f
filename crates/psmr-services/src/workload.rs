//! Workload parameters shared by both services, and the draws that turn them
//! into a reproducible sequence of command kinds.

use psmr_model::ClientId;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::fmt;
use std::str::FromStr;
use thiserror::Error;

/// Most shards a workload, class model or mapping may have. Each shard is two
/// classes, and a bound keeps per-shard tables small.
pub const SHARDS_MAX: usize = 1024;

/// Largest key space of the key-value store. Every key is created up front,
/// at about 100 bytes each (a small key and an 8-byte value, each in its
/// own allocation), so this bounds the store to under 2 GiB.
pub const KEYS_MAX: u64 = 1 << 24;

/// Invalid workload parameters. Every message names the parameter and the
/// values it accepts.
#[derive(Clone, Debug, Error, PartialEq)]
pub enum WorkloadError {
    /// The shard count is out of range.
    #[error("shards must be in 1..={max}, got {0}", max = SHARDS_MAX)]
    Shards(usize),
    /// The skew is not a fraction.
    #[error("skew must be in 0..=1 (share of local operations sent to the first shard), got {0}")]
    Skew(f64),
    /// The key space is empty or too large.
    #[error("keys must be in 1..={max}, got {0}", max = KEYS_MAX)]
    Keys(u64),
    /// No client to send the commands.
    #[error("clients must be at least 1, got 0")]
    Clients,
    /// The list size is out of range.
    #[error("list size must be in 1..={max}, got {0}", max = crate::list::LIST_SIZE_MAX)]
    ListSize(usize),
    /// A percentage of the mix is outside `0..=100`.
    #[error("{name} must be a percentage in 0..=100, got {value}")]
    Percent {
        /// Which percentage.
        name: &'static str,
        /// Its value.
        value: f64,
    },
    /// Local writes and global operations add up to more than everything.
    #[error("local writes α ({local_write_pct}%) plus global operations β ({global_pct}%) exceed 100%; α + β must be at most 100")]
    MixSum {
        /// α.
        local_write_pct: f64,
        /// β.
        global_pct: f64,
    },
    /// A mix that is not three percentages.
    #[error("malformed workload {0:?}: expected α-β-γ, three percentages in 0..=100 such as 25-5-25")]
    MixFormat(String),
    /// A name that is none of the known ones.
    #[error("unknown {what} {name:?} (valid: {valid})")]
    UnknownName {
        /// What was being named (cost, spread, model).
        what: &'static str,
        /// The name given.
        name: String,
        /// The valid names, comma-separated.
        valid: &'static str,
    },
    /// The model cannot express global writes.
    #[error("model {model} has no global writes: γ must be 0 when β > 0, got γ = {global_write_pct}")]
    NoGlobalWrites {
        /// The model.
        model: &'static str,
        /// γ.
        global_write_pct: f64,
    },
    /// The service has no global operations.
    #[error("the key-value store has no global operations: β must be 0, got {0}")]
    NoGlobalOps(f64),
    /// A generated operation that the class model refuses: a bug of the
    /// generator, reported rather than hidden.
    #[error("the workload generator drew an operation its class model refuses: {0}")]
    Access(#[from] crate::kv::AccessError),
    /// The skew targets shards that own no key of the key space.
    #[error("skew {skew} sends commands to {target}, but none of the {keys} keys maps there with {shards} shards; use more keys or skew 0")]
    SkewUnreachable {
        /// The skew.
        skew: f64,
        /// `the first shard` or `the other shards`.
        target: &'static str,
        /// Size of the key space.
        keys: u64,
        /// Shard count.
        shards: usize,
    },
}

/// Execution cost of a command (003 §6.2): how much work one command does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Cost {
    /// Almost no work: scheduling overhead dominates.
    #[default]
    Light,
    /// About the cost of scanning a 1 000-entry linked list.
    Moderate,
    /// About the cost of scanning a 10 000-entry linked list.
    Heavy,
}

impl Cost {
    /// Every cost, cheapest first.
    pub const ALL: [Cost; 3] = [Cost::Light, Cost::Moderate, Cost::Heavy];

    /// The name accepted by `FromStr` and printed by `Display`.
    pub fn name(self) -> &'static str {
        match self {
            Cost::Light => "light",
            Cost::Moderate => "moderate",
            Cost::Heavy => "heavy",
        }
    }

    /// Entries per shard of the linked list with this cost: 1, 1 000 and
    /// 10 000, as in 003 §6.2. (000 §5.4 uses ten times more; pass an
    /// explicit list size for that.)
    pub fn list_size(self) -> usize {
        match self {
            Cost::Light => 1,
            Cost::Moderate => 1_000,
            Cost::Heavy => 10_000,
        }
    }
}

impl fmt::Display for Cost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Cost {
    type Err = WorkloadError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Cost::ALL.into_iter().find(|c| c.name() == s).ok_or_else(|| WorkloadError::UnknownName {
            what: "cost",
            name: s.to_string(),
            valid: "light, moderate, heavy",
        })
    }
}

/// How conflicting commands are placed among concurrent ones (000 §7.1).
///
/// A command is *conflicting* when it is a local write or a global operation
/// (what the early scheduler synchronizes) and *concurrent* when it is a
/// local read. Both spreads give the same ratio `p = (α + β) / 100`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Spread {
    /// Evenly spaced: position `i` is conflicting when `⌊(i+1)·p⌋ > ⌊i·p⌋`
    /// (error diffusion), so every window of `w` commands holds `⌊w·p⌋` or
    /// `⌈w·p⌉` conflicting ones. Computed in integers: exact, not drifting.
    #[default]
    Uniform,
    /// Gaps between conflicting commands drawn i.i.d. from the discretized
    /// exponential distribution with mean `1/p`. Flooring an exponential
    /// variate gives a geometric one, and geometric gaps are the same as
    /// deciding each position independently with probability `p`, which is
    /// how it is drawn (in integers, so the stream is portable). The ratio
    /// holds on average, but concurrent commands come in long runs (run
    /// lengths are unbounded, with mean `1/p - 1`), the workload 000 §7.1
    /// measures work stealing with.
    Exponential,
}

impl Spread {
    /// The name accepted by `FromStr` and printed by `Display`.
    pub fn name(self) -> &'static str {
        match self {
            Spread::Uniform => "uniform",
            Spread::Exponential => "exponential",
        }
    }
}

impl fmt::Display for Spread {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Spread {
    type Err = WorkloadError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [Spread::Uniform, Spread::Exponential].into_iter().find(|c| c.name() == s).ok_or_else(|| {
            WorkloadError::UnknownName { what: "spread", name: s.to_string(), valid: "uniform, exponential" }
        })
    }
}

/// The α-β-γ workload notation of 000 §5.4.
///
/// α% of the commands are local writes, β% are global operations (on every
/// shard), γ% of the global operations are global writes, and the remaining
/// `100 - α - β`% are local reads. `25-5-25` is 25% local writes, 5% global
/// operations of which a quarter write, and 70% local reads.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct Mix {
    /// α: percentage of local writes.
    pub local_write_pct: f64,
    /// β: percentage of global operations.
    pub global_pct: f64,
    /// γ: percentage of global operations that write.
    pub global_write_pct: f64,
}

impl Mix {
    /// `pct-0-0`: `pct`% writes, the rest reads, nothing global.
    pub fn writes(pct: f64) -> Mix {
        Mix { local_write_pct: pct, global_pct: 0.0, global_write_pct: 0.0 }
    }

    /// Checks that each percentage is in `0..=100` and that `α + β <= 100`.
    pub fn validate(&self) -> Result<(), WorkloadError> {
        let parts = [
            ("local write percentage α", self.local_write_pct),
            ("global operation percentage β", self.global_pct),
            ("global write percentage γ", self.global_write_pct),
        ];
        for (name, value) in parts {
            // `contains` is false for NaN, so NaN is rejected here too.
            if !(0.0..=100.0).contains(&value) {
                return Err(WorkloadError::Percent { name, value });
            }
        }
        if self.local_write_pct + self.global_pct > 100.0 {
            return Err(WorkloadError::MixSum { local_write_pct: self.local_write_pct, global_pct: self.global_pct });
        }
        Ok(())
    }
}

impl fmt::Display for Mix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}-{}", self.local_write_pct, self.global_pct, self.global_write_pct)
    }
}

impl FromStr for Mix {
    type Err = WorkloadError;

    /// Parses `α-β-γ`, e.g. `25-5-25` or `12.5-0-0`, and validates it.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let malformed = || WorkloadError::MixFormat(s.to_string());
        let parts: Vec<&str> = s.trim().split('-').map(str::trim).collect();
        let [a, b, g] = parts.as_slice() else { return Err(malformed()) };
        // Only plain decimals: `f64::from_str` would also take "inf", "NaN"
        // and exponents, which no one means by a percentage.
        let num = |p: &str| {
            let plain = !p.is_empty() && p.chars().all(|c| c.is_ascii_digit() || c == '.');
            plain.then(|| p.parse::<f64>().ok()).flatten().ok_or_else(malformed)
        };
        let mix = Mix { local_write_pct: num(a)?, global_pct: num(b)?, global_write_pct: num(g)? };
        mix.validate()?;
        Ok(mix)
    }
}

/// Everything a workload generator needs besides the service-specific
/// model (and, for the list, its size).
#[derive(Clone, Debug, PartialEq)]
pub struct WorkloadConfig {
    /// Number of commands to generate.
    pub commands: usize,
    /// Seed of the generator: the same configuration always gives the same
    /// commands.
    pub seed: u64,
    /// Shards of the list, or of the key space for the sharded kv model
    /// (`1..=SHARDS_MAX`).
    pub shards: usize,
    /// Share of local operations sent to the first shard (`0..=1`); the
    /// others are spread evenly over the other shards. 0 means balanced:
    /// every shard equally likely. Ignored with one shard.
    pub skew: f64,
    /// Share of local *writes* sent to the first shard, when it differs
    /// from `skew` (which then applies to local reads only): 003 §6.5
    /// Workload 3 sends 67% of writes but 33% of reads to shard 1. `None`:
    /// writes follow `skew`. 0 means balanced, as for `skew`.
    pub write_skew: Option<f64>,
    /// How conflicting commands are placed among concurrent ones.
    pub spread: Spread,
    /// The α-β-γ mix.
    pub mix: Mix,
    /// Size of the kv key space (`1..=KEYS_MAX`); keys are
    /// [`crate::kv::key_bytes`]`(0..keys)`, the numbers in decimal.
    pub keys: u64,
    /// Client ids the commands are spread over, round robin (at least 1).
    /// Command `j` comes from client `j % clients` with sequence number
    /// `j / clients + 1`.
    pub clients: u64,
}

impl Default for WorkloadConfig {
    fn default() -> Self {
        Self {
            commands: 100_000,
            seed: 1,
            shards: 1,
            skew: 0.0,
            write_skew: None,
            spread: Spread::Uniform,
            mix: Mix::default(),
            keys: 100_000,
            clients: 64,
        }
    }
}

impl WorkloadConfig {
    /// Checks every parameter against its documented range.
    pub fn validate(&self) -> Result<(), WorkloadError> {
        if !(1..=SHARDS_MAX).contains(&self.shards) {
            return Err(WorkloadError::Shards(self.shards));
        }
        for skew in [Some(self.skew), self.write_skew].into_iter().flatten() {
            if !(0.0..=1.0).contains(&skew) {
                return Err(WorkloadError::Skew(skew));
            }
        }
        if !(1..=KEYS_MAX).contains(&self.keys) {
            return Err(WorkloadError::Keys(self.keys));
        }
        if self.clients == 0 {
            return Err(WorkloadError::Clients);
        }
        self.mix.validate()
    }

    /// Client and sequence number of command `index`.
    pub(crate) fn ids(&self, index: usize) -> (ClientId, u64) {
        let j = index as u64;
        (ClientId(j % self.clients), j / self.clients + 1)
    }
}

/// What a generated command does, before the service picks its operands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    LocalRead,
    LocalWrite,
    GlobalRead,
    GlobalWrite,
}

/// Fixed-point denominator of the conflicting ratio: percentages keep
/// seven decimals, which is more than anyone types.
const RATIO_DEN: u64 = 1_000_000_000;

/// The random draws common to both generators, in a fixed order per
/// command so that a seed always replays the same workload.
pub(crate) struct Draws {
    pub(crate) rng: ChaCha8Rng,
    spread: Spread,
    /// `p` in units of `1 / RATIO_DEN`.
    ratio: u64,
    position: u64,
    alpha: f64,
    beta: f64,
    beta_gamma: f64,
    shards: usize,
    skew: f64,
    write_skew: f64,
}

impl Draws {
    /// Draws for a validated configuration.
    pub(crate) fn new(cfg: &WorkloadConfig) -> Self {
        let m = cfg.mix;
        let pct = m.local_write_pct + m.global_pct;
        Self {
            rng: ChaCha8Rng::seed_from_u64(cfg.seed),
            spread: cfg.spread,
            ratio: ((pct / 100.0) * RATIO_DEN as f64).round() as u64,
            position: 0,
            alpha: m.local_write_pct,
            beta: m.global_pct,
            beta_gamma: m.global_pct * m.global_write_pct / 100.0,
            shards: cfg.shards,
            skew: cfg.skew,
            write_skew: cfg.write_skew.unwrap_or(cfg.skew),
        }
    }

    /// The kind of the next command.
    pub(crate) fn kind(&mut self) -> Kind {
        let i = u128::from(self.position);
        self.position += 1;
        let conflicting = match self.spread {
            Spread::Uniform => {
                let (r, d) = (u128::from(self.ratio), u128::from(RATIO_DEN));
                (i + 1) * r / d > i * r / d
            }
            Spread::Exponential => self.rng.gen_range(0..RATIO_DEN) < self.ratio,
        };
        if !conflicting {
            return Kind::LocalRead;
        }
        // α : β·γ : β·(1-γ), drawn over α + β so the three parts sum to one.
        let u = self.rng.gen::<f64>() * (self.alpha + self.beta);
        if u < self.alpha {
            Kind::LocalWrite
        } else if u < self.alpha + self.beta_gamma {
            Kind::GlobalWrite
        } else {
            Kind::GlobalRead
        }
    }

    /// The skew that applies to a local read (`write == false`) or write.
    pub(crate) fn skew(&self, write: bool) -> f64 {
        if write {
            self.write_skew
        } else {
            self.skew
        }
    }

    /// A shard for a local read or write: the first with probability
    /// [`Draws::skew`], otherwise one of the others uniformly; uniform over
    /// all when that skew is 0.
    pub(crate) fn local_shard(&mut self, write: bool) -> usize {
        if self.shards <= 1 {
            0
        } else if self.skew(write) > 0.0 {
            if self.picks_first_shard(write) {
                0
            } else {
                1 + self.rng.gen_range(0..self.shards - 1)
            }
        } else {
            self.rng.gen_range(0..self.shards)
        }
    }

    /// Whether a skewed draw goes to the first shard. Only for `shards > 1`
    /// and a skew above 0.
    pub(crate) fn picks_first_shard(&mut self, write: bool) -> bool {
        self.rng.gen::<f64>() < self.skew(write)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mix(s: &str) -> Result<Mix, WorkloadError> {
        s.parse()
    }

    #[test]
    fn mix_parses_alpha_beta_gamma() {
        let m = mix("25-5-25").unwrap();
        assert_eq!(m, Mix { local_write_pct: 25.0, global_pct: 5.0, global_write_pct: 25.0 });
        assert_eq!(mix(" 12.5 - 0 - 100 ").unwrap().local_write_pct, 12.5);
        assert_eq!(mix(&m.to_string()).unwrap(), m);
        assert_eq!(Mix::writes(30.0).to_string(), "30-0-0");
    }

    #[test]
    fn malformed_mixes_are_rejected_with_clear_messages() {
        for bad in ["25-5", "a-b-c", "25-5-25-1", "", "25--5", "-5-0-0", "inf-0-0", "NaN-0-0", "1e2-0-0"] {
            let e = mix(bad).unwrap_err();
            assert_eq!(e, WorkloadError::MixFormat(bad.to_string()), "{bad:?}");
            assert!(e.to_string().contains("expected α-β-γ"), "{e}");
        }
        let e = mix("101-0-0").unwrap_err();
        assert_eq!(e.to_string(), "local write percentage α must be a percentage in 0..=100, got 101");
        assert!(mix("0-0-100.5").unwrap_err().to_string().starts_with("global write percentage γ"));
        let e = mix("60-50-0").unwrap_err();
        assert!(matches!(e, WorkloadError::MixSum { .. }));
        assert!(e.to_string().contains("α + β must be at most 100"), "{e}");
    }

    #[test]
    fn names_round_trip_and_unknown_names_list_the_valid_ones() {
        for c in Cost::ALL {
            assert_eq!(c.to_string().parse::<Cost>(), Ok(c));
        }
        for s in [Spread::Uniform, Spread::Exponential] {
            assert_eq!(s.to_string().parse::<Spread>(), Ok(s));
        }
        assert_eq!(Cost::Moderate.list_size(), 1_000);
        let e = "medium".parse::<Cost>().unwrap_err();
        assert_eq!(e.to_string(), "unknown cost \"medium\" (valid: light, moderate, heavy)");
        assert!("poisson".parse::<Spread>().unwrap_err().to_string().contains("uniform, exponential"));
    }

    #[test]
    fn invalid_configs_name_the_parameter_and_its_range() {
        let ok = WorkloadConfig::default();
        assert_eq!(ok.validate(), Ok(()));
        let check = |cfg: WorkloadConfig, want: &str| {
            let e = cfg.validate().unwrap_err().to_string();
            assert!(e.contains(want), "{e:?} should contain {want:?}");
        };
        check(WorkloadConfig { shards: 0, ..ok.clone() }, "shards must be in 1..=1024, got 0");
        check(WorkloadConfig { shards: SHARDS_MAX + 1, ..ok.clone() }, "shards must be in 1..=1024");
        check(WorkloadConfig { skew: 1.5, ..ok.clone() }, "skew must be in 0..=1");
        check(WorkloadConfig { skew: f64::NAN, ..ok.clone() }, "skew must be in 0..=1");
        check(WorkloadConfig { keys: 0, ..ok.clone() }, "keys must be in 1..=");
        check(WorkloadConfig { clients: 0, ..ok.clone() }, "clients must be at least 1");
        let mix = Mix { local_write_pct: 120.0, ..Mix::default() };
        check(WorkloadConfig { mix, ..ok.clone() }, "α must be a percentage in 0..=100, got 120");
    }

    #[test]
    fn commands_go_round_robin_over_clients() {
        let cfg = WorkloadConfig { clients: 3, ..WorkloadConfig::default() };
        let ids: Vec<_> = (0..7).map(|j| cfg.ids(j)).collect();
        assert_eq!(ids[0], (ClientId(0), 1));
        assert_eq!(ids[2], (ClientId(2), 1));
        assert_eq!(ids[3], (ClientId(0), 2));
        assert_eq!(ids[6], (ClientId(0), 3));
    }

    fn kinds(spread: Spread, mix: &str, n: usize, seed: u64) -> Vec<Kind> {
        let cfg = WorkloadConfig { spread, mix: mix.parse().unwrap(), seed, ..WorkloadConfig::default() };
        let mut d = Draws::new(&cfg);
        (0..n).map(|_| d.kind()).collect()
    }

    fn conflicting(k: &Kind) -> bool {
        *k != Kind::LocalRead
    }

    fn longest_read_run(ks: &[Kind]) -> usize {
        ks.split(conflicting).map(<[Kind]>::len).max().unwrap_or(0)
    }

    #[test]
    fn uniform_spread_has_the_exact_ratio_in_every_window() {
        for (m, p) in [("25-0-0", 0.25), ("10-5-50", 0.15), ("33.3-0-0", 0.333), ("0-0-0", 0.0), ("100-0-0", 1.0)] {
            let ks = kinds(Spread::Uniform, m, 10_000, 7);
            for w in [1usize, 7, 20, 100, 1000] {
                for win in ks.windows(w).step_by(13) {
                    let c = win.iter().filter(|k| conflicting(k)).count() as f64;
                    let want = w as f64 * p;
                    assert!(c >= want.floor() - 1e-9 && c <= want.ceil() + 1e-9, "{m}: window {w} has {c}");
                }
            }
        }
    }

    #[test]
    fn exponential_spread_keeps_the_ratio_on_average_with_longer_runs() {
        let n = 100_000;
        let ks = kinds(Spread::Exponential, "20-5-50", n, 3);
        let c = ks.iter().filter(|k| conflicting(k)).count() as f64 / n as f64;
        // Binomial standard deviation is about 0.0014 here.
        assert!((c - 0.25).abs() < 0.01, "ratio {c}");
        let uniform = kinds(Spread::Uniform, "20-5-50", n, 3);
        assert_eq!(longest_read_run(&uniform), 3);
        assert!(longest_read_run(&ks) > 20, "longest run {}", longest_read_run(&ks));
    }

    #[test]
    fn conflicting_kinds_follow_alpha_to_beta_gamma() {
        let n = 100_000;
        let ks = kinds(Spread::Uniform, "30-20-25", n, 11);
        let share = |kind| ks.iter().filter(|&&k| k == kind).count() as f64 / n as f64;
        assert!((share(Kind::LocalRead) - 0.50).abs() < 1e-9);
        assert!((share(Kind::LocalWrite) - 0.30).abs() < 0.01);
        assert!((share(Kind::GlobalWrite) - 0.05).abs() < 0.005);
        assert!((share(Kind::GlobalRead) - 0.15).abs() < 0.01);
    }

    #[test]
    fn skew_sends_the_given_share_to_the_first_shard() {
        let n = 50_000;
        for (shards, skew) in [(2usize, 0.8), (4, 0.5), (4, 0.0), (3, 1.0), (1, 0.5)] {
            let cfg = WorkloadConfig { shards, skew, ..WorkloadConfig::default() };
            let mut d = Draws::new(&cfg);
            let mut counts = vec![0usize; shards];
            for _ in 0..n {
                counts[d.local_shard(false)] += 1;
            }
            let first = if shards == 1 {
                1.0
            } else if skew == 0.0 {
                1.0 / shards as f64
            } else {
                skew
            };
            let rest = if shards == 1 { 0.0 } else { (1.0 - first) / (shards - 1) as f64 };
            for (i, &c) in counts.iter().enumerate() {
                let want = if i == 0 { first } else { rest };
                assert!((c as f64 / n as f64 - want).abs() < 0.01, "{shards} shards skew {skew}: {counts:?}");
            }
        }
    }

    #[test]
    fn write_skew_applies_to_writes_only() {
        let n = 50_000;
        let cfg = WorkloadConfig { shards: 2, skew: 0.33, write_skew: Some(0.67), ..WorkloadConfig::default() };
        let mut d = Draws::new(&cfg);
        let share = |d: &mut Draws, write| (0..n).filter(|_| d.local_shard(write) == 0).count() as f64 / n as f64;
        assert!((share(&mut d, false) - 0.33).abs() < 0.01);
        assert!((share(&mut d, true) - 0.67).abs() < 0.01);
        let balanced_writes = WorkloadConfig { write_skew: Some(0.0), ..cfg.clone() };
        assert!((share(&mut Draws::new(&balanced_writes), true) - 0.5).abs() < 0.01);
        let bad = WorkloadConfig { write_skew: Some(1.5), ..cfg };
        assert!(matches!(bad.validate(), Err(WorkloadError::Skew(s)) if s == 1.5));
    }
}
