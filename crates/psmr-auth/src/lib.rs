//! # psmr-auth: who a client is, and what it may do
//!
//! A replica's configuration lists its users (`[[users]]`: a name, a
//! salted password hash and a [`Role`]); every replica of a cluster has
//! the same list, so every replica refuses the same client the same way,
//! whichever it reaches. A [`Gate`] is made of that list once, at start,
//! and then answers two questions for every connection of the client
//! port and the Redis ports:
//!
//! * who is this ([`Gate::check`]): a user name and a password, checked
//!   against the hash in constant time; guessing is slowed down per
//!   source address and bounded in total ([`attempts`]);
//! * may they do this ([`Principal::may`]): roles grant [`Need`]s, and
//!   the ports ask for the need of every message and command.
//!
//! A configuration without users must say `insecure_clients = true`, and
//! then every connection acts as an admin named `default` without
//! authenticating, as before clients could authenticate.
//!
//! Refusals read as Redis's own errors ([`Refusal`]'s text starts with
//! `NOAUTH`, `WRONGPASS` or `NOPERM`), on psmr's protocol as well.
//!
//! In the guide: `docs/design.md` places this crate among the others;
//! `docs/security.md`: users, roles and what each client may do.

pub mod attempts;
mod hash;

pub use attempts::Attempts;
pub use hash::{check_rounds, PasswordHash, ITERATIONS_DEFAULT, ITERATIONS_MAX, ITERATIONS_MIN};

use parking_lot::Mutex;
use ring::hmac;
use ring::rand::SystemRandom;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use thiserror::Error;

/// Longest user name.
pub const USER_MAX: usize = 64;
/// Longest password (a longer one is refused before it is hashed).
pub const PASSWORD_MAX: usize = 512;
/// Most users a configuration may list.
pub const USERS_MAX: usize = 1024;
/// The user a one-argument `AUTH password` names, as in Redis; also the
/// name of every connection where `insecure_clients = true`.
pub const DEFAULT_USER: &str = "default";

/// Errors in users, hashes and credentials.
#[derive(Debug, Error)]
pub enum AuthError {
    /// A password hash does not parse.
    #[error("invalid password hash: {0}")]
    Hash(String),
    /// A user entry breaks a rule.
    #[error("invalid user: {0}")]
    User(String),
    /// Credentials cannot be read.
    #[error("credentials: {0}")]
    Credentials(String),
    /// The system's random source failed.
    #[error("the system's random source failed")]
    Random,
}

/// What a user may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Read and write the service's data, and watch the replica (status,
    /// statistics, metrics).
    Data,
    /// Everything: also membership, reconfiguration, snapshots, and the
    /// service's privileged operations (flushing the store).
    Admin,
}

/// What an action needs of whoever asks for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// Nothing: listing the members (anyone may, as in etcd).
    Nothing,
    /// The [`Role::Data`] rights.
    Data,
    /// The [`Role::Admin`] rights.
    Admin,
}

impl Role {
    /// Its name, as configurations spell it.
    pub fn name(self) -> &'static str {
        match self {
            Role::Data => "data",
            Role::Admin => "admin",
        }
    }

    /// Whether this role may do what needs `need`.
    pub fn grants(self, need: Need) -> bool {
        match need {
            Need::Nothing | Need::Data => true,
            Need::Admin => self == Role::Admin,
        }
    }
}

/// One user, as a configuration lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserSpec {
    /// The name clients give.
    pub name: String,
    /// The password's hash (`psmr passwd` makes one); never the password.
    pub password: String,
    /// What the user may do.
    pub role: Role,
}

/// Who a connection acts as, once it has authenticated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Principal {
    name: Arc<str>,
    role: Role,
}

impl Principal {
    /// The user's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The user's role.
    pub fn role(&self) -> Role {
        self.role
    }

    /// Ok if this user may do `what`, which needs `need`; the refusal to
    /// send otherwise.
    pub fn may(&self, need: Need, what: &str) -> Result<(), Refusal> {
        match self.role.grants(need) {
            true => Ok(()),
            false => Err(Refusal::NoPerm { user: self.name.to_string(), what: what.to_string() }),
        }
    }
}

/// Why a client is refused, in the words Redis uses.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum Refusal {
    /// It has not authenticated.
    #[error("NOAUTH Authentication required.")]
    NoAuth,
    /// Its user name or password is wrong (which one is not said).
    #[error("WRONGPASS invalid username-password pair or user is disabled.")]
    WrongPass,
    /// Its user may not do this.
    #[error("NOPERM User {user} has no permissions to run the '{what}' command")]
    NoPerm {
        /// The user.
        user: String,
        /// What it asked for.
        what: String,
    },
    /// Too many attempts: try later.
    #[error("ERR too many authentication attempts, try again later")]
    Busy,
    /// The replica has no users (`insecure_clients`): there is nothing to
    /// authenticate as.
    #[error("ERR AUTH called without any users configured (insecure_clients = true)")]
    NoUsers,
}

struct User {
    hash: PasswordHash,
    role: Role,
}

/// The users of a replica, and the bounds on guessing their passwords.
/// See the crate documentation.
pub struct Gate {
    users: HashMap<String, User>,
    insecure: bool,
    /// Per user, a keyed digest of the last password that matched, so that
    /// a client that connects again costs no hash (the key is random per
    /// process, the digest compared in constant time).
    remembered: Mutex<HashMap<String, hmac::Tag>>,
    key: hmac::Key,
    attempts: Mutex<Attempts>,
}

impl fmt::Debug for Gate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gate").field("users", &self.users.len()).field("insecure", &self.insecure).finish()
    }
}

/// A new secret: 256 random bits from the system, as 64 hex digits.
pub fn new_secret() -> Result<String, AuthError> {
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; 32];
    SystemRandom::new().fill(&mut bytes).map_err(|_| AuthError::Random)?;
    Ok(hex::encode(bytes))
}

/// Checks a user name from a configuration or a client.
pub fn check_name(name: &str) -> Result<(), AuthError> {
    let ok = (1..=USER_MAX).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b'@'));
    match ok {
        true => Ok(()),
        false => {
            Err(AuthError::User(format!("name {name:?}: 1 to {USER_MAX} letters, digits and _ - . @ are accepted")))
        }
    }
}

impl Gate {
    /// The gate of `users`; `insecure`: no users, and every connection is
    /// an admin (`insecure_clients = true`).
    pub fn new(users: &[UserSpec], insecure: bool) -> Result<Self, AuthError> {
        let found = Self::users(users)?;
        match (found.is_empty(), insecure) {
            (true, false) => {
                return Err(AuthError::User(
                    "no users: list [[users]] (psmr passwd hashes a password) or, where every client is \
                     trusted, set insecure_clients = true"
                        .into(),
                ))
            }
            (false, true) => {
                return Err(AuthError::User("[[users]] and insecure_clients = true exclude each other".into()))
            }
            _ => {}
        }
        let key = hmac::Key::generate(hmac::HMAC_SHA256, &SystemRandom::new()).map_err(|_| AuthError::Random)?;
        let (remembered, attempts) = (Mutex::default(), Mutex::new(Attempts::new(Instant::now())));
        Ok(Self { users: found, insecure, remembered, key, attempts })
    }

    /// A gate that lets every connection do everything (tests, benchmarks).
    pub fn insecure() -> Self {
        Self::new(&[], true).expect("no users and insecure is a valid gate")
    }

    fn users(specs: &[UserSpec]) -> Result<HashMap<String, User>, AuthError> {
        if specs.len() > USERS_MAX {
            return Err(AuthError::User(format!("{} users, at most {USERS_MAX}", specs.len())));
        }
        let mut users = HashMap::new();
        for spec in specs {
            check_name(&spec.name)?;
            let hash = spec.password.parse().map_err(|e| AuthError::User(format!("{}: {e}", spec.name)))?;
            if users.insert(spec.name.clone(), User { hash, role: spec.role }).is_some() {
                return Err(AuthError::User(format!("{} is listed twice", spec.name)));
            }
        }
        Ok(users)
    }

    /// Whether clients must authenticate.
    pub fn required(&self) -> bool {
        !self.insecure
    }

    /// Who a connection is before it authenticates: an admin where
    /// clients are not authenticated, nobody otherwise.
    pub fn anonymous(&self) -> Option<Principal> {
        self.insecure.then(|| Principal { name: DEFAULT_USER.into(), role: Role::Admin })
    }

    /// The principal of user `name`, who proved who they are another way
    /// (a client certificate from the cluster's CA naming them); None if
    /// no such user is listed, or where clients are not authenticated.
    pub fn certified(&self, name: &str) -> Option<Principal> {
        let (name, user) = self.users.get_key_value(name)?;
        Some(Principal { name: name.as_str().into(), role: user.role })
    }

    /// An attempt to authenticate from `source` at `now`: how long it must
    /// wait before [`Gate::check`] (a source that failed waits, longer
    /// each time), or [`Refusal::Busy`].
    pub fn admit(&self, source: IpAddr, now: Instant) -> Result<Duration, Refusal> {
        self.attempts.lock().admit(source, now).ok_or(Refusal::Busy)
    }

    /// Checks `user`'s `password` (from `source`, at `now`). May compute a
    /// password hash (tens of milliseconds): call it where blocking is
    /// allowed.
    pub fn check(&self, source: IpAddr, user: &[u8], password: &[u8], now: Instant) -> Result<Principal, Refusal> {
        if self.insecure {
            return Err(Refusal::NoUsers);
        }
        let found = std::str::from_utf8(user).ok().and_then(|u| self.users.get_key_value(u));
        let result = match found {
            Some((name, u)) if password.len() <= PASSWORD_MAX => self.matches(name, u, password, now),
            _ => Err(Refusal::WrongPass),
        };
        match (&result, found) {
            (Ok(()), Some((name, u))) => {
                self.attempts.lock().succeeded(source);
                Ok(Principal { name: name.as_str().into(), role: u.role })
            }
            (Err(Refusal::Busy), _) => Err(Refusal::Busy),
            _ => {
                self.attempts.lock().failed(source, now);
                Err(Refusal::WrongPass)
            }
        }
    }

    fn matches(&self, name: &str, user: &User, password: &[u8], now: Instant) -> Result<(), Refusal> {
        if let Some(tag) = self.remembered.lock().get(name) {
            if hmac::verify(&self.key, password, tag.as_ref()).is_ok() {
                return Ok(());
            }
        }
        if !self.attempts.lock().take_hash(now) {
            return Err(Refusal::Busy);
        }
        if !user.hash.matches(password) {
            return Err(Refusal::WrongPass);
        }
        self.remembered.lock().insert(name.to_string(), hmac::sign(&self.key, password));
        Ok(())
    }
}

/// Checks `user`'s `password` from `source` for a server on tokio: waits
/// the delay that failures from `source` earned, then hashes on the
/// blocking pool (a hash takes milliseconds, which an IO thread must not
/// spend).
#[cfg(feature = "async")]
pub async fn authenticate(
    gate: Arc<Gate>,
    source: IpAddr,
    user: Vec<u8>,
    password: Vec<u8>,
) -> Result<Principal, Refusal> {
    let wait = gate.admit(source, Instant::now())?;
    tokio::time::sleep(wait).await;
    let check = move || gate.check(source, &user, &password, Instant::now());
    tokio::task::spawn_blocking(check).await.unwrap_or(Err(Refusal::Busy))
}

/// What a client says it is: a user name and a password.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    user: String,
    password: String,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials").field("user", &self.user).field("password", &"<hidden>").finish()
    }
}

impl Credentials {
    /// `user` with `password`, both within their limits.
    pub fn new(user: impl Into<String>, password: impl Into<String>) -> Result<Self, AuthError> {
        let (user, password) = (user.into(), password.into());
        check_name(&user)?;
        if password.is_empty() || password.len() > PASSWORD_MAX {
            return Err(AuthError::Credentials(format!("a password is 1 to {PASSWORD_MAX} bytes")));
        }
        Ok(Self { user, password })
    }

    /// `user` with the password that the first line of `file` holds.
    pub fn from_file(user: impl Into<String>, file: &Path) -> Result<Self, AuthError> {
        use std::io::Read;
        let shown = file.display();
        let f = std::fs::File::open(file).map_err(|e| AuthError::Credentials(format!("cannot read {shown}: {e}")))?;
        let mut text = String::new();
        f.take(PASSWORD_MAX as u64 + 3)
            .read_to_string(&mut text)
            .map_err(|e| AuthError::Credentials(format!("cannot read {shown}: {e}")))?;
        let line = text.lines().next().unwrap_or("");
        Self::new(user, line).map_err(|e| AuthError::Credentials(format!("{shown}: {e}")))
    }

    /// The user name.
    pub fn user(&self) -> &str {
        &self.user
    }

    /// The password.
    pub fn password(&self) -> &str {
        &self.password
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    const SOURCE: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

    fn spec(name: &str, password: &str, role: Role) -> UserSpec {
        let hash = PasswordHash::new(password.as_bytes(), ITERATIONS_MIN).unwrap();
        UserSpec { name: name.into(), password: hash.to_string(), role }
    }

    fn gate() -> Gate {
        Gate::new(&[spec("admin", "a-secret", Role::Admin), spec("default", "d-secret", Role::Data)], false).unwrap()
    }

    #[test]
    fn users_authenticate_with_their_own_password_only() {
        let (g, now) = (gate(), Instant::now());
        let admin = g.check(SOURCE, b"admin", b"a-secret", now).unwrap();
        assert_eq!((admin.name(), admin.role()), ("admin", Role::Admin));
        let data = g.check(SOURCE, b"default", b"d-secret", now).unwrap();
        assert_eq!(data.role(), Role::Data);
        // Remembered: the same again matches without a hash.
        assert_eq!(g.check(SOURCE, b"default", b"d-secret", now).unwrap(), data);
        for (user, pw) in [("admin", "d-secret"), ("default", "a-secret"), ("nobody", "x"), ("admin", "")] {
            assert_eq!(g.check(SOURCE, user.as_bytes(), pw.as_bytes(), now), Err(Refusal::WrongPass), "{user}");
        }
        let long = vec![b'x'; PASSWORD_MAX + 1];
        assert_eq!(g.check(SOURCE, b"admin", &long, now), Err(Refusal::WrongPass));
        assert_eq!(g.check(SOURCE, &[0xff, 0xfe], b"a-secret", now), Err(Refusal::WrongPass));
    }

    #[test]
    fn failures_slow_the_source_down_and_success_forgives() {
        let (g, now) = (gate(), Instant::now());
        assert_eq!(g.admit(SOURCE, now), Ok(Duration::ZERO));
        let _ = g.check(SOURCE, b"admin", b"wrong", now);
        assert_eq!(g.admit(SOURCE, now), Ok(attempts::FIRST_DELAY));
        g.check(SOURCE, b"admin", b"a-secret", now).unwrap();
        assert_eq!(g.admit(SOURCE, now), Ok(Duration::ZERO));
    }

    #[test]
    fn guessing_beyond_the_hash_budget_is_refused_as_busy() {
        let (g, now) = (gate(), Instant::now());
        let outcomes: Vec<_> = (0..attempts::HASH_BURST + 5)
            .map(|i| g.check(SOURCE, b"admin", format!("guess{i}").as_bytes(), now))
            .collect();
        let busy = outcomes.iter().filter(|r| **r == Err(Refusal::Busy)).count();
        assert_eq!(busy, 5, "{outcomes:?}");
    }

    #[test]
    fn roles_grant_their_needs() {
        let (g, now) = (gate(), Instant::now());
        let data = g.check(SOURCE, b"default", b"d-secret", now).unwrap();
        assert!(data.may(Need::Data, "get").is_ok() && data.may(Need::Nothing, "members").is_ok());
        let refusal = data.may(Need::Admin, "flushdb").unwrap_err();
        assert_eq!(refusal.to_string(), "NOPERM User default has no permissions to run the 'flushdb' command");
        let admin = g.check(SOURCE, b"admin", b"a-secret", now).unwrap();
        assert!(admin.may(Need::Admin, "flushdb").is_ok());
    }

    #[test]
    fn configurations_are_checked() {
        let bad = |users: &[UserSpec], insecure| Gate::new(users, insecure).unwrap_err().to_string();
        assert!(bad(&[], false).contains("insecure_clients = true"));
        assert!(bad(&[spec("a", "p", Role::Data)], true).contains("exclude each other"));
        assert!(bad(&[spec("a", "p", Role::Data), spec("a", "q", Role::Admin)], false).contains("twice"));
        assert!(bad(&[spec("a b", "p", Role::Data)], false).contains("name"));
        let mut plain = spec("a", "p", Role::Data);
        plain.password = "p".into();
        assert!(bad(&[plain], false).contains("psmr passwd"));
        let open = Gate::insecure();
        assert_eq!(open.anonymous().unwrap().role(), Role::Admin);
        assert_eq!(open.check(SOURCE, b"default", b"x", Instant::now()), Err(Refusal::NoUsers));
        assert!(gate().anonymous().is_none());
    }

    #[test]
    fn credentials_come_from_a_file_and_hide_their_password() {
        let dir = std::env::temp_dir().join(format!("psmr-auth-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("pw");
        std::fs::write(&file, "s3cret\n").unwrap();
        let c = Credentials::from_file("admin", &file).unwrap();
        assert_eq!((c.user(), c.password()), ("admin", "s3cret"));
        assert!(!format!("{c:?}").contains("s3cret"));
        std::fs::write(&file, "\n").unwrap();
        assert!(Credentials::from_file("admin", &file).is_err());
        assert!(Credentials::from_file("admin", &dir.join("missing")).unwrap_err().to_string().contains("cannot read"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
