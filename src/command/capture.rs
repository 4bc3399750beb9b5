//! The command's output passing through cronlock, which keeps its end: for `--ping-body`, the
//! last [`TAIL`] bytes for the final ping's body; for `--keep-output`, the last lines for the
//! run record ([`crate::command::kept`]). A stream that is not captured is cronlock's own,
//! untouched; `--keep-output` never captures a terminal.
//!
//! A pipe replaces each captured stream. One thread copies both to cronlock's own stdout and
//! stderr as the bytes come, and keeps the ends; it starts only once the command has written
//! something (the read ends wake the main loop, `O_ASYNC`, until then), so a command that prints
//! nothing, as most cron jobs, costs no thread. When a stream's reader goes away, its copying
//! stops, so the command's next write there fails as it would without cronlock between. A
//! reader that does not read holds back both streams' copies (the thread blocks writing to it),
//! as it would hold back a command that writes both streams from one thread.
//!
//! The thread reads whichever pipe has bytes, so the order in which they arrive is not always
//! the order the command wrote them: a stdout backlog still in its pipe can arrive after the
//! final error line on stderr. One shared 10 KiB window would then drop that error line, the
//! part a reader of the ping wants most. So each stream keeps its own tail, and the body gives
//! each stream at least half of [`TAIL`] (all of it when the other is shorter), in arrival order.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::mem::ManuallyDrop;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::fcntl::OFlag;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::unistd::pipe2;

use crate::command::child::Stdio;
use crate::command::guard::UNTOUCHED;
use crate::command::kept::Kept;
use crate::record::run::KeptLine;

/// How much output the ping carries (Healthchecks keeps up to 100 kB; the end is what matters).
pub const TAIL: usize = 10 * 1024;

pub struct Capture {
    writers: [Option<OwnedFd>; 2],
    /// The read ends, until the copying thread takes them (or the main thread copies, when no
    /// thread could be started).
    reads: Streams,
    tails: Arc<Mutex<Tails>>,
    /// Once the copying thread runs: told when it is done.
    done: Option<mpsc::Receiver<()>>,
}

/// The captured streams' read ends (stdout, stderr), each until it ends.
type Streams = [Option<std::fs::File>; 2];

/// What passes through cronlock, and what of it is kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CapturePlan {
    /// Per stream (stdout, stderr): whether it passes through cronlock.
    pub streams: [bool; 2],
    /// `--ping-body`: keep the last [`TAIL`] bytes for the final ping.
    pub ping_body: bool,
    /// `--keep-output`: the budget of the kept lines (0: none).
    pub keep: usize,
}

impl CapturePlan {
    /// What `--ping-body` and `--keep-output` ask for; `None` when nothing passes through
    /// cronlock. `--ping-body` takes both streams; `--keep-output` takes only a stream that is
    /// open and not a terminal (a terminal's output is on someone's screen, and the command must
    /// still see a terminal there).
    pub fn new(ping_body: bool, keep: usize) -> Option<CapturePlan> {
        let streams = [libc::STDOUT_FILENO, libc::STDERR_FILENO].map(|fd| {
            ping_body
                || (keep > 0 && fd_open(fd) && !std::io::IsTerminal::is_terminal(&borrowed(fd)))
        });
        (streams != [false; 2]).then_some(CapturePlan {
            streams,
            ping_body,
            keep,
        })
    }
}

/// fd 1 or 2, once known to be open ([`fd_open`]): cronlock never closes them.
fn borrowed(fd: RawFd) -> std::os::fd::BorrowedFd<'static> {
    // SAFETY: the callers pass fd 1 or 2 after checking it is open, and cronlock keeps its
    // stdout and stderr open for its whole life.
    unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) }
}

/// Whether descriptor `fd` is open (`F_GETFD` fails with EBADF on a closed one).
fn fd_open(fd: RawFd) -> bool {
    // SAFETY: F_GETFD only reads the flags of a descriptor number; it touches no memory.
    unsafe { libc::fcntl(fd, libc::F_GETFD) >= 0 }
}

/// Wait (at most `within`) until whoever reads cronlock's stdout and stderr pipes has read
/// what is in them: a replica's run, before it asks for its release, so that the replica, which
/// keeps the lines of its runs' output as it relays them (`--keep-output`), has every line the
/// command wrote. A stream that is not a pipe has nothing waiting.
pub fn wait_until_read(within: Duration) {
    let end = std::time::Instant::now() + within;
    let waiting = || {
        [libc::STDOUT_FILENO, libc::STDERR_FILENO]
            .into_iter()
            .any(|fd| crate::command::sys::unread(fd) > 0 && is_pipe(fd))
    };
    while waiting() && std::time::Instant::now() < end {
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn is_pipe(fd: RawFd) -> bool {
    nix::sys::stat::fstat(borrowed(fd)).is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFIFO)
}

/// The output's ends, as the run's reports and record want them.
#[derive(Default)]
pub struct Captured {
    /// `--ping-body`: the final ping's body.
    pub body: Option<Vec<u8>>,
    /// `--keep-output`: the last lines, oldest first.
    pub kept: Vec<KeptLine>,
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

/// The ping's tail and the kept lines, fed by the copying thread.
struct Tails {
    ping: Option<Tail>,
    kept: Kept,
}

impl Capture {
    /// The pipes; nothing copies yet. Their read ends wake the main loop when the command
    /// writes ([`Capture::look`] then starts the copying).
    pub fn start(plan: CapturePlan) -> std::io::Result<Capture> {
        let tails = Arc::new(Mutex::new(Tails {
            ping: plan.ping_body.then(Tail::default),
            kept: Kept::new(plan.keep),
        }));
        let mut writers = [None, None];
        let mut reads = [None, None];
        for stream in [0, 1].into_iter().filter(|&s| plan.streams[s]) {
            let (read, write) = pipe2(OFlag::O_CLOEXEC)?;
            crate::signals::wake_on_readable(read.as_raw_fd(), true)?;
            writers[stream] = Some(write);
            reads[stream] = Some(std::fs::File::from(read));
        }
        Ok(Capture {
            writers,
            reads,
            tails,
            done: None,
        })
    }

    /// The pipes, for the command's stdout and stderr (before the copying starts: the guard
    /// closes its copies of the read ends).
    pub fn stdio(&self) -> Stdio {
        Stdio {
            writers: [0, 1].map(|s| {
                self.writers[s]
                    .as_ref()
                    .map_or(UNTOUCHED, |w| w.as_raw_fd())
            }),
            readers: [0, 1].map(|s| self.reads[s].as_ref().map_or(UNTOUCHED, |r| r.as_raw_fd())),
        }
    }

    /// Close our copies of the write ends once the command has its own.
    pub fn started(&mut self) {
        self.writers = [None, None];
    }

    /// On each turn of the main loop: once the command has written, the copying starts (on a
    /// thread of its own; where none can be started, here, a turn at a time).
    pub fn look(&mut self) {
        if self.done.is_some() {
            return;
        }
        let written = self
            .reads
            .iter()
            .flatten()
            .any(|r| crate::command::sys::unread(r.as_raw_fd()) > 0);
        if written && !self.copy_apart() {
            copy_some(&mut self.reads, &self.tails, PollTimeout::ZERO);
        }
    }

    /// Hand the read ends to a copying thread. False when none could be started (the read ends
    /// are then still here).
    fn copy_apart(&mut self) -> bool {
        let (done_tx, done) = mpsc::channel();
        let mut reads = std::mem::take(&mut self.reads);
        for r in reads.iter().flatten() {
            let _ = crate::signals::wake_on_readable(r.as_raw_fd(), false);
        }
        let tails = self.tails.clone();
        let (give, take) = mpsc::sync_channel::<Streams>(1);
        let spawned = std::thread::Builder::new()
            .name("output".into())
            .stack_size(64 * 1024)
            .spawn(move || {
                if let Ok(mut reads) = take.recv() {
                    while !copy_some(&mut reads, &tails, PollTimeout::NONE) {}
                }
                let _ = done_tx.send(());
            });
        match spawned {
            Ok(_) => {
                let _ = give.send(std::mem::take(&mut reads));
                self.done = Some(done);
                true
            }
            Err(_) => {
                for r in reads.iter().flatten() {
                    let _ = crate::signals::wake_on_readable(r.as_raw_fd(), true);
                }
                self.reads = reads;
                false
            }
        }
    }

    /// The output's ends, once the pipes are drained (waiting at most `within`: a descendant
    /// that escaped with a pipe open must not hold up the end of the run).
    pub fn finish(mut self, within: Duration) -> Captured {
        self.writers = [None, None];
        let end = std::time::Instant::now() + within;
        let open = |reads: &Streams| reads.iter().flatten().any(|r| !drained(r));
        if self.done.is_none() && open(&self.reads) && !self.copy_apart() {
            while !copy_some(&mut self.reads, &self.tails, PollTimeout::from(10u8)) {
                if std::time::Instant::now() >= end {
                    break;
                }
            }
        }
        if let Some(done) = &self.done {
            let _ = done.recv_timeout(end.saturating_duration_since(std::time::Instant::now()));
        }
        let mut tails = self.tails.lock().unwrap_or_else(|e| e.into_inner());
        let body = tails.ping.as_ref().map(Tail::body);
        let kept = std::mem::replace(&mut tails.kept, Kept::new(0)).finish();
        Captured { body, kept }
    }
}

/// Whether a pipe's read end holds nothing and has no writer left.
fn drained(from: &std::fs::File) -> bool {
    let mut fds = [PollFd::new(from.as_fd(), PollFlags::POLLIN)];
    let hung_up = poll(&mut fds, PollTimeout::ZERO).is_ok_and(|n| n == 1)
        && fds[0]
            .revents()
            .is_some_and(|r| r.contains(PollFlags::POLLHUP));
    hung_up && crate::command::sys::unread(from.as_raw_fd()) <= 0
}

/// One round of copying: wait (at most `timeout`) until a stream has bytes or ended, then copy
/// what came to cronlock's own stream and keep its end. A stream that ended, failed, or whose
/// reader went away is closed. True once every stream is closed.
fn copy_some(reads: &mut Streams, tails: &Mutex<Tails>, timeout: PollTimeout) -> bool {
    let ready: Vec<usize> = {
        let (which, mut fds): (Vec<usize>, Vec<PollFd>) = reads
            .iter()
            .enumerate()
            .filter_map(|(s, r)| Some((s, PollFd::new(r.as_ref()?.as_fd(), PollFlags::POLLIN))))
            .unzip();
        if fds.is_empty() {
            return true;
        }
        if !poll(&mut fds, timeout).is_ok_and(|n| n > 0) {
            return false;
        }
        which
            .into_iter()
            .zip(&fds)
            .filter(|(_, f)| f.revents().is_some_and(|r| !r.is_empty()))
            .map(|(s, _)| s)
            .collect()
    };
    let mut buf = [0u8; 8192];
    for stream in ready {
        let Some(from) = reads[stream].as_mut() else {
            continue;
        };
        let n = match from.read(&mut buf) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => 0,
        };
        if n == 0 || !pass_on(stream, &buf[..n], tails) {
            reads[stream] = None;
        }
    }
    reads.iter().all(Option::is_none)
}

/// Keep the bytes' end and write them to cronlock's own stream. False when its reader went
/// away: the command's next write then fails as it would have without cronlock between
/// (SIGPIPE), so `cronlock KEY -- yes | head -1` still ends. (Any other failure to write is the
/// reader's; the output goes on being kept.)
fn pass_on(stream: usize, bytes: &[u8], tails: &Mutex<Tails>) -> bool {
    {
        let mut tails = tails.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(ping) = tails.ping.as_mut() {
            ping.push(stream, bytes);
        }
        tails.kept.push(stream, bytes);
    }
    let target = [libc::STDOUT_FILENO, libc::STDERR_FILENO][stream];
    // SAFETY: fd 1 or 2, which stays open for cronlock's life; ManuallyDrop never closes it.
    let mut to = ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(target) });
    !matches!(to.write_all(bytes), Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe)
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
