//! Getting the lock: one attempt, or, with `--wait`, a fast handoff from the releasing holder.
//!
//! A release pushes one element to the KEY's notify list; waiters block on it with `BLPOP`, so one
//! of them wakes within a round trip and takes the lock. Each `BLPOP` is bounded by the holder's
//! remaining expiry (a crashed holder is noticed when its lock expires), by what is left of
//! `--wait`, and by a short jittered cap, so a lost notification costs at most one poll and signals
//! (checked between polls) end the wait promptly. No lock is taken, and the command never runs,
//! when the wait ends without it.

use std::time::Duration;

use anyhow::{anyhow, Result};

use crate::clock::Instant;
use crate::duration::Span;
use crate::log::Log;
use crate::record::suspension::Suspension;
use crate::record::Stored;
use crate::signals;
use crate::store::acquire::Acquire;
use crate::store::acquire::AcquireOutcome;
use crate::store::keys::Keys;
use crate::store::lock::{self, Held, Holder};
use crate::store::quorum::{Masters, Refused};

/// The longest a waiter blocks between attempts.
const POLL_CAP: Duration = Duration::from_millis(500);

/// The furthest ahead of Redis's clock an instant may be for this host to wait for it (its clock
/// runs fast, or it fired early): further, the run does not start ([`Acquired::NotDue`]).
pub const EARLY_WAIT: Duration = Duration::from_secs(60);

/// The result of trying to get the lock.
pub enum Acquired {
    /// Ours (the masters' links that took it are the caller's: the watchdog goes on with them).
    Held(Box<Held>),
    /// Held elsewhere, and `--wait` (if any) ran out: who holds it (the raw value), and when the
    /// holder's lock expires unless renewed (None: no expiry).
    Busy {
        holder: String,
        expires_in: Option<Duration>,
    },
    /// A signal asked us to stop before we had the lock.
    Signalled(libc::c_int),
    /// With `--schedule`: the run for this instant already started (the recorded instant).
    AlreadyRan { instant: i64, ran: i64 },
    /// KEY is suspended (`--suspend`): the record (who, since when, why); no wait outlasts it.
    Suspended {
        record: Stored<Suspension>,
        instant: Option<i64>,
    },
    /// With `--schedule`: the instant this host fired for is further ahead of Redis's clock than
    /// [`EARLY_WAIT`] (this host's clock runs fast).
    NotDue { instant: i64, ahead: Duration },
}

/// A random duration in `[d/2, d]`, so waiters on many hosts do not poll in step.
fn jitter(d: Duration) -> Duration {
    let r = (uuid::Uuid::new_v4().as_u128() % 1024) as u32;
    d / 2 + d / 2 * r / 1024
}

/// Sleep `d` unless a forwarded signal comes first; returns it.
fn pause(d: Duration) -> Option<libc::c_int> {
    let end = Instant::now() + d;
    let set = signals::SigSet::of(signals::forwarded());
    loop {
        let left = end.saturating_duration_since(Instant::now());
        match signals::wait(&set, left) {
            None => return None,
            Some(sig) if signals::is_stop(sig) || sig == libc::SIGCONT || sig == libc::SIGWINCH => {
            }
            Some(sig) => return Some(sig),
        }
        if left.is_zero() {
            return None;
        }
    }
}

/// How a run asks for the lock.
pub struct AcquireRequest {
    pub ttl: Duration,
    /// `--wait` (zero: one attempt).
    pub wait: Duration,
    /// With `--schedule`: the instants to choose from.
    pub instants: Option<lock::Instants>,
    /// `--limit`.
    pub limit: u32,
}

/// Try to take the lock, waiting up to `wait` for it. While waiting, transient errors (Redis
/// restarting or loading, a timeout, a dropped connection) are retried on a new connection.
///
/// With a `slot`, the first answer fixes the run's instant: a waiter stays with the instant it
/// fired for, and skips when another host ran that one meanwhile.
pub fn acquire(
    masters: &mut Masters,
    keys: &Keys,
    command: &str,
    ask: AcquireRequest,
    log: &Log,
) -> Result<Acquired> {
    let AcquireRequest {
        ttl,
        wait,
        mut instants,
        limit,
    } = ask;
    let io_timeout = masters.redis().connect_timeout;
    let mut early_waits = 0;
    let mut waiter = Waiter {
        deadline: Instant::now() + wait,
        wait,
        keys,
        log,
        announced: false,
        trouble_told: false,
    };
    loop {
        if let Some(sig) = signals::pending_forwarded() {
            return Ok(Acquired::Signalled(sig));
        }
        // A fresh holder per attempt, so `started` says when we got it.
        let holder = Holder::new(command);
        let ask = Acquire {
            keys,
            holder: &holder,
            ttl,
            instants: instants.as_ref(),
            limit,
        };
        let (expires_in, busy_with) = match masters.acquire(io_timeout, ask) {
            Ok(AcquireOutcome::Held(held)) => return Ok(Acquired::Held(held)),
            Ok(AcquireOutcome::Mismatch(other)) => {
                return Err(anyhow!(
                    "lock '{}' is held with --limit {other} by its current holders, and this \
                         run has --limit {limit} (every host must give the same --limit); not \
                         running the command",
                    keys.name
                ))
            }
            Ok(AcquireOutcome::AlreadyRan { instant, ran, .. }) => {
                return Ok(Acquired::AlreadyRan { instant, ran })
            }
            Ok(AcquireOutcome::Suspended { record, instant }) => {
                return Ok(Acquired::Suspended { record, instant })
            }
            // Not yet due by Redis's clock: wait for it (answering signals) and ask for that
            // instant then; twice at most (Redis's clock does not go back).
            Ok(AcquireOutcome::Early { instant, ahead }) => {
                if ahead > EARLY_WAIT || early_waits >= 2 {
                    return Ok(Acquired::NotDue { instant, ahead });
                }
                early_waits += 1;
                waiter.early(instant, ahead);
                if let Some(s) = instants.as_mut() {
                    s.candidates = vec![instant];
                }
                match pause(ahead) {
                    Some(sig) => return Ok(Acquired::Signalled(sig)),
                    None => continue,
                }
            }
            Ok(AcquireOutcome::Busy {
                expires_in,
                holder: value,
                instant,
            }) => {
                if let (Some(s), Some(i)) = (instants.as_mut(), instant) {
                    s.candidates = vec![i];
                }
                (expires_in, value)
            }
            Err(Refused { text, transient }) => {
                if !transient {
                    return Err(anyhow!(text));
                }
                match waiter.retry(anyhow!(text))? {
                    Some(sig) => return Ok(Acquired::Signalled(sig)),
                    None => continue,
                }
            }
        };
        let now = Instant::now();
        if now >= waiter.deadline {
            return Ok(Acquired::Busy {
                holder: busy_with,
                expires_in,
            });
        }
        waiter.announce();
        if let Some(sig) = waiter.until_free(masters, now, expires_in)? {
            return Ok(Acquired::Signalled(sig));
        }
    }
}

/// One `--wait`: its deadline, and what it has told already.
struct Waiter<'a> {
    deadline: Instant,
    wait: Duration,
    keys: &'a Keys,
    log: &'a Log,
    announced: bool,
    trouble_told: bool,
}

impl Waiter<'_> {
    /// Transient trouble is retried while `--wait` lasts (said once); the last error is what we
    /// report. A signal that came during the pause ends the wait.
    fn retry(&mut self, e: anyhow::Error) -> Result<Option<libc::c_int>> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(e);
        }
        if !self.trouble_told {
            self.trouble_told = true;
            self.log
                .info("wait_retry", &format!("{e:#}; retrying while waiting"), &[]);
        }
        Ok(pause(jitter(POLL_CAP).min(left)))
    }

    /// The instant is `ahead` of Redis's clock: waiting for it.
    fn early(&self, instant: i64, ahead: Duration) {
        let ahead = Duration::from_millis(ahead.as_millis() as u64);
        // A second or more: this host's clock is off, or it fired far from the instant.
        let level = if ahead >= Duration::from_secs(1) {
            crate::log::Level::Warn
        } else {
            crate::log::Level::Info
        };
        self.log.event(
            level,
            "waiting_for_instant",
            &format!(
                "lock '{}': the {} instant is {} ahead of redis's clock (this host's clock runs \
                 fast, or it fired early); waiting for it",
                self.keys.name,
                crate::clock::rfc3339(instant.max(0) as u64),
                Span(ahead)
            ),
            &[
                ("instant", instant.into()),
                ("ahead_ms", (ahead.as_millis() as u64).into()),
            ],
        );
    }

    /// "lock 'KEY' is held elsewhere; waiting up to D", once.
    fn announce(&mut self) {
        if self.announced {
            return;
        }
        self.announced = true;
        self.log.info(
            "waiting",
            &format!(
                "lock '{}' is held elsewhere; waiting up to {}",
                self.keys.name,
                Span(self.wait)
            ),
            &[("wait_ms", (self.wait.as_millis() as u64).into())],
        );
    }

    /// Block (from `now`, before the deadline) until the lock may be free: told by the holder's
    /// release, its expiry (`expires_in`), or the next poll. A signal that came meanwhile ends
    /// the wait.
    fn until_free(
        &mut self,
        masters: &mut Masters,
        now: Instant,
        expires_in: Option<Duration>,
    ) -> Result<Option<libc::c_int>> {
        let name = &self.keys.name;
        let mut block = jitter(POLL_CAP).min(self.deadline - now);
        if let Some(left) = expires_in {
            block = block.min(left + Duration::from_millis(1));
        }
        // Woken or timed out, the next step is the same: try again. With several masters,
        // waiters poll.
        match masters.blpop(self.keys, block) {
            None => Ok(pause(block)),
            Some(Ok(())) => Ok(None),
            // Refused for good (an ACL without BLPOP, say): waiting longer cannot help.
            Some(Err(e)) if !e.transient() => Err(anyhow!("cannot wait for lock '{name}': {e}")),
            // The connection is gone or out of step: the next round makes a new one.
            Some(Err(e)) => self.retry(anyhow!("cannot wait for lock '{name}': {e}")),
        }
    }
}
