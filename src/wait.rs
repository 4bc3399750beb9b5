//! Getting the lock: one attempt, or retries with jittered backoff until `--wait` runs out.
//!
//! While waiting, cronlock sleeps in `sigtimedwait`, so SIGTERM or Ctrl-C end the wait at once
//! (the command never runs and no lock is left behind).

use std::time::{Duration, Instant};

use anyhow::Result;
use redis::Connection;

use crate::duration::Span;
use crate::lock::{self, Held, Holder, Keys};
use crate::log::Log;
use crate::signals::{self, SigSet};

/// The result of trying to get the lock.
#[derive(Debug)]
pub enum Acquired {
    Held(Box<Held>),
    /// Held elsewhere, and `--wait` (if any) ran out.
    Busy,
    /// A signal asked us to stop before we had the lock.
    Signalled(libc::c_int),
}

/// A random duration in `[d/2, d]`, so waiters on many hosts do not retry in step.
fn jitter(d: Duration) -> Duration {
    let r = (uuid::Uuid::new_v4().as_u128() % 1024) as u32;
    d / 2 + d / 2 * r / 1024
}

/// Try to take the lock, waiting up to `wait` for it.
pub fn acquire(
    con: &mut Connection,
    keys: &Keys,
    command: &str,
    ttl: Duration,
    wait: Duration,
    log: &Log,
) -> Result<Acquired> {
    let forwarded = SigSet::of(signals::forwarded());
    let deadline = Instant::now() + wait;
    let mut backoff = Duration::from_millis(10);
    let mut announced = false;
    loop {
        if let Some(sig) = signals::pending_forwarded() {
            return Ok(Acquired::Signalled(sig));
        }
        // A fresh holder per attempt, so `started` says when we got it.
        if let Some(held) = lock::try_acquire(con, keys, &Holder::new(command), ttl)? {
            return Ok(Acquired::Held(Box::new(held)));
        }
        let now = Instant::now();
        if now >= deadline {
            return Ok(Acquired::Busy);
        }
        if !announced {
            announced = true;
            log.info(
                "waiting",
                &format!(
                    "lock '{}' is held elsewhere; waiting up to {}",
                    keys.name,
                    Span(wait)
                ),
                &[("wait_ms", (wait.as_millis() as u64).into())],
            );
        }
        let sleep = jitter(backoff).min(deadline - now);
        backoff = (backoff * 2).min(Duration::from_millis(500));
        if let Some(sig) = signals::wait(&forwarded, sleep) {
            return Ok(Acquired::Signalled(sig));
        }
    }
}
