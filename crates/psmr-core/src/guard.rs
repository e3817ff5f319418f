//! The raft guard: every raft message from a peer passes here before
//! `RawNode::step`.
//!
//! # Threat model
//!
//! Peers are authenticated members of the cluster and are trusted to run
//! honest psmr code (crash faults, not Byzantine ones; see `docs/design.md`).
//! But bugs happen, frames get corrupted in ways a checksum misses, and an
//! old or mismatched binary may speak the same wire format with other
//! meanings. raft-rs, for its part, trusts its input completely: dozens of
//! `fatal!`, `panic!`, `assert!` and `unwrap` sites are reachable from
//! [`raft::RawNode::step`] and from the `ready`/`advance` that follows it
//! (a heartbeat whose commit index is past the end of the log panics with
//! `to_commit ... is out of range`, for one). A panic on the protocol
//! thread stops the whole replica. The guard keeps raft-rs's own
//! assertions from being reachable by a peer: a message that breaks one of
//! the rules below is dropped (counted and logged, rate-limited, by the
//! driver) and never reaches raft.
//!
//! Every rule is a property that every message an honest psmr replica
//! sends has, whatever the network did to it (delay, loss, duplication,
//! reordering): so dropping a message that breaks one loses nothing an
//! honest cluster needs. The rules are deliberately about raft's own
//! invariants, not about what raft-rs happens to check, so that they also
//! hold for the next raft-rs version. Should raft-rs panic anyway, the
//! protocol stops (fail-stop, see [`crate::protocol`]):
//! raft's state after a panic cannot be trusted.
//!
//! # Rules
//!
//! Shape (the message alone):
//!
//! 1. [`Rule::Sender`]: `from` is the authenticated sender, another
//!    replica, and not one removed from the cluster. (Not "a member as of
//!    this replica's last committed change": a replica that lags must
//!    hear from a leader added after the changes it has seen, and a
//!    learner from its leader before it knows the members. Peer
//!    certificates, issued by the cluster's CA, say who may connect at
//!    all.)
//! 2. [`Rule::Recipient`]: `to` is this replica.
//! 3. [`Rule::LocalOnly`]: not a type raft-rs only steps locally (`MsgHup`,
//!    `MsgBeat`, `MsgUnreachable`, `MsgSnapStatus`, `MsgCheckQuorum`).
//! 4. [`Rule::Unused`]: not one of the types psmr never sends: proposals and reads
//!    are never forwarded to the leader, nor requests to transfer
//!    leadership (`MsgPropose`, `MsgReadIndex`, `MsgReadIndexResp`,
//!    `MsgTransferLeader`). A leader asked to remove itself does transfer
//!    leadership first (see [`crate::protocol`]), with `MsgTimeoutNow`.
//! 5. [`Rule::Fields`]: a term (raft-rs takes term 0 for a local message and
//!    skips its term checks); no context but a read round's on heartbeats
//!    and their responses (at most [`READ_CONTEXT_MAX`] bytes, see
//!    the protocol's reads) and `CampaignTransfer` on the vote requests of a
//!    transfer's campaign (which only the leader's `MsgTimeoutNow`
//!    starts), no priority and no snapshot request (psmr uses
//!    none); entries only on `MsgAppend`, a
//!    snapshot on `MsgSnapshot` and only there; numbers below 2^62 (no
//!    honest log or term gets there: 146 years at a billion entries a
//!    second; far from `u64::MAX`, raft-rs's `index + 1` cannot overflow).
//! 6. [`Rule::Append`]: a `MsgAppend` is a piece of its leader's log: the
//!    entries are contiguous from `index + 1`; their terms never decrease,
//!    start at `log_term` or later and end at `term` or earlier; they are
//!    normal entries or version 2 conf changes (psmr's membership changes,
//!    see [`crate::membership`]); `log_term` is 0 exactly when `index` is 0
//!    (the log's dummy entry).
//! 7. [`Rule::Snapshot`]: a snapshot covers a real entry (index and term at
//!    least 1), no later than the sender's term, and its membership is one
//!    psmr makes: at least one voter, no replica both voter and learner,
//!    no joint state, at most [`MEMBERS_MAX`] members, and this replica
//!    among them (raft ignores a snapshot without it).
//! 8. [`Rule::Vote`]: a candidate's log ends no later than its campaign
//!    term, and its commit index and term are within its log; a vote
//!    response's commit term is no later than its term.
//!
//! State (the message against this replica's raft state; only where raft
//! will act on the message's content):
//!
//! 9. [`Rule::OneLeader`]: at most one leader per term (Election Safety): no
//!    append, heartbeat or snapshot for this replica's term from anyone but
//!    the leader it knows, nor at all if this replica leads that term; a
//!    `MsgTimeoutNow` only from the leader of this replica's term (the one
//!    it knows, if it knows one), never from a later term.
//! 10. [`Rule::Commit`]: a heartbeat's commit index is within this
//!     replica's log (the leader sends `min(match, commit)`, and a log
//!     never shrinks below what it acknowledged).
//! 11. [`Rule::Committed`]: an append or a snapshot does not contradict a
//!     committed entry (Leader Completeness and State Machine Safety: one
//!     term per committed index, in every later leader's log; terms never
//!     decrease along a log).
//! 12. [`Rule::Ack`]: a response to this leader acknowledges only what it
//!     sent: indexes and commit indexes within the leader's log, a
//!     rejection hint no later than the rejected index.
//!
//! Repair:
//!
//! 13. [`Rule::VoteFloor`]: while this replica's log is behind its vote
//!     floor (see [`floor_holds`]), no vote or pre-vote request from a
//!     candidate whose log is behind the floor reaches raft. The replica
//!     may have acknowledged entries up to the floor before it lost its
//!     log: granting such a candidate a vote could elect a leader without
//!     them. (The protocol thread also stops ticking raft while the floor
//!     holds, so the replica never campaigns.)
//!
//! # What raft-rs 0.7 panics on without the guard
//!
//! Found by stepping arbitrary messages into nodes in every role (the
//! `survey_unguarded_panics` test prints the full list with examples), by
//! the rule that stops each:
//!
//! * term 0 (taken for a local message): `term should be set when sending
//!   MsgRequestVoteResponse` (`raft.rs` `RaftCore::send`), and in a
//!   candidate `debug_assert_eq!(self.term, m.term)` on appends,
//!   heartbeats and snapshots (`step_candidate`), which in a release build
//!   would set the term back to 0 instead (rule 5);
//! * forwarded types: `stepped empty MsgProp` and `term should not be set
//!   when sending MsgPropose/MsgTransferLeader` (rules 3-4);
//! * a heartbeat's commit past the log: `to_commit .. is out of range`
//!   (`raft_log.rs` `commit_to`; rule 10);
//! * entries not contiguous from the anchor: `entry .. conflict with
//!   committed entry`, subtraction overflow and slice out of range
//!   (`raft_log.rs` `maybe_append`), `unstable.slice .. out of bound`
//!   (`log_unstable.rs`), index out of bounds in `MemStorage::term`,
//!   `applied(..) is out of range` and `commit_since_index < index`
//!   (`raw_node.rs`) after a ready (rule 6);
//! * an append anchored at an earlier term than a committed entry, into a
//!   compacted log: `term(..) must be valid` (`handle_append_entries`;
//!   rule 11);
//! * a snapshot with another membership: `unable to restore config`,
//!   `invalid restore` (`Raft::restore`; rule 7); one contradicting the
//!   committed entry at its index: raft installs it and the log refuses it
//!   (`SnapshotOutOfDate`), leaving the two disagreeing (rule 11);
//! * numbers near `u64::MAX`: additions overflow in `become_candidate`,
//!   `campaign`, `Unstable::restore`, `Progress::maybe_decr_to` and
//!   `maybe_append`, subtraction in `Raft::restore` (rule 5).
//!
//! What an honest leader may put in an entry's data is not checked here:
//! the service manager skips entries it cannot decode, identically on
//! every replica.

use psmr_model::wire::MEMBERS_MAX;
use raft::prelude::{EntryType, Message, MessageType, Snapshot};
use raft::{Raft, StateRole, Storage};
use std::fmt;

/// No honest index, term or commit index gets this large (see rule 5).
pub const NUMBER_MAX: u64 = 1 << 62;

/// The rules of the guard (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Rule {
    /// 1: `from` is the authenticated sender, another replica, not removed.
    Sender,
    /// 2: `to` is this replica.
    Recipient,
    /// 3: not a type raft-rs only steps locally.
    LocalOnly,
    /// 4: not a type psmr never sends.
    Unused,
    /// 5: fields honest psmr sets (or leaves empty) for the type.
    Fields,
    /// 6: a `MsgAppend` is a contiguous piece of its leader's log.
    Append,
    /// 7: a snapshot covers a real entry and a membership psmr makes.
    Snapshot,
    /// 8: a vote request's log and commit are consistent.
    Vote,
    /// 9: at most one leader per term.
    OneLeader,
    /// 10: a heartbeat commits only within this replica's log.
    Commit,
    /// 11: an append or a snapshot does not contradict a committed entry.
    Committed,
    /// 12: a response acknowledges only what this leader sent.
    Ack,
    /// 13: no vote for a log behind this replica's vote floor.
    VoteFloor,
}

impl Rule {
    /// Every rule, in order (a rule's place here is its index in the
    /// per-rule refusal counters of the metrics).
    pub const ALL: [Rule; 13] = [
        Rule::Sender,
        Rule::Recipient,
        Rule::LocalOnly,
        Rule::Unused,
        Rule::Fields,
        Rule::Append,
        Rule::Snapshot,
        Rule::Vote,
        Rule::OneLeader,
        Rule::Commit,
        Rule::Committed,
        Rule::Ack,
        Rule::VoteFloor,
    ];

    /// A metric label value: [`Rule::name`] in snake case.
    pub fn label(self) -> &'static str {
        match self {
            Rule::Sender => "sender",
            Rule::Recipient => "recipient",
            Rule::LocalOnly => "local_only_type",
            Rule::Unused => "unused_type",
            Rule::Fields => "fields",
            Rule::Append => "append",
            Rule::Snapshot => "snapshot",
            Rule::Vote => "vote",
            Rule::OneLeader => "one_leader_per_term",
            Rule::Commit => "commit",
            Rule::Committed => "committed",
            Rule::Ack => "ack",
            Rule::VoteFloor => "vote_floor",
        }
    }

    /// This rule's place in [`Rule::ALL`] (its declaration order).
    pub fn index(self) -> usize {
        self as usize
    }

    /// A short name, for logs.
    pub fn name(self) -> &'static str {
        match self {
            Rule::Sender => "sender",
            Rule::Recipient => "recipient",
            Rule::LocalOnly => "local-only type",
            Rule::Unused => "unused type",
            Rule::Fields => "fields",
            Rule::Append => "append",
            Rule::Snapshot => "snapshot",
            Rule::Vote => "vote",
            Rule::OneLeader => "one leader per term",
            Rule::Commit => "commit",
            Rule::Committed => "committed",
            Rule::Ack => "ack",
            Rule::VoteFloor => "vote floor",
        }
    }
}

/// Why a message was refused: the rule it breaks, and how.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The rule.
    pub rule: Rule,
    /// What in the message breaks it.
    pub detail: String,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} rule: {}", self.rule.name(), self.detail)
    }
}

impl std::error::Error for Refusal {}

fn refuse(rule: Rule, detail: String) -> Result<(), Refusal> {
    Err(Refusal { rule, detail })
}

/// True while this replica's log is behind `floor`, the (term, index) of
/// the last entry it had synced before a repair took its log away (`None`:
/// no floor). Logs compare the way Raft compares them for votes: by last
/// term, then by last index.
pub fn floor_holds<S: Storage>(raft: &Raft<S>, floor: Option<(u64, u64)>) -> bool {
    floor.is_some_and(|floor| (raft.raft_log.last_term(), raft.raft_log.last_index()) < floor)
}

/// The guard of one replica: its id and the replicas removed from the
/// cluster.
#[derive(Clone, Debug)]
pub struct Guard {
    id: u64,
    removed: Vec<u64>,
}

impl Guard {
    /// The guard of replica `id`.
    pub fn new(id: u64) -> Self {
        Self { id, removed: Vec::new() }
    }

    /// Refuses the messages of these replicas, removed from the cluster.
    pub fn with_removed(mut self, removed: impl IntoIterator<Item = u64>) -> Self {
        self.removed = removed.into_iter().collect();
        self.removed.sort_unstable();
        self.removed.dedup();
        self
    }

    /// Checks message `m`, received from the authenticated peer `sender`,
    /// against the rules and against `raft`'s current state. `vote_floor`
    /// is the replica's vote floor, if it has one. `Ok` means the message
    /// may be stepped.
    pub fn check<S: Storage>(
        &self,
        m: &Message,
        sender: u64,
        raft: &Raft<S>,
        vote_floor: Option<(u64, u64)>,
    ) -> Result<(), Refusal> {
        self.identity(m, sender)?;
        kind(m.get_msg_type())?;
        fields(m)?;
        match m.get_msg_type() {
            MessageType::MsgAppend => append(m)?,
            MessageType::MsgSnapshot => self.snapshot(m)?,
            MessageType::MsgRequestVote | MessageType::MsgRequestPreVote => {
                vote_request(m)?;
                floor(m, raft, vote_floor)?;
            }
            MessageType::MsgRequestVoteResponse | MessageType::MsgRequestPreVoteResponse => vote_response(m)?,
            // A transfer's campaign: never below the vote floor.
            MessageType::MsgTimeoutNow if floor_holds(raft, vote_floor) => {
                return refuse(Rule::VoteFloor, "MsgTimeoutNow below the vote floor".into());
            }
            _ => {}
        }
        state(m, raft)
    }

    fn identity(&self, m: &Message, sender: u64) -> Result<(), Refusal> {
        if m.from != sender {
            return refuse(Rule::Sender, format!("from {} on the link of replica {sender}", m.from));
        }
        if sender == self.id || sender == 0 || self.removed.binary_search(&sender).is_ok() {
            return refuse(Rule::Sender, format!("{sender} is this replica, no replica, or removed from the cluster"));
        }
        if m.to != self.id {
            return refuse(Rule::Recipient, format!("addressed to {}, this is replica {}", m.to, self.id));
        }
        Ok(())
    }

    fn snapshot(&self, m: &Message) -> Result<(), Refusal> {
        let meta = m.get_snapshot().get_metadata();
        if meta.index == 0 || meta.term == 0 {
            return refuse(Rule::Snapshot, format!("empty snapshot (index {}, term {})", meta.index, meta.term));
        }
        if meta.term > m.term {
            return refuse(Rule::Snapshot, format!("snapshot of term {} sent in term {}", meta.term, m.term));
        }
        // raft-rs panics on some conf states, e.g. with a voter that is
        // also a learner; psmr never enters a joint state.
        let cs = meta.get_conf_state();
        let (voters, learners) = (cs.get_voters(), cs.get_learners());
        let ids = || voters.iter().chain(learners);
        let mut all: Vec<u64> = ids().copied().collect();
        all.sort_unstable();
        all.dedup();
        let why = if voters.is_empty() {
            Some("no voter")
        } else if all.len() != voters.len() + learners.len() {
            Some("a replica listed twice")
        } else if all.len() > MEMBERS_MAX || all.iter().any(|&id| id == 0 || id >= NUMBER_MAX) {
            Some("too many members, or an id no replica has")
        } else if !cs.get_voters_outgoing().is_empty() || !cs.get_learners_next().is_empty() || cs.auto_leave {
            Some("a joint state")
        } else if !ids().any(|&id| id == self.id) {
            Some("not this replica")
        } else {
            None
        };
        match why {
            Some(why) => refuse(
                Rule::Snapshot,
                format!(
                    "membership with {why}: voters {voters:?}, learners {learners:?}, outgoing {:?}, \
                     next learners {:?}, auto leave {}",
                    cs.get_voters_outgoing(),
                    cs.get_learners_next(),
                    cs.auto_leave
                ),
            ),
            None => Ok(()),
        }
    }
}

fn kind(t: MessageType) -> Result<(), Refusal> {
    use MessageType::*;
    match t {
        // raft-rs's `RawNode::step` refuses these too, but that is its
        // choice of today; the rule is the protocol's.
        MsgHup | MsgBeat | MsgUnreachable | MsgSnapStatus | MsgCheckQuorum => {
            refuse(Rule::LocalOnly, format!("{t:?} is never sent between replicas"))
        }
        // A follower forwards proposals, reads and transfer requests to the
        // leader only when asked to by its application; psmr's protocol
        // thread proposes, reads and transfers leadership only as leader.
        MsgPropose | MsgReadIndex | MsgReadIndexResp | MsgTransferLeader => {
            refuse(Rule::Unused, format!("psmr never sends {t:?}"))
        }
        MsgAppend
        | MsgAppendResponse
        | MsgRequestVote
        | MsgRequestVoteResponse
        | MsgSnapshot
        | MsgHeartbeat
        | MsgHeartbeatResponse
        | MsgRequestPreVote
        | MsgRequestPreVoteResponse
        | MsgTimeoutNow => Ok(()),
    }
}

/// Longest context a heartbeat carries: a read round's (8 bytes, see
/// the protocol's reads).
pub const READ_CONTEXT_MAX: usize = 8;

fn fields(m: &Message) -> Result<(), Refusal> {
    let t = m.get_msg_type();
    // raft-rs sets the sender's term on every message it sends to a peer
    // (`RaftCore::send`) except forwarded proposals and reads; a term 0
    // message would skip every term check as a local one.
    if m.term == 0 {
        return refuse(Rule::Fields, format!("{t:?} without a term"));
    }
    let heartbeat = matches!(t, MessageType::MsgHeartbeat | MessageType::MsgHeartbeatResponse);
    let transfer = t == MessageType::MsgRequestVote && m.context == raft::CAMPAIGN_TRANSFER;
    if !m.context.is_empty() && !transfer && (!heartbeat || m.context.len() > READ_CONTEXT_MAX) {
        return refuse(Rule::Fields, format!("{t:?} with a context of {} bytes", m.context.len()));
    }
    // Set only by `RawNode::request_snapshot`, which psmr never calls.
    if m.request_snapshot != 0 {
        return refuse(Rule::Fields, format!("{t:?} requests a snapshot at {}", m.request_snapshot));
    }
    // psmr runs every replica at raft's default priority, 0.
    if m.priority != 0 || m.deprecated_priority != 0 {
        return refuse(Rule::Fields, format!("{t:?} with priority {}", m.priority));
    }
    if !m.entries.is_empty() && t != MessageType::MsgAppend {
        return refuse(Rule::Fields, format!("{t:?} with {} entries", m.entries.len()));
    }
    if m.has_snapshot() != (t == MessageType::MsgSnapshot) {
        return refuse(Rule::Fields, format!("{t:?} with a snapshot: {}", m.has_snapshot()));
    }
    let meta = m.get_snapshot().get_metadata();
    let numbers = [m.term, m.log_term, m.index, m.commit, m.commit_term, m.reject_hint, meta.index, meta.term];
    let entries = m.entries.iter().flat_map(|e| [e.index, e.term]);
    if let Some(n) = numbers.into_iter().chain(entries).find(|&n| n >= NUMBER_MAX) {
        return refuse(Rule::Fields, format!("{t:?} with a number ({n}) no honest log reaches"));
    }
    Ok(())
}

/// Rule 6 (the numbers are below [`NUMBER_MAX`]: no overflow).
fn append(m: &Message) -> Result<(), Refusal> {
    // A leader sends `term(next - 1)` of its own log; the dummy entry at
    // index 0 has term 0 and every real entry a term of at least 1.
    if (m.index == 0) != (m.log_term == 0) {
        return refuse(Rule::Append, format!("anchored at index {} of term {}", m.index, m.log_term));
    }
    if m.log_term > m.term {
        return refuse(Rule::Append, format!("anchored at term {} in term {}", m.log_term, m.term));
    }
    let mut prev = m.log_term;
    for (i, e) in m.entries.iter().enumerate() {
        if e.index != m.index + 1 + i as u64 {
            return refuse(Rule::Append, format!("entry {} at index {} after index {}", i, e.index, m.index));
        }
        if e.term < prev.max(1) || e.term > m.term {
            return refuse(
                Rule::Append,
                format!("entry {} of term {} after term {prev}, sent in term {}", e.index, e.term, m.term),
            );
        }
        if !matches!(e.get_entry_type(), EntryType::EntryNormal | EntryType::EntryConfChangeV2) {
            return refuse(Rule::Append, format!("entry {} is a {:?}", e.index, e.get_entry_type()));
        }
        prev = e.term;
    }
    Ok(())
}

fn vote_request(m: &Message) -> Result<(), Refusal> {
    // A candidate campaigns (or pre-campaigns) for a term after the last of
    // its log; `commit_info` is its commit index and that entry's term.
    let consistent = m.log_term <= m.term
        && (m.index == 0) == (m.log_term == 0)
        && m.commit <= m.index
        && m.commit_term <= m.log_term
        && (m.commit == 0) == (m.commit_term == 0);
    if !consistent {
        return refuse(
            Rule::Vote,
            format!(
                "candidate for term {} with log ({}, {}) and commit ({}, {})",
                m.term, m.log_term, m.index, m.commit_term, m.commit
            ),
        );
    }
    Ok(())
}

fn vote_response(m: &Message) -> Result<(), Refusal> {
    // A rejection carries the voter's commit index and its term, which the
    // candidate may commit by (`maybe_commit_by_vote`).
    if m.commit_term > m.term || (m.commit == 0) != (m.commit_term == 0) {
        return refuse(Rule::Vote, format!("vote in term {} with commit ({}, {})", m.term, m.commit_term, m.commit));
    }
    Ok(())
}

fn floor<S: Storage>(m: &Message, raft: &Raft<S>, floor: Option<(u64, u64)>) -> Result<(), Refusal> {
    if let Some((term, index)) = floor {
        if (m.log_term, m.index) < (term, index) && floor_holds(raft, Some((term, index))) {
            return refuse(
                Rule::VoteFloor,
                format!(
                    "candidate's log ends at ({}, {}), before this replica's vote floor ({term}, {index})",
                    m.log_term, m.index
                ),
            );
        }
    }
    Ok(())
}

fn state<S: Storage>(m: &Message, raft: &Raft<S>) -> Result<(), Refusal> {
    use MessageType::*;
    let t = m.get_msg_type();
    let log = &raft.raft_log;
    match t {
        // raft acts on these from the current leader or a newer one (an
        // older one only learns the newer term from the reply).
        MsgAppend | MsgHeartbeat | MsgSnapshot if m.term >= raft.term => {
            if m.term == raft.term {
                if raft.state == StateRole::Leader {
                    return refuse(
                        Rule::OneLeader,
                        format!("{t:?} from {} in term {} that this replica leads", m.from, m.term),
                    );
                }
                if raft.leader_id != 0 && raft.leader_id != m.from {
                    return refuse(
                        Rule::OneLeader,
                        format!("{t:?} from {} in term {} led by {}", m.from, m.term, raft.leader_id),
                    );
                }
            }
            match t {
                MsgHeartbeat if m.commit > log.last_index() => refuse(
                    Rule::Commit,
                    format!("commit {} beyond this log's last index {}", m.commit, log.last_index()),
                ),
                MsgSnapshot => snapshot_vs_log(m.get_snapshot(), raft),
                MsgAppend => anchor_vs_log(m, raft),
                _ => Ok(()),
            }
        }
        // An older term's is ignored by raft; a newer term's cannot be
        // honest (the leader sends it to a follower that acknowledged its
        // whole log in its term, and terms are persisted). In its term it
        // comes from the leader this replica knows, if it knows one (a
        // restart forgets who leads, not the term).
        MsgTimeoutNow
            if m.term > raft.term
                || (m.term == raft.term
                    && (raft.state == StateRole::Leader || (raft.leader_id != 0 && raft.leader_id != m.from))) =>
        {
            refuse(
                Rule::OneLeader,
                format!(
                    "MsgTimeoutNow from {} in term {}; the leader of term {} is {}",
                    m.from, m.term, raft.term, raft.leader_id
                ),
            )
        }
        // A leader's own term: replies to what it sent in that term.
        MsgAppendResponse | MsgHeartbeatResponse if m.term == raft.term && raft.state == StateRole::Leader => {
            let last = log.last_index();
            if m.commit > last {
                return refuse(Rule::Ack, format!("{t:?} with commit {} beyond the leader's log ({last})", m.commit));
            }
            if t == MsgAppendResponse {
                if m.index > last {
                    return refuse(
                        Rule::Ack,
                        format!("acknowledges index {} beyond the leader's log ({last})", m.index),
                    );
                }
                if m.reject && m.reject_hint > m.index {
                    return refuse(Rule::Ack, format!("rejects index {} with hint {}", m.index, m.reject_hint));
                }
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Rule 11 for an append: the leader's log holds this replica's committed
/// entries (Leader Completeness), and terms never decrease along a log, so
/// an append anchored at or after this replica's commit index is anchored
/// at a term no earlier than the committed entry's (the same term at that
/// very index). (raft-rs, searching its log backwards from an anchor of an
/// earlier term for a rejection hint, runs off the compacted start of the
/// log and panics: `term(..) must be valid`.)
fn anchor_vs_log<S: Storage>(m: &Message, raft: &Raft<S>) -> Result<(), Refusal> {
    let log = &raft.raft_log;
    // Below the commit index, raft answers with its commit index and
    // looks at nothing else.
    if m.index < log.committed {
        return Ok(());
    }
    if let Ok(committed_term) = log.term(log.committed) {
        if m.log_term < committed_term || (m.index == log.committed && m.log_term != committed_term) {
            return refuse(
                Rule::Committed,
                format!(
                    "append anchored at ({}, {}) contradicts the committed entry ({committed_term}, {})",
                    m.log_term, m.index, log.committed
                ),
            );
        }
    }
    Ok(())
}

fn snapshot_vs_log<S: Storage>(snap: &Snapshot, raft: &Raft<S>) -> Result<(), Refusal> {
    let meta = snap.get_metadata();
    let log = &raft.raft_log;
    if meta.index <= log.committed {
        // An index whose term is unknown here (compacted) was committed
        // long ago and raft ignores the snapshot.
        if let Ok(term) = log.term(meta.index) {
            if term != 0 && term != meta.term {
                return refuse(
                    Rule::Committed,
                    format!(
                        "snapshot at committed index {} has term {}, the committed entry {term}",
                        meta.index, meta.term
                    ),
                );
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    //! Unit tests of the rules, two property tests and two surveys:
    //!
    //! * `guarded_raft_never_panics`: raft nodes in every role step
    //!   arbitrary messages through the guard, and handle their readies as
    //!   the protocol does (its `handle_ready`), without a panic or a
    //!   log that refuses what raft asks it to store.
    //! * `honest_traffic_passes_the_guard`: a 3-replica group exchanging
    //!   only its own messages, over a network that drops, duplicates and
    //!   reorders them, with replicas compacting their logs (so snapshots
    //!   travel) and restarting from them, elects a leader and commits, the
    //!   replicas agree, and the guard never refuses one of its messages.
    //! * `survey_unguarded_panics` and `survey_guarded` (ignored: run them
    //!   by name): the first property's cases in bulk, without the guard
    //!   to list the panics raft-rs has, with it to show none is left and
    //!   what got through.

    use super::*;
    use crate::bug::Planted;
    use crate::protocol::ReadyOut;
    use crate::store::{MemStore, RaftLog, Store};
    use proptest::prelude::*;
    use proptest::strategy::ValueTree;
    use proptest::test_runner::{RngAlgorithm, TestRng, TestRunner};
    use protobuf::ProtobufEnum;
    use raft::prelude::{ConfState, Entry, HardState};
    use raft::{RawNode, SnapshotStatus};
    use std::collections::{BTreeMap, VecDeque};
    use std::panic::{catch_unwind, AssertUnwindSafe};
    use std::sync::{Arc, Mutex};

    const MEMBERS: [u64; 3] = [1, 2, 3];

    type Log = MemStore;
    type Node = RawNode<RaftLog<MemStore>>;

    /// The protocol's ready handling, without a planted bug.
    fn handle(node: &mut Node, log: &Log, out: &mut Collect) -> Result<(), String> {
        crate::protocol::handle_ready(node, log, out, Planted::default())
    }

    fn logger() -> slog::Logger {
        slog::Logger::root(slog::Discard, slog::o!())
    }

    /// The raft configuration of `Replica::start`, but for the size of the
    /// inflight window, which the tests shrink to reach a full window.
    fn raft_config(id: u64, max_inflight_msgs: usize) -> raft::Config {
        raft::Config {
            id,
            election_tick: 10,
            heartbeat_tick: 3,
            max_size_per_msg: 1 << 20,
            max_inflight_msgs,
            check_quorum: true,
            pre_vote: true,
            ..raft::Config::default()
        }
    }

    fn members_conf() -> ConfState {
        ConfState::from((MEMBERS.to_vec(), vec![]))
    }

    /// Collects a ready's output the way the protocol thread sends it.
    #[derive(Default)]
    struct Collect {
        sent: Vec<Message>,
        delivered: Vec<Entry>,
        restored: Vec<Snapshot>,
    }

    impl ReadyOut<MemStore> for Collect {
        fn send(&mut self, node: &mut Node, msgs: Vec<Message>) {
            for m in msgs {
                // As the protocol thread does for a snapshot it could queue.
                if m.get_msg_type() == MessageType::MsgSnapshot {
                    node.report_snapshot(m.to, SnapshotStatus::Finish);
                }
                self.sent.push(m);
            }
        }

        fn deliver(&mut self, entries: Vec<Entry>) -> Result<(), String> {
            self.delivered.extend(entries);
            Ok(())
        }

        fn restore(&mut self, snapshot: Snapshot) -> Result<(), String> {
            self.restored.push(snapshot);
            Ok(())
        }

        fn read_states(&mut self, _states: Vec<raft::ReadState>) {}
    }

    fn entry(index: u64, term: u64) -> Entry {
        Entry { index, term, data: vec![index as u8].into(), ..Default::default() }
    }

    /// The file of a test snapshot at `index` and `term`: no state, only
    /// its frame, the same bytes wherever it is made.
    fn file(index: u64, term: u64) -> (crate::snapfile::SnapshotId, Arc<Vec<u8>>) {
        let w = crate::snapfile::FileWriter::new(Vec::new(), index, term).expect("a file in memory");
        let (bytes, id) = w.finish().expect("a file in memory");
        (id, Arc::new(bytes))
    }

    fn snapshot_with(index: u64, term: u64, conf: ConfState) -> Snapshot {
        crate::state::raft_snapshot(file(index, term).0, Vec::new(), conf)
    }

    fn snapshot(index: u64, term: u64) -> Snapshot {
        snapshot_with(index, term, members_conf())
    }

    /// Keeps `snap` in `log`, as a snapshot taken there.
    fn keep(log: &Log, snap: &Snapshot) {
        let meta = snap.get_metadata();
        log.files().lock().kept = Some((snap.clone(), file(meta.index, meta.term).1));
    }

    /// What a transfer does before raft sees a snapshot message: its file
    /// is received whole.
    fn receive(log: &Log, m: &Message) {
        if m.get_msg_type() == MessageType::MsgSnapshot {
            let meta = m.get_snapshot().get_metadata();
            log.files().lock().receiving = Some(file(meta.index, meta.term));
        }
    }

    // ----- fixtures: a raft node in a given state -----

    #[derive(Clone, Copy, Debug)]
    enum Role {
        Follower { knows_leader: bool },
        PreCandidate,
        Candidate,
        Leader,
    }

    #[derive(Clone, Copy, Debug)]
    enum Compaction {
        None,
        /// A snapshot taken here, the log compacted behind it (at a
        /// fraction of the commit index).
        Own(u8),
        /// A snapshot received from a leader (at a fraction of the log),
        /// the rest of the log after it.
        Received(u8),
    }

    #[derive(Clone, Copy, Debug)]
    enum PeerProgress {
        Probe { paused: bool },
        Replicate,
        Snapshot,
    }

    #[derive(Clone, Debug)]
    struct Fixture {
        role: Role,
        /// Term increments from one entry to the next (0 or 1).
        steps: Vec<u64>,
        commit_frac: u8,
        compaction: Compaction,
        extra_term: u64,
        max_inflight: usize,
        /// A leader's view of replicas 2 and 3: progress state, how much of
        /// the log they match (fraction), recently active.
        peers: [(PeerProgress, u8, bool); 2],
    }

    fn frac(n: u64, f: u8) -> u64 {
        n * f as u64 / 255
    }

    /// Builds a node and its log; panics (failing the test) only on a bug
    /// of the fixture itself.
    fn build(f: &Fixture) -> (Node, Log) {
        let store = MemStore::new(MEMBERS.to_vec());
        let mut term = 1;
        let mut entries = Vec::new();
        for (i, step) in f.steps.iter().enumerate() {
            term += step;
            entries.push(entry(i as u64 + 1, term));
        }
        let last = entries.len() as u64;
        let last_term = entries.last().map_or(0, |e| e.term);
        let commit = frac(last, f.commit_frac);
        let term_of = |i: u64| if i == 0 { 0 } else { entries[i as usize - 1].term };
        match f.compaction {
            Compaction::Received(x) if last > 0 => {
                let at = frac(last, x).max(1);
                let snap = snapshot(at, term_of(at));
                store.mem.wl().apply_snapshot(snap.clone()).expect("a fresh log takes a snapshot");
                keep(&store, &snap);
                store.install(snap, 0).expect("keeps it");
                store.mem.wl().append(&entries[at as usize..]).expect("entries after the snapshot");
                store.mem.wl().set_hardstate(HardState {
                    term: last_term + f.extra_term,
                    vote: 0,
                    commit: commit.max(at),
                    ..Default::default()
                });
            }
            _ => {
                store.mem.wl().append(&entries).expect("a fresh log");
                store.mem.wl().set_hardstate(HardState {
                    term: last_term + f.extra_term,
                    vote: 0,
                    commit,
                    ..Default::default()
                });
                if let Compaction::Own(x) = f.compaction {
                    let at = frac(commit, x);
                    if at > 0 {
                        let snap = snapshot(at, term_of(at));
                        keep(&store, &snap);
                        store.install(snap, at).expect("compacts");
                    }
                }
            }
        }
        let log = store;
        let mut node =
            RawNode::new(&raft_config(1, f.max_inflight), RaftLog(log.clone()), &logger()).expect("a raft node");
        let mut out = Collect::default();
        handle(&mut node, &log, &mut out).expect("first ready");
        match f.role {
            Role::Follower { knows_leader } => {
                let term = node.raft.term.max(1);
                node.raft.become_follower(term, if knows_leader { 2 } else { 0 });
            }
            Role::PreCandidate => node.raft.become_pre_candidate(),
            Role::Candidate => node.raft.become_candidate(),
            Role::Leader => {
                node.raft.become_candidate();
                handle(&mut node, &log, &mut out).expect("candidate's ready");
                node.raft.become_leader();
                handle(&mut node, &log, &mut out).expect("leader's ready");
                let last = node.raft.raft_log.last_index();
                for (id, (progress, matched, active)) in [2, 3].into_iter().zip(f.peers) {
                    let pr = node.raft.mut_prs().get_mut(id).expect("a member");
                    pr.matched = frac(last, matched);
                    pr.recent_active = active;
                    match progress {
                        PeerProgress::Probe { paused } => {
                            pr.become_probe();
                            if paused {
                                pr.pause();
                            }
                        }
                        PeerProgress::Replicate => pr.become_replicate(),
                        PeerProgress::Snapshot => pr.become_snapshot(last.saturating_sub(1)),
                    }
                }
            }
        }
        handle(&mut node, &log, &mut out).expect("settled");
        (node, log)
    }

    fn fixture() -> impl Strategy<Value = Fixture> {
        let role = prop_oneof![
            any::<bool>().prop_map(|knows_leader| Role::Follower { knows_leader }),
            Just(Role::PreCandidate),
            Just(Role::Candidate),
            Just(Role::Leader),
        ];
        let compaction = prop_oneof![
            Just(Compaction::None),
            any::<u8>().prop_map(Compaction::Own),
            any::<u8>().prop_map(Compaction::Received),
        ];
        let progress = prop_oneof![
            any::<bool>().prop_map(|paused| PeerProgress::Probe { paused }),
            Just(PeerProgress::Replicate),
            Just(PeerProgress::Snapshot),
        ];
        let peer = (progress, any::<u8>(), any::<bool>());
        (
            role,
            prop::collection::vec(prop_oneof![3 => Just(0u64), 1 => Just(1u64)], 0..12),
            any::<u8>(),
            compaction,
            0..3u64,
            prop_oneof![Just(1usize), Just(3), Just(256)],
            [peer.clone(), peer],
        )
            .prop_map(|(role, steps, commit_frac, compaction, extra_term, max_inflight, peers)| Fixture {
                role,
                steps,
                commit_frac,
                compaction,
                extra_term,
                max_inflight,
                peers,
            })
    }

    // ----- arbitrary messages, with numbers near the node's own -----

    /// A term: relative to the node's term or to its last log term, or any.
    #[derive(Clone, Copy, Debug)]
    enum TermV {
        Current(i8),
        LastLog(i8),
        Abs(u64),
    }

    /// An index: relative to the node's last, commit or first index, or any.
    #[derive(Clone, Copy, Debug)]
    enum IndexV {
        Last(i8),
        Commit(i8),
        First(i8),
        Abs(u64),
    }

    fn big() -> impl Strategy<Value = u64> {
        prop_oneof![0..20u64, any::<u64>(), (0..4u64).prop_map(|d| u64::MAX - d), Just(1_000_000_000)]
    }

    fn term_v() -> impl Strategy<Value = TermV> {
        prop_oneof![
            8 => (-2..=2i8).prop_map(TermV::Current),
            4 => (-2..=1i8).prop_map(TermV::LastLog),
            1 => big().prop_map(TermV::Abs),
        ]
    }

    fn index_v() -> impl Strategy<Value = IndexV> {
        prop_oneof![
            6 => (-3..=3i8).prop_map(IndexV::Last),
            6 => (-3..=3i8).prop_map(IndexV::Commit),
            2 => (-2..=2i8).prop_map(IndexV::First),
            1 => big().prop_map(IndexV::Abs),
        ]
    }

    #[derive(Clone, Debug)]
    struct EntrySpec {
        /// At `index + 1 + i` (else at `index`).
        contiguous: bool,
        index: IndexV,
        /// One term later than the entry before (else the same), within the
        /// message's terms (else at `term`).
        well_formed: Option<bool>,
        term: TermV,
        kind: i32,
        data: Vec<u8>,
    }

    #[derive(Clone, Debug)]
    struct SnapSpec {
        index: IndexV,
        term: TermV,
        voters: Option<Vec<u64>>,
        learners: Vec<u64>,
        outgoing: Vec<u64>,
        auto_leave: bool,
    }

    /// A message. Each field is mostly what an honest replica would send
    /// and sometimes not, so that messages reach every corner of raft
    /// rather than all stopping at the first rule.
    #[derive(Clone, Debug)]
    struct MsgSpec {
        kind: i32,
        from: u64,
        to: u64,
        spoofed: Option<u64>,
        term: TermV,
        log_term: TermV,
        index: IndexV,
        commit: IndexV,
        commit_term: TermV,
        reject: bool,
        reject_hint: IndexV,
        request_snapshot: Option<IndexV>,
        context: Vec<u8>,
        priority: i64,
        /// Entries and snapshot on messages of other types.
        stray: bool,
        entries: Vec<EntrySpec>,
        snapshot: SnapSpec,
    }

    fn entry_spec() -> impl Strategy<Value = EntrySpec> {
        (
            prop::bool::weighted(0.9),
            index_v(),
            prop::option::weighted(0.8, any::<bool>()),
            term_v(),
            prop_oneof![12 => Just(0), 1 => 1..3i32],
            prop::collection::vec(any::<u8>(), 0..6),
        )
            .prop_map(|(contiguous, index, well_formed, term, kind, data)| EntrySpec {
                contiguous,
                index,
                well_formed,
                term,
                kind,
                data,
            })
    }

    fn ids() -> impl Strategy<Value = Vec<u64>> {
        prop::collection::vec(0..5u64, 0..4)
    }

    fn snap_spec() -> impl Strategy<Value = SnapSpec> {
        (
            index_v(),
            term_v(),
            prop_oneof![6 => Just(None), 1 => ids().prop_map(Some)],
            prop_oneof![10 => Just(vec![]), 1 => ids()],
            prop_oneof![10 => Just(vec![]), 1 => ids()],
            prop::bool::weighted(0.05),
        )
            .prop_map(|(index, term, voters, learners, outgoing, auto_leave)| SnapSpec {
                index,
                term,
                voters,
                learners,
                outgoing,
                auto_leave,
            })
    }

    fn msg_spec() -> impl Strategy<Value = MsgSpec> {
        use MessageType::*;
        let sent = [
            MsgAppend,
            MsgAppendResponse,
            MsgRequestVote,
            MsgRequestVoteResponse,
            MsgSnapshot,
            MsgHeartbeat,
            MsgHeartbeatResponse,
            MsgRequestPreVote,
            MsgRequestPreVoteResponse,
        ]
        .map(|t| t as i32);
        let kind = prop_oneof![6 => prop::sample::select(sent.to_vec()), 1 => 0..19i32];
        let peer = prop_oneof![20 => 2..4u64, 1 => Just(1u64), 1 => Just(0u64), 1 => 4..6u64];
        let to = prop_oneof![20 => Just(1u64), 1 => 0..6u64];
        let context = prop_oneof![
            30 => Just(vec![]),
            1 => Just(b"CampaignTransfer".to_vec()),
            1 => prop::collection::vec(any::<u8>(), 1..4),
            1 => prop::collection::vec(any::<u8>(), READ_CONTEXT_MAX..=READ_CONTEXT_MAX)
        ];
        (
            (kind, peer, to, prop::option::weighted(0.03, 0..6u64), term_v(), term_v(), index_v(), index_v()),
            (term_v(), any::<bool>(), index_v(), prop::option::weighted(0.03, index_v()), context),
            (
                prop_oneof![30 => Just(0i64), 1 => -2..3i64],
                prop::bool::weighted(0.05),
                prop::collection::vec(entry_spec(), 0..5),
                snap_spec(),
            ),
        )
            .prop_map(
                |(
                    (kind, from, to, spoofed, term, log_term, index, commit),
                    (commit_term, reject, reject_hint, request_snapshot, context),
                    (priority, stray, entries, snapshot),
                )| MsgSpec {
                    kind,
                    from,
                    to,
                    spoofed,
                    term,
                    log_term,
                    index,
                    commit,
                    commit_term,
                    reject,
                    reject_hint,
                    request_snapshot,
                    context,
                    priority,
                    stray,
                    entries,
                    snapshot,
                },
            )
    }

    #[derive(Clone, Debug)]
    enum Op {
        Step(Box<MsgSpec>),
        Tick(u8),
        /// Proposes an entry, as the protocol thread does: as leader only.
        Propose,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            8 => msg_spec().prop_map(|m| Op::Step(Box::new(m))),
            1 => (1..12u8).prop_map(Op::Tick),
            1 => Just(Op::Propose),
        ]
    }

    fn add(base: u64, d: i8) -> u64 {
        base.saturating_add_signed(d as i64)
    }

    fn term_of(v: TermV, node: &Node) -> u64 {
        match v {
            TermV::Current(d) => add(node.raft.term, d),
            TermV::LastLog(d) => add(node.raft.raft_log.last_term(), d),
            TermV::Abs(n) => n,
        }
    }

    fn index_of(v: IndexV, node: &Node) -> u64 {
        let log = &node.raft.raft_log;
        match v {
            IndexV::Last(d) => add(log.last_index(), d),
            IndexV::Commit(d) => add(log.committed, d),
            IndexV::First(d) => add(log.first_index(), d),
            IndexV::Abs(n) => n,
        }
    }

    /// The message `spec` describes, against `node`'s state; and the peer
    /// it comes from.
    fn message(spec: &MsgSpec, node: &Node) -> (Message, u64) {
        let mut m = Message {
            to: spec.to,
            from: spec.from,
            term: term_of(spec.term, node),
            log_term: term_of(spec.log_term, node),
            index: index_of(spec.index, node),
            commit: index_of(spec.commit, node),
            commit_term: term_of(spec.commit_term, node),
            reject: spec.reject,
            reject_hint: index_of(spec.reject_hint, node),
            request_snapshot: spec.request_snapshot.map_or(0, |v| index_of(v, node)),
            context: spec.context.clone().into(),
            priority: spec.priority,
            ..Default::default()
        };
        m.set_msg_type(MessageType::from_i32(spec.kind).unwrap_or(MessageType::MsgHup));
        let mut entries = Vec::new();
        let mut prev = m.log_term;
        if m.get_msg_type() == MessageType::MsgAppend || spec.stray {
            for (i, e) in spec.entries.iter().enumerate() {
                let term = match e.well_formed {
                    Some(step) => prev.max(1).saturating_add(step as u64).min(m.term),
                    None => term_of(e.term, node),
                };
                prev = term;
                let mut x = Entry {
                    index: if e.contiguous { m.index.saturating_add(i as u64 + 1) } else { index_of(e.index, node) },
                    term,
                    data: e.data.clone().into(),
                    ..Default::default()
                };
                x.set_entry_type(EntryType::from_i32(e.kind).unwrap_or(EntryType::EntryNormal));
                entries.push(x);
            }
        }
        m.set_entries(entries.into());
        if m.get_msg_type() == MessageType::MsgSnapshot || spec.stray {
            let s = &spec.snapshot;
            let mut snap = snapshot(index_of(s.index, node), term_of(s.term, node));
            let cs = snap.mut_metadata().mut_conf_state();
            cs.set_voters(s.voters.clone().unwrap_or_else(|| MEMBERS.to_vec()));
            cs.set_learners(s.learners.clone());
            cs.set_voters_outgoing(s.outgoing.clone());
            cs.auto_leave = s.auto_leave;
            m.set_snapshot(snap);
        }
        (m, spec.spoofed.unwrap_or(spec.from))
    }

    /// What cases did: messages stepped by (type, role of the node), and
    /// refused by rule.
    #[derive(Default, Debug)]
    struct Tally {
        stepped: BTreeMap<String, u64>,
        refused: BTreeMap<&'static str, u64>,
    }

    /// Runs `ops` against a node built from `f`, with or without the guard.
    /// `Err`: raft panicked (the message says where) or a ready could not
    /// be handled.
    fn run_case(f: &Fixture, ops: &[Op], guarded: bool, tally: &mut Tally) -> Result<(), String> {
        let (mut node, log) = build(f);
        let guard = Guard::new(1).with_removed([4]);
        let mut out = Collect::default();
        let mut trace = Vec::new();
        let result = catch_unwind(AssertUnwindSafe(|| -> Result<(), String> {
            for op in ops {
                match op {
                    Op::Step(spec) => {
                        let (m, sender) = message(spec, &node);
                        trace.push(format!("{m:?}"));
                        if guarded {
                            if let Err(refusal) = guard.check(&m, sender, &node.raft, None) {
                                *tally.refused.entry(refusal.rule.name()).or_default() += 1;
                                continue;
                            }
                        }
                        // As `peer` does: a message from another peer than
                        // the link's never reaches the protocol thread.
                        if m.from != sender {
                            continue;
                        }
                        let key = format!("{:?} to a {:?}", m.get_msg_type(), node.raft.state);
                        *tally.stepped.entry(key).or_default() += 1;
                        receive(&log, &m);
                        let _ = node.step(m);
                    }
                    Op::Tick(n) => {
                        trace.push(format!("tick x{n}"));
                        for _ in 0..*n {
                            node.tick();
                        }
                    }
                    Op::Propose => {
                        trace.push("propose".into());
                        if node.raft.state == StateRole::Leader {
                            let _ = node.propose(vec![], vec![1, 2, 3]);
                        }
                    }
                }
                handle(&mut node, &log, &mut out)?;
            }
            Ok(())
        }));
        match result {
            Ok(Ok(())) => Ok(()),
            Ok(Err(why)) => Err(format!("a ready could not be handled: {why}\nafter {trace:#?}")),
            Err(payload) => {
                let why = psmr_sched::panic_message(payload.as_ref());
                Err(format!("raft panicked: {why}\nafter {trace:#?}"))
            }
        }
    }

    proptest! {
        // The default number of cases (PROPTEST_CASES, 256 unless set)
        // keeps the suite fast; run many more locally with PROPTEST_CASES.
        #[test]
        fn guarded_raft_never_panics(f in fixture(), ops in prop::collection::vec(op(), 1..6)) {
            let mut tally = Tally::default();
            let outcome = run_case(&f, &ops, true, &mut tally);
            prop_assert!(outcome.is_ok(), "{}\nfixture {:?}", outcome.unwrap_err(), f);
        }
    }

    // ----- unit tests of the rules -----

    /// A follower of replica 2 in term 2, with log terms 1 1 2 2 and
    /// entries up to 2 committed.
    fn follower() -> (Node, Log) {
        let (node, log) = build(&follower_fixture());
        assert_eq!((node.raft.term, node.raft.leader_id, node.raft.raft_log.committed), (2, 2, 2));
        assert_eq!((node.raft.raft_log.last_term(), node.raft.raft_log.last_index()), (2, 4));
        (node, log)
    }

    fn follower_fixture() -> Fixture {
        Fixture {
            role: Role::Follower { knows_leader: true },
            steps: vec![0, 0, 1, 0],
            commit_frac: 128,
            compaction: Compaction::None,
            extra_term: 0,
            max_inflight: 256,
            peers: [(PeerProgress::Replicate, 255, true); 2],
        }
    }

    /// The leader of term 3 over log terms 1 1 2 2 3 (its own empty entry
    /// last), replica 2 matching everything and replica 3 nothing.
    fn leader() -> (Node, Log) {
        let f = Fixture {
            role: Role::Leader,
            steps: vec![0, 0, 1, 0],
            commit_frac: 128,
            compaction: Compaction::None,
            extra_term: 0,
            max_inflight: 256,
            peers: [(PeerProgress::Replicate, 255, true), (PeerProgress::Probe { paused: false }, 0, true)],
        };
        let (node, log) = build(&f);
        assert_eq!((node.raft.state, node.raft.term, node.raft.raft_log.last_index()), (StateRole::Leader, 3, 5));
        (node, log)
    }

    fn msg(t: MessageType, from: u64, term: u64) -> Message {
        let mut m = Message { to: 1, from, term, ..Default::default() };
        m.set_msg_type(t);
        m
    }

    fn heartbeat(commit: u64) -> Message {
        Message { commit, ..msg(MessageType::MsgHeartbeat, 2, 2) }
    }

    fn append(index: u64, log_term: u64, terms: &[u64]) -> Message {
        let mut m = Message { index, log_term, commit: 2, ..msg(MessageType::MsgAppend, 2, 2) };
        let entries: Vec<Entry> = terms.iter().zip(index + 1..).map(|(&t, i)| entry(i, t)).collect();
        m.set_entries(entries.into());
        m
    }

    fn snapshot_msg(index: u64, term: u64) -> Message {
        let mut m = msg(MessageType::MsgSnapshot, 2, 2);
        m.set_snapshot(snapshot(index, term));
        m
    }

    fn vote(t: MessageType, log_term: u64, index: u64) -> Message {
        // Replica 3 campaigns (or pre-campaigns) for term 3.
        Message { log_term, index, commit: 1, commit_term: 1, ..msg(t, 3, 3) }
    }

    /// The rule `m` breaks for `node`, if any.
    fn verdict(node: &Node, m: &Message) -> Option<Rule> {
        Guard::new(1).with_removed([4]).check(m, m.from, &node.raft, None).err().map(|r| r.rule)
    }

    /// Steps `m` without the guard: the panic message, if raft panics.
    fn unguarded(node: &mut Node, log: &Log, m: Message) -> Option<String> {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let result = catch_unwind(AssertUnwindSafe(|| {
            let _ = node.step(m);
            let _ = handle(node, log, &mut Collect::default());
        }));
        std::panic::set_hook(previous);
        result.err().map(|p| p.downcast_ref::<String>().cloned().unwrap_or_default())
    }

    #[test]
    fn the_forged_heartbeat_that_killed_a_follower_is_refused() {
        // The case found in the field: commit 10^9 sent to a follower.
        let (mut node, log) = follower();
        let forged = heartbeat(1_000_000_000);
        assert_eq!(verdict(&node, &forged), Some(Rule::Commit));
        let why = unguarded(&mut node, &log, forged).expect("raft-rs panics on it");
        assert!(why.contains("out of range"), "{why}");
        // Within the log, the same heartbeat is fine.
        let (node, _log) = follower();
        assert_eq!(verdict(&node, &heartbeat(4)), None);
    }

    #[test]
    fn honest_shapes_pass() {
        let (node, _log) = follower();
        for m in [
            heartbeat(2),
            // A read round's heartbeat (`crate::reads`).
            Message { context: 7u64.to_le_bytes().to_vec().into(), ..heartbeat(2) },
            append(4, 2, &[2, 2]),
            append(4, 2, &[]),
            append(2, 1, &[2, 2, 2]),
            // Below the commit index: raft answers with its commit index.
            append(0, 0, &[1]),
            snapshot_msg(6, 2),
            vote(MessageType::MsgRequestVote, 2, 4),
            vote(MessageType::MsgRequestPreVote, 2, 3),
            Message { reject: true, commit: 3, commit_term: 2, ..msg(MessageType::MsgRequestVoteResponse, 3, 3) },
            msg(MessageType::MsgRequestPreVoteResponse, 3, 3),
            // Stale: raft only answers these.
            Message { commit: 3, ..msg(MessageType::MsgAppendResponse, 3, 1) },
            heartbeat(0),
        ] {
            assert_eq!(verdict(&node, &m), None, "{m:?}");
        }
        let (node, _log) = leader();
        for m in [
            Message { index: 5, commit: 2, ..msg(MessageType::MsgAppendResponse, 2, 3) },
            Message {
                index: 5,
                reject: true,
                reject_hint: 4,
                log_term: 2,
                ..msg(MessageType::MsgAppendResponse, 3, 3)
            },
            Message { commit: 5, ..msg(MessageType::MsgHeartbeatResponse, 2, 3) },
        ] {
            assert_eq!(verdict(&node, &m), None, "{m:?}");
        }
    }

    #[test]
    fn each_rule_refuses_what_breaks_it() {
        use MessageType::*;
        let (node, _log) = follower();
        let cases: Vec<(Message, Rule)> = vec![
            (Message { from: 3, ..heartbeat(2) }, Rule::OneLeader),
            (Message { from: 1, ..heartbeat(2) }, Rule::Sender),
            (Message { from: 4, ..heartbeat(2) }, Rule::Sender),
            (Message { to: 2, ..heartbeat(2) }, Rule::Recipient),
            (msg(MsgHup, 2, 2), Rule::LocalOnly),
            (msg(MsgBeat, 2, 2), Rule::LocalOnly),
            (msg(MsgUnreachable, 2, 2), Rule::LocalOnly),
            (msg(MsgSnapStatus, 2, 2), Rule::LocalOnly),
            (msg(MsgCheckQuorum, 2, 2), Rule::LocalOnly),
            (msg(MsgPropose, 2, 2), Rule::Unused),
            (msg(MsgReadIndex, 2, 2), Rule::Unused),
            (msg(MsgReadIndexResp, 2, 2), Rule::Unused),
            (msg(MsgTransferLeader, 2, 2), Rule::Unused),
            // From the leader of this term (2, 2) it passes: see below.
            (msg(MsgTimeoutNow, 3, 2), Rule::OneLeader),
            (msg(MsgTimeoutNow, 2, 3), Rule::OneLeader),
            (Message { term: 0, ..heartbeat(2) }, Rule::Fields),
            (Message { context: b"CampaignTransfer".to_vec().into(), ..vote(MsgRequestPreVote, 2, 4) }, Rule::Fields),
            (Message { context: vec![1; READ_CONTEXT_MAX + 1].into(), ..heartbeat(2) }, Rule::Fields),
            (Message { context: vec![1; READ_CONTEXT_MAX].into(), ..append(4, 2, &[2]) }, Rule::Fields),
            (Message { request_snapshot: 3, ..heartbeat(2) }, Rule::Fields),
            (Message { priority: 5, ..vote(MsgRequestVote, 2, 4) }, Rule::Fields),
            (Message { entries: vec![entry(5, 2)].into(), ..heartbeat(2) }, Rule::Fields),
            (Message { snapshot: Some(snapshot(6, 2)).into(), ..heartbeat(2) }, Rule::Fields),
            (Message { term: NUMBER_MAX, ..heartbeat(2) }, Rule::Fields),
            (msg(MsgSnapshot, 2, 2), Rule::Fields),
            (append(4, 2, &[2, 3]), Rule::Append),
            (append(4, 2, &[1]), Rule::Append),
            (append(4, 0, &[2]), Rule::Append),
            (append(0, 1, &[2]), Rule::Append),
            (append(4, 3, &[]), Rule::Append),
            (Message { entries: vec![entry(5, 2), entry(7, 2)].into(), ..append(4, 2, &[]) }, Rule::Append),
            (Message { entries: vec![entry(2, 2)].into(), ..append(4, 2, &[]) }, Rule::Append),
            (
                {
                    let mut m = append(4, 2, &[2]);
                    m.entries[0].set_entry_type(EntryType::EntryConfChange);
                    m
                },
                Rule::Append,
            ),
            (snapshot_msg(0, 0), Rule::Snapshot),
            (snapshot_msg(6, 3), Rule::Snapshot),
            (
                {
                    let mut m = snapshot_msg(6, 2);
                    m.mut_snapshot().mut_metadata().mut_conf_state().mut_learners().push(3);
                    m
                },
                Rule::Snapshot,
            ),
            (
                {
                    let mut m = snapshot_msg(6, 2);
                    // A membership without this replica (1).
                    m.mut_snapshot().mut_metadata().mut_conf_state().set_voters(vec![2, 3]);
                    m
                },
                Rule::Snapshot,
            ),
            (
                {
                    let mut m = snapshot_msg(6, 2);
                    m.mut_snapshot().mut_metadata().mut_conf_state().set_voters_outgoing(vec![1, 2, 3]);
                    m
                },
                Rule::Snapshot,
            ),
            (
                {
                    let mut m = snapshot_msg(6, 2);
                    let cs = m.mut_snapshot().mut_metadata().mut_conf_state();
                    cs.set_learners(cs.get_voters().to_vec());
                    cs.set_voters(vec![]);
                    m
                },
                Rule::Snapshot,
            ),
            (vote(MsgRequestVote, 4, 5), Rule::Vote),
            (vote(MsgRequestVote, 0, 5), Rule::Vote),
            (Message { commit: 6, ..vote(MsgRequestVote, 2, 5) }, Rule::Vote),
            (Message { commit: 0, ..vote(MsgRequestVote, 2, 5) }, Rule::Vote),
            (Message { commit: 2, commit_term: 4, ..msg(MsgRequestVoteResponse, 3, 3) }, Rule::Vote),
            (heartbeat(5), Rule::Commit),
            (snapshot_msg(2, 2), Rule::Committed),
            (append(2, 2, &[2]), Rule::Committed),
        ];
        for (m, rule) in cases {
            assert_eq!(verdict(&node, &m), Some(rule), "{m:?}");
        }
        assert_eq!(verdict(&node, &msg(MsgTimeoutNow, 2, 2)), None, "the leader's own transfer passes");
        // With everything committed, up to (2, 4): an append anchored later
        // must be anchored at term 2 or later.
        let (node, _log) = build(&Fixture { commit_frac: 255, ..follower_fixture() });
        assert_eq!(verdict(&node, &append(5, 1, &[2])), Some(Rule::Committed));
        assert_eq!(verdict(&node, &append(5, 2, &[2])), None);
        let (node, _log) = leader();
        let cases: Vec<(Message, Rule)> = vec![
            (Message { commit: 5, ..msg(MsgHeartbeat, 2, 3) }, Rule::OneLeader),
            (Message { index: 6, ..msg(MsgAppendResponse, 2, 3) }, Rule::Ack),
            (Message { index: 4, commit: 6, ..msg(MsgAppendResponse, 2, 3) }, Rule::Ack),
            (
                Message { index: 4, reject: true, reject_hint: 5, log_term: 2, ..msg(MsgAppendResponse, 2, 3) },
                Rule::Ack,
            ),
            (Message { commit: 6, ..msg(MsgHeartbeatResponse, 2, 3) }, Rule::Ack),
        ];
        for (m, rule) in cases {
            assert_eq!(verdict(&node, &m), Some(rule), "{m:?}");
        }
        // A newer term's leader is believed: raft steps down first.
        assert_eq!(verdict(&node, &Message { commit: 5, ..msg(MsgHeartbeat, 2, 4) }), None);
    }

    #[test]
    fn the_vote_floor_holds_until_the_log_reaches_it() {
        use MessageType::*;
        let (mut node, log) = follower();
        let guard = Guard::new(1).with_removed([4]);
        let check = |node: &Node, m: &Message, floor| guard.check(m, m.from, &node.raft, floor).err().map(|r| r.rule);
        // The log ends at (2, 4).
        assert!(!floor_holds(&node.raft, None));
        assert!(!floor_holds(&node.raft, Some((2, 4))));
        assert!(!floor_holds(&node.raft, Some((1, 9))));
        assert!(floor_holds(&node.raft, Some((2, 5))));
        assert!(floor_holds(&node.raft, Some((3, 1))));
        let floor = Some((2, 6));
        for t in [MsgRequestVote, MsgRequestPreVote] {
            // Behind the floor, though as long as this replica's log.
            assert_eq!(check(&node, &vote(t, 2, 5), floor), Some(Rule::VoteFloor));
            assert_eq!(check(&node, &vote(t, 2, 4), floor), Some(Rule::VoteFloor));
            assert_eq!(check(&node, &vote(t, 1, 9), floor), Some(Rule::VoteFloor));
            // At or past it.
            assert_eq!(check(&node, &vote(t, 2, 6), floor), None);
            assert_eq!(check(&node, &vote(t, 3, 1), floor), None);
            // No floor: Raft's own check decides.
            assert_eq!(check(&node, &vote(t, 2, 4), None), None);
        }
        // Everything else still gets through: the replica catches up.
        assert_eq!(check(&node, &heartbeat(2), floor), None);
        let catch_up = append(4, 2, &[2, 2]);
        assert_eq!(check(&node, &catch_up, floor), None);
        node.step(catch_up).expect("steps");
        handle(&mut node, &log, &mut Collect::default()).expect("a ready");
        // The log reached (2, 6): the floor is lifted.
        assert!(!floor_holds(&node.raft, floor));
        assert_eq!(check(&node, &vote(MsgRequestVote, 2, 6), floor), None);
        assert_eq!(check(&node, &Message { term: 4, ..vote(MsgRequestVote, 2, 5) }, floor), None);
    }

    #[test]
    fn refusals_say_what_is_wrong() {
        let (node, _log) = follower();
        let refusal = Guard::new(1).with_removed([4]).check(&heartbeat(9), 2, &node.raft, None).expect_err("refused");
        assert_eq!(refusal.to_string(), "commit rule: commit 9 beyond this log's last index 4");
        // A message is from the peer of the link it came on.
        let refusal = Guard::new(1).with_removed([4]).check(&heartbeat(2), 3, &node.raft, None).expect_err("refused");
        assert_eq!(refusal.rule, Rule::Sender);
    }

    // ----- honest traffic -----

    /// One replica of an in-memory group.
    struct Member {
        node: Node,
        log: Log,
        /// Entries delivered to the service manager: index -> (term, data).
        delivered: BTreeMap<u64, (u64, Vec<u8>)>,
        /// Last index delivered or restored from a snapshot, and its term.
        applied: (u64, u64),
    }

    /// Three replicas and the messages in flight between them.
    struct Group {
        members: Vec<Member>,
        net: VecDeque<Message>,
        guard: Vec<Guard>,
        refused: Vec<String>,
        proposals: u64,
        /// Messages delivered, by type (to see what the cases exercise).
        seen: BTreeMap<String, u64>,
    }

    impl Group {
        fn new() -> Self {
            let members = MEMBERS
                .iter()
                .map(|&id| {
                    let log = MemStore::new(MEMBERS.to_vec());
                    let node =
                        RawNode::new(&raft_config(id, 256), RaftLog(log.clone()), &logger()).expect("a raft node");
                    Member { node, log, delivered: BTreeMap::new(), applied: (0, 0) }
                })
                .collect();
            let guard = MEMBERS.iter().map(|&id| Guard::new(id)).collect();
            Group { members, net: VecDeque::new(), guard, refused: Vec::new(), proposals: 0, seen: BTreeMap::new() }
        }

        fn ready(&mut self, i: usize) {
            let m = &mut self.members[i];
            let mut out = Collect::default();
            handle(&mut m.node, &m.log, &mut out).expect("an honest ready is handled");
            for s in out.restored {
                m.applied = (s.get_metadata().index, s.get_metadata().term);
            }
            for e in out.delivered {
                m.applied = (e.index, e.term);
                m.delivered.insert(e.index, (e.term, e.data.to_vec()));
            }
            self.net.extend(out.sent);
        }

        fn deliver(&mut self, m: Message) {
            let i = (m.to - 1) as usize;
            *self.seen.entry(format!("{:?}", m.get_msg_type())).or_default() += 1;
            let member = &mut self.members[i];
            match self.guard[i].check(&m, m.from, &member.node.raft, None) {
                Err(why) => self.refused.push(format!("{why}: {m:?}")),
                Ok(()) => {
                    receive(&member.log, &m);
                    let _ = member.node.step(m);
                }
            }
            self.ready(i);
        }

        fn tick(&mut self, i: usize) {
            self.members[i].node.tick();
            self.ready(i);
        }

        /// Proposes as the protocol thread does: as leader only.
        fn propose(&mut self, i: usize) -> bool {
            if self.members[i].node.raft.state != StateRole::Leader {
                return false;
            }
            self.proposals += 1;
            let data = format!("proposal {}", self.proposals).into_bytes();
            let ok = self.members[i].node.propose(vec![], data).is_ok();
            self.ready(i);
            ok
        }

        /// Takes a snapshot at what replica `i` applied and compacts its log
        /// right behind it, as the service manager and the protocol thread
        /// do (without the slack, so that snapshots travel).
        fn compact(&mut self, i: usize) {
            let m = &mut self.members[i];
            let (index, term) = m.applied;
            if index == 0 {
                return;
            }
            let snap = snapshot_with(index, term, m.node.raft.prs().conf().to_conf_state());
            keep(&m.log, &snap);
            m.log.install(snap, index).expect("compacts");
        }

        /// A new raft node over the same log, applied up to the snapshot the
        /// log keeps, as `Replica::start` does for a replica on disk.
        fn restart(&mut self, i: usize) {
            let m = &mut self.members[i];
            let kept = m.log.snapshot_index();
            let config = raft::Config { applied: kept, ..raft_config(m.node.raft.id, 256) };
            m.node = RawNode::new(&config, RaftLog(m.log.clone()), &logger()).expect("a raft node restarts");
            self.ready(i);
        }

        fn describe(&self) -> String {
            let mut out = String::new();
            for m in &self.members {
                let r = &m.node.raft;
                let log = &r.raft_log;
                out += &format!(
                    "\nreplica {}: {:?} term {} leader {} log [{}, {}] committed {} applied {:?} progress {:?}",
                    r.id,
                    r.state,
                    r.term,
                    r.leader_id,
                    log.first_index(),
                    log.last_index(),
                    log.committed,
                    m.applied,
                    r.prs()
                        .iter()
                        .map(|(id, p)| (*id, p.state, p.matched, p.next_idx, p.paused, p.pending_snapshot))
                        .collect::<Vec<_>>()
                );
            }
            out
        }

        fn leader(&self) -> Option<usize> {
            self.members.iter().position(|m| m.node.raft.state == StateRole::Leader)
        }

        /// Every message in flight is delivered and every replica ticks,
        /// until proposals made now are applied everywhere. `false` if
        /// that takes too long.
        fn settle(&mut self) -> bool {
            // The last proposal: (term, index).
            let mut target: Option<(u64, u64)> = None;
            for _ in 0..3_000 {
                while let Some(m) = self.net.pop_front() {
                    self.deliver(m);
                }
                for i in 0..self.members.len() {
                    self.tick(i);
                }
                if let Some((term, index)) = target {
                    let applied = self.members.iter().all(|m| m.applied.0 >= index);
                    let kept = self.members.iter().any(|m| m.delivered.get(&index).is_some_and(|e| e.0 == term));
                    if applied && kept {
                        return true;
                    }
                }
                // Proposals of a leader that lost its leadership may be
                // lost: the next leader proposes again.
                if let Some(l) = self.leader() {
                    let term = self.members[l].node.raft.term;
                    if target.map_or(true, |(t, _)| t != term) && (0..3).all(|_| self.propose(l)) {
                        target = Some((term, self.members[l].node.raft.raft_log.last_index()));
                    }
                }
            }
            false
        }
    }

    #[derive(Clone, Debug)]
    enum NetOp {
        /// Delivers one message in flight (any: reordering).
        Deliver(u16),
        /// Loses one.
        Drop(u16),
        /// Delivers one twice (later).
        Duplicate(u16),
        /// Loses everything in flight to or from a replica.
        Isolate(u8),
        /// Ticks a replica that many times (elections, heartbeats).
        Tick(u8, u8),
        /// Delivers everything in flight, in order, and ticks everyone.
        Round,
        Propose(u8),
        Compact(u8),
        /// Restarts a replica from its log, as a replica on disk restarts.
        Restart(u8),
    }

    fn net_op() -> impl Strategy<Value = NetOp> {
        prop_oneof![
            10 => any::<u16>().prop_map(NetOp::Deliver),
            2 => any::<u16>().prop_map(NetOp::Drop),
            2 => any::<u16>().prop_map(NetOp::Duplicate),
            1 => (0..3u8).prop_map(NetOp::Isolate),
            4 => (0..3u8, 1..12u8).prop_map(|(i, n)| NetOp::Tick(i, n)),
            3 => Just(NetOp::Round),
            3 => (0..3u8).prop_map(NetOp::Propose),
            2 => (0..3u8).prop_map(NetOp::Compact),
            1 => (0..3u8).prop_map(NetOp::Restart),
        ]
    }

    proptest! {
        #[test]
        fn honest_traffic_passes_the_guard(ops in prop::collection::vec(net_op(), 0..400)) {
            let mut g = Group::new();
            for op in ops {
                let pick = |n: u16, len: usize| (len > 0).then(|| n as usize % len);
                match op {
                    NetOp::Deliver(n) => {
                        if let Some(k) = pick(n, g.net.len()) {
                            let m = g.net.remove(k).expect("in range");
                            g.deliver(m);
                        }
                    }
                    NetOp::Drop(n) => {
                        if let Some(k) = pick(n, g.net.len()) {
                            g.net.remove(k);
                        }
                    }
                    NetOp::Duplicate(n) => {
                        if let Some(k) = pick(n, g.net.len()) {
                            let m = g.net[k].clone();
                            g.net.push_back(m);
                        }
                    }
                    NetOp::Isolate(i) => {
                        let id = i as u64 + 1;
                        g.net.retain(|m| m.from != id && m.to != id);
                    }
                    NetOp::Tick(i, n) => {
                        for _ in 0..n {
                            g.tick(i as usize);
                        }
                    }
                    NetOp::Round => {
                        for _ in 0..g.net.len() {
                            if let Some(m) = g.net.pop_front() {
                                g.deliver(m);
                            }
                        }
                        for i in 0..g.members.len() {
                            g.tick(i);
                        }
                    }
                    NetOp::Propose(i) => {
                        g.propose(i as usize);
                    }
                    NetOp::Compact(i) => g.compact(i as usize),
                    NetOp::Restart(i) => g.restart(i as usize),
                }
            }
            let settled = g.settle();
            prop_assert!(g.refused.is_empty(), "the guard refused honest messages: {:#?}", g.refused);
            prop_assert!(settled, "no leader committed proposals everywhere: {}", g.describe());
            // The replicas agree on every entry two of them applied.
            for a in &g.members {
                for b in &g.members {
                    for (index, entry) in &a.delivered {
                        if let Some(other) = b.delivered.get(index) {
                            prop_assert_eq!(entry, other, "entry {} differs", index);
                        }
                    }
                }
            }
        }
    }

    // ----- surveys: many cases, every failure site and what got through -----

    /// Where and how raft panicked, recorded by the surveys' panic hook.
    static PANICS: Mutex<Vec<(String, String)>> = Mutex::new(Vec::new());

    /// Failure sites of a survey: site -> (count, panic message, example).
    type Sites = BTreeMap<String, (u64, String, String)>;

    /// Runs `PSMR_SURVEY_CASES` cases (default `default_cases`) from seed
    /// `PSMR_SURVEY_SEED` (default: the clock; printed), with or without
    /// the guard; returns the failure sites and what the cases stepped.
    fn survey(guarded: bool, default_cases: u64) -> (Sites, Tally) {
        let cases: u64 = std::env::var("PSMR_SURVEY_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(default_cases);
        let seed: u64 = std::env::var("PSMR_SURVEY_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or_else(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
        });
        println!("survey (guarded: {guarded}): {cases} cases, seed {seed} (PSMR_SURVEY_SEED={seed} repeats it)");
        let mut bytes = [0u8; 32];
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = (seed >> ((i % 8) * 8)) as u8 ^ i as u8;
        }
        let mut runner = TestRunner::new_with_rng(
            proptest::test_runner::Config::default(),
            TestRng::from_seed(RngAlgorithm::ChaCha, &bytes),
        );
        let strategy = (fixture(), prop::collection::vec(op(), 1..6));
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(|info| {
            let at = info.location().map_or_else(String::new, |l| format!("{}:{}", l.file(), l.line()));
            let what = psmr_sched::panic_message(info.payload());
            PANICS.lock().unwrap_or_else(|p| p.into_inner()).push((at, what));
        }));
        let mut sites = Sites::new();
        let mut tally = Tally::default();
        let mut failed = 0;
        for _ in 0..cases {
            let (f, ops) = strategy.new_tree(&mut runner).expect("a case").current();
            PANICS.lock().unwrap_or_else(|p| p.into_inner()).clear();
            if let Err(why) = run_case(&f, &ops, guarded, &mut tally) {
                failed += 1;
                let recorded = PANICS.lock().unwrap_or_else(|p| p.into_inner()).first().cloned();
                let (at, what) = recorded.unwrap_or_else(|| ("(no panic: the log refused)".into(), why.clone()));
                let site = sites.entry(at).or_insert_with(|| (0, what, format!("{why}\nfixture {f:?}")));
                site.0 += 1;
            }
        }
        std::panic::set_hook(previous);
        println!("{failed} of {cases} cases failed, at {} sites", sites.len());
        for (at, (count, what, example)) in &sites {
            let example: String = example.chars().take(4000).collect();
            println!("\n=== {count:>6}  {at}\n    {what}\n{example}");
        }
        println!("\nstepped:");
        for (key, n) in &tally.stepped {
            println!("{n:>9}  {key}");
        }
        println!("refused:");
        for (rule, n) in &tally.refused {
            println!("{n:>9}  {rule}");
        }
        (sites, tally)
    }

    /// The surveys, one after the other (each installs a panic hook to
    /// record where raft-rs panicked). Without the guard: raft-rs panics on
    /// some of the cases, each distinct site printed with a count and an
    /// example (if it never did, the cases would explore too little to
    /// show anything). With the guard: no failure, and messages of every
    /// type a replica sends get through to every role. A few thousand
    /// cases by default; `PSMR_SURVEY_CASES=1000000` for a long run, with
    /// `-- --nocapture` to see the sites.
    #[test]
    fn surveys() {
        let (sites, _) = survey(false, 2_000);
        assert!(!sites.is_empty(), "raft-rs survived every unguarded case: the survey explores too little");
        let (sites, tally) = survey(true, 5_000);
        assert!(sites.is_empty(), "raft-rs failed despite the guard: {sites:#?}");
        assert!(tally.stepped.len() >= 20, "too few kinds of messages got through: {:?}", tally.stepped);
    }
}
