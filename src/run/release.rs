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
    let _ = masters.unclaim(within, held, Undo::GiveBack);
}

/// How long after its lock's lapse a run whose command succeeded still tries to record that
/// (`--schedule`): while Redis is slow or away, the ledger reads the instant `running`, and
/// `--retries` would judge it abandoned and run it again once Redis answers (`acquire.lua` waits
/// `REPORT` for the holder's end first). Past this, the success is lost (said so).
pub const OUTCOME_KEPT: Duration = Duration::from_secs(60);

/// Release our lock and record the run; problems are warnings, since the command's status is what
/// matters now. Bounded by `--connect-timeout` in all (after the watchdog's stop, which has its
/// own: the end of a run is at most 2x `--connect-timeout`); a failed call is retried on a new
/// connection while the lock can still be alive in Redis (before `valid_until`). A run with an
/// instant (`--schedule`) retries a failed release until its lock would lapse, so the ledger
/// records how the instant really ended instead of leaving it `running` (which `--retries` would
/// later judge abandoned and run again); one whose command succeeded, up to [`OUTCOME_KEPT`]
/// after that, so that a stall or an outage of Redis alone never runs a success again.
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
    let succeeded = held.instant.is_some() && opts.ledger.is_some_and(|l| l.exit == 0);
    let end = match (held.instant, succeeded) {
        (Some(_), true) => valid_until.max(Instant::now()) + OUTCOME_KEPT,
        (Some(_), false) => valid_until.max(Instant::now() + within),
        (None, _) => Instant::now() + within,
    };
    let tries_until = if succeeded { end } else { valid_until };
    let left = || end.saturating_duration_since(Instant::now()).min(within);
    let mut masters = masters.unwrap_or_else(|| Masters::new(redis));
    let mut retried = false;
    let mut told = false;
    let mut result = masters.release(left(), held, opts);
    // The watchdog's connection may have been dropped since its last renewal (a Redis restart,
    // an idle timeout, a failover): again, while it can still matter.
    while let Err(e) = &result {
        let pause = Duration::from_millis(if retried { 200 } else { 0 });
        if !e.transient() || Instant::now() + pause >= tries_until.min(end) {
            break;
        }
        if succeeded && !told && Instant::now() + pause >= valid_until {
            told = true;
            log.warn(
                "release_retrying",
                &format!(
                    "cannot record the end of lock '{name}' yet: {e}; still trying for up to {} \
                     so that --retries does not run the instant again",
                    Span(OUTCOME_KEPT)
                ),
            );
        }
        std::thread::sleep(pause);
        retried = true;
        result = masters.release(left(), held, opts);
    }
    if told && result.is_ok() {
        log.info(
            "release_recorded",
            &format!("recorded the end of lock '{name}' once redis answered"),
            &[],
        );
    }
    let result = result.map_err(|e| anyhow::anyhow!("cannot release lock '{name}': {e}"));
    said_released(held, opts, result, lost || told, retried, log);
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
        Ok(Released::Kept) => {
            let hold = opts.hold_left().unwrap_or_default();
            let hold = Duration::from_millis(hold.as_millis() as u64);
            log.info(
                "held_for_min_hold",
                &format!("keeping lock '{name}' for {} more (--min-hold)", Span(hold)),
                &[("hold_ms", Value::from(hold.as_millis() as u64))],
            )
        }
        // Lost, or deleted by a first try whose reply the dropped connection lost.
        Ok(Released::NotOurs) if lost || retried => {}
        Ok(Released::NotOurs) => log.warn(
            "release_not_ours",
            &format!(
                "lock '{name}' was no longer ours at release (it expired or was taken over); left it alone"
            ),
        ),
        // A success that could not be written: the ledger will read its instant abandoned.
        Err(e) if held.instant.is_some() && opts.ledger.is_some_and(|l| l.exit == 0) => log.warn(
            "release_failed",
            &format!(
                "{e:#}; the run succeeded, but its instant is not recorded so (it will read \
                 abandoned, and --retries may run it again)"
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
