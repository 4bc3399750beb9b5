//! A replica's runs have no guard process each: their starter guards every command they start.
//!
//! Before it forks a run, the starter maps the run's [shared page](crate::command::shared) and
//! makes the cgroup its command will run in ([`Overseer::prepare`]); the forked run inherits
//! both ([`RunGuard`]), starts its command straight into that cgroup (`clone3` with
//! `CLONE_INTO_CGROUP`, no process between them: `child::spawn_overseen`), and publishes its
//! kill-by time in the page as a guard's run does. The starter, one thread and small, is an
//! independent process with an address space of its own, so it outlives what takes a run
//! down (SIGKILL, the OOM killer) and is not frozen with it. It ends a run's command
//! (`cgroup.kill`, one write for the whole job) when:
//! - the kill-by time in the run's page passes without being moved on (the run frozen, starved
//!   or stuck): the page says the guard ended it, as a guard's does;
//! - the run is gone (the starter reaps it) while something of its job is left.
//!
//! The starter made the cgroup, so it removes it too, once the run is reaped: a cgroup never
//! exists without a process there to remove it. Where no cgroup can be made, the run forks a
//! guard of its own, as a command line's run does. The starter's own death asks each of its
//! runs to end (`PR_SET_PDEATHSIG`, set as the run starts): a run does not keep a command going
//! with nothing independent left to stop it.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::time::Duration;

use crate::clock::Instant;
use crate::command::cgroup;
use crate::command::shared::{self, Shared};

/// What a forked run gets from its starter: the page the starter reads its kill-by time from,
/// and the cgroup its command goes into (none where one cannot be made: the run's command then
/// starts behind a guard of its own).
pub struct RunGuard {
    pub shared: Shared,
    pub cgroup: Option<RunCgroup>,
    /// The starter's pid.
    pub starter: libc::pid_t,
}

impl RunGuard {
    /// Publish the run's first kill-by time (the page starts at never) and wake the starter, which
    /// sleeps until the earliest one it knows: a `SIGCHLD`, which its `signalfd` hears as it
    /// hears a run's end (a wake-up, nothing more). Later moves are only ever later, and need
    /// no wake-up: the starter reads the page again each time it wakes.
    pub fn publish_first(&self, kill_by: Instant) {
        self.shared.set_kill_by(kill_by);
        if nix::unistd::getppid().as_raw() == self.starter {
            let starter = nix::unistd::Pid::from_raw(self.starter);
            let _ = nix::sys::signal::kill(starter, nix::sys::signal::Signal::SIGCHLD);
        }
    }
}

/// The cgroup the starter made for a run's command: its directory, and that directory open
/// (for `CLONE_INTO_CGROUP`; close-on-exec).
pub struct RunCgroup {
    pub dir: PathBuf,
    pub fd: OwnedFd,
}

/// How long the starter waits, after killing what a run left in its cgroup, for the cgroup to
/// empty so it can remove it (a run killed mid-command): what is left is swept later
/// (`cgroup::sweep_own`).
const REMOVE_WITHIN: Duration = Duration::from_millis(100);

/// One run the starter forked and guards.
struct Overseen {
    shared: Shared,
    cgroup: Option<PathBuf>,
    /// Its command's cgroup was killed for its deadline.
    enforced: bool,
}

/// The starter's side: the runs it forked, each with its page and its command's cgroup.
#[derive(Default)]
pub struct Overseer {
    runs: HashMap<libc::pid_t, Overseen>,
    /// No cgroup could be made (said once by the run's `-v` line; the starter stops trying).
    no_cgroup: bool,
}

impl Overseer {
    /// Whether no run it forked is left.
    pub fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    /// The page and the cgroup for the run about to be forked. Its kill-by time starts at never:
    /// the run sets it once it holds the lock, before its command can start.
    pub fn prepare(&mut self) -> io::Result<RunGuard> {
        let shared = Shared::new(Instant::from_duration(Duration::from_nanos(u64::MAX)))?;
        let cgroup = if self.no_cgroup {
            None
        } else {
            let made = make_cgroup();
            self.no_cgroup = made.is_none();
            made
        };
        if cgroup.is_some() {
            shared.set(shared::CGROUP_MADE);
        }
        let starter = std::process::id() as libc::pid_t;
        Ok(RunGuard {
            shared,
            cgroup,
            starter,
        })
    }

    /// In the starter, once `pid` was forked with `guard`: guarded from now on. The starter's
    /// copy of the cgroup's descriptor is closed (the run has its own).
    pub fn forked(&mut self, pid: libc::pid_t, guard: RunGuard) {
        let RunGuard { shared, cgroup, .. } = guard;
        let overseen = Overseen {
            shared,
            cgroup: cgroup.map(|c| c.dir),
            enforced: false,
        };
        self.runs.insert(pid, overseen);
    }

    /// The fork failed: nothing of `guard` is left.
    pub fn abandon(guard: RunGuard) {
        let RunGuard { shared, cgroup, .. } = guard;
        if let Some(c) = cgroup {
            drop(c.fd);
            cgroup::remove_at(&c.dir, REMOVE_WITHIN);
        }
        // SAFETY: no run was forked with this page, and the starter drops its only handle here.
        unsafe { shared.unmap() };
    }

    /// The earliest kill-by time of a run whose command's cgroup was not killed yet.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.runs
            .values()
            .filter(|r| r.cgroup.is_some() && !r.enforced)
            .map(|r| r.shared.kill_by())
            .min()
    }

    /// Kill the command of every run whose kill-by time has passed by `now`; the page says the
    /// guard did (the run's supervision reports the lock lost).
    pub fn enforce(&mut self, now: Instant) {
        for run in self.runs.values_mut() {
            let Some(dir) = run.cgroup.as_deref() else {
                continue;
            };
            if run.enforced || now < run.shared.kill_by() {
                continue;
            }
            run.shared.set(shared::GUARD_ENFORCED);
            cgroup::kill_at(dir);
            run.enforced = true;
        }
    }

    /// `pid` was reaped: if it was a run, kill what its job left and remove its cgroup. Whether
    /// it was one of the runs (not an orphan that reached the starter).
    pub fn reaped(&mut self, pid: libc::pid_t) -> bool {
        let Some(run) = self.runs.remove(&pid) else {
            return false;
        };
        if let Some(dir) = run.cgroup.as_deref() {
            cgroup::kill_at(dir);
            cgroup::remove_at(dir, REMOVE_WITHIN);
        }
        // SAFETY: the run that shared this page is gone, and this was the starter's only handle.
        unsafe { run.shared.unmap() };
        true
    }
}

/// A new cgroup for a run's command under the starter's own, named so that no other run on the
/// machine can have it (whatever PID namespace each runs in), opened. `None` where none can be
/// made (no cgroup v2, not delegated, read-only).
fn make_cgroup() -> Option<RunCgroup> {
    let dir = cgroup::plan(&uuid::Uuid::new_v4().simple().to_string()).ok()?;
    std::fs::create_dir(&dir).ok()?;
    // Locked (shared) while it waits for its command: a sweep (`cgroup::sweep_own`, or a
    // command line's run beside it) takes an empty cgroup for an orphan, but never a locked one.
    // The lock goes with the last descriptor of this open directory: the run's, closed once the
    // command is inside.
    match File::open(&dir).and_then(|f| f.lock_shared().map(|_| f)) {
        Ok(f) => Some(RunCgroup { dir, fd: f.into() }),
        Err(_) => {
            cgroup::remove_at(&dir, REMOVE_WITHIN);
            None
        }
    }
}
