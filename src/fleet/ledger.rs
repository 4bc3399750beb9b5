//! The ledger of a scheduled KEY's instants (`record::ledger`), as `--status` and the page show
//! it: JSON for scripts, lines for people. It exists so that "what became of the 02:00 run"
//! (succeeded, failed and retried, abandoned by a dead host, missed, skipped while suspended)
//! reads the same everywhere it is shown.

use serde::Serialize;
use serde_json::Value;

use crate::clock::rfc3339;
use crate::fleet::describe::round_ms;
use crate::record::ledger::{LedgerAttempt, LedgerEntry, LedgerInstant};
use crate::record::{or_unknown, Stored};

/// One instant's entry as `--status --json` shows it: `{instant, instant_time, state,
/// attempts}`, each attempt with its times also in RFC 3339; an entry cronlock did not write
/// shows its `value`.
#[derive(Serialize)]
struct ShownEntry<'a> {
    instant: i64,
    instant_time: String,
    state: Option<&'a str>,
    attempts: Vec<ShownAttempt<'a>>,
    /// A manual instant (`--trigger`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    manual: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    value: Option<&'a str>,
}

/// An attempt, with `started_time` and `ended_time`.
#[derive(Serialize)]
struct ShownAttempt<'a> {
    #[serde(flatten)]
    attempt: &'a LedgerAttempt,
    #[serde(skip_serializing_if = "Option::is_none")]
    started_time: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ended_time: Option<String>,
}

/// One instant's entry as JSON (see [`ShownEntry`]).
pub fn entry_json(instant: i64, entry: &Stored<LedgerEntry>) -> Value {
    let ours = entry.ours();
    crate::record::to_json(&ShownEntry {
        instant,
        instant_time: rfc3339(instant.max(0) as u64),
        state: ours.and_then(|e| e.state.as_deref()),
        attempts: attempts(entry)
            .iter()
            .map(|a| ShownAttempt {
                attempt: a,
                started_time: a.started.map(rfc3339),
                ended_time: a.ended.map(rfc3339),
            })
            .collect(),
        manual: ours.is_some_and(|e| e.manual),
        reason: ours.and_then(|e| e.reason.as_deref()),
        value: match entry {
            Stored::Foreign(raw) => Some(raw),
            Stored::Ours(_) => None,
        },
    })
}

/// The ledger, newest first, as JSON.
pub fn json(ledger: &[LedgerInstant]) -> Value {
    ledger
        .iter()
        .map(|l| entry_json(l.instant, &l.entry))
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
    if entry.ours().is_some_and(|e| e.manual) {
        state = format!("{state}, manual (--trigger)");
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
pub fn lines(ledger: &[LedgerInstant], label: impl Fn(i64) -> String) -> Vec<String> {
    let mut out = Vec::new();
    if ledger.is_empty() {
        out.push("instants: none recorded".into());
        return out;
    }
    out.push(format!("instants ({}, newest first):", ledger.len()));
    let labels: Vec<String> = ledger.iter().map(|l| label(l.instant)).collect();
    let width = labels.iter().map(String::len).max().unwrap_or(0);
    for (LedgerInstant { entry, .. }, shown) in ledger.iter().zip(&labels) {
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
