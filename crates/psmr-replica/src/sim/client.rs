//! Simulated clients: one request outstanding at a time, sent to the
//! replica believed to lead, retried with the same sequence number
//! elsewhere on a timeout or a redirect, abandoned after a while.

use super::net::{Addr, Answer, Packet, Payload};
use super::service::{RegOp, RegReply};
use super::{OpKind, OpResult, OpStatus, SimOp};
use psmr_model::wire::OpCodec;
use psmr_model::SerdeCodec;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

/// How long a client waits for an answer before it tries another replica, µs.
pub(crate) const ATTEMPT_TIMEOUT_US: u64 = 60_000;
/// Attempts before a client gives up on a request (a write is then
/// `unknown`, a read `fail`: it had no effect either way).
pub const ATTEMPTS_MAX: u32 = 16;
/// Wait before retrying when a replica knows no leader, µs.
const NO_LEADER_BACKOFF_US: u64 = 15_000;
/// Longest pause between two requests of a client, µs.
const THINK_MAX_US: u64 = 8_000;

/// The request a client waits for.
pub(crate) struct Outstanding {
    pub seq: u64,
    op: Vec<u8>,
    /// Its operation in the history.
    history: usize,
    pub attempts: u32,
}

/// What a client asks the world to do.
pub(crate) enum Action {
    Send(Packet),
    /// Wake the client at this time for attempt `attempt` of `seq` (a
    /// timeout, or a retry after a redirect to nowhere).
    Timer {
        at: u64,
        seq: u64,
        attempt: u32,
    },
    /// Issue the next request at this time.
    IssueAt(u64),
}

/// What a client needs from the world while it works.
pub(crate) struct ClientEnv<'a> {
    pub now: u64,
    /// The replicas' ids.
    pub replicas: &'a [u64],
    pub rng: &'a mut ChaCha8Rng,
    pub history: &'a mut Vec<SimOp>,
    /// The load goes on: issue a next request when one is done.
    pub active: bool,
}

/// A client.
pub(crate) struct Client {
    pub id: u64,
    next_seq: u64,
    /// The replica it believes leads (0: none known).
    leader: u64,
    pub current: Option<Outstanding>,
    codec: SerdeCodec<RegOp, RegReply>,
}

impl Client {
    pub(crate) fn new(id: u64) -> Self {
        Self { id, next_seq: 1, leader: 0, current: None, codec: SerdeCodec::new() }
    }

    /// Issues a new request: a read or a write of one of `keys` keys (every
    /// write value unique), to the replica believed to lead.
    pub(crate) fn issue(&mut self, keys: u64, env: &mut ClientEnv<'_>) -> Vec<Action> {
        debug_assert!(self.current.is_none(), "one request outstanding at a time");
        let seq = self.next_seq;
        self.next_seq += 1;
        let key = env.rng.gen_range(0..keys);
        let op =
            if env.rng.gen_bool(0.5) { RegOp::Write { key, value: self.id << 32 | seq } } else { RegOp::Read { key } };
        let (kind, value) = match op {
            RegOp::Read { .. } => (OpKind::Read, None),
            RegOp::Write { value, .. } => (OpKind::Write, Some(value)),
        };
        env.history.push(SimOp {
            client: self.id,
            seq,
            kind,
            key,
            value,
            result: None,
            invoke_us: env.now,
            complete_us: 0,
            status: OpStatus::Unknown,
        });
        if self.leader == 0 {
            self.leader = env.replicas[env.rng.gen_range(0..env.replicas.len())];
        }
        let history = env.history.len() - 1;
        self.current = Some(Outstanding { seq, op: self.codec.encode_op(&op), history, attempts: 0 });
        self.attempt(env.now, self.leader)
    }

    /// Sends the outstanding request to replica `to`, with a timeout.
    fn attempt(&mut self, now: u64, to: u64) -> Vec<Action> {
        let Some(cur) = &mut self.current else { return Vec::new() };
        cur.attempts += 1;
        let packet = Packet {
            from: Addr::Client(self.id),
            to: Addr::Replica(to),
            payload: Payload::Request { seq: cur.seq, op: cur.op.clone() },
        };
        vec![Action::Send(packet), Action::Timer { at: now + ATTEMPT_TIMEOUT_US, seq: cur.seq, attempt: cur.attempts }]
    }

    /// The replica after `r` in `replicas`, round robin.
    fn next_replica(r: u64, replicas: &[u64], rng: &mut ChaCha8Rng) -> u64 {
        match replicas.iter().position(|&x| x == r) {
            Some(i) => replicas[(i + 1) % replicas.len()],
            None => replicas[rng.gen_range(0..replicas.len())],
        }
    }

    /// Gives up on the outstanding request, or tries again: `to` if given,
    /// else the next replica.
    fn retry(&mut self, to: Option<u64>, env: &mut ClientEnv<'_>) -> Vec<Action> {
        let Some(cur) = &self.current else { return Vec::new() };
        if cur.attempts >= ATTEMPTS_MAX {
            let op = &mut env.history[cur.history];
            // A write may still execute later (a copy in flight, an entry
            // not yet committed): unknown. A read that never answered had
            // no effect: it failed.
            op.status = if op.kind == OpKind::Write { OpStatus::Unknown } else { OpStatus::Fail };
            self.current = None;
            self.leader = 0;
            return self.next(env);
        }
        let to = to.unwrap_or_else(|| Self::next_replica(self.leader, env.replicas, env.rng));
        self.leader = to;
        self.attempt(env.now, to)
    }

    /// A timer of attempt `attempt` of request `seq` fired.
    pub(crate) fn timer(&mut self, seq: u64, attempt: u32, env: &mut ClientEnv<'_>) -> Vec<Action> {
        match &self.current {
            Some(cur) if cur.seq == seq && cur.attempts == attempt => self.retry(None, env),
            _ => Vec::new(),
        }
    }

    /// An answer from replica `from` to request `seq`.
    pub(crate) fn answer(&mut self, from: u64, seq: u64, answer: Answer, env: &mut ClientEnv<'_>) -> Vec<Action> {
        let Some(cur) = &self.current else { return Vec::new() };
        if cur.seq != seq {
            // An answer to an earlier attempt of a request already done.
            return Vec::new();
        }
        let now = env.now;
        let op = &mut env.history[cur.history];
        match answer {
            Answer::Ok(bytes) => {
                op.result = Some(match self.codec.decode_reply(&bytes) {
                    Ok(RegReply::Value(v)) if op.kind == OpKind::Read => OpResult::Read(v),
                    Ok(RegReply::Written { existed }) if op.kind == OpKind::Write => OpResult::Write(existed),
                    // A reply of the wrong shape: recorded as an impossible
                    // result, for the checker to find.
                    _ => OpResult::Garbled,
                });
                op.status = OpStatus::Ok;
                op.complete_us = now;
                self.leader = from;
                self.current = None;
                self.next(env)
            }
            Answer::Rejected(_) => {
                // Not executed under this number. (A write refused as stale
                // could have executed under an earlier attempt only if the
                // cache forgot it, which its window rules out for the one
                // request outstanding; stay conservative anyway.)
                op.status = if op.kind == OpKind::Write { OpStatus::Unknown } else { OpStatus::Fail };
                self.current = None;
                self.next(env)
            }
            Answer::Redirect(leader) if leader != 0 && leader != from => self.retry(Some(leader), env),
            Answer::Redirect(_) => {
                // Nobody known to lead: wait a little, then try the next.
                self.leader = from;
                let attempt = cur.attempts;
                vec![Action::Timer { at: now + NO_LEADER_BACKOFF_US, seq, attempt }]
            }
        }
    }

    /// After a request is done: the next one after a pause, unless the
    /// load is over.
    fn next(&mut self, env: &mut ClientEnv<'_>) -> Vec<Action> {
        if env.active {
            vec![Action::IssueAt(env.now + env.rng.gen_range(0..=THINK_MAX_US))]
        } else {
            Vec::new()
        }
    }
}
