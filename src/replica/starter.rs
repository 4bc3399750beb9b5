//! The replica's handle on its starter (`run/starter.rs`): spawned at a run when there is none
//! (the first, the first after it died or was let go idle, `runs.rs`), asked to start each run with the run's descriptors, and read on a thread of its own,
//! whose news (a run's process ended, the starter is gone) reach the loop as [`StarterNews`].
//! The starts of one instant are asked one after another and their answers read after
//! ([`Starter::ask`], [`Starter::answer`]): the starter forks each as soon as the one before is
//! forked, while the replica prepares the next.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, Sender};
use std::time::Duration;

use anyhow::{anyhow, bail, Result};

use crate::clock::Instant;
use crate::command::process::Helper;
use crate::signals;
use crate::starting::message::{Plan, StarterMessage};
use crate::starting::{LinkPair, Received, StarterLink, STARTER_ARG0};

/// How long a start may take to be answered: a starter slower than this is broken (it is
/// stopped, and replaced at the next start; the run, if it exists, never gets its lock; the
/// runs it forked before go on).
const START_ANSWER: Duration = Duration::from_secs(2);

/// What the starter's reader tells the loop.
pub enum StarterNews {
    /// A run's process ended.
    Exited { pid: u32, status: ExitStatus },
    /// The starter `pid` is gone: the runs it started go on, and nobody says when they end
    /// (their channels do).
    Gone { pid: u32 },
}

/// A start asked of the starter: answered by [`Starter::answer`] by `by`.
pub struct Asked {
    id: u64,
    by: Instant,
}

/// A starter the replica spawned.
pub struct Starter {
    child: Helper,
    link: StarterLink,
    answers: Receiver<StarterMessage>,
    /// Answers read while waiting for another's, by request id.
    early: HashMap<u64, StarterMessage>,
    next_id: u64,
    /// Its reader saw its end (or a start went unanswered): start another.
    broken: bool,
}

impl Starter {
    /// Spawn the starter of `exe` with the environment runs get (`hidden` removed); its news go
    /// to `news`.
    pub fn spawn(exe: &Path, hidden: &[&str], news: &Sender<StarterNews>) -> Result<Starter> {
        let LinkPair { link, theirs } = StarterLink::pair()?;
        let mut cmd = Command::new(exe);
        cmd.arg0(STARTER_ARG0);
        for name in hidden {
            cmd.env_remove(name);
        }
        // Its end of the link is its standard input: no `pre_exec` hook, so std spawns with
        // `posix_spawn`, not a fork of this multi-threaded replica.
        cmd.stdin(Stdio::from(theirs))
            .stdout(Stdio::inherit())
            .stderr(Stdio::inherit());
        let child = Helper::spawn(&mut cmd).map_err(|e| anyhow!(crate::log::io_text(&e)))?;
        drop(cmd);
        let (answer_to, answers) = mpsc::channel();
        let reader = link.try_clone()?;
        let (pid, news) = (child.id(), news.clone());
        let read = std::thread::Builder::new()
            .name("starter".into())
            .stack_size(128 * 1024)
            .spawn(move || read_news(&reader, pid, &answer_to, &news));
        let mut starter = Starter {
            child,
            link,
            answers,
            early: HashMap::new(),
            next_id: 0,
            broken: false,
        };
        if let Err(e) = read {
            starter.stop();
            bail!("cannot read its starter: {e}");
        }
        Ok(starter)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether it can be asked (else a new one is spawned).
    pub fn usable(&mut self) -> bool {
        !self.broken && self.child.running()
    }

    /// Ask for a run of KEY's job (as it resolved) with its channel, stdout and stderr;
    /// [`Starter::answer`] says the run's pid.
    pub fn ask(&mut self, key: &str, run: Plan, fds: [&OwnedFd; 3]) -> Result<Asked> {
        self.next_id += 1;
        let id = self.next_id;
        let ask = StarterMessage::Start {
            id,
            key: key.to_string(),
            run,
        };
        let raw = fds.map(AsRawFd::as_raw_fd);
        if let Err(e) = self.link.send(&ask, &raw) {
            self.broken = true;
            return Err(e);
        }
        Ok(Asked {
            id,
            by: Instant::now() + START_ANSWER,
        })
    }

    /// The answer to `asked`: the run's pid, or why it was not started (refused; or no answer
    /// in time: the starter is stopped, and whatever it forked gets no lock).
    pub fn answer(&mut self, asked: &Asked) -> Result<u32> {
        let id = asked.id;
        loop {
            let message = match self.early.remove(&id) {
                Some(message) => Ok(message),
                None => self
                    .answers
                    .recv_timeout(asked.by.saturating_duration_since(Instant::now())),
            };
            match message {
                Ok(StarterMessage::Started { id: of, pid }) if of == id => return Ok(pid),
                Ok(StarterMessage::Refused { id: of, why }) if of == id => bail!("{why}"),
                // Another start's answer, read while waiting for this one's.
                Ok(
                    other @ (StarterMessage::Started { id: of, .. }
                    | StarterMessage::Refused { id: of, .. }),
                ) if of > id => {
                    self.early.insert(of, other);
                }
                // An answer to a request given up on.
                Ok(_) => continue,
                Err(_) => {
                    self.early.clear();
                    // Unanswered: whatever it forked gets no lock (its channel is never
                    // written), and a starter that hangs is replaced: let go, not killed, since
                    // it guards the commands of the runs it forked before (`Runs::retire`).
                    self.let_go();
                    bail!(
                        "its starter did not answer within {} s",
                        START_ANSWER.as_secs()
                    );
                }
            }
        }
    }

    /// Stop it now (SIGKILL) and reap it: before it forked any run.
    pub fn stop(&mut self) {
        self.broken = true;
        self.link.shutdown();
        self.child.kill();
    }

    /// Ask it for nothing more: its link closes, and it exits once the runs it forked (whose
    /// commands it guards) have ended.
    pub fn let_go(&mut self) {
        self.broken = true;
        self.link.shutdown();
    }

    /// Whether its process still runs (an ended one is reaped).
    pub fn running(&mut self) -> bool {
        self.child.running()
    }
}

impl Drop for Starter {
    /// Close the link (a starter whose runs all ended exits at once) and reap it, waiting at most
    /// a second before it is killed.
    fn drop(&mut self) {
        self.link.shutdown();
        self.child.end_within(Duration::from_secs(1));
    }
}

/// The reader: answers to the asking thread, ends to the loop, until the starter's end.
fn read_news(
    link: &StarterLink,
    pid: u32,
    answers: &Sender<StarterMessage>,
    news: &Sender<StarterNews>,
) {
    while let Ok(Some(Received { message, .. })) = link.receive() {
        match message {
            StarterMessage::Exited { pid, status } => {
                let status = std::os::unix::process::ExitStatusExt::from_raw(status);
                let _ = news.send(StarterNews::Exited { pid, status });
                signals::wake_main();
            }
            answer => {
                let _ = answers.send(answer);
            }
        }
    }
    let _ = news.send(StarterNews::Gone { pid });
    signals::wake_main();
}
