//! # psmr: parallel state machine replication
//!
//! Replicas of your service agree on one order of client commands with
//! Raft, then execute the commands on many cores at once without ever
//! diverging: commands that do not conflict run in parallel, the others in
//! log order, and every replica reaches the same state and replies as a
//! sequential execution would.
//!
//! A service is two impls: [`model::Service`] (execute, snapshot, restore)
//! and [`model::App`] (the codec of its operations, its request classes
//! and which of them conflict, and what each operation touches). Start it
//! as a cluster with [`replica::LocalCluster`] (in this process) or
//! [`replica::ReplicaBuilder`] (one replica per process, from a
//! configuration), and talk to it with [`client::ServiceClient`].
//!
//! This replicated bank (`examples/bank.rs`, run it with `cargo run
//! --example bank`) runs deposits to accounts of different shards in
//! parallel and transfers alone:
//!
//! ```no_run
#![doc = include_str!("../../../examples/bank.rs")]
//! ```
//!
//! Check that a service's classes and keys cover what it really touches
//! with the differential harness, [`sched::check`]: it runs a workload
//! under every parallel scheduler and compares each reply and the final
//! state with sequential execution.
//!
//! The crates, re-exported here:
//!
//! * [`model`]: commands, class models, mappings, the `Service` and `App`
//!   traits, the wire format;
//! * [`sched`]: the execution schedulers and the class-to-threads
//!   optimizer;
//! * [`rt`]: the composable work-stealing task pools (psmr-rt);
//! * [`replica`]: a replica (raft, the staged pipeline, storage) and local
//!   clusters;
//! * [`client`]: the client library;
//! * [`gateway`] and [`resp`]: the Redis port and the Redis protocol;
//! * [`services`]: the built-in key-value store and sharded list;
//! * [`harness`]: local clusters of replica processes, the closed-loop
//!   load, client histories and the linearizability checker;
//! * [`bench`](mod@bench): the end-to-end benchmarks, and
//!   [`sched_bench`] the schedulers' in one process.
//!
//! In the guide: `docs/design.md` places this crate among the others;
//! `docs/cli.md`: every command and flag; README.md for the two commands a newcomer runs.

pub use psmr_bench as bench;
pub use psmr_client as client;
pub use psmr_gateway as gateway;
pub use psmr_harness as harness;
pub use psmr_model as model;
pub use psmr_replica as replica;
pub use psmr_resp as resp;
pub use psmr_rt as rt;
pub use psmr_sched as sched;
pub use psmr_sched_bench as sched_bench;
pub use psmr_services as services;

/// What a service and its driver need, in one import.
pub mod prelude {
    pub use psmr_client::{ClientConfig, ServiceClient};
    pub use psmr_model::wire::{OpCodec, WireError};
    pub use psmr_model::{
        decode_snapshot, encode_snapshot, Access, App, ClassId, ClassModel, Command, Mapping, Refused, SerdeCodec,
        Service, SnapshotError,
    };
    pub use psmr_replica::{Config, LocalCluster, Replica, ReplicaBuilder};
}
