//! Deterministic simulation testing of whole clusters (`psmr_replica::sim`
//! judged by `psmr_bench::dst`): seeds with every fault pass every check,
//! a seed replays identically, and the checks catch injected bugs.

use psmr_bench::dst::{self, DstConfig, DstReport};
use psmr_bench::history::{OpKind, Status};
use psmr_replica::sim::{self, Bug, Faults, OpResult, OpStatus, SimConfig, SimOp};

fn jobs() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn run(config: DstConfig) -> DstReport {
    dst::run(&config, |_, _| {}).expect("the simulation runs")
}

/// 400 seeds with every fault kind on: no violation of agreement, equal
/// states, exactly-once, convergence or linearizability, and every fault
/// kind was really injected.
#[test]
fn four_hundred_seeds_with_every_fault_pass_every_check() {
    let config = DstConfig {
        first_seed: 1_000,
        seeds: 400,
        jobs: jobs(),
        sim: SimConfig { faults: Faults::all(), ..SimConfig::default() },
        ..DstConfig::default()
    };
    let report = run(config);
    let text = report.text();
    eprintln!("{text}");
    assert_eq!(report.seeds_run, 400);
    assert!(report.violations.is_empty(), "violations (replay with `psmr simulate --replay SEED`):\n{text}");
    assert_eq!(report.failed, 0, "{text}");
    // A history too hard to check proves nothing; a few are tolerable,
    // many would mean the test checks little.
    assert!(report.too_hard <= 10, "{text}");
    assert_eq!(report.passed + report.too_hard, 400, "{text}");
    let f = &report.faults;
    for (what, n) in [
        ("lost", f.lost),
        ("duplicated", f.duplicated),
        ("delayed", f.delayed),
        ("cut", f.cut),
        ("partitions", f.partitions),
        ("one-way partitions", f.one_way_partitions),
        ("crashes", f.crashes),
        ("torn crashes", f.torn_crashes),
        ("restarts", f.restarts),
        ("membership changes", f.member_changes),
    ] {
        assert!(n > 0, "no {what} in 400 seeds:\n{text}");
    }
    assert!(report.cache_answers > 0, "no retry was answered by a reply cache:\n{text}");
    assert!(report.reads_without_log > 400, "leaders served (almost) no read with ReadIndex:\n{text}");
    assert!(report.ops_ok > 400 * 50, "too little load:\n{text}");
}

/// A one-replica cluster commits through light readies only, whose commit
/// index is written unsynced; a machine crash right after a snapshot once
/// left its state ahead of its durable commit, and raft refused to restart
/// it (`psmr simulate --replay 16 --replicas 1` before `DiskStore::install`
/// synced the commit first).
#[test]
fn one_replica_restarts_after_every_crash() {
    let faults = Faults::parse("crash,torn").unwrap();
    let report = run(DstConfig {
        first_seed: 0,
        seeds: 300,
        jobs: jobs(),
        sim: SimConfig { replicas: 1, faults, ..SimConfig::default() },
        ..DstConfig::default()
    });
    assert!(report.clean(), "{}", report.text());
    assert!(report.faults.crashes > 0, "{}", report.text());
}

/// Replicas join and leave while replicas crash and the network splits:
/// every change completes, and every check holds over the members. (The
/// simulation found that a member refusing peers outside the membership it
/// knew could never catch up with a leader added after it fell behind,
/// that a memory log restarted from a snapshot with the founders'
/// membership instead of the snapshot's, and that the guard refused
/// honest `MsgTimeoutNow`s; see the README.)
#[test]
fn membership_changes_under_crashes_and_partitions_pass_every_check() {
    let faults = Faults::parse("membership,crash,torn,partition,loss").unwrap();
    let report = run(DstConfig {
        first_seed: 50_000,
        seeds: 300,
        jobs: jobs(),
        sim: SimConfig { faults, ..SimConfig::default() },
        ..DstConfig::default()
    });
    assert!(report.clean(), "{}", report.text());
    assert!(report.faults.member_changes > 300, "too few membership changes:\n{}", report.text());
}

/// Without faults every operation is answered.
#[test]
fn without_faults_every_operation_is_answered() {
    let report = run(DstConfig {
        first_seed: 0,
        seeds: 8,
        jobs: jobs(),
        sim: SimConfig { faults: Faults::none(), ..SimConfig::default() },
        ..DstConfig::default()
    });
    assert!(report.clean(), "{}", report.text());
    assert_eq!((report.ops_unknown, report.ops_fail), (0, 0), "{}", report.text());
    assert_eq!(report.faults, sim::FaultCounts::default());
}

/// The same seed gives the same run, event for event, whatever thread runs
/// it and whatever raft-rs's thread-local generator draws; another seed
/// gives another run.
#[test]
fn a_seed_replays_identically() {
    let config = SimConfig { trace: true, ..SimConfig::default() };
    let a = sim::run(42, &config).unwrap();
    let b = std::thread::spawn({
        let config = config.clone();
        move || sim::run(42, &config).unwrap()
    })
    .join()
    .unwrap();
    assert!(a.trace.len() > 1_000, "a real run: {} events", a.trace.len());
    assert_eq!(a.trace_hash, b.trace_hash);
    assert_eq!(a.trace, b.trace);
    assert_eq!(a.history, b.history);
    assert_eq!(a.faults, b.faults);
    assert_eq!(a.stats, b.stats);
    // The trace hash does not depend on keeping the text.
    let quiet = sim::run(42, &SimConfig { trace: false, ..config.clone() }).unwrap();
    assert_eq!(quiet.trace_hash, a.trace_hash);
    assert!(quiet.trace.is_empty());
    let other = sim::run(43, &config).unwrap();
    assert_ne!(other.trace_hash, a.trace_hash);
    assert_ne!(other.history, a.history);
}

/// Runs up to `seeds` seeds with `bug` injected; the report (stopping at
/// the first violation).
fn with_bug(bug: Bug, seeds: u64) -> DstReport {
    run(DstConfig {
        first_seed: 0,
        seeds,
        jobs: jobs(),
        sim: SimConfig { bug: Some(bug), ..SimConfig::default() },
        stop_on_violation: true,
        ..DstConfig::default()
    })
}

/// A leader that acknowledges writes before they commit is caught by the
/// linearizability check.
#[test]
fn acknowledging_before_commit_is_caught() {
    let report = with_bug(Bug::AckBeforeCommit, 300);
    assert!(!report.clean(), "300 seeds and no violation:\n{}", report.text());
    assert!(
        report.violations.iter().any(|v| v.kind == "not-linearizable"),
        "caught, but not by the history:\n{}",
        report.text()
    );
}

/// Executing retried writes again (no reply cache) is caught by the
/// exactly-once check.
#[test]
fn executing_a_retry_again_is_caught() {
    let report = with_bug(Bug::NoReplyCache, 300);
    assert!(report.violations.iter().any(|v| v.kind == "double-execution"), "{}", report.text());
}

/// A leader that serves reads without a ReadIndex round (from its own
/// state, even cut off from a newer leader) is caught by the
/// linearizability check.
#[test]
fn reading_without_a_round_is_caught() {
    let report = run(DstConfig {
        first_seed: 0,
        seeds: 1000,
        jobs: jobs(),
        sim: SimConfig { bug: Some(Bug::ReadWithoutRound), reads_through_log: Some(false), ..SimConfig::default() },
        stop_on_violation: true,
        ..DstConfig::default()
    });
    assert!(report.violations.iter().any(|v| v.kind == "not-linearizable"), "{}", report.text());
}

/// A replica that forgets its log on restart is caught.
#[test]
fn forgetting_the_log_on_restart_is_caught() {
    let report = with_bug(Bug::ForgetLogOnRestart, 300);
    assert!(!report.clean(), "300 seeds and no violation:\n{}", report.text());
}

#[test]
fn fault_lists_and_bug_names_parse() {
    assert_eq!(Faults::parse("all").unwrap(), Faults::all());
    assert_eq!(Faults::parse("none").unwrap(), Faults::none());
    let f = Faults::parse("loss, torn,one-way").unwrap();
    assert!(f.loss && f.torn && f.one_way && !f.crash && !f.partition);
    assert_eq!(f.names(), "loss,one-way,torn");
    assert_eq!(Faults::parse(&Faults::all().names()).unwrap(), Faults::all());
    let e = Faults::parse("loss,earthquake").unwrap_err().to_string();
    assert!(e.contains("earthquake") && e.contains("one-way"), "{e}");
    for name in Bug::NAMES {
        assert_eq!(Bug::parse(name).unwrap().name(), name);
    }
    assert!(Bug::parse("typo").is_err());
    assert!(SimConfig { clients: 0, ..SimConfig::default() }.validate().is_err());
    let bad = DstConfig { sim: SimConfig { keys: 0, ..SimConfig::default() }, ..DstConfig::default() };
    assert!(dst::run(&bad, |_, _| {}).is_err());
}

#[test]
fn histories_convert_for_the_checker() {
    let op = |kind, value, result, status| SimOp {
        client: 1_001,
        seq: 1,
        kind,
        key: 3,
        value,
        result,
        invoke_us: 5,
        complete_us: 9,
        status,
    };
    let ops = dst::to_operations(&[
        op(sim::OpKind::Write, Some(77), Some(OpResult::Write(false)), OpStatus::Ok),
        op(sim::OpKind::Read, None, Some(OpResult::Read(Some(77))), OpStatus::Ok),
        op(sim::OpKind::Read, None, Some(OpResult::Read(None)), OpStatus::Ok),
        op(sim::OpKind::Write, Some(78), None, OpStatus::Unknown),
    ]);
    assert_eq!((ops[0].op, ops[0].key.as_str(), ops[0].value.as_deref()), (OpKind::Write, "3", Some("77")));
    assert_eq!(ops[0].result, serde_json::Value::Bool(false));
    assert_eq!(ops[1].result, serde_json::Value::String("77".into()));
    assert_eq!(ops[2].result, serde_json::Value::Null);
    assert_eq!((ops[3].status, ops[0].invoke_ns, ops[0].complete_ns), (Status::Unknown, 5_000, 9_000));
}
