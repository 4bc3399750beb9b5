//! Raw Linux system calls for the [guard](crate::command::guard) and for the command's process before
//! `execve`.
//!
//! The guard is a `fork()` of cronlock, which may have other threads (the log writer, a ping):
//! only the forking thread is copied, and a lock another thread held stays held in the copy, so
//! the guard must not take one (no allocation, no libc function that may lock). The command's
//! process runs in the guard's address space until `execve` (`clone3(CLONE_VM|CLONE_VFORK)`, as
//! `posix_spawn` does), sharing its memory and the thread-local storage of the guard's thread,
//! `errno` included. So these functions make the system call themselves and hand back the kernel's
//! answer: a value, or `-errno`. They allocate nothing, take no locks, keep no state and cannot
//! panic.
//!
//! Why `clone3(CLONE_INTO_CGROUP)` rather than a `fork()` that joins the cgroup through
//! `cgroup.procs`: a migration into a cgroup may wait for an RCU grace period, which makes the
//! slowest runs several times slower; a process born in its cgroup never migrates
//! (`docs/benchmarks.md` has the figures).
//!
//! On x86_64 this is one `syscall` instruction. Elsewhere libc's `syscall()` is used and its
//! `errno` read back, and the command's process is a plain `fork()` of the guard.

use std::ffi::CStr;

use crate::signals::SigSet;

/// The kernel's `sigset_t` is 64 bits (glibc's is 1024, with the kernel's in its first word).
const KERNEL_SIGSET: usize = 8;

/// `syscall(nr, a...)`: the result, or `-errno`.
///
/// # Safety
/// The arguments must be what system call `nr` expects; pointers must be valid for it.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn syscall(nr: libc::c_long, a: [usize; 6]) -> isize {
    let ret: isize;
    // SAFETY: the `syscall` instruction clobbers rax (the result), rcx and r11 only; the caller
    // vouches for the arguments.
    unsafe {
        std::arch::asm!(
            "syscall",
            inlateout("rax") nr as isize => ret,
            in("rdi") a[0],
            in("rsi") a[1],
            in("rdx") a[2],
            in("r10") a[3],
            in("r8") a[4],
            in("r9") a[5],
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack, preserves_flags),
        );
    }
    ret
}

/// `syscall(nr, a...)`: the result, or `-errno`.
///
/// # Safety
/// As above; only where the caller's `errno` is its own (no `clone3` with `CLONE_VM` elsewhere).
#[cfg(not(target_arch = "x86_64"))]
unsafe fn syscall(nr: libc::c_long, a: [usize; 6]) -> isize {
    // SAFETY: the caller vouches for the arguments.
    let r = unsafe { libc::syscall(nr, a[0], a[1], a[2], a[3], a[4], a[5]) };
    if r == -1 {
        -(std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EINVAL) as isize)
    } else {
        r as isize
    }
}

/// A system call whose arguments are plain integers: it cannot touch our memory.
fn plain(nr: libc::c_long, a: [usize; 6]) -> isize {
    // SAFETY: no argument is a pointer.
    unsafe { syscall(nr, a) }
}

pub fn getpid() -> libc::pid_t {
    plain(libc::SYS_getpid, [0; 6]) as libc::pid_t
}

pub fn getppid() -> libc::pid_t {
    plain(libc::SYS_getppid, [0; 6]) as libc::pid_t
}

pub fn setpgid(pid: libc::pid_t, pgid: libc::pid_t) -> isize {
    plain(libc::SYS_setpgid, [pid as usize, pgid as usize, 0, 0, 0, 0])
}

pub fn getpgid(pid: libc::pid_t) -> isize {
    plain(libc::SYS_getpgid, [pid as usize, 0, 0, 0, 0, 0])
}

pub fn kill(pid: libc::pid_t, sig: libc::c_int) -> isize {
    plain(libc::SYS_kill, [pid as usize, sig as usize, 0, 0, 0, 0])
}

pub fn close(fd: libc::c_int) -> isize {
    plain(libc::SYS_close, [fd as usize, 0, 0, 0, 0, 0])
}

pub fn dup2(old: libc::c_int, new: libc::c_int) -> isize {
    if old == new {
        return new as isize;
    }
    plain(libc::SYS_dup3, [old as usize, new as usize, 0, 0, 0, 0])
}

/// How many bytes wait unread in the pipe `fd` is an end of (`FIONREAD`), or `-errno`.
pub fn unread(fd: libc::c_int) -> isize {
    let mut n: libc::c_int = 0;
    let at = &mut n as *mut libc::c_int as usize;
    // SAFETY: FIONREAD writes one int, to `n`, which lives through the call.
    let r = unsafe {
        syscall(
            libc::SYS_ioctl,
            [fd as usize, libc::FIONREAD as usize, at, 0, 0, 0],
        )
    };
    if r < 0 {
        r
    } else {
        n as isize
    }
}

/// `prctl` with an integer argument (`PR_SET_PDEATHSIG`, `PR_SET_CHILD_SUBREAPER`).
pub fn prctl(option: libc::c_int, arg: libc::c_ulong) -> isize {
    plain(libc::SYS_prctl, [option as usize, arg as usize, 0, 0, 0, 0])
}

/// `prctl(PR_SET_NAME)`: what `ps -o comm` shows.
pub fn set_name(name: &CStr) -> isize {
    let a = [
        libc::PR_SET_NAME as usize,
        name.as_ptr() as usize,
        0,
        0,
        0,
        0,
    ];
    // SAFETY: a valid NUL-terminated string; the kernel copies at most 16 bytes of it.
    unsafe { syscall(libc::SYS_prctl, a) }
}

/// `fork()`, as `clone(SIGCHLD)`: 0 in the child, which goes on with a copy of everything (libc's
/// `fork` would run atfork handlers and touch `errno`).
pub fn fork() -> isize {
    plain(libc::SYS_clone, [libc::SIGCHLD as usize, 0, 0, 0, 0, 0])
}

/// `exit_group`: ends the calling process (the guard is a thread group of its own).
pub fn exit(code: libc::c_int) -> ! {
    loop {
        plain(libc::SYS_exit_group, [code as usize, 0, 0, 0, 0, 0]);
    }
}

pub fn write(fd: libc::c_int, buf: &[u8]) -> isize {
    let a = [fd as usize, buf.as_ptr() as usize, buf.len(), 0, 0, 0];
    // SAFETY: the kernel reads at most `buf.len()` bytes of `buf`.
    unsafe { syscall(libc::SYS_write, a) }
}

pub fn read(fd: libc::c_int, buf: &mut [u8]) -> isize {
    let a = [fd as usize, buf.as_mut_ptr() as usize, buf.len(), 0, 0, 0];
    // SAFETY: the kernel writes at most `buf.len()` bytes into `buf`.
    unsafe { syscall(libc::SYS_read, a) }
}

/// `openat(dir, path, flags | O_CLOEXEC)`.
pub fn openat(dir: libc::c_int, path: &CStr, flags: libc::c_int) -> isize {
    let flags = flags | libc::O_CLOEXEC;
    let a = [
        dir as usize,
        path.as_ptr() as usize,
        flags as usize,
        0,
        0,
        0,
    ];
    // SAFETY: a valid NUL-terminated path; no file is created, so no mode is read.
    unsafe { syscall(libc::SYS_openat, a) }
}

/// `mkdir(path, 0777)` (less the umask), as `mkdirat(AT_FDCWD, ...)`.
pub fn mkdir(path: &CStr) -> isize {
    let a = [
        libc::AT_FDCWD as usize,
        path.as_ptr() as usize,
        0o777,
        0,
        0,
        0,
    ];
    // SAFETY: a valid NUL-terminated path.
    unsafe { syscall(libc::SYS_mkdirat, a) }
}

/// `rmdir(path)`, as `unlinkat(AT_FDCWD, path, AT_REMOVEDIR)`.
pub fn rmdir(path: &CStr) -> isize {
    let a = [
        libc::AT_FDCWD as usize,
        path.as_ptr() as usize,
        libc::AT_REMOVEDIR as usize,
        0,
        0,
        0,
    ];
    // SAFETY: a valid NUL-terminated path.
    unsafe { syscall(libc::SYS_unlinkat, a) }
}

/// `wait4(pid, status, options, NULL)`; `status` may be left out.
pub fn wait4(pid: libc::pid_t, status: Option<&mut libc::c_int>, options: libc::c_int) -> isize {
    let status = status.map_or(0, |s| s as *mut libc::c_int as usize);
    let a = [pid as usize, status, options as usize, 0, 0, 0];
    // SAFETY: `status` is null or a valid place for one int; no rusage is asked for.
    unsafe { syscall(libc::SYS_wait4, a) }
}

pub fn nanosleep(ns: u64) -> isize {
    let ts = timespec(ns);
    let a = [&ts as *const libc::timespec as usize, 0, 0, 0, 0, 0];
    // SAFETY: a valid timespec; no remainder is asked for.
    unsafe { syscall(libc::SYS_nanosleep, a) }
}

/// `CLOCK_BOOTTIME` in nanoseconds (the system call, not the vDSO: libc's is not ours to use).
pub fn boottime_ns() -> u64 {
    let mut ts = timespec(0);
    let a = [
        libc::CLOCK_BOOTTIME as usize,
        &mut ts as *mut libc::timespec as usize,
        0,
        0,
        0,
        0,
    ];
    // SAFETY: a valid out-pointer for one timespec.
    unsafe { syscall(libc::SYS_clock_gettime, a) };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

fn timespec(ns: u64) -> libc::timespec {
    libc::timespec {
        tv_sec: (ns / 1_000_000_000).min(i32::MAX as u64) as libc::time_t,
        tv_nsec: (ns % 1_000_000_000) as libc::c_long,
    }
}

/// `sigprocmask(how, set)`.
pub fn sigprocmask(how: libc::c_int, set: &SigSet) -> isize {
    let set = &set.0 as *const libc::sigset_t as usize;
    let a = [how as usize, set, 0, KERNEL_SIGSET, 0, 0];
    // SAFETY: glibc's sigset_t starts with the kernel's 64-bit set; no old set is asked for.
    unsafe { syscall(libc::SYS_rt_sigprocmask, a) }
}

/// `sigtimedwait(set, NULL, timeout)`: the signal taken, or `-EAGAIN` when the time ran out.
pub fn sigtimedwait(set: &SigSet, ns: u64) -> isize {
    let ts = timespec(ns);
    let set = &set.0 as *const libc::sigset_t as usize;
    let a = [
        set,
        0,
        &ts as *const libc::timespec as usize,
        KERNEL_SIGSET,
        0,
        0,
    ];
    // SAFETY: as in `sigprocmask`; a valid timespec; no siginfo is asked for.
    unsafe { syscall(libc::SYS_rt_sigtimedwait, a) }
}

/// Reset `sig` to its default action. (The handler table is the calling process's own copy: the
/// guard and the command are created without `CLONE_SIGHAND`.)
pub fn default_action(sig: libc::c_int) -> isize {
    // The kernel's `struct sigaction`: handler, flags, restorer, mask. SIG_DFL is 0.
    let action = [0usize; 4];
    let a = [
        sig as usize,
        action.as_ptr() as usize,
        0,
        KERNEL_SIGSET,
        0,
        0,
    ];
    // SAFETY: a valid kernel sigaction (all zero: SIG_DFL, no flags, empty mask).
    unsafe { syscall(libc::SYS_rt_sigaction, a) }
}

/// `execve(path, argv, envp)`: returns only on failure, with `-errno`.
///
/// # Safety
/// `argv` and `envp` must be null-terminated arrays of valid NUL-terminated strings.
pub unsafe fn execve(
    path: &CStr,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
) -> isize {
    let a = [
        path.as_ptr() as usize,
        argv as usize,
        envp as usize,
        0,
        0,
        0,
    ];
    // SAFETY: the caller vouches for argv and envp.
    unsafe { syscall(libc::SYS_execve, a) }
}

/// `struct clone_args` of `clone3(2)`, up to `cgroup` (`CLONE_ARGS_SIZE_VER2`).
#[repr(C)]
#[derive(Default)]
pub struct CloneArgs {
    pub flags: u64,
    pub pidfd: u64,
    pub child_tid: u64,
    pub parent_tid: u64,
    pub exit_signal: u64,
    pub stack: u64,
    pub stack_size: u64,
    pub tls: u64,
    pub set_tid: u64,
    pub set_tid_size: u64,
    pub cgroup: u64,
}

pub const CLONE_VM: u64 = libc::CLONE_VM as u64;
pub const CLONE_VFORK: u64 = libc::CLONE_VFORK as u64;
pub const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// `clone3(args)`, then `child(arg)` in the new process on the stack `args` gives it. Returns the
/// new pid, or `-errno`. A plain `syscall()` cannot do this: with `CLONE_VM` the child would
/// return through the parent's stack frames.
///
/// # Safety
/// `args.stack`/`args.stack_size` must describe memory only the child uses, `child` must never
/// return, and whatever `arg` points to must stay valid as long as the child uses it.
#[cfg(target_arch = "x86_64")]
pub unsafe fn clone3_run(
    args: &CloneArgs,
    child: unsafe extern "C" fn(*const libc::c_void) -> !,
    arg: *const libc::c_void,
) -> isize {
    let ret: isize;
    // SAFETY: the `syscall` instruction clobbers only rax, rcx and r11 in the parent. In the
    // child (rax == 0) the kernel has switched to the new stack, 16-byte aligned by [`Stack`];
    // it calls `child`, which never returns, so nothing after the call runs there.
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

/// A stack for a process started with `CLONE_VM`: an anonymous mapping with an inaccessible page
/// below it, so an overflow faults instead of writing over cronlock's heap. Unmapped on drop:
/// drop it only once nothing runs on it any more.
pub struct Stack {
    base: *mut libc::c_void,
    len: usize,
}

const PAGE: usize = 4096;

impl Stack {
    pub fn new(size: usize) -> std::io::Result<Stack> {
        let len = size + PAGE;
        // SAFETY: a new private anonymous mapping aliases nothing.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let stack = Stack { base, len };
        // SAFETY: the lowest page of the mapping we just made.
        if unsafe { libc::mprotect(base, PAGE, libc::PROT_NONE) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(stack)
    }

    /// What `clone3` wants (the top is page-aligned).
    pub fn region(&self) -> Region {
        Region {
            lowest: self.base as u64 + PAGE as u64,
            size: (self.len - PAGE) as u64,
        }
    }
}

/// A stack's usable part, as `clone3` takes it.
#[derive(Debug, Clone, Copy)]
pub struct Region {
    /// The lowest usable address.
    pub lowest: u64,
    pub size: u64,
}

impl Drop for Stack {
    fn drop(&mut self) {
        // SAFETY: our own mapping, which nothing runs on any more (see the type's comment).
        unsafe { libc::munmap(self.base, self.len) };
    }
}
