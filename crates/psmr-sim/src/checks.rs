//! The invariants checked while a simulation runs, and its trace.

use crate::outcome::{Violation, ViolationKind};
use psmr_core::guard::{Refusal, Rule};
use psmr_model::{Digest, StableHasher};
use std::collections::{BTreeMap, HashMap};
use std::hash::Hasher;

/// Where a command executed in the log: the entry's index, and its place
/// among the commands admitted from it.
type Place = (u64, u64);

/// Violations kept per run: the first ones say what went wrong, the rest
/// are mostly consequences.
const VIOLATIONS_KEPT: usize = 16;

/// What every replica applied, compared as it happens.
#[derive(Default)]
pub(crate) struct Checks {
    /// Per log index, the (term, digest of data) of the entry the first
    /// replica to apply it applied: every other replica must apply the
    /// same (the applied entries of all replicas are prefixes of one
    /// sequence).
    entries: Vec<Option<(u64, u64)>>,
    /// Per log index, the latest stamp (ms) of the entries up to it.
    stamps: Vec<Option<u64>>,
    /// Per log index, the state digest after applying it.
    digests: Vec<Option<Digest>>,
    /// Per write (client, seq), the log index at which it executed: a
    /// write executes at one index at most (exactly-once).
    executed: HashMap<(u64, u64), u64>,
    /// Per (client, seq), where in the log it first executed: the entry's
    /// index, and its place among the commands admitted from that entry
    /// (the same on every replica: admission follows the replicated reply
    /// cache). See [`Checks::client_order`].
    first: HashMap<(u64, u64), Place>,
    /// Per replica, the entry it admits commands from and how many so far.
    admitting: HashMap<u64, Place>,
    /// Raft messages the guard refused, by rule.
    pub(crate) refused: BTreeMap<&'static str, u64>,
    pub(crate) violations: Vec<Violation>,
    /// Violations found, kept or not.
    pub(crate) found: u64,
    /// Commands answered from the reply cache (executed before).
    pub(crate) cache_answers: u64,
    /// Reads a leader served without the log.
    pub(crate) reads_without_log: u64,
    /// Snapshot chunks delivered.
    pub(crate) snapshot_chunks: u64,
    /// Snapshots from a leader restored.
    pub(crate) snapshots_installed: u64,
    /// Snapshot transfer messages refused.
    pub(crate) transfer_refusals: u64,
}

/// A digest of an entry's data.
pub(crate) fn data_hash(data: &[u8]) -> u64 {
    let mut h = StableHasher::new();
    h.write(data);
    h.finish()
}

fn slot<T: Clone>(v: &mut Vec<Option<T>>, index: u64) -> &mut Option<T> {
    let i = index as usize;
    if v.len() <= i {
        v.resize(i + 1, None);
    }
    &mut v[i]
}

impl Checks {
    pub(crate) fn violation(&mut self, kind: ViolationKind, description: String) {
        self.found += 1;
        if self.violations.len() < VIOLATIONS_KEPT {
            self.violations.push(Violation { kind, description });
        }
    }

    /// The highest index any replica applied.
    pub(crate) fn highest_applied(&self) -> u64 {
        self.entries.iter().rposition(Option::is_some).unwrap_or(0) as u64
    }

    /// Entry `index` carries stamp `stamp_ms` (0: none, as raft's own
    /// entries): never before a stamp of an entry before it, as far as the
    /// entries before it are known here.
    pub(crate) fn stamp(&mut self, index: u64, stamp_ms: u64) {
        let before = index.checked_sub(1).and_then(|i| self.stamps.get(i as usize).copied().flatten());
        if let Some(before) = before {
            if stamp_ms != 0 && stamp_ms < before {
                self.violation(
                    ViolationKind::StampBack,
                    format!("entry {index} is stamped {stamp_ms} ms, before {before} ms of an entry before it"),
                );
            }
        }
        *slot(&mut self.stamps, index) = Some(before.unwrap_or(0).max(stamp_ms));
    }

    /// Replica `replica` applies entry `index` of `term` with data digest
    /// `hash`.
    pub(crate) fn entry(&mut self, replica: u64, index: u64, term: u64, hash: u64) {
        match *slot(&mut self.entries, index) {
            Some((t, h)) if (t, h) != (term, hash) => self.violation(
                ViolationKind::Divergence,
                format!(
                    "replica {replica} applied entry {index} of term {term} (data {hash:016x}), \
                     another replica applied term {t} (data {h:016x}) there"
                ),
            ),
            Some(_) => {}
            ref mut empty => *empty = Some((term, hash)),
        }
    }

    /// Replica `replica`'s state after applying `index` (or restoring a
    /// snapshot taken there) has digest `digest`.
    pub(crate) fn state(&mut self, replica: u64, index: u64, digest: Digest) {
        match *slot(&mut self.digests, index) {
            Some(d) if d != digest => self.violation(
                ViolationKind::StateMismatch,
                format!("replica {replica}'s state at index {index} is {digest}, another replica's was {d}"),
            ),
            Some(_) => {}
            ref mut empty => *empty = Some(digest),
        }
    }

    /// Replica `replica` executed write `seq` of `client` at log `index`.
    pub(crate) fn executed(&mut self, replica: u64, client: u64, seq: u64, index: u64) {
        let earlier = *self.executed.entry((client, seq)).or_insert(index);
        if earlier != index {
            self.violation(
                ViolationKind::DoubleExecution,
                format!(
                    "write {seq} of client {client} executed at index {earlier} and again at {index} \
                     (replica {replica})"
                ),
            );
        }
    }

    /// Replica `replica` admitted command `seq` of `client` to execute
    /// from the log at `index`.
    pub(crate) fn admitted(&mut self, replica: u64, client: u64, seq: u64, index: u64) {
        let place = self.admitting.entry(replica).or_insert((index, 0));
        if place.0 != index {
            *place = (index, 0);
        }
        let at = *place;
        place.1 += 1;
        let first = self.first.entry((client, seq)).or_insert(at);
        *first = (*first).min(at);
    }

    /// Replica `replica` executed read `seq` of `client` without the log,
    /// after every entry up to `applied`: its place in the log's order is
    /// right after that entry.
    pub(crate) fn read_without_log(&mut self, replica: u64, client: u64, seq: u64, applied: u64) {
        let _ = replica;
        let at = (applied, u64::MAX);
        let first = self.first.entry((client, seq)).or_insert(at);
        *first = (*first).min(at);
    }

    /// Client order, judged at the end of a run against the history: a
    /// client's answered commands (`answered`) first executed in the log
    /// in the order of their sequence numbers. (A command its client gave
    /// up on may execute later than the ones after it: a copy still in
    /// flight. A read executed again for a retry changes nothing.)
    pub(crate) fn client_order(&mut self, answered: &std::collections::HashSet<(u64, u64)>) {
        let mut by_client: BTreeMap<u64, Vec<(u64, Place)>> = BTreeMap::new();
        for (&(client, seq), &at) in self.first.iter().filter(|(key, _)| answered.contains(key)) {
            by_client.entry(client).or_default().push((seq, at));
        }
        for (client, mut commands) in by_client {
            commands.sort_unstable();
            for pair in commands.windows(2) {
                let ((before, (i, k)), (seq, (j, l))) = (pair[0], pair[1]);
                if (j, l) < (i, k) {
                    self.violation(
                        ViolationKind::ClientOrder,
                        format!(
                            "command {seq} of client {client} executed at index {j} (its {l}th there), before its \
                             command {before} at index {i} (its {k}th)"
                        ),
                    );
                }
            }
        }
    }

    /// Replica `replica` restarted: it executes the log after its snapshot
    /// again.
    pub(crate) fn restarted(&mut self, replica: u64) {
        self.admitting.remove(&replica);
    }

    /// The guard of replica `replica` refused a message: a violation, as no
    /// honest replica sends what it refuses, but for a vote a repaired
    /// replica may not give.
    pub(crate) fn refused(&mut self, replica: u64, why: &Refusal, what: impl FnOnce() -> String) {
        *self.refused.entry(why.rule.label()).or_default() += 1;
        // A vote a repaired replica may not give: an honest candidate may
        // well ask for it.
        if why.rule == Rule::VoteFloor {
            return;
        }
        self.violation(ViolationKind::GuardRefusal, format!("replica {replica} refused {}: {why}", what()));
    }
}

/// The trace of a run: a hash of every event (always), and the events as
/// text (when asked for, to replay a seed).
pub(crate) struct Trace {
    hasher: StableHasher,
    lines: Option<Vec<String>>,
}

impl Trace {
    pub(crate) fn new(keep_lines: bool) -> Self {
        Self { hasher: StableHasher::new(), lines: keep_lines.then(Vec::new) }
    }

    /// Records an event at `now_us`: `words` go into the hash, `line` (made
    /// only when lines are kept) into the text.
    pub(crate) fn event(&mut self, now_us: u64, words: &[u64], line: impl FnOnce() -> String) {
        self.hasher.write_u64(now_us);
        for &w in words {
            self.hasher.write_u64(w);
        }
        if let Some(lines) = &mut self.lines {
            lines.push(format!("{:>10.3}ms {}", now_us as f64 / 1000.0, line()));
        }
    }

    pub(crate) fn hash(&self) -> u64 {
        self.hasher.finish()
    }

    pub(crate) fn take_lines(&mut self) -> Vec<String> {
        self.lines.take().unwrap_or_default()
    }
}
