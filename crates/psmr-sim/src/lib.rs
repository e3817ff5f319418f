//! # psmr-sim: deterministic simulation of whole clusters
//!
//! A cluster of 3 or 5 replicas and a handful of clients run in one
//! process, on one thread, on a simulated clock, network and disk, every
//! random choice drawn from one seeded generator
//! ([`rand_chacha::ChaCha8Rng`]): the same seed gives the same run, event
//! for event, on any machine. A failing seed is a reproducible bug report:
//! `psmr simulate --replay SEED` runs it again and prints its trace.
//!
//! ## What is real and what is simulated
//!
//! Real: each replica's whole core, the code replicas run
//! (`psmr-core`). Its protocol — raft-rs's `RawNode` in the configuration
//! of real replicas, the guard every peer message passes, the batcher, the
//! reads without the log (ReadIndex rounds, floors, deferred requests),
//! membership changes driven by client requests, ready handling — and its
//! apply loop — the reply cache consulted in log order, the snapshot
//! triggers and format, the restore — with the key-value store executed
//! through psmr-sched's `sequential` scheduler behind the `Scheduler`
//! trait, exactly as a replica's service manager submits to it. What a
//! replica's threads do around the core, this crate does around it
//! (its `node` module): requests checked and encoded as ClientIO does them, answers
//! sent to the clients served here, snapshots written as the side pool
//! writes them.
//!
//! Simulated, and nothing else:
//!
//! * the disk (its `store` module): synced and unsynced writes, a crash losing the
//!   unsynced, torn writes, a full disk, damage; every restart recovers by
//!   the disk store's own rule (psmr-storage's sync record), and a refused
//!   replica is repaired as an operator repairs one;
//! * the network (`net`), the clock (every replica's raft tick at its own
//!   rate under `skew`), and the clients (`client`): one request
//!   outstanding each, of one to three commands of a few keys, so that they
//!   conflict constantly; retried with the same sequence numbers elsewhere
//!   after a timeout or a redirect, given up after [`ATTEMPTS_MAX`]
//!   attempts (a write is then `unknown`, a read `fail`). A third of the
//!   requests carry a side command on keys of its own whose outcome
//!   depends on the log's clock and seed (keys that expire mid-run, random
//!   pops): the history does not check it, the replicas' equal states do.
//!
//! Replicas draw raft's randomized election timeouts from a generator the
//! simulation seeds (`psmr_core::protocol::Options`), so a run depends on
//! its seed alone.
//!
//! ## Faults
//!
//! Each kind can be switched on or off ([`Faults`]); when on, its rate is
//! drawn per seed, so some runs are calm and some are storms.
//!
//! * `loss`: a packet (raft message, request or reply) is dropped.
//! * `delay`: a packet takes up to 100 ms instead of up to 1.5 ms.
//! * `duplicate`: a packet arrives twice.
//! * `reorder`: packets of one link may overtake each other (otherwise
//!   links are FIFO, like TCP connections).
//! * `partition`: the replicas are split in two groups that cannot talk;
//!   `one-way`: one group's packets to the other are dropped, but not the
//!   other way round. Clients reach every replica.
//! * `crash`: a replica loses everything in memory and what its disk had
//!   not synced, and restarts later from its disk.
//! * `torn`: the crash strikes the replica's next synced write, which has
//!   reached the disk or not; some of the messages it was sending left,
//!   and the apply loop may have taken the work handed to it.
//! * `skew`: each replica's raft tick runs at its own rate, 0.7 to 1.4
//!   times the nominal 10 ms, and its wall clock is up to 5 s off: the
//!   stamps of entries must not go back when a leader with a slower clock
//!   follows one with a faster clock (checked on every entry applied).
//! * `membership`: replicas join and leave. The founders' logs start with
//!   the founding entries, as real replicas' do, and two more replicas may
//!   join. Now and then an administrator asks the replica it believes
//!   leads for a change, as `psmr client add-replica` / `remove-replica`
//!   do, and follows redirects until it is answered: add a replica that
//!   never ran (it starts at once with an empty log) or remove a member
//!   (keeping three). A replica stops as soon as it commits its own
//!   removal; one that never learns it is stopped at the end, as its next
//!   handshake would tell a real one.
//! * `disk-full`: a replica's disk refuses synced writes for a while; the
//!   replica stops with the store's reason, and restarts once space is
//!   back, with nothing lost.
//! * `damage`: a crashed replica's log loses synced entries; at its restart
//!   recovery refuses it, and it is repaired (an empty log, its term and
//!   vote kept, a vote floor) and catches up.
//! * `pause`: a replica's process stops (a long garbage collection, a
//!   `SIGSTOP`, a virtual machine descheduled) for up to half a second:
//!   what reaches it waits, its clock does not tick; then it goes on where
//!   it was, one tick later, believing what it believed (a leader that did
//!   not see its successor elected).
//!
//! A run has two phases: `steps` simulated milliseconds of load with
//! faults, then a quiet phase: every fault healed, every replica up, no new
//! requests, until every replica has applied everything the leader
//! committed (or [`SimConfig::quiet_ms`] passes: no convergence is a
//! violation too).
//!
//! ## What is checked
//!
//! * Agreement: the entries every replica applies are prefixes of one
//!   sequence: (index, term, digest of the entry's data) must match.
//! * Equal states: the state digest after each applied index is the same on
//!   every replica that applies it (or restores a snapshot there), and at
//!   the end every replica has the same applied index, state and reply
//!   cache.
//! * Exactly-once: a write (client, sequence number) executes at one log
//!   index only, however many times it was retried and proposed.
//! * Client order: a client's commands execute in the order of their
//!   sequence numbers.
//! * Linearizability of the clients' history ([`SimOutcome::history`]),
//!   by [`dst`] with psmr-harness's checker.
//!
//! ## Testing the checks: planted bugs
//!
//! [`SimConfig::bug`] plants a known bug in the replicas' core
//! ([`Bug`], never in this crate's code): the tests make sure the checks
//! catch each one, so that a simulation that passes means something.
//!
//! ## Replaying
//!
//! Every run is a function of its seed and its [`SimConfig`]. With
//! [`SimConfig::trace`] on, [`SimOutcome::trace`] lists every event (packet
//! deliveries with their raft fields, proposals, role changes, crashes,
//! partitions, client operations); [`SimOutcome::trace_hash`] digests the
//! same events and is always computed.
//!
//! In the guide: `docs/design.md` places this crate among the others;
//! `docs/testing.md`: `psmr simulate` and what it checks.

mod checks;
mod client;
mod config;
pub mod dst;
mod net;
mod node;
mod outcome;
mod run;
mod store;
mod world;

pub use client::ATTEMPTS_MAX;
pub use config::{Faults, SimConfig};
pub use outcome::{
    FaultCounts, OpKind, OpResult, OpStatus, SimError, SimOp, SimOutcome, SimStats, Violation, ViolationKind,
};
pub use psmr_core::bug::Bug;
pub use run::run;
