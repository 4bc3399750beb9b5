//! The link between a replica (`--crontab`) and its starter (`run/starter.rs`): a Unix stream
//! socket pair whose starter end is the starter's standard input when the replica spawns it.
//! Each message ([`StarterMessage`]) is a 4-byte length (big-endian) and that many bytes; a
//! `start` carries the run's descriptors (its channel to the replica, its stdout, its stderr)
//! as `SCM_RIGHTS` on the same write, and they arrive close-on-exec.

pub mod message;

use std::io::{IoSlice, IoSliceMut, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use anyhow::{anyhow, bail, Result};
use nix::sys::socket::{self, ControlMessage, ControlMessageOwned, MsgFlags};

use crate::starting::message::StarterMessage;

/// The name (`argv[0]`) a replica gives its starter; cronlock started so is a starter.
pub const STARTER_ARG0: &str = "cronlock-starter";

/// The longest message (a crontab job's run and its variables fit: the file is at most 1 MiB).
pub const MAX_STARTER_MESSAGE: usize = 4 << 20;
/// The most descriptors one message carries.
const MAX_FDS: usize = 3;
/// How long a write, or the rest of a message begun, may take: a peer that stalls longer is
/// broken.
const STALL: Duration = Duration::from_secs(2);

/// A new link's two ends.
pub struct LinkPair {
    /// The replica's end.
    pub link: StarterLink,
    /// The descriptor the starter gets as its standard input.
    pub theirs: OwnedFd,
}

/// A message, and the descriptors that came with it.
pub struct Received {
    pub message: StarterMessage,
    pub fds: Vec<OwnedFd>,
}

/// One end of the link.
pub struct StarterLink {
    stream: UnixStream,
}

impl StarterLink {
    /// A new link.
    pub fn pair() -> Result<LinkPair> {
        let (ours, theirs) = UnixStream::pair().map_err(|e| anyhow!(crate::log::io_text(&e)))?;
        ours.set_write_timeout(Some(STALL))
            .map_err(|e| anyhow!(crate::log::io_text(&e)))?;
        Ok(LinkPair {
            link: StarterLink { stream: ours },
            theirs: OwnedFd::from(theirs),
        })
    }

    /// The starter's end, from the descriptor it was given.
    pub fn adopt(fd: OwnedFd) -> Result<StarterLink> {
        let stream = UnixStream::from(fd);
        stream
            .set_write_timeout(Some(STALL))
            .map_err(|e| anyhow!(crate::log::io_text(&e)))?;
        Ok(StarterLink { stream })
    }

    /// Another handle on the same end (a reader thread's).
    pub fn try_clone(&self) -> Result<StarterLink> {
        let stream = self
            .stream
            .try_clone()
            .map_err(|e| anyhow!(crate::log::io_text(&e)))?;
        Ok(StarterLink { stream })
    }

    pub fn raw(&self) -> RawFd {
        self.stream.as_raw_fd()
    }

    /// Shut the link both ways: the starter sees its end.
    pub fn shutdown(&self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }

    /// Send `message`, with `fds` (at most three) beside it.
    pub fn send(&self, message: &StarterMessage, fds: &[RawFd]) -> Result<()> {
        let body = message.encode();
        if body.len() > MAX_STARTER_MESSAGE || fds.len() > MAX_FDS {
            bail!("a starter message of {} bytes is too long", body.len());
        }
        let mut bytes = (body.len() as u32).to_be_bytes().to_vec();
        bytes.extend_from_slice(&body);
        let rights = [ControlMessage::ScmRights(fds)];
        let cmsgs: &[ControlMessage] = if fds.is_empty() { &[] } else { &rights };
        let sent = socket::sendmsg::<()>(
            self.raw(),
            &[IoSlice::new(&bytes)],
            cmsgs,
            MsgFlags::MSG_NOSIGNAL,
            None,
        )
        .map_err(|e| anyhow!("cannot write to the starter link: {e}"))?;
        // The descriptors went with the first bytes; the rest (a long message) follows.
        (&self.stream).write_all(&bytes[sent..]).map_err(|e| {
            anyhow!(
                "cannot write to the starter link: {}",
                crate::log::io_text(&e)
            )
        })
    }

    /// The next message; `None` at end of file. Blocks until a message begins; its rest must
    /// follow within [`STALL`].
    pub fn receive(&self) -> Result<Option<Received>> {
        let mut head = [0u8; 4];
        let mut space = nix::cmsg_space!([RawFd; MAX_FDS]);
        let (got, fds) = {
            let mut iov = [IoSliceMut::new(&mut head)];
            let msg = socket::recvmsg::<()>(
                self.raw(),
                &mut iov,
                Some(&mut space),
                MsgFlags::MSG_CMSG_CLOEXEC,
            )
            .map_err(|e| anyhow!("cannot read the starter link: {e}"))?;
            let mut fds = Vec::new();
            for cmsg in msg
                .cmsgs()
                .map_err(|e| anyhow!("cannot read the starter link: {e}"))?
            {
                if let ControlMessageOwned::ScmRights(list) = cmsg {
                    fds.extend(list.into_iter().map(received));
                }
            }
            (msg.bytes, fds)
        };
        if got == 0 {
            return Ok(None);
        }
        self.stream
            .set_read_timeout(Some(STALL))
            .map_err(|e| anyhow!(crate::log::io_text(&e)))?;
        let rest = (|| -> Result<StarterMessage> {
            (&self.stream)
                .read_exact(&mut head[got..])
                .map_err(|e| anyhow!("a starter message cut short: {}", crate::log::io_text(&e)))?;
            let len = u32::from_be_bytes(head) as usize;
            if len > MAX_STARTER_MESSAGE {
                bail!("a starter message of {len} bytes is too long");
            }
            let mut body = vec![0u8; len];
            (&self.stream)
                .read_exact(&mut body)
                .map_err(|e| anyhow!("a starter message cut short: {}", crate::log::io_text(&e)))?;
            StarterMessage::decode(&body)
        })();
        self.stream
            .set_read_timeout(None)
            .map_err(|e| anyhow!(crate::log::io_text(&e)))?;
        Ok(Some(Received {
            message: rest?,
            fds,
        }))
    }
}

/// A descriptor that came with a message.
fn received(fd: RawFd) -> OwnedFd {
    // SAFETY: the kernel just installed this descriptor in this process for the message being
    // read; nothing else owns it.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

impl AsFd for StarterLink {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.stream.as_fd()
    }
}

/// Standard input, where the starter's end of the link is given: moved to a close-on-exec
/// descriptor (so nothing the runs start inherits it), with /dev/null put in its place.
pub fn take_stdin() -> Result<OwnedFd> {
    let moved = nix::fcntl::fcntl(std::io::stdin(), nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(3))
        .map_err(|e| anyhow!("standard input is not the starter's link: {e}"))?;
    let null =
        std::fs::File::open("/dev/null").map_err(|e| anyhow!("cannot open /dev/null: {e}"))?;
    nix::unistd::dup2_stdin(&null)
        .map_err(|e| anyhow!("cannot put /dev/null on standard input: {e}"))?;
    // SAFETY: fcntl just made this descriptor for this process; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(moved) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_and_its_descriptors_arrive_together() {
        let LinkPair { link: ours, theirs } = StarterLink::pair().unwrap();
        let theirs = StarterLink::adopt(theirs).unwrap();
        let (a, _b) = UnixStream::pair().unwrap();
        let long = format!("\"{}\"", "x".repeat(300_000));
        let m = StarterMessage::Start {
            id: 1,
            key: "k".into(),
            run: serde_json::from_str(&long).unwrap(),
        };
        let sender = std::thread::spawn(move || ours.send(&m, &[a.as_raw_fd()]).map(|_| ours));
        let Received { message: got, fds } = theirs.receive().unwrap().unwrap();
        let ours = sender.join().unwrap().unwrap();
        assert!(matches!(got, StarterMessage::Start { id: 1, .. }));
        assert_eq!(fds.len(), 1);
        ours.send(&StarterMessage::Exited { pid: 3, status: 0 }, &[])
            .unwrap();
        drop(ours);
        assert!(matches!(
            theirs.receive().unwrap(),
            Some(Received {
                message: StarterMessage::Exited { pid: 3, .. },
                ..
            })
        ));
        assert!(theirs.receive().unwrap().is_none());
    }
}
