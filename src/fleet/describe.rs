//! How a holder and a run record read, for people: the words a log line and the admin modes
//! share (`host web-1 pid 42 since ...`, "3m ago", a field or "?").
//!
//! It exists so that a run's "busy" line and `--status`/`--list` describe a holder the same way,
//! without the run reaching into an admin mode.

use std::time::Duration;

use serde_json::Value;

use crate::clock::{rfc3339, unix_millis};
use crate::duration::Span;
use crate::record::holder::HolderValue;
use crate::record::suspension::Suspension;
use crate::record::{or_unknown, Stored};

/// A holder in a few words for a log line: `host web-1 pid 42 since 2026-11-21T02:00:00Z`.
pub fn describe_holder(value: &str) -> String {
    let Stored::Ours(h) = Stored::<HolderValue>::read(value) else {
        return "a value cronlock did not write".into();
    };
    let since = h
        .started
        .map(|s| format!(" since {} ({} ago)", rfc3339(s), ago(s)))
        .unwrap_or_default();
    format!(
        "host {} pid {}{since}",
        or_unknown(h.host.as_deref()),
        or_unknown(h.pid)
    )
}

/// Who a holder is (host, pid, since), without its command line, for log events.
pub fn holder_identity(value: &str) -> Value {
    let h = Stored::<HolderValue>::read(value);
    crate::record::to_json(&h.ours().map(HolderValue::identity).unwrap_or_default())
}

/// A holder value as JSON; a value cronlock did not write is shown as `{"value": ...}`.
pub fn holder_json(value: &str) -> Value {
    Stored::<HolderValue>::read(value).to_json()
}

pub(crate) fn ttl_ms(pttl: i64) -> Value {
    if pttl >= 0 {
        pttl.into()
    } else {
        Value::Null
    }
}

pub(crate) fn round_ms(ms: u64) -> String {
    // Whole seconds read better above a minute.
    let d = if ms >= 60_000 {
        Duration::from_secs(ms / 1000)
    } else {
        Duration::from_millis(ms)
    };
    Span(d).to_string()
}

pub(crate) fn ago(ms: u64) -> String {
    round_ms(unix_millis().saturating_sub(ms))
}

/// How long until `ms` (Unix ms), by this host's clock.
pub(crate) fn left(ms: u64) -> String {
    round_ms(ms.saturating_sub(unix_millis()))
}

/// A suspension with its start also in RFC 3339.
#[derive(serde::Serialize)]
struct ShownSuspension<'a> {
    #[serde(flatten)]
    record: &'a Suspension,
    #[serde(skip_serializing_if = "Option::is_none")]
    since_time: Option<String>,
    /// With `--for`: when it ends, and how long is left (by this host's clock).
    #[serde(skip_serializing_if = "Option::is_none")]
    until_time: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    left_ms: Option<u64>,
}

/// A suspension record (`--suspend`) as JSON, with `since_time`; one cronlock did not write is
/// shown as `{"value": ...}`.
pub fn suspension_json(record: &Stored<Suspension>) -> Value {
    match record {
        Stored::Ours(record) => crate::record::to_json(&ShownSuspension {
            record,
            since_time: record.since.map(rfc3339),
            until_time: record.until.map(rfc3339),
            left_ms: record.until.map(|u| u.saturating_sub(unix_millis())),
        }),
        foreign => foreign.to_json(),
    }
}

/// When a suspension began (Unix ms), if its record says.
pub fn suspended_since(record: &Stored<Suspension>) -> Option<u64> {
    record.ours()?.since
}

/// A suspension in a few words: `by ops on web-1 since 2026-11-24T01:00:00Z (3h ago): reason`.
pub fn describe_suspension(record: &Stored<Suspension>) -> String {
    let Stored::Ours(v) = record else {
        return "by a record cronlock did not write".into();
    };
    let since = v
        .since
        .map(|s| format!(" since {} ({} ago)", rfc3339(s), ago(s)))
        .unwrap_or_default();
    let until = v
        .until
        .map(|u| format!(" until {} ({} left)", rfc3339(u), left(u)))
        .unwrap_or_default();
    let why = match v.reason.as_deref() {
        Some(r) if !r.is_empty() => format!(": {r}"),
        _ => " (no reason given)".into(),
    };
    format!(
        "by {} on {}{since}{until}{why}",
        or_unknown(v.user.as_deref()),
        or_unknown(v.host.as_deref())
    )
}
