//! The ledger of a scheduled KEY's instants (written by `acquire.lua` and `release.lua`), as
//! `--status` shows it: JSON for scripts, lines for people. It exists so that "what became of the
//! 02:00 run" (succeeded, failed and retried, abandoned by a dead host, missed, skipped while
//! suspended) reads the same everywhere it is shown.

use serde_json::{json, Value};

use crate::clock::rfc3339;
use crate::fleet::describe::{round_ms, text_field};

/// The states an instant can be in, as the scripts write them.
pub const STATES: [&str; 7] = [
    "running",
    "succeeded",
    "failed",
    "missed",
    "abandoned",
    "interrupted",
    "skipped",
];

/// Why an instant was recorded `missed` (the entry's `reason`, and the `reason` label of
/// `cronlock_instants_missed_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MissedReason {
    /// It waited for room (`--max-jobs`) on the replicas that could claim it, until its next
    /// instant (or the end of its `--catch-up` window).
    NoRoom,
    /// Its claims could not reach Redis in time.
    Unreachable,
    /// The replica's loop came to it only after it could no longer start (the machine was
    /// saturated, or the replica was frozen).
    Late,
}

impl MissedReason {
    pub const ALL: [MissedReason; 3] = [Self::NoRoom, Self::Unreachable, Self::Late];

    /// The word in the ledger and the metrics.
    pub fn name(self) -> &'static str {
        match self {
            Self::NoRoom => "no_room",
            Self::Unreachable => "redis_unreachable",
            Self::Late => "late",
        }
    }

    /// Why, for people.
    pub fn says(self) -> &'static str {
        match self {
            Self::NoRoom => "no replica had room to start it in time (--max-jobs)",
            Self::Unreachable => "its claims could not reach redis in time",
            Self::Late => {
                "the replica came to it only after it could no longer start (overloaded or frozen)"
            }
        }
    }
}

/// One instant's entry as JSON: `{instant, instant_time, state, attempts: [...]}`, each attempt
/// with its times also in RFC 3339. An entry cronlock did not write is shown as `{"value": ...}`.
pub fn entry_json(instant: i64, raw: &str) -> Value {
    let mut entry = match serde_json::from_str::<Value>(raw) {
        Ok(v @ Value::Object(_)) => v,
        _ => json!({ "value": raw }),
    };
    let attempts: Vec<Value> = match &entry["attempts"] {
        // Lua's cjson writes an empty list as {}.
        Value::Array(list) => list
            .iter()
            .map(|a| {
                let mut a = a.clone();
                for (at, shown) in [("started", "started_time"), ("ended", "ended_time")] {
                    if let Some(ms) = a[at].as_u64() {
                        a[shown] = rfc3339(ms).into();
                    }
                }
                a
            })
            .collect(),
        _ => Vec::new(),
    };
    let mut doc = json!({
        "instant": instant,
        "instant_time": rfc3339(instant.max(0) as u64),
        "state": entry.get("state").cloned().unwrap_or(Value::Null),
        "attempts": attempts,
    });
    if let Some(v) = entry.get_mut("value") {
        doc["value"] = v.take();
    }
    if let Some(reason) = entry.get("reason").filter(|r| r.is_string()) {
        doc["reason"] = reason.clone();
    }
    doc
}

/// The ledger, newest first, as JSON.
pub fn json(ledger: &[(i64, String)]) -> Value {
    ledger
        .iter()
        .map(|(at, raw)| entry_json(*at, raw))
        .collect()
}

/// An instant's state in a few words: `succeeded (attempt 2 of 2)`, `missed`.
pub fn state_words(entry: &Value) -> String {
    let mut state = text_field(entry, "state");
    let word = |r: &&str| !r.is_empty() && r.chars().all(|c| c.is_ascii_lowercase() || c == '_');
    if let Some(reason) = entry["reason"].as_str().filter(word) {
        state = format!("{state} ({reason})");
    }
    match entry["attempts"].as_array().map_or(0, Vec::len) {
        0 | 1 => state,
        n => format!("{state} after {n} attempts"),
    }
}

/// The ledger for people, newest first: one line per instant, one per attempt under it.
pub fn lines(ledger: &[(i64, String)], label: impl Fn(i64) -> String) -> Vec<String> {
    let mut out = Vec::new();
    if ledger.is_empty() {
        out.push("instants: none recorded".into());
        return out;
    }
    out.push(format!("instants ({}, newest first):", ledger.len()));
    let labels: Vec<String> = ledger.iter().map(|(at, _)| label(*at)).collect();
    let width = labels.iter().map(String::len).max().unwrap_or(0);
    for ((at, raw), shown) in ledger.iter().zip(&labels) {
        let entry = entry_json(*at, raw);
        out.push(format!("  {shown:<width$}  {}", state_words(&entry)));
        for (i, a) in entry["attempts"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            let ended = match (a["ended"].as_u64(), a["started"].as_u64()) {
                (Some(end), Some(start)) => {
                    format!(" after {}", round_ms(end.saturating_sub(start)))
                }
                _ => String::new(),
            };
            let how = match a["exit"].as_i64() {
                Some(code) => format!("{} (exit {code}){ended}", text_field(a, "state")),
                None => format!("{}{ended}", text_field(a, "state")),
            };
            out.push(format!(
                "    attempt {}: host {}, started {}, {how}",
                i + 1,
                text_field(a, "host"),
                a["started_time"].as_str().unwrap_or("?"),
            ));
        }
    }
    out
}
