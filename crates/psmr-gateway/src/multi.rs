//! `MULTI` ... `EXEC`: a connection's transaction.
//!
//! Between `MULTI` and `EXEC` every command is checked as it would be
//! alone (its syntax, the service's refusals, the user's rights) and
//! queued, answered `+QUEUED`; one that is refused is answered with its
//! error and makes `EXEC` answer `-EXECABORT`, as Redis does. `EXEC`
//! submits the queued operations as **one request**: the log orders a
//! request's commands one after the other, and every scheduler executes
//! them as the log orders them, so no other client's command comes
//! between them on any replica. Its reply is the array of their replies,
//! each encoded as its outcome comes (an [`Step::ArrayStart`] and then
//! the steps themselves), so a transaction's replies are bounded as a
//! pipeline's are. A transaction holds at most one request's worth of
//! commands (`batch_max_commands`, `batch_max_bytes`): one more is refused
//! while it is queued, not at `EXEC`.
//!
//! `WATCH` keys and an `EXEC` runs as one conditional operation instead
//! (`crate::watch`).

use crate::answers::Step;
use psmr_resp::Reply;

/// The commands queued since `MULTI`.
pub(crate) struct Transaction<Op> {
    steps: Vec<Step<Op>>,
    bytes: usize,
    /// A command was refused while queued: `EXEC` aborts.
    failed: bool,
}

impl<Op> Default for Transaction<Op> {
    fn default() -> Self {
        Self { steps: Vec::new(), bytes: 0, failed: false }
    }
}

/// What a command means to a connection's transaction.
pub(crate) enum Control {
    /// Starts one.
    Multi,
    /// Runs the one queued.
    Exec,
    /// Drops the one queued.
    Discard,
    /// Answered at once, whether or not one is queued.
    Answer(Reply),
    /// Reads the versions of keys (outside a transaction).
    Watch,
    /// Forgets the watched keys (outside a transaction; inside one it is
    /// queued, as Redis queues it, and answers `+OK` in its place).
    Unwatch,
    /// Any other command: queued if a transaction is open.
    Other,
}

/// What `name` (upper case) with `args` arguments means for transactions;
/// `open`: whether one is.
pub(crate) fn control(name: &str, args: usize, open: bool) -> Control {
    let arity = |n: &str| Control::Answer(psmr_resp::wrong_arity(n));
    match (name, open) {
        ("MULTI" | "EXEC" | "DISCARD", _) if args != 1 => arity(&name.to_ascii_lowercase()),
        ("MULTI", false) => Control::Multi,
        ("MULTI", true) => Control::Answer(Reply::error("ERR MULTI calls can not be nested")),
        ("EXEC", true) => Control::Exec,
        ("EXEC", false) => Control::Answer(Reply::error("ERR EXEC without MULTI")),
        ("DISCARD", true) => Control::Discard,
        ("DISCARD", false) => Control::Answer(Reply::error("ERR DISCARD without MULTI")),
        ("WATCH", true) => Control::Answer(Reply::error("ERR WATCH inside MULTI is not allowed")),
        ("WATCH", false) if args < 2 => arity("watch"),
        ("WATCH", false) => Control::Watch,
        ("UNWATCH", _) if args != 1 => arity("unwatch"),
        ("UNWATCH", false) => Control::Unwatch,
        ("UNWATCH", true) => Control::Other,
        _ => Control::Other,
    }
}

impl<Op> Transaction<Op> {
    /// Queues `step` (a command checked as if it came alone) within
    /// `max_commands` and `max_bytes` of operations; the reply to send
    /// now.
    pub(crate) fn queue(&mut self, step: Step<Op>, max_commands: usize, max_bytes: usize) -> Reply {
        let reply = match step {
            Step::Local(Reply::Error(e)) => Reply::Error(e),
            Step::Hello(..) | Step::Auth(_) | Step::Quit | Step::Transaction(_) | Step::ArrayStart(_) => {
                Reply::error("ERR AUTH, HELLO and QUIT are not allowed inside MULTI")
            }
            step if self.steps.len() >= max_commands => {
                drop(step);
                Reply::error(format!("ERR a transaction holds at most {max_commands} commands (batch_max_commands)"))
            }
            Step::Execute(_, ref encoded) if self.bytes + encoded.len() > max_bytes => Reply::error(format!(
                "ERR a transaction holds at most {max_bytes} bytes of operations (batch_max_bytes)"
            )),
            step => {
                if let Step::Execute(_, encoded) = &step {
                    self.bytes += encoded.len();
                }
                self.steps.push(step);
                return Reply::simple("QUEUED");
            }
        };
        self.failed = true;
        reply
    }

    /// What `EXEC` runs: the queued steps, or the abort's reply.
    pub(crate) fn into_steps(self) -> Result<Vec<Step<Op>>, Reply> {
        match self.failed {
            true => Err(Reply::error("EXECABORT Transaction discarded because of previous errors.")),
            false => Ok(self.steps),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exec(t: Transaction<u8>) -> Option<Vec<Step<u8>>> {
        t.into_steps().ok()
    }

    #[test]
    fn refused_commands_abort_and_the_bounds_hold() {
        let mut t = Transaction::default();
        assert_eq!(t.queue(Step::Execute(1, vec![0; 4]), 3, 8), Reply::simple("QUEUED"));
        assert_eq!(t.queue(Step::Local(Reply::simple("PONG")), 3, 8), Reply::simple("QUEUED"));
        assert_eq!(exec(t).map(|s| s.len()), Some(2));

        let mut t = Transaction::default();
        t.queue(Step::Execute(1, vec![0; 4]), 3, 8);
        assert!(matches!(t.queue(Step::Execute(2, vec![0; 5]), 3, 8), Reply::Error(e) if e.contains("8 bytes")));
        assert!(exec(t).is_none(), "over the bytes: aborted");

        let mut t = Transaction::default();
        for i in 0..3 {
            t.queue(Step::Execute(i, Vec::new()), 3, 8);
        }
        assert!(matches!(t.queue(Step::Local(Reply::ok()), 3, 8), Reply::Error(e) if e.contains("3 commands")));
        assert!(exec(t).is_none(), "over the commands: aborted");

        let mut t = Transaction::<u8>::default();
        let refused = t.queue(Step::Local(Reply::error("NOPERM no")), 3, 8);
        assert_eq!(refused, Reply::error("NOPERM no"));
        assert!(matches!(t.into_steps(), Err(Reply::Error(e)) if e.starts_with("EXECABORT")));
    }

    #[test]
    fn control_commands_answer_as_redis_does() {
        assert!(matches!(control("MULTI", 1, false), Control::Multi));
        assert!(matches!(control("MULTI", 1, true), Control::Answer(Reply::Error(e)) if e.contains("nested")));
        assert!(matches!(control("EXEC", 1, false), Control::Answer(Reply::Error(e)) if e.contains("without MULTI")));
        assert!(matches!(control("EXEC", 2, true), Control::Answer(Reply::Error(e)) if e.contains("wrong number")));
        assert!(matches!(control("DISCARD", 1, true), Control::Discard));
        assert!(matches!(control("UNWATCH", 1, true), Control::Other));
        assert!(matches!(control("UNWATCH", 1, false), Control::Unwatch));
        assert!(matches!(control("WATCH", 2, false), Control::Watch));
        assert!(matches!(control("WATCH", 1, false), Control::Answer(Reply::Error(e)) if e.contains("wrong number")));
        assert!(matches!(control("WATCH", 2, true), Control::Answer(Reply::Error(e)) if e.contains("inside MULTI")));
        assert!(matches!(control("GET", 2, true), Control::Other));
    }
}
