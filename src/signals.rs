//! Signal plumbing without handlers: the signals cronlock cares about are blocked in every thread
//! from the start and taken synchronously with `sigtimedwait` on the main thread.
//!
//! Blocked signals are queued even for PID 1 (which ignores signals left at their default action),
//! so the same code works as a container entrypoint. The child gets the original mask back.

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

/// The mask cronlock was started with, restored in the child before exec.
static ORIGINAL_MASK: OnceLock<SigSet> = OnceLock::new();

/// A `sigset_t` that is `Send + Sync` so it can live in a static.
#[derive(Clone, Copy)]
pub struct SigSet(pub libc::sigset_t);

// SAFETY: sigset_t is plain data.
unsafe impl Send for SigSet {}
unsafe impl Sync for SigSet {}

impl SigSet {
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

/// Everything the main thread waits for: forwarded signals, child exits and watchdog wake-ups.
pub fn watched() -> SigSet {
    let mut all = FORWARDED.to_vec();
    all.extend([libc::SIGCHLD, WAKEUP]);
    SigSet::of(&all)
}

/// Block [`watched`] in the calling thread (call before any thread starts so all inherit it) and
/// remember the original mask for the child.
pub fn block() {
    let mut old = MaybeUninit::<libc::sigset_t>::uninit();
    let set = watched();
    // SAFETY: valid sets; pthread_sigmask only fails for an invalid `how`.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set.0, old.as_mut_ptr()) };
    // SAFETY: pthread_sigmask filled `old`.
    let _ = ORIGINAL_MASK.set(SigSet(unsafe { old.assume_init() }));
}

/// The mask to restore in the child.
pub fn original_mask() -> SigSet {
    *ORIGINAL_MASK.get_or_init(|| SigSet::of(&[]))
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
    wait(&SigSet::of(&FORWARDED), Duration::ZERO)
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
