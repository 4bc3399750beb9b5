//! One watch for the locks of many runs on one server: a replica's (`--crontab`), so that its
//! runs' locks are watched over one pair of connections instead of a pair per run. The same
//! client-side-caching invalidations as a run's own watch ([`super`]), in the default mode: the
//! tracking connection reads a lock (`GET`) to watch it, each change is told once, and the lock
//! is read again, which both checks it and watches it anew. A lock whose value is no longer the
//! holder's, or a connection that broke, is told to that lock's [`Listener`] (the replica passes
//! it to its run, which renews now: only the renewal decides).
//!
//! A lock is watched from the time it is added with (a run's command's start, plus the
//! watch's settling time), so runs that end before cost nothing. With nothing to watch, the
//! thread sleeps until a lock is added, and after [`IDLE_CLOSE`] closes the connections.

use std::collections::HashMap;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::Duration;

use redis::Value;

use super::{explain, pair, End, Listener, Pair};
use crate::clock::Instant;
use crate::log::{Level, Log};
use crate::store::resp::Reply;
use crate::store::topology::Redis;
use crate::store::wire::{Wire, WireError};

/// How long one wait for an invalidation lasts at most (a lock added meanwhile waits this long).
const STEP: Duration = Duration::from_millis(50);
/// With nothing watched for this long, the connections are closed (kept meanwhile, so that a
/// replica whose runs come every few seconds does not connect again for each).
const IDLE_CLOSE: Duration = Duration::from_secs(60);

/// The handle on a shared watch; its thread ends when this is dropped.
pub struct SharedWatch {
    inbox: Sender<WatchAsk>,
}

enum WatchAsk {
    Add(Watched),
    Remove(u64),
}

struct Watched {
    id: u64,
    key: String,
    value: String,
    /// Watched from then on.
    from: Instant,
    listener: Arc<dyn Listener>,
    /// Read on the tracking connection since it was (re)opened: watched.
    read: bool,
}

impl SharedWatch {
    /// Start watching on `redis` (a single node, [`Redis::single_node`]).
    pub fn start(redis: Redis, log: Log) -> std::io::Result<SharedWatch> {
        let (inbox, asks) = mpsc::channel();
        std::thread::Builder::new()
            .name("watch".into())
            .stack_size(256 * 1024)
            .spawn(move || Sharing::new(redis, log).run(&asks))?;
        Ok(SharedWatch { inbox })
    }

    /// Watch `key`, held with `value`, from `from` on, telling `listener`; `id` names it.
    pub fn add(&self, id: u64, key: &str, value: &str, from: Instant, listener: Arc<dyn Listener>) {
        let _ = self.inbox.send(WatchAsk::Add(Watched {
            id,
            key: key.to_string(),
            value: value.to_string(),
            from,
            listener,
            read: false,
        }));
    }

    /// Stop watching `id`.
    pub fn remove(&self, id: u64) {
        let _ = self.inbox.send(WatchAsk::Remove(id));
    }
}

/// The thread's state.
struct Sharing {
    redis: Redis,
    log: Log,
    watched: HashMap<u64, Watched>,
    conns: Option<(Wire, Wire)>,
    /// No connection before then (after a failure).
    retry_at: Instant,
    backoff: Duration,
    /// The server refused tracking: locks are watched by their runs' renewals alone.
    refused: bool,
}

impl Sharing {
    fn new(redis: Redis, log: Log) -> Sharing {
        Sharing {
            redis,
            log,
            watched: HashMap::new(),
            conns: None,
            retry_at: Instant::now(),
            backoff: Duration::from_millis(50),
            refused: false,
        }
    }

    fn run(mut self, asks: &Receiver<WatchAsk>) {
        loop {
            // With nothing watched, sleep until asked (the connections are closed after
            // IDLE_CLOSE of that); else take what was asked.
            if self.watched.is_empty() {
                let ask = match self.conns {
                    None => asks.recv().map_err(|_| RecvTimeoutError::Disconnected),
                    Some(_) => asks.recv_timeout(IDLE_CLOSE),
                };
                match ask {
                    Ok(ask) => self.take(ask),
                    Err(RecvTimeoutError::Timeout) => {
                        self.conns = None;
                        continue;
                    }
                    Err(RecvTimeoutError::Disconnected) => return,
                }
            }
            loop {
                match asks.try_recv() {
                    Ok(ask) => self.take(ask),
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(mpsc::TryRecvError::Disconnected) => return,
                }
            }
            let now = Instant::now();
            if let Err(why) = self.step(now) {
                self.broken(&why);
            }
            if self.conns.is_none() {
                // Waiting to connect again (or refused): a new ask wakes it.
                let wait = self
                    .retry_at
                    .saturating_duration_since(Instant::now())
                    .clamp(Duration::from_millis(1), STEP);
                match asks.recv_timeout(wait) {
                    Ok(ask) => self.take(ask),
                    Err(RecvTimeoutError::Timeout) => {}
                    Err(RecvTimeoutError::Disconnected) => return,
                }
            }
        }
    }

    fn take(&mut self, ask: WatchAsk) {
        match ask {
            WatchAsk::Add(w) => {
                self.watched.insert(w.id, w);
            }
            WatchAsk::Remove(id) => {
                self.watched.remove(&id);
            }
        }
    }

    /// Connect when needed, read the locks due, and wait a [`STEP`] for invalidations.
    fn step(&mut self, now: Instant) -> Result<(), String> {
        if self.conns.is_none() {
            if self.refused || now < self.retry_at || self.watched.is_empty() {
                return Ok(());
            }
            self.connect()?;
        }
        let Some((mut sub, mut reader)) = self.conns.take() else {
            return Ok(());
        };
        let outcome = self.listen(&mut sub, &mut reader, now);
        if outcome.is_ok() {
            self.conns = Some((sub, reader));
        }
        outcome
    }

    fn connect(&mut self) -> Result<(), String> {
        let key = self
            .watched
            .values()
            .next()
            .map(|w| w.key.clone())
            .unwrap_or_default();
        match pair(&self.redis, &key, None) {
            Ok(Pair {
                sub,
                reader,
                at: addr,
            }) => {
                self.log.event(
                    Level::Debug,
                    "tracking_on",
                    &format!("watching this replica's runs' locks on {addr}"),
                    &[],
                );
                self.conns = Some((sub, reader));
                self.backoff = Duration::from_millis(50);
                for w in self.watched.values_mut() {
                    w.read = false;
                }
                Ok(())
            }
            Err(End::Refused(why)) => {
                self.refused = true;
                self.log.event(
                    Level::Info,
                    "tracking_off",
                    &format!(
                        "this replica's runs' locks are watched by renewals alone: the server \
                         refused tracking ({why})"
                    ),
                    &[],
                );
                Ok(())
            }
            Err(End::Broken(why)) => Err(why),
            Err(End::Stopped) => Err("stopped".into()),
        }
    }

    /// Read the locks now due, then wait up to a [`STEP`] (less when a lock comes due sooner)
    /// for an invalidation, and read again the locks it names.
    fn listen(&mut self, sub: &mut Wire, reader: &mut Wire, now: Instant) -> Result<(), String> {
        let due: Vec<u64> = self
            .watched
            .values()
            .filter(|w| !w.read && w.from <= now)
            .map(|w| w.id)
            .collect();
        self.check(reader, &due)?;
        // The tracking connection speaks only when spoken to (see the run's own watch).
        if reader.readable() {
            match reader.call(&[b"PING"], Instant::now() + self.redis.connect_timeout) {
                Ok(Reply::Value(Value::SimpleString(s))) if s == "PONG" => {}
                Ok(_) => return Err("the tracking connection spoke out of turn".into()),
                Err(e) => return Err(explain(&e)),
            }
        }
        let next = self
            .watched
            .values()
            .filter(|w| !w.read)
            .map(|w| w.from)
            .min()
            .unwrap_or(now + STEP)
            .clamp(now + Duration::from_millis(1), now + STEP);
        match sub.read(next) {
            Err(WireError::Timeout) => Ok(()),
            Err(e) => Err(explain(&e)),
            Ok(Reply::Error(e)) => Err(e),
            Ok(Reply::Value(msg)) => {
                let named: Vec<u64> = match invalidated(&msg) {
                    None => return Ok(()),
                    Some(None) => self
                        .watched
                        .values()
                        .filter(|w| w.read)
                        .map(|w| w.id)
                        .collect(),
                    Some(Some(keys)) => self
                        .watched
                        .values()
                        .filter(|w| w.read && keys.iter().any(|k| k == w.key.as_bytes()))
                        .map(|w| w.id)
                        .collect(),
                };
                self.check(reader, &named)
            }
        }
    }

    /// Read each of `ids`' locks on the tracking connection (which watches it from then on); a
    /// value that is not the holder's is told.
    fn check(&mut self, reader: &mut Wire, ids: &[u64]) -> Result<(), String> {
        for id in ids {
            let Some(w) = self.watched.get_mut(id) else {
                continue;
            };
            let deadline = Instant::now() + self.redis.connect_timeout;
            let reply = reader
                .call(&[b"GET", w.key.as_bytes()], deadline)
                .and_then(Reply::ok)
                .map_err(|e| explain(&e))?;
            w.read = true;
            let ours = matches!(&reply, Value::BulkString(v) if v == w.value.as_bytes());
            if !ours {
                w.listener.changed();
            }
        }
        Ok(())
    }

    /// The connections broke: a failover or a restart may have lost the locks with them; every
    /// lock watched is told, and the watch connects again (after a backoff up to a second).
    fn broken(&mut self, why: &str) {
        self.conns = None;
        self.log.event(
            Level::Info,
            "tracking_broken",
            &format!("the connection watching this replica's runs' locks broke ({why})"),
            &[],
        );
        for w in self.watched.values_mut() {
            if w.read {
                w.listener.changed();
            }
            w.read = false;
        }
        self.retry_at = Instant::now() + self.backoff;
        self.backoff = (self.backoff * 2).min(Duration::from_secs(1));
    }
}

/// The keys an invalidation message names: `None` for another message, `Some(None)` for every
/// key (a flush).
fn invalidated(msg: &Value) -> Option<Option<Vec<Vec<u8>>>> {
    let Value::Array(parts) = msg else {
        return None;
    };
    match parts.as_slice() {
        [Value::BulkString(kind), _, keys] if kind == b"message" => match keys {
            Value::Array(keys) => Some(Some(
                keys.iter()
                    .filter_map(|k| match k {
                        Value::BulkString(k) => Some(k.clone()),
                        _ => None,
                    })
                    .collect(),
            )),
            _ => Some(None),
        },
        _ => None,
    }
}
