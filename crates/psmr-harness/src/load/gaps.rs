//! When a cluster answered nothing: requests completed in each tick of
//! [`TICK`] since a load's start (warm-up included), counted by every
//! client, and the longest stretch without one within a stretch of time
//! (how long a fault left the clients without answers).

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// The resolution of the count.
pub const TICK: Duration = Duration::from_millis(10);

/// See the module documentation. Bounded by the load's length: an hour
/// (the longest load) is 360 000 ticks, 1.4 MB.
pub struct Completions {
    start: Instant,
    ticks: Vec<AtomicU32>,
}

impl Completions {
    /// Counts for a load of `length` from `start`.
    pub fn new(start: Instant, length: Duration) -> Self {
        let n = (length.as_millis() / TICK.as_millis()) as usize + 2;
        Self { start, ticks: (0..n).map(|_| AtomicU32::new(0)).collect() }
    }

    /// A request completed at `done` (one past the end counts in the last
    /// tick).
    pub fn record(&self, done: Instant) {
        let i = (done.saturating_duration_since(self.start).as_millis() / TICK.as_millis()) as usize;
        self.ticks[i.min(self.ticks.len() - 1)].fetch_add(1, Ordering::Relaxed);
    }

    /// The counts, tick by tick.
    pub fn counts(&self) -> Vec<u32> {
        self.ticks.iter().map(|t| t.load(Ordering::Relaxed)).collect()
    }
}

/// The longest run of ticks of `counts` with no request completed that
/// overlaps `from..to` (offsets from the load's start), in whole ticks; a
/// run that starts before `from` or ends after `to` counts whole, since
/// the clients waited all of it.
pub fn longest_gap(counts: &[u32], from: Duration, to: Duration) -> Duration {
    let tick = |d: Duration| (d.as_millis() / TICK.as_millis()) as usize;
    let (lo, hi) = (tick(from), tick(to).min(counts.len().saturating_sub(1)));
    let (mut best, mut run_start) = (0, None);
    for (i, &c) in counts.iter().enumerate() {
        match (c, run_start) {
            (0, None) => run_start = Some(i),
            (0, Some(_)) => {}
            (_, Some(s)) => {
                if i > lo && s <= hi {
                    best = best.max(i - s);
                }
                run_start = None;
            }
            (_, None) => {}
        }
        if i > hi && run_start.is_none() {
            break;
        }
    }
    if let Some(s) = run_start.filter(|&s| s <= hi) {
        best = best.max(counts.len() - s);
    }
    TICK * best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn the_longest_silence_overlapping_the_stretch_counts_whole() {
        //            0  1  2  3  4  5  6  7  8  9
        let counts = [5, 0, 0, 3, 0, 0, 0, 0, 2, 1];
        assert_eq!(longest_gap(&counts, ms(0), ms(90)), ms(40));
        assert_eq!(longest_gap(&counts, ms(0), ms(20)), ms(20), "ticks 1-2 only");
        assert_eq!(longest_gap(&counts, ms(70), ms(90)), ms(40), "4-7 started before, counts whole");
        assert_eq!(longest_gap(&counts, ms(80), ms(90)), ms(0), "answers throughout");
        assert_eq!(longest_gap(&[1, 0, 0], ms(0), ms(10)), ms(20), "silent to the end");
    }

    #[test]
    fn completions_fall_in_their_tick() {
        let start = Instant::now();
        let c = Completions::new(start, ms(100));
        c.record(start + ms(5));
        c.record(start + ms(15));
        c.record(start + ms(17));
        c.record(start + ms(10_000));
        let counts = c.counts();
        assert_eq!((counts[0], counts[1], *counts.last().unwrap()), (1, 2, 1));
        assert_eq!(counts.len(), 12);
    }
}
