//! The table's agenda: which jobs a turn of the loop has to look at. A job comes due at its next
//! instant less its lead (`entry.rs`), and needs looking at from then until its waiting instant
//! is claimed, checked or given up. The agenda keeps the first by time and the second as a set,
//! so a turn costs what is due, not what is served: 20,000 jobs of which a few are due cost the
//! loop a few.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap};

/// When each job next comes due (a heap of Unix ms and job index; an entry whose time is no
/// longer its job's is stale and skipped), and the jobs with an instant waiting.
#[derive(Default)]
pub struct Agenda {
    coming: BinaryHeap<Reverse<(i64, usize)>>,
    waiting: BTreeSet<usize>,
}

impl Agenda {
    /// Job `i` next comes due at `at` (an earlier time given for it is now stale).
    pub fn comes_due(&mut self, i: usize, at: i64) {
        self.coming.push(Reverse((at, i)));
    }

    /// Whether job `i` has an instant waiting.
    pub fn set_waiting(&mut self, i: usize, waiting: bool) {
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

    /// Take the jobs that came due by `now`, each once, in table order: those whose time, by
    /// `due_at` (the job's current one), is still the one given.
    pub fn take_come(&mut self, now: i64, due_at: impl Fn(usize) -> Option<i64>) -> Vec<usize> {
        let mut come = BTreeSet::new();
        while let Some(Reverse((at, i))) = self.coming.peek().copied() {
            if at > now {
                break;
            }
            self.coming.pop();
            if due_at(i) == Some(at) {
                come.insert(i);
            }
        }
        come.into_iter().collect()
    }

    /// The earliest time a job comes due (stale times included: an early wake-up finds nothing).
    pub fn next_come(&self) -> Option<i64> {
        self.coming.peek().map(|Reverse((at, _))| *at)
    }

    /// Whether the stale times outnumber the jobs (then [`Agenda::rebuild`]).
    pub fn crowded(&self, jobs: usize) -> bool {
        self.coming.len() > 2 * jobs + 1024
    }

    /// Start again from each job's time and waiting state (`(time, waiting)` by index).
    pub fn rebuild(&mut self, jobs: impl Iterator<Item = (Option<i64>, bool)>) {
        self.coming.clear();
        self.waiting.clear();
        for (i, (at, waiting)) in jobs.enumerate() {
            if let Some(at) = at {
                self.comes_due(i, at);
            }
            self.set_waiting(i, waiting);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_comes_once_at_its_current_time() {
        let mut a = Agenda::default();
        let mut times = [Some(100), Some(300), Some(200)];
        for (i, t) in times.iter().enumerate() {
            a.comes_due(i, t.unwrap());
        }
        // Job 1 moved earlier: its first time (300) is stale.
        times[1] = Some(150);
        a.comes_due(1, 150);
        assert_eq!(a.next_come(), Some(100));
        assert_eq!(a.take_come(160, |i| times[i]), vec![0, 1]);
        assert_eq!(a.take_come(250, |i| times[i]), vec![2]);
        assert_eq!(a.take_come(1000, |i| times[i]), Vec::<usize>::new());
        assert_eq!(a.next_come(), None);
    }

    #[test]
    fn waiting_jobs_in_table_order() {
        let mut a = Agenda::default();
        a.set_waiting(5, true);
        a.set_waiting(2, true);
        a.set_waiting(5, false);
        a.set_waiting(9, true);
        assert_eq!(a.waiting().collect::<Vec<_>>(), vec![2, 9]);
        a.rebuild([(Some(5), true), (None, false)].into_iter());
        assert_eq!(a.waiting().collect::<Vec<_>>(), vec![0]);
        assert_eq!(a.take_come(5, |_| Some(5)), vec![0]);
    }
}
