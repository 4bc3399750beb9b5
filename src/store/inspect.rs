//! What the admin modes read and force: a consistent snapshot of a lock (`--status`, `--check`,
//! `--list`), a forced release (`--force-release`) and the fleet-wide switch (`--suspend`,
//! `--resume`), each one script.

use std::time::Duration;

use anyhow::{anyhow, Result};
use redis::Value;

use crate::record::ledger::LedgerInstant;
use crate::record::run::RunRecord;
use crate::record::suspension::Suspension;
use crate::record::Stored;
use crate::store::keys::{Keys, MAX_LIMIT};
use crate::store::lock::NOTIFY_TTL;
use crate::store::script::{eval, ms, text_or_nil, Script};
use crate::store::topology::{Failure, Link};

const FORCE_RELEASE_LUA: &str = include_str!("lua/force_release.lua");
const STATUS_LUA: &str = concat!(
    include_str!("lua/suspension.lua"),
    include_str!("lua/status.lua")
);
const SUSPEND_LUA: &str = concat!(
    include_str!("lua/suspension.lua"),
    include_str!("lua/suspend.lua")
);
const RESUME_LUA: &str = concat!(
    include_str!("lua/suspension.lua"),
    include_str!("lua/resume.lua")
);
static FORCE_RELEASE: Script = Script::new(FORCE_RELEASE_LUA);
static STATUS: Script = Script::new(STATUS_LUA);
static SUSPEND: Script = Script::new(SUSPEND_LUA);
static RESUME: Script = Script::new(RESUME_LUA);

/// How many instants the ledger keeps (`KEEP` in `acquire.lua`, which trims in batches above it).
pub const LEDGER_KEEP: usize = 64;

/// A master's answer to `--suspend`.
pub struct Suspended {
    /// The record in force before (None: KEY was not suspended, or its suspension had run out).
    pub before: Option<String>,
    /// The record in force now.
    pub now: String,
}

/// `--suspend KEY`: store `record` (JSON: host, user, reason; Redis adds `since`, and `until`
/// when `lasting` is not zero).
pub fn suspend(
    link: &mut Link,
    within: Duration,
    keys: &Keys,
    record: &str,
    lasting: Duration,
) -> Result<Suspended> {
    eval(
        link,
        within,
        &SUSPEND,
        &[&keys.suspend],
        &[record.to_string(), lasting.as_millis().to_string()],
        |v| {
            redis::from_redis_value::<(Option<String>, String)>(v.clone())
                .map(|(before, now)| Suspended { before, now })
                .map_err(|_| Failure::shape("a suspend reply that is not {before, now}"))
        },
    )
    .map_err(|e| anyhow!("cannot suspend lock '{}': {e}", keys.name))
}

/// `--resume KEY`: the record that was in force (None: KEY was not suspended).
pub fn resume(link: &mut Link, within: Duration, keys: &Keys) -> Result<Option<String>> {
    eval(link, within, &RESUME, &[&keys.suspend], &[], |v| {
        text_or_nil(v, "a resume reply that is not the record")
    })
    .map_err(|e| anyhow!("cannot resume lock '{}': {e}", keys.name))
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
        &all,
        &[ms(NOTIFY_TTL).to_string(), token.unwrap_or("").to_string()],
        |v| match v {
            Value::Array(items) => items
                .iter()
                .map(|i| text_or_nil(i, "a force-release reply that is not the holders"))
                .filter_map(Result::transpose)
                .collect(),
            _ => Err(Failure::shape(
                "a force-release reply that is not the holders",
            )),
        },
    )
    .map_err(|e| anyhow!("cannot release lock '{}': {e}", keys.name))
}

/// A consistent snapshot of one lock.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub holder: Option<String>,
    pub pttl: i64,
    pub fence: Option<i64>,
    pub last_run: Option<Stored<RunRecord>>,
    /// The newest kept run records, when asked for.
    pub history: Vec<Stored<RunRecord>>,
    /// With `--schedule`: the last started run's instant (Unix ms) and the schedule it used.
    pub instant: Option<i64>,
    pub schedule: Option<String>,
    /// With `--limit` above 1: N, and each held slot.
    pub limit: Option<u32>,
    pub slots: Vec<SlotHolder>,
    /// With `--schedule`: the ledger, as (instant in Unix ms, entry), newest first (at most
    /// [`LEDGER_KEEP`]).
    pub ledger: Vec<LedgerInstant>,
    /// While `--suspend` is in force: its record.
    pub suspended: Option<Stored<Suspension>>,
}

/// One holder of a `--limit` above 1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotHolder {
    pub slot: u32,
    pub value: String,
    pub pttl: i64,
    pub fence: i64,
}

/// What `status.lua` answers: an array of these, in this order.
struct StatusReply {
    holder: Option<String>,
    pttl: i64,
    fence: Option<i64>,
    last_run: Option<String>,
    history: Vec<String>,
    /// The schedule record: the last instant and the expression.
    instant: Option<i64>,
    schedule: Option<String>,
    limit: Option<u32>,
    slots: Vec<SlotHolder>,
    /// The ledger, unsorted, each entry's raw text.
    ledger: Vec<RawInstant>,
    suspended: Option<String>,
}

/// One instant of the ledger as `status.lua` gives it.
struct RawInstant {
    instant: i64,
    raw: String,
}

impl StatusReply {
    /// The reply read to the letter: `None` for any other shape.
    fn read(v: &Value) -> Option<StatusReply> {
        fn field<T: redis::FromRedisValue>(v: Option<&Value>) -> Option<T> {
            redis::from_redis_value(v?.clone()).ok()
        }
        let Value::Array(items) = v else {
            return None;
        };
        if items.len() != 10 {
            return None;
        }
        let mut it = items.iter();
        let holder = field(it.next())?;
        let pttl = field(it.next())?;
        let fence = field(it.next())?;
        let last_run = field(it.next())?;
        let history = field(it.next())?;
        let (instant, schedule): (Option<i64>, Option<String>) = field(it.next())?;
        let limit = field(it.next())?;
        let slots: Vec<(u32, String, i64, i64)> = field(it.next())?;
        let ledger: Vec<(i64, String)> = field(it.next())?;
        let suspended = field(it.next())?;
        Some(StatusReply {
            holder,
            pttl,
            fence,
            last_run,
            history,
            instant,
            schedule,
            limit,
            slots: slots
                .into_iter()
                .map(|(slot, value, pttl, fence)| SlotHolder {
                    slot,
                    value,
                    pttl,
                    fence,
                })
                .collect(),
            ledger: ledger
                .into_iter()
                .map(|(instant, raw)| RawInstant { instant, raw })
                .collect(),
            suspended,
        })
    }
}

/// Read the lock, its expiry, its fencing counter, its last run and up to `history` kept runs at
/// one instant.
pub fn snapshot(
    link: &mut Link,
    within: Duration,
    keys: &Keys,
    history: Option<u32>,
) -> Result<Snapshot, Unread> {
    let slot_keys = keys.slots(MAX_LIMIT);
    let mut all: Vec<&str> = vec![
        &keys.lock,
        &keys.fence,
        &keys.last,
        &keys.history,
        &keys.schedule,
        &keys.limit,
        &keys.fences,
        &keys.ledger,
        &keys.suspend,
    ];
    all.extend(slot_keys.iter().map(String::as_str));
    let reply: StatusReply = eval(
        link,
        within,
        &STATUS,
        &all,
        &[history.map_or(0, i64::from).to_string()],
        |v| StatusReply::read(v).ok_or_else(|| Failure::shape("a status reply of the wrong shape")),
    )
    .map_err(|failure| Unread {
        name: keys.name.clone(),
        failure,
    })?;
    Ok(snapshot_of(reply))
}

/// The snapshot `status.lua`'s reply says.
fn snapshot_of(reply: StatusReply) -> Snapshot {
    let mut ledger = reply.ledger;
    ledger.sort_by_key(|e| std::cmp::Reverse(e.instant));
    // acquire.lua trims in batches: the newest LEDGER_KEEP are the ledger.
    ledger.truncate(LEDGER_KEEP);
    Snapshot {
        holder: reply.holder,
        pttl: reply.pttl,
        fence: reply.fence,
        last_run: reply.last_run.as_deref().map(Stored::read),
        history: reply.history.iter().map(|r| Stored::read(r)).collect(),
        instant: reply.instant,
        schedule: reply.schedule,
        limit: reply.limit,
        slots: reply.slots,
        ledger: ledger
            .into_iter()
            .map(|l| LedgerInstant {
                instant: l.instant,
                entry: Stored::read(&l.raw),
            })
            .collect(),
        suspended: reply.suspended.as_deref().map(Stored::read),
    }
}

/// A lock that could not be read, and why: the failure keeps its kind and the server's code
/// (`WRONGTYPE`: a key under the prefix that is not a cronlock lock).
#[derive(Debug)]
pub struct Unread {
    pub name: String,
    pub failure: Failure,
}

impl std::fmt::Display for Unread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "cannot read lock '{}': {}", self.name, self.failure)
    }
}

impl std::error::Error for Unread {}

/// One lock as the masters see it.
pub struct Merged {
    /// The merged view: held when a majority holds the same value; the newest run record; the
    /// highest counter. With one master, its answer.
    pub view: Snapshot,
    /// Each master's own answer.
    pub each: Vec<Result<Snapshot, Unread>>,
}

/// One lock as the masters see it ([`Merged`]).
pub fn merge(snaps: Vec<Result<Snapshot, Unread>>, majority: usize) -> Result<Merged> {
    if snaps.len() == 1 {
        let mut snaps = snaps;
        let only = snaps.remove(0)?;
        return Ok(Merged {
            view: only.clone(),
            each: vec![Ok(only)],
        });
    }
    let ok: Vec<&Snapshot> = snaps.iter().filter_map(|s| s.as_ref().ok()).collect();
    if ok.len() < majority {
        let first = snaps
            .iter()
            .find_map(|s| s.as_ref().err())
            .map(|e| format!("{e:#}"))
            .unwrap_or_default();
        anyhow::bail!(
            "only {} of {} masters answered, {majority} needed ({first})",
            ok.len(),
            snaps.len()
        );
    }
    let holder = ok
        .iter()
        .filter_map(|s| s.holder.as_ref())
        .find(|h| ok.iter().filter(|s| s.holder.as_ref() == Some(*h)).count() >= majority)
        .cloned();
    let started = |s: &&&Snapshot| {
        s.last_run
            .as_ref()
            .and_then(Stored::ours)
            .and_then(|r| r.started)
            .unwrap_or(0)
    };
    let newest = ok.iter().max_by_key(started).expect("a majority answered");
    let merged = Snapshot {
        pttl: ok
            .iter()
            .filter(|s| holder.is_some() && s.holder == holder)
            .map(|s| s.pttl)
            .min()
            .unwrap_or(-2),
        holder,
        fence: ok.iter().filter_map(|s| s.fence).max(),
        last_run: newest.last_run.clone(),
        history: newest.history.clone(),
        instant: ok.iter().filter_map(|s| s.instant).max(),
        schedule: ok.iter().find_map(|s| s.schedule.clone()),
        // A --limit above 1 needs a single Redis: nothing to merge.
        limit: None,
        slots: Vec::new(),
        ledger: newest.ledger.clone(),
        // Suspended wherever one master says so, as an acquire reads it.
        suspended: ok.iter().find_map(|s| s.suspended.clone()),
    };
    Ok(Merged {
        view: merged,
        each: snaps,
    })
}
