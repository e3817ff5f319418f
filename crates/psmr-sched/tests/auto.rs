//! `auto` switching by itself mid-stream: on a machine it believes idle
//! (a probe that reports no thread waiting for a CPU), with execution the
//! bottleneck, it measures its candidates and so switches several times;
//! every reply and the final state stay those of `sequential`.
//!
//! A workload shift in the middle (read-only, then writes) makes it
//! measure again. The controller's logic itself (hysteresis, starvation,
//! flapping) is tested in `src/auto.rs` on synthetic windows.

use psmr_model::{Batch, Service};
use psmr_sched::auto::Auto;
use psmr_sched::{CollectSink, SchedConfig, Scheduler, SchedulerKind};
use psmr_services::{list, Mix, Spread, WorkloadConfig};
use std::sync::Arc;
use std::time::Duration;

/// `commands` commands of `mix` in batches of 50; sequence numbers start
/// at `first_seq` so that workloads can follow each other.
fn batches(mix: Mix, seed: u64, commands: usize, first_seq: u64) -> Vec<Batch<list::ListOp>> {
    let cfg = WorkloadConfig {
        commands,
        seed,
        shards: 2,
        skew: 0.0,
        write_skew: None,
        spread: Spread::Uniform,
        mix,
        keys: 64,
        clients: 4,
    };
    let mut commands = list::generate(list::ListModel::ShardedGlobal, &cfg, 200).unwrap();
    commands.iter_mut().for_each(|c| c.seq += first_seq);
    commands.chunks(50).map(|c| Batch::new(c.to_vec(), 1024)).collect()
}

#[test]
fn auto_switches_mid_stream_and_matches_sequential() {
    let model = list::class_model(list::ListModel::ShardedGlobal, 2);
    let mut all = batches(Mix::writes(0.0), 1, 30_000, 0);
    all.extend(batches(Mix::writes(50.0), 2, 30_000, 1 << 32));

    let run = |kind: SchedulerKind| {
        let service = Arc::new(list::ListService::new(2, 200));
        let sink = Arc::new(CollectSink::new(4));
        let mut config = SchedConfig::new(kind, 2);
        config.auto_window = Duration::from_micros(500);
        let mut scheduler: Box<dyn Scheduler<list::ListService>> = match kind {
            SchedulerKind::Auto => Box::new(
                Auto::with_probe(&config, service.clone(), &model, sink.clone(), || Some(Duration::ZERO)).unwrap(),
            ),
            _ => psmr_sched::build(&config, service.clone(), &model, sink.clone()).unwrap(),
        };
        for b in &all {
            scheduler.submit(b.clone()).unwrap();
        }
        let decisions = scheduler.decisions();
        assert_eq!(scheduler.decisions_made(), decisions.len() as u64);
        scheduler.finish().unwrap();
        let (replies, duplicates) = sink.take();
        assert!(duplicates.is_empty(), "{kind}: {} duplicate replies", duplicates.len());
        (replies, service.digest(), decisions)
    };
    let (want, want_digest, _) = run(SchedulerKind::Sequential);
    let (got, got_digest, decisions) = run(SchedulerKind::Auto);
    assert_eq!(got.len(), want.len(), "auto lost or invented replies");
    assert!(want == got, "auto replied differently from sequential");
    assert_eq!(got_digest, want_digest);
    let trials = decisions.iter().filter(|d| d.reason.starts_with("measuring")).count();
    assert!(trials >= 2, "auto measured fewer than its two parallel candidates: {decisions:#?}");
    // A switch away from `late-batch-bitmap` overlaps what it holds; one
    // away from `early` takes back what it had not begun and overlaps what
    // it had. Every switch made is recorded, overlapped ones included:
    // each decision leaves what the one before chose.
    assert!(decisions.len() < psmr_sched::auto::DECISIONS_KEPT);
    for pair in decisions.windows(2) {
        assert_eq!(pair[1].from, pair[0].to, "a switch went unrecorded: {decisions:#?}");
    }
    for d in &decisions {
        use psmr_sched::auto::Choice;
        let overlaps = matches!(d.from, Choice::Late(_) | Choice::Early(_));
        let withdraws = matches!(d.from, Choice::Early(_));
        assert!(overlaps || d.overlapped == 0, "{d:#?}");
        assert!(if withdraws { d.withdrawn <= d.held } else { d.withdrawn == 0 }, "{d:#?}");
    }
}
