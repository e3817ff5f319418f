//! Who the cluster's members are, and where they listen.
//!
//! Membership lives in the raft log. A cluster's first start writes one
//! conf-change entry per configured replica (indexes 1 to n, term 1,
//! identical on every founding replica, as etcd bootstraps), so that a
//! replica that joins later and receives the log from index 1 replays the
//! whole history of the membership, not just the changes after the start.
//! Every change after that is one more conf-change entry, proposed by the
//! leader for `psmr client add-replica` / `remove-replica`:
//!
//! * adding replica N: N joins as a learner (it receives the log but does
//!   not vote); once it has caught up, a second entry makes it a voter.
//!   A voter that is still empty would count towards every quorum while it
//!   cannot acknowledge anything.
//! * removing replica N: one entry; the replica stops once it applies it.
//!
//! Each entry changes one replica, so no change moves more than one voter
//! and raft's simple (non-joint) changes are always safe. An entry carries
//! the added replica's addresses (a [`Member`]), so every replica learns
//! where the new one listens from the log itself; snapshots carry the
//! whole [`Membership`] at their index.
//!
//! [`Membership`] is the pure model of what the entries do: the protocol
//! thread applies each committed change to it and to raft (and stops the
//! replica should the two ever disagree), the service manager applies it
//! at execution time to put the membership of each snapshot's index into
//! the snapshot.

use crate::config::Member;
use psmr_model::wire::{Decoder, Encoder, MemberInfo, WireError, MEMBERS_MAX};
use raft::prelude::{ConfChangeSingle, ConfChangeType, ConfChangeV2, ConfState, Entry, EntryType};
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;

/// One change of the membership: one conf-change entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// Adds `member` as a learner (`voter` false) or makes it a voter.
    Add {
        /// The replica and its addresses.
        member: Member,
        /// A voter rather than a learner.
        voter: bool,
    },
    /// Removes the replica with this id.
    Remove(u64),
}

impl Change {
    /// The replica the change is about.
    pub fn id(&self) -> u64 {
        match self {
            Change::Add { member, .. } => member.id,
            Change::Remove(id) => *id,
        }
    }

    /// The raft conf change: one simple change, the member's addresses in
    /// its context.
    pub fn to_conf_change(&self) -> ConfChangeV2 {
        let (kind, context) = match self {
            Change::Add { member, voter: true } => (ConfChangeType::AddNode, encode_member(member)),
            Change::Add { member, voter: false } => (ConfChangeType::AddLearnerNode, encode_member(member)),
            Change::Remove(_) => (ConfChangeType::RemoveNode, Vec::new()),
        };
        let mut single = ConfChangeSingle { node_id: self.id(), ..Default::default() };
        single.set_change_type(kind);
        let mut cc = ConfChangeV2::default();
        cc.set_changes(vec![single].into());
        cc.context = context.into();
        cc
    }

    /// The change a committed conf-change entry makes. An error means
    /// the entry changes nothing, identically on every replica: psmr's
    /// leaders propose only what [`Change::to_conf_change`] makes.
    pub fn from_entry(e: &Entry) -> Result<Change, String> {
        if e.get_entry_type() != EntryType::EntryConfChangeV2 {
            return Err(format!("a {:?} entry (psmr proposes only version 2 conf changes)", e.get_entry_type()));
        }
        let cc: ConfChangeV2 =
            crate::entry::decode_proto(&e.data).map_err(|err| format!("undecodable conf change: {err}"))?;
        if cc.get_transition() != raft::prelude::ConfChangeTransition::Auto || cc.changes.len() != 1 {
            return Err(format!("a joint conf change ({} changes, {:?})", cc.changes.len(), cc.get_transition()));
        }
        let single = &cc.changes[0];
        let id = single.node_id;
        if id == 0 {
            return Err("a conf change of replica 0".into());
        }
        let voter = match single.get_change_type() {
            ConfChangeType::RemoveNode => return Ok(Change::Remove(id)),
            ConfChangeType::AddNode => true,
            ConfChangeType::AddLearnerNode => false,
        };
        let member = decode_member(&cc.context).map_err(|err| format!("conf change of replica {id}: {err}"))?;
        if member.id != id {
            return Err(format!("conf change of replica {id} with the addresses of replica {}", member.id));
        }
        Ok(Change::Add { member, voter })
    }

    /// The entry at `index` (term 1) of a founding replica's log that
    /// makes `member` a voter.
    fn founding_entry(index: u64, member: &Member) -> Entry {
        use protobuf::Message as _;
        let cc = Change::Add { member: member.clone(), voter: true }.to_conf_change();
        let mut e = Entry::default();
        e.set_entry_type(EntryType::EntryConfChangeV2);
        e.index = index;
        e.term = 1;
        e.data = cc.write_to_bytes().expect("a conf change always encodes").into();
        e
    }
}

/// The first entries of a founding replica's log: one per configured
/// replica, by id, each making it a voter (see the module documentation).
pub fn founding_entries(replicas: &[Member]) -> Vec<Entry> {
    let mut members: Vec<&Member> = replicas.iter().collect();
    members.sort_by_key(|m| m.id);
    members.iter().enumerate().map(|(i, m)| Change::founding_entry(i as u64 + 1, m)).collect()
}

/// What a committed conf-change entry did ([`apply_committed`]).
#[derive(Debug)]
pub(crate) enum Committed {
    /// Nothing, and why (identically on every replica).
    Ignored(String),
    /// This change, to raft's membership and to psmr's.
    Changed(Change),
    /// It removes this replica, which must stop at once, without applying
    /// it: raft-rs 0.7 panics when a leader goes on without itself in the
    /// membership, and a removed replica has nothing left to do.
    RemovedSelf,
}

/// Applies the committed conf-change entry `e` to `node` and to
/// `membership` (the protocol thread's and the simulation's one way to do
/// it). psmr's model is asked first, raft second: a change the model
/// refuses changes nothing anywhere; an error means raft and psmr
/// disagree, and the replica must stop.
pub(crate) fn apply_committed<S: raft::Storage>(
    node: &mut raft::RawNode<S>,
    membership: &mut Membership,
    e: &Entry,
) -> Result<Committed, String> {
    let index = e.index;
    let change = match Change::from_entry(e) {
        Ok(c) => c,
        Err(why) => return Ok(Committed::Ignored(why)),
    };
    if change == Change::Remove(node.raft.id) {
        return Ok(Committed::RemovedSelf);
    }
    let mut next = membership.clone();
    if let Err(why) = next.apply(&change) {
        return Ok(Committed::Ignored(format!("{change:?}: {why}")));
    }
    let conf = node
        .apply_conf_change(&change.to_conf_change())
        .map_err(|err| format!("raft refused the conf change at {index} ({change:?}): {err}"))?;
    if !next.matches(&conf) {
        return Err(format!("raft's membership {conf:?} after entry {index} is not psmr's {:?}", next.info()));
    }
    *membership = next;
    Ok(Committed::Changed(change))
}

/// The members of a cluster: voters and learners, with their addresses.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Membership {
    voters: BTreeSet<u64>,
    learners: BTreeSet<u64>,
    members: BTreeMap<u64, Member>,
    /// Every replica ever removed: its id is never used again, and its
    /// messages are refused (it may not know it was removed).
    removed: BTreeSet<u64>,
}

impl Membership {
    /// Applies `change`, or explains why it changes nothing: it would
    /// leave no voter, add a replica beyond [`MEMBERS_MAX`], or give a
    /// replica addresses another member listens on. raft refuses the
    /// first too; the others are psmr's, so the protocol thread asks here
    /// before it asks raft.
    pub fn apply(&mut self, change: &Change) -> Result<(), String> {
        match change {
            Change::Add { member, voter } => {
                let id = member.id;
                if self.removed.contains(&id) {
                    return Err(format!("replica {id} was removed from the cluster; an id is never used again"));
                }
                if !self.members.contains_key(&id) && self.members.len() >= MEMBERS_MAX {
                    return Err(format!("the cluster has {MEMBERS_MAX} members, the most it may have"));
                }
                if let Some(other) = self.listening_on(member) {
                    return Err(format!("replica {} already listens on an address of replica {id}", other));
                }
                self.members.insert(id, member.clone());
                if *voter {
                    self.learners.remove(&id);
                    self.voters.insert(id);
                } else {
                    self.voters.remove(&id);
                    self.learners.insert(id);
                }
            }
            Change::Remove(id) => {
                if self.voters.len() == 1 && self.voters.contains(id) {
                    return Err(format!("replica {id} is the only voter"));
                }
                self.voters.remove(id);
                self.learners.remove(id);
                self.members.remove(id);
                self.removed.insert(*id);
            }
        }
        Ok(())
    }

    /// The member other than `m` that listens on one of `m`'s addresses.
    fn listening_on(&self, m: &Member) -> Option<u64> {
        let theirs: Vec<SocketAddr> = m.addrs().collect();
        self.members.values().find(|o| o.id != m.id && o.addrs().any(|a| theirs.contains(&a))).map(|o| o.id)
    }

    /// Whether replica `id` was removed from the cluster.
    pub fn is_removed(&self, id: u64) -> bool {
        self.removed.contains(&id)
    }

    /// Every replica ever removed.
    pub fn removed(&self) -> impl Iterator<Item = u64> + '_ {
        self.removed.iter().copied()
    }

    /// Whether no member is known.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Whether `id` votes.
    pub fn is_voter(&self, id: u64) -> bool {
        self.voters.contains(&id)
    }

    /// Whether `id` is a voter or a learner.
    pub fn contains(&self, id: u64) -> bool {
        self.members.contains_key(&id)
    }

    /// Member `id`'s addresses.
    pub fn member(&self, id: u64) -> Option<&Member> {
        self.members.get(&id)
    }

    /// A membership of `voters`, all of them voters: a cluster's first
    /// (the founding entries make the same), or a restored one's.
    pub fn of_voters(voters: &[Member]) -> Result<Membership, String> {
        let mut m = Membership::default();
        for member in voters {
            m.apply(&Change::Add { member: member.clone(), voter: true })?;
        }
        Ok(m)
    }

    /// Every member, by id.
    pub fn members(&self) -> impl Iterator<Item = &Member> {
        self.members.values()
    }

    /// Voters and learners as raft keeps them.
    pub fn conf_state(&self) -> ConfState {
        ConfState::from((
            self.voters.iter().copied().collect::<Vec<_>>(),
            self.learners.iter().copied().collect::<Vec<_>>(),
        ))
    }

    /// Whether raft's `conf` has exactly these voters and learners.
    pub fn matches(&self, conf: &ConfState) -> bool {
        let set = |ids: &[u64]| ids.iter().copied().collect::<BTreeSet<u64>>();
        set(conf.get_voters()) == self.voters
            && set(conf.get_learners()) == self.learners
            && conf.get_voters_outgoing().is_empty()
            && conf.get_learners_next().is_empty()
    }

    /// The members as a client sees them.
    pub fn info(&self) -> Vec<MemberInfo> {
        self.members
            .values()
            .map(|m| MemberInfo {
                id: m.id,
                client: m.client.to_string(),
                peer: m.peer.to_string(),
                voter: self.voters.contains(&m.id),
            })
            .collect()
    }

    /// The membership as a snapshot holds it.
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Encoder::new();
        e.u32(self.members.len() as u32);
        for m in self.members.values() {
            e.u8(self.voters.contains(&m.id) as u8).bytes(&encode_member(m));
        }
        e.u32(self.removed.len() as u32);
        for id in &self.removed {
            e.u64(*id);
        }
        e.finish()
    }

    /// What [`Membership::encode`] wrote; refuses anything else.
    pub fn decode(bytes: &[u8]) -> Result<Membership, WireError> {
        let mut d = Decoder::new(bytes, "membership");
        let n = d.count(MEMBERS_MAX, 5)?;
        let mut out = Membership::default();
        for _ in 0..n {
            let voter = match d.u8()? {
                0 => false,
                1 => true,
                v => return Err(d.error(format!("voter flag {v}"))),
            };
            let member = decode_member(d.bytes()?)?;
            out.apply(&Change::Add { member, voter }).map_err(|why| d.error(why))?;
        }
        let n = d.count(REMOVED_MAX, 8)?;
        for _ in 0..n {
            let id = d.u64()?;
            if id == 0 || out.members.contains_key(&id) {
                return Err(d.error(format!("replica {id} both removed and a member")));
            }
            out.removed.insert(id);
        }
        d.end()?;
        if !out.members.is_empty() && out.voters.is_empty() {
            return Err(d.error("members but no voter"));
        }
        Ok(out)
    }
}

/// Most removed replicas a snapshot's membership lists (8 bytes each).
const REMOVED_MAX: usize = 1 << 20;

fn encode_member(m: &Member) -> Vec<u8> {
    let mut e = Encoder::new();
    e.u64(m.id).str(&m.client.to_string()).str(&m.peer.to_string());
    for a in [m.redis, m.metrics] {
        e.str(&a.map(|a| a.to_string()).unwrap_or_default());
    }
    e.finish()
}

fn decode_member(bytes: &[u8]) -> Result<Member, WireError> {
    let mut d = Decoder::new(bytes, "member");
    let id = d.u64()?;
    let mut addr = |what: &str| -> Result<Option<SocketAddr>, WireError> {
        let s = d.str()?;
        if s.is_empty() {
            return Ok(None);
        }
        s.parse().map(Some).map_err(|_| d.error(format!("{what} address {s:?}")))
    };
    let (client, peer) = (addr("client")?, addr("peer")?);
    let (redis, metrics) = (addr("redis")?, addr("metrics")?);
    d.end()?;
    match (client, peer) {
        (Some(client), Some(peer)) if id != 0 => Ok(Member { id, client, peer, redis, metrics }),
        _ => Err(d.error(format!("replica {id} without an id, a client or a peer address"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(id: u64) -> Member {
        let a = |port: u64| format!("127.0.0.1:{}", port + id).parse().unwrap();
        Member { id, client: a(7000), peer: a(8000), redis: (id == 2).then(|| a(6000)), metrics: None }
    }

    fn founded(n: u64) -> Membership {
        let mut s = Membership::default();
        for e in founding_entries(&(1..=n).map(m).collect::<Vec<_>>()) {
            s.apply(&Change::from_entry(&e).unwrap()).unwrap();
        }
        s
    }

    #[test]
    fn founding_entries_replay_into_the_configured_voters() {
        let s = founded(3);
        assert_eq!(s.conf_state().voters, vec![1, 2, 3]);
        assert!(s.conf_state().learners.is_empty());
        assert_eq!(s.member(2), Some(&m(2)));
        let entries = founding_entries(&[m(3), m(1)]);
        assert_eq!(entries.iter().map(|e| (e.index, e.term)).collect::<Vec<_>>(), vec![(1, 1), (2, 1)]);
        assert_eq!(Change::from_entry(&entries[0]).unwrap().id(), 1);
    }

    #[test]
    fn a_replica_joins_as_a_learner_then_votes_then_leaves() {
        let mut s = founded(3);
        for change in [Change::Add { member: m(4), voter: false }, Change::Add { member: m(4), voter: true }] {
            let mut e = Change::founding_entry(9, &m(1));
            use protobuf::Message as _;
            e.data = change.to_conf_change().write_to_bytes().unwrap().into();
            let back = Change::from_entry(&e).unwrap();
            assert_eq!(back, change);
            s.apply(&back).unwrap();
            assert_eq!(s.is_voter(4), matches!(change, Change::Add { voter: true, .. }));
            assert!(s.contains(4));
        }
        s.apply(&Change::Remove(4)).unwrap();
        assert!(!s.contains(4) && !s.is_voter(4));
        assert_eq!(Membership::decode(&s.encode()).unwrap(), s);
    }

    #[test]
    fn changes_that_break_the_membership_change_nothing() {
        let mut s = founded(1);
        assert!(s.apply(&Change::Remove(1)).unwrap_err().contains("only voter"));
        let mut clash = m(5);
        clash.peer = m(1).client;
        assert!(s.apply(&Change::Add { member: clash, voter: false }).unwrap_err().contains("already listens"));
        assert_eq!(s, founded(1));
        let mut e = Change::founding_entry(1, &m(1));
        e.data = vec![0xff, 0xff].into();
        assert!(Change::from_entry(&e).is_err());
        e.set_entry_type(EntryType::EntryConfChange);
        assert!(Change::from_entry(&e).unwrap_err().contains("version 2"));
    }

    #[test]
    fn hostile_snapshot_memberships_are_refused() {
        assert!(Membership::decode(&[0, 0, 0, 1, 0, 0, 0, 0, 0]).is_err());
        let mut learner_only = Membership::default();
        learner_only.apply(&Change::Add { member: m(1), voter: false }).unwrap();
        assert!(Membership::decode(&learner_only.encode()).unwrap_err().to_string().contains("no voter"));
        assert_eq!(Membership::decode(&Membership::default().encode()).unwrap(), Membership::default());
        let mut gone = founded(3);
        gone.apply(&Change::Remove(2)).unwrap();
        assert_eq!(Membership::decode(&gone.encode()).unwrap(), gone, "the removed ids travel too");
        assert!(gone.apply(&Change::Add { member: m(2), voter: false }).unwrap_err().contains("never used again"));
    }
}
