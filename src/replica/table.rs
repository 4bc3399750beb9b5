//! The replica's jobs and, for each, when it is next due and which instant waits to be claimed.
//!
//! An instant that comes due waits until this replica has room (`--max-jobs` counts the runs
//! it won and the claims it has in flight), however long another replica takes; it is given up
//! only when it can no longer start: at the job's next instant, or, with `--catch-up`, when it
//! leaves the window (then the next claim's acquire records it missed in the ledger). Due
//! instants are claimed in an order of this replica's own (a hash of its identity, the KEY and
//! the instant), so replicas that are all due at once mostly claim different jobs first.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use anyhow::Result;

use crate::config::CronJob;
use crate::host::{rfc3339, unix_millis};
use crate::log::{Level, Log};

/// After a claim that could not be sent (Redis down), how long before the next try (ms).
const RETRY_MS: i64 = 1000;

/// A job of the table.
pub struct Job {
    pub cron: CronJob,
    /// The next instant (Unix ms) to come due.
    next: Option<i64>,
    /// An instant that came due and waits to be claimed, and until when it can still start.
    due: Option<(i64, i64)>,
    /// A claim of it is in flight.
    claiming: bool,
    /// An instant that came due while a claim was in flight: it waits next.
    queued: Option<i64>,
    /// No claim before this (after a failed one).
    not_before: i64,
    /// A failed claim was said (once, until one goes through).
    trouble_told: bool,
}

/// The jobs, by KEY too.
pub struct Table {
    pub jobs: Vec<Job>,
    index: HashMap<String, usize>,
    /// This replica's identity, for its order of claims.
    me: u64,
}

impl Table {
    /// `first`: jobs with `--catch-up` are due at once (a replica that starts late catches up).
    pub fn new(jobs: &[CronJob], first: bool, me: u64) -> Table {
        let now = unix_millis() as i64;
        let jobs: Vec<Job> = jobs
            .iter()
            .map(|c| Job {
                next: if first && c.catch_up {
                    Some(now)
                } else {
                    c.schedule.next_after(now)
                },
                due: None,
                claiming: false,
                queued: None,
                not_before: 0,
                trouble_told: false,
                cron: c.clone(),
            })
            .collect();
        let index = jobs
            .iter()
            .enumerate()
            .map(|(i, j)| (j.cron.key.clone(), i))
            .collect();
        Table { jobs, index, me }
    }

    /// How many instants wait for a claim.
    pub fn waiting(&self) -> usize {
        self.jobs
            .iter()
            .filter(|j| j.due.is_some() && !j.claiming)
            .count()
    }

    pub fn job(&mut self, key: &str) -> Option<&mut Job> {
        let i = *self.index.get(key)?;
        self.jobs.get_mut(i)
    }

    /// When something next needs the loop: an instant comes due, a waiting one can be tried
    /// again or gives up.
    pub fn next_wake(&self) -> Option<i64> {
        self.jobs
            .iter()
            .flat_map(|j| {
                let waiting = j.due.filter(|_| !j.claiming);
                [
                    j.next,
                    waiting.map(|(_, until)| until),
                    waiting.map(|_| j.not_before),
                ]
            })
            .flatten()
            .min()
    }

    /// Move every instant that came due into its job's waiting place; a waiting instant that can
    /// no longer start is given up, with one line.
    pub fn advance(&mut self, log: &Log) {
        let now = unix_millis() as i64;
        for job in &mut self.jobs {
            if let Some((at, _)) = job.due.filter(|(_, until)| *until <= now && !job.claiming) {
                missed(job, at, log);
                job.due = None;
            }
            let Some(at) = job.next.filter(|n| *n <= now) else {
                continue;
            };
            job.next = job.cron.schedule.next_after(at.max(now));
            // The instant this one replaces can no longer start on time.
            if let Some((old, _)) = job.due.filter(|_| !job.claiming) {
                missed(job, old, log);
            }
            if job.claiming {
                job.queued = Some(at);
            } else {
                job.due = Some((at, deadline(job, at)));
            }
        }
    }

    /// Up to `room` waiting instants to claim now, in this replica's order; each is marked in
    /// flight until [`Table::answered`].
    pub fn take_due(&mut self, room: usize) -> Vec<(usize, i64)> {
        if room == 0 {
            return Vec::new();
        }
        let now = unix_millis() as i64;
        let mut ready: Vec<(u64, usize, i64)> = self
            .jobs
            .iter()
            .enumerate()
            .filter(|(_, j)| !j.claiming && j.not_before <= now)
            .filter_map(|(i, j)| {
                j.due
                    .map(|(at, _)| (order(self.me, &j.cron.key, at), i, at))
            })
            .collect();
        ready.sort_unstable();
        ready.truncate(room);
        for (_, i, _) in &ready {
            self.jobs[*i].claiming = true;
        }
        ready.into_iter().map(|(_, i, at)| (i, at)).collect()
    }

    /// A claim of KEY came back: `done` unless it failed (Redis could not be asked), in which case
    /// the instant waits again, for a while.
    pub fn answered(&mut self, key: &str, done: bool, log: &Log) -> bool {
        let Some(job) = self.job(key) else {
            return false;
        };
        job.claiming = false;
        if let Some(at) = job.queued.take() {
            if let Some((old, _)) = job.due.filter(|_| !done) {
                missed(job, old, log);
            }
            job.due = Some((at, deadline(job, at)));
        } else if done {
            job.due = None;
        }
        if done {
            std::mem::take(&mut job.trouble_told)
        } else {
            job.not_before = unix_millis() as i64 + RETRY_MS;
            !std::mem::replace(&mut job.trouble_told, true)
        }
    }

    /// Look at KEY again at `at` (Unix ms): a run of it failed, or the lock of the run that holds
    /// it elsewhere lapses then (with `--retries`, an abandoned attempt is due again).
    pub fn look_again(&mut self, key: &str, at: i64) {
        if let Some(job) = self.job(key) {
            job.next = Some(job.next.map_or(at, |n| n.min(at)));
        }
    }

    /// Read the file again: added jobs start, removed ones are no longer fired (their runs go
    /// on); a file with an error keeps this table.
    pub fn reload(&mut self, reload: &dyn Fn() -> Result<Vec<CronJob>>, log: &Log) {
        match reload() {
            Ok(jobs) => {
                let mut next = Table::new(&jobs, false, self.me);
                // A job that stays keeps its next instant and its waiting one (a reload does not
                // fire it again).
                for job in &mut next.jobs {
                    if let Some(old) = self.job(&job.cron.key) {
                        if old.cron.args == job.cron.args && old.cron.env == job.cron.env {
                            job.next = old.next;
                            job.due = old.due;
                            job.claiming = old.claiming;
                        }
                    }
                }
                log.info(
                    "reloaded",
                    &format!("read the crontab again: {} jobs", next.jobs.len()),
                    &[("jobs", next.jobs.len().into())],
                );
                *self = next;
            }
            Err(e) => log.error(
                "reload_failed",
                &format!(
                    "{e:#}; still serving the {} jobs read before",
                    self.jobs.len()
                ),
            ),
        }
    }
}

/// Until when instant `at` of `job` can still start: its `--catch-up` window, or else the
/// job's next instant (at least a second later).
fn deadline(job: &Job, at: i64) -> i64 {
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

/// Under `-v`: an instant that waited for room here and can no longer start (another replica
/// may well have run it: this one cannot tell without asking Redis).
fn missed(job: &Job, at: i64, log: &Log) {
    let within = if job.cron.catch_up {
        "its --catch-up window"
    } else {
        "its period"
    };
    log.event(
        Level::Debug,
        "gave_up",
        &format!(
            "{}: gave up the {} instant: no room here within {within} (--max-jobs); another \
             replica may have run it",
            job.cron.key,
            rfc3339(at.max(0) as u64)
        ),
        &[("key", job.cron.key.clone().into()), ("instant", at.into())],
    );
}

/// This replica's place for claiming (KEY, instant): a hash, different on every replica.
fn order(me: u64, key: &str, at: i64) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (me, key, at).hash(&mut h);
    h.finish()
}
