//! The Redis lock itself: what a held lock is, and the Lua scripts that renew and release it
//! (taking it is `store/acquire.rs`; who holds it is [`Holder`], `store/holder.rs`).
//! Every write compares the holder value inside Lua, so cronlock never deletes or extends a lock it
//! does not own. The keys a KEY uses are [`Keys`] (`store/keys.rs`); what the admin modes read and
//! force is in `store/inspect.rs`.

use std::time::Duration;

use anyhow::Result;
use redis::Value;

use crate::clock::Instant;
pub use crate::store::holder::Holder;
use crate::store::keys::Keys;
use crate::store::overlap::Overlap;
use crate::store::script::{eval, eval_many, int, ms, Script, ScriptCall};
use crate::store::topology::{Failure, Link};

// The scripts, hashed at compile time: every call sends EVALSHA with the SHA1.
const RENEW_LUA: &str = include_str!("lua/renew.lua");
const RELEASE_LUA: &str = include_str!("lua/release.lua");
const ABANDON_LUA: &str = include_str!("lua/abandon.lua");
const RAISE_LUA: &str = concat!(include_str!("lua/fence.lua"), include_str!("lua/raise.lua"));
const RESTORE_LUA: &str = concat!(
    include_str!("lua/fence.lua"),
    include_str!("lua/restore.lua")
);

static RESTORE: Script = Script::new(RESTORE_LUA);
static RAISE: Script = Script::new(RAISE_LUA);
static RENEW: Script = Script::new(RENEW_LUA);
static RELEASE: Script = Script::new(RELEASE_LUA);

/// How long a release notification waits for a waiter before it expires.
pub const NOTIFY_TTL: Duration = Duration::from_secs(10);

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
    /// With `--schedule`: which attempt at the instant this is (1, 2, ... with `--retries`).
    pub attempt: u32,
    /// The instant is a manual one (`--trigger`), not the schedule's.
    pub manual: bool,
    /// `--overlap allow`: `keys.lock` is the instant's own lock ([`Keys::at`]).
    pub own_lock: bool,
    /// `--overlap replace`: a run this one replaced may still be stopping until then (unless
    /// `keys.replaced` names none first); the command must not start before.
    pub after: Option<Instant>,
    /// A scheduled instant's: when Redis's clock reaches it (`CLOCK_BOOTTIME`), from the
    /// acquire's reply; the command must not start before.
    pub due: Option<Instant>,
}

/// With `--schedule`: what the acquire script chooses the run's instant from.
#[derive(Debug, Clone)]
pub struct Instants {
    pub schedule: String,
    /// Instants (Unix ms) around the local clock; Redis takes the one nearest to its own.
    pub candidates: Vec<i64>,
    /// `--catch-up`: run the latest instant inside this window that has not run (None: the
    /// nearest instant only, once).
    pub catch_up: Option<Duration>,
    /// `--retries`: attempts after a failed or abandoned one.
    pub retries: u32,
    /// With `--catch-up`: instants before the candidates inside the window (newest first), for
    /// the ledger to call `missed`.
    pub earlier: Vec<i64>,
    /// How long the ledger lives (`--history-ttl`; None: no expiry).
    pub ledger_ttl: Option<Duration>,
    /// Which instant is asked for: the schedule's, a manual one (`--trigger`: the one
    /// candidate), or the one that waits (`--overlap queue`: no candidate).
    pub kind: InstantKind,
    /// `--overlap`: what an instant that finds the lock held does.
    pub overlap: Overlap,
}

/// Which instant an acquire asks for (`acquire.lua`'s ARGV[10]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InstantKind {
    /// One of the schedule's, chosen from the candidates.
    Scheduled,
    /// A manual instant (`--trigger`): the one candidate.
    Manual,
    /// The instant that waits under `--overlap queue`, if any.
    Queued,
}

impl InstantKind {
    pub fn word(self) -> &'static str {
        match self {
            InstantKind::Scheduled => "0",
            InstantKind::Manual => "1",
            InstantKind::Queued => "2",
        }
    }
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
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReleaseOptions {
    /// Keep the lock until then (`--min-hold`, on `CLOCK_BOOTTIME`) instead of deleting it: what
    /// is left of it when the release is carried out (a release tried again keeps it no longer).
    pub hold_until: Option<Instant>,
    /// The run record (JSON) to store as the last run.
    pub record: Option<String>,
    pub history: u32,
    pub record_ttl: Option<Duration>,
    /// With `--schedule`: how the attempt at its instant ended, for the ledger.
    pub ledger: Option<LedgerEnd>,
}

impl ReleaseOptions {
    /// What is left of `--min-hold` now, if anything.
    pub fn hold_left(&self) -> Option<Duration> {
        let left = self.hold_until?.saturating_duration_since(Instant::now());
        (!left.is_zero()).then_some(left)
    }
}

/// How an attempt at a scheduled instant ended, for the ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LedgerEnd {
    pub instant: i64,
    pub exit: u8,
    /// cronlock was asked to end (SIGTERM, SIGINT: a drain, a shutdown): a failure is then
    /// `interrupted`, which `--retries` runs again like an abandoned attempt.
    pub interrupted: bool,
}

/// What an undo does to the attempt's ledger entry (see `abandon.lua`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Undo {
    /// The claim never became a run: its attempt is removed and the instant can be claimed again
    /// (whoever undoes it answers for the instant).
    RollBack,
    /// The claim never became a run, and nobody here answers for its instant any more (the run's
    /// replica is gone, or drains): rolled back while the other replicas can still claim it (at
    /// most 200 ms after the instant of the schedule, by Redis's clock), else ended `interrupted`
    /// (they judged it decided by then).
    GiveBack,
    /// Its run died after its lock lapsed: the attempt is ended `abandoned`.
    Abandoned,
}

/// Undo an attempt that did not become a run (see `abandon.lua`): its reply was lost, a majority
/// did not grant it, or its run could not start. `Ok(true)` when it deleted our lock.
///
/// Sent as `EVAL` with the whole script: Redis is likely hung right now, and a `NOSCRIPT` reply
/// to an `EVALSHA` would arrive after we stopped listening, so the script would never run.
pub fn abandon(
    link: &mut Link,
    within: Duration,
    keys: &Keys,
    holder: &Holder,
    ttl: Duration,
    undo: Undo,
    slots: &[String],
) -> Result<bool, Failure> {
    let abandoned = keys.abandoned(&holder.token);
    let ttl = ms(ttl).to_string();
    let mode: &[u8] = match undo {
        Undo::RollBack => b"undo",
        Undo::GiveBack => b"give-back",
        Undo::Abandoned => b"abandoned",
    };
    let count = (5 + slots.len()).to_string();
    let mut args: Vec<&[u8]> = vec![
        b"EVAL",
        ABANDON_LUA.as_bytes(),
        count.as_bytes(),
        keys.lock.as_bytes(),
        abandoned.as_bytes(),
        keys.schedule.as_bytes(),
        keys.ledger.as_bytes(),
        keys.trigger.as_bytes(),
    ];
    args.extend(slots.iter().map(|s| s.as_bytes()));
    args.extend([
        holder.value.as_bytes(),
        ttl.as_bytes(),
        holder.token.as_bytes(),
        mode,
    ]);
    let reply = link.call(within, &keys.lock, &args)?;
    link.read(reply, |v| {
        Ok(int(v, "an undo reply that is not 0 or 1")? == 1)
    })
}

const CLAIMED_LUA: &str = include_str!("lua/claimed.lua");
static CLAIMED: Script = Script::new(CLAIMED_LUA);

/// A KEY's keys and one of its instants.
pub struct KeyInstant<'a> {
    pub keys: &'a Keys,
    pub instant: i64,
}

/// Which of `items` are decided already: their run started
/// or the ledger skipped or missed them (see `claimed.lua`). On one node, one call for all; on a
/// Cluster, one call for each (their keys live in different slots), as one pipeline.
pub fn claimed_many(
    link: &mut Link,
    within: Duration,
    items: &[KeyInstant<'_>],
) -> Vec<Result<bool, Failure>> {
    const SHAPE: &str = "a reply that is not one 0 or 1 for each instant";
    if items.is_empty() {
        return Vec::new();
    }
    if link.redis().one_node() {
        let ScriptCall { keys, args } = claimed_call(items);
        let read = |v: &Value| match v {
            Value::Array(a) if a.len() == items.len() => a
                .iter()
                .map(|x| Ok(int(x, SHAPE)? == 1))
                .collect::<Result<Vec<bool>, Failure>>(),
            _ => Err(Failure::shape(SHAPE)),
        };
        return match eval(link, within, &CLAIMED, &keys, &args, read) {
            Ok(all) => all.into_iter().map(Ok).collect(),
            Err(f) => items.iter().map(|_| Err(f.duplicate())).collect(),
        };
    }
    let calls: Vec<ScriptCall<'_>> = items.chunks(1).map(claimed_call).collect();
    let read = |v: &Value| match v {
        Value::Array(a) if a.len() == 1 => Ok(int(&a[0], SHAPE)? == 1),
        _ => Err(Failure::shape(SHAPE)),
    };
    eval_many(link, within, &CLAIMED, &calls, read)
}

/// `claimed.lua`'s keys (each KEY's schedule record and ledger) and arguments (the instants).
fn claimed_call<'a>(items: &[KeyInstant<'a>]) -> ScriptCall<'a> {
    let keys = items
        .iter()
        .flat_map(|i| [i.keys.schedule.as_str(), i.keys.ledger.as_str()])
        .collect();
    ScriptCall {
        keys,
        args: items.iter().map(|i| i.instant.to_string()).collect(),
    }
}

/// Extend our lock to `ttl` from now if it is still ours: `Ok(true)` ours, `Ok(false)` not ours.
/// Any other reply (`+OK`, RESP3 `#t`, a string) is a failure: the renewal is not confirmed.
pub fn renew(link: &mut Link, within: Duration, held: &Held) -> Result<bool, Failure> {
    let ScriptCall { keys, args } = renew_call(held);
    eval(link, within, &RENEW, &keys, &args, renewed)
}

/// [`renew`] for several locks at once, as one pipeline: each one's answer, in order.
pub fn renew_many(
    link: &mut Link,
    within: Duration,
    helds: &[&Held],
) -> Vec<Result<bool, Failure>> {
    let calls: Vec<ScriptCall<'_>> = helds.iter().map(|held| renew_call(held)).collect();
    eval_many(link, within, &RENEW, &calls, renewed)
}

/// `renew.lua`'s keys and arguments for `held`: with `--limit` above 1, our slot and the limit
/// record, kept alive as long as a slot.
fn renew_call(held: &Held) -> ScriptCall<'_> {
    let ttl = ms(held.ttl).to_string();
    if held.limit > 1 {
        ScriptCall {
            keys: vec![held.keys.lock.as_str(), held.keys.limit.as_str()],
            args: vec![held.holder.value.clone(), ttl, held.limit.to_string()],
        }
    } else {
        ScriptCall {
            keys: vec![held.keys.lock.as_str()],
            args: vec![held.holder.value.clone(), ttl],
        }
    }
}

/// A renewal's reply, read.
fn renewed(v: &Value) -> Result<bool, Failure> {
    match int(v, "a renewal reply that is not 0 or 1")? {
        1 => Ok(true),
        0 => Ok(false),
        _ => Err(Failure::shape("a renewal reply that is not 0 or 1")),
    }
}

const REPLACED_LUA: &str = include_str!("lua/replaced.lua");
static REPLACED: Script = Script::new(REPLACED_LUA);

/// `--overlap replace`: how many runs replaced may still be stopping (`replaced.lua`).
pub fn replaced_left(link: &mut Link, within: Duration, keys: &Keys) -> Result<u64, Failure> {
    let read = |v: &Value| {
        u64::try_from(int(v, "a count that is not a number")?)
            .map_err(|_| Failure::shape("a count below 0"))
    };
    eval(link, within, &REPLACED, &[&keys.replaced], &[], read)
}

const MISSED_LUA: &str = concat!(
    include_str!("lua/suspension.lua"),
    include_str!("lua/missed.lua")
);
static MISSED: Script = Script::new(MISSED_LUA);

/// Record instant `at` of `keys`'s KEY as missed in its ledger, for `reason` (a word), unless the
/// ledger has it already; whether it wrote.
pub fn record_missed(
    link: &mut Link,
    within: Duration,
    keys: &Keys,
    at: i64,
    reason: &str,
) -> Result<bool, Failure> {
    let read = |v: &Value| match int(v, "a missed reply that is not 0 or 1")? {
        1 => Ok(true),
        0 => Ok(false),
        _ => Err(Failure::shape("a missed reply that is not 0 or 1")),
    };
    let keys = [keys.ledger.as_str(), keys.suspend.as_str()];
    eval(
        link,
        within,
        &MISSED,
        &keys,
        &[at.to_string(), reason.to_string()],
        read,
    )
}

/// Several masters: raise the fencing counter to `held.fence` while the lock is ours there
/// (`Ok(false)`: not ours).
pub fn raise(link: &mut Link, within: Duration, held: &Held) -> Result<bool, Failure> {
    eval(
        link,
        within,
        &RAISE,
        &[&held.keys.lock, &held.keys.fence],
        &[held.holder.value.clone(), held.fence.to_string()],
        |v| Ok(int(v, "a fencing reply that is not 0 or 1")? == 1),
    )
}

/// Several masters: write our lock (and our fencing token) back on a master that lost it, where
/// it is missing or ours: `Ok(false)` when another holds it there.
pub fn restore(link: &mut Link, within: Duration, held: &Held) -> Result<bool, Failure> {
    eval(
        link,
        within,
        &RESTORE,
        &[&held.keys.lock, &held.keys.fence],
        &[
            held.holder.value.clone(),
            ms(held.ttl).to_string(),
            held.fence.to_string(),
        ],
        |v| Ok(int(v, "a restore reply that is not 0 or 1")? == 1),
    )
}

/// Delete (or, for `--min-hold`, shorten) our lock if it is still ours, and record the run.
pub fn release(
    link: &mut Link,
    within: Duration,
    held: &Held,
    opts: &ReleaseOptions,
) -> Result<Released, Failure> {
    let ReleaseCall { keys, args } = release_call(held, opts);
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    eval(link, within, &RELEASE, &keys, &args, released)
}

/// [`release`] for several locks at once, as one pipeline: each one's outcome, in order.
pub fn release_many(
    link: &mut Link,
    within: Duration,
    items: &[(&Held, &ReleaseOptions)],
) -> Vec<Result<Released, Failure>> {
    let calls: Vec<ReleaseCall> = items
        .iter()
        .map(|(held, opts)| release_call(held, opts))
        .collect();
    let calls: Vec<ScriptCall<'_>> = calls
        .iter()
        .map(|c| ScriptCall {
            keys: c.keys.iter().map(String::as_str).collect(),
            args: c.args.clone(),
        })
        .collect();
    eval_many(link, within, &RELEASE, &calls, released)
}

/// `release.lua`'s keys and arguments for a lock (owned: a slot's keys are made here).
struct ReleaseCall {
    keys: Vec<String>,
    args: Vec<String>,
}

/// `release.lua`'s keys and arguments for `held`.
fn release_call(held: &Held, opts: &ReleaseOptions) -> ReleaseCall {
    let keys = &held.keys;
    let hold = opts.hold_left().map_or(0, ms);
    let mut all: Vec<String> = vec![
        keys.lock.clone(),
        keys.last.clone(),
        keys.history.clone(),
        keys.notify.clone(),
        keys.ledger.clone(),
        keys.replaced.clone(),
    ];
    if held.limit > 1 {
        all.push(keys.limit.clone());
        all.extend(keys.slots(held.limit));
    }
    let args = vec![
        held.holder.value.clone(),
        hold.to_string(),
        opts.record.clone().unwrap_or_default(),
        opts.history.to_string(),
        opts.record_ttl.map_or(0, ms).to_string(),
        ms(NOTIFY_TTL).to_string(),
        opts.ledger.map_or(String::new(), |l| l.instant.to_string()),
        opts.ledger.map_or(0, |l| l.exit).to_string(),
        if opts.ledger.is_some_and(|l| l.interrupted) {
            "1"
        } else {
            "0"
        }
        .to_string(),
        held.holder.quoted(),
    ];
    ReleaseCall { keys: all, args }
}

/// A release's reply, read.
fn released(v: &Value) -> Result<Released, Failure> {
    match int(v, "a release reply that is not 0, 1 or 2")? {
        1 => Ok(Released::Deleted),
        2 => Ok(Released::Kept),
        0 => Ok(Released::NotOurs),
        _ => Err(Failure::shape("a release reply that is not 0, 1 or 2")),
    }
}
