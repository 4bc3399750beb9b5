//! The exit-status contract in one place, so every path that ends cronlock agrees on what it means.
//!
//! The codes follow `timeout(1)` and `env(1)`: 125 is our own failure, 126/127 are exec failures,
//! 128+N is death by signal N. A missing status never becomes 0.

/// Why cronlock exits, mapped to the documented status by [`Exit::code`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// The command ran and exited with this status.
    Child(u8),
    /// The command (or cronlock, before it ran anything) was killed by this signal: 128+N.
    Signal(i32),
    /// The lock is held elsewhere (or `--wait` ran out): the `-E` value.
    Conflict(u8),
    /// The command was terminated because the lock was lost.
    LockLost,
    /// The command was terminated because it ran past `--max-runtime`.
    MaxRuntime,
    /// cronlock itself failed; the command did not run.
    Failure,
    /// The command was found but could not be executed.
    CannotExecute,
    /// The command was not found.
    NotFound,
    /// `--help` / `--version` or an admin action that succeeded.
    Success,
    /// `--check`: the monitoring plugin's status (0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN).
    Check(u8),
    /// `--trigger`: no replica serving KEY took it (sysexits' `EX_UNAVAILABLE`).
    Unserved,
    /// `--trigger --wait`: the run did not end within the wait (as timeout(1)).
    TimedOut,
}

pub const LOCK_LOST: u8 = 122;
pub const MAX_RUNTIME: u8 = 124;
pub const FAILURE: u8 = 125;
pub const CANNOT_EXECUTE: u8 = 126;
pub const NOT_FOUND: u8 = 127;
pub const UNSERVED: u8 = 69;
pub const TIMED_OUT: u8 = 124;

impl Exit {
    /// The numeric status the process exits with.
    pub fn code(self) -> u8 {
        match self {
            Exit::Child(c) | Exit::Conflict(c) => c,
            Exit::Signal(n) => 128u8.saturating_add(u8::try_from(n).unwrap_or(127)),
            Exit::LockLost => LOCK_LOST,
            Exit::MaxRuntime => MAX_RUNTIME,
            Exit::Failure => FAILURE,
            Exit::CannotExecute => CANNOT_EXECUTE,
            Exit::NotFound => NOT_FOUND,
            Exit::Success => 0,
            Exit::Check(c) => c,
            Exit::Unserved => UNSERVED,
            Exit::TimedOut => TIMED_OUT,
        }
    }

    /// Decode a `waitpid` status. Anything that is neither an exit nor a signal is a failure,
    /// never a silent 0.
    pub fn from_wait_status(status: libc::c_int) -> Exit {
        if libc::WIFEXITED(status) {
            Exit::Child(libc::WEXITSTATUS(status) as u8)
        } else if libc::WIFSIGNALED(status) {
            Exit::Signal(libc::WTERMSIG(status))
        } else {
            Exit::Failure
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signal_is_128_plus_n() {
        assert_eq!(Exit::Signal(9).code(), 137);
        assert_eq!(Exit::Signal(15).code(), 143);
    }

    #[test]
    fn reserved_codes() {
        assert_eq!(Exit::LockLost.code(), 122);
        assert_eq!(Exit::MaxRuntime.code(), 124);
        assert_eq!(Exit::Failure.code(), 125);
        assert_eq!(Exit::CannotExecute.code(), 126);
        assert_eq!(Exit::NotFound.code(), 127);
        assert_eq!(Exit::Conflict(75).code(), 75);
    }
}
