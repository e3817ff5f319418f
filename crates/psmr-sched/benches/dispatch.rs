//! Per-command scheduling cost: each scheduler against the plain loop that
//! calls `Service::execute` on every command, over a service whose commands
//! do (almost) nothing, so what is measured is the scheduler itself.
//!
//! `cargo bench -p psmr-sched --bench dispatch`; criterion prints the time
//! per command ("thrpt" in elements/s) for each variant side by side.
#![allow(missing_docs)] // criterion_group! generates undocumented items

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use psmr_model::{Batch, ClassModel, ClientId, Command, Digest, Mapping, Service, SnapshotError};
use psmr_sched::{build, NullSink, SchedConfig, SchedulerKind};
use std::hint::black_box;
use std::sync::Arc;

/// A service whose commands return their sequence number.
struct Noop;

impl Service for Noop {
    type Op = ();
    type Reply = u64;
    fn execute(&self, command: &Command<()>) -> u64 {
        black_box(command.seq)
    }
    fn snapshot(&self) -> Vec<u8> {
        Vec::new()
    }
    fn restore(&self, _: &[u8]) -> Result<(), SnapshotError> {
        Ok(())
    }
    fn digest(&self) -> Digest {
        Digest::default()
    }
}

const COMMANDS: usize = 100_000;
const BATCH: usize = 50;

fn batches(model: &ClassModel) -> Vec<Batch<()>> {
    let r = model.class_id("R").unwrap();
    let cmds: Vec<Command<()>> = (0..COMMANDS as u64)
        .map(|i| Command {
            client: ClientId(i % 64),
            seq: i,
            class: r,
            reads: [i].into_iter().collect(),
            writes: Default::default(),
            op: (),
            stamp: Default::default(),
        })
        .collect();
    cmds.chunks(BATCH).map(|c| Batch::new(c.to_vec(), 1024)).collect()
}

fn per_command_cost(c: &mut Criterion) {
    let model = ClassModel::builder("readers-writers")
        .class("R")
        .class("W")
        .conflict("R", "W")
        .conflict("W", "W")
        .build()
        .unwrap();
    let input = batches(&model);
    let mut group = c.benchmark_group("schedule-100k-read-commands");
    group.throughput(Throughput::Elements(COMMANDS as u64));
    group.sample_size(20);
    group.bench_function("plain-loop", |b| {
        let service = Noop;
        b.iter_batched(
            || input.clone(),
            |bs| {
                for batch in &bs {
                    for cmd in batch.commands() {
                        black_box(service.execute(cmd));
                    }
                }
            },
            BatchSize::LargeInput,
        )
    });
    let variants: [(SchedulerKind, usize); 6] = [
        (SchedulerKind::Sequential, 1),
        (SchedulerKind::Early, 1),
        (SchedulerKind::Early, 2),
        (SchedulerKind::EarlyBusyWait, 2),
        (SchedulerKind::LateBatchBitmap, 1),
        (SchedulerKind::LateCbase, 1),
    ];
    for (kind, workers) in variants {
        let mapping =
            Mapping::from_spec(&model, workers, &format!("R=conc:0-{w};W=seq:0-{w}", w = workers - 1)).unwrap();
        let config = SchedConfig::new(kind, workers).with_mapping(mapping);
        group.bench_function(format!("{kind}/{workers}"), |b| {
            b.iter_batched(
                || input.clone(),
                |bs| {
                    let mut s = build(&config, Arc::new(Noop), &model, Arc::new(NullSink)).unwrap();
                    for batch in bs {
                        s.submit(batch).unwrap();
                    }
                    s.finish().unwrap()
                },
                BatchSize::LargeInput,
            )
        });
    }
    group.finish();
}

criterion_group!(benches, per_command_cost);
criterion_main!(benches);
