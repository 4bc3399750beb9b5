//! `--crontab FILE`: one replica of a fleet scheduler with no leader. Every replica reads the same
//! crontab and is equal: it sleeps until the next instant one of its jobs is due (nothing is
//! polled meanwhile), then fires that job's run, and the run's atomic acquire in Redis is the
//! claim: the first replica's run takes the instant, the others' runs skip it. A job with
//! `--catch-up` is also fired once at start, so a replica that starts late catches up.
//!
//! Each run is exactly the run `cronlock --schedule SCHEDULE [OPTIONS] KEY -c COMMAND-LINE` makes:
//! it *is* that run, a child process of cronlock itself (guard, watchdog, lost-lock stop,
//! fencing, history, metrics, pings, ledger), tied to the replica with `PR_SET_PDEATHSIG`, so a
//! replica that dies (SIGKILL, OOM) takes its runs with it and their instants become abandoned,
//! for `--retries` on another replica. At `--max-jobs` runs, a replica claims nothing.
//!
//! SIGTERM or SIGINT: claim nothing more; runs go on until they end or `--drain` runs out, then
//! get SIGTERM, and SIGKILL after `--grace`. A second SIGTERM or SIGINT stops them at once. The
//! exit status is 0 when every run ended on its own, 143 otherwise. SIGHUP, or a change of the
//! file, reads it again: a file with an error keeps the table that runs, in one line.

mod output;

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime};

use anyhow::{anyhow, Result};

use crate::clock::Instant;
use crate::config::{CronJob, Replica};
use crate::exit::Exit;
use crate::host::{rfc3339, unix_millis};
use crate::job::guard::tie_to_parent;
use crate::log::Log;
use crate::signals::{self, SigSet};

/// How often the file's modification time is looked at (a ConfigMap update, an edit).
const FILE_CHECK: Duration = Duration::from_secs(2);

/// A job of the table, and when it is next due (Unix ms).
struct Job {
    cron: CronJob,
    next: Option<i64>,
}

/// A run this replica supervises.
struct Run {
    key: String,
    child: Child,
    /// We signalled it (the drain ran out, or a second SIGTERM).
    stopped: bool,
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
    let mut table = Table::new(&replica.jobs, true);
    let (follow, follow_ups) = std::sync::mpsc::channel::<(String, i64)>();
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
    let mut runs: HashMap<u32, Run> = HashMap::new();
    let mut modified = mtime(&replica.file);
    let mut checked = Instant::now();
    // Set by the first SIGTERM/SIGINT: when the drain ends. Then when SIGKILL follows.
    let mut draining: Option<Instant> = None;
    let mut killing: Option<Instant> = None;
    let mut killed = false;
    let mut interrupted = false;
    let set = SigSet::of(&[
        libc::SIGTERM,
        libc::SIGINT,
        libc::SIGHUP,
        libc::SIGCHLD,
        signals::WAKEUP,
    ]);
    loop {
        reap(&mut runs, &mut interrupted, log);
        if draining.is_some() && runs.is_empty() {
            break;
        }
        let now = Instant::now();
        if draining.is_some_and(|end| now >= end) && killing.is_none() {
            stop(&mut runs, libc::SIGTERM, log);
            killing = Some(now + replica.grace);
        }
        if killing.is_some_and(|end| now >= end) && !killed {
            stop(&mut runs, libc::SIGKILL, log);
            killed = true;
        }
        for (key, at) in follow_ups.try_iter() {
            if let Some(job) = table.jobs.iter_mut().find(|j| j.cron.key == key) {
                job.next = Some(job.next.map_or(at, |n| n.min(at)));
            }
        }
        if draining.is_none() {
            table.fire(&exe, replica.max_jobs, &mut runs, (json, &follow), log);
        }
        // Sleep until the next instant (none while draining), the drain's end, the grace's end,
        // a run's exit (SIGCHLD) or the next look at the file.
        let mut wake = checked + FILE_CHECK;
        match (draining, killing) {
            (None, _) => {
                if let Some(ms) = table.next_due() {
                    let left = (ms - unix_millis() as i64).max(0) as u64;
                    wake = wake.min(now + Duration::from_millis(left));
                }
            }
            (Some(end), None) => wake = wake.min(end),
            (Some(_), Some(end)) if !killed => wake = wake.min(end),
            _ => {}
        }
        match signals::wait(&set, wake.saturating_duration_since(Instant::now())) {
            Some(libc::SIGTERM | libc::SIGINT) if draining.is_none() => {
                log.info(
                    "draining",
                    &format!(
                        "stopping: claiming nothing more; {} running jobs may go on for {}",
                        runs.len(),
                        crate::duration::Span(replica.drain)
                    ),
                    &[("running", runs.len().into())],
                );
                draining = Some(Instant::now() + replica.drain);
            }
            Some(libc::SIGTERM | libc::SIGINT) => {
                // A second one: stop them now.
                draining = Some(Instant::now());
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
    log.info(
        "replica_stopped",
        if interrupted {
            "stopped; some runs had to be stopped"
        } else {
            "stopped; every run ended on its own"
        },
        &[],
    );
    Ok(if interrupted {
        Exit::Signal(libc::SIGTERM)
    } else {
        Exit::Success
    })
}

/// The jobs and when each is next due.
struct Table {
    jobs: Vec<Job>,
}

impl Table {
    /// `first`: jobs with `--catch-up` are due at once (a replica that starts late catches up).
    fn new(jobs: &[CronJob], first: bool) -> Table {
        let now = unix_millis() as i64;
        Table {
            jobs: jobs
                .iter()
                .map(|c| Job {
                    next: if first && c.catch_up {
                        Some(now)
                    } else {
                        c.schedule.next_after(now)
                    },
                    cron: c.clone(),
                })
                .collect(),
        }
    }

    fn next_due(&self) -> Option<i64> {
        self.jobs.iter().filter_map(|j| j.next).min()
    }

    /// Fire every job that is due, as long as fewer than `max` runs are going on.
    fn fire(
        &mut self,
        exe: &std::path::Path,
        max: u32,
        runs: &mut HashMap<u32, Run>,
        (json, follow): (bool, &output::FollowUp),
        log: &Log,
    ) {
        let now = unix_millis() as i64;
        for job in &mut self.jobs {
            let Some(due) = job.next.filter(|d| *d <= now) else {
                continue;
            };
            job.next = job.cron.schedule.next_after(due.max(now));
            if runs.len() >= max as usize {
                log.warn(
                    "at_max_jobs",
                    &format!(
                        "{}: not claiming the {} instant: {} runs are going on (--max-jobs {max}); \
                         another replica may run it",
                        job.cron.key,
                        rfc3339(due as u64),
                        runs.len()
                    ),
                );
                continue;
            }
            let follow = (job.cron.retries > 0).then(|| follow.clone());
            match spawn(exe, &job.cron, due, (json, follow), log) {
                Ok(run) => {
                    runs.insert(run.child.id(), run);
                }
                Err(e) => log.error(
                    "spawn_failed",
                    &format!("{}: cannot start its run: {e:#}", job.cron.key),
                ),
            }
        }
    }

    /// Read the file again: added jobs start, removed ones are no longer fired (their runs go
    /// on); a file with an error keeps this table.
    fn reload(&mut self, reload: &dyn Fn() -> Result<Vec<CronJob>>, log: &Log) {
        match reload() {
            Ok(jobs) => {
                let mut next = Table::new(&jobs, false);
                // A job that stays keeps its next instant (a reload does not fire it again).
                for job in &mut next.jobs {
                    if let Some(old) = self.jobs.iter().find(|o| o.cron.key == job.cron.key) {
                        if old.cron.args == job.cron.args {
                            job.next = old.next;
                        }
                    }
                }
                log.info(
                    "reloaded",
                    &format!("read the crontab again: {} jobs", next.jobs.len()),
                    &[("jobs", next.jobs.len().into())],
                );
                *self = next;
            }
            Err(e) => log.error(
                "reload_failed",
                &format!(
                    "{e:#}; still serving the {} jobs read before",
                    self.jobs.len()
                ),
            ),
        }
    }
}

/// Start one run of `job`: cronlock itself, tied to us, its output relayed line by line.
fn spawn(
    exe: &std::path::Path,
    job: &CronJob,
    due: i64,
    (json, follow): (bool, Option<output::FollowUp>),
    log: &Log,
) -> Result<Run> {
    let mut cmd = Command::new(exe);
    cmd.args(&job.args)
        .envs(job.env.iter().map(|(k, v)| (k, v)))
        // The replica's own settings are not the run's.
        .env_remove("CRONLOCK_CRONTAB")
        .env_remove("CRONLOCK_MAX_JOBS")
        .env_remove("CRONLOCK_DRAIN")
        // Its cronlock lines as JSON events, for the replica to report (a line's own
        // --log-format wins, and its lines are then relayed as output).
        .env("CRONLOCK_LOG_FORMAT", "json")
        // The instant it fires for: the run is for that one, however late it starts.
        .env("CRONLOCK_FIRED_FOR", due.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    tie_to_parent(&mut cmd);
    let mut child = cmd.spawn().map_err(|e| anyhow!(crate::log::io_text(&e)))?;
    let pid = child.id();
    let streams = [
        child.stdout.take().map(|s| {
            (
                Box::new(s) as Box<dyn std::io::Read + Send>,
                output::Stream::Stdout,
            )
        }),
        child.stderr.take().map(|s| {
            (
                Box::new(s) as Box<dyn std::io::Read + Send>,
                output::Stream::Stderr,
            )
        }),
    ];
    for (from, stream) in streams.into_iter().flatten() {
        let key = job.key.clone();
        let log = log.clone();
        let follow = follow.clone();
        std::thread::Builder::new()
            .name("output".into())
            .spawn(move || output::relay(from, stream, (&key, pid), json, &log, follow.as_ref()))
            .map_err(|e| anyhow!(crate::log::io_text(&e)))?;
    }
    Ok(Run {
        key: job.key.clone(),
        child,
        stopped: false,
    })
}

/// Collect the runs that ended.
fn reap(runs: &mut HashMap<u32, Run>, interrupted: &mut bool, log: &Log) {
    runs.retain(|_, run| match run.child.try_wait() {
        Ok(None) => true,
        Ok(Some(status)) => {
            if run.stopped {
                *interrupted = true;
                log.warn(
                    "run_stopped",
                    &format!("{}: its run was stopped ({status})", run.key),
                );
            }
            false
        }
        Err(_) => false,
    });
}

/// Send `sig` to every run's cronlock (which passes SIGTERM on to its command; SIGKILL leaves
/// the command to the run's guard).
fn stop(runs: &mut HashMap<u32, Run>, sig: libc::c_int, log: &Log) {
    for (pid, run) in runs.iter_mut() {
        if !run.stopped {
            log.warn(
                "stopping_run",
                &format!(
                    "{}: stopping its run ({}): the drain is over",
                    run.key,
                    signals::name(sig)
                ),
            );
        }
        run.stopped = true;
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(*pid as i32),
            nix::sys::signal::Signal::try_from(sig).ok(),
        );
    }
}

/// The file's modification time (a ConfigMap's symlink swap changes it too).
fn mtime(path: &std::path::Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}
