//! The run record of a run that held `held` (a `record::run::RunRecord`), written at release as
//! the KEY's last run and into its capped history.

use std::time::Duration;

use crate::exit::Exit;
use crate::record::run::{Ending, RecordedEnding, RunRecord};
use crate::store::lock::Held;

/// The record of one run.
pub fn run_record(held: &Held, ending: Ending, exit: Exit, duration: Duration) -> RunRecord {
    let h = &held.holder;
    let several = held.limit > 1;
    RunRecord {
        command: Some(h.command.clone()),
        duration_ms: Some(duration.as_millis() as u64),
        ended: Some(RecordedEnding::Known(ending)),
        exit_status: Some(i64::from(exit.code())),
        fencing_token: Some(held.fence),
        finished: Some(h.started_ms + duration.as_millis() as u64),
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
        started: Some(h.started_ms),
        token: Some(h.token.clone()),
        rest: Default::default(),
    }
}
