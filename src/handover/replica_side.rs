//! The replica's end of a run's channel: everything the replica tells a run goes through
//! [`ReplicaSide`], each message written whole by this room (the `lock` handed over, `changed`,
//! `renewed`, `releasing`, `released`).

use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use nix::sys::socket::MsgFlags;

use crate::clock::Instant;
use crate::handover::message::{Message, ReleaseOutcome, ReleasedMessage};
use crate::handover::{Handover, ReleaseAnswer};
use crate::store::lock::Released;

/// How long the `released` answer may take to write: the run waits for it, and releases by
/// itself when it does not come.
const RELEASED_WITHIN: Duration = Duration::from_millis(100);

/// The replica's end of a run's channel (the run's is [`crate::handover::RunSide`]).
pub struct ReplicaSide {
    stream: UnixStream,
}

impl ReplicaSide {
    pub fn new(stream: UnixStream) -> ReplicaSide {
        ReplicaSide { stream }
    }

    /// Another handle on the same end (for the claims thread's answer, or a watch's news).
    pub fn try_clone(&self) -> std::io::Result<ReplicaSide> {
        self.stream.try_clone().map(ReplicaSide::new)
    }

    /// Hand the run the lock the replica won: the first message, written whole.
    pub fn hand_over(&mut self, handover: &Handover) -> std::io::Result<()> {
        self.stream.write_all(handover.line().as_bytes())
    }

    /// The run's lock changed (a watch saw it, or a renewal found it not ours).
    pub fn changed(&self) {
        self.tell(&changed_line());
    }

    /// The replica renewed the run's lock with a renewal sent at `sent` (confirmed).
    pub fn renewed(&self, sent: Instant) {
        self.tell(&renewed_line(sent));
    }

    /// The replica lives and carries the run's release out.
    pub fn releasing(&self) {
        self.tell(&releasing_line());
    }

    /// How the release the run asked for went (the run waits for this, a bounded while; a run
    /// that is gone no longer needs it).
    pub fn released(&mut self, answer: &ReleaseAnswer) {
        let _ = self.stream.set_write_timeout(Some(RELEASED_WITHIN));
        let _ = self.stream.write_all(released_line(answer).as_bytes());
    }

    /// A line the run may miss, never waited for: a run that does not read its channel loses
    /// only this line (it renews and releases by itself).
    fn tell(&self, line: &str) {
        let _ = nix::sys::socket::send(
            self.stream.as_raw_fd(),
            line.as_bytes(),
            MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL,
        );
    }
}

/// The replica's `changed` message (its watch saw the run's lock change), one line.
pub(super) fn changed_line() -> String {
    Message::Changed.line()
}

/// The replica renewed the run's lock with a renewal sent at `sent` (confirmed).
pub(super) fn renewed_line(sent: Instant) -> String {
    Message::Renewed {
        sent_boot_ns: sent.as_duration().as_nanos() as u64,
    }
    .line()
}

/// The replica's `releasing` message, one line.
pub(super) fn releasing_line() -> String {
    Message::Releasing.line()
}

/// The replica's `released` message, one line.
pub(super) fn released_line(answer: &ReleaseAnswer) -> String {
    let message = match answer {
        ReleaseAnswer::Done(r) => ReleasedMessage {
            outcome: Some(match r {
                Released::Deleted => ReleaseOutcome::Deleted,
                Released::Kept => ReleaseOutcome::Kept,
                Released::NotOurs => ReleaseOutcome::NotOurs,
            }),
            error: None,
            owed: false,
        },
        ReleaseAnswer::Owed(e) | ReleaseAnswer::Failed(e) => ReleasedMessage {
            outcome: None,
            error: Some(e.clone()),
            owed: matches!(answer, ReleaseAnswer::Owed(_)),
        },
    };
    Message::Released(message).line()
}
