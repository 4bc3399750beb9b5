//! The table's agenda: which jobs a turn of the loop has to look at. A job comes due at its next
//! instant less its lead (`entry.rs`), and needs looking at from then until its waiting instant
//! is claimed, checked or given up. The agenda keeps the first by time and the second as a set,
//! so a turn costs what is due, not what is served: 20,000 jobs of which a few are due cost the
//! loop a few.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap};

/// When each job next comes due (Unix ms, by job index), a heap of those times (an entry whose
/// time is no longer its job's is stale and skipped), and the jobs with an instant waiting.
#[derive(Default)]
pub struct Agenda {
    times: Vec<Option<i64>>,
    coming: BinaryHeap<Reverse<(i64, usize)>>,
    waiting: BTreeSet<usize>,
}

impl Agenda {
    /// An agenda of jobs given as (when it comes due, whether it has an instant waiting).
    pub fn new(jobs: impl Iterator<Item = (Option<i64>, bool)>) -> Agenda {
        let mut a = Agenda::default();
        for (i, (at, waiting)) in jobs.enumerate() {
            a.times.push(None);
            a.set(i, at, waiting);
        }
        a
    }

    /// Job `i` comes due at `at` (none: not any more) and has an instant waiting or not.
    pub fn set(&mut self, i: usize, at: Option<i64>, waiting: bool) {
        if self.times[i] != at {
            self.times[i] = at;
            if let Some(at) = at {
                self.coming.push(Reverse((at, i)));
            }
            // Stale times outnumber the jobs: the heap again from each job's time.
            if self.coming.len() > 2 * self.times.len() + 1024 {
                let times = self.times.iter().enumerate();
                self.coming = times
                    .filter_map(|(i, t)| t.map(|t| Reverse((t, i))))
                    .collect();
            }
        }
        if waiting {
            self.waiting.insert(i);
        } else {
            self.waiting.remove(&i);
        }
    }

    /// The jobs with an instant waiting, in table order.
    pub fn waiting(&self) -> impl Iterator<Item = usize> + '_ {
        self.waiting.iter().copied()
    }

    /// Take the jobs that came due by `now`, each once, in table order (each is due no more
    /// until it is [`Agenda::set`] again).
    pub fn take_come(&mut self, now: i64) -> Vec<usize> {
        let mut come = BTreeSet::new();
        while let Some(Reverse((at, i))) = self.coming.peek().copied() {
            if at > now {
                break;
            }
            self.coming.pop();
            if self.times[i] == Some(at) {
                self.times[i] = None;
                come.insert(i);
            }
        }
        come.into_iter().collect()
    }

    /// The earliest time a job comes due (a stale one included: an early wake-up finds nothing).
    pub fn next_come(&self) -> Option<i64> {
        self.coming.peek().map(|Reverse((at, _))| *at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_comes_once_at_its_current_time() {
        let mut a =
            Agenda::new([(Some(100), false), (Some(300), false), (Some(200), false)].into_iter());
        // Job 1 moved earlier: its first time (300) is stale.
        a.set(1, Some(150), false);
        assert_eq!(a.next_come(), Some(100));
        assert_eq!(a.take_come(160), vec![0, 1]);
        assert_eq!(a.take_come(250), vec![2]);
        assert_eq!(a.take_come(1000), Vec::<usize>::new());
        assert_eq!(a.next_come(), None);
        // The same time given again is one entry, not two.
        a.set(0, Some(2000), false);
        a.set(0, Some(2000), true);
        assert_eq!(a.take_come(2000), vec![0]);
    }

    #[test]
    fn waiting_jobs_in_table_order() {
        let mut a = Agenda::new((0..10).map(|_| (None, false)));
        a.set(5, None, true);
        a.set(2, None, true);
        a.set(5, None, false);
        a.set(9, None, true);
        assert_eq!(a.waiting().collect::<Vec<_>>(), vec![2, 9]);
    }

    #[test]
    fn stale_times_never_outgrow_the_jobs() {
        let mut a = Agenda::new([(Some(0), false)].into_iter());
        for t in 1..5000 {
            a.set(0, Some(t), false);
        }
        assert!(a.coming.len() <= 2 + 1024);
        assert_eq!(a.take_come(10_000), vec![0]);
    }
}
