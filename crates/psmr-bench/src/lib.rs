//! # psmr-bench: measuring psmr
//!
//! This crate turns psmr clusters into numbers people can compare (the
//! schedulers alone, in one process, are psmr-sched-bench's).
//!
//! [`scenario`] names the end-to-end experiments of `psmr bench` and
//! expands their parameter sweeps; [`report`] writes their results as
//! JSON, CSV, SVG plots and a Markdown report, with [`timeline`] for
//! workloads that shift during a run and [`compare`] for `auto` against
//! the fixed schedulers and for points run several times (`--repeat`);
//! [`simulate`] is the bitmap false-positive simulation of 004 Table I.
//!
//! [`runner`] runs a scenario's points on clusters that psmr-harness
//! starts and loads ([`psmr_harness::launch`], [`psmr_harness::load`]);
//! [`faults`] kills and restarts their replicas while a load runs.
//! [`catch_up`] fills a state of a given size and times the replicas that
//! must reach it (`psmr bench --scenario catch-up`); [`peers`] runs etcd
//! and Redis next to psmr (`psmr bench --scenario peers`).
//!
//! [`rt_bench`] runs psmr-rt's task pools next to tokio on the workloads
//! of 001 (`psmr rt-bench`).
//!
//! In the guide: `docs/design.md` places this crate among the others;
//! `docs/benchmarks.md`: `psmr bench` and its scenarios; docs/nemesis.md for faults.

pub mod catch_up;
pub mod compare;
pub mod faults;
pub mod peers;
pub mod report;
pub mod rt_bench;
pub mod runner;
pub mod scenario;
pub mod simulate;
pub mod timeline;
