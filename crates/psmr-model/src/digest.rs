//! Stable hashing and state digests.
//!
//! `std`'s default hasher is randomly seeded per process, so digests that
//! must agree across replicas and runs use [`StableHasher`] instead.

use std::fmt;
use std::hash::Hasher;

/// Finalizer of SplitMix64: a cheap bijective mix with good avalanche.
#[inline]
pub(crate) fn mix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// A deterministic 64-bit hasher: the same input gives the same hash in
/// every process, on every run and on every platform (integers are widened
/// to 64 bits, byte strings are read as little-endian words).
///
/// Each 64-bit word costs one round of the SplitMix64 finalizer, so hashing
/// replies and states stays cheap next to the commands that produce them.
#[derive(Clone, Debug)]
pub struct StableHasher {
    state: u64,
}

impl Default for StableHasher {
    fn default() -> Self {
        Self { state: 0xCBF2_9CE4_8422_2325 }
    }
}

impl StableHasher {
    /// A hasher with the default seed.
    pub fn new() -> Self {
        Self::default()
    }
}

impl Hasher for StableHasher {
    fn finish(&self) -> u64 {
        mix64(self.state)
    }

    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.write_u64(u64::from_le_bytes(c.try_into().expect("chunks of 8")));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut word = [0u8; 8];
            word[..rest.len()].copy_from_slice(rest);
            // The tail's length is mixed in so that "ab" and "ab\0" differ.
            self.write_u64(u64::from_le_bytes(word) ^ ((rest.len() as u64) << 56));
        }
    }

    fn write_u8(&mut self, i: u8) {
        self.write_u64(u64::from(i));
    }

    fn write_u16(&mut self, i: u16) {
        self.write_u64(u64::from(i));
    }

    fn write_u32(&mut self, i: u32) {
        self.write_u64(u64::from(i));
    }

    fn write_u64(&mut self, i: u64) {
        self.state = mix64(self.state ^ i);
    }

    fn write_usize(&mut self, i: usize) {
        self.write_u64(i as u64);
    }

    fn write_isize(&mut self, i: isize) {
        self.write_u64(i as u64);
    }

    fn write_i64(&mut self, i: i64) {
        self.write_u64(i as u64);
    }

    fn write_i32(&mut self, i: i32) {
        self.write_u64(i as u64);
    }
}

/// A 128-bit digest of a service state or of a stream of replies.
///
/// Equal states have equal digests; different states have different digests
/// with overwhelming probability. Printed as 32 hex digits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Digest(pub [u8; 16]);

impl Digest {
    /// The digest of a byte string (e.g. a snapshot): two hashes of it
    /// with different seeds.
    pub fn of_bytes(bytes: &[u8]) -> Self {
        let mut lo = StableHasher::new();
        lo.write(bytes);
        let mut hi = StableHasher { state: mix64(bytes.len() as u64) };
        hi.write(bytes);
        let mut d = [0u8; 16];
        d[..8].copy_from_slice(&lo.finish().to_le_bytes());
        d[8..].copy_from_slice(&hi.finish().to_le_bytes());
        Digest(d)
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

/// Builds a [`Digest`] of a set of entries whose order does not matter
/// (hash-map contents, replies produced by different workers).
///
/// Each entry is hashed on its own and the hashes are combined with
/// commutative operations (sum and xor, plus a count), so two builders fed
/// the same multiset of entries in any order, or merged from parts, agree.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnorderedDigest {
    sum: u64,
    xor: u64,
    count: u64,
}

impl UnorderedDigest {
    /// An empty digest.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one entry, given as its stable 64-bit hash.
    #[inline]
    pub fn add_hash(&mut self, h: u64) {
        self.sum = self.sum.wrapping_add(h);
        self.xor ^= mix64(h ^ 0xA5A5_A5A5_A5A5_A5A5);
        self.count += 1;
    }

    /// Adds every entry of `other`.
    pub fn merge(&mut self, other: &UnorderedDigest) {
        self.sum = self.sum.wrapping_add(other.sum);
        self.xor ^= other.xor;
        self.count += other.count;
    }

    /// Number of entries added.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The digest of the entries added so far.
    pub fn finish(&self) -> Digest {
        let a = mix64(self.sum ^ mix64(self.count));
        let b = mix64(self.xor ^ self.count.rotate_left(32));
        let mut out = [0u8; 16];
        out[..8].copy_from_slice(&a.to_be_bytes());
        out[8..].copy_from_slice(&b.to_be_bytes());
        Digest(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::Hash;

    fn h<T: Hash>(t: T) -> u64 {
        let mut s = StableHasher::new();
        t.hash(&mut s);
        s.finish()
    }

    #[test]
    fn stable_hasher_is_deterministic_and_discriminating() {
        assert_eq!(h((1u64, "x")), h((1u64, "x")));
        assert_ne!(h((1u64, "x")), h((2u64, "x")));
        assert_ne!(h(1u64), h(2u64));
        assert_ne!(h("ab"), h("ab\0"));
        assert_ne!(h([1u8, 2].as_slice()), h([2u8, 1].as_slice()));
        assert_ne!(h("abcdefgh1"), h("abcdefgh2"));
        // Widening makes the hash independent of the integer's width.
        assert_eq!(h(7usize), h(7u64));
    }

    #[test]
    fn unordered_digest_ignores_order_but_not_content() {
        let mut a = UnorderedDigest::new();
        let mut b = UnorderedDigest::new();
        for i in 0..100u64 {
            a.add_hash(h(i));
            b.add_hash(h(99 - i));
        }
        assert_eq!(a.finish(), b.finish());
        b.add_hash(h(5u64));
        assert_ne!(a.finish(), b.finish());
        let mut c = UnorderedDigest::new();
        let mut d = UnorderedDigest::new();
        for i in 0..50u64 {
            c.add_hash(h(i));
        }
        for i in 50..100u64 {
            d.add_hash(h(i));
        }
        c.merge(&d);
        assert_eq!(a.finish(), c.finish());
        assert_eq!(a.finish().to_string().len(), 32);
    }
}
