//! The administrator: now and then wants a membership change, and asks the
//! replica it believes leads for it, as `psmr client add-replica` and
//! `remove-replica` do: a redirect sends it to the leader, "retry later"
//! makes it wait, an answer with the members ends it, and a request left
//! unanswered (its replica crashed, or lost its leadership before it
//! could answer) is asked again.

use super::{Event, World};
use crate::node::sim_member;
use psmr_model::wire::{MemberChange, ServerMsg, RETRY_LATER};
use rand::seq::SliceRandom;
use rand::Rng;

/// How long the administrator waits for an answer before it asks again,
/// µs.
const ANSWER_TIMEOUT_US: u64 = 500_000;
/// How long it waits before asking again after "retry later" or a
/// redirect to nowhere, µs.
const RETRY_US: u64 = 20_000;

/// The membership change the administrator wants.
pub(crate) struct Goal {
    change: MemberChange,
    /// The request in flight.
    ticket: u64,
    /// The replica asked.
    to: u64,
    /// When to ask again if no answer comes.
    retry_at: u64,
}

impl World {
    /// Now and then, a membership change: adds a replica that never ran
    /// (started at once, with an empty log) or removes a member, keeping
    /// at least three.
    pub(super) fn start_goal(&mut self) {
        if self.goal.is_some() || self.rates.member == 0.0 || !self.rng.gen_bool(self.rates.member) {
            return;
        }
        let Some(members) = self.members() else { return };
        let fresh: Vec<usize> = (0..self.nodes.len()).filter(|&i| self.nodes[i].incarnation == 0).collect();
        let add = !fresh.is_empty() && (members.len() <= 3 || self.rng.gen_bool(0.5));
        let change = if add {
            let i = *fresh.choose(&mut self.rng).expect("not empty");
            if self.start(i).is_err() {
                return;
            }
            let m = sim_member(self.nodes[i].id);
            MemberChange::Add { id: m.id, client: m.client.to_string(), peer: m.peer.to_string() }
        } else if members.len() > 3 {
            MemberChange::Remove { id: *members.choose(&mut self.rng).expect("not empty") }
        } else {
            return;
        };
        self.trace.event(self.now, &[0x60A1], || format!("membership goal: {change:?}"));
        let to = self.believed_leader();
        self.goal = Some(Goal { change, ticket: 0, to, retry_at: 0 });
        self.ask_admin();
    }

    /// The replica that believes it leads in the highest term, else any.
    fn believed_leader(&mut self) -> u64 {
        let leader = self
            .nodes
            .iter()
            .filter(|n| n.view().is_some_and(|v| v.is_leader()))
            .max_by_key(|n| n.view().map(|v| v.term));
        match leader {
            Some(n) => n.id,
            None => *self.ids.choose(&mut self.rng).expect("replicas"),
        }
    }

    /// Asks (again) for the change under way, if one is and it is time.
    pub(super) fn ask_admin(&mut self) {
        let Some(goal) = &mut self.goal else { return };
        if self.now < goal.retry_at {
            return;
        }
        self.next_ticket += 1;
        let (ticket, to, change) = (self.next_ticket, goal.to, goal.change.clone());
        goal.ticket = ticket;
        goal.retry_at = self.now + ANSWER_TIMEOUT_US;
        self.schedule(self.now + ANSWER_TIMEOUT_US, Event::Admin);
        let i = (to - 1) as usize;
        if self.nodes[i].is_up() && self.paused[i].is_none() {
            self.with_node(i, |n, s, env| n.admin(ticket, change, s, env));
        } else if let Some(goal) = &mut self.goal {
            // Nobody answers there: ask whoever leads now, soon.
            goal.to = 0;
            goal.retry_at = self.now + RETRY_US;
            self.retry_admin();
        }
    }

    fn retry_admin(&mut self) {
        let to = self.believed_leader();
        let Some(goal) = &mut self.goal else { return };
        if goal.to == 0 {
            goal.to = to;
        }
        let at = goal.retry_at;
        self.schedule(at, Event::Admin);
    }

    /// The answer to membership request `ticket`.
    pub(super) fn admin_answer(&mut self, ticket: u64, msg: ServerMsg) {
        let Some(goal) = &mut self.goal else { return };
        if goal.ticket != ticket {
            return;
        }
        let change = goal.change.clone();
        match msg {
            ServerMsg::Members(_) => {
                self.counts.member_changes += 1;
                self.trace.event(self.now, &[0x60A2], || format!("membership goal reached: {change:?}"));
                self.goal = None;
            }
            ServerMsg::Redirect { leader, .. } => {
                goal.to = leader;
                goal.retry_at = self.now + if leader == 0 { RETRY_US } else { 1 };
                self.retry_admin();
            }
            ServerMsg::Error(why) if why.starts_with(RETRY_LATER) => {
                goal.retry_at = self.now + RETRY_US;
                self.retry_admin();
            }
            other => {
                self.trace.event(self.now, &[0x60A3], || format!("membership goal {change:?} refused: {other:?}"));
                self.goal = None;
            }
        }
    }
}
