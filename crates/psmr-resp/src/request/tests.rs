use super::*;
use crate::Version;
use ProtocolError::*;

/// The arguments of a parsed request and the bytes it took.
type Outcome = Option<(Vec<Vec<u8>>, usize)>;

fn parse(input: &[u8]) -> Result<Outcome, ProtocolError> {
    parse_with(input, &Limits::default())
}

fn parse_with(input: &[u8], limits: &Limits) -> Result<Outcome, ProtocolError> {
    let parsed = parse_request(input, limits)?;
    Ok(parsed.map(|(req, used)| (req.args.iter().map(|a| a.to_vec()).collect(), used)))
}

fn args(words: &[&str]) -> Vec<Vec<u8>> {
    words.iter().map(|w| w.as_bytes().to_vec()).collect()
}

#[test]
fn multibulk_and_inline_parse() {
    let wire = b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n";
    assert_eq!(parse(wire), Ok(Some((args(&["GET", "k"]), wire.len()))));
    assert_eq!(parse(b"PING\r\n"), Ok(Some((args(&["PING"]), 6))));
    assert_eq!(parse(b"ECHO  hi\n"), Ok(Some((args(&["ECHO", "hi"]), 9))));
    assert_eq!(parse(b"SET \"a b\" 'c'\r\n"), Ok(Some((args(&["SET", "a b", "c"]), 15))));
}

#[test]
fn binary_bulk_keeps_its_bytes() {
    let wire = b"*1\r\n$4\r\n\r\n\0\xff\r\n";
    assert_eq!(parse(wire), Ok(Some((vec![b"\r\n\0\xff".to_vec()], wire.len()))));
}

#[test]
fn incomplete_requests_wait() {
    let wire = b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n";
    for cut in 0..wire.len() {
        assert_eq!(parse(&wire[..cut]), Ok(None), "cut at {cut}");
    }
    assert_eq!(parse(b"PING"), Ok(None));
    assert_eq!(parse(b"PING\r"), Ok(None));
}

#[test]
fn resp_garbage_at_top_level_is_an_inline_command() {
    assert_eq!(parse(b"+OK\r\n"), Ok(Some((args(&["+OK"]), 5))));
    assert_eq!(parse(b"$3\r\nfoo\r\n"), Ok(Some((args(&["$3"]), 4))));
    assert_eq!(parse(b"\x01\x02 x\r\n"), Ok(Some((vec![b"\x01\x02".to_vec(), b"x".to_vec()], 6))));
    assert_eq!(parse(b"\x00\x01\r\n"), Ok(None), "a NUL-led line is empty, so skipped");
}

#[test]
fn resp_garbage_in_multibulk_is_rejected() {
    let cases: &[(&[u8], ProtocolError)] = &[
        (b"*abc\r\n", InvalidMultibulkLength),
        (b"*+1\r\n", InvalidMultibulkLength),
        (b"*01\r\n", InvalidMultibulkLength),
        (b"*1\n", InvalidMultibulkLength),
        (b"*99999999999999999999\r\n", InvalidMultibulkLength),
        (b"*1\r\nx", ExpectedBulk(b'x')),
        (b"*1\r\n:1\r\n", ExpectedBulk(b':')),
        (b"*1\r\n*1\r\n", ExpectedBulk(b'*')),
        (b"*1\r\n$abc\r\n", InvalidBulkLength),
        (b"*1\r\n$-1\r\n", InvalidBulkLength),
        (b"*1\r\n$-0\r\n", InvalidBulkLength),
        (b"*1\r\n$3\r\nfooXY", MissingBulkTerminator),
    ];
    for (wire, error) in cases {
        assert_eq!(parse(wire), Err(*error), "{}", wire.escape_ascii());
    }
}

#[test]
fn bulk_length_of_2_pow_40_fails_before_its_data() {
    assert_eq!(parse(b"*1\r\n$1099511627776\r\n"), Err(InvalidBulkLength));
    let limits = Limits { bulk_max: 10, ..Limits::default() };
    assert_eq!(parse_with(b"*1\r\n$11\r\n", &limits), Err(InvalidBulkLength));
    assert_eq!(parse_with(b"*1\r\n$10\r\n", &limits), Ok(None));
}

#[test]
fn array_count_over_args_max_fails() {
    assert_eq!(parse(b"*1048577\r\n"), Err(InvalidMultibulkLength));
    assert_eq!(parse(b"*1048576\r\n"), Ok(None));
    let limits = Limits { args_max: 2, ..Limits::default() };
    assert_eq!(parse_with(b"*3\r\n", &limits), Err(InvalidMultibulkLength));
}

#[test]
fn ten_thousand_empty_strings_parse() {
    let mut wire = b"*10000\r\n".to_vec();
    (0..10_000).for_each(|_| wire.extend_from_slice(b"$0\r\n\r\n"));
    let (args, used) = parse(&wire).unwrap().unwrap();
    assert_eq!((args.len(), used), (10_000, wire.len()));
    assert!(args.iter().all(Vec::is_empty));
}

#[test]
fn declared_count_reserves_only_what_arrived() {
    let mut parser = RequestParser::default();
    let mut buf = BytesMut::from(&b"*1048576\r\n"[..]);
    assert_eq!(parser.next(&mut buf), Ok(None));
    assert_eq!(parser.scanner.multibulk.as_ref().unwrap().args.capacity(), 0);

    let mut parser = RequestParser::default();
    let mut buf = BytesMut::from(&b"*1048576\r\n$0\r\n\r\n$0\r\n\r\n"[..]);
    assert_eq!(parser.next(&mut buf), Ok(None));
    let mb = parser.scanner.multibulk.as_ref().unwrap();
    assert!(mb.args.capacity() < 16, "capacity {}", mb.args.capacity());
    assert_eq!((mb.args.len(), mb.left), (2, 1_048_574));
}

#[test]
fn unterminated_inline_line_over_inline_max_fails() {
    let max = Limits::default().inline_max;
    let mut line = vec![b'a'; max + 1];
    assert_eq!(parse(&line), Ok(None), "room is left for the \\r");
    line.push(b'a');
    assert_eq!(parse(&line), Err(TooBigInline));

    let mut exact = vec![b'a'; max];
    exact.extend_from_slice(b"\r\n");
    assert_eq!(parse(&exact).map(|p| p.map(|(_, used)| used)), Ok(Some(max + 2)));
    let mut over = vec![b'a'; max + 2];
    over.push(b'\n');
    assert_eq!(parse(&over), Err(TooBigInline), "terminated or not");
}

#[test]
fn overlong_count_lines_fail() {
    let limits = Limits { inline_max: 8, ..Limits::default() };
    assert_eq!(parse_with(b"*1111111111", &limits), Err(TooBigMultibulkCount));
    assert_eq!(parse_with(b"*1\r\n$1111111111", &limits), Err(TooBigBulkCount));
}

#[test]
fn declared_sizes_over_request_max_fail_before_the_data() {
    let limits = Limits { request_max: 100, ..Limits::default() };
    assert_eq!(parse_with(b"*2\r\n$90\r\n", &limits), Err(TooBigRequest));
    assert_eq!(parse_with(b"*20\r\n", &limits), Err(TooBigRequest));
    assert_eq!(parse_with(b"*1\r\n$89\r\n", &limits), Ok(None), "4 + 5 + 89 + 2 = 100");
}

#[test]
fn empty_requests_are_skipped() {
    let wire = b"*0\r\n*-1\r\n*-7\r\n\r\n \t \r\n\nPING\r\n";
    assert_eq!(parse(wire), Ok(Some((args(&["PING"]), wire.len()))));

    let mut parser = RequestParser::default();
    let mut buf = BytesMut::from(&b"*0\r\n\r\n*1\r\n$4\r\nPI"[..]);
    assert_eq!(parser.next(&mut buf), Ok(None));
    assert_eq!(&buf[..], b"*1\r\n$4\r\nPI", "skipped bytes are dropped at once");
    buf.extend_from_slice(b"NG\r\n");
    assert_eq!(parser.next(&mut buf).unwrap().unwrap().args, [Bytes::from("PING")]);
    assert!(buf.is_empty());
}

#[test]
fn large_bulk_arrives_in_pieces() {
    let mut wire = Vec::new();
    let value = vec![7u8; 100_000];
    encode_request(&[&b"SET"[..], b"k", &value], &mut wire);
    let mut parser = RequestParser::default();
    let mut buf = BytesMut::new();
    for chunk in wire.chunks(2048) {
        assert_eq!(parser.next(&mut buf), Ok(None));
        buf.extend_from_slice(chunk);
    }
    let request = parser.next(&mut buf).unwrap().unwrap();
    assert_eq!(request.args[2], value);
    assert_eq!(parser.next(&mut buf), Ok(None));
}

#[test]
fn shrunk_buffer_restarts_instead_of_panicking() {
    let mut parser = RequestParser::default();
    let mut buf = BytesMut::from(&b"*2\r\n$3\r\nGET\r\n$1"[..]);
    assert_eq!(parser.next(&mut buf), Ok(None));
    buf.truncate(2);
    assert_eq!(parser.next(&mut buf), Ok(None));
    buf.clear();
    buf.extend_from_slice(b"PING\r\n");
    assert_eq!(parser.next(&mut buf).unwrap().unwrap().args, [Bytes::from("PING")]);
}

#[test]
fn errors_display_redis_messages() {
    let cases = [
        (InvalidMultibulkLength, "Protocol error: invalid multibulk length"),
        (InvalidBulkLength, "Protocol error: invalid bulk length"),
        (ExpectedBulk(b'x'), "Protocol error: expected '$', got 'x'"),
        (ExpectedBulk(b'\r'), "Protocol error: expected '$', got '\\r'"),
        (TooBigInline, "Protocol error: too big inline request"),
        (TooBigMultibulkCount, "Protocol error: too big mbulk count string"),
        (TooBigBulkCount, "Protocol error: too big bulk count string"),
        (UnbalancedQuotes, "Protocol error: unbalanced quotes in request"),
        (TooBigRequest, "Protocol error: too big request"),
        (MissingBulkTerminator, "Protocol error: expected '\\r\\n' after bulk data"),
    ];
    for (error, message) in cases {
        assert_eq!(error.to_string(), message);
    }
    let reply = Reply::from(ExpectedBulk(b'x')).to_bytes(Version::Resp2);
    assert_eq!(reply, b"-ERR Protocol error: expected '$', got 'x'\r\n");
}

#[test]
fn unbalanced_quotes_in_inline_request() {
    assert_eq!(parse(b"GET \"k\r\n"), Err(UnbalancedQuotes));
}

#[test]
fn parse_int_follows_string2ll() {
    let ok: &[(&[u8], i64)] = &[(b"0", 0), (b"7", 7), (b"-12", -12), (b"9223372036854775807", i64::MAX)];
    for (text, n) in ok {
        assert_eq!(parse_integer(text), Some(*n));
    }
    assert_eq!(parse_integer(b"-9223372036854775808"), Some(i64::MIN));
    for text in [&b""[..], b"-", b"-0", b"00", b"01", b"+1", b" 1", b"1 ", b"9223372036854775808", b"1a"] {
        assert_eq!(parse_integer(text), None, "{}", text.escape_ascii());
    }
}
