//! A small blocking HTTP/1.1 client over one `TcpStream`: enough to drive
//! etcd's JSON gateway (`POST` with a body, keep-alive, one request at a
//! time), with every read bounded. The server's bytes are hostile: an
//! oversized or malformed answer is an error, never a panic or an
//! unbounded allocation.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;
use thiserror::Error;

/// Longest status or header line, bytes.
const LINE_BYTES_MAX: u64 = 8192;
/// Most header lines in one response.
const HEADERS_MAX: usize = 100;
/// Largest response body, bytes (etcd's answers to a put are ~120).
pub const BODY_BYTES_MAX: usize = 1 << 20;

/// What can go wrong with one exchange.
#[derive(Debug, Error)]
pub enum HttpError {
    /// Connecting, sending or receiving failed (a timeout included).
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The server closed the connection before a whole response.
    #[error("the server closed the connection in the middle of a response")]
    Closed,
    /// The response is not HTTP/1.x as this client reads it.
    #[error("malformed response: {0}")]
    Malformed(String),
    /// The body is larger than [`BODY_BYTES_MAX`].
    #[error("response body of {0} bytes is above the limit of {max}", max = BODY_BYTES_MAX)]
    TooLarge(u64),
}

/// One response: its status code and body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    /// The status code (200 ...).
    pub status: u16,
    /// The body, de-chunked.
    pub body: Vec<u8>,
}

/// One keep-alive connection to an HTTP/1.1 server.
pub struct HttpConn {
    reader: BufReader<TcpStream>,
    host: String,
    /// The server said `Connection: close`: no further request.
    closed: bool,
}

impl HttpConn {
    /// Connects to `addr`; every later read or write waits at most
    /// `timeout`.
    pub fn connect(addr: SocketAddr, timeout: Duration) -> Result<Self, HttpError> {
        let stream = TcpStream::connect_timeout(&addr, timeout)?;
        // One small request at a time: waiting to coalesce would only add
        // latency.
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        Ok(Self { reader: BufReader::new(stream), host: addr.to_string(), closed: false })
    }

    /// Whether the server asked to close the connection after its last
    /// response.
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// Sends `POST path` with a JSON `body` and reads the response.
    pub fn post_json(&mut self, path: &str, body: &[u8]) -> Result<Response, HttpError> {
        if self.closed {
            return Err(HttpError::Closed);
        }
        // One write for the request line, headers and body: one segment.
        let mut request = format!(
            "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            self.host,
            body.len()
        )
        .into_bytes();
        request.extend_from_slice(body);
        self.reader.get_mut().write_all(&request)?;
        let (response, close) = read_response(&mut self.reader)?;
        self.closed = close;
        Ok(response)
    }
}

/// Reads one line ending in `\n`, at most [`LINE_BYTES_MAX`] bytes,
/// without its line end.
fn read_line(r: &mut impl BufRead) -> Result<String, HttpError> {
    let mut line = Vec::new();
    r.take(LINE_BYTES_MAX).read_until(b'\n', &mut line)?;
    match line.last() {
        Some(b'\n') => {}
        None => return Err(HttpError::Closed),
        Some(_) if line.len() as u64 >= LINE_BYTES_MAX => {
            return Err(HttpError::Malformed(format!("a line longer than {LINE_BYTES_MAX} bytes")))
        }
        Some(_) => return Err(HttpError::Closed),
    }
    while matches!(line.last(), Some(b'\n' | b'\r')) {
        line.pop();
    }
    String::from_utf8(line).map_err(|_| HttpError::Malformed("a line that is not UTF-8".into()))
}

/// How a response's body is delimited.
enum Framing {
    Length(u64),
    Chunked,
}

/// Reads a status line, headers and body; also says whether the server
/// will close the connection.
pub fn read_response(r: &mut impl BufRead) -> Result<(Response, bool), HttpError> {
    let status = parse_status_line(&read_line(r)?)?;
    let (framing, close) = read_headers(r)?;
    let body = match framing {
        Some(Framing::Length(n)) => read_exact_body(r, n)?,
        Some(Framing::Chunked) => read_chunked(r)?,
        // 1xx, 204 and 304 have no body; anything else must say how long.
        None if status < 200 || status == 204 || status == 304 => Vec::new(),
        None => return Err(HttpError::Malformed("a body with neither Content-Length nor chunked encoding".into())),
    };
    Ok((Response { status, body }, close))
}

fn parse_status_line(line: &str) -> Result<u16, HttpError> {
    let mut parts = line.splitn(3, ' ');
    let (version, code) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    if !version.starts_with("HTTP/1.") {
        return Err(HttpError::Malformed(format!("status line {line:?}")));
    }
    code.parse::<u16>()
        .ok()
        .filter(|c| (100..=599).contains(c))
        .ok_or_else(|| HttpError::Malformed(format!("status code in {line:?}")))
}

/// The body's framing (if the headers give one) and `Connection: close`.
fn read_headers(r: &mut impl BufRead) -> Result<(Option<Framing>, bool), HttpError> {
    let (mut framing, mut close) = (None, false);
    for _ in 0..HEADERS_MAX {
        let line = read_line(r)?;
        if line.is_empty() {
            return Ok((framing, close));
        }
        let (name, value) =
            line.split_once(':').ok_or_else(|| HttpError::Malformed(format!("header line {line:?}")))?;
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            let n = value.parse().map_err(|_| HttpError::Malformed(format!("Content-Length {value:?}")))?;
            framing = Some(Framing::Length(n));
        } else if name.eq_ignore_ascii_case("transfer-encoding") && value.eq_ignore_ascii_case("chunked") {
            framing = Some(Framing::Chunked);
        } else if name.eq_ignore_ascii_case("connection") && value.eq_ignore_ascii_case("close") {
            close = true;
        }
    }
    Err(HttpError::Malformed(format!("more than {HEADERS_MAX} header lines")))
}

fn read_exact_body(r: &mut impl Read, n: u64) -> Result<Vec<u8>, HttpError> {
    if n > BODY_BYTES_MAX as u64 {
        return Err(HttpError::TooLarge(n));
    }
    let mut body = vec![0; n as usize];
    r.read_exact(&mut body).map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => HttpError::Closed,
        _ => HttpError::Io(e),
    })?;
    Ok(body)
}

/// A chunked body: hex sizes, each chunk followed by CRLF, a last chunk
/// of size 0, then trailers up to an empty line.
fn read_chunked(r: &mut impl BufRead) -> Result<Vec<u8>, HttpError> {
    let mut body = Vec::new();
    loop {
        let line = read_line(r)?;
        let hex = line.split(';').next().unwrap_or("").trim();
        let size = u64::from_str_radix(hex, 16).map_err(|_| HttpError::Malformed(format!("chunk size {line:?}")))?;
        if size == 0 {
            break;
        }
        let total = body.len() as u64 + size;
        if total > BODY_BYTES_MAX as u64 {
            return Err(HttpError::TooLarge(total));
        }
        body.extend(read_exact_body(r, size)?);
        if !read_line(r)?.is_empty() {
            return Err(HttpError::Malformed("no CRLF after a chunk".into()));
        }
    }
    for _ in 0..HEADERS_MAX {
        if read_line(r)?.is_empty() {
            return Ok(body);
        }
    }
    Err(HttpError::Malformed(format!("more than {HEADERS_MAX} trailer lines")))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::net::TcpListener;

    /// A request as the fake server saw it.
    pub(crate) struct Seen {
        pub(crate) head: String,
        pub(crate) body: Vec<u8>,
    }

    /// A server on loopback that answers each request of one connection
    /// with the next of `answers` (raw bytes), then closes it; returns
    /// its address and a handle that yields the requests it saw.
    pub(crate) fn fake_server(answers: Vec<Vec<u8>>) -> (SocketAddr, std::thread::JoinHandle<Vec<Seen>>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let handle = std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let mut reader = BufReader::new(stream);
            let mut seen = Vec::new();
            for answer in answers {
                let mut head = String::new();
                let mut length = 0;
                loop {
                    let line = read_line(&mut reader).unwrap();
                    if line.is_empty() {
                        break;
                    }
                    if let Some(v) = line.strip_prefix("Content-Length: ") {
                        length = v.parse().unwrap();
                    }
                    head.push_str(&line);
                    head.push('\n');
                }
                let body = read_exact_body(&mut reader, length).unwrap();
                seen.push(Seen { head, body });
                reader.get_mut().write_all(&answer).unwrap();
            }
            seen
        });
        (addr, handle)
    }

    fn conn(addr: SocketAddr) -> HttpConn {
        HttpConn::connect(addr, Duration::from_secs(10)).unwrap()
    }

    #[test]
    fn two_requests_share_one_connection() {
        let ok = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}".to_vec();
        let (addr, server) = fake_server(vec![ok.clone(), ok]);
        let mut c = conn(addr);
        for _ in 0..2 {
            assert_eq!(
                c.post_json("/v3/kv/put", b"{\"a\":1}").unwrap(),
                Response { status: 200, body: b"{}".to_vec() }
            );
        }
        let seen = server.join().unwrap();
        assert_eq!(seen.len(), 2, "the fake server accepts once");
        assert!(seen[0].head.starts_with("POST /v3/kv/put HTTP/1.1\n"));
        assert!(seen[0].head.contains(&format!("Host: {addr}\n")));
        assert_eq!(seen[1].body, b"{\"a\":1}");
    }

    #[test]
    fn chunked_bodies_and_connection_close_are_understood() {
        let answer = b"HTTP/1.1 503 Service Unavailable\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n\
                       4\r\nabcd\r\n3;ext=1\r\nefg\r\n0\r\nTrailer: x\r\n\r\n"
            .to_vec();
        let (addr, server) = fake_server(vec![answer]);
        let mut c = conn(addr);
        assert_eq!(c.post_json("/", b"").unwrap(), Response { status: 503, body: b"abcdefg".to_vec() });
        assert!(c.is_closed());
        assert!(matches!(c.post_json("/", b""), Err(HttpError::Closed)));
        server.join().unwrap();
    }

    fn parse(raw: &[u8]) -> Result<(Response, bool), HttpError> {
        read_response(&mut BufReader::new(raw))
    }

    #[test]
    fn hostile_responses_are_errors() {
        let cases: [(&[u8], &str); 9] = [
            (b"", "closed"),
            (b"SSH-2.0-OpenSSH\r\n\r\n", "status line"),
            (b"HTTP/1.1 abc OK\r\n\r\n", "status code"),
            (b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n", "header line"),
            (b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", "Content-Length"),
            (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", "closed"),
            (b"HTTP/1.1 200 OK\r\nContent-Length: 99999999999\r\n\r\n", "above the limit"),
            (b"HTTP/1.1 200 OK\r\n\r\n{}", "neither Content-Length"),
            (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "chunk size"),
        ];
        for (raw, want) in cases {
            let err = parse(raw).unwrap_err().to_string();
            assert!(err.contains(want), "{:?}: {err}", String::from_utf8_lossy(raw));
        }
        let long = [b"HTTP/1.1 200 OK\r\nX: ".as_slice(), &vec![b'a'; 10_000], b"\r\n\r\n"].concat();
        assert!(parse(&long).unwrap_err().to_string().contains("longer than"));
        let many = [b"HTTP/1.1 200 OK\r\n".as_slice(), &b"X: y\r\n".repeat(200), b"\r\n"].concat();
        assert!(parse(&many).unwrap_err().to_string().contains("header lines"));
        let huge_chunks =
            [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".as_slice(), b"FFFFFFFF\r\n"].concat();
        assert!(matches!(parse(&huge_chunks), Err(HttpError::TooLarge(_))));
        assert_eq!(parse(b"HTTP/1.1 204 No Content\r\n\r\n").unwrap().0.status, 204);
    }
}
