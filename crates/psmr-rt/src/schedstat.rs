//! What the kernel counts of each thread's scheduling: time on a CPU and
//! time runnable without one (`/proc/PID/task/TID/schedstat`). psmr reads
//! them to show how busy each stage and pool is, to tell when threads
//! wait for cores (`auto`), and to charge CPU time per command. The files
//! may come from another process, which may exit while they are read, so
//! every read is bounded and a thread that vanishes is left out.

use std::io::Read;
use std::path::{Path, PathBuf};

/// Longest `/proc` file read; a schedstat line is under 64 bytes, a
/// thread name under 16.
pub const FILE_BYTES_MAX: u64 = 4096;
/// Most threads read under one task directory.
pub const THREADS_MAX: usize = 16_384;

/// One thread's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SchedStat {
    /// Time on a CPU, ns.
    pub cpu_ns: u64,
    /// Time runnable and waiting for a CPU, ns.
    pub runq_ns: u64,
}

/// Parses a `schedstat` file: three numbers, ns on a CPU, ns waiting for
/// one, and time slices run.
pub fn parse(text: &str) -> Result<SchedStat, String> {
    let fields: Vec<&str> = text.split_whitespace().collect();
    let [cpu, runq, _slices] = fields[..] else {
        return Err(format!("expected 3 numbers, got {text:?}"));
    };
    let number = |raw: &str| raw.parse::<u64>().map_err(|_| format!("not a number: {raw:?}"));
    Ok(SchedStat { cpu_ns: number(cpu)?, runq_ns: number(runq)? })
}

/// Reads at most [`FILE_BYTES_MAX`] bytes of `path` as text.
pub fn read_bounded(path: &Path) -> std::io::Result<String> {
    let mut text = String::new();
    std::fs::File::open(path)?.take(FILE_BYTES_MAX).read_to_string(&mut text)?;
    Ok(text)
}

/// A thread listed under a task directory, with its counters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Thread {
    /// Its id.
    pub tid: u64,
    /// Its directory (`comm` in it holds the name).
    pub dir: PathBuf,
    /// Its counters.
    pub stat: SchedStat,
}

/// The threads under `task` (`/proc/PID/task`) whose counters can be read,
/// at most [`THREADS_MAX`]; empty where the kernel keeps none (not Linux).
pub fn threads(task: &Path) -> Vec<Thread> {
    let Ok(dir) = std::fs::read_dir(task) else { return Vec::new() };
    let mut out = Vec::new();
    for entry in dir.flatten().take(THREADS_MAX) {
        let Some(tid) = entry.file_name().to_str().and_then(|t| t.parse::<u64>().ok()) else { continue };
        let dir = entry.path();
        let Some(stat) = read_bounded(&dir.join("schedstat")).ok().and_then(|t| parse(&t).ok()) else { continue };
        out.push(Thread { tid, dir, stat });
    }
    out
}

/// This process's threads.
pub fn own_threads() -> Vec<Thread> {
    threads(Path::new("/proc/self/task"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_schedstat_line_is_three_numbers() {
        assert_eq!(parse("123456789 2000 31\n"), Ok(SchedStat { cpu_ns: 123_456_789, runq_ns: 2000 }));
        assert!(parse("").is_err());
        assert!(parse("1 2").is_err());
        assert!(parse("1 2 3 4").is_err());
        assert!(parse("x 2 3").is_err());
        assert!(parse("99999999999999999999999 2 3").is_err(), "overflow");
    }

    #[test]
    fn this_threads_counters_are_read_where_the_kernel_keeps_them() {
        let threads = own_threads();
        if Path::new("/proc/self/task").exists() {
            assert!(!threads.is_empty());
            assert!(threads.iter().all(|t| t.dir.ends_with(t.tid.to_string())));
        } else {
            assert!(threads.is_empty());
        }
    }
}
