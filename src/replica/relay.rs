//! One thread that reads the lines of many runs' descriptors: a replica has two, one for all its
//! runs' output (stdout and stderr, relayed with their KEY, `output.rs`) and one for all their
//! channels (the reports, `handover/mod.rs`), instead of three threads per run. Each waits in
//! `poll` on its descriptors and a wake-up pipe (a new descriptor to read); each descriptor's
//! bytes are cut into lines, at most `max` bytes each (a longer line is cut there). Output and
//! reports have threads of their own, so a stalled reader of the replica's stdout never delays
//! what a run reports.

use std::collections::HashMap;
use std::io::{PipeReader, PipeWriter, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::mpsc::{self, Receiver, Sender};

use anyhow::{anyhow, Result};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

/// What a line read from one descriptor is for; told `None` at its end of file.
pub type OnLine = Box<dyn FnMut(Option<&[u8]>) + Send>;

/// A descriptor to read, its handler, and how long its lines may be.
pub struct Source {
    pub fd: OwnedFd,
    pub on_line: OnLine,
    pub max_line: usize,
}

/// The handle on a relay thread.
pub struct Relay {
    add: Sender<Source>,
    wake: PipeWriter,
}

impl Relay {
    pub fn start(name: &str) -> Result<Relay> {
        let (wake_r, wake) = std::io::pipe().map_err(|e| anyhow!(crate::log::io_text(&e)))?;
        let (add, added) = mpsc::channel();
        std::thread::Builder::new()
            .name(name.into())
            .stack_size(256 * 1024)
            .spawn(move || serve(wake_r, &added))
            .map_err(|e| anyhow!("cannot start a thread: {e}"))?;
        Ok(Relay { add, wake })
    }

    /// Read `source` from now on.
    pub fn add(&self, source: Source) {
        if self.add.send(source).is_ok() {
            let _ = (&self.wake).write(&[1]);
        }
    }
}

/// One descriptor being read.
struct Reading {
    file: std::fs::File,
    on_line: OnLine,
    max_line: usize,
    buf: Vec<u8>,
}

fn serve(mut wake: PipeReader, added: &Receiver<Source>) {
    let mut reading: HashMap<u64, Reading> = HashMap::new();
    let mut next = 0u64;
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        let ids: Vec<u64> = reading.keys().copied().collect();
        let mut fds = vec![PollFd::new(wake.as_fd(), PollFlags::POLLIN)];
        fds.extend(
            ids.iter()
                .map(|id| PollFd::new(reading[id].file.as_fd(), PollFlags::POLLIN)),
        );
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(_) => return,
        }
        let ready: Vec<bool> = fds
            .iter()
            .map(|f| f.revents().is_some_and(|r| !r.is_empty()))
            .collect();
        drop(fds);
        if ready[0] {
            // The replica is gone when its end of the pipe is.
            if matches!(wake.read(&mut chunk), Ok(0) | Err(_)) {
                return;
            }
            while let Ok(source) = added.try_recv() {
                next += 1;
                reading.insert(
                    next,
                    Reading {
                        file: source.fd.into(),
                        on_line: source.on_line,
                        max_line: source.max_line.max(1),
                        buf: Vec::new(),
                    },
                );
            }
        }
        for (id, _) in ids.iter().zip(&ready[1..]).filter(|(_, r)| **r) {
            let ended = reading.get_mut(id).is_none_or(|r| r.read_some(&mut chunk));
            if ended {
                if let Some(mut r) = reading.remove(id) {
                    r.end();
                }
            }
        }
    }
}

impl Reading {
    /// Read what is there and hand on each whole line; whether the descriptor ended.
    fn read_some(&mut self, chunk: &mut [u8]) -> bool {
        let got = match (&self.file).read(chunk) {
            Ok(0) | Err(_) => return true,
            Ok(n) => n,
        };
        self.buf.extend_from_slice(&chunk[..got]);
        loop {
            let cut = match self.buf.iter().position(|b| *b == b'\n') {
                Some(at) if at < self.max_line => at + 1,
                _ if self.buf.len() >= self.max_line => self.max_line,
                _ => break,
            };
            let line: Vec<u8> = self.buf.drain(..cut).collect();
            (self.on_line)(Some(&line));
        }
        false
    }

    /// Its end: a last line without a newline, then `None`.
    fn end(&mut self) {
        if !self.buf.is_empty() {
            let line = std::mem::take(&mut self.buf);
            (self.on_line)(Some(&line));
        }
        (self.on_line)(None);
    }
}
