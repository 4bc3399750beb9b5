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
//! checked [`super::fleets::FALLBACK_MS`] after it is due by the two replicas after its owners in
//! turn, with one read-only call per fleet for all such instants; one still undecided is claimed
//! by the checker. While the fleet changes (its live or full replicas changed), views disagree until
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
use super::manual::{ManualClaim, Manuals};
use super::rank::{self, fnv, owner, rank};
use crate::replica::claim::{group, Group, Reached, ToCheck};
use crate::store::lock::InstantKind;
use crate::store::members::{FleetView, Poke};

pub use super::entry::Entry;
use super::entry::{missed, GivenUp, Pending};
pub use super::fleets::Fleets;
use crate::clock::redis_millis;
use crate::config::CronJob;
use crate::log::Log;

/// The instants of one group to check together: a job's configuration reaches its servers.
pub struct CheckBatch {
    pub group: Group,
    pub config: std::sync::Arc<crate::config::RunConfig>,
    pub items: Vec<ToCheck>,
}

/// A waiting instant this replica may claim now, in the order claims go out: the oldest first,
/// and at one instant in an order of this replica's own.
struct Ready {
    at: i64,
    order: u64,
    job: usize,
}

/// An instant to claim now: KEY's, with its job's configuration; scheduled, manual, or the one
/// that waits (`instant` 0).
pub struct ToClaim {
    pub key: String,
    pub config: std::sync::Arc<crate::config::RunConfig>,
    pub instant: i64,
    pub kind: InstantKind,
}

/// An instant a claim named: KEY's, scheduled, manual or the one that waits (`instant` 0).
#[derive(Clone, Copy)]
pub struct Claimed<'k> {
    pub key: &'k str,
    pub instant: i64,
    pub kind: InstantKind,
}

/// A run of KEY that ended here and said how (its `ended` report).
pub struct RunEnded<'k> {
    pub key: &'k str,
    /// Its command failed (or never started).
    pub failed: bool,
    /// The instant it ran for (none for a run without one), and whether it was manual.
    pub instant: Option<i64>,
    pub manual: bool,
}

/// A run of KEY that is gone without saying how it ended.
pub struct RunGone<'k> {
    pub key: &'k str,
    pub instant: Option<i64>,
    pub manual: bool,
    /// Its claim was undone (no command can be left): its instant is claimed again while it can
    /// still start.
    pub undone: bool,
    /// When its lock lapses, if it may have been left held: its attempt is abandoned then.
    pub lapses_at: Option<i64>,
}

/// The jobs, by KEY too, and who serves them.
pub struct Table {
    pub jobs: Vec<Entry>,
    index: HashMap<String, usize>,
    /// Who owns and checks each instant, as the fleets' views say.
    pub fleets: Fleets,
    /// Instants this replica gave up (no room in time, Redis unreachable, the loop late, a
    /// reload): to record missed, with the reason, under their job's configuration then.
    pub gave_up: Vec<Pending>,
    /// Fleets a reload left (their jobs changed): to say so in a heartbeat.
    pub left: Vec<Reached>,
    /// How many times the file was read again (and a new table made from it).
    pub loaded: u64,
    /// Which jobs a turn looks at: those come due, those with an instant waiting.
    agenda: Agenda,
    /// The instants claimed apart from the schedule: manual ones (`--trigger`), and each job's
    /// that waits under `--overlap queue`.
    manuals: Manuals,
    /// Its groups, each with one of its jobs' configuration (to reach its servers), and the
    /// shortest `--ttl`: read at each heartbeat, found once.
    groups: Vec<Reached>,
    shortest_ttl: Duration,
}

impl Table {
    /// `first`: jobs with `--catch-up` are due at once (a replica that starts late catches up).
    pub fn new(jobs: &[CronJob], first: bool, me: &str) -> Table {
        let now = redis_millis();
        let mut jobs: Vec<Entry> = jobs
            .iter()
            .map(|c| Entry::new(c.clone(), group(&c.run.config), first, now))
            .collect();
        name_fleets(&mut jobs);
        let index = jobs
            .iter()
            .enumerate()
            .map(|(i, j)| (j.cron.key.clone(), i))
            .collect();
        let mut table = Table {
            jobs,
            index,
            fleets: Fleets::new(me),
            gave_up: Vec::new(),
            left: Vec::new(),
            loaded: 0,
            agenda: Agenda::default(),
            manuals: Manuals::default(),
            groups: Vec::new(),
            shortest_ttl: Duration::from_secs(30),
        };
        for job in &table.jobs {
            if !table.groups.iter().any(|r| r.group == job.group) {
                table.groups.push(Reached {
                    group: job.group.clone(),
                    config: job.cron.run.config.clone(),
                });
            }
        }
        let ttls = table.jobs.iter().map(|j| j.cron.run.config.timing.ttl);
        table.shortest_ttl = ttls.min().unwrap_or(Duration::from_secs(30));
        table.reindex();
        table
    }

    /// The agenda again from every job (a new table, a reload that kept jobs' times).
    fn reindex(&mut self) {
        let jobs = self.jobs.iter().map(|j| (j.comes_due(), j.has_due()));
        self.agenda = Agenda::new(jobs);
    }

    /// Job `i`'s time or waiting instant may have changed: the agenda follows.
    fn noted(&mut self, i: usize) {
        let job = &self.jobs[i];
        self.agenda.set(i, job.comes_due(), job.has_due());
    }

    /// What job `i` gave up: said (under `-v`) and kept to be recorded missed.
    fn give_up(&mut self, i: usize, given: Vec<GivenUp>, log: &Log) {
        let job = &self.jobs[i];
        for g in given {
            missed(job, &g, log);
            self.gave_up.push(Pending::of(&job.cron, &g));
        }
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
        let me = &self.fleets.me;
        if let Some(old) = self.fleets.fresh(&group) {
            let gone: Vec<&String> = old.live.iter().filter(|m| !view.live.contains(m)).collect();
            if !gone.is_empty() {
                let at = redis_millis();
                let mut again = Vec::new();
                for (i, job) in self
                    .jobs
                    .iter()
                    .enumerate()
                    .filter(|(_, j)| j.group == group)
                {
                    let Some(last) = job.retried() else {
                        continue;
                    };
                    let was = owner(old, me, &job.cron.key, last, job.shares);
                    if gone.contains(&&was)
                        && owner(&view, me, &job.cron.key, last, job.shares) == *me
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
        self.fleets.set_view(group, view)
    }

    /// The replica's clock was just measured against Redis's for the first time: the jobs'
    /// next instants were chosen by this host's clock, and those that Redis's clock has passed
    /// meanwhile are not this replica's to answer for (it did not serve then): each job's next
    /// is chosen again from now, by Redis's clock.
    pub fn rebase(&mut self) {
        let now = redis_millis();
        for i in 0..self.jobs.len() {
            if self.jobs[i].rebase(now) {
                self.noted(i);
            }
        }
    }

    /// How many instants wait for a claim.
    pub fn waiting(&self) -> usize {
        let owns = |j: &Entry, at| self.fleets.mine(j, at);
        self.agenda
            .waiting()
            .map(|i| &self.jobs[i])
            .filter(|j| j.waiting().is_some_and(|d| j.claims(&d, &owns)))
            .count()
    }

    /// The instants other replicas own that are due for a check ([`super::fleets::FALLBACK_MS`]
    /// after them), by group (with a job's configuration to reach it); each is marked asked.
    pub fn due_checks(&mut self) -> Vec<CheckBatch> {
        let now = redis_millis();
        let owns = |j: &Entry, at| self.fleets.mine(j, at);
        let mut out: Vec<CheckBatch> = Vec::new();
        let mut asked = Vec::new();
        for i in self.agenda.waiting() {
            let job = &self.jobs[i];
            let Some(d) = job.unchecked(&owns) else {
                continue;
            };
            if self.fleets.check_at(job, &d).is_none_or(|t| now < t) {
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
                    config: job.cron.run.config.clone(),
                    items: vec![item],
                }),
            }
            asked.push(i);
        }
        for i in asked {
            self.jobs[i].check_sent();
        }
        out
    }

    /// A check's answer for instant `at` of KEY: decided (its run started, or it was recorded)
    /// or not, in which case this replica claims it.
    pub fn checked(&mut self, key: &str, at: i64, decided: bool) {
        let Some(i) = self.index.get(key).copied() else {
            return;
        };
        self.jobs[i].checked(at, decided);
        self.noted(i);
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
        let now = redis_millis();
        let owns = |j: &Entry, at| self.fleets.mine(j, at);
        self.agenda
            .waiting()
            .map(|i| &self.jobs[i])
            .flat_map(|j| {
                let check = j
                    .unchecked(&owns)
                    .and_then(|d| self.fleets.check_at(j, &d))
                    .map(|t| t.max(now));
                [j.waiting().map(|d| d.until), j.retry_at(now), check]
            })
            .flatten()
            .chain(self.agenda.next_come())
            .chain(self.manuals.next_wake())
            .min()
    }

    /// Move every instant that came due into its job's waiting place; a waiting instant that can
    /// no longer start is given up, with one line, to be recorded missed. Instants the loop came
    /// to too late (it was frozen, or the machine saturated) are given up as late.
    pub fn advance(&mut self, log: &Log) {
        let now = redis_millis();
        for i in self.agenda.waiting().collect::<Vec<_>>() {
            let owns = |j: &Entry, at| self.fleets.mine(j, at);
            let given = self.jobs[i].expire(now, &owns);
            if let Some(given) = given {
                self.give_up(i, vec![given], log);
            }
            // Only a job whose instant no longer waits changed.
            if !self.jobs[i].has_due() {
                self.noted(i);
            }
        }
        for i in self.agenda.take_come(now) {
            let owns = |j: &Entry, at| self.fleets.mine(j, at);
            let given = self.jobs[i].come_due(now, &owns);
            self.give_up(i, given, log);
            self.noted(i);
        }
    }

    /// Up to `room` waiting instants to claim now, in this replica's order; each is marked in
    /// flight until its claim comes back ([`Table::answered`], [`Table::claim_back`]).
    pub fn take_due(&mut self, room: usize) -> Vec<ToClaim> {
        if room == 0 {
            return Vec::new();
        }
        let now = redis_millis();
        let owns = |j: &Entry, at| self.fleets.mine(j, at);
        // Scheduled instants first, then the manual ones. Oldest first; at one instant, in an
        // order of this replica's own.
        let mut ready: Vec<Ready> = self
            .agenda
            .waiting()
            .filter_map(|i| {
                let job = &self.jobs[i];
                let d = job.claimable(now, &owns)?;
                let order = rank(&self.fleets.me, &job.cron.key, d.at);
                Some(Ready {
                    at: d.at,
                    order,
                    job: i,
                })
            })
            .collect();
        ready.sort_unstable_by_key(|r| (r.at, r.order, r.job));
        ready.truncate(room);
        let mut out = Vec::new();
        for r in ready {
            let job = &mut self.jobs[r.job];
            job.claim_sent();
            out.push(ToClaim {
                key: job.cron.key.clone(),
                config: job.cron.run.config.clone(),
                instant: r.at,
                kind: InstantKind::Scheduled,
            });
        }
        for ManualClaim { key, instant, kind } in self.manuals.take_due(room - out.len()) {
            let Some(job) = self.job(&key) else {
                // Its job was removed by a reload: nothing claims it.
                self.manuals.answered(&key, instant, None);
                continue;
            };
            let config = job.cron.run.config.clone();
            out.push(ToClaim {
                key,
                config,
                instant,
                kind,
            });
        }
        out
    }

    /// A claim of KEY came back: `done` unless it failed (Redis could not be asked), in which case
    /// the instant waits again, for a while.
    pub fn answered(&mut self, key: &str, done: bool, log: &Log) {
        let Some(i) = self.index.get(key).copied() else {
            return;
        };
        let superseded = self.jobs[i].answered(done, redis_millis());
        self.give_up(i, superseded.into_iter().collect(), log);
        self.noted(i);
    }

    /// Look at KEY again at `at` (Unix ms): a run of it failed, or the lock of the run that holds
    /// it elsewhere lapses then (with `--retries`, an abandoned attempt is due again).
    fn look_again(&mut self, key: &str, at: i64) {
        if let Some(i) = self.index.get(key).copied() {
            self.jobs[i].look_at(at);
            self.noted(i);
        }
    }

    /// The pokes a heartbeat brought (`--trigger`): those of jobs this table serves wait to be
    /// claimed now.
    pub fn poked(&mut self, pokes: Vec<Poke>) {
        let index = &self.index;
        self.manuals.poked(pokes, |key| index.contains_key(key));
    }

    /// The claim of `claimed` is done with, or its instant is to be looked at again at `again`
    /// (a scheduled one through its job; a manual one, or the one that waits, here too).
    pub fn claim_back(&mut self, claimed: Claimed<'_>, again: Option<i64>) {
        match (claimed.kind, again) {
            (InstantKind::Scheduled, Some(at)) => self.look_again(claimed.key, at),
            (InstantKind::Scheduled, None) => {}
            (_, again) => self.manuals.answered(claimed.key, claimed.instant, again),
        }
    }

    /// KEY's instant that waits (`--overlap queue`) is claimed at `at` at the latest: the lock
    /// it waits for lapses then (its replica died), unless the run that holds it ends here first.
    pub fn queue_at(&mut self, key: &str, at: i64) {
        self.manuals.queued(key, at);
    }

    /// A run ended here: the instant that waits behind it, and its job's manual instants that
    /// wait, are claimed now; with `--retries`, a failed run's instant is looked at again a second
    /// later.
    pub fn run_ended(&mut self, ended: RunEnded<'_>) {
        let now = redis_millis();
        let Some(config) = self.job(ended.key).map(|j| j.cron.run.config.clone()) else {
            return;
        };
        if config.overlap.waits() {
            self.manuals.queued(ended.key, now);
        }
        self.manuals.run_ended(ended.key, now);
        if ended.failed && config.retries > 0 {
            self.retry(ended.key, ended.instant, ended.manual, now + 1000);
        }
    }

    /// A run is gone without saying how it ended: an undone claim's instant is claimed again
    /// while it can still start (else recorded missed at its deadline); the instant that waits
    /// behind it, and with `--retries` its own, are looked at when its lock lapses.
    pub fn run_gone(&mut self, gone: RunGone<'_>) {
        let now = redis_millis();
        if let (true, Some(at)) = (gone.undone, gone.instant) {
            match gone.manual {
                true => self.manuals.look_again(gone.key, at, now),
                false => self.look_again(gone.key, at),
            }
        }
        let Some(job) = self.job(gone.key) else {
            return;
        };
        let (waits, retries) = (
            job.cron.run.config.overlap.waits(),
            job.cron.run.config.retries > 0,
        );
        if let (true, Some(at)) = (waits, gone.lapses_at) {
            self.manuals.queued(gone.key, at);
        }
        if let (true, Some(at)) = (retries, gone.lapses_at) {
            self.retry(gone.key, gone.instant, gone.manual, at);
        }
    }

    /// Look at KEY's instant again at `at` (`--retries`): a manual one as such, a scheduled one
    /// through its job (Redis picks the instant due).
    fn retry(&mut self, key: &str, instant: Option<i64>, manual: bool, at: i64) {
        match (manual, instant) {
            (true, Some(instant)) => self.manuals.look_again(key, instant, at),
            (true, None) => {}
            (false, _) => self.look_again(key, at),
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
                for i in 0..self.jobs.len() {
                    let old = &self.jobs[i];
                    if jobs.iter().any(|j| j.same_as(&old.cron)) {
                        continue;
                    }
                    let owns = |j: &Entry, at| self.fleets.mine(j, at);
                    let dropped = old.dropped(&owns);
                    self.give_up(i, dropped.into_iter().collect(), log);
                }
                let mut next = Table::new(&jobs, false, &self.fleets.me);
                // A fleet this replica no longer serves (its jobs changed) is left at once, so
                // its other replicas do not wait for this one to lapse.
                let now = next.groups();
                self.left = self
                    .groups()
                    .into_iter()
                    .filter(|r| !now.iter().any(|n| n.group == r.group))
                    .collect();
                next.left = std::mem::take(&mut self.left);
                std::mem::swap(&mut next.fleets, &mut self.fleets);
                std::mem::swap(&mut next.manuals, &mut self.manuals);
                next.loaded = self.loaded + 1;
                // A job that stays keeps its next instant and its waiting one (a reload does not
                // fire it again).
                for job in &mut next.jobs {
                    if let Some(old) = self.job(&job.cron.key) {
                        if old.cron.same_as(&job.cron) {
                            job.keep(old);
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
                    .run
                    .env
                    .iter()
                    .map(|v| format!("{}={}", v.name, v.value))
                    .collect();
                format!("{}\0{}\0{}", c.key, c.words.join("\0"), env.join("\0"))
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
