//! Synchronization primitives, swapped for loom's under `--cfg loom` so the
//! protocols built on them can be model-checked.

#[cfg(loom)]
pub(crate) use loom::sync::{Condvar, Mutex};

#[cfg(not(loom))]
pub(crate) use std::sync::{Condvar, Mutex};
