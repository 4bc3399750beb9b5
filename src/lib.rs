//! cronlock: run a command under a cluster-wide lock held in Redis.
//!
//! `run()` is the whole program: parse the command line, take the lock, run the command under the
//! watchdog, release, and turn what happened into the documented exit status.

pub mod child;
pub mod cli;
pub mod connect;
pub mod duration;
pub mod exit;
pub mod guard;
pub mod host;
pub mod lock;
pub mod log;
pub mod signals;
pub mod wait;
pub mod watchdog;

use std::ffi::OsString;
use std::process::ExitCode;

use anyhow::Result;
use clap::error::ErrorKind;

use crate::child::{Limits, Stop};
use crate::cli::{Cli, Job};
use crate::connect::Redis;
use crate::exit::Exit;
use crate::lock::{Held, Keys, Released};
use crate::log::{Level, Log};
use crate::wait::Acquired;
use crate::watchdog::{Timing, Watchdog};

/// The program: returns the exit status; never exits while the lock is held.
pub fn run() -> ExitCode {
    // Before any thread exists, so every thread inherits the mask (see `signals`).
    signals::block();
    let cli = match cli::parse() {
        Ok(cli) => cli,
        Err(e) => {
            return match e.kind() {
                ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
                    let _ = e.print();
                    Exit::Success.into()
                }
                _ => {
                    eprintln!("cronlock: {}", cli::one_line(&e));
                    Exit::Failure.into()
                }
            }
        }
    };
    let log = Log::new(cli.quiet, cli.verbose, false);
    match execute(&cli, &log) {
        Ok(exit) => exit.into(),
        Err(e) => {
            log.error("error", &format!("{e:#}"));
            Exit::Failure.into()
        }
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

fn execute(cli: &Cli, log: &Log) -> Result<Exit> {
    let job = cli.job()?;
    let timing = Timing::new(cli.ttl.0, cli.grace.map(|g| g.0))?;
    let redis = Redis::new(&cli.redis_url(), cli.connect_timeout.0)?;
    if let Some(p) = redis.password() {
        log.add_secret(&p);
    }
    log.set_key(&job.key);
    let keys = Keys::new(&cli.prefix, &job.key);
    let mut con = redis.connect(cli.connect_timeout.0)?;
    let command = command_line(&job.argv);
    let held = match wait::acquire(&mut con, &keys, &command, timing.ttl, cli.wait(), log)? {
        Acquired::Held(held) => *held,
        Acquired::Busy => {
            log.info(
                "busy",
                &format!(
                    "lock '{}' is held elsewhere; not running the command",
                    job.key
                ),
                &[],
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
                &[],
            );
            return Ok(Exit::Signal(sig));
        }
    };
    log.set_lock(&held.holder.token, held.fence);
    log.info(
        "acquired",
        &format!("acquired lock '{}' (fencing token {})", job.key, held.fence),
        &[],
    );
    let watchdog = match Watchdog::start(redis.clone(), con, held.clone(), timing, log.clone()) {
        Ok(w) => w,
        Err(e) => {
            release(&redis, None, &held, false, log);
            return Err(e.context("cannot start the watchdog thread"));
        }
    };
    let limits = Limits {
        grace: timing.grace,
        max_runtime: cli.max_runtime.map(|m| m.0),
    };
    let exit = run_child(&job, &held, &watchdog.watch, limits, log);
    let lost = watchdog.watch.is_lost();
    let con = watchdog.stop();
    release(&redis, con, &held, lost, log);
    Ok(exit)
}

/// Spawn and supervise the command; the lock is held throughout.
fn run_child(job: &Job, held: &Held, watch: &watchdog::Watch, limits: Limits, log: &Log) -> Exit {
    if let Some(sig) = signals::pending_forwarded() {
        log.info(
            "signal",
            &format!(
                "received {} before starting; not running the command",
                signals::name(sig)
            ),
            &[],
        );
        return Exit::Signal(sig);
    }
    let env = [
        ("CRONLOCK_KEY", job.key.clone()),
        ("CRONLOCK_TOKEN", held.holder.token.clone()),
        ("CRONLOCK_FENCING_TOKEN", held.fence.to_string()),
    ];
    let child = match child::spawn(&job.argv, &env) {
        Ok(c) => c,
        Err(e) => {
            let text = e.error.to_string();
            let text = text
                .split(" (os error")
                .next()
                .unwrap_or(&text)
                .to_lowercase();
            log.error(
                "spawn_failed",
                &format!("cannot run '{}': {text}", e.program),
            );
            return e.exit();
        }
    };
    let ended = child::supervise(&child, watch, limits, log);
    let exit = ended.exit();
    let how = match (&ended.stopped, ended.status) {
        (Some(Stop::LockLost(_)), _) => "terminated: lock lost".to_string(),
        (Some(Stop::MaxRuntime), _) => "terminated: max runtime".to_string(),
        (None, Exit::Signal(n)) => format!("killed by {}", signals::name(n)),
        (None, e) => format!("exited with status {}", e.code()),
    };
    log.info(
        "finished",
        &format!("command {how}"),
        &[("exit_status", exit.code().into())],
    );
    exit
}

/// Release our lock; problems are warnings, since the command's status is what matters now.
fn release(redis: &Redis, con: Option<redis::Connection>, held: &Held, lost: bool, log: &Log) {
    let result = match con {
        Some(c) => Ok(c),
        None => redis.connect(redis.connect_timeout),
    }
    .and_then(|mut c| lock::release(&mut c, held));
    match result {
        Ok(Released::Deleted) => log.info(
            "released",
            &format!("released lock '{}'", held.keys.name),
            &[],
        ),
        Ok(Released::NotOurs) if lost => {}
        Ok(Released::NotOurs) => log.warn(
            "release_not_ours",
            &format!(
                "lock '{}' was no longer ours at release (it expired or was taken over); left it alone",
                held.keys.name
            ),
        ),
        Err(e) => log.event(
            Level::Warn,
            "release_failed",
            &format!("{e:#}; it will expire within {}", duration::Span(held.ttl)),
            &[],
        ),
    }
}
