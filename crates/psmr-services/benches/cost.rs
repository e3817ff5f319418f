//! Calibration of the execution costs: a moderate (heavy) key-value read
//! should take about as long as a moderate (heavy) list lookup that scans
//! the whole list. Criterion prints the pairs side by side.
#![allow(missing_docs)] // criterion_group! generates undocumented items

use criterion::{criterion_group, criterion_main, Criterion};
use psmr_model::{ClassId, ClientId, Command, Service};
use psmr_services::{kv, list, Cost};
use std::hint::black_box;

fn command<O>(op: O) -> Command<O> {
    Command {
        client: ClientId(1),
        seq: 1,
        class: ClassId(0),
        reads: [0].into_iter().collect(),
        writes: Default::default(),
        op,
        stamp: Default::default(),
    }
}

fn costs(c: &mut Criterion) {
    let mut group = c.benchmark_group("command-cost");
    for cost in [Cost::Moderate, Cost::Heavy] {
        let size = cost.list_size();
        let l = list::ListService::new(1, size);
        // A value that is not in the list: the lookup scans every entry.
        let miss = command(list::ListOp::Contains { shard: 0, value: -1 });
        group.bench_function(format!("list-scan/{cost}"), |b| b.iter(|| black_box(l.execute(black_box(&miss)))));
        let store = kv::KvService::new(16, cost);
        let read = command(kv::KvOp::Read { key: kv::key_bytes(3) });
        group.bench_function(format!("kv-read/{cost}"), |b| b.iter(|| black_box(store.execute(black_box(&read)))));
    }
    group.finish();
}

criterion_group!(benches, costs);
criterion_main!(benches);
