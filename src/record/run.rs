//! A run record: what one run did, written at release as the KEY's last run (and into a short
//! capped history), so "did last night's job run, where, and did it succeed?" has an answer
//! without redis-cli.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::exit::Exit;

/// How a run ended, as recorded, logged and reported to a replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Ending {
    /// The command exited by itself.
    Exited,
    /// The command was killed by a signal it did not handle.
    Signalled,
    /// cronlock stopped it because the lock was lost.
    Lost,
    /// cronlock stopped it at `--max-runtime`.
    MaxRuntime,
    /// The command could not be started (or a signal arrived first).
    NotStarted,
}

/// A recorded ending: one this version knows, or the word another version wrote.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum RecordedEnding {
    Known(Ending),
    Other(String),
}

impl Ending {
    pub fn name(self) -> &'static str {
        match self {
            Ending::Exited => "exited",
            Ending::Signalled => "signalled",
            Ending::Lost => "lost",
            Ending::MaxRuntime => "max-runtime",
            Ending::NotStarted => "not-started",
        }
    }
}

/// The record of one run. Every field is optional on reading (a record another version wrote
/// may lack one); cronlock writes all that apply.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended: Option<RecordedEnding>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_status: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fencing_token: Option<i64>,
    /// Wall-clock ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// With `--schedule`: the instant it ran for (Unix ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instant: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// With `--limit` above 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u64>,
    /// The signal that killed the command.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot: Option<u32>,
    /// Wall-clock ms: when the command started (when the lock was asked for, for a run whose
    /// command did not start, and in records of versions before 0.2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started: Option<u64>,
    /// The holder's token (the run id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// With `--keep-output`: the last lines the command printed, oldest first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<Vec<KeptLine>>,
    /// Fields this version does not know.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// One line of a command's output kept with its run record (`--keep-output`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeptLine {
    pub stream: KeptStream,
    /// The line without its newline; a byte that is not printable UTF-8 (other than a tab) is
    /// written `\xNN`, and a line cut at its head (longer than what is kept) starts with `…`.
    pub line: String,
}

/// Which of the command's streams a kept line came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KeptStream {
    Stdout,
    Stderr,
}

impl KeptStream {
    /// `out` or `err`, the mark `--status` shows before a kept line.
    pub fn mark(self) -> &'static str {
        match self {
            KeptStream::Stdout => "out",
            KeptStream::Stderr => "err",
        }
    }
}

/// How a run's command ended, as its release records it: what a replica's run tells its replica
/// when it asks it to release (the replica, which claimed the lock, makes the record), and what a
/// run that releases by itself records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommandEnd {
    /// cronlock's exit status for the run.
    pub exit: Exit,
    pub ending: Ending,
    /// When the command started (wall-clock ms), if it did.
    pub started_ms: Option<u64>,
    /// When the run was done with it (wall-clock ms).
    pub finished_ms: u64,
    /// cronlock was asked to end while it ran (and passed it on): the ledger says interrupted.
    pub interrupted: bool,
}

impl CommandEnd {
    /// Whether the command ran and exited with status 0.
    pub fn succeeded(&self) -> bool {
        self.ending == Ending::Exited && self.exit.code() == 0
    }
}
