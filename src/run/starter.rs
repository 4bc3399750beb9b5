//! The starter: the small process a replica (`--crontab`) starts its runs from. The replica
//! spawns it at its first run (cronlock itself, named [`crate::starting::STARTER_ARG0`]), tied to it (`PR_SET_PDEATHSIG`); for
//! each won claim it asks `start` on their link ([`crate::starting`]), with the job's run as the
//! replica resolved it ([`crate::config::JobRun`]) and the run's channel, stdout and stderr. The
//! starter forks, and the child *is* the run: the same steps a run makes
//! ([`crate::run::run_reported`]), from that value, decoded once per job and kept. No `execve`
//! of cronlock, no command line read again, and a fork of a process of a few MiB with one
//! thread, not of the replica with its threads and table.
//!
//! Its one thread is what makes the fork sound (a lock held by another thread would stay held in
//! the child): the starter forks only while it has one (a job's run is decoded on a thread that
//! is joined first; [`process::fork_alone`] checks), and says its rare failures on stderr
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

use crate::command::process::{self, Reaped};
use crate::config::JobRun;
use crate::exit::Exit;
use crate::log::Log;
use crate::starting::message::{Plan, StarterMessage};
use crate::starting::{self, Received, StarterLink};

/// At most this many jobs' runs are kept decoded (all are dropped when it is reached).
const KEPT_MAX: usize = 4096;

/// Serve the replica until it closes the link and every run ended (in the starter), or carry out
/// one run (in a forked child): the exit status of either.
pub fn serve() -> Exit {
    crate::command::guard::die_with_parent();
    // Started as `/proc/self/exe` (the replica's own image), it would show as `exe`: its runs
    // inherit the name, and `ps` should say what they are.
    let _ = nix::sys::prctl::set_name(c"cronlock");
    crate::memory::for_forking();
    // What every run would otherwise look up for itself, found once before any fork.
    crate::command::cgroup::find_own();
    crate::host::hostname();
    match serve_runs() {
        Ok(Served::Done) => Exit::Success,
        Ok(Served::Run(child)) => child.run(),
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

/// A forked run, before it is one: its job's run, and its descriptors (channel, stdout, stderr).
struct Forked {
    run: Arc<JobRun>,
    fds: Vec<OwnedFd>,
}

/// The starter's state between messages.
struct StarterState {
    link: StarterLink,
    /// Each job's run, decoded, by its encoded text.
    kept: HashMap<String, Arc<JobRun>>,
    /// Runs forked and not yet reaped.
    running: usize,
}

fn serve_runs() -> Result<Served> {
    let link = StarterLink::adopt(starting::take_stdin()?)?;
    let mut mask = SigSet::empty();
    mask.add(Signal::SIGCHLD);
    let ended = SignalFd::with_flags(&mask, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)
        .map_err(|e| anyhow!("cannot watch for ended runs: {e}"))?;
    let mut s = StarterState {
        link,
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
                message: StarterMessage::Start { id, key, run },
                fds,
            }) => {
                if let Some(forked) = s.start(id, &key, &run, fds)? {
                    return Ok(Served::Run(forked));
                }
            }
            Some(_) => bail!("the replica sent a message that is not 'start'"),
        }
    }
}

impl StarterState {
    /// Reap every run that ended, and say so while the replica listens.
    fn reap(&mut self, open: bool) {
        while let Some(Reaped { pid, status }) = process::reap_any() {
            self.running = self.running.saturating_sub(1);
            if open {
                let said = StarterMessage::Exited {
                    pid: pid as u32,
                    status,
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
        plan: &Plan,
        fds: Vec<OwnedFd>,
    ) -> Result<Option<Box<Forked>>> {
        let run = match self.decoded(plan) {
            Ok(r) => r,
            Err(e) => return self.refuse(id, &format!("{key}: {e:#}")).map(|_| None),
        };
        if fds.len() != 3 {
            return self
                .refuse(id, "a start request without its three descriptors")
                .map(|_| None);
        }
        // One thread here (a decoding thread is joined first); `fork_alone` refuses otherwise.
        match process::fork_alone() {
            Ok(None) => {
                // Left as it is: freeing it would write to pages the child shares with the
                // starter until then, and each would be copied.
                std::mem::forget(std::mem::take(&mut self.kept));
                Ok(Some(Box::new(Forked { run, fds })))
            }
            Ok(Some(child)) => {
                self.running += 1;
                let started = StarterMessage::Started {
                    id,
                    pid: child as u32,
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

    /// The job's run `plan` carries, decoded once (its servers resolved, its TLS files read).
    /// Decoding runs on a thread of its own, joined before anything forks: glibc gives that
    /// thread its own arena, so the decoder's garbage is not scattered through the heap the runs
    /// allocate from (each page of it a child wrote to would be copied).
    fn decoded(&mut self, plan: &Plan) -> Result<Arc<JobRun>> {
        if let Some(r) = self.kept.get(plan.text()) {
            return Ok(r.clone());
        }
        let r = std::thread::scope(|scope| {
            let decoding = std::thread::Builder::new()
                .name("decode".into())
                .spawn_scoped(scope, || plan.read().map(Arc::new))
                .map_err(|e| anyhow!("cannot start a thread: {e}"))?;
            decoding
                .join()
                .map_err(|_| anyhow!("decoding the job's run failed"))?
        })?;
        if self.kept.len() >= KEPT_MAX {
            self.kept.clear();
        }
        self.kept.insert(plan.text().to_string(), r.clone());
        Ok(r)
    }
}

impl Forked {
    /// Become the run: its stdout and stderr the replica's pipes, its command's crontab variables
    /// set, handed its channel; then the run's own steps. It is not tied to the starter: it
    /// follows its replica through the channel (a starter replaced for a slow start, or killed,
    /// leaves the runs it forked going).
    fn run(self) -> Exit {
        let mut fds = self.fds.into_iter();
        let (Some(channel), Some(out), Some(err)) = (fds.next(), fds.next(), fds.next()) else {
            return Exit::Failure;
        };
        if nix::unistd::dup2_stdout(&out).is_err() || nix::unistd::dup2_stderr(&err).is_err() {
            return Exit::Failure;
        }
        drop((out, err));
        for crate::config::Variable { name, value } in self.run.env.iter() {
            // (One thread: nothing reads the environment meanwhile.)
            std::env::set_var(name, value);
        }
        let mut config = (*self.run.config).clone();
        config.handover = Some(channel.into_raw_fd());
        let log = Log::new(self.run.verbosity, self.run.format);
        let exit = crate::run::run_reported(&config, &log).unwrap_or_else(|e| {
            log.error("error", &format!("{e:#}"));
            Exit::Failure
        });
        log.flush(crate::log::FLUSH_WAIT);
        // Ends here, its log flushed by the run: what it would free on the way out lies in
        // pages it shares with the starter, and each one written to would be copied first.
        std::process::exit(exit.code().into())
    }
}
