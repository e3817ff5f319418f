//! The leader's housekeeping: now and then, the service is asked for an
//! operation that reclaims what nobody can see any more
//! ([`psmr_model::App::sweep`]: the kv store's keys past their deadline),
//! and the operation goes through the log as client 0, the id reserved for
//! the replica itself, so that every replica reclaims the same keys at the
//! same point of the log. Only the leader asks; a follower that becomes
//! leader starts asking at its next round.
//!
//! A sweep takes a slot of the request queue only if one is free: under
//! load, clients' requests go first and the sweep waits for the next round.

use crate::start::Handles;
use psmr_core::request::Request;
use psmr_model::wire::OpCodec;
use psmr_model::App;
use psmr_transport::msg::RequestSender;
use std::sync::Arc;
use std::time::Duration;

/// How often the leader sweeps.
const EVERY: Duration = Duration::from_millis(100);

/// Sweeps per round at most, when each finds its fill of keys: about ten
/// thousand keys a second reclaimed, past which expired keys wait longer.
const ROUNDS: usize = 8;

/// Starts the sweeper on `runtime`; it stops with the replica.
pub(crate) fn spawn<A: App>(runtime: &tokio::runtime::Runtime, h: &Handles, app: Arc<A>, requests: RequestSender) {
    let (life, view) = (h.life.clone(), h.view.clone());
    runtime.spawn(async move {
        let mut tick = tokio::time::interval(EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut seq = 0u64;
        loop {
            tokio::select! {
                _ = life.stopped() => return,
                _ = tick.tick() => {}
            }
            if view.is_leader() {
                sweep(app.as_ref(), &requests, &mut seq);
            }
        }
    });
}

/// One round: sweeps while the service finds something and the queue has
/// room, at most [`ROUNDS`] times.
fn sweep<A: App>(app: &A, requests: &RequestSender, seq: &mut u64) {
    let codec = A::Codec::default();
    for _ in 0..ROUNDS {
        let Some(op) = app.sweep(psmr_transport::clock::wall_ms()) else { return };
        let op = codec.encode_op(&op);
        *seq += 1;
        let mut encoded = Vec::with_capacity(op.len() + 20);
        psmr_core::entry::encode_command(&mut encoded, 0, *seq, &op);
        let r = Request::new(0, 1, encoded, op.len(), psmr_transport::clock::now_ns());
        if requests.try_send(r).is_err() {
            return;
        }
    }
}
