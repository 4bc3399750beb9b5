//! The guard: a small process between cronlock and the command that outlives cronlock just long
//! enough to kill the command's whole process group if cronlock dies (SIGKILL, OOM).
//!
//! `PR_SET_PDEATHSIG` reaches only a direct child, so with `sh -c 'a; b'` the real work would run on
//! without a lock. The guard is forked from cronlock's main thread (which lives as long as cronlock),
//! leads the command's process group, gets a death signal when cronlock goes, and then SIGKILLs the
//! group. Otherwise it is transparent: it ignores signals cronlock sends to the group (they reach the
//! command directly) and ends exactly as the command did, exit code or signal.
//!
//! It is a plain `fork()` without `exec`, which is cheaper than re-executing cronlock. Since
//! cronlock may already run the watchdog thread when it forks, everything here after `fork()` uses
//! only async-signal-safe system calls on data prepared beforehand: no allocation, no locks, no
//! panics.

use std::ffi::CString;

use crate::signals::SigSet;

/// Sent to the guard when cronlock dies. Not a signal cronlock forwards.
pub const DEATH_SIGNAL: libc::c_int = libc::SIGPWR;

/// Everything the guard and the command need, computed before `fork()`.
pub struct Prepared {
    /// Paths to try with `execve`, in `PATH` order (one when COMMAND contains a `/`).
    pub candidates: Vec<CString>,
    pub argv: Vec<CString>,
    pub envp: Vec<CString>,
    pub argv_ptrs: Vec<*const libc::c_char>,
    pub envp_ptrs: Vec<*const libc::c_char>,
    /// The command's signal mask (empty: the signals cronlock blocks must reach it).
    pub child_mask: SigSet,
    /// What the guard waits for: forwarded signals, SIGCHLD and the death signal.
    pub guard_set: SigSet,
    /// cronlock's pid; when the guard's parent changes, cronlock is gone.
    pub parent: libc::pid_t,
}

impl Prepared {
    pub fn new(
        candidates: Vec<CString>,
        argv: Vec<CString>,
        envp: Vec<CString>,
        child_mask: SigSet,
    ) -> Prepared {
        let ptrs = |v: &[CString]| {
            v.iter()
                .map(|s| s.as_ptr())
                .chain(std::iter::once(std::ptr::null()))
                .collect::<Vec<_>>()
        };
        let mut guarded = crate::signals::FORWARDED.to_vec();
        guarded.extend([libc::SIGCHLD, DEATH_SIGNAL, crate::signals::WAKEUP]);
        Prepared {
            argv_ptrs: ptrs(&argv),
            envp_ptrs: ptrs(&envp),
            candidates,
            argv,
            envp,
            child_mask,
            guard_set: SigSet::of(&guarded),
            // SAFETY: getpid cannot fail.
            parent: unsafe { libc::getpid() },
        }
    }
}

fn errno() -> libc::c_int {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// The guard's body, run in the forked process. Never returns.
///
/// # Safety
/// Call only in a freshly forked child; `p` must have been built before the fork, `report_fd` is
/// the write end of a close-on-exec pipe on which exec failures are reported as an errno.
pub unsafe fn run(p: &Prepared, report_fd: libc::c_int) -> ! {
    // SAFETY (whole block): async-signal-safe calls on memory that was valid before the fork.
    unsafe {
        libc::setpgid(0, 0);
        libc::prctl(
            libc::PR_SET_PDEATHSIG,
            DEATH_SIGNAL as libc::c_ulong,
            0,
            0,
            0,
        );
        // So `ps -o comm` tells the guard from cronlock.
        libc::prctl(libc::PR_SET_NAME, c"cronlock-guard".as_ptr(), 0, 0, 0);
        libc::pthread_sigmask(libc::SIG_BLOCK, &p.guard_set.0, std::ptr::null_mut());
        if libc::getppid() != p.parent {
            // cronlock died before the death signal was armed: run nothing.
            libc::_exit(crate::exit::FAILURE as libc::c_int);
        }
        let pid = libc::fork();
        if pid == 0 {
            exec_command(p, report_fd);
        }
        if pid < 0 {
            report(report_fd, errno());
            libc::_exit(crate::exit::CANNOT_EXECUTE as libc::c_int);
        }
        libc::close(report_fd);
        loop {
            let sig = libc::sigwaitinfo(&p.guard_set.0, std::ptr::null_mut());
            if libc::getppid() != p.parent {
                // cronlock is gone: nothing renews the lock any more. Stop the whole group now.
                libc::kill(0, libc::SIGKILL);
                libc::_exit(crate::exit::LOCK_LOST as libc::c_int);
            }
            if sig == libc::SIGCHLD {
                let mut status = 0;
                loop {
                    let r = libc::waitpid(-1, &mut status, libc::WNOHANG);
                    if r == pid {
                        end_like(status);
                    }
                    if r <= 0 {
                        break;
                    }
                }
            }
            // Forwarded signals were sent to the whole group by cronlock and have reached the
            // command already; the guard ignores its copy.
        }
    }
}

/// Exit the way the command did, so cronlock sees the same status.
unsafe fn end_like(status: libc::c_int) -> ! {
    // SAFETY (whole block): async-signal-safe calls only.
    unsafe {
        if libc::WIFSIGNALED(status) {
            let sig = libc::WTERMSIG(status);
            // Die of the same signal, without leaving a core file of the guard.
            let no_core = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            libc::setrlimit(libc::RLIMIT_CORE, &no_core);
            libc::signal(sig, libc::SIG_DFL);
            let one = SigSet::of(&[sig]);
            libc::pthread_sigmask(libc::SIG_UNBLOCK, &one.0, std::ptr::null_mut());
            libc::kill(libc::getpid(), sig);
            libc::_exit(128 + sig);
        }
        libc::_exit(libc::WEXITSTATUS(status));
    }
}

/// In the command's process: restore what cronlock changed, then exec like `execvp`.
unsafe fn exec_command(p: &Prepared, report_fd: libc::c_int) -> ! {
    // SAFETY (whole block): async-signal-safe calls on memory prepared before fork.
    unsafe {
        // If the guard is killed alone, the command must not run on without it.
        libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGKILL as libc::c_ulong,
            0,
            0,
            0,
        );
        // Rust's runtime ignores SIGPIPE; commands expect the default.
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        libc::pthread_sigmask(libc::SIG_SETMASK, &p.child_mask.0, std::ptr::null_mut());
        let mut saw_eacces = false;
        let mut err = libc::ENOENT;
        for path in &p.candidates {
            libc::execve(path.as_ptr(), p.argv_ptrs.as_ptr(), p.envp_ptrs.as_ptr());
            match errno() {
                libc::EACCES => saw_eacces = true,
                libc::ENOENT | libc::ENOTDIR => {}
                other => {
                    err = other;
                    break;
                }
            }
        }
        if err == libc::ENOENT && saw_eacces {
            err = libc::EACCES;
        }
        report(report_fd, err);
        let code = if err == libc::ENOENT {
            crate::exit::NOT_FOUND
        } else {
            crate::exit::CANNOT_EXECUTE
        };
        libc::_exit(code as libc::c_int);
    }
}

unsafe fn report(fd: libc::c_int, err: libc::c_int) {
    let bytes = err.to_ne_bytes();
    // SAFETY: writing 4 bytes from a stack buffer.
    unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
}
