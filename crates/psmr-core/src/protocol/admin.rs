//! Membership changes a client asks for (`psmr client add-replica` /
//! `remove-replica`), carried out by the leader's protocol thread.
//!
//! A request is a goal, not a step: "replica 4 at these addresses is a
//! voter", "replica 2 is not a member". Every turn the leader compares the
//! goal with the membership of the committed log and proposes the next
//! conf change towards it (see [`crate::membership`]): add as learner;
//! once the learner's log is within [`CATCH_UP_SLACK`] entries of the
//! commit index, make it a voter; remove. Because the goal is checked
//! against the log, a client that sends the same request again (after a
//! leader change, or a lost answer) continues where the last leader
//! stopped, and a goal already met is answered at once.
//!
//! A leader asked to remove itself hands leadership to the voter with
//! the most of its log first (raft's leadership transfer); the client,
//! redirected, asks the new leader, which removes the old one.
//!
//! One change at a time: raft refuses a conf change while another is
//! pending, and a second request is told to retry later. A request that
//! has not reached its goal within [`CHANGE_TIMEOUT`] (a new replica that
//! is not running, cannot be reached, or is still receiving a large
//! snapshot) is answered with an error to retry later; what was done stays
//! done (a learner stays a learner until removed or asked for again).

use super::{contained, Protocol, ProtocolIo, Stop};
use crate::config::Member;
use crate::membership::{Change, Membership};
use crate::store::Store;
use psmr_model::wire::{MemberChange, ServerMsg, RETRY_LATER};
use raft::{RawNode, StateRole, Storage};
use std::time::Duration;
use tracing::info;

/// A learner this close to the commit index (in entries) is made a voter:
/// it streams the rest in a moment, and until then the quorum does not
/// wait for it.
pub const CATCH_UP_SLACK: u64 = 100;

/// How long a membership change may take before its client is told it
/// failed.
pub const CHANGE_TIMEOUT: Duration = Duration::from_secs(60);

/// The goal of a membership change.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Goal {
    /// This replica, at these addresses, is a voter.
    Voter(Member),
    /// This replica is not a member.
    Gone(u64),
}

/// The request the leader works on.
pub(crate) struct Pending {
    goal: Goal,
    /// The driver's name for the request, to answer it.
    ticket: u64,
    /// The tick after which the client is told the change failed.
    deadline: u64,
    /// A learner becomes a voter only once it holds the log up to here:
    /// the leader's last entry when the request came, then the entry that
    /// added the learner. (The slack alone would promote a replica that
    /// never answered, on a short log.)
    holds: u64,
    /// The term this replica leads in and took the request in: `holds` is
    /// an index of its log in that term.
    term: u64,
}

/// What to do next for a goal.
#[derive(Debug)]
enum Step {
    Done,
    Wait,
    Propose(Change),
    /// Hand leadership to this voter first.
    Transfer(u64),
    Refuse(String),
}

fn goal(change: MemberChange) -> Result<Goal, String> {
    match change {
        MemberChange::Add { id, client, peer } => {
            let addr = |what: &str, s: &str| s.parse().map_err(|_| format!("{what} address {s:?} is not host:port"));
            if id == 0 {
                return Err("replica ids start at 1".into());
            }
            Ok(Goal::Voter(Member::new(id, addr("client", &client)?, addr("peer", &peer)?)))
        }
        MemberChange::Remove { id } => Ok(Goal::Gone(id)),
    }
}

impl<S: Store> Protocol<S> {
    /// Takes a client's membership change, known to the driver as
    /// `ticket`: the one under way, unless another is.
    pub fn admin(&mut self, ticket: u64, change: MemberChange, io: &mut impl ProtocolIo) -> Result<(), Stop> {
        if let Some(p) = &self.admin {
            io.answer(
                ticket,
                ServerMsg::Error(format!("{RETRY_LATER}another membership change is under way ({:?})", p.goal)),
            );
            return Ok(());
        }
        match goal(change) {
            Ok(goal) => {
                let deadline = self.ticks + CHANGE_TIMEOUT.as_millis() as u64 / self.config.tick_ms.max(1);
                let (holds, term) = (self.node.raft.raft_log.last_index(), self.node.raft.term);
                self.admin = Some(Pending { goal, ticket, deadline, holds, term });
                self.drive_admin(io)
            }
            Err(why) => {
                io.answer(ticket, ServerMsg::Error(why));
                Ok(())
            }
        }
    }

    /// Moves the change under way one step, and answers its client once
    /// it is done (or cannot be done here).
    pub(crate) fn drive_admin(&mut self, io: &mut impl ProtocolIo) -> Result<(), Stop> {
        let Some(p) = &self.admin else { return Ok(()) };
        let answer = if self.node.raft.state != StateRole::Leader || self.node.raft.term != p.term {
            Some(self.redirect())
        } else if self.ticks >= p.deadline {
            // Worth asking again: what was done stays done, and a replica
            // catching up from a large snapshot may need longer (the
            // client decides how long it waits in all).
            Some(ServerMsg::Error(format!(
                "{RETRY_LATER}{:?} not reached within {CHANGE_TIMEOUT:?}; the membership is now {:?} (is the new \
                 replica running with --join, and reachable at its peer address?)",
                p.goal,
                self.membership.info()
            )))
        } else {
            let mut holds = p.holds;
            match next_step(&self.node, &self.membership, &p.goal, holds) {
                Step::Done => Some(ServerMsg::Members(self.membership.info())),
                Step::Wait => None,
                Step::Refuse(why) => Some(ServerMsg::Error(why)),
                step => {
                    info!(?step, "the next step of a membership change");
                    let what = || format!("taking {step:?}");
                    let taken = contained(what, || take_step(&mut self.node, &step, &mut holds))?;
                    self.reseed();
                    if let Some(p) = &mut self.admin {
                        p.holds = holds;
                    }
                    taken.err().map(|e| ServerMsg::Error(format!("{RETRY_LATER}raft did not take the change: {e}")))
                }
            }
        };
        if let Some(msg) = answer {
            if let Some(p) = self.admin.take() {
                io.answer(p.ticket, msg);
            }
        }
        Ok(())
    }
}

/// The next step towards `goal` for the leader `raw`, given the committed
/// `membership`; a learner is made a voter once it holds the log up to
/// `holds` (see [`Pending`]).
fn next_step<S: Storage>(raw: &RawNode<S>, membership: &Membership, goal: &Goal, holds: u64) -> Step {
    let pending = raw.raft.has_pending_conf();
    match goal {
        Goal::Voter(m) => match membership.member(m.id) {
            Some(cur) if (cur.client, cur.peer) != (m.client, m.peer) => Step::Refuse(format!(
                "replica {} is a member at client {} and peer {}; remove it first",
                m.id, cur.client, cur.peer
            )),
            Some(_) if membership.is_voter(m.id) => Step::Done,
            _ if pending => Step::Wait,
            Some(cur) if caught_up(raw, m.id, holds) => Step::Propose(Change::Add { member: cur.clone(), voter: true }),
            Some(_) => Step::Wait,
            None => checked(membership, Change::Add { member: m.clone(), voter: false }),
        },
        Goal::Gone(id) if !membership.contains(*id) => Step::Done,
        Goal::Gone(_) if pending || raw.raft.lead_transferee.is_some() => Step::Wait,
        Goal::Gone(id) if *id == raw.raft.id => match checked(membership, Change::Remove(*id)) {
            Step::Propose(_) => successor(raw, membership).map_or(Step::Wait, Step::Transfer),
            refused => refused,
        },
        Goal::Gone(id) => checked(membership, Change::Remove(*id)),
    }
}

/// Takes `step` on the leader `raw`: proposes the conf change (a learner
/// must then hold the log up to it before it votes: `holds`) or hands
/// leadership over. An error: raft did not take the change.
fn take_step<S: Storage>(raw: &mut RawNode<S>, step: &Step, holds: &mut u64) -> raft::Result<()> {
    match step {
        Step::Propose(change) => {
            raw.propose_conf_change(Vec::new(), change.to_conf_change())?;
            *holds = (*holds).max(raw.raft.raft_log.last_index());
        }
        Step::Transfer(to) => raw.transfer_leader(*to),
        Step::Done | Step::Wait | Step::Refuse(_) => {}
    }
    Ok(())
}

/// Proposes `change` if the membership takes it.
fn checked(membership: &Membership, change: Change) -> Step {
    match membership.clone().apply(&change) {
        Ok(()) => Step::Propose(change),
        Err(why) => Step::Refuse(why),
    }
}

/// The voter other than the leader `raw` with the most of its log: the
/// one to lead once the leader is removed (raft-rs 0.7 cannot go on
/// leading without its leader in the membership).
fn successor<S: Storage>(raw: &RawNode<S>, membership: &Membership) -> Option<u64> {
    let me = raw.raft.id;
    let voters = membership.members().map(|m| m.id).filter(|&id| id != me && membership.is_voter(id));
    voters.max_by_key(|&id| raw.raft.prs().get(id).map_or(0, |pr| pr.matched))
}

/// Whether learner `id` holds the log up to `holds` and (nearly) all of
/// the committed log.
fn caught_up<S: Storage>(raw: &RawNode<S>, id: u64, holds: u64) -> bool {
    let committed = raw.raft.raft_log.committed;
    let pr = raw.raft.prs().get(id);
    pr.is_some_and(|pr| pr.matched >= holds && pr.matched + CATCH_UP_SLACK >= committed)
}
