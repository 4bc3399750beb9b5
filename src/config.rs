//! What cronlock was asked to do, as plain values resolved once: a run ([`RunConfig`]) or an
//! admin mode ([`Admin`]).
//!
//! It exists so that a run can be described by something other than a command line. `cli/`
//! resolves the arguments and variables into these values, with every check done and every
//! secret file read before anything talks to Redis; a crontab line resolves into the same
//! [`RunConfig`]. Nothing below `lib.rs` sees the parsed command line, and nothing here fails:
//! a value of these types is a request cronlock can carry out as it stands.

use std::ffi::OsString;
use std::time::Duration;

pub use crate::fleet::report::Reports;
use crate::fleet::schedule::Schedule;
use crate::lease::Timing;
use crate::store::topology::Redis;

/// What to do: one run, or one admin mode.
pub enum Request {
    Run(Box<RunConfig>),
    Admin(Box<Admin>),
}

/// One run of a command under a KEY's lock, fully described.
#[derive(Clone)]
pub struct RunConfig {
    pub key: String,
    /// argv of the command: `[COMMAND, ARGS...]` or `["/bin/sh", "-c", SHELL_COMMAND]`.
    pub argv: Vec<OsString>,
    /// `--prefix`: the namespace of the Redis keys.
    pub prefix: String,
    /// Where the lock lives: one topology, or the masters of a quorum.
    pub servers: Vec<Redis>,
    /// `--connect-timeout`: the budget of one Redis step (a connection, a call, the release).
    pub connect_timeout: Duration,
    /// `--ttl` and `--grace`, checked together.
    pub timing: Timing,
    /// How long to wait for the lock (`-n` already folded in: zero).
    pub wait: Duration,
    /// `--limit`: how many may hold the KEY at once.
    pub limit: u32,
    /// `--schedule`: once per scheduled instant.
    pub schedule: Option<Schedule>,
    /// `--catch-up`: the window in which a missed, failed or abandoned instant still runs.
    pub catch_up: Option<Duration>,
    /// `--retries`: more attempts at a failed or abandoned instant (0 without `--catch-up`).
    pub retries: u32,
    /// `-E`/`--conflict-exit-code`: the status when the lock is busy.
    pub conflict_exit_code: u8,
    /// `--max-runtime`, none when 0.
    pub max_runtime: Option<Duration>,
    /// `--min-hold`: keep the lock at least this long after it was taken.
    pub min_hold: Duration,
    /// `--history`: how many run records to keep.
    pub history: u32,
    /// `--history-ttl`: how long run records live.
    pub history_ttl: Option<Duration>,
    pub reports: Reports,
}

/// An admin mode and what it needs.
pub struct Admin {
    pub mode: AdminMode,
    pub prefix: String,
    pub servers: Vec<Redis>,
    /// `--connect-timeout`: the budget of each step.
    pub timeout: Duration,
    /// `--json` output.
    pub json: bool,
}

/// The admin modes.
pub enum AdminMode {
    /// `--status KEY`, with `--history [N]` (`Some(None)`: all that are kept).
    Status {
        key: String,
        history: Option<Option<u32>>,
        schedule: Option<Schedule>,
    },
    /// `--check KEY`.
    Check {
        key: String,
        max_age: Option<Duration>,
        schedule: Option<Schedule>,
    },
    /// `--list`.
    List,
    /// `--force-release KEY [--token T]`.
    ForceRelease { key: String, token: Option<String> },
    /// `--suspend KEY [--reason TEXT]`.
    Suspend { key: String, reason: Option<String> },
    /// `--resume KEY`.
    Resume { key: String },
}
