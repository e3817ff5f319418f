//! The certificates `psmr certs` issues: one CA per cluster, a certificate
//! per replica and, for clients that prove who they are with one, per user.
//!
//! * The CA is a self-signed ECDSA P-256 certificate whose only job is to
//!   sign the others (path length 0).
//! * Replica `N`'s certificate names `replica-N.psmr` (what peers check)
//!   and the hosts clients dial to reach its client-facing ports (what
//!   clients check; loopback by default), for server and client
//!   authentication.
//! * User `NAME`'s certificate names `NAME.user.psmr`, for client
//!   authentication only: it can never pass as a replica (peers check for
//!   `replica-N.psmr`) nor as a server.
//!
//! All are valid for ten years, from a day before they are made (a
//! replica whose clock is somewhat behind accepts them at once). Files are
//! never overwritten; the directory is created private and keys 0600.

use crate::pem::{create_private_dir, io_err, parse_certs, read_file, read_private, write_new};
use crate::TlsError;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// How long issued certificates are valid.
pub const VALIDITY: Duration = Duration::from_secs(3653 * 24 * 3600);

/// Issued certificates are valid from this long before they are made.
const BACKDATE: Duration = Duration::from_secs(24 * 3600);

/// The hosts a replica certificate names unless told otherwise: clients
/// on the same host reach it under these.
pub const LOOPBACK_HOSTS: [&str; 3] = ["127.0.0.1", "::1", "localhost"];

/// The suffix of the names in user certificates.
const USER_SUFFIX: &str = ".user.psmr";

/// The name replica `id`'s certificate carries for its peers.
pub fn replica_name(id: u64) -> String {
    format!("replica-{id}.psmr")
}

/// The name user `user`'s certificate carries.
pub fn user_name(user: &str) -> String {
    format!("{user}{USER_SUFFIX}")
}

/// The user a name of a certificate stands for, if it is a user name.
pub(crate) fn user_of_name(name: &str) -> Option<&str> {
    name.strip_suffix(USER_SUFFIX).filter(|u| check_user(u).is_ok())
}

/// The files [`generate`] made, as a configuration names them: `{id}` in
/// `cert` and `key` stands for the replica's id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaFiles {
    /// The CA's certificate.
    pub ca: PathBuf,
    /// `…/replica-{id}.pem`.
    pub cert: PathBuf,
    /// `…/replica-{id}.key`.
    pub key: PathBuf,
}

/// Not before, not after.
type Validity = (SystemTime, SystemTime);

fn validity_from_now() -> Validity {
    let now = SystemTime::now();
    (now.checked_sub(BACKDATE).unwrap_or(now), now.checked_add(VALIDITY).unwrap_or(now))
}

/// The cluster CA, as an issuer.
struct Ca {
    cert: rcgen::Certificate,
    key: rcgen::KeyPair,
}

/// Makes one certificate per replica id under `dir` (`replica-N.pem`,
/// `replica-N.key`), naming `hosts` besides `replica-N.psmr`, signed by
/// the cluster CA there (`ca.pem`, `ca.key`), which is made first if
/// neither file exists: so a replica added later gets its certificate
/// from the CA the others trust. No existing file is overwritten; a
/// refusal leaves nothing half-written. Returns the files, with absolute
/// paths.
pub fn generate(dir: &Path, ids: &[u64], hosts: &[&str]) -> Result<ReplicaFiles, TlsError> {
    check_ids(ids)?;
    let hosts = check_hosts(hosts)?;
    let (ca_pem, ca_key) = (dir.join("ca.pem"), dir.join("ca.key"));
    let existing = ca_pem.exists() && ca_key.exists();
    let mut files = Vec::new();
    if !existing {
        files.extend([(ca_pem.clone(), false), (ca_key.clone(), true)]);
    }
    for id in ids {
        files.push((dir.join(format!("replica-{id}.pem")), false));
        files.push((dir.join(format!("replica-{id}.key")), true));
    }
    refuse_existing(&files)?;
    let validity = validity_from_now();
    let (ca, mut contents) = match existing {
        true => (existing_ca(&ca_pem, &ca_key, validity)?, Vec::new()),
        false => {
            let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
            let cert = ca_params(validity)?.self_signed(&key)?;
            let texts = vec![cert.pem(), key.serialize_pem()];
            (Ca { cert, key }, texts)
        }
    };
    for &id in ids {
        let mut names = vec![replica_name(id)];
        names.extend(hosts.iter().map(|h| h.to_string()));
        let (cert, key) = leaf(&replica_name(id), names, true, &ca, validity)?;
        contents.extend([cert, key]);
    }
    write_all(dir, &files, &contents)?;
    let dir = dir.canonicalize().map_err(io_err("resolve", dir))?;
    Ok(ReplicaFiles { ca: dir.join("ca.pem"), cert: dir.join("replica-{id}.pem"), key: dir.join("replica-{id}.key") })
}

/// Makes user `user`'s certificate under `dir` (`user-NAME.pem`,
/// `user-NAME.key`), signed by the cluster CA there, which must exist.
/// Returns the certificate's and the key's paths.
pub fn generate_user(dir: &Path, user: &str) -> Result<(PathBuf, PathBuf), TlsError> {
    check_user(user)?;
    let (ca_pem, ca_key) = (dir.join("ca.pem"), dir.join("ca.key"));
    if !(ca_pem.exists() && ca_key.exists()) {
        return Err(TlsError::Names(format!(
            "no cluster CA in {} (ca.pem and ca.key): make the replicas' certificates first",
            dir.display()
        )));
    }
    let files = [(dir.join(format!("user-{user}.pem")), false), (dir.join(format!("user-{user}.key")), true)];
    refuse_existing(&files)?;
    let validity = validity_from_now();
    let ca = existing_ca(&ca_pem, &ca_key, validity)?;
    let (cert, key) = leaf(&user_name(user), vec![user_name(user)], false, &ca, validity)?;
    write_all(dir, &files, &[cert, key])?;
    let [(cert, _), (key, _)] = files;
    Ok((cert, key))
}

/// Refuses before anything is made if one of `files` exists, so that a
/// refusal leaves nothing half-written; `create_new` still refuses a file
/// that appears in between.
fn refuse_existing(files: &[(PathBuf, bool)]) -> Result<(), TlsError> {
    match files.iter().find(|(p, _)| p.symlink_metadata().is_ok()) {
        Some((path, _)) => Err(TlsError::Exists(path.clone())),
        None => Ok(()),
    }
}

fn write_all(dir: &Path, files: &[(PathBuf, bool)], contents: &[String]) -> Result<(), TlsError> {
    create_private_dir(dir)?;
    for ((path, secret), text) in files.iter().zip(contents) {
        write_new(path, text.as_bytes(), if *secret { 0o600 } else { 0o644 })?;
    }
    Ok(())
}

fn check_ids(ids: &[u64]) -> Result<(), TlsError> {
    let bad = |why: String| Err(TlsError::Names(format!("replica ids: {why}")));
    if ids.is_empty() {
        return bad("no replica ids given".into());
    }
    if ids.contains(&0) {
        return bad("replica ids start at 1".into());
    }
    let mut sorted = ids.to_vec();
    sorted.sort_unstable();
    match sorted.windows(2).find(|w| w[0] == w[1]) {
        Some(w) => bad(format!("id {} is given twice", w[0])),
        None => Ok(()),
    }
}

/// Host names and IP addresses, each checked to be usable in a
/// certificate as clients check it.
fn check_hosts<'a>(hosts: &[&'a str]) -> Result<Vec<&'a str>, TlsError> {
    for h in hosts {
        if rustls::pki_types::ServerName::try_from(*h).is_err() || h.ends_with(".psmr") {
            return Err(TlsError::Names(format!(
                "host {h:?}: give a DNS name or an IP address that clients dial (not one ending in .psmr)"
            )));
        }
    }
    Ok(hosts.to_vec())
}

/// User names that can stand in a certificate: a DNS label.
fn check_user(user: &str) -> Result<(), TlsError> {
    let ok = (1..=63).contains(&user.len())
        && user.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        && !user.starts_with('-')
        && !user.ends_with('-');
    match ok {
        true => Ok(()),
        false => Err(TlsError::Names(format!(
            "user {user:?}: a certificate names users of 1 to 63 letters, digits and inner hyphens"
        ))),
    }
}

/// The cluster CA's own certificate: its name alone identifies it as the
/// issuer of the others.
fn ca_params((not_before, not_after): Validity) -> Result<rcgen::CertificateParams, TlsError> {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.distinguished_name.push(rcgen::DnType::CommonName, "psmr cluster CA");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
    params.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign, rcgen::KeyUsagePurpose::CrlSign];
    params.not_before = not_before.into();
    params.not_after = not_after.into();
    Ok(params)
}

/// The CA of `ca.pem` and its key `ca.key` (private, as every key psmr
/// reads), as an issuer: its name and key are what signing needs. A key
/// that is not `ca.pem`'s is refused.
fn existing_ca(pem: &Path, key: &Path, validity: Validity) -> Result<Ca, TlsError> {
    let text = String::from_utf8(read_private(key)?)
        .map_err(|_| TlsError::Parse { path: key.to_path_buf(), why: "not PEM text".into() })?;
    let ca_key =
        rcgen::KeyPair::from_pem(&text).map_err(|e| TlsError::Parse { path: key.to_path_buf(), why: e.to_string() })?;
    let cert = parse_certs(pem, &read_file(pem)?)?;
    let public = ca_key.public_key_raw();
    if !cert[0].as_ref().windows(public.len()).any(|w| w == public) {
        return Err(TlsError::Parse { path: key.to_path_buf(), why: format!("not the key of {}", pem.display()) });
    }
    Ok(Ca { cert: ca_params(validity)?.self_signed(&ca_key)?, key: ca_key })
}

/// A certificate and key (PEM) named `common` with the subject alternative
/// names `names` (IP addresses where they parse as one), signed by `ca`;
/// for servers too if `server`, else for clients only.
fn leaf(
    common: &str,
    names: Vec<String>,
    server: bool,
    ca: &Ca,
    (not_before, not_after): Validity,
) -> Result<(String, String), TlsError> {
    use rcgen::ExtendedKeyUsagePurpose::{ClientAuth, ServerAuth};
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
    let mut params = rcgen::CertificateParams::new(names)?;
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.distinguished_name.push(rcgen::DnType::CommonName, common);
    params.is_ca = rcgen::IsCa::ExplicitNoCa;
    params.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = if server { vec![ServerAuth, ClientAuth] } else { vec![ClientAuth] };
    params.use_authority_key_identifier_extension = true;
    params.not_before = not_before.into();
    params.not_after = not_after.into();
    let cert = params.signed_by(&key, &ca.cert, &ca.key)?;
    Ok((cert.pem(), key.serialize_pem()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_before_anything_is_written() {
        let tmp = tempfile::tempdir().unwrap();
        for bad in ["", "a b", "x.psmr", "replica-1.psmr"] {
            let e = generate(tmp.path(), &[1], &[bad]).unwrap_err();
            assert!(matches!(e, TlsError::Names(_)), "{bad:?}: {e}");
        }
        assert!(!tmp.path().join("ca.pem").exists());
        for bad in ["", "a_b", "a.b", "-a", &"x".repeat(64)] {
            assert!(check_user(bad).is_err(), "{bad:?}");
        }
        check_user("alice-2").unwrap();
        // A user needs the CA first.
        let e = generate_user(tmp.path(), "alice").unwrap_err().to_string();
        assert!(e.contains("no cluster CA"), "{e}");
        generate(tmp.path(), &[1], &LOOPBACK_HOSTS).unwrap();
        let (cert, key) = generate_user(tmp.path(), "alice").unwrap();
        assert!(cert.ends_with("user-alice.pem") && key.ends_with("user-alice.key"));
        assert!(matches!(generate_user(tmp.path(), "alice"), Err(TlsError::Exists(_))));
        assert_eq!(user_of_name(&user_name("alice")), Some("alice"));
        assert_eq!(user_of_name("replica-1.psmr"), None);
        assert_eq!(user_of_name("a_b.user.psmr"), None);
    }
}
