//! A worker's ready queue in the early schedulers (000 Alg. 6): filled by
//! the scheduler thread in log order, emptied whole by its worker, and, in
//! the stealing schedulers, robbed of its concurrent front by idle workers,
//! with the flags and markers that keep stolen work from overtaking a
//! sequential command. Generic over the entry so that loom can check the
//! protocol with plain numbers (`tests/loom_steal.rs`, `tests/loom_semi.rs`).

use crate::sync::{AtomicBool, AtomicU64, Mutex, MutexGuard, Naps, Patience, Signal};
use smallvec::SmallVec;
use std::collections::VecDeque;
use std::sync::atomic::Ordering;

/// A set of classes, bit `c` for class `c`; one word, inline, for up to 64
/// classes.
pub type ClassSet = SmallVec<[u64; 1]>;

/// One worker's queues, flags and markers (000 Alg. 6), generic over what
/// an entry is so that loom can check the protocol with plain numbers.
#[derive(Debug)]
pub struct WsQueue<T> {
    state: Mutex<Ready<T>>,
    /// `markers[s]`: worker `s` stole from this worker and is not done.
    markers: Vec<AtomicBool>,
    /// Lock-free hints for waiting workers, written under the lock: the
    /// ready queue is not empty; a steal could succeed.
    has_ready: AtomicBool,
    stealable: AtomicBool,
    /// The classes of the entries a steal would take, folded to 64 bits
    /// (class `c` on bit `c % 64`); meaningful when `stealable`.
    steal_classes: AtomicU64,
    /// Closed, and nothing left in the ready queue.
    drained: AtomicBool,
    /// Where the owner sleeps, waiting for work or for its stealers.
    signal: Signal,
}

#[derive(Debug)]
struct Ready<T> {
    /// Entries, whether each holds a sequential command, and the classes of
    /// its commands as a bit set (000 Alg. 9 `readyClasses`, kept per entry;
    /// empty for `early-ws-queue`).
    queue: VecDeque<(T, bool, ClassSet)>,
    /// Entries of `queue` holding a sequential command (`readyFlag` is
    /// `ready_seq > 0`).
    ready_seq: usize,
    /// Entries at the front of `queue` before the first sequential one:
    /// what a steal takes. Their classes, folded as in `steal_classes`.
    prefix: usize,
    prefix_classes: u64,
    /// The batch the owner is executing holds a sequential command.
    exec_flag: bool,
    closed: bool,
}

impl<T> WsQueue<T> {
    /// Queues for a worker among `workers`.
    pub fn new(workers: usize) -> Self {
        Self {
            state: Mutex::new(Ready {
                queue: VecDeque::new(),
                ready_seq: 0,
                prefix: 0,
                prefix_classes: 0,
                exec_flag: false,
                closed: false,
            }),
            markers: (0..workers).map(|_| AtomicBool::new(false)).collect(),
            has_ready: AtomicBool::new(false),
            stealable: AtomicBool::new(false),
            steal_classes: AtomicU64::new(0),
            drained: AtomicBool::new(false),
            signal: Signal::new(),
        }
    }

    /// Refreshes the hints; called under the lock after every change.
    fn hint(&self, st: &Ready<T>) {
        self.has_ready.store(!st.queue.is_empty(), Ordering::Relaxed);
        self.stealable.store(!st.exec_flag && st.prefix > 0, Ordering::Relaxed);
        self.steal_classes.store(st.prefix_classes, Ordering::Relaxed);
        self.drained.store(st.closed && st.queue.is_empty(), Ordering::Release);
    }

    /// True once the queue is closed and its ready queue empty for good.
    pub fn drained(&self) -> bool {
        self.drained.load(Ordering::Acquire)
    }

    fn lock(&self) -> MutexGuard<'_, Ready<T>> {
        // Nothing panics while holding this lock; recover the data anyway.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Scheduler side (Alg. 7): appends an entry; `sequential` when it holds
    /// a sequential command for this worker.
    pub fn push(&self, entry: T, sequential: bool) {
        self.push_with_classes(entry, sequential, &[]);
    }

    /// Like [`WsQueue::push`], also recording the classes of the entry's
    /// commands (a bit set, bit `c` for class `c`; 000 Alg. 10).
    pub fn push_with_classes(&self, entry: T, sequential: bool, classes: &[u64]) {
        let mut st = self.lock();
        Self::append(&mut st, entry, sequential, classes.into());
        self.hint(&st);
        drop(st);
        self.signal.notify_one();
    }

    /// Appends several entries at once, under one acquisition of the lock,
    /// leaving `entries` empty: `(entry, sequential, classes)` as in
    /// [`WsQueue::push_with_classes`].
    pub fn push_all(&self, entries: &mut Vec<(T, bool, ClassSet)>) {
        let mut st = self.lock();
        for (entry, sequential, classes) in entries.drain(..) {
            Self::append(&mut st, entry, sequential, classes);
        }
        self.hint(&st);
        drop(st);
        self.signal.notify_one();
    }

    fn append(st: &mut Ready<T>, entry: T, sequential: bool, classes: ClassSet) {
        if !sequential && st.prefix == st.queue.len() {
            st.prefix += 1;
            st.prefix_classes |= fold(&classes);
        }
        st.queue.push_back((entry, sequential, classes));
        st.ready_seq += usize::from(sequential);
    }

    /// Removes the entries at the back of the ready queue for which `pred`
    /// holds, up to the first for which it does not, and returns them,
    /// last first: the scheduler taking back what a worker has not begun.
    pub fn pop_back_while(&self, mut pred: impl FnMut(&T) -> bool) -> Vec<T> {
        let mut st = self.lock();
        let mut taken = Vec::new();
        while st.queue.back().is_some_and(|e| pred(&e.0)) {
            let (entry, sequential, _) = st.queue.pop_back().expect("checked above");
            st.ready_seq -= usize::from(sequential);
            taken.push(entry);
        }
        if st.prefix > st.queue.len() {
            st.prefix = st.queue.len();
            st.prefix_classes = st.queue.iter().fold(0, |acc, e| acc | fold(&e.2));
        }
        self.hint(&st);
        taken
    }

    /// No more entries will come.
    pub fn close(&self) {
        let mut st = self.lock();
        st.closed = true;
        self.hint(&st);
        drop(st);
        self.signal.notify_one();
    }

    /// Owner side (Alg. 8 lines 5-9): moves the whole ready queue to the
    /// returned exec batch and sets `exec_flag` to whether it holds a
    /// sequential command.
    pub fn take_all(&self) -> Vec<(T, bool)> {
        let mut batch = Vec::new();
        self.take_all_into(&mut batch);
        batch
    }

    /// [`WsQueue::take_all`] into a buffer the owner reuses (appended to).
    pub fn take_all_into(&self, batch: &mut Vec<(T, bool)>) {
        let mut st = self.lock();
        st.exec_flag = st.ready_seq > 0;
        st.ready_seq = 0;
        st.prefix = 0;
        st.prefix_classes = 0;
        batch.extend(st.queue.drain(..).map(|(t, seq, _)| (t, seq)));
        self.hint(&st);
    }

    /// Hint: the ready queue holds something.
    pub fn has_ready(&self) -> bool {
        self.has_ready.load(Ordering::Relaxed)
    }

    /// Hint: a steal from this queue could succeed.
    pub fn stealable(&self) -> bool {
        self.stealable.load(Ordering::Relaxed)
    }

    /// The optimistic validation of 000 Alg. 14 (line 5): the steal
    /// conditions of [`WsQueue::try_steal_avoiding`] evaluated on the
    /// hints, without the lock. `avoid` is folded to 64 bits, so with more
    /// than 64 classes it may refuse a steal the locked check would allow
    /// (never the reverse matters: the locked check decides).
    pub fn may_steal(&self, avoid: &[u64]) -> bool {
        self.stealable() && self.steal_classes.load(Ordering::Relaxed) & fold(avoid) == 0
    }

    /// Stealer side (Alg. 8 lines 29-36): takes the entries at the front of
    /// the victim's ready queue up to its first sequential one, if the
    /// batch the victim is executing holds no sequential command, and
    /// raises the victim's marker for `stealer`.
    ///
    /// 000 steals the whole ready queue and only when it holds no
    /// sequential command at all. psmr delivers commands in batches, so a
    /// ready queue nearly always holds one; stealing the prefix before it is
    /// just as safe: the stolen commands precede the sequential one in log
    /// order, and the victim waits for its markers before it runs it.
    pub fn try_steal(&self, stealer: usize) -> Option<Vec<T>> {
        self.try_steal_avoiding(stealer, &[])
    }

    /// Like [`WsQueue::try_steal`], and only if the stolen entries hold no
    /// command of the classes in `avoid` (000 Alg. 11, `NoConflict`: a
    /// stealer waiting for a sequential command of class `c` passes the
    /// classes that conflict with `c`).
    pub fn try_steal_avoiding(&self, stealer: usize, avoid: &[u64]) -> Option<Vec<T>> {
        let mut st = self.lock();
        if st.exec_flag {
            return None;
        }
        let prefix = st.prefix;
        if prefix == 0 {
            return None;
        }
        let conflicting =
            st.queue.iter().take(prefix).any(|e| e.2.iter().zip(avoid).any(|(have, bad)| have & bad != 0));
        if conflicting {
            return None;
        }
        // Raised under the lock: the owner can only see the steal's effect
        // (an emptier queue) together with the marker.
        self.markers[stealer].store(true, Ordering::Release);
        let stolen = st.queue.drain(..prefix).map(|(t, _, _)| t).collect();
        // The front is now a sequential entry, or nothing.
        st.prefix = 0;
        st.prefix_classes = 0;
        self.hint(&st);
        Some(stolen)
    }

    /// Stealer side (Alg. 8 line 40): the stolen entries have executed.
    pub fn steal_done(&self, stealer: usize) {
        self.markers[stealer].store(false, Ordering::Release);
        self.signal.notify_one();
    }

    /// A worker died: the owner stops waiting for work and for its
    /// stealers ([`Signal::abandon`]).
    pub fn abandon(&self) {
        self.signal.abandon();
    }

    /// Owner side: waits, with `patience`, until no stealer holds work
    /// taken from this queue.
    /// Returns the patience, which says how the wait ended.
    pub fn wait_for_stealers(&self, patience: Patience) -> Patience {
        self.signal.wait_until(patience, Naps::Notified, || self.no_stealers())
    }

    /// Where the owner sleeps: [`WsQueue::push`], [`WsQueue::close`] and
    /// [`WsQueue::steal_done`] notify it.
    pub fn signal(&self) -> &Signal {
        &self.signal
    }

    /// True when no stealer holds work taken from this worker.
    pub fn no_stealers(&self) -> bool {
        self.markers.iter().all(|m| !m.load(Ordering::Acquire))
    }
}

/// A class bit set folded to one word: class `c` on bit `c % 64`.
fn fold(classes: &[u64]) -> u64 {
    classes.iter().fold(0, |a, w| a | w)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn flags_decide_what_may_be_stolen() {
        let q = WsQueue::new(2);
        assert_eq!(q.try_steal(1), None, "nothing to steal");
        q.push(1u32, false);
        q.push(2, false);
        assert_eq!(q.try_steal(1), Some(vec![1, 2]));
        assert!(!q.no_stealers(), "the marker is up until the stealer is done");
        q.steal_done(1);
        assert!(q.no_stealers());
        // A sequential entry and everything behind it stay; the concurrent
        // entries before it may go.
        q.push(3, false);
        q.push(4, true);
        q.push(7, false);
        assert_eq!(q.try_steal(1), Some(vec![3]));
        assert_eq!(q.try_steal(1), None, "the front is sequential now");
        q.steal_done(1);
        // Once the owner takes it, the exec flag protects what comes next.
        assert_eq!(q.take_all(), vec![(4, true), (7, false)]);
        q.push(5, false);
        assert_eq!(q.try_steal(1), None);
        // The next take clears the exec flag.
        assert_eq!(q.take_all(), vec![(5, false)]);
        q.push(6, false);
        assert_eq!(q.try_steal(1), Some(vec![6]));
        q.steal_done(1);
    }

    #[test]
    fn taking_back_the_tail_keeps_what_stealers_see_right() {
        let q = WsQueue::new(2);
        q.push_with_classes(1u32, false, &[0b01]);
        q.push_with_classes(2, false, &[0b10]);
        q.push(3, true);
        q.push(4, false);
        assert_eq!(q.pop_back_while(|&e| e >= 3), vec![4, 3]);
        assert!(q.stealable());
        assert_eq!(q.pop_back_while(|&e| e >= 2), vec![2]);
        assert!(q.may_steal(&[0b10]) && !q.may_steal(&[0b01]), "only entry 1's class is left to steal");
        assert_eq!(q.pop_back_while(|_| true), vec![1]);
        assert!(!q.has_ready() && !q.stealable() && q.try_steal(1).is_none());
        q.push(5, true);
        assert_eq!(q.take_all(), vec![(5, true)], "the sequential count went down with entry 3");
    }

    #[test]
    fn semi_blocked_stealers_avoid_conflicting_classes() {
        let q = WsQueue::new(2);
        q.push_with_classes(1u32, false, &[0b010]);
        assert_eq!(q.try_steal_avoiding(1, &[0b010]), None, "class 1 conflicts");
        assert_eq!(q.try_steal_avoiding(1, &[0b101]), Some(vec![1]));
        q.steal_done(1);
        // Stealing cleared the recorded classes.
        q.push_with_classes(2, false, &[0b100]);
        assert_eq!(q.try_steal_avoiding(1, &[0b010]), Some(vec![2]));
    }

    #[test]
    fn lock_free_hints_agree_with_the_locked_check() {
        let q = WsQueue::new(2);
        assert!(!q.may_steal(&[]), "empty");
        q.push_with_classes(1u32, false, &[0b001]);
        q.push_with_classes(2, false, &[0b100]);
        q.push_with_classes(3, true, &[0b010]);
        q.push_with_classes(4, false, &[0b1000]);
        // The prefix is 1 and 2: classes 0 and 2; entry 4's class is
        // behind the sequential entry and does not count.
        assert!(q.may_steal(&[0b1010]));
        assert!(!q.may_steal(&[0b100]), "class 2 is in the prefix");
        assert_eq!(q.try_steal_avoiding(1, &[0b1010]), Some(vec![1, 2]));
        assert!(!q.may_steal(&[]), "the front is sequential");
        q.steal_done(1);
        assert_eq!(q.take_all().len(), 2);
        q.push_with_classes(5, false, &[0b001]);
        assert!(!q.may_steal(&[]), "the exec batch holds a sequential command");
        assert_eq!(q.try_steal(1), None);
        assert!(q.take_all().len() == 1 && !q.may_steal(&[]));
        q.push_with_classes(6, false, &[0, 0b1]);
        assert!(q.may_steal(&[0b10]), "class 64 folds onto bit 0 and 0b10 is clear");
        assert!(!q.may_steal(&[0b1]), "folded: class 0 and class 64 look alike");
        assert_eq!(q.try_steal_avoiding(1, &[0b1]), Some(vec![6]), "the locked check is exact");
    }
}
