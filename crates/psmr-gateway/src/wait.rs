//! Commands that wait for data (`BLPOP`, `BRPOP`, `BLMOVE`): the client
//! waits here, at its gateway, not in the replica. The command's
//! operation is an ordinary pop through the log; while it finds nothing
//! ([`Commands::nothing_yet`]) it is tried again, after a pause that grows
//! from [`PAUSE_MIN`] to [`PAUSE_MAX`], until it finds something or its
//! timeout passes, and then the client hears Redis's nil. Every try is a
//! command of the log, so the element popped is the same on every replica
//! and a pop never happens twice; a client waiting for ever costs about
//! ten small entries a second.
//!
//! While it waits the connection keeps reading: a client that closes stops
//! the waiting, and what it sends meanwhile is served after the reply, as
//! Redis serves it.

use crate::{Connection, Replier};
use psmr_client::{Session, Submit};
use psmr_model::wire::{OpCodec, Outcome};
use psmr_model::App;
use psmr_resp::{Commands, Reply};
use std::time::Duration;
use tokio::time::Instant;

/// The first pause between two tries.
const PAUSE_MIN: Duration = Duration::from_millis(5);
/// The longest pause between two tries: how late a waiting client may
/// hear of data at worst.
const PAUSE_MAX: Duration = Duration::from_millis(100);

impl<A, C, S> Connection<'_, A, C, S>
where
    A: App,
    C: Commands<Op = A::Op, Reply = A::Reply>,
    S: Submit,
{
    /// Tries `op` (encoded as `encoded`) until it finds something or
    /// `timeout` passes; writes the reply. Ok(true) when the client closed.
    pub(crate) async fn wait(
        &mut self,
        op: A::Op,
        encoded: Vec<u8>,
        timeout: Option<Duration>,
    ) -> Result<bool, String> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut pause = PAUSE_MIN;
        loop {
            let Some(outcome) = self.submit_alone(encoded.clone()).await else { return Ok(false) };
            if !self.found_nothing(&op, &outcome) {
                let reply = self.gateway.reply(&op, outcome);
                self.answer_now(&[reply]).await;
                return Ok(false);
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                self.answer_now(&[self.gateway.commands.timed_out(&op)]).await;
                return Ok(false);
            }
            let next = deadline.map_or(now + pause, |d| d.min(now + pause));
            if self.read_until(next).await? {
                return Ok(true);
            }
            pause = (pause * 2).min(PAUSE_MAX);
        }
    }

    /// Submits one operation (encoded) as a request of its own: its
    /// outcome, or `None` once the client was told the cluster is
    /// unavailable.
    pub(crate) async fn submit_alone(&mut self, encoded: Vec<u8>) -> Option<Outcome> {
        let mut outcomes: Vec<Outcome> = Vec::new();
        if let Err(e) = self.client.submit(vec![encoded], &mut outcomes).await {
            self.answer_now(&[Reply::error(format!("ERR cluster unavailable: {e}"))]).await;
            return None;
        }
        Some(outcomes.pop().unwrap_or_else(|| Outcome::Rejected("no outcome for the command".into())))
    }

    /// Whether `outcome` says there was nothing to take yet.
    fn found_nothing(&self, op: &A::Op, outcome: &Outcome) -> bool {
        match outcome {
            Outcome::Ok(bytes) => {
                self.gateway.codec.decode_reply(bytes).is_ok_and(|r| self.gateway.commands.nothing_yet(op, &r))
            }
            Outcome::Rejected(_) => false,
        }
    }

    /// Reads what the client sends until `until`, keeping it for later;
    /// true if the client closed meanwhile.
    async fn read_until(&mut self, until: Instant) -> Result<bool, String> {
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(until) => return Ok(false),
                more = self.read_more() => if !more? {
                    return Ok(true);
                },
            }
        }
    }
}
