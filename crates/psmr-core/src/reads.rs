//! Linearizable reads without a log entry: raft's ReadIndex (Raft thesis
//! §6.4), kept by the protocol thread of the leader.
//!
//! A request whose commands all only read (the application's
//! [`psmr_model::App::access`] names no key written) skips the log:
//!
//! 1. Every read waiting starts one round together: one `read_index` call,
//!    one heartbeat to the followers, whatever the number of reads. Rounds
//!    overlap (at most `pipeline` in flight, as entries do): reads that
//!    arrive while one is in flight start the next at once.
//! 2. When a majority has answered the heartbeat, raft hands back the
//!    commit index of the moment the round started (a [`raft::ReadState`]).
//!    No leader elected later can have committed anything this one did not
//!    know of then, so state at that index or later is fresh enough for
//!    every read of the round.
//! 3. The reads go to the service manager once the entry at that index
//!    (or at the round's floor, below) is applied. The manager hands them
//!    to the scheduler as one batch after the entries applied so far: the
//!    scheduler orders them after every earlier conflicting write, so each
//!    read sees everything committed before it was issued.
//!
//! Per-client order: a client may pipeline requests, and each must see
//! its earlier ones and none of its later ones, as through the log.
//! * A write before the read: a read of a client with a request still in
//!   the batcher takes the log with it, and every round also waits for the
//!   last entry the leader had appended when it started (its *floor*), so
//!   it sees every write proposed before.
//! * A write after the read: while a client has reads held here, its later
//!   requests wait here too (*deferred*), and go on, in order, once its
//!   reads are handed to the manager. Their entries then come after the
//!   reads in the manager's queue.
//!
//! Rounds can be lost (a heartbeat answer dropped, a leader that steps
//! down): the oldest round, unanswered for an election timeout, starts
//! again under a new context, and a leader that steps down sends every read it holds to
//! the new leader. Reads hold their request's place in the request queue
//! until they are handed to the manager, so the queue's bound covers them.

use crate::request::Request;
use std::collections::{HashMap, VecDeque};

/// The round in flight.
struct Round {
    /// Its context, as given to raft.
    ctx: u64,
    /// The last log index when it started.
    floor: u64,
    /// The tick it started at.
    started: u64,
    reads: Vec<Request>,
}

/// The reads a leader holds, from arrival until they may execute.
#[derive(Default)]
pub(crate) struct Reads {
    waiting: Vec<Request>,
    /// Rounds in flight, oldest first.
    rounds: VecDeque<Round>,
    /// Answered rounds: the applied index each waits for, in rising order.
    answered: VecDeque<(u64, Vec<Request>)>,
    next_ctx: u64,
    /// Reads held per client.
    held: HashMap<u64, usize>,
    /// Later requests of clients with reads held, in arrival order.
    deferred: Vec<Request>,
}

impl Reads {
    /// Takes request `r`: holds it (a read for the next round, or a
    /// request that must wait for its client's reads), or gives it back
    /// for the log. `read` says whether it may skip the log: it only reads,
    /// and no earlier request of its client waits in the batcher.
    pub(crate) fn take(&mut self, r: Request, read: bool) -> Option<Request> {
        let deferred = self.deferred.iter().any(|d| d.client == r.client);
        if deferred || (!read && self.held.contains_key(&r.client)) {
            self.deferred.push(r);
            return None;
        }
        self.admit(r, read)
    }

    /// Like [`Reads::take`], for a request [`Reads::next_released`] gave
    /// back: it goes before its client's other deferred requests.
    pub(crate) fn admit(&mut self, r: Request, read: bool) -> Option<Request> {
        if !read {
            return Some(r);
        }
        *self.held.entry(r.client).or_default() += 1;
        self.waiting.push(r);
        None
    }

    /// The first deferred request whose client no longer has reads held:
    /// a client's deferred requests come back in their order, and each
    /// goes before anything newer of its client.
    pub(crate) fn next_released(&mut self) -> Option<Request> {
        let i = self.deferred.iter().position(|r| !self.held.contains_key(&r.client))?;
        Some(self.deferred.remove(i))
    }

    /// Requests held, reads and deferred ones.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.held.values().sum::<usize>() + self.deferred.len()
    }

    fn release(&mut self, reads: &[Request]) {
        for r in reads {
            if let Some(n) = self.held.get_mut(&r.client) {
                *n -= 1;
                if *n == 0 {
                    self.held.remove(&r.client);
                }
            }
        }
    }

    /// Starts the oldest round in flight again (new context, waiting reads
    /// added) if it has gone unanswered since `tick - timeout`; or else a
    /// round with every waiting read, if fewer than `in_flight` are in
    /// flight. `last_index` is the leader's last log index. Returns the
    /// context to give raft.
    pub(crate) fn start(&mut self, last_index: u64, tick: u64, timeout: u64, in_flight: usize) -> Option<Vec<u8>> {
        let stale = self.rounds.front().is_some_and(|r| tick.saturating_sub(r.started) >= timeout);
        let mut reads = if stale {
            self.rounds.pop_front().map(|r| r.reads).unwrap_or_default()
        } else if self.waiting.is_empty() || self.rounds.len() >= in_flight {
            return None;
        } else {
            Vec::new()
        };
        reads.append(&mut self.waiting);
        self.next_ctx += 1;
        let ctx = self.next_ctx;
        self.rounds.push_back(Round { ctx, floor: last_index, started: tick, reads });
        Some(ctx.to_le_bytes().to_vec())
    }

    /// Raft answered the round with context `ctx`: its reads may execute
    /// once `index` is applied. Contexts of rounds started again, or of
    /// another leadership, are ignored. Returns the reads of the round.
    pub(crate) fn answered(&mut self, ctx: &[u8], index: u64) -> usize {
        let Some(i) = self.rounds.iter().position(|r| ctx == r.ctx.to_le_bytes()) else {
            return 0;
        };
        let Some(round) = self.rounds.remove(i) else { return 0 };
        let reads = round.reads.len();
        let at = index.max(round.floor);
        // Commit indexes only grow within a leadership, and floors too;
        // keep the queue ordered regardless.
        let at = self.answered.back().map_or(at, |(last, _)| at.max(*last));
        self.answered.push_back((at, round.reads));
        reads
    }

    /// The reads whose index is applied (`applied`), in order.
    pub(crate) fn due(&mut self, applied: u64) -> Vec<Request> {
        let mut due = Vec::new();
        while self.answered.front().is_some_and(|(at, _)| *at <= applied) {
            due.extend(self.answered.pop_front().map(|(_, reads)| reads).unwrap_or_default());
        }
        self.release(&due);
        due
    }

    /// The applied index the first answered round waits for, if any.
    pub(crate) fn next_due(&self) -> Option<u64> {
        self.answered.front().map(|(at, _)| *at)
    }

    /// Every request held (the replica no longer leads).
    pub(crate) fn drain(&mut self) -> Vec<Request> {
        let mut all = std::mem::take(&mut self.waiting);
        all.extend(self.rounds.drain(..).flat_map(|r| r.reads));
        all.extend(self.answered.drain(..).flat_map(|(_, reads)| reads));
        all.append(&mut self.deferred);
        self.held.clear();
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(client: u64) -> Request {
        Request::new(client, 1, Vec::new(), 0, 0)
    }

    fn push(reads: &mut Reads, r: Request) {
        assert!(reads.take(r, true).is_none(), "a read is held");
    }

    fn clients(reads: &[Request]) -> Vec<u64> {
        reads.iter().map(|r| r.client).collect()
    }

    #[test]
    fn one_round_serves_every_read_waiting_and_later_ones_wait_for_the_next() {
        let mut reads = Reads::default();
        assert_eq!(reads.start(5, 0, 10, 1), None, "nothing to read");
        push(&mut reads, read(1));
        push(&mut reads, read(2));
        let ctx = reads.start(5, 0, 10, 1).expect("a round");
        push(&mut reads, read(3));
        assert_eq!(reads.start(5, 1, 10, 1), None, "one round in flight at most");
        reads.answered(&ctx, 4);
        assert_eq!(reads.next_due(), Some(5), "the floor (the last index at the start) wins");
        assert!(reads.due(4).is_empty());
        assert_eq!(clients(&reads.due(5)), vec![1, 2]);
        let ctx = reads.start(9, 2, 10, 1).expect("the next round");
        reads.answered(&ctx, 12);
        assert_eq!(reads.next_due(), Some(12), "the commit index wins");
        assert_eq!(clients(&reads.due(20)), vec![3]);
        assert_eq!(reads.len(), 0);
    }

    #[test]
    fn rounds_overlap_up_to_the_bound_and_each_answer_frees_its_own() {
        let mut reads = Reads::default();
        push(&mut reads, read(1));
        let a = reads.start(5, 0, 10, 2).expect("a first round");
        push(&mut reads, read(2));
        let b = reads.start(6, 0, 10, 2).expect("a second one while the first is in flight");
        push(&mut reads, read(3));
        assert_eq!(reads.start(6, 0, 10, 2), None, "two in flight at most");
        reads.answered(&b, 6);
        assert_eq!(clients(&reads.due(6)), vec![2], "the second round's read, without waiting for the first");
        let c = reads.start(7, 1, 10, 2).expect("room again");
        reads.answered(&a, 5);
        reads.answered(&c, 7);
        assert_eq!(reads.next_due(), Some(5));
        assert_eq!(clients(&reads.due(7)), vec![1, 3]);
    }

    #[test]
    fn an_unanswered_round_starts_again_and_its_old_answer_is_ignored() {
        let mut reads = Reads::default();
        push(&mut reads, read(1));
        let old = reads.start(3, 0, 10, 1).unwrap();
        push(&mut reads, read(2));
        assert_eq!(reads.start(3, 9, 10, 1), None, "not yet stale");
        let new = reads.start(4, 10, 10, 1).expect("started again");
        assert_ne!(old, new);
        reads.answered(&old, 3);
        assert_eq!(reads.next_due(), None, "the old context is gone");
        reads.answered(&new, 3);
        assert_eq!(clients(&reads.due(4)), vec![1, 2], "the old round's reads and the waiting ones");
    }

    #[test]
    fn a_deposed_leader_gives_back_every_read() {
        let mut reads = Reads::default();
        push(&mut reads, read(1));
        let ctx = reads.start(1, 0, 10, 1).unwrap();
        reads.answered(&ctx, 7);
        push(&mut reads, read(2));
        reads.start(1, 1, 10, 1).unwrap();
        push(&mut reads, read(3));
        assert_eq!(reads.len(), 3);
        let mut all = clients(&reads.drain());
        all.sort_unstable();
        assert_eq!(all, vec![1, 2, 3]);
        assert_eq!((reads.len(), reads.next_due()), (0, None));
    }

    #[test]
    fn answered_rounds_leave_in_order() {
        let mut reads = Reads::default();
        push(&mut reads, read(1));
        let a = reads.start(8, 0, 10, 1).unwrap();
        reads.answered(&a, 8);
        push(&mut reads, read(2));
        let b = reads.start(2, 1, 10, 1).unwrap();
        reads.answered(&b, 6);
        assert!(reads.due(7).is_empty(), "a later round never overtakes an earlier one");
        assert_eq!(clients(&reads.due(8)), vec![1, 2]);
    }

    #[test]
    fn later_requests_of_a_client_wait_for_its_reads_in_order() {
        let mut reads = Reads::default();
        push(&mut reads, read(1));
        let ctx = reads.start(3, 0, 10, 1).unwrap();
        let write = |client| Request::new(client, 1, vec![9], 1, 0);
        assert!(reads.take(write(2), false).is_some(), "another client's write goes to the log at once");
        assert!(reads.take(write(1), false).is_none(), "client 1's write waits for its read");
        assert!(reads.take(read(1), true).is_none(), "and so does its read after that write");
        assert_eq!(reads.len(), 3);
        assert!(reads.next_released().is_none(), "client 1 still has a read held");
        reads.answered(&ctx, 3);
        assert_eq!(clients(&reads.due(3)), vec![1]);
        assert!(reads.take(write(1), false).is_none(), "a new request goes behind the deferred ones");
        let mut back = Vec::new();
        while let Some(r) = reads.next_released() {
            let read = r.bytes == 0;
            back.push(read);
            if let Some(w) = reads.admit(r, read) {
                assert_eq!(w.bytes, 1, "the log gets the writes");
            }
        }
        assert_eq!(back, vec![false, true], "the deferred write, then the read, whose client then has it held again");
        assert_eq!(reads.len(), 2, "the read, and the newest write behind it");
    }
}
