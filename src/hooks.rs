//! Test hooks: the variables through which the suite stops cronlock at a chosen point or injects
//! a fault. Only a debug build (the tests' own binary, `tests/suite/common` `cronlock_debug`)
//! reads them: in the release build users run, [`get`] is `None` whatever the environment says,
//! so the shipped binary's behaviour never depends on them. Every hook is named here and read
//! through [`get`], one idiom; a replica keeps its own ([`REPLICA`]) from its runs.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

/// `main`, `watchdog` or `watchdog-start`: a run panics in its main thread once the command
/// started, panics in its watchdog, or fails to start the watchdog.
pub const PANIC: &str = "CRONLOCK_TEST_PANIC";

/// A file: a replica that won a claim writes the KEY there and stops before starting the run (a
/// test then kills it "between claim and spawn").
pub const HOLD_AFTER_CLAIM: &str = "CRONLOCK_TEST_HOLD_AFTER_CLAIM";

/// N: the claims thread holds each won claim's answer N ms before the loop hears it (a test then
/// changes the crontab while a claim is in flight).
pub const HOLD_CLAIM_ANSWER_MS: &str = "CRONLOCK_TEST_HOLD_CLAIM_ANSWER_MS";

/// A file: while it exists, the replica's loop sleeps instead of turning (for `/healthz`).
pub const HOLD_LOOP: &str = "CRONLOCK_TEST_HOLD_LOOP";

/// N: a replica lets its idle starter go after N ms instead of a minute.
pub const STARTER_IDLE_MS: &str = "CRONLOCK_TEST_STARTER_IDLE_MS";

/// N (ms, may be negative): the wall clock reads N ms ahead of the host's (a host whose clock
/// is wrong). Every process of the test's replica reads it, its runs too, as on such a host.
pub const CLOCK_SHIFT_MS: &str = "CRONLOCK_TEST_CLOCK_SHIFT_MS";

/// The hooks that act on a replica, never on its runs.
pub const REPLICA: [&str; 4] = [
    HOLD_AFTER_CLAIM,
    HOLD_CLAIM_ANSWER_MS,
    HOLD_LOOP,
    STARTER_IDLE_MS,
];

/// The hook's value, in a debug build only.
pub fn get(hook: &str) -> Option<OsString> {
    if cfg!(debug_assertions) {
        std::env::var_os(hook)
    } else {
        None
    }
}

/// A hook that names a file.
pub fn file(hook: &str) -> Option<PathBuf> {
    get(hook).map(PathBuf::from)
}

/// A hook that gives milliseconds.
pub fn millis(hook: &str) -> Option<Duration> {
    get(hook)?.to_str()?.parse().ok().map(Duration::from_millis)
}

/// Whether [`PANIC`] asks for a fault at `point`.
pub fn fault_at(point: &str) -> bool {
    get(PANIC).is_some_and(|v| v == point)
}
