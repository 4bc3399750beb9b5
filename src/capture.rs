//! `--ping-body`: the command's output passes through cronlock, which keeps its last
//! [`TAIL`] bytes for the final ping's body. Only when asked: otherwise the command's stdio is
//! cronlock's own, untouched, and no output ever leaves the host.
//!
//! Two pipes replace the command's stdout and stderr; a thread per pipe copies everything to
//! cronlock's own stdout or stderr as it comes and keeps the tail.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::mem::ManuallyDrop;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::fcntl::OFlag;
use nix::unistd::pipe2;

/// How much output the ping carries (Healthchecks keeps up to 100 kB; the end is what matters).
pub const TAIL: usize = 10 * 1024;

pub struct Capture {
    writers: Option<[OwnedFd; 2]>,
    tail: Arc<Mutex<VecDeque<u8>>>,
    done: mpsc::Receiver<()>,
}

impl Capture {
    pub fn start() -> std::io::Result<Capture> {
        let tail = Arc::new(Mutex::new(VecDeque::with_capacity(TAIL)));
        let (done_tx, done) = mpsc::channel();
        let mut writers = Vec::new();
        for target in [libc::STDOUT_FILENO, libc::STDERR_FILENO] {
            let (read, write) = pipe2(OFlag::O_CLOEXEC)?;
            writers.push(write);
            let (tail, done_tx) = (tail.clone(), done_tx.clone());
            std::thread::Builder::new()
                .name("output".into())
                .stack_size(64 * 1024)
                .spawn(move || {
                    copy(read, target, &tail);
                    let _ = done_tx.send(());
                })?;
        }
        let [out, err]: [OwnedFd; 2] = writers.try_into().expect("two pipes");
        Ok(Capture {
            writers: Some([out, err]),
            tail,
            done,
        })
    }

    /// The write ends, for the command's stdout and stderr.
    pub fn fds(&self) -> Option<[RawFd; 2]> {
        self.writers
            .as_ref()
            .map(|[o, e]| [o.as_raw_fd(), e.as_raw_fd()])
    }

    /// Close our copies of the write ends once the command has its own.
    pub fn started(&mut self) {
        self.writers = None;
    }

    /// The output's tail, once both pipes are drained (waiting at most `within`: a descendant
    /// that escaped with the pipe open must not hold up the end of the run).
    pub fn finish(mut self, within: Duration) -> Vec<u8> {
        self.writers = None;
        let end = std::time::Instant::now() + within;
        for _ in 0..2 {
            let left = end.saturating_duration_since(std::time::Instant::now());
            if self.done.recv_timeout(left).is_err() {
                break;
            }
        }
        let tail = self.tail.lock().unwrap_or_else(|e| e.into_inner());
        tail.iter().copied().collect()
    }
}

fn copy(read: OwnedFd, target: RawFd, tail: &Mutex<VecDeque<u8>>) {
    let mut from = std::fs::File::from(read);
    // SAFETY: fd 1 or 2, which stays open for cronlock's life; ManuallyDrop never closes it.
    let mut to = ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(target) });
    let mut buf = [0u8; 8192];
    let mut writing = true;
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return,
        };
        // A reader that went away must not block the command: keep draining.
        writing = writing && to.write_all(&buf[..n]).is_ok();
        let mut t = tail.lock().unwrap_or_else(|e| e.into_inner());
        t.extend(&buf[..n]);
        let excess = t.len().saturating_sub(TAIL);
        t.drain(..excess);
    }
}
