//! `--crontab FILE`: one replica of a fleet scheduler with no leader. Every replica reads the same
//! crontab and is equal: it sleeps until the next instant one of its jobs is due (nothing is
//! polled meanwhile), then claims that instant itself in Redis, with the atomic acquire a run
//! makes (`claim.rs`, on a thread of its own, so a hung Redis never stops this loop). Only a claim
//! it won starts a process: the run `cronlock --schedule SCHEDULE [OPTIONS] KEY -c COMMAND-LINE`
//! makes, handed the won lock on a channel of its own (`runs.rs`, [`crate::handover`]),
//! with its guard, watchdog, lost-lock stop, fencing, history, metrics, pings and ledger. The run
//! reports on that channel when its command started and how it ended: the job's output and
//! verbosity never change what the replica knows.
//!
//! Each room owns its state: the runs (`runs.rs`), the claims thread and its answers
//! (`claimer.rs`), whether runs can start (`health.rs`), the heartbeats (`beat.rs`), the instants
//! (`table.rs`) and what the page shows (`watched.rs`); what a run's report or a claim's answer
//! means is `reports.rs` and `answers.rs`. `replicant.rs` holds them and routes what one learned
//! to the others; this file is the loop, its signals and the file's reloads.
//!
//! `--max-jobs` counts the runs this replica won and its claims in flight; an instant that comes
//! due while it is full waits for room (`table.rs`) and is given up only when it can no longer
//! start. Runs are forked by the replica's starter (`starter.rs`, `run/starter.rs`), which dies
//! with the replica (`PR_SET_PDEATHSIG`); each run follows the replica through its channel, not
//! the starter: a replica that dies (SIGKILL, OOM) closes every channel, and each run stops its
//! command, gives its lock back and records the attempt `interrupted`, for `--retries`
//! elsewhere; a starter that dies alone (or is replaced after a start it did not answer) leaves
//! the runs it forked going.
//!
//! An instant is owned by one replica by preference only: any replica with room claims it when
//! it is still undecided shortly after it is due (`table.rs`). A claim that does not become a
//! run is undone, so the instant runs elsewhere at once; a replica that cannot start runs stops
//! claiming until a probe shows it can (`health.rs`).
//!
//! SIGTERM or SIGINT: claim nothing more; runs go on until they end or `--drain` runs out, then
//! get SIGTERM, and SIGKILL after `--grace`. A second SIGTERM or SIGINT stops them at once. Before
//! it exits, the replica waits (bounded) until its leave, its releases and its records have
//! reached Redis. The exit status is 0 when every run ended on its own, 143 otherwise, and 125
//! when its leave could not be confirmed. SIGHUP, or a change of the
//! file, reads it again: a file with an error keeps the table that runs, in one line.

mod agenda;
mod answers;
mod beat;
mod claim;
mod claimer;
mod entry;
mod fleets;
mod health;
mod manual;
mod output;
mod owed;
mod rank;
mod relay;
mod replicant;
mod reports;
mod runs;
mod skew;
mod starter;
mod table;
mod watched;
mod watches;

use std::time::{Duration, SystemTime};

use anyhow::Result;

use crate::clock::Instant;
use crate::config::{CronJob, Replica};
use crate::exit::Exit;
use crate::log::Log;
use crate::signals::{self, SigSet};
use beat::period;
use replicant::{Phase, Replicant};
use table::Table;

/// How often the file's modification time is looked at (a ConfigMap update, an edit).
const FILE_CHECK: Duration = Duration::from_secs(2);

/// How often the replica removes the cgroups its runs left when killed with their guards
/// (`command::cgroup::sweep_own`; its runs do not sweep themselves).
const SWEEP_EVERY: Duration = Duration::from_secs(30);

/// Serve the crontab until SIGTERM or SIGINT, and every run has ended.
pub fn serve(
    replica: &Replica,
    reload: &dyn Fn() -> Result<Vec<CronJob>>,
    json: bool,
    log: &Log,
) -> Result<Exit> {
    let me = format!(
        "{}/{}",
        crate::host::hostname(),
        uuid::Uuid::new_v4().simple()
    );
    let mut table = Table::new(&replica.jobs, true, &me);
    let mut r = Replicant::new(replica, me, json, log, period(1, table.shortest_ttl()))?;
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
    // What reading the crontab freed goes back to the system: an idle replica's memory.
    crate::memory::give_back();
    let mut phase = Phase::Serving;
    let mut file = FileSeen {
        modified: mtime(&replica.file),
        checked: Instant::now(),
        swept: None,
    };
    let set = SigSet::of(&[
        libc::SIGTERM,
        libc::SIGINT,
        libc::SIGHUP,
        libc::SIGCHLD,
        signals::WAKEUP,
    ]);
    loop {
        r.take_news(&mut table, phase);
        let now = Instant::now();
        if r.is_done(phase, now) {
            break;
        }
        phase = r.advance_phase(phase, now);
        if phase == Phase::Serving {
            table.advance(log);
            r.serve_due(&mut table);
        }
        let wake = r.wake(&table, phase, file.checked + FILE_CHECK);
        let got = signals::wait(&set, wake.saturating_duration_since(Instant::now()));
        let got = reread(got, replica, reload, &mut file, &mut table, log);
        if let Some(libc::SIGTERM | libc::SIGINT) = got {
            phase = r.asked_to_stop(&mut table, phase);
        }
    }
    let left = r.leave(&table);
    let said = if r.interrupted() {
        "stopped; some runs had to be stopped"
    } else {
        "stopped; every run ended on its own"
    };
    log.info("replica_stopped", said, &[]);
    Ok(if !left {
        Exit::Failure
    } else if r.interrupted() {
        Exit::Signal(libc::SIGTERM)
    } else {
        Exit::Success
    })
}
/// After a wait: read the file again on SIGHUP, or when it changed (its modification time is
/// looked at every [`FILE_CHECK`]). A reload answers SIGTERM and SIGINT while it reads: the
/// signal it was stopped by, or the one the wait got, is returned.
fn reread(
    got: Option<libc::c_int>,
    replica: &Replica,
    reload: &dyn Fn() -> Result<Vec<CronJob>>,
    file: &mut FileSeen,
    table: &mut Table,
    log: &Log,
) -> Option<libc::c_int> {
    let mut got = got;
    if got == Some(libc::SIGHUP) {
        got = table.reload(reload, log);
        file.modified = mtime(&replica.file);
        crate::memory::give_back();
    }
    if file.swept.is_none_or(|at| at.elapsed() >= SWEEP_EVERY) {
        file.swept = Some(Instant::now());
        // On a thread of its own: removing many cgroups can take a while, and the loop must not
        // wait (a sweep that cannot start waits for the next).
        let _ = std::thread::Builder::new()
            .name("sweep".into())
            .stack_size(128 * 1024)
            .spawn(crate::command::cgroup::sweep_own);
    }
    if file.checked.elapsed() >= FILE_CHECK {
        file.checked = Instant::now();
        let now_modified = mtime(&replica.file);
        if now_modified != file.modified {
            file.modified = now_modified;
            got = got.or(table.reload(reload, log));
            crate::memory::give_back();
        }
    }
    got
}

/// The crontab as the loop last looked at it: its modification time, and when it looked; and
/// when it last swept its runs' leftover cgroups.
struct FileSeen {
    modified: Option<SystemTime>,
    checked: Instant,
    swept: Option<Instant>,
}

/// The file's modification time (a ConfigMap's symlink swap changes it too).
fn mtime(path: &std::path::Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}
