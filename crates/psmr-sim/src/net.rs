//! The simulated network: who talks to whom, and what happens to a packet
//! on the way (loss, delay, duplication, reordering, cut links).

use crate::outcome::FaultCounts;
use psmr_core::transfer::SnapMsg;
use raft::prelude::Message;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use std::collections::{BTreeMap, BTreeSet};

/// An endpoint: a replica (by raft id) or a client (by client id).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Addr {
    Replica(u64),
    Client(u64),
}

impl std::fmt::Display for Addr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Addr::Replica(id) => write!(f, "r{id}"),
            Addr::Client(id) => write!(f, "c{id}"),
        }
    }
}

/// What a replica answers a client's command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Answer {
    /// Executed (now or earlier: the reply cache's copy); the encoded reply.
    Ok(Vec<u8>),
    /// Not executed, and it never will be under this sequence number.
    Rejected(String),
}

/// What travels.
#[derive(Clone, Debug)]
pub(crate) enum Payload {
    /// A raft message between replicas.
    Raft(Box<Message>),
    /// A message of a snapshot transfer between replicas.
    Snap(Box<SnapMsg>),
    /// A client's request: the sequence number of its first command, and
    /// its commands' encoded operations (numbered on from the first).
    Request { seq: u64, ops: Vec<Vec<u8>> },
    /// A replica's answer to command `seq`.
    Reply { seq: u64, answer: Answer },
    /// A replica that does not lead sends the client to the leader it
    /// knows (0: none).
    Redirect { leader: u64 },
}

/// One packet.
#[derive(Clone, Debug)]
pub(crate) struct Packet {
    pub from: Addr,
    pub to: Addr,
    pub payload: Payload,
}

/// A packet on its way between the incarnations of its ends of the moment
/// it was sent (0 for a client). Between replicas it travels on a
/// connection, which dies with either process: it is lost if the
/// recipient restarted meanwhile, and dropped if the sender did (its new
/// incarnation's connection replaced the old one, and a replica takes
/// nothing from a replaced connection).
#[derive(Clone, Debug)]
pub(crate) struct InFlight {
    pub packet: Packet,
    /// The recipient's incarnation.
    pub incarnation: u64,
    /// The sender's incarnation.
    pub from_incarnation: u64,
}

/// How the network behaves, drawn once per run from the seed (benign
/// values for the fault kinds that are off, and for the quiet phase).
#[derive(Clone, Debug)]
pub(crate) struct NetParams {
    /// Probability that a packet is lost.
    pub loss: f64,
    /// Probability that a packet arrives twice.
    pub duplicate: f64,
    /// Ordinary one-way delay, µs.
    pub delay_min_us: u64,
    /// Ordinary one-way delay, µs.
    pub delay_max_us: u64,
    /// Probability that a packet takes far longer.
    pub long_delay: f64,
    /// Longest of those delays, µs.
    pub long_delay_max_us: u64,
    /// Packets of one link arrive in the order they were sent (a TCP
    /// connection); false lets later packets overtake earlier ones.
    pub fifo: bool,
}

impl NetParams {
    /// A network that only delays, in order.
    pub(crate) fn benign() -> Self {
        Self {
            loss: 0.0,
            duplicate: 0.0,
            delay_min_us: 200,
            delay_max_us: 1_500,
            long_delay: 0.0,
            long_delay_max_us: 0,
            fifo: true,
        }
    }
}

/// The network's state.
pub(crate) struct Net {
    pub params: NetParams,
    /// Directed replica links that drop every packet (a partition).
    cut: BTreeSet<(u64, u64)>,
    /// Latest arrival time scheduled per link, for FIFO links.
    last_arrival: BTreeMap<(Addr, Addr), u64>,
}

impl Net {
    pub(crate) fn new(params: NetParams) -> Self {
        Self { params, cut: BTreeSet::new(), last_arrival: BTreeMap::new() }
    }

    /// Whether the link from `from` to `to` is cut. Partitions separate
    /// replicas only: every client reaches every replica (so a client may
    /// well talk to a deposed leader on the minority side).
    pub(crate) fn is_cut(&self, from: Addr, to: Addr) -> bool {
        match (from, to) {
            (Addr::Replica(a), Addr::Replica(b)) => self.cut.contains(&(a, b)),
            _ => false,
        }
    }

    /// Cuts the directed link `a -> b`.
    pub(crate) fn cut(&mut self, a: u64, b: u64) {
        self.cut.insert((a, b));
    }

    /// Whether any link is cut.
    pub(crate) fn partitioned(&self) -> bool {
        !self.cut.is_empty()
    }

    /// Restores every link.
    pub(crate) fn heal(&mut self) {
        self.cut.clear();
    }

    /// The arrival times of a packet sent now from `from` to `to`: none if
    /// it is lost, two if it is duplicated.
    pub(crate) fn route(
        &mut self,
        now: u64,
        from: Addr,
        to: Addr,
        rng: &mut ChaCha8Rng,
        counts: &mut FaultCounts,
    ) -> Vec<u64> {
        if self.is_cut(from, to) {
            counts.cut += 1;
            return Vec::new();
        }
        let p = &self.params;
        if p.loss > 0.0 && rng.gen_bool(p.loss) {
            counts.lost += 1;
            return Vec::new();
        }
        let copies = if p.duplicate > 0.0 && rng.gen_bool(p.duplicate) {
            counts.duplicated += 1;
            2
        } else {
            1
        };
        let mut times = Vec::with_capacity(copies);
        for _ in 0..copies {
            let mut delay = rng.gen_range(p.delay_min_us..=p.delay_max_us);
            if p.long_delay > 0.0 && rng.gen_bool(p.long_delay) {
                counts.delayed += 1;
                delay += rng.gen_range(0..=p.long_delay_max_us);
            }
            let mut at = now + delay;
            if p.fifo {
                let last = self.last_arrival.entry((from, to)).or_insert(0);
                at = at.max(*last + 1);
                *last = at;
            }
            times.push(at);
        }
        times
    }
}
