//! One way to talk to Redis, whatever runs it.
//!
//! The URL resolves once into a [`Redis`] value: one server (`redis://`, `rediss://`,
//! `redis+unix://`), a primary found through Sentinel (`redis+sentinel://`), or a Redis Cluster
//! (`redis+cluster://`). The lock code then asks a [`Link`] one thing: run this call for KEY within
//! this much time, whole reply included ([`crate::store::wire`]). The link connects when it has no
//! connection, asking the sentinels again or reading the cluster's slot map ([`crate::store::cluster`]);
//! a failed call drops the connection, so the next call starts from a fresh lookup. That is how a renewal follows a
//! failover: the watchdog simply retries within the lock's deadline, as for any failed call.
//!
//! A grant or a renewal counts only once it is confirmed ([`Link::confirm`]): on a Sentinel's
//! primary, once the replicas a failover could promote hold it ([`crate::store::durable`]); with
//! `--min-replicas N`, once `WAIT` says N replicas have it, asked on the same connection (on a
//! cluster, on the KEY's slot owner).

use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Result};
use redis::Value;

use crate::clock::Instant;
use crate::store::cluster::{Cluster, ClusterCon};
pub use crate::store::failure::Failure;
use crate::store::origin::{shared, Origin};
use crate::store::resp::{Bad, Reply};
use crate::store::sentinel::{Primary, Service};
use crate::store::tls::TlsOptions;
use crate::store::url::{explain, redact_url, Node};
use crate::store::wire::{Wire, WireError};

/// Where the locks live, resolved from the URL. Cheap to clone: the watchdog thread has a copy.
///
/// It crosses to another process (a crontab job's run, `crate::config::JobRun`) as what it was
/// resolved from ([`Origin`]), and is resolved there again: a TLS configuration and the
/// connections it opens belong to one process.
#[derive(Clone)]
pub struct Redis {
    target: Arc<Topology>,
    origin: Arc<Origin>,
    /// The URL with its secrets replaced, safe to print.
    pub shown_url: String,
    pub connect_timeout: Duration,
    /// `--min-replicas`: replicas that must acknowledge each write before it counts.
    pub min_replicas: u32,
    /// The same for two values resolved from the same URL and options: a replica shares one
    /// set of connections between the jobs whose servers are the same.
    pub fingerprint: u64,
}

impl serde::Serialize for Redis {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.origin.serialize(s)
    }
}

impl<'de> serde::Deserialize<'de> for Redis {
    /// Resolved from its origin, as the command line's URL was (the TLS files read again).
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Redis, D::Error> {
        let o = Origin::deserialize(d)?;
        Redis::new(&o.url, &o.source, o.connect_timeout, &o.tls, o.min_replicas)
            .map_err(|e| serde::de::Error::custom(format!("{e:#}")))
    }
}

enum Topology {
    Node(Node),
    Sentinel(Service),
    Cluster(Cluster),
}

impl Redis {
    /// Whether every key lives on one node (a server, or the primary the Sentinels name), so a
    /// script may touch the keys of several KEYs; not on a Cluster, whose KEYs live in slots of
    /// their own.
    pub fn one_node(&self) -> bool {
        !matches!(*self.target, Topology::Cluster(_))
    }

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
                Topology::Sentinel(Service::parse(url, source, &shown_url, tls)?)
            }
            "redis+cluster" | "rediss+cluster" => {
                Topology::Cluster(Cluster::parse(url, source, &shown_url, tls)?)
            }
            _ => Topology::Node(Node::parse(url, source, tls)?),
        };
        let fingerprint = {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            (url, connect_timeout, min_replicas, format!("{tls:?}")).hash(&mut h);
            h.finish()
        };
        let origin = Origin {
            url: url.to_string(),
            source: source.to_string(),
            connect_timeout,
            tls: tls.clone(),
            min_replicas,
        };
        Ok(Redis {
            target: Arc::new(target),
            origin: shared(origin, fingerprint),
            shown_url,
            connect_timeout,
            min_replicas,
            fingerprint,
        })
    }

    /// Open a connection by `deadline`: to the server, to the primary the sentinels name, or to
    /// the cluster (its slot map). A refusal that asking again cannot mend (a wrong password, an
    /// ACL, a database that does not exist) is [`Failure::Refused`].
    fn connect(&self, deadline: Instant) -> Result<Con, Failure> {
        let within = deadline.saturating_duration_since(Instant::now());
        let before = format!("cannot connect to Redis at {}: ", self.shown_url);
        match &*self.target {
            Topology::Node(node) => node
                .connect(within)
                .map(Con::Node)
                .map_err(|e| Failure::connect(&e, format!("{before}{}", explain(&e)))),
            Topology::Sentinel(service) => service
                .connect(deadline)
                .map(Con::Primary)
                .map_err(|f| f.context(&before)),
            Topology::Cluster(cluster) => cluster
                .connect(deadline)
                .map(|c| Con::Cluster(Box::new(c)))
                .map_err(|f| f.context(&before)),
        }
    }
}

impl Redis {
    /// The node that serves `key` now (the server; the primary the sentinels name; the cluster
    /// node that owns its slot) and how to open a session on it: for a connection of its own that
    /// is not a lock call ([`crate::store::tracking`]).
    /// Whether every key lives on one node named by the URL itself (not a Sentinel's primary,
    /// not a Cluster): a watch of several keys can then share one pair of connections.
    pub fn single_node(&self) -> bool {
        matches!(&*self.target, Topology::Node(_))
    }

    pub fn side(&self, key: &str, deadline: Instant) -> Result<Node> {
        match &*self.target {
            Topology::Node(node) => Ok(node.clone()),
            Topology::Sentinel(service) => service.side(deadline),
            Topology::Cluster(cluster) => cluster.side(key, deadline),
        }
    }
}

/// An open connection of any shape.
enum Con {
    Node(Wire),
    /// The primary the sentinels named.
    Primary(crate::store::sentinel::Primary),
    Cluster(Box<ClusterCon>),
}

impl Con {
    /// Run `args` for `key` by `deadline` (on a cluster, on the node that serves `key`).
    fn call(&mut self, key: &str, args: &[&[u8]], deadline: Instant) -> Result<Reply, WireError> {
        match self {
            Con::Node(w) | Con::Primary(Primary { wire: w, .. }) => w.call(args, deadline),
            Con::Cluster(c) => c.call(key, args, deadline),
        }
    }

    /// Run each call by `deadline`, their replies in order: one pipeline on a node; on a
    /// cluster, one call after another, each on the node that serves its key.
    fn call_many(
        &mut self,
        calls: &[Call<'_>],
        deadline: Instant,
    ) -> Result<Vec<Reply>, WireError> {
        match self {
            Con::Node(w) | Con::Primary(Primary { wire: w, .. }) => {
                let args: Vec<&[&[u8]]> = calls.iter().map(|c| c.args).collect();
                w.call_many(&args, deadline)
            }
            Con::Cluster(c) => calls
                .iter()
                .map(|call| c.call(call.key, call.args, deadline))
                .collect(),
        }
    }
}

/// One command of a pipeline.
pub struct Call<'a> {
    /// The key it is for (on a cluster, it names the node).
    pub key: &'a str,
    /// The command and its arguments.
    pub args: &'a [&'a [u8]],
}

/// A connection that (re)connects itself: see the module comment.
pub struct Link {
    redis: Redis,
    con: Option<Con>,
    /// The connection carries a write that did not count (its confirmation fell short): it is
    /// used as it is, without asking the sentinels again, until [`Link::unpin`], so that the
    /// undo reaches the node that took the write, not the one the sentinels name a moment later.
    pinned: bool,
}

impl Link {
    /// A link that connects on its first call.
    pub fn new(redis: &Redis) -> Link {
        Link {
            redis: redis.clone(),
            con: None,
            pinned: false,
        }
    }

    pub fn redis(&self) -> &Redis {
        &self.redis
    }

    /// Run `args` for `key` within `within`, connecting first if needed (that counts against
    /// `within`), the whole reply included. A refusal by the server is an error; any failure but
    /// `NOSCRIPT` drops the connection: the next call looks the server up again.
    pub fn call(&mut self, within: Duration, key: &str, args: &[&[u8]]) -> Result<Value, Failure> {
        let deadline = Instant::now() + within;
        let reused = self.con.is_some();
        let mut con = self.reuse_or_connect(deadline)?;
        let mut reply = con.call(key, args, deadline);
        if reused && reply == Err(WireError::Unasked) {
            // The kept connection held a frame nobody asked for: dropped unread, and the call
            // (never sent) goes on a fresh connection.
            drop(con);
            con = self.redis.connect(deadline)?;
            reply = con.call(key, args, deadline);
        }
        match reply {
            Ok(Reply::Value(v)) => {
                self.con = Some(con);
                Ok(v)
            }
            Ok(Reply::Error(e)) => {
                let e = WireError::Server(e);
                if e.code() == Some("NOSCRIPT") {
                    self.con = Some(con);
                }
                Err(Failure::Call(e))
            }
            Err(e) => Err(Failure::Call(e)),
        }
    }

    /// [`Link::call`] for several commands at once (see [`Con::call_many`]): each one's reply or
    /// refusal, in order. A failure of the connection fails them all, and drops it.
    pub fn call_many(
        &mut self,
        within: Duration,
        calls: &[Call<'_>],
    ) -> Vec<Result<Value, Failure>> {
        let deadline = Instant::now() + within;
        let reused = self.con.is_some();
        let mut con = match self.reuse_or_connect(deadline) {
            Ok(con) => con,
            Err(f) => return calls.iter().map(|_| Err(f.duplicate())).collect(),
        };
        let mut replies = con.call_many(calls, deadline);
        if reused && replies == Err(WireError::Unasked) {
            drop(con);
            con = match self.redis.connect(deadline) {
                Ok(con) => con,
                Err(f) => return calls.iter().map(|_| Err(f.duplicate())).collect(),
            };
            replies = con.call_many(calls, deadline);
        }
        let replies = match replies {
            Ok(replies) => replies,
            Err(e) => {
                return calls
                    .iter()
                    .map(|_| Err(Failure::Call(e.clone())))
                    .collect()
            }
        };
        // As after one call: a refusal other than NOSCRIPT drops the connection (the next call
        // looks the server up again).
        let keep = replies.iter().all(|r| match r {
            Reply::Value(_) => true,
            Reply::Error(e) => WireError::Server(e.clone()).code() == Some("NOSCRIPT"),
        });
        if keep {
            self.con = Some(con);
        }
        replies
            .into_iter()
            .map(|r| match r {
                Reply::Value(v) => Ok(v),
                Reply::Error(e) => Err(Failure::Call(WireError::Server(e))),
            })
            .collect()
    }

    /// Never use the open connection again: its last reply was not of the shape asked for, so
    /// what it says next cannot be matched to a request (see [`Link::read`]).
    pub fn distrust(&mut self) {
        self.con = None;
    }

    /// `read` applied to a reply of [`Link::call`]: a reply it refuses (the wrong type or shape)
    /// drops the connection, so the next request (an undo included) goes on a fresh one.
    pub fn read<T>(
        &mut self,
        reply: Value,
        read: impl FnOnce(&Value) -> Result<T, Failure>,
    ) -> Result<T, Failure> {
        read(&reply).inspect_err(|_| self.distrust())
    }

    /// The open connection if it may still be used, else a new one. Under Sentinel, a connection
    /// is used again only if the sentinels still name its node as the primary: otherwise a lock
    /// could be kept alive on a node they demoted, while it expires on the new primary.
    fn reuse_or_connect(&mut self, deadline: Instant) -> Result<Con, Failure> {
        if self.pinned {
            if let Some(con) = self.con.take() {
                return Ok(con);
            }
        }
        match (self.con.take(), &*self.redis.target) {
            (Some(Con::Primary(primary)), Topology::Sentinel(service)) => {
                match service.still_primary(&primary.addr, deadline) {
                    Ok(true) => Ok(Con::Primary(primary)),
                    Ok(false) => self.redis.connect(deadline),
                    Err(e) => Err(Failure::Connect(anyhow!(
                        "cannot confirm the primary of {}: {e:#}",
                        self.redis.shown_url
                    ))),
                }
            }
            (Some(c), _) => Ok(c),
            (None, _) => self.redis.connect(deadline),
        }
    }

    /// Confirm the writes made on this connection, on the node that serves `key`, within
    /// `within`. On a Sentinel's primary: once the replicas a failover could promote hold them
    /// (and `--min-replicas N` of them), see [`crate::store::durable`]. Elsewhere, with
    /// `--min-replicas N`: once `WAIT` says N replicas have them; nothing to do without it.
    /// Falling short pins the connection ([`Link::unpin`] ends it): the undo goes to the node that
    /// took the write; the next call after it looks the primary up again (a failover may have
    /// left it on a node whose replicas are gone). A connection that failed is dropped.
    pub fn confirm(&mut self, key: &str, within: Duration) -> Result<(), Failure> {
        self.confirm_with(key, within, self.redis.min_replicas)
    }

    /// [`Link::confirm`] an answer that must only outlive a failover (a release's): on a
    /// Sentinel's primary, as a grant is, but without `--min-replicas`; nothing to do elsewhere.
    pub fn confirm_kept(&mut self, key: &str, within: Duration) -> Result<(), Failure> {
        self.confirm_with(key, within, 0)
    }

    /// [`Link::confirm`], with `wanted` replicas (`--min-replicas`).
    fn confirm_with(&mut self, key: &str, within: Duration, wanted: u32) -> Result<(), Failure> {
        let deadline = Instant::now() + within;
        let con = match (self.con.take(), &*self.redis.target) {
            (Some(Con::Primary(mut primary)), Topology::Sentinel(service)) => {
                let confirmed = service.durable(&mut primary.wire, &primary.addr, wanted, deadline);
                if !matches!(confirmed, Err(Failure::Call(_))) {
                    self.con = Some(Con::Primary(primary));
                    self.pinned = confirmed.is_err();
                }
                return confirmed;
            }
            // The write's connection is gone: its replication cannot be confirmed.
            (None, Topology::Sentinel(_)) => {
                return Err(Failure::NotDurable(format!(
                    "the connection to the primary of {} closed before its replicas \
                     confirmed the write",
                    self.redis.shown_url
                )))
            }
            (con, _) if wanted == 0 => {
                self.con = con;
                return Ok(());
            }
            (None, _) => return Err(Failure::Replicas { acked: 0, wanted }),
            (Some(con), _) => con,
        };
        let mut con = con;
        // WAIT's own timeout ends before our deadline, so its count is what we read.
        let wait_ms = (within.as_millis() as u64 * 3 / 4).max(1).to_string();
        let wanted_s = wanted.to_string();
        let acked = con
            .call(
                key,
                &[b"WAIT", wanted_s.as_bytes(), wait_ms.as_bytes()],
                deadline,
            )
            .and_then(Reply::ok);
        match acked {
            Ok(Value::Int(n)) if n >= i64::from(wanted) => {
                self.con = Some(con);
                Ok(())
            }
            Ok(Value::Int(n)) => {
                self.con = Some(con);
                self.pinned = true;
                Err(Failure::Replicas {
                    acked: n.max(0) as u32,
                    wanted,
                })
            }
            Ok(_) => Err(Failure::shape("a WAIT reply that is not a count")),
            Err(e) => Err(Failure::Call(e)),
        }
    }

    /// The undos of a write that did not count are done: the next call looks the primary up again
    /// (a connection that carried such a write is not used again).
    pub fn unpin(&mut self) {
        if std::mem::take(&mut self.pinned) {
            self.con = None;
        }
    }

    /// Every key matching `pattern`, with SCAN (never KEYS): on every primary of a cluster.
    pub fn scan(&mut self, pattern: &str, within: Duration) -> Result<Vec<String>, Failure> {
        let deadline = Instant::now() + within;
        let mut con = self.reuse_or_connect(deadline)?;
        let found = match &mut con {
            Con::Node(w) | Con::Primary(Primary { wire: w, .. }) => {
                scan_node(&mut |args| w.call(args, deadline), pattern)
            }
            Con::Cluster(c) => c
                .primaries()
                .iter()
                .try_fold(Vec::new(), |mut found, addr| {
                    found.extend(scan_node(
                        &mut |args| c.call_at(addr, args, deadline),
                        pattern,
                    )?);
                    Ok(found)
                }),
        }
        .map_err(Failure::Call)?;
        self.con = Some(con);
        Ok(found)
    }
}

/// Runs one command on one server.
type Send<'a> = dyn FnMut(&[&[u8]]) -> Result<Reply, WireError> + 'a;

/// SCAN one server to the end; `send` runs a command on it.
fn scan_node(send: &mut Send, pattern: &str) -> Result<Vec<String>, WireError> {
    let bad = || WireError::Bad(Bad::Protocol("a SCAN reply of the wrong shape"));
    let mut found = Vec::new();
    let mut cursor = "0".to_string();
    loop {
        let reply = send(&[
            b"SCAN",
            cursor.as_bytes(),
            b"MATCH",
            pattern.as_bytes(),
            b"COUNT",
            b"1000",
        ])?
        .ok()?;
        let Value::Array(parts) = reply else {
            return Err(bad());
        };
        let [Value::BulkString(next), Value::Array(batch)] = parts.as_slice() else {
            return Err(bad());
        };
        for key in batch {
            let Value::BulkString(k) = key else {
                return Err(bad());
            };
            found.push(String::from_utf8_lossy(k).into_owned());
        }
        cursor = String::from_utf8_lossy(next).into_owned();
        if cursor == "0" {
            return Ok(found);
        }
    }
}
