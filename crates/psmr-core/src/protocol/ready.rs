//! Handling one raft `Ready`: what must be stored, in which order, before
//! what may leave.

use crate::bug::{Bug, Planted};
use crate::store::{RaftLog, Store};
use raft::prelude::{Entry, EntryType, Message, Snapshot};
use raft::{RawNode, ReadState};

/// Where the output of a ready goes, besides the store.
pub(crate) trait ReadyOut<S: Store> {
    /// Sends messages to peers, telling `node` about the ones that cannot
    /// be sent.
    fn send(&mut self, node: &mut RawNode<RaftLog<S>>, msgs: Vec<Message>);
    /// Hands committed entries, in log order, to the apply loop.
    fn deliver(&mut self, entries: Vec<Entry>) -> Result<(), String>;
    /// Hands a snapshot from the leader, now in the log, to the apply loop.
    fn restore(&mut self, snapshot: Snapshot) -> Result<(), String>;
    /// The answers to read-index requests: each says which commit index
    /// the reads with that context must wait for.
    fn read_states(&mut self, states: Vec<ReadState>);
    /// Applies the committed conf-change entry `e` to `node`, before the
    /// entry reaches the apply loop. A caller whose membership never
    /// changes may ignore them.
    fn conf_change(&mut self, node: &mut RawNode<RaftLog<S>>, e: &Entry) -> Result<(), String> {
        let _ = (node, e);
        Ok(())
    }
}

/// Applies the conf changes among `entries` to `node`, then hands them
/// all to the apply loop.
fn deliver_committed<S: Store>(
    node: &mut RawNode<RaftLog<S>>,
    out: &mut impl ReadyOut<S>,
    entries: Vec<Entry>,
) -> Result<(), String> {
    for e in entries.iter().filter(|e| e.get_entry_type() != EntryType::EntryNormal) {
        out.conf_change(node, e)?;
    }
    out.deliver(entries)
}

/// Handles one ready of `node`, if it has one: stores what raft asks to
/// store in `store`, and sends and delivers the rest through `out`. An
/// error means the replica must stop.
///
/// The order is raft's rule: the messages of the ready itself (a leader's
/// appends) may leave before its entries are stored, so that followers
/// write while the leader does; its *persisted* messages (votes,
/// acknowledgements) only after the synced write, since they promise
/// what is on disk.
pub(crate) fn handle_ready<S: Store>(
    node: &mut RawNode<RaftLog<S>>,
    store: &S,
    out: &mut impl ReadyOut<S>,
    planted: Planted,
) -> Result<(), String> {
    if !node.has_ready() {
        return Ok(());
    }
    let mut ready = node.ready();
    out.send(node, ready.take_messages());
    if !ready.read_states().is_empty() {
        out.read_states(ready.take_read_states());
    }
    if *ready.snapshot() != Snapshot::default() {
        let snap = ready.snapshot().clone();
        let index = snap.get_metadata().index;
        // raft has already restored its log from the snapshot: a log that
        // refuses it would leave the two disagreeing.
        store.apply_snapshot(snap.clone()).map_err(|e| format!("cannot install the snapshot at {index}: {e}"))?;
        tracing::info!(index, "installing a snapshot from the leader");
        out.restore(snap)?;
    }
    deliver_committed(node, out, ready.take_committed_entries())?;
    if planted.is(Bug::ReplyBeforeSync) {
        // The planted bug: the votes and acknowledgements leave first.
        out.send(node, ready.take_persisted_messages());
    }
    // Nothing that depends on these entries or this vote leaves before
    // they are stored (synced, on disk).
    store.append(ready.entries(), ready.hs()).map_err(|e| format!("cannot persist the log: {e}"))?;
    out.send(node, ready.take_persisted_messages());
    advance(node, ready, store, out)
}

/// Tells raft the ready is handled, then handles what that released: the
/// light ready's commit index, messages and committed entries.
fn advance<S: Store>(
    node: &mut RawNode<RaftLog<S>>,
    ready: raft::Ready,
    store: &S,
    out: &mut impl ReadyOut<S>,
) -> Result<(), String> {
    let mut light = node.advance(ready);
    if let Some(commit) = light.commit_index() {
        store.set_commit(commit).map_err(|e| format!("cannot persist the log: {e}"))?;
    }
    out.send(node, light.take_messages());
    deliver_committed(node, out, light.take_committed_entries())?;
    node.advance_apply();
    Ok(())
}
