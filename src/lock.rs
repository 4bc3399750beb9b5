//! The Redis lock itself: key layout, holder identity, and the Lua scripts that acquire, renew and
//! release it. Every write compares the holder value inside Lua, so cronlock never deletes or
//! extends a lock it does not own.
//!
//! Key layout for KEY under the default prefix `cronlock:` (all in one Cluster hash slot, `{KEY}`):
//! - `cronlock:{KEY}`        the lock; its value identifies the holder
//! - `cronlock:{KEY}:fence`  the fencing counter, bumped on every acquisition, never expires

use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};
use redis::{Connection, RedisResult, Script};
use serde_json::json;

use crate::connect::first_line;

static ACQUIRE: &str = include_str!("lua/acquire.lua");
static RENEW: &str = include_str!("lua/renew.lua");
static RELEASE: &str = include_str!("lua/release.lua");

/// The Redis keys that belong to one KEY.
#[derive(Debug, Clone)]
pub struct Keys {
    pub name: String,
    pub lock: String,
    pub fence: String,
}

impl Keys {
    pub fn new(prefix: &str, name: &str) -> Keys {
        let lock = format!("{prefix}{{{name}}}");
        Keys {
            name: name.to_string(),
            fence: format!("{lock}:fence"),
            lock,
        }
    }
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
        let command: String = command.chars().take(256).collect();
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
}

/// What the release found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Released {
    /// We deleted our lock.
    Deleted,
    /// The lock was no longer ours: we touched nothing.
    NotOurs,
}

fn ms(d: Duration) -> u64 {
    d.as_millis().max(1) as u64
}

/// One acquisition attempt. `Ok(None)` when the lock is held elsewhere.
pub fn try_acquire(
    con: &mut Connection,
    keys: &Keys,
    holder: &Holder,
    ttl: Duration,
) -> Result<Option<Held>> {
    let sent_at = Instant::now();
    let fence: i64 = Script::new(ACQUIRE)
        .key(&keys.lock)
        .key(&keys.fence)
        .arg(&holder.value)
        .arg(ms(ttl))
        .invoke(con)
        .map_err(|e| anyhow!("cannot acquire lock '{}': {}", keys.name, first_line(&e)))?;
    Ok((fence > 0).then(|| Held {
        keys: keys.clone(),
        holder: holder.clone(),
        fence,
        ttl,
        sent_at,
    }))
}

/// Extend our lock to `ttl` from now if it is still ours: `Ok(true)` ours, `Ok(false)` not ours.
pub fn renew(con: &mut Connection, held: &Held) -> RedisResult<bool> {
    Script::new(RENEW)
        .key(&held.keys.lock)
        .arg(&held.holder.value)
        .arg(ms(held.ttl))
        .invoke(con)
}

/// Delete our lock if it is still ours.
pub fn release(con: &mut Connection, held: &Held) -> Result<Released> {
    let n: i64 = Script::new(RELEASE)
        .key(&held.keys.lock)
        .arg(&held.holder.value)
        .invoke(con)
        .map_err(|e| {
            anyhow!(
                "cannot release lock '{}': {}",
                held.keys.name,
                first_line(&e)
            )
        })?;
    Ok(if n == 1 {
        Released::Deleted
    } else {
        Released::NotOurs
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
