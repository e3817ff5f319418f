//! What a load reads of the replicas while it runs: their thread and
//! worker counters every second of the window, and their processes' CPU
//! time at its two ends.

use super::client::Window;
use super::CpuSource;
use super::{StageRow, Switch, WorkerRow};
use crate::cpu::{CpuSample, Reading as CpuReading, ReplicaCpu, Role};
use crate::probe::{leader_of, Probe};
use psmr_client::ReplicaStats;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// How long a replica may take to tell its status.
const STATUS_TIMEOUT: Duration = Duration::from_secs(1);

/// How long a replica may take to tell its counters.
const STATS_TIMEOUT: Duration = Duration::from_secs(3);

/// A replica whose CPU time a load reads.
struct Watched {
    id: u64,
    addr: SocketAddr,
    pid: u32,
    role: Role,
}

/// The replicas a load reads the CPU time of, found before it starts.
pub(super) struct CpuWatch {
    replicas: Vec<Watched>,
    leader: u64,
    pub note: Option<String>,
}

impl CpuWatch {
    /// Asks every replica for its pid and the leader.
    pub fn locate(probe: &Probe, source: &CpuSource) -> Self {
        let mut watch = CpuWatch { replicas: Vec::new(), leader: 0, note: None };
        if let CpuSource::Off(why) = source {
            watch.note = Some(why.clone());
            return watch;
        }
        let statuses = probe.statuses(STATUS_TIMEOUT);
        watch.leader = leader_of(statuses.iter().flatten());
        let mut foreign = Vec::new();
        for (addr, status) in probe.addrs().iter().zip(statuses) {
            let Ok(s) = status else { continue };
            if matches!(source, CpuSource::IfLocal) && !is_local_psmr(addr, s.pid) {
                foreign.push(addr.to_string());
                continue;
            }
            let role = if s.id == watch.leader { Role::Leader } else { Role::Follower };
            watch.replicas.push(Watched { id: s.id, addr: *addr, pid: s.pid, role });
        }
        if !foreign.is_empty() {
            watch.note = Some(format!("n/a for {}: not a psmr process of this machine", foreign.join(", ")));
        } else if watch.replicas.is_empty() {
            watch.note = Some("n/a: no replica told its pid".into());
        }
        watch
    }

    /// One reading per watched replica, in order; errors as text.
    fn sample(&self) -> Vec<CpuReading> {
        self.replicas.iter().map(|r| CpuSample::read(r.pid).map_err(|e| e.to_string())).collect()
    }

    /// Each watched replica's CPU over the window and per command.
    pub fn rows(&self, before: &[CpuReading], after: &[CpuReading], commands: u64) -> Vec<ReplicaCpu> {
        let missing: CpuReading = Err("not read".into());
        self.replicas
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let (b, a) = (before.get(i).unwrap_or(&missing), after.get(i).unwrap_or(&missing));
                ReplicaCpu::measured(r.id, r.addr.to_string(), r.pid, r.role, b, a, commands)
            })
            .collect()
    }

    /// A note when the leader after the window is another than before.
    pub fn leader_change(&self, probe: &Probe) -> Option<String> {
        if self.replicas.is_empty() {
            return None;
        }
        let now = leader_of(probe.statuses(STATUS_TIMEOUT).iter().flatten());
        (now != self.leader).then(|| {
            format!(
                "the leader changed during the window (replica {} before, {now} after): roles are those before",
                self.leader
            )
        })
    }
}

/// Whether `pid`, reported by the replica at `addr`, is a `psmr` process
/// of this machine: the address is loopback (this host's network) and the
/// process there is named `psmr`.
fn is_local_psmr(addr: &SocketAddr, pid: u32) -> bool {
    addr.ip().is_loopback() && crate::cpu::comm(pid).is_ok_and(|c| c == "psmr")
}

/// What [`window`] read.
pub(super) struct Sampled {
    pub stages: Vec<StageRow>,
    pub workers: Vec<WorkerRow>,
    pub worker_timeline: Vec<Vec<WorkerRow>>,
    pub switches: Vec<Switch>,
    pub cpu_before: Vec<CpuReading>,
    pub cpu_after: Vec<CpuReading>,
}

/// Waits for the measured window and reads the replicas over it: the
/// workers every second too, for their timeline (000 Fig. 5.3); a replica
/// that does not answer leaves a gap.
pub(super) fn window(probe: &Probe, window: &Window, watch: &CpuWatch) -> Sampled {
    let addrs = probe.addrs();
    std::thread::sleep(window.measure_from.saturating_duration_since(Instant::now()));
    let cpu_before = watch.sample();
    let before = probe.stats(STATS_TIMEOUT);
    let mut worker_timeline = Vec::with_capacity(window.buckets);
    let mut switches = Vec::new();
    let mut last = before.clone();
    let mut cpu_after = Vec::new();
    for second in 1..=window.buckets {
        let tick = (window.measure_from + Duration::from_secs(second as u64)).min(window.measure_to);
        std::thread::sleep(tick.saturating_duration_since(Instant::now()));
        if second == window.buckets {
            cpu_after = watch.sample();
        }
        let now = probe.stats(STATS_TIMEOUT);
        worker_timeline.push(worker_shares(addrs, &last, &now));
        let at_s = tick.duration_since(window.measure_from).as_secs_f64();
        switches.extend(changed_schedulers(addrs, &last, &now, at_s));
        last = now;
    }
    Sampled {
        stages: stage_shares(addrs, &before, &last),
        workers: worker_shares(addrs, &before, &last),
        worker_timeline,
        switches,
        cpu_before,
        cpu_after,
    }
}

type Reading = Option<ReplicaStats>;

/// Per replica and thread name (threads of one name summed, then divided
/// by their number): shares of the interval on a CPU and waiting for one.
fn stage_shares(addrs: &[SocketAddr], before: &[Reading], after: &[Reading]) -> Vec<StageRow> {
    let mut out = Vec::new();
    for ((addr, b), a) in addrs.iter().zip(before).zip(after) {
        let (Some(b), Some(a)) = (b, a) else { continue };
        let wall = a.at_ns.saturating_sub(b.at_ns).max(1) as f64;
        let (b, a) = (&b.threads, &a.threads);
        let mut groups: BTreeMap<String, (f64, f64, usize)> = BTreeMap::new();
        for t in a.iter().filter(|t| is_stage(&t.name)) {
            if let Some(old) = b.iter().find(|o| o.tid == t.tid) {
                let g = groups.entry(stage_of(&t.name)).or_default();
                g.0 += t.cpu_ns.saturating_sub(old.cpu_ns) as f64 / wall;
                g.1 += t.runq_ns.saturating_sub(old.runq_ns) as f64 / wall;
                g.2 += 1;
            }
        }
        for (stage, (busy, runq, n)) in groups {
            let (busy, waiting_cpu) = (busy / n as f64, runq / n as f64);
            let blocked = (1.0 - busy - waiting_cpu).max(0.0);
            out.push(StageRow { replica: addr.to_string(), stage, busy, waiting_cpu, blocked, threads: n });
        }
    }
    out
}

/// Per replica and worker: what the scheduler's counters say about the
/// window.
fn worker_shares(addrs: &[SocketAddr], before: &[Reading], after: &[Reading]) -> Vec<WorkerRow> {
    let mut out = Vec::new();
    for ((addr, b), a) in addrs.iter().zip(before).zip(after) {
        let (Some(b), Some(a)) = (b, a) else { continue };
        let wall = a.at_ns.saturating_sub(b.at_ns).max(1) as f64;
        for (worker, (wa, wb)) in a.workers.iter().zip(&b.workers).enumerate() {
            let dequeues = wa.dequeues.saturating_sub(wb.dequeues);
            let dequeued = wa.dequeued_commands.saturating_sub(wb.dequeued_commands);
            out.push(WorkerRow {
                replica: addr.to_string(),
                worker,
                sync_idle: wa.sync_idle_ns.saturating_sub(wb.sync_idle_ns) as f64 / wall,
                queue_idle: wa.queue_idle_ns.saturating_sub(wb.queue_idle_ns) as f64 / wall,
                executed: wa.executed.saturating_sub(wb.executed),
                queue_size: if dequeues == 0 { 0.0 } else { dequeued as f64 / dequeues as f64 },
                steals_tried: wa.steals_tried.saturating_sub(wb.steals_tried),
                steals_ok: wa.steals_ok.saturating_sub(wb.steals_ok),
            });
        }
    }
    out
}

/// The replicas whose scheduler (or `auto`'s last decision) differs
/// between two readings, as seen `at_s` into the window.
fn changed_schedulers(addrs: &[SocketAddr], before: &[Reading], after: &[Reading], at_s: f64) -> Vec<Switch> {
    let mut out = Vec::new();
    for ((addr, b), a) in addrs.iter().zip(before).zip(after) {
        let (Some(b), Some(a)) = (b, a) else { continue };
        if (&a.scheduler, &a.decision) != (&b.scheduler, &b.decision) {
            let (scheduler, decision) = (a.scheduler.clone(), a.decision.clone());
            out.push(Switch { at_s, replica: addr.to_string(), scheduler, decision });
        }
    }
    out
}

/// Threads of one stage share a name up to a trailing number.
/// Whether a thread is one of the replica's stages: its own threads
/// (`psmr-*`) and those of its psmr-rt pools (`rt-*`: the late schedulers
/// on a pool, the snapshot side pool). The process's main thread only
/// waits for the others.
fn is_stage(name: &str) -> bool {
    name.starts_with("psmr-") || name.starts_with("rt-")
}

fn stage_of(name: &str) -> String {
    name.trim_end_matches(|c: char| c.is_ascii_digit()).trim_end_matches('-').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use psmr_model::wire::ThreadStat;

    fn reading(at_ns: u64, threads: &[(&str, u64, u64)]) -> Reading {
        let threads = threads
            .iter()
            .enumerate()
            .map(|(tid, &(name, cpu_ns, runq_ns))| ThreadStat { name: name.into(), tid: tid as u64, cpu_ns, runq_ns })
            .collect();
        Some(ReplicaStats { at_ns, threads, workers: vec![], scheduler: String::new(), decision: String::new() })
    }

    #[test]
    fn stages_group_the_replicas_threads_and_their_pools_threads_by_name() {
        let addr: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let names = [("psmr", 0, 0), ("psmr-manager", 0, 0), ("rt-late-0", 0, 0), ("rt-late-1", 0, 0)];
        let before = reading(0, &names);
        let after = reading(
            1000,
            &[("psmr", 900, 0), ("psmr-manager", 500, 100), ("rt-late-0", 600, 0), ("rt-late-1", 200, 200)],
        );
        let rows = stage_shares(&[addr], &[before], &[after]);
        let stages: Vec<_> = rows.iter().map(|r| (r.stage.as_str(), r.threads)).collect();
        assert_eq!(stages, [("psmr-manager", 1), ("rt-late", 2)], "the main thread is left out");
        let late = &rows[1];
        assert!((late.busy - 0.4).abs() < 1e-9 && (late.waiting_cpu - 0.1).abs() < 1e-9, "{late:?}");
    }
}
