//! The replica's jobs and, for each, when it is next due and which instant waits to be claimed.
//!
//! An instant that comes due waits until this replica has room (`--max-jobs` counts the runs
//! it won and the claims it has in flight); it is given up only when it can no longer start: at
//! the job's next instant, or, with `--catch-up`, when it leaves the window. Every replica that
//! gives it up asks for it to be recorded `missed`, with the reason (the ledger takes the first,
//! and never over a run). Due instants are claimed in an order of this replica's own (a hash of
//! its identity, the KEY and the instant), so replicas that are all due at once mostly claim
//! different jobs first.
//!
//! Ownership is a preference, never a condition: an instant the views give another replica is
//! checked [`FALLBACK_MS`] after it is due by the two replicas after its owners in turn, with
//! one read-only call per fleet for all such instants; one still undecided is claimed by the
//! checker. While the fleet changes (its live or full replicas changed), views disagree until
//! every replica had its next heartbeat (they go at the fleet's shared slots, so within a
//! period): a replica then also checks the instants it owned or checked in the views it held
//! within a period (and [`super::beat::BEAT_AGAIN`]) before, so every replica that any of those
//! views named still answers for its instants; and with no fresh view at all, it checks every
//! instant. So a dead, frozen,
//! sick or ghost owner, and views that disagree while the fleet changes, cost an instant about a
//! quarter of a second, and a fleet two checks an instant when settled and a few while it
//! changes, whatever its size. An instant given up is recorded missed by those that claim or
//! checked it.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::Result;

use super::agenda::Agenda;
use super::rank::{self, checker, fnv, owner, rank};
use crate::clock::Instant;
use crate::replica::claim::{group, Group, Reached, ToCheck};
use crate::store::members::FleetView;

pub use super::entry::Entry;
use super::entry::{deadline, missed, Check, Due, Pending};
use crate::clock::unix_millis;
use crate::config::CronJob;
use crate::log::Log;
use crate::record::ledger::MissedReason;

/// After a claim that failed (Redis down, or a failover under way: its primary's writes may be
/// dropped), how long before the next try (ms): a failover's second costs its instants a quarter
/// second each, late, instead of the instant.
pub const RETRY_MS: i64 = 250;

/// How long after it is due an instant another replica owns is checked, and claimed here when
/// still undecided (ms). The owner claims `LEAD_MS` (`entry.rs`) ahead, so by then its claim
/// has long been answered on a healthy fleet; well under the shortest period (1 s).
pub const FALLBACK_MS: i64 = 250;

/// The most instants of one job the loop records missed at once when it comes late to them, and
/// how old the oldest may be (ms): older ones may have left the ledger, which keeps 64.
const MAX_LATE: usize = 8;
/// The most earlier views of a fleet kept (see `Table::earlier`).
const EARLIER_MAX: usize = 8;
const LATE_WINDOW_MS: i64 = 60_000;

/// The instants of one group to check together: a job's configuration reaches its servers.
pub struct CheckBatch {
    pub group: Group,
    pub config: std::sync::Arc<crate::config::RunConfig>,
    pub items: Vec<ToCheck>,
}

/// A scheduled instant to claim now: the job (its index in the table) and the instant.
pub struct ToClaim {
    pub job: usize,
    pub instant: i64,
}

/// The jobs, by KEY too, and who serves them.
pub struct Table {
    pub jobs: Vec<Entry>,
    index: HashMap<String, usize>,
    /// This replica's identity (its id in the live set), for the ranking.
    me: String,
    /// The last view of each group's replicas, and when it came.
    views: HashMap<Group, (FleetView, Instant)>,
    /// A group's earlier views that differ from its last, each with when it was replaced: kept
    /// for [`Table::settle`], while the fleet's views may disagree (its instants are checked
    /// under them too).
    earlier: HashMap<Group, Vec<(FleetView, Instant)>>,
    /// How long a view counts (a replica lapses after this without a heartbeat).
    pub lapse: Duration,
    /// How long the fleet's views may disagree after a change: a heartbeat period and
    /// [`super::beat::BEAT_AGAIN`] (every replica has had a heartbeat since).
    pub settle: Duration,
    /// Instants this replica gave up (no room in time, Redis unreachable, the loop late, a
    /// reload): to record missed, with the reason, under their job's configuration then.
    pub gave_up: Vec<Pending>,
    /// Fleets a reload left (their jobs changed): to say so in a heartbeat.
    pub left: Vec<Reached>,
    /// When the table was made: until a first view comes (or a lapse passes without one), an
    /// instant waits for it rather than being claimed by every replica.
    made: Instant,
    /// How many times the file was read again (and a new table made from it).
    pub loaded: u64,
    /// Which jobs a turn looks at: those come due, those with an instant waiting.
    agenda: Agenda,
    /// Its groups, each with one of its jobs' configuration (to reach its servers), and the
    /// shortest `--ttl`: read at each heartbeat, found once.
    groups: Vec<Reached>,
    shortest_ttl: Duration,
}

impl Table {
    /// `first`: jobs with `--catch-up` are due at once (a replica that starts late catches up).
    pub fn new(jobs: &[CronJob], first: bool, me: &str) -> Table {
        let now = unix_millis() as i64;
        let jobs: Vec<Entry> = jobs
            .iter()
            .map(|c| Entry {
                next: None,
                early: 0,
                due: None,
                last: None,
                group: group(&c.config),
                shares: 1,
                claiming: false,
                queued: None,
                not_before: 0,
                cron: c.clone(),
            })
            .collect();
        let mut jobs = jobs;
        for job in &mut jobs {
            if first && job.cron.catch_up {
                job.look_at(now);
            } else {
                job.schedule_after(now);
            }
        }
        name_fleets(&mut jobs);
        let index = jobs
            .iter()
            .enumerate()
            .map(|(i, j)| (j.cron.key.clone(), i))
            .collect();
        let mut table = Table {
            jobs,
            index,
            me: me.to_string(),
            views: HashMap::new(),
            earlier: HashMap::new(),
            lapse: Duration::from_secs(2),
            settle: Duration::from_millis(1500),
            made: Instant::now(),
            gave_up: Vec::new(),
            left: Vec::new(),
            loaded: 0,
            agenda: Agenda::default(),
            groups: Vec::new(),
            shortest_ttl: Duration::from_secs(30),
        };
        for job in &table.jobs {
            if !table.groups.iter().any(|r| r.group == job.group) {
                table.groups.push(Reached {
                    group: job.group.clone(),
                    config: job.cron.config.clone(),
                });
            }
        }
        let ttls = table.jobs.iter().map(|j| j.cron.config.timing.ttl);
        table.shortest_ttl = ttls.min().unwrap_or(Duration::from_secs(30));
        table.reindex();
        table
    }

    /// The agenda again from every job (a new table, a reload that kept jobs' times).
    fn reindex(&mut self) {
        let jobs = self.jobs.iter().map(|j| (j.comes_due(), j.due.is_some()));
        self.agenda = Agenda::new(jobs);
    }

    /// Job `i`'s time or waiting instant may have changed: the agenda follows.
    fn noted(&mut self, i: usize) {
        let job = &self.jobs[i];
        self.agenda.set(i, job.comes_due(), job.due.is_some());
    }

    /// The shortest `--ttl` of the jobs (the heartbeats' period follows it: `beat::period`).
    pub fn shortest_ttl(&self) -> Duration {
        self.shortest_ttl
    }

    /// The groups the jobs claim in, each with a job's configuration to reach it.
    pub fn groups(&self) -> Vec<Reached> {
        self.groups.clone()
    }

    /// A heartbeat's view of `group`. With `--retries`, a job whose latest instant belonged to a
    /// replica that left and is now this one's is looked at again at once: its attempt may have
    /// been abandoned. Whether it names other live or full replicas than the last (or is the
    /// first).
    pub fn set_view(&mut self, group: Group, view: FleetView) -> bool {
        let now = Instant::now();
        let before = self.fresh(&group).cloned();
        if let Some(old) = &before {
            let gone: Vec<&String> = old.live.iter().filter(|m| !view.live.contains(m)).collect();
            if !gone.is_empty() {
                let at = unix_millis() as i64;
                let mut again = Vec::new();
                for (i, job) in self
                    .jobs
                    .iter()
                    .enumerate()
                    .filter(|(_, j)| j.group == group)
                {
                    let Some(last) = job.last.filter(|_| job.cron.retries > 0) else {
                        continue;
                    };
                    let was = owner(old, &self.me, &job.cron.key, last, job.shares);
                    if gone.contains(&&was)
                        && owner(&view, &self.me, &job.cron.key, last, job.shares) == self.me
                    {
                        again.push(i);
                    }
                }
                for i in again {
                    self.jobs[i].look_at(at);
                    self.noted(i);
                }
            }
        }
        // Views may disagree on who owns or checks an instant only after the live replicas, or
        // the full ones among them, changed: the view replaced is kept while others may hold it.
        let alike =
            |a: &[String], b: &[String]| a.len() == b.len() && a.iter().all(|m| b.contains(m));
        let settle = self.settle;
        let earlier = self.earlier.entry(group.clone()).or_default();
        earlier.retain(|(_, replaced)| replaced.elapsed() < settle);
        let changed = match self.views.get(&group) {
            Some((old, _)) if alike(&old.live, &view.live) && alike(&old.full, &view.full) => false,
            Some((old, _)) => {
                earlier.push((old.clone(), now));
                // Bounded: a fleet that changes at every heartbeat keeps its last few views.
                if earlier.len() > EARLIER_MAX {
                    earlier.remove(0);
                }
                true
            }
            None => true,
        };
        self.views.insert(group, (view, now));
        changed
    }

    /// When this replica checks `d` of `job`, another replica's instant (Unix ms): [`FALLBACK_MS`]
    /// after it, as one of its two checkers, as its owner or checker in a view it held lately
    /// (the fleet changed), or with no fresh view; never otherwise.
    fn check_at(&self, job: &Entry, d: &Due) -> Option<i64> {
        // Both checkers at once: Redis wakes once for both (a wake costs it more than the
        // reads), and when both find an instant undecided, one claim wins.
        let checks = match self.fresh(&job.group) {
            Some(view) => {
                checker(view, &self.me, d.at, job.shares).is_some()
                    || self.answered_before(job, d.at)
            }
            None => true,
        };
        checks.then_some(d.at + job.offset() + FALLBACK_MS)
    }

    /// Whether a view of `job`'s fleet this replica held lately ([`Table::settle`]) made it owner or checker
    /// of instant `at`: the replicas that still hold that view count on it.
    fn answered_before(&self, job: &Entry, at: i64) -> bool {
        let Some(earlier) = self.earlier.get(&job.group) else {
            return false;
        };
        earlier
            .iter()
            .filter(|(_, replaced)| replaced.elapsed() < self.settle)
            .any(|(view, _)| {
                checker(view, &self.me, at, job.shares).is_some()
                    || owner(view, &self.me, &job.cron.key, at, job.shares) == self.me
            })
    }

    /// The group's view, if it is recent enough to trust.
    fn fresh(&self, group: &Group) -> Option<&FleetView> {
        let (view, when) = self.views.get(group)?;
        (when.elapsed() < self.lapse).then_some(view)
    }

    /// This replica claims `d` of `job` now: anyone may, it is its turn, or its owner did not
    /// claim it in time (checked).
    fn claims(&self, job: &Entry, d: &Due) -> bool {
        d.anyone || d.check == Check::Open || self.mine(job, d.at)
    }

    /// Whether this replica answers for `d` of `job` when it can no longer start (records it
    /// missed, unless it ran): it claims it, or it checked it. Any other replica's instant is
    /// dropped silently: its owner and checkers answer for it.
    fn answers_for(&self, job: &Entry, d: &Due) -> bool {
        self.claims(job, d) || d.check != Check::Ahead
    }

    /// This replica claims instant `at` of `job`: it is its turn, or it has no view.
    fn mine(&self, job: &Entry, at: i64) -> bool {
        match self.fresh(&job.group) {
            // A stale view (heartbeats failing): claim as if alone. None yet: wait for the first.
            None => self.views.contains_key(&job.group) || self.made.elapsed() >= self.lapse,
            Some(view) => owner(view, &self.me, &job.cron.key, at, job.shares) == self.me,
        }
    }

    /// How many instants wait for a claim.
    pub fn waiting(&self) -> usize {
        self.agenda
            .waiting()
            .map(|i| &self.jobs[i])
            .filter(|j| !j.claiming && j.due.is_some_and(|d| self.claims(j, &d)))
            .count()
    }

    /// The instants other replicas own that are due for a check ([`FALLBACK_MS`] after them),
    /// by group (with a job's configuration to reach it); each is marked asked.
    pub fn due_checks(&mut self) -> Vec<CheckBatch> {
        let now = unix_millis() as i64;
        let mut out: Vec<CheckBatch> = Vec::new();
        for i in self.agenda.waiting().collect::<Vec<_>>() {
            let job = &self.jobs[i];
            let Some(d) = job.due.filter(|d| d.check == Check::Ahead && !job.claiming) else {
                continue;
            };
            if self.claims(job, &d) || self.check_at(job, &d).is_none_or(|t| now < t) {
                continue;
            }
            let item = ToCheck {
                key: job.cron.key.clone(),
                instant: d.at,
            };
            match out.iter_mut().find(|b| b.group == job.group) {
                Some(batch) => batch.items.push(item),
                None => out.push(CheckBatch {
                    group: job.group.clone(),
                    config: job.cron.config.clone(),
                    items: vec![item],
                }),
            }
            if let Some(d) = &mut self.jobs[i].due {
                d.check = Check::Asked;
            }
        }
        out
    }

    /// A check's answer for instant `at` of KEY: decided (its run started, or it was recorded)
    /// or not, in which case this replica claims it.
    pub fn checked(&mut self, key: &str, at: i64, decided: bool) {
        let Some(i) = self.index.get(key).copied() else {
            return;
        };
        let job = &mut self.jobs[i];
        match &mut job.due {
            Some(d) if d.at == at && decided => job.due = None,
            Some(d) if d.at == at => d.check = Check::Open,
            _ => {}
        }
        self.noted(i);
    }

    /// Whether KEY is one of its jobs.
    pub fn serves(&self, key: &str) -> bool {
        self.index.contains_key(key)
    }

    pub fn job(&self, key: &str) -> Option<&Entry> {
        let i = *self.index.get(key)?;
        self.jobs.get(i)
    }

    /// When something next needs the loop: an instant comes due, a waiting one can be tried
    /// again or gives up.
    ///
    /// Never a time already past for a waiting instant: one that waits for room (or for another
    /// replica) is looked at again when room comes (a run's end wakes the loop) or a view comes,
    /// and once when it can no longer start; one whose claim failed, when it may be tried again.
    /// (A past time here made the loop spin until the instant's deadline.) A check due now is
    /// sent in the turn that computes this.
    pub fn next_wake(&self) -> Option<i64> {
        let now = unix_millis() as i64;
        self.agenda
            .waiting()
            .map(|i| &self.jobs[i])
            .flat_map(|j| {
                let waiting = j.due.filter(|_| !j.claiming);
                let retry = waiting.map(|_| j.not_before).filter(|t| *t > now);
                let check = waiting
                    .filter(|d| d.check == Check::Ahead && !self.claims(j, d))
                    .and_then(|d| self.check_at(j, &d))
                    .map(|t| t.max(now));
                [waiting.map(|d| d.until), retry, check]
            })
            .flatten()
            .chain(self.agenda.next_come())
            .min()
    }

    /// Move every instant that came due into its job's waiting place; a waiting instant that can
    /// no longer start is given up, with one line, to be recorded missed. Instants the loop came
    /// to too late (it was frozen, or the machine saturated) are given up as late.
    pub fn advance(&mut self, log: &Log) {
        let now = unix_millis() as i64;
        for i in self.agenda.waiting().collect::<Vec<_>>() {
            let job = &self.jobs[i];
            if let Some(d) = job.due.filter(|d| d.until <= now && !job.claiming) {
                if self.answers_for(job, &d) {
                    missed(job, d.at, d.reason, log);
                    self.gave_up.push(Pending::of(&job.cron, d.at, d.reason));
                }
                self.jobs[i].due = None;
                self.noted(i);
            }
        }
        for i in self.agenda.take_come(now) {
            self.come_due(i, now, log);
            self.noted(i);
        }
    }

    /// Job `i` came due (its next instant, less its lead, is past `now`): its instants the loop
    /// came too late to are given up as late, the one that can still start waits, and its next
    /// one is scheduled.
    fn come_due(&mut self, i: usize, now: i64, log: &Log) {
        let job = &mut self.jobs[i];
        let Some(mut at) = job.next.filter(|n| *n - job.early <= now) else {
            return;
        };
        let mut late = 0;
        while deadline(job, at) <= now {
            let scheduled = job.cron.schedule.next_after(at - 1) == Some(at);
            if scheduled && late < MAX_LATE && now - at <= LATE_WINDOW_MS {
                late += 1;
                missed(job, at, MissedReason::Late, log);
                self.gave_up
                    .push(Pending::of(&job.cron, at, MissedReason::Late));
            }
            match job.cron.schedule.next_after(at) {
                Some(n) if n - job.early <= now => at = n,
                _ => break,
            }
        }
        job.schedule_after(at.max(now));
        if deadline(job, at) <= now {
            return;
        }
        // Fired at start or looked at again: not an instant of the schedule's (Redis picks the
        // instant due), and this replica claims it whatever the rank.
        let anyone = job.cron.schedule.next_after(at - 1) != Some(at);
        job.last = Some(at);
        if job.claiming {
            // The instant queued behind the claim in flight can no longer start on time either:
            // the claim has not come back (Redis slow, or not answering), so it is given up as
            // unreachable, not dropped.
            let Some((old, old_anyone)) = job.queued.replace((at, anyone)) else {
                return;
            };
            let mut old = Due::new(old, deadline(job, old), old_anyone);
            old.reason = MissedReason::Unreachable;
            let job = &self.jobs[i];
            if self.answers_for(job, &old) {
                missed(job, old.at, old.reason, log);
                self.gave_up
                    .push(Pending::of(&job.cron, old.at, old.reason));
            }
            return;
        }
        // A look again (a run failed, a lock lapses) while an instant still waits here: that
        // instant is the one the look is for (Redis picks the instant due), claimed now whatever
        // the rank; giving it up would record it missed before its claim.
        if let Some(waiting) = job.due.as_mut().filter(|d| anyone && d.until > now) {
            waiting.anyone = true;
            return;
        }
        let old = job.due.replace(Due::new(at, deadline(job, at), anyone));
        // The instant this one replaces can no longer start on time.
        if let Some(old) = old {
            let job = &self.jobs[i];
            if self.answers_for(job, &old) {
                missed(job, old.at, old.reason, log);
                self.gave_up
                    .push(Pending::of(&job.cron, old.at, old.reason));
            }
        }
    }

    /// Up to `room` waiting instants to claim now, in this replica's order; each is marked in
    /// flight until [`Table::answered`].
    pub fn take_due(&mut self, room: usize) -> Vec<ToClaim> {
        if room == 0 {
            return Vec::new();
        }
        let now = unix_millis() as i64;
        // Oldest first; at one instant, in an order of this replica's own.
        let mut ready: Vec<(i64, u64, usize)> = self
            .agenda
            .waiting()
            .map(|i| (i, &self.jobs[i]))
            .filter(|(_, j)| !j.claiming && j.not_before <= now)
            .filter_map(|(i, j)| j.due.map(|d| (i, j, d)))
            .filter(|(_, j, d)| self.claims(j, d))
            .map(|(i, j, d)| (d.at, rank(&self.me, &j.cron.key, d.at), i))
            .collect();
        ready.sort_unstable();
        ready.truncate(room);
        for (_, _, i) in &ready {
            self.jobs[*i].claiming = true;
        }
        ready
            .into_iter()
            .map(|(instant, _, job)| ToClaim { job, instant })
            .collect()
    }

    /// A claim of KEY came back: `done` unless it failed (Redis could not be asked), in which case
    /// the instant waits again, for a while.
    pub fn answered(&mut self, key: &str, done: bool, log: &Log) {
        let Some(i) = self.index.get(key).copied() else {
            return;
        };
        let job = &mut self.jobs[i];
        job.claiming = false;
        let mut superseded = None;
        if !done {
            if let Some(d) = &mut job.due {
                d.reason = MissedReason::Unreachable;
            }
        }
        if let Some((at, anyone)) = job.queued.take() {
            if let Some(old) = job.due.filter(|_| !done) {
                missed(job, old.at, old.reason, log);
                superseded = Some(Pending::of(&job.cron, old.at, old.reason));
            }
            job.due = Some(Due::new(at, deadline(job, at), anyone));
        } else if done {
            job.due = None;
        }
        if !done {
            job.not_before = unix_millis() as i64 + RETRY_MS;
        }
        self.gave_up.extend(superseded);
        self.noted(i);
    }

    /// Look at KEY again at `at` (Unix ms): a run of it failed, or the lock of the run that holds
    /// it elsewhere lapses then (with `--retries`, an abandoned attempt is due again).
    pub fn look_again(&mut self, key: &str, at: i64) {
        if let Some(i) = self.index.get(key).copied() {
            self.jobs[i].look_at(at);
            self.noted(i);
        }
    }

    /// Read the file again: added jobs start, removed ones are no longer fired (their runs go
    /// on); a file with an error keeps this table. A signal that asked to end while the file
    /// was read is returned.
    pub fn reload(
        &mut self,
        reload: &dyn Fn() -> Result<Vec<CronJob>>,
        log: &Log,
    ) -> Option<libc::c_int> {
        match reload() {
            Ok(jobs) => {
                // The instant that waited for a job removed or changed is given up, recorded
                // missed (`reload`) under the job as it was (judged with this table's views).
                for old in &self.jobs {
                    let kept = jobs.iter().any(|j| {
                        j.key == old.cron.key && j.args == old.cron.args && j.env == old.cron.env
                    });
                    let waiting = old
                        .due
                        .filter(|d| !old.claiming && self.answers_for(old, d));
                    if let (false, Some(d)) = (kept, waiting) {
                        missed(old, d.at, MissedReason::Reload, log);
                        let gave_up = Pending::of(&old.cron, d.at, MissedReason::Reload);
                        self.gave_up.push(gave_up);
                    }
                }
                let mut next = Table::new(&jobs, false, &self.me);
                // A fleet this replica no longer serves (its jobs changed) is left at once, so
                // its other replicas do not wait for this one to lapse.
                let now = next.groups();
                self.left = self
                    .groups()
                    .into_iter()
                    .filter(|r| !now.iter().any(|n| n.group == r.group))
                    .collect();
                next.left = std::mem::take(&mut self.left);
                next.views = std::mem::take(&mut self.views);
                next.earlier = std::mem::take(&mut self.earlier);
                next.lapse = self.lapse;
                next.settle = self.settle;
                next.made = self.made;
                next.loaded = self.loaded + 1;
                // A job that stays keeps its next instant and its waiting one (a reload does not
                // fire it again).
                for job in &mut next.jobs {
                    if let Some(old) = self.job(&job.cron.key) {
                        if old.cron.args == job.cron.args && old.cron.env == job.cron.env {
                            (job.next, job.early) = (old.next, old.early);
                            job.due = old.due;
                            job.last = old.last;
                            job.claiming = old.claiming;
                        }
                    }
                }
                next.gave_up = std::mem::take(&mut self.gave_up);
                next.reindex();
                log.info(
                    "reloaded",
                    &format!("read the crontab again: {} jobs", next.jobs.len()),
                    &[("jobs", next.jobs.len().into())],
                );
                *self = next;
                None
            }
            Err(e) => {
                if let Some(stop) = e.downcast_ref::<crate::signals::Interrupted>() {
                    return Some(stop.0);
                }
                log.error(
                    "reload_failed",
                    &format!(
                        "{e:#}; still serving the {} jobs read before",
                        self.jobs.len()
                    ),
                );
                None
            }
        }
    }
}

/// Name each group's fleet: a hash of the ranking scheme and of the jobs this replica serves in
/// it (KEY, arguments, environment, in KEY order), the same on every replica of the same crontab
/// that ranks alike, so only replicas serving the same jobs rank each other; and split them into
/// shares.
fn name_fleets(jobs: &mut [Entry]) {
    let mut by: HashMap<Group, Vec<usize>> = HashMap::new();
    for (i, j) in jobs.iter().enumerate() {
        by.entry(j.group.clone()).or_default().push(i);
    }
    for members in by.values() {
        let mut lines: Vec<String> = members
            .iter()
            .map(|&i| {
                let c = &jobs[i].cron;
                let env: Vec<String> = c
                    .env
                    .iter()
                    .map(|v| format!("{}={}", v.name, v.value))
                    .collect();
                format!("{}\0{}\0{}", c.key, c.args.join("\0"), env.join("\0"))
            })
            .collect();
        lines.sort();
        lines.insert(0, rank::SCHEME.to_string());
        let fleet = fnv(lines.join("\n").as_bytes());
        let shares = rank::shares(members.len());
        for &i in members {
            jobs[i].group.fleet = fleet;
            jobs[i].shares = shares;
        }
    }
}
