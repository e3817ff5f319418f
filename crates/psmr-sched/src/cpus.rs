//! The CPUs this process may use: the CPUs of its affinity mask, and its
//! cgroup's CPU quota (v2 `cpu.max`, v1 `cpu.cfs_quota_us` over
//! `cpu.cfs_period_us`), as Go's runtime and tokio read them. A replica in
//! a container with a quota of 1.5 CPUs on a 64-core host can keep 1.5
//! cores busy, not 64: more execution threads than that only queue for
//! them.
//!
//! `std::thread::available_parallelism` folds both into one number and
//! says neither which bound it is nor what the quota is; [`Cpus::read`]
//! keeps them apart for `status` and the metrics. The file formats are
//! parsed by pure functions, tested on fixtures; a missing or unreadable
//! file means no bound from it.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How often [`contended`] looks at the machine, at most.
pub const CONTENTION_REFRESH: Duration = Duration::from_millis(1);

/// The CPUs a process may use, and why.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Cpus {
    /// CPUs in its affinity mask.
    pub affinity: usize,
    /// Its cgroup's CPU quota, in CPUs (`None`: no quota).
    pub quota: Option<f64>,
    /// What it can keep busy: the smaller of the two, the quota rounded
    /// up, at least 1.
    pub usable: usize,
}

impl Cpus {
    /// From `affinity` CPUs and `quota`.
    pub fn new(affinity: usize, quota: Option<f64>) -> Self {
        let by_quota = quota.map_or(usize::MAX, |q| q.ceil().max(1.0) as usize);
        Self { affinity: affinity.max(1), quota, usable: affinity.min(by_quota).max(1) }
    }

    /// This process's, now.
    pub fn read() -> Self {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let affinity = status
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            .and_then(|l| cpu_list_len(l.trim()))
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
        Self::new(affinity, quota(Path::new("/")))
    }

    /// For people: `2 (affinity 2, no CPU quota)`, `1 (affinity 2, quota
    /// 1.00 CPUs)`.
    pub fn describe(&self) -> String {
        let quota = self.quota.map_or_else(|| "no CPU quota".to_string(), |q| format!("quota {q:.2} CPUs"));
        format!("{} (affinity {}, {quota})", self.usable, self.affinity)
    }
}

/// Whether, a moment ago, the machine had more than twice as many
/// runnable threads as this process has usable CPUs: then a thread that
/// waits for another one should not spin (000 §6.1: spinning pays only
/// while the awaited thread runs on a core of its own, and here a spinner
/// takes a core that runnable threads, maybe the awaited one, are queued
/// for).
///
/// Why twice: the count includes the spinners themselves. One process
/// with two workers and its dispatching thread on 2 cores (`psmr
/// sched-bench`) has 3 runnable threads, and there spinning and stealing
/// pay (the skewed list workloads run 1.3 to 5 times faster with them);
/// three replicas and their clients on 2 cores (the main job) keep 5 to 7
/// runnable, most of them waiting (`auto` reports 3.4 to 4.8 runnable
/// without a CPU on average), and there a spinning worker delivered a
/// fifth of what a sleeping one does.
///
/// The count is the kernel's runnable threads now (`/proc/loadavg`,
/// before the slash), read at most once per [`CONTENTION_REFRESH`] by
/// whichever caller comes first (about 5 µs, so at most half a percent of
/// one core); the others read the last answer, one atomic load. Where the
/// file is missing, never contended.
pub fn contended() -> bool {
    // Loom explores interleavings of its own primitives: an answer that
    // changes with the machine's load would make its runs disagree.
    if cfg!(loom) {
        return false;
    }
    match CONTENTION_FIXED.load(Ordering::Relaxed) {
        FIXED_NO => return false,
        FIXED_YES => return true,
        _ => {}
    }
    struct Gauge {
        start: Instant,
        usable: usize,
        next_ns: AtomicU64,
        contended: AtomicBool,
    }
    static GAUGE: OnceLock<Gauge> = OnceLock::new();
    let g = GAUGE.get_or_init(|| Gauge {
        start: Instant::now(),
        usable: Cpus::read().usable,
        next_ns: AtomicU64::new(0),
        contended: AtomicBool::new(false),
    });
    let now = g.start.elapsed().as_nanos() as u64;
    let next = g.next_ns.load(Ordering::Relaxed);
    let refresh = now + CONTENTION_REFRESH.as_nanos() as u64;
    if now >= next && g.next_ns.compare_exchange(next, refresh, Ordering::Relaxed, Ordering::Relaxed).is_ok() {
        let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        let runnable = parse_loadavg_runnable(&text).unwrap_or(0);
        g.contended.store(runnable > 2 * g.usable, Ordering::Relaxed);
    }
    g.contended.load(Ordering::Relaxed)
}

/// [`contended`]'s answer fixed by [`fix_contention`], if it is.
static CONTENTION_FIXED: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(FIXED_NOT);
const FIXED_NOT: u8 = 0;
const FIXED_NO: u8 = 1;
const FIXED_YES: u8 = 2;

/// Fixes what [`contended`] answers in this process (`None`: the
/// machine's load again). For tests that stage what the schedulers do on
/// free or on contended cores: a test of stealing, run beside other tests
/// on a loaded machine, would otherwise find stealing turned off.
pub fn fix_contention(contended: Option<bool>) {
    let v = match contended {
        None => FIXED_NOT,
        Some(false) => FIXED_NO,
        Some(true) => FIXED_YES,
    };
    CONTENTION_FIXED.store(v, Ordering::Relaxed);
}

/// The runnable threads of `/proc/loadavg` (`0.52 0.58 0.59 3/467 12345`:
/// 3); `None` if it does not parse.
pub fn parse_loadavg_runnable(text: &str) -> Option<usize> {
    text.split_whitespace().nth(3)?.split_once('/')?.0.parse().ok()
}

/// The number of CPUs in a list such as `0-3,8,10-11`; `None` if it does
/// not parse.
pub fn cpu_list_len(list: &str) -> Option<usize> {
    let mut n = 0;
    for part in list.split(',').filter(|p| !p.trim().is_empty()) {
        n += match part.trim().split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.parse().ok()?, b.parse().ok()?);
                b.checked_sub(a)? + 1
            }
            None => {
                part.trim().parse::<usize>().ok()?;
                1
            }
        };
    }
    (n > 0).then_some(n)
}

/// A v2 `cpu.max` (`max 100000`, `150000 100000`): the quota in CPUs.
pub fn parse_cpu_max(text: &str) -> Option<f64> {
    let mut words = text.split_whitespace();
    let (quota, period) = (words.next()?, words.next().unwrap_or("100000"));
    ratio(quota, period)
}

/// v1 `cpu.cfs_quota_us` and `cpu.cfs_period_us` (`-1`: no quota): the
/// quota in CPUs.
pub fn parse_cfs(quota: &str, period: &str) -> Option<f64> {
    ratio(quota.trim(), period.trim())
}

fn ratio(quota: &str, period: &str) -> Option<f64> {
    let (q, p): (i64, i64) = (quota.parse().ok()?, period.parse().ok()?);
    (q > 0 && p > 0).then(|| q as f64 / p as f64)
}

/// Where this process's cgroup of the CPU controller is, from
/// `/proc/self/cgroup` and `/proc/self/mountinfo`: the directory, and
/// whether it is v2. v1's `cpu` controller wins when both are mounted,
/// as the kernel enforces the quota of the hierarchy that has it.
pub fn cgroup_dir(cgroup: &str, mountinfo: &str, root: &Path) -> Option<(PathBuf, bool)> {
    let v1 = cgroup.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (_, controllers, path) = (f.next()?, f.next()?, f.next()?);
        controllers.split(',').any(|c| c == "cpu").then_some(path)
    });
    let v2 = cgroup.lines().find_map(|l| l.strip_prefix("0::"));
    let (path, v2_only) = match (v1, v2) {
        (Some(p), _) => (p, false),
        (None, Some(p)) => (p, true),
        (None, None) => return None,
    };
    let mount = mountinfo.lines().find_map(|l| {
        // `id parent major:minor root mount-point options - fstype source super-options`
        let (left, right) = l.split_once(" - ")?;
        let fields: Vec<&str> = left.split_whitespace().collect();
        let mut right = right.split_whitespace();
        let (fstype, _, options) = (right.next()?, right.next()?, right.next().unwrap_or(""));
        let fits = match v2_only {
            true => fstype == "cgroup2",
            false => fstype == "cgroup" && options.split(',').any(|o| o == "cpu"),
        };
        fits.then(|| (fields.get(3).copied(), fields.get(4).copied()))
    })?;
    let (mount_root, mount_point) = (mount.0?, mount.1?);
    // The cgroup's path is relative to the hierarchy's root, of which the
    // mount shows `mount_root`.
    let inside = Path::new(path).strip_prefix(mount_root).unwrap_or(Path::new(path));
    let dir = root.join(mount_point.trim_start_matches('/')).join(inside.to_string_lossy().trim_start_matches('/'));
    Some((dir, v2_only))
}

/// The smallest quota on the way from this process's cgroup up to the
/// root of its hierarchy (a parent's quota bounds its children), under
/// the file system root `root` (`/` but in tests).
pub fn quota(root: &Path) -> Option<f64> {
    let read = |p: &Path| std::fs::read_to_string(root.join(p.strip_prefix("/").unwrap_or(p))).ok();
    let (cgroup, mountinfo) = (read(Path::new("/proc/self/cgroup"))?, read(Path::new("/proc/self/mountinfo"))?);
    let (dir, v2) = cgroup_dir(&cgroup, &mountinfo, root)?;
    let mut best: Option<f64> = None;
    for d in dir.ancestors().take_while(|d| d.starts_with(root)) {
        let here = match v2 {
            true => std::fs::read_to_string(d.join("cpu.max")).ok().and_then(|t| parse_cpu_max(&t)),
            false => {
                let q = std::fs::read_to_string(d.join("cpu.cfs_quota_us")).ok();
                let p = std::fs::read_to_string(d.join("cpu.cfs_period_us")).ok();
                q.zip(p).and_then(|(q, p)| parse_cfs(&q, &p))
            }
        };
        best = match (best, here) {
            (Some(b), Some(h)) => Some(b.min(h)),
            (b, h) => b.or(h),
        };
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runnable_count_of_loadavg_parses() {
        assert_eq!(parse_loadavg_runnable("0.52 0.58 0.59 3/467 12345\n"), Some(3));
        assert_eq!(parse_loadavg_runnable("0.52 0.58 0.59 x/467 12345"), None);
        assert_eq!(parse_loadavg_runnable(""), None);
        // On Linux it reads, and the answer is stable between refreshes.
        if std::path::Path::new("/proc/loadavg").exists() {
            let _ = contended();
        }
    }

    #[test]
    fn lists_quotas_and_the_usable_count_parse() {
        assert_eq!(cpu_list_len("0-3,8,10-11"), Some(7));
        assert_eq!(cpu_list_len("0"), Some(1));
        assert_eq!(cpu_list_len("3-1"), None);
        assert_eq!(cpu_list_len("x"), None);
        assert_eq!(parse_cpu_max("max 100000\n"), None);
        assert_eq!(parse_cpu_max("150000 100000\n"), Some(1.5));
        assert_eq!(parse_cpu_max("garbage"), None);
        assert_eq!(parse_cfs("-1\n", "100000\n"), None);
        assert_eq!(parse_cfs("50000\n", "100000\n"), Some(0.5));
        assert_eq!(Cpus::new(8, Some(1.5)).usable, 2);
        assert_eq!(Cpus::new(2, Some(6.0)).usable, 2);
        assert_eq!(Cpus::new(4, Some(0.2)).usable, 1);
        assert_eq!(Cpus::new(2, None).describe(), "2 (affinity 2, no CPU quota)");
        assert_eq!(Cpus::new(2, Some(1.0)).describe(), "1 (affinity 2, quota 1.00 CPUs)");
    }

    fn fixture(files: &[(&str, &str)]) -> tempfile::TempDir {
        let root = tempfile::tempdir().unwrap();
        for (path, text) in files {
            let p = root.path().join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        root
    }

    const MOUNTS_V2: &str = "25 30 0:22 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw\n";
    const MOUNTS_V1: &str = "24 23 0:21 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n\
                             26 23 0:23 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n";

    #[test]
    fn a_v2_quota_is_read_from_the_cgroup_and_its_parents() {
        let root = fixture(&[
            ("proc/self/cgroup", "0::/app/web\n"),
            ("proc/self/mountinfo", MOUNTS_V2),
            ("sys/fs/cgroup/app/web/cpu.max", "max 100000\n"),
            ("sys/fs/cgroup/app/cpu.max", "250000 100000\n"),
        ]);
        assert_eq!(quota(root.path()), Some(2.5), "the parent's quota bounds the child");
        std::fs::write(root.path().join("sys/fs/cgroup/app/web/cpu.max"), "50000 100000").unwrap();
        assert_eq!(quota(root.path()), Some(0.5), "the smallest on the way up");
    }

    #[test]
    fn a_v1_quota_is_read_from_the_cpu_hierarchy() {
        let root = fixture(&[
            ("proc/self/cgroup", "4:memory:/x\n1:cpu:/psmr\n0::/\n"),
            ("proc/self/mountinfo", MOUNTS_V1),
            ("sys/fs/cgroup/cpu/psmr/cpu.cfs_quota_us", "150000\n"),
            ("sys/fs/cgroup/cpu/psmr/cpu.cfs_period_us", "100000\n"),
            ("sys/fs/cgroup/cpu/cpu.cfs_quota_us", "-1\n"),
            ("sys/fs/cgroup/cpu/cpu.cfs_period_us", "100000\n"),
        ]);
        assert_eq!(quota(root.path()), Some(1.5));
        let none = fixture(&[("proc/self/cgroup", "1:cpu:/\n"), ("proc/self/mountinfo", MOUNTS_V1)]);
        assert_eq!(quota(none.path()), None, "no quota files: no quota");
    }
}
