//! The Redis lock itself: key layout, holder identity, and the Lua scripts that acquire, renew and
//! release it. Every write compares the holder value inside Lua, so cronlock never deletes or
//! extends a lock it does not own.
//!
//! Key layout for KEY under the default prefix `cronlock:`. All of a KEY's keys share the hash tag
//! `{KEY}`, so on a Redis Cluster they live in one slot and every script runs on one node. A KEY
//! with `{` or `}` would cut the tag short (or leave it empty): its tag is `{ENCODED}~`, with `%`,
//! `{` and `}` percent-encoded and a `~` after the tag that no brace-free KEY's keys can have, so
//! the KEY can be read back exactly. Brace-free KEYs keep the plain layout:
//! - `cronlock:{KEY}`        the lock; its value identifies the holder
//! - `cronlock:{KEY}:fence`  the fencing counter: the last token, max(last + 1, Redis TIME in µs)
//! - `cronlock:{KEY}:last`   the last run's record (JSON)
//! - `cronlock:{KEY}:history` the last runs' records, newest first, capped
//! - `cronlock:{KEY}:notify` a one-element list that wakes one `--wait`er on release
//! - `cronlock:{KEY}:schedule` with `--schedule`: the last started run's instant and schedule
//! - `cronlock:{KEY}:abandoned:TOKEN` for a TTL after an acquire whose reply was lost
//! - with `--limit N` above 1 (a semaphore): `cronlock:{KEY}:slot:I` for each holder (I in
//!   0..N, held like the plain lock), `cronlock:{KEY}:limit` (N, while holders exist) and
//!   `cronlock:{KEY}:fences` (each slot's fencing token)

use std::sync::LazyLock;
use std::time::Duration;

use anyhow::{anyhow, Result};
use redis::{Script, Value};
use serde_json::json;

use crate::clock::Instant;
use crate::store::topology::{Failure, Link};

// The scripts, hashed once: every call then sends EVALSHA with the SHA1.
const ACQUIRE_LUA: &str = include_str!("lua/acquire.lua");
const RENEW_LUA: &str = include_str!("lua/renew.lua");
const RELEASE_LUA: &str = include_str!("lua/release.lua");
const FORCE_RELEASE_LUA: &str = include_str!("lua/force_release.lua");
const STATUS_LUA: &str = include_str!("lua/status.lua");
const ABANDON_LUA: &str = include_str!("lua/abandon.lua");
const RAISE_LUA: &str = include_str!("lua/raise.lua");
const RESTORE_LUA: &str = include_str!("lua/restore.lua");
const SEMAPHORE_LUA: &str = include_str!("lua/semaphore.lua");
static SEMAPHORE: LazyLock<Script> = LazyLock::new(|| Script::new(SEMAPHORE_LUA));

/// The largest `--limit`.
pub const MAX_LIMIT: u32 = 64;
static RESTORE: LazyLock<Script> = LazyLock::new(|| Script::new(RESTORE_LUA));
static RAISE: LazyLock<Script> = LazyLock::new(|| Script::new(RAISE_LUA));
static ACQUIRE: LazyLock<Script> = LazyLock::new(|| Script::new(ACQUIRE_LUA));
static RENEW: LazyLock<Script> = LazyLock::new(|| Script::new(RENEW_LUA));
static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(RELEASE_LUA));
static FORCE_RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(FORCE_RELEASE_LUA));
static STATUS: LazyLock<Script> = LazyLock::new(|| Script::new(STATUS_LUA));

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
    /// With `--limit` above 1: N, kept while holders exist (see `semaphore.lua`).
    pub limit: String,
    /// With `--limit` above 1: each slot's fencing token (a hash).
    pub fences: String,
}

impl Keys {
    pub fn new(prefix: &str, name: &str) -> Keys {
        let lock = format!("{prefix}{}", tag(name));
        Keys {
            name: name.to_string(),
            fence: format!("{lock}:fence"),
            last: format!("{lock}:last"),
            history: format!("{lock}:history"),
            notify: format!("{lock}:notify"),
            schedule: format!("{lock}:schedule"),
            limit: format!("{lock}:limit"),
            fences: format!("{lock}:fences"),
            lock,
        }
    }

    /// Slot `i` of a `--limit` above 1: a lock of its own, held like the plain one.
    pub fn slot(&self, i: u32) -> String {
        format!("{}:slot:{i}", self.lock)
    }

    /// Slots `0..n`.
    pub fn slots(&self, n: u32) -> Vec<String> {
        (0..n).map(|i| self.slot(i)).collect()
    }

    /// The marker that makes a late-running acquire of the attempt `token` take nothing.
    pub fn abandoned(&self, token: &str) -> String {
        format!("{}:abandoned:{token}", self.lock)
    }

    /// The SCAN pattern that finds every lock key under `prefix` (and some others, which
    /// [`Keys::name_of`] tells apart).
    pub fn pattern(prefix: &str) -> String {
        let mut out = String::with_capacity(prefix.len() + 4);
        for c in prefix.chars() {
            if matches!(c, '*' | '?' | '[' | ']' | '\\') {
                out.push('\\');
            }
            out.push(c);
        }
        out + "{*}*"
    }

    /// The KEY of a lock key found by SCAN, if `redis_key` is one (not a `:fence` or other key).
    pub fn name_of(prefix: &str, redis_key: &str) -> Option<String> {
        let inner = redis_key.strip_prefix(prefix)?.strip_prefix('{')?;
        if let Some(name) = inner.strip_suffix('}') {
            return Some(name.to_string()).filter(|n| !n.is_empty() && !n.contains(['{', '}']));
        }
        let encoded = inner.strip_suffix("}~")?;
        if encoded.contains(['{', '}']) {
            return None;
        }
        let name = decode(encoded)?;
        Some(name).filter(|n| n.contains(['{', '}']))
    }
}

/// The hash tag of KEY: `{KEY}`, or `{ENCODED}~` for a KEY with a brace (see the module comment).
fn tag(name: &str) -> String {
    if !name.contains(['{', '}']) {
        return format!("{{{name}}}");
    }
    let mut out = String::from("{");
    for c in name.chars() {
        match c {
            '%' => out.push_str("%25"),
            '{' => out.push_str("%7B"),
            '}' => out.push_str("%7D"),
            c => out.push(c),
        }
    }
    out + "}~"
}

/// Undo [`tag`]'s encoding; None for text it cannot have made.
fn decode(text: &str) -> Option<String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find('%') {
        out.push_str(&rest[..i]);
        out.push(match rest.get(i + 1..i + 3)? {
            "25" => '%',
            "7B" => '{',
            "7D" => '}',
            _ => return None,
        });
        rest = &rest[i + 3..];
    }
    out.push_str(rest);
    Some(out)
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
    /// `--limit`; above 1, `keys.lock` is our slot's key.
    pub limit: u32,
    /// Our slot (0 for the plain lock).
    pub slot: u32,
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
    /// The current holders hold KEY with this other `--limit`: refused, nothing touched.
    Mismatch(u32),
}

fn ms(d: Duration) -> u64 {
    d.as_millis().max(1) as u64
}

/// Run `script` with `keys` and `args` on the node that serves `keys[0]`, within `within` in all:
/// by SHA1 (`EVALSHA`), and with its text when the server does not have it yet (a new server, a
/// restart, a promoted replica: the script cache is not replicated).
fn eval(
    link: &mut Link,
    within: Duration,
    script: &Script,
    text: &str,
    keys: &[&str],
    args: &[String],
) -> Result<Value, Failure> {
    let deadline = Instant::now() + within;
    let n = keys.len().to_string();
    let call = |link: &mut Link, verb: &str, body: &str| {
        let mut all: Vec<&[u8]> = vec![verb.as_bytes(), body.as_bytes(), n.as_bytes()];
        all.extend(keys.iter().map(|k| k.as_bytes()));
        all.extend(args.iter().map(|a| a.as_bytes()));
        link.call(
            deadline.saturating_duration_since(Instant::now()),
            keys[0],
            &all,
        )
    };
    match call(link, "EVALSHA", script.get_hash()) {
        Err(Failure::Call(e)) if e.code() == Some("NOSCRIPT") => call(link, "EVAL", text),
        r => r,
    }
}

/// The integer a script returns; anything else is a failure of the call, never an answer.
fn int(v: &Value, what: &'static str) -> Result<i64, Failure> {
    match v {
        Value::Int(n) => Ok(*n),
        _ => Err(Failure::shape(what)),
    }
}

/// A string or nothing (Lua's `false`).
fn text_or_nil(v: &Value, what: &'static str) -> Result<Option<String>, Failure> {
    match v {
        Value::Nil => Ok(None),
        Value::BulkString(b) => Ok(Some(String::from_utf8_lossy(b).into_owned())),
        _ => Err(Failure::shape(what)),
    }
}

/// One acquisition attempt, within `within` (connecting included). An error whose
/// [`Failure::maybe_ran`] holds may have taken the lock: see [`abandon`].
pub fn try_acquire(
    link: &mut Link,
    within: Duration,
    keys: &Keys,
    holder: &Holder,
    ttl: Duration,
    slot: Option<&Slot>,
    limit: u32,
) -> Result<Attempt, Failure> {
    let sent_at = Instant::now();
    let abandoned = keys.abandoned(&holder.token);
    let reply = if limit > 1 {
        let slots = keys.slots(limit);
        let mut all: Vec<&str> = vec![
            &keys.lock,
            &keys.fence,
            &abandoned,
            &keys.limit,
            &keys.fences,
        ];
        all.extend(slots.iter().map(String::as_str));
        eval(
            link,
            within,
            &SEMAPHORE,
            SEMAPHORE_LUA,
            &all,
            &[holder.value.clone(), ms(ttl).to_string(), limit.to_string()],
        )?
    } else {
        plain_acquire(link, within, keys, holder, ttl, slot, &abandoned)?
    };
    const SHAPE: &str =
        "an acquire reply that is not {fence, pttl, holder, instant, ran, slot, limit}";
    let Value::Array(parts) = &reply else {
        return Err(Failure::shape(SHAPE));
    };
    let [fence, pttl, value, instant, ran, got, other] = parts.as_slice() else {
        return Err(Failure::shape(SHAPE));
    };
    let (fence, pttl, value, instant, ran, got, other) = (
        int(fence, SHAPE)?,
        int(pttl, SHAPE)?,
        text_or_nil(value, SHAPE)?,
        int(instant, SHAPE)?,
        int(ran, SHAPE)?,
        int(got, SHAPE)?,
        int(other, SHAPE)?,
    );
    if other != 0 {
        return Ok(Attempt::Mismatch(other.clamp(0, i64::from(u32::MAX)) as u32));
    }
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
    let slot = u32::try_from(got).map_err(|_| Failure::shape(SHAPE))?;
    let mut keys = keys.clone();
    if limit > 1 {
        keys.lock = keys.slot(slot);
    }
    Ok(Attempt::Held(Box::new(Held {
        keys,
        holder: holder.clone(),
        fence,
        ttl,
        sent_at,
        instant,
        limit,
        slot,
    })))
}

/// The plain lock's acquire (`acquire.lua`).
fn plain_acquire(
    link: &mut Link,
    within: Duration,
    keys: &Keys,
    holder: &Holder,
    ttl: Duration,
    slot: Option<&Slot>,
    abandoned: &str,
) -> Result<Value, Failure> {
    let mut args = vec![
        holder.value.clone(),
        ms(ttl).to_string(),
        slot.map_or(String::new(), |s| s.schedule.clone()),
    ];
    args.extend(
        slot.map_or(&[][..], |s| &s.candidates)
            .iter()
            .map(i64::to_string),
    );
    eval(
        link,
        within,
        &ACQUIRE,
        ACQUIRE_LUA,
        &[
            &keys.lock,
            &keys.fence,
            abandoned,
            &keys.schedule,
            &keys.limit,
        ],
        &args,
    )
}

/// Undo an attempt whose reply was lost (see `abandon.lua`): `Ok(true)` when it deleted our lock.
///
/// Sent as `EVAL` with the whole script: Redis is likely hung right now, and a `NOSCRIPT` reply
/// to an `EVALSHA` would arrive after we stopped listening, so the script would never run.
pub fn abandon(
    link: &mut Link,
    within: Duration,
    keys: &Keys,
    holder: &Holder,
    ttl: Duration,
) -> Result<bool, Failure> {
    let abandoned = keys.abandoned(&holder.token);
    let ttl = ms(ttl).to_string();
    let reply = link.call(
        within,
        &keys.lock,
        &[
            b"EVAL",
            ABANDON_LUA.as_bytes(),
            b"2",
            keys.lock.as_bytes(),
            abandoned.as_bytes(),
            holder.value.as_bytes(),
            ttl.as_bytes(),
        ],
    )?;
    Ok(int(&reply, "an undo reply that is not 0 or 1")? == 1)
}

/// Extend our lock to `ttl` from now if it is still ours: `Ok(true)` ours, `Ok(false)` not ours.
/// Any other reply (`+OK`, RESP3 `#t`, a string) is a failure: the renewal is not confirmed.
pub fn renew(link: &mut Link, within: Duration, held: &Held) -> Result<bool, Failure> {
    let ttl = ms(held.ttl).to_string();
    let reply = if held.limit > 1 {
        // Our slot, and the limit record kept alive as long as a slot.
        eval(
            link,
            within,
            &RENEW,
            RENEW_LUA,
            &[&held.keys.lock, &held.keys.limit],
            &[held.holder.value.clone(), ttl, held.limit.to_string()],
        )?
    } else {
        eval(
            link,
            within,
            &RENEW,
            RENEW_LUA,
            &[&held.keys.lock],
            &[held.holder.value.clone(), ttl],
        )?
    };
    match int(&reply, "a renewal reply that is not 0 or 1")? {
        1 => Ok(true),
        0 => Ok(false),
        _ => Err(Failure::shape("a renewal reply that is not 0 or 1")),
    }
}

/// Several masters: raise the fencing counter to `held.fence` while the lock is ours there
/// (`Ok(false)`: not ours).
pub fn raise(link: &mut Link, within: Duration, held: &Held) -> Result<bool, Failure> {
    let reply = eval(
        link,
        within,
        &RAISE,
        RAISE_LUA,
        &[&held.keys.lock, &held.keys.fence],
        &[held.holder.value.clone(), held.fence.to_string()],
    )?;
    Ok(int(&reply, "a fencing reply that is not 0 or 1")? == 1)
}

/// Several masters: write our lock (and our fencing token) back on a master that lost it, where
/// it is missing or ours: `Ok(false)` when another holds it there.
pub fn restore(link: &mut Link, within: Duration, held: &Held) -> Result<bool, Failure> {
    let reply = eval(
        link,
        within,
        &RESTORE,
        RESTORE_LUA,
        &[&held.keys.lock, &held.keys.fence],
        &[
            held.holder.value.clone(),
            ms(held.ttl).to_string(),
            held.fence.to_string(),
        ],
    )?;
    Ok(int(&reply, "a restore reply that is not 0 or 1")? == 1)
}

/// Delete (or, for `--min-hold`, shorten) our lock if it is still ours, and record the run.
pub fn release(
    link: &mut Link,
    within: Duration,
    held: &Held,
    opts: &ReleaseOptions,
) -> Result<Released, Failure> {
    let keys = &held.keys;
    let hold = if opts.hold.is_zero() {
        0
    } else {
        ms(opts.hold)
    };
    let slots = if held.limit > 1 {
        keys.slots(held.limit)
    } else {
        Vec::new()
    };
    let mut all: Vec<&str> = vec![&keys.lock, &keys.last, &keys.history, &keys.notify];
    if held.limit > 1 {
        all.push(&keys.limit);
        all.extend(slots.iter().map(String::as_str));
    }
    let reply = eval(
        link,
        within,
        &RELEASE,
        RELEASE_LUA,
        &all,
        &[
            held.holder.value.clone(),
            hold.to_string(),
            opts.record.clone().unwrap_or_default(),
            opts.history.to_string(),
            opts.record_ttl.map_or(0, ms).to_string(),
            ms(NOTIFY_TTL).to_string(),
        ],
    )?;
    Ok(
        match int(&reply, "a release reply that is not 0, 1 or 2")? {
            1 => Released::Deleted,
            2 => Released::Kept,
            0 => Released::NotOurs,
            _ => return Err(Failure::shape("a release reply that is not 0, 1 or 2")),
        },
    )
}

/// Delete the lock whoever holds it (every holder, with `--limit` above 1), or only the holder
/// whose token is `token`; returns the holder values deleted (none when it was free).
pub fn force_release(
    link: &mut Link,
    within: Duration,
    keys: &Keys,
    token: Option<&str>,
) -> Result<Vec<String>> {
    let slots = keys.slots(MAX_LIMIT);
    let mut all: Vec<&str> = vec![&keys.lock, &keys.notify, &keys.limit];
    all.extend(slots.iter().map(String::as_str));
    eval(
        link,
        within,
        &FORCE_RELEASE,
        FORCE_RELEASE_LUA,
        &all,
        &[ms(NOTIFY_TTL).to_string(), token.unwrap_or("").to_string()],
    )
    .and_then(|v| match v {
        Value::Array(items) => items
            .iter()
            .map(|i| text_or_nil(i, "a force-release reply that is not the holders"))
            .filter_map(Result::transpose)
            .collect(),
        _ => Err(Failure::shape(
            "a force-release reply that is not the holders",
        )),
    })
    .map_err(|e| anyhow!("cannot release lock '{}': {e}", keys.name))
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
    /// With `--limit` above 1: N, and each held slot.
    pub limit: Option<u32>,
    pub slots: Vec<SlotHolder>,
}

/// One holder of a `--limit` above 1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotHolder {
    pub slot: u32,
    pub value: String,
    pub pttl: i64,
    pub fence: i64,
}

/// Read the lock, its expiry, its fencing counter, its last run and up to `history` kept runs at
/// one instant.
pub fn snapshot(
    link: &mut Link,
    within: Duration,
    keys: &Keys,
    history: Option<u32>,
) -> Result<Snapshot> {
    type Reply = (
        Option<String>,
        i64,
        Option<i64>,
        Option<String>,
        Vec<String>,
        (Option<i64>, Option<String>),
        Option<u32>,
        Vec<(u32, String, i64, i64)>,
    );
    let slot_keys = keys.slots(MAX_LIMIT);
    let mut all: Vec<&str> = vec![
        &keys.lock,
        &keys.fence,
        &keys.last,
        &keys.history,
        &keys.schedule,
        &keys.limit,
        &keys.fences,
    ];
    all.extend(slot_keys.iter().map(String::as_str));
    let (holder, pttl, fence, last_run, history, (instant, schedule), limit, slots): Reply = eval(
        link,
        within,
        &STATUS,
        STATUS_LUA,
        &all,
        &[history.map_or(0, i64::from).to_string()],
    )
    .and_then(|v| {
        redis::from_redis_value(v).map_err(|_| Failure::shape("a status reply of the wrong shape"))
    })
    .map_err(|e| anyhow!("cannot read lock '{}': {e}", keys.name))?;
    let slots = slots
        .into_iter()
        .map(|(slot, value, pttl, fence)| SlotHolder {
            slot,
            value,
            pttl,
            fence,
        })
        .collect();
    Ok(Snapshot {
        holder,
        pttl,
        fence,
        last_run,
        history,
        instant,
        schedule,
        limit,
        slots,
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
        assert_eq!(
            Keys::name_of("cronlock:", &k.lock).as_deref(),
            Some("nightly")
        );
        assert_eq!(Keys::name_of("cronlock:", &k.fence), None);
        assert_eq!(Keys::name_of("cronlock:", "other:{x}"), None);
    }

    /// Redis's rule: the tag is between the first `{` and the first `}` after it, if non-empty.
    fn hash_tag(key: &str) -> &str {
        if let Some(open) = key.find('{') {
            if let Some(len) = key[open + 1..].find('}') {
                if len > 0 {
                    return &key[open + 1..open + 1 + len];
                }
            }
        }
        key
    }

    #[test]
    fn every_key_keeps_one_tag_and_reads_back() {
        for name in [
            "}",
            "{",
            "{}",
            "a{b}c",
            "a}b",
            "x y",
            "50%",
            "%7D",
            "}~",
            "a}~:fence",
        ] {
            let k = Keys::new("cronlock:", name);
            let tag = hash_tag(&k.lock);
            assert!(!tag.is_empty() && tag != k.lock, "{name}: {}", k.lock);
            for other in [&k.fence, &k.last, &k.history, &k.notify, &k.schedule] {
                assert_eq!(hash_tag(other), tag, "{name}: {other}");
            }
            assert_eq!(hash_tag(&k.abandoned("t")), tag);
            assert_eq!(
                Keys::name_of("cronlock:", &k.lock).as_deref(),
                Some(name),
                "{}",
                k.lock
            );
            for other in [&k.fence, &k.last, &k.notify] {
                assert_eq!(Keys::name_of("cronlock:", other), None, "{other}");
            }
        }
        // Brace-free KEYs keep the layout earlier versions used.
        assert_eq!(Keys::new("cronlock:", "50%").lock, "cronlock:{50%}");
        assert_eq!(Keys::new("cronlock:", "a}b").lock, "cronlock:{a%7Db}~");
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
