//! Password hashes as a configuration stores them:
//! `pbkdf2-sha256$<iterations>$<salt, hex>$<hash, hex>`.
//!
//! PBKDF2-HMAC-SHA256 from `ring`, which the build already has for TLS:
//! a memory-hard hash (argon2) would be stronger against guessing on
//! GPUs, but it is one more crate of cryptography, and the secrets
//! `psmr cluster` makes are 256 random bits, which no hash needs to
//! stretch. A user's own password gets [`ITERATIONS_DEFAULT`] rounds.

use crate::AuthError;
use ring::pbkdf2;
use ring::rand::{SecureRandom, SystemRandom};
use std::fmt;
use std::num::NonZeroU32;
use std::str::FromStr;

/// Rounds of a new hash: about 25 ms of one core (a million rounds took
/// 0.23 s of CPU on a 2-core test machine), so that a stolen
/// configuration costs a guesser that much per guess and a replica pays
/// it once per user and password it sees (then it remembers them).
pub const ITERATIONS_DEFAULT: u32 = 100_000;
/// Fewest rounds a configuration may give.
pub const ITERATIONS_MIN: u32 = 1_000;
/// Most rounds a configuration may give (each check would take seconds).
pub const ITERATIONS_MAX: u32 = 10_000_000;

const SCHEME: &str = "pbkdf2-sha256";
const SALT_LEN: usize = 16;
const HASH_LEN: usize = 32;

/// A salted password hash.
#[derive(Clone, PartialEq, Eq)]
pub struct PasswordHash {
    iterations: NonZeroU32,
    salt: [u8; SALT_LEN],
    hash: [u8; HASH_LEN],
}

impl PasswordHash {
    /// Hashes `password` with a fresh random salt and `iterations` rounds.
    pub fn new(password: &[u8], iterations: u32) -> Result<Self, AuthError> {
        let iterations = rounds(iterations)?;
        let mut salt = [0; SALT_LEN];
        SystemRandom::new().fill(&mut salt).map_err(|_| AuthError::Random)?;
        let mut hash = [0; HASH_LEN];
        pbkdf2::derive(pbkdf2::PBKDF2_HMAC_SHA256, iterations, &salt, password, &mut hash);
        Ok(Self { iterations, salt, hash })
    }

    /// Whether `password` is the one hashed (in constant time).
    pub fn matches(&self, password: &[u8]) -> bool {
        pbkdf2::verify(pbkdf2::PBKDF2_HMAC_SHA256, self.iterations, &self.salt, password, &self.hash).is_ok()
    }
}

/// Checks a number of rounds a hash may have.
pub fn check_rounds(iterations: u32) -> Result<(), AuthError> {
    rounds(iterations).map(drop)
}

fn rounds(iterations: u32) -> Result<NonZeroU32, AuthError> {
    match NonZeroU32::new(iterations) {
        Some(n) if (ITERATIONS_MIN..=ITERATIONS_MAX).contains(&iterations) => Ok(n),
        _ => Err(AuthError::Hash(format!(
            "{iterations} rounds; between {ITERATIONS_MIN} and {ITERATIONS_MAX} are accepted"
        ))),
    }
}

fn unhex<const N: usize>(text: &str, what: &str) -> Result<[u8; N], AuthError> {
    let mut out = [0; N];
    hex::decode_to_slice(text, &mut out)
        .map_err(|_| AuthError::Hash(format!("the {what} is not {} hex digits", 2 * N)))?;
    Ok(out)
}

impl FromStr for PasswordHash {
    type Err = AuthError;

    fn from_str(s: &str) -> Result<Self, AuthError> {
        let parts: Vec<&str> = s.split('$').collect();
        let [scheme, iterations, salt, hash] = parts[..] else {
            return Err(AuthError::Hash(format!("expected {SCHEME}$<rounds>$<salt>$<hash> (psmr passwd makes one)")));
        };
        if scheme != SCHEME {
            return Err(AuthError::Hash(format!("unknown scheme {scheme:?}: only {SCHEME} is known")));
        }
        let iterations = iterations.parse().map_err(|_| AuthError::Hash(format!("rounds {iterations:?}")))?;
        Ok(Self { iterations: rounds(iterations)?, salt: unhex(salt, "salt")?, hash: unhex(hash, "hash")? })
    }
}

impl fmt::Display for PasswordHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{SCHEME}${}${}${}", self.iterations, hex::encode(self.salt), hex::encode(self.hash))
    }
}

impl fmt::Debug for PasswordHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PasswordHash({SCHEME}, {} rounds)", self.iterations)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hash_matches_its_password_only_and_survives_its_text() {
        let h = PasswordHash::new(b"secret", ITERATIONS_MIN).unwrap();
        assert!(h.matches(b"secret"));
        assert!(!h.matches(b"secreT"));
        assert!(!h.matches(b""));
        let back: PasswordHash = h.to_string().parse().unwrap();
        assert_eq!(back, h);
        assert!(back.matches(b"secret"));
    }

    #[test]
    fn the_same_password_gets_a_different_salt() {
        let (a, b) =
            (PasswordHash::new(b"pw", ITERATIONS_MIN).unwrap(), PasswordHash::new(b"pw", ITERATIONS_MIN).unwrap());
        assert_ne!(a.to_string(), b.to_string());
    }

    #[test]
    fn malformed_hashes_are_refused_with_their_reason() {
        let good = PasswordHash::new(b"pw", ITERATIONS_MIN).unwrap().to_string();
        let cases = [
            ("", "expected"),
            ("secret", "expected"),
            (&good.replace("pbkdf2-sha256", "md5"), "unknown scheme"),
            (&good.replacen("$1000$", "$10$", 1), "rounds"),
            (&good.replacen("$1000$", "$x$", 1), "rounds"),
            (&format!("{good}00"), "hash"),
            (&format!("pbkdf2-sha256$1000${}${}", "zz".repeat(SALT_LEN), "00".repeat(HASH_LEN)), "salt is not"),
            (&format!("pbkdf2-sha256$1000${}$00", "00".repeat(SALT_LEN)), "hash is not"),
        ];
        for (text, why) in cases {
            let err = text.parse::<PasswordHash>().unwrap_err().to_string();
            assert!(err.contains(why), "{text:?}: {err}");
        }
    }

    #[test]
    fn debug_output_shows_no_secret() {
        let h = PasswordHash::new(b"pw", ITERATIONS_MIN).unwrap();
        let shown = format!("{h:?}");
        assert!(!shown.contains(&hex::encode(h.hash)) && !shown.contains(&hex::encode(h.salt)), "{shown}");
    }
}
