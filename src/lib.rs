//! cronlock: run a command under a cluster-wide lock held in Redis.
//!
//! `run()` is the whole program: parse the command line, take the lock, run the command under the
//! watchdog, release, and turn what happened into the documented exit status.

pub mod cli;
pub mod clock;
pub mod command;
pub mod config;
pub mod duration;
pub mod exit;
pub mod files;
pub mod fleet;
pub mod handover;
pub mod hooks;
pub mod host;
pub mod http;
pub mod lease;
pub mod log;
pub mod memory;
pub mod record;
pub mod replica;
pub mod run;
pub mod signals;
pub mod starting;
pub mod store;
pub mod watchdog;

use std::sync::atomic::Ordering;

use anyhow::Result;
use clap::error::ErrorKind;

use crate::cli::Cli;
use crate::config::{Admin, AdminMode, Request};
use crate::exit::Exit;
use crate::fleet::{admin, check, status, suspend, trigger};
use crate::log::LogFormat;
use crate::log::{Log, Verbosity};
use crate::store::inspect;
use crate::store::keys::Keys;
use crate::store::quorum::Masters;

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
            let log = Log::new(Verbosity::Normal, format_from_env());
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
            log.flush(crate::log::FLUSH_WAIT);
            exit
        }
    }
}

/// Parse the command line and do what it says (or, started as a replica's starter, serve it).
fn run_parsed() -> Exit {
    if started_as_starter() {
        return run::starter::serve();
    }
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
                    let log = Log::new(Verbosity::Normal, format_from_env());
                    log.error("usage", &cli::one_line(&e));
                    log.flush(crate::log::FLUSH_WAIT);
                    Exit::Failure
                }
            };
        }
    };
    let format = cli.log_format;
    let verbosity = match cli.verbosity() {
        Ok(v) => v,
        Err(e) if cli.mode == cli::Mode::Check => return unknown(&format!("{e:#}")),
        Err(e) => {
            let log = Log::new(Verbosity::Normal, format);
            log.error("usage", &format!("{e:#}"));
            log.flush(crate::log::FLUSH_WAIT);
            return Exit::Failure;
        }
    };
    // A replica (--crontab) is a service: its runs' starts and ends are its normal output.
    let verbosity = match verbosity {
        Verbosity::Normal if cli.crontab.is_some() => Verbosity::Verbose,
        v => v,
    };
    let log = Log::new(verbosity, format);
    let exit = match execute(&cli, &log) {
        Ok(exit) => exit,
        // Asked to end while reading a crontab: the signal's status, as for any stop.
        Err(e) if e.downcast_ref::<signals::Interrupted>().is_some() => {
            let sig = e.downcast_ref::<signals::Interrupted>().map_or(0, |i| i.0);
            log.info("signal", &format!("{e:#}"), &[("signal", sig.into())]);
            Exit::Signal(sig)
        }
        Err(e) if cli.mode == cli::Mode::Check => unknown(&format!("{e:#}")),
        Err(e) => {
            log.error("error", &format!("{e:#}"));
            Exit::Failure
        }
    };
    log.flush(crate::log::FLUSH_WAIT);
    exit
}

/// The log format the environment asks for, when the command line could not be read.
fn format_from_env() -> LogFormat {
    match std::env::var("CRONLOCK_LOG_FORMAT").as_deref() {
        Ok("json") => LogFormat::Json,
        _ => LogFormat::Text,
    }
}

/// Whether the command line asks for `--check` (when it could not be parsed).
fn checking_args() -> bool {
    std::env::args_os().any(|a| a == "--check")
}

/// `--check` could not judge: the plugin's UNKNOWN line, never status 125.
fn unknown(message: &str) -> Exit {
    let text = message.strip_prefix("cronlock: ").unwrap_or(message);
    let verdict = check::CheckVerdict::unknown(text.to_string());
    let _ = admin::print(&verdict.render("", false));
    Exit::Check(check::CheckState::Unknown as u8)
}

/// Do what the parsed command line says: one run, one of the admin modes, or a replica.
fn execute(cli: &Cli, log: &Log) -> Result<Exit> {
    match cli::request::request(cli)? {
        Request::Run(config) => run::run_reported(&config, log, None),
        Request::Admin(admin) => admin_mode(&admin, log),
        Request::Crontab(replica) => {
            let file = replica.file.clone();
            let json = cli.log_format == LogFormat::Json;
            replica::serve(&replica, &|| cli::crontab::load_answering(&file), json, log)
        }
        Request::TestCrontab(replica) => {
            let file = &replica.file;
            let mut out = fleet::next::crontab_checked(file, replica.jobs.len());
            for job in &replica.jobs {
                out += &fleet::next::crontab_job(file, job.line, &job.key, &job.schedule);
            }
            admin::print(&out)?;
            Ok(Exit::Success)
        }
        Request::Next(query) => {
            admin::print(&fleet::next::render(&query))?;
            Ok(Exit::Success)
        }
    }
}

/// Whether cronlock was started as a replica's starter (its `argv[0]`).
fn started_as_starter() -> bool {
    std::env::args_os()
        .next()
        .is_some_and(|a| a == starting::STARTER_ARG0)
}

/// `--status`, `--check`, `--list`, `--force-release`, `--suspend` and `--resume`.
fn admin_mode(admin: &Admin, log: &Log) -> Result<Exit> {
    let mut masters = Masters::new(&admin.servers);
    let (timeout, json) = (admin.timeout, admin.json);
    let text = match &admin.mode {
        AdminMode::Status {
            key,
            history,
            schedule,
            offset,
        } => {
            let keys = Keys::new(&admin.prefix, key);
            let planned = status::Planned {
                schedule: schedule.as_ref(),
                offset: *offset,
            };
            status::status(
                &mut masters,
                timeout,
                &keys,
                &admin.prefix,
                json,
                *history,
                planned,
            )?
        }
        AdminMode::Check { key, .. } => {
            let verdict = check_key(admin, &mut masters);
            admin::print(&verdict.render(key, json))?;
            return Ok(Exit::Check(verdict.state as u8));
        }
        AdminMode::List => admin::list(&mut masters, timeout, &admin.prefix, json, log)?,
        AdminMode::ForceRelease { key, token } => admin::force_release(
            &mut masters,
            timeout,
            &Keys::new(&admin.prefix, key),
            token.as_deref(),
            json,
        )?,
        AdminMode::Suspend {
            key,
            reason,
            lasting,
        } => suspend::suspend(
            &mut masters,
            timeout,
            &Keys::new(&admin.prefix, key),
            &suspend::SuspendAsked {
                reason: reason.as_deref(),
                lasting: *lasting,
            },
            json,
        )?,
        AdminMode::Trigger {
            key,
            reason,
            wait,
            conflict,
        } => {
            let asked = trigger::TriggerAsked {
                reason: reason.as_deref(),
                wait: *wait,
                conflict: *conflict,
            };
            return trigger_key(admin, key, &asked, log);
        }
        AdminMode::Resume { key } => {
            suspend::resume(&mut masters, timeout, &Keys::new(&admin.prefix, key), json)?
        }
    };
    admin::print(&text)?;
    Ok(Exit::Success)
}

/// `--trigger KEY`: its line on stdout, or why it was not carried out on stderr; the status
/// says which.
fn trigger_key(admin: &Admin, key: &str, asked: &trigger::TriggerAsked, log: &Log) -> Result<Exit> {
    let mut masters = Masters::new(&admin.servers);
    let keys = Keys::new(&admin.prefix, key);
    let done = trigger::trigger(&mut masters, admin.timeout, &admin.prefix, &keys, asked)?;
    if !done.out.is_empty() {
        admin::print(&done.out)?;
    }
    if let Some(said) = &done.said {
        log.error("trigger_not_done", said);
    }
    Ok(done.exit)
}

/// `--check KEY`: every failure is an UNKNOWN verdict, never an error.
fn check_key(admin: &Admin, masters: &mut Masters) -> check::CheckVerdict {
    let AdminMode::Check {
        key,
        max_age,
        schedule,
    } = &admin.mode
    else {
        unreachable!("only --check is judged");
    };
    let keys = Keys::new(&admin.prefix, key);
    let snaps = masters.snapshots(admin.timeout, &keys, None);
    let snap = inspect::merge(snaps, masters.majority()).map(|m| m.view);
    match snap {
        Ok(snap) => check::judge(
            key,
            &snap,
            *max_age,
            schedule.as_ref(),
            crate::clock::unix_millis(),
        ),
        Err(e) => check::CheckVerdict::unknown(format!("{e:#}")),
    }
}
