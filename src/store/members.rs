//! The replicas (`--crontab`) serving from one Redis, for ranking who claims which instant: each
//! replica's heartbeat (`members.lua`) renews it in a hash valued by when it lapses (by Redis's
//! clock), drops the lapsed, and answers who is live and who is at `--max-jobs`.
//!
//! A fleet is the replicas serving the same jobs (the caller names it by a hash of them, FLEET):
//! replicas of different crontabs sharing a Redis are different fleets and never rank each
//! other. The key, under the prefix `cronlock:`: `cronlock:~{~replicas:FLEET}:members`. Its hash
//! tag is its own, and a KEY's keys (which start `cronlock:{`) can never have it; `--list` does
//! not see it.

use std::sync::LazyLock;
use std::time::Duration;

use redis::{Script, Value};

use crate::store::script::{eval, ms};
use crate::store::topology::{Failure, Link};

const MEMBERS_LUA: &str = include_str!("lua/members.lua");
static MEMBERS: LazyLock<Script> = LazyLock::new(|| Script::new(MEMBERS_LUA));

/// The most replicas a view lists (a bound on the reply).
pub const MAX_MEMBERS: usize = 256;

/// Who serves from this Redis, as one heartbeat saw it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FleetView {
    /// The live replicas' ids.
    pub live: Vec<String>,
    /// Those of them at `--max-jobs`.
    pub full: Vec<String>,
}

/// One heartbeat: replica `id` of `fleet` (its hash, in hex) under `prefix` is live for `lapse`
/// more (zero: it leaves now), and is full (at `--max-jobs`) or not.
#[derive(Debug, Clone, Copy)]
pub struct Heartbeat<'a> {
    pub prefix: &'a str,
    pub fleet: &'a str,
    pub id: &'a str,
    pub lapse: Duration,
    pub full: bool,
}

/// Send one heartbeat; the view after it.
pub fn beat(link: &mut Link, within: Duration, beat: Heartbeat<'_>) -> Result<FleetView, Failure> {
    let Heartbeat {
        prefix,
        fleet,
        id,
        lapse,
        full,
    } = beat;
    let members = format!("{prefix}~{{~replicas:{fleet}}}:members");
    let lapse_ms = if lapse.is_zero() { 0 } else { ms(lapse) };
    let args = [
        id.to_string(),
        lapse_ms.to_string(),
        u8::from(full).to_string(),
        MAX_MEMBERS.to_string(),
    ];
    eval(
        link,
        within,
        &MEMBERS,
        MEMBERS_LUA,
        &[&members],
        &args,
        read_view,
    )
}

/// `{live ids, full ids}`; anything else is a failure.
fn read_view(reply: &Value) -> Result<FleetView, Failure> {
    const SHAPE: &str = "a heartbeat reply that is not {live ids, full ids}";
    let ids = |v: &Value| -> Result<Vec<String>, Failure> {
        let Value::Array(items) = v else {
            return Err(Failure::shape(SHAPE));
        };
        if items.len() > MAX_MEMBERS {
            return Err(Failure::shape(SHAPE));
        }
        items
            .iter()
            .map(|i| match i {
                Value::BulkString(b) => Ok(String::from_utf8_lossy(b).into_owned()),
                _ => Err(Failure::shape(SHAPE)),
            })
            .collect()
    };
    match reply {
        Value::Array(parts) if parts.len() == 2 => Ok(FleetView {
            live: ids(&parts[0])?,
            full: ids(&parts[1])?,
        }),
        _ => Err(Failure::shape(SHAPE)),
    }
}
