//! Checking and running the cases of the peers scenario: etcd and Redis
//! through their drivers ([`super::etcd`], [`super::redis`]), psmr as an
//! ordinary point of [`crate::runner`] on a fresh cluster of replica
//! processes.

use super::{Case, PeerLoad, Row, Setup, Tools};
use crate::faults::Faults;
use crate::runner::{self, RunError, Runner, Target};
use crate::scenario::{Params, Point, ScenarioError, Sweep};
use std::path::Path;

/// Every case to run for `sweeps` (the scenario's merged with the
/// overrides): [`super::plan`] for the client counts swept, else the
/// base's.
pub fn plan(sweeps: &[Sweep], base: &Params) -> Result<Vec<Case>, RunError> {
    let clients = match sweeps.iter().find(|s| s.key == "clients") {
        Some(s) => s
            .values
            .iter()
            .map(|v| {
                v.parse::<usize>().map_err(|_| ScenarioError::BadValue {
                    key: s.key.clone(),
                    value: v.clone(),
                    why: "a whole number".into(),
                })
            })
            .collect::<Result<Vec<_>, _>>()?,
        None => vec![base.clients],
    };
    Ok(super::plan(&clients))
}

/// The parameters of a psmr case.
fn case_params(base: &Params, storage: &str, clients: usize, per_request: usize) -> Params {
    Params { storage: storage.to_string(), clients, per_request, ..base.clone() }
}

/// Checks one case's settings before the first run.
pub fn check(case: &Case, base: &Params, seed: u64) -> Result<(), RunError> {
    match case {
        Case::Psmr { storage, clients, per_request } => {
            runner::check_params(&case_params(base, storage, *clients, *per_request), false, seed)
        }
        Case::Etcd { clients, .. } | Case::Redis { clients, .. } => Ok(PeerLoad::of(base, *clients, seed).map(drop)?),
    }
}

/// Versions, the load and the psmr cluster, for the report.
pub fn setup(tools: &Tools, base: &Params, seed: u64) -> Setup {
    let tmp = std::env::temp_dir();
    let fs = super::fs_type(&tmp).unwrap_or_else(|| "file system unknown".into());
    Setup {
        etcd_version: super::version_of(&tools.etcd),
        redis_version: super::version_of(&tools.redis_server),
        redis_benchmark_version: super::version_of(&tools.redis_benchmark),
        keys: base.keys,
        key_bytes: super::KEY_BYTES,
        value_bytes: base.value_bytes.unwrap_or(super::VALUE_BYTES),
        warmup_s: base.warmup_s,
        duration_s: base.duration_s,
        seed,
        psmr: psmr_summary(base),
        data_dir: format!("{} ({fs}), for etcd and psmr alike", tmp.display()),
        cores: psmr_sched::cpus::Cpus::read().usable,
        load_average: load_average(),
    }
}

/// The machine's 1-minute load average, or `unknown`.
pub fn load_average() -> String {
    super::load_average().unwrap_or_else(|| "unknown".into())
}

/// The psmr cluster of `p` in words.
fn psmr_summary(p: &Params) -> String {
    format!(
        "{} `psmr replica` processes ({} between them), scheduler {}, {} workers, {} ClientIO threads, log entries of at most {} commands, batch delay {} µs, pipeline {}; closed-loop psmr clients that find the leader and send to it",
        p.replicas,
        if p.insecure_peers { "plain TCP" } else { "mutual TLS" },
        p.scheduler,
        p.workers,
        p.client_io_threads,
        p.batch_max_commands,
        p.batch_delay_us,
        p.pipeline
    )
}

/// Runs one case; psmr's replicas are processes of `exe` (the `psmr`
/// executable). Logs go to `logs`.
pub fn run(
    case: &Case,
    tools: &Tools,
    setup: &Setup,
    base: &Params,
    logs: &Path,
    seed: u64,
    exe: &Path,
) -> Result<Row, RunError> {
    Ok(match case {
        Case::Etcd { fsync, clients } => {
            let load = PeerLoad::of(base, *clients, seed)?;
            super::etcd::run(&tools.etcd, &setup.etcd_version, *fsync, &load, logs)?
        }
        Case::Redis { clients, pipeline } => {
            let load = PeerLoad::of(base, *clients, seed)?;
            let versions = (setup.redis_version.as_str(), setup.redis_benchmark_version.as_str());
            super::redis::run(tools, versions, &load, *pipeline, logs)?
        }
        Case::Psmr { storage, clients, per_request } => {
            let runner = Runner { target: Target::Local { exe: exe.to_path_buf() }, faults: Faults::default(), seed };
            psmr_row(&runner, &case_params(base, storage, *clients, *per_request), logs)?
        }
    })
}

/// One psmr run of the peers scenario, as a row of its table.
fn psmr_row(runner: &Runner, p: &Params, logs: &Path) -> Result<Row, RunError> {
    let label = [("storage", p.storage.clone()), ("clients", p.clients.to_string())];
    let point = Point { params: p.clone(), label: label.map(|(k, v)| (k.to_string(), v)).to_vec() };
    let r = runner.run(&point, None, logs)?;
    let l = r.latency_us.get("request").cloned().unwrap_or_default();
    Ok(Row {
        system: "psmr".into(),
        setup: p.storage.clone(),
        clients: p.clients,
        per_request: p.per_request,
        puts_per_s: r.commands_per_s,
        p50_us: l.p50,
        p99_us: l.p99,
        max_us: l.max,
        failed_requests: r.failed_requests,
        cpu: r.cpu,
        cpu_note: r.cpu_note,
        ran: format!(
            "psmr {}: storage {}; {} clients x {} puts per request, {} % writes, {} B values",
            env!("CARGO_PKG_VERSION"),
            p.storage,
            p.clients,
            p.per_request,
            p.write_pct,
            p.value_bytes.map_or("decimal".to_string(), |b| b.to_string())
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_follows_the_clients_swept() {
        let base = super::super::base_params();
        assert_eq!(plan(&[], &base).unwrap().len(), super::super::plan(&[base.clients]).len());
        let sweep: Sweep = "clients=1,8".parse().unwrap();
        assert_eq!(plan(&[sweep], &base).unwrap(), super::super::plan(&[1, 8]));
        let big = Case::Psmr { storage: "memory", clients: 1, per_request: 2000 };
        assert!(check(&big, &base, 1).unwrap_err().to_string().contains("above batch_max_commands"));
    }
}
