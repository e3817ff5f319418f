//! Commands and the key-level conflict relation.

use smallvec::SmallVec;
use std::fmt;

/// A key of the service state: the unit at which conflicts are decided.
///
/// Services map their state onto keys (a key-value store uses its keys, the
/// sharded list uses shard numbers). Two commands conflict when one writes a
/// key that the other reads or writes.
pub type Key = u64;

/// The key that stands for a service's whole state, for commands that
/// depend on or change every key (a count of keys, a flush): a service
/// makes every command read it and such commands write it, so that they
/// conflict with everything while reads of it conflict with nothing.
/// Batch bitmaps give it a bit of its own ([`crate::KeyBitmap::bit_of`]).
pub const KEY_ALL: Key = u64::MAX;

/// The keys a command reads or writes. Most commands touch one or two keys,
/// so they are stored inline.
pub type KeySet = SmallVec<[Key; 2]>;

/// Identifies a client: replies are routed back by (client, sequence number).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClientId(pub u64);

impl fmt::Display for ClientId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Identifies a request class: an index into a [`crate::ClassModel`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClassId(pub u16);

impl ClassId {
    /// The class index as a `usize`, for indexing per-class tables.
    #[inline]
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// One client command as the schedulers see it.
///
/// The read and write sets are what the late schedulers use to find
/// conflicts; the class is what the early scheduler uses. A service that
/// builds commands must make both agree with what `execute` really touches;
/// [`crate::ClassModel::check_commands`] and the services' conflict sanitizer
/// check that they do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Command<O> {
    /// The client that sent the command.
    pub client: ClientId,
    /// The client's sequence number for this command; (client, seq) is unique.
    pub seq: u64,
    /// The request class of the command.
    pub class: ClassId,
    /// Keys the command reads (and does not write).
    pub reads: KeySet,
    /// Keys the command writes (it may read them too).
    pub writes: KeySet,
    /// The service operation to execute.
    pub op: O,
    /// When the log delivered it: the time and seed of its log entry.
    pub stamp: Stamp,
}

/// The time and the seed a command executes with, the same on every
/// replica: the leader stamps each log entry with its clock (never going
/// back along the log) and a seed, and every replica executes the entry's
/// commands with them. A service reads time (key expiry) and draws
/// anything random (a random member of a set) from the stamp only, never
/// from the clock or a generator of its own, so that replicas stay equal.
/// Commands built outside a log (tests, benchmarks) have the zero stamp.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Stamp {
    /// Milliseconds since the Unix epoch on the leader's clock when it
    /// proposed the entry, raised to the previous entry's if its clock was
    /// behind. Reads served without the log get the serving replica's
    /// time, raised the same way.
    pub time_ms: u64,
    /// A seed drawn for the entry.
    pub seed: u64,
}

impl Stamp {
    /// A stamp at `time_ms` with no seed.
    pub fn at(time_ms: u64) -> Self {
        Self { time_ms, seed: 0 }
    }

    /// The seed of one command of the entry: the entry's seed mixed with
    /// the command's client and sequence number, so that two commands of
    /// an entry draw differently and every replica draws alike.
    pub fn seed_for(&self, client: ClientId, seq: u64) -> u64 {
        let mut x = self.seed ^ client.0.rotate_left(17) ^ seq.rotate_left(41);
        x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        x ^ (x >> 31)
    }
}

impl<O> Command<O> {
    /// True when the two commands must execute in log order: one of them
    /// writes a key the other reads or writes.
    pub fn conflicts_with<P>(&self, other: &Command<P>) -> bool {
        let touches = |c: &Command<P>, k: &Key| c.reads.contains(k) || c.writes.contains(k);
        self.writes.iter().any(|k| touches(other, k)) || other.writes.iter().any(|k| self.reads.contains(k))
    }

    /// True when the command writes nothing.
    pub fn is_read_only(&self) -> bool {
        self.writes.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use smallvec::smallvec;

    fn cmd(reads: &[Key], writes: &[Key]) -> Command<()> {
        Command {
            client: ClientId(1),
            seq: 1,
            class: ClassId(0),
            reads: reads.iter().copied().collect(),
            writes: writes.iter().copied().collect(),
            op: (),
            stamp: Default::default(),
        }
    }

    #[test]
    fn conflict_needs_a_write_on_a_shared_key() {
        assert!(!cmd(&[1], &[]).conflicts_with(&cmd(&[1], &[])));
        assert!(cmd(&[1], &[]).conflicts_with(&cmd(&[], &[1])));
        assert!(cmd(&[], &[1]).conflicts_with(&cmd(&[1], &[])));
        assert!(cmd(&[], &[1]).conflicts_with(&cmd(&[], &[1])));
        assert!(!cmd(&[], &[1]).conflicts_with(&cmd(&[2], &[3])));
        let c = Command { writes: smallvec![7, 8], ..cmd(&[], &[]) };
        assert!(c.conflicts_with(&cmd(&[8], &[])));
    }
}
