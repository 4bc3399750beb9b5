//! The Redis lock itself: key layout, holder identity, and the Lua scripts that acquire, renew and
//! release it. Every write compares the holder value inside Lua, so cronlock never deletes or
//! extends a lock it does not own.
//!
//! Key layout for KEY under the default prefix `cronlock:` (all in one Cluster hash slot, `{KEY}`):
//! - `cronlock:{KEY}`        the lock; its value identifies the holder
//! - `cronlock:{KEY}:fence`  the fencing counter: the last token, max(last + 1, Redis TIME in µs)
//! - `cronlock:{KEY}:last`   the last run's record (JSON)
//! - `cronlock:{KEY}:history` the last runs' records, newest first, capped
//! - `cronlock:{KEY}:notify` a one-element list that wakes one `--wait`er on release
//! - `cronlock:{KEY}:schedule` with `--schedule`: the last started run's instant and schedule
//! - `cronlock:{KEY}:abandoned:TOKEN` for a TTL after an acquire whose reply was lost

use std::sync::LazyLock;
use std::time::Duration;

use anyhow::{anyhow, Result};
use redis::{Connection, RedisResult, Script};
use serde_json::json;

use crate::clock::Instant;
use crate::connect::first_line;

// The scripts, hashed once: every call then sends EVALSHA with the cached SHA1.
static ACQUIRE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/acquire.lua")));
static RENEW: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/renew.lua")));
static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/release.lua")));
static FORCE_RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/force_release.lua")));
static STATUS: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/status.lua")));
const ABANDON_LUA: &str = include_str!("lua/abandon.lua");

/// How long a release notification waits for a waiter before it expires.
pub const NOTIFY_TTL: Duration = Duration::from_secs(10);

/// The Redis keys that belong to one KEY.
#[derive(Debug, Clone)]
pub struct Keys {
    pub name: String,
    pub lock: String,
    pub fence: String,
    pub last: String,
    pub history: String,
    pub notify: String,
    pub schedule: String,
}

impl Keys {
    pub fn new(prefix: &str, name: &str) -> Keys {
        let lock = format!("{prefix}{{{name}}}");
        Keys {
            name: name.to_string(),
            fence: format!("{lock}:fence"),
            last: format!("{lock}:last"),
            history: format!("{lock}:history"),
            notify: format!("{lock}:notify"),
            schedule: format!("{lock}:schedule"),
            lock,
        }
    }

    /// The marker that makes a late-running acquire of the attempt `token` take nothing.
    pub fn abandoned(&self, token: &str) -> String {
        format!("{}:abandoned:{token}", self.lock)
    }

    /// The KEY of a lock key found by SCAN, if `redis_key` is one (not a `:fence` or other key).
    pub fn name_of<'a>(prefix: &str, redis_key: &'a str) -> Option<&'a str> {
        redis_key
            .strip_prefix(prefix)?
            .strip_prefix('{')?
            .strip_suffix('}')
            .filter(|name| !name.is_empty())
    }
}

/// How many characters of the command line the lock value and the run record keep.
pub const MAX_COMMAND: usize = 256;

/// `text` cut to `max` characters, the last being `…` when anything was cut.
pub fn truncate(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_string();
    }
    let mut cut: String = text.chars().take(max - 1).collect();
    cut.push('…');
    cut
}

/// Who holds the lock: the value stored in Redis is this, as JSON, and is compared whole.
#[derive(Debug, Clone)]
pub struct Holder {
    /// A fresh uuid v4 per run; also given to the child as `CRONLOCK_TOKEN`.
    pub token: String,
    pub host: String,
    pub pid: u32,
    /// Wall-clock milliseconds when we asked for the lock.
    pub started_ms: u64,
    pub command: String,
    /// The exact value written to Redis.
    pub value: String,
}

impl Holder {
    pub fn new(command: &str) -> Holder {
        let token = uuid::Uuid::new_v4().to_string();
        let host = crate::host::hostname();
        let pid = std::process::id();
        let started_ms = crate::host::unix_millis();
        let command = truncate(command, MAX_COMMAND);
        let value = json!({
            "token": token, "host": host, "pid": pid, "started": started_ms, "command": command,
        })
        .to_string();
        Holder {
            token,
            host,
            pid,
            started_ms,
            command,
            value,
        }
    }
}

/// A lock we hold: who we are, our fencing token, and from when its expiry counts.
#[derive(Debug, Clone)]
pub struct Held {
    pub keys: Keys,
    pub holder: Holder,
    pub fence: i64,
    pub ttl: Duration,
    /// When the acquiring script was sent: the lock is valid until this + ttl at the least.
    pub sent_at: Instant,
    /// With `--schedule`: the instant (Unix ms) this run is for.
    pub instant: Option<i64>,
}

/// With `--schedule`: what the acquire script chooses the run's instant from.
#[derive(Debug, Clone)]
pub struct Slot {
    pub schedule: String,
    /// Instants (Unix ms) around the local clock; Redis takes the one nearest to its own.
    pub candidates: Vec<i64>,
}

/// What the release found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Released {
    /// We deleted our lock.
    Deleted,
    /// We kept it, expiring after the rest of `--min-hold`.
    Kept,
    /// The lock was no longer ours: we touched nothing.
    NotOurs,
}

/// What the release also does besides deleting.
#[derive(Debug, Clone, Default)]
pub struct ReleaseOptions {
    /// Keep the lock this much longer instead of deleting it (`--min-hold`).
    pub hold: Duration,
    /// The run record (JSON) to store as the last run.
    pub record: Option<String>,
    pub history: u32,
    pub record_ttl: Option<Duration>,
}

/// One attempt's outcome.
#[derive(Debug)]
pub enum Attempt {
    Held(Box<Held>),
    /// Held elsewhere; the holder's lock expires in this much (None: no expiry set), the
    /// holder's value, and (with a schedule) the instant this attempt was for.
    Busy(Option<Duration>, String, Option<i64>),
    /// The run for this instant already started (at `ran`, the recorded instant).
    AlreadyRan {
        instant: i64,
        ran: i64,
    },
}

fn ms(d: Duration) -> u64 {
    d.as_millis().max(1) as u64
}

/// An acquire that failed; `unknown` when Redis may have run it anyway (timeout, dropped
/// connection), so the lock may be ours without our knowing.
#[derive(Debug)]
pub struct AcquireError {
    pub error: redis::RedisError,
    pub unknown: bool,
}

impl AcquireError {
    pub fn transient(&self) -> bool {
        self.unknown || self.error.code() == Some("LOADING") || self.error.code() == Some("BUSY")
    }
}

/// One acquisition attempt.
pub fn try_acquire(
    con: &mut Connection,
    keys: &Keys,
    holder: &Holder,
    ttl: Duration,
    slot: Option<&Slot>,
) -> std::result::Result<Attempt, AcquireError> {
    let sent_at = Instant::now();
    let mut call = ACQUIRE.prepare_invoke();
    call.key(&keys.lock)
        .key(&keys.fence)
        .key(keys.abandoned(&holder.token))
        .key(&keys.schedule)
        .arg(&holder.value)
        .arg(ms(ttl))
        .arg(slot.map_or("", |s| s.schedule.as_str()));
    for c in slot.map_or(&[][..], |s| &s.candidates) {
        call.arg(*c);
    }
    let (fence, pttl, value, instant, ran): (i64, i64, Option<String>, i64, i64) =
        call.invoke(con).map_err(|error| AcquireError {
            // No reply, or one we could not read: the script may have run and taken the lock.
            unknown: error.is_timeout()
                || error.is_io_error()
                || error.is_connection_dropped()
                || matches!(
                    error.kind(),
                    redis::ErrorKind::Parse | redis::ErrorKind::UnexpectedReturnType
                ),
            error,
        })?;
    let instant = (instant != 0).then_some(instant);
    if ran != 0 {
        return Ok(Attempt::AlreadyRan {
            instant: instant.unwrap_or(ran),
            ran,
        });
    }
    if fence <= 0 {
        let left = u64::try_from(pttl).ok().map(Duration::from_millis);
        return Ok(Attempt::Busy(left, value.unwrap_or_default(), instant));
    }
    Ok(Attempt::Held(Box::new(Held {
        keys: keys.clone(),
        holder: holder.clone(),
        fence,
        ttl,
        sent_at,
        instant,
    })))
}

/// Undo an attempt whose reply was lost (see `abandon.lua`): `Ok(true)` when it deleted our lock.
///
/// Sent as `EVAL` with the whole script: Redis is likely hung right now, and a `NOSCRIPT` reply
/// to an `EVALSHA` would arrive after we stopped listening, so the script would never run.
pub fn abandon(
    con: &mut Connection,
    keys: &Keys,
    holder: &Holder,
    ttl: Duration,
) -> RedisResult<bool> {
    redis::cmd("EVAL")
        .arg(ABANDON_LUA)
        .arg(2)
        .arg(&keys.lock)
        .arg(keys.abandoned(&holder.token))
        .arg(&holder.value)
        .arg(ms(ttl))
        .query(con)
}

/// Extend our lock to `ttl` from now if it is still ours: `Ok(true)` ours, `Ok(false)` not ours.
pub fn renew(con: &mut Connection, held: &Held) -> RedisResult<bool> {
    RENEW
        .key(&held.keys.lock)
        .arg(&held.holder.value)
        .arg(ms(held.ttl))
        .invoke(con)
}

/// Delete (or, for `--min-hold`, shorten) our lock if it is still ours, and record the run.
/// The Redis error is returned as is, so the caller can tell a dropped connection.
pub fn release(con: &mut Connection, held: &Held, opts: &ReleaseOptions) -> RedisResult<Released> {
    let keys = &held.keys;
    let n: i64 = RELEASE
        .key(&keys.lock)
        .key(&keys.last)
        .key(&keys.history)
        .key(&keys.notify)
        .arg(&held.holder.value)
        .arg(if opts.hold.is_zero() {
            0
        } else {
            ms(opts.hold)
        })
        .arg(opts.record.as_deref().unwrap_or(""))
        .arg(opts.history)
        .arg(opts.record_ttl.map_or(0, ms))
        .arg(ms(NOTIFY_TTL))
        .invoke(con)?;
    Ok(match n {
        1 => Released::Deleted,
        2 => Released::Kept,
        _ => Released::NotOurs,
    })
}

/// Delete the lock whoever holds it; returns the holder value, or None if it was free.
pub fn force_release(con: &mut Connection, keys: &Keys) -> Result<Option<String>> {
    FORCE_RELEASE
        .key(&keys.lock)
        .key(&keys.notify)
        .arg(ms(NOTIFY_TTL))
        .invoke(con)
        .map_err(|e| anyhow!("cannot release lock '{}': {}", keys.name, first_line(&e)))
}

/// A consistent snapshot of one lock.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub holder: Option<String>,
    pub pttl: i64,
    pub fence: Option<i64>,
    pub last_run: Option<String>,
    /// The newest kept run records, when asked for.
    pub history: Vec<String>,
    /// With `--schedule`: the last started run's instant (Unix ms) and the schedule it used.
    pub instant: Option<i64>,
    pub schedule: Option<String>,
}

/// Read the lock, its expiry, its fencing counter, its last run and up to `history` kept runs at
/// one instant.
pub fn snapshot(con: &mut Connection, keys: &Keys, history: Option<u32>) -> Result<Snapshot> {
    type Reply = (
        Option<String>,
        i64,
        Option<i64>,
        Option<String>,
        Vec<String>,
        (Option<i64>, Option<String>),
    );
    let (holder, pttl, fence, last_run, history, (instant, schedule)): Reply = STATUS
        .key(&keys.lock)
        .key(&keys.fence)
        .key(&keys.last)
        .key(&keys.history)
        .key(&keys.schedule)
        .arg(history.map_or(0, i64::from))
        .invoke(con)
        .map_err(|e| anyhow!("cannot read lock '{}': {}", keys.name, first_line(&e)))?;
    Ok(Snapshot {
        holder,
        pttl,
        fence,
        last_run,
        history,
        instant,
        schedule,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_share_a_hash_slot() {
        let k = Keys::new("cronlock:", "nightly");
        assert_eq!(k.lock, "cronlock:{nightly}");
        assert_eq!(k.fence, "cronlock:{nightly}:fence");
        assert_eq!(k.notify, "cronlock:{nightly}:notify");
        assert_eq!(Keys::name_of("cronlock:", &k.lock), Some("nightly"));
        assert_eq!(Keys::name_of("cronlock:", &k.fence), None);
        assert_eq!(Keys::name_of("cronlock:", "other:{x}"), None);
    }

    #[test]
    fn long_commands_are_cut_with_a_marker() {
        assert_eq!(truncate("short", 256), "short");
        let long = "x".repeat(300);
        let cut = Holder::new(&long).command;
        assert_eq!(cut.chars().count(), MAX_COMMAND);
        assert!(cut.ends_with('…'));
    }

    #[test]
    fn holder_value_is_json_with_identity() {
        let h = Holder::new("report.sh --all");
        let v: serde_json::Value = serde_json::from_str(&h.value).unwrap();
        assert_eq!(v["token"], h.token.as_str());
        assert_eq!(v["command"], "report.sh --all");
        assert_eq!(v["pid"], std::process::id());
    }
}
