//! Bounds on guessing: per source address, attempts after a failure come
//! one at a time, each after a delay that doubles with every failure
//! ([`FIRST_DELAY`] up to [`MOST_DELAY`]); over all sources, password
//! hashes are computed at most [`HASHES_PER_SECOND`] a second (with a
//! burst of [`HASH_BURST`]), so guessing cannot take the replica's CPU.
//!
//! Decisions only, with the time passed in: the caller sleeps the delays,
//! and tests step through them by hand.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// Delay after a source's first failure.
pub const FIRST_DELAY: Duration = Duration::from_millis(100);
/// Longest delay between two attempts of a failing source.
pub const MOST_DELAY: Duration = Duration::from_secs(10);
/// An attempt that would wait longer than this is refused at once (the
/// source has many attempts queued already).
pub const WAIT_MAX: Duration = Duration::from_secs(30);
/// A source that has not failed for this long is forgotten.
pub const FORGET_AFTER: Duration = Duration::from_secs(600);
/// Sources remembered at most (the oldest failure is forgotten first).
pub const SOURCES_MAX: usize = 4096;
/// Password hashes computed per second, over all sources, in the long run.
pub const HASHES_PER_SECOND: u32 = 20;
/// Password hashes that may be computed at once after a quiet while (a
/// cluster's clients all connecting at start).
pub const HASH_BURST: u32 = 128;

#[derive(Clone, Copy, Debug)]
struct Source {
    failures: u32,
    /// When its next attempt may be checked.
    next: Instant,
    last_failure: Instant,
}

/// Failed attempts per source and the budget of hashes. See the module
/// documentation.
#[derive(Debug)]
pub struct Attempts {
    sources: HashMap<IpAddr, Source>,
    /// Hashes that may be computed now (a token bucket), and when it was
    /// last filled.
    tokens: f64,
    filled: Instant,
}

fn delay(failures: u32) -> Duration {
    match failures {
        0 => Duration::ZERO,
        n => FIRST_DELAY.saturating_mul(1 << (n - 1).min(16)).min(MOST_DELAY),
    }
}

impl Attempts {
    /// Nothing failed yet; the hash budget full at `now`.
    pub fn new(now: Instant) -> Self {
        Self { sources: HashMap::new(), tokens: f64::from(HASH_BURST), filled: now }
    }

    /// An attempt from `source` at `now`: how long it must wait before it
    /// is checked, or None if it would wait more than [`WAIT_MAX`].
    pub fn admit(&mut self, source: IpAddr, now: Instant) -> Option<Duration> {
        let Some(s) = self.sources.get_mut(&source) else { return Some(Duration::ZERO) };
        let slot = s.next.max(now);
        let wait = slot - now;
        if wait > WAIT_MAX {
            return None;
        }
        // The attempts of a failing source take turns.
        s.next = slot + delay(s.failures);
        Some(wait)
    }

    /// Takes one hash from the budget at `now`; false if it is spent.
    pub fn take_hash(&mut self, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.filled).as_secs_f64();
        self.tokens = (self.tokens + elapsed * f64::from(HASHES_PER_SECOND)).min(f64::from(HASH_BURST));
        self.filled = now;
        if self.tokens < 1.0 {
            return false;
        }
        self.tokens -= 1.0;
        true
    }

    /// `source` failed at `now`.
    pub fn failed(&mut self, source: IpAddr, now: Instant) {
        if !self.sources.contains_key(&source) {
            self.make_room(now);
        }
        let s = self.sources.entry(source).or_insert(Source { failures: 0, next: now, last_failure: now });
        s.failures = s.failures.saturating_add(1);
        s.last_failure = now;
        s.next = s.next.max(now + delay(s.failures));
    }

    /// `source` succeeded: its failures are forgotten.
    pub fn succeeded(&mut self, source: IpAddr) {
        self.sources.remove(&source);
    }

    /// Failures remembered for `source`.
    pub fn failures(&self, source: IpAddr) -> u32 {
        self.sources.get(&source).map_or(0, |s| s.failures)
    }

    /// Sources remembered.
    pub fn sources(&self) -> usize {
        self.sources.len()
    }

    fn make_room(&mut self, now: Instant) {
        if self.sources.len() < SOURCES_MAX {
            return;
        }
        self.sources.retain(|_, s| now.saturating_duration_since(s.last_failure) < FORGET_AFTER);
        if self.sources.len() >= SOURCES_MAX {
            let oldest = self.sources.iter().min_by_key(|(_, s)| s.last_failure).map(|(ip, _)| *ip);
            if let Some(ip) = oldest {
                self.sources.remove(&ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn ip(n: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(10, 0, 0, n))
    }

    #[test]
    fn a_failing_source_waits_longer_after_every_failure() {
        let t0 = Instant::now();
        let mut a = Attempts::new(t0);
        assert_eq!(a.admit(ip(1), t0), Some(Duration::ZERO));
        let mut now = t0;
        let mut waits = Vec::new();
        for _ in 0..9 {
            a.failed(ip(1), now);
            let wait = a.admit(ip(1), now).unwrap();
            waits.push(wait);
            now += wait;
        }
        let ms: Vec<u128> = waits.iter().map(Duration::as_millis).collect();
        assert_eq!(ms, [100, 200, 400, 800, 1600, 3200, 6400, 10000, 10000]);
        // Another source is not slowed down.
        assert_eq!(a.admit(ip(2), now), Some(Duration::ZERO));
        a.succeeded(ip(1));
        assert_eq!(a.admit(ip(1), now), Some(Duration::ZERO));
    }

    #[test]
    fn attempts_of_a_failing_source_take_turns_and_a_long_queue_is_refused() {
        let t0 = Instant::now();
        let mut a = Attempts::new(t0);
        for _ in 0..4 {
            a.failed(ip(1), t0);
        }
        // Each attempt begun at once waits one more delay (800 ms).
        let waits: Vec<_> = (0..40).map_while(|_| a.admit(ip(1), t0)).collect();
        assert!(waits.windows(2).all(|w| w[1] == w[0] + Duration::from_millis(800)), "{waits:?}");
        assert!(*waits.last().unwrap() <= WAIT_MAX && waits.len() < 40, "{}", waits.len());
    }

    #[test]
    fn the_hash_budget_refills_at_its_rate() {
        let t0 = Instant::now();
        let mut a = Attempts::new(t0);
        let burst = (0..1000).take_while(|_| a.take_hash(t0)).count();
        assert_eq!(burst, HASH_BURST as usize);
        assert!(!a.take_hash(t0));
        let later = t0 + Duration::from_secs(1);
        let refilled = (0..1000).take_while(|_| a.take_hash(later)).count();
        assert_eq!(refilled, HASHES_PER_SECOND as usize);
    }

    #[test]
    fn sources_are_bounded_forgetting_the_oldest() {
        let t0 = Instant::now();
        let mut a = Attempts::new(t0);
        for i in 0..SOURCES_MAX as u32 + 10 {
            let addr = IpAddr::V4(Ipv4Addr::from(i));
            a.failed(addr, t0 + Duration::from_millis(u64::from(i)));
        }
        assert_eq!(a.sources(), SOURCES_MAX);
        assert_eq!(a.failures(IpAddr::V4(Ipv4Addr::from(0))), 0, "the oldest is forgotten");
        assert_eq!(a.failures(IpAddr::V4(Ipv4Addr::from(SOURCES_MAX as u32 + 9))), 1);
    }
}
