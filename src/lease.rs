//! The lease: how long the lock is ours, on our monotonic clock ([`crate::clock`], which counts
//! system suspend). [`Timing`] follows from `--ttl` and `--grace`; [`Validity`] is the one shared
//! view of "valid until" (or lost, and why) that the renewal thread moves on, the lock's watch
//! shortens, and the supervising loop acts on.
//!
//! It exists beneath both the store and the job so that neither needs the other, nor the
//! watchdog above them, to know whether the lock still holds. It publishes the guard's kill-by
//! time through a function it is given (the guard's page lives in [`crate::command`]), and it wakes
//! the main thread through [`crate::signals`].

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Result};

use crate::clock::Instant;
use crate::duration::Span;

/// The shortest TTL that leaves room to renew, terminate and kill before expiry.
pub const MIN_TTL: Duration = Duration::from_millis(250);
/// Default grace between SIGTERM and SIGKILL (shortened for short TTLs when not given).
pub const DEFAULT_GRACE: Duration = Duration::from_secs(5);

/// The timing that follows from `--ttl` and `--grace`.
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize)]
pub struct Timing {
    pub ttl: Duration,
    pub grace: Duration,
    /// Kept between the SIGKILL and the lock's expiry, for clock-rate differences between us and
    /// Redis and for the kill to take effect.
    pub margin: Duration,
    /// Between renewals.
    pub interval: Duration,
}

impl Timing {
    /// Check `--ttl` and `--grace` together. Without `--grace`, it defaults to 5s, shortened to a
    /// quarter of the TTL when the TTL is short; an explicit `--grace` over half the TTL is refused.
    pub fn new(ttl: Duration, grace: Option<Duration>) -> Result<Timing> {
        if ttl < MIN_TTL {
            bail!(
                "--ttl {} is too short: it must be at least {} so the lock can be renewed and the \
                 command stopped before it expires",
                Span(ttl),
                Span(MIN_TTL)
            );
        }
        let grace = match grace {
            Some(g) if g > ttl / 2 => bail!(
                "--grace {} must be at most half of --ttl {}: the command must be gone before the \
                 lock can expire",
                Span(g),
                Span(ttl)
            ),
            Some(g) => g,
            None => DEFAULT_GRACE.min(ttl / 4),
        };
        let margin = Duration::from_millis(50) + ttl / 100;
        // From a confirmed renewal to the moment a feared loss sends SIGTERM: renew at least three
        // times in that window, so two failures in a row are survivable.
        let window = ttl - grace - margin;
        let interval = (ttl / 3).min(window / 3);
        Ok(Timing {
            ttl,
            grace,
            margin,
            interval,
        })
    }
}

/// What the main thread needs to know about the lock.
#[derive(Debug, Clone)]
pub enum LockState {
    Valid {
        until: Instant,
    },
    /// Lost, or feared lost; `until` is still the last moment the lock was known valid, so the
    /// command is killed by then at the latest.
    Lost {
        reason: String,
        until: Instant,
    },
}

#[derive(Debug)]
struct Inner {
    valid_until: Instant,
    lost: Option<String>,
    last_error: Option<String>,
    /// Something suggests the lock may be gone ([`crate::store::tracking`]): renew now, not at the next
    /// interval.
    renew_now: bool,
}

/// Where the guard's kill-by time goes each time it moves (the guard's shared page).
pub type Publish = Arc<dyn Fn(Instant) + Send + Sync>;

/// The shared view of the lock's validity; every move of it is published as the guard's kill-by
/// time ([`kill_by`]).
#[derive(Clone)]
pub struct Validity {
    inner: Arc<Mutex<Inner>>,
    publish: Publish,
    pub margin: Duration,
}

impl Validity {
    /// Validity starts at `valid_until`. The guard's kill-by time follows it, half a margin
    /// earlier: after cronlock's own SIGKILL (a whole margin early), so a live cronlock acts
    /// first, yet still before the lock can expire.
    /// `publish` has already been told [`kill_by`]`(valid_until, margin)`.
    pub fn new(valid_until: Instant, margin: Duration, publish: Publish) -> Validity {
        Validity {
            inner: Arc::new(Mutex::new(Inner {
                valid_until,
                lost: None,
                last_error: None,
                renew_now: false,
            })),
            publish,
            margin,
        }
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A poisoned lock still holds plain data worth reading.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn state(&self) -> LockState {
        let inner = self.inner();
        match &inner.lost {
            Some(reason) => LockState::Lost {
                reason: reason.clone(),
                until: inner.valid_until,
            },
            None => LockState::Valid {
                until: inner.valid_until,
            },
        }
    }

    pub fn is_lost(&self) -> bool {
        self.inner().lost.is_some()
    }

    pub fn last_error(&self) -> Option<String> {
        self.inner().last_error.clone()
    }

    pub fn valid_until(&self) -> Instant {
        self.inner().valid_until
    }

    /// A renewal sent at `sent` was confirmed: the lock is valid until `sent + ttl`. Never once
    /// it is lost (a renewal heard late must not delay the kill).
    pub fn confirm(&self, until: Instant) {
        let mut inner = self.inner();
        if inner.lost.is_none() && until > inner.valid_until {
            inner.valid_until = until;
            (self.publish)(kill_by(until, self.margin));
        }
    }

    /// Why the last renewal failed, for the line that says the lock is lost.
    pub fn set_last_error(&self, error: String) {
        self.inner().last_error = Some(error);
    }

    /// Ask for a renewal now: the lock may be gone (deleted, flushed, evicted) or the connection
    /// that watches it broke. Only the renewal decides; this only shortens the time to notice.
    pub fn renew_now(&self) {
        self.inner().renew_now = true;
        crate::signals::wake_main();
    }

    /// Whether a renewal was asked for since the last call.
    pub fn take_renew_now(&self) -> bool {
        std::mem::take(&mut self.inner().renew_now)
    }

    /// Mark the lock lost (the first reason wins) and wake the main thread.
    pub fn lose(&self, reason: String) {
        self.inner().lost.get_or_insert(reason);
        crate::signals::wake_main();
    }
}

/// The guard's kill-by time for a lock valid until `until`.
pub fn kill_by(until: Instant, margin: Duration) -> Instant {
    until.checked_sub(margin / 2).unwrap_or(until)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_grace_shrinks_for_short_ttls() {
        let t = Timing::new(Duration::from_secs(30), None).unwrap();
        assert_eq!(t.grace, Duration::from_secs(5));
        assert_eq!(
            t.interval,
            Duration::from_secs(10).min((t.ttl - t.grace - t.margin) / 3)
        );
        let t = Timing::new(Duration::from_secs(1), None).unwrap();
        assert_eq!(t.grace, Duration::from_millis(250));
    }

    #[test]
    fn renewal_always_precedes_feared_loss() {
        for ms in [250u64, 1000, 3000, 30_000, 600_000] {
            let t = Timing::new(Duration::from_millis(ms), None).unwrap();
            assert!(t.interval * 3 <= t.ttl - t.grace - t.margin, "ttl {ms}ms");
        }
    }

    #[test]
    fn rejects_impossible_combinations() {
        assert!(Timing::new(Duration::from_millis(100), None).is_err());
        assert!(Timing::new(Duration::from_secs(1), Some(Duration::from_secs(5))).is_err());
        assert!(Timing::new(Duration::from_secs(10), Some(Duration::from_secs(5))).is_ok());
    }
}
