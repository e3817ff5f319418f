//! Replies, encoded for the protocol version a connection negotiated.

use std::fmt::Display;
use std::io::Write;

use bytes::Bytes;

const CRLF: &[u8] = b"\r\n";

/// The protocol version a connection speaks; `HELLO 3` switches to RESP3.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Version {
    /// RESP2, what every connection starts with.
    #[default]
    Resp2,
    /// RESP3: distinct null and map types.
    Resp3,
}

/// A reply a Redis-compatible server sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// `+text`; a `\r` or `\n` in it is sent as a space.
    Simple(String),
    /// `-CODE message`; a `\r` or `\n` in it is sent as a space.
    Error(String),
    /// `:n`.
    Integer(i64),
    /// `$len` and the bytes.
    Bulk(Bytes),
    /// A missing value: `$-1` in RESP2, `_` in RESP3.
    Null,
    /// A missing array: `*-1` in RESP2, `_` in RESP3.
    NullArray,
    /// `*n` and the elements.
    Array(Vec<Reply>),
    /// `%n` and key-value pairs in RESP3; a flat array of 2n in RESP2.
    Map(Vec<(Reply, Reply)>),
    /// A float, written as given (`1.5`, `inf`): `,text` in RESP3, a bulk
    /// string in RESP2.
    Double(String),
    /// Pairs (a sorted set's members and scores): an array of two-element
    /// arrays in RESP3, a flat array of 2n in RESP2.
    Pairs(Vec<(Reply, Reply)>),
}

impl Reply {
    /// `+OK`.
    pub fn ok() -> Self {
        Self::simple("OK")
    }

    /// A simple string.
    pub fn simple(text: impl Into<String>) -> Self {
        Self::Simple(text.into())
    }

    /// An error; `message` starts with its code, as in `ERR unknown command`.
    pub fn error(message: impl Into<String>) -> Self {
        Self::Error(message.into())
    }

    /// An integer.
    pub fn integer(n: i64) -> Self {
        Self::Integer(n)
    }

    /// A bulk string.
    pub fn bulk(bytes: impl Into<Bytes>) -> Self {
        Self::Bulk(bytes.into())
    }

    /// The null bulk string.
    pub fn null() -> Self {
        Self::Null
    }

    /// The null array.
    pub fn null_array() -> Self {
        Self::NullArray
    }

    /// An array.
    pub fn array(items: Vec<Reply>) -> Self {
        Self::Array(items)
    }

    /// A map.
    pub fn map(pairs: Vec<(Reply, Reply)>) -> Self {
        Self::Map(pairs)
    }

    /// Pairs.
    pub fn pairs(pairs: Vec<(Reply, Reply)>) -> Self {
        Self::Pairs(pairs)
    }

    /// A float, as its text.
    pub fn double(text: impl Into<String>) -> Self {
        Self::Double(text.into())
    }

    /// Appends the start of an array of `len` elements, in either version,
    /// for a reply whose elements are encoded one by one after it.
    pub fn encode_array_start(len: usize, out: &mut Vec<u8>) {
        header(out, b'*', len);
    }

    /// Appends the wire form of this reply in `version` to `out`.
    pub fn encode(&self, version: Version, out: &mut Vec<u8>) {
        match self {
            Self::Simple(text) => line(out, b'+', text),
            Self::Error(text) => line(out, b'-', text),
            Self::Integer(n) => header(out, b':', n),
            Self::Bulk(bytes) => bulk(out, bytes),
            Self::Double(text) => match version {
                Version::Resp2 => bulk(out, text.as_bytes()),
                Version::Resp3 => line(out, b',', text),
            },
            Self::Null => out.extend_from_slice(null(version, b"$-1\r\n")),
            Self::NullArray => out.extend_from_slice(null(version, b"*-1\r\n")),
            Self::Array(items) => {
                header(out, b'*', items.len());
                items.iter().for_each(|item| item.encode(version, out));
            }
            Self::Pairs(pairs) => match version {
                Version::Resp2 => {
                    header(out, b'*', pairs.len().saturating_mul(2));
                    pairs.iter().for_each(|(a, b)| {
                        a.encode(version, out);
                        b.encode(version, out);
                    });
                }
                Version::Resp3 => {
                    header(out, b'*', pairs.len());
                    pairs.iter().for_each(|(a, b)| {
                        header(out, b'*', 2);
                        a.encode(version, out);
                        b.encode(version, out);
                    });
                }
            },
            Self::Map(pairs) => {
                match version {
                    Version::Resp2 => header(out, b'*', pairs.len().saturating_mul(2)),
                    Version::Resp3 => header(out, b'%', pairs.len()),
                }
                for (key, value) in pairs {
                    key.encode(version, out);
                    value.encode(version, out);
                }
            }
        }
    }

    /// The wire form of this reply in `version`.
    pub fn to_bytes(&self, version: Version) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode(version, &mut out);
        out
    }
}

fn null(version: Version, resp2: &'static [u8]) -> &'static [u8] {
    match version {
        Version::Resp2 => resp2,
        Version::Resp3 => b"_\r\n",
    }
}

/// A line break inside would end the reply early and let the rest of the
/// text be read as a second, forged reply.
fn line(out: &mut Vec<u8>, prefix: u8, text: &str) {
    out.push(prefix);
    out.extend(text.bytes().map(|b| if b == b'\r' || b == b'\n' { b' ' } else { b }));
    out.extend_from_slice(CRLF);
}

pub(crate) fn header(out: &mut Vec<u8>, prefix: u8, n: impl Display) {
    out.push(prefix);
    // Writing to a Vec cannot fail.
    let _ = write!(out, "{n}");
    out.extend_from_slice(CRLF);
}

pub(crate) fn bulk(out: &mut Vec<u8>, bytes: &[u8]) {
    header(out, b'$', bytes.len());
    out.extend_from_slice(bytes);
    out.extend_from_slice(CRLF);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn both(reply: &Reply) -> (String, String) {
        let text = |v| String::from_utf8(reply.to_bytes(v)).unwrap();
        (text(Version::Resp2), text(Version::Resp3))
    }

    fn same(reply: Reply, wire: &str) {
        assert_eq!(both(&reply), (wire.to_owned(), wire.to_owned()));
    }

    #[test]
    fn scalars_golden() {
        same(Reply::ok(), "+OK\r\n");
        same(Reply::simple("PONG"), "+PONG\r\n");
        same(Reply::error("ERR unknown command 'x'"), "-ERR unknown command 'x'\r\n");
        same(Reply::integer(-42), ":-42\r\n");
        same(Reply::integer(i64::MIN), ":-9223372036854775808\r\n");
        same(Reply::bulk(&b"a\r\nb"[..]), "$4\r\na\r\nb\r\n");
        same(Reply::bulk(Vec::new()), "$0\r\n\r\n");
    }

    #[test]
    fn nulls_golden() {
        assert_eq!(both(&Reply::null()), ("$-1\r\n".into(), "_\r\n".into()));
        assert_eq!(both(&Reply::null_array()), ("*-1\r\n".into(), "_\r\n".into()));
    }

    #[test]
    fn arrays_golden() {
        same(Reply::array(vec![]), "*0\r\n");
        let nested = Reply::array(vec![Reply::integer(1), Reply::array(vec![Reply::bulk("x")])]);
        same(nested, "*2\r\n:1\r\n*1\r\n$1\r\nx\r\n");
        let with_null = Reply::array(vec![Reply::null()]);
        assert_eq!(both(&with_null), ("*1\r\n$-1\r\n".into(), "*1\r\n_\r\n".into()));
    }

    #[test]
    fn map_golden_hello_reply() {
        let hello =
            Reply::map(vec![(Reply::bulk("server"), Reply::bulk("psmr")), (Reply::bulk("proto"), Reply::integer(3))]);
        let (resp2, resp3) = both(&hello);
        assert_eq!(resp2, "*4\r\n$6\r\nserver\r\n$4\r\npsmr\r\n$5\r\nproto\r\n:3\r\n");
        assert_eq!(resp3, "%2\r\n$6\r\nserver\r\n$4\r\npsmr\r\n$5\r\nproto\r\n:3\r\n");
    }

    #[test]
    fn line_breaks_cannot_inject_a_reply() {
        same(Reply::error("ERR x\r\n+OK"), "-ERR x  +OK\r\n");
        same(Reply::simple("a\nb\rc"), "+a b c\r\n");
    }
}
