//! `psmr certs`: a cluster CA and one certificate per replica, for mutual
//! TLS between replicas (`[peer_tls]`; see `psmr_replica::tls`).

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
    #[arg(long, value_name = "N", required_unless_present = "ids", conflicts_with = "ids")]
    replicas: Option<u64>,
    /// Certificates for these replica ids, comma-separated (e.g. 1,2,3).
    #[arg(long, value_delimiter = ',', value_name = "ID,...")]
    ids: Vec<u64>,
}

/// Makes the CA and the certificates, then prints the files and the
/// `[peer_tls]` block for the cluster's configuration.
pub fn certs(args: CertsArgs) -> Result<()> {
    let ids: Vec<u64> = match args.replicas {
        Some(n) if !(1..=IDS_MAX).contains(&n) => bail!("--replicas must be between 1 and {IDS_MAX}, got {n}"),
        Some(n) => (1..=n).collect(),
        None => args.ids,
    };
    if ids.len() as u64 > IDS_MAX {
        bail!("at most {IDS_MAX} replica ids at once, got {}", ids.len());
    }
    let existing = args.dir.join("ca.pem").exists() && args.dir.join("ca.key").exists();
    let tls = psmr_replica::tls::generate(&args.dir, &ids)
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
