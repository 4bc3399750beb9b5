//! The replicas that serve under a prefix, as `--status` lists them: each fleet found (the
//! members hashes, by SCAN, as `--trigger` finds them), each replica's id, whether it is at
//! `--max-jobs`, and how far its clock is from Redis's (a replica names and claims instants by
//! Redis's clock, and measures its own against it: `replica/skew.rs`).

use std::time::Duration;

use serde::Serialize;

use crate::store::members::{fleet_of, fleets_pattern, Member};
use crate::store::quorum::Masters;

/// The most fleets listed.
const MOST_FLEETS: usize = 64;

/// A replica as `--status` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct ShownReplica {
    pub id: String,
    pub fleet: String,
    pub full: bool,
    /// How far Redis's clock is ahead of the replica's (ms; negative: behind), once it measured.
    pub clock_offset_ms: Option<i64>,
}

/// The replicas heartbeating under `prefix`; none when Redis could not say (`--status` shows
/// the lock all the same).
pub fn seen(masters: &mut Masters, within: Duration, prefix: &str) -> Vec<ShownReplica> {
    let Ok(mut found) = masters.scan(&fleets_pattern(prefix), within) else {
        return Vec::new();
    };
    found.sort();
    found.dedup();
    let mut out = Vec::new();
    for key in found.iter().take(MOST_FLEETS) {
        let Some(fleet) = fleet_of(prefix, key) else {
            continue;
        };
        let Ok(members) = masters.members(within, prefix, &fleet) else {
            continue;
        };
        out.extend(members.into_iter().map(|m: Member| ShownReplica {
            id: m.id,
            fleet: fleet.clone(),
            full: m.full,
            clock_offset_ms: m.offset,
        }));
    }
    out.sort_by(|a, b| (&a.fleet, &a.id).cmp(&(&b.fleet, &b.id)));
    out
}

/// Its line for people: `ID (full, clock 3.012 s ahead of redis's)`.
pub fn line(r: &ShownReplica) -> String {
    let mut notes = Vec::new();
    if r.full {
        notes.push("full (--max-jobs)".to_string());
    }
    match r.clock_offset_ms {
        Some(0) => notes.push("clock in step with redis's".into()),
        Some(ms) => {
            let way = if ms > 0 { "behind" } else { "ahead of" };
            notes.push(format!(
                "clock {}.{:03} s {way} redis's",
                ms.abs() / 1000,
                ms.abs() % 1000
            ));
        }
        None => notes.push("clock not measured".into()),
    }
    format!("  {} ({})", r.id, notes.join(", "))
}
