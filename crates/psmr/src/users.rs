//! Users on the command line: `psmr passwd` (a password hash and the
//! `[[users]]` block for a configuration) and the credentials `psmr
//! client` presents.

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use psmr_auth::{Credentials, PasswordHash, Role};
use std::io::BufRead;
use std::path::PathBuf;

/// The environment variable a password may come from (never a flag: the
/// command line is visible to every user of the machine).
pub const PASSWORD_ENV: &str = "PSMR_PASSWORD";

/// Who `psmr client` is.
#[derive(Args, Debug, Clone)]
pub struct CredentialArgs {
    /// The user to act as (`psmr cluster` makes `admin` and `default`);
    /// without it and without a password, the client is anonymous, which
    /// replicas with users let list the members and nothing else.
    #[arg(long, env = "PSMR_USER", value_name = "NAME")]
    user: Option<String>,
    /// A file whose first line is the password (`psmr cluster` writes
    /// DIR/NAME.password); else the PSMR_PASSWORD environment variable.
    #[arg(long, env = "PSMR_PASSWORD_FILE", value_name = "FILE")]
    password_file: Option<PathBuf>,
    /// Reach the client ports in TLS, trusting the cluster CA of FILE
    /// (`psmr certs` writes DIR/ca.pem); for replicas whose
    /// `[client_tls]` lists `client`.
    #[arg(long, env = "PSMR_TLS_CA", value_name = "FILE")]
    tls_ca: Option<PathBuf>,
    /// Show the user certificate of FILE (`psmr certs --user NAME` writes
    /// DIR/user-NAME.pem): the client is user NAME without a password.
    #[arg(long, env = "PSMR_TLS_CERT", value_name = "FILE", requires_all = ["tls_ca", "tls_key"])]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (DIR/user-NAME.key).
    #[arg(long, env = "PSMR_TLS_KEY", value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
}

impl CredentialArgs {
    /// The credentials given, if any: a user name (`default` if only a
    /// password is given, as in Redis) and its password.
    pub fn credentials(&self) -> Result<Option<Credentials>> {
        let env = std::env::var(PASSWORD_ENV).ok().filter(|p| !p.is_empty());
        let user = self.user.clone();
        match (&self.password_file, env) {
            (Some(file), _) => {
                let user = user.unwrap_or_else(|| psmr_auth::DEFAULT_USER.into());
                Ok(Some(Credentials::from_file(user, file)?))
            }
            (None, Some(password)) => {
                let user = user.unwrap_or_else(|| psmr_auth::DEFAULT_USER.into());
                Ok(Some(Credentials::new(user, password).map_err(|e| anyhow!("{PASSWORD_ENV}: {e}"))?))
            }
            (None, None) if user.is_some() && self.tls_cert.is_none() => {
                bail!("--user needs a password: --password-file FILE (or PSMR_PASSWORD_FILE) or PSMR_PASSWORD")
            }
            (None, None) => Ok(None),
        }
    }

    /// TLS to the client ports, if --tls-ca is given.
    pub fn tls(&self) -> Result<Option<psmr_client::Connector>> {
        let Some(ca) = &self.tls_ca else { return Ok(None) };
        let identity = self.tls_cert.as_deref().zip(self.tls_key.as_deref());
        Ok(Some(psmr_client::Connector::load(ca, identity)?))
    }
}

/// `psmr passwd`.
#[derive(Args, Debug)]
pub struct PasswdArgs {
    /// The user's name.
    #[arg(long, value_name = "NAME")]
    user: String,
    /// What the user may do: data (read and write) or admin (also
    /// membership, reconfigure, snapshots, flush).
    #[arg(long, default_value = "data")]
    role: String,
    /// Make a new random password and write it to FILE (created readable
    /// by its owner only; an existing file is never overwritten), instead
    /// of reading one from standard input.
    #[arg(long, value_name = "FILE")]
    generate: Option<PathBuf>,
    /// Rounds of PBKDF2-HMAC-SHA256.
    #[arg(long, default_value_t = psmr_auth::ITERATIONS_DEFAULT)]
    iterations: u32,
}

/// Hashes a password (read from standard input's first line, or made and
/// written to a file) and prints the `[[users]]` block for every
/// replica's configuration.
pub fn passwd(args: PasswdArgs) -> Result<()> {
    psmr_auth::check_name(&args.user)?;
    let role = match args.role.as_str() {
        "data" => Role::Data,
        "admin" => Role::Admin,
        other => bail!("unknown role {other:?} (known: data, admin)"),
    };
    psmr_auth::check_rounds(args.iterations)?;
    let password = match &args.generate {
        Some(file) => {
            let secret = psmr_auth::new_secret()?;
            psmr_harness::launch::write_private(file, &secret)?;
            eprintln!("password written to {}", file.display());
            secret
        }
        None => {
            let mut line = String::new();
            std::io::stdin().lock().read_line(&mut line).context("cannot read the password from standard input")?;
            line.trim_end_matches(['\r', '\n']).to_string()
        }
    };
    // The same rules as a client's.
    Credentials::new(&args.user, password.clone())?;
    let hash = PasswordHash::new(password.as_bytes(), args.iterations)?;
    println!("[[users]]\nname = {:?}\npassword = \"{hash}\"\nrole = \"{}\"", args.user, role.name());
    Ok(())
}
