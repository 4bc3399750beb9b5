//! Signal plumbing without handlers: the signals cronlock cares about are blocked in every thread
//! from the start and taken synchronously with `sigtimedwait` on the main thread.
//!
//! Blocked signals are queued even for PID 1 (which ignores signals left at their default action),
//! so the same code works as a container entrypoint. The child starts with an empty mask.
//!
//! Inherited dispositions are decided, not trusted (tini's `configure_signals`, uutils'
//! `install_sigchld`): SIGCHLD is reset to its default, because a parent that ignores it makes the
//! kernel reap our children behind our back. The job-control signals SIGTSTP, SIGTTIN and SIGTTOU
//! never stop cronlock itself (that would stop the watchdog while the command runs on): they are
//! forwarded to the command's group, which stops while cronlock keeps renewing the lock, and SIGCONT
//! is forwarded to continue it.
//!
//! A forwarded signal that was already ignored when cronlock started (`nohup` ignores SIGHUP) is
//! left ignored and not forwarded, so `nohup cronlock ...` keeps its meaning for the command.

use std::mem::MaybeUninit;
use std::sync::OnceLock;
use std::time::Duration;

use nix::sys::signal::Signal;

/// Signals forwarded to the child's process group.
pub const FORWARDED: [libc::c_int; 11] = [
    libc::SIGTERM,
    libc::SIGINT,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGTSTP,
    libc::SIGTTIN,
    libc::SIGTTOU,
    libc::SIGCONT,
    libc::SIGWINCH,
];

/// Forwarded signals that stop the command; they are not followed by SIGCONT.
pub fn is_stop(sig: libc::c_int) -> bool {
    matches!(sig, libc::SIGTSTP | libc::SIGTTIN | libc::SIGTTOU)
}

/// The watchdog wakes the main thread with this when it learns the lock is lost.
pub const WAKEUP: libc::c_int = libc::SIGALRM;

/// The forwarded signals that were not ignored at start: these are blocked and forwarded.
static ACTIVE: OnceLock<Vec<libc::c_int>> = OnceLock::new();

/// A `sigset_t` that is `Send + Sync` so it can live in a static.
#[derive(Clone, Copy)]
pub struct SigSet(pub libc::sigset_t);

// SAFETY: sigset_t is plain data without pointers; sharing or sending it between threads is sound.
unsafe impl Send for SigSet {}
// SAFETY: as above, plain data.
unsafe impl Sync for SigSet {}

impl SigSet {
    /// A set of `signals`. Allocation-free, so the guard may call it after `fork()`.
    pub fn of(signals: &[libc::c_int]) -> SigSet {
        let mut set = MaybeUninit::<libc::sigset_t>::uninit();
        // SAFETY: sigemptyset initialises the set before sigaddset and assume_init read it;
        // sigaddset only fails (harmlessly) for invalid numbers.
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
    // SAFETY: a null new action only queries the current one into `old`.
    let rc = unsafe { libc::sigaction(sig, std::ptr::null(), old.as_mut_ptr()) };
    // SAFETY: sigaction filled `old` when it returned 0.
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

/// Reset SIGCHLD and block [`watched`] in the calling thread; call before any thread starts so
/// all inherit the mask.
pub fn block() {
    // SAFETY: setting a default disposition installs no handler; SIGCHLD is a valid signal.
    unsafe { libc::signal(libc::SIGCHLD, libc::SIG_DFL) };
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
/// Job-control signals are consumed and ignored then: there is nothing to stop yet.
pub fn pending_forwarded() -> Option<libc::c_int> {
    let set = SigSet::of(forwarded());
    while let Some(sig) = wait(&set, Duration::ZERO) {
        if !is_stop(sig) && sig != libc::SIGCONT && sig != libc::SIGWINCH {
            return Some(sig);
        }
    }
    None
}

/// Set once cronlock passed a request to end (SIGTERM, SIGINT, SIGHUP, SIGQUIT) to the command.
static ASKED_TO_END: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Note that cronlock was asked to end (and passed it on to the command).
pub fn note_asked_to_end() {
    ASKED_TO_END.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// Whether cronlock was asked to end while the command ran: its run was interrupted.
pub fn asked_to_end() -> bool {
    ASKED_TO_END.load(std::sync::atomic::Ordering::SeqCst)
}

/// A signal that asked cronlock to end while it was busy with something that then stopped
/// (reading a crontab): an error of its own kind, so the exit status is 128 + N, not 125.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interrupted(pub libc::c_int);

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "stopped by {}", name(self.0))
    }
}

impl std::error::Error for Interrupted {}

/// Wake the main thread (from the watchdog).
pub fn wake_main() {
    // SAFETY: sending a blocked signal to our own process is harmless; sigtimedwait collects it.
    unsafe { libc::kill(libc::getpid(), WAKEUP) };
}

/// Ask this process to end, as a SIGTERM from outside would (a replica's run whose replica is
/// gone): taken by the main thread like any forwarded signal.
pub fn ask_to_end() {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::this(), Signal::SIGTERM);
}

/// `fcntl`'s `F_SETSIG` (Linux; not in the libc crate).
const F_SETSIG: libc::c_int = 10;

/// Have the kernel wake the main thread (as [`wake_main`] does) whenever `fd` becomes readable
/// (`O_ASYNC`, the signal [`WAKEUP`]), or stop it (`on` false). The descriptor stays blocking.
pub fn wake_on_readable(fd: std::os::fd::RawFd, on: bool) -> std::io::Result<()> {
    // SAFETY: fcntl on a descriptor the caller owns, with integer arguments only; a failure is
    // returned, nothing is left half-done that matters (a wake-up is an optimisation).
    unsafe {
        if on
            && (libc::fcntl(fd, libc::F_SETOWN, libc::getpid()) < 0
                || libc::fcntl(fd, F_SETSIG, WAKEUP) < 0)
        {
            return Err(std::io::Error::last_os_error());
        }
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let flags = if on {
            flags | libc::O_ASYNC
        } else {
            flags & !libc::O_ASYNC
        };
        if libc::fcntl(fd, libc::F_SETFL, flags) < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Conventional name, for messages: `SIGTERM`.
pub fn name(sig: libc::c_int) -> String {
    match Signal::try_from(sig) {
        Ok(s) => s.as_str().to_string(),
        Err(_) => format!("signal {sig}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(name(libc::SIGTERM), "SIGTERM");
        assert_eq!(name(libc::SIGTSTP), "SIGTSTP");
        assert_eq!(name(1000), "signal 1000");
    }
}
