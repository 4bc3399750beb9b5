//! The fleet: what operators see of many runs across many hosts: schedules, checks, metrics,
//! pings, run records and the admin modes (`--status`, `--list`, `--force-release`, `--check`,
//! `--suspend`, `--resume`).
//!
//! May not: run or signal the command, or hold a lock; the admin modes read and force the store
//! through [`crate::store::quorum::Masters`] like every other caller.

/// `writeln!` into a `String`, which cannot fail.
macro_rules! w {
    ($out:expr, $($arg:tt)*) => {{
        let _ = writeln!($out, $($arg)*);
    }};
}

pub mod admin;
pub mod check;
pub mod describe;
pub mod instants;
pub mod ledger;
pub mod metrics;
pub mod next;
pub mod ping;
pub mod record;
pub mod replicas;
pub mod report;
pub mod schedule;
pub mod spread;
pub mod status;
pub mod suspend;
pub mod trigger;
