//! Deterministic simulation testing of whole clusters (`psmr_sim`, judged
//! by `psmr_sim::dst`): seeds with every fault pass every check, a seed
//! replays identically, and the checks catch the bugs planted in the core.

use psmr_harness::history::{OpKind, Status};
use psmr_sim::dst::{self, DstConfig, DstReport};
use psmr_sim::{self as sim, Bug, Faults, OpResult, OpStatus, SimConfig, SimOp};

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
        ("stops on a full disk", f.full_stops),
        ("repairs", f.repairs),
        ("pauses", f.pauses),
    ] {
        assert!(n > 0, "no {what} in 400 seeds:\n{text}");
    }
    assert!(report.cache_answers > 0, "no retry was answered by a reply cache:\n{text}");
    assert!(report.reads_without_log > 400, "leaders served (almost) no read with ReadIndex:\n{text}");
    assert!(report.ops_ok > 400 * 50, "too little load:\n{text}");
    // Followers behind the compacted log catch up from snapshots sent in
    // chunks, through the lost, duplicated and delayed packets.
    assert!(report.snapshots_installed > 40, "few snapshots restored from a leader:\n{text}");
    assert!(report.snapshot_chunks > 2 * report.snapshots_installed, "snapshots in few chunks:\n{text}");
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
/// honest `MsgTimeoutNow`s; see docs/testing.md.)
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

/// The simulation that exposes `bug`: the defaults, but for the two bugs
/// that only show when a leader changes while reads skip the log, or while
/// a replica that lost data is behind its vote floor: every seed serves
/// reads with ReadIndex, and every seed has crashes that damage disks,
/// pauses and a lossy, slow network.
fn exposing(bug: Bug) -> SimConfig {
    match bug {
        Bug::ReadWithoutRound => SimConfig { reads_through_log: Some(false), ..SimConfig::default() },
        Bug::IgnoreVoteFloor => SimConfig {
            replicas: 3,
            faults: Faults::parse("crash,damage,pause,loss,delay").unwrap(),
            ..SimConfig::default()
        },
        _ => SimConfig::default(),
    }
}

/// Runs up to `seeds` seeds from `first_seed` with `bug` planted; the
/// report (stopping at the first violation).
fn with_bug(bug: Bug, first_seed: u64, seeds: u64) -> DstReport {
    run(DstConfig {
        first_seed,
        seeds,
        jobs: jobs(),
        sim: SimConfig { bug: Some(bug), ..exposing(bug) },
        stop_on_violation: true,
        ..DstConfig::default()
    })
}

/// The checks that judge the protocol: what clients saw (linearizability),
/// agreement, equal states, exactly-once, client order, convergence, and
/// the raft rules every honest message keeps (the guard of the replica
/// that receives it). A panic or a replica that stops is not one: an
/// assertion beside a bug would catch it that way.
const PROTOCOL_CHECKS: [&str; 7] = [
    "not-linearizable",
    "divergence",
    "state-mismatch",
    "double-execution",
    "client-order",
    "no-convergence",
    "guard-refusal",
];

/// Every bug planted in the core is caught by a protocol check within 200
/// seeds, from two first seeds far apart.
#[test]
fn every_planted_bug_is_caught_within_200_seeds() {
    for bug in Bug::ALL {
        for first_seed in [0, 7_000_000] {
            let report = with_bug(bug, first_seed, 200);
            let caught = report.violations.iter().find(|v| PROTOCOL_CHECKS.contains(&v.kind.as_str()));
            assert!(
                caught.is_some(),
                "{bug} from seed {first_seed}: not caught by a protocol check:\n{}",
                report.text()
            );
        }
    }
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
        assert_eq!(name.parse::<Bug>().unwrap().name(), name);
    }
    assert!("typo".parse::<Bug>().is_err());
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
