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
//! itself (the log has a writer thread). A run is tied to the replica through its channel: a
//! replica SIGKILLed takes the starter with it, and closes every run's channel, and each run then
//! stops its command and gives its lock back ([`crate::handover`]). The starter also guards its
//! runs' commands ([`crate::command::oversight`]: each run's page and cgroup made before its
//! fork, its command killed when its kill-by time passes or when the run is reaped), so a
//! starter that dies alone (killed, or replaced when a start went unanswered) asks its runs to
//! end as well.
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

use crate::clock::Instant;
use crate::command::oversight::{Overseer, RunGuard};
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
    // What a run leaves behind when it is killed (its command's processes) comes back here, to
    // be reaped with the runs.
    let _ = nix::sys::prctl::set_child_subreaper(true);
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

/// A forked run, before it is one: its job's run, its descriptors (channel, stdout, stderr),
/// and what its starter guards its command with.
struct Forked {
    run: Arc<JobRun>,
    fds: Vec<OwnedFd>,
    guard: RunGuard,
}

/// The starter's state between messages.
struct StarterState {
    link: StarterLink,
    /// Each job's run, decoded, by its encoded text.
    kept: HashMap<String, Arc<JobRun>>,
    /// Runs forked and not yet reaped, each with its page and its command's cgroup.
    overseer: Overseer,
    /// The link failed (the replica let this starter go): nothing more is said on it, and the
    /// starter ends once its runs have (it guards their commands meanwhile).
    closed: bool,
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
        overseer: Overseer::default(),
        closed: false,
    };
    let mut open = true;
    loop {
        if !open && s.overseer.is_empty() {
            return Ok(Served::Done);
        }
        s.overseer.enforce(Instant::now());
        // Wakes only for a message, the link's end, an ended run, or a run's kill-by time:
        // nothing polls.
        let mut fds = vec![PollFd::new(ended.as_fd(), PollFlags::POLLIN)];
        if open {
            fds.push(PollFd::new(s.link.as_fd(), PollFlags::POLLIN));
        }
        match poll(&mut fds, until(s.overseer.next_deadline())) {
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
        // A link that fails is one the replica let go: the runs it guards end first.
        match s.link.receive() {
            Ok(None) | Err(_) => open = false,
            Ok(Some(Received {
                message: StarterMessage::Start { id, key, run },
                fds,
            })) => {
                if let Some(forked) = s.start(id, &key, &run, fds) {
                    return Ok(Served::Run(forked));
                }
                open &= !s.closed;
            }
            Ok(Some(_)) => {
                // Listened to no more: the runs it guards end first.
                eprintln!(
                    "cronlock: the starter of the replica's runs: the replica sent a message \
                     that is not 'start'; starting nothing more"
                );
                open = false;
            }
        }
    }
}

impl StarterState {
    /// Reap every run that ended, and say so while the replica listens.
    fn reap(&mut self, open: bool) {
        while let Some(Reaped { pid, status }) = process::reap_any() {
            // (Not a run: what a killed run left, come back to the subreaper.)
            if self.overseer.reaped(pid) && open {
                let said = StarterMessage::Exited {
                    pid: pid as u32,
                    status,
                };
                self.say(&said);
            }
        }
    }

    /// Start request `id`: fork the run (returned in the child), or say why not.
    fn start(&mut self, id: u64, key: &str, plan: &Plan, fds: Vec<OwnedFd>) -> Option<Box<Forked>> {
        let run = match self.decoded(plan) {
            Ok(r) => r,
            Err(e) => return self.refuse(id, &format!("{key}: {e:#}")),
        };
        if fds.len() != 3 {
            return self.refuse(id, "a start request without its three descriptors");
        }
        let guard = match self.overseer.prepare() {
            Ok(g) => g,
            Err(e) => {
                let why = format!("cannot map a page for the run: {}", crate::log::io_text(&e));
                return self.refuse(id, &why);
            }
        };
        // One thread here (a decoding thread is joined first); `fork_alone` refuses otherwise.
        match process::fork_alone() {
            Ok(None) => {
                // Left as it is: freeing it would write to pages the child shares with the
                // starter until then, and each would be copied.
                std::mem::forget(std::mem::take(&mut self.kept));
                std::mem::forget(std::mem::take(&mut self.overseer));
                let forked = Forked { run, fds, guard };
                Some(Box::new(forked))
            }
            Ok(Some(child)) => {
                self.overseer.forked(child, guard);
                let started = StarterMessage::Started {
                    id,
                    pid: child as u32,
                };
                self.say(&started);
                None
            }
            Err(e) => {
                Overseer::abandon(guard);
                self.refuse(id, &format!("cannot fork: {e}"))
            }
        }
    }

    /// Say why start request `id` was not carried out: no run.
    fn refuse(&mut self, id: u64, why: &str) -> Option<Box<Forked>> {
        let refused = StarterMessage::Refused {
            id,
            why: why.to_string(),
        };
        self.say(&refused);
        None
    }

    /// Tell the replica `message`, unless the link failed: then nothing more is said, and the
    /// starter ends once its runs have (a starter the replica let go still guards them).
    fn say(&mut self, message: &StarterMessage) {
        if !self.closed && self.link.send(message, &[]).is_err() {
            self.closed = true;
        }
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
    /// set, handed its channel; then the run's own steps. It follows its replica through the
    /// channel, and its starter, which guards its command, through its death signal.
    fn run(self) -> Exit {
        // The starter guards this run's command: its death asks the run to end, as a drain
        // would (a command is not left going with nothing independent to stop it).
        let _ = nix::sys::prctl::set_pdeathsig(Signal::SIGTERM);
        if nix::unistd::getppid().as_raw() != self.guard.starter {
            crate::signals::ask_to_end();
        }
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
        let exit = crate::run::run_reported(&config, &log, Some(self.guard)).unwrap_or_else(|e| {
            log.error("error", &format!("{e:#}"));
            Exit::Failure
        });
        log.flush(crate::log::FLUSH_WAIT);
        // Ends here, its log flushed by the run: what it would free on the way out lies in
        // pages it shares with the starter, and each one written to would be copied first.
        std::process::exit(exit.code().into())
    }
}

/// How long the starter may sleep: until `deadline` (a run's kill-by time), or for ever.
fn until(deadline: Option<Instant>) -> PollTimeout {
    let Some(deadline) = deadline else {
        return PollTimeout::NONE;
    };
    // Rounded up, so a wake-up is never early and nothing spins.
    let ms = deadline
        .saturating_duration_since(Instant::now())
        .as_micros()
        .div_ceil(1000);
    PollTimeout::try_from(ms.min(i32::MAX as u128) as i32).unwrap_or(PollTimeout::MAX)
}
