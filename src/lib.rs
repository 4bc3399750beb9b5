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
pub mod lease;
pub mod log;
pub mod run;
pub mod signals;
pub mod store;
pub mod watchdog;

use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::Result;
use clap::error::ErrorKind;

use crate::cli::{Cli, LogFormat, Mode};
use crate::exit::Exit;
use crate::fleet::report::Report;
use crate::fleet::{admin, check, status};
use crate::lease::Timing;
use crate::log::Log;
use crate::store::keys::Keys;
use crate::store::quorum::Masters;
use crate::store::topology::Redis;

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
            let group = run::RUNNING_GROUP.swap(0, Ordering::SeqCst);
            let msg = crate::log::panic_message(&*payload);
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

/// Do what the parsed command line says: one run, or one of the admin modes.
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
    let redis = servers(cli)?;
    match (mode, timing) {
        (Mode::Run(job), Some(timing)) => {
            let mut report = Report::new(cli, log)?;
            let attempted = host::unix_millis();
            let result = run::run_job(cli, &job, timing, &redis, log, &mut report);
            report.tell(&job.key, attempted, &result, log);
            result
        }
        (mode, _) => admin_mode(cli, mode, &redis, log),
    }
}

/// The Redis URL(s) of the command line, each resolved to one topology.
fn servers(cli: &Cli) -> Result<Vec<Redis>> {
    let (urls, source) = cli.redis_urls()?;
    let tls = cli.tls()?;
    let redis = urls
        .iter()
        .map(|url| Redis::new(url, source, cli.connect_timeout.0, &tls, cli.min_replicas))
        .collect::<Result<Vec<Redis>>>()?;
    if cli.limit > 1 && redis.len() > 1 {
        anyhow::bail!(
            "--limit {} needs one Redis (plain, Sentinel or Cluster): with several independent \
             masters the holders of a KEY could not be counted safely",
            cli.limit
        );
    }
    Ok(redis)
}

/// `--status`, `--check`, `--list` and `--force-release`.
fn admin_mode(cli: &Cli, mode: Mode, redis: &[Redis], log: &Log) -> Result<Exit> {
    let io_timeout = cli.connect_timeout.0;
    let text = match mode {
        Mode::Run(_) => unreachable!("a run is not an admin mode"),
        Mode::Status(key) => {
            let history = cli
                .given
                .history_flag
                .then(|| cli.history.and_then(|c| c.0));
            let keys = Keys::new(&cli.prefix, &key);
            let schedule = cli.schedule.as_ref();
            let mut masters = Masters::new(redis);
            status::status(&mut masters, io_timeout, &keys, cli.json, history, schedule)?
        }
        Mode::Check(key) => {
            let verdict = check_key(cli, redis, &key);
            admin::print(&verdict.render(&key, cli.json))?;
            return Ok(Exit::Check(verdict.state as u8));
        }
        Mode::List => admin::list(
            &mut Masters::new(redis),
            io_timeout,
            &cli.prefix,
            cli.json,
            log,
        )?,
        Mode::ForceRelease(key) => admin::force_release(
            &mut Masters::new(redis),
            io_timeout,
            &Keys::new(&cli.prefix, &key),
            cli.token.as_deref(),
            cli.json,
        )?,
    };
    admin::print(&text)?;
    Ok(Exit::Success)
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
