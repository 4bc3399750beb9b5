//! When this replica's heartbeat goes: every period, at the fleet's slots (the multiples of the
//! period on Redis's clock as measured, less the claims' lead), so the heartbeats of every replica of a fleet
//! and the claims of instants on whole seconds reach Redis together, and it wakes once for all of
//! them instead of once for each.

use std::sync::Arc;
use std::time::Duration;

use crate::clock::redis_millis;
use crate::clock::Instant;
use crate::config::RunConfig;
use crate::log::{Level, Log};
use crate::store::members::{FleetView, Poke};

use super::claim::{Ask, Group, Reached};
use super::claimer::Claims;
use super::entry::LEAD_MS;
use super::skew::{ClockSample, Skew};
use super::table::Table;
use super::watched::BoardFeed;

/// The heartbeat's period with up to [`FLEET_BEATS`] replicas; a second more per
/// [`FLEET_BEATS`] replicas above that, so a fleet's heartbeats cost Redis at most
/// [`FLEET_BEATS`] calls a second whatever its size (each replica's heartbeat reads the live set,
/// so the cost of a fleet's heartbeats follows neither its size nor its square), sent in the wakes
/// of Redis that claim the instants on whole seconds (a period under a second would wake Redis
/// again between instants for the heartbeats alone). A replica lapses after 3 periods without
/// one. Shorter for a short `--ttl`: see [`period`].
pub const BEAT: Duration = Duration::from_millis(1000);
/// How many heartbeats a second a fleet sends at most (see [`BEAT`]).
pub const FLEET_BEATS: usize = 3;
/// The soonest a change of "full" is told again: so a replica whose runs come and go at
/// `--max-jobs` adds at most two heartbeats a second.
pub const BEAT_AGAIN: Duration = Duration::from_millis(500);

/// The heartbeat's period for a fleet of `live` replicas whose shortest `--ttl` is `ttl`: [`BEAT`]
/// for each [`FLEET_BEATS`] replicas (whole seconds), and at most a quarter of TTL + 2 s (0.5 s
/// below 1 s, else whole seconds, so the heartbeats keep to the claims' slots on whole seconds).
/// A dead replica lapses 3 periods after its last heartbeat and is seen gone at the next of the
/// others, so a dead owner's instant is claimed again within TTL + 2 s.
pub fn period(live: usize, ttl: Duration) -> Duration {
    let fleet = BEAT * live.max(1).div_ceil(FLEET_BEATS) as u32;
    fleet.min(bound(ttl))
}

/// The longest period for the shortest `--ttl` `ttl`: a quarter of TTL + 2 s, 0.5 s below 1 s,
/// else whole seconds.
fn bound(ttl: Duration) -> Duration {
    let bound = (ttl + Duration::from_secs(2)) / 4;
    if bound >= Duration::from_secs(1) {
        Duration::from_secs(bound.as_secs())
    } else {
        Duration::from_millis(500)
    }
}

/// The last heartbeat: when (on both clocks), the period, and whether it said "full".
#[derive(Clone, Copy)]
pub struct Beat {
    at: Instant,
    at_ms: i64,
    pub every: Duration,
    pub full: bool,
}

impl Beat {
    /// None sent yet: the first is due at once; then every `every`.
    pub fn first(every: Duration) -> Beat {
        Beat {
            at: Instant::from_duration(Duration::ZERO),
            at_ms: 0,
            every,
            full: false,
        }
    }

    /// One sent now.
    pub fn sent(every: Duration, full: bool) -> Beat {
        Beat {
            at: Instant::now(),
            at_ms: redis_millis(),
            every,
            full,
        }
    }

    /// How long ago it was sent.
    pub fn since(&self) -> Duration {
        self.at.elapsed()
    }

    /// Whether the next is due: its slot came, or a period passed (the wall clock may jump).
    pub fn is_due(&self) -> bool {
        redis_millis() >= next_slot(self.at_ms, self.every) || self.since() >= self.every
    }

    /// When the next is due, `sooner` (a change to tell, a view to renew): [`BEAT_AGAIN`] after
    /// this one at the latest; else at the next slot.
    pub fn due_for(&self, sooner: bool) -> Instant {
        if !sooner {
            return self.due();
        }
        self.due().min(self.at + BEAT_AGAIN)
    }

    /// When the next is due: at the next slot, and a period after this one at the latest.
    pub fn due(&self) -> Instant {
        let slot = next_slot(self.at_ms, self.every);
        let left = (slot - redis_millis()).max(0) as u64;
        (Instant::now() + Duration::from_millis(left)).min(self.at + self.every)
    }
}

/// This replica's heartbeats: its id among the live replicas, the last one sent, and whether
/// the last view changed.
pub(super) struct Heartbeats {
    me: String,
    last: Beat,
    /// The last view named other live or full replicas than the one before (or was the first):
    /// the next heartbeat goes [`BEAT_AGAIN`] after the last, whatever the period, so the views
    /// of a fleet that changed (replicas started together, one joined, left or lapsed) agree
    /// again within about half a second of the change being seen, not a period.
    changed: bool,
    /// This host's clock against Redis's, read from the heartbeats' answers (and told in them).
    pub(super) skew: Skew,
}

impl Heartbeats {
    /// None sent yet; the first goes at once, then every `every` until a view says otherwise.
    pub(super) fn new(me: String, every: Duration) -> Heartbeats {
        Heartbeats {
            me,
            last: Beat::first(every),
            changed: false,
            skew: Skew::default(),
        }
    }

    /// Whether one should go before the next slot (at most every [`BEAT_AGAIN`]): "full"
    /// changed, or the last view did. (An instant a full owner leaves waiting is claimed by the others after
    /// [`super::fleets::FALLBACK_MS`] whatever their views say, so nothing else hurries a
    /// heartbeat: the fleet's heartbeats stay a few calls a second however busy it is.)
    pub(super) fn sooner(&self, full: bool) -> bool {
        full != self.last.full || self.changed
    }

    /// When the next is due, for a replica `full` or not.
    pub(super) fn due(&self, full: bool) -> Instant {
        self.last.due_for(self.sooner(full))
    }

    /// Send this replica's heartbeat to each group its jobs claim in: at its slot, when "full"
    /// changed (at most every [`BEAT_AGAIN`]), or, `leaving`, to leave the ranking.
    pub(super) fn send(
        &mut self,
        claims: &mut Claims,
        table: &mut Table,
        full: bool,
        leaving: bool,
    ) {
        let every = self.last.every;
        let due = self.last.is_due();
        if !leaving && !due && (!self.sooner(full) || self.last.since() < BEAT_AGAIN) {
            return;
        }
        let lapse = if leaving { Duration::ZERO } else { every * 3 };
        for Reached { group, config } in table.groups() {
            claims.send(Ask::Beat {
                config,
                group,
                id: self.me.clone(),
                lapse,
                full,
                offset: self.skew.offset(),
            });
        }
        self.last = Beat::sent(every, full);
        self.changed = false;
        table.fleets.lapse = every * 3;
        table.fleets.settle = every + BEAT_AGAIN;
    }

    /// Leave `group`'s fleet (a heartbeat that lapses at once).
    pub(super) fn leave(&self, claims: &mut Claims, group: Group, config: Arc<RunConfig>) {
        claims.send(Ask::Beat {
            config,
            group,
            id: self.me.clone(),
            lapse: Duration::ZERO,
            full: false,
            offset: self.skew.offset(),
        });
    }

    /// A heartbeat's answer: the fleet's view (and the heartbeat's period for its size), or why
    /// there is none. The manual instants it brought are returned.
    pub(super) fn viewed(
        &mut self,
        table: &mut Table,
        group: Group,
        view: Result<FleetView, String>,
        clock: Option<ClockSample>,
        shown: &BoardFeed,
        log: &Log,
    ) -> Vec<Poke> {
        if let Some(sample) = clock {
            if self.skew.heard(sample, log) {
                table.rebase();
            }
        }
        if let Ok(view) = &view {
            self.last.every = period(view.live.len(), table.shortest_ttl());
        }
        let failed = view.as_ref().err().map(String::as_str);
        shown.beat(failed, self.last.every, self.skew.offset());
        match view {
            Ok(mut view) => {
                let pokes = std::mem::take(&mut view.pokes);
                // Until the next heartbeat is sent (one group's change is enough).
                self.changed |= table.set_view(group, view);
                pokes
            }
            Err(text) => {
                log.event(
                    Level::Debug,
                    "heartbeat_failed",
                    &format!("cannot send this replica's heartbeat: {text}"),
                    &[],
                );
                Vec::new()
            }
        }
    }
}

/// The first slot after `sent_ms` (Unix ms) for the period `every`: a multiple of the period less
/// [`LEAD_MS`].
fn next_slot(sent_ms: i64, every: Duration) -> i64 {
    let every = (every.as_millis() as i64).max(1);
    ((sent_ms + LEAD_MS).div_euclid(every) + 1) * every - LEAD_MS
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--trigger` waits for a fleet to take its instant two heartbeats' periods and a claim.
    #[test]
    fn a_trigger_waits_two_of_the_fleets_periods() {
        for live in 1..200 {
            let need = period(live, Duration::MAX / 4) * 2 + Duration::from_secs(2);
            assert!(crate::fleet::trigger::accept_within(live) >= need, "{live}");
        }
    }

    #[test]
    fn the_period_lets_a_dead_owners_instant_run_within_ttl_and_2_s() {
        let s = Duration::from_secs;
        assert_eq!(period(1, s(30)), s(1));
        assert_eq!(period(3, s(30)), s(1));
        assert_eq!(period(4, s(30)), s(2));
        assert_eq!(period(10, s(30)), s(4));
        assert_eq!(period(40, s(30)), s(8));
        assert_eq!(period(10, s(6)), s(2));
        assert_eq!(period(10, s(5)), s(1));
        assert_eq!(period(3, s(1)), Duration::from_millis(500));
        assert_eq!(period(3, Duration::ZERO), Duration::from_millis(500));
        for live in 1..40 {
            for ttl in (1..120).map(|t| Duration::from_millis(t * 500)) {
                let every = period(live, ttl);
                assert!(every * 4 <= ttl + s(2), "{live} {ttl:?} {every:?}");
                // A fleet's heartbeats: at most FLEET_BEATS a second, whatever its size.
                let fleet_rate = live as f64 / every.as_secs_f64();
                assert!(
                    fleet_rate <= FLEET_BEATS as f64 || every < s(1) || every == bound(ttl),
                    "{live} {ttl:?} {every:?}"
                );
            }
        }
    }

    #[test]
    fn slots_are_shared_by_every_replica_and_come_within_a_period() {
        let every = Duration::from_millis(500);
        assert_eq!(next_slot(1_000_000, every), 1_000_450);
        assert_eq!(next_slot(1_000_449, every), 1_000_450);
        assert_eq!(next_slot(1_000_450, every), 1_000_950);
        for sent in (0..5000).map(|i| 1_700_000_000_000 + i * 37) {
            let slot = next_slot(sent, every);
            assert!(slot > sent && slot - sent <= 500, "{sent} {slot}");
            assert_eq!((slot + LEAD_MS) % 500, 0);
        }
    }
}
