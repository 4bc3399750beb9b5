//! The clocks: every deadline is measured on `CLOCK_BOOTTIME` ([`Instant`]); the wall clock
//! ([`unix_millis`], [`rfc3339`]) is for records people read, never for deadlines; and Redis's
//! clock as a replica measured it ([`redis_millis`]) names and schedules instants.
//!
//! `CLOCK_BOOTTIME` is monotonic like `std::time::Instant` (`CLOCK_MONOTONIC`) but keeps counting
//! while the system is suspended. Redis's expiry keeps running then too, so after a resume
//! cronlock must see the time that passed: with `CLOCK_MONOTONIC` it would believe a lock valid for up to a whole TTL
//! after Redis dropped it. With this clock the next check after the resume (within a second) finds
//! the deadline passed and stops the command.

use std::ops::{Add, Sub};
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A point on `CLOCK_BOOTTIME`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Instant(Duration);

impl Instant {
    pub fn now() -> Instant {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: valid out-pointer; CLOCK_BOOTTIME exists on every Linux cronlock supports.
        let rc = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
        assert_eq!(rc, 0, "clock_gettime(CLOCK_BOOTTIME) failed");
        Instant(Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
    }

    /// Time since boot: what the shared page stores.
    pub fn as_duration(&self) -> Duration {
        self.0
    }

    pub fn from_duration(d: Duration) -> Instant {
        Instant(d)
    }

    pub fn elapsed(&self) -> Duration {
        Instant::now().saturating_duration_since(*self)
    }

    /// `self - earlier`, or zero when `earlier` is later.
    pub fn saturating_duration_since(&self, earlier: Instant) -> Duration {
        self.0.saturating_sub(earlier.0)
    }

    pub fn checked_sub(&self, d: Duration) -> Option<Instant> {
        self.0.checked_sub(d).map(Instant)
    }
}

impl Add<Duration> for Instant {
    type Output = Instant;

    fn add(self, d: Duration) -> Instant {
        Instant(self.0 + d)
    }
}

/// Saturating, like [`Instant::saturating_duration_since`].
impl Sub for Instant {
    type Output = Duration;

    fn sub(self, earlier: Instant) -> Duration {
        self.saturating_duration_since(earlier)
    }
}

/// Wall-clock milliseconds since the Unix epoch, for records people read (never for deadlines).
pub fn unix_millis() -> u64 {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    ms.saturating_add_signed(shifted())
}

/// A debug build's wall clock shifted by [`crate::hooks::CLOCK_SHIFT_MS`] (a host whose clock is
/// wrong, for the tests); 0 in the release build.
fn shifted() -> i64 {
    static SHIFT: std::sync::OnceLock<i64> = std::sync::OnceLock::new();
    *SHIFT.get_or_init(|| {
        crate::hooks::get(crate::hooks::CLOCK_SHIFT_MS)
            .and_then(|v| v.to_str()?.parse().ok())
            .unwrap_or(0)
    })
}

/// How far Redis's clock is ahead of this host's wall clock (ms), as a replica measured it
/// (`replica/skew.rs`); 0 until then, and in a plain run (which reads Redis's clock in each
/// acquire's reply instead).
static REDIS_OFFSET_MS: AtomicI64 = AtomicI64::new(0);

/// Redis's clock as this process knows it (Unix ms): the wall clock corrected by the offset a
/// replica measured. A replica names, schedules and claims instants by it: Redis's clock, not a
/// host's, names an instant.
pub fn redis_millis() -> i64 {
    unix_millis() as i64 + REDIS_OFFSET_MS.load(Ordering::Relaxed)
}

/// The offset [`redis_millis`] adds (a replica's measurement).
pub fn set_redis_offset(ms: i64) {
    REDIS_OFFSET_MS.store(ms, Ordering::Relaxed);
}

/// RFC 3339 rendering of [`unix_millis`] values for humans.
pub fn rfc3339(ms: u64) -> String {
    let t = UNIX_EPOCH + std::time::Duration::from_millis(ms);
    humantime::format_rfc3339_seconds(t).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advances_with_std_instant() {
        let (a, s) = (Instant::now(), std::time::Instant::now());
        std::thread::sleep(Duration::from_millis(20));
        let (ours, theirs) = (a.elapsed(), s.elapsed());
        assert!(ours >= Duration::from_millis(20));
        assert!(
            ours.abs_diff(theirs) < Duration::from_millis(5),
            "{ours:?} vs {theirs:?}"
        );
        assert_eq!(a + Duration::from_secs(1) - a, Duration::from_secs(1));
        assert_eq!(a - (a + Duration::from_secs(1)), Duration::ZERO);
    }
}
