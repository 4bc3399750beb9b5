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
//! SIGTERM or SIGINT: claim nothing more; runs go on until they end or `--drain` runs out, then
//! get SIGTERM, and SIGKILL after `--grace`. A second SIGTERM or SIGINT stops them at once. The
//! exit status is 0 when every run ended on its own, 143 otherwise. SIGHUP, or a change of the
//! file, reads it again: a file with an error keeps the table that runs, in one line.

mod claim;
mod output;
mod runs;
mod table;

use std::collections::HashMap;
use std::sync::mpsc::{self, Receiver, Sender};
use std::time::{Duration, SystemTime};

use anyhow::{anyhow, Result};

use crate::clock::Instant;
use crate::config::{CronJob, Replica};
use crate::exit::Exit;
use crate::fleet::handover::Report;
use crate::fleet::record::Ending;
use crate::host::{rfc3339, unix_millis};
use crate::log::{Level, Log};
use crate::signals::{self, SigSet};
use claim::{Answer, Ask, Claims, Verdict};
use runs::{Heard, Run};
use table::Table;

/// How often the file's modification time is looked at (a ConfigMap update, an edit).
const FILE_CHECK: Duration = Duration::from_secs(2);

/// The heartbeat's period with up to 5 replicas; 100 ms more per replica above that, so the
/// heartbeats of a fleet cost Redis at most 10 calls a second. A replica lapses after 3 periods
/// without one.
const BEAT: Duration = Duration::from_millis(500);
/// The soonest a change of "full" is told again.
const BEAT_AGAIN: Duration = Duration::from_millis(100);

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
    runs: HashMap<u32, Run>,
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
    /// This replica's id among the live replicas.
    me: String,
    /// The heartbeats: the last sent, the period, and whether it said "full".
    beat: (Instant, Duration, bool),
    /// The test hook [`runs::HOLD_AFTER_CLAIM`]: where to say a claim was won, then stop.
    hold: Option<std::path::PathBuf>,
}

/// Serve the crontab until SIGTERM or SIGINT, and every run has ended.
pub fn serve(
    replica: &Replica,
    reload: &dyn Fn() -> Result<Vec<CronJob>>,
    json: bool,
    log: &Log,
) -> Result<Exit> {
    let exe = std::env::current_exe().map_err(|e| {
        anyhow!(
            "cannot find cronlock's own binary: {}",
            crate::log::io_text(&e)
        )
    })?;
    let me = format!(
        "{}/{}",
        crate::host::hostname(),
        uuid::Uuid::new_v4().simple()
    );
    let mut table = Table::new(&replica.jobs, true, &me);
    table.lapse = BEAT * 3;
    let (answered, answers) = mpsc::channel();
    let claims =
        Claims::start(answered).map_err(|e| anyhow!("cannot start the claims thread: {e}"))?;
    let mut r = Replicant {
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
        me,
        // The first heartbeat goes out at once.
        beat: (Instant::from_duration(Duration::ZERO), BEAT, false),
        hold: std::env::var_os(runs::HOLD_AFTER_CLAIM).map(Into::into),
    };
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
    let mut modified = mtime(&replica.file);
    let mut checked = Instant::now();
    let set = SigSet::of(&[
        libc::SIGTERM,
        libc::SIGINT,
        libc::SIGHUP,
        libc::SIGCHLD,
        signals::WAKEUP,
    ]);
    loop {
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
            r.claim(&mut table);
            r.heartbeat(&mut table, false);
        }
        let wake = r.wake(&table, phase, checked + FILE_CHECK);
        match signals::wait(&set, wake.saturating_duration_since(Instant::now())) {
            Some(libc::SIGTERM | libc::SIGINT) if phase == Phase::Serving => {
                log.info(
                    "draining",
                    &format!(
                        "stopping: claiming nothing more; {} running jobs may go on for {}",
                        r.runs.len(),
                        crate::duration::Span(replica.drain)
                    ),
                    &[("running", r.runs.len().into())],
                );
                phase = Phase::Draining {
                    until: Instant::now() + replica.drain,
                };
                // Out of the ranking at once: the others take this replica's instants.
                r.heartbeat(&mut table, true);
            }
            // A second one: stop them now.
            Some(libc::SIGTERM | libc::SIGINT) => {
                if let Phase::Draining { .. } = phase {
                    phase = Phase::Draining {
                        until: Instant::now(),
                    };
                }
            }
            Some(libc::SIGHUP) => {
                table.reload(reload, log);
                modified = mtime(&replica.file);
            }
            _ => {}
        }
        if checked.elapsed() >= FILE_CHECK {
            checked = Instant::now();
            let now_modified = mtime(&replica.file);
            if now_modified != modified {
                modified = now_modified;
                table.reload(reload, log);
            }
        }
    }
    let said = if r.interrupted {
        "stopped; some runs had to be stopped"
    } else {
        "stopped; every run ended on its own"
    };
    log.info("replica_stopped", said, &[]);
    Ok(if r.interrupted {
        Exit::Signal(libc::SIGTERM)
    } else {
        Exit::Success
    })
}

impl Replicant<'_> {
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
            Phase::Serving => table
                .next_wake()
                .map(|ms| {
                    let left = (ms - unix_millis() as i64).max(0) as u64;
                    (now + Duration::from_millis(left)).min(self.beat.0 + self.beat.1)
                })
                .or(Some(self.beat.0 + self.beat.1)),
            Phase::Draining { until } => Some(until),
            Phase::Stopping { kill_at } => Some(kill_at),
            Phase::Killed => None,
        };
        at.map_or(file_check, |at| at.min(file_check))
    }

    /// Send the claims there is room for.
    fn claim(&mut self, table: &mut Table) {
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

    /// Send this replica's heartbeat to each group its jobs claim in: when the period is over,
    /// when "full" changed (at most every [`BEAT_AGAIN`]), or, `leaving`, to leave the ranking.
    fn heartbeat(&mut self, table: &mut Table, leaving: bool) {
        let busy = self.runs.len() + self.in_flight;
        let full = busy >= self.replica.max_jobs as usize;
        let (sent, every, said_full) = self.beat;
        let since = sent.elapsed();
        if !leaving && since < every && (full == said_full || since < BEAT_AGAIN) {
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
        self.beat = (Instant::now(), every, full);
        table.lapse = every * 3;
    }

    /// Act on the claims thread's answers: start a won run, note a lost one, take a new view.
    fn answers(&mut self, table: &mut Table, phase: Phase) {
        while let Ok(answer) = self.answers.try_recv() {
            let (key, instant, verdict, config) = match answer {
                Answer::Claim {
                    key,
                    instant,
                    verdict,
                    config,
                } => (key, instant, verdict, config),
                Answer::Missed {
                    key,
                    config,
                    instant,
                    recorded,
                } => {
                    self.missed(&key, &config, instant, recorded);
                    continue;
                }
                Answer::View { group, view } => {
                    match view {
                        Ok(view) => {
                            // 100 ms more per replica above 5: a fleet's heartbeats stay at about
                            // 10 calls a second.
                            let n = view.live.len().max(5) as u32;
                            self.beat.1 = BEAT * n / 5;
                            table.set_view(group, view);
                        }
                        Err(text) => self.log.event(
                            Level::Debug,
                            "heartbeat_failed",
                            &format!("cannot send this replica's heartbeat: {text}"),
                            &[],
                        ),
                    }
                    continue;
                }
            };
            self.in_flight = self.in_flight.saturating_sub(1);
            let failed = matches!(verdict, Verdict::Failed(_));
            table.answered(&key, !failed, self.log);
            let first_news = failed && !std::mem::replace(&mut self.trouble_told, failed);
            let Some(job) = table.job(&key).map(|j| j.cron.clone()) else {
                // Removed by a reload meanwhile: a won claim is given back.
                if let Verdict::Won(held) = verdict {
                    self.claims.send(Ask::Release { config, held });
                }
                continue;
            };
            match verdict {
                Verdict::Won(held) if phase != Phase::Serving => {
                    self.claims.send(Ask::Release { config, held });
                }
                Verdict::Won(held) => self.start(&job, held),
                Verdict::Failed(text) if first_news => self.log.warn(
                    "claim_failed",
                    &format!(
                        "{key}: cannot claim the {} instant: {text}; trying again every second \
                         (said once until a claim goes through)",
                        rfc3339(instant.max(0) as u64)
                    ),
                ),
                Verdict::Failed(_) => {}
                lost => self.lost(table, &job, instant, lost),
            }
        }
    }

    /// Ask for the instants this replica gave up to be recorded missed (unless they ran), and
    /// leave the fleets a reload left.
    fn give_up(&mut self, table: &mut Table) {
        for (group, config) in std::mem::take(&mut table.left) {
            self.claims.send(Ask::Beat {
                config,
                group,
                id: self.me.clone(),
                lapse: Duration::ZERO,
                full: false,
            });
        }
        for (key, instant) in std::mem::take(&mut table.gave_up) {
            if let Some(job) = table.job(&key) {
                let config = job.cron.config.clone();
                self.claims.send(Ask::Missed {
                    key,
                    config,
                    instant,
                });
            }
        }
    }

    /// An instant recorded missed: one line, and the job's metrics file says so.
    fn missed(
        &mut self,
        key: &str,
        config: &crate::config::RunConfig,
        instant: i64,
        recorded: Result<bool, String>,
    ) {
        let at = rfc3339(instant.max(0) as u64);
        match recorded {
            Ok(true) => {
                self.log.warn(
                    "missed",
                    &format!(
                        "{key}: the {at} instant was missed: no replica had room to start it \
                         in time (--max-jobs); recorded missed"
                    ),
                );
                if let Ok(report) = crate::fleet::report::Report::new(&config.reports, self.log) {
                    report.missed(key, instant.max(0) as u64, self.log);
                }
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

    /// Start the run of a won claim; a run that cannot start gives its claim back.
    fn start(&mut self, job: &CronJob, held: Box<crate::store::lock::Held>) {
        if let Some(path) = &self.hold {
            let _ = std::fs::write(path, &job.key);
            loop {
                std::thread::park();
            }
        }
        let heard = &self.heard.0;
        match runs::spawn(&self.exe, job, &held, (self.json, heard), self.log) {
            Ok(run) => {
                self.runs.insert(run.pid(), run);
            }
            Err(e) => {
                self.log.error(
                    "spawn_failed",
                    &format!(
                        "{}: cannot start its run: {e:#}; released the claim",
                        job.key
                    ),
                );
                let config = job.config.clone();
                self.claims.send(Ask::Release { config, held });
            }
        }
    }

    /// A claim another replica's run (or a suspension) answered: said under `-v`, reported in the
    /// job's metrics file, and, with `--retries`, looked at again when the holder's lock would
    /// lapse.
    fn lost(&mut self, table: &mut Table, job: &CronJob, instant: i64, verdict: Verdict) {
        let key = &job.key;
        let at = rfc3339(instant.max(0) as u64);
        let mut suspended = None;
        let text = match &verdict {
            Verdict::Busy { holder, expires_in } => {
                if let (true, Some(left)) = (job.retries > 0, expires_in) {
                    let at = unix_millis() as i64 + left.as_millis() as i64 + 250;
                    table.look_again(key, at);
                }
                let by = crate::fleet::describe::describe_holder(holder);
                format!("{key}: the {at} instant is held by {by}")
            }
            Verdict::AlreadyRan => format!("{key}: the {at} instant already ran or is not due"),
            Verdict::Suspended(record) => {
                suspended = Some(crate::fleet::describe::suspended_since(record).unwrap_or(0));
                let how = crate::fleet::describe::describe_suspension(record);
                format!("{key}: suspended {how}; the {at} instant is recorded skipped")
            }
            Verdict::Won(_) | Verdict::Failed(_) => return,
        };
        let fields = [("key", key.clone().into()), ("instant", instant.into())];
        self.log.event(Level::Debug, "claim_lost", &text, &fields);
        if job.config.reports.metrics_dir.is_some() {
            report_skip(job, suspended, self.log);
        }
    }

    /// Read what the runs reported.
    fn reports(&mut self, table: &mut Table) {
        while let Ok((pid, heard)) = self.heard.1.try_recv() {
            let Some(run) = self.runs.get_mut(&pid) else {
                continue;
            };
            match heard {
                None => run.closed = true,
                Some(Report::Started { pid: group }) => {
                    run.started = true;
                    said_started(run, group, self.log);
                }
                Some(Report::Ended {
                    status,
                    ending,
                    duration,
                }) => {
                    run.ended = true;
                    said_ended(run, (status, ending, duration), self.log);
                    let retries = table.job(&run.key).is_some_and(|j| j.cron.retries > 0);
                    if status != 0 && retries {
                        table.look_again(&run.key, unix_millis() as i64 + 1000);
                    }
                }
            }
        }
    }

    /// Forget the runs that are over; one that died without reporting its end is said, and looked
    /// at again (with `--retries`) once its lock has lapsed.
    fn forget_ended(&mut self, table: &mut Table) {
        let over: Vec<u32> = self
            .runs
            .iter()
            .filter(|(_, r)| r.over())
            .map(|(p, _)| *p)
            .collect();
        for pid in over {
            let Some(run) = self.runs.remove(&pid) else {
                continue;
            };
            let status = run.exited.map(|s| s.to_string()).unwrap_or_default();
            if run.stopped {
                self.interrupted = true;
                self.log.warn(
                    "run_stopped",
                    &format!("{}: its run was stopped ({status})", run.key),
                );
            }
            if run.ended {
                continue;
            }
            // A run that exited by itself without starting its command (it reports the start
            // right after the spawn) left no command behind: its lock is given back at once
            // (compare-and-delete), the attempt recorded interrupted. After a start, or a death
            // by a signal, the guard may have been killed with it and the command's children
            // live on: the lock is left to lapse (abandoned), as when the replica dies.
            let by_itself = run.exited.is_some_and(|s| s.code().is_some());
            let release = !run.started && by_itself;
            if !run.stopped {
                let then = if release {
                    "its lock is released"
                } else {
                    "its lock is left to lapse"
                };
                self.log.warn(
                    "run_died",
                    &format!(
                        "{}: its run ended ({status}) without reporting an end; {then}",
                        run.key
                    ),
                );
            }
            if release {
                self.claims.send(Ask::Release {
                    config: run.config.clone(),
                    held: run.held.clone(),
                });
            }
            if table.job(&run.key).is_some_and(|j| j.cron.retries > 0) {
                let wait = if release {
                    1000
                } else {
                    run.ttl.as_millis() as i64 + 250
                };
                table.look_again(&run.key, unix_millis() as i64 + wait);
            }
        }
    }
}

/// "KEY: started for the INSTANT instant, attempt N (fencing token F)".
fn said_started(run: &Run, group: u32, log: &Log) {
    let at = run.instant.map_or(String::new(), |ms| {
        format!(" for the {} instant", rfc3339(ms.max(0) as u64))
    });
    log.info(
        "run_started",
        &format!(
            "{}: started{at}, attempt {} (fencing token {})",
            run.key, run.attempt, run.fence
        ),
        &[
            ("key", run.key.clone().into()),
            ("instant", run.instant.into()),
            ("attempt", run.attempt.into()),
            ("fencing_token", run.fence.into()),
            ("run_pid", run.pid().into()),
            ("command_pid", group.into()),
        ],
    );
}

/// "KEY: command exited with status S after D", or how else it ended.
fn said_ended(run: &Run, (status, ending, took): (u8, Ending, Duration), log: &Log) {
    let how = match ending {
        Ending::Exited => format!("command exited with status {status}"),
        Ending::Signalled => format!("command was killed by a signal (status {status})"),
        Ending::Lost => "command was terminated: lock lost".into(),
        Ending::MaxRuntime => "command was terminated: --max-runtime".into(),
        Ending::NotStarted => format!("command did not start (status {status})"),
    };
    let took = Duration::from_millis(took.as_millis() as u64);
    log.info(
        "run_ended",
        &format!("{}: {how} after {}", run.key, crate::duration::Span(took)),
        &[
            ("key", run.key.clone().into()),
            ("instant", run.instant.into()),
            ("attempt", run.attempt.into()),
            ("exit_status", status.into()),
            ("ended", ending.name().into()),
            ("duration_ms", (took.as_millis() as u64).into()),
        ],
    );
}

/// A lost claim in the job's metrics file, as the losing run used to write it (skipped, and
/// `cronlock_suspended` while KEY is suspended).
fn report_skip(job: &CronJob, suspended: Option<u64>, log: &Log) {
    use crate::fleet::report::{Report, RunOutcome};
    let Ok(report) = Report::new(&job.config.reports, log) else {
        return;
    };
    let outcome = RunOutcome {
        result: Ok(Exit::Conflict(job.conflict_exit_code)),
        locked: false,
        run: None,
        body: None,
        suspended,
    };
    report.tell(&job.key, unix_millis(), &outcome, log);
}

/// The file's modification time (a ConfigMap's symlink swap changes it too).
fn mtime(path: &std::path::Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}
