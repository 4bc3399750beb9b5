//! The releases this replica owes: a run's end (its lock's release, its run record, its
//! instant's end in the ledger) that Redis did not take when the run asked (slow, away, a
//! failover, or too few of several masters), kept by the claims thread and carried out again
//! every [`AGAIN`] until Redis takes it. The run is told its end is owed (`ReleaseAnswer::Owed`)
//! and is done: the replica, which outlives it, writes the end as soon as Redis answers, so a
//! stall or an outage of Redis alone never leaves a finished run's instant to be judged
//! abandoned (`acquire.lua` gives a holder `REPORT` ms once Redis answers) and run again.
//!
//! Bounded: at most [`MOST`] releases and [`MOST_BYTES`] of their records, none kept longer
//! than [`KEPT`]; the oldest go first, each said. A replica that stops, or dies, with releases
//! owed loses them (said at its stop): their instants then read abandoned once their locks
//! lapse, and `--retries` may run them again (at-least-once, as for a host that died).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use crate::clock::Instant;
use crate::config::RunConfig;
use crate::store::lock::{Held, ReleaseOptions};

/// How often the owed releases are carried out again.
pub const AGAIN: Duration = Duration::from_millis(250);
/// The most releases owed at once.
const MOST: usize = 4096;
/// The most bytes of run records owed at once.
const MOST_BYTES: usize = 32 << 20;
/// The longest a release is owed.
const KEPT: Duration = Duration::from_secs(3600);

/// One release owed: the run's job, its lock, what to record, and since when it is owed.
pub struct OwedRelease {
    pub config: Arc<RunConfig>,
    pub held: Box<Held>,
    pub opts: Box<ReleaseOptions>,
    pub since: Instant,
}

impl OwedRelease {
    fn bytes(&self) -> usize {
        self.opts.record.as_ref().map_or(0, String::len) + 256
    }
}

/// The releases owed, oldest first, and when they are tried next.
#[derive(Default)]
pub struct Owed {
    items: VecDeque<OwedRelease>,
    bytes: usize,
    next_try: Option<Instant>,
}

impl Owed {
    /// Keep `release` to carry out later; those dropped to make room (or kept too long) are
    /// returned, to be said.
    pub fn keep(&mut self, release: OwedRelease) -> Vec<OwedRelease> {
        self.bytes += release.bytes();
        self.items.push_back(release);
        self.next_try.get_or_insert_with(|| Instant::now() + AGAIN);
        let mut dropped = Vec::new();
        while self.items.len() > MOST
            || self.bytes > MOST_BYTES
            || self.items.front().is_some_and(|r| r.since.elapsed() > KEPT)
        {
            let Some(old) = self.items.pop_front() else {
                break;
            };
            self.bytes -= old.bytes();
            dropped.push(old);
        }
        dropped
    }

    /// When they are next carried out, if any are owed.
    pub fn next_try(&self) -> Option<Instant> {
        self.next_try.filter(|_| !self.items.is_empty())
    }

    /// Those to carry out now (those still not taken come back through [`Owed::keep`]).
    pub fn due(&mut self, now: Instant) -> Vec<OwedRelease> {
        if self.next_try().is_none_or(|at| now < at) {
            return Vec::new();
        }
        self.take_all()
    }

    /// Every one owed (the replica stops: they are tried once more).
    pub fn take_all(&mut self) -> Vec<OwedRelease> {
        self.next_try = None;
        self.bytes = 0;
        self.items.drain(..).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn release(record: usize) -> OwedRelease {
        let cron = crate::cli::crontab::job_line("* * * * * * k true");
        let holder = crate::store::holder::Holder::new("true");
        let keys = crate::store::keys::Keys::new("cronlock:", "k");
        OwedRelease {
            config: cron.run.config.clone(),
            held: Box::new(Held {
                keys,
                holder,
                fence: 1,
                ttl: Duration::from_secs(30),
                sent_at: Instant::now(),
                instant: Some(1_800_000_000_000),
                limit: 1,
                slot: 0,
                attempt: 1,
                manual: false,
                own_lock: false,
                after: None,
                due: None,
            }),
            opts: Box::new(ReleaseOptions {
                record: Some("x".repeat(record)),
                ..ReleaseOptions::default()
            }),
            since: Instant::now(),
        }
    }

    #[test]
    fn the_oldest_go_first_past_the_bounds_and_the_rest_are_tried_again() {
        let mut owed = Owed::default();
        assert!(owed.next_try().is_none());
        for _ in 0..MOST {
            assert!(owed.keep(release(10)).is_empty());
        }
        assert_eq!(owed.keep(release(10)).len(), 1);
        let at = owed.next_try().unwrap();
        assert!(owed
            .due(at.checked_sub(Duration::from_millis(1)).unwrap())
            .is_empty());
        assert_eq!(owed.due(at).len(), MOST);
        assert!(owed.next_try().is_none());
        // A few large records fill the bytes first.
        let big = MOST_BYTES / 3;
        let dropped: usize = (0..4).map(|_| owed.keep(release(big)).len()).sum();
        assert_eq!(dropped, 2);
        assert_eq!(owed.take_all().len(), 2);
    }
}
