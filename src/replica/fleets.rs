//! Who owns and who checks each instant, as the fleets' views say: the latest view of each fleet
//! this replica serves in (a heartbeat's), the earlier ones other replicas may still hold while
//! the fleet changes, and the judgments the table asks of them (`table.rs` has the whole story).

use std::collections::HashMap;
use std::time::Duration;

use super::entry::{Due, Entry};
use super::rank::{checker, owner};
use crate::clock::Instant;
use crate::replica::claim::Group;
use crate::store::members::FleetView;

/// How long after it is due an instant another replica owns is checked, and claimed here when
/// still undecided (ms). The owner claims `LEAD_MS` (`entry.rs`) ahead, so by then its claim
/// has long been answered on a healthy fleet; well under the shortest period (1 s).
pub const FALLBACK_MS: i64 = 250;

/// The most earlier views of a fleet kept (see `Fleets::earlier`).
const EARLIER_MAX: usize = 8;

/// What this replica knows of the fleets it serves in: the latest view of each (and the views
/// that may still be held elsewhere), and so who owns and who checks each instant.
pub struct Fleets {
    /// This replica's identity (its id in the live set), for the ranking.
    pub(super) me: String,
    /// The last view of each group's replicas, and when it came.
    views: HashMap<Group, SeenView>,
    /// A group's earlier views that differ from its last, each with when it was replaced: kept
    /// for [`Fleets::settle`], while the fleet's views may disagree (its instants are checked
    /// under them too).
    earlier: HashMap<Group, Vec<SeenView>>,
    /// How long a view counts (a replica lapses after this without a heartbeat).
    pub lapse: Duration,
    /// How long the fleet's views may disagree after a change: a heartbeat period and
    /// [`super::beat::BEAT_AGAIN`] (every replica has had a heartbeat since).
    pub settle: Duration,
    /// When the table was made: until a first view comes (or a lapse passes without one), an
    /// instant waits for it rather than being claimed by every replica.
    made: Instant,
}

/// A view of a fleet, and when it came (or, among the earlier ones, when it was replaced).
#[derive(Clone)]
struct SeenView {
    view: FleetView,
    when: Instant,
}

impl Fleets {
    /// No view yet, for replica `me`: until a first view comes (or a lapse passes without one),
    /// an instant waits for it.
    pub(super) fn new(me: &str) -> Fleets {
        Fleets {
            me: me.to_string(),
            views: HashMap::new(),
            earlier: HashMap::new(),
            lapse: Duration::from_secs(2),
            settle: Duration::from_millis(1500),
            made: Instant::now(),
        }
    }

    /// Keep `view` as `group`'s latest: whether it names other live or full replicas than the
    /// last (or is the first).
    pub(super) fn set_view(&mut self, group: Group, view: FleetView) -> bool {
        let now = Instant::now();
        // Views may disagree on who owns or checks an instant only after the live replicas, or
        // the full ones among them, changed: the view replaced is kept while others may hold it.
        let alike =
            |a: &[String], b: &[String]| a.len() == b.len() && a.iter().all(|m| b.contains(m));
        let settle = self.settle;
        let earlier = self.earlier.entry(group.clone()).or_default();
        earlier.retain(|seen| seen.when.elapsed() < settle);
        let changed = match self.views.get(&group) {
            Some(old) if alike(&old.view.live, &view.live) && alike(&old.view.full, &view.full) => {
                false
            }
            Some(old) => {
                earlier.push(SeenView {
                    view: old.view.clone(),
                    when: now,
                });
                // Bounded: a fleet that changes at every heartbeat keeps its last few views.
                if earlier.len() > EARLIER_MAX {
                    earlier.remove(0);
                }
                true
            }
            None => true,
        };
        self.views.insert(group, SeenView { view, when: now });
        changed
    }

    /// When this replica checks `d` of `job`, another replica's instant (Unix ms): [`FALLBACK_MS`]
    /// after it, as one of its two checkers, as its owner or checker in a view it held lately
    /// (the fleet changed), or with no fresh view; never otherwise.
    pub(super) fn check_at(&self, job: &Entry, d: &Due) -> Option<i64> {
        // Both checkers at once: Redis wakes once for both (a wake costs it more than the
        // reads), and when both find an instant undecided, one claim wins.
        let checks = match self.fresh(&job.group) {
            Some(view) => {
                checker(view, &self.me, d.at, job.shares).is_some()
                    || self.answered_before(job, d.at)
            }
            None => true,
        };
        checks.then_some(d.at + job.offset() + FALLBACK_MS)
    }

    /// Whether a view of `job`'s fleet this replica held lately ([`Fleets::settle`]) made it
    /// owner or checker of instant `at`: the replicas that still hold that view count on it.
    fn answered_before(&self, job: &Entry, at: i64) -> bool {
        let Some(earlier) = self.earlier.get(&job.group) else {
            return false;
        };
        earlier
            .iter()
            .filter(|seen| seen.when.elapsed() < self.settle)
            .any(|seen| {
                checker(&seen.view, &self.me, at, job.shares).is_some()
                    || owner(&seen.view, &self.me, &job.cron.key, at, job.shares) == self.me
            })
    }

    /// The group's view, if it is recent enough to trust.
    pub(super) fn fresh(&self, group: &Group) -> Option<&FleetView> {
        let seen = self.views.get(group)?;
        (seen.when.elapsed() < self.lapse).then_some(&seen.view)
    }

    /// This replica owns instant `at` of `job`: it is its turn, or it has no view ([`Owns`]).
    pub(super) fn mine(&self, job: &Entry, at: i64) -> bool {
        match self.fresh(&job.group) {
            // A stale view (heartbeats failing): claim as if alone. None yet: wait for the first.
            None => self.views.contains_key(&job.group) || self.made.elapsed() >= self.lapse,
            Some(view) => owner(view, &self.me, &job.cron.key, at, job.shares) == self.me,
        }
    }
}
