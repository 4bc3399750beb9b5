//! cronlock: run a command under a cluster-wide lock held in Redis.
//!
//! `run()` is the whole program: parse the command line, take the lock, run the command under the
//! watchdog, release, and turn what happened into the documented exit status.

pub mod cli;
pub mod clock;
pub mod duration;
pub mod exit;
pub mod fleet;
pub mod host;
pub mod job;
pub mod log;
pub mod store;
pub mod watchdog;

use std::ffi::OsString;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use anyhow::Result;
use clap::error::ErrorKind;
use serde_json::Value;

use crate::cli::{Cli, Job, LogFormat, Mode};
use crate::clock::Instant;
use crate::duration::Span;
use crate::exit::Exit;
use crate::fleet::record::Ending;
use crate::fleet::{admin, check, metrics, ping, record};
use crate::job::child::{Limits, Stop};
use crate::job::{capture, cgroup, child, signals};
use crate::log::{Level, Log};
use crate::store::lock::{Held, Keys, ReleaseOptions, Released};
use crate::store::quorum::Masters;
use crate::store::topology::Redis;
use crate::store::wait::Acquired;
use crate::store::{lock, tracking, wait};
use crate::watchdog::{LockState, Timing, Watch, Watchdog};

/// The command's process group while one runs, so a panic on the main thread can still end it.
static RUNNING_GROUP: AtomicI32 = AtomicI32::new(0);

/// The program: returns the exit status; never exits while the lock is held.
///
/// Rust's own start-up is kept: it opens closed descriptors 0–2 on `/dev/null` (otherwise the first
/// socket would become "stderr" and our messages would go to Redis), ignores SIGPIPE (a reader of
/// our output that went away must not kill cronlock while it holds a lock; the command gets the
/// default back before `execve`) and flushes stdout at the end.
pub fn run() -> u8 {
    run_guarded().code()
}

fn run_guarded() -> Exit {
    // Before any thread exists, so every thread inherits the mask (see `signals`).
    signals::block();
    // A panic is reported once, as our own line, by whoever catches it; never as Rust's text,
    // and never as status 101.
    std::panic::set_hook(Box::new(|_| {}));
    match std::panic::catch_unwind(run_parsed) {
        Ok(exit) => exit,
        Err(payload) => {
            let group = RUNNING_GROUP.swap(0, Ordering::SeqCst);
            let msg = watchdog::panic_message(&*payload);
            let json = std::env::var("CRONLOCK_LOG_FORMAT").is_ok_and(|f| f == "json");
            let log = Log::new(false, false, json);
            let exit = if group > 0 {
                // SAFETY: killing the command's process group, which we created.
                unsafe { libc::kill(-group, libc::SIGKILL) };
                log.error(
                    "internal",
                    &format!("internal error: {msg}; the command was stopped"),
                );
                Exit::LockLost
            } else {
                log.error("internal", &format!("internal error: {msg}"));
                Exit::Failure
            };
            log.flush(FLUSH_WAIT);
            exit
        }
    }
}

/// Parse the command line and do what it says.
fn run_parsed() -> Exit {
    let cli = match cli::parse() {
        Ok(cli) => cli,
        Err(e) => {
            return match e.kind() {
                ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
                    let _ = e.print();
                    Exit::Success
                }
                _ if checking_args() => unknown(&cli::one_line(&e)),
                _ => {
                    // The format is unknown when parsing failed; honour the environment's.
                    let json = std::env::var("CRONLOCK_LOG_FORMAT").is_ok_and(|f| f == "json");
                    let log = Log::new(false, false, json);
                    log.error("usage", &cli::one_line(&e));
                    log.flush(FLUSH_WAIT);
                    Exit::Failure
                }
            };
        }
    };
    let json = cli.log_format == LogFormat::Json;
    let (quiet, verbose) = match cli.quiet_verbose() {
        Ok(qv) => qv,
        Err(e) if cli.check => return unknown(&format!("{e:#}")),
        Err(e) => {
            let log = Log::new(false, false, json);
            log.error("usage", &format!("{e:#}"));
            log.flush(FLUSH_WAIT);
            return Exit::Failure;
        }
    };
    let log = Log::new(quiet, verbose, json);
    let exit = match execute(&cli, &log) {
        Ok(exit) => exit,
        Err(e) if cli.check => unknown(&format!("{e:#}")),
        Err(e) => {
            log.error("error", &format!("{e:#}"));
            Exit::Failure
        }
    };
    log.flush(FLUSH_WAIT);
    exit
}

/// Whether the command line asks for `--check` (when it could not be parsed).
fn checking_args() -> bool {
    std::env::args_os().any(|a| a == "--check")
}

/// `--check` could not judge: the plugin's UNKNOWN line, never status 125.
fn unknown(message: &str) -> Exit {
    let text = message.strip_prefix("cronlock: ").unwrap_or(message);
    let verdict = check::Verdict::unknown(text.to_string());
    let _ = admin::print(&verdict.render("", false));
    Exit::Check(check::State::Unknown as u8)
}

/// How long the exit waits for queued log lines to reach a slow stderr.
const FLUSH_WAIT: Duration = Duration::from_millis(500);

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

fn execute(cli: &Cli, log: &Log) -> Result<Exit> {
    let mode = cli.mode()?;
    let timing = match &mode {
        Mode::Run(_) => {
            // Checked before the lock is taken, so a bad value never runs the command.
            cli.history_kept()?;
            Some(Timing::new(cli.ttl.0, cli.grace.map(|g| g.0))?)
        }
        _ => None,
    };
    let (urls, source) = cli.redis_urls()?;
    let tls = cli.tls()?;
    let redis = urls
        .iter()
        .map(|url| Redis::new(url, source, cli.connect_timeout.0, &tls, cli.min_replicas))
        .collect::<Result<Vec<Redis>>>()?;
    let io_timeout = cli.connect_timeout.0;
    if cli.limit > 1 && redis.len() > 1 {
        anyhow::bail!(
            "--limit {} needs one Redis (plain, Sentinel or Cluster): with several independent \
             masters the holders of a KEY could not be counted safely",
            cli.limit
        );
    }
    match mode {
        Mode::Run(job) => {
            if let Some(dir) = cli.metrics_dir.as_deref().filter(|d| !d.is_dir()) {
                anyhow::bail!(
                    "--metrics-dir {} is not a directory (or CRONLOCK_METRICS_DIR)",
                    dir.display()
                );
            }
            let ping = cli.ping()?;
            let mut report = Report {
                pinger: ping
                    .as_deref()
                    .map(|url| ping::Pinger::new(url, log))
                    .transpose()?,
                run: None,
                locked: false,
                capture: ping.is_some() && cli.ping_body,
                body: None,
            };
            let attempted = host::unix_millis();
            let timing = timing.expect("checked for runs");
            let result = run_job(cli, &job, timing, &redis, log, &mut report);
            report.tell(cli, &job.key, attempted, &result, log);
            result
        }
        Mode::Status(key) => {
            let mut masters = Masters::new(&redis);
            let history = cli
                .given
                .history_flag
                .then(|| cli.history.and_then(|c| c.0));
            let keys = Keys::new(&cli.prefix, &key);
            let schedule = cli.schedule.as_ref();
            admin::print(&admin::status(
                &mut masters,
                io_timeout,
                &keys,
                cli.json,
                history,
                schedule,
            )?)?;
            Ok(Exit::Success)
        }
        Mode::Check(key) => {
            let verdict = check_key(cli, &redis, &key);
            admin::print(&verdict.render(&key, cli.json))?;
            Ok(Exit::Check(verdict.state as u8))
        }
        Mode::List => {
            admin::print(&admin::list(
                &mut Masters::new(&redis),
                io_timeout,
                &cli.prefix,
                cli.json,
                log,
            )?)?;
            Ok(Exit::Success)
        }
        Mode::ForceRelease(key) => {
            let keys = Keys::new(&cli.prefix, &key);
            admin::print(&admin::force_release(
                &mut Masters::new(&redis),
                io_timeout,
                &keys,
                cli.token.as_deref(),
                cli.json,
            )?)?;
            Ok(Exit::Success)
        }
    }
}

/// `--check KEY`: every failure is an UNKNOWN verdict, never an error.
fn check_key(cli: &Cli, redis: &[Redis], key: &str) -> check::Verdict {
    let keys = Keys::new(&cli.prefix, key);
    let mut masters = Masters::new(redis);
    let snaps = masters.snapshots(cli.connect_timeout.0, &keys, None);
    let snap = admin::merge(snaps, masters.majority()).map(|(snap, _)| snap);
    match snap {
        Ok(snap) => check::judge(
            key,
            &snap,
            cli.max_age.map(|m| m.0),
            cli.schedule.as_ref(),
            host::unix_millis(),
        ),
        Err(e) => check::Verdict::unknown(format!("{e:#}")),
    }
}

/// What a run tells the world after it ends: `--metrics-dir` and `--ping`.
struct Report {
    pinger: Option<ping::Pinger>,
    /// The command's run, when it started.
    run: Option<metrics::Run>,
    /// We held the lock, so this host is the one that pings.
    locked: bool,
    /// `--ping-body`: capture the output, and its tail once the command ended.
    capture: bool,
    body: Option<Vec<u8>>,
}

impl Report {
    fn tell(self, cli: &Cli, key: &str, attempted: u64, result: &Result<Exit>, log: &Log) {
        use metrics::Outcome;
        let outcome = match result {
            Err(_) => Outcome::Error,
            Ok(Exit::Conflict(_)) => Outcome::Skipped,
            Ok(Exit::LockLost) => Outcome::Lost,
            Ok(Exit::MaxRuntime) => Outcome::MaxRuntime,
            Ok(Exit::CannotExecute | Exit::NotFound) => Outcome::FailedToStart,
            Ok(_) if self.run.is_some() => Outcome::Ran,
            Ok(_) => Outcome::Error,
        };
        if let Some(dir) = &cli.metrics_dir {
            let attempt = metrics::Attempt {
                outcome,
                at_ms: attempted,
                run: self.run,
            };
            if let Err(e) = metrics::write(dir, key, &host::hostname(), &attempt) {
                log.warn(
                    "metrics_failed",
                    &format!(
                        "cannot write metrics to {}: {}",
                        dir.display(),
                        crate::log::io_text(&e)
                    ),
                );
            }
        }
        if let (Some(p), true) = (self.pinger, self.locked) {
            p.finished(
                result.as_ref().map_or(exit::FAILURE, |e| e.code()),
                self.body,
            );
        }
    }
}

/// Take the lock, run the command under the watchdog, release and record the run.
fn run_job(
    cli: &Cli,
    job: &Job,
    timing: Timing,
    redis: &[Redis],
    log: &Log,
    report: &mut Report,
) -> Result<Exit> {
    log.set_key(&job.key);
    let keys = Keys::new(&cli.prefix, &job.key);
    let command = command_line(&job.argv);
    let asked = Instant::now();
    let slot = cli.schedule.as_ref().map(|s| lock::Slot {
        schedule: s.text.clone(),
        candidates: s.candidates(host::unix_millis() as i64),
    });
    let masters = Masters::new(redis);
    let ask = wait::Ask {
        ttl: timing.ttl,
        wait: cli.wait(),
        slot,
        limit: cli.limit,
    };
    let acquired = wait::acquire(masters, &keys, &command, ask, log)?;
    let (held, masters) = match acquired {
        Acquired::Held(held, masters) => (*held, masters),
        Acquired::Busy(value) => {
            let waited = asked.elapsed();
            let after = if cli.wait().is_zero() {
                String::new()
            } else {
                format!(
                    " after waiting {}",
                    Span(Duration::from_millis(waited.as_millis() as u64))
                )
            };
            log.info(
                "busy",
                &if cli.limit > 1 {
                    format!(
                        "all {} slots of lock '{}' are held (the first to free by {}){after}; not \
                         running the command",
                        cli.limit,
                        job.key,
                        admin::describe_holder(&value)
                    )
                } else {
                    format!(
                        "lock '{}' is held by {}{after}; not running the command",
                        job.key,
                        admin::describe_holder(&value)
                    )
                },
                &[
                    ("conflict_exit_code", cli.conflict_exit_code.into()),
                    ("waited_ms", (waited.as_millis() as u64).into()),
                    ("holder", admin::holder_identity(&value)),
                ],
            );
            return Ok(Exit::Conflict(cli.conflict_exit_code));
        }
        Acquired::AlreadyRan { instant, ran } => {
            let label = cli
                .schedule
                .as_ref()
                .map_or_else(|| instant.to_string(), |s| s.label(instant));
            let what = if ran > instant {
                format!(
                    "a later run ({}) already started",
                    cli.schedule
                        .as_ref()
                        .map_or_else(|| ran.to_string(), |s| s.label(ran))
                )
            } else {
                format!("already ran for the {label} run")
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
            return Ok(Exit::Conflict(cli.conflict_exit_code));
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
            return Ok(Exit::Signal(sig));
        }
    };
    report.locked = true;
    log.set_lock(&held.holder.token, held.fence);
    log.info(
        "acquired",
        &format!(
            "acquired {}lock '{}' (fencing token {}){}",
            if held.limit > 1 {
                format!("slot {} of {} of ", held.slot, held.limit)
            } else {
                String::new()
            },
            job.key,
            held.fence,
            match (held.instant, &cli.schedule) {
                (Some(i), Some(s)) => format!(" for the {} run", s.label(i)),
                _ => String::new(),
            }
        ),
        &[("waited_ms", (asked.elapsed().as_millis() as u64).into())],
    );
    let watch = match Watch::new(held.sent_at + timing.ttl, timing.margin) {
        Ok(w) => w,
        Err(e) => {
            let opts = ReleaseOptions::default();
            release(
                redis,
                Some(masters),
                &held,
                held.sent_at + timing.ttl,
                &opts,
                log,
            );
            return Err(anyhow::Error::from(e).context("cannot map the page shared with the guard"));
        }
    };
    let mut watchdog = Watchdog::new(masters, held.clone(), timing, watch, log.clone());
    let limits = Limits {
        grace: timing.grace,
        max_runtime: cli.max_runtime(),
    };
    let (exit, ending) = run_child(job, &held, redis, &mut watchdog, limits, log, report);
    // From here on, the end of the run is bounded by --connect-timeout in all.
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
        record: Some(record::run_record(&held, ending, exit, duration).to_string()),
        history: cli.history_kept()?,
        record_ttl: cli.history_ttl.map(|t| t.0),
    };
    let lost_until = if lost { Instant::now() } else { valid_until };
    release(redis, masters, &held, lost_until, &opts, log);
    Ok(exit)
}

/// Spawn and supervise the command; the lock is held throughout.
fn run_child(
    job: &Job,
    held: &Held,
    redis: &[Redis],
    watchdog: &mut Watchdog,
    limits: Limits,
    log: &Log,
    report: &mut Report,
) -> (Exit, Ending) {
    let watch = watchdog.watch.clone();
    if let Some(sig) = signals::pending_forwarded() {
        log.info(
            "signal",
            &format!(
                "received {} before starting; not running the command",
                signals::name(sig)
            ),
            &[("signal", sig.into())],
        );
        return (Exit::Signal(sig), Ending::NotStarted);
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
        (Exit::LockLost, Ending::NotStarted)
    };
    // The command starts only with the whole grace period still ahead of the lock's deadline.
    match watch.state() {
        LockState::Valid { until }
            if until.checked_sub(limits.grace + watch.margin) > Some(Instant::now()) => {}
        _ => return too_late(),
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
    let mut capture = match report.capture.then(capture::Capture::start).transpose() {
        Ok(c) => c,
        Err(e) => {
            let text = crate::log::io_text(&e);
            log.error(
                "spawn_failed",
                &format!("cannot capture the output for --ping-body: {text}"),
            );
            return (Exit::Failure, Ending::NotStarted);
        }
    };
    let stdio = capture.as_ref().and_then(capture::Capture::fds);
    let child = match child::spawn(&job.argv, &env, watch.shared(), cgroup, stdio) {
        Ok(c) => c,
        Err(e) if e.too_late => return too_late(),
        Err(e) => {
            let text = crate::log::io_text(&e.error);
            log.error(
                "spawn_failed",
                &format!("cannot run '{}': {text}", e.program),
            );
            return (e.exit(), Ending::NotStarted);
        }
    };
    RUNNING_GROUP.store(child.group, Ordering::SeqCst);
    if let Some(c) = capture.as_mut() {
        c.started();
    }
    if let Some(p) = report.pinger.as_mut() {
        p.started();
    }
    let no_cgroup = no_cgroup.or_else(|| {
        let errno = watch.shared().cgroup_error()?;
        let dir = planned.as_deref()?.display();
        let text = crate::log::io_text(&std::io::Error::from_raw_os_error(errno));
        Some(format!("cannot make {dir}: {text}"))
    });
    let (mechanism, how) = match (child.cgroup(), no_cgroup) {
        (Some(cg), _) => (
            "cgroup",
            format!(
                "its own cgroup {} (ended with cgroup.kill)",
                cg.dir.display()
            ),
        ),
        (None, why) => (
            "process-group",
            format!(
                "its own process group under a subreaper guard ({})",
                why.unwrap_or_else(|| "the command could not join the cgroup".into())
            ),
        ),
    };
    log.info(
        "containment",
        &format!("the command runs in {how}"),
        &[("mechanism", mechanism.into())],
    );
    #[cfg(debug_assertions)]
    if std::env::var_os("CRONLOCK_DEBUG_PANIC").is_some_and(|v| v == "main") {
        panic!("injected by CRONLOCK_DEBUG_PANIC");
    }
    let started = Instant::now();
    // Told at once when the lock key changes, once the command has run a little.
    let plan = tracking::Plan {
        masters: redis.to_vec(),
        key: held.keys.lock.clone(),
        value: held.holder.value.clone(),
        log: log.clone(),
    };
    watchdog.track(plan, started);
    let ended = child::supervise(child, watchdog, limits, log);
    RUNNING_GROUP.store(0, Ordering::SeqCst);
    report.body = capture.map(|c| c.finish(Duration::from_secs(1)));
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
/// matters now. Bounded by `--connect-timeout` in all; a failed call is retried once on a new
/// connection, but only while the lock can still be alive in Redis (before `valid_until`).
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
