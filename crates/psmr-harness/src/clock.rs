//! Clock faults and the check that expiry survives them.
//!
//! [`Clocks`] gives every replica process a wall clock of its own, which
//! the nemesis moves forward and back while the replica runs, as Jepsen's
//! clock nemesis does: the process runs under libfaketime (installed by
//! `scripts/setup.sh`), which reads the offset from a file of the
//! replica's and adds it to `CLOCK_REALTIME` only; the monotonic clock,
//! which timers and elections use, is left alone. So a replica that leads
//! stamps log entries with a clock that jumps.
//!
//! [`probe_ttl`] is the check: one client sets keys with TTLs and reads
//! them back, each in a transaction with `TIME`, which answers the time
//! its log entry executes at. Whatever the leaders' clocks do, along one
//! client's requests that time never goes back, and a key is there until
//! its deadline in that time and gone after it.

use psmr_client::{Client, ClientConfig};
use psmr_services::kv::{Deadline, KvCodec, KvOp, KvReply, SetWhen, Ttl};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use thiserror::Error;

/// Where Debian and Ubuntu install libfaketime, in its build for
/// multi-threaded programs (a replica's threads all read the clock).
const FAKETIME_LIBS: [&str; 2] =
    ["/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1", "/usr/lib/aarch64-linux-gnu/faketime/libfaketimeMT.so.1"];

/// How often libfaketime reads the offset again, in seconds: a jump takes
/// effect within this long.
const REREAD_S: &str = "1";

/// Why clocks cannot be given.
#[derive(Debug, Error)]
pub enum ClockError {
    /// libfaketime is not installed.
    #[error("libfaketime is not installed (looked for {0}); scripts/setup.sh installs it (package faketime)")]
    NoFaketime(String),
    /// A clock's file could not be written.
    #[error("cannot write the clock file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// The replicas' own clocks: one offset file each, in a directory.
#[derive(Clone, Debug)]
pub struct Clocks {
    lib: PathBuf,
    dir: PathBuf,
}

impl Clocks {
    /// Clocks whose offset files live in `dir` (created if missing), all
    /// on time.
    pub fn new(dir: &Path) -> Result<Self, ClockError> {
        let lib = FAKETIME_LIBS
            .iter()
            .map(PathBuf::from)
            .find(|p| p.exists())
            .ok_or_else(|| ClockError::NoFaketime(FAKETIME_LIBS.join(", ")))?;
        std::fs::create_dir_all(dir).map_err(|source| ClockError::Io { path: dir.to_path_buf(), source })?;
        Ok(Self { lib, dir: dir.to_path_buf() })
    }

    fn file(&self, id: u64) -> PathBuf {
        self.dir.join(format!("clock-{id}"))
    }

    /// The environment that runs replica `id`'s process on its clock; its
    /// offset file is written first, on time, if it does not exist.
    pub fn env(&self, id: u64) -> Result<Vec<(String, OsString)>, ClockError> {
        let file = self.file(id);
        if !file.exists() {
            self.set(id, 0)?;
        }
        let var = |k: &str, v: OsString| (k.to_string(), v);
        Ok(vec![
            var("LD_PRELOAD", self.lib.clone().into_os_string()),
            var("FAKETIME_TIMESTAMP_FILE", file.into_os_string()),
            var("FAKETIME_CACHE_DURATION", REREAD_S.into()),
            // Both spellings: libfaketime 0.9.10 reads the first, later
            // ones the second.
            var("DONT_FAKE_MONOTONIC", "1".into()),
            var("FAKETIME_DONT_FAKE_MONOTONIC", "1".into()),
        ])
    }

    /// Sets replica `id`'s clock `offset_s` seconds off the true time
    /// (written whole, then renamed, so that libfaketime never reads half
    /// of it).
    pub fn set(&self, id: u64, offset_s: i64) -> Result<(), ClockError> {
        let file = self.file(id);
        let tmp = file.with_extension("tmp");
        let io = |source| ClockError::Io { path: file.clone(), source };
        std::fs::write(&tmp, format!("{offset_s:+}\n")).map_err(io)?;
        std::fs::rename(&tmp, &file).map_err(io)
    }
}

/// What [`probe_ttl`] found.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct TtlReport {
    /// Keys set with a TTL.
    pub keys: usize,
    /// Reads of them.
    pub reads: usize,
    /// Keys seen gone (at or after their deadline, unless a violation says
    /// otherwise).
    pub expired: usize,
    /// Requests that failed or timed out (their keys are given up).
    pub failed: usize,
    /// What broke the rules, one line each.
    pub violations: Vec<String>,
}

/// Keys in flight at once.
const KEYS_IN_FLIGHT: usize = 8;

/// Between two transactions of the probe: its rate (a few dozen a
/// second), not a wait for anything; its keys expire as the log's time
/// passes whatever the probe does, and each transaction reads the time it
/// ran at.
const PACE: Duration = Duration::from_millis(20);

/// A key set and not yet seen gone: its name, and its deadline in log time.
struct Pending {
    key: Vec<u8>,
    deadline: u64,
}

/// Sets keys with TTLs of 0.1 to 3 s drawn from `seed` and reads them
/// back, through `client`, until `stop`; every request is one transaction
/// that ends with `TIME`. See the module documentation for what it checks.
pub fn probe_ttl(client: ClientConfig, seed: u64, stop: &AtomicBool) -> TtlReport {
    let mut report = TtlReport::default();
    let mut client = match Client::new(client) {
        Ok(c) => c,
        Err(e) => {
            report.violations.push(format!("no client: {e}"));
            return report;
        }
    };
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let (mut pending, mut last_time, mut next_key) = (Vec::<Pending>::new(), 0u64, 0u64);
    while !stop.load(Ordering::SeqCst) {
        let set = (pending.len() < KEYS_IN_FLIGHT).then(|| {
            next_key += 1;
            (format!("psmr-ttl-probe-{seed}-{next_key}").into_bytes(), rng.gen_range(100..=3000u64))
        });
        let mut ops: Vec<KvOp> = pending.iter().map(|p| KvOp::Read { key: p.key.clone() }).collect();
        if let Some((key, ttl)) = &set {
            let ttl = Ttl::Expire(Deadline::In(*ttl as i64));
            ops.push(KvOp::Set { key: key.clone(), value: b"v".to_vec(), when: SetWhen::Always, get: false, ttl });
        }
        ops.push(KvOp::Time);
        let exec = KvOp::Exec { watched: Vec::new(), versions: Vec::new(), ops };
        let replies = match client.call(&KvCodec, &[exec]) {
            Ok(mut r) => match r.pop() {
                Some(Ok(KvReply::Exec(Some(replies)))) => replies,
                other => {
                    report.violations.push(format!("a transaction of the probe answered {other:?}"));
                    return report;
                }
            },
            Err(_) => {
                // The outcome is unknown: its keys are given up.
                report.failed += 1;
                pending.clear();
                continue;
            }
        };
        let now = match replies.last() {
            Some(KvReply::Int(t)) => *t as u64,
            other => {
                report.violations.push(format!("TIME answered {other:?}"));
                return report;
            }
        };
        if now < last_time {
            report.violations.push(format!("the log's time went back from {last_time} to {now} ms"));
        }
        last_time = now;
        check_reads(&mut report, &mut pending, &replies, now);
        if let Some((key, ttl)) = set {
            report.keys += 1;
            pending.push(Pending { key, deadline: now + ttl });
        }
        std::thread::sleep(PACE);
    }
    report
}

/// Checks the reads of `pending` (the first replies) made at `now`: a key
/// is there up to its deadline and gone after it. Keys seen gone are done.
fn check_reads(report: &mut TtlReport, pending: &mut Vec<Pending>, replies: &[KvReply], now: u64) {
    let mut still = Vec::new();
    for (p, reply) in pending.drain(..).zip(replies) {
        report.reads += 1;
        let name = String::from_utf8_lossy(&p.key).into_owned();
        match reply {
            KvReply::Value(Some(_)) if now > p.deadline => {
                report.violations.push(format!("{name} still there at {now} ms, past its deadline {}", p.deadline));
            }
            KvReply::Value(Some(_)) => still.push(p),
            KvReply::Value(None) if now <= p.deadline => {
                report.violations.push(format!("{name} gone at {now} ms, before its deadline {}", p.deadline));
            }
            KvReply::Value(None) => report.expired += 1,
            other => report.violations.push(format!("reading {name} answered {other:?}")),
        }
    }
    *pending = still;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_are_judged_against_the_deadline_in_log_time() {
        let p = |k: &str, deadline| Pending { key: k.as_bytes().to_vec(), deadline };
        let there = || KvReply::Value(Some(b"v".to_vec()));
        let mut report = TtlReport::default();
        let mut pending = vec![p("early", 100), p("on-time", 100), p("kept", 100)];
        check_reads(&mut report, &mut pending, &[KvReply::Value(None), there(), there()], 100);
        assert_eq!(report.violations, ["early gone at 100 ms, before its deadline 100"]);
        assert_eq!(pending.iter().map(|p| p.key.clone()).collect::<Vec<_>>(), [b"on-time".to_vec(), b"kept".to_vec()]);
        let mut report = TtlReport::default();
        let mut pending = vec![p("late", 100), p("gone", 50)];
        check_reads(&mut report, &mut pending, &[there(), KvReply::Value(None)], 101);
        assert_eq!(report.violations, ["late still there at 101 ms, past its deadline 100"]);
        assert_eq!((report.reads, report.expired, pending.len()), (2, 1, 0));
    }

    #[test]
    fn a_process_on_a_moved_clock_reads_the_moved_time() {
        let dir = tempfile::tempdir().unwrap();
        let clocks = Clocks::new(dir.path()).unwrap();
        clocks.set(1, 1_000_000).unwrap();
        let out = std::process::Command::new("date").arg("+%s").envs(clocks.env(1).unwrap()).output().unwrap();
        let moved: i64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
        assert!((moved - now - 1_000_000).abs() < 100, "date said {moved}, now is {now}");
        assert_eq!(std::fs::read_to_string(dir.path().join("clock-1")).unwrap(), "+1000000\n");
    }
}
