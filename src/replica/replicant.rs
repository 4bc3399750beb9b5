//! The replica's loop state: each room's own state (its runs, its claims, its health, its
//! heartbeats, what its page shows), and the steps of a turn of the loop that route what one
//! room learned to the others: a won claim becomes a run, a run's release goes out on the claims
//! thread's link, a run that cannot start makes the replica sick.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Result};

use crate::clock::Instant;
use crate::clock::{redis_millis, rfc3339};
use crate::config::{CronJob, Replica, RunConfig};
use crate::log::Log;
use crate::record::ledger::MissedReason;
use crate::store::lock::{Held, InstantKind, Undo};

use super::answers::{self, Pending, Unrecorded};
use super::beat::Heartbeats;
use super::claim::{self, Answer, Ask, CheckedInstant, ClaimVerdict, Reached};
use super::claimer::Claims;
use super::health::Health;
use super::reports::{self, Followup};
use super::runs::{RunHeard, Runs, Starting};
use super::table::{Claimed, RunEnded, RunGone, Table, ToClaim};
use super::watched;

/// The longest a replica waits, at its end, for its leave and its last releases and records to
/// reach Redis (a healthy Redis takes milliseconds; a hung one must not hold up a rollout).
const LEAVE_WITHIN: Duration = Duration::from_secs(1);

/// Where the replica is in its life.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    /// Claiming due instants and running them.
    Serving,
    /// Asked to stop: claiming nothing; runs may go on until then.
    Draining { until: Instant },
    /// The drain is over: runs got SIGTERM, and get SIGKILL then.
    Stopping { kill_at: Instant },
    /// Runs got SIGKILL: their guards stop their commands; waiting for them to end.
    Killed,
}

/// What the loop owns besides the table: each room's own state, and what was said.
pub(super) struct Replicant<'a> {
    replica: &'a Replica,
    log: &'a Log,
    runs: Runs,
    claims: Claims,
    health: Health,
    beats: Heartbeats,
    /// With `--listen`: what the server shows (`watched.rs`).
    shown: watched::BoardFeed,
    /// "At --max-jobs" was said, and no room came since.
    full_told: bool,
    /// A failed claim was said, and none went through since.
    trouble_told: bool,
    /// Missed instants Redis did not take yet.
    unrecorded: Unrecorded,
    /// The runs of won claims asked of the starter this turn, handed their locks once all are
    /// asked ([`Replicant::hand_over`]).
    starting: Vec<StartAsked>,
}

/// A won claim whose run was asked of the starter: the instant it claimed, and the run.
struct StartAsked {
    key: String,
    instant: i64,
    kind: InstantKind,
    run: Starting,
}

impl<'a> Replicant<'a> {
    /// The loop's state at start, its claims thread started.
    /// `every`: the heartbeats' first period (the first goes at once).
    pub(super) fn new(
        replica: &'a Replica,
        me: String,
        json: bool,
        log: &'a Log,
        every: Duration,
    ) -> Result<Replicant<'a>> {
        let runs = Runs::new(json, log)?;
        let board = watched::board(replica, log)?;
        let claims = Claims::start(board.clone())
            .map_err(|e| anyhow!("cannot start the claims thread: {e}"))?;
        Ok(Replicant {
            replica,
            log,
            runs,
            claims,
            health: Health::new(),
            beats: Heartbeats::new(me, every),
            shown: watched::BoardFeed::new(board),
            full_told: false,
            trouble_told: false,
            unrecorded: Unrecorded::default(),
            starting: Vec::new(),
        })
    }

    /// What came since the last turn: the claims thread's answers, the runs' reports and ends.
    pub(super) fn take_news(&mut self, table: &mut Table, phase: Phase) {
        self.shown
            .turn(table, self.claims.in_flight(), phase != Phase::Serving);
        self.answers(table, phase);
        self.reports(table);
        self.runs.reap();
        self.forget_ended(table);
    }

    /// Whether a stopping replica is done: no run left, and no claim in flight (one is waited
    /// for while the drain lasts: a win is released).
    pub(super) fn is_done(&self, phase: Phase, now: Instant) -> bool {
        if phase == Phase::Serving || !self.runs.is_empty() {
            return false;
        }
        match phase {
            Phase::Draining { until } => self.claims.in_flight() == 0 || now >= until,
            _ => true,
        }
    }

    /// Serving: record what was given up, probe when due, claim the due instants there is room
    /// for, check the others' and send the heartbeat when due.
    pub(super) fn serve_due(&mut self, table: &mut Table) {
        self.give_up(table);
        self.health.probe(self.runs.exe(), self.log, &self.shown);
        self.claim(table);
        self.check(table);
        self.heartbeat(table, false);
    }

    /// Whether a run had to be stopped (the exit status says so).
    pub(super) fn interrupted(&self) -> bool {
        self.runs.interrupted()
    }

    /// SIGTERM or SIGINT: the first drains (claiming nothing more, leaving the ranking); a second
    /// stops the runs now.
    pub(super) fn asked_to_stop(&mut self, table: &mut Table, phase: Phase) -> Phase {
        match phase {
            Phase::Serving => {
                self.log.info(
                    "draining",
                    &format!(
                        "stopping: claiming nothing more; {} may go on for {}",
                        match self.runs.len() {
                            1 => "1 running job".to_string(),
                            n => format!("{n} running jobs"),
                        },
                        crate::duration::Span(self.replica.drain)
                    ),
                    &[("running", self.runs.len().into())],
                );
                // Out of the ranking at once: the others take this replica's instants.
                self.heartbeat(table, true);
                Phase::Draining {
                    until: Instant::now() + self.replica.drain,
                }
            }
            Phase::Draining { .. } => Phase::Draining {
                until: Instant::now(),
            },
            other => other,
        }
    }

    /// The drain's end sends SIGTERM, the grace's end SIGKILL.
    pub(super) fn advance_phase(&mut self, phase: Phase, now: Instant) -> Phase {
        match phase {
            Phase::Draining { until } if now >= until => {
                self.runs.stop(libc::SIGTERM, self.log);
                Phase::Stopping {
                    kill_at: now + self.replica.grace,
                }
            }
            Phase::Stopping { kill_at } if now >= kill_at => {
                self.runs.stop(libc::SIGKILL, self.log);
                Phase::Killed
            }
            other => other,
        }
    }

    /// When the loop must look again: the next instant (none unless serving), the drain's or the
    /// grace's end, or the next look at the file; signals and answers wake it sooner.
    pub(super) fn wake(&self, table: &Table, phase: Phase, file_check: Instant) -> Instant {
        let now = Instant::now();
        let at = match phase {
            // A change of "full" not yet told, or a view to renew, within BEAT_AGAIN: the loop
            // must not sleep through it (instants would wait for the next slot).
            Phase::Serving => {
                let beat = self.beats.due(self.full()).min(self.health.probe_at());
                let at = table.next_wake().map(|ms| {
                    let left = (ms - redis_millis()).max(0) as u64;
                    (now + Duration::from_millis(left)).min(beat)
                });
                at.or(Some(beat))
            }
            Phase::Draining { until } => Some(until),
            Phase::Stopping { kill_at } => Some(kill_at),
            Phase::Killed => None,
        };
        at.map_or(file_check, |at| at.min(file_check))
    }

    /// Send the claims there is room for (none while this replica cannot start runs).
    fn claim(&mut self, table: &mut Table) {
        if self.health.is_sick() {
            return;
        }
        let max = self.replica.max_jobs as usize;
        let busy = self.runs.len() + self.claims.in_flight();
        let room = max.saturating_sub(busy);
        let waiting = table.waiting();
        if self.runs.len() < max || waiting == 0 {
            self.full_told = false;
        } else if !self.full_told {
            self.full_told = true;
            self.log.warn(
                "at_max_jobs",
                &format!(
                    "{} runs are going on (--max-jobs {max}): {waiting} due instants wait for \
                     room here; another replica may run them",
                    self.runs.len()
                ),
            );
        }
        for ToClaim {
            key,
            config,
            instant,
            kind,
        } in table.take_due(room)
        {
            self.claims.send(Ask::Claim {
                key,
                config,
                instant,
                kind,
            });
        }
    }

    /// Check the instants other replicas own that this replica checks (`table.rs`) and that are
    /// still waiting: one call per fleet for all of them.
    fn check(&mut self, table: &mut Table) {
        // (Also while sick: what it checks and finds undecided, it records missed at the
        // deadline unless another replica ran it.)
        for batch in table.due_checks() {
            let (config, items) = (batch.config, batch.items);
            self.claims.send(Ask::Check { config, items });
        }
    }

    /// Whether this replica is at `--max-jobs` (its runs and its claims in flight), or cannot
    /// start runs: either way the fleet ranks it out.
    fn full(&self) -> bool {
        self.health.is_sick()
            || self.runs.len() + self.claims.in_flight() >= self.replica.max_jobs as usize
    }

    /// Leave the fleet for good: the leave goes again (a heartbeat queued before the first would
    /// have renewed it), and every ask still queued (the leave, releases, records) is carried out
    /// before this returns, within [`LEAVE_WITHIN`]. Whether the leave reached Redis on every
    /// fleet; when not, one line says so.
    pub(super) fn leave(&mut self, table: &Table) -> bool {
        let mut groups = table.groups();
        groups.append(&mut table.left.clone());
        for Reached { group, config } in groups {
            self.beats.leave(&mut self.claims, group, config);
        }
        let finished = self.claims.finish(LEAVE_WITHIN);
        let mut failed = None;
        while let Some(answer) = self.claims.answer() {
            match answer {
                claim::Answer::View {
                    view: Err(text), ..
                } => failed = Some(text),
                claim::Answer::Owed { key, instant, end } => {
                    answers::owed(&key, instant, end, self.log)
                }
                _ => {}
            }
        }
        let why = match (finished, failed) {
            (true, None) => return true,
            (false, _) => format!("redis did not answer within {} s", LEAVE_WITHIN.as_secs()),
            (true, Some(text)) => text,
        };
        self.log.error(
            "leave_unconfirmed",
            &format!(
                "cannot confirm leaving the fleet: {why}; the other replicas take over its \
                 instants once its heartbeat lapses"
            ),
        );
        false
    }

    /// Act on the claims thread's answers: start a won run (all those won together asked of the
    /// starter first, then each handed its lock), note a lost one, take a new view.
    fn answers(&mut self, table: &mut Table, phase: Phase) {
        while let Some(answer) = self.claims.answer() {
            match answer {
                Answer::Claim {
                    key,
                    instant,
                    kind,
                    verdict,
                    config,
                } => {
                    let claimed = Claimed {
                        key: &key,
                        instant,
                        kind,
                    };
                    self.claim_answered(table, phase, claimed, verdict, config)
                }
                Answer::Missed {
                    key,
                    config,
                    instant,
                    reason,
                    recorded,
                } => {
                    let unrecorded = recorded.is_err();
                    answers::missed(
                        &key,
                        &config,
                        instant,
                        reason,
                        recorded,
                        &self.shown,
                        self.log,
                    );
                    if unrecorded {
                        self.unrecorded.keep(Pending {
                            key,
                            config,
                            instant,
                            reason,
                        });
                    }
                }
                Answer::Checked { items } => {
                    for CheckedInstant {
                        key,
                        instant,
                        decided,
                    } in items
                    {
                        table.checked(&key, instant, decided);
                    }
                }
                Answer::Unclaimed { key, result } => {
                    if let Err(text) = result {
                        self.log.warn(
                            "undo_failed",
                            &format!(
                                "{key}: cannot undo a claim that did not become a run: {text}; \
                                 its lock lapses by itself"
                            ),
                        );
                    }
                }
                Answer::Renewed { pid, sent, result } => self.runs.renewed(pid, sent, result),
                Answer::Owed { key, instant, end } => answers::owed(&key, instant, end, self.log),
                Answer::View { group, view, clock } => {
                    let pokes = self
                        .beats
                        .viewed(table, group, view, clock, &self.shown, self.log);
                    table.poked(pokes);
                }
            }
        }
        // The runs of the claims won this turn, all asked: each handed its lock.
        self.hand_over(table);
    }

    /// A claim's answer: a won claim starts its run (or is undone: while draining or sick, or
    /// for a job a reload removed), a failed one is said once, a lost one noted.
    fn claim_answered(
        &mut self,
        table: &mut Table,
        phase: Phase,
        claimed: Claimed,
        verdict: ClaimVerdict,
        config: Arc<RunConfig>,
    ) {
        let Claimed { key, instant, .. } = claimed;
        let failed = matches!(verdict, ClaimVerdict::Failed(_));
        if let ClaimVerdict::Early {
            clock: Some(sample),
        } = &verdict
        {
            if self.beats.skew.heard(*sample, self.log) {
                table.rebase();
            }
        }
        match &verdict {
            ClaimVerdict::Won(_) => self.shown.claim(key, Some(true), None),
            ClaimVerdict::Failed(_) => self.shown.claim(key, None, None),
            _ => {}
        }
        if claimed.kind == InstantKind::Scheduled {
            table.answered(key, !failed, self.log);
        }
        let first_news = failed && !std::mem::replace(&mut self.trouble_told, failed);
        let job = table.job(key).map(|j| j.cron.clone());
        // Removed or changed by a reload meanwhile (its run would refuse the lock: another TTL,
        // --limit, or an instant its schedule no longer names): a won claim is undone, and a
        // scheduled instant recorded missed (`reload`); never a run refused, nor this replica
        // sick for it.
        let refused = match (&job, &verdict) {
            (None, _) => true,
            (Some(job), ClaimVerdict::Won(held)) => job.run.config.mismatch(held).is_some(),
            _ => false,
        };
        let Some(job) = job.filter(|_| !refused) else {
            if let ClaimVerdict::Won(held) = verdict {
                let at = held
                    .instant
                    .filter(|_| claimed.kind == InstantKind::Scheduled);
                self.unclaim(config.clone(), held);
                if let Some(instant) = at {
                    self.claims.send(Ask::Missed {
                        key: key.to_string(),
                        config,
                        instant,
                        reason: MissedReason::Reload,
                    });
                }
            }
            table.claim_back(claimed, None);
            return;
        };
        let now = redis_millis();
        // --overlap queue: a claim that found the lock held is followed by a claim of the
        // instant that waits when the holder's lock would lapse (its replica died), unless that
        // run ends here first.
        if let (true, ClaimVerdict::Busy { expires_in, .. }) =
            (job.run.config.overlap.waits(), &verdict)
        {
            let lapse = expires_in.map_or(1000, |d| d.as_millis() as i64);
            table.queue_at(key, now + lapse + 250);
        }
        let again = match verdict {
            // Won while draining (or sick): undone, so another replica runs it at once.
            ClaimVerdict::Won(held) if phase != Phase::Serving || self.health.is_sick() => {
                self.unclaim(config, held);
                (phase == Phase::Serving).then_some(instant)
            }
            // A run that cannot start: its instant back in the table, recorded missed at its
            // deadline unless another replica runs it.
            ClaimVerdict::Won(held) => (!self.start(&job, held, claimed)).then_some(instant),
            ClaimVerdict::Failed(text) => {
                if first_news {
                    self.log.warn(
                        "claim_failed",
                        &format!(
                            "{key}: cannot claim the {} instant: {text}; trying again every \
                             quarter second (said once until a claim goes through)",
                            rfc3339(instant.max(0) as u64)
                        ),
                    );
                }
                // (The table waits by itself after a failed claim.)
                (claimed.kind != InstantKind::Scheduled)
                    .then_some(now + crate::replica::entry::RETRY_MS)
            }
            // Nothing waits (any more): nothing to say.
            ClaimVerdict::AlreadyRan if claimed.kind == InstantKind::Queued => None,
            // The one that waits is taken care of above.
            ClaimVerdict::Busy { .. } if claimed.kind == InstantKind::Queued => None,
            // A manual instant may wait (always under --overlap queue; under the others when
            // the run before it started after it was asked for): claimed again when that run
            // ends here, or when its lock would lapse (its replica died). One that was skipped
            // instead reads "already ran" then.
            ClaimVerdict::Busy { expires_in, .. } if claimed.kind == InstantKind::Manual => {
                Some(now + expires_in.map_or(1000, |d| d.as_millis() as i64) + 250)
            }
            lost => answers::lost(&job, instant, lost, &self.shown, self.log),
        };
        table.claim_back(claimed, again);
    }

    /// Ask for the run of a won claim to start (whether it could be asked): the runs won
    /// together are all asked before any is handed its lock ([`Replicant::hand_over`]), so the
    /// starts of one instant do not wait for each other's fork.
    fn start(&mut self, job: &CronJob, held: Box<Held>, claimed: Claimed) -> bool {
        match self.runs.start(job, &held) {
            Ok(run) => {
                self.starting.push(StartAsked {
                    key: claimed.key.to_string(),
                    instant: claimed.instant,
                    kind: claimed.kind,
                    run,
                });
                true
            }
            Err(e) => {
                self.not_started(&job.key, job.run.config.clone(), held, &e);
                false
            }
        }
    }

    /// Hand each run asked of the starter this turn its lock, once the starter says it forked
    /// it; a run that did not start has its claim undone, and its instant looked at again.
    fn hand_over(&mut self, table: &mut Table) {
        for asked in std::mem::take(&mut self.starting) {
            let config = asked.run.config();
            let held = asked.run.held();
            match self.runs.started(asked.run, self.log) {
                Ok(()) => self.health.started_run(),
                Err(e) => {
                    self.not_started(&asked.key, config, held, &e);
                    let claimed = Claimed {
                        key: &asked.key,
                        instant: asked.instant,
                        kind: asked.kind,
                    };
                    table.claim_back(claimed, Some(asked.instant));
                }
            }
        }
    }

    /// A won claim whose run cannot start: the claim is undone, and this replica claims nothing
    /// until it can start runs again.
    fn not_started(
        &mut self,
        key: &str,
        config: Arc<RunConfig>,
        held: Box<Held>,
        e: &anyhow::Error,
    ) {
        self.log.error(
            "spawn_failed",
            &format!(
                "{key}: cannot start its run: {e:#}; undid the claim (another replica runs it)"
            ),
        );
        self.unclaim(config, held);
        let why = format!("cannot start runs: {e:#}");
        self.health.fell_sick(why, self.log, &self.shown);
    }

    /// Undo a won claim that does not become a run: the instant can run elsewhere at once.
    fn unclaim(&mut self, config: Arc<RunConfig>, held: Box<Held>) {
        self.claims.send(Ask::Unclaim {
            config,
            held,
            undo: Undo::RollBack,
        });
    }

    /// Ask for the instants this replica gave up to be recorded missed (unless they ran), and
    /// leave the fleets a reload left.
    fn give_up(&mut self, table: &mut Table) {
        for Reached { group, config } in std::mem::take(&mut table.left) {
            self.beats.leave(&mut self.claims, group, config);
        }
        for Pending {
            key,
            config,
            instant,
            reason,
        } in std::mem::take(&mut table.gave_up)
        {
            self.claims.send(Ask::Missed {
                key,
                config,
                instant,
                reason,
            });
        }
        // Those Redis did not take before: again, once a second, until it does.
        for Pending {
            key,
            config,
            instant,
            reason,
        } in self.unrecorded.due()
        {
            self.claims.send(Ask::Missed {
                key,
                config,
                instant,
                reason,
            });
        }
    }

    /// Act on what the runs reported (`reports.rs`): a renewal or a release goes on the claims
    /// thread's link, a failed run of a `--retries` job is looked at again.
    fn reports(&mut self, table: &mut Table) {
        // A release an instant waits for goes at once (see `claimer.rs`).
        let urgent = self.full() || table.waiting() > 0;
        while let Some(RunHeard { run, report }) = self.runs.next_report() {
            if let (Some(board), Some(report)) = (self.shown.board(), &report) {
                watched::show_report(board, run, report);
            }
            match reports::heard(run, report, self.log) {
                Followup::Nothing => {}
                Followup::Renew => self.claims.send(Ask::RenewRun {
                    config: run.config.clone(),
                    pid: run.pid(),
                    held: run.held.clone(),
                }),
                Followup::Release { opts, reply } => {
                    let ask = Ask::ReleaseRun {
                        config: run.config.clone(),
                        held: run.held.clone(),
                        opts,
                        reply,
                        urgent,
                    };
                    self.claims.send(ask);
                }
                Followup::Ended { failed } => table.run_ended(RunEnded {
                    key: &run.key,
                    failed,
                    instant: run.instant,
                    manual: run.manual,
                }),
            }
        }
    }

    /// Forget the runs that are over; one that ended without reporting its end is said, its
    /// claim undone when no command can be left, and looked at again (with `--retries`) once
    /// its lock has lapsed.
    fn forget_ended(&mut self, table: &mut Table) {
        for run in self.runs.take_over(self.log) {
            if run.ended {
                continue;
            }
            self.shown.gone(&run.key);
            let after = reports::unreported(&run, self.log);
            if after.release {
                self.unclaim(run.config.clone(), run.held.clone());
            }
            if let Some(why) = after.sick {
                self.health.fell_sick(why, self.log, &self.shown);
            }
            table.run_gone(RunGone {
                key: &run.key,
                instant: run.instant,
                manual: run.manual,
                undone: after.release,
                lapses_at: after.retry_at,
            });
        }
    }

    /// Send this replica's heartbeat when it is due (`beat.rs`), or, `leaving`, to leave the
    /// ranking.
    fn heartbeat(&mut self, table: &mut Table, leaving: bool) {
        let full = self.full();
        self.beats.send(&mut self.claims, table, full, leaving);
    }
}
