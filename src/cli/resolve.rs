//! The command line resolved into what it asks for ([`crate::config`]): every check done, every
//! secret file read and every URL resolved to a topology, before anything talks to Redis.
//!
//! It exists so that the rest of cronlock is handed one plain value (ripgrep's `LowArgs` →
//! `HiArgs`, uutils' `Config::from(&matches)`): nothing below `lib.rs` sees [`Cli`], and a run
//! described some other way (a crontab line) is started the same way.

use std::time::Duration;

use anyhow::{anyhow, bail, Result};

use crate::cli::{Cli, Mode, RedisUrls, RunTarget};
use crate::config::{Admin, AdminMode, NextQuery, Reports, Request, RunConfig};
use crate::fleet::schedule::Schedule;
use crate::lease::Timing;
use crate::store::overlap::Overlap;
use crate::store::topology::Redis;

/// A run or an admin mode (a replica's crontab is `crontab.rs`'s), checked in the order the
/// messages promise: the mode's arguments, then the run's timing and history, the servers, and
/// the reports.
/// `key` is the admin mode's KEY, checked ([`Cli::checked_mode`]).
pub fn resolve(cli: &Cli, key: Option<String>) -> Result<Request> {
    match (cli.mode, key) {
        (Mode::Run, _) => {
            let target = cli.target()?;
            run_config(cli, target).map(|c| Request::Run(Box::new(c)))
        }
        (mode, key) => admin(cli, mode, key).map(|a| Request::Admin(Box::new(a))),
    }
}

/// The run a command line (or a crontab line) describes.
pub(super) fn run_config(cli: &Cli, target: RunTarget) -> Result<RunConfig> {
    // Checked before anything else, so a bad value never runs the command.
    let history = cli.history_kept()?;
    let timing = Timing::new(cli.ttl.0, cli.grace.map(|g| g.0))?;
    let servers = servers(cli)?;
    if cli.catch_up.is_some() && servers.len() > 1 {
        bail!(
            "--catch-up needs one Redis (plain, Sentinel or Cluster): with several \
             independent masters each would keep its own ledger of instants, and a retry \
             could be judged due on some and not on others"
        );
    }
    let reports = reports(cli)?;
    let schedule = keyed(cli, &target.key)?;
    let jitter = jitter(cli, schedule.as_ref())?;
    if cli.overlap.waits() && cli.catch_up.is_some() {
        bail!(
            "--overlap queue cannot go with --catch-up: a catch-up window already runs a busy \
             instant later, once the lock is free"
        );
    }
    let Policy { overlap, limit } = overlap_and_limit(cli);
    Ok(RunConfig {
        key: target.key,
        argv: target.argv,
        prefix: cli.prefix.clone(),
        servers,
        connect_timeout: cli.connect_timeout.0,
        timing,
        wait: cli.wait(),
        limit,
        schedule,
        jitter,
        overlap,
        handover: None,
        catch_up: cli.catch_up.map(|c| c.0),
        retries: cli.retries.unwrap_or(0),
        conflict_exit_code: cli.conflict_exit_code,
        max_runtime: cli.max_runtime(),
        min_hold: cli.min_hold.0,
        history,
        history_ttl: cli.history_ttl.map(|t| t.0),
        keep_output: cli.keep_output.unwrap_or_default(),
        reports,
    })
}

/// `--next CRON`: the expression with `H` drawn for `--key` (or KEY), and `--from` read in its
/// time zone.
pub(super) fn next(cli: &Cli) -> Result<NextQuery> {
    let given = cli.next.as_ref().expect("--next");
    let key = cli.next_key.clone().or_else(|| cli.key.clone());
    let schedule = match (&given.resolved, &key) {
        (Some(_), None) => bail!(
            "--next '{}' has an H field, drawn from the job's KEY: give --key KEY",
            given.text
        ),
        (_, Some(key)) => given
            .for_key(&super::check_key(key)?)
            .map_err(|e| anyhow!("--next '{}': {e}", given.text))?,
        (None, None) => given.clone(),
    };
    let from_ms = cli
        .from
        .as_deref()
        .map(|text| from_time(text, schedule.zone()))
        .transpose()?;
    Ok(NextQuery {
        schedule,
        key,
        count: cli.count as usize,
        from_ms,
        json: cli.json,
    })
}

/// `--from TIME`: RFC 3339, else a date and time (or a date: its midnight) in `zone`.
fn from_time(text: &str, zone: &jiff::tz::TimeZone) -> Result<i64> {
    let text = text.trim();
    if let Ok(ts) = text.parse::<jiff::Timestamp>() {
        return Ok(ts.as_millisecond());
    }
    let civil = text.parse::<jiff::civil::DateTime>().or_else(|_| {
        text.parse::<jiff::civil::Date>()
            .map(|d| d.to_datetime(jiff::civil::Time::midnight()))
    });
    let Ok(civil) = civil else {
        bail!(
            "--from '{text}' is not a time: give 2026-03-29T00:00:00Z, 2026-03-29 01:30 or \
             2026-03-29 (in the schedule's time zone)"
        );
    };
    let zoned = zone
        .to_ambiguous_zoned(civil)
        .compatible()
        .map_err(|e| anyhow!("--from '{text}': {e}"))?;
    Ok(zoned.timestamp().as_millisecond())
}

/// `--overlap` and the `--limit` of each run's lock.
struct Policy {
    overlap: Overlap,
    limit: u32,
}

/// `--overlap`, with `--limit` folded into `allow`'s cap: under `allow` each instant holds a lock
/// of its own, so `--limit` counts the instants at once and each run holds a plain lock.
fn overlap_and_limit(cli: &Cli) -> Policy {
    match cli.overlap {
        Overlap::Allow { at_once } => {
            let at_once = if cli.limit > 1 { cli.limit } else { at_once };
            Policy {
                overlap: Overlap::Allow { at_once },
                limit: 1,
            }
        }
        overlap => Policy {
            overlap,
            limit: cli.limit,
        },
    }
}

/// `--jitter`, checked shorter than the schedule's shortest period among its next instants (a
/// run must start before its next instant).
fn jitter(cli: &Cli, schedule: Option<&Schedule>) -> Result<Duration> {
    let (Some(span), Some(schedule)) = (cli.jitter.map(|j| j.0), schedule) else {
        return Ok(Duration::ZERO);
    };
    let mut at = crate::clock::unix_millis() as i64;
    let mut shortest = i64::MAX;
    let mut prev = schedule.next_after(at);
    for _ in 0..16 {
        let Some(p) = prev else { break };
        at = p;
        prev = schedule.next_after(at);
        if let Some(n) = prev {
            shortest = shortest.min(n - p);
        }
    }
    if span.as_millis() as i64 >= shortest {
        bail!(
            "--jitter {} is not shorter than the schedule's period ({}): a run would start after \
             its next instant",
            crate::duration::Span(span),
            crate::duration::Span(Duration::from_millis(shortest.max(0) as u64))
        );
    }
    Ok(span)
}

/// `--schedule` with its `H` fields drawn for `key`.
fn keyed(cli: &Cli, key: &str) -> Result<Option<Schedule>> {
    cli.schedule
        .as_ref()
        .map(|s| s.for_key(key))
        .transpose()
        .map_err(|e| {
            anyhow!(
                "--schedule '{}': {e}",
                cli.schedule.as_ref().map_or("", |s| s.text.as_str())
            )
        })
}

/// An admin mode with what it needs; `key` is its KEY, checked (none for `--list`).
fn admin(cli: &Cli, mode: Mode, key: Option<String>) -> Result<Admin> {
    let key = || {
        key.clone()
            .ok_or_else(|| anyhow!("the admin mode needs a KEY"))
    };
    let mode = match mode {
        Mode::Run | Mode::Crontab | Mode::Next => bail!("not an admin mode"),
        Mode::Status => {
            let key = key()?;
            AdminMode::Status {
                history: cli
                    .given
                    .history_flag
                    .then(|| cli.history.and_then(|c| c.0)),
                schedule: keyed(cli, &key)?,
                offset: crate::fleet::spread::offset(
                    &key,
                    cli.jitter.map_or(Duration::ZERO, |j| j.0),
                ),
                key,
            }
        }
        Mode::Check => {
            let key = key()?;
            AdminMode::Check {
                max_age: cli.max_age.map(|m| m.0),
                schedule: keyed(cli, &key)?,
                key,
            }
        }
        Mode::List => AdminMode::List,
        Mode::ForceRelease => AdminMode::ForceRelease {
            key: key()?,
            token: cli.token.clone(),
        },
        Mode::Suspend => AdminMode::Suspend {
            key: key()?,
            reason: cli.reason.clone(),
            lasting: cli.suspend_for.map(|d| d.0),
        },
        Mode::Resume => AdminMode::Resume { key: key()? },
        Mode::Trigger => AdminMode::Trigger {
            key: key()?,
            reason: cli.reason.clone(),
            wait: (!cli.wait().is_zero()).then(|| cli.wait()),
            conflict: cli.conflict_exit_code,
        },
    };
    Ok(Admin {
        mode,
        prefix: cli.prefix.clone(),
        servers: servers(cli)?,
        timeout: cli.connect_timeout.0,
        json: cli.json,
    })
}

/// The Redis URL(s), each resolved to one topology.
fn servers(cli: &Cli) -> Result<Vec<Redis>> {
    let RedisUrls { urls, source } = cli.redis_urls()?;
    let tls = cli.tls()?;
    let redis = urls
        .iter()
        .map(|url| Redis::new(url, source, cli.connect_timeout.0, &tls, cli.min_replicas))
        .collect::<Result<Vec<Redis>>>()?;
    if cli.limit > 1 && redis.len() > 1 {
        bail!(
            "--limit {} needs one Redis (plain, Sentinel or Cluster): with several independent \
             masters the holders of a KEY could not be counted safely",
            cli.limit
        );
    }
    Ok(redis)
}

/// The reports; a `--metrics-dir` that is not a directory is an error before the lock is
/// taken, and so is an unreadable `--ping-url-file`.
fn reports(cli: &Cli) -> Result<Reports> {
    if let Some(dir) = cli.metrics_dir.as_deref().filter(|d| !d.is_dir()) {
        bail!(
            "--metrics-dir {} is not a directory (or CRONLOCK_METRICS_DIR)",
            dir.display()
        );
    }
    Ok(Reports {
        metrics_dir: cli.metrics_dir.clone(),
        ping_url: cli.ping()?,
        ping_body: cli.ping_body,
    })
}
