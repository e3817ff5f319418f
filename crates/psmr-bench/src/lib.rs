//! # psmr-bench: measuring psmr
//!
//! This crate turns psmr's parts into numbers people can compare. The
//! scheduler benchmark behind `psmr sched-bench` generates a
//! workload for a service and class model, cuts it into ordered batches
//! before the clock starts, and feeds the same batches to each scheduler in
//! turn, with no network and no consensus in the way. Every run starts from
//! a fresh service and ends with the service's state digest and a digest of
//! all replies; a parallel scheduler that disagrees with `sequential` is an
//! error, not a number.
//!
//! [`scenario`] names the end-to-end experiments of `psmr bench` and
//! expands their parameter sweeps; [`report`] writes their results as
//! JSON, CSV, SVG plots and a Markdown report, with [`timeline`] for
//! workloads that shift during a run and [`compare`] for `auto` against
//! the fixed schedulers and for points run several times (`--repeat`);
//! [`simulate`] is the bitmap false-positive simulation of 004 Table I.
//!
//! [`history`] reads client histories of the key-value store and checks
//! them for linearizability (`psmr check-history`).
//!
//! [`load`] is the closed-loop load of `psmr client load` and `psmr
//! bench`, against any cluster; [`launch`] starts, kills, restarts and
//! watches local clusters of replica processes (`psmr cluster`);
//! [`faults`] kills and restarts their replicas while a load runs;
//! [`runner`] runs a scenario's points with them; [`probe`] asks a running
//! cluster about itself (`psmr client status`).
//!
//! [`cpu`] reads processes' CPU time from `/proc` (the CPU µs per command
//! of each replica); [`kv_stream`] is the kv load's random stream of keys
//! and values; [`peers`] runs etcd and Redis next to psmr (`psmr bench
//! --scenario peers`).
//!
//! [`rt_bench`] runs psmr-rt's task pools next to tokio on the workloads
//! of 001 (`psmr rt-bench`).
//!
//! [`fuzz`] is the seeded mutation fuzzer of the decoders that read the
//! network and the disk (`psmr fuzz`).

pub mod compare;
pub mod cpu;
pub mod faults;
pub mod fuzz;
pub mod kv_stream;
pub mod launch;
pub mod load;
pub mod peers;
pub mod probe;
pub mod report;
pub mod rt_bench;
pub mod runner;
pub mod scenario;
pub mod sched_bench;
pub mod simulate;
pub mod timeline;

pub use psmr_harness::history;

pub use sched_bench::{
    format_metrics_table, format_table, run, BenchError, Isolate, MappingSource, MetricsSample, RunReport,
    SchedBenchConfig, ServiceKind,
};
