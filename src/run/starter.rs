//! The starter: the small process a replica (`--crontab`) starts its runs from. The replica
//! spawns it at its first run (cronlock itself, named [`crate::starting::STARTER_ARG0`]), tied to it (`PR_SET_PDEATHSIG`); for
//! each won claim it asks `start` on their link ([`crate::starting`]), with the run's
//! channel, stdout and stderr. The starter forks, and the child *is* the run: the same steps a
//! run makes ([`crate::run::run_job`], with the reports), from the configuration the job's
//! arguments resolved to, resolved once per starter and kept. No `execve` of cronlock, no
//! command-line parsing per run, and a fork of a process of a few MiB with one thread, not of
//! the replica with its threads and table.
//!
//! Its one thread is what makes the fork sound (a lock held by another thread would stay held in
//! the child): the starter forks only while it has one (a job's resolution runs on a thread that
//! is joined first, and is checked to start no other), and says its rare failures on stderr
//! itself (the log has a writer thread). The child is not tied to the starter but to the
//! replica, through its channel: a replica SIGKILLed takes the starter with it, and closes every
//! run's channel, and each run then stops its command and gives its lock back
//! ([`crate::handover`]); a starter that dies alone (killed, or replaced when a start went
//! unanswered) leaves its runs going.
//!
//! It answers each `start` with `started` (the pid) or `refused`, and says `exited` with each
//! run's wait status. At end of file (the replica is done, or let it go idle) it waits for the
//! runs it has left, then exits.

use std::collections::HashMap;
use std::os::fd::{AsFd, IntoRawFd, OwnedFd};
use std::sync::Arc;

use anyhow::{anyhow, bail, Result};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{fork, ForkResult};

use crate::config::RunConfig;
use crate::exit::Exit;
use crate::log::{LogFormat, Verbosity};
use crate::starting::message::StarterMessage;
use crate::starting::{self, Received, StarterLink};

/// At most this many jobs' resolutions are kept (all are dropped when it is reached).
const KEPT_MAX: usize = 4096;

/// A job's run as its arguments resolved: what the child runs, and how it logs.
#[derive(Clone)]
pub struct Resolved {
    pub config: RunConfig,
    pub verbosity: Verbosity,
    pub format: LogFormat,
}

/// What the starter is given by `lib.rs`: how a job's run arguments resolve (the command line's
/// own parsing), and how a resolved run is carried out (in the forked child, with its reports).
pub struct StarterHooks<'a> {
    pub resolve: &'a (dyn Fn(&[String]) -> Result<Resolved> + Sync),
    pub run: &'a dyn Fn(&Resolved) -> Exit,
}

/// Serve the replica until it closes the link and every run ended (in the starter), or carry out
/// one run (in a forked child): the exit status of either.
pub fn serve(hooks: &StarterHooks<'_>) -> Exit {
    crate::command::guard::die_with_parent();
    // Started as `/proc/self/exe` (the replica's own image), it would show as `exe`: its runs
    // inherit the name, and `ps` should say what they are.
    let _ = nix::sys::prctl::set_name(c"cronlock");
    crate::memory::for_forking();
    // What every run would otherwise look up for itself, found once before any fork.
    crate::command::cgroup::find_own();
    crate::host::hostname();
    match serve_runs(hooks.resolve) {
        Ok(Served::Done) => Exit::Success,
        Ok(Served::Run(child)) => child.run(hooks.run),
        Err(e) => {
            eprintln!("cronlock: the starter of the replica's runs: {e:#}");
            Exit::Failure
        }
    }
}

/// How [`serve_runs`] ended: the starter is done, or this process is a forked run.
enum Served {
    Done,
    Run(Box<Forked>),
}

/// A forked run, before it is one: its job's resolution, its command's crontab variables, and
/// its descriptors (channel, stdout, stderr).
struct Forked {
    resolved: Arc<Resolved>,
    env: Vec<crate::starting::message::Variable>,
    fds: Vec<OwnedFd>,
}

/// The starter's state between messages.
struct StarterState<'a> {
    link: StarterLink,
    resolve: &'a (dyn Fn(&[String]) -> Result<Resolved> + Sync),
    kept: HashMap<Vec<String>, Arc<Resolved>>,
    /// Runs forked and not yet reaped.
    running: usize,
}

fn serve_runs(resolve: &(dyn Fn(&[String]) -> Result<Resolved> + Sync)) -> Result<Served> {
    let link = StarterLink::adopt(starting::take_stdin()?)?;
    let mut mask = SigSet::empty();
    mask.add(Signal::SIGCHLD);
    let ended = SignalFd::with_flags(&mask, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)
        .map_err(|e| anyhow!("cannot watch for ended runs: {e}"))?;
    let mut s = StarterState {
        link,
        resolve,
        kept: HashMap::new(),
        running: 0,
    };
    let mut open = true;
    loop {
        if !open && s.running == 0 {
            return Ok(Served::Done);
        }
        // Wakes only for a message, the link's end, or an ended run: nothing polls.
        let mut fds = vec![PollFd::new(ended.as_fd(), PollFlags::POLLIN)];
        if open {
            fds.push(PollFd::new(s.link.as_fd(), PollFlags::POLLIN));
        }
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => bail!("cannot wait for the replica: {e}"),
        }
        let message = fds
            .get(1)
            .and_then(PollFd::revents)
            .is_some_and(|r| !r.is_empty());
        drop(fds);
        while let Ok(Some(_)) = ended.read_signal() {}
        s.reap(open);
        if !message {
            continue;
        }
        match s.link.receive()? {
            None => open = false,
            Some(Received {
                message: StarterMessage::Start { id, key, args, env },
                fds,
            }) => {
                if let Some(forked) = s.start(id, &key, args, env, fds)? {
                    return Ok(Served::Run(forked));
                }
            }
            Some(_) => bail!("the replica sent a message that is not 'start'"),
        }
    }
}

impl StarterState<'_> {
    /// Reap every run that ended, and say so while the replica listens.
    fn reap(&mut self, open: bool) {
        while let Ok(status) = waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            let (pid, raw) = match status {
                WaitStatus::Exited(pid, code) => (pid, (code & 0xff) << 8),
                WaitStatus::Signaled(pid, sig, core) => {
                    (pid, sig as i32 | if core { 0x80 } else { 0 })
                }
                WaitStatus::StillAlive => return,
                _ => continue,
            };
            self.running = self.running.saturating_sub(1);
            if open {
                let said = StarterMessage::Exited {
                    pid: pid.as_raw() as u32,
                    status: raw,
                };
                let _ = self.link.send(&said, &[]);
            }
        }
    }

    /// Start request `id`: fork the run (returned in the child), or say why not.
    fn start(
        &mut self,
        id: u64,
        key: &str,
        args: Vec<String>,
        env: Vec<crate::starting::message::Variable>,
        fds: Vec<OwnedFd>,
    ) -> Result<Option<Box<Forked>>> {
        let resolved = match self.resolved(args) {
            Ok(r) => r,
            Err(e) => return self.refuse(id, &format!("{key}: {e:#}")).map(|_| None),
        };
        if fds.len() != 3 {
            return self
                .refuse(id, "a start request without its three descriptors")
                .map(|_| None);
        }
        // SAFETY: this process has one thread here (a resolution's thread is joined, and checked
        // to have started no other), so the child starts with no lock held by a thread it lacks.
        match unsafe { fork() } {
            Ok(ForkResult::Child) => {
                // Left as it is: freeing it would write to pages the child shares with the
                // starter until then, and each would be copied.
                std::mem::forget(std::mem::take(&mut self.kept));
                Ok(Some(Box::new(Forked { resolved, env, fds })))
            }
            Ok(ForkResult::Parent { child }) => {
                self.running += 1;
                let started = StarterMessage::Started {
                    id,
                    pid: child.as_raw() as u32,
                };
                self.link.send(&started, &[])?;
                Ok(None)
            }
            Err(e) => self.refuse(id, &format!("cannot fork: {e}")).map(|_| None),
        }
    }

    fn refuse(&self, id: u64, why: &str) -> Result<()> {
        let refused = StarterMessage::Refused {
            id,
            why: why.to_string(),
        };
        self.link.send(&refused, &[])
    }

    /// The job's run as its arguments resolve, resolved once. The resolution runs on a thread
    /// of its own, joined before anything forks: glibc gives that thread its own arena, so the
    /// parser's garbage is not scattered through the heap the runs allocate from (each page of
    /// it a child wrote to would be copied).
    fn resolved(&mut self, args: Vec<String>) -> Result<Arc<Resolved>> {
        if let Some(r) = self.kept.get(&args) {
            return Ok(r.clone());
        }
        let resolve = self.resolve;
        let r = std::thread::scope(|scope| {
            let resolving = std::thread::Builder::new()
                .name("resolve".into())
                .spawn_scoped(scope, || {
                    let r = resolve(&args).map(Arc::new);
                    // Besides this one, nothing else may have been started.
                    let threads = std::fs::read_dir("/proc/self/task").map_or(2, |d| d.count());
                    if threads > 2 {
                        bail!("resolving a job started a thread; the starter cannot fork safely");
                    }
                    r
                })
                .map_err(|e| anyhow!("cannot start a thread: {e}"))?;
            resolving
                .join()
                .map_err(|_| anyhow!("resolving the job's run failed"))?
        })?;
        if self.kept.len() >= KEPT_MAX {
            self.kept.clear();
        }
        self.kept.insert(args, r.clone());
        Ok(r)
    }
}

impl Forked {
    /// Become the run: its stdout and stderr the replica's pipes, its command's crontab variables
    /// set, handed its channel; then the run's own steps. It is not tied to the starter: it
    /// follows its replica through the channel (a starter replaced for a slow start, or killed,
    /// leaves the runs it forked going).
    fn run(self, run: &dyn Fn(&Resolved) -> Exit) -> Exit {
        let mut fds = self.fds.into_iter();
        let (Some(channel), Some(out), Some(err)) = (fds.next(), fds.next(), fds.next()) else {
            return Exit::Failure;
        };
        if nix::unistd::dup2_stdout(&out).is_err() || nix::unistd::dup2_stderr(&err).is_err() {
            return Exit::Failure;
        }
        drop((out, err));
        for crate::starting::message::Variable { name, value } in &self.env {
            // (One thread: nothing reads the environment meanwhile.)
            std::env::set_var(name, value);
        }
        let mut resolved = (*self.resolved).clone();
        resolved.config.handover = Some(channel.into_raw_fd());
        let exit = run(&resolved);
        // Ends here, its log flushed by the run: what it would free on the way out lies in
        // pages it shares with the starter, and each one written to would be copied first.
        std::process::exit(exit.code().into())
    }
}
