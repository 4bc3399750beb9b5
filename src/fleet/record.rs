//! The run record of a run that held `held` (a `record::run::RunRecord`), written at release as
//! the KEY's last run and into its capped history, with the output `--keep-output` kept.

use crate::exit::Exit;
use crate::record::run::{CommandEnd, KeptLine, RecordedEnding, RunRecord};
use crate::store::lock::Held;

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
