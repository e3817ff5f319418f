//! How a thread of psmr-sched waits: the one waiting mechanism of psmr's
//! worker pools, [`psmr_rt::wait`] ([`Patience`], [`Naps`], [`Signal`]),
//! and the atomics and locks the schedulers build their protocols from,
//! loom's under `--cfg loom` so that those protocols can be
//! model-checked (`tests/loom_*.rs`).

pub use psmr_rt::wait::{AdaptiveSpin, Naps, Patience, Signal};

pub(crate) use psmr_rt::wait::{fence, AtomicBool, AtomicU64, AtomicUsize, Mutex, MutexGuard, RwLock, RwLockReadGuard};
