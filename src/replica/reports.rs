//! What a run's reports and its end mean to the replica: the start and end lines (from the
//! typed reports on each run's channel, never from its output), a release to carry out, and
//! what follows a run that ended without reporting its end (its lock given back when no command
//! can be left, else left to lapse).

use std::time::Duration;

use crate::clock::{redis_millis, rfc3339};
use crate::handover::{ReplicaSide, RunEnd, RunReport};
use crate::log::Log;
use crate::record::run::CommandEnd;
use crate::record::run::Ending;
use crate::store::lock::ReleaseOptions;

use super::runs::Spawned;

/// What the loop does after a run's report.
pub enum Followup {
    Nothing,
    /// Renew the run's lock on the claims thread's link (with the others asked together), and
    /// say `renewed` on its channel.
    Renew,
    /// Release the run's lock on the claims thread's link, recording this, and answer on `reply`.
    Release {
        opts: Box<ReleaseOptions>,
        reply: ReplicaSide,
    },
    /// The run ended; `failed`: its command did not succeed (a `--retries` job looks again).
    Ended {
        failed: bool,
    },
}

/// Note what `run` reported (`None`: its channel closed), and say its start and end.
pub fn heard(run: &mut Spawned, report: Option<RunReport>, log: &Log) -> Followup {
    match report {
        None => run.closed = true,
        Some(RunReport::Started { pid: group }) => {
            run.started = true;
            said_started(run, group, log);
        }
        // One at a time, and never once it asked for its release (a renewal after it would keep
        // a lock released for --min-hold a whole TTL).
        Some(RunReport::Renew) => {
            if !run.renewing && run.reply.is_some() {
                run.renewing = true;
                return Followup::Renew;
            }
        }
        // At most once: a second ask goes unanswered, and the run releases by itself.
        Some(RunReport::Release(end)) => {
            if let Some(reply) = run.reply.take() {
                let opts = Box::new(release_options(run, &end));
                return Followup::Release { opts, reply };
            }
        }
        Some(RunReport::Ended(end)) => {
            run.ended = true;
            said_ended(run, &end, log);
            return Followup::Ended {
                failed: end.status != 0,
            };
        }
    }
    Followup::Nothing
}

/// What the release of `run` records, its command having ended so: the replica, which claimed
/// the lock, makes the run record, with the last lines of its command's output as the replica
/// relayed them (`--keep-output`: the run waited until they were read).
fn release_options(run: &Spawned, end: &CommandEnd) -> ReleaseOptions {
    let kept = || run.kept.lock().unwrap_or_else(|e| e.into_inner()).lines();
    run.config.release_options(&run.held, end, kept)
}

/// What follows a run that is over without having reported its end.
pub struct Unreported {
    /// Its lock is given back (no command can be left): the instant runs elsewhere at once.
    pub release: bool,
    /// It failed as cronlock itself before starting its command: this replica cannot start runs.
    pub sick: Option<String>,
    /// With `--retries`, when to look at its job again: once its lock has lapsed.
    pub retry_at: Option<i64>,
}

/// Say how a run that never reported its end ended, and what follows.
pub fn unreported(run: &Spawned, log: &Log) -> Unreported {
    // A run that exited by itself without starting its command (it reports the start right
    // after the spawn) left no command behind: its claim is undone at once (the instant runs
    // elsewhere), and one that failed as cronlock itself (125: another version of the binary, a
    // handover it refused) makes this replica sick. After a start, or a death by a signal, the
    // guard may have been killed with it and the command's children live on: the lock is left
    // to lapse, and the next claim of the job records the attempt abandoned, as when the
    // replica dies.
    let code = run.exited.and_then(|s| s.code());
    let release = !run.started && code.is_some();
    if !run.stopped {
        let status = run.exited.map(|s| s.to_string()).unwrap_or_default();
        let then = if release {
            "its lock is released"
        } else {
            "its lock is left to lapse"
        };
        log.warn(
            "run_died",
            &format!(
                "{}: its run ended ({status}) without reporting an end; {then}",
                run.key
            ),
        );
    }
    let failed_as_us = !run.started && code == Some(i32::from(crate::exit::FAILURE));
    Unreported {
        release,
        sick: (failed_as_us && !run.stopped).then(|| {
            format!(
                "its runs fail before starting their command (exit {})",
                crate::exit::FAILURE
            )
        }),
        retry_at: (!release).then(|| redis_millis() + run.ttl.as_millis() as i64 + 250),
    }
}

/// "KEY: started for the INSTANT instant, attempt N (fencing token F)".
fn said_started(run: &Spawned, group: u32, log: &Log) {
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
fn said_ended(run: &Spawned, end: &RunEnd, log: &Log) {
    let RunEnd {
        status,
        ending,
        duration: took,
    } = *end;
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
