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
use super::entry::{missed, Due, GivenUp, Pending};
use crate::clock::unix_millis;
use crate::config::CronJob;
use crate::log::Log;

/// How long after it is due an instant another replica owns is checked, and claimed here when
/// still undecided (ms). The owner claims `LEAD_MS` (`entry.rs`) ahead, so by then its claim
/// has long been answered on a healthy fleet; well under the shortest period (1 s).
pub const FALLBACK_MS: i64 = 250;

/// The most earlier views of a fleet kept (see `Fleets::earlier`).
const EARLIER_MAX: usize = 8;

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

/// A scheduled instant to claim now: the job (its index in the table) and the instant.
pub struct ToClaim {
    pub job: usize,
    pub instant: i64,
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
    /// Its groups, each with one of its jobs' configuration (to reach its servers), and the
    /// shortest `--ttl`: read at each heartbeat, found once.
    groups: Vec<Reached>,
    shortest_ttl: Duration,
}

/// What this replica knows of the fleets it serves in: the latest view of each (and the views
/// that may still be held elsewhere), and so who owns and who checks each instant.
pub struct Fleets {
    /// This replica's identity (its id in the live set), for the ranking.
    me: String,
    /// The last view of each group's replicas, and when it came.
    views: HashMap<Group, SeenView>,
    /// A group's earlier views that differ from its last, each with when it was replaced: kept
    /// for [`Fleets::settle`], while the fleet's views may disagree (its instants are checked
    /// under them too).
    earlier: HashMap<Group, Vec<SeenView>>,
    /// How long a view counts (a replica lapses after this without a heartbeat).
    pub lapse: Duration,
    /// How long the fleet's views may disagree after a change: a heartbeat period and
    /// [`super::beat::BEAT_AGAIN`] (every replica has had a heartbeat since).
    pub settle: Duration,
    /// When the table was made: until a first view comes (or a lapse passes without one), an
    /// instant waits for it rather than being claimed by every replica.
    made: Instant,
}

/// A view of a fleet, and when it came (or, among the earlier ones, when it was replaced).
#[derive(Clone)]
struct SeenView {
    view: FleetView,
    when: Instant,
}

impl Table {
    /// `first`: jobs with `--catch-up` are due at once (a replica that starts late catches up).
    pub fn new(jobs: &[CronJob], first: bool, me: &str) -> Table {
        let now = unix_millis() as i64;
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
            fleets: Fleets {
                me: me.to_string(),
                views: HashMap::new(),
                earlier: HashMap::new(),
                lapse: Duration::from_secs(2),
                settle: Duration::from_millis(1500),
                made: Instant::now(),
            },
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
                let at = unix_millis() as i64;
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

    /// How many instants wait for a claim.
    pub fn waiting(&self) -> usize {
        let owns = |j: &Entry, at| self.fleets.mine(j, at);
        self.agenda
            .waiting()
            .map(|i| &self.jobs[i])
            .filter(|j| j.waiting().is_some_and(|d| j.claims(&d, &owns)))
            .count()
    }

    /// The instants other replicas own that are due for a check ([`FALLBACK_MS`] after them),
    /// by group (with a job's configuration to reach it); each is marked asked.
    pub fn due_checks(&mut self) -> Vec<CheckBatch> {
        let now = unix_millis() as i64;
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
            .min()
    }

    /// Move every instant that came due into its job's waiting place; a waiting instant that can
    /// no longer start is given up, with one line, to be recorded missed. Instants the loop came
    /// to too late (it was frozen, or the machine saturated) are given up as late.
    pub fn advance(&mut self, log: &Log) {
        let now = unix_millis() as i64;
        for i in self.agenda.waiting().collect::<Vec<_>>() {
            let owns = |j: &Entry, at| self.fleets.mine(j, at);
            if let Some(given) = self.jobs[i].expire(now, &owns) {
                self.give_up(i, vec![given], log);
            }
            self.noted(i);
        }
        for i in self.agenda.take_come(now) {
            let owns = |j: &Entry, at| self.fleets.mine(j, at);
            let given = self.jobs[i].come_due(now, &owns);
            self.give_up(i, given, log);
            self.noted(i);
        }
    }

    /// Up to `room` waiting instants to claim now, in this replica's order; each is marked in
    /// flight until [`Table::answered`].
    pub fn take_due(&mut self, room: usize) -> Vec<ToClaim> {
        if room == 0 {
            return Vec::new();
        }
        let now = unix_millis() as i64;
        let owns = |j: &Entry, at| self.fleets.mine(j, at);
        // Oldest first; at one instant, in an order of this replica's own.
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
        for r in &ready {
            self.jobs[r.job].claim_sent();
        }
        ready
            .into_iter()
            .map(|r| ToClaim {
                job: r.job,
                instant: r.at,
            })
            .collect()
    }

    /// A claim of KEY came back: `done` unless it failed (Redis could not be asked), in which case
    /// the instant waits again, for a while.
    pub fn answered(&mut self, key: &str, done: bool, log: &Log) {
        let Some(i) = self.index.get(key).copied() else {
            return;
        };
        let superseded = self.jobs[i].answered(done, unix_millis() as i64);
        self.give_up(i, superseded.into_iter().collect(), log);
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

impl Fleets {
    /// Keep `view` as `group`'s latest: whether it names other live or full replicas than the
    /// last (or is the first).
    fn set_view(&mut self, group: Group, view: FleetView) -> bool {
        let now = Instant::now();
        // Views may disagree on who owns or checks an instant only after the live replicas, or
        // the full ones among them, changed: the view replaced is kept while others may hold it.
        let alike =
            |a: &[String], b: &[String]| a.len() == b.len() && a.iter().all(|m| b.contains(m));
        let settle = self.settle;
        let earlier = self.earlier.entry(group.clone()).or_default();
        earlier.retain(|seen| seen.when.elapsed() < settle);
        let changed = match self.views.get(&group) {
            Some(old) if alike(&old.view.live, &view.live) && alike(&old.view.full, &view.full) => {
                false
            }
            Some(old) => {
                earlier.push(SeenView {
                    view: old.view.clone(),
                    when: now,
                });
                // Bounded: a fleet that changes at every heartbeat keeps its last few views.
                if earlier.len() > EARLIER_MAX {
                    earlier.remove(0);
                }
                true
            }
            None => true,
        };
        self.views.insert(group, SeenView { view, when: now });
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

    /// Whether a view of `job`'s fleet this replica held lately ([`Fleets::settle`]) made it
    /// owner or checker of instant `at`: the replicas that still hold that view count on it.
    fn answered_before(&self, job: &Entry, at: i64) -> bool {
        let Some(earlier) = self.earlier.get(&job.group) else {
            return false;
        };
        earlier
            .iter()
            .filter(|seen| seen.when.elapsed() < self.settle)
            .any(|seen| {
                checker(&seen.view, &self.me, at, job.shares).is_some()
                    || owner(&seen.view, &self.me, &job.cron.key, at, job.shares) == self.me
            })
    }

    /// The group's view, if it is recent enough to trust.
    fn fresh(&self, group: &Group) -> Option<&FleetView> {
        let seen = self.views.get(group)?;
        (seen.when.elapsed() < self.lapse).then_some(&seen.view)
    }

    /// This replica owns instant `at` of `job`: it is its turn, or it has no view ([`Owns`]).
    fn mine(&self, job: &Entry, at: i64) -> bool {
        match self.fresh(&job.group) {
            // A stale view (heartbeats failing): claim as if alone. None yet: wait for the first.
            None => self.views.contains_key(&job.group) || self.made.elapsed() >= self.lapse,
            Some(view) => owner(view, &self.me, &job.cron.key, at, job.shares) == self.me,
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
