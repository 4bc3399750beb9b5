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
use redis::Connection;

use crate::clock::Instant;
use crate::connect::{first_line, set_io_timeout};
use crate::duration::Span;
use crate::lock::{self, Attempt, Held, Holder, Keys};
use crate::log::Log;
use crate::signals;

/// The longest a waiter blocks between attempts.
const POLL_CAP: Duration = Duration::from_millis(500);

/// The result of trying to get the lock.
#[derive(Debug)]
pub enum Acquired {
    Held(Box<Held>),
    /// Held elsewhere, and `--wait` (if any) ran out.
    Busy,
    /// A signal asked us to stop before we had the lock.
    Signalled(libc::c_int),
}

/// A random duration in `[d/2, d]`, so waiters on many hosts do not poll in step.
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
    io_timeout: Duration,
    log: &Log,
) -> Result<Acquired> {
    let deadline = Instant::now() + wait;
    let mut announced = false;
    loop {
        if let Some(sig) = signals::pending_forwarded() {
            return Ok(Acquired::Signalled(sig));
        }
        // A fresh holder per attempt, so `started` says when we got it.
        let expires_in = match lock::try_acquire(con, keys, &Holder::new(command), ttl)? {
            Attempt::Held(held) => return Ok(Acquired::Held(held)),
            Attempt::Busy(expires_in) => expires_in,
        };
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
        let mut block = jitter(POLL_CAP).min(deadline - now);
        if let Some(left) = expires_in {
            block = block.min(left + Duration::from_millis(1));
        }
        // BLPOP takes seconds with millisecond precision (Redis >= 6); 0 would block forever.
        let secs = (block.as_millis().max(1) as f64) / 1000.0;
        set_io_timeout(con, block + io_timeout)?;
        // Woken or timed out, the next step is the same: try again.
        redis::cmd("BLPOP")
            .arg(&keys.notify)
            .arg(secs)
            .query::<Option<(String, String)>>(con)
            .map_err(|e| anyhow!("cannot wait for lock '{}': {}", keys.name, first_line(&e)))?;
        set_io_timeout(con, io_timeout)?;
    }
}
