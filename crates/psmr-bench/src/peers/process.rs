//! The processes of the peers scenario: finding the programs, starting and
//! always stopping them, their scratch directories, free ports, versions
//! and log tails.

use super::PeersError;
use std::io::{Read, Seek, SeekFrom};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The programs the peers scenario runs, found on `PATH`.
#[derive(Clone, Debug)]
pub struct Tools {
    /// `etcd` (Debian: etcd-server).
    pub etcd: PathBuf,
    /// `redis-server`.
    pub redis_server: PathBuf,
    /// `redis-benchmark` (Debian: redis-tools).
    pub redis_benchmark: PathBuf,
}

impl Tools {
    /// Finds the three programs; the error names every missing one and how
    /// to install them.
    pub fn find() -> Result<Self, PeersError> {
        let names = ["etcd", "redis-server", "redis-benchmark"];
        let found: Vec<Option<PathBuf>> = names.iter().map(|n| which(n)).collect();
        let missing: Vec<&str> = names.iter().zip(&found).filter(|(_, f)| f.is_none()).map(|(n, _)| *n).collect();
        match found.as_slice() {
            [Some(etcd), Some(server), Some(bench)] => {
                Ok(Self { etcd: etcd.clone(), redis_server: server.clone(), redis_benchmark: bench.clone() })
            }
            _ => Err(PeersError::NotInstalled { missing: missing.join(", ") }),
        }
    }
}

/// The first executable file called `name` in a directory of `PATH`.
pub fn which(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|dir| dir.join(name)).find(|candidate| {
        std::fs::metadata(candidate).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    })
}

/// The first `X.Y[.Z]` version number in `text` (after `v=` or not).
pub fn version_in(text: &str) -> Option<String> {
    text.split(|c: char| c.is_whitespace() || c == '=' || c == ',')
        .map(|t| t.trim_start_matches('v'))
        .find(|t| {
            let parts: Vec<&str> = t.split('.').collect();
            parts.len() >= 2 && parts.iter().all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
        })
        .map(str::to_string)
}

/// The version `program --version` prints, or `unknown`.
pub fn version_of(program: &Path) -> String {
    let output = Command::new(program).arg("--version").stdin(Stdio::null()).stderr(Stdio::null()).output();
    // A version line is short; the rest, if any, is not looked at.
    output
        .ok()
        .and_then(|o| version_in(&String::from_utf8_lossy(&o.stdout[..o.stdout.len().min(4096)])))
        .unwrap_or_else(|| "unknown".into())
}

/// A child process that is killed (SIGKILL) and reaped when dropped: no
/// etcd or redis-server outlives its point, whatever fails.
pub struct ChildGuard {
    child: Child,
    /// What it is, for messages (`etcd member 2`).
    pub what: String,
    /// Where its output goes.
    pub log: PathBuf,
}

impl ChildGuard {
    /// Starts `command` with stdin closed and stdout and stderr appended
    /// to `log`.
    pub fn spawn(command: Command, what: &str, log: &Path) -> Result<Self, PeersError> {
        Self::spawn_split(command, what, log, log)
    }

    /// Starts `command` with stdin closed, stdout appended to `out` and
    /// stderr to `log`.
    pub fn spawn_split(mut command: Command, what: &str, out: &Path, log: &Path) -> Result<Self, PeersError> {
        let open = |path: &Path| {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|source| PeersError::Io { what: format!("cannot open {}", path.display()), source })
        };
        command.stdin(Stdio::null()).stdout(open(out)?).stderr(open(log)?);
        let child =
            command.spawn().map_err(|source| PeersError::Io { what: format!("cannot start {what}"), source })?;
        Ok(Self { child, what: what.to_string(), log: log.to_path_buf() })
    }

    /// Waits for it to exit, at most `timeout` (then it is killed and
    /// that is an error).
    pub fn wait_timeout(&mut self, timeout: Duration) -> Result<std::process::ExitStatus, PeersError> {
        let deadline = Instant::now() + timeout;
        loop {
            let io = |source| PeersError::Io { what: format!("cannot watch {}", self.what), source };
            if let Some(status) = self.child.try_wait().map_err(io)? {
                return Ok(status);
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                return Err(PeersError::NotReady { what: format!("{} to finish", self.what), secs: timeout.as_secs() });
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// An error if it has exited, with the end of its log.
    pub fn check_running(&mut self) -> Result<(), PeersError> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(PeersError::Exited {
                what: self.what.clone(),
                status: status.to_string(),
                log: log_tail(&self.log),
            }),
            Err(source) => Err(PeersError::Io { what: format!("cannot watch {}", self.what), source }),
        }
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A fresh private directory under the system's temporary directory,
/// removed with everything in it when dropped.
pub struct Scratch {
    /// The directory.
    pub path: PathBuf,
}

impl Scratch {
    /// Creates `psmr-peers-PID-N-name` (mode 0700: the data of one run is
    /// no other user's business).
    pub fn new(name: &str) -> Result<Self, PeersError> {
        use std::os::unix::fs::DirBuilderExt;
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("psmr-peers-{}-{n}-{name}", std::process::id()));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .map_err(|source| PeersError::Io { what: format!("cannot create {}", path.display()), source })?;
        Ok(Self { path })
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// `n` distinct free ports on loopback, chosen as psmr's own clusters'
/// are ([`psmr_harness::launch::hold_free_ports`]).
pub fn free_ports(n: usize) -> Result<Vec<SocketAddr>, PeersError> {
    let io = |source| PeersError::Io { what: "cannot find a free port on 127.0.0.1".into(), source };
    let held = psmr_harness::launch::hold_free_ports("127.0.0.1", n).map_err(io)?;
    held.iter().map(|l| l.local_addr().map_err(io)).collect()
}

/// The last 2 KiB of a log, for error messages.
pub fn log_tail(path: &Path) -> String {
    const TAIL_BYTES: u64 = 2048;
    let read = || -> std::io::Result<String> {
        let mut f = std::fs::File::open(path)?;
        let len = f.metadata()?.len();
        f.seek(SeekFrom::Start(len.saturating_sub(TAIL_BYTES)))?;
        let mut text = Vec::new();
        f.take(TAIL_BYTES).read_to_end(&mut text)?;
        Ok(String::from_utf8_lossy(&text).trim().to_string())
    };
    match read() {
        Ok(t) if t.is_empty() => format!("{} is empty", path.display()),
        Ok(t) => format!("{} ends with:\n{t}", path.display()),
        Err(e) => format!("cannot read {}: {e}", path.display()),
    }
}

/// Calls `ready` every 50 ms until it says yes, `alive` fails, or
/// `timeout` passes (then the error is `NotReady` for `what`).
pub fn wait_until(
    what: &str,
    timeout: Duration,
    mut alive: impl FnMut() -> Result<(), PeersError>,
    mut ready: impl FnMut() -> bool,
) -> Result<(), PeersError> {
    let deadline = Instant::now() + timeout;
    loop {
        alive()?;
        if ready() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(PeersError::NotReady { what: what.to_string(), secs: timeout.as_secs() });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The 1-minute load average (`/proc/loadavg`), as written there: other
/// work on the machine during a run makes its numbers worth less.
pub fn load_average() -> Option<String> {
    let mut text = String::new();
    std::fs::File::open("/proc/loadavg").ok()?.take(256).read_to_string(&mut text).ok()?;
    let first = text.split_whitespace().next()?;
    first.parse::<f64>().ok().map(|_| first.to_string())
}

/// The file system `path` is on (`ext4`, `tmpfs` ...), from
/// `/proc/mounts`: the longest mount point that holds it.
pub fn fs_type(path: &Path) -> Option<String> {
    let mut text = String::new();
    std::fs::File::open("/proc/mounts").ok()?.take(1 << 20).read_to_string(&mut text).ok()?;
    let path = path.canonicalize().ok()?;
    text.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_, mount, fs) = (f.next()?, f.next()?, f.next()?);
            path.starts_with(mount).then(|| (mount.len(), fs.to_string()))
        })
        .max_by_key(|(len, _)| *len)
        .map(|(_, fs)| fs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_found_in_what_the_programs_print() {
        assert_eq!(version_in("etcd Version: 3.4.23\nGit SHA: Not provided").as_deref(), Some("3.4.23"));
        let redis = "Redis server v=7.0.15 sha=00000000:0 malloc=jemalloc-5.3.0 bits=64 build=ae4d7c971a948f0";
        assert_eq!(version_in(redis).as_deref(), Some("7.0.15"));
        assert_eq!(version_in("redis-benchmark 7.0.15").as_deref(), Some("7.0.15"));
        assert_eq!(version_in("no version here 1. .2 a.b"), None);
        assert!(load_average().is_some_and(|l| l.parse::<f64>().is_ok()));
    }

    #[test]
    fn missing_programs_are_not_found_and_present_ones_are() {
        assert!(which("psmr-no-such-program-anywhere").is_none());
        assert!(which("sh").is_some(), "every machine has a shell on PATH");
    }

    #[test]
    fn children_die_with_their_guard_and_scratch_dirs_vanish() {
        let scratch = Scratch::new("test").unwrap();
        let log = scratch.path.join("child.log");
        let mut command = Command::new("sh");
        command.args(["-c", "echo started; exec sleep 600"]);
        let mut child = ChildGuard::spawn(command, "a sleeper", &log).unwrap();
        child.check_running().unwrap();
        let pid = child.pid();
        drop(child);
        assert!(!Path::new(&format!("/proc/{pid}")).exists(), "killed and reaped");
        let mut quick = Command::new("sh");
        quick.args(["-c", "echo bye; exit 3"]);
        let mut gone = ChildGuard::spawn(quick, "a quitter", &log).unwrap();
        let status = gone.wait_timeout(Duration::from_secs(600)).unwrap();
        assert_eq!(status.code(), Some(3));
        let err = gone.check_running().unwrap_err().to_string();
        assert!(err.contains("a quitter exited") && err.contains("bye"), "{err}");
        let dir = scratch.path.clone();
        drop(scratch);
        assert!(!dir.exists());
        assert_eq!(free_ports(3).unwrap().iter().collect::<std::collections::BTreeSet<_>>().len(), 3);
    }
}
