//! The `Service` trait: what a replicated, parallel state machine provides.

use crate::command::Command;
use crate::digest::Digest;
use std::fmt::Debug;
use std::hash::Hash;
use thiserror::Error;

/// A snapshot could not be restored.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum SnapshotError {
    /// The bytes end before the snapshot does.
    #[error("snapshot truncated at byte {0}")]
    Truncated(usize),
    /// The bytes are not a snapshot of this service.
    #[error("malformed snapshot: {0}")]
    Malformed(String),
}

/// A copy of a service's state, taken by [`Service::freeze`] while nothing
/// executes, that encodes into its snapshot when called: later, on another
/// thread, while execution goes on.
pub type Frozen = Box<dyn FnOnce() -> Vec<u8> + Send>;

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

    /// Serializes the whole state. Must not run concurrently with `execute`.
    fn snapshot(&self) -> Vec<u8>;

    /// Copies the state for a snapshot encoded later: what execution must
    /// pause for is only the copy, and the returned [`Frozen`] makes the
    /// bytes [`Service::snapshot`] would have made, on whichever thread
    /// calls it. Must not run concurrently with `execute`. The default
    /// encodes at once; a service with a large state overrides it with a
    /// cheaper copy (the replica takes its snapshots this way, and encodes
    /// them on a side pool).
    fn freeze(&self) -> Frozen {
        let bytes = self.snapshot();
        Box::new(move || bytes)
    }

    /// Replaces the state with a snapshot taken by [`Service::snapshot`].
    /// On error the state is unchanged.
    fn restore(&self, snapshot: &[u8]) -> Result<(), SnapshotError>;

    /// A digest of the state: equal states give equal digests. The default
    /// digests [`Service::snapshot`], so it needs a snapshot that is a
    /// function of the state alone (sorted maps, not hash-map order);
    /// services with large states or unordered snapshots override it.
    fn digest(&self) -> Digest {
        Digest::of_bytes(&self.snapshot())
    }
}
