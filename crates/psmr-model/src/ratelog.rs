//! Rate-limited warnings: a flood of bad connections must not become a
//! flood of log lines (a disk filled with warnings is a denial of service
//! of its own). Each kind of warning has its own budget per interval;
//! warnings over budget are counted and the count is reported with the
//! next warning that passes. Here, below every part that reads from the
//! network (the peer and client ports, the Redis gateway), so that none
//! depends on another for it.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// A budget of `burst` warnings per `interval`.
#[derive(Debug)]
pub struct RateLimit {
    burst: u32,
    interval: Duration,
    state: Mutex<Window>,
}

#[derive(Debug)]
struct Window {
    start: Option<Instant>,
    passed: u32,
    suppressed: u64,
}

impl RateLimit {
    /// At most `burst` warnings per `interval`.
    pub const fn new(burst: u32, interval: Duration) -> Self {
        Self { burst, interval, state: Mutex::new(Window { start: None, passed: 0, suppressed: 0 }) }
    }

    /// `Some(n)` if a warning may be logged now, `n` being how many were
    /// suppressed since the last one that passed; `None` if over budget.
    pub fn allow(&self) -> Option<u64> {
        self.allow_at(Instant::now())
    }

    fn allow_at(&self, now: Instant) -> Option<u64> {
        let mut w = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if w.start.map_or(true, |s| now.duration_since(s) >= self.interval) {
            w.start = Some(now);
            w.passed = 0;
        }
        if w.passed < self.burst {
            w.passed += 1;
            Some(std::mem::take(&mut w.suppressed))
        } else {
            w.suppressed += 1;
            None
        }
    }
}

/// Logs a warning through `limit` (a `static RateLimit`), adding how many
/// were suppressed before it (with `tracing`, which the calling crate
/// depends on).
#[macro_export]
macro_rules! warn_limited {
    ($limit:expr, $($arg:tt)+) => {
        if let Some(suppressed) = $limit.allow() {
            if suppressed > 0 {
                tracing::warn!(suppressed, $($arg)+);
            } else {
                tracing::warn!($($arg)+);
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_passes_then_the_rest_is_counted() {
        let limit = RateLimit::new(3, Duration::from_secs(10));
        let t0 = Instant::now();
        let passed: Vec<_> = (0..10).map(|_| limit.allow_at(t0)).collect();
        assert_eq!(passed.iter().filter(|p| p.is_some()).count(), 3);
        // The next window reports the 7 suppressed with its first warning.
        assert_eq!(limit.allow_at(t0 + Duration::from_secs(10)), Some(7));
        assert_eq!(limit.allow_at(t0 + Duration::from_secs(10)), Some(0));
    }
}
