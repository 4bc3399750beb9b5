//! A job's entry in the replica's table: when it is next due, the instant that waits to be
//! claimed (until when it can still start, where its check stands when another replica owns
//! it, and why it would be missed), the line said when it is given up, and the record of a
//! given-up instant to send ([`Pending`]).

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

/// The table's entry for one job: the job (its crontab line, resolved) and when it is due.
pub struct Entry {
    pub cron: CronJob,
    /// The next instant (Unix ms) to come due.
    pub(super) next: Option<i64>,
    /// How long before `next` it comes due (ms): [`LEAD_MS`] for an instant of
    /// the schedule, 0 for a look at once.
    pub(super) early: i64,
    /// An instant that came due and waits to be claimed.
    pub(super) due: Option<Due>,
    /// The latest instant that came due.
    pub(super) last: Option<i64>,
    /// Where its claims go (replicas are ranked per group).
    pub(super) group: Group,
    /// How many shares its group's jobs are split into (see `rank.rs`).
    pub(super) shares: u64,
    /// A claim of it is in flight.
    pub(super) claiming: bool,
    /// An instant that came due while a claim was in flight: it waits next.
    pub(super) queued: Option<(i64, bool)>,
    /// No claim before this (after a failed one).
    pub(super) not_before: i64,
}

/// An instant waiting to be claimed.
#[derive(Clone, Copy)]
pub(super) struct Due {
    pub(super) at: i64,
    /// Until when it can still start.
    pub(super) until: i64,
    /// Claimed by this replica whatever the rank (fired at start, or looked at again).
    pub(super) anyone: bool,
    /// Where its check stands, when another replica owns it.
    pub(super) check: Check,
    /// Why it would be missed, if given up now.
    pub(super) reason: MissedReason,
}

/// The check of an instant another replica owns (see the module comment).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Check {
    /// Not yet: its check comes 250 ms after the instant (`FALLBACK_MS` in `table.rs`).
    Ahead,
    /// Sent; the answer is awaited.
    Asked,
    /// Undecided when checked: this replica claims it.
    Open,
}

impl Due {
    pub(super) fn new(at: i64, until: i64, anyone: bool) -> Due {
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
    /// Its next instant is the schedule's first after `ms`, claimed [`LEAD_MS`]
    /// (at most a twentieth of the period) before it, or before its `--jitter` offset after it
    /// (then `early` is negative).
    pub(super) fn schedule_after(&mut self, ms: i64) {
        self.next = self.cron.schedule.next_after(ms);
        let offset = self.offset();
        self.early = self.next.map_or(0, |at| {
            let period = self.cron.schedule.next_after(at).map_or(0, |f| f - at);
            (period / 20).min(LEAD_MS) - offset
        });
    }

    /// When it next comes due (Unix ms): its next instant less its lead.
    pub(super) fn comes_due(&self) -> Option<i64> {
        self.next.map(|n| n - self.early)
    }

    /// Its `--jitter` offset after each instant (ms; 0 without).
    pub(super) fn offset(&self) -> i64 {
        self.cron.config.jitter_offset().as_millis() as i64
    }

    /// Look at it at `at` (Unix ms) at the latest, not ahead of time: Redis picks the instant due.
    pub(super) fn look_at(&mut self, at: i64) {
        if self.next.is_none_or(|n| at < n - self.early) {
            (self.next, self.early) = (Some(at), 0);
        }
    }
}

/// Until when instant `at` of `job` can still start: its `--catch-up` window, or else the
/// job's next instant (at least a second later).
pub(super) fn deadline(job: &Entry, at: i64) -> i64 {
    match job.cron.config.catch_up {
        Some(window) => at + window.as_millis() as i64,
        None => job
            .cron
            .schedule
            .next_after(at)
            .unwrap_or(at + 60_000)
            .max(at + 1000),
    }
}

/// Under `-v`: an instant that waited here and can no longer start (another replica may well
/// have run it: the ledger, asked next, records it missed only if nobody did).
pub(super) fn missed(job: &Entry, at: i64, reason: MissedReason, log: &Log) {
    let within = if job.cron.catch_up {
        "its --catch-up window"
    } else {
        "its period"
    };
    log.event(
        Level::Debug,
        "gave_up",
        &format!(
            "{}: gave up the {} instant: not started here within {within} ({}); another \
             replica may have run it",
            job.cron.key,
            rfc3339(at.max(0) as u64),
            reason.name()
        ),
        &[
            ("key", job.cron.key.clone().into()),
            ("instant", at.into()),
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
    pub fn of(job: &CronJob, instant: i64, reason: MissedReason) -> Pending {
        Pending {
            key: job.key.clone(),
            config: job.config.clone(),
            instant,
            reason,
        }
    }
}
