//! Every process cronlock starts, other than the command, and every wait for a child: the one
//! room where processes are made and reaped.
//!
//! cronlock makes three kinds of process, each the one way that is sound for its parent:
//! - a replica's helpers (its starter, its version probe) are spawned as [`Helper`]s, with
//!   std's `posix_spawn`: the replica has threads, and a fork of it would copy locks they hold;
//! - a starter's runs are forks of the starter without `execve` ([`fork_alone`]), sound because
//!   the starter has one thread, which [`fork_alone`] checks;
//! - a run's command is started behind its guard (`child.rs`, `guard.rs`), with raw system calls,
//!   or, for a replica's run, with no guard, straight into the cgroup its starter made and
//!   guards (`child::spawn_overseen`, `oversight.rs`).
//!
//! Every child is reaped here: [`reap_any`], [`reap`] and [`ended_any`] for those made by fork
//! (wait statuses as `waitpid` gives them), [`Helper::end_within`] and [`Helper::kill`] for the
//! helpers, each bounded.

use std::io;
use std::process::{Child, ChildStdout, Command, ExitStatus};
use std::time::Duration;

use crate::clock::Instant;

/// A child that ended and was reaped.
pub struct Reaped {
    pub pid: libc::pid_t,
    /// Its wait status, as `waitpid` gives it.
    pub status: libc::c_int,
}

/// Reap a child that ended, if one did; never waits.
pub fn reap_any() -> Option<Reaped> {
    let mut status = 0;
    // SAFETY: plain system call with a valid out-parameter; WNOHANG never blocks.
    let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
    (pid > 0).then_some(Reaped { pid, status })
}

/// The pid of a child that ended, if one did, left waitable (so its pid, and the process group
/// it leads, cannot be reused until it is reaped); never waits.
pub fn ended_any() -> Option<libc::pid_t> {
    // SAFETY: zeroed siginfo_t is a valid out-parameter for waitid.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer; WNOWAIT leaves the child waitable, WNOHANG never blocks.
    let rc = unsafe {
        libc::waitid(
            libc::P_ALL,
            0,
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        )
    };
    // SAFETY: si_pid is valid for SIGCHLD-style siginfo filled by waitid.
    let pid = unsafe { info.si_pid() };
    (rc == 0 && pid > 0).then_some(pid)
}

/// Reap `pid`, waiting until it ends: its wait status. Only for a child known to have ended,
/// or being killed.
pub fn reap(pid: libc::pid_t) -> libc::c_int {
    let mut status = 0;
    // SAFETY: reaping our own child, with a valid out-parameter.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    status
}

/// How long [`fork_alone`] waits for a thread that was joined to be gone.
const ALONE_WITHIN: Duration = Duration::from_millis(100);

/// Fork this process, which must have one thread: in the child, `Ok(None)`; in the parent, the
/// child's pid. A process seen to have another thread is refused: the child would inherit locks
/// that thread holds (the allocator's, stdio's), and nothing would ever release them. (Without
/// `/proc` the threads cannot be counted, and the caller's word is taken: the starter joins the
/// one thread it ever starts before it forks.)
pub fn fork_alone() -> io::Result<Option<libc::pid_t>> {
    let threads = || std::fs::read_dir("/proc/self/task").ok().map(|d| d.count());
    // A thread just joined may still be listed while it finishes exiting (its joiner is woken
    // before the kernel lets it go): looked at again for a short, bounded while.
    let deadline = Instant::now() + ALONE_WITHIN;
    let mut count = threads();
    while count.is_some_and(|n| n != 1) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
        count = threads();
    }
    if let Some(n) = count.filter(|n| *n != 1) {
        return Err(io::Error::other(format!(
            "cannot fork with {n} threads (one is needed)"
        )));
    }
    // SAFETY: this process has one thread (checked above; nothing here starts one), so the child
    // starts with no lock held by a thread it lacks; glibc's atfork handlers run.
    match unsafe { libc::fork() } {
        -1 => Err(io::Error::last_os_error()),
        0 => Ok(None),
        pid => Ok(Some(pid)),
    }
}

/// A helper process of a replica's (its starter, its version probe).
pub struct Helper {
    child: Child,
}

impl Helper {
    /// Spawn `command` with `posix_spawn` (std does when it has no `pre_exec` hook: the replica
    /// is never forked).
    pub fn spawn(command: &mut Command) -> io::Result<Helper> {
        command.spawn().map(|child| Helper { child })
    }

    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Whether it is still running (an ended one is reaped).
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Its standard output, when it was piped.
    pub fn take_stdout(&mut self) -> Option<ChildStdout> {
        self.child.stdout.take()
    }

    /// Wait at most `within` for it to end: its status; or, still running then, it is killed
    /// and reaped, and `None`.
    pub fn end_within(&mut self, within: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + within;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => return Some(status),
                // Bounded: a few milliseconds between looks, until the deadline.
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5))
                }
                _ => {
                    self.kill();
                    return None;
                }
            }
        }
    }

    /// Kill it (SIGKILL) and reap it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_helper_ends_within_its_bound_or_is_killed() {
        let mut quick = Helper::spawn(&mut Command::new("true")).unwrap();
        assert!(quick
            .end_within(Duration::from_secs(5))
            .is_some_and(|s| s.success()));
        let mut slow = Helper::spawn(Command::new("sleep").arg("30")).unwrap();
        assert!(slow.running());
        assert!(slow.end_within(Duration::from_millis(50)).is_none());
        assert!(!slow.running());
    }

    #[test]
    fn a_process_with_threads_is_not_forked() {
        // The test harness runs this on a thread of its own, beside its main thread.
        let refused = fork_alone().unwrap_err();
        assert!(
            refused.to_string().contains("threads (one is needed)"),
            "{refused}"
        );
    }
}
