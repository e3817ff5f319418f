//! The replica's monotonic clock: nanoseconds since the process first
//! asked. Requests carry their arrival time on it, so that the core's
//! batching can tell how long they waited.

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
