//! Lock loss noticed in milliseconds, not at the next renewal.
//!
//! It exists because a lock can vanish between two renewals (a `DEL`, `FLUSHALL`, eviction, another
//! client's `SET`), and another host may take the free lock at once: renewing every TTL/3 would
//! leave the two jobs side by side for up to that long. While the command runs, a thread per master
//! asks Redis to tell it when the lock key changes, with what Redis 6+ (and Valkey) offers every
//! client without server configuration: client-side-caching invalidations. One connection
//! subscribes to `__redis__:invalidate`; a second turns on `CLIENT TRACKING ... REDIRECT <first>
//! BCAST PREFIX <lock key>`, so every change to the key (ours included: a renewal's `PEXPIRE`)
//! sends a message. On a message the thread reads the key on its own connection: still our value,
//! nothing happened; anything else, or a watch connection that broke (a failover or a restart may
//! have lost the key: either of the two, the tracking one is looked at every [`TICK`]), asks the
//! watchdog for a renewal now ([`Listener::changed`]). Only the renewal
//! decides: "not ours" is the lost lock (122), as at any renewal, and with several masters a loss
//! on a minority is mended by the renewal, not counted.
//!
//! Where the server offers none of it (Redis before 6, a proxy that blocks the commands, an ACL
//! without them), the lock is watched by renewals alone, and `-v` says so; the run never fails
//! for it. The watch starts 20 ms after the command, so it costs no round trip before the
//! command, and a run shorter than that no thread at all.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::Value;

use crate::clock::Instant;
use crate::log::{Level, Log};
use crate::store::resp::Reply;
use crate::store::topology::Redis;
use crate::store::url::{explain, Node};
use crate::store::wire::{Wire, WireError};

pub mod shared;

/// The channel invalidation messages are published on (RESP2, with `REDIRECT`).
const CHANNEL: &[u8] = b"__redis__:invalidate";

/// How often a waiting watch thread looks whether it should stop.
const TICK: Duration = Duration::from_millis(200);

/// The watch starts this long after the command: most cron jobs' `true`-sized runs end before,
/// and pay for no thread and no connection.
const SETTLE: Duration = Duration::from_millis(20);

/// The watch threads; they end when this is dropped (within [`TICK`]).
pub struct Tracking {
    stop: Arc<AtomicBool>,
}

impl Drop for Tracking {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// Who hears what the watch finds: the lock's validity view, given by the watchdog. A trait, so
/// that this module imports nothing above the store.
pub trait Listener: Send + Sync {
    /// The key changed or the watch broke: renew now (only the renewal decides whether the lock
    /// is still ours).
    fn changed(&self);
    /// The lock is known lost: the watch can stop.
    fn lost(&self) -> bool;
    /// Someone else renewed the lock with a renewal sent at `sent` (on `CLOCK_BOOTTIME`), and it
    /// was confirmed: the run's replica, heard on its channel. A watch of the run's own never
    /// says so.
    fn renewed(&self, _sent: crate::clock::Instant) {}
}

/// A watch a run starts once its command has run a little: its own ([`WatchPlan`]) or its
/// replica's (`handover::ReplicaWatch`, which hears it on the run's channel).
pub trait Watch: Send {
    /// Start it; what it returns ends it when dropped.
    fn start(self: Box<Self>, listener: Arc<dyn Listener>) -> Box<dyn Watching>;
}

/// A watch that runs: ended when dropped; looked at on each of the main loop's wake-ups (a
/// watch without a thread of its own reads what came then).
pub trait Watching: Send {
    fn look(&mut self) {}
}

impl Watching for Tracking {}

impl Watch for WatchPlan {
    fn start(self: Box<Self>, listener: Arc<dyn Listener>) -> Box<dyn Watching> {
        Box::new(start(
            &self.masters,
            &self.key,
            &self.value,
            listener,
            &self.log,
        ))
    }
}

/// A watch to start once the command has run for [`SETTLE`] (see [`crate::watchdog`], which
/// starts it): most cron jobs' `true`-sized runs end before, and pay for no thread.
pub struct WatchPlan {
    pub masters: Vec<Redis>,
    pub key: String,
    pub value: String,
    pub log: Log,
}

impl WatchPlan {
    /// When the watch should start, for a command started at `started`.
    pub fn due(started: Instant) -> Instant {
        started + SETTLE
    }
}

/// Start watching `key` (holding `value`) on every master.
fn start(
    masters: &[Redis],
    key: &str,
    value: &str,
    listener: Arc<dyn Listener>,
    log: &Log,
) -> Tracking {
    let stop = Arc::new(AtomicBool::new(false));
    for redis in masters {
        let w = Watcher {
            redis: redis.clone(),
            key: key.to_string(),
            value: value.to_string(),
            listener: Arc::clone(&listener),
            log: log.clone(),
            stop: Arc::clone(&stop),
        };
        let spawned = std::thread::Builder::new()
            .name("tracking".into())
            .stack_size(256 * 1024)
            .spawn(move || w.run());
        if let Err(e) = spawned {
            log.event(
                Level::Debug,
                "tracking_off",
                &format!("the lock is watched by renewals alone: cannot start a thread ({e})"),
                &[],
            );
        }
    }
    Tracking { stop }
}

struct Watcher {
    redis: Redis,
    key: String,
    value: String,
    listener: Arc<dyn Listener>,
    log: Log,
    stop: Arc<AtomicBool>,
}

/// Why a watch ended.
enum End {
    /// Told to stop.
    Stopped,
    /// The server refused tracking for good: renewals alone.
    Refused(String),
    /// The connection failed: the lock may have gone with it.
    Broken(String),
}

impl Watcher {
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst) || self.listener.lost()
    }

    fn run(self) {
        let mut backoff = Duration::from_millis(50);
        let mut told = false;
        while !self.stopped() {
            match self.watch_once(&mut told) {
                End::Stopped => return,
                End::Refused(why) => {
                    self.log.event(
                        Level::Info,
                        "tracking_off",
                        &format!(
                            "the lock is watched by renewals alone: the server refused tracking \
                             ({why})"
                        ),
                        &[],
                    );
                    return;
                }
                End::Broken(why) => {
                    if self.stopped() {
                        return;
                    }
                    // A failover or a restart may have lost the key with the connection.
                    self.log.event(
                        Level::Info,
                        "tracking_broken",
                        &format!("the connection watching the lock broke ({why}); renewing now"),
                        &[],
                    );
                    self.listener.changed();
                }
            }
            let until = Instant::now() + backoff;
            while Instant::now() < until && !self.stopped() {
                std::thread::sleep(Duration::from_millis(10));
            }
            backoff = (backoff * 2).min(Duration::from_secs(1));
        }
    }

    /// Set up the two connections and watch until told to stop or a connection fails.
    fn watch_once(&self, told: &mut bool) -> End {
        match self.set_up(told) {
            Ok(Pair { sub, reader, .. }) => self.listen(sub, reader),
            Err(end) => end,
        }
    }

    /// The subscribed connection and the tracking one, with the watch on and the key checked
    /// once (whatever happened before the watch was on).
    fn set_up(&self, told: &mut bool) -> Result<Pair, End> {
        let Pair {
            sub,
            mut reader,
            at: addr,
        } = pair(&self.redis, &self.key, Some(&self.key))?;
        if !*told {
            *told = true;
            self.log.event(
                Level::Debug,
                "tracking_on",
                &format!(
                    "watching the lock for changes on {addr} (client-side-caching invalidations)"
                ),
                &[],
            );
        }
        // Whatever happened before the watch was on.
        if let Err(e) = self.check(&mut reader) {
            return Err(End::Broken(explain(&e)));
        }
        Ok(Pair {
            sub,
            reader,
            at: addr,
        })
    }

    /// Wait for invalidations (and look at the tracking connection) until told to stop or a
    /// connection fails.
    fn listen(&self, mut sub: Wire, mut reader: Wire) -> End {
        loop {
            if self.stopped() {
                return End::Stopped;
            }
            // The tracking connection speaks only when spoken to: anything from it (its
            // closing) means tracking is off, and invalidations would stop without a word.
            // Over TLS the bytes may be the protocol's own: a PING tells.
            if reader.readable() {
                let pong = reader.call(&[b"PING"], Instant::now() + self.redis.connect_timeout);
                match pong {
                    Ok(Reply::Value(Value::SimpleString(s))) if s == "PONG" => {}
                    Ok(_) => {
                        return End::Broken("the tracking connection spoke out of turn".into())
                    }
                    Err(e) => return End::Broken(explain(&e)),
                }
            }
            match sub.read(Instant::now() + TICK) {
                Err(WireError::Timeout) => continue,
                Err(e) => return End::Broken(explain(&e)),
                Ok(Reply::Error(e)) => return End::Broken(e),
                Ok(Reply::Value(msg)) => {
                    if self.concerns_us(&msg) {
                        if let Err(e) = self.check(&mut reader) {
                            return End::Broken(explain(&e));
                        }
                    }
                }
            }
        }
    }

    /// An invalidation of our key, or of every key (a flush).
    fn concerns_us(&self, msg: &Value) -> bool {
        let Value::Array(parts) = msg else {
            return false;
        };
        match parts.as_slice() {
            [Value::BulkString(kind), _, keys] if kind == b"message" => match keys {
                Value::Nil => true,
                Value::Array(keys) => keys
                    .iter()
                    .any(|k| matches!(k, Value::BulkString(k) if k == self.key.as_bytes())),
                _ => true,
            },
            _ => false,
        }
    }

    /// Read the key: our value, nothing to do; anything else, renew now.
    fn check(&self, reader: &mut Wire) -> Result<(), WireError> {
        let deadline = Instant::now() + self.redis.connect_timeout;
        let ours = match reader
            .call(&[b"GET", self.key.as_bytes()], deadline)?
            .ok()?
        {
            Value::BulkString(v) => v == self.value.as_bytes(),
            _ => false,
        };
        if !ours && !self.stopped() {
            self.listener.changed();
        }
        Ok(())
    }
}

/// A subscribed connection and a tracking one redirecting to it, on the node of `key`: with
/// `prefix`, every change under it is told (`BCAST`); without, a key is watched once the
/// tracking connection has read it. The node's address, for a line.
/// The two connections of a watch on one node.
struct Pair {
    /// Subscribed: it receives the invalidations.
    sub: Wire,
    /// Tracking: it reads keys, and the server redirects their invalidations to `sub`.
    reader: Wire,
    /// The node's address, for a line.
    at: String,
}

fn pair(redis: &Redis, key: &str, prefix: Option<&str>) -> Result<Pair, End> {
    let budget = redis.connect_timeout;
    let deadline = Instant::now() + budget;
    let Node { addr, session } = match redis.side(key, deadline) {
        Ok(node) => node,
        Err(e) => return Err(End::Broken(format!("{e:#}"))),
    };
    let connect = || Wire::connect(&addr, &session, deadline);
    let (mut sub, mut reader) = match (connect(), connect()) {
        (Ok(s), Ok(r)) => (s, r),
        (Err(e), _) | (_, Err(e)) => return Err(End::Broken(explain(&e))),
    };
    let id = match sub.call(&[b"CLIENT", b"ID"], deadline).and_then(Reply::ok) {
        Ok(Value::Int(id)) => id.to_string(),
        Ok(_) => return Err(End::Refused("CLIENT ID answered oddly".into())),
        Err(e) => return Err(refused_or_broken(e)),
    };
    match sub.call(&[b"SUBSCRIBE", CHANNEL], deadline) {
        Ok(Reply::Value(Value::Array(_))) => {}
        Ok(Reply::Value(_)) => return Err(End::Refused("SUBSCRIBE answered oddly".into())),
        Ok(Reply::Error(e)) => return Err(End::Refused(e)),
        Err(e) => return Err(End::Broken(explain(&e))),
    }
    let mut tracking: Vec<&[u8]> = vec![b"CLIENT", b"TRACKING", b"ON", b"REDIRECT", id.as_bytes()];
    if let Some(prefix) = prefix {
        tracking.extend([&b"BCAST"[..], b"PREFIX", prefix.as_bytes()]);
    }
    match reader.call(&tracking, deadline).and_then(Reply::ok) {
        Ok(_) => {}
        // Refused, unless the subscribed connection went away between SUBSCRIBE and here
        // (killed, a restart), so there was nothing to redirect to: a broken watch. The
        // subscribed connection itself says which (a PING is allowed while subscribed).
        Err(WireError::Server(e)) => {
            return Err(match sub.call(&[b"PING"], deadline) {
                Ok(Reply::Value(_)) => End::Refused(e),
                _ => End::Broken(e),
            })
        }
        Err(e) => return Err(End::Broken(explain(&e))),
    }
    Ok(Pair {
        sub,
        reader,
        at: addr.to_string(),
    })
}

/// A refusal that will not change (an ACL, an unknown command): renewals alone. Anything else:
/// the connection failed.
fn refused_or_broken(e: WireError) -> End {
    match e {
        WireError::Server(text) => End::Refused(text),
        e => End::Broken(explain(&e)),
    }
}
