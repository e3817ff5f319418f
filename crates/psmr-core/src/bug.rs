//! Known bugs, planted in the core's own code paths so that the simulator
//! can show that its checks catch them (`psmr simulate --bug`): a
//! simulation that passes means something only if one with a bug fails.
//!
//! Only a core built with the `bugs` feature can carry one, and only the
//! simulator's constructors set it ([`crate::protocol::Options::inject`],
//! [`crate::apply::Applier::inject`]): no configuration key, flag or
//! message of a running replica reaches them.

use std::fmt;
use std::str::FromStr;

/// A bug to plant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum Bug {
    /// A leader executes and answers each entry's commands as soon as it
    /// proposes it, outside the log, as if they were reads: a write is
    /// acknowledged before it commits, and the leader's state leaves its
    /// followers'.
    AckBeforeCommit,
    /// A replica repaired after it lost its log votes and campaigns at
    /// once, as if it had lost nothing, instead of waiting for its log to
    /// reach its vote floor: it may help elect a leader that lacks entries
    /// it acknowledged.
    IgnoreVoteFloor,
    /// The apply loop never consults the reply cache: a retried write
    /// executes again.
    NoReplyCache,
    /// A leader serves a read without the log at once, without a ReadIndex
    /// round: a deposed leader that does not know it answers stale reads.
    ReadWithoutRound,
    /// The batcher puts the commands of a request into the entry last
    /// first: a client's commands execute out of order.
    ReorderCommands,
    /// A restarting replica starts raft as if nothing were applied, and the
    /// entries the log keeps behind its snapshot are applied a second time
    /// on top of the restored state.
    ApplyTwiceAfterRestore,
    /// A ready's persisted messages (votes, acknowledgements) and the
    /// commits they allow leave before its entries and hard state are
    /// synced: a crash then loses what was acknowledged.
    ReplyBeforeSync,
}

impl Bug {
    /// Every bug, in the order [`Bug::NAMES`] lists them.
    pub const ALL: [Bug; 7] = [
        Bug::AckBeforeCommit,
        Bug::IgnoreVoteFloor,
        Bug::NoReplyCache,
        Bug::ReadWithoutRound,
        Bug::ReorderCommands,
        Bug::ApplyTwiceAfterRestore,
        Bug::ReplyBeforeSync,
    ];

    /// The names `FromStr` takes.
    pub const NAMES: [&'static str; 7] = [
        "ack-before-commit",
        "ignore-vote-floor",
        "no-reply-cache",
        "read-without-round",
        "reorder-commands",
        "apply-twice-after-restore",
        "reply-before-sync",
    ];

    /// Its name in [`Bug::NAMES`].
    pub fn name(self) -> &'static str {
        let i = Bug::ALL.iter().position(|&b| b == self).expect("every bug is listed");
        Bug::NAMES[i]
    }
}

impl fmt::Display for Bug {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is not one of [`Bug::NAMES`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown bug {0:?}: expected one of {list}", list = Bug::NAMES.join(", "))]
pub struct UnknownBug(pub String);

impl FromStr for Bug {
    type Err = UnknownBug;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let i = Bug::NAMES.iter().position(|&n| n == s.trim()).ok_or_else(|| UnknownBug(s.to_string()))?;
        Ok(Bug::ALL[i])
    }
}

/// The bug a part of the core carries: always none without the `bugs`
/// feature, so that every check of it compiles to nothing.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Planted {
    #[cfg(feature = "bugs")]
    bug: Option<Bug>,
}

impl Planted {
    /// Carries `bug`.
    #[cfg(feature = "bugs")]
    pub(crate) fn new(bug: Option<Bug>) -> Self {
        Self { bug }
    }

    /// Whether `bug` is planted.
    #[inline]
    pub(crate) fn is(&self, bug: Bug) -> bool {
        #[cfg(feature = "bugs")]
        return self.bug == Some(bug);
        #[cfg(not(feature = "bugs"))]
        {
            let _ = bug;
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_ones_are_refused() {
        for bug in Bug::ALL {
            assert_eq!(bug.name().parse::<Bug>(), Ok(bug));
        }
        let e = "no-such-bug".parse::<Bug>().unwrap_err();
        assert!(e.to_string().contains("reply-before-sync"), "{e}");
    }
}
