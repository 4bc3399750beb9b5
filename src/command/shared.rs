//! The page cronlock shares with its guard process: the kill-by time, and what the guard did.
//!
//! cronlock may be frozen (SIGSTOP, a debugger, a page-fault storm) while the command runs on. The
//! guard is an independent process, so cronlock publishes here, on `CLOCK_BOOTTIME`, the moment the
//! command must be gone (the lock's validity deadline minus the safety margin), moving it on with
//! every confirmed renewal. The guard kills the command by itself when that moment passes, and the
//! command's process checks it right before `execve`. The page is an anonymous shared mapping made
//! before the guard starts: the guard is a `fork()` with a copy of everything else, but this page
//! is the same memory in both processes, so both see the same atomics.

use std::io;
use std::num::NonZeroUsize;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use nix::sys::mman::{mmap_anonymous, MapFlags, ProtFlags};

use crate::clock::Instant;

/// The guard killed the command because the kill-by time passed.
pub const GUARD_ENFORCED: u32 = 1;
/// The command's process joined the job's cgroup before `execve`.
pub const CGROUP_JOINED: u32 = 2;
/// The command's process found the kill-by time passed and did not `execve`.
pub const TOO_LATE: u32 = 4;
/// The guard reaped the command and killed whatever it left behind; `status` is its wait status.
pub const ENDED: u32 = 8;
/// The guard made the job's cgroup (only then is it this run's to kill and remove).
pub const CGROUP_MADE: u32 = 16;

#[repr(C)]
#[derive(Debug)]
struct Page {
    /// Nanoseconds on `CLOCK_BOOTTIME`.
    kill_by_ns: AtomicU64,
    flags: AtomicU32,
    /// The command's wait status, once [`ENDED`] is set.
    status: AtomicI32,
    /// Why the guard could not make the job's cgroup (an errno; 0: it did, or did not try).
    cgroup_errno: AtomicI32,
    /// The command's pid, once the guard started it (0: not yet).
    command: AtomicI32,
}

/// A handle on the shared page. A run's mapping lives as long as its process (the guard may still
/// read it after cronlock's handle is gone); only a replica's starter unmaps the pages it made
/// for its runs, once each run is reaped ([`Shared::unmap`]).
#[derive(Debug, Clone, Copy)]
pub struct Shared {
    page: NonNull<Page>,
}

// SAFETY: the page holds only atomics, which are safe to use from any thread.
unsafe impl Send for Shared {}
// SAFETY: as above.
unsafe impl Sync for Shared {}

impl Shared {
    /// Map a fresh page; the kill-by time starts at `kill_by`.
    pub fn new(kill_by: Instant) -> io::Result<Shared> {
        let len = NonZeroUsize::new(std::mem::size_of::<Page>()).expect("non-empty page");
        // SAFETY: a new anonymous mapping aliases nothing; it is zero-filled, which is a valid
        // `Page` (atomics of 0).
        let ptr = unsafe {
            mmap_anonymous(
                None,
                len,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_SHARED,
            )
        }
        .map_err(io::Error::from)?;
        let shared = Shared { page: ptr.cast() };
        shared.set_kill_by(kill_by);
        Ok(shared)
    }

    /// Give the page back: a replica's starter maps one per run it forks, and unmaps it once the
    /// run is reaped (`command::oversight`).
    ///
    /// # Safety
    /// No handle on this page (a copy of this one) is used in this process afterwards.
    pub unsafe fn unmap(self) {
        let len = std::mem::size_of::<Page>();
        // SAFETY: the page was mapped by `new` with this length; the caller promises nothing of
        // this process uses it again.
        let _ = unsafe { nix::sys::mman::munmap(self.page.cast(), len) };
    }

    fn page(&self) -> &Page {
        // SAFETY: the mapping is valid and aligned (page-aligned); it is unmapped only by
        // `unmap`, whose caller uses no handle on it afterwards.
        unsafe { self.page.as_ref() }
    }

    pub fn set_kill_by(&self, t: Instant) {
        let ns = t.as_duration().as_nanos().min(u64::MAX as u128) as u64;
        self.page().kill_by_ns.store(ns, Ordering::SeqCst);
    }

    pub fn kill_by(&self) -> Instant {
        Instant::from_duration(Duration::from_nanos(
            self.page().kill_by_ns.load(Ordering::SeqCst),
        ))
    }

    pub fn set(&self, flag: u32) {
        self.page().flags.fetch_or(flag, Ordering::SeqCst);
    }

    pub fn has(&self, flag: u32) -> bool {
        self.page().flags.load(Ordering::SeqCst) & flag != 0
    }

    /// The guard's last word: the command ended with `status`, and nothing of the job is left.
    pub fn end(&self, status: i32) {
        self.page().status.store(status, Ordering::SeqCst);
        self.set(ENDED);
    }

    /// The guard could not make the job's cgroup: `errno` says why.
    pub fn cgroup_failed(&self, errno: i32) {
        self.page().cgroup_errno.store(errno, Ordering::SeqCst);
    }

    /// Why the guard could not make the job's cgroup, if it could not.
    pub fn cgroup_error(&self) -> Option<i32> {
        Some(self.page().cgroup_errno.load(Ordering::SeqCst)).filter(|&e| e != 0)
    }

    /// The guard started the command as `pid`.
    pub fn set_command(&self, pid: i32) {
        self.page().command.store(pid, Ordering::SeqCst);
    }

    /// The command's pid, once the guard started it.
    pub fn command(&self) -> Option<i32> {
        Some(self.page().command.load(Ordering::SeqCst)).filter(|&p| p > 0)
    }

    /// The command's wait status, if the guard handed it over.
    pub fn status(&self) -> Option<i32> {
        self.has(ENDED)
            .then(|| self.page().status.load(Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_across_fork() {
        let s = Shared::new(Instant::now()).unwrap();
        let t = Instant::now() + Duration::from_secs(5);
        // SAFETY: the child only touches atomics and calls _exit.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            s.set_kill_by(t);
            s.set(GUARD_ENFORCED);
            s.end(9);
            // SAFETY: leaving the forked child without running the parent's destructors.
            unsafe { libc::_exit(0) };
        }
        let mut status = 0;
        // SAFETY: reaping our own child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert_eq!(s.kill_by(), t);
        assert!(s.has(GUARD_ENFORCED));
        assert!(!s.has(CGROUP_JOINED));
        assert_eq!(s.status(), Some(9));
    }
}
