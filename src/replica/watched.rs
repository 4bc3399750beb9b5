//! What the replica shows on its board (`--listen`, [`crate::http`]): its jobs, each turn of its
//! loop, its runs' starts and ends, its claims won and lost, the instants it recorded missed, and
//! whether Redis answers its heartbeats. Typed values, as the loop has them; nothing here is read
//! back by the scheduler.

use crate::record::ledger::MissedReason;
use std::sync::Arc;
use std::time::Duration;

use crate::clock::unix_millis;
use crate::fleet::metrics::{MetricsAttempt, Outcome, Ran};
use crate::handover::{RunEnd, RunReport};
use crate::host::hostname;
use crate::http::{Board, JobLine, Running};
use crate::record::run::Ending;

use super::runs::Spawned;
use super::table::Table;

/// The board a replica shows (with `--listen`), and the table it last showed.
pub(super) struct BoardFeed {
    board: Option<Arc<Board>>,
    /// The table (its `loaded` count) the board last showed.
    loaded: Option<u64>,
}

impl BoardFeed {
    pub(super) fn new(board: Option<Arc<Board>>) -> BoardFeed {
        BoardFeed {
            board,
            loaded: None,
        }
    }

    /// The board, with `--listen`.
    pub(super) fn board(&self) -> Option<&Arc<Board>> {
        self.board.as_ref()
    }

    /// The loop turned: the board hears it, with the table's jobs when they changed, the claims
    /// in flight, and whether the replica drains.
    pub(super) fn turn(&mut self, table: &Table, in_flight: usize, draining: bool) {
        let Some(board) = &self.board else {
            return;
        };
        board.turned();
        let mut s = board.state();
        if self.loaded != Some(table.loaded) {
            self.loaded = Some(table.loaded);
            // A job kept across a reload keeps the time it began to be served.
            let since: std::collections::HashMap<&str, u64> = s
                .jobs
                .iter()
                .map(|j| (j.key.as_str(), j.since_ms))
                .collect();
            let now = crate::clock::unix_millis();
            let jobs = table
                .jobs
                .iter()
                .map(|j| JobLine {
                    key: j.cron.key.clone(),
                    schedule: j.cron.schedule.clone(),
                    config: j.cron.run.config.clone(),
                    since_ms: since.get(j.cron.key.as_str()).copied().unwrap_or(now),
                })
                .collect();
            s.jobs = jobs;
        }
        s.in_flight = in_flight;
        s.draining = draining;
    }

    /// A run is over without having reported its end.
    pub(super) fn gone(&self, key: &str) {
        if let Some(board) = &self.board {
            board.state().running.remove(key);
        }
    }

    /// A claim's answer: won, lost (another replica's run, a suspension: an attempt skipped
    /// here), or failed (Redis did not answer).
    pub(super) fn claim(&self, key: &str, won: Option<bool>, suspended: Option<u64>) {
        let Some(board) = &self.board else {
            return;
        };
        match won {
            Some(true) => board.state().claims_won += 1,
            Some(false) => {
                board.state().claims_lost += 1;
                let attempt = MetricsAttempt {
                    outcome: Outcome::Skipped,
                    at_ms: unix_millis(),
                    run: None,
                    suspended,
                };
                board.attempted(key, &hostname(), &attempt);
            }
            None => board.state().redis_errors += 1,
        }
    }

    /// This replica cannot start runs (and why), or can again.
    pub(super) fn sick(&self, why: Option<&str>) {
        if let Some(board) = &self.board {
            board.state().sick = why.map(str::to_string);
        }
    }

    /// An instant of KEY recorded missed, for `reason`.
    pub(super) fn missed(&self, key: &str, instant: i64, reason: MissedReason) {
        if let Some(board) = &self.board {
            *board
                .state()
                .missed
                .entry((key.to_string(), reason))
                .or_default() += 1;
            let attempt = MetricsAttempt {
                outcome: Outcome::Missed,
                at_ms: instant.max(0) as u64,
                run: None,
                suspended: None,
            };
            board.attempted(key, &hostname(), &attempt);
        }
    }

    /// A heartbeat was answered (or failed, with why); the next is due within `every`; the
    /// clock's offset from Redis's as measured so far.
    pub(super) fn beat(&self, failed: Option<&str>, every: Duration, offset: Option<i64>) {
        if let Some(board) = &self.board {
            let mut s = board.state();
            s.beat_every = every;
            s.clock_offset_ms = offset;
            match failed {
                None => {
                    s.answered = Some(crate::clock::Instant::now());
                    s.failing = None;
                }
                Some(why) => {
                    s.failing = Some(why.to_string());
                    s.redis_errors += 1;
                }
            }
        }
    }
}

/// A run reported `heard`.
pub(super) fn show_report(board: &Board, run: &Spawned, heard: &RunReport) {
    match heard {
        RunReport::Started { .. } => board.started(
            &run.key,
            &hostname(),
            Running {
                since_ms: unix_millis(),
                attempt: run.attempt,
                instant: run.instant,
            },
        ),
        RunReport::Ended(end) => {
            let since = board.state().running.get(&run.key).map(|r| r.since_ms);
            let attempt = ended(run, end, since);
            board.attempted(&run.key, &hostname(), &attempt);
        }
        RunReport::Renew | RunReport::Release(_) => {}
    }
}

/// A run's end as the metrics count it (as [`crate::fleet::report::Report::tell`] does): its
/// command ran from its reported start (`since`, Unix ms) until now; without a start, the
/// attempt took `took` from the claim.
fn ended(run: &Spawned, end: &RunEnd, since: Option<u64>) -> MetricsAttempt {
    let RunEnd {
        status,
        ending,
        duration: took,
    } = *end;
    let outcome = match ending {
        Ending::Exited | Ending::Signalled => Outcome::Ran,
        Ending::Lost => Outcome::Lost,
        Ending::MaxRuntime => Outcome::MaxRuntime,
        Ending::NotStarted if matches!(status, 126 | 127) => Outcome::FailedToStart,
        Ending::NotStarted => Outcome::Error,
    };
    let now = unix_millis();
    let started_ms = since.unwrap_or_else(|| now.saturating_sub(took.as_millis() as u64));
    MetricsAttempt {
        outcome,
        at_ms: started_ms,
        run: Some(Ran {
            started_ms,
            duration: Duration::from_millis(now.saturating_sub(started_ms)),
            exit_status: status,
            attempt: run.attempt,
        }),
        suspended: None,
    }
}

/// The board for `--listen`, serving there (with `--show-output`, the page shows each job's
/// last failure's kept output); none without it.
pub(super) fn board(
    replica: &crate::config::Replica,
    log: &crate::log::Log,
) -> anyhow::Result<Option<std::sync::Arc<Board>>> {
    let Some(addr) = replica.listen else {
        return Ok(None);
    };
    let board = Board::new(replica.max_jobs);
    crate::http::start(addr, board.clone(), log.clone(), replica.show_output)?;
    Ok(Some(board))
}
