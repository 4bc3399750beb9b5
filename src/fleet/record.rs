//! The run record: what one run did, written at release as the KEY's last run (and into a short
//! capped history), so "did last night's job run, where, and did it succeed?" has an answer
//! without redis-cli.

use std::time::Duration;

use serde_json::{json, Value};

use crate::exit::Exit;
use crate::store::lock::Held;

/// How a run ended, as recorded and logged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// The command exited by itself.
    Exited,
    /// The command was killed by a signal it did not handle.
    Signalled,
    /// cronlock stopped it because the lock was lost.
    Lost,
    /// cronlock stopped it at `--max-runtime`.
    MaxRuntime,
    /// The command could not be started (or a signal arrived first).
    NotStarted,
}

impl Ending {
    pub fn name(self) -> &'static str {
        match self {
            Ending::Exited => "exited",
            Ending::Signalled => "signalled",
            Ending::Lost => "lost",
            Ending::MaxRuntime => "max-runtime",
            Ending::NotStarted => "not-started",
        }
    }

    /// The ending [`Ending::name`] names.
    pub fn from_name(name: &str) -> Option<Ending> {
        [
            Ending::Exited,
            Ending::Signalled,
            Ending::Lost,
            Ending::MaxRuntime,
            Ending::NotStarted,
        ]
        .into_iter()
        .find(|e| e.name() == name)
    }
}

/// The record of one run, as JSON.
pub fn run_record(held: &Held, ending: Ending, exit: Exit, duration: Duration) -> Value {
    let h = &held.holder;
    let mut rec = json!({
        "key": held.keys.name,
        "host": h.host,
        "pid": h.pid,
        "command": h.command,
        "token": h.token,
        "fencing_token": held.fence,
        "started": h.started_ms,
        "finished": h.started_ms + duration.as_millis() as u64,
        "duration_ms": duration.as_millis() as u64,
        "exit_status": exit.code(),
        "ended": ending.name(),
    });
    if let Some(instant) = held.instant {
        rec["instant"] = instant.into();
    }
    if held.limit > 1 {
        rec["slot"] = held.slot.into();
        rec["limit"] = held.limit.into();
    }
    if let Exit::Signal(n) = exit {
        rec["signal"] = n.into();
    }
    rec
}
