//! A node of a dependency graph whose edges live in its nodes, for the late
//! schedulers on a task pool (`late-batch-bitmap-pool`, `late-cbase-pool`).
//!
//! In [`crate::late`] one lock guards the whole graph (004 Alg. 1): the
//! scheduler holds it while it compares a new node with every node in the
//! graph, and a worker that has executed a node waits for that lock to
//! remove the node and find what it freed, because it also needs the lock
//! to find its next node. A pool worker's next job is already in its queue,
//! so here each node keeps its own part of the graph under a lock of its
//! own: how many older nodes it still waits for, and which younger nodes
//! wait for it. Only the scheduler thread (adding an edge) and the worker
//! that finishes the node take that lock, so a worker never waits for the
//! scheduler's comparisons.
//!
//! The protocol, model-checked in `tests/loom_dag.rs`:
//!
//! * A node is created waiting for one thing: its own insertion. It cannot
//!   become free before the scheduler has compared it with every older node.
//! * An edge from an older node is added under the older node's lock, unless
//!   that node has finished. A finished node needs no edge, and taking its
//!   lock orders its effects before whatever the new node will do.
//! * Finishing a node marks it finished and takes its dependents under its
//!   lock; each dependent then waits for one thing fewer.
//! * The scheduler ends the insertion last ([`DagNode::inserted`]).
//!
//! Whoever brings a node's count to zero, the scheduler or the worker of its
//! last predecessor, is told the node is free, exactly once, and everything
//! its predecessors did happens before that.

use crate::sync::{AtomicBool, AtomicUsize, Mutex};
use smallvec::SmallVec;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Nodes freed at once: almost always few.
pub type Freed<T> = SmallVec<[Arc<DagNode<T>>; 4]>;

/// A node of the graph, carrying `T` (what to execute).
#[derive(Debug)]
pub struct DagNode<T> {
    payload: T,
    /// Older nodes not yet finished that this one waits for, plus one until
    /// its insertion ends.
    waiting: AtomicUsize,
    /// Set, under `dependents`' lock, when the node has finished; read
    /// without the lock only to leave finished nodes out.
    finished: AtomicBool,
    /// Younger nodes waiting for this one, in insertion order; `None` once
    /// the node has finished.
    dependents: Mutex<Option<Vec<Arc<DagNode<T>>>>>,
}

impl<T> DagNode<T> {
    /// A node being inserted: it waits for its insertion to end.
    pub fn new(payload: T) -> Arc<Self> {
        Arc::new(Self {
            payload,
            waiting: AtomicUsize::new(1),
            finished: AtomicBool::new(false),
            dependents: Mutex::new(Some(Vec::new())),
        })
    }

    /// What the node carries.
    pub fn payload(&self) -> &T {
        &self.payload
    }

    /// Whether the node has finished. Once true, what it did is visible to
    /// the caller.
    pub fn is_finished(&self) -> bool {
        self.finished.load(Ordering::Acquire)
    }

    /// Makes `dependent`, a node being inserted, wait for this older one,
    /// unless this one has finished. Returns whether it waits.
    pub fn precede(&self, dependent: &Arc<DagNode<T>>) -> bool {
        let mut dependents = self.dependents.lock().unwrap_or_else(|e| e.into_inner());
        match dependents.as_mut() {
            Some(list) => {
                // Counted while the lock is held: `finish` cannot take the
                // edge away before it is counted.
                dependent.waiting.fetch_add(1, Ordering::Relaxed);
                list.push(dependent.clone());
                true
            }
            None => false,
        }
    }

    /// Ends the node's insertion, once it has been compared with every
    /// older node. Returns true if it waits for nothing: it is free, and
    /// the caller runs it.
    pub fn inserted(&self) -> bool {
        self.release()
    }

    /// Marks the node finished, once what it carries has been executed, and
    /// returns the dependents that became free, oldest first.
    pub fn finish(&self) -> Freed<T> {
        let dependents = {
            let mut dependents = self.dependents.lock().unwrap_or_else(|e| e.into_inner());
            self.finished.store(true, Ordering::Release);
            dependents.take().unwrap_or_default()
        };
        dependents.into_iter().filter(|d| d.release()).collect()
    }

    /// One thing fewer to wait for; true if that was the last. The
    /// read-modify-writes on `waiting` form one release sequence, so the
    /// thread that takes the count to zero sees what every releaser did.
    fn release(&self) -> bool {
        self.waiting.fetch_sub(1, Ordering::AcqRel) == 1
    }
}
