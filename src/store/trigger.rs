//! `--trigger`: a manual instant of KEY, asked for in KEY's slot (`trigger.lua`: the request,
//! with who asked, from where, why and when by Redis's clock), taken back when no replica
//! accepted it (`untrigger.lua`), and read while the asking command waits (`trigger_read.lua`:
//! the request and the instant's ledger entry). A replica's claim of the instant
//! (`acquire.lua`) marks the request accepted, or skipped.

use std::time::Duration;

use redis::Value;

use crate::store::keys::Keys;
use crate::store::script::{eval, int, text_or_nil, Script};
use crate::store::topology::{Failure, Link};

const TRIGGER_LUA: &str = concat!(
    include_str!("lua/newest.lua"),
    include_str!("lua/trigger.lua")
);
const UNTRIGGER_LUA: &str = include_str!("lua/untrigger.lua");
const READ_LUA: &str = include_str!("lua/trigger_read.lua");
static TRIGGER: Script = Script::new(TRIGGER_LUA);
static UNTRIGGER: Script = Script::new(UNTRIGGER_LUA);
static READ: Script = Script::new(READ_LUA);

/// How long the requests of a KEY are kept after the last one (for `--status` and `--wait`).
pub const KEPT: Duration = Duration::from_secs(86_400);

/// Ask for the manual instant `instant` of KEY with `record` (JSON: host, user, reason): whether
/// it was written (false: the instant is taken, by a request or a ledger entry).
pub fn ask(
    link: &mut Link,
    within: Duration,
    keys: &Keys,
    instant: i64,
    record: &str,
) -> Result<bool, Failure> {
    let args = [
        instant.to_string(),
        record.to_string(),
        KEPT.as_millis().to_string(),
    ];
    eval(
        link,
        within,
        &TRIGGER,
        &[&keys.trigger, &keys.ledger],
        &args,
        |v| Ok(int(v, "a trigger reply that is not 0 or 1")? == 1),
    )
}

/// Take the request for `instant` back, unless a replica accepted it: whether it was taken back.
pub fn take_back(
    link: &mut Link,
    within: Duration,
    keys: &Keys,
    instant: i64,
) -> Result<bool, Failure> {
    eval(
        link,
        within,
        &UNTRIGGER,
        &[&keys.trigger],
        &[instant.to_string()],
        |v| Ok(int(v, "an untrigger reply that is not 0 or 1")? == 1),
    )
}

/// The request for `instant` and its ledger entry, as stored (JSON), each if there is one.
#[derive(Debug, Clone, Default)]
pub struct Standing {
    pub request: Option<String>,
    pub entry: Option<String>,
}

/// Where the manual instant `instant` of KEY stands.
pub fn read(
    link: &mut Link,
    within: Duration,
    keys: &Keys,
    instant: i64,
) -> Result<Standing, Failure> {
    const SHAPE: &str = "a trigger read that is not {request, entry}";
    eval(
        link,
        within,
        &READ,
        &[&keys.trigger, &keys.ledger],
        &[instant.to_string()],
        |v| match v {
            Value::Array(parts) if parts.len() == 2 => Ok(Standing {
                request: text_or_nil(&parts[0], SHAPE)?,
                entry: text_or_nil(&parts[1], SHAPE)?,
            }),
            _ => Err(Failure::shape(SHAPE)),
        },
    )
}
