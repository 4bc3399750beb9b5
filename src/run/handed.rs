//! The first step of a run a replica (`--crontab`) started: instead of taking the lock, receive
//! the lock the replica claimed, over the channel it named ([`crate::handover`]), and
//! check it against this run's own configuration. A lock that does not match is released (it is
//! ours by handover) and the command does not run. A replica claims a scheduled instant a little
//! ahead of it (`LEAD_MS` in `replica/table.rs`), so the run waits for the instant by the wall
//! clock: its command starts on time, never before.

use anyhow::{bail, Result};

use crate::config::RunConfig;
use crate::handover::RunSide;
use crate::log::Log;
use crate::store::keys::Keys;
use crate::store::lock::{Held, ReleaseOptions};
use crate::store::quorum::Masters;

/// The handed-over lock, the masters to keep it with, and the channel to report on.
pub(super) struct Handed {
    pub held: Held,
    pub masters: Masters,
    pub side: RunSide,
}

/// The lock the replica hands over on the channel `fd`.
pub(super) fn receive(config: &RunConfig, fd: i32, log: &Log) -> Result<Handed> {
    let mut side = RunSide::adopt(fd)?;
    let handed = side.receive(config.connect_timeout)?;
    // (Named by the KEY handed over: a lock of another KEY is released as the lock it is.)
    let keys = Keys::new(&config.prefix, &handed.key);
    let held = handed.into_held(keys);
    let why = config.mismatch(&held);
    let masters = Masters::new(&config.servers);
    if let Some(why) = why {
        let until = held.sent_at + held.ttl;
        let opts = ReleaseOptions::default();
        super::release(
            &config.servers,
            config.connect_timeout,
            Some(masters),
            &held,
            until,
            &opts,
            log,
        );
        bail!(
            "the lock the replica handed over is not this run's ({why}); not running the command"
        );
    }
    Ok(Handed {
        held,
        masters,
        side,
    })
}

/// The most a run waits for its instant (a replica claims 50 ms ahead at most).
const MAX_EARLY_MS: i64 = 1000;

/// Sleep until the held instant, if it is ahead (by at most [`MAX_EARLY_MS`]): called as late as
/// possible, right before the command is started.
pub(super) fn wait_for_instant(held: &Held, offset: std::time::Duration) {
    let Some(at) = held.instant else {
        return;
    };
    // A manual instant runs now; a scheduled one, `--jitter`'s offset after it.
    let at = if held.manual {
        at
    } else {
        at + offset.as_millis() as i64
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let at = std::time::Duration::from_millis(at.clamp(0, i64::MAX) as u64);
    let ahead = at.saturating_sub(now);
    std::thread::sleep(ahead.min(std::time::Duration::from_millis(MAX_EARLY_MS as u64)));
}
