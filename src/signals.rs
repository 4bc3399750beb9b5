//! Signal plumbing without handlers: the signals cronlock cares about are blocked in every thread
//! from the start and taken synchronously with `sigtimedwait` on the main thread.
//!
//! Blocked signals are queued even for PID 1 (which ignores signals left at their default action),
//! so the same code works as a container entrypoint. The child starts with an empty mask.
//!
//! A forwarded signal that was already ignored when cronlock started (`nohup` ignores SIGHUP) is
//! left ignored and not forwarded, so `nohup cronlock ...` keeps its meaning for the command.

use std::mem::MaybeUninit;
use std::sync::OnceLock;
use std::time::Duration;

/// Signals forwarded to the child's process group.
pub const FORWARDED: [libc::c_int; 6] = [
    libc::SIGTERM,
    libc::SIGINT,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
];

/// The watchdog wakes the main thread with this when it learns the lock is lost.
pub const WAKEUP: libc::c_int = libc::SIGALRM;

/// The forwarded signals that were not ignored at start: these are blocked and forwarded.
static ACTIVE: OnceLock<Vec<libc::c_int>> = OnceLock::new();

/// A `sigset_t` that is `Send + Sync` so it can live in a static.
#[derive(Clone, Copy)]
pub struct SigSet(pub libc::sigset_t);

// SAFETY: sigset_t is plain data.
unsafe impl Send for SigSet {}
unsafe impl Sync for SigSet {}

impl SigSet {
    /// A set of `signals`. Allocation-free, so the guard may call it after `fork()`.
    pub fn of(signals: &[libc::c_int]) -> SigSet {
        let mut set = MaybeUninit::<libc::sigset_t>::uninit();
        // SAFETY: sigemptyset initialises the set; sigaddset takes valid signal numbers.
        unsafe {
            libc::sigemptyset(set.as_mut_ptr());
            for &s in signals {
                libc::sigaddset(set.as_mut_ptr(), s);
            }
            SigSet(set.assume_init())
        }
    }
}

fn is_ignored(sig: libc::c_int) -> bool {
    let mut old = MaybeUninit::<libc::sigaction>::uninit();
    // SAFETY: a null new action only queries the current one.
    let rc = unsafe { libc::sigaction(sig, std::ptr::null(), old.as_mut_ptr()) };
    // SAFETY: filled by sigaction on success.
    rc == 0 && unsafe { old.assume_init() }.sa_sigaction == libc::SIG_IGN
}

/// The signals cronlock forwards to the command (those not ignored at start).
pub fn forwarded() -> &'static [libc::c_int] {
    ACTIVE.get_or_init(|| {
        FORWARDED
            .iter()
            .copied()
            .filter(|&s| !is_ignored(s))
            .collect()
    })
}

/// Everything the main thread waits for: forwarded signals, child exits and watchdog wake-ups.
pub fn watched() -> SigSet {
    let mut all = forwarded().to_vec();
    all.extend([libc::SIGCHLD, WAKEUP]);
    SigSet::of(&all)
}

/// Block [`watched`] in the calling thread; call before any thread starts so all inherit it.
pub fn block() {
    let set = watched();
    // SAFETY: valid set; pthread_sigmask only fails for an invalid `how`.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set.0, std::ptr::null_mut()) };
}

/// Wait up to `timeout` for one of `set`; `None` on timeout.
pub fn wait(set: &SigSet, timeout: Duration) -> Option<libc::c_int> {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i32::MAX as u64) as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: valid set and timespec; a null siginfo pointer is allowed.
    let sig = unsafe { libc::sigtimedwait(&set.0, std::ptr::null_mut(), &ts) };
    (sig > 0).then_some(sig)
}

/// A forwarded signal already pending (used while no child runs: before and while waiting).
pub fn pending_forwarded() -> Option<libc::c_int> {
    wait(&SigSet::of(forwarded()), Duration::ZERO)
}

/// Wake the main thread (from the watchdog).
pub fn wake_main() {
    // SAFETY: sending a blocked signal to our own process is harmless; sigtimedwait collects it.
    unsafe { libc::kill(libc::getpid(), WAKEUP) };
}

/// Conventional name, for messages: `SIGTERM`.
pub fn name(sig: libc::c_int) -> String {
    let name = match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGTERM => "SIGTERM",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGABRT => "SIGABRT",
        _ => return format!("signal {sig}"),
    };
    name.to_string()
}
