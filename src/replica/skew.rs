//! How far this host's clock is from Redis's: a replica names, schedules and claims instants by
//! Redis's clock ([`crate::clock::redis_millis`]), so a host whose clock runs fast or slow claims
//! each instant when Redis's clock reaches it. Measured from the replies that carry Redis's
//! clock (each heartbeat's, and a claim Redis found early), each read with the time it took
//! there and back: the offset is the one of the quickest of the recent samples (its error is at
//! most half that time), and a sample that disagrees with it by more than both their errors
//! means a clock stepped (NTP, a resume): the samples before it are dropped.
//!
//! Past [`WARN_MS`] the replica says so in its log, once each time it gets there, and shows the
//! offset on `/metrics` (`cronlock_replica_clock_offset_seconds`), on its page and in its
//! heartbeat (`--status` lists it).

use std::collections::VecDeque;

use crate::clock::rfc3339;
use crate::log::Log;

/// How many recent samples the offset is chosen from.
const KEPT: usize = 16;

/// Past this offset (ms, either way) the replica warns in its log; under half of it again, it
/// may warn anew.
pub const WARN_MS: i64 = 500;

/// One reading of Redis's clock: what it said (Unix ms), this host's wall clock halfway through
/// the call, and how long the call took (ms).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClockSample {
    pub redis_ms: i64,
    pub local_ms: i64,
    pub took_ms: i64,
}

/// When a call went out and when its answer came, on this host's wall clock (Unix ms).
#[derive(Debug, Clone, Copy)]
pub struct CallWindow {
    pub before: i64,
    pub after: i64,
}

impl CallWindow {
    /// A call about to go out.
    pub fn start() -> CallWindow {
        let now = crate::clock::unix_millis() as i64;
        CallWindow {
            before: now,
            after: now,
        }
    }

    /// Its answer came.
    pub fn ended(self) -> CallWindow {
        CallWindow {
            after: crate::clock::unix_millis() as i64,
            ..self
        }
    }
}

impl ClockSample {
    /// Redis said `redis_ms` in the call of `window`; none when Redis did not read its clock.
    pub fn of(redis_ms: i64, window: CallWindow) -> Option<ClockSample> {
        let CallWindow { before, after } = window;
        (redis_ms > 0).then(|| ClockSample {
            redis_ms,
            local_ms: before + (after - before).max(0) / 2,
            took_ms: (after - before).max(0),
        })
    }

    fn offset(&self) -> i64 {
        self.redis_ms - self.local_ms
    }

    /// The most this sample's offset can be wrong by (ms).
    fn error(&self) -> i64 {
        self.took_ms / 2 + 1
    }
}

/// The replica's measurement of its clock against Redis's.
#[derive(Default)]
pub struct Skew {
    samples: VecDeque<ClockSample>,
    /// The offset in use (ms; Redis's clock minus this host's), once measured.
    offset: Option<i64>,
    warned: bool,
}

impl Skew {
    /// A new reading: the offset follows (and [`crate::clock::redis_millis`] with it). Whether
    /// it is the first (the replica's times so far were its own clock's).
    pub fn heard(&mut self, sample: ClockSample, log: &Log) -> bool {
        if let Some(best) = self.best() {
            if (sample.offset() - best.offset()).abs() > sample.error() + best.error() + 50 {
                self.samples.clear();
            }
        }
        if self.samples.len() >= KEPT {
            self.samples.pop_front();
        }
        self.samples.push_back(sample);
        let Some(best) = self.best() else {
            return false;
        };
        let offset = best.offset();
        let first = self.offset.replace(offset).is_none();
        crate::clock::set_redis_offset(offset);
        self.tell(offset, log);
        first
    }

    /// The offset in use: how far Redis's clock is ahead of this host's (ms; negative: behind).
    pub fn offset(&self) -> Option<i64> {
        self.offset
    }

    fn best(&self) -> Option<ClockSample> {
        self.samples.iter().copied().min_by_key(|s| s.took_ms)
    }

    /// Past [`WARN_MS`]: one line, until it is back under half of it.
    fn tell(&mut self, offset: i64, log: &Log) {
        if offset.abs() < WARN_MS / 2 {
            self.warned = false;
        }
        if offset.abs() < WARN_MS || self.warned {
            return;
        }
        self.warned = true;
        let (way, by) = if offset < 0 {
            ("ahead of", -offset)
        } else {
            ("behind", offset)
        };
        log.warn(
            "clock_offset",
            &format!(
                "this host's clock is {}.{:03} s {way} redis's (redis reads {}): instants are \
                 named and claimed by redis's clock, but fix this host's time (ntp)",
                by / 1000,
                by % 1000,
                rfc3339(crate::clock::redis_millis().max(0) as u64)
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(redis_ms: i64, local_ms: i64, took_ms: i64) -> ClockSample {
        ClockSample {
            redis_ms,
            local_ms,
            took_ms,
        }
    }

    #[test]
    fn the_quickest_sample_names_the_offset_and_a_step_starts_anew() {
        let log = Log::new(crate::log::Verbosity::Quiet, crate::log::LogFormat::Text);
        let mut skew = Skew::default();
        skew.heard(at(10_000, 13_000, 40), &log);
        skew.heard(at(11_010, 14_000, 4), &log);
        skew.heard(at(12_030, 15_000, 60), &log);
        assert_eq!(skew.offset(), Some(-2990));
        // The host's clock stepped back 3 s: the old samples no longer count.
        skew.heard(at(20_000, 20_010, 30), &log);
        assert_eq!(skew.offset(), Some(-10));
        let window = CallWindow {
            before: 10,
            after: 20,
        };
        assert_eq!(ClockSample::of(0, window), None);
        assert_eq!(ClockSample::of(100, window), Some(at(100, 15, 10)));
    }
}
