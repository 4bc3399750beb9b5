//! One run, in order: take the lock, start the command beside its guard, let the watchdog keep
//! the lock while it runs, release, and record what happened.
//!
//! It exists so that the order of a run reads top to bottom in one place. Each step is one call
//! into the wing that does it ([`crate::store`] for Redis, [`crate::command`] for the command,
//! [`crate::fleet`] for the report); the lines a step logs are written beside it here.

use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use anyhow::Result;

use crate::clock::Instant;
use crate::command::capture::{self, CapturePlan};
use crate::command::cgroup;
use crate::command::child::Stdio;
use crate::command::child::{self, Child, Ended, Stop};
use crate::command::oversight::{RunCgroup, RunGuard};
use crate::command::shared::Shared;
use crate::command::supervise::{self, Limits};
use crate::config::RunConfig;
use crate::duration::Span;
use crate::exit::Exit;
use crate::fleet::metrics;
use crate::fleet::report::{Report, RunOutcome};
use crate::handover::{ReleaseAnswer, RunEnd, RunReport, RunSide};
use crate::lease::{self, LockState, Validity};
use crate::log::Log;
use crate::record::run::CommandEnd;
use crate::record::run::Ending;
use crate::record::run::KeptLine;
use crate::signals;
use crate::store::lock::{Held, ReleaseOptions};
use crate::store::quorum::Masters;
use crate::store::tracking;
use crate::watchdog::Watchdog;

/// Told the run id once the command started (the start ping).
type OnStart<'a> = &'a mut dyn FnMut(&str, u32);

mod handed;
mod release;
mod replacing;
pub mod starter;
mod take;

use release::{release, said_released};
use take::{acquired_line, take, Taken};

/// How long a replica's run waits, at its end, for its replica to read the output its command
/// left in the pipes (a replica whose stdout is stalled reads nothing meanwhile).
const OUTPUT_READ_WITHIN: Duration = Duration::from_millis(100);

/// The command's process group while one runs, so a panic on the main thread can still end it.
pub static RUNNING_GROUP: AtomicI32 = AtomicI32::new(0);

/// One run, with its reports (metrics file, pings): a command line's, or a replica's run that its
/// starter forked (and guards: `guard`, see [`crate::command::oversight`]).
pub fn run_reported(config: &RunConfig, log: &Log, guard: Option<RunGuard>) -> Result<Exit> {
    let mut report = Report::new(&config.reports, log)?;
    let attempted = crate::clock::unix_millis();
    let outcome = run_job(config, log, guard, &mut |rid, attempt| {
        report.started(&config.key, rid, attempt, log)
    });
    report.tell(&config.key, attempted, &outcome, log);
    outcome.result
}

/// Take the lock, run the command under the watchdog, release and record the run: how it went,
/// for the reports. `on_start` is called once the command started, with its run id and attempt
/// (the start ping, the metrics' `cronlock_running`). A run its replica's starter guards has
/// `guard`: no guard process of its own where the starter made its command's cgroup.
pub fn run_job(
    config: &RunConfig,
    log: &Log,
    guard: Option<RunGuard>,
    on_start: &mut dyn FnMut(&str, u32),
) -> RunOutcome {
    let mut outcome = RunOutcome {
        result: Ok(Exit::Success),
        locked: false,
        run: None,
        body: None,
        suspended: None,
    };
    outcome.result = run_locked(config, log, guard, on_start, &mut outcome);
    outcome
}

/// [`run_job`], with what the reports need written into `outcome` as it happens.
fn run_locked(
    config: &RunConfig,
    log: &Log,
    guard: Option<RunGuard>,
    on_start: OnStart<'_>,
    outcome: &mut RunOutcome,
) -> Result<Exit> {
    log.set_key(&config.key);
    let asked = Instant::now();
    // A replica's run is handed the lock the replica claimed; any other run takes it.
    let (held, masters, channel) = match config.handover {
        Some(fd) => {
            let handed::Handed {
                held,
                masters,
                side,
            } = handed::receive(config, fd, log)?;
            (held, masters, Some(side))
        }
        None => match take(config, log, &mut outcome.suspended)? {
            Taken::Held(granted) => (granted.held, granted.masters, None),
            Taken::NotRun(exit) => return Ok(exit),
        },
    };
    outcome.locked = true;
    log.set_lock(&held.holder.token, held.fence);
    log.info(
        "acquired",
        &acquired_line(config, &held),
        &[
            ("waited_ms", (asked.elapsed().as_millis() as u64).into()),
            ("instant", held.instant.into()),
            ("attempt", held.attempt.into()),
        ],
    );
    let mut run = Run::new(config, log, held, masters, channel, guard)?;
    replacing::wait_for_replaced(config, &run.held, &run.watchdog.validity, log);
    wait_for_instant(&run.held, config.jitter_offset());
    let mut captured = capture::Captured::default();
    let end = run.command(on_start, &mut captured);
    outcome.body = captured.body;
    outcome.run = run.finish(end, captured.kept);
    Ok(end.exit)
}

/// The most a run waits for its instant: a claim goes at most 250 ms before it by Redis's clock
/// (`acquire.lua`'s `AHEAD`), a replica's 50 ms (`LEAD_MS`).
const MAX_EARLY: Duration = Duration::from_secs(1);

/// Sleep until the held scheduled instant comes by Redis's clock (`--jitter`'s offset after it),
/// if it is ahead (by at most [`MAX_EARLY`]): called as late as possible, right before the
/// command is started, so no command starts before its instant by Redis's clock. (A manual
/// instant is a label, and runs now.)
fn wait_for_instant(held: &Held, offset: Duration) {
    let Some(due) = held.due else {
        return;
    };
    let ahead = (due + offset).saturating_duration_since(Instant::now());
    std::thread::sleep(ahead.min(MAX_EARLY));
}

/// One run that holds its lock: what it was asked to do, the lock, its log, the channel to the
/// replica that handed it the lock (a replica's run), and the watchdog that keeps the lock
/// while the command runs. Its steps are its methods, in order: [`Run::command`] (start the
/// command beside its guard, supervise it) and [`Run::finish`] (stop the watchdog, release,
/// record).
struct Run<'a> {
    config: &'a RunConfig,
    log: &'a Log,
    held: Held,
    channel: Option<RunSide>,
    watchdog: Watchdog,
    limits: Limits,
    /// The page it shares with the guard, or with its starter (told the kill-by time each time
    /// the lease moves).
    shared: Shared,
    /// The cgroup its starter made for its command, which the starter guards: the command starts
    /// in it with no guard process (a replica's run).
    overseen: Option<RunCgroup>,
}

/// A command started: its process, and with `--ping-body` the capture of its output (its clock
/// started).
struct Started {
    child: Child,
    capture: Option<capture::Capture>,
}

impl<'a> Run<'a> {
    /// The run of a lock just taken or handed over. A page that cannot be shared with the guard
    /// releases the lock: nothing runs.
    fn new(
        config: &'a RunConfig,
        log: &'a Log,
        held: Held,
        masters: Masters,
        channel: Option<RunSide>,
        guard: Option<RunGuard>,
    ) -> Result<Run<'a>> {
        let timing = config.timing;
        let until = held.sent_at + timing.ttl;
        let kill_by = lease::kill_by(until, timing.margin);
        let (page, overseen) = match guard {
            Some(guard) => {
                guard.publish_first(kill_by);
                (Ok(guard.shared), guard.cgroup)
            }
            None => (Shared::new(kill_by), None),
        };
        let shared = match page {
            Ok(shared) => shared,
            Err(e) => {
                let within = config.connect_timeout;
                let opts = ReleaseOptions::default();
                let redis = &config.servers;
                release(redis, within, Some(masters), &held, until, &opts, log);
                return Err(
                    anyhow::Error::from(e).context("cannot map the page shared with the guard")
                );
            }
        };
        let validity = Validity::new(
            until,
            timing.margin,
            std::sync::Arc::new(move |kill_by| shared.set_kill_by(kill_by)),
        );
        let mut watchdog = Watchdog::new(masters, held.clone(), timing, validity, log.clone());
        if let Some(ask) = channel.as_ref().and_then(RunSide::renew_asker) {
            watchdog.renewed_by_replica(ask);
        }
        let limits = Limits {
            grace: timing.grace,
            max_runtime: config.max_runtime,
            look_every: timing.interval,
        };
        let run = Run {
            config,
            log,
            held,
            channel,
            watchdog,
            limits,
            shared,
            overseen,
        };
        Ok(run)
    }

    /// Spawn and supervise the command; the lock is held throughout. `on_start` (and the
    /// replica, for its run) is told when it started; the end of its output goes to `captured`
    /// (`--ping-body`, `--keep-output`).
    fn command(&mut self, on_start: OnStart<'_>, captured: &mut capture::Captured) -> CommandEnd {
        let Started { child, mut capture } = match self.start() {
            Ok(started) => started,
            Err(exit) => {
                return CommandEnd {
                    exit,
                    ending: Ending::NotStarted,
                    started_ms: None,
                    finished_ms: crate::clock::unix_millis(),
                    interrupted: false,
                }
            }
        };
        let started_ms = crate::clock::unix_millis();
        on_start(&self.held.holder.token, self.held.attempt);
        if let Some(c) = self.channel.as_mut() {
            let pid = RUNNING_GROUP.load(Ordering::SeqCst).max(0) as u32;
            c.send(&RunReport::Started { pid });
        }
        let started = Instant::now();
        // Told at once when the lock key changes, once the command has run a little: by the
        // replica's watch when it watches the lock, else by the run's own; a replica's run also
        // hears its replica's end on the channel.
        let own = Box::new(tracking::WatchPlan {
            masters: self.config.servers.clone(),
            key: self.held.keys.lock.clone(),
            value: self.held.holder.value.clone(),
            log: self.log.clone(),
        });
        let plan: Box<dyn tracking::Watch> = match self.channel.as_mut() {
            Some(channel) => Box::new(channel.replica_watch(own)),
            None => own,
        };
        self.watchdog.track(plan, started);
        let ended = supervise::supervise(
            child,
            &mut self.watchdog,
            capture.as_mut(),
            self.limits,
            self.log,
        );
        RUNNING_GROUP.store(0, Ordering::SeqCst);
        if let Some(c) = capture {
            *captured = c.finish(Duration::from_secs(1));
        }
        CommandEnd {
            started_ms: Some(started_ms),
            ..finished(&ended, started, self.log)
        }
    }

    /// After the command: stop the watchdog (within `--connect-timeout`), then release and
    /// record the run (within another; a replica's run first asks its replica, see [`RunSide`]),
    /// and tell the replica how it ended: the end of a run is bounded by 2x `--connect-timeout`
    /// (a scheduled run's release retries until its lock would lapse). Returns the command's
    /// run for the reports, if it started.
    fn finish(self, end: CommandEnd, kept: Vec<KeptLine>) -> Option<metrics::Ran> {
        if end.ending == Ending::NotStarted
            && matches!(end.exit, Exit::Signal(_))
            && self.channel.is_some()
            && self.held.instant.is_some()
        {
            return self.undo(end);
        }
        let Run {
            config,
            log,
            held,
            mut channel,
            watchdog,
            ..
        } = self;
        let CommandEnd { exit, ending, .. } = end;
        let Stopped {
            masters,
            valid_until,
            lost,
        } = stop_watchdog(watchdog, config, ending, log);
        let run = (ending != Ending::NotStarted).then_some(metrics::Ran {
            started_ms: held.holder.started_ms,
            duration: held.sent_at.elapsed(),
            exit_status: exit.code(),
            attempt: held.attempt,
        });
        // (Made only where this run records: the replica records what it releases.)
        let opts = || config.release_options(&held, &end, || kept);
        let lost_until = if lost { Instant::now() } else { valid_until };
        let within = config.connect_timeout;
        // A replica's run has the replica release on its long-lived connection; without an
        // answer in time (the replica died or hangs), or with a failure, it releases by itself.
        // The answer is waited for only while a release of its own can still reach Redis before
        // the lock could lapse: a frozen replica must not let a success's lock lapse, and its
        // instant run again.
        let left = valid_until
            .saturating_duration_since(Instant::now())
            .saturating_sub(within + Duration::from_millis(100));
        let wait = (within + Duration::from_millis(250)).min(left);
        // The replica keeps the command's last lines as it reads them: every one of them read
        // before it is asked to release (and adds them to the record).
        if channel.is_some() && config.keep_output.bytes > 0 && ending != Ending::NotStarted {
            capture::wait_until_read(OUTPUT_READ_WITHIN.min(left));
        }
        match channel
            .as_mut()
            .and_then(|c| c.release_by_replica(&end, wait))
        {
            Some(ReleaseAnswer::Done(released)) => {
                said_released(&held, &opts(), Ok(released), lost, false, log)
            }
            Some(ReleaseAnswer::Owed(why)) => log.info(
                "release_owed",
                &format!(
                    "cannot release lock '{}' yet: {why}; the replica keeps the run's end and \
                     writes it as soon as redis answers",
                    config.key
                ),
                &[],
            ),
            Some(ReleaseAnswer::Failed(_)) | None => release(
                &config.servers,
                within,
                masters,
                &held,
                lost_until,
                &opts(),
                log,
            ),
        }
        if let Some(c) = channel.as_mut() {
            c.send(&RunReport::Ended(RunEnd {
                status: exit.code(),
                ending,
                duration: held.sent_at.elapsed(),
            }));
        }
        run
    }

    /// A replica's run asked to end before its command started (its starter died, with its
    /// replica or alone; a drain's end): the claim never became a run, so it is undone (the
    /// lock, the schedule record and the ledger entry rolled back), not released as spent, and
    /// the instant runs elsewhere at once. The replica, if it is there, is told how it ended.
    fn undo(self, end: CommandEnd) -> Option<metrics::Ran> {
        let Run {
            config,
            held,
            mut channel,
            watchdog,
            ..
        } = self;
        let masters = watchdog.stop(Duration::ZERO);
        release::undo(&config.servers, config.connect_timeout, masters, &held);
        if let Some(c) = channel.as_mut() {
            c.send(&RunReport::Ended(RunEnd {
                status: end.exit.code(),
                ending: end.ending,
                duration: held.sent_at.elapsed(),
            }));
        }
        None
    }

    /// Start the command, if the lock leaves time to stop it; the exit status if it did not
    /// start.
    fn start(&mut self) -> Result<Started, Exit> {
        let shared = self.shared;
        let (config, held, log) = (self.config, &self.held, self.log);
        let validity = &self.watchdog.validity;
        // A replica's run follows its replica, not the starter that forked it: a replica gone
        // (its end of the channel closed) asks this run to end, as its drain would.
        if self.channel.as_ref().is_some_and(RunSide::replica_gone) {
            signals::ask_to_end();
        }
        if let Some(sig) = signals::pending_forwarded() {
            log.info(
                "signal",
                &format!(
                    "received {} before starting; not running the command",
                    signals::name(sig)
                ),
                &[("signal", sig.into())],
            );
            return Err(Exit::Signal(sig));
        }
        let too_late = || {
            log.error(
                "lost",
                &format!(
                    "lock '{}' was taken too late to run the command safely (it could expire \
                     before the command was stopped); not running it",
                    config.key
                ),
            );
            Exit::LockLost
        };
        // The command starts only with the whole grace period still ahead of the lock's deadline.
        match validity.state() {
            LockState::Valid { until }
                if until.checked_sub(self.limits.grace + validity.margin)
                    > Some(Instant::now()) => {}
            // Lost before the start (taken over while waiting: `--overlap replace`): said so.
            LockState::Lost { reason, .. } => {
                log.error(
                    "lost",
                    &format!("lock lost: {reason}; not running the command"),
                );
                return Err(Exit::LockLost);
            }
            _ => return Err(too_late()),
        }
        let env = command_env(config, held);
        // Contained in a cgroup of its own where one can be made (the guard makes it, or the
        // starter did); why not, for -v.
        let overseen = self.overseen.take();
        let (cgroup, no_cgroup) = match cgroup::plan(&held.holder.token) {
            _ if overseen.is_some() => (None, None),
            Ok(dir) => (Some(dir), None),
            Err(why) => (None, Some(why)),
        };
        let planned = cgroup.clone();
        let mut capture = capture_for(config, log)?;
        let stdio = capture
            .as_ref()
            .map_or(Stdio::UNTOUCHED, capture::Capture::stdio);
        let spawned = match overseen {
            Some(given) => child::spawn_overseen(&config.argv, &env, shared, given, stdio),
            None => child::spawn(&config.argv, &env, shared, cgroup, stdio),
        };
        let child = match spawned {
            Ok(c) => c,
            Err(e) if e.too_late => return Err(too_late()),
            Err(e) => return Err(spawn_failed(&e, log)),
        };
        RUNNING_GROUP.store(child.group, Ordering::SeqCst);
        if let Some(c) = capture.as_mut() {
            c.started();
        }
        // While the command runs: cgroups that runs killed with their guards left beside ours
        // (a replica sweeps for its runs, `cgroup::sweep_own`).
        if let Some(ours) = planned.as_ref().filter(|_| self.channel.is_none()) {
            cgroup::sweep(ours);
        }
        contained(&child, shared, planned, no_cgroup, log);
        if crate::hooks::fault_at("main") {
            panic!("injected by a test hook (hooks::PANIC)");
        }
        Ok(Started { child, capture })
    }
}

/// The watchdog stopped once the command ended: the masters to release with, until when the
/// lock was valid, and whether it is lost (confirmed by Redis, or feared by the main loop).
struct Stopped {
    masters: Option<Masters>,
    valid_until: Instant,
    lost: bool,
}

/// Stop the watchdog. It waits at most `--connect-timeout` for a renewal in flight (the release
/// then has a `--connect-timeout` of its own), and not at all for a lock that is lost.
fn stop_watchdog(watchdog: Watchdog, config: &RunConfig, ending: Ending, log: &Log) -> Stopped {
    let release_by = Instant::now() + config.connect_timeout;
    let valid_until = match watchdog.validity.state() {
        LockState::Valid { until } => until,
        LockState::Lost { until, .. } => until,
    };
    // Lost as the command ended by itself: supervising had nothing left to stop, and said
    // nothing; the release will find the lock not ours.
    if let (LockState::Lost { reason, .. }, Ending::Exited | Ending::Signalled) =
        (watchdog.validity.state(), ending)
    {
        log.warn(
            "lost",
            &format!("lock lost: {reason}; the command had already ended"),
        );
    }
    // Confirmed by Redis, or feared by the main loop (no renewal in time): nothing to wait for.
    let lost = watchdog.validity.is_lost() || ending == Ending::Lost;
    let stop_wait = if lost {
        Duration::ZERO
    } else {
        (release_by - Instant::now()).min(valid_until - Instant::now())
    };
    Stopped {
        masters: watchdog.stop(stop_wait),
        valid_until,
        lost,
    }
}

/// The capture of the command's output, when `--ping-body` or `--keep-output` asks for one.
/// A replica keeps its runs' output as it relays it (`replica/runs.rs`): no pipe, no thread of
/// the run's own for it. `--ping-body` needs the output: a capture that cannot start fails the
/// run. What `--keep-output` keeps is a record's extra: the command runs without it (said at
/// -v).
fn capture_for(config: &RunConfig, log: &Log) -> Result<Option<capture::Capture>, Exit> {
    let keep = match config.handover {
        Some(_) => 0,
        None => config.keep_output.bytes,
    };
    let plan = CapturePlan::new(config.reports.wants_body(), keep);
    match plan.map(capture::Capture::start) {
        Some(Ok(c)) => Ok(Some(c)),
        Some(Err(e)) if config.reports.wants_body() => {
            let text = crate::log::io_text(&e);
            log.error(
                "spawn_failed",
                &format!("cannot capture the output for --ping-body: {text}"),
            );
            Err(Exit::Failure)
        }
        Some(Err(e)) => {
            log.info(
                "output_not_kept",
                &format!(
                    "cannot capture the command's output to keep it (--keep-output): {}; \
                     running it without",
                    crate::log::io_text(&e)
                ),
                &[],
            );
            Ok(None)
        }
        None => Ok(None),
    }
}

/// The variables the command gets: the lock's, and with `--schedule` which instant this run is
/// for (to the second and to the millisecond: a manual instant is named by the asking host's
/// clock, and may share its second with a scheduled one), whether it is a manual one
/// (`--trigger`), and which attempt at it.
fn command_env(config: &RunConfig, held: &Held) -> Vec<child::CommandVariable> {
    let var = |name, value| child::CommandVariable { name, value };
    let mut env = vec![
        var("CRONLOCK_KEY", config.key.clone()),
        var("CRONLOCK_TOKEN", held.holder.token.clone()),
        var("CRONLOCK_FENCING_TOKEN", held.fence.to_string()),
        var("CRONLOCK_SLOT", held.slot.to_string()),
        var("CRONLOCK_RUN_ID", held.holder.token.clone()),
    ];
    if let Some(i) = held.instant {
        env.extend([
            var("CRONLOCK_INSTANT", crate::clock::rfc3339(i.max(0) as u64)),
            var("CRONLOCK_INSTANT_MS", i.max(0).to_string()),
            var("CRONLOCK_MANUAL", u8::from(held.manual).to_string()),
            var("CRONLOCK_ATTEMPT", held.attempt.to_string()),
        ]);
    }
    env
}

/// A command that could not be started: one line saying why, and the exit status (126, 127).
fn spawn_failed(e: &child::SpawnError, log: &Log) -> Exit {
    let text = crate::log::io_text(&e.error);
    let line = if e.no_process {
        let hint = match e.error.raw_os_error() {
            Some(libc::EAGAIN) => " (too many processes for this user: ulimit -u?)",
            _ => "",
        };
        format!(
            "cannot make a process to run '{}' (the guard or the command): \
             {text}{hint}; the command did not run",
            e.program
        )
    } else {
        format!("cannot run '{}': {text}", e.program)
    };
    log.error("spawn_failed", &line);
    e.exit()
}

/// For `-v`: how the command is contained (its cgroup, or why it has none).
fn contained(
    child: &Child,
    shared: Shared,
    planned: Option<std::path::PathBuf>,
    no_cgroup: Option<String>,
    log: &Log,
) {
    let no_cgroup = no_cgroup.or_else(|| {
        let errno = shared.cgroup_error()?;
        let dir = planned.as_deref()?.display();
        let text = crate::log::io_text(&std::io::Error::from_raw_os_error(errno));
        Some(format!("cannot make {dir}: {text}"))
    });
    let child::Containment { mechanism, how } = child.containment(no_cgroup);
    log.info(
        "containment",
        &format!("the command runs in {how}"),
        &[("mechanism", mechanism.into())],
    );
}

/// "command exited with status N after D": cronlock's exit status, and what the run record
/// calls the ending (its start is the caller's to fill in).
fn finished(ended: &Ended, started: Instant, log: &Log) -> CommandEnd {
    let exit = ended.exit();
    let (ending, how) = match (&ended.stopped, ended.status) {
        (Some(Stop::LockLost(_)), _) => (Ending::Lost, "was terminated: lock lost".to_string()),
        (Some(Stop::MaxRuntime), _) => (Ending::MaxRuntime, "was terminated: --max-runtime".into()),
        (None, Exit::Signal(n)) => (
            Ending::Signalled,
            format!("was killed by {}", signals::name(n)),
        ),
        (None, e) => (Ending::Exited, format!("exited with status {}", e.code())),
    };
    let took_ms = started.elapsed().as_millis() as u64;
    log.info(
        "finished",
        &format!(
            "command {how} after {}",
            Span(std::time::Duration::from_millis(took_ms))
        ),
        &[
            ("exit_status", exit.code().into()),
            ("ended", ending.name().into()),
            ("duration_ms", took_ms.into()),
        ],
    );
    CommandEnd {
        exit,
        ending,
        started_ms: None,
        finished_ms: crate::clock::unix_millis(),
        interrupted: signals::asked_to_end(),
    }
}
