//! Snapshots as streams: a service writes its frozen state to a sink in
//! pieces ([`Frozen`]) and reads it back from a source
//! ([`crate::Service::restore_from`]), so that neither psmr nor the service
//! ever holds the whole encoded state at once, whatever its size.
//!
//! The sink and the source are plain [`std::io::Write`] and
//! [`std::io::Read`]: psmr cuts what a service writes into checksummed
//! pieces on disk and on the wire, and hands the service back exactly the
//! bytes it wrote, checked. [`SnapshotReader`] and the `put_*` functions
//! read and write the little-endian fields services' formats are made of.
//!
//! A small service need do none of this: [`crate::Service::snapshot`] and
//! [`crate::Service::restore`] on one byte vector (with
//! [`crate::encode_snapshot`] and [`crate::decode_snapshot`] for serde
//! types) are streamed for it by the trait's default methods.

use std::io::{self, Read, Write};
use thiserror::Error;

/// A snapshot could not be restored.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum SnapshotError {
    /// The bytes end before the snapshot does.
    #[error("snapshot truncated at byte {0}")]
    Truncated(usize),
    /// The bytes are not a snapshot of this service.
    #[error("malformed snapshot: {0}")]
    Malformed(String),
    /// The source failed (a damaged piece, a file that cannot be read).
    #[error("cannot read the snapshot: {0}")]
    Io(String),
}

/// A copy of a service's state, taken by [`crate::Service::freeze`] while
/// nothing executes, that writes its snapshot to the sink it is given:
/// later, on another thread, while execution goes on. The sink buffers;
/// small writes cost little.
pub type Frozen = Box<dyn FnOnce(&mut dyn Write) -> io::Result<()> + Send>;

/// A state's digest to be computed later, on another thread, from a copy
/// taken while nothing executes ([`crate::Service::freeze_digest`]).
pub type FrozenDigest = Box<dyn FnOnce() -> crate::Digest + Send>;

/// Writes a snapshot's header: its 4-byte `magic` and 16-bit `version`.
pub fn put_header(w: &mut dyn Write, magic: &[u8; 4], version: u16) -> io::Result<()> {
    w.write_all(magic)?;
    w.write_all(&version.to_le_bytes())
}

/// Writes `v`, little-endian.
pub fn put_u32(w: &mut dyn Write, v: u32) -> io::Result<()> {
    w.write_all(&v.to_le_bytes())
}

/// Writes `v`, little-endian.
pub fn put_u64(w: &mut dyn Write, v: u64) -> io::Result<()> {
    w.write_all(&v.to_le_bytes())
}

/// Writes a byte string: its length (u32), then its bytes. Longer than
/// `u32::MAX` bytes is an error.
pub fn put_bytes(w: &mut dyn Write, bytes: &[u8]) -> io::Result<()> {
    let len = u32::try_from(bytes.len()).map_err(|_| io::Error::other("a byte string over 4 GiB in a snapshot"))?;
    put_u32(w, len)?;
    w.write_all(bytes)
}

/// Reads the fields of a snapshot from a source, failing (never
/// panicking, never allocating more than a field's stated bound) on
/// anything that is not one.
pub struct SnapshotReader<'a> {
    src: &'a mut dyn Read,
    pos: usize,
}

impl<'a> SnapshotReader<'a> {
    /// Reads from `src`.
    pub fn new(src: &'a mut dyn Read) -> Self {
        Self { src, pos: 0 }
    }

    /// Reads from `src` after checking the 4-byte `magic` and the 16-bit
    /// `version` that start a snapshot of `what`.
    pub fn open(src: &'a mut dyn Read, magic: &[u8; 4], version: u16, what: &str) -> Result<Self, SnapshotError> {
        let mut r = Self::new(src);
        if &r.array::<4>()? != magic {
            return Err(SnapshotError::Malformed(format!("not a {what} snapshot (bad magic)")));
        }
        let v = r.u16()?;
        if v != version {
            return Err(SnapshotError::Malformed(format!(
                "{what} snapshot version {v} is not supported (only {version})"
            )));
        }
        Ok(r)
    }

    /// Bytes read so far.
    pub fn position(&self) -> usize {
        self.pos
    }

    /// Fills `buf` from the source.
    pub fn read_exact(&mut self, buf: &mut [u8]) -> Result<(), SnapshotError> {
        match self.src.read_exact(buf) {
            Ok(()) => {
                self.pos += buf.len();
                Ok(())
            }
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Err(SnapshotError::Truncated(self.pos)),
            Err(e) => Err(SnapshotError::Io(e.to_string())),
        }
    }

    /// `N` bytes.
    pub fn array<const N: usize>(&mut self) -> Result<[u8; N], SnapshotError> {
        let mut out = [0; N];
        self.read_exact(&mut out)?;
        Ok(out)
    }

    /// A little-endian `u16`.
    pub fn u16(&mut self) -> Result<u16, SnapshotError> {
        self.array().map(u16::from_le_bytes)
    }

    /// A little-endian `u32`.
    pub fn u32(&mut self) -> Result<u32, SnapshotError> {
        self.array().map(u32::from_le_bytes)
    }

    /// A little-endian `u64`.
    pub fn u64(&mut self) -> Result<u64, SnapshotError> {
        self.array().map(u64::from_le_bytes)
    }

    /// A byte string [`put_bytes`] wrote, of at most `max` bytes: a longer
    /// one is refused before anything is allocated for it.
    pub fn bytes(&mut self, max: usize, what: &str) -> Result<Vec<u8>, SnapshotError> {
        let at = self.pos;
        let len = self.u32()? as usize;
        if len > max {
            return Err(SnapshotError::Malformed(format!("{what} of {len} bytes at byte {at}, over {max}")));
        }
        let mut out = vec![0; len];
        self.read_exact(&mut out)?;
        Ok(out)
    }

    /// Succeeds when the source has nothing more.
    pub fn finish(self) -> Result<(), SnapshotError> {
        let mut probe = [0u8; 1];
        loop {
            match self.src.read(&mut probe) {
                Ok(0) => return Ok(()),
                Ok(_) => {
                    return Err(SnapshotError::Malformed(format!(
                        "bytes after the end of the snapshot at byte {}",
                        self.pos
                    )))
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(SnapshotError::Io(e.to_string())),
            }
        }
    }
}

/// Reads all of `src`, as the small-service path of
/// [`crate::Service::restore_from`] does.
pub fn read_all(src: &mut dyn Read) -> Result<Vec<u8>, SnapshotError> {
    let mut bytes = Vec::new();
    src.read_to_end(&mut bytes).map_err(|e| SnapshotError::Io(e.to_string()))?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_round_trip_and_every_cut_is_truncation() {
        let mut out = Vec::new();
        put_header(&mut out, b"TEST", 3).unwrap();
        put_u64(&mut out, 7).unwrap();
        put_bytes(&mut out, b"hello").unwrap();
        let mut src = &out[..];
        let mut r = SnapshotReader::open(&mut src, b"TEST", 3, "test").unwrap();
        assert_eq!(r.u64().unwrap(), 7);
        assert_eq!(r.bytes(5, "greeting").unwrap(), b"hello");
        assert_eq!(r.position(), out.len());
        r.finish().unwrap();
        for cut in 0..out.len() {
            let mut src = &out[..cut];
            let read = SnapshotReader::open(&mut src, b"TEST", 3, "test")
                .and_then(|mut r| r.u64().and_then(|_| r.bytes(5, "greeting")));
            assert!(matches!(read, Err(SnapshotError::Truncated(_))), "cut {cut}: {read:?}");
        }
    }

    #[test]
    fn bad_magic_version_bounds_and_trailing_bytes_are_refused() {
        let mut out = Vec::new();
        put_header(&mut out, b"TEST", 3).unwrap();
        put_bytes(&mut out, &[1; 10]).unwrap();
        out.push(0);
        let open = |magic: &[u8; 4], version| {
            let mut src = &out[..];
            SnapshotReader::open(&mut src, magic, version, "test").err().map(|e| e.to_string())
        };
        assert!(open(b"ELSE", 3).unwrap().contains("bad magic"));
        assert!(open(b"TEST", 4).unwrap().contains("version 3 is not supported"));
        let mut src = &out[..];
        let mut r = SnapshotReader::open(&mut src, b"TEST", 3, "test").unwrap();
        assert!(r.bytes(9, "blob").unwrap_err().to_string().contains("blob of 10 bytes"));
        let mut src = &out[..];
        let mut r = SnapshotReader::open(&mut src, b"TEST", 3, "test").unwrap();
        r.bytes(10, "blob").unwrap();
        assert!(r.finish().unwrap_err().to_string().contains("bytes after the end"));
    }
}
