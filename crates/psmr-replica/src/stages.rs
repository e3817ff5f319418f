//! How busy each thread of the replica is (002 §VI-B, Fig. 8), from the
//! kernel's per-thread scheduler statistics: time on a CPU, time ready but
//! waiting for one, and (the rest of the wall time) time blocked, on a
//! queue, a socket or a lock. Two readings taken some time apart give the
//! shares over that time.

use psmr_model::wire::ThreadStat;

/// Every thread of this process with its counters. Empty where the
/// kernel does not provide `/proc/self/task/*/schedstat` (not Linux).
pub fn threads() -> Vec<ThreadStat> {
    let mut out: Vec<ThreadStat> = psmr_rt::schedstat::own_threads()
        .into_iter()
        .map(|t| {
            let name = psmr_rt::schedstat::read_bounded(&t.dir.join("comm")).unwrap_or_default().trim().to_string();
            ThreadStat { name, tid: t.tid, cpu_ns: t.stat.cpu_ns, runq_ns: t.stat.runq_ns }
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}
