//! The `Service` trait: what a replicated, parallel state machine provides.

use crate::command::Command;
use crate::digest::Digest;
use crate::snapshot::{read_all, Frozen, FrozenDigest, SnapshotError};
use std::fmt::Debug;
use std::hash::Hash;
use std::io::Read;

/// A deterministic state machine whose independent commands may run at once.
///
/// `execute` takes `&self` and the service is `Sync`: a scheduler calls it
/// from several worker threads, but only ever for commands that do not
/// conflict (per their read and write sets, or per the class model for the
/// early scheduler). The service protects its own memory (for instance with
/// a lock per shard) so that a scheduler bug can make results wrong, which
/// the differential tests catch, but never makes memory unsafe.
///
/// Determinism: the reply and the state change of a command may depend only
/// on the state and the command, never on time, thread identity or
/// randomness not derived from the command.
pub trait Service: Send + Sync + 'static {
    /// A service operation, carried in [`Command::op`].
    type Op: Send + Sync + Debug + 'static;
    /// The reply to an operation. `Hash` must be stable across processes
    /// (derive it on plain data), because replies are digested.
    type Reply: Send + Clone + PartialEq + Debug + Hash + 'static;

    /// Executes one command and returns its reply.
    fn execute(&self, command: &Command<Self::Op>) -> Self::Reply;

    /// Serializes the whole state into one byte vector: the small-service
    /// path (see [`crate::snapshot`]). Must not run concurrently with
    /// `execute`. A service with a large state overrides
    /// [`Service::freeze`] and [`Service::restore_from`] to stream instead,
    /// and may make this `freeze` into a vector (tests and digests use it).
    fn snapshot(&self) -> Vec<u8>;

    /// Copies the state for a snapshot written later: what execution must
    /// pause for is only the copy, and the returned [`Frozen`] writes the
    /// bytes [`Service::snapshot`] would have made to a sink, on whichever
    /// thread calls it. Must not run concurrently with `execute`. The
    /// default encodes at once; a service with a large state overrides it
    /// with a cheaper copy that it writes out piece by piece (the replica
    /// takes its snapshots this way, and writes them on a side pool).
    fn freeze(&self) -> Frozen {
        let bytes = self.snapshot();
        Box::new(move |sink| sink.write_all(&bytes))
    }

    /// Replaces the state with a snapshot taken by [`Service::snapshot`].
    /// On error the state is unchanged.
    fn restore(&self, snapshot: &[u8]) -> Result<(), SnapshotError>;

    /// Replaces the state with the snapshot `source` yields, the bytes a
    /// [`Frozen`] of this service wrote (psmr has checked them). The
    /// default reads them whole and calls [`Service::restore`]; a service
    /// with a large state overrides it to decode as it reads, so that no
    /// encoded copy of the state is ever held. A streaming restore may
    /// leave the state partly replaced when it fails after its header;
    /// the replica then stops rather than run on such a state.
    fn restore_from(&self, source: &mut dyn Read) -> Result<(), SnapshotError> {
        self.restore(&read_all(source)?)
    }

    /// Reads as much of the snapshot `source` yields as it takes to tell
    /// whether [`Service::restore_from`] would take it (its format and
    /// version, say), without touching the state. A replica calls it on a
    /// snapshot received from the leader before it keeps the file, and
    /// refuses one it fails: the replica keeps its state and its own
    /// snapshot. The default takes every snapshot (the default
    /// `restore_from` leaves the state unchanged when it refuses one); a
    /// service that streams its restore checks its header here.
    fn check_snapshot(&self, source: &mut dyn Read) -> Result<(), SnapshotError> {
        let _ = source;
        Ok(())
    }

    /// A digest of the state: equal states give equal digests. The default
    /// digests [`Service::snapshot`], so it needs a snapshot that is a
    /// function of the state alone (sorted maps, not hash-map order);
    /// services with large states or unordered snapshots override it.
    fn digest(&self) -> Digest {
        Digest::of_bytes(&self.snapshot())
    }

    /// Copies what [`Service::digest`] reads, as [`Service::freeze`] does,
    /// and returns the digest to compute later on any thread: a replica's
    /// `status` pauses execution only for the copy, never for the digest
    /// of a large state. Must not run concurrently with `execute`. The
    /// default digests at once.
    fn freeze_digest(&self) -> FrozenDigest {
        let digest = self.digest();
        Box::new(move || digest)
    }
}
