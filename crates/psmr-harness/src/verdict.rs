//! Judging a run by what its clients saw, as Jepsen does after its
//! nemesis: once the faults are over, a final read of every key that an
//! acknowledged update touched; the acknowledged updates those reads show
//! lost; whether the history, final reads included, is linearizable
//! ([`crate::history`]); and whether the replicas converged to one state.

use crate::history::{self, OpKind, Operation, Status, Verdict};
use crate::probe::Probe;
use psmr_client::{ClientConfig, Credentials, ServiceClient};
use psmr_services::kv::{KvCodec, KvOp, KvReply};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use thiserror::Error;

/// Keys per final read request.
const READ_BATCH: usize = 100;
/// Threads reading in parallel.
const READERS: usize = 8;

/// A run that cannot be judged.
#[derive(Debug, Error)]
pub enum VerdictError {
    /// A final read got no answer or a wrong one.
    #[error("the final read of key {key:?}: {reason}")]
    Read {
        /// The key.
        key: String,
        /// Why.
        reason: String,
    },
}

/// The judgement of a run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Judgement {
    /// Operations in the history.
    pub operations: usize,
    /// Keys read back at the end.
    pub keys_read: usize,
    /// Acknowledged updates the final reads show lost, one line each.
    pub lost: Vec<String>,
    /// `yes`; `no: ...` with the key and operations; or `undecided: ...`
    /// when the search gave up.
    pub linearizable: String,
    /// After the load, how long until every replica reported the same
    /// applied index and digest, ms; `None` if they did not within the
    /// wait.
    pub converged_ms: Option<u64>,
    /// Each replica's `id: applied digest` at the end.
    pub replicas: Vec<String>,
    /// What the expiry probe found, in a run that moved clocks
    /// ([`crate::clock::probe_ttl`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expiry: Option<crate::clock::TtlReport>,
}

impl Judgement {
    /// Nothing lost, linearizable, converged.
    pub fn passed(&self) -> bool {
        let expiry_held = self.expiry.as_ref().map_or(true, |r| r.violations.is_empty());
        self.lost.is_empty() && self.linearizable == "yes" && self.converged_ms.is_some() && expiry_held
    }
}

/// Judges a run of the cluster at `addrs` whose clients recorded
/// `history`: reads back every key an acknowledged update touched (as
/// `who`, on a cluster with users), checks the whole with at most
/// `max_states` per key, and waits up to `settle` for the replicas to
/// agree.
pub fn judge(
    (addrs, who): (&[SocketAddr], Option<&Credentials>),
    mut history: Vec<Operation>,
    max_states: usize,
    settle: Duration,
) -> Result<Judgement, VerdictError> {
    let (converged_ms, replicas) = converged(addrs, who, settle);
    let finals = final_reads(addrs, who, &history)?;
    let lost = lost_updates(&history, &finals);
    let operations = history.len();
    let keys_read = finals.len();
    history.extend(finals);
    let linearizable = match history::check_linearizable(&history, max_states) {
        Verdict::Linearizable => "yes".to_string(),
        Verdict::Violation { key, ops } => {
            let shown: Vec<String> = ops.iter().take(5).map(|&i| describe(&history[i])).collect();
            format!("no: key {key:?}, no order for {}", shown.join("; "))
        }
        Verdict::TooHard { key, states } => format!("undecided: key {key:?} after {states} states"),
    };
    Ok(Judgement { operations, keys_read, lost, linearizable, converged_ms, replicas, expiry: None })
}

fn describe(op: &Operation) -> String {
    let value = op.value.as_deref().map_or(String::new(), |v| format!(" {v}"));
    format!("client {} {:?}{value} -> {} ({:?})", op.client, op.op, op.result, op.status)
}

/// Waits up to `settle` until every replica at `addrs` reports the same
/// applied index and digest: how long it took (ms), and what each said
/// last.
pub fn converged(addrs: &[SocketAddr], who: Option<&Credentials>, settle: Duration) -> (Option<u64>, Vec<String>) {
    let start = Instant::now();
    let Ok(probe) = Probe::new(addrs) else { return (None, Vec::new()) };
    let probe = probe.as_user(who.cloned());
    loop {
        let statuses = probe.statuses(Duration::from_secs(1));
        let said: Vec<String> = statuses
            .iter()
            .map(|s| match s {
                Ok(s) => format!("{}: {} {}", s.id, s.applied, s.digest),
                Err(e) => format!("?: {e}"),
            })
            .collect();
        let answered: Vec<_> = statuses.iter().flatten().collect();
        let one = answered.len() == addrs.len()
            && answered.windows(2).all(|w| w[0].applied == w[1].applied && w[0].digest == w[1].digest);
        if one {
            return (Some(start.elapsed().as_millis() as u64), said);
        }
        if start.elapsed() >= settle {
            return (None, said);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Reads every key of `history` that an acknowledged update touched, in
/// parallel; the reads as operations of a client of their own, invoked
/// after everything in `history`.
pub fn final_reads(
    addrs: &[SocketAddr],
    who: Option<&Credentials>,
    history: &[Operation],
) -> Result<Vec<Operation>, VerdictError> {
    let keys: BTreeSet<&str> =
        history.iter().filter(|o| o.status == Status::Ok && o.op != OpKind::Read).map(|o| o.key.as_str()).collect();
    let keys: Vec<&str> = keys.into_iter().collect();
    let per = keys.len().div_ceil(READERS).max(1);
    let values: Vec<(String, Option<String>)> = std::thread::scope(|scope| {
        let readers: Vec<_> = keys.chunks(per).map(|part| scope.spawn(move || read_all(addrs, who, part))).collect();
        readers.into_iter().map(|r| r.join().unwrap_or_else(|_| Err(panicked()))).collect::<Result<Vec<_>, _>>()
    })?
    .into_iter()
    .flatten()
    .collect();
    let client = history.iter().map(|o| o.client).max().map_or(0, |c| c + 1);
    let after = history.iter().map(|o| o.invoke_ns.max(o.complete_ns)).max().unwrap_or(0) + 1;
    Ok(values
        .into_iter()
        .enumerate()
        .map(|(i, (key, value))| Operation {
            client,
            op: OpKind::Read,
            key,
            value: None,
            result: value.map_or(serde_json::Value::Null, Into::into),
            invoke_ns: after + 2 * i as u64,
            complete_ns: after + 2 * i as u64 + 1,
            status: Status::Ok,
        })
        .collect())
}

fn panicked() -> VerdictError {
    VerdictError::Read { key: String::new(), reason: "a reader panicked".into() }
}

/// Reads `keys` with one client, [`READ_BATCH`] per request.
fn read_all(
    addrs: &[SocketAddr],
    who: Option<&Credentials>,
    keys: &[&str],
) -> Result<Vec<(String, Option<String>)>, VerdictError> {
    let failed = |key: &str, reason: String| VerdictError::Read { key: key.to_string(), reason };
    let first = keys.first().copied().unwrap_or_default();
    let config = ClientConfig { credentials: who.cloned(), ..ClientConfig::new(addrs.to_vec()) };
    let mut client = ServiceClient::with_config(config, KvCodec).map_err(|e| failed(first, e.to_string()))?;
    let mut out = Vec::with_capacity(keys.len());
    for batch in keys.chunks(READ_BATCH) {
        let ops: Vec<KvOp> = batch.iter().map(|k| KvOp::Read { key: k.as_bytes().to_vec() }).collect();
        let replies = client.call_all(&ops).map_err(|e| failed(batch[0], e.to_string()))?;
        for (key, reply) in batch.iter().zip(replies) {
            let value = match reply {
                Ok(KvReply::Value(v)) => v.map(|v| String::from_utf8_lossy(&v).into_owned()),
                other => return Err(failed(key, format!("{other:?}"))),
            };
            out.push((key.to_string(), value));
        }
    }
    Ok(out)
}

/// The acknowledged updates of `history` that the final reads `finals`
/// show lost, one line each: a final value written before an acknowledged
/// update was invoked (which it should have replaced), a value never
/// written, or a key absent although no delete can follow an
/// acknowledged write.
pub fn lost_updates(history: &[Operation], finals: &[Operation]) -> Vec<String> {
    let mut by_key: BTreeMap<&str, Vec<&Operation>> = BTreeMap::new();
    for op in history.iter().filter(|o| o.op != OpKind::Read && o.status != Status::Fail) {
        by_key.entry(&op.key).or_default().push(op);
    }
    let mut lost = Vec::new();
    for f in finals {
        let updates = by_key.get(f.key.as_str()).map_or(&[][..], Vec::as_slice);
        if let Some(line) = lost_on(&f.key, f.result.as_str(), updates) {
            lost.push(line);
        }
    }
    lost
}

/// [`lost_updates`] of one key whose final value is `last`.
fn lost_on(key: &str, last: Option<&str>, updates: &[&Operation]) -> Option<String> {
    let acked = || updates.iter().filter(|o| o.status == Status::Ok);
    let secs = |o: &Operation| o.invoke_ns as f64 / 1e9;
    let Some(last) = last else {
        // Absent: a delete must be able to come after each acked write.
        let deletes: Vec<&&Operation> = updates.iter().filter(|o| o.op == OpKind::Delete).collect();
        let w = acked().find(|w| {
            w.op == OpKind::Write && deletes.iter().all(|d| d.status == Status::Ok && d.complete_ns < w.invoke_ns)
        })?;
        return Some(format!(
            "key {key:?}: the write of {:?} acknowledged at {:.3} s is gone: the key is absent",
            w.value.as_deref().unwrap_or(""),
            secs(w)
        ));
    };
    let sources: Vec<&&Operation> = updates.iter().filter(|o| o.value.as_deref() == Some(last)).collect();
    if sources.is_empty() {
        return Some(format!("key {key:?}: its final value {last:?} was never written"));
    }
    // Lost when every write that could have left `last` completed before
    // some acknowledged update began.
    let w = acked().find(|w| {
        sources.iter().all(|u| u.status == Status::Ok && !std::ptr::eq(**u, **w) && u.complete_ns < w.invoke_ns)
    })?;
    Some(format!(
        "key {key:?}: the {:?} acknowledged at {:.3} s is gone: the final value {last:?} was written before it",
        w.op,
        secs(w)
    ))
}

/// The 99th percentile of how long the acknowledged operations of
/// `history` that completed within `[from_ns, to_ns)` took, µs; `None`
/// if none did.
pub fn p99_between(history: &[Operation], from_ns: u64, to_ns: u64) -> Option<u64> {
    let mut took: Vec<u64> = history
        .iter()
        .filter(|o| o.status == Status::Ok && o.complete_ns >= from_ns && o.complete_ns < to_ns)
        .map(|o| (o.complete_ns - o.invoke_ns) / 1000)
        .collect();
    if took.is_empty() {
        return None;
    }
    let at = (took.len() * 99).div_ceil(100).saturating_sub(1);
    Some(*took.select_nth_unstable(at).1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(client: u64, op: OpKind, value: Option<&str>, status: Status, (invoke, complete): (u64, u64)) -> Operation {
        let result = match op {
            OpKind::Read => serde_json::Value::Null,
            _ => false.into(),
        };
        Operation {
            client,
            op,
            key: "7".into(),
            value: value.map(str::to_string),
            result,
            invoke_ns: invoke,
            complete_ns: complete,
            status,
        }
    }

    fn read(value: Option<&str>) -> Operation {
        let mut r = op(99, OpKind::Read, None, Status::Ok, (1000, 1001));
        r.result = value.map_or(serde_json::Value::Null, Into::into);
        r
    }

    #[test]
    fn an_acknowledged_write_overwritten_by_an_older_one_is_lost() {
        let w1 = op(1, OpKind::Write, Some("a"), Status::Ok, (0, 10));
        let w2 = op(2, OpKind::Write, Some("b"), Status::Ok, (20, 30));
        let history = vec![w1.clone(), w2.clone()];
        assert!(lost_updates(&history, &[read(Some("b"))]).is_empty());
        let lost = lost_updates(&history, &[read(Some("a"))]);
        assert_eq!(lost.len(), 1, "{lost:?}");
        assert!(lost[0].contains("Write") && lost[0].contains("\"a\" was written before it"), "{lost:?}");
        // Concurrent writes may end in either order.
        let w3 = op(3, OpKind::Write, Some("c"), Status::Ok, (5, 25));
        assert!(lost_updates(&[w1.clone(), w3], &[read(Some("a"))]).is_empty());
        // An unacknowledged write may take effect last.
        let late = op(4, OpKind::Write, Some("d"), Status::Unknown, (1, 0));
        assert!(lost_updates(&[w1.clone(), w2.clone(), late], &[read(Some("d"))]).is_empty());
        assert_eq!(lost_updates(&history, &[read(Some("zz"))]).len(), 1, "a value never written");
        assert_eq!(lost_updates(&history, &[read(None)]).len(), 1, "absent with no delete");
        let delete = op(5, OpKind::Delete, None, Status::Ok, (40, 50));
        assert!(lost_updates(&[w1, w2, delete], &[read(None)]).is_empty());
    }

    #[test]
    fn a_planted_stale_read_is_not_linearizable_with_the_final_reads() {
        let w1 = op(1, OpKind::Write, Some("a"), Status::Ok, (0, 10));
        let mut w2 = op(2, OpKind::Write, Some("b"), Status::Ok, (20, 30));
        w2.result = true.into();
        let mut stale = op(3, OpKind::Read, None, Status::Ok, (40, 50));
        stale.result = "a".into();
        let mut history = vec![w1, w2, stale];
        history.push(read(Some("b")));
        assert!(matches!(history::check_linearizable(&history, 1000), Verdict::Violation { .. }));
        history.remove(2);
        assert_eq!(history::check_linearizable(&history, 1000), Verdict::Linearizable);
    }

    #[test]
    fn the_99th_percentile_counts_only_acknowledged_operations_completed_in_the_window() {
        let mut history: Vec<Operation> =
            (0..100).map(|i| op(1, OpKind::Read, None, Status::Ok, (i * 1000, i * 1000 + (i + 1) * 1000))).collect();
        history.push(op(2, OpKind::Read, None, Status::Unknown, (0, 0)));
        assert_eq!(p99_between(&history, 0, u64::MAX), Some(99));
        assert_eq!(p99_between(&history, 0, 10_000), Some(5), "the ops completed before 10 µs: 1 to 5 µs");
        assert_eq!(p99_between(&history, u64::MAX - 1, u64::MAX), None);
    }
}
