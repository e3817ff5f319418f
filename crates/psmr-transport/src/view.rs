//! What a replica knows of its cluster, as its protocol last published it:
//! who leads, in which term, up to which index the log is committed, and
//! who the members are. The protocol thread writes it after every turn;
//! the peer links, the client port and the metrics read it.

use parking_lot::RwLock;
use psmr_core::config::Member;
use psmr_core::membership::Membership;
use psmr_core::protocol::View;
use psmr_core::transfer::Progress;
use psmr_model::wire::{MemberInfo, ServerMsg};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// One transfer, for `status`.
fn describe_transfer(t: &Progress, now_ns: u64) -> String {
    let mib = |b: u64| b as f64 / f64::from(1 << 20);
    let secs = now_ns.saturating_sub(t.started_ns) as f64 / 1e9;
    let rate = if secs > 0.0 { mib(t.done) / secs } else { 0.0 };
    let (verb, dir) = if t.sending { ("sending", "to") } else { ("receiving", "from") };
    format!(
        "{verb} the snapshot at {} {dir} replica {}: {:.1} of {:.1} MiB, {rate:.1} MiB/s",
        t.id.index,
        t.peer,
        mib(t.done),
        mib(t.id.bytes)
    )
}

/// See the module documentation.
pub struct ClusterView {
    id: u64,
    /// The configuration's members: who the members are until the log
    /// names any (a joining replica that has heard nothing yet).
    configured: Vec<Member>,
    leader: AtomicU64,
    term: AtomicU64,
    is_leader: AtomicBool,
    commit: AtomicU64,
    repaired: AtomicBool,
    membership: RwLock<Membership>,
    /// Bumped at every membership change (peer links check it cheaply).
    epoch: AtomicU64,
    /// Snapshot transfers in progress.
    transfers: RwLock<Vec<Progress>>,
    /// Whether `transfers` is non-empty (read without the lock).
    transferring: AtomicBool,
}

impl ClusterView {
    /// The view of replica `id` before its protocol published anything:
    /// no leader, the configured members, and whether it was repaired.
    pub fn new(id: u64, configured: Vec<Member>, repaired: bool) -> Self {
        Self {
            id,
            configured,
            leader: AtomicU64::new(0),
            term: AtomicU64::new(0),
            is_leader: AtomicBool::new(false),
            commit: AtomicU64::new(0),
            repaired: AtomicBool::new(repaired),
            membership: RwLock::new(Membership::default()),
            epoch: AtomicU64::new(0),
            transfers: RwLock::default(),
            transferring: AtomicBool::new(false),
        }
    }

    /// Publishes the snapshot transfers in progress (cheap while there
    /// are none, as almost always).
    pub fn set_transfers(&self, transfers: Vec<Progress>) {
        if transfers.is_empty() && !self.transferring.load(Ordering::Acquire) {
            return;
        }
        self.transferring.store(!transfers.is_empty(), Ordering::Release);
        *self.transfers.write() = transfers;
    }

    /// The snapshot transfers in progress, as people read them: the peer,
    /// bytes done of the file's size, and the rate since it started (the
    /// protocol's clock, [`crate::clock::now_ns`]).
    pub fn transfers_text(&self) -> String {
        let now = crate::clock::now_ns();
        let lines: Vec<String> = self.transfers.read().iter().map(|t| describe_transfer(t, now)).collect();
        lines.join("; ")
    }

    /// This replica's id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Publishes the protocol's view.
    pub fn publish(&self, view: &View) {
        self.leader.store(view.leader, Ordering::Release);
        self.term.store(view.term, Ordering::Release);
        self.commit.store(view.commit, Ordering::Release);
        self.is_leader.store(view.is_leader(), Ordering::Release);
        self.repaired.store(view.repaired, Ordering::Release);
    }

    /// Publishes the protocol's membership.
    pub fn set_membership(&self, m: &Membership) {
        *self.membership.write() = m.clone();
        self.epoch.fetch_add(1, Ordering::AcqRel);
    }

    /// The leader as this replica knows it (0: none).
    pub fn leader(&self) -> u64 {
        self.leader.load(Ordering::Acquire)
    }

    /// The current term.
    pub fn term(&self) -> u64 {
        self.term.load(Ordering::Acquire)
    }

    /// This replica leads.
    pub fn is_leader(&self) -> bool {
        self.is_leader.load(Ordering::Acquire)
    }

    /// The commit index.
    pub fn commit(&self) -> u64 {
        self.commit.load(Ordering::Acquire)
    }

    /// This replica was repaired and has not caught up with its vote floor
    /// (its peer handshakes say so).
    pub fn repaired(&self) -> bool {
        self.repaired.load(Ordering::Acquire)
    }

    /// Changes with every membership change.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Member `id`'s addresses.
    pub fn member(&self, id: u64) -> Option<Member> {
        let m = self.membership.read();
        match m.is_empty() {
            true => self.configured.iter().find(|c| c.id == id).cloned(),
            false => m.member(id).cloned(),
        }
    }

    /// Every member, voters and learners.
    pub fn members(&self) -> Vec<Member> {
        let m = self.membership.read();
        match m.is_empty() {
            true => self.configured.clone(),
            false => m.members().cloned().collect(),
        }
    }

    /// The members as a client sees them.
    pub fn member_info(&self) -> Vec<MemberInfo> {
        self.membership.read().info()
    }

    /// Whether replica `id` was removed from the cluster (as far as this
    /// replica's log says).
    pub fn is_removed(&self, id: u64) -> bool {
        self.membership.read().is_removed(id)
    }

    /// The answer that sends a client to the leader (none known: leader
    /// 0), with its client address if this replica knows it.
    pub fn redirect(&self) -> ServerMsg {
        let leader = self.leader();
        let addr = self.member(leader).map(|m| m.client.to_string()).unwrap_or_default();
        ServerMsg::Redirect { leader, addr }
    }
}
