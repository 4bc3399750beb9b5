//! The guard: a small process between cronlock and the command that enforces the lock's deadline
//! even when cronlock cannot: when cronlock dies (SIGKILL, OOM) or is frozen (SIGSTOP, a debugger).
//!
//! `PR_SET_PDEATHSIG` reaches only a direct child, so with `sh -c 'a; b'` the real work would run on
//! without a lock. The guard is forked from cronlock's main thread (which lives as long as cronlock),
//! leads the command's process group, and is a child subreaper, so every descendant that is
//! orphaned (`setsid`, daemonizing, `timeout(1)`'s own group) comes back to it. It ends the whole
//! job — the job's cgroup when there is one (`cgroup.kill`), every descendant, the group — when:
//! - cronlock dies (the death signal);
//! - the kill-by time cronlock publishes in the [shared page](crate::shared) passes without being
//!   moved on by a confirmed renewal (cronlock frozen or starved).
//!
//! Otherwise it is transparent: it ignores signals cronlock sends to the group (they reach the
//! command directly), relays them to children that left the group, and ends exactly as the command
//! did, exit code or signal, after killing whatever the command left behind.
//!
//! It is a plain `fork()` without `exec`. Since cronlock may already run other threads when it
//! forks, everything here after `fork()` uses only async-signal-safe system calls on data prepared
//! beforehand: no allocation, no locks, no panics. The command's process is started from the guard
//! the way `posix_spawn` does it, sharing the guard's memory until `execve` ([`start_command`]).

use std::cell::Cell;
use std::ffi::CString;
use std::os::fd::RawFd;

use crate::shared::{self, Shared};
use crate::signals::SigSet;

/// Sent to the guard when cronlock dies. Not a signal cronlock forwards.
pub const DEATH_SIGNAL: libc::c_int = libc::SIGPWR;

/// How the guard reports an exec failure on the report pipe when the deadline had passed.
pub const REPORT_TOO_LATE: i32 = -1;

/// The job's cgroup, as file descriptors opened before the fork.
#[derive(Debug, Clone, Copy)]
pub struct CgroupFds {
    /// The cgroup's directory: the command is created inside it (`clone3(CLONE_INTO_CGROUP)`).
    pub dir: RawFd,
    /// `cgroup.procs`: where `clone3` is missing, the command's process writes `0` here to join
    /// before `execve` (a migration, which costs an RCU grace period: milliseconds).
    pub procs: RawFd,
    /// `cgroup.kill`: writing `1` kills every process in the cgroup.
    pub kill: RawFd,
}

/// Everything the guard and the command need, computed before `fork()`.
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
    pub cgroup: Option<CgroupFds>,
    /// With `--ping-body`: the pipes that replace the command's stdout and stderr.
    pub stdio: Option<[RawFd; 2]>,
    /// The command's process runs on this until it calls `execve` (see [`start_command`]).
    stack: Vec<u8>,
}

const SH: &std::ffi::CStr = c"/bin/sh";

impl Prepared {
    pub fn new(
        candidates: Vec<CString>,
        argv: Vec<CString>,
        envp: Vec<CString>,
        shared: Shared,
        cgroup: Option<CgroupFds>,
    ) -> Prepared {
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
        Prepared {
            argv_ptrs: ptrs(&argv),
            envp_ptrs: ptrs(&envp),
            sh_argv,
            candidates,
            argv,
            envp,
            child_mask: SigSet::of(&[]),
            guard_set: SigSet::of(&guarded),
            // SAFETY: getpid cannot fail.
            parent: unsafe { libc::getpid() },
            shared,
            cgroup,
            stdio: None,
            stack: vec![0; CHILD_STACK],
        }
    }

    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    /// The child's stack as `clone3` wants it: lowest address and size, the top 16-byte aligned.
    fn stack_region(&self) -> (u64, u64) {
        let base = self.stack.as_ptr() as u64;
        let top = (base + self.stack.len() as u64) & !15;
        (base, top - base)
    }
}

/// Enough for `exec_command`: a few system calls, no allocation.
const CHILD_STACK: usize = 64 * 1024;

fn errno() -> libc::c_int {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// `CLOCK_BOOTTIME` in nanoseconds, without the assertion of [`crate::clock::Instant::now`].
fn boottime_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer; clock_gettime is async-signal-safe.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn kill_by_ns(p: &Prepared) -> u64 {
    p.shared.kill_by().as_duration().as_nanos() as u64
}

/// The guard's body, run in the forked process. Never returns.
///
/// # Safety
/// Call only in a freshly forked child; `p` must have been built before the fork, `report_fd` is
/// the write end of a close-on-exec pipe on which exec failures are reported as an errno.
pub unsafe fn run(p: &Prepared, report_fd: libc::c_int) -> ! {
    // SAFETY: (the whole block) async-signal-safe calls on memory that was valid before the fork.
    unsafe {
        libc::setpgid(0, 0);
        libc::prctl(
            libc::PR_SET_PDEATHSIG,
            DEATH_SIGNAL as libc::c_ulong,
            0,
            0,
            0,
        );
        // Orphaned descendants (setsid, daemons, timeout(1)'s own group) come back to us.
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
        // So `ps -o comm` tells the guard from cronlock.
        libc::prctl(libc::PR_SET_NAME, c"cronlock-guard".as_ptr(), 0, 0, 0);
        libc::pthread_sigmask(libc::SIG_BLOCK, &p.guard_set.0, std::ptr::null_mut());
        if libc::getppid() != p.parent {
            // cronlock died before the death signal was armed: run nothing.
            libc::_exit(crate::exit::FAILURE as libc::c_int);
        }
        let pid = start_command(p, report_fd);
        if pid < 0 {
            report(report_fd, errno());
            libc::_exit(crate::exit::CANNOT_EXECUTE as libc::c_int);
        }
        libc::close(report_fd);
        if let Some(fds) = p.stdio {
            // Only the command writes there: the pipes end when the job does.
            fds.iter().for_each(|fd| {
                libc::close(*fd);
            });
        }
        loop {
            let now = boottime_ns();
            let kill_by = kill_by_ns(p);
            if now >= kill_by {
                // cronlock did not move the deadline on in time: frozen, starved or stuck.
                p.shared.set(shared::GUARD_ENFORCED);
                end_everything(p);
            }
            let left = kill_by - now;
            let ts = libc::timespec {
                tv_sec: (left / 1_000_000_000).min(i32::MAX as u64) as libc::time_t,
                tv_nsec: (left % 1_000_000_000) as libc::c_long,
            };
            let sig = libc::sigtimedwait(&p.guard_set.0, std::ptr::null_mut(), &ts);
            if libc::getppid() != p.parent {
                // cronlock is gone: nothing renews the lock any more. Stop the whole job now.
                end_everything(p);
            }
            if sig == libc::SIGCHLD {
                let mut status = 0;
                loop {
                    let r = libc::waitpid(-1, &mut status, libc::WNOHANG);
                    if r == pid {
                        // Nothing of the job may outlive the command: the lock is released next.
                        kill_descendants(p.cgroup);
                        end_like(status);
                    }
                    if r <= 0 {
                        break;
                    }
                }
            } else if sig > 0 && sig != DEATH_SIGNAL && sig != crate::signals::WAKEUP {
                // cronlock sent this to the whole group, so it reached the command already;
                // children that left the group (`timeout(1)` makes its own) get it from us.
                relay_to_escaped_children(sig);
            }
        }
    }
}

/// `struct clone_args` of `clone3(2)`, up to `cgroup` (`CLONE_ARGS_SIZE_VER2`).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// Start the command's process, inside the job's cgroup when there is one, and return its pid
/// (negative: it could not be created).
///
/// Like `posix_spawn`, the new process shares the guard's memory (`CLONE_VM`) and the guard waits
/// until it has called `execve` or exited (`CLONE_VFORK`): no page tables are copied. It runs on a
/// stack of its own, prepared before the guard was forked. `CLONE_INTO_CGROUP` (Linux 5.7) puts
/// it in the cgroup from its first instruction, without the migration a write to `cgroup.procs`
/// would cost (an RCU grace period: milliseconds). Older kernels get a plain `fork()`.
unsafe fn start_command(p: &Prepared, report_fd: libc::c_int) -> libc::pid_t {
    #[cfg(target_arch = "x86_64")]
    {
        let mut job = Exec {
            p,
            report_fd,
            joined: false,
        };
        let (stack, stack_size) = p.stack_region();
        let mut args = CloneArgs {
            flags: CLONE_VM | CLONE_VFORK,
            exit_signal: libc::SIGCHLD as u64,
            stack,
            stack_size,
            ..CloneArgs::default()
        };
        if let Some(cg) = p.cgroup {
            args.flags |= CLONE_INTO_CGROUP;
            args.cgroup = cg.dir as u64;
            job.joined = true;
        }
        for _ in 0..2 {
            // SAFETY: `args` names a stack of ours that nothing else uses, `exec_entry` never
            // returns, and `job` outlives the child's use of it (the guard sleeps until exec).
            let pid = unsafe { clone3_run(&args, exec_entry, (&job as *const Exec).cast()) };
            if pid > 0 {
                return pid as libc::pid_t;
            }
            if args.flags & CLONE_INTO_CGROUP == 0 {
                break;
            }
            // Refused into the cgroup (before 5.7): the child joins by migrating.
            args.flags &= !CLONE_INTO_CGROUP;
            args.cgroup = 0;
            job.joined = false;
        }
    }
    // SAFETY: fork in the single-threaded guard; the child only runs exec_command.
    unsafe {
        let pid = libc::fork();
        if pid == 0 {
            exec_command(p, report_fd);
        }
        pid
    }
}

/// What the command's process gets from [`start_command`].
struct Exec<'a> {
    p: &'a Prepared,
    report_fd: libc::c_int,
    /// Created inside the cgroup already.
    joined: bool,
}

/// The command's process, started by [`clone3_run`] on its own stack.
unsafe extern "C" fn exec_entry(arg: *const libc::c_void) -> ! {
    // SAFETY: `arg` is the `Exec` that start_command keeps alive until we exec or exit.
    unsafe {
        let job = &*(arg as *const Exec);
        if job.joined {
            job.p.shared.set(shared::CGROUP_JOINED);
        }
        exec_command(job.p, job.report_fd)
    }
}

const CLONE_VM: u64 = libc::CLONE_VM as u64;
const CLONE_VFORK: u64 = libc::CLONE_VFORK as u64;

/// `clone3(args)`, then `child(arg)` in the new process on the stack `args` gives it. Returns the
/// new pid, or `-errno`; touches neither `errno` nor the caller's stack in the child. A plain
/// `syscall()` cannot do this: with `CLONE_VM` the child would return through the parent's frames.
///
/// # Safety
/// `args.stack`/`args.stack_size` must describe memory only the child uses, and `child` must never
/// return.
#[cfg(target_arch = "x86_64")]
unsafe fn clone3_run(
    args: &CloneArgs,
    child: unsafe extern "C" fn(*const libc::c_void) -> !,
    arg: *const libc::c_void,
) -> i64 {
    let ret: i64;
    // SAFETY: the `syscall` instruction clobbers only rax, rcx and r11 in the parent. In the
    // child (rax == 0) the kernel has switched to the new stack, 16-byte aligned by
    // `stack_region`; it calls `child`, which never returns, so nothing after the call runs there.
    unsafe {
        std::arch::asm!(
            "syscall",
            "test rax, rax",
            "jnz 2f",
            "xor ebp, ebp",
            "mov rdi, r12",
            "call r13",
            "ud2",
            "2:",
            inlateout("rax") libc::SYS_clone3 => ret,
            in("rdi") args as *const CloneArgs,
            in("rsi") std::mem::size_of::<CloneArgs>(),
            in("r12") arg,
            in("r13") child,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    ret
}

/// Kill the whole job and exit: the lock can no longer protect it.
unsafe fn end_everything(p: &Prepared) -> ! {
    // SAFETY: (the whole block) async-signal-safe calls only.
    unsafe {
        kill_descendants(p.cgroup);
        // Whatever is left of our group (only the guard itself, normally).
        libc::kill(0, libc::SIGKILL);
        libc::_exit(crate::exit::LOCK_LOST as libc::c_int);
    }
}

/// Call `f` with the pid of each child of the calling thread, from `/proc/thread-self/children`.
/// Returns how many there were, or `None` when `/proc` cannot tell (not mounted: an empty root).
unsafe fn for_each_child(mut f: impl FnMut(libc::pid_t)) -> Option<usize> {
    // SAFETY: (the whole block) open/read/close on a stack buffer are async-signal-safe.
    unsafe {
        let fd = libc::open(
            c"/proc/thread-self/children".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        );
        if fd < 0 {
            return None;
        }
        let mut buf = [0u8; 512];
        let mut n = 0usize;
        let mut pid: libc::pid_t = 0;
        loop {
            let got = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
            if got <= 0 {
                break;
            }
            for &b in &buf[..got as usize] {
                if b.is_ascii_digit() {
                    pid = pid
                        .saturating_mul(10)
                        .saturating_add((b - b'0') as libc::pid_t);
                } else if pid > 0 {
                    f(pid);
                    n += 1;
                    pid = 0;
                }
            }
        }
        if pid > 0 {
            f(pid);
            n += 1;
        }
        libc::close(fd);
        Some(n)
    }
}

/// Kill every descendant of the calling thread: the job's cgroup at once when there is one, then
/// children one by one; as a subreaper, their orphaned children come back to us and are killed in
/// the next round. Bounded: a process stuck in the kernel cannot keep us here.
///
/// Async-signal-safe, so the guard may call it; cronlock's main thread uses it too, for orphans
/// that reached it after the guard died.
///
/// # Safety
/// Reaps any child of the caller with `waitpid(-1)`: call it only when no child's status matters.
pub unsafe fn kill_descendants(cgroup: Option<CgroupFds>) {
    // SAFETY: (the whole block) async-signal-safe calls on stack data.
    unsafe {
        if let Some(cg) = cgroup {
            libc::write(cg.kill, b"1".as_ptr().cast(), 1);
        }
        for _ in 0..2000 {
            while libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) > 0 {}
            match for_each_child(|pid| {
                libc::kill(pid, libc::SIGKILL);
            }) {
                Some(0) | None => return,
                Some(_) => {}
            }
            let ts = libc::timespec {
                tv_sec: 0,
                tv_nsec: 1_000_000,
            };
            libc::nanosleep(&ts, std::ptr::null_mut());
        }
    }
}

/// Send `sig` to our children outside our process group (it reached the group already).
unsafe fn relay_to_escaped_children(sig: libc::c_int) {
    // SAFETY: (the whole block) async-signal-safe calls only.
    unsafe {
        let ours = libc::getpgrp();
        for_each_child(|pid| {
            let group = libc::getpgid(pid);
            if group > 0 && group != ours {
                libc::kill(pid, sig);
                if !crate::signals::is_stop(sig) && sig != libc::SIGCONT {
                    libc::kill(pid, libc::SIGCONT);
                }
            }
        });
    }
}

/// Exit the way the command did, so cronlock sees the same status.
unsafe fn end_like(status: libc::c_int) -> ! {
    // SAFETY: (the whole block) async-signal-safe calls only.
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

/// In the command's process: join the job's cgroup, restore what cronlock changed, check the
/// deadline, then exec like `execvp` (including `/bin/sh` for a file without `#!`).
unsafe fn exec_command(p: &Prepared, report_fd: libc::c_int) -> ! {
    // SAFETY: (the whole block) async-signal-safe calls on memory prepared before fork.
    unsafe {
        // If the guard is killed alone, the command must not run on without it.
        libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGKILL as libc::c_ulong,
            0,
            0,
            0,
        );
        if let Some(cg) = p.cgroup {
            if !p.shared.has(shared::CGROUP_JOINED)
                && libc::write(cg.procs, b"0".as_ptr().cast(), 1) == 1
            {
                p.shared.set(shared::CGROUP_JOINED);
            }
        }
        if let Some([out, err]) = p.stdio {
            libc::dup2(out, libc::STDOUT_FILENO);
            libc::dup2(err, libc::STDERR_FILENO);
        }
        // Rust's runtime ignores SIGPIPE; commands expect the default. Its SIGSEGV/SIGBUS
        // handlers must not run here either, on memory shared with the guard, before `execve`.
        for sig in [libc::SIGPIPE, libc::SIGSEGV, libc::SIGBUS] {
            libc::signal(sig, libc::SIG_DFL);
        }
        libc::pthread_sigmask(libc::SIG_SETMASK, &p.child_mask.0, std::ptr::null_mut());
        let mut saw_eacces = false;
        let mut err = libc::ENOENT;
        for path in &p.candidates {
            // The last moment to check: the lock must still be valid when the command starts.
            if boottime_ns() >= kill_by_ns(p) {
                p.shared.set(shared::TOO_LATE);
                report(report_fd, REPORT_TOO_LATE);
                libc::_exit(crate::exit::LOCK_LOST as libc::c_int);
            }
            libc::execve(path.as_ptr(), p.argv_ptrs.as_ptr(), p.envp_ptrs.as_ptr());
            match errno() {
                libc::ENOEXEC => {
                    // A script without `#!`: run it with /bin/sh, as execvp, env(1) and tini do.
                    p.sh_argv[1].set(path.as_ptr());
                    libc::execve(SH.as_ptr(), p.sh_argv.as_ptr().cast(), p.envp_ptrs.as_ptr());
                    err = errno();
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
