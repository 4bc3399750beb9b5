//! The channel between a replica (`--crontab`) and a run it started: the replica claims an
//! instant itself, then hands the lock it won to the run, and the run tells the replica when its
//! command started and how it ended. Nothing passes through an environment value or a log line:
//! the job's output, verbosity and log format cannot change what the replica knows.
//!
//! The channel is a Unix socket pair. The run's end reaches the run through the replica's
//! starter (`run/starter.rs`, [`crate::starting`]), close-on-exec, so the command does not
//! inherit it. Each message is one line of JSON with a version (`"v"`):
//! the replica sends one `lock`; the run sends `started`, then `release` (how its command ended) and
//! waits for the replica's `released`, then `ended`. End of file without `ended` means the run
//! died.
//!
//! The release goes through the replica so that a run costs Redis no connection of its own: the
//! replica releases on its long-lived one, with the holder value it claimed with, and records
//! the run (the run only says how its command ended). A run that hears no `released` in time (the replica died or hangs)
//! releases by itself, as any run does.

pub mod message;
mod replica_side;

use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::mpsc::{self, Receiver};
use std::time::Duration;

use anyhow::{anyhow, bail, Result};

use crate::clock::Instant;
use crate::exit::Exit;
use crate::handover::message::{LockMessage, Message, ReleaseMessage, ReleaseOutcome};
use crate::record::run::CommandEnd;
use crate::record::run::Ending;
use crate::store::holder::Holder;
use crate::store::keys::Keys;
use crate::store::lock::{Held, Released};
use crate::store::tracking::Watch;

/// How a run asks its replica to renew its lock ([`RunSide::renew_asker`]).
pub type AskReplica = Box<dyn Fn() + Send>;

/// The longest message: the `lock`, with the KEY (at most 1 KiB) and the holder value (its
/// command cut to 256 characters), each at most 6 bytes a byte once escaped, well within this.
pub const MAX_MESSAGE: usize = 64 * 1024;

/// The lock a replica won, as the run receives it.
#[derive(Debug, Clone)]
pub struct Handover {
    pub key: String,
    pub holder: Holder,
    pub fence: i64,
    pub slot: u32,
    pub limit: u32,
    pub instant: Option<i64>,
    /// The instant is a manual one (`--trigger`).
    pub manual: bool,
    pub attempt: u32,
    pub ttl: Duration,
    /// When the claim was sent, on `CLOCK_BOOTTIME` (the same clock in every process): the lock
    /// is valid until this + ttl at the least.
    pub sent_at: Instant,
    /// `--overlap allow`: the lock is the instant's own.
    pub own_lock: bool,
    /// The process that forked the run (the replica's starter; 0: not said), for diagnostics.
    pub parent_pid: u32,
    /// The replica watches the lock and says `changed` on the channel.
    pub watched: bool,
    /// The replica renews the lock when the run asks, and says `renewed` on the channel: the
    /// run renews by itself only when no renewal came in time.
    pub renewed_by_replica: bool,
    /// `--overlap replace`: a run replaced may still be stopping until then (`CLOCK_BOOTTIME`).
    pub after: Option<Instant>,
    /// A scheduled instant's: when Redis's clock reaches it (`CLOCK_BOOTTIME`).
    pub due: Option<Instant>,
}

impl Handover {
    /// What the replica won, for KEY, handed to a run forked by `parent_pid` (the replica's
    /// starter).
    pub fn from_held(key: &str, held: &Held, parent_pid: u32, watched: bool) -> Handover {
        Handover {
            key: key.to_string(),
            holder: held.holder.clone(),
            fence: held.fence,
            slot: held.slot,
            limit: held.limit,
            instant: held.instant,
            manual: held.manual,
            attempt: held.attempt,
            ttl: held.ttl,
            sent_at: held.sent_at,
            own_lock: held.own_lock,
            after: held.after,
            due: held.due,
            parent_pid,
            watched,
            // A replica renews its runs' locks as they ask, those asking together as one pipeline.
            renewed_by_replica: true,
        }
    }

    /// The lock as the run holds it: `keys` are the run's own for its KEY.
    pub fn into_held(self, keys: Keys) -> Held {
        let own_instant = self.instant.filter(|_| self.own_lock);
        Held {
            keys: keys.held(self.limit, self.slot, own_instant),
            holder: self.holder,
            fence: self.fence,
            ttl: self.ttl,
            sent_at: self.sent_at,
            instant: self.instant,
            limit: self.limit,
            slot: self.slot,
            attempt: self.attempt,
            manual: self.manual,
            own_lock: self.own_lock,
            after: self.after,
            due: self.due,
        }
    }

    /// The message, one line.
    pub fn line(&self) -> String {
        let h = &self.holder;
        Message::Lock(LockMessage {
            key: self.key.clone(),
            value: h.value.clone(),
            token: h.token.clone(),
            host: h.host.clone(),
            pid: h.pid,
            started: h.started_ms,
            command: h.command.clone(),
            fence: self.fence,
            slot: self.slot,
            limit: self.limit,
            instant: self.instant,
            manual: self.manual,
            attempt: self.attempt,
            ttl_ms: self.ttl.as_millis() as u64,
            sent_boot_ns: self.sent_at.as_duration().as_nanos() as u64,
            parent_pid: self.parent_pid,
            watched: self.watched,
            renewed_by_replica: self.renewed_by_replica,
            own_lock: self.own_lock,
            after_boot_ns: self.after.map(|a| a.as_duration().as_nanos() as u64),
            due_boot_ns: self.due.map(|a| a.as_duration().as_nanos() as u64),
        })
        .line()
    }

    /// Read a `lock` message; anything but its exact shape is refused.
    pub fn parse(line: &str) -> Result<Handover> {
        let Message::Lock(m) = Message::parse(line)? else {
            bail!("expected a 'lock' message");
        };
        if m.fence <= 0 {
            bail!("the handover has no fencing token");
        }
        Ok(Handover {
            key: m.key,
            holder: Holder {
                token: m.token,
                host: m.host,
                pid: m.pid,
                started_ms: m.started,
                command: m.command,
                value: m.value,
            },
            fence: m.fence,
            slot: m.slot,
            limit: m.limit.max(1),
            instant: m.instant,
            manual: m.manual,
            attempt: m.attempt.max(1),
            ttl: Duration::from_millis(m.ttl_ms),
            sent_at: Instant::from_duration(Duration::from_nanos(m.sent_boot_ns)),
            own_lock: m.own_lock,
            parent_pid: m.parent_pid,
            watched: m.watched,
            renewed_by_replica: m.renewed_by_replica,
            after: m
                .after_boot_ns
                .map(|ns| Instant::from_duration(Duration::from_nanos(ns))),
            due: m
                .due_boot_ns
                .map(|ns| Instant::from_duration(Duration::from_nanos(ns))),
        })
    }
}

/// What a run tells its replica.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunReport {
    /// The command started, as process `pid`.
    Started { pid: u32 },
    /// Renew the lock now: the run is alive, and its command runs.
    Renew,
    /// Release the lock for the run, recording how its command ended; the run waits for
    /// [`ReleaseAnswer`].
    Release(CommandEnd),
    /// The run ended (the lock released and the instant recorded).
    Ended(RunEnd),
}

/// How a run ended: its exit status, how the command ended, and when, from the claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunEnd {
    pub status: u8,
    pub ending: Ending,
    pub duration: Duration,
}

impl RunReport {
    pub fn line(&self) -> String {
        match self {
            RunReport::Started { pid } => Message::Started { pid: *pid },
            RunReport::Renew => Message::Renew,
            RunReport::Release(end) => Message::Release(release_message(end)),
            RunReport::Ended(end) => Message::Ended {
                status: end.status,
                ending: end.ending,
                duration_ms: end.duration.as_millis() as u64,
            },
        }
        .line()
    }

    pub fn parse(line: &str) -> Result<RunReport> {
        match Message::parse(line)? {
            Message::Started { pid } => Ok(RunReport::Started { pid }),
            Message::Renew => Ok(RunReport::Renew),
            Message::Release(m) => Ok(RunReport::Release(command_end(m))),
            Message::Ended {
                status,
                ending,
                duration_ms,
            } => Ok(RunReport::Ended(RunEnd {
                status,
                ending,
                duration: Duration::from_millis(duration_ms),
            })),
            Message::Lock(_)
            | Message::Releasing
            | Message::Released(_)
            | Message::Changed
            | Message::Renewed { .. } => {
                bail!("not a report")
            }
        }
    }
}

/// The replica's answer to a `release`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReleaseAnswer {
    /// Carried out: how it went.
    Done(Released),
    /// Not carried out yet (Redis is slow or away: the line says why): the replica keeps it and
    /// carries it out as soon as Redis answers. The run is done with it.
    Owed(String),
    /// Failed for good (the line says why): the run releases by itself.
    Failed(String),
}

/// A `release` message: how the run's command ended.
fn release_message(end: &CommandEnd) -> ReleaseMessage {
    ReleaseMessage {
        status: end.exit.code(),
        signal: match end.exit {
            Exit::Signal(n) => Some(n),
            _ => None,
        },
        ending: end.ending,
        started_ms: end.started_ms,
        finished_ms: end.finished_ms,
        interrupted: end.interrupted,
    }
}

/// How a run's command ended, as its `release` message says: the exit status as the record and
/// the ledger store it (the number, and the signal that made it).
fn command_end(m: ReleaseMessage) -> CommandEnd {
    CommandEnd {
        exit: m.signal.map_or(Exit::Child(m.status), Exit::Signal),
        ending: m.ending,
        started_ms: m.started_ms,
        finished_ms: m.finished_ms,
        interrupted: m.interrupted,
    }
}

/// How long a run waits for the replica's `releasing` before it releases by itself: the thread
/// that reads the run's channel sends it at once, so only a replica that is frozen or gone (or a
/// machine starved for this long) misses it. The lock of a run whose replica is frozen is free
/// this long after its command ended, not `--connect-timeout` later.
pub const RELEASING_WITHIN: Duration = Duration::from_millis(50);

/// Read a `released` message.
fn parse_released(line: &str) -> Result<ReleaseAnswer> {
    let Message::Released(m) = Message::parse(line)? else {
        bail!("expected a 'released' message");
    };
    if let Some(e) = m.error {
        return Ok(match m.owed {
            true => ReleaseAnswer::Owed(e),
            false => ReleaseAnswer::Failed(e),
        });
    }
    match m.outcome {
        Some(ReleaseOutcome::Deleted) => Ok(ReleaseAnswer::Done(Released::Deleted)),
        Some(ReleaseOutcome::Kept) => Ok(ReleaseAnswer::Done(Released::Kept)),
        Some(ReleaseOutcome::NotOurs) => Ok(ReleaseAnswer::Done(Released::NotOurs)),
        None => bail!("a released message with no outcome"),
    }
}

/// The run's end of the channel.
pub struct RunSide {
    stream: UnixStream,
    /// The replica watches the lock (the handover said so).
    watched: bool,
    /// The replica renews the lock (the handover said so).
    renewed_by_replica: bool,
    /// Once a [`ReplicaWatch`] reads the channel, the `released` lines it read.
    answers: Option<Receiver<String>>,
}

impl RunSide {
    /// Take over descriptor `fd`, the channel a replica's starter handed this run, close-on-exec
    /// from now on.
    pub fn adopt(fd: RawFd) -> Result<RunSide> {
        let flags = nix::fcntl::fcntl(
            // SAFETY: only borrowed for this call; fcntl on a closed number fails with EBADF.
            unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) },
            nix::fcntl::FcntlArg::F_GETFD,
        );
        if flags.is_err() || fd < 3 {
            bail!("descriptor {fd} is no open channel");
        }
        // SAFETY: the descriptor is open (checked above) and nothing else in this process owns
        // it: it was inherited for this purpose, and is adopted once, at start.
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        nix::fcntl::fcntl(
            &owned,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
        )
        .map_err(|e| anyhow!("cannot keep the channel from the command: {e}"))?;
        Ok(RunSide {
            stream: UnixStream::from(owned),
            watched: false,
            renewed_by_replica: false,
            answers: None,
        })
    }

    /// The lock the replica handed over, within `within`.
    pub fn receive(&mut self, within: Duration) -> Result<Handover> {
        self.stream
            .set_read_timeout(Some(within.max(Duration::from_millis(1))))
            .map_err(|e| anyhow!("cannot read the channel: {e}"))?;
        let mut line = String::new();
        let mut reader = BufReader::new((&self.stream).take(MAX_MESSAGE as u64));
        match reader.read_line(&mut line) {
            Ok(0) => bail!("the replica closed the channel before handing over a lock"),
            Ok(_) if !line.ends_with('\n') => bail!("the handover is cut short or too long"),
            Ok(_) => {
                let handed = Handover::parse(line.trim_end())?;
                self.watched = handed.watched;
                self.renewed_by_replica = handed.renewed_by_replica;
                Ok(handed)
            }
            Err(e) => bail!("no lock was handed over: {}", crate::log::io_text(&e)),
        }
    }

    /// Ask the replica to release the lock, recording how the command ended (`end`), and wait at most
    /// [`RELEASING_WITHIN`] for its `releasing`, then at most `within` in all for its answer.
    /// `None`: no answer (the replica is gone, frozen, hangs, or answered out of shape): the run
    /// releases by itself.
    pub fn release_by_replica(
        &mut self,
        end: &CommandEnd,
        within: Duration,
    ) -> Option<ReleaseAnswer> {
        self.send(&RunReport::Release(*end));
        let sent = Instant::now();
        let mut taken = false;
        let mut reader = BufReader::new(&self.stream);
        loop {
            // Read already by the replica's watch, if it came while the command ran; else here,
            // past any `changed` the replica sent before.
            let line = match self.answers.as_ref().and_then(|a| a.try_recv().ok()) {
                Some(line) => line,
                None => {
                    let patience = if taken {
                        within
                    } else {
                        RELEASING_WITHIN.min(within)
                    };
                    let left = (sent + patience).saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return None;
                    }
                    reader.get_ref().set_read_timeout(Some(left)).ok()?;
                    let mut line = String::new();
                    match (&mut reader).take(MAX_MESSAGE as u64).read_line(&mut line) {
                        Ok(_) if line.ends_with('\n') => line,
                        _ => return None,
                    }
                }
            };
            match Message::parse(line.trim_end()) {
                Ok(Message::Releasing) => taken = true,
                Ok(Message::Released(_)) => return parse_released(line.trim_end()).ok(),
                _ => {}
            }
        }
    }

    /// What the run hears on this channel once its command started ([`ReplicaWatch`]): the
    /// replica's watch of the lock when the handover said the replica watches it (else the
    /// run's `own` watch runs beside it), and the replica's end.
    pub fn replica_watch(&mut self, own: Box<dyn Watch>) -> ReplicaWatch {
        let (answers, heard) = mpsc::channel();
        let stream = self.stream.try_clone().ok();
        if stream.is_some() {
            self.answers = Some(heard);
        }
        ReplicaWatch {
            stream,
            answers,
            own: (!self.watched).then_some(own),
        }
    }

    /// How the run asks its replica to renew the lock, when the handover said the replica
    /// renews it (its `renewed` is heard by [`ReplicaWatch`]): a `renew` sent without waiting (a
    /// replica that does not read it is a late renewal, and the run renews by itself).
    pub fn renew_asker(&self) -> Option<AskReplica> {
        if !self.renewed_by_replica {
            return None;
        }
        let stream = self.stream.try_clone().ok()?;
        let line = RunReport::Renew.line();
        Some(Box::new(move || {
            let flags =
                nix::sys::socket::MsgFlags::MSG_DONTWAIT | nix::sys::socket::MsgFlags::MSG_NOSIGNAL;
            let _ = nix::sys::socket::send(stream.as_raw_fd(), line.as_bytes(), flags);
        }))
    }

    /// Whether the replica is gone: its end of the channel closed (looked at without waiting).
    pub fn replica_gone(&self) -> bool {
        replica_gone(&self.stream)
    }

    /// Tell the replica; a replica that is gone is not an error (the run goes on).
    pub fn send(&mut self, report: &RunReport) {
        let _ = self.stream.set_write_timeout(Some(Duration::from_secs(1)));
        let _ = self.stream.write_all(report.line().as_bytes());
    }
}

/// A line the replica read from a run's channel, as a report; `None` for a line that is not one
/// (it is skipped). The replica reads every run's channel on one thread (`replica/relay.rs`).
pub fn report_in(line: &[u8]) -> Option<RunReport> {
    RunReport::parse(String::from_utf8_lossy(line).trim_end()).ok()
}

mod heard;
use heard::replica_gone;
pub use heard::ReplicaWatch;
pub use replica_side::ReplicaSide;

#[cfg(test)]
mod tests;
