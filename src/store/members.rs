//! The replicas (`--crontab`) serving from one Redis, for ranking who claims which instant: each
//! replica's heartbeat (`members.lua`) renews it in a hash valued by when it lapses (by Redis's
//! clock), drops the lapsed, and answers who is live and who is at `--max-jobs`.
//!
//! A fleet is the replicas serving the same jobs (the caller names it by a hash of them, FLEET):
//! replicas of different crontabs sharing a Redis are different fleets and never rank each
//! other. The key, under the prefix `cronlock:`: `cronlock:~{~replicas:FLEET}:members`. Its hash
//! tag is its own, and a KEY's keys (which start `cronlock:{`) can never have it; `--list` does
//! not see it. Beside it, in the same slot, `...:pokes`: the manual instants (`--trigger`) that
//! wait for a replica of the fleet (`poke.lua`), read with every heartbeat.

use std::time::Duration;

use redis::Value;

use crate::store::script::{eval, int, ms, Script};
use crate::store::topology::{Failure, Link};

const MEMBERS_LUA: &str = include_str!("lua/members.lua");
static MEMBERS: Script = Script::new(MEMBERS_LUA);
const POKE_LUA: &str = include_str!("lua/poke.lua");
static POKE: Script = Script::new(POKE_LUA);

/// The most replicas a view lists (a bound on the reply).
pub const MAX_MEMBERS: usize = 256;

/// Who serves from this Redis, as one heartbeat saw it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FleetView {
    /// The live replicas' ids.
    pub live: Vec<String>,
    /// Those of them at `--max-jobs`.
    pub full: Vec<String>,
    /// The manual instants (`--trigger`) that wait for the fleet.
    pub pokes: Vec<Poke>,
    /// Redis's clock when it answered (Unix ms).
    pub redis_ms: i64,
}

/// A manual instant of KEY that waits for a replica (`--trigger`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Poke {
    pub key: String,
    /// Unix ms: the manual instant's label, and its field in the ledger.
    pub instant: i64,
}

impl Poke {
    /// As stored: `KEY\nINSTANT`.
    fn member(&self) -> String {
        format!("{}\n{}", self.key, self.instant)
    }

    fn read(member: &str) -> Option<Poke> {
        let (key, instant) = member.rsplit_once('\n')?;
        Some(Poke {
            key: key.to_string(),
            instant: instant.parse().ok()?,
        })
    }
}

/// The members hash of `fleet` under `prefix`.
fn members_key(prefix: &str, fleet: &str) -> String {
    format!("{prefix}~{{~replicas:{fleet}}}:members")
}

/// The pokes of `fleet` under `prefix`, in the members hash's slot.
fn pokes_key(prefix: &str, fleet: &str) -> String {
    format!("{prefix}~{{~replicas:{fleet}}}:pokes")
}

/// The SCAN pattern of every fleet's members hash under `prefix`.
pub fn fleets_pattern(prefix: &str) -> String {
    crate::store::keys::glob_escaped(prefix) + "~{~replicas:*}:members"
}

/// The FLEET of a members hash found with [`fleets_pattern`].
pub fn fleet_of(prefix: &str, redis_key: &str) -> Option<String> {
    let fleet = redis_key
        .strip_prefix(prefix)?
        .strip_prefix("~{~replicas:")?
        .strip_suffix("}:members")?;
    (!fleet.is_empty() && !fleet.contains(['{', '}'])).then(|| fleet.to_string())
}

/// Tell `fleet`'s replicas that `poke` waits, for `span` (zero: take it back): how many replicas
/// the fleet has.
pub fn poke(
    link: &mut Link,
    within: Duration,
    prefix: &str,
    fleet: &str,
    poke: &Poke,
    span: Duration,
) -> Result<usize, Failure> {
    let keys = [pokes_key(prefix, fleet), members_key(prefix, fleet)];
    let keys = [keys[0].as_str(), keys[1].as_str()];
    let args = [poke.member(), span.as_millis().to_string()];
    eval(link, within, &POKE, &keys, &args, |v| {
        Ok(int(v, "a poke reply that is not a count")?.max(0) as usize)
    })
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
    /// How far Redis's clock is ahead of the replica's (ms), once it measured it.
    pub offset: Option<i64>,
}

/// Send one heartbeat; the view after it.
pub fn beat(link: &mut Link, within: Duration, beat: Heartbeat<'_>) -> Result<FleetView, Failure> {
    let Heartbeat {
        prefix,
        fleet,
        id,
        lapse,
        full,
        offset,
    } = beat;
    let members = members_key(prefix, fleet);
    let pokes = pokes_key(prefix, fleet);
    let lapse_ms = if lapse.is_zero() { 0 } else { ms(lapse) };
    let args = [
        id.to_string(),
        lapse_ms.to_string(),
        u8::from(full).to_string(),
        MAX_MEMBERS.to_string(),
        offset.map_or(String::new(), |o| o.to_string()),
    ];
    eval(
        link,
        within,
        &MEMBERS,
        &[&members, &pokes],
        &args,
        read_view,
    )
}

/// `{live ids, full ids, pokes, clock}`; anything else is a failure.
fn read_view(reply: &Value) -> Result<FleetView, Failure> {
    const SHAPE: &str = "a heartbeat reply that is not {live ids, full ids, pokes, clock}";
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
        Value::Array(parts) if parts.len() == 4 => Ok(FleetView {
            live: ids(&parts[0])?,
            full: ids(&parts[1])?,
            pokes: ids(&parts[2])?
                .iter()
                .filter_map(|m| Poke::read(m))
                .collect(),
            redis_ms: int(&parts[3], SHAPE)?,
        }),
        _ => Err(Failure::shape(SHAPE)),
    }
}

/// One replica of a fleet as its heartbeat left it: its id, whether it is at `--max-jobs`, and
/// how far Redis's clock is ahead of its own (ms), when it measured it (a replica of an earlier
/// version does not say).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub id: String,
    pub full: bool,
    pub offset: Option<i64>,
}

impl Member {
    /// A members hash's field and value (`LAPSE[ full][ offset=N]`).
    fn read(id: &str, value: &str) -> Member {
        let offset = value
            .split(' ')
            .find_map(|w| w.strip_prefix("offset="))
            .and_then(|n| n.parse().ok());
        Member {
            id: id.to_string(),
            full: value.split(' ').any(|w| w == "full"),
            offset,
        }
    }
}

/// The replicas of `fleet` under `prefix` that heartbeat there (at most [`MAX_MEMBERS`]; a
/// lapsed one may linger until the next heartbeat drops it).
pub fn members(
    link: &mut Link,
    within: Duration,
    prefix: &str,
    fleet: &str,
) -> Result<Vec<Member>, Failure> {
    const SHAPE: &str = "a members hash that is not field, value pairs";
    let key = members_key(prefix, fleet);
    let reply = link.call(within, &key, &[b"HGETALL", key.as_bytes()])?;
    link.read(reply, |v| {
        let Value::Array(items) = v else {
            return Err(Failure::shape(SHAPE));
        };
        let text = |v: &Value| match v {
            Value::BulkString(b) => Ok(String::from_utf8_lossy(b).into_owned()),
            _ => Err(Failure::shape(SHAPE)),
        };
        let mut out = Vec::new();
        for pair in items.chunks(2).take(MAX_MEMBERS) {
            let [id, value] = pair else {
                return Err(Failure::shape(SHAPE));
            };
            out.push(Member::read(&text(id)?, &text(value)?));
        }
        Ok(out)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_reads_as_its_heartbeat_wrote_it() {
        let m = Member::read("h/1", "1800000000000 full offset=-3012");
        assert_eq!((m.full, m.offset), (true, Some(-3012)));
        let m = Member::read("h/2", "1800000000000");
        assert_eq!((m.full, m.offset), (false, None));
    }
}
