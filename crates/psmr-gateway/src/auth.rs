//! Who a Redis connection is, and what it may run.
//!
//! `AUTH [user] password` and `HELLO proto AUTH user password` check the
//! replica's users ([`psmr_auth::Gate`]: the client port's own, so a
//! user is the same on both ports); a one-argument `AUTH` names the user
//! `default`, as in Redis. Until a connection authenticates, every command
//! but `AUTH`, `HELLO` and `QUIT` is answered `-NOAUTH`; after, every
//! command is checked against the user's role before it is submitted:
//! the gateway submits inside the replica with the replica's own rights,
//! so it never lets a command through that its user could not send
//! itself (over the network, its session authenticates as that user and
//! the leader checks again).

use bytes::Bytes;
use psmr_auth::{Gate, Need, Principal, Refusal};
use psmr_model::ratelog::RateLimit;
use psmr_resp::{Reply, Version};
use psmr_tls::Stream;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpStream;

static DENIED: RateLimit = RateLimit::new(10, Duration::from_secs(10));

/// Told of every refusal (the replica counts them in its metrics).
pub type Refused = Arc<dyn Fn(&Refusal) + Send + Sync>;

/// Told of every TLS handshake that fails or runs out of time.
pub type HandshakeFailed = Arc<dyn Fn() + Send + Sync>;

/// The users of a gateway, its TLS, and where its refusals are counted.
#[derive(Clone)]
pub struct Auth {
    /// The replica's users.
    pub gate: Arc<Gate>,
    /// Counts a refusal.
    pub refused: Refused,
    /// TLS on the port, and where failed handshakes are counted. A client
    /// certificate, if the port asks for one, must be from the cluster's
    /// CA, but names nobody here: Redis clients say who they are with
    /// `AUTH`, as they do to Redis, so that a follower's gateway can
    /// forward their commands to the leader as them.
    pub tls: Option<(psmr_tls::Acceptor, HandshakeFailed)>,
}

impl Auth {
    /// Every connection may do everything; refusals are not counted
    /// (tests).
    pub fn insecure() -> Self {
        Self { gate: Arc::new(Gate::insecure()), refused: Arc::new(|_| {}), tls: None }
    }

    /// The connection on `stream` from `peer`, in TLS if the port is; None
    /// if its handshake failed (counted and logged).
    pub(crate) async fn handshake(&self, stream: TcpStream, peer: SocketAddr) -> Option<Stream> {
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(%peer, "redis connection: {e}");
            return None;
        }
        let Some((tls, failed)) = &self.tls else { return Some(Stream::Plain(stream)) };
        match tls.accept(stream).await {
            Ok((stream, _user)) => Some(stream),
            Err(e) => {
                failed();
                psmr_model::warn_limited!(DENIED, %peer, "redis client refused: {e}");
                None
            }
        }
    }
}

/// An attempt to authenticate.
pub(crate) struct Login {
    user: Bytes,
    password: Bytes,
    /// `HELLO`'s protocol version, switched to once authenticated.
    pub(crate) hello: Option<Version>,
}

/// `AUTH [user] password`.
pub(crate) fn auth_command(args: &[Bytes]) -> Result<Login, Reply> {
    match args {
        [_, password] => Ok(Login { user: Bytes::from_static(b"default"), password: password.clone(), hello: None }),
        [_, user, password] => Ok(Login { user: user.clone(), password: password.clone(), hello: None }),
        _ => Err(Reply::error("ERR syntax error")),
    }
}

/// What `HELLO [proto [AUTH user password] [SETNAME name]]` asks for.
pub(crate) struct Hello {
    pub(crate) version: Option<Version>,
    pub(crate) login: Option<Login>,
    pub(crate) name: Option<Bytes>,
}

/// Parses `HELLO`'s arguments as Redis 7 does.
pub(crate) fn hello_command(args: &[Bytes]) -> Result<Hello, Reply> {
    let version = match args.get(1).map(|v| v.as_ref()) {
        None => None,
        Some(b"2") => Some(Version::Resp2),
        Some(b"3") => Some(Version::Resp3),
        Some(_) => return Err(Reply::error("NOPROTO unsupported protocol version")),
    };
    let mut hello = Hello { version, login: None, name: None };
    let mut rest = args.get(2..).unwrap_or_default();
    while let Some(option) = rest.first() {
        match (option.to_ascii_uppercase().as_slice(), rest) {
            (b"AUTH", [_, user, password, ..]) => {
                hello.login = Some(Login { user: user.clone(), password: password.clone(), hello: version });
                rest = &rest[3..];
            }
            (b"SETNAME", [_, name, ..]) => {
                hello.name = Some(name.clone());
                rest = &rest[2..];
            }
            _ => {
                let shown = String::from_utf8_lossy(option);
                return Err(Reply::error(format!("ERR Syntax error in HELLO option '{shown}'")));
            }
        }
    }
    Ok(hello)
}

/// What `HELLO` without `AUTH` answers a connection that must
/// authenticate first.
pub(crate) fn hello_noauth() -> Reply {
    Reply::error(
        "NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH \
         <user> <pass> option can be used to authenticate the client and select the RESP protocol version at \
         the same time",
    )
}

impl Auth {
    /// Checks `login` from `peer`: who the connection is now, and the
    /// credentials its network session presents; or the reply refusing it.
    pub(crate) async fn login(
        &self,
        peer: SocketAddr,
        login: &Login,
    ) -> Result<(Principal, psmr_auth::Credentials), Reply> {
        let (user, password) = (login.user.to_vec(), login.password.to_vec());
        let shown = String::from_utf8_lossy(&user).into_owned();
        let checked = match std::str::from_utf8(&password) {
            // psmr's protocol carries text passwords; no user has another.
            Err(_) => Err(Refusal::WrongPass),
            Ok(_) => psmr_auth::authenticate(self.gate.clone(), peer.ip(), user, password).await,
        };
        let principal = checked.map_err(|r| self.refuse(peer, Some(&shown), &r))?;
        let password = String::from_utf8_lossy(&login.password).into_owned();
        let credentials =
            psmr_auth::Credentials::new(principal.name(), password).map_err(|e| Reply::error(format!("ERR {e}")))?;
        Ok((principal, credentials))
    }

    /// Ok if `who` may run `command`, which needs `need`; the reply
    /// refusing it otherwise. Admin commands that pass are audited.
    pub(crate) fn may(
        &self,
        peer: SocketAddr,
        who: Option<&Principal>,
        need: Need,
        command: &str,
    ) -> Result<(), Reply> {
        let Some(principal) = who else {
            return Err(self.refuse(peer, None, &Refusal::NoAuth));
        };
        principal.may(need, command).map_err(|r| self.refuse(peer, Some(principal.name()), &r))?;
        if need == Need::Admin && self.gate.required() {
            tracing::info!(target: "psmr::audit", user = principal.name(), %peer, "redis {command}");
        }
        Ok(())
    }

    /// Counts and logs `refusal`; its reply.
    pub(crate) fn refuse(&self, peer: SocketAddr, user: Option<&str>, refusal: &Refusal) -> Reply {
        (self.refused)(refusal);
        let user = user.unwrap_or("(anonymous)");
        psmr_model::warn_limited!(DENIED, %peer, user, "redis client refused: {refusal}");
        Reply::error(refusal.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(words: &[&str]) -> Vec<Bytes> {
        words.iter().map(|w| Bytes::copy_from_slice(w.as_bytes())).collect()
    }

    #[test]
    fn auth_takes_a_password_or_a_user_and_a_password() {
        let one = auth_command(&args(&["AUTH", "pw"])).unwrap();
        assert_eq!((&one.user[..], &one.password[..]), (&b"default"[..], &b"pw"[..]));
        let two = auth_command(&args(&["auth", "admin", "pw"])).unwrap();
        assert_eq!((&two.user[..], &two.password[..]), (&b"admin"[..], &b"pw"[..]));
        assert!(auth_command(&args(&["AUTH"])).is_err());
        assert!(auth_command(&args(&["AUTH", "a", "b", "c"])).is_err());
    }

    #[test]
    fn hello_options_parse_as_redis_parses_them() {
        let h = hello_command(&args(&["HELLO", "3", "AUTH", "u", "p", "SETNAME", "me"])).unwrap();
        assert_eq!(h.version, Some(Version::Resp3));
        let login = h.login.unwrap();
        assert_eq!((&login.user[..], login.hello), (&b"u"[..], Some(Version::Resp3)));
        assert_eq!(h.name.as_deref(), Some(&b"me"[..]));
        assert!(hello_command(&args(&["HELLO"])).unwrap().version.is_none());
        let bad = |words: &[&str]| match hello_command(&args(words)) {
            Err(Reply::Error(e)) => e,
            _ => panic!("{words:?} accepted"),
        };
        assert!(bad(&["HELLO", "4"]).starts_with("NOPROTO"));
        assert!(bad(&["HELLO", "3", "AUTH", "u"]).contains("'AUTH'"));
        assert!(bad(&["HELLO", "3", "FOO"]).contains("'FOO'"));
    }
}
