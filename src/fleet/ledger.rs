//! The ledger of a scheduled KEY's instants (`record::ledger`), as `--status` and the page show
//! it: JSON for scripts, lines for people. It exists so that "what became of the 02:00 run"
//! (succeeded, failed and retried, abandoned by a dead host, missed, skipped while suspended)
//! reads the same everywhere it is shown.

use serde_json::{json, Value};

use crate::clock::rfc3339;
use crate::fleet::describe::round_ms;
use crate::record::ledger::{LedgerAttempt, LedgerEntry};
use crate::record::{or_unknown, Stored};

/// A ledger: (instant in Unix ms, its entry), newest first.
pub type Ledger = [(i64, Stored<LedgerEntry>)];

/// One instant's entry as JSON: `{instant, instant_time, state, attempts: [...]}`, each attempt
/// with its times also in RFC 3339. An entry cronlock did not write is shown as `{"value": ...}`.
pub fn entry_json(instant: i64, entry: &Stored<LedgerEntry>) -> Value {
    let mut doc = json!({
        "instant": instant,
        "instant_time": rfc3339(instant.max(0) as u64),
        "state": Value::Null,
        "attempts": [],
    });
    match entry {
        Stored::Foreign(raw) => doc["value"] = raw.as_str().into(),
        Stored::Ours(e) => {
            doc["state"] = e.state.as_deref().into();
            doc["attempts"] = e.attempts.iter().map(attempt_json).collect();
            if let Some(reason) = &e.reason {
                doc["reason"] = reason.as_str().into();
            }
        }
    }
    doc
}

/// An attempt as JSON, with `started_time` and `ended_time`.
fn attempt_json(a: &LedgerAttempt) -> Value {
    let mut v = crate::record::to_json(a);
    if let Some(ms) = a.started {
        v["started_time"] = rfc3339(ms).into();
    }
    if let Some(ms) = a.ended {
        v["ended_time"] = rfc3339(ms).into();
    }
    v
}

/// The ledger, newest first, as JSON.
pub fn json(ledger: &Ledger) -> Value {
    ledger
        .iter()
        .map(|(at, entry)| entry_json(*at, entry))
        .collect()
}

/// An entry's state (`?` when it has none, as one cronlock did not write).
pub fn state(entry: &Stored<LedgerEntry>) -> String {
    or_unknown(entry.ours().and_then(|e| e.state.as_deref()))
}

/// The attempts of an entry, oldest first.
pub fn attempts(entry: &Stored<LedgerEntry>) -> &[LedgerAttempt] {
    entry.ours().map_or(&[], |e| &e.attempts)
}

/// An instant's state in a few words: `succeeded (attempt 2 of 2)`, `missed`.
pub fn state_words(entry: &Stored<LedgerEntry>) -> String {
    let mut state = state(entry);
    if let Some(reason) = entry.ours().and_then(LedgerEntry::reason_word) {
        state = format!("{state} ({reason})");
    }
    match attempts(entry).len() {
        0 | 1 => state,
        n => format!("{state} after {n} attempts"),
    }
}

/// How long an attempt took, when it ended.
pub fn took(a: &LedgerAttempt) -> Option<String> {
    Some(round_ms(a.ended?.saturating_sub(a.started?)))
}

/// The ledger for people, newest first: one line per instant, one per attempt under it.
pub fn lines(ledger: &Ledger, label: impl Fn(i64) -> String) -> Vec<String> {
    let mut out = Vec::new();
    if ledger.is_empty() {
        out.push("instants: none recorded".into());
        return out;
    }
    out.push(format!("instants ({}, newest first):", ledger.len()));
    let labels: Vec<String> = ledger.iter().map(|(at, _)| label(*at)).collect();
    let width = labels.iter().map(String::len).max().unwrap_or(0);
    for ((_, entry), shown) in ledger.iter().zip(&labels) {
        out.push(format!("  {shown:<width$}  {}", state_words(entry)));
        for (i, a) in attempts(entry).iter().enumerate() {
            let ended = took(a).map_or(String::new(), |t| format!(" after {t}"));
            let state = or_unknown(a.state.as_deref());
            let how = match a.exit {
                Some(code) => format!("{state} (exit {code}){ended}"),
                None => format!("{state}{ended}"),
            };
            out.push(format!(
                "    attempt {}: host {}, started {}, {how}",
                i + 1,
                or_unknown(a.host.as_deref()),
                a.started.map_or("?".into(), rfc3339),
            ));
        }
    }
    out
}
