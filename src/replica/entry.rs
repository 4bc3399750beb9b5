//! One job's scheduling state, and every change of it: when it next comes due, the instant that
//! waits to be claimed (until when it can still start, where its check stands when another
//! replica owns it, why it would be missed), whether a claim of it is in flight and which instant
//! queued behind that claim, when a failed claim may be tried again, and which instants it gives
//! up. The table (`table.rs`) asks each job and acts: it says who owns an instant (the fleet's
//! views, [`Owns`]), records what a job gave up ([`GivenUp`]) and keeps its agenda.

use crate::clock::rfc3339;
use std::sync::Arc;

use crate::config::{CronJob, RunConfig};
use crate::log::{Level, Log};
use crate::record::ledger::MissedReason;
use crate::replica::claim::Group;

/// How long before a scheduled instant its claim goes out (ms), at most a twentieth of the
/// period: the claim, the run's start and its wait for the instant come before it, so the
/// command starts on time (the run waits for the instant by the wall clock; `acquire.lua` takes
/// an instant this close ahead for the one due).
pub const LEAD_MS: i64 = 50;

/// After a claim that failed (Redis down, or a failover under way: its primary's writes may be
/// dropped), how long before the next try (ms): a failover's second costs its instants a quarter
/// second each, late, instead of the instant.
pub const RETRY_MS: i64 = 250;

/// The most instants of one job the loop records missed at once when it comes late to them, and
/// how old the oldest may be (ms): older ones may have left the ledger, which keeps 64.
const MAX_LATE: usize = 8;
const LATE_WINDOW_MS: i64 = 60_000;

/// Whether this replica owns instant `at` of a job, as the fleet's views say (the table's
/// judgment, `table.rs`).
pub(super) type Owns<'a> = &'a dyn Fn(&Entry, i64) -> bool;

/// The table's entry for one job: the job (its crontab line, resolved) and its scheduling state.
pub struct Entry {
    pub cron: CronJob,
    /// Where its claims go (replicas are ranked per group).
    pub(super) group: Group,
    /// How many shares its group's jobs are split into (see `rank.rs`).
    pub(super) shares: u64,
    /// The next instant (Unix ms) to come due.
    next: Option<i64>,
    /// How long before `next` it comes due (ms): [`LEAD_MS`] for an instant of
    /// the schedule, 0 for a look at once.
    early: i64,
    /// An instant that came due and waits to be claimed.
    due: Option<Due>,
    /// The latest instant that came due.
    last: Option<i64>,
    /// A claim of it is in flight.
    claiming: bool,
    /// An instant that came due while a claim was in flight: it waits next.
    queued: Option<Queued>,
    /// No claim before this (after a failed one).
    not_before: i64,
}

/// An instant waiting to be claimed.
#[derive(Clone, Copy)]
pub(super) struct Due {
    pub(super) at: i64,
    /// Until when it can still start.
    pub(super) until: i64,
    /// Claimed by this replica whatever the rank (fired at start, or looked at again).
    anyone: bool,
    /// Where its check stands, when another replica owns it.
    check: Check,
    /// Why it would be missed, if given up now.
    reason: MissedReason,
}

/// The instant that came due while a claim was in flight.
#[derive(Clone, Copy)]
struct Queued {
    at: i64,
    /// As [`Due`]'s.
    anyone: bool,
}

/// The check of an instant another replica owns (see `table.rs`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Check {
    /// Not yet: its check comes 250 ms after the instant (`FALLBACK_MS` in `fleets.rs`).
    Ahead,
    /// Sent; the answer is awaited.
    Asked,
    /// Undecided when checked: this replica claims it.
    Open,
}

/// An instant a job gave up: to be said (under `-v`) and recorded missed, with the reason.
pub(super) struct GivenUp {
    pub(super) at: i64,
    pub(super) reason: MissedReason,
}

impl Due {
    fn new(at: i64, until: i64, anyone: bool) -> Due {
        Due {
            at,
            until,
            anyone,
            check: Check::Ahead,
            reason: MissedReason::NoRoom,
        }
    }
}

impl Entry {
    /// A job of `group`, due at its schedule's next instant after `now`; `first`: a job with
    /// `--catch-up` is due at once instead (a replica that starts late catches up).
    pub(super) fn new(cron: CronJob, group: Group, first: bool, now: i64) -> Entry {
        let mut job = Entry {
            cron,
            group,
            shares: 1,
            next: None,
            early: 0,
            due: None,
            last: None,
            claiming: false,
            queued: None,
            not_before: 0,
        };
        if first && job.cron.run.config.catch_up.is_some() {
            job.look_at(now);
        } else {
            job.schedule_after(now);
        }
        job
    }

    /// The same job read again (a reload): it keeps its next instant, the one waiting, the
    /// claim in flight and the instant queued behind it, and when a failed claim may be tried
    /// again (a reload neither fires it again nor drops an instant without a word).
    pub(super) fn keep(&mut self, old: &Entry) {
        (self.next, self.early) = (old.next, old.early);
        self.due = old.due;
        self.last = old.last;
        self.claiming = old.claiming;
        self.queued = old.queued;
        self.not_before = old.not_before;
    }

    /// Its next instant is the schedule's first after `ms`, claimed [`LEAD_MS`]
    /// (at most a twentieth of the period) before it, or before its `--jitter` offset after it
    /// (then `early` is negative).
    fn schedule_after(&mut self, ms: i64) {
        self.next = self.cron.schedule.next_after(ms);
        let offset = self.offset();
        self.early = self.next.map_or(0, |at| {
            let period = self.cron.schedule.next_after(at).map_or(0, |f| f - at);
            (period / 20).min(LEAD_MS) - offset
        });
    }

    /// Its next instant chosen again after `now`, if it came due already (see
    /// [`super::table::Table::rebase`]); whether it changed. A claim in flight, or an instant
    /// that waits, stays as it is.
    pub(super) fn rebase(&mut self, now: i64) -> bool {
        let passed = self.comes_due().is_some_and(|at| at <= now);
        if self.claiming || self.due.is_some() || !passed {
            return false;
        }
        if self.cron.run.config.catch_up.is_some() {
            (self.next, self.early) = (Some(now), 0);
        } else {
            self.schedule_after(now);
        }
        true
    }

    /// When it next comes due (Unix ms): its next instant less its lead.
    pub(super) fn comes_due(&self) -> Option<i64> {
        self.next.map(|n| n - self.early)
    }

    /// Its `--jitter` offset after each instant (ms; 0 without).
    pub(super) fn offset(&self) -> i64 {
        self.cron.run.config.jitter_offset().as_millis() as i64
    }

    /// Look at it at `at` (Unix ms) at the latest, not ahead of time: Redis picks the instant due.
    pub(super) fn look_at(&mut self, at: i64) {
        if self.next.is_none_or(|n| at < n - self.early) {
            (self.next, self.early) = (Some(at), 0);
        }
    }

    /// The latest instant that came due, when it may be tried again (`--retries`): a replica
    /// that left may have abandoned it.
    pub(super) fn retried(&self) -> Option<i64> {
        self.last.filter(|_| self.cron.run.config.retries > 0)
    }

    /// Whether an instant waits here, or in a claim in flight (the agenda looks at it each turn).
    pub(super) fn has_due(&self) -> bool {
        self.due.is_some()
    }

    /// Its instant waiting here (none while a claim of it is in flight).
    pub(super) fn waiting(&self) -> Option<Due> {
        self.due.filter(|_| !self.claiming)
    }

    /// This replica claims `d` now: anyone may, its owner did not claim it in time (checked), or
    /// it is this replica's.
    pub(super) fn claims(&self, d: &Due, owns: Owns<'_>) -> bool {
        d.anyone || d.check == Check::Open || owns(self, d.at)
    }

    /// Whether this replica answers for `d` when it can no longer start (records it missed,
    /// unless it ran): it claims it, or it checked it. Any other replica's instant is dropped
    /// silently: its owner and checkers answer for it.
    fn answers_for(&self, d: &Due, owns: Owns<'_>) -> bool {
        self.claims(d, owns) || d.check != Check::Ahead
    }

    /// `d`, given up for its reason: said and recorded when this replica answers for it.
    fn give_up(&self, d: &Due, owns: Owns<'_>) -> Option<GivenUp> {
        self.answers_for(d, owns).then_some(GivenUp {
            at: d.at,
            reason: d.reason,
        })
    }

    /// Its waiting instant to claim now: this replica claims it, and no failed claim holds it
    /// back.
    pub(super) fn claimable(&self, now: i64, owns: Owns<'_>) -> Option<Due> {
        let d = self.waiting().filter(|_| self.not_before <= now)?;
        self.claims(&d, owns).then_some(d)
    }

    /// Its waiting instant that another replica owns and that has not been checked yet.
    pub(super) fn unchecked(&self, owns: Owns<'_>) -> Option<Due> {
        let d = self.waiting().filter(|d| d.check == Check::Ahead)?;
        (!self.claims(&d, owns)).then_some(d)
    }

    /// When a failed claim may be tried again, if that is after `now`.
    pub(super) fn retry_at(&self, now: i64) -> Option<i64> {
        self.waiting().map(|_| self.not_before).filter(|t| *t > now)
    }

    /// A claim of its waiting instant goes out.
    pub(super) fn claim_sent(&mut self) {
        self.claiming = true;
    }

    /// Its waiting instant's check went out.
    pub(super) fn check_sent(&mut self) {
        if let Some(d) = &mut self.due {
            d.check = Check::Asked;
        }
    }

    /// A check's answer for instant `at`: decided (its run started, or it was recorded) or not,
    /// in which case this replica claims it.
    pub(super) fn checked(&mut self, at: i64, decided: bool) {
        match &mut self.due {
            Some(d) if d.at == at && decided => self.due = None,
            Some(d) if d.at == at => d.check = Check::Open,
            _ => {}
        }
    }

    /// Its waiting instant, once it can no longer start at `now`: no longer waiting, and given
    /// up when this replica answers for it.
    pub(super) fn expire(&mut self, now: i64, owns: Owns<'_>) -> Option<GivenUp> {
        let d = self.waiting().filter(|d| d.until <= now)?;
        self.due = None;
        self.give_up(&d, owns)
    }

    /// Until when instant `at` can still start: its `--catch-up` window, or else the job's next
    /// instant (at least a second later).
    fn deadline(&self, at: i64) -> i64 {
        match self.cron.run.config.catch_up {
            Some(window) => at + window.as_millis() as i64,
            None => self
                .cron
                .schedule
                .next_after(at)
                .unwrap_or(at + 60_000)
                .max(at + 1000),
        }
    }

    /// It came due (its next instant, less its lead, is past `now`): its instants the loop came
    /// too late to are given up as late, the one that can still start waits, and its next one is
    /// scheduled. The instants it gave up are returned.
    pub(super) fn come_due(&mut self, now: i64, owns: Owns<'_>) -> Vec<GivenUp> {
        let mut gave_up = Vec::new();
        let Some(mut at) = self.next.filter(|n| *n - self.early <= now) else {
            return gave_up;
        };
        while self.deadline(at) <= now {
            let scheduled = self.cron.schedule.next_after(at - 1) == Some(at);
            if scheduled && gave_up.len() < MAX_LATE && now - at <= LATE_WINDOW_MS {
                let reason = MissedReason::Late;
                gave_up.push(GivenUp { at, reason });
            }
            match self.cron.schedule.next_after(at) {
                Some(n) if n - self.early <= now => at = n,
                _ => break,
            }
        }
        self.schedule_after(at.max(now));
        if self.deadline(at) <= now {
            return gave_up;
        }
        // Fired at start or looked at again: not an instant of the schedule's (Redis picks the
        // instant due), and this replica claims it whatever the rank.
        let anyone = self.cron.schedule.next_after(at - 1) != Some(at);
        self.last = Some(at);
        if self.claiming {
            // The instant queued behind the claim in flight can no longer start on time either:
            // the claim has not come back (Redis slow, or not answering), so it is given up as
            // unreachable, not dropped.
            if let Some(old) = self.queued.replace(Queued { at, anyone }) {
                let mut old = Due::new(old.at, self.deadline(old.at), old.anyone);
                old.reason = MissedReason::Unreachable;
                gave_up.extend(self.give_up(&old, owns));
            }
            return gave_up;
        }
        // A look again (a run failed, a lock lapses) while an instant still waits here: that
        // instant is the one the look is for (Redis picks the instant due), claimed now whatever
        // the rank; giving it up would record it missed before its claim.
        if let Some(waiting) = self.due.as_mut().filter(|d| anyone && d.until > now) {
            waiting.anyone = true;
            return gave_up;
        }
        let new = Due::new(at, self.deadline(at), anyone);
        // The instant this one replaces can no longer start on time.
        if let Some(old) = self.due.replace(new) {
            gave_up.extend(self.give_up(&old, owns));
        }
        gave_up
    }

    /// Its claim came back at `now`: `done` unless it failed (Redis could not be asked), in which
    /// case the instant waits again, for a while. The instant it gave up for the one queued
    /// behind the claim, if any, is returned.
    pub(super) fn answered(&mut self, done: bool, now: i64) -> Option<GivenUp> {
        self.claiming = false;
        let mut superseded = None;
        if !done {
            if let Some(d) = &mut self.due {
                d.reason = MissedReason::Unreachable;
            }
            self.not_before = now + RETRY_MS;
        }
        if let Some(queued) = self.queued.take() {
            if let Some(old) = self.due.filter(|_| !done) {
                superseded = Some(GivenUp {
                    at: old.at,
                    reason: old.reason,
                });
            }
            let at = queued.at;
            self.due = Some(Due::new(at, self.deadline(at), queued.anyone));
        } else if done {
            self.due = None;
        }
        superseded
    }

    /// What a reload gives up of it when the job is removed or changed: its instant that waits
    /// here, when this replica answers for it.
    pub(super) fn dropped(&self, owns: Owns<'_>) -> Option<GivenUp> {
        let d = self.waiting()?;
        let d = Due {
            reason: MissedReason::Reload,
            ..d
        };
        self.give_up(&d, owns)
    }
}

/// Under `-v`: an instant that waited here and can no longer start (another replica may well
/// have run it: the ledger, asked next, records it missed only if nobody did).
pub(super) fn missed(job: &Entry, given: &GivenUp, log: &Log) {
    let within = if job.cron.run.config.catch_up.is_some() {
        "its --catch-up window"
    } else {
        "its period"
    };
    let reason = given.reason;
    log.event(
        Level::Debug,
        "gave_up",
        &format!(
            "{}: gave up the {} instant: not started here within {within} ({}); another \
             replica may have run it",
            job.cron.key,
            rfc3339(given.at.max(0) as u64),
            reason.name()
        ),
        &[
            ("key", job.cron.key.clone().into()),
            ("instant", given.at.into()),
            ("reason", reason.name().into()),
        ],
    );
}

/// One missed instant to record, under its job's configuration when it was given up (a reload
/// may have removed the job since).
pub(super) struct Pending {
    pub key: String,
    pub config: Arc<RunConfig>,
    pub instant: i64,
    pub reason: MissedReason,
}

impl Pending {
    pub fn of(job: &CronJob, given: &GivenUp) -> Pending {
        Pending {
            key: job.key.clone(),
            config: job.run.config.clone(),
            instant: given.at,
            reason: given.reason,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A whole second, long after the epoch.
    const T: i64 = 1_800_000_000_000;

    fn every_second() -> Entry {
        let cron = crate::cli::crontab::job_line("* * * * * * k true");
        let group = crate::replica::claim::group(&cron.run.config);
        Entry::new(cron, group, false, T)
    }

    fn at(given: &[GivenUp]) -> Vec<(i64, &'static str)> {
        given.iter().map(|g| (g.at - T, g.reason.name())).collect()
    }

    #[test]
    fn a_late_loop_gives_up_the_instants_it_came_to_too_late() {
        let mine = |_: &Entry, _| true;
        let mut job = every_second();
        assert_eq!(job.comes_due(), Some(T + 1000 - LEAD_MS));
        let late = job.come_due(T + 5500, &mine);
        let late_at: Vec<_> = (1..=4).map(|s| (s * 1000, "late")).collect();
        assert_eq!(at(&late), late_at);
        assert_eq!(job.claimable(T + 5500, &mine).map(|d| d.at), Some(T + 5000));
        assert_eq!(job.comes_due(), Some(T + 6000 - LEAD_MS));
    }

    #[test]
    fn an_instant_queued_behind_a_claim_in_flight_waits_next() {
        let mine = |_: &Entry, _| true;
        let mut job = every_second();
        assert!(job.come_due(T + 950, &mine).is_empty());
        job.claim_sent();
        assert!(job.waiting().is_none());
        // Queued behind the claim; the next one replaces it, given up as unreachable.
        assert!(job.come_due(T + 1950, &mine).is_empty());
        assert_eq!(
            at(&job.come_due(T + 2950, &mine)),
            [(2000, "redis_unreachable")]
        );
        // The claim failed: its instant is given up for the one queued, tried after RETRY_MS.
        let superseded = job.answered(false, T + 3000);
        assert_eq!(
            at(&superseded.into_iter().collect::<Vec<_>>()),
            [(1000, "redis_unreachable")]
        );
        assert!(job.claimable(T + 3000, &mine).is_none());
        let d = job.claimable(T + 3000 + RETRY_MS, &mine).unwrap();
        assert_eq!(d.at, T + 3000);
        job.claim_sent();
        assert!(job.answered(true, T + 3400).is_none());
        assert!(!job.has_due());
    }

    /// A reload while a claim is in flight keeps the instant queued behind it: it waits next
    /// in the job read again (it was dropped without a record before).
    #[test]
    fn a_reload_keeps_the_instant_queued_behind_a_claim_in_flight() {
        let mine = |_: &Entry, _| true;
        let mut job = every_second();
        job.come_due(T + 950, &mine);
        job.claim_sent();
        assert!(job.come_due(T + 1950, &mine).is_empty());
        let mut again = every_second();
        again.keep(&job);
        assert!(again.answered(true, T + 2100).is_none());
        assert_eq!(
            again.claimable(T + 2100, &mine).map(|d| d.at),
            Some(T + 2000)
        );
    }

    #[test]
    fn another_replicas_instant_is_checked_and_answered_for_only_once_checked() {
        let theirs = |_: &Entry, _| false;
        let mut job = every_second();
        job.come_due(T + 950, &theirs);
        assert!(job.claimable(T + 1000, &theirs).is_none());
        assert_eq!(job.unchecked(&theirs).map(|d| d.at), Some(T + 1000));
        // Not checked: dropped silently when it can no longer start.
        assert!(job.expire(T + 2000, &theirs).is_none());
        assert!(!job.has_due());
        // Checked and undecided: claimed here, and given up here if it cannot start.
        job.come_due(T + 1950, &theirs);
        job.check_sent();
        assert!(job.unchecked(&theirs).is_none());
        job.checked(T + 2000, false);
        assert_eq!(
            job.claimable(T + 2300, &theirs).map(|d| d.at),
            Some(T + 2000)
        );
        let missed = job.expire(T + 3000, &theirs);
        assert_eq!(
            at(&missed.into_iter().collect::<Vec<_>>()),
            [(2000, "no_room")]
        );
        // Checked and decided: nothing waits.
        job.come_due(T + 2950, &theirs);
        job.checked(T + 3000, true);
        assert!(!job.has_due());
    }
}
