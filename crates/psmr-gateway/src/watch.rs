//! `WATCH`: transactions that run only if what they watched is unchanged.
//!
//! `WATCH k...` reads the keys' versions through the log (the service's
//! read, [`Commands::watch`]), and the connection keeps them. An `EXEC`
//! after it submits the queued operations as **one operation** of the
//! service ([`Commands::exec`]) that first compares every watched key's
//! version with the one kept: every replica compares at the same point of
//! the log, so on all of them the operations all run or none does, and a
//! nil array tells the client none did. The commands answered here inside
//! the transaction (`PING`, say) keep their places among the replies.
//! `EXEC`, `DISCARD` and `UNWATCH` forget the watched keys, as in Redis. A
//! transaction that watched nothing runs as one request of its commands
//! (`crate::multi`), as before.
//!
//! `WATCH` is a batch of its own, like a waiting command: the versions must
//! be known before the commands after it are read. A connection watches
//! at most `batch_max_bytes` of keys (each counted with its 8-byte
//! version): the `EXEC` that carries them must fit in one request.

use crate::answers::Step;
use crate::multi::Transaction;
use crate::{Connection, Replier};
use bytes::Bytes;
use psmr_auth::Need;
use psmr_client::Submit;
use psmr_model::wire::{OpCodec, Outcome};
use psmr_model::App;
use psmr_resp::{Commands, Reply};

/// The keys a connection watches and their versions, first watch first.
#[derive(Default)]
pub(crate) struct Watched {
    keys: Vec<(Bytes, u64)>,
    /// Bytes of keys, each with its version's 8.
    bytes: usize,
}

impl Watched {
    /// Keeps `versions` of `keys`; a key already watched keeps its first
    /// version, as Redis keeps its first watch.
    fn add(&mut self, keys: Vec<Bytes>, versions: Vec<u64>) {
        for (key, version) in keys.into_iter().zip(versions) {
            if !self.keys.iter().any(|(k, _)| *k == key) {
                self.bytes += key.len() + 8;
                self.keys.push((key, version));
            }
        }
    }

    /// Whether `keys` would take the watched bytes past `max`.
    fn over(&self, keys: &[Bytes], max: usize) -> bool {
        self.bytes + keys.iter().map(|k| k.len() + 8).sum::<usize>() > max
    }
}

/// `reply`, the array of a watched transaction's operations' replies, with
/// the replies answered here put at their places; a nil array (the
/// transaction did not run) or an error stays as it is.
pub(crate) fn splice(reply: Reply, locals: Vec<(usize, Reply)>) -> Reply {
    match reply {
        Reply::Array(mut items) => {
            for (at, local) in locals {
                items.insert(at.min(items.len()), local);
            }
            Reply::Array(items)
        }
        other => other,
    }
}

impl<A, C, S> Connection<'_, A, C, S>
where
    A: App,
    C: Commands<Op = A::Op, Reply = A::Reply>,
    S: Submit,
{
    /// What `WATCH key...` turns into.
    pub(crate) fn watch_step(&mut self, args: &[Bytes]) -> Step<C::Op> {
        let gateway = self.gateway;
        if let Err(refusal) = gateway.auth.may(self.peer, self.who.as_ref(), Need::Data, "watch") {
            return Step::Local(refusal);
        }
        let keys = &args[1..];
        let max = gateway.limits.batch_max_bytes;
        if self.watched.over(keys, max) {
            let why = format!("ERR a connection watches at most {max} bytes of keys (batch_max_bytes); UNWATCH first");
            return Step::Local(Reply::error(why));
        }
        match gateway.commands.watch(keys) {
            Ok(op) => match self.operation(op, "watch") {
                Step::Execute(op, encoded) => Step::Watch(op, encoded, keys.to_vec()),
                refused => refused,
            },
            Err(reply) => Step::Local(reply),
        }
    }

    /// What `EXEC` of `transaction` turns into: its commands as one
    /// request if nothing is watched, else one conditional operation. The
    /// watched keys are forgotten either way.
    pub(crate) fn exec_step(&mut self, transaction: Transaction<C::Op>) -> Step<C::Op> {
        let watched = std::mem::take(&mut self.watched);
        let steps = match transaction.into_steps() {
            Ok(steps) if watched.keys.is_empty() => return Step::Transaction(steps),
            Ok(steps) => steps,
            Err(abort) => return Step::Local(abort),
        };
        let (mut ops, mut locals) = (Vec::new(), Vec::new());
        for (at, step) in steps.into_iter().enumerate() {
            match step {
                Step::Execute(op, _) => ops.push(op),
                Step::Local(reply) => locals.push((at, reply)),
                // A transaction queues nothing else.
                _ => locals.push((at, Reply::error("ERR not allowed in a transaction"))),
            }
        }
        match self.gateway.commands.exec(watched.keys, ops) {
            Ok(op) => match self.operation(op, "exec") {
                Step::Execute(op, encoded) => Step::Exec(op, encoded, locals),
                refused => refused,
            },
            Err(reply) => Step::Local(reply),
        }
    }

    /// Forgets the watched keys (`UNWATCH`).
    pub(crate) fn unwatch(&mut self) {
        self.watched = Watched::default();
    }

    /// Reads the versions of `keys` with `op` (encoded as `encoded`), keeps
    /// them, and answers. Never Ok(true): `WATCH` does not close.
    pub(crate) async fn watch(&mut self, op: A::Op, encoded: Vec<u8>, keys: Vec<Bytes>) -> Result<bool, String> {
        let Some(outcome) = self.submit_alone(encoded).await else { return Ok(false) };
        let gateway = self.gateway;
        let versions = match outcome {
            Outcome::Ok(bytes) => match gateway.codec.decode_reply(&bytes) {
                Ok(reply) => gateway.commands.versions(reply),
                Err(e) => Err(Reply::error(format!("ERR undecodable reply: {e}"))),
            },
            rejected => Err(gateway.reply(&op, rejected)),
        };
        let reply = match versions {
            Ok(versions) if versions.len() == keys.len() => {
                self.watched.add(keys, versions);
                Reply::ok()
            }
            Ok(versions) => Reply::error(format!("ERR {} versions for {} keys", versions.len(), keys.len())),
            Err(reply) => reply,
        };
        self.answer_now(&[reply]).await;
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_replies_keep_their_places() {
        let executed = Reply::Array(vec![Reply::integer(1), Reply::integer(2)]);
        let locals = vec![(0, Reply::simple("PONG")), (2, Reply::simple("PONG"))];
        let spliced = splice(executed, locals);
        let pong = Reply::simple("PONG");
        assert_eq!(spliced, Reply::Array(vec![pong.clone(), Reply::integer(1), pong, Reply::integer(2)]));
        assert_eq!(splice(Reply::NullArray, vec![(0, Reply::ok())]), Reply::NullArray);
    }

    #[test]
    fn a_key_watched_twice_keeps_its_first_version() {
        let mut w = Watched::default();
        w.add(vec![Bytes::from("a"), Bytes::from("b")], vec![3, 5]);
        w.add(vec![Bytes::from("a")], vec![7]);
        assert_eq!(w.keys, vec![(Bytes::from("a"), 3), (Bytes::from("b"), 5)]);
        assert_eq!(w.bytes, 18);
        assert!(!w.over(&[Bytes::from("c")], 27));
        assert!(w.over(&[Bytes::from("c")], 26));
    }
}
