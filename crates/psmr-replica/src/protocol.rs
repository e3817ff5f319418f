//! The protocol thread (002 §V-C2): drives the replica's
//! [`psmr_core::protocol::Protocol`]. It waits for peer messages and
//! client requests (one blocking select, with a deadline in microseconds
//! for the entry being filled and the next tick), hands them to the
//! protocol, lets it take its turn, and turns what it asks for into IO:
//! raft messages onto the peers' send queues, work onto the service
//! manager's queue, redirects onto clients' connections, links to new
//! members. It is the only thread that touches the protocol.
//!
//! The protocol never blocks on a peer: a full send queue drops the
//! message (raft retransmits what matters). It does block on the service
//! manager's queue, which bounds in bytes what is committed and not yet
//! applied.

use crate::handles::{Applied, Counters};
use crate::metrics::Metrics;
use crossbeam::channel::Select;
use psmr_core::guard::Refusal;
use psmr_core::membership::Membership;
use psmr_core::protocol::{Apply, Protocol, ProtocolIo, Stop};
use psmr_core::transfer::SnapMsg;
use psmr_model::ratelog::RateLimit;
use psmr_model::wire::ServerMsg;
use psmr_storage::Log;
use psmr_transport::life::Life;
use psmr_transport::msg::{Decision, Inbound, RequestReceiver};
use psmr_transport::peer::{PeerSender, Peers};
use psmr_transport::queue::{Receiver, Sender};
use psmr_transport::router::{Outgoing, Router};
use psmr_transport::tls::PeerTlsContext;
use psmr_transport::view::ClusterView;
use raft::prelude::Message;
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;
use tracing::{debug, warn};

/// Warnings about refused peer messages: a misbehaving peer sends many.
static REFUSED: RateLimit = RateLimit::new(10, Duration::from_secs(10));

/// Peer messages, and separately client requests, taken in one turn at
/// most: one ready for a burst, yet ticks and readies still come often.
const TURN_TAKES: usize = 256;

/// The protocol thread: the protocol and the queues and links around it.
pub(crate) struct ProtocolThread {
    pub(crate) life: Arc<Life>,
    pub(crate) applied: Arc<Applied>,
    pub(crate) tick: Duration,
    pub(crate) protocol: Protocol<Log>,
    pub(crate) inbound: Receiver<Inbound>,
    pub(crate) requests: RequestReceiver,
    pub(crate) links: Links,
}

/// What the protocol's effects go to.
pub(crate) struct Links {
    pub(crate) view: Arc<ClusterView>,
    pub(crate) peers: Arc<Peers>,
    /// A sender per peer.
    pub(crate) senders: HashMap<u64, PeerSender>,
    pub(crate) decisions: Sender<Decision>,
    pub(crate) router: Arc<Router>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) counters: Arc<Counters>,
    /// Peer TLS, for senders to replicas added later.
    pub(crate) tls: Option<Arc<PeerTlsContext>>,
    /// Membership changes waiting for their answer, by ticket.
    pub(crate) tickets: HashMap<u64, oneshot::Sender<ServerMsg>>,
    pub(crate) next_ticket: u64,
}

/// Makes this thread's timed waits end within a microsecond of their
/// deadline instead of Linux's default slack of 50 µs: the batching delay
/// is honoured to within microseconds, not to within the kernel's timer
/// coalescing.
fn precise_timers() {
    #[cfg(target_os = "linux")]
    if let Err(e) = nix::sys::prctl::set_timerslack(1_000) {
        debug!("cannot lower the protocol thread's timer slack: {e}");
    }
}

/// What one wait brought.
enum Got {
    Inbound(Inbound),
    Request(psmr_core::request::Request),
    Nothing,
    Closed,
}

impl ProtocolThread {
    pub(crate) fn run(mut self) {
        precise_timers();
        if let Some(disk) = self.protocol.store().disk() {
            let histogram = self.links.metrics.log_sync.clone();
            disk.time_syncs(Arc::new(move |took| histogram.observe_duration(took)));
        }
        self.protocol.start(&mut self.links);
        let tick = self.tick;
        let mut next_tick = Instant::now() + tick;
        while !self.life.stopping() {
            if let Err(stop) = self.turn(tick, &mut next_tick) {
                match stop {
                    // A stopping replica closes the queues the protocol
                    // waits on: that is the stop, not a failure.
                    Stop::Failed(_) if self.life.stopping() => {}
                    Stop::Failed(why) => self.life.fail(why),
                    Stop::Removed(why) => self.life.stop_removed(&why),
                }
                return;
            }
        }
    }

    fn turn(&mut self, tick: Duration, next_tick: &mut Instant) -> Result<(), Stop> {
        match self.wait(*next_tick) {
            Got::Inbound(m) => self.inbound_msg(m)?,
            Got::Request(r) => self.protocol.request(r),
            Got::Nothing => {}
            Got::Closed => return Err(Stop::Failed("a stage the protocol thread needs stopped".into())),
        }
        // Take whatever else is waiting before the turn: one ready (one
        // sync) for a burst of messages and requests.
        for _ in 0..TURN_TAKES {
            match self.inbound.try_recv() {
                Ok(m) => self.inbound_msg(m)?,
                Err(_) => break,
            }
        }
        for _ in 0..TURN_TAKES {
            if !self.protocol.has_room() {
                break;
            }
            match self.requests.try_recv() {
                Some(r) => self.protocol.request(r),
                None => break,
            }
        }
        if Instant::now() >= *next_tick {
            self.protocol.tick()?;
            *next_tick += tick;
            if *next_tick < Instant::now() {
                *next_tick = Instant::now() + tick;
            }
        }
        self.protocol.set_applied(self.applied.get());
        let (index, clock) = self.applied.with_clock();
        self.protocol.set_applied_clock(index, clock);
        self.protocol.set_wall_clock(psmr_transport::clock::wall_ms());
        self.protocol.turn(psmr_transport::clock::now_ns(), &mut self.links)?;
        self.links.view.publish(&self.protocol.view());
        self.links.view.set_transfers(self.protocol.transfers());
        Ok(())
    }

    /// Waits for a peer message or a request, until the next tick or until
    /// the protocol has work due.
    fn wait(&mut self, next_tick: Instant) -> Got {
        self.protocol.set_applied(self.applied.get());
        if self.protocol.waits_for_applied() {
            // Either the service manager sees the request for a nudge, or
            // this sees what it applied (see `Applied::wait_for_more`).
            self.protocol.set_applied(self.applied.wait_for_more());
        }
        let now = psmr_transport::clock::now_ns();
        let deadline = match self.protocol.due(now) {
            Some(at) if at <= now => Instant::now(),
            Some(at) => (Instant::now() + Duration::from_nanos(at - now)).min(next_tick),
            None => next_tick,
        };
        let mut sel = Select::new();
        let i_in = self.inbound.select(&mut sel);
        let i_req = self.protocol.has_room().then(|| self.requests.select(&mut sel));
        match sel.select_deadline(deadline) {
            Ok(op) if op.index() == i_in => self.inbound.complete(op).map_or(Got::Closed, Got::Inbound),
            Ok(op) if Some(op.index()) == i_req => self.requests.complete(op).map_or(Got::Closed, Got::Request),
            Ok(_) => unreachable!("only two operations are selected"),
            Err(_) => Got::Nothing,
        }
    }

    fn inbound_msg(&mut self, m: Inbound) -> Result<(), Stop> {
        match m {
            Inbound::Raft(msg) => self.protocol.step(*msg, &mut self.links),
            Inbound::Snap { peer, msg } => {
                self.links.metrics.snapshots.transfer_bytes(false, msg.weight());
                let now = psmr_transport::clock::now_ns();
                self.protocol.snapshot_msg(peer, *msg, now, &mut self.links)
            }
            Inbound::Snapshot(snap) => {
                self.protocol.snapshot_persisted(*snap);
                Ok(())
            }
            Inbound::Admin(change, reply) => {
                let ticket = self.links.next_ticket;
                self.links.next_ticket += 1;
                self.links.tickets.insert(ticket, reply);
                self.protocol.admin(ticket, change, &mut self.links)
            }
            Inbound::PeerListens { peer, addr } => {
                self.protocol.peer_listens(peer, addr, &mut self.links);
                Ok(())
            }
            Inbound::PeerRepaired { peer } => self.protocol.peer_repaired(peer),
            // The turn this ends looks at the pipeline again.
            Inbound::Applied => Ok(()),
        }
    }
}

impl ProtocolIo for Links {
    fn send(&mut self, msg: Message) -> bool {
        self.senders.get(&msg.to).is_some_and(|p| p.send(msg))
    }

    fn send_snapshot(&mut self, to: u64, msg: SnapMsg) -> bool {
        let bytes = msg.weight();
        let sent = self.senders.get(&to).is_some_and(|p| p.send_snapshot(msg));
        if sent && bytes > 0 {
            self.metrics.snapshots.transfer_bytes(true, bytes);
        }
        sent
    }

    fn transfer_refused(&mut self, peer: u64, why: &str) {
        self.metrics.snapshots.transfer_refused();
        psmr_model::warn_limited!(REFUSED, peer, "refused a snapshot transfer message: {why}");
    }

    fn apply(&mut self, work: Apply) -> bool {
        self.decisions.send(Decision::Apply(work)).is_ok()
    }

    fn tell(&mut self, client: u64, msg: ServerMsg) {
        self.router.send(client, Outgoing::Msg(msg));
    }

    fn membership(&mut self, membership: &Membership, peers: &BTreeMap<u64, SocketAddr>) {
        self.view.set_membership(membership);
        self.senders.retain(|peer, _| peers.contains_key(peer));
        for (&peer, &addr) in peers {
            if self.senders.contains_key(&peer) {
                continue;
            }
            match psmr_transport::peer::spawn_sender(&self.peers, peer, addr, self.tls.clone()) {
                Ok(sender) => {
                    self.senders.insert(peer, sender);
                }
                Err(e) => warn!(peer, "cannot start a sender: {e}"),
            }
        }
    }

    fn answer(&mut self, ticket: u64, msg: ServerMsg) {
        if let Some(reply) = self.tickets.remove(&ticket) {
            let _ = reply.send(msg);
        }
    }

    fn refused(&mut self, msg: &Message, why: &Refusal) {
        self.counters.peer_refused.fetch_add(1, Ordering::Relaxed);
        self.metrics.peer_refused(why.rule);
        let (peer, kind) = (msg.from, msg.get_msg_type());
        psmr_model::warn_limited!(REFUSED, peer, kind = ?kind, "refused a raft message: {why}");
    }

    fn proposed(&mut self, commands: u64, bytes: usize) {
        let counters = &self.counters;
        counters.entries_proposed.fetch_add(1, Ordering::Relaxed);
        counters.commands_proposed.fetch_add(commands, Ordering::Relaxed);
        self.metrics.entry_proposed(commands, bytes);
    }

    fn read_round(&mut self, reads: usize) {
        self.metrics.read_round_requests.observe(reads as u64);
    }

    fn clock_entry_proposed(&mut self) {
        self.metrics.read_clock_entries.inc();
    }
}
