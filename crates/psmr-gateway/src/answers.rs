//! A batch's replies, written in their places as outcomes come, within
//! bounded bytes.
//!
//! A pipeline of big replies to a client that reads slowly must not make
//! the replica hold them: each reply is encoded when its outcome's turn
//! comes ([`psmr_client::InOrder`]) and written out in chunks of
//! [`WRITE_CHUNK`] bytes, and while a write waits for the client no
//! further outcome is taken (the replica's bounded outbox, or the socket
//! of the network way, takes the back-pressure). An outcome that comes
//! ahead of its turn is held only within [`HELD_MAX`] bytes per
//! connection and the gateway's reply budget for all of them; beyond
//! that it is asked for again later. A client that takes nothing for
//! `client_idle_timeout_ms` while a reply waits is disconnected.

use psmr_client::Deliver;
use psmr_model::wire::Outcome;
use psmr_resp::{Reply, Version};
use psmr_tls::Stream;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Encoded replies written to the socket at a time.
pub(crate) const WRITE_CHUNK: usize = 64 * 1024;

/// Bytes of outcomes one connection may hold ahead of their turn.
pub(crate) const HELD_MAX: usize = 8 << 20;

/// What a request turns into, in its place among the replies.
pub(crate) enum Step<Op> {
    /// Answered here.
    Local(Reply),
    /// Submitted to the cluster, with its encoding.
    Execute(Op, Vec<u8>),
    /// A watched transaction's `EXEC`: one operation, with its encoding,
    /// whose reply is the array of the queued commands' replies; the
    /// replies of the commands answered here go into it at their places
    /// (see `crate::watch`).
    Exec(Op, Vec<u8>, Vec<(usize, Reply)>),
    /// `WATCH`: the operation that reads the keys' versions, with its
    /// encoding, and the keys (never among a batch's [`Answers`]: it is a
    /// batch of its own, see `crate::watch`).
    Watch(Op, Vec<u8>, Vec<bytes::Bytes>),
    /// Changes the protocol version, then answers.
    Hello(Version, Reply),
    /// Answers, then closes.
    Quit,
    /// Authenticates, after every step before it is answered (never
    /// among a batch's [`Answers`]).
    Auth(crate::auth::Login),
    /// `EXEC`'s steps, submitted in one request (never among a batch's
    /// [`Answers`]: a batch holds an [`Step::ArrayStart`] and the steps).
    Transaction(Vec<Step<Op>>),
    /// Starts an array of the replies of the steps that follow.
    ArrayStart(usize),
    /// A command that waits for data (`BLPOP`), at most this long (`None`:
    /// for ever): its operation, with its encoding, is tried until it
    /// finds some (never among a batch's [`Answers`]: it is a batch of its
    /// own, see `crate::wait`).
    Wait(Op, Vec<u8>, Option<std::time::Duration>),
}

impl<Op> Step<Op> {
    /// Operations and their bytes.
    pub(crate) fn load(&self) -> (usize, usize) {
        match self {
            Step::Execute(_, encoded)
            | Step::Exec(_, encoded, _)
            | Step::Watch(_, encoded, _)
            | Step::Wait(_, encoded, _) => (1, encoded.len()),
            Step::Transaction(steps) => steps.iter().map(Step::load).fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1)),
            _ => (0, 0),
        }
    }
}

/// Turns an executed operation's outcome into its Redis reply.
pub(crate) trait Replier<Op>: Sync {
    /// The reply to `op` for `outcome`.
    fn reply(&self, op: &Op, outcome: Outcome) -> Reply;
}

/// The [`Deliver`] of one batch: its steps, in order, and where their
/// replies go.
pub(crate) struct Answers<'a, Op, R> {
    steps: std::vec::IntoIter<Step<Op>>,
    replier: &'a R,
    stream: &'a mut Stream,
    version: &'a mut Version,
    out: Vec<u8>,
    /// How long a write may wait for the client.
    stall: Duration,
    /// Why writing stopped (the client is gone or stalled); later replies
    /// are dropped.
    broken: Option<String>,
    quit: bool,
    /// The gateway's budget for outcomes held ahead of their turn, and
    /// this batch's grant from it.
    budget: Arc<Semaphore>,
    granted: Option<OwnedSemaphorePermit>,
}

impl<'a, Op: Send, R: Replier<Op>> Answers<'a, Op, R> {
    /// The answers to `steps`, written to `stream` in `version`.
    pub(crate) fn new(
        steps: Vec<Step<Op>>,
        replier: &'a R,
        stream: &'a mut Stream,
        version: &'a mut Version,
        stall: Duration,
        budget: Arc<Semaphore>,
    ) -> Self {
        let steps = steps.into_iter();
        Self {
            steps,
            replier,
            stream,
            version,
            out: Vec::new(),
            stall,
            broken: None,
            quit: false,
            budget,
            granted: None,
        }
    }

    /// Encodes the steps answered here, up to the next operation's.
    fn locals(&mut self) {
        while let Some(step) = self.steps.as_slice().first() {
            if matches!(step, Step::Execute(..) | Step::Exec(..)) {
                return;
            }
            let reply = match self.steps.next() {
                Some(Step::Local(reply)) => reply,
                Some(Step::Hello(version, reply)) => {
                    *self.version = version;
                    reply
                }
                Some(Step::ArrayStart(n)) => {
                    Reply::encode_array_start(n, &mut self.out);
                    continue;
                }
                _ => {
                    self.quit = true;
                    Reply::ok()
                }
            };
            reply.encode(*self.version, &mut self.out);
        }
    }

    /// Writes what is encoded if it fills a chunk (`all`: whatever there is).
    async fn write(&mut self, all: bool) {
        if self.out.is_empty() || (!all && self.out.len() < WRITE_CHUNK) {
            return;
        }
        if self.broken.is_none() {
            let write = tokio::time::timeout(self.stall, self.stream.send(&self.out)).await;
            self.broken = match write {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(e.to_string()),
                Err(_) => Some(format!("took no reply for {} ms", self.stall.as_millis())),
            };
        }
        self.out.clear();
        if self.out.capacity() > 4 * WRITE_CHUNK {
            self.out = Vec::new();
        }
    }

    /// Answers every step left, an operation's with `why` (the request
    /// failed as a whole), and writes everything out: whether the client
    /// asked to quit, or why writing failed.
    pub(crate) async fn finish(mut self, why: Option<&str>) -> Result<bool, String> {
        loop {
            self.locals();
            match self.steps.next() {
                Some(Step::Execute(..) | Step::Exec(..)) => {
                    let why = why.unwrap_or("no outcome for the command");
                    Reply::error(format!("ERR {why}")).encode(*self.version, &mut self.out);
                }
                Some(_) => unreachable!("locals() stops only at an operation"),
                None => break,
            }
            self.write(false).await;
        }
        self.write(true).await;
        match self.broken {
            Some(why) => Err(why),
            None => Ok(self.quit),
        }
    }
}

impl<Op: Send, R: Replier<Op>> Deliver for Answers<'_, Op, R> {
    async fn deliver(&mut self, outcome: Outcome) {
        self.locals();
        let step = self.steps.next();
        // A client that is gone gets nothing: its replies are not even made.
        let reply = match step {
            _ if self.broken.is_some() => None,
            Some(Step::Execute(op, _)) => Some(self.replier.reply(&op, outcome)),
            Some(Step::Exec(op, _, locals)) => Some(crate::watch::splice(self.replier.reply(&op, outcome), locals)),
            _ => None,
        };
        if let Some(reply) = reply {
            reply.encode(*self.version, &mut self.out);
        }
        self.write(false).await;
    }

    fn hold(&mut self, bytes: usize) -> bool {
        let held = self.granted.as_ref().map_or(0, |g| g.num_permits());
        let Ok(more) = u32::try_from(bytes) else { return false };
        if held + bytes > HELD_MAX {
            return false;
        }
        match self.budget.clone().try_acquire_many_owned(more) {
            Ok(permit) => {
                match &mut self.granted {
                    Some(g) => g.merge(permit),
                    None => self.granted = Some(permit),
                }
                true
            }
            Err(_) => false,
        }
    }

    fn release(&mut self, bytes: usize) {
        if let Some(g) = &mut self.granted {
            drop(g.split(bytes.min(g.num_permits())));
        }
    }
}
