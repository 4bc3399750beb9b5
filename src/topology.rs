//! One way to talk to Redis, whatever runs it.
//!
//! The URL resolves once into a [`Redis`] value: one server (`redis://`, `rediss://`,
//! `redis+unix://`), a primary found through Sentinel (`redis+sentinel://`), or a Redis Cluster
//! (`redis+cluster://`). The lock code then asks a [`Link`] one thing: run this call for KEY within
//! this much time. The link connects when it has no connection, asking the sentinels again or
//! letting the cluster client (redis-rs) find the KEY's slot owner; a failed call drops the
//! connection, so the next call starts from a fresh lookup. That is how a renewal follows a
//! failover: the watchdog simply retries within the lock's deadline, as for any failed call.
//!
//! With `--min-replicas N`, every write (acquire, renewal) counts only once `WAIT` says N replicas
//! have it, asked on the same connection (on a cluster, on the KEY's slot owner).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Result};
use redis::cluster::ClusterConnection;
use redis::{Connection, ConnectionLike, RedisError, RedisResult};

use crate::clock::Instant;
use crate::cluster::Cluster;
use crate::connect::{first_line, redact_url, Node};
use crate::sentinel::Service;
use crate::tls::TlsOptions;

/// Where the locks live, resolved from the URL. Cheap to clone: the watchdog thread has a copy.
#[derive(Clone)]
pub struct Redis {
    target: Arc<Target>,
    /// The URL with its secrets replaced, safe to print.
    pub shown_url: String,
    pub connect_timeout: Duration,
    /// `--min-replicas`: replicas that must acknowledge each write before it counts.
    pub min_replicas: u32,
}

enum Target {
    Node(Node),
    Sentinel(Service),
    Cluster(Cluster),
}

impl Redis {
    /// Parse the URL, which came from `source` (a flag or variable, for messages). Errors name
    /// the redacted URL, never a password.
    pub fn new(
        url: &str,
        source: &str,
        connect_timeout: Duration,
        tls: &TlsOptions,
        min_replicas: u32,
    ) -> Result<Redis> {
        let shown_url = redact_url(url);
        let scheme = url.split_once("://").map_or("", |(s, _)| s);
        let target = match scheme {
            "redis+sentinel" | "rediss+sentinel" => {
                Target::Sentinel(Service::parse(url, source, &shown_url, tls)?)
            }
            "redis+cluster" | "rediss+cluster" => {
                Target::Cluster(Cluster::parse(url, source, &shown_url, tls)?)
            }
            _ => Target::Node(Node::parse(url, source, tls)?),
        };
        Ok(Redis {
            target: Arc::new(target),
            shown_url,
            connect_timeout,
            min_replicas,
        })
    }

    /// Open a connection within `within`: to the server, to the primary the sentinels name, or to
    /// the cluster (its slot map).
    fn connect(&self, within: Duration) -> Result<Con> {
        let con = match &*self.target {
            Target::Node(node) => node.connect(within).map(Con::Node),
            Target::Sentinel(service) => service.connect(within).map(Con::Node),
            Target::Cluster(cluster) => cluster.connect(within).map(|c| Con::Cluster(Box::new(c))),
        };
        con.map_err(|e| anyhow!("cannot connect to Redis at {}: {e:#}", self.shown_url))
    }
}

/// An open connection of either shape. Both speak redis-rs' `ConnectionLike`, so a script call
/// is written once; a cluster connection routes it by its first key.
enum Con {
    Node(Connection),
    Cluster(Box<ClusterConnection>),
}

impl Con {
    fn set_timeout(&self, d: Duration) -> RedisResult<()> {
        let d = Some(d.max(Duration::from_millis(1)));
        match self {
            Con::Node(c) => {
                c.set_read_timeout(d)?;
                c.set_write_timeout(d)
            }
            Con::Cluster(c) => {
                c.set_read_timeout(d)?;
                c.set_write_timeout(d)
            }
        }
    }

    fn like(&mut self) -> &mut dyn ConnectionLike {
        match self {
            Con::Node(c) => c,
            Con::Cluster(c) => c,
        }
    }
}

/// Why a call failed.
#[derive(Debug)]
pub enum Failure {
    /// No connection could be made: nothing was sent.
    Connect(anyhow::Error),
    /// The call was sent and failed: Redis's error, or no (readable) reply.
    Call(RedisError),
    /// `--min-replicas`: fewer replicas than asked acknowledged the write in time.
    Replicas { acked: u32, wanted: u32 },
}

impl Failure {
    /// Redis may have run the call even though we got no reply we could read.
    pub fn maybe_ran(&self) -> bool {
        match self {
            Failure::Call(e) => {
                e.is_timeout()
                    || e.is_io_error()
                    || e.is_connection_dropped()
                    || matches!(
                        e.kind(),
                        redis::ErrorKind::Parse | redis::ErrorKind::UnexpectedReturnType
                    )
            }
            _ => false,
        }
    }

    /// Worth another try on a new connection: the server or the network, not the request.
    pub fn transient(&self) -> bool {
        match self {
            Failure::Connect(_) | Failure::Replicas { .. } => true,
            Failure::Call(e) => {
                self.maybe_ran()
                    || matches!(
                        e.code(),
                        Some("LOADING" | "BUSY" | "READONLY" | "MASTERDOWN" | "TRYAGAIN")
                    )
                    || e.is_cluster_error()
            }
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Connect(e) => write!(f, "{e:#}"),
            Failure::Call(e) => f.write_str(&first_line(e)),
            Failure::Replicas { acked, wanted } => write!(
                f,
                "only {acked} of the {wanted} replicas asked for (--min-replicas) confirmed it in time"
            ),
        }
    }
}

impl std::error::Error for Failure {}

/// A connection that (re)connects itself: see the module comment.
pub struct Link {
    redis: Redis,
    con: Option<Con>,
}

impl Link {
    /// A link that connects on its first call.
    pub fn new(redis: &Redis) -> Link {
        Link {
            redis: redis.clone(),
            con: None,
        }
    }

    pub fn redis(&self) -> &Redis {
        &self.redis
    }

    /// The connection, made within `within` if there is none, with its timeouts set to what is
    /// left of `within`. The caller puts it back after a successful call.
    fn take(&mut self, within: Duration) -> Result<Con, Failure> {
        let start = Instant::now();
        let con = match self.con.take() {
            Some(c) => c,
            None => self.redis.connect(within).map_err(Failure::Connect)?,
        };
        con.set_timeout(within.saturating_sub(start.elapsed()))
            .map_err(Failure::Call)?;
        Ok(con)
    }

    /// Run `call` within `within`, connecting first if needed (that counts against `within`).
    /// Any failure drops the connection: the next call looks the server up again.
    pub fn call<T>(
        &mut self,
        within: Duration,
        call: impl FnOnce(&mut dyn ConnectionLike) -> RedisResult<T>,
    ) -> Result<T, Failure> {
        let start = Instant::now();
        let mut con = self.take(within)?;
        match call(con.like()) {
            Ok(value) => {
                self.con = Some(con);
                Ok(value)
            }
            Err(e) => match &*self.redis.target {
                Target::Cluster(c) if e.kind() == redis::ErrorKind::ClusterConnectionNotFound => {
                    let left = within.saturating_sub(start.elapsed());
                    Err(Failure::Connect(anyhow!(
                        "cannot use Redis at {}: {}",
                        self.redis.shown_url,
                        c.explain(left)
                    )))
                }
                _ => Err(Failure::Call(e)),
            },
        }
    }

    /// With `--min-replicas N`: wait (within `within`) until N replicas acknowledged every write
    /// made on this connection, on the node that serves `key`. Nothing to do without it.
    pub fn confirm(&mut self, key: &str, within: Duration) -> Result<(), Failure> {
        let wanted = self.redis.min_replicas;
        if wanted == 0 {
            return Ok(());
        }
        let Some(con) = self.con.as_mut() else {
            // The write's connection is gone: its replication cannot be confirmed.
            return Err(Failure::Replicas { acked: 0, wanted });
        };
        // WAIT's own timeout ends before our read timeout, so its count is what we read.
        let wait_ms = (within.as_millis() as u64 * 3 / 4).max(1);
        let mut cmd = redis::cmd("WAIT");
        cmd.arg(wanted).arg(wait_ms);
        let acked = con.set_timeout(within).and_then(|()| match con {
            Con::Node(c) => cmd.query::<i64>(c),
            Con::Cluster(c) => {
                use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
                let route = Route::with_key(key.as_bytes(), SlotAddr::Master);
                let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route));
                c.route_command(&cmd, routing)
                    .and_then(|v| redis::from_redis_value::<i64>(v).map_err(Into::into))
            }
        });
        match acked {
            Ok(n) if n >= i64::from(wanted) => Ok(()),
            Ok(n) => Err(Failure::Replicas {
                acked: n.max(0) as u32,
                wanted,
            }),
            Err(e) => {
                self.con = None;
                Err(Failure::Call(e))
            }
        }
    }

    /// Every key matching `pattern`, with SCAN (never KEYS): on every primary of a cluster.
    pub fn scan(&mut self, pattern: &str, within: Duration) -> Result<Vec<String>, Failure> {
        let mut con = self.take(within)?;
        let found = match &mut con {
            Con::Node(c) => scan_node(&mut |cmd| cmd.query(c), pattern),
            Con::Cluster(c) => Cluster::scan_primaries(c, pattern, scan_node),
        }
        .map_err(Failure::Call)?;
        self.con = Some(con);
        Ok(found)
    }
}

/// SCAN one server to the end; `send` runs a command on it.
fn scan_node(
    send: &mut dyn FnMut(&redis::Cmd) -> RedisResult<redis::Value>,
    pattern: &str,
) -> RedisResult<Vec<String>> {
    let mut found = Vec::new();
    let mut cursor: u64 = 0;
    loop {
        let mut cmd = redis::cmd("SCAN");
        cmd.arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000);
        let (next, batch): (u64, Vec<String>) = redis::from_redis_value(send(&cmd)?)?;
        found.extend(batch);
        cursor = next;
        if cursor == 0 {
            return Ok(found);
        }
    }
}
