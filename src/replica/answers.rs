//! What the claims thread's answers mean beyond the claim itself: a lost claim (its line under
//! `-v`, the job's metrics file, when to look again for `--retries`) and an instant recorded missed
//! (its line, the job's metrics file, the page), or kept to record again once Redis answers
//! ([`Unrecorded`]).

use std::collections::VecDeque;

use crate::clock::{redis_millis, rfc3339, unix_millis};
use crate::config::{CronJob, RunConfig};
use crate::exit::Exit;
use crate::log::{Level, Log};
use crate::record::ledger::MissedReason;

use super::claim::{ClaimVerdict, OwedEnd};
pub(super) use super::entry::Pending;
use super::watched::BoardFeed;

/// Missed instants whose record Redis did not take (no primary answered: a failover, an
/// outage): asked again every [`AGAIN_MS`] until one answers, so an instant lost while Redis was
/// away is in the ledger once it is back (on the new primary after a failover). Bounded: the
/// newest [`MAX_UNRECORDED`], none older than [`KEPT_MS`] (the ledger keeps 64 instants a job).
#[derive(Default)]
pub(super) struct Unrecorded {
    pending: VecDeque<Pending>,
    next_try: i64,
}

const MAX_UNRECORDED: usize = 1024;
const AGAIN_MS: i64 = 1000;
const KEPT_MS: i64 = 600_000;

impl Unrecorded {
    /// Keep `missed` to record later.
    pub fn keep(&mut self, missed: Pending) {
        if self.pending.len() >= MAX_UNRECORDED {
            self.pending.pop_front();
        }
        if self.pending.is_empty() {
            self.next_try = redis_millis() + AGAIN_MS;
        }
        self.pending.push_back(missed);
    }

    /// Those to ask again now (the others come back through [`Unrecorded::keep`] if Redis still
    /// does not take them).
    pub fn due(&mut self) -> Vec<Pending> {
        let now = redis_millis();
        if self.pending.is_empty() || now < self.next_try {
            return Vec::new();
        }
        self.pending.retain(|p| now - p.instant <= KEPT_MS);
        self.pending.drain(..).collect()
    }
}

/// An instant recorded missed: one line, and the job's metrics file says so. (One Redis did not
/// take is the caller's to keep, in [`Unrecorded`].)
pub(super) fn missed(
    key: &str,
    config: &RunConfig,
    instant: i64,
    reason: MissedReason,
    recorded: Result<bool, String>,
    shown: &BoardFeed,
    log: &Log,
) {
    let at = rfc3339(instant.max(0) as u64);
    match recorded {
        Ok(true) => {
            log.warn(
                "missed",
                &format!(
                    "{key}: the {at} instant was missed: {}; recorded missed ({})",
                    reason.says(),
                    reason.name()
                ),
            );
            let report = crate::fleet::report::Report::metrics_only(&config.reports);
            report.missed(key, instant.max(0) as u64, log);
            shown.missed(key, instant, reason);
        }
        Ok(false) => {}
        Err(text) => log.event(
            Level::Debug,
            "missed_unrecorded",
            &format!(
                "{key}: cannot record the {at} instant missed yet: {text}; trying again once \
                 Redis answers"
            ),
            &[],
        ),
    }
}

/// What came of a run's end this replica owed (Redis did not take it when the run ended): one
/// line.
pub(super) fn owed(key: &str, instant: Option<i64>, end: OwedEnd, log: &Log) {
    let of = instant.map_or(String::new(), |at| {
        format!(" (the {} instant)", rfc3339(at.max(0) as u64))
    });
    match end {
        OwedEnd::Written => log.info(
            "release_written",
            &format!("{key}: wrote the end of its run{of} once redis answered"),
            &[("key", key.into()), ("instant", instant.into())],
        ),
        OwedEnd::Dropped(why) => log.warn(
            "release_dropped",
            &format!(
                "{key}: gave up writing the end of its run{of}: {why}; its lock lapses by \
                 itself, and its instant then reads abandoned (--retries may run it again)"
            ),
        ),
    }
}

/// A claim another replica's run (or a suspension) answered: said under `-v`, reported in the
/// job's metrics file. When to look at it again, if ever: with `--retries`, when the holder's
/// lock would lapse; a claim sent ahead that Redis found not yet due, at the instant.
pub(super) fn lost(
    job: &CronJob,
    instant: i64,
    verdict: ClaimVerdict,
    shown: &BoardFeed,
    log: &Log,
) -> Option<i64> {
    let key = &job.key;
    let at = rfc3339(instant.max(0) as u64);
    let mut suspended = None;
    let mut again = None;
    let text = match &verdict {
        ClaimVerdict::Busy { holder, expires_in } => {
            if let (true, Some(left)) = (job.run.config.retries > 0, expires_in) {
                again = Some(redis_millis() + left.as_millis() as i64 + 250);
            }
            let by = crate::fleet::describe::describe_holder(holder);
            format!("{key}: the {at} instant is held by {by}")
        }
        // Claimed ahead of the instant, and Redis's clock (a little behind this host's)
        // judged it not yet due: looked at again at the instant itself, once; not lost yet.
        ClaimVerdict::AlreadyRan if instant > redis_millis() => {
            return Some(instant);
        }
        ClaimVerdict::AlreadyRan => {
            format!("{key}: the {at} instant already ran or is not due")
        }
        // Claimed before Redis's clock reached it (this host's clock runs fast, and its offset
        // was not measured yet: the reply measured it): claimed again at the instant, by
        // Redis's clock.
        ClaimVerdict::Early { .. } => return Some(instant),
        ClaimVerdict::Suspended(record) => {
            suspended = Some(crate::fleet::describe::suspended_since(record).unwrap_or(0));
            let how = crate::fleet::describe::describe_suspension(record);
            format!("{key}: suspended {how}; the {at} instant is recorded skipped")
        }
        ClaimVerdict::Won(_) | ClaimVerdict::Failed(_) => return None,
    };
    let fields = [("key", key.clone().into()), ("instant", instant.into())];
    log.event(Level::Debug, "claim_lost", &text, &fields);
    shown.claim(key, Some(false), suspended);
    if job.run.config.reports.metrics_dir.is_some() {
        report_skip(job, suspended, log);
    }
    again
}

/// A lost claim in the job's metrics file, as a run that lost its acquire writes it (skipped, and
/// `cronlock_suspended` while KEY is suspended).
fn report_skip(job: &CronJob, suspended: Option<u64>, log: &Log) {
    use crate::fleet::report::{Report, RunOutcome};
    let report = Report::metrics_only(&job.run.config.reports);
    let outcome = RunOutcome {
        result: Ok(Exit::Conflict(job.run.config.conflict_exit_code)),
        locked: false,
        run: None,
        body: None,
        suspended,
    };
    report.tell(&job.key, unix_millis(), &outcome, log);
}
