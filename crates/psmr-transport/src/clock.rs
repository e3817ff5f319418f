//! The replica's clocks: a monotonic one, nanoseconds since the process
//! first asked (requests carry their arrival time on it, so that the
//! core's batching can tell how long they waited), and the wall clock the
//! leader stamps log entries with ([`wall_ms`]).

use std::sync::OnceLock;
use std::time::Instant;

fn origin() -> Instant {
    static START: OnceLock<Instant> = OnceLock::new();
    *START.get_or_init(Instant::now)
}

/// Starts the clock (the first call does).
pub fn init() {
    origin();
}

/// Nanoseconds since the clock started.
pub fn now_ns() -> u64 {
    origin().elapsed().as_nanos() as u64
}

/// Milliseconds since the Unix epoch on the system clock (0 if the clock
/// is set before the epoch). The core never lets stamps go back, whatever
/// this does.
pub fn wall_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}
