//! The encoding of one log entry: a batch of client commands, each with
//! its client, sequence number and encoded operation. ClientIO encodes a
//! request's commands once ([`encode_command`]); the batcher concatenates
//! requests into an entry ([`EntryBuilder`]); every replica's service
//! manager decodes it without copying the operations ([`entry_commands`]).
//!
//! # Format
//!
//! Version 2 (this build writes it): a mark (`u32` [`MARK_V2`]), the
//! leader's [`Stamp`] (time in ms and seed, `u64` each), the command count
//! (`u32`), then per command the client and sequence number (`u64` each)
//! and the operation (`u32` length, bytes); all big-endian. Version 1, read
//! still (logs written before entries carried a time), has no mark and no
//! stamp: it starts with the count, which is never as large as the mark,
//! and reads as the zero stamp.

use psmr_model::wire::{Decoder, WireError, REQUEST_COMMANDS_MAX};
use psmr_model::Stamp;

/// What starts a version 2 entry: far above any command count a version 1
/// entry starts with.
pub const MARK_V2: u32 = 0xFFFF_FF02;

/// Bytes before the first command of a version 2 entry.
pub const HEADER_BYTES: usize = 24;

/// One command in a log entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EntryCommand {
    /// The client.
    pub client: u64,
    /// Its sequence number.
    pub seq: u64,
    /// The encoded operation.
    pub op: Vec<u8>,
}

/// A log entry being built, one command at a time, in the encoding
/// [`decode_entry`] reads (see the module documentation); its stamp is
/// zero until [`stamp`] sets it.
pub struct EntryBuilder {
    buf: Vec<u8>,
    count: u32,
}

impl Default for EntryBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl EntryBuilder {
    /// An entry with no command yet.
    pub fn new() -> Self {
        // The header goes in front once the count is known.
        Self { buf: vec![0; HEADER_BYTES], count: 0 }
    }

    /// Appends one command.
    pub fn push(&mut self, client: u64, seq: u64, op: &[u8]) {
        encode_command(&mut self.buf, client, seq, op);
        self.count += 1;
    }

    /// Appends `count` commands already encoded by [`encode_command`].
    pub fn extend_encoded(&mut self, count: u32, encoded: &[u8]) {
        self.buf.extend_from_slice(encoded);
        self.count += count;
    }

    /// Commands so far.
    pub fn len(&self) -> usize {
        self.count as usize
    }

    /// Makes room for `bytes` more bytes of commands.
    pub fn reserve(&mut self, bytes: usize) {
        self.buf.reserve(bytes);
    }

    /// No command yet.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The encoded entry, with the zero stamp; the builder starts over
    /// empty.
    pub fn take(&mut self) -> Vec<u8> {
        let mut buf = std::mem::replace(&mut self.buf, vec![0; HEADER_BYTES]);
        buf[..4].copy_from_slice(&MARK_V2.to_be_bytes());
        buf[20..24].copy_from_slice(&self.count.to_be_bytes());
        self.count = 0;
        buf
    }
}

/// Sets the stamp of `entry`, an entry [`EntryBuilder::take`] made.
pub fn stamp(entry: &mut [u8], stamp: Stamp) {
    debug_assert!(entry.len() >= HEADER_BYTES && entry[..4] == MARK_V2.to_be_bytes());
    entry[4..12].copy_from_slice(&stamp.time_ms.to_be_bytes());
    entry[12..20].copy_from_slice(&stamp.seed.to_be_bytes());
}

/// A seed for the entry at `index` proposed in `term` at `time_ms`: a
/// mix of the three (SplitMix64's finalizer), different for every entry of
/// a log.
pub fn seed(term: u64, index: u64, time_ms: u64) -> u64 {
    let mut x = index.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ term.rotate_left(32) ^ time_ms.rotate_left(13);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The stamp of an encoded entry: the zero stamp for a version 1 entry or
/// bytes too short to hold one (which do not decode anyway).
pub fn entry_stamp(bytes: &[u8]) -> Stamp {
    if bytes.len() < HEADER_BYTES || bytes[..4] != MARK_V2.to_be_bytes() {
        return Stamp::default();
    }
    let u64_at = |i: usize| u64::from_be_bytes(bytes[i..i + 8].try_into().expect("8 bytes"));
    Stamp { time_ms: u64_at(4), seed: u64_at(12) }
}

/// Appends one command to `buf` in the entry encoding (without the count
/// in front of an entry's commands), as ClientIO prepares a request.
pub fn encode_command(buf: &mut Vec<u8>, client: u64, seq: u64, op: &[u8]) {
    buf.extend_from_slice(&client.to_be_bytes());
    buf.extend_from_slice(&seq.to_be_bytes());
    buf.extend_from_slice(&u32::try_from(op.len()).expect("operations are far below 4 GiB").to_be_bytes());
    buf.extend_from_slice(op);
}

/// Encodes a log entry.
pub fn encode_entry(commands: &[EntryCommand]) -> Vec<u8> {
    let mut e = EntryBuilder::new();
    for c in commands {
        e.push(c.client, c.seq, &c.op);
    }
    e.take()
}

/// One command of a log entry, borrowed from the entry's bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntryRef<'a> {
    /// The client.
    pub client: u64,
    /// Its sequence number.
    pub seq: u64,
    /// The encoded operation.
    pub op: &'a [u8],
}

/// Decodes a log entry without copying its operations: its stamp and its
/// commands.
pub fn entry_commands(bytes: &[u8]) -> Result<(Stamp, Vec<EntryRef<'_>>), WireError> {
    let mut d = Decoder::new(bytes, "log entry");
    let stamp = entry_stamp(bytes);
    if bytes.len() >= 4 && bytes[..4] == MARK_V2.to_be_bytes() {
        d.u32()?;
        d.u64()?;
        d.u64()?;
    }
    let n = d.count(REQUEST_COMMANDS_MAX * 100, 20)?;
    Ok((stamp, commands(d, n)?))
}

/// Decodes the `count` commands of one request as [`encode_command`]
/// wrote them (an entry's encoding without the count in front).
pub fn request_commands(bytes: &[u8], count: u32) -> Result<Vec<EntryRef<'_>>, WireError> {
    let n = count as usize;
    if n > bytes.len() / 20 {
        return Err(WireError::Malformed {
            what: "request",
            why: format!("{n} commands cannot fit in {} bytes", bytes.len()),
        });
    }
    commands(Decoder::new(bytes, "request"), n)
}

fn commands(mut d: Decoder<'_>, n: usize) -> Result<Vec<EntryRef<'_>>, WireError> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(EntryRef { client: d.u64()?, seq: d.u64()?, op: d.bytes()? });
    }
    d.end()?;
    Ok(out)
}

/// Decodes a log entry's commands.
pub fn decode_entry(bytes: &[u8]) -> Result<Vec<EntryCommand>, WireError> {
    Ok(entry_commands(bytes)?
        .1
        .into_iter()
        .map(|c| EntryCommand { client: c.client, seq: c.seq, op: c.op.to_vec() })
        .collect())
}

/// Decodes a protobuf message (raft's) from hostile bytes. Read from
/// `Bytes` with the input as the stream's limit, a length field beyond
/// the bytes given fails before anything is allocated for it (and the
/// message's byte fields share the input); `parse_from_bytes` on a slice
/// reserves up to 10 MB per field first (found by `psmr fuzz --target
/// conf-change`).
pub fn decode_proto<M: protobuf::Message>(bytes: &bytes::Bytes) -> protobuf::ProtobufResult<M> {
    let mut input = protobuf::CodedInputStream::from_carllerche_bytes(bytes);
    input.push_limit(bytes.len() as u64)?;
    let mut m = M::new();
    m.merge_from(&mut input)?;
    input.check_eof()?;
    m.check_initialized()?;
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_and_garbage_is_refused() {
        let cmds =
            vec![EntryCommand { client: 1, seq: 2, op: vec![3] }, EntryCommand { client: 4, seq: 5, op: vec![] }];
        let bytes = encode_entry(&cmds);
        assert_eq!(decode_entry(&bytes).unwrap(), cmds);
        assert!(decode_entry(&bytes[..bytes.len() - 1]).is_err());
        assert!(decode_entry(&[0xff, 0xff, 0xff, 0xff]).is_err());
        assert!(decode_entry(&MARK_V2.to_be_bytes()).is_err(), "a mark without its stamp");
    }

    #[test]
    fn a_stamp_set_on_an_entry_is_read_back_and_version_1_reads_as_zero() {
        let cmds = vec![EntryCommand { client: 7, seq: 9, op: vec![1, 2, 3] }];
        let mut bytes = encode_entry(&cmds);
        assert_eq!(entry_stamp(&bytes), Stamp::default());
        let s = Stamp { time_ms: 1_790_000_000_123, seed: 0xdead_beef };
        stamp(&mut bytes, s);
        let (read, commands) = entry_commands(&bytes).unwrap();
        assert_eq!(read, s);
        assert_eq!(commands.len(), 1);
        assert_eq!(decode_entry(&bytes).unwrap(), cmds);
        // Version 1: the count first, no stamp.
        let mut v1 = 1u32.to_be_bytes().to_vec();
        encode_command(&mut v1, 7, 9, &[1, 2, 3]);
        assert_eq!(entry_commands(&v1).unwrap().0, Stamp::default());
        assert_eq!(decode_entry(&v1).unwrap(), cmds);
    }

    #[test]
    fn an_entry_built_from_encoded_requests_is_the_entry_of_their_commands() {
        let cmds: Vec<EntryCommand> =
            (0..5u64).map(|i| EntryCommand { client: i % 2 + 1, seq: i, op: vec![i as u8; i as usize] }).collect();
        let mut b = EntryBuilder::new();
        b.push(cmds[0].client, cmds[0].seq, &cmds[0].op);
        let mut request = Vec::new();
        for c in &cmds[1..] {
            encode_command(&mut request, c.client, c.seq, &c.op);
        }
        b.extend_encoded(4, &request);
        assert_eq!(b.len(), 5);
        let entry = b.take();
        assert_eq!(entry, encode_entry(&cmds));
        assert!(b.is_empty(), "take starts over");
        assert_eq!(decode_entry(&b.take()).unwrap(), vec![]);
        let borrowed: Vec<_> =
            entry_commands(&entry).unwrap().1.into_iter().map(|c| (c.client, c.seq, c.op.to_vec())).collect();
        let owned: Vec<_> = cmds.into_iter().map(|c| (c.client, c.seq, c.op)).collect();
        assert_eq!(borrowed, owned);
    }
}
