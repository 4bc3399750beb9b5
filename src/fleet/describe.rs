//! How a holder and a run record read, for people: the words a log line and the admin modes
//! share (`host web-1 pid 42 since ...`, "3m ago", a field or "?").
//!
//! It exists so that a run's "busy" line and `--status`/`--list` describe a holder the same way,
//! without the run reaching into an admin mode.

use std::time::Duration;

use serde_json::{json, Value};

use crate::clock::{rfc3339, unix_millis};
use crate::duration::Span;

/// A holder in a few words for a log line: `host web-1 pid 42 since 2026-11-21T02:00:00Z`.
pub fn describe_holder(value: &str) -> String {
    let h = holder_json(value);
    if h.get("value").is_some() {
        return "a value cronlock did not write".into();
    }
    let since = h["started"]
        .as_u64()
        .map(|s| format!(" since {} ({} ago)", rfc3339(s), ago(s)))
        .unwrap_or_default();
    format!(
        "host {} pid {}{since}",
        text_field(&h, "host"),
        text_field(&h, "pid")
    )
}

/// Who a holder is (host, pid, since), without its command line, for log events.
pub fn holder_identity(value: &str) -> Value {
    let h = holder_json(value);
    json!({ "host": h.get("host"), "pid": h.get("pid"), "started": h.get("started") })
}

/// A holder value as JSON; a value cronlock did not write is shown as `{"value": ...}`.
pub fn holder_json(value: &str) -> Value {
    match serde_json::from_str::<Value>(value) {
        Ok(v @ Value::Object(_)) => v,
        _ => json!({ "value": value }),
    }
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

pub(crate) fn text_field(v: &Value, key: &str) -> String {
    match &v[key] {
        Value::String(s) => s.clone(),
        Value::Null => "?".into(),
        other => other.to_string(),
    }
}

/// A suspension record (`--suspend`) as JSON, with `since_time`; one cronlock did not write is
/// shown as `{"value": ...}`.
pub fn suspension_json(record: &str) -> Value {
    let mut v = holder_json(record);
    if let Some(since) = v["since"].as_u64() {
        v["since_time"] = rfc3339(since).into();
    }
    v
}

/// When a suspension began (Unix ms), if its record says.
pub fn suspended_since(record: &str) -> Option<u64> {
    holder_json(record)["since"].as_u64()
}

/// A suspension in a few words: `by ops on web-1 since 2026-11-24T01:00:00Z (3h ago): reason`.
pub fn describe_suspension(record: &str) -> String {
    let v = holder_json(record);
    if v.get("value").is_some() {
        return "by a record cronlock did not write".into();
    }
    let since = v["since"]
        .as_u64()
        .map(|s| format!(" since {} ({} ago)", rfc3339(s), ago(s)))
        .unwrap_or_default();
    let why = match v["reason"].as_str() {
        Some(r) if !r.is_empty() => format!(": {r}"),
        _ => " (no reason given)".into(),
    };
    format!(
        "by {} on {}{since}{why}",
        text_field(&v, "user"),
        text_field(&v, "host")
    )
}
