//! A reusable blocking barrier, the class barrier of 003 Alg. 2.

use crate::sync::{Condvar, Mutex};

/// A cyclic barrier for a fixed number of parties.
///
/// `std::sync::Barrier` would do, but this one is model-checked with loom
/// (see `tests/loom_barrier.rs`), and its generation counter is what makes
/// back-to-back reuse safe: a thread released from round `g` may arrive for
/// round `g + 1` before a slower thread of round `g` has woken up; the slow
/// thread waits for the generation to change, not for the count to reach a
/// value, so it still leaves, and the count it sees belongs to round `g + 1`.
#[derive(Debug)]
pub struct Barrier {
    parties: usize,
    state: Mutex<State>,
    cvar: Condvar,
}

#[derive(Debug)]
struct State {
    arrived: usize,
    generation: u64,
}

impl Barrier {
    /// A barrier for `parties` threads (at least one).
    pub fn new(parties: usize) -> Self {
        Self { parties: parties.max(1), state: Mutex::new(State { arrived: 0, generation: 0 }), cvar: Condvar::new() }
    }

    /// Number of threads that must arrive to open the barrier.
    pub fn parties(&self) -> usize {
        self.parties
    }

    /// Arrives and waits until all parties of this round have arrived.
    pub fn wait(&self) {
        // A poisoned lock means another party panicked inside `wait` itself,
        // which only a bug in this function could cause; the state is still
        // consistent (it is only read and written under the lock), so go on.
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let generation = st.generation;
        st.arrived += 1;
        if st.arrived == self.parties {
            st.arrived = 0;
            st.generation = st.generation.wrapping_add(1);
            drop(st);
            self.cvar.notify_all();
            return;
        }
        while st.generation == generation {
            st = self.cvar.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }
}
