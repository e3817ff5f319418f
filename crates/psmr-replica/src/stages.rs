//! How busy each thread of the replica is (002 §VI-B, Fig. 8), from the
//! kernel's per-thread scheduler statistics: time on a CPU, time ready but
//! waiting for one, and (the rest of the wall time) time blocked, on a
//! queue, a socket or a lock. Two readings taken some time apart give the
//! shares over that time.

use psmr_model::wire::ThreadStat;
use std::sync::OnceLock;
use std::time::Instant;

fn origin() -> Instant {
    static START: OnceLock<Instant> = OnceLock::new();
    *START.get_or_init(Instant::now)
}

/// Starts the clock of [`now_ns`].
pub fn init() {
    origin();
}

/// Nanoseconds since the replica started.
pub fn now_ns() -> u64 {
    origin().elapsed().as_nanos() as u64
}

/// Every thread of this process with its counters. Empty where the
/// kernel does not provide `/proc/self/task/*/schedstat` (not Linux).
pub fn threads() -> Vec<ThreadStat> {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else { return Vec::new() };
    let mut out = Vec::new();
    for task in dir.flatten() {
        let path = task.path();
        let tid = task.file_name().to_str().and_then(|t| t.parse().ok()).unwrap_or(0);
        let name = std::fs::read_to_string(path.join("comm")).unwrap_or_default().trim().to_string();
        let Ok(sched) = std::fs::read_to_string(path.join("schedstat")) else { continue };
        let mut it = sched.split_whitespace().map(|v| v.parse::<u64>().unwrap_or(0));
        let (cpu_ns, runq_ns) = (it.next().unwrap_or(0), it.next().unwrap_or(0));
        out.push(ThreadStat { name, tid, cpu_ns, runq_ns });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}
