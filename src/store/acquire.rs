//! Taking the lock: one acquisition attempt (`acquire.lua`, or `semaphore.lua` with `--limit`
//! above 1), and its reply read to the letter: a grant, busy, already ran, suspended, another
//! `--limit`, or an instant not yet due by Redis's clock. Anything but the exact shape is a
//! failure, never a grant.

use std::time::Duration;

use redis::Value;

use crate::clock::Instant;
use crate::record::suspension::Suspension;
use crate::record::Stored;
use crate::store::keys::Keys;
use crate::store::lock::{Held, Holder, InstantKind, Instants};
use crate::store::overlap::Overlap;
use crate::store::script::{eval, eval_many, int, ms, text_or_nil, Script, ScriptCall};
use crate::store::topology::{Failure, Link};

// Hashed at compile time: every call sends EVALSHA with the SHA1.
const ACQUIRE_LUA: &str = concat!(
    include_str!("lua/fence.lua"),
    include_str!("lua/suspension.lua"),
    include_str!("lua/newest.lua"),
    include_str!("lua/acquire.lua")
);
const SEMAPHORE_LUA: &str = concat!(
    include_str!("lua/fence.lua"),
    include_str!("lua/suspension.lua"),
    include_str!("lua/semaphore.lua")
);
static ACQUIRE: Script = Script::new(ACQUIRE_LUA);
static SEMAPHORE: Script = Script::new(SEMAPHORE_LUA);

/// One acquisition attempt, within `within` (connecting included). An error whose
/// [`Failure::maybe_ran`] holds may have taken the lock: see [`crate::store::lock::abandon`].
pub fn try_acquire(
    link: &mut Link,
    within: Duration,
    ask: Acquire<'_>,
) -> Result<AcquireOutcome, Failure> {
    let Acquire {
        keys,
        holder,
        ttl,
        instants,
        limit,
    } = ask;
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
            &keys.suspend,
        ];
        all.extend(slots.iter().map(String::as_str));
        eval(
            link,
            within,
            &SEMAPHORE,
            &all,
            &[holder.value.clone(), ms(ttl).to_string(), limit.to_string()],
            acquire_reply,
        )?
    } else {
        let ScriptCall { keys, args } = plain_call(keys, holder, ttl, instants, &abandoned);
        eval(link, within, &ACQUIRE, &keys, &args, acquire_reply)?
    };
    let clock = RedisRead {
        redis_ms: reply.redis_ms,
        by: Instant::now(),
    };
    attempt(link, reply, ask, sent_at, clock)
}

/// Redis's clock as a reply told it (Unix ms; 0: not read), and a time on `CLOCK_BOOTTIME` it
/// was read by (the reply had come): Redis's clock reads `redis_ms` no later than `by`.
#[derive(Debug, Clone, Copy)]
struct RedisRead {
    redis_ms: i64,
    by: Instant,
}

/// One attempt's outcome.
#[derive(Debug)]
pub enum AcquireOutcome {
    Held(Box<Held>),
    /// Held elsewhere.
    Busy {
        /// When the holder's lock expires (None: no expiry set).
        expires_in: Option<Duration>,
        /// The holder's value.
        holder: String,
        /// With a schedule, the instant this attempt was for.
        instant: Option<i64>,
    },
    /// The run for this instant already started (at `ran`, the recorded instant); `holder`: the
    /// lock's value, while it is held (by that run, or by a contender's grant not yet decided).
    AlreadyRan {
        instant: i64,
        ran: i64,
        holder: Option<String>,
    },
    /// The current holders hold KEY with this other `--limit`: refused, nothing touched.
    Mismatch(u32),
    /// KEY is suspended (`--suspend`): the suspension record, and (with a schedule) the instant
    /// this attempt was for, now recorded `skipped`.
    Suspended {
        record: Stored<Suspension>,
        instant: Option<i64>,
    },
    /// The instant of the schedule is `ahead` of Redis's clock (by more than `acquire.lua`'s
    /// `AHEAD`, 250 ms): nothing was taken or written; ask again once it is due.
    Early {
        instant: i64,
        ahead: Duration,
    },
}

/// One acquire: KEY's keys, the holder value, the TTL, with `--schedule` the instants to choose
/// from, and the `--limit` (1: the plain lock).
#[derive(Debug, Clone, Copy)]
pub struct Acquire<'a> {
    pub keys: &'a Keys,
    pub holder: &'a Holder,
    pub ttl: Duration,
    pub instants: Option<&'a Instants>,
    pub limit: u32,
}

impl<'a> Acquire<'a> {
    /// The same acquire under another holder value.
    pub fn by(self, holder: &'a Holder) -> Acquire<'a> {
        Acquire { holder, ..self }
    }
}

/// [`try_acquire`] for several plain locks (`--limit 1`) at once, as one pipeline: each one's
/// attempt, in order.
pub fn try_acquire_many(
    link: &mut Link,
    within: Duration,
    claims: &[Acquire<'_>],
) -> Vec<Result<AcquireOutcome, Failure>> {
    let sent_at = Instant::now();
    let abandoned: Vec<String> = claims
        .iter()
        .map(|c| c.keys.abandoned(&c.holder.token))
        .collect();
    let calls: Vec<_> = claims
        .iter()
        .zip(&abandoned)
        .map(|(c, gone)| plain_call(c.keys, c.holder, c.ttl, c.instants, gone))
        .collect();
    let replies = eval_many(link, within, &ACQUIRE, &calls, acquire_reply);
    // The pipeline's latest reading of Redis's clock (its last script's) is the closest to when
    // the replies came: every claim's instant is timed from it.
    let clock = RedisRead {
        redis_ms: replies
            .iter()
            .filter_map(|r| r.as_ref().ok().map(|r| r.redis_ms))
            .max()
            .unwrap_or(0),
        by: Instant::now(),
    };
    replies
        .into_iter()
        .zip(claims)
        .map(|(reply, ask)| attempt(link, reply?, *ask, sent_at, clock))
        .collect()
}

/// What an acquire's reply says: a grant (sent at `sent_at`; its instant due by Redis's clock as
/// `clock` read it), busy, already ran, suspended, not yet due, or another `--limit`.
fn attempt(
    link: &mut Link,
    reply: AcquireReply,
    ask: Acquire<'_>,
    sent_at: Instant,
    clock: RedisRead,
) -> Result<AcquireOutcome, Failure> {
    let Acquire {
        keys,
        holder,
        ttl,
        limit,
        instants,
    } = ask;
    if reply.other_limit != 0 {
        return Ok(AcquireOutcome::Mismatch(
            reply.other_limit.clamp(0, i64::from(u32::MAX)) as u32,
        ));
    }
    let instant = (reply.instant != 0).then_some(reply.instant);
    if let Some(record) = reply.suspension {
        return Ok(AcquireOutcome::Suspended {
            record: Stored::read(&record),
            instant,
        });
    }
    if reply.ahead_ms > 0 {
        return Ok(AcquireOutcome::Early {
            instant: reply.instant,
            ahead: Duration::from_millis(reply.ahead_ms as u64),
        });
    }
    if reply.ran != 0 {
        return Ok(AcquireOutcome::AlreadyRan {
            instant: instant.unwrap_or(reply.ran),
            ran: reply.ran,
            holder: reply.holder,
        });
    }
    if reply.fence <= 0 {
        let left = u64::try_from(reply.pttl).ok().map(Duration::from_millis);
        return Ok(AcquireOutcome::Busy {
            expires_in: left,
            holder: reply.holder.unwrap_or_default(),
            instant,
        });
    }
    // A grant names its slot (0 for the plain lock): a broken server, never a lock, otherwise.
    let Ok(slot) = u32::try_from(reply.slot) else {
        link.distrust();
        return Err(Failure::shape(
            "an acquire reply that is not {fence, pttl, holder, instant, ran, slot, limit}",
        ));
    };
    let overlap = instants.map_or(Overlap::Skip, |s| s.overlap);
    let own_lock = overlap.at_once().is_some() && instant.is_some();
    let keys = keys.clone().held(limit, slot, instant.filter(|_| own_lock));
    // Measured from the reply, which came after the script ran: never shorter than Redis's.
    let after = u64::try_from(reply.after_ms)
        .ok()
        .filter(|ms| *ms > 0)
        .map(|ms| Instant::now() + Duration::from_millis(ms));
    let manual = instants.is_some_and(|s| s.kind == InstantKind::Manual);
    // A scheduled instant comes when Redis's clock reaches it (maybe past): measured from the
    // reply, which came after Redis read its clock, so never early. (A manual instant is a
    // label: it runs now.)
    let due = instant
        .filter(|_| !manual && clock.redis_ms > 0)
        .and_then(|at| {
            let now = clock.by;
            let ms = at - clock.redis_ms;
            match u64::try_from(ms) {
                Ok(ahead) => Some(now + Duration::from_millis(ahead)),
                Err(_) => now.checked_sub(Duration::from_millis(ms.unsigned_abs())),
            }
        });
    Ok(AcquireOutcome::Held(Box::new(Held {
        keys,
        holder: holder.clone(),
        fence: reply.fence,
        ttl,
        sent_at,
        instant,
        limit,
        slot,
        attempt: reply.attempt.clamp(1, i64::from(u32::MAX)) as u32,
        manual,
        own_lock,
        after,
        due,
    })))
}

/// An acquire's reply, read (`acquire.lua` and `semaphore.lua` say what each element means).
struct AcquireReply {
    /// The fencing token when taken, else 0.
    fence: i64,
    /// Busy: ms until the holder's lock expires.
    pttl: i64,
    /// Busy: the holder's value.
    holder: Option<String>,
    instant: i64,
    /// The instant recorded as run already (0: none).
    ran: i64,
    slot: i64,
    /// The current holders' other `--limit` (0: none).
    other_limit: i64,
    attempt: i64,
    /// The suspension record, while KEY is suspended.
    suspension: Option<String>,
    /// `--overlap replace`: how long a run replaced may still be stopping, in ms.
    after_ms: i64,
    /// Redis's clock when the script read it (Unix ms; 0: it did not).
    redis_ms: i64,
    /// The instant is this far ahead of Redis's clock, and was not taken (ms; 0: not early).
    ahead_ms: i64,
}

/// Read an acquire's reply; anything but its exact shape is a failure, never an answer.
fn acquire_reply(reply: &Value) -> Result<AcquireReply, Failure> {
    const SHAPE: &str = "an acquire reply that is not {fence, pttl, holder, instant, ran, slot, \
                         limit, attempt, suspension, after, clock, ahead}";
    let Value::Array(parts) = reply else {
        return Err(Failure::shape(SHAPE));
    };
    let [fence, pttl, value, instant, ran, got, other, attempt, suspended, after, clock, ahead] =
        parts.as_slice()
    else {
        return Err(Failure::shape(SHAPE));
    };
    // The token comes as a decimal string (exact), 0 when none was handed out.
    let fence = match fence {
        Value::BulkString(digits) => std::str::from_utf8(digits)
            .ok()
            .and_then(|d| d.parse::<i64>().ok())
            .filter(|t| *t > 0)
            .ok_or_else(|| Failure::shape(SHAPE))?,
        other => int(other, SHAPE)?,
    };
    Ok(AcquireReply {
        fence,
        pttl: int(pttl, SHAPE)?,
        holder: text_or_nil(value, SHAPE)?,
        instant: int(instant, SHAPE)?,
        ran: int(ran, SHAPE)?,
        slot: int(got, SHAPE)?,
        other_limit: int(other, SHAPE)?,
        attempt: int(attempt, SHAPE)?,
        suspension: text_or_nil(suspended, SHAPE)?,
        after_ms: int(after, SHAPE)?,
        redis_ms: int(clock, SHAPE)?,
        ahead_ms: int(ahead, SHAPE)?,
    })
}

/// The plain lock's acquire (`acquire.lua`): its keys and arguments.
fn plain_call<'a>(
    keys: &'a Keys,
    holder: &Holder,
    ttl: Duration,
    instants: Option<&Instants>,
    abandoned: &'a str,
) -> ScriptCall<'a> {
    let window = instants.and_then(|s| s.catch_up).map_or(0, ms);
    let mut args = vec![
        holder.value.clone(),
        ms(ttl).to_string(),
        instants.map_or(String::new(), |s| s.schedule.clone()),
        window.to_string(),
        instants.map_or(0, |s| s.retries).to_string(),
        instants
            .and_then(|s| s.ledger_ttl)
            .map_or(0, ms)
            .to_string(),
        instants.map_or(0, |s| s.candidates.len()).to_string(),
        holder.quoted(),
        holder.attempt_members(),
        instants
            .map_or(InstantKind::Scheduled, |s| s.kind)
            .word()
            .to_string(),
        instants
            .map_or(Overlap::Skip, |s| s.overlap)
            .word()
            .to_string(),
        instants
            .and_then(|s| s.overlap.at_once())
            .unwrap_or(1)
            .to_string(),
    ];
    if let Some(s) = instants {
        args.extend(s.candidates.iter().chain(&s.earlier).map(i64::to_string));
    }
    let keys = vec![
        keys.lock.as_str(),
        &keys.fence,
        abandoned,
        &keys.schedule,
        &keys.limit,
        &keys.ledger,
        &keys.suspend,
        &keys.trigger,
        &keys.replaced,
        &keys.running,
    ];
    ScriptCall { keys, args }
}
