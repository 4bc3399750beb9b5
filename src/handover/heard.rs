//! What a run hears from its replica on its channel while its command runs (see
//! `replica/watches.rs` for the replica's side): the replica's watch of the lock, its answers to
//! the release, and its end.

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::mpsc::Sender;
use std::sync::Arc;

use nix::errno::Errno;
use nix::sys::socket::{recv, MsgFlags};

use super::MAX_MESSAGE;
use crate::handover::message::Message;
use crate::signals;
use crate::store::tracking::{Listener, Watch, Watching};

/// What a run hears on its channel: from 20 ms into the command (the watchdog starts it, as a
/// run's own watch), the kernel wakes the run's main loop whenever the channel is readable
/// (`O_ASYNC`), and each wake-up reads what came without waiting: a `changed` asks the lock's
/// validity to renew now; a `renewed` moves it on (the replica's renewal, confirmed); a `releasing` or `released` is kept for the release; the end of the
/// channel (the replica is gone: killed, or exited) asks the run to end, as a drain would, so
/// it stops its command and gives its lock back itself. A run lives on when the starter that
/// forked it dies: it follows its replica, through this channel. When the replica does not
/// watch the lock (the handover says), the run's `own` watch runs beside it. No thread and no
/// connection of the run's own for this.
pub struct ReplicaWatch {
    pub(super) stream: Option<UnixStream>,
    pub(super) answers: Sender<String>,
    pub(super) own: Option<Box<dyn Watch>>,
}

/// A [`ReplicaWatch`] that runs.
struct HearingReplica {
    stream: UnixStream,
    answers: Sender<String>,
    listener: Arc<dyn Listener>,
    /// A line begun and not yet ended.
    partial: Vec<u8>,
    /// The replica's end was heard (the run was asked to end once).
    gone: bool,
    own: Option<Box<dyn Watching>>,
}

impl Watch for ReplicaWatch {
    fn start(self: Box<Self>, listener: Arc<dyn Listener>) -> Box<dyn Watching> {
        let ReplicaWatch {
            stream,
            answers,
            own,
        } = *self;
        let own = own.map(|w| w.start(listener.clone()));
        let Some(stream) =
            stream.filter(|s| signals::wake_on_readable(s.as_raw_fd(), true).is_ok())
        else {
            // (Not heard: the release reads its answer itself, and the replica's end is looked
            // at before the command starts; changes go unheard, renewals alone.)
            return own.unwrap_or_else(|| Box::new(NotHearing));
        };
        let mut hearing = HearingReplica {
            stream,
            answers,
            listener,
            partial: Vec::new(),
            gone: false,
            own,
        };
        // What came before the wake-ups were on.
        hearing.look();
        Box::new(hearing)
    }
}

/// A replica's watch that could not be set up.
struct NotHearing;

impl Watching for NotHearing {}

impl Watching for HearingReplica {
    fn look(&mut self) {
        if let Some(own) = self.own.as_mut() {
            own.look();
        }
        let mut chunk = [0u8; 4096];
        while !self.gone {
            let got = match recv(self.stream.as_raw_fd(), &mut chunk, MsgFlags::MSG_DONTWAIT) {
                Err(Errno::EAGAIN | Errno::EINTR) => return,
                Ok(0) | Err(_) => {
                    self.gone = true;
                    signals::ask_to_end();
                    return;
                }
                Ok(n) => n,
            };
            self.partial.extend_from_slice(&chunk[..got]);
            while let Some(at) = self.partial.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.partial.drain(..=at).collect();
                let text = String::from_utf8_lossy(&line);
                match Message::parse(text.trim_end()) {
                    Ok(Message::Changed) => self.listener.changed(),
                    Ok(Message::Renewed { sent_boot_ns }) => {
                        let ns = std::time::Duration::from_nanos(sent_boot_ns);
                        self.listener
                            .renewed(crate::clock::Instant::from_duration(ns));
                    }
                    Ok(Message::Releasing | Message::Released(_)) => {
                        let _ = self.answers.send(text.into_owned());
                    }
                    _ => {}
                }
            }
            if self.partial.len() > MAX_MESSAGE {
                self.partial.clear();
            }
        }
    }
}

impl Drop for HearingReplica {
    fn drop(&mut self) {
        let _ = signals::wake_on_readable(self.stream.as_raw_fd(), false);
    }
}

/// Whether the replica's end of `stream` is closed, looked at without waiting or reading (a
/// message not yet read says it is there).
pub(super) fn replica_gone(stream: &UnixStream) -> bool {
    let mut byte = [0u8; 1];
    let peek = MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT;
    !matches!(
        recv(stream.as_raw_fd(), &mut byte, peek),
        Ok(1..) | Err(Errno::EAGAIN | Errno::EINTR)
    )
}
