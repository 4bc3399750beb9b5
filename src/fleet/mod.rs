//! The fleet: schedules, checks, metrics, pings, run records and the admin modes.
//!
//! What operators see of many runs across many hosts. Nothing here runs the command.

/// `writeln!` into a `String`, which cannot fail.
macro_rules! w {
    ($out:expr, $($arg:tt)*) => {{
        let _ = writeln!($out, $($arg)*);
    }};
}

pub mod admin;
pub mod check;
pub mod metrics;
pub mod ping;
pub mod record;
pub mod report;
pub mod schedule;
pub mod status;
