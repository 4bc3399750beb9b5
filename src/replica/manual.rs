//! The instants claimed apart from the table's schedule: manual instants (`cronlock --trigger
//! KEY`), the ones the fleet's heartbeats brought (a poke per instant, `store::members::Poke`) for
//! the jobs this replica serves, each claimed at once by every replica with room, whatever the
//! ranking: one wins it (the acquire script takes a manual instant once, and only while its
//! request is there), the others lose it; and the instant that waits under `--overlap queue`,
//! claimed as soon as the run before it ended here, or when that run's lock would lapse (its
//! replica died). A lost or failed one is looked at again as a scheduled instant is (with
//! `--retries`: when the holder's lock would lapse, or a second after a failed run), until its
//! window ends.

use std::collections::VecDeque;

use crate::clock::redis_millis;
use crate::store::lock::InstantKind;
use crate::store::members::Poke;

/// How long a manual instant is looked after here (ms): a trigger's request is taken back
/// within seconds when no replica accepts it, and a run and its retries end well within this.
const WINDOW_MS: i64 = 600_000;
/// The most manual instants that wait here at once, and that are remembered as seen.
const MOST: usize = 64;

/// One instant that waits here: a manual one, or KEY's queued one (`instant` 0: Redis names it).
struct Waiting {
    key: String,
    instant: i64,
    kind: InstantKind,
    /// When to claim it (Unix ms).
    look: i64,
    /// When to forget it.
    until: i64,
    claiming: bool,
}

/// A manual instant to claim now.
pub struct ManualClaim {
    pub key: String,
    pub instant: i64,
    pub kind: InstantKind,
}

/// The manual instants this replica looks after.
#[derive(Default)]
pub struct Manuals {
    waiting: Vec<Waiting>,
    /// The pokes taken already (a poke stays while its trigger waits, and comes with every
    /// heartbeat).
    seen: VecDeque<Poke>,
}

impl Manuals {
    /// The pokes a heartbeat brought: those of jobs this replica serves (`serves`), not seen
    /// before, wait to be claimed now.
    pub fn poked(&mut self, pokes: Vec<Poke>, serves: impl Fn(&str) -> bool) {
        let now = redis_millis();
        for poke in pokes {
            if self.seen.contains(&poke) || !serves(&poke.key) {
                continue;
            }
            if self.seen.len() >= MOST {
                self.seen.pop_front();
            }
            self.seen.push_back(poke.clone());
            if self.waiting.len() < MOST {
                self.waiting.push(Waiting {
                    key: poke.key,
                    instant: poke.instant,
                    kind: InstantKind::Manual,
                    look: now,
                    until: now + WINDOW_MS,
                    claiming: false,
                });
            }
        }
    }

    /// Up to `room` instants to claim now, each marked in flight.
    pub fn take_due(&mut self, room: usize) -> Vec<ManualClaim> {
        let now = redis_millis();
        self.waiting.retain(|w| w.until > now || w.claiming);
        let mut out = Vec::new();
        for w in &mut self.waiting {
            if out.len() >= room {
                break;
            }
            if !w.claiming && w.look <= now {
                w.claiming = true;
                out.push(ManualClaim {
                    key: w.key.clone(),
                    instant: w.instant,
                    kind: w.kind,
                });
            }
        }
        out
    }

    /// A claim of the instant came back: `again` says when to look at it again (a failed claim,
    /// a holder whose lock may lapse), else it is done here.
    pub fn answered(&mut self, key: &str, instant: i64, again: Option<i64>) {
        let at = self
            .waiting
            .iter()
            .position(|w| w.key == key && w.instant == instant && w.claiming)
            .or_else(|| {
                self.waiting
                    .iter()
                    .position(|w| w.key == key && w.instant == instant)
            });
        let Some(at) = at else {
            return;
        };
        match again {
            Some(look) => {
                let w = &mut self.waiting[at];
                w.claiming = false;
                w.look = look;
            }
            None => {
                self.waiting.swap_remove(at);
            }
        }
    }

    /// Look at the manual instant again at `look` (a run of it failed or died, with `--retries`).
    pub fn look_again(&mut self, key: &str, instant: i64, look: i64) {
        self.pin(key, instant, InstantKind::Manual, look);
    }

    /// KEY's run ended here: its manual instants that wait (`--overlap queue`) are claimed at
    /// `look`.
    pub fn run_ended(&mut self, key: &str, look: i64) {
        for w in &mut self.waiting {
            if w.key == key && w.kind == InstantKind::Manual && !w.claiming {
                w.look = w.look.min(look);
            }
        }
    }

    /// Claim KEY's queued instant (`--overlap queue`) at `look` at the latest: the run before it
    /// ended, or its lock would lapse then.
    pub fn queued(&mut self, key: &str, look: i64) {
        self.pin(key, 0, InstantKind::Queued, look);
    }

    fn pin(&mut self, key: &str, instant: i64, kind: InstantKind, look: i64) {
        if let Some(w) = self
            .waiting
            .iter_mut()
            .find(|w| w.key == key && w.instant == instant && w.kind == kind && !w.claiming)
        {
            w.look = w.look.min(look);
            w.until = w.until.max(look + 60_000);
            return;
        }
        if self.waiting.len() < MOST {
            self.waiting.push(Waiting {
                key: key.to_string(),
                instant,
                kind,
                look,
                until: look + 60_000,
                claiming: false,
            });
        }
    }

    /// When one next needs the loop: its look, or, when that passed (it waits for room, which a
    /// run's end brings with a wake of its own), its end; never a time already past.
    pub fn next_wake(&self) -> Option<i64> {
        let now = redis_millis();
        self.waiting
            .iter()
            .filter(|w| !w.claiming)
            .map(|w| if w.look > now { w.look } else { w.until })
            .min()
    }
}
