//! Threads, loom's under `--cfg loom` (whose threads are not the
//! system's: their thread-locals, parking and joining must be loom's too).

#[cfg(loom)]
pub(crate) use loom::thread::{current, park, JoinHandle as StdJoin, Thread};
#[cfg(not(loom))]
pub(crate) use std::thread::{current, park, JoinHandle as StdJoin, Thread};

/// A worker thread's handle.
pub(crate) type JoinHandle = StdJoin<()>;

/// Starts a thread called `name` running `f`.
#[cfg(not(loom))]
pub(crate) fn spawn(name: String, f: impl FnOnce() + Send + 'static) -> std::io::Result<JoinHandle> {
    std::thread::Builder::new().name(name).spawn(f)
}

/// Loom names no threads.
#[cfg(loom)]
pub(crate) fn spawn(_name: String, f: impl FnOnce() + Send + 'static) -> std::io::Result<JoinHandle> {
    Ok(loom::thread::spawn(f))
}

/// Wakes `thread` from [`park`].
pub(crate) fn unpark(thread: &Thread) {
    thread.unpark();
}

/// The queues: crossbeam's, or under loom a locked stand-in with the same
/// interface, whose hand-offs loom can see (crossbeam's atomics are not
/// loom's; crossbeam checks its deques with loom itself).
#[cfg(not(loom))]
pub(crate) mod deque {
    pub(crate) use crossbeam::deque::{Injector, Steal, Stealer, Worker};
    pub(crate) use crossbeam::queue::SegQueue;
}

#[cfg(loom)]
pub(crate) mod deque {
    pub(crate) use crossbeam::deque::Steal;
    use loom::sync::{Arc, Mutex};
    use std::collections::VecDeque;

    type Shared<T> = Arc<Mutex<VecDeque<T>>>;

    /// A worker's queue: the owner pushes at the back and pops at the
    /// back (LIFO) or the front (FIFO); thieves take from the front.
    pub(crate) struct Worker<T> {
        q: Shared<T>,
        lifo: bool,
    }

    impl<T> Worker<T> {
        pub fn new_fifo() -> Self {
            Worker { q: Arc::new(Mutex::new(VecDeque::new())), lifo: false }
        }
        pub fn new_lifo() -> Self {
            Worker { q: Arc::new(Mutex::new(VecDeque::new())), lifo: true }
        }
        pub fn push(&self, t: T) {
            self.q.lock().unwrap().push_back(t);
        }
        pub fn pop(&self) -> Option<T> {
            let mut q = self.q.lock().unwrap();
            if self.lifo {
                q.pop_back()
            } else {
                q.pop_front()
            }
        }
        pub fn len(&self) -> usize {
            self.q.lock().unwrap().len()
        }
        pub fn is_empty(&self) -> bool {
            self.q.lock().unwrap().is_empty()
        }
        pub fn stealer(&self) -> Stealer<T> {
            Stealer { q: self.q.clone() }
        }
    }

    /// A thief's view of a worker's queue.
    pub(crate) struct Stealer<T> {
        q: Shared<T>,
    }

    impl<T> Stealer<T> {
        pub fn steal(&self) -> Steal<T> {
            self.q.lock().unwrap().pop_front().map_or(Steal::Empty, Steal::Success)
        }
        pub fn steal_batch_and_pop(&self, dest: &Worker<T>) -> Steal<T> {
            take_half(&self.q, dest, usize::MAX)
        }
        pub fn steal_batch_with_limit_and_pop(&self, dest: &Worker<T>, limit: usize) -> Steal<T> {
            take_half(&self.q, dest, limit)
        }
        pub fn is_empty(&self) -> bool {
            self.q.lock().unwrap().is_empty()
        }
    }

    fn take_half<T>(q: &Shared<T>, dest: &Worker<T>, limit: usize) -> Steal<T> {
        let mut batch: Vec<T> = {
            let mut q = q.lock().unwrap();
            let n = q.len().div_ceil(2).min(limit);
            q.drain(..n).collect()
        };
        if batch.is_empty() {
            return Steal::Empty;
        }
        let first = batch.remove(0);
        for t in batch {
            dest.push(t);
        }
        Steal::Success(first)
    }

    /// The pool's shared FIFO: a queue anyone pushes to and takes from
    /// the front of, as thieves do.
    pub(crate) struct Injector<T> {
        s: Stealer<T>,
    }

    impl<T> Injector<T> {
        pub fn new() -> Self {
            Injector { s: Stealer { q: Arc::new(Mutex::new(VecDeque::new())) } }
        }
        pub fn push(&self, t: T) {
            self.s.q.lock().unwrap().push_back(t);
        }
        pub fn steal(&self) -> Steal<T> {
            self.s.steal()
        }
        pub fn steal_batch_and_pop(&self, dest: &Worker<T>) -> Steal<T> {
            self.s.steal_batch_and_pop(dest)
        }
        pub fn is_empty(&self) -> bool {
            self.s.is_empty()
        }
    }

    /// The yield queue.
    pub(crate) struct SegQueue<T> {
        q: Injector<T>,
    }

    impl<T> SegQueue<T> {
        pub fn new() -> Self {
            SegQueue { q: Injector::new() }
        }
        pub fn push(&self, t: T) {
            self.q.push(t);
        }
        pub fn pop(&self) -> Option<T> {
            match self.q.steal() {
                Steal::Success(t) => Some(t),
                _ => None,
            }
        }
        pub fn is_empty(&self) -> bool {
            self.q.is_empty()
        }
    }
}
