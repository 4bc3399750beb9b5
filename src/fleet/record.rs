//! The run record of a run that held `held` (a `record::run::RunRecord`), written at release as
//! the KEY's last run and into its capped history, with the output `--keep-output` kept.

use crate::exit::Exit;
use crate::record::run::{Ending, KeptLine, RecordedEnding, RunRecord};
use crate::store::lock::Held;

/// How a run's command ended, as its release records it: what a replica's run tells its replica
/// when it asks it to release (the replica, which claimed the lock, makes the record), and what a
/// run that releases by itself records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommandEnd {
    /// cronlock's exit status for the run.
    pub exit: Exit,
    pub ending: Ending,
    /// When the command started (wall-clock ms), if it did.
    pub started_ms: Option<u64>,
    /// When the run was done with it (wall-clock ms).
    pub finished_ms: u64,
    /// cronlock was asked to end while it ran (and passed it on): the ledger says interrupted.
    pub interrupted: bool,
}

impl CommandEnd {
    /// Whether the command ran and exited with status 0.
    pub fn succeeded(&self) -> bool {
        self.ending == Ending::Exited && self.exit.code() == 0
    }
}

/// The record of one run: from when its command started (the lock's ask, when it did not) to
/// when it ended; `output`, what `--keep-output` kept of it.
pub fn run_record(held: &Held, end: &CommandEnd, output: Option<Vec<KeptLine>>) -> RunRecord {
    let CommandEnd {
        exit,
        ending,
        started_ms,
        finished_ms,
        ..
    } = *end;
    let h = &held.holder;
    let several = held.limit > 1;
    let started = started_ms.unwrap_or(h.started_ms);
    let finished = finished_ms.max(started);
    RunRecord {
        command: Some(h.command.clone()),
        duration_ms: Some(finished - started),
        ended: Some(RecordedEnding::Known(ending)),
        exit_status: Some(i64::from(exit.code())),
        fencing_token: Some(held.fence),
        finished: Some(finished),
        host: Some(h.host.clone()),
        instant: held.instant,
        key: Some(held.keys.name.clone()),
        limit: several.then_some(held.limit),
        pid: Some(u64::from(h.pid)),
        signal: match exit {
            Exit::Signal(n) => Some(i64::from(n)),
            _ => None,
        },
        slot: several.then_some(held.slot),
        started: Some(started),
        token: Some(h.token.clone()),
        output,
        rest: Default::default(),
    }
}
