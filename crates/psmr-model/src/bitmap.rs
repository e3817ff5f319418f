//! One-hash key bitmaps (a Bloom filter with a single hash function).

use crate::command::{Key, KEY_ALL};
use crate::digest::mix64;

/// A bitmap of keys built with one hash function, as in 004 §VI-B.
///
/// Two bitmaps are compared by intersection, not by membership queries, so
/// a single hash function is the right choice: with more, the intersection of
/// two filters would have more false positives, not fewer. Equal keys always
/// set the same bit, so if two key sets share a key their bitmaps intersect:
/// there are no false negatives.
///
/// Besides the dense words the bitmap keeps the sorted list of set bits:
/// intersecting a bitmap of `k` keys with any other costs `O(k)` word probes
/// instead of a pass over every word.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyBitmap {
    bits: u32,
    words: Box<[u64]>,
    set: Vec<u32>,
}

impl KeyBitmap {
    /// An empty bitmap of `bits` bits (`bits` is at least 1).
    pub fn new(bits: u32) -> Self {
        let bits = bits.max(1);
        Self { bits, words: vec![0; bits.div_ceil(64) as usize].into_boxed_slice(), set: Vec::new() }
    }

    /// A bitmap of `bits` bits with the given keys set.
    pub fn from_keys<'a>(bits: u32, keys: impl IntoIterator<Item = &'a Key>) -> Self {
        let mut bm = Self::new(bits);
        for &k in keys {
            bm.insert(k);
        }
        bm
    }

    /// The bit a key maps to: [`KEY_ALL`] has bit 0 to itself (with two
    /// bits or more), so that the key every command reads never collides
    /// with a key a command writes; any other key one hash, reduced to the
    /// other bits by a multiply-shift (no division, no bias worth
    /// measuring).
    #[inline]
    pub fn bit_of(bits: u32, key: Key) -> u32 {
        if bits < 2 {
            return 0;
        }
        if key == KEY_ALL {
            return 0;
        }
        1 + ((u128::from(mix64(key)) * u128::from(bits - 1)) >> 64) as u32
    }

    /// Sets the bit of `key`.
    pub fn insert(&mut self, key: Key) {
        let bit = Self::bit_of(self.bits, key);
        let (w, m) = ((bit / 64) as usize, 1u64 << (bit % 64));
        if self.words[w] & m == 0 {
            self.words[w] |= m;
            let pos = self.set.partition_point(|&b| b < bit);
            self.set.insert(pos, bit);
        }
    }

    /// True when the bit of `key` is set (the key may be present).
    pub fn may_contain(&self, key: Key) -> bool {
        self.test_bit(Self::bit_of(self.bits, key))
    }

    #[inline]
    fn test_bit(&self, bit: u32) -> bool {
        self.words[(bit / 64) as usize] & (1u64 << (bit % 64)) != 0
    }

    /// True when the two bitmaps share a set bit.
    ///
    /// Bitmaps of different sizes cannot be compared bit by bit; they are
    /// reported as intersecting, which is safe (a false positive serializes
    /// two batches, a false negative would break determinism).
    pub fn intersects(&self, other: &KeyBitmap) -> bool {
        if self.bits != other.bits {
            return true;
        }
        let (small, large) = if self.set.len() <= other.set.len() { (self, other) } else { (other, self) };
        small.set.iter().any(|&b| large.test_bit(b))
    }

    /// Number of bits in the bitmap.
    pub fn bits(&self) -> u32 {
        self.bits
    }

    /// Number of bits set.
    pub fn count_ones(&self) -> usize {
        self.set.len()
    }

    /// True when no bit is set.
    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// No false negatives: two key sets that share a key always give
        /// intersecting bitmaps, whatever the bitmap size.
        #[test]
        fn shared_key_always_intersects(
            bits in 1u32..4096,
            a in proptest::collection::vec(any::<u64>(), 0..64),
            b in proptest::collection::vec(any::<u64>(), 0..64),
            shared in any::<u64>(),
        ) {
            let mut a = a;
            let mut b = b;
            a.push(shared);
            b.insert(b.len() / 2, shared);
            let ba = KeyBitmap::from_keys(bits, &a);
            let bb = KeyBitmap::from_keys(bits, &b);
            prop_assert!(ba.intersects(&bb));
            prop_assert!(bb.intersects(&ba));
            for k in &a {
                prop_assert!(ba.may_contain(*k));
            }
        }

        /// The dense words and the list of set bits always agree, and the
        /// sparse intersection equals the word-by-word one.
        #[test]
        fn sparse_and_dense_agree(
            bits in 1u32..2048,
            a in proptest::collection::vec(any::<u64>(), 0..40),
            b in proptest::collection::vec(any::<u64>(), 0..40),
        ) {
            let ba = KeyBitmap::from_keys(bits, &a);
            let bb = KeyBitmap::from_keys(bits, &b);
            let dense = ba.words.iter().zip(bb.words.iter()).any(|(x, y)| x & y != 0);
            prop_assert_eq!(dense, ba.intersects(&bb));
            let ones: u32 = ba.words.iter().map(|w| w.count_ones()).sum();
            prop_assert_eq!(ones as usize, ba.count_ones());
            prop_assert!(ba.set.windows(2).all(|w| w[0] < w[1]));
            prop_assert!(ba.set.iter().all(|&s| s < bits));
        }
    }

    #[test]
    fn the_whole_state_key_has_a_bit_of_its_own() {
        for bits in [2u32, 3, 64, 1024] {
            assert_eq!(KeyBitmap::bit_of(bits, KEY_ALL), 0);
            assert!((0..100_000u64).all(|k| (1..bits).contains(&KeyBitmap::bit_of(bits, k))), "{bits} bits");
            let all = KeyBitmap::from_keys(bits, &[KEY_ALL]);
            let keys: Vec<Key> = (0..5_000).collect();
            assert!(!all.intersects(&KeyBitmap::from_keys(bits, &keys)));
        }
    }

    #[test]
    fn disjoint_keys_usually_do_not_intersect_in_a_large_bitmap() {
        // Not a guarantee (false positives exist), but with 8 keys per side
        // in 1 Mi bits a collision among these fixed keys would mean the hash
        // is broken.
        let a: Vec<u64> = (0..8).collect();
        let b: Vec<u64> = (100..108).collect();
        assert!(!KeyBitmap::from_keys(1 << 20, &a).intersects(&KeyBitmap::from_keys(1 << 20, &b)));
    }

    #[test]
    fn different_sizes_are_conservatively_conflicting() {
        let a = KeyBitmap::from_keys(64, &[1]);
        let b = KeyBitmap::from_keys(128, &[2]);
        assert!(a.intersects(&b));
    }
}
