//! # psmr-rt: composable work-stealing task pools
//!
//! A task runtime whose scheduling policy is a choice and whose pools
//! compose (seed 001). A [`Pool`] is a set of worker threads, each with a
//! local queue ordered by the pool's [`Policy`] (`fifo`, `lifo`,
//! `fifo-slot`, and the LIFO heuristics of 001 §5.3.3), which idle
//! workers steal from ([`Steal`]: half or one; [`Victims`]: anyone or a
//! neighbourhood). A full local queue overflows into the pool's injector
//! or grows ([`Full`]). Tasks are futures ([`Handle::spawn`], returning a
//! [`Task`], an eager promise) or closures that never suspend
//! ([`Handle::spawn_fn`]); [`yield_now`] sends a task to the pool's yield
//! queue, which no worker can ignore for long. A [`Runtime`] holds several
//! named pools; a task of one spawns into another through its [`Handle`]
//! (staged composition, 001 §4.4.2).
//!
//! Each worker counts what it did ([`WorkerStats`]) and how long its tasks
//! waited in a queue ([`PoolStats::queue_wait_ns`], one task in
//! [`WAIT_SAMPLE`]).
//!
//! The queues are crossbeam-deque's (local queues, the injector, batched
//! steals) and crossbeam-queue's (yields); tasks, wakers and join handles
//! are async-task's. Idle workers sleep on a [`wait::Signal`], the event
//! count psmr-sched's workers sleep on too; `tests/loom_rt.rs` checks with
//! loom that no task is lost to a sleeping worker, that the slot is run,
//! and that yields cannot livelock a pool.
//!
//! [`schedstat`] reads what the kernel counts of each thread's scheduling
//! (time on a CPU, time waiting for one), which psmr shows per stage and
//! pool.
//!
//! psmr-rt depends on no other psmr crate. It bounds no queue: a pool runs
//! what it is given, and whoever spawns bounds its own work in flight.
//!
//! ```
//! use psmr_rt::{Pool, PoolConfig, Policy};
//!
//! let pool = Pool::start(PoolConfig { policy: Policy::Lifo, ..PoolConfig::new("doc", 2) })?;
//! let sum = pool.spawn(async {
//!     let parts: Vec<_> = (0..4u64).map(|i| psmr_rt::Handle::current().unwrap().spawn(async move { i * i })).collect();
//!     let mut sum = 0;
//!     for p in parts {
//!         sum += p.await?;
//!     }
//!     Ok::<u64, psmr_rt::RtError>(sum)
//! });
//! assert_eq!(sum.wait()??, 14);
//! pool.shutdown()?;
//! # Ok::<(), psmr_rt::RtError>(())
//! ```
//!
//! In the guide: `docs/design.md` places this crate among the others;
//! `docs/benchmarks.md`: task pools and `psmr rt-bench`.

mod config;
mod pool;
mod runtime;
pub mod schedstat;
mod shim;
mod stats;
mod task;
pub mod wait;

pub use config::{Full, Policy, PoolConfig, Steal, Victims, CAPACITY_MAX, WORKERS_MAX};
pub use pool::{Handle, Pool, SLOT_BUDGET, WAIT_SAMPLE};
pub use runtime::Runtime;
pub use stats::{PoolStats, WorkerStats};
pub use task::{block_on, yield_now, Task, YieldNow};

use thiserror::Error;

/// What can go wrong with a pool or a task.
#[derive(Debug, Error)]
pub enum RtError {
    /// A name on a command line or in a config does not parse.
    #[error("bad {what} {value:?}: {why}")]
    Parse {
        /// What it names.
        what: &'static str,
        /// The text given.
        value: String,
        /// What is expected.
        why: String,
    },
    /// A pool's settings are out of range.
    #[error("pool {pool:?}: {why}")]
    Config {
        /// The pool.
        pool: String,
        /// What is wrong.
        why: String,
    },
    /// A worker thread could not be started.
    #[error("cannot start a worker thread: {0}")]
    Thread(#[source] std::io::Error),
    /// The task panicked, or its pool stopped before it ran.
    #[error("a task of pool {pool:?} was cancelled: it panicked or its pool stopped")]
    Cancelled {
        /// The pool.
        pool: String,
    },
    /// [`Task::wait`] on a worker of the task's own pool.
    #[error("Task::wait on a worker of pool {pool:?} could wait for itself: await the task instead")]
    WaitOnWorker {
        /// The pool.
        pool: String,
    },
    /// Tasks of the pool panicked.
    #[error("{} task(s) of pool {pool:?} panicked, the first with: {}", messages.len(), messages.first().map_or("", String::as_str))]
    Panicked {
        /// The pool.
        pool: String,
        /// Each panic's message.
        messages: Vec<String>,
    },
}
