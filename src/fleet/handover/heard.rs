//! The replica's watch of a run's lock as the run hears it, on its channel (see `replica/watches.rs`
//! for the replica's side).

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::mpsc::Sender;
use std::sync::Arc;

use super::MAX_MESSAGE;
use crate::record::message::Message;
use crate::signals;
use crate::store::tracking::{Listener, Watch, Watching};

/// The replica's watch of a run's lock, as the run hears it: from 20 ms into the command (the
/// watchdog starts it, as a run's own watch), the kernel wakes the run's main loop whenever the
/// channel is readable (`O_ASYNC`), and each wake-up reads what came without waiting: a
/// `changed` asks the lock's validity to renew now; a `releasing` or `released` is kept for the
/// release. No thread and no connection of the run's own.
pub struct ReplicaWatch {
    pub(super) stream: UnixStream,
    pub(super) answers: Sender<String>,
}

/// A [`ReplicaWatch`] that runs.
struct HearingReplica {
    stream: UnixStream,
    answers: Sender<String>,
    listener: Arc<dyn Listener>,
    /// A line begun and not yet ended.
    partial: Vec<u8>,
}

impl Watch for ReplicaWatch {
    fn start(self: Box<Self>, listener: Arc<dyn Listener>) -> Box<dyn Watching> {
        let ReplicaWatch { stream, answers } = *self;
        if signals::wake_on_readable(stream.as_raw_fd(), true).is_err() {
            // The release reads its answer itself; changes go unheard (renewals alone).
            return Box::new(NotHearing);
        }
        let mut hearing = HearingReplica {
            stream,
            answers,
            listener,
            partial: Vec::new(),
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
        let mut chunk = [0u8; 4096];
        loop {
            let got = match nix::sys::socket::recv(
                self.stream.as_raw_fd(),
                &mut chunk,
                nix::sys::socket::MsgFlags::MSG_DONTWAIT,
            ) {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            self.partial.extend_from_slice(&chunk[..got]);
            while let Some(at) = self.partial.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.partial.drain(..=at).collect();
                let text = String::from_utf8_lossy(&line);
                match Message::parse(text.trim_end()) {
                    Ok(Message::Changed) => self.listener.changed(),
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
