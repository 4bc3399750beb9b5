//! Finding the primary through Redis Sentinel: `redis+sentinel://` and `rediss+sentinel://`.
//!
//! Every sentinel is asked at once (`SENTINEL GET-MASTER-ADDR-BY-NAME`), each from a short-lived
//! thread, every exchange bounded by the time we have ([`crate::wire`]); the first primary a
//! sentinel names is connected to and must say with `ROLE` that it is a primary. A hung sentinel
//! costs one thread until the deadline, never the lookup.

use std::sync::{mpsc, Arc};
use std::time::Duration;

use anyhow::{anyhow, bail, Result};
use redis::Value;

use crate::clock::Instant;
use crate::connect::{explain, HostsUrl};
use crate::tls::TlsOptions;
use crate::wire::{Addr, Session, Wire, WireError};

/// Sentinel's default port.
const PORT: u16 = 26379;

/// A service (a primary and its replicas) watched by sentinels.
pub struct Service {
    name: String,
    sentinels: Vec<(String, u16)>,
    /// For the data nodes (the URL's userinfo, TLS, db).
    data: Session,
    /// For the sentinels (`?sentinel_username=...&sentinel_password=...`, TLS).
    sentinel: Session,
}

/// What one sentinel said.
enum Named {
    Primary(String, u16),
    /// It knows no primary of that name.
    Unknown,
}

impl Service {
    /// Parse `redis+sentinel://[user][:password@]host[:port][,host[:port]...]/SERVICE[/db]`.
    pub fn parse(url: &str, source: &str, shown: &str, tls: &TlsOptions) -> Result<Service> {
        let invalid = |problem: &str| anyhow!("invalid {source} '{shown}': {problem}");
        let u = HostsUrl::parse(url, Some(PORT)).map_err(|p| invalid(&p))?;
        let (name, db) = match u.path.as_slice() {
            [name] => (name.clone(), 0),
            [name, db] => (
                name.clone(),
                db.parse::<i64>()
                    .ok()
                    .filter(|d| *d >= 0)
                    .ok_or_else(|| invalid(&format!("database '{db}' is not a number")))?,
            ),
            _ => {
                return Err(invalid(
                    "expected redis+sentinel://[user][:password@]host[:port][,host[:port]...]\
                     /SERVICE[/db]: the service name is the primary's name in the sentinels' \
                     configuration",
                ))
            }
        };
        let tls_config = if u.tls {
            Some(tls.client_config()?)
        } else if tls.any() {
            bail!(
                "--tls-ca-cert, --tls-cert and --tls-key are for rediss+sentinel:// URLs, and \
                 {source} is '{shown}'"
            );
        } else {
            None
        };
        let mut service = Service {
            name,
            sentinels: u.hosts,
            data: Session {
                tls: tls_config.clone(),
                user: u.user,
                password: u.password,
                db,
            },
            sentinel: Session {
                tls: tls_config,
                ..Session::default()
            },
        };
        for (k, v) in u.query {
            match k.as_str() {
                "sentinel_username" => service.sentinel.user = Some(v),
                "sentinel_password" => service.sentinel.password = Some(v),
                _ => {
                    return Err(invalid(&format!(
                        "unknown parameter '{k}' (known: sentinel_username, sentinel_password)"
                    )))
                }
            }
        }
        Ok(service)
    }

    /// Connect to the service's primary within `within`, lookup included.
    pub fn connect(&self, within: Duration) -> Result<Wire> {
        let deadline = Instant::now() + within;
        let (host, port) = self.primary(deadline)?;
        let addr = Addr::Tcp(host, port);
        let named = |e: &WireError| {
            anyhow!(
                "the primary of service '{}' ({addr}): {}",
                self.name,
                explain(e)
            )
        };
        let mut wire = Wire::connect(&addr, &self.data, deadline).map_err(|e| named(&e))?;
        // The sentinels may name a node that is not (or no longer) a primary: never use one.
        let role = wire
            .call(&[b"ROLE"], deadline)
            .and_then(|r| r.ok())
            .map_err(|e| named(&e))?;
        match role {
            Value::Array(parts) if matches!(parts.first(), Some(Value::BulkString(r)) if r == b"master") => {
                Ok(wire)
            }
            _ => bail!(
                "the node the sentinels name for service '{}' ({addr}) is not a primary (a \
                 failover under way?)",
                self.name
            ),
        }
    }

    /// Ask every sentinel at once; the first that names a primary wins.
    fn primary(&self, deadline: Instant) -> Result<(String, u16)> {
        let (tx, rx) = mpsc::channel();
        let name = Arc::new(self.name.clone());
        for (i, (host, port)) in self.sentinels.iter().enumerate() {
            let (tx, name, session) = (tx.clone(), Arc::clone(&name), self.sentinel.clone());
            let addr = Addr::Tcp(host.clone(), *port);
            let spawned = std::thread::Builder::new()
                .name("sentinel".into())
                .stack_size(256 * 1024)
                .spawn(move || {
                    let _ = tx.send((i, ask(&addr, &session, &name, deadline)));
                });
            if let Err(e) = spawned {
                bail!("cannot start a thread to ask the sentinels: {e}");
            }
        }
        drop(tx);
        let mut errors: Vec<(usize, Result<Named, WireError>)> = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok((_, Ok(Named::Primary(host, port)))) => return Ok((host, port)),
                Ok(answer) => errors.push(answer),
                Err(mpsc::RecvTimeoutError::Timeout) => bail!(
                    "no sentinel named a primary for service '{}' in time{}",
                    self.name,
                    self.list(&errors)
                ),
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
        if errors.iter().all(|(_, a)| matches!(a, Ok(Named::Unknown))) {
            bail!(
                "the sentinels know no working primary for service '{}' (is the name right? \
                 is a failover under way?)",
                self.name
            );
        }
        bail!(
            "no sentinel named a working primary for service '{}'{}",
            self.name,
            self.list(&errors)
        )
    }

    /// ` (host:port: what went wrong; ...)` for the sentinels that failed.
    fn list(&self, errors: &[(usize, Result<Named, WireError>)]) -> String {
        if errors.is_empty() {
            return String::new();
        }
        let parts: Vec<String> = errors
            .iter()
            .map(|(i, a)| {
                let (host, port) = &self.sentinels[*i];
                let text = match a {
                    Ok(_) => "knows no working primary of that name".to_string(),
                    Err(WireError::Server(t))
                        if t.contains("unknown command") || t.contains("Unknown sentinel") =>
                    {
                        "is not a sentinel (a plain Redis server?)".into()
                    }
                    Err(e) => explain(e).to_lowercase(),
                };
                format!("{host}:{port}: {text}")
            })
            .collect();
        format!(" ({})", parts.join("; "))
    }
}

/// Ask one sentinel which primary it names for `name`.
fn ask(addr: &Addr, session: &Session, name: &str, deadline: Instant) -> Result<Named, WireError> {
    let mut wire = Wire::connect(addr, session, deadline)?;
    let reply = wire
        .call(
            &[b"SENTINEL", b"GET-MASTER-ADDR-BY-NAME", name.as_bytes()],
            deadline,
        )?
        .ok()?;
    match reply {
        Value::Nil => Ok(Named::Unknown),
        Value::Array(parts) => match parts.as_slice() {
            [Value::BulkString(host), Value::BulkString(port)] => {
                let host = String::from_utf8_lossy(host).into_owned();
                let port = std::str::from_utf8(port).ok().and_then(|p| p.parse().ok());
                match port {
                    Some(port) if !host.is_empty() => Ok(Named::Primary(host, port)),
                    _ => Err(WireError::Bad(crate::resp::Bad::Protocol(
                        "a primary address that is not host and port",
                    ))),
                }
            }
            _ => Err(WireError::Bad(crate::resp::Bad::Protocol(
                "a primary address that is not host and port",
            ))),
        },
        _ => Err(WireError::Bad(crate::resp::Bad::Protocol(
            "a primary address that is not host and port",
        ))),
    }
}
