//! Simulated clients of the key-value store: one request outstanding at a
//! time, of one to [`REQUEST_COMMANDS_MAX`] commands (a client batch, as
//! psmr's client library sends), sent to the replica believed to lead,
//! retried with the same sequence numbers elsewhere on a timeout or a
//! redirect, abandoned after a while.

use crate::net::{Addr, Answer, Packet, Payload};
use crate::outcome::{OpKind, OpResult, OpStatus, SimOp};
use psmr_model::wire::OpCodec;
use psmr_services::kv::{key_bytes, Deadline, ExpireCond, KvCodec, KvOp, KvReply, SetCmd, SetWhen, Ttl, TtlCmd};
use rand::Rng;
use rand_chacha::ChaCha8Rng;

/// How long a client waits for an answer before it tries another replica, µs.
pub(crate) const ATTEMPT_TIMEOUT_US: u64 = 60_000;
/// Attempts before a client gives up on a request (its writes are then
/// `unknown`, its reads `fail`: they had no effect either way).
pub const ATTEMPTS_MAX: u32 = 16;
/// Wait before retrying when a replica knows no leader, µs.
const NO_LEADER_BACKOFF_US: u64 = 15_000;
/// Longest pause between two requests of a client, µs.
const THINK_MAX_US: u64 = 8_000;
/// Most commands in one request.
pub(crate) const REQUEST_COMMANDS_MAX: u64 = 3;

/// The request a client waits for.
pub(crate) struct Outstanding {
    /// The first command's sequence number; the others follow.
    pub seq: u64,
    ops: Vec<Vec<u8>>,
    /// Its commands' operations in the history, in order (`None`: a side
    /// command the history does not check, [`side_op`]).
    history: Vec<Option<usize>>,
    /// Which commands are answered.
    done: Vec<bool>,
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
    /// The chance that a command of its is a write: clients differ, from
    /// write-heavy to nearly read-only, as an application's do.
    writes: f64,
    next_seq: u64,
    /// The replica it believes leads (0: none known).
    leader: u64,
    pub current: Option<Outstanding>,
}

/// The share of requests that carry a side command besides their checked
/// reads and writes.
const SIDE_SHARE: f64 = 0.3;

/// A side command: on keys of their own (`ttl:N`, `set:N`), commands whose
/// outcome depends on the log's clock and seed (deadlines a few ms to a
/// few hundred ms away, keys expiring in the middle of the run, random
/// pops and draws). The history does not check their replies; the
/// replicas' equal states do: a replica that saw another time or seed
/// than the others would diverge.
fn side_op(rng: &mut ChaCha8Rng) -> KvOp {
    let n = rng.gen_range(0..4);
    let (key, set) = (format!("ttl:{n}").into_bytes(), format!("set:{n}").into_bytes());
    match rng.gen_range(0..7) {
        0 | 1 => KvOp::Set {
            key,
            value: b"v".to_vec(),
            when: SetWhen::Always,
            get: false,
            ttl: Ttl::Expire(Deadline::In(rng.gen_range(1..300))),
        },
        2 => KvOp::Expire {
            key,
            deadline: Deadline::In(rng.gen_range(-5..200)),
            cond: ExpireCond::Always,
            cmd: TtlCmd::PExpire,
        },
        3 => KvOp::Incr { key, by: 1 },
        4 => KvOp::Members { key: set, cmd: SetCmd::Add(vec![vec![rng.gen_range(b'a'..b'h')]; 2]) },
        5 => KvOp::Members { key: set, cmd: SetCmd::Pop(Some(rng.gen_range(0..3))) },
        _ => KvOp::RandomKey,
    }
}

/// The value a write of client `client`'s command `seq` writes: unique in
/// the run.
fn unique_value(client: u64, seq: u64) -> u64 {
    client << 32 | seq
}

impl Client {
    pub(crate) fn new(id: u64, writes: f64) -> Self {
        Self { id, writes, next_seq: 1, leader: 0, current: None }
    }

    /// Issues a new request: one to a few reads or writes of `keys` keys
    /// (every write's value unique), to the replica believed to lead.
    pub(crate) fn issue(&mut self, keys: u64, env: &mut ClientEnv<'_>) -> Vec<Action> {
        debug_assert!(self.current.is_none(), "one request outstanding at a time");
        let n = if env.rng.gen_bool(0.25) { env.rng.gen_range(2..=REQUEST_COMMANDS_MAX) } else { 1 };
        let seq = self.next_seq;
        self.next_seq += n;
        let (mut ops, mut history) = (Vec::new(), Vec::new());
        for s in seq..seq + n {
            let key = env.rng.gen_range(0..keys);
            let write = env.rng.gen_bool(self.writes);
            let value = write.then(|| unique_value(self.id, s));
            let op = match value {
                Some(v) => KvOp::Put { key: key_bytes(key), value: v.to_string().into_bytes() },
                None => KvOp::Read { key: key_bytes(key) },
            };
            ops.push(KvCodec.encode_op(&op));
            let kind = if write { OpKind::Write } else { OpKind::Read };
            history.push(Some(env.history.len()));
            env.history.push(SimOp {
                client: self.id,
                seq: s,
                kind,
                key,
                value,
                result: None,
                invoke_us: env.now,
                complete_us: 0,
                status: OpStatus::Unknown,
            });
        }
        if env.rng.gen_bool(SIDE_SHARE) {
            ops.push(KvCodec.encode_op(&side_op(env.rng)));
            history.push(None);
            self.next_seq += 1;
        }
        if self.leader == 0 {
            self.leader = env.replicas[env.rng.gen_range(0..env.replicas.len())];
        }
        let done = vec![false; ops.len()];
        self.current = Some(Outstanding { seq, ops, history, done, attempts: 0 });
        self.attempt(env.now, self.leader)
    }

    /// Sends the outstanding request to replica `to`, with a timeout.
    fn attempt(&mut self, now: u64, to: u64) -> Vec<Action> {
        let Some(cur) = &mut self.current else { return Vec::new() };
        cur.attempts += 1;
        let packet = Packet {
            from: Addr::Client(self.id),
            to: Addr::Replica(to),
            payload: Payload::Request { seq: cur.seq, ops: cur.ops.clone() },
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
            for (&h, _) in cur.history.iter().zip(&cur.done).filter(|(_, &done)| !done) {
                let Some(h) = h else { continue };
                let op = &mut env.history[h];
                // A write may still execute later (a copy in flight, an
                // entry not yet committed): unknown. A read that never
                // answered had no effect: it failed.
                op.status = if op.kind == OpKind::Write { OpStatus::Unknown } else { OpStatus::Fail };
            }
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

    /// Replica `from` sends the client to `leader` (0: none known).
    pub(crate) fn redirect(&mut self, from: u64, leader: u64, env: &mut ClientEnv<'_>) -> Vec<Action> {
        let Some(cur) = &self.current else { return Vec::new() };
        if leader != 0 && leader != from {
            return self.retry(Some(leader), env);
        }
        // Nobody known to lead: wait a little, then try the next.
        self.leader = from;
        vec![Action::Timer { at: env.now + NO_LEADER_BACKOFF_US, seq: cur.seq, attempt: cur.attempts }]
    }

    /// An answer from replica `from` to command `seq`.
    pub(crate) fn answer(&mut self, from: u64, seq: u64, answer: Answer, env: &mut ClientEnv<'_>) -> Vec<Action> {
        let Some(cur) = &mut self.current else { return Vec::new() };
        let Some(i) = seq.checked_sub(cur.seq).map(|i| i as usize).filter(|&i| i < cur.done.len()) else {
            // An answer to an earlier request, already done.
            return Vec::new();
        };
        if cur.done[i] {
            return Vec::new();
        }
        cur.done[i] = true;
        let op = cur.history[i].map(|h| &mut env.history[h]);
        match (answer, op) {
            (_, None) => {}
            (Answer::Ok(bytes), Some(op)) => {
                op.result = Some(result(op.kind, &bytes));
                op.status = OpStatus::Ok;
                op.complete_us = env.now;
            }
            // Not executed under this number. (A write refused as stale
            // could have executed under an earlier attempt only if the
            // cache forgot it, which its window rules out for the one
            // request outstanding; stay conservative anyway.)
            (Answer::Rejected(_), Some(op)) => {
                op.status = if op.kind == OpKind::Write { OpStatus::Unknown } else { OpStatus::Fail };
            }
        }
        if cur.done.iter().all(|&d| d) {
            self.leader = from;
            self.current = None;
            return self.next(env);
        }
        Vec::new()
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

/// What an encoded reply says about an operation of `kind`.
fn result(kind: OpKind, bytes: &[u8]) -> OpResult {
    let number = |v: &[u8]| std::str::from_utf8(v).ok().and_then(|s| s.parse::<u64>().ok());
    match (kind, KvCodec.decode_reply(bytes)) {
        (OpKind::Read, Ok(KvReply::Value(None))) => OpResult::Read(None),
        (OpKind::Read, Ok(KvReply::Value(Some(v)))) => {
            number(&v).map_or(OpResult::Garbled, |n| OpResult::Read(Some(n)))
        }
        (OpKind::Write, Ok(KvReply::Done(existed))) => OpResult::Write(existed),
        // A reply of the wrong shape: recorded as an impossible result,
        // for the checker to find.
        _ => OpResult::Garbled,
    }
}
