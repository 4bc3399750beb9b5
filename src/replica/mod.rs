//! `--crontab FILE`: one replica of a fleet scheduler with no leader. Every replica reads the same
//! crontab and is equal: it sleeps until the next instant one of its jobs is due (nothing is
//! polled meanwhile), then claims that instant itself in Redis, with the atomic acquire a run
//! makes (`claim.rs`, on a thread of its own, so a hung Redis never stops this loop). Only a claim
//! it won starts a process: the run `cronlock --schedule SCHEDULE [OPTIONS] KEY -c COMMAND-LINE`
//! makes, handed the won lock on a channel of its own (`runs.rs`, [`crate::fleet::handover`]),
//! with its guard, watchdog, lost-lock stop, fencing, history, metrics, pings and ledger. The run
//! reports on that channel when its command started and how it ended: the job's output and
//! verbosity never change what the replica knows.
//!
//! `--max-jobs` counts the runs this replica won and its claims in flight; an instant that comes
//! due while it is full waits for room (`table.rs`) and is given up only when it can no longer
//! start. Runs are tied to the replica with `PR_SET_PDEATHSIG`, so a replica that dies (SIGKILL,
//! OOM) takes its runs with it and their instants become abandoned, for `--retries` elsewhere.
//!
//! An instant is owned by one replica by preference only: any replica with room claims it when
//! it is still undecided shortly after it is due (`table.rs`). A claim that does not become a
//! run is undone, so the instant runs elsewhere at once; a replica that cannot start runs stops
//! claiming until a probe shows it can (`health.rs`).
//!
//! SIGTERM or SIGINT: claim nothing more; runs go on until they end or `--drain` runs out, then
//! get SIGTERM, and SIGKILL after `--grace`. A second SIGTERM or SIGINT stops them at once. Before
//! it exits, the replica waits (bounded) until its leave, its releases and its records have
//! reached Redis. The exit status is 0 when every run ended on its own, 143 otherwise, and 125
//! when its leave could not be confirmed. SIGHUP, or a change of the
//! file, reads it again: a file with an error keeps the table that runs, in one line.

mod answers;
mod beat;
mod claim;
mod claimer;
mod entry;
mod health;
mod output;
mod rank;
mod reports;
mod runs;
mod table;
mod watched;

use std::collections::HashMap;
use std::sync::mpsc::{self, Receiver, Sender};
use std::time::{Duration, SystemTime};

use anyhow::{anyhow, Result};

use crate::clock::unix_millis;
use crate::clock::Instant;
use crate::config::{CronJob, Replica};
use crate::exit::Exit;
use crate::log::Log;
use crate::signals::{self, SigSet};
use beat::{period, Beat, BEAT_AGAIN};
use claim::{Answer, Ask};
use claimer::Claims;
use runs::{Heard, Spawned};
use table::Table;

/// How often the file's modification time is looked at (a ConfigMap update, an edit).
const FILE_CHECK: Duration = Duration::from_secs(2);

/// The longest a replica waits, at its end, for its leave and its last releases and records to
/// reach Redis (a healthy Redis takes milliseconds; a hung one must not hold up a rollout).
const LEAVE_WITHIN: Duration = Duration::from_secs(1);

/// Where the replica is in its life.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Claiming due instants and running them.
    Serving,
    /// Asked to stop: claiming nothing; runs may go on until then.
    Draining { until: Instant },
    /// The drain is over: runs got SIGTERM, and get SIGKILL then.
    Stopping { kill_at: Instant },
    /// Runs got SIGKILL: their guards stop their commands; waiting for them to end.
    Killed,
}

/// What the loop owns besides the table.
struct Replicant<'a> {
    replica: &'a Replica,
    exe: std::path::PathBuf,
    json: bool,
    log: &'a Log,
    runs: HashMap<u32, Spawned>,
    claims: Claims,
    answers: Receiver<Answer>,
    heard: (Sender<Heard>, Receiver<Heard>),
    /// Claims sent and not yet answered.
    in_flight: usize,
    /// A run had to be stopped (the exit status says so).
    interrupted: bool,
    /// "At --max-jobs" was said, and no room came since.
    full_told: bool,
    /// A failed claim was said, and none went through since.
    trouble_told: bool,
    /// This replica cannot start runs, and why (`health.rs`).
    sick: Option<health::Sick>,
    /// While it can: when it probes if it starts no run before (`health::IDLE_PROBE`).
    idle_probe_at: Instant,
    /// This replica's id among the live replicas.
    me: String,
    /// The last heartbeat.
    beat: Beat,
    /// The test hook [`runs::HOLD_AFTER_CLAIM`]: where to say a claim was won, then stop.
    hold: Option<std::path::PathBuf>,
    /// With `--listen`: what the server shows (`watched.rs`).
    shown: watched::Shown,
}

/// Serve the crontab until SIGTERM or SIGINT, and every run has ended.
pub fn serve(
    replica: &Replica,
    reload: &dyn Fn() -> Result<Vec<CronJob>>,
    json: bool,
    log: &Log,
) -> Result<Exit> {
    let me = format!(
        "{}/{}",
        crate::host::hostname(),
        uuid::Uuid::new_v4().simple()
    );
    let mut table = Table::new(&replica.jobs, true, &me);
    let mut r = Replicant::new(replica, me, json, log, period(1, table.shortest_ttl()))?;
    log.info(
        "replica_started",
        &format!(
            "serving {} jobs from {} (at most {} runs at once)",
            table.jobs.len(),
            replica.file.display(),
            replica.max_jobs
        ),
        &[("jobs", table.jobs.len().into())],
    );
    let mut phase = Phase::Serving;
    let mut file = FileSeen {
        modified: mtime(&replica.file),
        checked: Instant::now(),
    };
    let set = SigSet::of(&[
        libc::SIGTERM,
        libc::SIGINT,
        libc::SIGHUP,
        libc::SIGCHLD,
        signals::WAKEUP,
    ]);
    loop {
        r.shown.turn(&table, r.in_flight, phase != Phase::Serving);
        r.answers(&mut table, phase);
        r.reports(&mut table);
        runs::reap(&mut r.runs);
        r.forget_ended(&mut table);
        let now = Instant::now();
        if phase != Phase::Serving && r.runs.is_empty() {
            // A claim still in flight is waited for while the drain lasts (a win is released).
            let drained = matches!(phase, Phase::Draining { until } if now >= until);
            if r.in_flight == 0 || drained || !matches!(phase, Phase::Draining { .. }) {
                break;
            }
        }
        phase = r.advance_phase(phase, now);
        if phase == Phase::Serving {
            table.advance(log);
            r.give_up(&mut table);
            r.probe();
            r.claim(&mut table);
            r.check(&mut table);
            r.heartbeat(&mut table, false);
        }
        let wake = r.wake(&table, phase, file.checked + FILE_CHECK);
        let got = signals::wait(&set, wake.saturating_duration_since(Instant::now()));
        let got = reread(got, replica, reload, &mut file, &mut table, log);
        if let Some(libc::SIGTERM | libc::SIGINT) = got {
            phase = r.asked_to_stop(&mut table, phase);
        }
    }
    let left = r.leave(&table);
    let said = if r.interrupted {
        "stopped; some runs had to be stopped"
    } else {
        "stopped; every run ended on its own"
    };
    log.info("replica_stopped", said, &[]);
    Ok(if !left {
        Exit::Failure
    } else if r.interrupted {
        Exit::Signal(libc::SIGTERM)
    } else {
        Exit::Success
    })
}

impl<'a> Replicant<'a> {
    /// The loop's state at start, its claims thread started.
    /// `every`: the heartbeats' first period (the first goes at once).
    fn new(
        replica: &'a Replica,
        me: String,
        json: bool,
        log: &'a Log,
        every: Duration,
    ) -> Result<Replicant<'a>> {
        let exe = std::env::current_exe().map_err(|e| {
            anyhow!(
                "cannot find cronlock's own binary: {}",
                crate::log::io_text(&e)
            )
        })?;
        let (answered, answers) = mpsc::channel();
        let board = watched::board(replica.listen, replica.max_jobs, log)?;
        let claims = Claims::start(answered, board.clone())
            .map_err(|e| anyhow!("cannot start the claims thread: {e}"))?;
        Ok(Replicant {
            replica,
            exe,
            json,
            log,
            runs: HashMap::new(),
            claims,
            answers,
            heard: mpsc::channel(),
            in_flight: 0,
            interrupted: false,
            full_told: false,
            trouble_told: false,
            sick: None,
            idle_probe_at: Instant::now() + health::IDLE_PROBE,
            me,
            beat: Beat::first(every),
            hold: cfg!(debug_assertions)
                .then(|| std::env::var_os(runs::HOLD_AFTER_CLAIM).map(Into::into))
                .flatten(),
            shown: watched::Shown::new(board),
        })
    }

    /// SIGTERM or SIGINT: the first drains (claiming nothing more, leaving the ranking); a second
    /// stops the runs now.
    fn asked_to_stop(&mut self, table: &mut Table, phase: Phase) -> Phase {
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
    fn advance_phase(&mut self, phase: Phase, now: Instant) -> Phase {
        match phase {
            Phase::Draining { until } if now >= until => {
                runs::stop(&mut self.runs, libc::SIGTERM, self.log);
                Phase::Stopping {
                    kill_at: now + self.replica.grace,
                }
            }
            Phase::Stopping { kill_at } if now >= kill_at => {
                runs::stop(&mut self.runs, libc::SIGKILL, self.log);
                Phase::Killed
            }
            other => other,
        }
    }

    /// When the loop must look again: the next instant (none unless serving), the drain's or the
    /// grace's end, or the next look at the file; signals and answers wake it sooner.
    fn wake(&self, table: &Table, phase: Phase, file_check: Instant) -> Instant {
        let now = Instant::now();
        let at = match phase {
            // A change of "full" not yet told, or a view to renew, within BEAT_AGAIN: the loop
            // must not sleep through it (instants would wait for the next slot).
            Phase::Serving => {
                let beat = self.beat.due_for(self.sooner());
                let probe_at = self
                    .sick
                    .as_ref()
                    .map_or(self.idle_probe_at, |s| s.probe_at);
                let beat = beat.min(probe_at);
                let at = table.next_wake().map(|ms| {
                    let left = (ms - unix_millis() as i64).max(0) as u64;
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
        if self.sick.is_some() {
            return;
        }
        let max = self.replica.max_jobs as usize;
        let busy = self.runs.len() + self.in_flight;
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
        for (i, instant) in table.take_due(room) {
            let job = &table.jobs[i].cron;
            self.in_flight += 1;
            self.claims.send(Ask::Claim {
                key: job.key.clone(),
                config: job.config.clone(),
                instant,
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

    /// A sick replica probes when its time comes, and serves again once it can start runs; one
    /// that started no run for [`health::IDLE_PROBE`] probes too (so `/readyz` says it is sick
    /// before it loses a claim).
    fn probe(&mut self) {
        let now = Instant::now();
        let Some(sick) = &mut self.sick else {
            if now >= self.idle_probe_at {
                self.idle_probe_at = now + health::IDLE_PROBE;
                if let Err(why) = health::probe(&self.exe) {
                    self.fell_sick(why);
                }
            }
            return;
        };
        if now < sick.probe_at {
            return;
        }
        match health::probe(&self.exe) {
            Ok(()) => {
                self.sick = None;
                self.idle_probe_at = Instant::now() + health::IDLE_PROBE;
                self.log.info(
                    "runs_start_again",
                    "can start runs again: claiming again",
                    &[],
                );
                self.shown.sick(None);
            }
            Err(why) => {
                sick.probe_at = Instant::now() + health::PROBE_EVERY;
                if why != sick.why {
                    sick.why = why;
                    self.shown.sick(self.sick.as_ref().map(|s| s.why.as_str()));
                }
            }
        }
    }

    /// This replica cannot start runs: it claims nothing (and says it is full) until a probe
    /// shows it can.
    fn fell_sick(&mut self, why: String) {
        if self.sick.is_none() {
            self.log.error(
                "cannot_start_runs",
                &format!(
                    "{why}; claiming nothing (other replicas take its instants) and trying again \
                     every {} s",
                    health::PROBE_EVERY.as_secs()
                ),
            );
            self.shown.sick(Some(&why));
        }
        self.sick = Some(health::Sick::new(why));
    }

    /// Whether this replica is at `--max-jobs` (its runs and its claims in flight), or cannot
    /// start runs: either way the fleet ranks it out.
    fn full(&self) -> bool {
        self.sick.is_some() || self.runs.len() + self.in_flight >= self.replica.max_jobs as usize
    }

    /// Whether a heartbeat should go before the next slot (at most every [`BEAT_AGAIN`]): "full"
    /// changed. (An instant a full owner leaves waiting is claimed by the others after
    /// [`table::FALLBACK_MS`] whatever their views say, so nothing else hurries a heartbeat: the
    /// fleet's heartbeats stay a few calls a second however busy it is.)
    fn sooner(&self) -> bool {
        self.full() != self.beat.full
    }

    /// Leave the fleet for good: the leave goes again (a heartbeat queued before the first would
    /// have renewed it), and every ask still queued (the leave, releases, records) is carried out
    /// before this returns, within [`LEAVE_WITHIN`]. Whether the leave reached Redis on every
    /// fleet; when not, one line says so.
    fn leave(&mut self, table: &Table) -> bool {
        let mut groups = table.groups();
        groups.append(&mut table.left.clone());
        for (group, config) in groups {
            self.send_leave(group, config);
        }
        let finished = self.claims.finish(LEAVE_WITHIN);
        let mut failed = None;
        while let Ok(answer) = self.answers.try_recv() {
            if let claim::Answer::View {
                view: Err(text), ..
            } = answer
            {
                failed = Some(text);
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

    /// Send this replica's heartbeat to each group its jobs claim in: at its slot (`beat.rs`),
    /// when "full" changed (at most every [`BEAT_AGAIN`]), or, `leaving`, to leave the ranking.
    fn heartbeat(&mut self, table: &mut Table, leaving: bool) {
        let full = self.full();
        let (every, since) = (self.beat.every, self.beat.since());
        let due = self.beat.is_due();
        if !leaving && !due && (!self.sooner() || since < BEAT_AGAIN) {
            return;
        }
        let lapse = if leaving { Duration::ZERO } else { every * 3 };
        for (group, config) in table.groups() {
            self.claims.send(Ask::Beat {
                config,
                group,
                id: self.me.clone(),
                lapse,
                full,
            });
        }
        self.beat = Beat::sent(every, full);
        table.lapse = every * 3;
    }
}

/// After a wait: read the file again on SIGHUP, or when it changed (its modification time is
/// looked at every [`FILE_CHECK`]). A reload answers SIGTERM and SIGINT while it reads: the
/// signal it was stopped by, or the one the wait got, is returned.
fn reread(
    got: Option<libc::c_int>,
    replica: &Replica,
    reload: &dyn Fn() -> Result<Vec<CronJob>>,
    file: &mut FileSeen,
    table: &mut Table,
    log: &Log,
) -> Option<libc::c_int> {
    let mut got = got;
    if got == Some(libc::SIGHUP) {
        got = table.reload(reload, log);
        file.modified = mtime(&replica.file);
    }
    if file.checked.elapsed() >= FILE_CHECK {
        file.checked = Instant::now();
        let now_modified = mtime(&replica.file);
        if now_modified != file.modified {
            file.modified = now_modified;
            got = got.or(table.reload(reload, log));
        }
    }
    got
}

/// The crontab as the loop last looked at it: its modification time, and when it looked.
struct FileSeen {
    modified: Option<SystemTime>,
    checked: Instant,
}

/// The file's modification time (a ConfigMap's symlink swap changes it too).
fn mtime(path: &std::path::Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}
