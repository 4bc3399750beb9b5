//! The ledger of a scheduled KEY: one entry per instant (a Redis hash field named by the instant
//! in Unix ms), written by `acquire.lua`, `release.lua`, `abandon.lua` and `missed.lua`, with the
//! attempts that ran it.

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

/// The states an instant can be in, as the scripts write them.
pub const STATES: [&str; 9] = [
    "queued",
    "running",
    "replaced",
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
    /// It waited on a replica whose crontab was read again without its job, or with the job
    /// changed (another schedule, TTL, command).
    Reload,
}

impl MissedReason {
    pub const ALL: [MissedReason; 4] = [Self::NoRoom, Self::Unreachable, Self::Late, Self::Reload];

    /// The word in the ledger and the metrics.
    pub fn name(self) -> &'static str {
        match self {
            Self::NoRoom => "no_room",
            Self::Unreachable => "redis_unreachable",
            Self::Late => "late",
            Self::Reload => "reload",
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
            Self::Reload => "it waited on a replica whose crontab changed its job or removed it",
        }
    }
}

/// One instant of a KEY's ledger, as read back: the instant and its entry.
#[derive(Debug, Clone, PartialEq)]
pub struct LedgerInstant {
    /// Unix ms.
    pub instant: i64,
    pub entry: crate::record::Stored<LedgerEntry>,
}

/// One instant's entry.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LedgerEntry {
    /// Oldest first. Lua's cjson writes an empty list as `{}`.
    #[serde(default, deserialize_with = "list_or_empty")]
    pub attempts: Vec<LedgerAttempt>,
    /// While an attempt runs: its holder value (compared by `release.lua`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
    /// A manual instant (`--trigger`), not the schedule's.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub manual: bool,
    /// Why it was `missed` or `skipped`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// One of [`STATES`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// Fields this version does not know.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// One attempt at an instant.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LedgerAttempt {
    /// Wall-clock ms (Redis's clock).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended: Option<u64>,
    /// The run's exit status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit: Option<i64>,
    /// The fencing token it held, as the script wrote it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fence: Option<Fence>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// When a later instant replaced it (`--overlap replace`), wall-clock ms (Redis's clock).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replaced: Option<u64>,
    /// The holder's token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    /// Wall-clock ms (Redis's clock).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started: Option<u64>,
    /// One of [`STATES`] but `missed` and `skipped`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// Fields this version does not know.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// A fencing token as a script wrote it: text (a first attempt's entry, written without cjson)
/// or a number.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Fence {
    Number(i64),
    Text(String),
}

impl LedgerEntry {
    /// The state and, for a `missed` or `skipped` one, its reason when it is a word.
    pub fn reason_word(&self) -> Option<&str> {
        let word =
            |r: &&str| !r.is_empty() && r.chars().all(|c| c.is_ascii_lowercase() || c == '_');
        self.reason.as_deref().filter(word)
    }
}

fn list_or_empty<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<LedgerAttempt>, D::Error> {
    match Value::deserialize(d)? {
        list @ Value::Array(_) => serde_json::from_value(list).map_err(serde::de::Error::custom),
        _ => Ok(Vec::new()),
    }
}
