//! `--keep-output`: the last lines of the command's output, as its run record keeps them.
//!
//! Bytes come in pieces from the two streams in the order they arrive; each stream's pieces are
//! cut into lines, and whole lines are kept, marked with their stream, in arrival order, within
//! a budget of bytes (each line counts its bytes and its newline) and of lines (a sixteenth of
//! the bytes: a flood of empty lines cannot make the record many times larger than the budget).
//! When both streams have more than the budget, each keeps at least half of it: a stdout backlog
//! flushed at exit (a program's buffered stdout arrives after its last error line) must not push
//! out the error that explains the failure.
//! Memory is bounded by the budget: a line longer than it keeps only its end, and a stream's
//! unfinished line never holds more than the budget either. Nothing here decides anything about
//! the run: it only remembers.

use std::collections::VecDeque;

use crate::record::run::{KeptLine, KeptStream};

/// The last lines of both streams within a budget.
pub struct Kept {
    budget: usize,
    /// Per stream, its kept lines: (arrival number, line, the bytes it stood for with its
    /// newline).
    lines: [VecDeque<(u64, KeptLine, usize)>; 2],
    /// Per stream, the bytes of its kept lines.
    bytes: [usize; 2],
    /// The next line's arrival number.
    arrived: u64,
    /// Each stream's line so far, and whether its head was cut.
    partial: [Vec<u8>; 2],
    cut: [bool; 2],
}

const STREAMS: [KeptStream; 2] = [KeptStream::Stdout, KeptStream::Stderr];

impl Kept {
    /// Keep at most `budget` bytes (0: nothing).
    pub fn new(budget: usize) -> Kept {
        Kept {
            budget,
            lines: [VecDeque::new(), VecDeque::new()],
            bytes: [0, 0],
            arrived: 0,
            partial: [Vec::new(), Vec::new()],
            cut: [false; 2],
        }
    }

    fn max_lines(&self) -> usize {
        (self.budget / 16).max(1)
    }

    /// `bytes` the command wrote on stream `stream` (0: stdout, 1: stderr).
    pub fn push(&mut self, stream: usize, mut bytes: &[u8]) {
        if self.budget == 0 {
            return;
        }
        while let Some(at) = bytes.iter().position(|&b| b == b'\n') {
            self.partial[stream].extend_from_slice(&bytes[..at]);
            self.bound_partial(stream);
            self.end_line(stream);
            bytes = &bytes[at + 1..];
        }
        self.partial[stream].extend_from_slice(bytes);
        self.bound_partial(stream);
    }

    /// A line longer than the budget (with its newline) keeps its end only.
    fn bound_partial(&mut self, stream: usize) {
        let partial = &mut self.partial[stream];
        let excess = partial.len().saturating_sub(self.budget - 1);
        if excess > 0 {
            partial.drain(..excess);
            self.cut[stream] = true;
        }
    }

    fn end_line(&mut self, stream: usize) {
        let raw = std::mem::take(&mut self.partial[stream]);
        let cut = std::mem::replace(&mut self.cut[stream], false);
        let mut line = if cut {
            String::from("…")
        } else {
            String::new()
        };
        escape_into(&raw, &mut line);
        let kept = KeptLine {
            stream: STREAMS[stream],
            line,
        };
        self.bytes[stream] += raw.len() + 1;
        self.lines[stream].push_back((self.arrived, kept, raw.len() + 1));
        self.arrived += 1;
        while self.bytes[0] + self.bytes[1] > self.budget
            || self.lines[0].len() + self.lines[1].len() > self.max_lines()
        {
            let victim = self.victim();
            let Some((_, _, len)) = self.lines[victim].pop_front() else {
                break;
            };
            self.bytes[victim] -= len;
        }
    }

    /// The stream whose oldest line goes: one over half the budget (of bytes or of lines),
    /// else the one with the oldest line.
    fn victim(&self) -> usize {
        let over = |s: usize| {
            self.bytes[s] > self.budget / 2 || self.lines[s].len() > self.max_lines() / 2
        };
        match (over(0), over(1)) {
            (true, false) => 0,
            (false, true) => 1,
            _ => {
                let oldest = |s: usize| self.lines[s].front().map_or(u64::MAX, |l| l.0);
                usize::from(oldest(1) < oldest(0))
            }
        }
    }

    /// The lines kept so far, oldest first, each stream's unfinished line ended, leaving this
    /// as it was (a replica keeps its runs' lines as it relays them, and takes them at the
    /// run's release).
    pub fn lines(&self) -> Vec<KeptLine> {
        let mut copy = Kept {
            budget: self.budget,
            lines: self.lines.clone(),
            bytes: self.bytes,
            partial: self.partial.clone(),
            cut: self.cut,
            arrived: self.arrived,
        };
        for stream in 0..2 {
            if !copy.partial[stream].is_empty() {
                copy.end_line(stream);
            }
        }
        copy.finish()
    }

    /// The kept lines, oldest first, each stream's unfinished line ended.
    pub fn finish(mut self) -> Vec<KeptLine> {
        for stream in 0..2 {
            if !self.partial[stream].is_empty() {
                self.end_line(stream);
            }
        }
        let [out, err] = self.lines;
        let mut all: Vec<(u64, KeptLine, usize)> = out.into_iter().chain(err).collect();
        all.sort_by_key(|l| l.0);
        all.into_iter().map(|(_, line, _)| line).collect()
    }
}

/// `raw` as text: printable UTF-8 as it is (and tabs), any other byte as `\xNN`.
fn escape_into(raw: &[u8], out: &mut String) {
    use std::fmt::Write as _;
    for chunk in raw.utf8_chunks() {
        for c in chunk.valid().chars() {
            if c.is_control() && c != '\t' {
                let mut buf = [0u8; 4];
                for b in c.encode_utf8(&mut buf).bytes() {
                    let _ = write!(out, "\\x{b:02x}");
                }
            } else {
                out.push(c);
            }
        }
        for b in chunk.invalid() {
            let _ = write!(out, "\\x{b:02x}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kept(budget: usize, pieces: &[(usize, &[u8])]) -> Vec<String> {
        let mut k = Kept::new(budget);
        for (s, b) in pieces {
            k.push(*s, b);
        }
        k.finish()
            .into_iter()
            .map(|l| format!("{} {}", l.stream.mark(), l.line))
            .collect()
    }

    #[test]
    fn lines_are_kept_whole_marked_with_their_stream_in_arrival_order() {
        assert_eq!(
            kept(
                4096,
                &[(0, b"a1\na"), (1, b"e1\n"), (0, b"2\n"), (1, b"fatal")]
            ),
            ["out a1", "err e1", "out a2", "err fatal"]
        );
        assert!(kept(0, &[(0, b"a\n")]).is_empty());
    }

    #[test]
    fn the_newest_lines_within_the_budget_at_a_line_boundary() {
        let mut out = Vec::new();
        for i in 0..100_000 {
            out.extend(format!("line {i:06}\n").bytes());
        }
        // 12 bytes a line: 4096 / 12 = 341 whole lines, within 256 lines (4096 / 16).
        let lines = kept(4096, &[(0, &out), (1, b"the end\n")]);
        assert_eq!(lines.len(), 256);
        assert_eq!(lines.last().unwrap(), "err the end");
        assert_eq!(lines[lines.len() - 2], "out line 099999");
        assert!(lines[0].starts_with("out line 099"), "{}", lines[0]);
        // Lines of 24 bytes: the bytes bound them before the count does (1200 / 16 = 75 lines).
        let long: Vec<u8> = (0..1000)
            .flat_map(|i| format!("a longer line {i:06}...\n").into_bytes())
            .collect();
        let lines = kept(1200, &[(0, &long)]);
        let bytes: usize = lines.iter().map(|l| l.len() - 4 + 1).sum();
        assert!(bytes <= 1200 && bytes > 1200 - 24, "{bytes}");
        assert_eq!(lines.last().unwrap(), "out a longer line 000999...");
    }

    #[test]
    fn a_stdout_backlog_flushed_last_leaves_half_the_room_to_the_error() {
        let err: Vec<u8> = (0..100)
            .flat_map(|i| format!("err {i:03}\n").into_bytes())
            .collect();
        let out: Vec<u8> = (0..1000)
            .flat_map(|i| format!("out {i:03}\n").into_bytes())
            .collect();
        let lines = kept(1024, &[(1, &err), (0, &out)]);
        let errs = lines.iter().filter(|l| l.starts_with("err")).count();
        // 8 bytes a line, 512 bytes each, within 64 lines in all (1024 / 16).
        assert_eq!(errs, 32, "{lines:?}");
        assert_eq!(lines.len(), 64);
        assert_eq!(lines[31], "err err 099");
        assert_eq!(lines[63], "out out 999");
        // Arrival order: the errors came first.
        assert!(lines[..32].iter().all(|l| l.starts_with("err")));
    }

    #[test]
    fn a_line_longer_than_the_budget_keeps_its_end() {
        let long = vec![b'x'; 1 << 20];
        let lines = kept(1024, &[(1, &long), (1, b"y\n")]);
        assert_eq!(lines.len(), 1);
        assert!(lines[0].starts_with("err …xxx") && lines[0].ends_with("xy"));
        assert_eq!(lines[0].len(), "err …".len() + 1023);
    }

    #[test]
    fn invalid_utf8_and_control_characters_are_escaped() {
        let lines = kept(4096, &[(0, b"ok \xff\xfe caf\xc3\xa9\t\x1b[31mred\r\n")]);
        assert_eq!(lines, ["out ok \\xff\\xfe café\t\\x1b[31mred\\x0d"]);
    }
}
