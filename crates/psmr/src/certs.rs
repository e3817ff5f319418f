//! `psmr certs`: a cluster CA and one certificate per replica, for mutual
//! TLS between replicas (`[peer_tls]`; see `psmr_replica::tls`) and TLS on
//! the ports clients reach (`[client_tls]`), and user certificates for
//! clients that prove who they are with one (see `psmr_tls`).

use anyhow::{bail, Context, Result};
use clap::Args;
use std::path::{Path, PathBuf};

/// Most replica ids one run makes certificates for.
const IDS_MAX: u64 = 1_000;

/// `psmr certs`.
#[derive(Args, Debug)]
pub struct CertsArgs {
    /// Where to write ca.pem, ca.key, replica-N.pem and replica-N.key (the
    /// directory is created readable by its owner only; existing files are
    /// never overwritten). Where DIR holds ca.pem and ca.key already, the
    /// new certificates are signed by that CA: `--ids 4` for a replica
    /// added to a running cluster.
    #[arg(long, value_name = "DIR")]
    dir: PathBuf,
    /// Certificates for replicas 1 to N.
    #[arg(long, value_name = "N", required_unless_present_any = ["ids", "user"], conflicts_with = "ids")]
    replicas: Option<u64>,
    /// Certificates for these replica ids, comma-separated (e.g. 1,2,3).
    #[arg(long, value_delimiter = ',', value_name = "ID,...")]
    ids: Vec<u64>,
    /// The host names and IP addresses clients dial to reach the replicas'
    /// client, Redis and metrics ports in TLS, comma-separated: each
    /// replica certificate names them all, and clients check the one they
    /// dial.
    #[arg(long, value_delimiter = ',', value_name = "HOST,...", default_values_t = LOOPBACK.map(String::from))]
    hosts: Vec<String>,
    /// A user certificate for user NAME (user-NAME.pem, user-NAME.key),
    /// signed by the CA in DIR: with it, a client reaching a client port
    /// in TLS is NAME without a password (`psmr client --tls-cert`). NAME
    /// must be one of the cluster's `[[users]]`, which gives its role.
    #[arg(long, value_name = "NAME")]
    user: Option<String>,
}

const LOOPBACK: [&str; 3] = psmr_replica::tls::LOOPBACK_HOSTS;

/// Makes the CA and the certificates, then prints the files and the
/// `[peer_tls]` block for the cluster's configuration.
pub fn certs(args: CertsArgs) -> Result<()> {
    if args.replicas.is_none() && args.ids.is_empty() {
        if let Some(user) = &args.user {
            return user_cert(&args.dir, user);
        }
    }
    let ids: Vec<u64> = match args.replicas {
        Some(n) if !(1..=IDS_MAX).contains(&n) => bail!("--replicas must be between 1 and {IDS_MAX}, got {n}"),
        Some(n) => (1..=n).collect(),
        None => args.ids,
    };
    if ids.len() as u64 > IDS_MAX {
        bail!("at most {IDS_MAX} replica ids at once, got {}", ids.len());
    }
    let existing = args.dir.join("ca.pem").exists() && args.dir.join("ca.key").exists();
    let hosts: Vec<&str> = args.hosts.iter().map(String::as_str).collect();
    let tls = psmr_replica::tls::generate_for_hosts(&args.dir, &ids, &hosts)
        .with_context(|| format!("cannot make certificates in {}", args.dir.display()))?;
    let dir = tls.ca.parent().map(Path::to_path_buf).unwrap_or_default();
    println!("made in {}:", dir.display());
    if existing {
        println!("  (signed by the existing CA in ca.pem and ca.key, which the other replicas trust)");
    } else {
        println!("  ca.pem    the cluster CA's certificate: every replica needs it");
        println!("  ca.key    the CA's private key (0600): no replica needs it; keep it where only you can read it");
    }
    for id in &ids {
        println!("  replica-{id}.pem, replica-{id}.key (0600)    replica {id}'s certificate and private key");
    }
    println!();
    println!("add to the cluster's configuration:");
    println!();
    println!("[peer_tls]");
    println!("ca = {}", toml_string(&tls.ca)?);
    println!("cert = {}", toml_string(&tls.cert)?);
    println!("key = {}", toml_string(&tls.key)?);
    println!();
    println!("and, for TLS on the ports clients reach (their certificates name {}):", hosts.join(", "));
    println!();
    println!("[client_tls]");
    println!("cert = {}", toml_string(&tls.cert)?);
    println!("key = {}", toml_string(&tls.key)?);
    println!("ca = {}    # to accept user certificates (psmr certs --user NAME)", toml_string(&tls.ca)?);
    if let Some(user) = &args.user {
        println!();
        user_cert(&dir, user)?;
    }
    Ok(())
}

/// Makes user `user`'s certificate with the CA in `dir`.
fn user_cert(dir: &Path, user: &str) -> Result<()> {
    let (cert, key) = psmr_replica::tls::generate_user(dir, user)
        .with_context(|| format!("cannot make user {user}'s certificate in {}", dir.display()))?;
    println!("made {} and {} (0600): user {user}'s certificate and key", cert.display(), key.display());
    let ca = dir.join("ca.pem");
    println!(
        "use them with: psmr client --tls-ca {} --tls-cert {} --tls-key {} ...",
        ca.display(),
        cert.display(),
        key.display()
    );
    Ok(())
}

/// A path as a TOML basic string.
fn toml_string(path: &Path) -> Result<String> {
    let Some(s) = path.to_str() else {
        bail!("{} is not valid UTF-8 and cannot be written in a configuration", path.display());
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_become_toml_strings() {
        assert_eq!(toml_string(Path::new("/a/b c/ca.pem")).unwrap(), "\"/a/b c/ca.pem\"");
        assert_eq!(toml_string(Path::new("/a\"b\\c\n")).unwrap(), "\"/a\\\"b\\\\c\\u000A\"");
    }
}
