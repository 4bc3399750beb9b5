//! The last step of a run: release the lock and record the run (with bounded retries while the
//! lock can still be alive), and the line saying how it went; or, for a claim that never became
//! a run, undo it.

use std::time::Duration;

use serde_json::Value;

use crate::clock::Instant;
use crate::duration::Span;
use crate::log::{Level, Log};
use crate::store::lock::{Held, ReleaseOptions, Released, Undo};
use crate::store::quorum::Masters;
use crate::store::topology::Redis;

/// Undo a replica's claim that never became a run (see [`Masters::unclaim`]): the lock, the
/// schedule record and the ledger entry rolled back, so the instant runs elsewhere at once. An
/// undo that does not reach Redis leaves the lock to lapse.
pub(super) fn undo(redis: &[Redis], within: Duration, masters: Option<Masters>, held: &Held) {
    let mut masters = masters.unwrap_or_else(|| Masters::new(redis));
    let _ = masters.unclaim(within, held, Undo::RollBack);
}

/// Release our lock and record the run; problems are warnings, since the command's status is what
/// matters now. Bounded by `--connect-timeout` in all (after the watchdog's stop, which has its
/// own: the end of a run is at most 2x `--connect-timeout`); a failed call is retried once on a
/// new connection, but only while the lock can still be alive in Redis (before `valid_until`).
/// A run with an instant (`--schedule`) retries a failed release until its lock would lapse, so
/// the ledger records how the instant really ended instead of leaving it `running` (which
/// `--retries` would later judge abandoned and run again).
pub(super) fn release(
    redis: &[Redis],
    within: Duration,
    masters: Option<Masters>,
    held: &Held,
    valid_until: Instant,
    opts: &ReleaseOptions,
    log: &Log,
) {
    let lost = Instant::now() >= valid_until;
    let name = &held.keys.name;
    let end = if held.instant.is_some() {
        valid_until.max(Instant::now() + within)
    } else {
        Instant::now() + within
    };
    let left = || end.saturating_duration_since(Instant::now()).min(within);
    let mut masters = masters.unwrap_or_else(|| Masters::new(redis));
    let mut retried = false;
    let mut result = masters.release(left(), held, opts);
    // The watchdog's connection may have been dropped since its last renewal (a Redis restart,
    // an idle timeout, a failover): again, while it can still matter.
    while let Err(e) = &result {
        let pause = Duration::from_millis(if retried { 200 } else { 0 });
        if !e.transient() || Instant::now() + pause >= valid_until.min(end) {
            break;
        }
        std::thread::sleep(pause);
        retried = true;
        result = masters.release(left(), held, opts);
    }
    let result = result.map_err(|e| anyhow::anyhow!("cannot release lock '{name}': {e}"));
    said_released(held, opts, result, lost, retried, log);
}

/// The line for how the release went. `lost`: the lock was lost before (a failure is no news);
/// `retried`: a first try whose reply was lost may have deleted it ("not ours" is no news).
pub(super) fn said_released(
    held: &Held,
    opts: &ReleaseOptions,
    result: anyhow::Result<Released>,
    lost: bool,
    retried: bool,
    log: &Log,
) {
    let name = &held.keys.name;
    match result {
        Ok(Released::Deleted) => log.info("released", &format!("released lock '{name}'"), &[]),
        Ok(Released::Kept) => log.info(
            "held_for_min_hold",
            &format!(
                "keeping lock '{name}' for {} more (--min-hold)",
                Span(std::time::Duration::from_millis(opts.hold.as_millis() as u64))
            ),
            &[("hold_ms", Value::from(opts.hold.as_millis() as u64))],
        ),
        // Lost, or deleted by a first try whose reply the dropped connection lost.
        Ok(Released::NotOurs) if lost || retried => {}
        Ok(Released::NotOurs) => log.warn(
            "release_not_ours",
            &format!(
                "lock '{name}' was no longer ours at release (it expired or was taken over); left it alone"
            ),
        ),
        // After a loss the release is expected to fail: the loss was the one line to print.
        Err(e) => log.event(
            if lost { Level::Info } else { Level::Warn },
            "release_failed",
            &format!("{e:#}; it will expire within {}", Span(held.ttl)),
            &[],
        ),
    }
}
