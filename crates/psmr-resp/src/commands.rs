//! [`Commands`]: how a replicated service speaks Redis.

use crate::Reply;
use bytes::Bytes;

/// A service's Redis commands: which of its operations a command asks
/// for, and how that operation's reply is said in RESP.
///
/// Connection commands (`PING`, `ECHO`, `HELLO`, `SELECT`, `CLIENT`,
/// `QUIT`, `COMMAND`, `INFO`, `CONFIG`) are answered by the server that
/// holds the connection and never reach this trait; everything else does.
pub trait Commands: Send + Sync + 'static {
    /// The service's operation.
    type Op: Send + Sync + 'static;
    /// The service's reply.
    type Reply;

    /// The operation `args` asks for (`args[0]` is the command name, in
    /// any case; `args` is never empty), or the reply to send without
    /// executing anything: an unknown command, a wrong number of
    /// arguments, a value that does not parse.
    fn operation(&self, args: &[Bytes]) -> Result<Self::Op, Reply>;

    /// `reply`, the outcome of `op`, as Redis would say it.
    fn reply(&self, op: &Self::Op, reply: Self::Reply) -> Reply;

    /// The names of the commands [`Commands::operation`] knows, in lower
    /// case (for references and checks; none by default).
    fn names(&self) -> Vec<&'static str> {
        Vec::new()
    }

    /// How long a command that waits for data (`BLPOP` and its kin) waits
    /// at most: `Some(Ok(None))` for ever, `Some(Ok(Some(d)))` at most
    /// `d`, `Some(Err(reply))` if its timeout does not parse; `None` for a
    /// command that does not wait (all of them by default). Outside a
    /// transaction such a command's operation is tried, and tried again
    /// while [`Commands::nothing_yet`] says so, until its time is up; in a
    /// transaction it is tried once, as Redis runs it there.
    fn waits(&self, args: &[Bytes]) -> Option<Result<Option<std::time::Duration>, Reply>> {
        let _ = args;
        None
    }

    /// Whether `reply`, the outcome of a waiting command's operation, says
    /// there was nothing to take yet.
    fn nothing_yet(&self, op: &Self::Op, reply: &Self::Reply) -> bool {
        let _ = (op, reply);
        false
    }

    /// The operation that reads the versions of `keys` for `WATCH`, or
    /// the reply that refuses it: by default every `WATCH` is refused (the
    /// service keeps no versions). A service that has them also gives
    /// [`Commands::versions`] and [`Commands::exec`].
    fn watch(&self, keys: &[Bytes]) -> Result<Self::Op, Reply> {
        let _ = keys;
        Err(Reply::error("ERR WATCH is not supported by this service: its transactions run whole, in the log's order"))
    }

    /// The versions in `reply`, the outcome of a [`Commands::watch`]
    /// operation, one per key (opaque numbers the service compares at
    /// `EXEC`), or the reply to send instead.
    fn versions(&self, reply: Self::Reply) -> Result<Vec<u64>, Reply> {
        let _ = reply;
        Err(Reply::error("ERR WATCH is not supported by this service"))
    }

    /// One operation that runs `ops` in order if each watched key is still
    /// at the version [`Commands::versions`] gave for it, or the reply that
    /// refuses the transaction. Its reply, through [`Commands::reply`], is
    /// the array of the operations' replies, or Redis's nil array when a
    /// watched key changed.
    fn exec(&self, watched: Vec<(Bytes, u64)>, ops: Vec<Self::Op>) -> Result<Self::Op, Reply> {
        let _ = (watched, ops);
        Err(Reply::error("ERR WATCH is not supported by this service"))
    }

    /// The reply of a waiting command whose time is up: Redis 7.0's nil
    /// array by default, which `BLPOP` and `BLMOVE` alike answer.
    fn timed_out(&self, op: &Self::Op) -> Reply {
        let _ = op;
        Reply::null_array()
    }
}

/// The error Redis sends for a command it does not know.
pub fn unknown_command(args: &[Bytes]) -> Reply {
    // As Redis 7 writes it: the name cut at 128 bytes, then each argument
    // quoted and followed by a space, until 128 bytes of them.
    let cut = |a: &[u8], n: usize| String::from_utf8_lossy(&a[..a.len().min(n)]).into_owned();
    let name = args.first().map_or_else(String::new, |a| cut(a, 128));
    let mut rest = String::new();
    for a in args.iter().skip(1) {
        if rest.len() >= 128 {
            break;
        }
        rest = format!("{rest}'{}' ", cut(a, 128 - rest.len()));
    }
    Reply::error(format!("ERR unknown command '{name}', with args beginning with: {rest}"))
}

/// The error Redis sends for a command with the wrong number of arguments.
pub fn wrong_arity(name: &str) -> Reply {
    Reply::error(format!("ERR wrong number of arguments for '{}' command", name.to_ascii_lowercase()))
}
