//! What the world writes into a run's trace: its drawn parameters, every
//! delivery, the clients' operations, the replicas' changes of role.

use super::World;
use crate::net::{Addr, Answer, Packet, Payload};
use psmr_core::transfer::SnapMsg;
use raft::StateRole;

/// A snapshot transfer message in a trace line (a chunk without its data).
fn describe(m: &SnapMsg) -> String {
    match m {
        SnapMsg::Offer(_) => "offer".into(),
        SnapMsg::Chunk { offset, data, .. } => format!("chunk of {} bytes at {offset}", data.len()),
        SnapMsg::Ack { next, resume, .. } => format!("ack {next}{}", if *resume { ", resume" } else { "" }),
        SnapMsg::Refuse { why, .. } => format!("refused: {why}"),
    }
}

fn addr_word(a: Addr) -> u64 {
    match a {
        Addr::Replica(id) => id,
        Addr::Client(id) => id << 8,
    }
}

fn answer_code(a: &Answer) -> u64 {
    match a {
        Answer::Ok(_) => 1,
        Answer::Rejected(_) => 2,
    }
}

impl World {
    /// The run's drawn parameters, at the top of the trace.
    pub(super) fn describe(&mut self) {
        let (seed, n, p) = (self.seed, self.nodes.len(), self.net.params.clone());
        let ticks: Vec<u64> = self.nodes.iter().map(|n| n.tick_us).collect();
        let r = &self.rates;
        let (crash, partition, full, damage) = (r.crash, r.partition, r.disk_full, r.damage);
        let c = &self.settings.config;
        let (every, window, delay, log_reads) =
            (c.snapshot_every, self.settings.cache.window, c.batch_delay_us, c.reads_through_log);
        let (faults, bug) = (self.config.faults, self.config.bug);
        self.trace.event(0, &[seed, n as u64], || {
            format!(
                "seed {seed}: {n} replicas, faults {faults}, bug {bug:?}; loss {:.3}, duplicate {:.3}, long delay \
                 {:.3}, fifo {}, delay {}-{} µs; crash rate {crash:.3}, partition rate {partition:.3}, disk-full \
                 rate {full:.3}, damage {damage:.3}; ticks {ticks:?} µs; snapshot every {every} entries; reply \
                 window {window}; batch delay {delay} µs; reads through the log: {log_reads}",
                p.loss, p.duplicate, p.long_delay, p.fifo, p.delay_min_us, p.delay_max_us
            )
        });
    }

    /// Traces a change of role or term of node `i`.
    pub(super) fn trace_role(&mut self, i: usize) {
        let node = &self.nodes[i];
        let role = node.view().map_or((StateRole::Follower, 0), |v| (v.role, v.term));
        if role == self.roles[i] {
            return;
        }
        self.roles[i] = role;
        if node.is_up() {
            self.stats.term = self.stats.term.max(role.1);
            let id = node.id;
            self.trace.event(self.now, &[0x201E, id, role.0 as u64, role.1], || {
                format!("r{id} is {:?} in term {}", role.0, role.1)
            });
        }
    }

    pub(super) fn trace_delivery(&mut self, p: &Packet) {
        let (from, to) = (p.from, p.to);
        match &p.payload {
            Payload::Raft(m) => {
                let words = [
                    1,
                    m.from,
                    m.to,
                    m.get_msg_type() as u64,
                    m.term,
                    m.index,
                    m.log_term,
                    m.commit,
                    m.entries.len() as u64,
                    u64::from(m.reject),
                    m.get_snapshot().get_metadata().index,
                ];
                self.trace.event(self.now, &words, || {
                    let mut line = format!(
                        "{to} <- {from} {:?} term {} index {} log term {} commit {}",
                        m.get_msg_type(),
                        m.term,
                        m.index,
                        m.log_term,
                        m.commit
                    );
                    if !m.entries.is_empty() {
                        let first = m.entries[0].index;
                        line += &format!(" entries {first}..={}", first + m.entries.len() as u64 - 1);
                    }
                    if m.reject {
                        line += &format!(" reject (hint {})", m.reject_hint);
                    }
                    if m.has_snapshot() {
                        line += &format!(" snapshot at {}", m.get_snapshot().get_metadata().index);
                    }
                    line
                });
            }
            Payload::Snap(m) => {
                let (kind, at, index) = match &**m {
                    SnapMsg::Offer(o) => (0, 0, o.get_snapshot().get_metadata().index),
                    SnapMsg::Chunk { id, offset, .. } => (1, *offset, id.index),
                    SnapMsg::Ack { id, next, .. } => (2, *next, id.index),
                    SnapMsg::Refuse { id, .. } => (3, 0, id.index),
                };
                self.trace.event(self.now, &[7, addr_word(from), addr_word(to), kind, at, index], || {
                    format!("{to} <- {from} snapshot transfer at {index}: {}", describe(m))
                });
            }
            Payload::Request { seq, ops } => {
                let (seq, n) = (*seq, ops.len() as u64);
                self.trace.event(self.now, &[2, addr_word(from), addr_word(to), seq, n], || {
                    format!("{to} <- {from} request {seq} ({n} commands)")
                });
            }
            Payload::Reply { seq, answer } => {
                let (seq, code) = (*seq, answer_code(answer));
                self.trace.event(self.now, &[3, addr_word(from), addr_word(to), seq, code], || {
                    format!("{to} <- {from} reply to {seq}: {answer:?}")
                });
            }
            Payload::Redirect { leader } => {
                let leader = *leader;
                self.trace.event(self.now, &[6, addr_word(from), addr_word(to), leader], || {
                    format!("{to} <- {from} redirect to r{leader}")
                });
            }
        }
    }

    /// Traces the operations issued since history index `from`.
    pub(super) fn trace_issue(&mut self, from: usize) {
        for op in &self.history[from..] {
            let c = op.client;
            self.trace.event(self.now, &[4, c, op.seq, op.key, op.value.unwrap_or(u64::MAX)], || {
                format!("c{c} invokes {} {:?} of key {} (value {:?})", op.seq, op.kind, op.key, op.value)
            });
        }
    }

    /// Traces the end of client `client`'s request that began with `seq`.
    pub(super) fn trace_done(&mut self, client: usize, seq: u64) {
        let c = self.clients[client].id;
        let ops: Vec<_> = self.history.iter().rev().filter(|o| o.client == c && o.seq >= seq).cloned().collect();
        for op in ops.into_iter().rev() {
            self.trace.event(self.now, &[5, c, op.seq, op.status as u64], || {
                format!("c{c} completes {}: {:?} {:?}", op.seq, op.status, op.result)
            });
        }
    }
}
