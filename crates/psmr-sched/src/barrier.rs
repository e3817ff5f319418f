//! A reusable barrier, the class barrier of 003 Alg. 2.

use crate::sync::{AtomicU64, Mutex, Naps, Patience, Signal};
use std::sync::atomic::Ordering;

/// A cyclic barrier for a fixed number of parties that spins briefly before
/// it blocks.
///
/// Rounds are numbered by a generation counter. The last thread to arrive
/// advances it; the others wait for it to change. Waiting for a *change*
/// rather than for a count is what makes back-to-back reuse safe: a thread
/// released from round `g` may arrive for round `g + 1` before a slower
/// thread of round `g` has even looked, and the slow thread still leaves.
///
/// Waiters watch a copy of the generation in an atomic, briefly
/// ([`Patience::brief`]), then sleep on the barrier's [`Signal`]. When the
/// parties arrive close together, which is the common case for a
/// sequential command whose threads were idle, nobody makes a system call;
/// the last arriver notifies, which costs nothing when nobody sleeps.
///
/// The protocol is model-checked with loom in `tests/loom_barrier.rs`.
#[derive(Debug)]
pub struct Barrier {
    parties: usize,
    state: Mutex<State>,
    /// The generation, readable without the lock; written under it.
    generation: AtomicU64,
    signal: Signal,
}

#[derive(Debug)]
struct State {
    arrived: usize,
    generation: u64,
}

impl Barrier {
    /// A barrier for `parties` threads (at least one).
    pub fn new(parties: usize) -> Self {
        Self {
            parties: parties.max(1),
            state: Mutex::new(State { arrived: 0, generation: 0 }),
            generation: AtomicU64::new(0),
            signal: Signal::new(),
        }
    }

    /// Number of threads that must arrive to open the barrier.
    pub fn parties(&self) -> usize {
        self.parties
    }

    /// Arrives and waits until all parties of this round have arrived.
    ///
    /// Everything a party did before arriving happens-before everything any
    /// party does after leaving (the lock orders arrivals; the generation is
    /// published with release and read with acquire).
    pub fn wait(&self) {
        // A poisoned lock would mean a panic inside this function, which
        // holds no invariant broken across an unwind; go on.
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let generation = st.generation;
        st.arrived += 1;
        if st.arrived == self.parties {
            st.arrived = 0;
            st.generation = generation.wrapping_add(1);
            self.generation.store(st.generation, Ordering::Release);
            drop(st);
            self.signal.notify_all();
            return;
        }
        drop(st);
        // Where more threads are runnable than there are cores, the last
        // party may be queued for the core a spinner holds: sleep at once.
        let patience = if crate::cpus::contended() { Patience::with_yields(0, 0) } else { Patience::brief() };
        self.signal.wait_until(patience, Naps::Notified, || self.generation.load(Ordering::Acquire) != generation);
    }

    /// A party died and will never arrive: every wait at this barrier,
    /// now or later, returns at once (check the failure that caused it
    /// before relying on what the others did).
    pub fn abandon(&self) {
        self.signal.abandon();
    }
}
