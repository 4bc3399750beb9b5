//! What the replica does with the claims thread's answers: start a won run (or undo the claim),
//! note a lost claim (its line under `-v`, the job's metrics file, a look again for
//! `--retries`), take a heartbeat's view, a check's answer, and record an instant given up as
//! missed.

use std::sync::Arc;
use std::time::Duration;

use crate::clock::{rfc3339, unix_millis, Instant};
use crate::config::{CronJob, RunConfig};
use crate::exit::Exit;
use crate::log::{Level, Log};
use crate::record::ledger::MissedReason;
use crate::store::lock::{Held, Undo};
use crate::store::members::FleetView;

use super::beat::period;
use super::claim::{Answer, Ask, ClaimVerdict, Group};
use super::table::Table;
use super::{health, runs, Phase, Replicant};

impl Replicant<'_> {
    /// Act on the claims thread's answers: start a won run, note a lost one, take a new view.
    pub(super) fn answers(&mut self, table: &mut Table, phase: Phase) {
        while let Ok(answer) = self.answers.try_recv() {
            match answer {
                Answer::Claim {
                    key,
                    instant,
                    verdict,
                    config,
                } => self.claim_answered(table, phase, &key, instant, verdict, config),
                Answer::Missed {
                    key,
                    config,
                    instant,
                    reason,
                    recorded,
                } => self.missed(&key, &config, instant, reason, recorded),
                Answer::Checked { items } => {
                    for (key, at, decided) in items {
                        table.checked(&key, at, decided);
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
                Answer::View { group, view } => self.viewed(table, group, view),
            }
        }
    }

    /// A heartbeat's answer: the fleet's view (and the heartbeat's period for its size), or why
    /// there is none.
    fn viewed(&mut self, table: &mut Table, group: Group, view: Result<FleetView, String>) {
        if let Ok(view) = &view {
            self.beat.every = period(view.live.len(), table.shortest_ttl());
        }
        self.shown
            .beat(view.as_ref().err().map(String::as_str), self.beat.every);
        match view {
            Ok(view) => table.set_view(group, view),
            Err(text) => self.log.event(
                Level::Debug,
                "heartbeat_failed",
                &format!("cannot send this replica's heartbeat: {text}"),
                &[],
            ),
        }
    }

    /// A claim's answer: a won claim starts its run (or is undone: while draining or sick, or
    /// for a job a reload removed), a failed one is said once, a lost one noted.
    fn claim_answered(
        &mut self,
        table: &mut Table,
        phase: Phase,
        key: &str,
        instant: i64,
        verdict: ClaimVerdict,
        config: Arc<RunConfig>,
    ) {
        self.in_flight = self.in_flight.saturating_sub(1);
        let failed = matches!(verdict, ClaimVerdict::Failed(_));
        match &verdict {
            ClaimVerdict::Won(_) => self.shown.claim(key, Some(true), None),
            ClaimVerdict::Failed(_) => self.shown.claim(key, None, None),
            _ => {}
        }
        table.answered(key, !failed, self.log);
        let first_news = failed && !std::mem::replace(&mut self.trouble_told, failed);
        let Some(job) = table.job(key).map(|j| j.cron.clone()) else {
            // Removed by a reload meanwhile: a won claim is undone.
            if let ClaimVerdict::Won(held) = verdict {
                self.unclaim(config, held);
            }
            return;
        };
        match verdict {
            // Won while draining (or sick): undone, so another replica runs it at once.
            ClaimVerdict::Won(held) if phase != Phase::Serving || self.sick.is_some() => {
                self.unclaim(config, held);
                if phase == Phase::Serving {
                    table.look_again(key, instant);
                }
            }
            ClaimVerdict::Won(held) => {
                // A run that cannot start: its instant back in the table, recorded missed at its
                // deadline unless another replica runs it.
                if !self.start(&job, held) {
                    table.look_again(key, instant);
                }
            }
            ClaimVerdict::Failed(text) if first_news => self.log.warn(
                "claim_failed",
                &format!(
                    "{key}: cannot claim the {} instant: {text}; trying again every second (said \
                     once until a claim goes through)",
                    rfc3339(instant.max(0) as u64)
                ),
            ),
            ClaimVerdict::Failed(_) => {}
            lost => self.lost(table, &job, instant, lost),
        }
    }

    /// Ask for the instants this replica gave up to be recorded missed (unless they ran), and
    /// leave the fleets a reload left.
    pub(super) fn give_up(&mut self, table: &mut Table) {
        for (group, config) in std::mem::take(&mut table.left) {
            self.send_leave(group, config);
        }
        for (key, instant, reason) in std::mem::take(&mut table.gave_up) {
            if let Some(job) = table.job(&key) {
                let config = job.cron.config.clone();
                self.claims.send(Ask::Missed {
                    key,
                    config,
                    instant,
                    reason,
                });
            }
        }
    }

    /// Leave `group`'s fleet (a heartbeat that lapses at once).
    pub(super) fn send_leave(&self, group: super::claim::Group, config: Arc<RunConfig>) {
        self.claims.send(Ask::Beat {
            config,
            group,
            id: self.me.clone(),
            lapse: Duration::ZERO,
            full: false,
        });
    }

    /// An instant recorded missed: one line, and the job's metrics file says so.
    fn missed(
        &mut self,
        key: &str,
        config: &RunConfig,
        instant: i64,
        reason: MissedReason,
        recorded: Result<bool, String>,
    ) {
        let at = rfc3339(instant.max(0) as u64);
        match recorded {
            Ok(true) => {
                self.log.warn(
                    "missed",
                    &format!(
                        "{key}: the {at} instant was missed: {}; recorded missed ({})",
                        reason.says(),
                        reason.name()
                    ),
                );
                let report = crate::fleet::report::Report::metrics_only(&config.reports);
                report.missed(key, instant.max(0) as u64, self.log);
                self.shown.missed(key, instant, reason);
            }
            Ok(false) => {}
            Err(text) => self.log.event(
                Level::Debug,
                "missed_unrecorded",
                &format!("{key}: cannot record the {at} instant missed: {text}"),
                &[],
            ),
        }
    }

    /// Undo a won claim that does not become a run: the instant can run elsewhere at once.
    pub(super) fn unclaim(&self, config: Arc<RunConfig>, held: Box<Held>) {
        self.claims.send(Ask::Unclaim {
            config,
            held,
            undo: Undo::RollBack,
        });
    }

    /// Start the run of a won claim (whether it started); a run that cannot start undoes its
    /// claim, and this replica claims nothing until it can start runs again.
    fn start(&mut self, job: &CronJob, held: Box<Held>) -> bool {
        if let Some(path) = &self.hold {
            let _ = std::fs::write(path, &job.key);
            loop {
                std::thread::park();
            }
        }
        let heard = &self.heard.0;
        match runs::spawn(&self.exe, job, &held, self.json, heard, self.log) {
            Ok(run) => {
                self.runs.insert(run.pid(), run);
                self.idle_probe_at = Instant::now() + health::IDLE_PROBE;
                true
            }
            Err(e) => {
                self.log.error(
                    "spawn_failed",
                    &format!(
                        "{}: cannot start its run: {e:#}; undid the claim (another replica runs \
                         it)",
                        job.key
                    ),
                );
                self.unclaim(job.config.clone(), held);
                self.fell_sick(format!("cannot start runs: {e:#}"));
                false
            }
        }
    }

    /// A claim another replica's run (or a suspension) answered: said under `-v`, reported in the
    /// job's metrics file, and, with `--retries`, looked at again when the holder's lock would
    /// lapse; a claim sent ahead that Redis found not yet due, at the instant.
    fn lost(&mut self, table: &mut Table, job: &CronJob, instant: i64, verdict: ClaimVerdict) {
        let key = &job.key;
        let at = rfc3339(instant.max(0) as u64);
        let mut suspended = None;
        let text = match &verdict {
            ClaimVerdict::Busy { holder, expires_in } => {
                if let (true, Some(left)) = (job.retries > 0, expires_in) {
                    let at = unix_millis() as i64 + left.as_millis() as i64 + 250;
                    table.look_again(key, at);
                }
                let by = crate::fleet::describe::describe_holder(holder);
                format!("{key}: the {at} instant is held by {by}")
            }
            // Claimed ahead of the instant, and Redis's clock (a little behind this host's)
            // judged it not yet due: looked at again at the instant itself, once; not lost yet.
            ClaimVerdict::AlreadyRan if instant > unix_millis() as i64 => {
                table.look_again(key, instant);
                return;
            }
            ClaimVerdict::AlreadyRan => {
                format!("{key}: the {at} instant already ran or is not due")
            }
            ClaimVerdict::Suspended(record) => {
                suspended = Some(crate::fleet::describe::suspended_since(record).unwrap_or(0));
                let how = crate::fleet::describe::describe_suspension(record);
                format!("{key}: suspended {how}; the {at} instant is recorded skipped")
            }
            ClaimVerdict::Won(_) | ClaimVerdict::Failed(_) => return,
        };
        let fields = [("key", key.clone().into()), ("instant", instant.into())];
        self.log.event(Level::Debug, "claim_lost", &text, &fields);
        self.shown.claim(key, Some(false), suspended);
        if job.config.reports.metrics_dir.is_some() {
            report_skip(job, suspended, self.log);
        }
    }
}

/// A lost claim in the job's metrics file, as a run that lost its acquire writes it (skipped, and
/// `cronlock_suspended` while KEY is suspended).
fn report_skip(job: &CronJob, suspended: Option<u64>, log: &Log) {
    use crate::fleet::report::{Report, RunOutcome};
    let report = Report::metrics_only(&job.config.reports);
    let outcome = RunOutcome {
        result: Ok(Exit::Conflict(job.conflict_exit_code)),
        locked: false,
        run: None,
        body: None,
        suspended,
    };
    report.tell(&job.key, unix_millis(), &outcome, log);
}
