//! A client request as the core sees it: checked and encoded by whoever
//! received it (ClientIO, the Redis gateway, the simulator's clients), its
//! commands already in the log entry encoding ([`crate::entry`]).

use std::fmt;

/// Something the receiver of a request holds while the core holds the
/// request, given back when the core drops it: a share of a memory
/// budget, a place in a queue. The core never looks inside.
#[derive(Default)]
pub struct Lease(Option<Box<dyn Send>>);

impl Lease {
    /// Holds `guard` until the lease is dropped.
    pub fn new(guard: impl Send + 'static) -> Self {
        Self(Some(Box::new(guard)))
    }

    /// Holds nothing.
    pub fn none() -> Self {
        Self(None)
    }

    /// Holds something.
    pub fn is_held(&self) -> bool {
        self.0.is_some()
    }
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.is_held() { "Lease(held)" } else { "Lease(none)" })
    }
}

/// One client request: one or more commands of one client, in the order
/// of their sequence numbers.
#[derive(Debug)]
pub struct Request {
    /// The client.
    pub client: u64,
    /// Its commands.
    pub count: u32,
    /// The commands, encoded by [`crate::entry::encode_command`].
    pub encoded: Vec<u8>,
    /// Bytes of operations in it.
    pub bytes: usize,
    /// When it was received, ns on the driver's clock.
    pub at_ns: u64,
    /// Every command only reads: the leader may serve it without a log
    /// entry (see the protocol's reads).
    pub read: bool,
    /// Given back once the request is in a proposed entry (or executed,
    /// for a read): the frame's share of the receiver's memory budget.
    pub held: Lease,
    /// Given back once the core has taken the request into an entry (or,
    /// for a read, handed it to execution): its place in the queue that
    /// brought it.
    pub slot: Lease,
}

impl Request {
    /// A request of `client` with `count` commands encoded in `encoded`,
    /// received at `at_ns`, holding nothing.
    pub fn new(client: u64, count: u32, encoded: Vec<u8>, bytes: usize, at_ns: u64) -> Self {
        Self { client, count, encoded, bytes, at_ns, read: false, held: Lease::none(), slot: Lease::none() }
    }
}

/// Why a request is refused before it reaches the core.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Client id 0 is reserved.
    ReservedClient,
    /// A request must hold a command.
    Empty,
    /// More commands than an entry holds.
    TooManyCommands {
        /// The limit.
        max: usize,
        /// The request's.
        got: usize,
    },
    /// More bytes of operations than an entry holds.
    TooManyBytes {
        /// The limit.
        max: usize,
        /// The request's.
        got: usize,
    },
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::ReservedClient => f.write_str("client id 0 is reserved"),
            Refusal::Empty => f.write_str("a request needs at least one command"),
            Refusal::TooManyCommands { max, got } => {
                write!(f, "a request holds at most {max} commands, this one {got}")
            }
            Refusal::TooManyBytes { max, got } => {
                write!(f, "a request holds at most {max} bytes of operations, this one {got}")
            }
        }
    }
}

/// Checks a request of `client` whose operations are `ops` long against
/// the limits of one entry (`batch_max_commands`, `batch_max_bytes`): the
/// batcher never splits a request, so one that does not fit is refused
/// whole.
pub fn check(
    client: u64,
    ops: impl ExactSizeIterator<Item = usize>,
    max_commands: usize,
    max_bytes: usize,
) -> Result<(), Refusal> {
    if client == 0 {
        return Err(Refusal::ReservedClient);
    }
    let got = ops.len();
    if got == 0 {
        return Err(Refusal::Empty);
    }
    if got > max_commands {
        return Err(Refusal::TooManyCommands { max: max_commands, got });
    }
    let bytes: usize = ops.sum();
    if bytes > max_bytes {
        return Err(Refusal::TooManyBytes { max: max_bytes, got: bytes });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[test]
    fn a_lease_gives_back_what_it_holds_when_dropped() {
        struct Guard(Arc<AtomicUsize>);
        impl Drop for Guard {
            fn drop(&mut self) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let given_back = Arc::new(AtomicUsize::new(0));
        let lease = Lease::new(Guard(given_back.clone()));
        assert!(lease.is_held());
        assert_eq!(given_back.load(Ordering::SeqCst), 0);
        drop(lease);
        assert_eq!(given_back.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn requests_that_cannot_fit_an_entry_are_refused_whole() {
        assert_eq!(check(0, [1].into_iter(), 4, 10), Err(Refusal::ReservedClient));
        assert_eq!(check(1, std::iter::empty(), 4, 10), Err(Refusal::Empty));
        assert_eq!(check(1, [1; 5].into_iter(), 4, 10), Err(Refusal::TooManyCommands { max: 4, got: 5 }));
        assert_eq!(check(1, [6, 5].into_iter(), 4, 10), Err(Refusal::TooManyBytes { max: 10, got: 11 }));
        assert_eq!(check(1, [5, 5].into_iter(), 4, 10), Ok(()));
    }
}
