//! The snapshot file: what a store keeps on disk, what a leader sends a
//! follower chunk by chunk, and what a restore reads back, as one format.
//!
//! ```text
//! header   "PSMRSNP2" | index u64 | term u64                     (24 bytes)
//! pieces   len u32 (1..=PIECE_MAX) | crc32 u32 | len bytes       (repeated)
//! end      0 u32 | crc32 of every byte before it and of data bytes u32 | data bytes u64
//! ```
//!
//! All little-endian. The pieces carry the bytes written to a
//! [`FileWriter`] (a replica's state: [`crate::state`]), cut where its
//! buffer fills: a writer never holds more than one piece, a reader never
//! more than one, whatever the state's size. Each piece is checked as it
//! is read; the end says how many bytes the pieces held and carries the
//! checksum of the whole file before it, which names the file in a
//! [`SnapshotId`]: a receiver checks what it assembled against the id it
//! was offered before anything is installed.
//!
//! A file that starts with `PSMRSNP1` was written by a psmr that kept a
//! snapshot as one buffer; it is refused with that reason.

use std::io::{self, Read, Write};

/// The file's magic and format version. Version 3 differs from 2 only in
/// what [`crate::state`] keeps in the pieces (the apply loop's clock after
/// the reply cache); the container is the same, and version 2 is read.
pub const MAGIC: &[u8; 8] = b"PSMRSNP3";
/// The magic of version 2, before the apply loop's clock was kept.
const MAGIC_V2: &[u8; 8] = b"PSMRSNP2";
/// The magic of the format before streamed snapshots.
const MAGIC_V1: &[u8; 8] = b"PSMRSNP1";
/// Bytes of the header.
pub const HEADER_BYTES: u64 = 24;
/// Bytes of the end mark.
pub const END_BYTES: u64 = 16;
/// The largest piece a reader accepts (writers cut at [`PIECE_BYTES`]).
pub const PIECE_MAX: usize = 4 << 20;
/// Where a writer cuts its pieces.
pub const PIECE_BYTES: usize = 256 << 10;

/// Names one snapshot file: the entry it covers, its size and its
/// checksum. A transfer offers an id; a receiver resumes only the same id.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SnapshotId {
    /// The index of the last entry the snapshot covers.
    pub index: u64,
    /// Its term.
    pub term: u64,
    /// The file's size in bytes.
    pub bytes: u64,
    /// The checksum its end mark carries (of every byte but the mark's own
    /// first eight).
    pub crc: u32,
}

impl SnapshotId {
    /// Bytes of [`SnapshotId::encode`].
    pub const ENCODED: usize = 28;

    /// The id as bytes.
    pub fn encode(&self) -> [u8; Self::ENCODED] {
        let mut out = [0u8; Self::ENCODED];
        out[..8].copy_from_slice(&self.index.to_le_bytes());
        out[8..16].copy_from_slice(&self.term.to_le_bytes());
        out[16..24].copy_from_slice(&self.bytes.to_le_bytes());
        out[24..].copy_from_slice(&self.crc.to_le_bytes());
        out
    }

    /// Reads what [`SnapshotId::encode`] wrote; a size that cannot hold a
    /// header and an end mark is refused.
    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        let b: &[u8; Self::ENCODED] =
            bytes.try_into().map_err(|_| format!("a snapshot id of {} bytes", bytes.len()))?;
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        let id = Self {
            index: u64_at(0),
            term: u64_at(8),
            bytes: u64_at(16),
            crc: u32::from_le_bytes(b[24..].try_into().expect("4 bytes")),
        };
        if id.bytes < HEADER_BYTES + END_BYTES {
            return Err(format!("a snapshot of {} bytes, less than a header and an end", id.bytes));
        }
        Ok(id)
    }
}

impl std::fmt::Display for SnapshotId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "snapshot {} (term {}, {} bytes, crc {:08x})", self.index, self.term, self.bytes, self.crc)
    }
}

/// What raft carries of a snapshot (its `data`): the id of the file and
/// the membership at its index, never the state itself, which travels as
/// the file, in chunks, apart from raft's messages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Descriptor {
    /// The file.
    pub id: SnapshotId,
    /// The membership at the snapshot's index
    /// ([`crate::membership::Membership::encode`]).
    pub members: Vec<u8>,
}

/// The magic of an encoded [`Descriptor`].
const DESCRIPTOR_MAGIC: &[u8; 4] = b"PSD1";

impl Descriptor {
    /// The descriptor as bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(4 + SnapshotId::ENCODED + self.members.len());
        out.extend_from_slice(DESCRIPTOR_MAGIC);
        out.extend_from_slice(&self.id.encode());
        out.extend_from_slice(&self.members);
        out
    }

    /// Reads what [`Descriptor::encode`] wrote.
    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        let head = 4 + SnapshotId::ENCODED;
        if bytes.len() < head || &bytes[..4] != DESCRIPTOR_MAGIC {
            return Err(format!("not a snapshot descriptor ({} bytes)", bytes.len()));
        }
        Ok(Self { id: SnapshotId::decode(&bytes[4..head])?, members: bytes[head..].to_vec() })
    }
}

/// Writes a snapshot file to `out`: the header at once, then what it is
/// given, a piece at a time.
pub struct FileWriter<W: Write> {
    out: W,
    piece: Vec<u8>,
    crc: crc32fast::Hasher,
    index: u64,
    term: u64,
    written: u64,
    data: u64,
}

impl<W: Write> FileWriter<W> {
    /// Starts the file of the snapshot at `index` in `term`.
    pub fn new(mut out: W, index: u64, term: u64) -> io::Result<Self> {
        let mut header = [0u8; HEADER_BYTES as usize];
        header[..8].copy_from_slice(MAGIC);
        header[8..16].copy_from_slice(&index.to_le_bytes());
        header[16..].copy_from_slice(&term.to_le_bytes());
        out.write_all(&header)?;
        let mut crc = crc32fast::Hasher::new();
        crc.update(&header);
        let piece = Vec::with_capacity(PIECE_BYTES);
        Ok(Self { out, piece, crc, index, term, written: HEADER_BYTES, data: 0 })
    }

    fn put(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.out.write_all(bytes)?;
        self.crc.update(bytes);
        self.written += bytes.len() as u64;
        Ok(())
    }

    fn flush_piece(&mut self) -> io::Result<()> {
        if self.piece.is_empty() {
            return Ok(());
        }
        let piece = std::mem::take(&mut self.piece);
        let mut head = [0u8; 8];
        head[..4].copy_from_slice(&(piece.len() as u32).to_le_bytes());
        head[4..].copy_from_slice(&crc32fast::hash(&piece).to_le_bytes());
        self.put(&head)?;
        self.put(&piece)?;
        self.data += piece.len() as u64;
        self.piece = piece;
        self.piece.clear();
        Ok(())
    }

    /// Writes the last piece and the end; the writer's output and the id
    /// of the file it holds. The caller makes the output durable.
    pub fn finish(mut self) -> io::Result<(W, SnapshotId)> {
        self.flush_piece()?;
        let mut crc = self.crc.clone();
        crc.update(&self.data.to_le_bytes());
        let crc = crc.finalize();
        let mut end = [0u8; END_BYTES as usize];
        end[4..8].copy_from_slice(&crc.to_le_bytes());
        end[8..].copy_from_slice(&self.data.to_le_bytes());
        self.put(&end)?;
        self.out.flush()?;
        let id = SnapshotId { index: self.index, term: self.term, bytes: self.written, crc };
        Ok((self.out, id))
    }
}

impl<W: Write> Write for FileWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = buf.len().min(PIECE_BYTES - self.piece.len());
        self.piece.extend_from_slice(&buf[..n]);
        if self.piece.len() == PIECE_BYTES {
            self.flush_piece()?;
        }
        Ok(n)
    }

    /// Pieces go out whole: a flush does not cut one short.
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn invalid(why: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why)
}

/// Reads the header of a snapshot file: its index, term and format version
/// (2 or 3). A file of the format before streamed snapshots is refused
/// with that reason.
pub fn read_header(src: &mut impl Read) -> io::Result<(u64, u64, u8)> {
    let mut header = [0u8; HEADER_BYTES as usize];
    src.read_exact(&mut header)?;
    if &header[..8] == MAGIC_V1 {
        return Err(invalid(
            "written by a psmr that kept a snapshot as one buffer (format 1); this build streams snapshots \
             (format 2) and cannot read it: rebuild the replica from its peers (`psmr replica --repair`)"
                .into(),
        ));
    }
    let version = match &header[..8] {
        m if m == MAGIC => 3,
        m if m == MAGIC_V2 => 2,
        _ => return Err(invalid("not a psmr snapshot (bad magic)".into())),
    };
    let u64_at = |i: usize| u64::from_le_bytes(header[i..i + 8].try_into().expect("8 bytes"));
    Ok((u64_at(8), u64_at(16), version))
}

/// Reads the end mark of a snapshot file of `bytes` bytes: the checksum it
/// names the file by and the bytes its pieces hold.
pub fn read_end(end: &[u8; END_BYTES as usize]) -> io::Result<(u32, u64)> {
    if end[..4] != [0; 4] {
        return Err(invalid("no end mark at the end of the snapshot file".into()));
    }
    let crc = u32::from_le_bytes(end[4..8].try_into().expect("4 bytes"));
    Ok((crc, u64::from_le_bytes(end[8..].try_into().expect("8 bytes"))))
}

/// The checksum an end mark carries: of every byte before it and of the
/// data bytes it counts, so that no byte of a file goes unchecked.
fn sealed(body: &crc32fast::Hasher, end: &[u8; END_BYTES as usize]) -> u32 {
    let mut crc = body.clone();
    crc.update(&end[8..]);
    crc.finalize()
}

/// Reads a snapshot file back, checking every piece as it comes, the end
/// mark and the whole file's checksum; yields the bytes written to the
/// [`FileWriter`]. Any damage is an [`io::ErrorKind::InvalidData`] error
/// naming the offset.
pub struct FileReader<R: Read> {
    src: R,
    piece: Vec<u8>,
    at: usize,
    crc: crc32fast::Hasher,
    offset: u64,
    data: u64,
    done: bool,
    /// The file's index and term.
    pub index: u64,
    /// See `index`.
    pub term: u64,
    /// The file's format version (2 or 3).
    pub version: u8,
}

impl<R: Read> FileReader<R> {
    /// Opens the file `src` yields, reading its header.
    pub fn open(mut src: R) -> io::Result<Self> {
        let mut header = [0u8; HEADER_BYTES as usize];
        src.read_exact(&mut header)?;
        let (index, term, version) = read_header(&mut &header[..])?;
        let mut crc = crc32fast::Hasher::new();
        crc.update(&header);
        let (piece, at, offset, data, done) = (Vec::new(), 0, HEADER_BYTES, 0, false);
        Ok(Self { src, piece, at, crc, offset, data, done, index, term, version })
    }

    fn next_piece(&mut self) -> io::Result<()> {
        let mut head = [0u8; 8];
        self.src.read_exact(&mut head).map_err(|e| self.cut(e))?;
        let len = u32::from_le_bytes(head[..4].try_into().expect("4 bytes")) as usize;
        if len == 0 {
            return self.end(head);
        }
        if len > PIECE_MAX {
            return Err(invalid(format!("a piece of {len} bytes at offset {}, over {PIECE_MAX}", self.offset)));
        }
        self.crc.update(&head);
        self.piece.resize(len, 0);
        self.src.read_exact(&mut self.piece).map_err(|e| self.cut(e))?;
        if crc32fast::hash(&self.piece).to_le_bytes() != head[4..] {
            return Err(invalid(format!("the piece at offset {} is damaged (checksum mismatch)", self.offset)));
        }
        self.crc.update(&self.piece);
        self.offset += 8 + len as u64;
        self.data += len as u64;
        self.at = 0;
        Ok(())
    }

    fn end(&mut self, head: [u8; 8]) -> io::Result<()> {
        let mut end = [0u8; END_BYTES as usize];
        end[..8].copy_from_slice(&head);
        self.src.read_exact(&mut end[8..]).map_err(|e| self.cut(e))?;
        let (crc, data) = read_end(&end)?;
        if crc != sealed(&self.crc, &end) {
            return Err(invalid(format!("the snapshot's checksum does not match at offset {}", self.offset)));
        }
        if data != self.data {
            return Err(invalid(format!("the end mark says {data} bytes, the pieces held {}", self.data)));
        }
        let mut probe = [0u8; 1];
        if self.src.read(&mut probe)? != 0 {
            return Err(invalid(format!("bytes after the end mark at offset {}", self.offset + END_BYTES)));
        }
        self.done = true;
        Ok(())
    }

    fn cut(&self, e: io::Error) -> io::Error {
        match e.kind() {
            io::ErrorKind::UnexpectedEof => {
                invalid(format!("the snapshot file ends at offset {}, before its end mark", self.offset))
            }
            _ => e,
        }
    }
}

impl<R: Read> Read for FileReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.at == self.piece.len() {
            if self.done || buf.is_empty() {
                return Ok(0);
            }
            self.next_piece()?;
            if self.done {
                return Ok(0);
            }
        }
        let n = buf.len().min(self.piece.len() - self.at);
        buf[..n].copy_from_slice(&self.piece[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

/// Checks a whole snapshot file's bytes as they arrive in order, as a
/// receiver assembles them: the running checksum of everything before the
/// end mark, compared with the id's at the end.
#[derive(Clone)]
pub struct Assembly {
    id: SnapshotId,
    crc: crc32fast::Hasher,
    /// Bytes checked so far.
    pub bytes: u64,
}

impl Assembly {
    /// Starts checking the file `id` names.
    pub fn new(id: SnapshotId) -> Self {
        Self { id, crc: crc32fast::Hasher::new(), bytes: 0 }
    }

    /// Takes the next `data`; refuses bytes beyond the file's size.
    pub fn update(&mut self, data: &[u8]) -> Result<(), String> {
        let body = self.id.bytes - END_BYTES;
        let end = self.bytes + data.len() as u64;
        if end > self.id.bytes {
            return Err(format!("{end} bytes of a snapshot of {}", self.id.bytes));
        }
        let in_body = body.saturating_sub(self.bytes).min(data.len() as u64) as usize;
        self.crc.update(&data[..in_body]);
        self.bytes = end;
        Ok(())
    }

    fn updated(mut self, data: &[u8]) -> Result<Self, String> {
        self.update(data)?;
        Ok(self)
    }

    /// The file this checks.
    pub fn id(&self) -> SnapshotId {
        self.id
    }

    /// Whether every byte came and they make the file the id names.
    /// `end` is the file's end mark.
    pub fn check(&self, end: &[u8; END_BYTES as usize]) -> Result<(), String> {
        if self.bytes != self.id.bytes {
            return Err(format!("{} of {} bytes arrived", self.bytes, self.id.bytes));
        }
        let (crc, _) = read_end(end).map_err(|e| e.to_string())?;
        let got = sealed(&self.crc, end);
        if got != self.id.crc || crc != self.id.crc {
            return Err(format!("checksum {got:08x} (end mark {crc:08x}), offered {:08x}", self.id.crc));
        }
        Ok(())
    }
}

/// A snapshot file a store keeps, read at any offset: what a transfer
/// sends from, a restore reads and a receiver checks. A handle keeps its
/// file readable while a newer snapshot replaces it.
pub trait SnapshotFile: Send + Sync {
    /// Reads into `buf` from `offset`; fewer bytes only at the end.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize>;
    /// The file's size now.
    fn len(&self) -> u64;
    /// Whether the file is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl SnapshotFile for Vec<u8> {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        let start = usize::try_from(offset).unwrap_or(usize::MAX).min(self.len());
        let n = buf.len().min(self.len() - start);
        buf[..n].copy_from_slice(&self[start..start + n]);
        Ok(n)
    }

    fn len(&self) -> u64 {
        self.len() as u64
    }
}

/// Reads a [`SnapshotFile`] from its start, as [`FileReader`] wants.
pub struct Cursor {
    file: Box<dyn SnapshotFile>,
    offset: u64,
}

impl Cursor {
    /// Reads `file` from its start.
    pub fn new(file: Box<dyn SnapshotFile>) -> Self {
        Self { file, offset: 0 }
    }
}

impl Read for Cursor {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.file.read_at(self.offset, buf)?;
        self.offset += n as u64;
        Ok(n)
    }
}

/// Finds how much of a partly received file is whole, a bounded number
/// of bytes a step (so that a replica resuming a transfer after a restart
/// never stops to read gigabytes at once): the header and the pieces that
/// check out, up to the first that does not or that a crash cut short.
pub struct Scan {
    assembly: Assembly,
    /// The end of the whole part found so far.
    valid: u64,
}

impl Scan {
    /// Scans a partial file of `id`.
    pub fn new(id: SnapshotId) -> Self {
        Self { assembly: Assembly::new(id), valid: 0 }
    }

    /// Scans on for about `budget` bytes of `file`; the whole part's
    /// length and its checksum state once the scan is over.
    pub fn step(&mut self, file: &dyn SnapshotFile, budget: u64) -> io::Result<Option<(u64, Assembly)>> {
        let len = file.len().min(self.assembly.id.bytes);
        let mut scanned = 0;
        while scanned < budget {
            match self.next(file, len)? {
                Some(n) => scanned += n,
                None => return Ok(Some((self.valid, self.assembly.clone()))),
            }
        }
        Ok(None)
    }

    /// Checks the next part (the header, a piece or the end mark); its
    /// size, or `None` if it is not whole.
    fn next(&mut self, file: &dyn SnapshotFile, len: u64) -> io::Result<Option<u64>> {
        let id = self.assembly.id;
        let at = self.valid;
        let want = if at == 0 { HEADER_BYTES } else { 8 };
        if at + want > len {
            return Ok(None);
        }
        let mut head = vec![0u8; want as usize];
        if file.read_at(at, &mut head)? < head.len() {
            return Ok(None);
        }
        if at == 0 {
            let ok = read_header(&mut &head[..]).is_ok_and(|(index, term, _)| (index, term) == (id.index, id.term));
            return Ok(ok.then(|| self.take(&head)));
        }
        let piece = u32::from_le_bytes(head[..4].try_into().expect("4 bytes")) as u64;
        let total = if piece == 0 { END_BYTES } else { 8 + piece };
        if piece as usize > PIECE_MAX || at + total > len {
            return Ok(None);
        }
        let mut part = vec![0u8; total as usize];
        if file.read_at(at, &mut part)? < part.len() {
            return Ok(None);
        }
        let whole = match piece {
            0 => {
                let end: [u8; END_BYTES as usize] = part[..].try_into().expect("16 bytes");
                at + END_BYTES == id.bytes && self.assembly.clone().updated(&part).is_ok_and(|a| a.check(&end).is_ok())
            }
            _ => crc32fast::hash(&part[8..]).to_le_bytes() == part[4..8],
        };
        Ok(whole.then(|| self.take(&part)))
    }

    fn take(&mut self, part: &[u8]) -> u64 {
        // Within the id's size: `next` only takes parts that end there.
        let _ = self.assembly.update(part);
        self.valid += part.len() as u64;
        part.len() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(data: &[u8]) -> (Vec<u8>, SnapshotId) {
        let mut w = FileWriter::new(Vec::new(), 7, 3).unwrap();
        w.write_all(data).unwrap();
        w.finish().unwrap()
    }

    fn read(bytes: &[u8]) -> io::Result<Vec<u8>> {
        let mut r = FileReader::open(bytes)?;
        let mut out = Vec::new();
        r.read_to_end(&mut out)?;
        Ok(out)
    }

    #[test]
    fn data_of_every_size_round_trips_in_pieces() {
        for len in [0, 1, PIECE_BYTES - 1, PIECE_BYTES, PIECE_BYTES + 1, 3 * PIECE_BYTES + 5] {
            let data: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
            let (bytes, id) = file(&data);
            assert_eq!(id.bytes, bytes.len() as u64);
            assert_eq!((id.index, id.term), (7, 3));
            assert_eq!(read(&bytes).unwrap(), data, "{len} bytes");
            let pieces = len.div_ceil(PIECE_BYTES) as u64;
            assert_eq!(id.bytes, HEADER_BYTES + END_BYTES + 8 * pieces + len as u64);
            let mut check = Assembly::new(id);
            for chunk in bytes.chunks(1000) {
                check.update(chunk).unwrap();
            }
            let end: [u8; 16] = bytes[bytes.len() - 16..].try_into().unwrap();
            check.check(&end).unwrap();
            assert_eq!(SnapshotId::decode(&id.encode()).unwrap(), id);
        }
    }

    #[test]
    fn every_flipped_byte_and_every_cut_is_refused() {
        let data: Vec<u8> = (0..3000).map(|i| i as u8).collect();
        let (bytes, id) = file(&data);
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x40;
            assert!(read(&bad).is_err(), "a flipped byte at {i} passed");
            let mut check = Assembly::new(id);
            check.update(&bad).unwrap();
            let end: [u8; 16] = bad[bad.len() - 16..].try_into().unwrap();
            assert!(check.check(&end).is_err(), "the assembly passed a flipped byte at {i}");
        }
        for cut in 0..bytes.len() {
            assert!(read(&bytes[..cut]).is_err(), "a file cut at {cut} passed");
        }
        let mut long = bytes.clone();
        long.push(0);
        assert!(read(&long).unwrap_err().to_string().contains("after the end mark"));
        assert!(Assembly::new(id).update(&long).is_err());
    }

    #[test]
    fn the_old_format_is_refused_with_its_reason() {
        let mut old = b"PSMRSNP1".to_vec();
        old.extend_from_slice(&[0; 40]);
        let e = read(&old).unwrap_err().to_string();
        assert!(e.contains("format 1") && e.contains("--repair"), "{e}");
        assert!(read(&[b'X'; 40]).unwrap_err().to_string().contains("bad magic"));
    }

    fn scan(partial: &Vec<u8>, id: SnapshotId) -> (u64, Assembly) {
        let mut scan = Scan::new(id);
        loop {
            if let Some(done) = scan.step(partial, 100_000).unwrap() {
                return done;
            }
        }
    }

    #[test]
    fn a_scan_finds_the_whole_prefix_of_a_cut_or_damaged_file() {
        let data: Vec<u8> = (0..2 * PIECE_BYTES + 100).map(|i| (i % 251) as u8).collect();
        let (bytes, id) = file(&data);
        let piece = 8 + PIECE_BYTES;
        let boundaries = [0, 24, 24 + piece, 24 + 2 * piece, 24 + 2 * piece + 108, bytes.len()];
        for cut in (0..=bytes.len()).step_by(997).chain([bytes.len() - 1, bytes.len()]) {
            let (valid, assembly) = scan(&bytes[..cut].to_vec(), id);
            let expect = boundaries.iter().rev().find(|&&b| b <= cut).copied().unwrap_or(0);
            assert_eq!(valid as usize, expect, "cut at {cut}");
            assert_eq!(assembly.bytes, valid);
        }
        let (valid, assembly) = scan(&bytes, id);
        assert_eq!(valid, id.bytes);
        assembly.check(&bytes[bytes.len() - 16..].try_into().unwrap()).unwrap();
        let mut damaged = bytes.clone();
        damaged[24 + piece + 100] ^= 1;
        assert_eq!(scan(&damaged, id).0 as usize, 24 + piece, "the damaged second piece ends the whole part");
        let other = SnapshotId { index: 8, ..id };
        assert_eq!(scan(&bytes, other).0, 0, "a file of another snapshot has no whole part");
    }
}
