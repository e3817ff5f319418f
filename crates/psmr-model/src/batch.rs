//! Batches: the unit of ordering (one raft log entry) and of late scheduling.

use crate::bitmap::KeyBitmap;
use crate::command::{Command, Key};

/// Default bitmap size, in bits, of a batch summary.
///
/// With 50 keys per batch, two batches of distinct keys collide with
/// probability about `1 - exp(-50*50/16384)`, roughly 14 %.
pub const BITMAP_BITS_DEFAULT: u32 = 16 * 1024;

/// Largest accepted bitmap size, in bits (1 MiB of bitmap per batch side).
pub const BITMAP_BITS_MAX: u32 = 1 << 23;

/// What a batch touches, in two precisions.
///
/// * Exact: the sorted, deduplicated keys written, and all keys touched.
///   `late-batch-keys` compares these (004 Alg. 1 `cmmdKeyConflict`).
/// * Approximate: the same two sets as one-hash [`KeyBitmap`]s.
///   `late-batch-bitmap` compares these (004 Alg. 1 `bitmapConflict`).
///
/// 004 encodes one bitmap per batch because its workload only writes. psmr
/// keeps a bitmap of written keys beside the bitmap of all keys, so that two
/// batches conflict only if one *writes* a key the other touches: read-only
/// batches never depend on each other, and there are still no false
/// negatives (two conflicting commands share a key one of them writes, and
/// that key is in one batch's write bitmap and in the other's full bitmap).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchSummary {
    write_keys: Vec<Key>,
    all_keys: Vec<Key>,
    write_bits: KeyBitmap,
    all_bits: KeyBitmap,
}

impl BatchSummary {
    /// Summarizes the keys of `commands` with bitmaps of `bitmap_bits` bits.
    pub fn of<O>(commands: &[Command<O>], bitmap_bits: u32) -> Self {
        let mut write_keys: Vec<Key> = commands.iter().flat_map(|c| c.writes.iter().copied()).collect();
        let mut all_keys: Vec<Key> =
            commands.iter().flat_map(|c| c.reads.iter().chain(c.writes.iter()).copied()).collect();
        write_keys.sort_unstable();
        write_keys.dedup();
        all_keys.sort_unstable();
        all_keys.dedup();
        let write_bits = KeyBitmap::from_keys(bitmap_bits, &write_keys);
        let all_bits = KeyBitmap::from_keys(bitmap_bits, &all_keys);
        Self { write_keys, all_keys, write_bits, all_bits }
    }

    /// Exact conflict test: one side writes a key the other touches.
    pub fn keys_conflict(&self, other: &BatchSummary) -> bool {
        sorted_intersect(&self.write_keys, &other.all_keys) || sorted_intersect(&other.write_keys, &self.all_keys)
    }

    /// Bitmap conflict test: like [`Self::keys_conflict`] on the bitmaps.
    /// Never false when `keys_conflict` is true.
    pub fn bitmap_conflict(&self, other: &BatchSummary) -> bool {
        self.write_bits.intersects(&other.all_bits) || other.write_bits.intersects(&self.all_bits)
    }

    /// Sorted keys written by the batch.
    pub fn write_keys(&self) -> &[Key] {
        &self.write_keys
    }

    /// Sorted keys read or written by the batch.
    pub fn all_keys(&self) -> &[Key] {
        &self.all_keys
    }

    /// Bitmap of the keys written.
    pub fn write_bitmap(&self) -> &KeyBitmap {
        &self.write_bits
    }

    /// Bitmap of the keys read or written.
    pub fn all_bitmap(&self) -> &KeyBitmap {
        &self.all_bits
    }
}

/// True when two sorted slices share an element: a merge walk, or binary
/// searches of the larger from the smaller when the sizes differ a lot.
pub fn sorted_intersect<T: Ord>(a: &[T], b: &[T]) -> bool {
    if a.is_empty() || b.is_empty() {
        return false;
    }
    let (small, large) = if a.len() <= b.len() { (a, b) } else { (b, a) };
    if small.len() * 8 < large.len() {
        return small.iter().any(|k| large.binary_search(k).is_ok());
    }
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        match a[i].cmp(&b[j]) {
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
            std::cmp::Ordering::Equal => return true,
        }
    }
    false
}

/// Commands in log order with a summary of their keys.
///
/// A batch is what one raft log entry carries and what the late batch
/// schedulers put in their dependency graph; its commands execute one after
/// the other, in order, on one worker.
///
/// The summary is built the first time it is asked for: only the late
/// batch schedulers read it, and for the others its sorting and bitmaps
/// (two of `bitmap_bits` bits) would be spent on every log entry for
/// nothing.
#[derive(Clone, Debug)]
pub struct Batch<O> {
    commands: Vec<Command<O>>,
    bitmap_bits: u32,
    summary: std::sync::OnceLock<BatchSummary>,
}

impl<O> Batch<O> {
    /// A batch whose key summary, when asked for, has bitmaps of
    /// `bitmap_bits` bits.
    pub fn new(commands: Vec<Command<O>>, bitmap_bits: u32) -> Self {
        Self { commands, bitmap_bits, summary: std::sync::OnceLock::new() }
    }

    /// The commands, in log order.
    pub fn commands(&self) -> &[Command<O>] {
        &self.commands
    }

    /// The key summary, built on the first call.
    pub fn summary(&self) -> &BatchSummary {
        self.summary.get_or_init(|| BatchSummary::of(&self.commands, self.bitmap_bits))
    }

    /// Whether the key summary has been built (by [`Self::summary`]).
    pub fn has_summary(&self) -> bool {
        self.summary.get().is_some()
    }

    /// Number of commands.
    pub fn len(&self) -> usize {
        self.commands.len()
    }

    /// True when the batch holds no command.
    pub fn is_empty(&self) -> bool {
        self.commands.is_empty()
    }

    /// Takes the commands out of the batch.
    pub fn into_commands(self) -> Vec<Command<O>> {
        self.commands
    }

    /// True when some command of `self` conflicts with some command of
    /// `other`, checked pair by pair. Quadratic: for tests and checkers.
    pub fn commands_conflict<P>(&self, other: &Batch<P>) -> bool {
        self.commands.iter().any(|a| other.commands.iter().any(|b| a.conflicts_with(b)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::{ClassId, ClientId};
    use proptest::prelude::*;

    fn arb_command() -> impl Strategy<Value = Command<()>> {
        (proptest::collection::vec(0u64..64, 0..3), proptest::collection::vec(0u64..64, 0..3)).prop_map(|(r, w)| {
            Command {
                client: ClientId(0),
                seq: 0,
                class: ClassId(0),
                reads: r.into_iter().collect(),
                writes: w.into_iter().collect(),
                op: (),
                stamp: Default::default(),
            }
        })
    }

    proptest! {
        /// The exact key test agrees with pairwise command conflicts, and
        /// the bitmap test never misses one of them (no false negatives).
        #[test]
        fn batch_conflict_tests_are_sound(
            a in proptest::collection::vec(arb_command(), 0..12),
            b in proptest::collection::vec(arb_command(), 0..12),
            bits in 1u32..512,
        ) {
            let ba = Batch::new(a, bits);
            let bb = Batch::new(b, bits);
            let truth = ba.commands_conflict(&bb);
            prop_assert_eq!(truth, ba.summary().keys_conflict(bb.summary()));
            prop_assert_eq!(truth, bb.summary().keys_conflict(ba.summary()));
            if truth {
                prop_assert!(ba.summary().bitmap_conflict(bb.summary()));
                prop_assert!(bb.summary().bitmap_conflict(ba.summary()));
            }
        }
    }

    #[test]
    fn the_summary_is_built_only_when_asked_for() {
        let write = Command {
            client: ClientId(0),
            seq: 0,
            class: ClassId(0),
            reads: Default::default(),
            writes: [1].into_iter().collect(),
            op: (),
            stamp: Default::default(),
        };
        let b = Batch::new(vec![write], 64);
        assert!(!b.has_summary());
        let first = b.summary() as *const BatchSummary;
        assert!(b.has_summary());
        assert_eq!(first, b.summary() as *const BatchSummary, "built once");
    }

    #[test]
    fn read_only_batches_never_conflict() {
        let read = |k| Command {
            client: ClientId(0),
            seq: 0,
            class: ClassId(0),
            reads: [k].into_iter().collect(),
            writes: Default::default(),
            op: (),
            stamp: Default::default(),
        };
        let a = Batch::new(vec![read(1), read(2)], 8);
        let b = Batch::new(vec![read(1), read(3)], 8);
        assert!(!a.summary().keys_conflict(b.summary()));
        assert!(!a.summary().bitmap_conflict(b.summary()));
    }

    #[test]
    fn sorted_intersect_both_paths() {
        assert!(sorted_intersect(&[1, 5, 9], &[2, 5]));
        assert!(!sorted_intersect(&[1, 5, 9], &[2, 6]));
        let large: Vec<u64> = (0..100).map(|x| x * 2).collect();
        assert!(sorted_intersect(&[3, 8], &large));
        assert!(!sorted_intersect(&[3, 7], &large));
        assert!(!sorted_intersect::<u64>(&[], &large));
    }
}
