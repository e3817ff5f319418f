//! The random stream of a kv load's client: which keys it touches and what
//! values it writes. psmr's own load (`psmr client load`, `psmr bench`) and
//! the etcd driver of the peers scenario both draw from it, so that for the
//! same seed both put the same keys with the same values.

/// The seed of client `client`'s stream: each client its own stream, the
/// same seed the same streams.
pub fn client_seed(seed: u64, client: usize) -> u64 {
    (seed ^ (client as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)).wrapping_mul(0xBF58_476D_1CE4_E5B9)
}

/// Marsaglia's xorshift64 (13, 7, 17): fast, and plenty for picking keys.
#[derive(Clone, Debug)]
pub struct XorShift(u64);

impl XorShift {
    /// A stream from `seed`, its lowest bit set: xorshift never leaves
    /// the all-zero state.
    pub fn new(seed: u64) -> Self {
        Self(seed | 1)
    }

    /// The next number.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// `n` in decimal as exactly `bytes` bytes: zeros on the left, or its last
/// `bytes` digits.
pub fn sized_value(n: u64, bytes: usize) -> Vec<u8> {
    let digits = format!("{n:020}");
    if bytes <= digits.len() {
        digits.as_bytes()[digits.len() - bytes..].to_vec()
    } else {
        format!("{n:0>bytes$}").into_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sized_values_have_exactly_the_size_asked() {
        assert_eq!(sized_value(42, 5), b"00042");
        assert_eq!(sized_value(123_456, 3), b"456");
        assert_eq!(sized_value(u64::MAX, 20), u64::MAX.to_string().as_bytes());
        let v = sized_value(7, 64);
        assert_eq!((v.len(), v[63], v[0]), (64, b'7', b'0'));
        assert!(sized_value(7, 0).is_empty());
    }

    #[test]
    fn streams_are_reproducible_and_differ_per_client() {
        let draw = |client| {
            let mut x = XorShift::new(client_seed(1, client));
            (0..4).map(|_| x.next()).collect::<Vec<_>>()
        };
        assert_eq!(draw(0), draw(0));
        assert_ne!(draw(0), draw(1));
        assert_ne!(XorShift::new(0).next(), 0);
    }
}
