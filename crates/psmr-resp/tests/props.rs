//! Properties of the request parser over arbitrary and adversarial streams.

use bytes::BytesMut;
use proptest::prelude::*;
use proptest::sample::Index;
use psmr_resp::{encode_request, parse_request, Limits, ProtocolError, Reply, Request, RequestParser, Version};

/// Small enough that generated streams hit every limit.
const TIGHT: Limits = Limits { args_max: 4, bulk_max: 32, request_max: 128, inline_max: 24 };

type Outcome = (Vec<Request>, Option<ProtocolError>);

fn limits() -> impl Strategy<Value = Limits> {
    prop_oneof![Just(Limits::default()), Just(TIGHT)]
}

fn args() -> impl Strategy<Value = Vec<Vec<u8>>> {
    prop::collection::vec(prop::collection::vec(any::<u8>(), 0..40), 1..6)
}

/// Valid requests, empty ones, inline lines and garbage, to be concatenated.
fn fragment() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => args().prop_map(|a| encoded(&a)),
        1 => Just(b"*0\r\n".to_vec()),
        2 => "[A-Za-z \"'\\\\]{0,30}\r?\n".prop_map(String::into_bytes),
        1 => prop::collection::vec(any::<u8>(), 0..16),
        1 => prop::collection::vec(prop::sample::select(b"*$\r\n-0123456789x".to_vec()), 0..16),
    ]
}

fn encoded(args: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    encode_request(args, &mut out);
    out
}

/// Feeds `stream` to a [`RequestParser`] in pieces cut at `cuts`.
fn fed_in_pieces(limits: Limits, stream: &[u8], cuts: &[Index]) -> Outcome {
    let mut points: Vec<usize> = cuts.iter().map(|i| i.index(stream.len() + 1)).collect();
    points.push(stream.len());
    points.sort_unstable();
    let mut parser = RequestParser::new(limits);
    let (mut buf, mut requests, mut from) = (BytesMut::new(), Vec::new(), 0);
    for to in points {
        buf.extend_from_slice(&stream[from..to]);
        from = to;
        loop {
            match parser.next(&mut buf) {
                Ok(Some(request)) => requests.push(request),
                Ok(None) => break,
                Err(e) => return (requests, Some(e)),
            }
        }
    }
    (requests, None)
}

/// Parses `stream` whole with the stateless [`parse_request`].
fn parsed_whole(limits: Limits, stream: &[u8]) -> Outcome {
    let (mut requests, mut at) = (Vec::new(), 0);
    loop {
        match parse_request(&stream[at..], &limits) {
            Ok(Some((request, used))) => {
                assert!(used > 0 && at + used <= stream.len());
                requests.push(request);
                at += used;
            }
            Ok(None) => return (requests, None),
            Err(e) => return (requests, Some(e)),
        }
    }
}

fn args_of(request: &Request) -> Vec<Vec<u8>> {
    request.args.iter().map(|a| a.to_vec()).collect()
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(
        limits in limits(),
        bytes in prop::collection::vec(any::<u8>(), 0..512),
        cuts in prop::collection::vec(any::<Index>(), 0..8),
    ) {
        let whole = parsed_whole(limits, &bytes);
        let pieces = fed_in_pieces(limits, &bytes, &cuts);
        prop_assert_eq!(whole, pieces);
    }

    #[test]
    fn encoded_request_parses_back(args in args()) {
        let wire = encoded(&args);
        let (request, used) = parse_request(&wire, &Limits::default()).unwrap().unwrap();
        prop_assert_eq!(args_of(&request), args);
        prop_assert_eq!(used, wire.len());
    }

    #[test]
    fn split_stream_parses_like_whole_stream(
        limits in limits(),
        fragments in prop::collection::vec(fragment(), 0..8),
        cuts in prop::collection::vec(any::<Index>(), 0..12),
    ) {
        let stream = fragments.concat();
        let whole = parsed_whole(limits, &stream);
        prop_assert_eq!(fed_in_pieces(limits, &stream, &[]), whole.clone());
        prop_assert_eq!(fed_in_pieces(limits, &stream, &cuts), whole);
    }

    #[test]
    fn pipelined_requests_come_out_in_order(batch in prop::collection::vec(args(), 1..8)) {
        let wires: Vec<Vec<u8>> = batch.iter().map(|a| encoded(a)).collect();
        let stream = wires.concat();
        let mut at = 0;
        for (args, wire) in batch.iter().zip(&wires) {
            let (request, used) = parse_request(&stream[at..], &Limits::default()).unwrap().unwrap();
            prop_assert_eq!(&args_of(&request), args);
            prop_assert_eq!(used, wire.len());
            at += used;
        }
        prop_assert_eq!(parse_request(&stream[at..], &Limits::default()), Ok(None));
    }

    #[test]
    fn text_replies_stay_one_line(text in ".*", error in any::<bool>(), resp3 in any::<bool>()) {
        let reply = if error { Reply::error(text) } else { Reply::simple(text) };
        let version = if resp3 { Version::Resp3 } else { Version::Resp2 };
        let wire = reply.to_bytes(version);
        prop_assert!(wire.ends_with(b"\r\n"));
        prop_assert!(!wire[..wire.len() - 2].iter().any(|b| *b == b'\r' || *b == b'\n'));
    }
}
