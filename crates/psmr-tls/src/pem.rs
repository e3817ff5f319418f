//! Reading and writing certificate and key files: bounded in size, keys
//! private, nothing overwritten.

use crate::TlsError;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::RootCertStore;
use std::io::{self, Read, Write};
use std::path::Path;

/// Longest certificate or key file read. A CA bundle of a few hundred
/// certificates fits many times over; a huge file is a mistake, not a
/// reason to fill memory.
pub const PEM_FILE_MAX: u64 = 1 << 20;

pub(crate) fn io_err<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> TlsError + 'a {
    move |source| TlsError::Io { what, path: path.to_path_buf(), source }
}

/// Creates `dir` (and its parents) readable by its owner only; an
/// existing directory is left as it is.
pub fn create_private_dir(dir: &Path) -> Result<(), TlsError> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir).map_err(io_err("create directory", dir))
}

/// Writes a file that must not exist yet, created with `mode` (never wider
/// for a moment, as a chmod afterwards would be).
pub fn write_new(path: &Path, bytes: &[u8], mode: u32) -> Result<(), TlsError> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, mode);
    #[cfg(not(unix))]
    let _ = mode;
    let mut file = options.open(path).map_err(|source| match source.kind() {
        io::ErrorKind::AlreadyExists => TlsError::Exists(path.to_path_buf()),
        _ => TlsError::Io { what: "create", path: path.to_path_buf(), source },
    })?;
    file.write_all(bytes).and_then(|()| file.sync_all()).map_err(io_err("write", path))
}

/// Reads a certificate file (at most [`PEM_FILE_MAX`] bytes).
pub fn read_file(path: &Path) -> Result<Vec<u8>, TlsError> {
    let file = std::fs::File::open(path).map_err(io_err("read", path))?;
    read_bounded(path, file)
}

fn read_bounded(path: &Path, file: std::fs::File) -> Result<Vec<u8>, TlsError> {
    let mut bytes = Vec::new();
    file.take(PEM_FILE_MAX + 1).read_to_end(&mut bytes).map_err(io_err("read", path))?;
    if bytes.len() as u64 > PEM_FILE_MAX {
        return Err(TlsError::Parse {
            path: path.to_path_buf(),
            why: format!("longer than {PEM_FILE_MAX} bytes: not a PEM certificate or key"),
        });
    }
    Ok(bytes)
}

/// Reads a private key file, refusing one that group or others may read.
/// The mode is checked on the opened file, so the file checked is the
/// file read.
pub fn read_private(path: &Path) -> Result<Vec<u8>, TlsError> {
    let file = std::fs::File::open(path).map_err(io_err("read", path))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = file.metadata().map_err(io_err("inspect", path))?.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(TlsError::KeyReadable { path: path.to_path_buf(), mode });
        }
    }
    read_bounded(path, file)
}

/// The certificates of a PEM file's bytes (at least one).
pub fn parse_certs(path: &Path, bytes: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Parse { path: path.to_path_buf(), why: format!("not a PEM certificate: {e}") })?;
    if certs.is_empty() {
        return Err(TlsError::Parse { path: path.to_path_buf(), why: "no CERTIFICATE block in the file".into() });
    }
    Ok(certs)
}

/// The private key of a PEM file's bytes.
pub fn parse_key(path: &Path, bytes: &[u8]) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_slice(bytes)
        .map_err(|e| TlsError::Parse { path: path.to_path_buf(), why: format!("not a PEM private key: {e}") })
}

/// The certificate chain of `cert` and the private key of `key` (which
/// must be private).
pub fn load_identity(
    cert: &Path,
    key: &Path,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), TlsError> {
    let chain = parse_certs(cert, &read_file(cert)?)?;
    Ok((chain, parse_key(key, &read_private(key)?)?))
}

/// The CA certificates of `ca`, as the only roots to trust.
pub fn load_roots(ca: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in parse_certs(ca, &read_file(ca)?)? {
        roots.add(cert).map_err(|e| crate::config_err(&format!("CA certificate {}", ca.display()), &e))?;
    }
    Ok(roots)
}
