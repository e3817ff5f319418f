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
