//! # psmr-harness: running and judging clusters from outside
//!
//! What starts, probes, loads and hurts psmr clusters, and what judges
//! them by what their clients saw, for whoever runs them (`psmr
//! cluster`, `psmr client`, the benchmarks, the deterministic simulator):
//!
//! - [`launch`] starts, kills, restarts and watches local clusters of
//!   replica processes (`psmr cluster`), and [`probe`] asks a running
//!   cluster about itself (`psmr client status`);
//! - [`load`] is the closed-loop load of `psmr client load` and `psmr
//!   bench`, against any cluster, with [`kv_stream`] its random keys and
//!   values and [`cpu`] each replica process's CPU time from `/proc`;
//! - [`relay`] cuts, stalls, resets and delays the links between
//!   replicas of a local cluster, [`disk`] puts each replica's data on a
//!   small disk of its own that can fill up, and [`nemesis`] hurts a
//!   cluster with them, with pauses and with kills, on a schedule drawn
//!   from a seed, and [`verdict`] judges what the clients saw of it:
//!   acknowledged writes still there, histories linearizable, replicas
//!   agreeing;
//! - [`fuzz`] is the seeded mutation fuzzer of the decoders that read the
//!   network and the disk (`psmr fuzz`);
//! - [`history`] holds client histories and checks them for
//!   linearizability (`psmr check-history`, the simulator).
//!
//! Everything but [`history`] sits behind the default `clusters` feature:
//! the simulator, which must not depend on a replica's threads, takes the
//! histories alone.
//!
//! In the guide: `docs/design.md` places this crate among the others;
//! `docs/nemesis.md`: faults against real processes; docs/testing.md for histories and their checker.

#[cfg(feature = "clusters")]
pub mod clock;
#[cfg(feature = "clusters")]
pub mod cpu;
#[cfg(feature = "clusters")]
pub mod disk;
#[cfg(feature = "clusters")]
pub mod fuzz;
pub mod history;
#[cfg(feature = "clusters")]
pub mod kv_stream;
#[cfg(feature = "clusters")]
pub mod launch;
#[cfg(feature = "clusters")]
pub mod load;
#[cfg(feature = "clusters")]
pub mod nemesis;
#[cfg(feature = "clusters")]
pub mod probe;
#[cfg(feature = "clusters")]
pub mod relay;
#[cfg(feature = "clusters")]
pub mod verdict;
