//! `--ping-body`: the command's output passes through cronlock, which keeps its last
//! [`TAIL`] bytes for the final ping's body. Only when asked: otherwise the command's stdio is
//! cronlock's own, untouched, and no output ever leaves the host.
//!
//! Two pipes replace the command's stdout and stderr; a thread per pipe copies everything to
//! cronlock's own stdout or stderr as it comes and keeps the tail.
//!
//! The two pipes are read by two threads, so the order in which their bytes arrive is not the
//! order the command wrote them: a stdout backlog still in its pipe can arrive after the final
//! error line on stderr. One shared 10 KiB window would then drop that error line, the part a
//! reader of the ping wants most. So each stream keeps its own tail, and the body gives each
//! stream at least half of [`TAIL`] (all of it when the other is shorter), in arrival order.

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
    tail: Arc<Mutex<Tail>>,
    done: mpsc::Receiver<()>,
}

/// The last output of both streams, and the order its pieces arrived in.
#[derive(Default)]
struct Tail {
    /// Per stream: its last [`TAIL`] bytes, and how many bytes it produced in all.
    kept: [VecDeque<u8>; 2],
    total: [u64; 2],
    /// Pieces in arrival order: (stream, offset of its end in that stream's output).
    pieces: VecDeque<(usize, u64)>,
}

impl Tail {
    fn push(&mut self, stream: usize, bytes: &[u8]) {
        let kept = &mut self.kept[stream];
        kept.extend(bytes);
        let excess = kept.len().saturating_sub(TAIL);
        kept.drain(..excess);
        self.total[stream] += bytes.len() as u64;
        self.pieces.push_back((stream, self.total[stream]));
        // Forget pieces that ended before what either stream still keeps.
        if self.pieces.len() > 4 * TAIL {
            let starts = self.starts();
            self.pieces.retain(|&(s, end)| end > starts[s]);
        }
    }

    /// Where each stream's kept bytes start, in that stream's output.
    fn starts(&self) -> [u64; 2] {
        [0, 1].map(|s| self.total[s] - self.kept[s].len() as u64)
    }

    /// At most [`TAIL`] bytes: each stream's last bytes, at least half of the room each unless
    /// the other needs less, interleaved in the order they arrived.
    fn body(&self) -> Vec<u8> {
        let len = [0, 1].map(|s| self.kept[s].len());
        let half = TAIL / 2;
        let room = [0, 1].map(|s| {
            let other = len[1 - s].min(half);
            len[s].min(TAIL - other)
        });
        let from = [0, 1].map(|s| self.total[s] - room[s] as u64);
        let starts = self.starts();
        let mut body = Vec::with_capacity(room[0] + room[1]);
        let mut begin = starts;
        for &(s, end) in &self.pieces {
            let (lo, hi) = (begin[s].max(from[s]), end);
            begin[s] = end;
            if hi > lo && lo >= starts[s] {
                let (a, b) = ((lo - starts[s]) as usize, (hi - starts[s]) as usize);
                body.extend(self.kept[s].range(a..b));
            }
        }
        body
    }
}

impl Capture {
    pub fn start() -> std::io::Result<Capture> {
        let tail = Arc::new(Mutex::new(Tail::default()));
        let (done_tx, done) = mpsc::channel();
        let mut writers = Vec::new();
        for (stream, target) in [libc::STDOUT_FILENO, libc::STDERR_FILENO]
            .into_iter()
            .enumerate()
        {
            let (read, write) = pipe2(OFlag::O_CLOEXEC)?;
            writers.push(write);
            let (tail, done_tx) = (tail.clone(), done_tx.clone());
            std::thread::Builder::new()
                .name("output".into())
                .stack_size(64 * 1024)
                .spawn(move || {
                    copy(read, target, stream, &tail);
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
        tail.body()
    }
}

fn copy(read: OwnedFd, target: RawFd, stream: usize, tail: &Mutex<Tail>) {
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
        tail.lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(stream, &buf[..n]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(pieces: &[(usize, &[u8])]) -> Vec<u8> {
        let mut t = Tail::default();
        for (s, b) in pieces {
            t.push(*s, b);
        }
        t.body()
    }

    #[test]
    fn short_output_is_kept_whole_in_arrival_order() {
        assert_eq!(
            body(&[(0, b"a1 "), (1, b"e1 "), (0, b"a2 "), (1, b"e2")]),
            b"a1 e1 a2 e2"
        );
        assert_eq!(body(&[]), b"");
    }

    #[test]
    fn a_late_stdout_backlog_does_not_push_out_the_last_error_line() {
        let big = vec![b'x'; 8192];
        let b = body(&[(1, b"fatal: disk full\n"), (0, &big), (0, &big), (0, &big)]);
        assert_eq!(b.len(), TAIL);
        assert!(b.starts_with(b"fatal: disk full\n"));
        assert!(b[17..].iter().all(|&c| c == b'x'));
    }

    #[test]
    fn two_floods_share_the_room_half_and_half() {
        let mut pieces = Vec::new();
        for i in 0..50_000u32 {
            pieces.push((
                (i % 2) as usize,
                if i % 2 == 0 { &b"o"[..] } else { &b"e"[..] },
            ));
        }
        let b = body(&pieces);
        assert_eq!(b.len(), TAIL);
        assert_eq!(b.iter().filter(|&&c| c == b'o').count(), TAIL / 2);
        assert!(b.ends_with(b"oe"));
    }

    #[test]
    fn the_newest_bytes_of_each_stream_are_the_ones_kept() {
        let mut out = Vec::new();
        for i in 0..3000 {
            out.extend(format!("{i:04}\n").bytes());
        }
        let b = body(&[(0, &out), (1, b"err\n")]);
        assert_eq!(b.len(), TAIL);
        assert!(b.ends_with(b"2999\nerr\n"));
    }
}
