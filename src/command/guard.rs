//! The guard: a small process between cronlock and the command that enforces the lock's deadline
//! even when cronlock cannot: when cronlock dies (SIGKILL, OOM) or is frozen (SIGSTOP, a debugger).
//!
//! `PR_SET_PDEATHSIG` reaches only a direct child, so with `sh -c 'a; b'` the real work would run on
//! without a lock. The guard is forked from cronlock's main thread (which lives as long as cronlock),
//! leads the command's process group, and is a child subreaper, so every descendant that is
//! orphaned (`setsid`, daemonizing, `timeout(1)`'s own group) comes back to it. It ends the whole
//! job — the job's cgroup when there is one (`cgroup.kill`), every descendant, the group — when:
//! - cronlock dies (the death signal);
//! - the kill-by time cronlock publishes in the [shared page](crate::command::shared) passes without being
//!   moved on by a confirmed renewal (cronlock frozen or starved).
//!
//! Otherwise it is transparent: it ignores signals cronlock sends to the group (they reach the
//! command directly), relays them to children that left the group, and once the command has ended
//! and whatever it left behind is killed, hands its wait status to cronlock in the shared page.
//!
//! It is a `fork()` of cronlock ([`start`]) with an address space of its own, never a process
//! that shares cronlock's memory: the kernel's OOM killer SIGKILLs its victim together with every
//! process sharing the victim's memory, and the guard must outlive exactly that. It does nothing
//! but raw system calls ([`crate::command::sys`]) on its copy of data prepared beforehand, so no lock that
//! another thread of cronlock held at the fork can stop it. The command's process is started from
//! the guard the way `posix_spawn` starts one, sharing the guard's memory until `execve`
//! ([`start_command`]): that process is short-lived and execs at once.

use std::cell::Cell;
use std::ffi::{CStr, CString};
use std::os::fd::RawFd;

use crate::command::shared::{self, Shared};
use crate::command::sys;
use crate::command::tree::{kill_descendants, relay_to_escaped_children};
use crate::signals::SigSet;

/// Sent to the guard when cronlock dies. Not a signal cronlock forwards.
pub const DEATH_SIGNAL: libc::c_int = libc::SIGPWR;

/// A stream of [`Prepared::stdio`] the command gets as cronlock has it.
pub const UNTOUCHED: RawFd = -1;

/// How the guard reports an exec failure on the report pipe when the deadline had passed.
pub const REPORT_TOO_LATE: i32 = -1;

/// How the command's process reports that it could not join the cgroup its starter made, when
/// no guard started it (only that cgroup lets the starter stop it: [`start_alone`]).
pub const REPORT_NOT_CONTAINED: i32 = -2;

/// Added to the errno when the guard could not create the command's process at all (`clone`
/// failed: too many processes), as opposed to an `execve` that failed in it.
pub const REPORT_NO_PROCESS: i32 = 1 << 16;

/// The job's cgroup, as the guard made and opened it (see [`make_cgroup`]).
#[derive(Debug, Clone, Copy)]
struct CgroupFds {
    /// The cgroup's directory: the command is created inside it (`clone3(CLONE_INTO_CGROUP)`);
    /// where `clone3` cannot do that, the command's process joins through its `cgroup.procs`.
    dir: RawFd,
    /// `cgroup.kill`: writing `1` kills every process in the cgroup.
    kill: RawFd,
}

/// Everything the guard and the command need, computed before the guard starts. The guard works
/// on its own copy (it is a fork), so cronlock may drop this once the guard has started.
pub struct Prepared {
    /// Paths to try with `execve`, in `PATH` order (one when COMMAND contains a `/`).
    pub candidates: Vec<CString>,
    pub argv: Vec<CString>,
    pub envp: Vec<CString>,
    pub argv_ptrs: Vec<*const libc::c_char>,
    pub envp_ptrs: Vec<*const libc::c_char>,
    /// `/bin/sh FILE ARGS...` for a file without `#!` (ENOEXEC), like `execvp`; slot 1 is filled
    /// with the candidate that failed.
    pub sh_argv: Vec<Cell<*const libc::c_char>>,
    /// The command's signal mask (empty: the signals cronlock blocks must reach it).
    pub child_mask: SigSet,
    /// What the guard waits for: forwarded signals, SIGCHLD and the death signal.
    pub guard_set: SigSet,
    /// cronlock's pid; when the guard's parent changes, cronlock is gone.
    pub parent: libc::pid_t,
    pub shared: Shared,
    /// Where the guard makes the job's cgroup, if cgroup v2 is there (see [`make_cgroup`]).
    pub cgroup_path: Option<CString>,
    /// The pipes that replace the command's stdout and stderr when its output is captured
    /// (`--ping-body`, `--keep-output`); [`UNTOUCHED`] for a stream left as cronlock's own.
    pub stdio: [RawFd; 2],
    /// cronlock's read ends of those pipes, which the guard closes: once cronlock's copy ends
    /// (its reader went away), the command's next write must fail as it would without cronlock.
    pub stdio_readers: [RawFd; 2],
    /// The write end of a close-on-exec pipe on which exec failures are reported as an errno.
    pub report_fd: RawFd,
    /// The command's process leads a process group of its own (no guard leads one for it:
    /// [`start_alone`]).
    pub own_group: bool,
    /// The command's process runs on this until it calls `execve` (see [`start_command`]).
    #[cfg(target_arch = "x86_64")]
    command_stack: sys::Stack,
}

const SH: &CStr = c"/bin/sh";

/// Enough for `exec_command`: a few system calls, no allocation.
#[cfg(target_arch = "x86_64")]
const STACK: usize = 64 * 1024;

impl Prepared {
    pub fn new(
        candidates: Vec<CString>,
        argv: Vec<CString>,
        envp: Vec<CString>,
        shared: Shared,
        cgroup_path: Option<CString>,
    ) -> std::io::Result<Prepared> {
        let ptrs = |v: &[CString]| {
            v.iter()
                .map(|s| s.as_ptr())
                .chain(std::iter::once(std::ptr::null()))
                .collect::<Vec<_>>()
        };
        let sh_argv = [SH.as_ptr(), std::ptr::null()]
            .into_iter()
            .chain(argv[1..].iter().map(|a| a.as_ptr()))
            .chain(std::iter::once(std::ptr::null()))
            .map(Cell::new)
            .collect();
        let mut guarded = crate::signals::FORWARDED.to_vec();
        guarded.extend([libc::SIGCHLD, DEATH_SIGNAL, crate::signals::WAKEUP]);
        Ok(Prepared {
            argv_ptrs: ptrs(&argv),
            envp_ptrs: ptrs(&envp),
            sh_argv,
            candidates,
            argv,
            envp,
            child_mask: SigSet::of(&[]),
            guard_set: SigSet::of(&guarded),
            parent: sys::getpid(),
            shared,
            cgroup_path,
            stdio: [UNTOUCHED; 2],
            stdio_readers: [UNTOUCHED; 2],
            report_fd: -1,
            own_group: false,
            #[cfg(target_arch = "x86_64")]
            command_stack: sys::Stack::new(STACK)?,
        })
    }
}

fn kill_by_ns(p: &Prepared) -> u64 {
    p.shared.kill_by().as_duration().as_nanos() as u64
}

/// Start the guard: returns its pid, or `-errno`.
///
/// The guard is a `fork()` (the raw system call: no atfork handlers run, no lock is taken), so it
/// has an address space of its own: the kernel's OOM killer, which SIGKILLs the process it picks
/// *and every process sharing that process's memory*, cannot take the guard along with cronlock.
/// The copy costs little: cronlock's anonymous memory is small, and file-backed pages are not
/// copied at all (`docs/benchmarks.md`, "where the time goes").
///
/// # Safety
/// Call from cronlock's main thread, which lives as long as cronlock (`PR_SET_PDEATHSIG` fires
/// when the thread that forked ends). The guard runs on its own copy of `p`, so cronlock may drop
/// `p` as soon as this returns.
pub unsafe fn start(p: &Prepared) -> isize {
    let pid = sys::fork();
    if pid == 0 {
        // SAFETY: we are the new guard, a single-threaded copy of cronlock; `run` makes raw
        // system calls only, so no lock another thread of cronlock held at the fork matters.
        unsafe { run(p) }
    }
    pid
}

/// The guard's body. Never returns.
///
/// # Safety
/// Call only in the guard's own process, started by [`start`].
unsafe fn run(p: &Prepared) -> ! {
    // A fault handler (cronlock installs none, a library might) would run on cronlock's
    // thread-local storage: a fault here must simply end the guard.
    for sig in [libc::SIGSEGV, libc::SIGBUS] {
        sys::default_action(sig);
    }
    sys::setpgid(0, 0);
    sys::prctl(libc::PR_SET_PDEATHSIG, DEATH_SIGNAL as libc::c_ulong);
    // Orphaned descendants (setsid, daemons, timeout(1)'s own group) come back to us.
    sys::prctl(libc::PR_SET_CHILD_SUBREAPER, 1);
    // So `ps -o comm` tells the guard from cronlock.
    sys::set_name(c"cronlock-guard");
    sys::sigprocmask(libc::SIG_BLOCK, &p.guard_set);
    if sys::getppid() != p.parent {
        // cronlock died before the death signal was armed: run nothing.
        sys::exit(crate::exit::FAILURE as libc::c_int);
    }
    let cgroup = p
        .cgroup_path
        .as_deref()
        .and_then(|path| make_cgroup(p, path));
    // SAFETY: we are the guard, and `p` outlives us.
    let pid = unsafe { start_command(p, cgroup) };
    if pid < 0 {
        report(p.report_fd, REPORT_NO_PROCESS + (-pid as i32));
        sys::exit(crate::exit::CANNOT_EXECUTE as libc::c_int);
    }
    let pid = pid as libc::pid_t;
    // For cronlock, which notices the command's end itself when this guard cannot (stopped).
    p.shared.set_command(pid);
    sys::close(p.report_fd);
    // Only the command writes there: the pipes end when the job does; and only cronlock reads.
    for fd in p
        .stdio
        .into_iter()
        .chain(p.stdio_readers)
        .filter(|&fd| fd != UNTOUCHED)
    {
        sys::close(fd);
    }
    loop {
        let now = sys::boottime_ns();
        let kill_by = kill_by_ns(p);
        if now >= kill_by {
            // cronlock did not move the deadline on in time: frozen, starved or stuck.
            p.shared.set(shared::GUARD_ENFORCED);
            end_everything(p, cgroup);
        }
        let sig = sys::sigtimedwait(&p.guard_set, kill_by - now);
        if sys::getppid() != p.parent {
            // cronlock is gone: nothing renews the lock any more. Stop the whole job now.
            end_everything(p, cgroup);
        }
        if sig == libc::SIGCHLD as isize {
            let mut status = 0;
            loop {
                let r = sys::wait4(-1, Some(&mut status), libc::WNOHANG);
                if r == pid as isize {
                    // Nothing of the job may outlive the command: the lock is released next.
                    kill_descendants(cgroup.map(|cg| cg.kill));
                    p.shared.end(status);
                    sys::exit(0);
                }
                if r <= 0 {
                    break;
                }
            }
        } else if sig > 0 && sig != DEATH_SIGNAL as isize && sig != crate::signals::WAKEUP as isize
        {
            // cronlock sent this to the whole group, so it reached the command already;
            // children that left the group (`timeout(1)` makes its own) get it from us.
            relay_to_escaped_children(sig as libc::c_int);
        }
    }
}

/// Start the command with no guard, straight into the cgroup open at `dir` (a replica's run,
/// whose starter guards the cgroup: `command::oversight`), leading a process group of its own;
/// its pid, or `-errno`.
///
/// # Safety
/// `p.own_group` is set, and `p` outlives the call; the calling thread waits until the command's
/// process has called `execve` or exited (`CLONE_VFORK`), so it must not be one another thread
/// waits on meanwhile.
pub unsafe fn start_alone(p: &Prepared, dir: RawFd) -> isize {
    let cgroup = CgroupFds { dir, kill: -1 };
    // SAFETY: as the caller promised; `exec_command` makes raw system calls only.
    unsafe { start_command(p, Some(cgroup)) }
}

/// Start the command's process, inside the job's cgroup when there is one, and return its pid
/// (or `-errno`).
///
/// Like `posix_spawn`, the new process shares the guard's memory (`CLONE_VM`) and the guard waits
/// until it has called `execve` or exited (`CLONE_VFORK`): no page tables are copied. It runs on a
/// stack of its own, prepared before the guard started. `CLONE_INTO_CGROUP` (Linux 5.7) puts
/// it in the cgroup from its first instruction, without the migration a write to `cgroup.procs`
/// would cost (an RCU grace period: milliseconds). Older kernels get a plain `fork()`.
///
/// # Safety
/// Call only in the guard; `p` outlives the command's use of it (the guard sleeps until exec).
unsafe fn start_command(p: &Prepared, cgroup: Option<CgroupFds>) -> isize {
    #[cfg(target_arch = "x86_64")]
    {
        let mut job = Exec {
            p,
            cgroup,
            joined: false,
        };
        let sys::Region {
            lowest: stack,
            size: stack_size,
        } = p.command_stack.region();
        let mut args = sys::CloneArgs {
            flags: sys::CLONE_VM | sys::CLONE_VFORK,
            exit_signal: libc::SIGCHLD as u64,
            stack,
            stack_size,
            ..sys::CloneArgs::default()
        };
        if let Some(cg) = cgroup {
            args.flags |= sys::CLONE_INTO_CGROUP;
            args.cgroup = cg.dir as u64;
            job.joined = true;
        }
        for _ in 0..2 {
            // SAFETY: `args` names a stack of ours that nothing else uses, `exec_entry` never
            // returns, and `job` outlives the child's use of it (we sleep until it execs).
            let pid = unsafe { sys::clone3_run(&args, exec_entry, (&job as *const Exec).cast()) };
            if pid > 0 {
                return pid;
            }
            if args.flags & sys::CLONE_INTO_CGROUP == 0 {
                break;
            }
            // Refused into the cgroup (before 5.7): the child joins by migrating.
            args.flags &= !sys::CLONE_INTO_CGROUP;
            args.cgroup = 0;
            job.joined = false;
        }
    }
    let pid = sys::fork();
    if pid == 0 {
        // SAFETY: we are the command's process, a copy of the guard.
        unsafe { exec_command(p, cgroup, false) };
    }
    pid
}

/// What the command's process gets from [`start_command`].
#[cfg(target_arch = "x86_64")]
struct Exec<'a> {
    p: &'a Prepared,
    cgroup: Option<CgroupFds>,
    /// Created inside the cgroup already.
    joined: bool,
}

/// The command's process, started by [`sys::clone3_run`] on its own stack.
#[cfg(target_arch = "x86_64")]
unsafe extern "C" fn exec_entry(arg: *const libc::c_void) -> ! {
    // SAFETY: `arg` is the `Exec` that start_command keeps alive until we exec or exit.
    unsafe {
        let job = &*(arg as *const Exec);
        exec_command(job.p, job.cgroup, job.joined)
    }
}

/// Make the job's cgroup at `path` and open it; on failure, say why in the shared page (for `-v`)
/// and leave nothing behind. The guard makes it, not cronlock, so that it only ever exists while a
/// guard is there to remove it: cronlock may be SIGKILLed at any moment. One that exists already
/// is not ours (the name is unique to this run), so it is never taken over: no cgroup.
fn make_cgroup(p: &Prepared, path: &CStr) -> Option<CgroupFds> {
    let made = sys::mkdir(path);
    if made < 0 {
        p.shared.cgroup_failed(-made as i32);
        return None;
    }
    let dir = sys::openat(libc::AT_FDCWD, path, libc::O_RDONLY | libc::O_DIRECTORY);
    let kill = if dir < 0 {
        dir
    } else {
        sys::openat(dir as libc::c_int, c"cgroup.kill", libc::O_WRONLY)
    };
    if kill < 0 {
        if dir >= 0 {
            sys::close(dir as libc::c_int);
        }
        sys::rmdir(path);
        p.shared.cgroup_failed(-kill as i32);
        return None;
    }
    p.shared.set(shared::CGROUP_MADE);
    Some(CgroupFds {
        dir: dir as libc::c_int,
        kill: kill as libc::c_int,
    })
}

/// Kill the whole job and exit: the lock can no longer protect it.
fn end_everything(p: &Prepared, cgroup: Option<CgroupFds>) -> ! {
    kill_descendants(cgroup.map(|cg| cg.kill));
    // cronlock may be gone for good: leave no empty cgroup behind (if it is only frozen, it
    // finds the cgroup removed when it wakes up).
    if let Some(path) = p.cgroup_path.as_deref().filter(|_| cgroup.is_some()) {
        for _ in 0..100 {
            if sys::rmdir(path) != -(libc::EBUSY as isize) {
                break;
            }
            // Killed processes still on their way out.
            sys::nanosleep(1_000_000);
        }
    }
    // Whatever is left of our group (only the guard itself, normally).
    sys::kill(0, libc::SIGKILL);
    sys::exit(crate::exit::LOCK_LOST as libc::c_int);
}

/// In the command's process: join the job's cgroup, restore what cronlock changed, check the
/// deadline, then exec like `execvp` (including `/bin/sh` for a file without `#!`).
///
/// # Safety
/// Call only in the command's process, started by [`start_command`].
unsafe fn exec_command(p: &Prepared, cgroup: Option<CgroupFds>, joined: bool) -> ! {
    // If the guard is killed alone, the command must not run on without it (nor without the
    // run that started it, when no guard did).
    sys::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
    if p.own_group {
        sys::setpgid(0, 0);
    }
    let mut contained = joined;
    if let Some(cg) = cgroup {
        if !joined {
            let procs = sys::openat(cg.dir, c"cgroup.procs", libc::O_WRONLY);
            if procs >= 0 {
                contained = sys::write(procs as libc::c_int, b"0") == 1;
                sys::close(procs as libc::c_int);
            }
        }
        if contained {
            p.shared.set(shared::CGROUP_JOINED);
        }
    }
    if p.own_group && !contained {
        // Nothing independent could stop the command outside its cgroup: it does not run.
        report(p.report_fd, REPORT_NOT_CONTAINED);
        sys::exit(crate::exit::FAILURE as libc::c_int);
    }
    for (fd, target) in p
        .stdio
        .into_iter()
        .zip([libc::STDOUT_FILENO, libc::STDERR_FILENO])
    {
        if fd != UNTOUCHED {
            sys::dup2(fd, target);
        }
    }
    // cronlock ignores SIGPIPE (see `start`); commands expect the default. No fault handler
    // may run here either, on memory shared with cronlock, before `execve`.
    for sig in [libc::SIGPIPE, libc::SIGSEGV, libc::SIGBUS] {
        sys::default_action(sig);
    }
    sys::sigprocmask(libc::SIG_SETMASK, &p.child_mask);
    let mut saw_eacces = false;
    let mut err = libc::ENOENT;
    for path in &p.candidates {
        // The last moment to check: the lock must still be valid when the command starts.
        if sys::boottime_ns() >= kill_by_ns(p) {
            p.shared.set(shared::TOO_LATE);
            report(p.report_fd, REPORT_TOO_LATE);
            sys::exit(crate::exit::LOCK_LOST as libc::c_int);
        }
        // SAFETY: argv and envp are null-terminated arrays of the strings in `p`.
        let e = -unsafe { sys::execve(path, p.argv_ptrs.as_ptr(), p.envp_ptrs.as_ptr()) } as i32;
        match e {
            libc::ENOEXEC => {
                // A script without `#!`: run it with /bin/sh, as execvp, env(1) and tini do.
                p.sh_argv[1].set(path.as_ptr());
                let argv = p.sh_argv.as_ptr().cast();
                // SAFETY: as above; sh_argv is null-terminated and its slots point into `p`.
                err = -unsafe { sys::execve(SH, argv, p.envp_ptrs.as_ptr()) } as i32;
                break;
            }
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
    report(p.report_fd, err);
    let code = if err == libc::ENOENT {
        crate::exit::NOT_FOUND
    } else {
        crate::exit::CANNOT_EXECUTE
    };
    sys::exit(code as libc::c_int);
}

fn report(fd: libc::c_int, err: i32) {
    sys::write(fd, &err.to_ne_bytes());
}

/// The starter of a `--crontab` replica's runs: die with SIGKILL when the replica dies. Called
/// first thing in the starter (the replica spawns it without a `pre_exec` hook, so its spawn is a
/// `posix_spawn`, not a fork of the whole replica), and the replica spawns it from its main
/// thread, which lives as long as the replica (`PR_SET_PDEATHSIG` fires when the spawning thread
/// ends).
pub fn die_with_parent() {
    sys::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
}
