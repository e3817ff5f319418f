//! CPU time of processes on this machine, from the kernel's own accounting
//! (Linux `/proc`): what `psmr bench` divides by the commands of a measured
//! window to report CPU µs per command for each replica (or etcd member, or
//! redis-server).
//!
//! Two counters, each with its weakness:
//!
//! * `/proc/PID/task/TID/schedstat`, first field: the thread's time on a
//!   CPU in ns (the scheduler's `sum_exec_runtime`). Precise, but only for
//!   threads alive when it is read: a thread that exits takes its time
//!   with it.
//! * `/proc/PID/stat` fields 14 and 15, `utime + stime`: the whole process,
//!   exited threads included, in clock ticks. The kernel scales them so
//!   that they add up to the same `sum_exec_runtime`, but the two values
//!   are rounded down to a tick each. `USER_HZ` is 100 on every Linux
//!   architecture psmr runs on; it is taken as that rather than asked of
//!   libc (`sysconf(_SC_CLK_TCK)`), which would need `unsafe`.
//!
//! A window's CPU time is the ns one: per thread, the difference of its two
//! readings (a thread born in the window counts from 0). When the tick
//! counters grew by more than that plus their rounding, threads exited in
//! the window and the tick difference, the larger, is the better figure.
//! The process itself is recognized by its pid and its start time
//! (`/proc/PID/stat` field 22): a replica that died, or was replaced by
//! another process of the same pid, is an error, never a wrong number.
//!
//! Everything read from `/proc` is treated as hostile: bounded reads,
//! parse errors as values, no panics.

use psmr_rt::schedstat;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use thiserror::Error;

/// Clock ticks per second of `utime`/`stime` (`USER_HZ`).
pub const TICKS_PER_S: u64 = 100;

/// Why a process's CPU time could not be read.
#[derive(Debug, Error)]
pub enum CpuError {
    /// A `/proc` file could not be read (the process may have exited).
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A `/proc` file does not hold what the kernel writes there.
    #[error("{path}: {why}")]
    Malformed {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// The pid now belongs to another process than at the first reading.
    #[error("process {pid} exited or was replaced during the window")]
    Replaced {
        /// The pid.
        pid: u32,
    },
}

/// The fields of `/proc/PID/stat` psmr uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatFields {
    /// The command name (field 2, without its parentheses).
    pub comm: String,
    /// User time, ticks (field 14).
    pub utime_ticks: u64,
    /// System time, ticks (field 15).
    pub stime_ticks: u64,
    /// When the process started, ticks after boot (field 22).
    pub start_ticks: u64,
}

/// Parses one `/proc/PID/stat` line. The command name may hold spaces and
/// parentheses, so it runs to the last `)`.
pub fn parse_stat(text: &str) -> Result<StatFields, String> {
    let open = text.find('(').ok_or("no '(' before the command name")?;
    let close = text.rfind(')').filter(|&c| c > open).ok_or("no ')' after the command name")?;
    let comm = text[open + 1..close].to_string();
    // Field 3 (the state) is the first after the name.
    let rest: Vec<&str> = text[close + 1..].split_whitespace().collect();
    let field = |n: usize| -> Result<u64, String> {
        let raw = rest.get(n - 3).ok_or_else(|| format!("field {n} is missing"))?;
        raw.parse().map_err(|_| format!("field {n} is not a number: {raw:?}"))
    };
    Ok(StatFields { comm, utime_ticks: field(14)?, stime_ticks: field(15)?, start_ticks: field(22)? })
}

/// Reads a `/proc` file, bounded (see [`schedstat::read_bounded`]).
fn read_bounded(path: &Path) -> Result<String, CpuError> {
    schedstat::read_bounded(path).map_err(|source| CpuError::Read { path: path.to_path_buf(), source })
}

fn stat_of(dir: &Path) -> Result<StatFields, CpuError> {
    let path = dir.join("stat");
    let text = read_bounded(&path)?;
    parse_stat(&text).map_err(|why| CpuError::Malformed { path, why })
}

/// The command name of process `pid` (`/proc/PID/stat`).
pub fn comm(pid: u32) -> Result<String, CpuError> {
    Ok(stat_of(&Path::new("/proc").join(pid.to_string()))?.comm)
}

/// One reading of a process's CPU counters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuSample {
    /// The process.
    pub pid: u32,
    /// Its start time, ticks after boot: the pid's owner at this reading.
    pub start_ticks: u64,
    /// `utime + stime`, ticks.
    pub ticks: u64,
    /// ns on a CPU per live thread id; `None` where the kernel keeps no
    /// `schedstat`.
    pub threads_ns: Option<BTreeMap<u64, u64>>,
}

impl CpuSample {
    /// Reads process `pid` from `/proc`.
    pub fn read(pid: u32) -> Result<Self, CpuError> {
        Self::read_from(Path::new("/proc"), pid)
    }

    /// Reads process `pid` from `root` laid out as `/proc` (for tests).
    pub fn read_from(root: &Path, pid: u32) -> Result<Self, CpuError> {
        let dir = root.join(pid.to_string());
        let stat = stat_of(&dir)?;
        Ok(Self {
            pid,
            start_ticks: stat.start_ticks,
            ticks: stat.utime_ticks.saturating_add(stat.stime_ticks),
            threads_ns: threads_ns(&dir.join("task")),
        })
    }
}

/// ns on a CPU of every thread listed under `task`; `None` when no
/// thread's `schedstat` can be read. A thread that exits while it is read
/// is left out.
fn threads_ns(task: &Path) -> Option<BTreeMap<u64, u64>> {
    let out: BTreeMap<u64, u64> = schedstat::threads(task).into_iter().map(|t| (t.tid, t.stat.cpu_ns)).collect();
    (!out.is_empty()).then_some(out)
}

/// CPU time of one process between two readings, ns (see the module
/// documentation for which counter wins).
pub fn cpu_ns_between(before: &CpuSample, after: &CpuSample) -> Result<u64, CpuError> {
    if before.pid != after.pid || before.start_ticks != after.start_ticks {
        return Err(CpuError::Replaced { pid: after.pid });
    }
    let tick_ns = 1_000_000_000 / TICKS_PER_S;
    let by_ticks = after.ticks.saturating_sub(before.ticks).saturating_mul(tick_ns);
    let Some((b, a)) = before.threads_ns.as_ref().zip(after.threads_ns.as_ref()) else { return Ok(by_ticks) };
    let by_threads: u64 = a.iter().map(|(tid, ns)| ns.saturating_sub(b.get(tid).copied().unwrap_or(0))).sum();
    // utime and stime are each rounded down, at both readings.
    let rounding = 2 * tick_ns;
    Ok(if by_ticks > by_threads + rounding { by_ticks } else { by_threads })
}

/// A reading, or why it could not be taken (the process may be gone).
pub type Reading = Result<CpuSample, String>;

/// A replica's part in the cluster during a window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// The raft leader (at the start of the window).
    Leader,
    /// A follower.
    Follower,
    /// The only server (no replication: redis).
    Single,
}

/// One server process's CPU over a measured window.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ReplicaCpu {
    /// The replica's id (etcd: member number, redis: 1).
    pub id: u64,
    /// Its client address.
    pub addr: String,
    /// Its process id, if known.
    pub pid: Option<u32>,
    /// Leader, follower or the single server.
    pub role: Role,
    /// CPU seconds it used in the window, if they could be read.
    pub cpu_s: Option<f64>,
    /// CPU µs per command completed in the window.
    pub us_per_command: Option<f64>,
    /// Why there is no figure, when there is none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl ReplicaCpu {
    /// The row for a process measured from `before` to `after` (either
    /// missing when it could not be read) over `commands` commands.
    pub fn measured(
        id: u64,
        addr: String,
        pid: u32,
        role: Role,
        before: &Reading,
        after: &Reading,
        commands: u64,
    ) -> Self {
        let used = match (before, after) {
            (Ok(b), Ok(a)) => cpu_ns_between(b, a).map_err(|e| e.to_string()),
            (Err(e), _) | (_, Err(e)) => Err(e.clone()),
        };
        let (cpu_s, us_per_command, error) = match used {
            Ok(ns) => {
                let per = (commands > 0).then(|| ns as f64 / 1e3 / commands as f64);
                (Some(ns as f64 / 1e9), per, None)
            }
            Err(e) => (None, None, Some(e)),
        };
        Self { id, addr, pid: Some(pid), role, cpu_s, us_per_command, error }
    }
}

/// CPU µs per command of the leader (or single server), if measured.
pub fn leader_us(rows: &[ReplicaCpu]) -> Option<f64> {
    rows.iter().find(|r| r.role != Role::Follower).and_then(|r| r.us_per_command)
}

/// Mean and largest CPU µs per command of the followers that were
/// measured, if any was.
pub fn followers_us(rows: &[ReplicaCpu]) -> Option<(f64, f64)> {
    let v: Vec<f64> = rows.iter().filter(|r| r.role == Role::Follower).filter_map(|r| r.us_per_command).collect();
    let max = v.iter().copied().reduce(f64::max)?;
    Some((v.iter().sum::<f64>() / v.len() as f64, max))
}

/// `leader` and `followers mean / max` cells for a table: `n/a` where
/// nothing was measured, `-` for a single server's followers.
pub fn cells(rows: &[ReplicaCpu]) -> (String, String) {
    let leader = leader_us(rows).map_or("n/a".to_string(), |v| format!("{v:.1}"));
    let followers = match followers_us(rows) {
        Some((mean, max)) => format!("{mean:.1} / {max:.1}"),
        None if !rows.is_empty() && rows.iter().all(|r| r.role == Role::Single) => "-".to_string(),
        None => "n/a".to_string(),
    };
    (leader, followers)
}

#[cfg(test)]
mod tests {
    use super::*;

    // A real line (a thread pool's name with spaces and a parenthesis).
    const STAT: &str = "4242 (psmr (x) y) S 1 4242 4242 0 -1 4194560 1520 0 0 0 731 209 0 0 20 0 9 0 \
                        983167 1108545536 3125 18446744073709551615 1 1 0 0 0 0 0 4096 17663 0 0 0 17 1 0 0 0 0 0\n";

    #[test]
    fn stat_lines_parse_even_with_odd_command_names() {
        let s = parse_stat(STAT).unwrap();
        assert_eq!(
            s,
            StatFields { comm: "psmr (x) y".into(), utime_ticks: 731, stime_ticks: 209, start_ticks: 983167 }
        );
        assert!(parse_stat("").is_err());
        assert!(parse_stat("1 (psmr S 1 2").is_err(), "unclosed name");
        assert!(parse_stat("1 (psmr) S 1 2 3").unwrap_err().contains("field 14"));
        let bad = STAT.replace(" 731 ", " -5 ");
        assert!(parse_stat(&bad).unwrap_err().contains("field 14 is not a number"));
    }

    fn sample(ticks: u64, threads: &[(u64, u64)]) -> CpuSample {
        CpuSample { pid: 7, start_ticks: 100, ticks, threads_ns: Some(threads.iter().copied().collect()) }
    }

    #[test]
    fn windows_count_threads_precisely_and_exited_ones_by_ticks() {
        let before = sample(10, &[(7, 5_000_000), (8, 1_000_000)]);
        // Thread 9 was born in the window.
        let after = sample(12, &[(7, 20_000_000), (8, 2_000_000), (9, 500_000)]);
        assert_eq!(cpu_ns_between(&before, &after).unwrap(), 16_500_000);
        // Thread 8 exited after using 300 ms that only the ticks kept.
        let after = sample(45, &[(7, 20_000_000)]);
        assert_eq!(cpu_ns_between(&before, &after).unwrap(), 350_000_000);
        // Without schedstat, ticks alone.
        let (b, a) = (CpuSample { threads_ns: None, ..before.clone() }, sample(13, &[]));
        assert_eq!(cpu_ns_between(&b, &a).unwrap(), 30_000_000);
        let replaced = CpuSample { start_ticks: 101, ..after };
        assert!(matches!(cpu_ns_between(&before, &replaced), Err(CpuError::Replaced { pid: 7 })));
    }

    #[test]
    fn a_fake_proc_tree_reads_and_a_vanished_process_is_an_error() {
        let root = std::env::temp_dir().join(format!("psmr-cpu-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let task = root.join("4242/task");
        for (tid, ns) in [(4242, "1000 5 2\n"), (4243, "2500 1 1\n")] {
            std::fs::create_dir_all(task.join(tid.to_string())).unwrap();
            std::fs::write(task.join(format!("{tid}/schedstat")), ns).unwrap();
        }
        std::fs::write(root.join("4242/stat"), STAT).unwrap();
        let s = CpuSample::read_from(&root, 4242).unwrap();
        assert_eq!((s.ticks, s.start_ticks), (940, 983167));
        assert_eq!(s.threads_ns.unwrap().values().sum::<u64>(), 3500);
        assert!(matches!(CpuSample::read_from(&root, 1), Err(CpuError::Read { .. })));
        std::fs::write(root.join("4242/stat"), "garbage").unwrap();
        assert!(matches!(CpuSample::read_from(&root, 4242), Err(CpuError::Malformed { .. })));
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn this_process_reads_and_its_cpu_time_grows() {
        let me = std::process::id();
        let before = CpuSample::read(me).unwrap();
        // Reading /proc costs CPU time, which the counters soon show (ns
        // with schedstat, else whole ticks).
        let grew = (0..1_000_000).any(|_| cpu_ns_between(&before, &CpuSample::read(me).unwrap()).unwrap() > 0);
        assert!(grew);
        assert!(!comm(me).unwrap().is_empty());
    }

    #[test]
    fn rows_summarize_leader_and_followers_and_missing_figures() {
        // Ticks only (no schedstat): 1 tick is 10 ms, 10 µs per command.
        let ok = |t: u64| Ok(CpuSample { threads_ns: None, ..sample(t, &[]) });
        let gone: Result<CpuSample, String> = Err("process 7 exited".into());
        fn row(id: u64, role: Role, b: &Result<CpuSample, String>, a: &Result<CpuSample, String>) -> ReplicaCpu {
            ReplicaCpu::measured(id, format!("r{id}"), 7, role, b, a, 1000)
        }
        let rows = vec![
            row(1, Role::Follower, &ok(0), &ok(2)),
            row(2, Role::Leader, &ok(0), &ok(5)),
            row(3, Role::Follower, &ok(0), &ok(4)),
        ];
        assert_eq!(leader_us(&rows), Some(50.0));
        assert_eq!(followers_us(&rows), Some((30.0, 40.0)));
        assert_eq!(cells(&rows), ("50.0".into(), "30.0 / 40.0".into()));
        let dead = vec![row(1, Role::Leader, &ok(0), &gone), row(2, Role::Follower, &gone, &ok(1))];
        assert_eq!(dead[0].error.as_deref(), Some("process 7 exited"));
        assert_eq!(cells(&dead), ("n/a".into(), "n/a".into()));
        assert_eq!(cells(&[row(1, Role::Single, &ok(0), &ok(1))]), ("10.0".into(), "-".into()));
        assert_eq!(cells(&[]), ("n/a".into(), "n/a".into()));
        let idle = ReplicaCpu::measured(1, "r".into(), 7, Role::Leader, &ok(0), &ok(1), 0);
        assert_eq!((idle.cpu_s, idle.us_per_command), (Some(0.01), None));
    }
}
