//! Finding the primary through Redis Sentinel: `redis+sentinel://` and `rediss+sentinel://`.
//!
//! The lookup itself is redis-rs' Sentinel client (it asks `SENTINEL MASTERS`, skips a primary
//! flagged down, and checks with `ROLE` that the node it names really is a primary). That client
//! has no timeouts of its own, and a frozen sentinel would hold it forever, so each sentinel is
//! asked from a short-lived thread of its own and we take the first good answer within the time
//! we have. A sentinel whose last lookup is still stuck is not asked again until it answers, so
//! a hung sentinel costs one thread, not one per retry.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use anyhow::{anyhow, bail, Result};
use redis::sentinel::{SentinelClientBuilder, SentinelServerType};
use redis::{Connection, ConnectionAddr, ErrorKind, RedisError, TlsCertificates, TlsMode};

use crate::clock::Instant;
use crate::connect::{first_line, HostsUrl, Node};
use crate::tls::TlsOptions;

/// Sentinel's default port.
const PORT: u16 = 26379;

/// A service (a primary and its replicas) watched by sentinels.
pub struct Service {
    name: String,
    sentinels: Vec<(String, u16)>,
    tls: bool,
    certs: Option<TlsCertificates>,
    /// For the data nodes (the URL's userinfo).
    user: Option<String>,
    password: Option<String>,
    db: i64,
    /// For the sentinels (`?sentinel_username=...&sentinel_password=...`).
    sentinel_user: Option<String>,
    sentinel_password: Option<String>,
    /// Per sentinel: a lookup is still running (its thread waits on a hung server).
    busy: Vec<Arc<AtomicBool>>,
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
        let mut service = Service {
            name,
            busy: u.hosts.iter().map(|_| Arc::default()).collect(),
            sentinels: u.hosts,
            tls: u.tls,
            certs: None,
            user: u.user,
            password: u.password,
            db,
            sentinel_user: None,
            sentinel_password: None,
        };
        for (k, v) in u.query {
            match k.as_str() {
                "sentinel_username" => service.sentinel_user = Some(v),
                "sentinel_password" => service.sentinel_password = Some(v),
                _ => {
                    return Err(invalid(&format!(
                        "unknown parameter '{k}' (known: sentinel_username, sentinel_password)"
                    )))
                }
            }
        }
        if u.tls {
            service.certs = Some(tls.certificates()?);
        } else if tls.any() {
            bail!(
                "--tls-ca-cert, --tls-cert and --tls-key are for rediss+sentinel:// URLs, and \
                 {source} is '{shown}'"
            );
        }
        Ok(service)
    }

    /// Connect to the service's primary within `within`, lookup included.
    pub fn connect(&self, within: Duration) -> Result<Connection> {
        let start = Instant::now();
        let primary = self.primary(within)?;
        let node = Node::open(primary.get_connection_info().clone(), None)
            .map_err(|e| anyhow!("{}", first_line(&e)))?;
        node.connect(within.saturating_sub(start.elapsed()))
            .map_err(|e| anyhow!("the primary of service '{}': {e:#}", self.name))
    }

    /// Ask every sentinel at once; the first primary one of them names (and `ROLE` confirms)
    /// wins.
    fn primary(&self, within: Duration) -> Result<redis::Client> {
        let deadline = Instant::now() + within;
        let (tx, rx) = mpsc::channel();
        let mut errors: Vec<(usize, RedisError)> = Vec::new();
        for (i, busy) in self.busy.iter().enumerate() {
            if busy.swap(true, Ordering::SeqCst) {
                continue;
            }
            let builder = match self.builder(i) {
                Ok(b) => b,
                Err(e) => {
                    busy.store(false, Ordering::SeqCst);
                    errors.push((i, e));
                    continue;
                }
            };
            let (tx, done) = (tx.clone(), Arc::clone(busy));
            let spawned = std::thread::Builder::new()
                .name("sentinel".into())
                .stack_size(512 * 1024)
                .spawn(move || {
                    let found = builder.build().and_then(|mut c| c.get_client());
                    done.store(false, Ordering::SeqCst);
                    let _ = tx.send((i, found));
                });
            if let Err(e) = spawned {
                busy.store(false, Ordering::SeqCst);
                bail!("cannot start a thread to ask the sentinels: {e}");
            }
        }
        drop(tx);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok((_, Ok(client))) => return Ok(client),
                Ok((i, Err(e))) => errors.push((i, e)),
                Err(mpsc::RecvTimeoutError::Timeout) => bail!(
                    "no sentinel named a primary for service '{}' within {}{}",
                    self.name,
                    crate::duration::Span(within),
                    self.list(&errors)
                ),
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
        if errors.is_empty() {
            bail!(
                "no sentinel named a primary for service '{}': every sentinel is still busy \
                 with an earlier lookup (hung?)",
                self.name
            );
        }
        if errors
            .iter()
            .all(|(_, e)| e.kind() == ErrorKind::MasterNameNotFoundBySentinel)
        {
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
    fn list(&self, errors: &[(usize, RedisError)]) -> String {
        if errors.is_empty() {
            return String::new();
        }
        let parts: Vec<String> = errors
            .iter()
            .map(|(i, e)| {
                let (host, port) = &self.sentinels[*i];
                let text = match e.kind() {
                    ErrorKind::MasterNameNotFoundBySentinel => {
                        "knows no working primary of that name".to_string()
                    }
                    _ => first_line(e).to_lowercase(),
                };
                format!("{host}:{port}: {text}")
            })
            .collect();
        format!(" ({})", parts.join("; "))
    }

    /// redis-rs' Sentinel client for sentinel `i` alone, with our credentials and TLS.
    fn builder(&self, i: usize) -> redis::RedisResult<SentinelClientBuilder> {
        let (host, port) = self.sentinels[i].clone();
        let addr = if self.tls {
            ConnectionAddr::TcpTls {
                host,
                port,
                insecure: false,
                tls_params: None,
            }
        } else {
            ConnectionAddr::Tcp(host, port)
        };
        let mut b = SentinelClientBuilder::new([addr], &self.name, SentinelServerType::Master)?
            .set_client_to_redis_db(self.db);
        if let Some(u) = &self.user {
            b = b.set_client_to_redis_username(u);
        }
        if let Some(p) = &self.password {
            b = b.set_client_to_redis_password(p);
        }
        if let Some(u) = &self.sentinel_user {
            b = b.set_client_to_sentinel_username(u);
        }
        if let Some(p) = &self.sentinel_password {
            b = b.set_client_to_sentinel_password(p);
        }
        if self.tls {
            b = b
                .set_client_to_redis_tls_mode(TlsMode::Secure)
                .set_client_to_sentinel_tls_mode(TlsMode::Secure);
            if let Some(c) = &self.certs {
                b = b
                    .set_client_to_redis_certificates(c.clone())
                    .set_client_to_sentinel_certificates(c.clone());
            }
        }
        Ok(b)
    }
}
