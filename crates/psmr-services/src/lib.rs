//! # psmr-services: the services psmr replicates, and the workloads that drive them
//!
//! This crate holds the two services of the papers psmr reproduces, each with
//! everything a scheduler or a benchmark needs besides the service itself:
//!
//! * [`list`]: the sharded linked list of "Early Scheduling in Parallel SMR"
//!   (003 §6.2) and its three class models (readers-writers, sharded with
//!   snapshots, sharded with global reads and writes; 003 Fig. 1).
//! * [`kv`]: the key-value store of "Efficient and Deterministic Scheduling
//!   for Parallel SMR" (004 §VI), with a readers-writers and a sharded model,
//!   byte-string keys, and the Redis string commands (`GET`, `SET`, `INCR`,
//!   `MGET`, ...) through [`kv::KvRedis`].
//!
//! For each service the module offers the same five things:
//!
//! 1. the service, implementing [`psmr_model::Service`]: it executes
//!    commands from many worker threads, takes and restores snapshots, and
//!    digests its state;
//! 2. `class_model(model, shards)`: the request classes and their conflicts;
//! 3. `default_mapping(model, shards, workers)`: a class-to-threads mapping
//!    that obeys rules R.1-R.5 for any number of workers;
//! 4. `generate(model, config, ..)`: a reproducible workload described by a
//!    [`WorkloadConfig`] (the α-β-γ [`Mix`] of 000 §5.4, skew, and the
//!    [`Spread`] of conflicting commands of 000 §7.1);
//! 5. key sets on every generated command that say exactly what `execute`
//!    touches, so that the late schedulers and
//!    [`psmr_model::ClassModel::check_commands`] see the true conflicts.
//!
//! Services guard their memory with locks (one per list shard, one per
//! stripe of keys), so a scheduler that runs conflicting commands at once
//! gets wrong answers, which differential tests catch, never undefined
//! behaviour. With the `sanitizer` feature the services also record which
//! commands are inside each shard or key and panic, naming both commands,
//! the moment two conflicting ones overlap; without it that bookkeeping is
//! compiled out entirely.
//!
//! The crate depends on `psmr-model`, and on `psmr-resp` for the Redis
//! command table alone. Schedulers use it in their
//! tests, benchmarks and the CLI use it to build runs; it never depends on
//! them, so a service can be read and tested without any scheduler.
//!
//! In the guide: `docs/design.md` places this crate among the others;
//! `docs/redis.md`: the key-value store as Redis clients see it.

mod app;
pub mod kv;
pub mod list;
#[cfg(feature = "sanitizer")]
mod sanitizer;
mod workload;

pub use app::{BuiltIn, KvApp, ListApp, ServiceConfig, START_KEYS_MAX};
#[cfg(feature = "sanitizer")]
pub use sanitizer::Occupancy;
pub use workload::{Cost, Mix, Spread, WorkloadConfig, WorkloadError, KEYS_MAX, SHARDS_MAX};

use psmr_model::{ClassMapping, ClassModelBuilder, Mode};

/// Clamps a shard count into `1..=SHARDS_MAX`, so that class models and
/// mappings can be built for any input without failing.
fn clamp_shards(shards: usize) -> usize {
    shards.clamp(1, SHARDS_MAX)
}

/// Declares the local classes `R1..RS`, `W1..WS` (ids `0..2S`) with the
/// conflicts `Ri-Wi` and `Wi-Wi` shared by every sharded model.
fn local_classes(mut builder: ClassModelBuilder, shards: usize) -> ClassModelBuilder {
    for i in 1..=shards {
        builder = builder.class(format!("R{i}"));
    }
    for i in 1..=shards {
        builder = builder.class(format!("W{i}"));
    }
    for i in 1..=shards {
        builder = builder.conflict(format!("R{i}"), format!("W{i}")).conflict(format!("W{i}"), format!("W{i}"));
    }
    builder
}

/// The threads of each shard: with at least as many workers as shards,
/// shard `g` gets every thread `t` with `t % shards == g` (so groups are
/// disjoint and as equal as possible); with fewer, shard `i` shares thread
/// `i % workers` with other shards. With no worker every group is empty,
/// which [`psmr_model::Mapping::validate`] then reports.
fn shard_groups(shards: usize, workers: usize) -> Vec<Vec<usize>> {
    (0..shards)
        .map(|g| match workers {
            0 => Vec::new(),
            w if w >= shards => (g..w).step_by(shards).collect(),
            w => vec![g % w],
        })
        .collect()
}

/// The lowest thread of each group: the smallest set that shares a thread
/// with every group, which is what a sequential class conflicting with every
/// local write class needs (rule R.5) and no more.
fn group_heads(groups: &[Vec<usize>]) -> Vec<usize> {
    groups.iter().filter_map(|g| g.first().copied()).collect()
}

/// Mapping entries of the local classes, in the order of [`local_classes`]:
/// `Ri` concurrent and `Wi` sequential on the threads of shard `i`.
fn local_mappings(groups: &[Vec<usize>]) -> Vec<ClassMapping> {
    let reads = groups.iter().map(|g| ClassMapping::new(Mode::Concurrent, g.iter().copied()));
    let writes = groups.iter().map(|g| ClassMapping::new(Mode::Sequential, g.iter().copied()));
    reads.chain(writes).collect()
}

/// The readers-writers mapping: reads concurrent, writes sequential, both
/// on every thread.
fn readers_writers_mappings(workers: usize) -> Vec<ClassMapping> {
    vec![ClassMapping::new(Mode::Concurrent, 0..workers), ClassMapping::new(Mode::Sequential, 0..workers)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_partition_threads_or_share_them() {
        assert_eq!(shard_groups(2, 4), vec![vec![0, 2], vec![1, 3]]);
        assert_eq!(shard_groups(3, 4), vec![vec![0, 3], vec![1], vec![2]]);
        assert_eq!(shard_groups(3, 2), vec![vec![0], vec![1], vec![0]]);
        assert_eq!(shard_groups(2, 0), vec![Vec::<usize>::new(), Vec::new()]);
        assert_eq!(group_heads(&shard_groups(2, 4)), vec![0, 1]);
    }
}
