//! Requests: multibulk arrays of bulk strings and inline command lines,
//! parsed incrementally within [`Limits`].

use std::ops::Range;

use bytes::{Buf, Bytes, BytesMut};

use crate::inline::split_args;
use crate::reply::{bulk, header};
use crate::Reply;

/// The smallest element, `$0\r\n\r\n`: a declared count can be checked against
/// `request_max`, and capacity capped by the bytes at hand, before any
/// element arrives.
const MIN_ELEMENT: usize = 6;

/// Bounds on what one request may declare or send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most arguments in one multibulk request (Redis: 1024 * 1024).
    pub args_max: usize,
    /// Most bytes in one argument (Redis `proto-max-bulk-len`: 512 MiB).
    pub bulk_max: usize,
    /// Most bytes of one multibulk request, framing included (Redis
    /// `client-query-buffer-limit`: 1 GiB). Inline lines have `inline_max`.
    pub request_max: usize,
    /// Longest inline line and longest `*`/`$` count line, terminator aside
    /// (Redis: 64 KiB).
    pub inline_max: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            args_max: 1024 * 1024,
            bulk_max: 512 * 1024 * 1024,
            request_max: 1024 * 1024 * 1024,
            inline_max: 64 * 1024,
        }
    }
}

/// A request that breaks the protocol or the [`Limits`]; the connection
/// cannot be resynchronised after it. `Display` is Redis's own message where
/// Redis has one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    /// A `*` count that is not a number or is over `args_max`.
    #[error("Protocol error: invalid multibulk length")]
    InvalidMultibulkLength,
    /// A `$` length that is not a number, negative, or over `bulk_max`.
    #[error("Protocol error: invalid bulk length")]
    InvalidBulkLength,
    /// An array element that is not a bulk string.
    #[error("Protocol error: expected '$', got '{}'", shown(*.0))]
    ExpectedBulk(u8),
    /// An inline line over `inline_max`.
    #[error("Protocol error: too big inline request")]
    TooBigInline,
    /// A `*` count line over `inline_max`.
    #[error("Protocol error: too big mbulk count string")]
    TooBigMultibulkCount,
    /// A `$` length line over `inline_max`.
    #[error("Protocol error: too big bulk count string")]
    TooBigBulkCount,
    /// An inline line with an unclosed quote, or a closing quote inside a word.
    #[error("Protocol error: unbalanced quotes in request")]
    UnbalancedQuotes,
    /// Declared sizes adding up beyond `request_max`; Redis closes the
    /// connection silently here, so the message is psmr's.
    #[error("Protocol error: too big request")]
    TooBigRequest,
    /// Bulk data not followed by `\r\n`; Redis skips two bytes blindly, psmr
    /// refuses to guess.
    #[error("Protocol error: expected '\\r\\n' after bulk data")]
    MissingBulkTerminator,
}

/// Redis prints the byte raw; unprintable ones are escaped here so that the
/// message stays one readable line.
fn shown(byte: u8) -> String {
    match byte {
        b' '..=b'~' => char::from(byte).to_string(),
        _ => byte.escape_ascii().to_string(),
    }
}

impl From<ProtocolError> for Reply {
    /// The reply Redis sends before closing the connection.
    fn from(error: ProtocolError) -> Self {
        Reply::error(format!("ERR {error}"))
    }
}

/// One command: its name and then its arguments, never empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The command name and its arguments, as sent.
    pub args: Vec<Bytes>,
}

/// Appends the multibulk form of a command to `out`, as clients send it.
pub fn encode_request<A: AsRef<[u8]>>(args: &[A], out: &mut Vec<u8>) {
    header(out, b'*', args.len());
    args.iter().for_each(|arg| bulk(out, arg.as_ref()));
}

/// Parses the first request in `buf`: `Ok(None)` while it is incomplete,
/// else the request and the bytes it took, empty requests before it included.
///
/// Stateless, so each call re-scans `buf` from its start; a connection should
/// use [`RequestParser`], which does not.
pub fn parse_request(buf: &[u8], limits: &Limits) -> Result<Option<(Request, usize)>, ProtocolError> {
    let mut scanner = Scanner::default();
    let Some(parsed) = scanner.next(buf, limits)? else {
        return Ok(None);
    };
    let frame = || Bytes::copy_from_slice(buf.get(scanner.start..scanner.pos).unwrap_or_default());
    Ok(Some((parsed.into_request(frame), scanner.pos)))
}

/// Parses the requests of one connection as its bytes arrive, remembering
/// its progress so that no byte is scanned twice.
#[derive(Debug, Default)]
pub struct RequestParser {
    limits: Limits,
    scanner: Scanner,
}

impl RequestParser {
    /// A parser enforcing `limits`.
    pub fn new(limits: Limits) -> Self {
        Self { limits, scanner: Scanner::default() }
    }

    /// The limits this parser enforces.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Takes the next request off the front of `buf`, or `Ok(None)` until
    /// more bytes are appended. Between calls `buf` may only grow at its end.
    /// The arguments share `buf`'s allocation rather than being copied.
    pub fn next(&mut self, buf: &mut BytesMut) -> Result<Option<Request>, ProtocolError> {
        let parsed = self.scanner.next(buf, &self.limits)?;
        let start = self.scanner.start;
        // Skipped empty requests go now, so a stream of them cannot pile up.
        buf.advance(start);
        let Some(parsed) = parsed else {
            self.scanner.rebase(start);
            return Ok(None);
        };
        let frame = buf.split_to(self.scanner.pos - start).freeze();
        self.scanner = Scanner::default();
        Ok(Some(parsed.into_request(|| frame)))
    }
}

/// A complete request, located in the buffer it was parsed from.
enum Parsed {
    /// Argument ranges relative to the request's first byte.
    Multibulk(Vec<Range<usize>>),
    /// Inline arguments, unescaped and so copied.
    Inline(Vec<Vec<u8>>),
}

impl Parsed {
    fn into_request(self, frame: impl FnOnce() -> Bytes) -> Request {
        let args = match self {
            Self::Multibulk(ranges) => {
                let frame = frame();
                ranges.into_iter().map(|range| frame.slice(range)).collect()
            }
            Self::Inline(args) => args.into_iter().map(Bytes::from).collect(),
        };
        Request { args }
    }
}

/// What a step found: nothing complete yet, an empty request to skip, or
/// something complete.
enum Step<T> {
    Pending,
    Skipped,
    Done(T),
}

/// The resumable state machine behind both entry points; offsets index the
/// buffer it is fed, which may only grow between calls.
#[derive(Debug, Default)]
struct Scanner {
    /// First byte of the request being parsed; earlier ones were empty requests.
    start: usize,
    /// First byte not yet parsed.
    pos: usize,
    /// How far an unterminated line at `pos` was searched for its `\n`.
    scanned: usize,
    multibulk: Option<Multibulk>,
}

/// A multibulk request whose header has been read.
#[derive(Debug)]
struct Multibulk {
    left: usize,
    args: Vec<Range<usize>>,
    /// The declared length of the bulk whose data is awaited.
    pending: Option<usize>,
}

impl Scanner {
    fn next(&mut self, buf: &[u8], limits: &Limits) -> Result<Option<Parsed>, ProtocolError> {
        if self.pos > buf.len() || self.scanned > buf.len() {
            // The caller broke the grow-only contract; starting over beats
            // indexing past the end.
            *self = Self::default();
        }
        while self.multibulk.is_none() {
            self.start = self.pos;
            let Some(&first) = buf.get(self.pos) else {
                return Ok(None);
            };
            let step = if first == b'*' {
                self.header(buf, limits)?
            } else {
                match self.inline(buf, limits)? {
                    Step::Done(args) => return Ok(Some(Parsed::Inline(args))),
                    Step::Pending => Step::Pending,
                    Step::Skipped => Step::Skipped,
                }
            };
            if let Step::Pending = step {
                return Ok(None);
            }
        }
        Ok(self.elements(buf, limits)?.map(Parsed::Multibulk))
    }

    /// Shifts offsets after the caller dropped the first `n` bytes.
    fn rebase(&mut self, n: usize) {
        self.start -= n;
        self.pos -= n;
        self.scanned = self.scanned.saturating_sub(n);
    }

    /// The line at `pos`, up to but excluding its `\n`, and the offset after
    /// it. It may hold `max` bytes plus a `\r`, whether or not its `\n` has
    /// arrived, so the outcome does not depend on how the bytes were split.
    fn line<'b>(
        &mut self,
        buf: &'b [u8],
        max: usize,
        too_long: ProtocolError,
    ) -> Result<Option<(&'b [u8], usize)>, ProtocolError> {
        let rest = buf.get(self.pos..).unwrap_or_default();
        let from = self.scanned.saturating_sub(self.pos);
        let unseen = rest.get(from..).unwrap_or_default();
        let newline = unseen.iter().position(|&b| b == b'\n').map(|i| from + i);
        if newline.unwrap_or(rest.len()) > max.saturating_add(1) {
            return Err(too_long);
        }
        let Some(end) = newline else {
            self.scanned = buf.len();
            return Ok(None);
        };
        self.scanned = 0;
        Ok(Some((&rest[..end], self.pos + end + 1)))
    }

    /// A `*n` or `$n` line: the number and the offset after the line.
    fn count(
        &mut self,
        buf: &[u8],
        limits: &Limits,
        too_long: ProtocolError,
        invalid: ProtocolError,
    ) -> Result<Option<(i64, usize)>, ProtocolError> {
        let Some((line, next)) = self.line(buf, limits.inline_max, too_long)? else {
            return Ok(None);
        };
        let digits = line.get(1..).and_then(|l| l.strip_suffix(b"\r"));
        let n = digits.and_then(parse_integer).ok_or(invalid)?;
        Ok(Some((n, next)))
    }

    fn inline(&mut self, buf: &[u8], limits: &Limits) -> Result<Step<Vec<Vec<u8>>>, ProtocolError> {
        let Some((line, next)) = self.line(buf, limits.inline_max, ProtocolError::TooBigInline)? else {
            return Ok(Step::Pending);
        };
        let args = split_args(line.strip_suffix(b"\r").unwrap_or(line))?;
        self.pos = next;
        Ok(if args.is_empty() { Step::Skipped } else { Step::Done(args) })
    }

    fn header(&mut self, buf: &[u8], limits: &Limits) -> Result<Step<()>, ProtocolError> {
        use ProtocolError::{InvalidMultibulkLength as Invalid, TooBigMultibulkCount};
        let Some((n, next)) = self.count(buf, limits, TooBigMultibulkCount, Invalid)? else {
            return Ok(Step::Pending);
        };
        self.pos = next;
        if n <= 0 {
            // Redis ignores `*0`, `*-1` and any other non-positive count.
            return Ok(Step::Skipped);
        }
        let n = usize::try_from(n).ok().filter(|&n| n <= limits.args_max).ok_or(Invalid)?;
        if (next - self.start).saturating_add(n.saturating_mul(MIN_ELEMENT)) > limits.request_max {
            return Err(ProtocolError::TooBigRequest);
        }
        // A count is only a claim: reserve what the bytes at hand could fill.
        let room = (buf.len() - next) / MIN_ELEMENT;
        let args = Vec::with_capacity(n.min(room));
        self.multibulk = Some(Multibulk { left: n, args, pending: None });
        Ok(Step::Done(()))
    }

    fn elements(&mut self, buf: &[u8], limits: &Limits) -> Result<Option<Vec<Range<usize>>>, ProtocolError> {
        let Some(mut mb) = self.multibulk.take() else {
            return Ok(None);
        };
        while mb.left > 0 {
            let len = match mb.pending {
                Some(len) => len,
                None => match self.bulk_len(buf, limits, mb.left)? {
                    Some(len) => len,
                    None => break,
                },
            };
            mb.pending = Some(len);
            let end = self.pos.saturating_add(len);
            let Some(terminator) = buf.get(end..end.saturating_add(2)) else {
                break;
            };
            if terminator != b"\r\n" {
                return Err(ProtocolError::MissingBulkTerminator);
            }
            mb.args.push(self.pos - self.start..end - self.start);
            self.pos = end + 2;
            mb.pending = None;
            mb.left -= 1;
        }
        if mb.left > 0 {
            self.multibulk = Some(mb);
            return Ok(None);
        }
        Ok(Some(mb.args))
    }

    /// Reads a `$len` line, checking `len` against the limits before any of
    /// the data arrives.
    fn bulk_len(&mut self, buf: &[u8], limits: &Limits, left: usize) -> Result<Option<usize>, ProtocolError> {
        use ProtocolError::{InvalidBulkLength as Invalid, TooBigBulkCount};
        let Some(&first) = buf.get(self.pos) else {
            return Ok(None);
        };
        if first != b'$' {
            return Err(ProtocolError::ExpectedBulk(first));
        }
        let Some((n, next)) = self.count(buf, limits, TooBigBulkCount, Invalid)? else {
            return Ok(None);
        };
        let len = usize::try_from(n).ok().filter(|&n| n <= limits.bulk_max).ok_or(Invalid)?;
        let others = (left - 1).saturating_mul(MIN_ELEMENT);
        let least = (next - self.start).saturating_add(len).saturating_add(2).saturating_add(others);
        if least > limits.request_max {
            return Err(ProtocolError::TooBigRequest);
        }
        self.pos = next;
        Ok(Some(len))
    }
}

/// Parses an integer exactly as Redis's `string2ll` does: an optional
/// `-`, then `0` or digits without a leading zero, within `i64`. No
/// spaces, no `+`, no `-0`. Redis reads lengths, counts and the numbers of
/// commands (`INCRBY k 5`) this way.
pub fn parse_integer(text: &[u8]) -> Option<i64> {
    if text == b"0" {
        return Some(0);
    }
    let (negative, digits) = match text.strip_prefix(b"-") {
        Some(digits) => (true, digits),
        None => (false, text),
    };
    if !matches!(digits.first(), Some(b'1'..=b'9')) {
        return None;
    }
    digits.iter().try_fold(0i64, |acc, &d| {
        let digit = i64::from(d.checked_sub(b'0').filter(|d| *d <= 9)?);
        let acc = acc.checked_mul(10)?;
        if negative {
            acc.checked_sub(digit)
        } else {
            acc.checked_add(digit)
        }
    })
}

#[cfg(test)]
mod tests;
