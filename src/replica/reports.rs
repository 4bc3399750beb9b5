//! What the replica does with its runs' reports and ends: the start and end lines (from the
//! typed reports on each run's channel, never from its output), and a run that ended without
//! reporting its end (its lock given back when no command can be left, else left to lapse).

use std::time::Duration;

use crate::clock::{rfc3339, unix_millis};
use crate::fleet::handover::{RunEnd, RunReport};
use crate::log::Log;
use crate::record::run::Ending;

use super::claim::Ask;
use super::runs::Spawned;
use super::table::Table;
use super::Replicant;

impl Replicant<'_> {
    /// Read what the runs reported.
    pub(super) fn reports(&mut self, table: &mut Table) {
        // A release an instant waits for goes at once (see `claimer.rs`).
        let full = self.runs.len() + self.in_flight >= self.replica.max_jobs as usize;
        let urgent = full || table.waiting() > 0;
        while let Ok((pid, heard)) = self.heard.1.try_recv() {
            let Some(run) = self.runs.get_mut(&pid) else {
                continue;
            };
            if let (Some(board), Some(report)) = (self.shown.board(), &heard) {
                super::watched::show_report(board, run, report);
            }
            match heard {
                None => run.closed = true,
                Some(RunReport::Started { pid: group }) => {
                    run.started = true;
                    said_started(run, group, self.log);
                }
                // Released on the claims thread's link, answered on the run's channel (at most
                // once: a second ask goes unanswered, and the run releases by itself).
                Some(RunReport::Release(opts)) => {
                    if let Some(reply) = run.reply.take() {
                        self.claims.send(Ask::ReleaseRun {
                            config: run.config.clone(),
                            held: run.held.clone(),
                            opts,
                            reply,
                            urgent,
                        });
                    }
                }
                Some(RunReport::Ended(end)) => {
                    run.ended = true;
                    said_ended(run, &end, self.log);
                    let retries = table.job(&run.key).is_some_and(|j| j.cron.retries > 0);
                    if end.status != 0 && retries {
                        table.look_again(&run.key, unix_millis() as i64 + 1000);
                    }
                }
            }
        }
    }

    /// Forget the runs that are over; one that died without reporting its end is said, and looked
    /// at again (with `--retries`) once its lock has lapsed.
    pub(super) fn forget_ended(&mut self, table: &mut Table) {
        let over: Vec<u32> = self
            .runs
            .iter()
            .filter(|(_, r)| r.over())
            .map(|(p, _)| *p)
            .collect();
        for pid in over {
            let Some(run) = self.runs.remove(&pid) else {
                continue;
            };
            let status = run.exited.map(|s| s.to_string()).unwrap_or_default();
            if run.stopped {
                self.interrupted = true;
                self.log.warn(
                    "run_stopped",
                    &format!("{}: its run was stopped ({status})", run.key),
                );
            }
            if run.ended {
                continue;
            }
            self.shown.gone(&run.key);
            // A run that exited by itself without starting its command (it reports the start
            // right after the spawn) left no command behind: its claim is undone at once (the
            // instant runs elsewhere), and one that failed as cronlock itself (125: another
            // version of the binary, a handover it refused) makes this replica sick. After a
            // start, or a death by a signal, the guard may have been killed with it and the
            // command's children live on: the lock is left to lapse, and the next claim of the
            // job records the attempt abandoned, as when the replica dies.
            let code = run.exited.and_then(|s| s.code());
            let release = !run.started && code.is_some();
            if !run.stopped {
                let then = if release {
                    "its lock is released"
                } else {
                    "its lock is left to lapse"
                };
                self.log.warn(
                    "run_died",
                    &format!(
                        "{}: its run ended ({status}) without reporting an end; {then}",
                        run.key
                    ),
                );
            }
            if release {
                self.unclaim(run.config.clone(), run.held.clone());
                // Back in the table: claimed again (here or elsewhere) while it can still
                // start, else recorded missed at its deadline.
                if let Some(at) = run.instant {
                    table.look_again(&run.key, at);
                }
            }
            if !run.started && code == Some(i32::from(crate::exit::FAILURE)) && !run.stopped {
                self.fell_sick(format!(
                    "its runs fail before starting their command (exit {})",
                    crate::exit::FAILURE
                ));
            }
            if !release && table.job(&run.key).is_some_and(|j| j.cron.retries > 0) {
                let wait = run.ttl.as_millis() as i64 + 250;
                table.look_again(&run.key, unix_millis() as i64 + wait);
            }
        }
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
