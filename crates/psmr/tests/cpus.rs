//! The CPUs a replica may use, as its status says: under an affinity mask
//! (`taskset`) and under a cgroup v1 CPU quota this test makes (root
//! only, as on this project's machines and CI).

use psmr::harness::launch::{ClusterDir, ClusterSpec};
use psmr::harness::probe::Probe;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// A replica process, killed when dropped.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A one-replica cluster started by `sh -c "PREFIX exec WRAPPER psmr
/// replica ..."`: what its status says of its CPUs.
fn cpus_under(prefix: &str, wrapper: &str) -> String {
    let dir = ClusterDir::scratch("psmr-cpus-test-").unwrap();
    let config = ClusterSpec { replicas: 1, ..ClusterSpec::default() }.config(dir.path()).unwrap();
    let file = dir.write(&config).unwrap();
    let exe = env!("CARGO_BIN_EXE_psmr");
    let script = format!("{prefix} exec {wrapper} \"$0\" replica --config \"$1\" --id 1");
    let child = Command::new("sh").arg("-c").arg(script).arg(exe).arg(&file).spawn().unwrap();
    let mut running = Running(child);
    let probe = Probe::new(&[config.replicas[0].client]).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(Ok(status)) = probe.statuses(Duration::from_secs(1)).into_iter().next() {
            return status.cpus;
        }
        if let Ok(Some(status)) = running.0.try_wait() {
            panic!("the replica exited: {status}");
        }
        assert!(Instant::now() < deadline, "the replica never answered");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn an_affinity_mask_bounds_the_usable_cpus() {
    let cpus = cpus_under("", "taskset -c 0");
    assert!(cpus.starts_with("1 (affinity 1, "), "{cpus}");
}

/// A cgroup v1 of the `cpu` controller, removed when dropped.
struct Cgroup(PathBuf);

impl Drop for Cgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

#[test]
fn a_cgroup_quota_bounds_the_usable_cpus() {
    let cpu = Path::new("/sys/fs/cgroup/cpu");
    assert!(
        cpu.join("cpu.cfs_quota_us").exists(),
        "this test needs cgroup v1's cpu controller at {} (and root)",
        cpu.display()
    );
    let group = Cgroup(cpu.join(format!("psmr-cpus-test-{}", std::process::id())));
    std::fs::create_dir_all(&group.0).unwrap();
    std::fs::write(group.0.join("cpu.cfs_period_us"), "100000").unwrap();
    std::fs::write(group.0.join("cpu.cfs_quota_us"), "50000").unwrap();
    let enter = format!("echo $$ > {}/cgroup.procs &&", group.0.display());
    let cpus = cpus_under(&enter, "");
    assert!(cpus.starts_with("1 (") && cpus.contains("quota 0.50 CPUs"), "{cpus}");
}
