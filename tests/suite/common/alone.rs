//! Tests that measure time run alone. A test measures time when what it asserts is a duration
//! within a few times what it should take (a lock noticed gone within 500 ms, a run retried
//! within TTL + 2 s, a drain within 2.5 s): another test's processes on the same cores could
//! make it fail. Such tests live in a module named `alone` inside their suite (`mod alone` at
//! its end: `tracking::alone::a_flush_stops_the_command_at_once`); a bound many times
//! over what the operation takes (a refusal within 1 s) only says it does not hang, and stays
//! where it is.
//!
//! Every test holds one side of a lock on a file, from the first call it makes to this
//! support (a scratch directory, a server, a cronlock) until its thread ends. Other tests share
//! it; a test in `alone` takes it for itself with [`measure_alone`] where its measuring starts
//! (after its servers and replicas have started), and shares it again when the guard drops. It
//! is a file lock, so it also keeps apart the passes `scripts/test.sh` runs at the same time
//! from one build. A second file is a turnstile: a test waiting to measure lets no test start
//! before it. `scripts/test.sh` runs the `alone` tests in a pass of their own, so that their
//! measuring waits only for each other; under a plain `cargo test` the lock alone keeps them
//! apart from the rest.
//!
//! Threads a test spawns take no side of their own: their test holds it for them. Values made
//! once and shared by tests (`shared`, the TLS certificates) are made with a side held, so a
//! test waiting to measure never waits for a value that a test waiting for it is making.

use std::cell::RefCell;
use std::fs::{File, OpenOptions};
use std::path::Path;
use std::time::{Duration, Instant};

/// How long a test waits for its side of the lock before it goes on without it, and says so:
/// longer than any queue of tests that measure, so reached only by a mistake in this file.
const PATIENCE: Duration = Duration::from_secs(300);

/// The lock file open, and held on one side.
struct Held {
    _lock: File,
    alone: bool,
}

thread_local! {
    /// The lock file, held on one side by this test's thread (closed, so released, with it).
    static HELD: RefCell<Option<Held>> = const { RefCell::new(None) };
}

/// Take this test's side of the lock, unless its thread holds it already. Called by the
/// support's entry points; a no-op in a thread that is not a test's (libtest names each
/// test's thread by its path, `suite::test`).
pub fn enter() {
    let thread = std::thread::current();
    let Some(name) = thread.name().filter(|n| n.contains("::")) else {
        return;
    };
    HELD.with(|held| {
        if held.borrow().is_none() {
            *held.borrow_mut() = Some(take(name, false));
        }
    });
}

/// From here to the guard's drop, this test runs alone: no other test of this build runs
/// meanwhile, in this process or another. For tests in a module named `alone` only.
#[must_use = "the test runs alone while the guard lives"]
pub fn measure_alone() -> Alone {
    let thread = std::thread::current();
    let name = thread.name().unwrap_or("?");
    assert!(
        name.contains("::alone::"),
        "{name} measures alone outside a module named alone: scripts/test.sh would not run it \
         in the pass of its own"
    );
    if HELD.with(|held| held.borrow().as_ref().is_some_and(|h| h.alone)) {
        return Alone {
            nested: true,
            since: Instant::now(),
        };
    }
    HELD.with(|held| {
        // Give the shared side back first: two tests waiting to measure while each still
        // shared the lock would wait for each other.
        held.borrow_mut().take();
        *held.borrow_mut() = Some(take(name, true));
    });
    Alone {
        nested: false,
        since: Instant::now(),
    }
}

/// A test measuring alone; dropped, the test shares the lock again until its thread ends
/// (unless it was measuring alone already when this one was taken).
pub struct Alone {
    nested: bool,
    /// When the lock was taken for itself.
    since: Instant,
}

impl Drop for Alone {
    fn drop(&mut self) {
        if self.nested {
            return;
        }
        let thread = std::thread::current();
        let name = thread.name().unwrap_or("?");
        record(name, self.since.elapsed());
        HELD.with(|held| {
            held.borrow_mut().take();
            *held.borrow_mut() = Some(take(name, false));
        });
    }
}

/// With `CRONLOCK_TEST_ALONE_LOG` set to a file, each measuring goes there as a line `TEST
/// SECONDS ENDED` (ENDED: Unix seconds): what the measuring pass of `scripts/test.sh` spends, test
/// by test, and when the lock was free between them.
fn record(test: &str, measured: Duration) {
    use std::io::Write;
    let Some(path) = std::env::var_os("CRONLOCK_TEST_ALONE_LOG") else {
        return;
    };
    if let Ok(mut f) = OpenOptions::new().create(true).append(true).open(path) {
        let ended = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let _ = writeln!(
            f,
            "{test} {:.2} {:.2}",
            measured.as_secs_f64(),
            ended.as_secs_f64()
        );
    }
}

fn open(name: &str) -> File {
    OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(Path::new(env!("CARGO_TARGET_TMPDIR")).join(name))
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Pass the turnstile, then take the lock's side: an `alone` test keeps the turnstile shut
/// while it waits for the tests running to end, so that no new one starts meanwhile.
fn take(test: &str, alone: bool) -> Held {
    let since = Instant::now();
    let gate = open("alone.gate");
    let lock = open("alone.lock");
    let passed = poll(since, || gate.try_lock().is_ok());
    let side = if alone {
        poll(since, || lock.try_lock().is_ok())
    } else {
        poll(since, || lock.try_lock_shared().is_ok())
    };
    drop(gate);
    if !(passed && side) {
        eprintln!("{test}: waited {PATIENCE:?} for the tests that measure time; going on");
    }
    Held { _lock: lock, alone }
}

/// Try every 5 ms until `got` or [`PATIENCE`] has passed since `since`.
fn poll(since: Instant, mut got: impl FnMut() -> bool) -> bool {
    loop {
        if got() {
            return true;
        }
        if since.elapsed() >= PATIENCE {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}
