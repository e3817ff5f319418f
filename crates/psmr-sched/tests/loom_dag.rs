//! Model checks, with loom, of the dependency protocol of the late
//! schedulers on a pool (`DagNode`): a node inserted while the nodes it
//! conflicts with finish on other threads becomes free exactly once, to
//! whichever thread ends its last wait, and that thread sees what every
//! node it waited for did.
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test -p psmr-sched --test loom_dag --release`
//! (`.ci/run` does). Without `--cfg loom` this file compiles to nothing.
#![cfg(loom)]

use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::thread;
use psmr_sched::DagNode;
use std::sync::Arc;

/// What a node stands for: the cell it writes when it runs.
type Node = Arc<DagNode<usize>>;

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(4);
    builder.check(f);
}

/// A node that is free: as the scheduler inserts one into an empty graph.
fn free_node(cell: usize) -> Node {
    let node = DagNode::new(cell);
    assert!(node.inserted(), "a node with no older node is free at once");
    node
}

/// A worker runs `node` (writes its cell) and finishes it; returns the
/// nodes that became free.
fn run(node: &Node, cells: &[AtomicUsize]) -> Vec<Node> {
    cells[*node.payload()].store(1, Ordering::Relaxed);
    node.finish().into_iter().collect()
}

/// The scheduler inserts `new` after `older`, as `late_pool` does: a
/// finished node gets no edge; returns whether `new` is free at once.
fn insert(new: &Node, older: &[Node]) -> bool {
    for o in older {
        if !o.is_finished() {
            o.precede(new);
        }
    }
    new.inserted()
}

/// One older node finishing on a worker while the scheduler makes a new
/// node wait for it: the new node is freed once, by either thread, and
/// whoever frees it sees the older node's write.
#[test]
fn a_node_inserted_while_its_predecessor_finishes_is_freed_once_after_it() {
    model(|| {
        let cells = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0)]);
        let older = free_node(0);
        let new = DagNode::new(1);
        let (c, o) = (cells.clone(), older.clone());
        let worker = thread::spawn(move || {
            let freed = run(&o, &c[..]);
            for _ in &freed {
                assert_eq!(c[0].load(Ordering::Relaxed), 1, "freed before its predecessor's effects");
            }
            freed.len()
        });
        let free_at_insert = insert(&new, &[older]);
        if free_at_insert {
            assert_eq!(cells[0].load(Ordering::Relaxed), 1, "free at insertion before its predecessor ran");
        }
        let freed_by_worker = worker.join().unwrap();
        assert_eq!(usize::from(free_at_insert) + freed_by_worker, 1, "the new node is freed exactly once");
    });
}

/// Two older nodes finishing on two workers while the scheduler makes a
/// new node wait for both: it is freed once, and only after both ran.
#[test]
fn a_node_waiting_for_two_is_freed_once_after_both() {
    model(|| {
        let cells = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0), AtomicUsize::new(0)]);
        let older = [free_node(0), free_node(1)];
        let new = DagNode::new(2);
        let workers: Vec<_> = older
            .iter()
            .map(|o| {
                let (c, o) = (cells.clone(), o.clone());
                thread::spawn(move || {
                    let freed = run(&o, &c[..]);
                    for _ in &freed {
                        assert_eq!(c[0].load(Ordering::Relaxed) + c[1].load(Ordering::Relaxed), 2, "freed too early");
                    }
                    freed.len()
                })
            })
            .collect();
        let free_at_insert = insert(&new, &older);
        if free_at_insert {
            assert_eq!(cells[0].load(Ordering::Relaxed) + cells[1].load(Ordering::Relaxed), 2, "free too early");
        }
        let freed: usize = workers.into_iter().map(|w| w.join().unwrap()).sum();
        assert_eq!(usize::from(free_at_insert) + freed, 1, "the new node is freed exactly once");
    });
}
