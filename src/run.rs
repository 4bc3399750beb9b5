//! One run, in order: take the lock, start the command beside its guard, let the watchdog keep
//! the lock while it runs, release, and record what happened.
//!
//! It exists so that the order of a run reads top to bottom in one place. Each step is one call
//! into the wing that does it ([`crate::store`] for Redis, [`crate::job`] for the command,
//! [`crate::fleet`] for the report); the lines a step logs are written beside it here.

use std::ffi::OsString;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use anyhow::Result;
use serde_json::Value;

use crate::cli::{Cli, Job};
use crate::clock::Instant;
use crate::duration::Span;
use crate::exit::Exit;
use crate::fleet::record::{self, Ending};
use crate::fleet::report::Report;
use crate::fleet::{admin, metrics};
use crate::host;
use crate::job::child::{self, Child, Ended, Stop};
use crate::job::shared::Shared;
use crate::job::supervise::{self, Limits};
use crate::job::{capture, cgroup};
use crate::lease::{self, LockState, Timing, Watch};
use crate::log::{Level, Log};
use crate::signals;
use crate::store::keys::Keys;
use crate::store::lock::{self, Held, ReleaseOptions, Released};
use crate::store::quorum::Masters;
use crate::store::topology::Redis;
use crate::store::tracking;
use crate::store::wait::{self, Acquired};
use crate::watchdog::Watchdog;

/// The command's process group while one runs, so a panic on the main thread can still end it.
pub static RUNNING_GROUP: AtomicI32 = AtomicI32::new(0);

/// Take the lock, run the command under the watchdog, release and record the run.
pub fn run_job(
    cli: &Cli,
    job: &Job,
    timing: Timing,
    redis: &[Redis],
    log: &Log,
    report: &mut Report,
) -> Result<Exit> {
    log.set_key(&job.key);
    let asked = Instant::now();
    let (held, masters) = match take(cli, job, timing, redis, log)? {
        Ok(taken) => taken,
        Err(exit) => return Ok(exit),
    };
    report.locked = true;
    log.set_lock(&held.holder.token, held.fence);
    log.info(
        "acquired",
        &acquired_line(cli, job, &held),
        &[("waited_ms", (asked.elapsed().as_millis() as u64).into())],
    );
    let until = held.sent_at + timing.ttl;
    // The guard's page, told the kill-by time each time the lease moves.
    let shared = match Shared::new(lease::kill_by(until, timing.margin)) {
        Ok(shared) => shared,
        Err(e) => {
            let until = held.sent_at + timing.ttl;
            release(
                redis,
                Some(masters),
                &held,
                until,
                &ReleaseOptions::default(),
                log,
            );
            return Err(anyhow::Error::from(e).context("cannot map the page shared with the guard"));
        }
    };
    let watch = Watch::new(
        until,
        timing.margin,
        std::sync::Arc::new(move |kill_by| shared.set_kill_by(kill_by)),
    );
    let mut watchdog = Watchdog::new(masters, held.clone(), timing, watch, log.clone());
    let limits = Limits {
        grace: timing.grace,
        max_runtime: cli.max_runtime(),
        look_every: timing.interval,
    };
    let (exit, ending) = run_child(
        job,
        &held,
        redis,
        (&mut watchdog, shared),
        limits,
        log,
        report,
    );
    finish(cli, redis, watchdog, &held, (exit, ending), log, report)?;
    Ok(exit)
}

/// Ask for the lock (waiting as `--wait` says): ours, or the exit status of a run that does not
/// start, its reason logged.
fn take(
    cli: &Cli,
    job: &Job,
    timing: Timing,
    redis: &[Redis],
    log: &Log,
) -> Result<Result<(Held, Masters), Exit>> {
    let keys = Keys::new(&cli.prefix, &job.key);
    let command = command_line(&job.argv);
    let asked = Instant::now();
    let slot = cli.schedule.as_ref().map(|s| lock::Slot {
        schedule: s.text.clone(),
        candidates: s.candidates(host::unix_millis() as i64),
    });
    let ask = wait::Ask {
        ttl: timing.ttl,
        wait: cli.wait(),
        slot,
        limit: cli.limit,
    };
    let exit = match wait::acquire(Masters::new(redis), &keys, &command, ask, log)? {
        Acquired::Held(held, masters) => return Ok(Ok((*held, masters))),
        Acquired::Busy(value) => {
            busy(cli, job, &value, asked.elapsed(), log);
            Exit::Conflict(cli.conflict_exit_code)
        }
        Acquired::AlreadyRan { instant, ran } => {
            already_ran(cli, job, instant, ran, log);
            Exit::Conflict(cli.conflict_exit_code)
        }
        Acquired::Signalled(sig) => {
            log.info(
                "signal",
                &format!(
                    "received {} while waiting; not running the command",
                    signals::name(sig)
                ),
                &[("signal", sig.into())],
            );
            Exit::Signal(sig)
        }
    };
    Ok(Err(exit))
}

/// The lock (or every slot) is held elsewhere: say by whom, and how long we waited.
fn busy(cli: &Cli, job: &Job, value: &str, waited: Duration, log: &Log) {
    let after = if cli.wait().is_zero() {
        String::new()
    } else {
        format!(
            " after waiting {}",
            Span(Duration::from_millis(waited.as_millis() as u64))
        )
    };
    let holder = admin::describe_holder(value);
    let text = if cli.limit > 1 {
        format!(
            "all {} slots of lock '{}' are held (the first to free by {holder}){after}; not \
             running the command",
            cli.limit, job.key,
        )
    } else {
        format!(
            "lock '{}' is held by {holder}{after}; not running the command",
            job.key
        )
    };
    log.info(
        "busy",
        &text,
        &[
            ("conflict_exit_code", cli.conflict_exit_code.into()),
            ("waited_ms", (waited.as_millis() as u64).into()),
            ("holder", admin::holder_identity(value)),
        ],
    );
}

/// `--schedule`: the run for this instant (or a later one) already started.
fn already_ran(cli: &Cli, job: &Job, instant: i64, ran: i64, log: &Log) {
    let label = |at: i64| {
        cli.schedule
            .as_ref()
            .map_or_else(|| at.to_string(), |s| s.label(at))
    };
    let what = if ran > instant {
        format!("a later run ({}) already started", label(ran))
    } else {
        format!("already ran for the {} run", label(instant))
    };
    log.info(
        "already_ran",
        &format!("lock '{}': {what}; not running the command", job.key),
        &[
            ("conflict_exit_code", cli.conflict_exit_code.into()),
            ("instant", instant.into()),
            ("recorded_instant", ran.into()),
        ],
    );
}

/// "acquired [slot S of N of ]lock 'KEY' (fencing token F)[ for the ... run]".
fn acquired_line(cli: &Cli, job: &Job, held: &Held) -> String {
    let slot = if held.limit > 1 {
        format!("slot {} of {} of ", held.slot, held.limit)
    } else {
        String::new()
    };
    let run = match (held.instant, &cli.schedule) {
        (Some(i), Some(s)) => format!(" for the {} run", s.label(i)),
        _ => String::new(),
    };
    format!(
        "acquired {slot}lock '{}' (fencing token {}){run}",
        job.key, held.fence
    )
}

/// After the command: stop the watchdog (within `--connect-timeout`), then release and record the
/// run (within another): the end of a run is bounded by 2x `--connect-timeout`.
fn finish(
    cli: &Cli,
    redis: &[Redis],
    watchdog: Watchdog,
    held: &Held,
    (exit, ending): (Exit, Ending),
    log: &Log,
    report: &mut Report,
) -> Result<()> {
    // Stopping the watchdog waits at most --connect-timeout (a renewal in flight); the release
    // then has a --connect-timeout of its own.
    let release_by = Instant::now() + redis[0].connect_timeout;
    let valid_until = match watchdog.watch.state() {
        LockState::Valid { until } => until,
        LockState::Lost { until, .. } => until,
    };
    // Confirmed by Redis, or feared by the main loop (no renewal in time): nothing to wait for.
    let lost = watchdog.watch.is_lost() || ending == Ending::Lost;
    let stop_wait = if lost {
        Duration::ZERO
    } else {
        (release_by - Instant::now()).min(valid_until - Instant::now())
    };
    let masters = watchdog.stop(stop_wait);
    let duration = held.sent_at.elapsed();
    if ending != Ending::NotStarted {
        report.run = Some(metrics::Run {
            started_ms: held.holder.started_ms,
            duration,
            exit_status: exit.code(),
        });
    }
    let opts = ReleaseOptions {
        hold: (held.sent_at + cli.min_hold.0).saturating_duration_since(Instant::now()),
        record: Some(record::run_record(held, ending, exit, duration).to_string()),
        history: cli.history_kept()?,
        record_ttl: cli.history_ttl.map(|t| t.0),
    };
    let lost_until = if lost { Instant::now() } else { valid_until };
    release(redis, masters, held, lost_until, &opts, log);
    Ok(())
}

/// Spawn and supervise the command; the lock is held throughout.
fn run_child(
    job: &Job,
    held: &Held,
    redis: &[Redis],
    (watchdog, shared): (&mut Watchdog, Shared),
    limits: Limits,
    log: &Log,
    report: &mut Report,
) -> (Exit, Ending) {
    let child = match start(job, held, (&watchdog.watch, shared), limits, log, report) {
        Ok(child) => child,
        Err(exit) => return (exit, Ending::NotStarted),
    };
    let started = Instant::now();
    // Told at once when the lock key changes, once the command has run a little.
    let plan = tracking::Plan {
        masters: redis.to_vec(),
        key: held.keys.lock.clone(),
        value: held.holder.value.clone(),
        log: log.clone(),
    };
    watchdog.track(plan, started);
    let ended = supervise::supervise(child, watchdog, limits, log);
    RUNNING_GROUP.store(0, Ordering::SeqCst);
    report.body = report
        .capture
        .take()
        .map(|c| c.finish(Duration::from_secs(1)));
    finished(&ended, started, log)
}

/// Start the command, if the lock leaves time to stop it; the exit status if it did not start.
fn start(
    job: &Job,
    held: &Held,
    (watch, shared): (&Watch, Shared),
    limits: Limits,
    log: &Log,
    report: &mut Report,
) -> Result<Child, Exit> {
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
                "lock '{}' was taken too late to run the command safely (it could expire before \
                 the command was stopped); not running it",
                job.key
            ),
        );
        Exit::LockLost
    };
    // The command starts only with the whole grace period still ahead of the lock's deadline.
    match watch.state() {
        LockState::Valid { until }
            if until.checked_sub(limits.grace + watch.margin) > Some(Instant::now()) => {}
        _ => return Err(too_late()),
    }
    let env = [
        ("CRONLOCK_KEY", job.key.clone()),
        ("CRONLOCK_TOKEN", held.holder.token.clone()),
        ("CRONLOCK_FENCING_TOKEN", held.fence.to_string()),
        ("CRONLOCK_SLOT", held.slot.to_string()),
    ];
    // Contained in a cgroup of its own where one can be made (the guard makes it); why not, for -v.
    let (cgroup, no_cgroup) = match cgroup::plan(&held.holder.token) {
        Ok(dir) => (Some(dir), None),
        Err(why) => (None, Some(why)),
    };
    let planned = cgroup.clone();
    if report.wants_capture {
        report.capture = Some(capture::Capture::start().map_err(|e| {
            let text = crate::log::io_text(&e);
            log.error(
                "spawn_failed",
                &format!("cannot capture the output for --ping-body: {text}"),
            );
            Exit::Failure
        })?);
    }
    let stdio = report.capture.as_ref().and_then(capture::Capture::fds);
    let child = match child::spawn(&job.argv, &env, shared, cgroup, stdio) {
        Ok(c) => c,
        Err(e) if e.too_late => return Err(too_late()),
        Err(e) => {
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
            return Err(e.exit());
        }
    };
    RUNNING_GROUP.store(child.group, Ordering::SeqCst);
    report.started();
    // While the command runs: cgroups that runs killed with their guards left beside ours.
    if let Some(ours) = &planned {
        cgroup::sweep(ours);
    }
    contained(&child, shared, planned, no_cgroup, log);
    #[cfg(debug_assertions)]
    if std::env::var_os("CRONLOCK_DEBUG_PANIC").is_some_and(|v| v == "main") {
        panic!("injected by CRONLOCK_DEBUG_PANIC");
    }
    Ok(child)
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
    let (mechanism, how) = child.containment(no_cgroup);
    log.info(
        "containment",
        &format!("the command runs in {how}"),
        &[("mechanism", mechanism.into())],
    );
}

/// "command exited with status N after D", and what the run record calls the ending.
fn finished(ended: &Ended, started: Instant, log: &Log) -> (Exit, Ending) {
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
    (exit, ending)
}

/// Release our lock and record the run; problems are warnings, since the command's status is what
/// matters now. Bounded by `--connect-timeout` in all (after the watchdog's stop, which has its
/// own: the end of a run is at most 2x `--connect-timeout`); a failed call is retried once on a
/// new connection, but only while the lock can still be alive in Redis (before `valid_until`).
fn release(
    redis: &[Redis],
    masters: Option<Masters>,
    held: &Held,
    valid_until: Instant,
    opts: &ReleaseOptions,
    log: &Log,
) {
    let name = &held.keys.name;
    let end = Instant::now() + redis[0].connect_timeout;
    let lost = Instant::now() >= valid_until;
    let left = || end.saturating_duration_since(Instant::now());
    let mut masters = masters.unwrap_or_else(|| Masters::new(redis));
    let mut retried = false;
    let result = match masters.release(left(), held, opts) {
        // The watchdog's connection may have been dropped since its last renewal (a Redis
        // restart, an idle timeout, a failover): one more try, if it can still matter.
        Err(e) if e.transient() && Instant::now() < valid_until && !left().is_zero() => {
            retried = true;
            masters.release(left(), held, opts)
        }
        r => r,
    }
    .map_err(|e| anyhow::anyhow!("cannot release lock '{name}': {e}"));
    match result {
        Ok(Released::Deleted) => log.info("released", &format!("released lock '{name}'"), &[]),
        Ok(Released::Kept) => log.info(
            "held_for_min_hold",
            &format!(
                "keeping lock '{name}' for {} more (--min-hold)",
                Span(std::time::Duration::from_millis(opts.hold.as_millis() as u64))
            ),
            &[("hold_ms", Value::from(opts.hold.as_millis() as u64))],
        ),
        // Lost, or deleted by a first try whose reply the dropped connection lost.
        Ok(Released::NotOurs) if lost || retried => {}
        Ok(Released::NotOurs) => log.warn(
            "release_not_ours",
            &format!(
                "lock '{name}' was no longer ours at release (it expired or was taken over); left it alone"
            ),
        ),
        // After a loss the release is expected to fail: the loss was the one line to print.
        Err(e) => log.event(
            if lost { Level::Info } else { Level::Warn },
            "release_failed",
            &format!("{e:#}; it will expire within {}", Span(held.ttl)),
            &[],
        ),
    }
}

/// `argv` as one line for people (the holder's `command` field).
fn command_line(argv: &[OsString]) -> String {
    argv.iter()
        .map(|a| {
            let a = a.to_string_lossy();
            if a.is_empty() || a.contains(|c: char| c.is_whitespace() || "'\"\\$`".contains(c)) {
                format!("'{}'", a.replace('\'', r"'\''"))
            } else {
                a.into_owned()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}
