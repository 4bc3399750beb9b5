//! Finding the primary through Redis Sentinel: `redis+sentinel://` and `rediss+sentinel://`.
//!
//! Every sentinel is asked at once (`SENTINEL MASTER`), each from a short-lived thread, every
//! exchange bounded by the time we have ([`crate::store::wire`]). Once a majority has answered
//! and the others had [`STRAGGLERS`] more, the primary named with the highest configuration epoch
//! wins (after a failover, the new configuration's epoch is higher); that node must say with
//! `ROLE` that it is a primary. A hung sentinel costs one thread until the deadline, and the
//! lookup at most [`STRAGGLERS`].
//!
//! The primary is the node the sentinels name *now*: a connection to it is used again only after
//! the sentinels have named it once more ([`Service::still_primary`]), so a holder moves to the
//! new primary at its next renewal after a failover, and never renews on a demoted node.

use std::sync::{mpsc, Arc};
use std::time::Duration;

use anyhow::{anyhow, bail, Result};
use redis::Value;

use crate::clock::Instant;
use crate::store::durable::{Replicas, Shortfall};
use crate::store::failure::Failure;
use crate::store::resp::{Bad, Reply};
use crate::store::tls::TlsOptions;
use crate::store::url::{explain, HostsUrl, Node};
use crate::store::wire::{Addr, Session, Wire, WireError};

/// A connection that took longer than this to make is checked against the sentinels again.
const RECHECK_AFTER: Duration = Duration::from_millis(200);

/// Sentinel's default port.
const PORT: u16 = 26379;

/// How long the sentinels that did not answer with a majority are waited for (see
/// [`Service::primary`]): a sentinel on the network answers in well under that; a frozen one or a
/// host that is down costs a lookup that much.
const STRAGGLERS: Duration = Duration::from_millis(50);

/// A connection to the primary the sentinels named, and its address.
pub struct Primary {
    pub wire: Wire,
    pub addr: Addr,
}

/// A service (a primary and its replicas) watched by sentinels.
pub struct Service {
    name: String,
    sentinels: Vec<Addr>,
    /// For the data nodes (the URL's userinfo, TLS, db).
    data: Session,
    /// For the sentinels (`?sentinel_username=...&sentinel_password=...`, TLS).
    sentinel: Session,
    /// The replicas the primary reported attached, which a claim waits for.
    replicas: Replicas,
}

/// What one sentinel said.
enum Named {
    /// The primary it names, and how current that is: after a failover the new configuration has
    /// a higher epoch, and the highest one wins (Sentinel's own rule).
    Primary { addr: Addr, current: Current },
    /// It knows no primary of that name.
    Unknown,
}

/// How current a sentinel's answer is, in the order answers are preferred: the configuration
/// epoch first; on a tie, a sentinel not leading a failover of the primary. The one that leads it
/// gives its configuration the new epoch at the start but names the old primary until the
/// failover ends, while the others already name the promoted replica with that epoch (measured:
/// for about a second in a planned failover).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Current {
    epoch: u64,
    settled: bool,
}

impl Service {
    /// Parse `redis+sentinel://[user][:password@]host[:port][,host[:port]...]/SERVICE[/db]`.
    pub fn parse(url: &str, source: &str, shown: &str, tls: &TlsOptions) -> Result<Service> {
        let invalid = |problem: &str| {
            anyhow!(
                "invalid {source}{}: {problem}",
                crate::store::url::scheme_shown(url)
            )
        };
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
            replicas: Replicas::default(),
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

    /// Connect to the service's primary by `deadline`, lookup included: the node the sentinels
    /// name, which must say with `ROLE` that it is a primary. Returns it with its address.
    pub fn connect(&self, deadline: Instant) -> Result<Primary, Failure> {
        let asked = Instant::now();
        let addr = self.primary(deadline)?;
        let wire = self.connect_to(&addr, deadline)?;
        // The replicas the sentinels know for it, beside those it lists: one promoted before this
        // process first met the primary has left its list, not theirs.
        self.replicas
            .known_to_sentinels(&addr, &self.sentinels_replicas(&addr, deadline));
        // A node that took long to answer (frozen, then woken) may have been replaced meanwhile:
        // the primary is the node the sentinels name now, not the one they named before.
        if asked.elapsed() > RECHECK_AFTER && self.primary(deadline)? != addr {
            return Err(Failure::unreachable(format!(
                "the primary of service '{}' changed while connecting to it (a failover under way)",
                self.name
            )));
        }
        Ok(Primary { wire, addr })
    }

    /// Is `addr` still the primary the sentinels name? Asked before a connection to it is used
    /// again, so that no lock is ever renewed on a node the sentinels no longer name.
    pub fn still_primary(&self, addr: &Addr, deadline: Instant) -> Result<bool> {
        Ok(self.primary(deadline)? == *addr)
    }

    /// Wait (by `deadline`) until the writes made on `wire`, a connection to the primary at
    /// `addr`, are held by the replicas a failover could promote ([`crate::store::durable`]).
    /// `at_least`: `--min-replicas`.
    pub fn durable(
        &self,
        wire: &mut Wire,
        addr: &Addr,
        at_least: u32,
        deadline: Instant,
    ) -> Result<(), Failure> {
        self.replicas
            .confirm(wire, addr, &self.data, at_least, deadline)
            .map_err(|shortfall| match shortfall {
                Shortfall::Call(e) => Failure::Call(e),
                Shortfall::Behind { acked, wanted } if at_least > 0 => {
                    Failure::Replicas { acked, wanted }
                }
                other => Failure::NotDurable(format!(
                    "the primary of service '{}' ({addr}): {other}",
                    self.name
                )),
            })
    }

    /// The primary the sentinels name now, and how to open a session on it (for a connection of
    /// its own, see [`crate::store::tracking`]).
    pub fn side(&self, deadline: Instant) -> Result<Node> {
        Ok(Node {
            addr: self.primary(deadline)?,
            session: self.data.clone(),
        })
    }

    /// Connect to `addr` and check that it is a primary.
    fn connect_to(&self, addr: &Addr, deadline: Instant) -> Result<Wire, Failure> {
        let named = |e: &WireError| {
            Failure::connect(
                e,
                format!(
                    "the primary of service '{}' ({addr}): {}",
                    self.name,
                    explain(e)
                ),
            )
        };
        let mut wire = Wire::connect(addr, &self.data, deadline).map_err(|e| named(&e))?;
        let role = wire
            .call(&[b"ROLE"], deadline)
            .and_then(|r| r.ok())
            .map_err(|e| named(&e))?;
        match &role {
            Value::Array(parts) if matches!(parts.first(), Some(Value::BulkString(r)) if r == b"master") =>
            {
                self.replicas.reported(addr, &role);
                Ok(wire)
            }
            _ => Err(Failure::unreachable(format!(
                "the node the sentinels name for service '{}' ({addr}) is not a primary (a \
                 failover under way?)",
                self.name
            ))),
        }
    }

    /// Ask every sentinel at once; once a majority of them answered and the others had
    /// [`STRAGGLERS`] more to answer (or all that can, by the deadline), the primary named with
    /// the highest configuration epoch wins. The others are waited for a moment since in a
    /// failover the sentinel that led it names the new primary a second or two before the others
    /// learn it: a majority of those would send a lock's release or renewal to the old primary.
    fn primary(&self, deadline: Instant) -> Result<Addr> {
        let (tx, rx) = mpsc::channel();
        let name = Arc::new(self.name.clone());
        for (i, addr) in self.sentinels.iter().enumerate() {
            let (tx, name, session) = (tx.clone(), Arc::clone(&name), self.sentinel.clone());
            let addr = addr.clone();
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
        let majority = self.sentinels.len() / 2 + 1;
        let mut best: Option<(Addr, Current)> = None;
        let mut answered = 0;
        let mut errors: Vec<(usize, Result<Named, WireError>)> = Vec::new();
        let mut until = deadline;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok((_, Ok(Named::Primary { addr, current }))) => {
                    answered += 1;
                    if best.as_ref().is_none_or(|(_, c)| current > *c) {
                        best = Some((addr, current));
                    }
                }
                Ok(answer) => {
                    if answer.1.is_ok() {
                        answered += 1;
                    }
                    errors.push(answer);
                }
                Err(mpsc::RecvTimeoutError::Timeout) if best.is_some() => break,
                Err(mpsc::RecvTimeoutError::Timeout) => bail!(
                    "no sentinel named a primary for service '{}' in time{}",
                    self.name,
                    self.list(&errors)
                ),
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
            if answered >= majority && best.is_some() && until == deadline {
                until = deadline.min(Instant::now() + STRAGGLERS);
            }
        }
        if let Some((addr, _)) = best {
            return Ok(addr);
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

    /// The replicas (not believed down) that the sentinels naming `primary` know for it, asked of
    /// every sentinel at once for at most a quarter second (within `deadline`); none when none
    /// answers.
    fn sentinels_replicas(&self, primary: &Addr, deadline: Instant) -> Vec<Addr> {
        let by = deadline.min(Instant::now() + Duration::from_millis(250));
        let (tx, rx) = mpsc::channel();
        let name = Arc::new(self.name.clone());
        for addr in &self.sentinels {
            let (tx, name, session) = (tx.clone(), Arc::clone(&name), self.sentinel.clone());
            let addr = addr.clone();
            let primary = primary.clone();
            let _ = std::thread::Builder::new()
                .name("sentinel".into())
                .stack_size(256 * 1024)
                .spawn(move || {
                    let _ = tx.send(replicas_of(&addr, &session, &name, &primary, by));
                });
        }
        drop(tx);
        let mut all: Vec<Addr> = Vec::new();
        while let Ok(found) = rx.recv_timeout(by.saturating_duration_since(Instant::now())) {
            for r in found.unwrap_or_default() {
                if !all.contains(&r) {
                    all.push(r);
                }
            }
        }
        all
    }

    /// ` (host:port: what went wrong; ...)` for the sentinels that failed.
    fn list(&self, errors: &[(usize, Result<Named, WireError>)]) -> String {
        if errors.is_empty() {
            return String::new();
        }
        let parts: Vec<String> = errors
            .iter()
            .map(|(i, a)| {
                // As the URL gave it (an IPv6 address without brackets).
                let at = match &self.sentinels[*i] {
                    Addr::Tcp { host, port } => format!("{host}:{port}"),
                    other => other.to_string(),
                };
                let text = match a {
                    Ok(_) => "knows no working primary of that name".to_string(),
                    Err(WireError::Server(t))
                        if t.contains("unknown command") || t.contains("Unknown sentinel") =>
                    {
                        "is not a sentinel (a plain Redis server?)".into()
                    }
                    Err(e) => explain(e).to_lowercase(),
                };
                format!("{at}: {text}")
            })
            .collect();
        format!(" ({})", parts.join("; "))
    }
}

/// Ask one sentinel which primary it names for `name` (`SENTINEL MASTER`: its address and the
/// configuration epoch it comes from).
fn ask(addr: &Addr, session: &Session, name: &str, deadline: Instant) -> Result<Named, WireError> {
    let mut wire = Wire::connect(addr, session, deadline)?;
    let reply = match wire.call(&[b"SENTINEL", b"MASTER", name.as_bytes()], deadline)? {
        Reply::Error(e) if e.contains("No such master") => return Ok(Named::Unknown),
        r => r.ok()?,
    };
    let bad = || WireError::Bad(Bad::Protocol("a SENTINEL MASTER reply of the wrong shape"));
    let fields = fields_of(reply).ok_or_else(bad)?;
    let field = |k: &str| fields.get(k);
    let (Some(ip), Some(port)) = (field("ip"), field("port").and_then(|p| p.parse().ok())) else {
        return Err(bad());
    };
    // A primary this sentinel believes down is no primary to use (a failover is coming).
    if field("flags").is_some_and(|f| f.split(',').any(|f| f == "s_down" || f == "o_down")) {
        return Ok(Named::Unknown);
    }
    let epoch = field("config-epoch")
        .and_then(|e| e.parse().ok())
        .unwrap_or(0);
    let settled =
        !field("flags").is_some_and(|f| f.split(',').any(|f| f == "failover_in_progress"));
    Ok(Named::Primary {
        addr: Addr::tcp(ip.to_string(), port),
        current: Current { epoch, settled },
    })
}

/// A sentinel's flat field list (`SENTINEL MASTER`, or one replica of `SENTINEL REPLICAS`), by
/// name (the first of a name repeated).
struct Fields {
    by_name: std::collections::BTreeMap<String, String>,
}

impl Fields {
    fn get(&self, name: &str) -> Option<&str> {
        self.by_name.get(name).map(String::as_str)
    }
}

/// A reply's [`Fields`]; `None` for another shape.
fn fields_of(reply: Value) -> Option<Fields> {
    let pairs: Vec<(String, String)> = match reply {
        Value::Array(flat) => flat
            .chunks(2)
            .filter_map(|kv| match kv {
                [Value::BulkString(k), Value::BulkString(v)] => Some((
                    String::from_utf8_lossy(k).into_owned(),
                    String::from_utf8_lossy(v).into_owned(),
                )),
                _ => None,
            })
            .collect(),
        Value::Map(pairs) => pairs
            .iter()
            .filter_map(|kv| match kv {
                (Value::BulkString(k), Value::BulkString(v)) => Some((
                    String::from_utf8_lossy(k).into_owned(),
                    String::from_utf8_lossy(v).into_owned(),
                )),
                _ => None,
            })
            .collect(),
        _ => return None,
    };
    let mut by_name = std::collections::BTreeMap::new();
    for (name, value) in pairs {
        by_name.entry(name).or_insert(value);
    }
    Some(Fields { by_name })
}

/// The replicas one sentinel knows for `name`, not believed down, if it names `primary` as its
/// primary (`SENTINEL MASTER` and `SENTINEL REPLICAS`, as one pipeline).
fn replicas_of(
    addr: &Addr,
    session: &Session,
    name: &str,
    primary: &Addr,
    deadline: Instant,
) -> Result<Vec<Addr>, WireError> {
    let mut wire = Wire::connect(addr, session, deadline)?;
    let mut replies = wire
        .call_many(
            &[
                &[b"SENTINEL", b"MASTER", name.as_bytes()],
                &[b"SENTINEL", b"REPLICAS", name.as_bytes()],
            ],
            deadline,
        )?
        .into_iter();
    let (Some(master), Some(replicas)) = (replies.next(), replies.next()) else {
        return Ok(Vec::new());
    };
    let address = |fields: &Fields| {
        let field = |k: &str| fields.get(k);
        let ip = field("ip")?;
        let port = field("port")?.parse().ok()?;
        // (One flagged `disconnected` still counts: the promotion kills the sentinels' own links
        // to the promoted replica. One that is gone is forgotten when its connection is refused.)
        let down =
            field("flags").is_some_and(|f| f.split(',').any(|f| matches!(f, "s_down" | "o_down")));
        (!down).then(|| Addr::tcp(ip.to_string(), port))
    };
    let names = fields_of(master.ok()?).and_then(|f| address(&f));
    if names.as_ref() != Some(primary) {
        return Ok(Vec::new());
    }
    let Value::Array(list) = replicas.ok()? else {
        return Ok(Vec::new());
    };
    Ok(list
        .into_iter()
        .take(64)
        .filter_map(|r| fields_of(r).and_then(|f| address(&f)))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::Current;

    #[test]
    fn a_higher_epoch_wins_and_on_a_tie_a_sentinel_not_leading_a_failover() {
        let current = |epoch, settled| Current { epoch, settled };
        assert!(current(2, false) > current(1, true));
        // The leader of the failover to epoch 1 still names the old primary.
        assert!(current(1, true) > current(1, false));
    }
}
