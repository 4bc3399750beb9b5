//! The messages between a replica (`--crontab`) and a run it started, one line of JSON each
//! with a version (`"v"`) and a kind: the replica sends one `lock` (and `changed` whenever its
//! watch saw the lock change, `renewed` whenever it renewed the lock); the run sends `started`,
//! `renew` whenever a renewal is due,
//! then `release` (how its command ended) and waits for the replica's `releasing`, then `released`,
//! then `ended`
//! (`handover/mod.rs` carries them).

use anyhow::{anyhow, bail, Result};
use serde::{Deserialize, Serialize};

use crate::record::run::Ending;

/// The version of the messages; a process refuses any other.
pub const VERSION: u64 = 6;

/// One message, by kind.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Message {
    /// The lock a replica won, handed to its run.
    Lock(LockMessage),
    /// The command started, as process `pid`.
    Started { pid: u32 },
    /// The run is alive and its command runs: renew the lock now (with the others due, in one
    /// pipeline), and say `renewed`.
    Renew,
    /// Release the lock for the run, recording how its command ended.
    Release(ReleaseMessage),
    /// The replica read a `release` and is carrying it out: the run waits for its `released`
    /// (without it, soon, the run releases by itself). Sent at once by the thread that reads the
    /// run's channel, so a frozen or dead replica is told from a busy one in milliseconds. (A
    /// run of an earlier version skips it: no new version.)
    Releasing,
    /// The replica's answer to a `release`.
    Released(ReleasedMessage),
    /// The replica's watch saw the lock change (or the watch broke): renew now.
    Changed,
    /// The replica renewed the lock, and Redis (with `--min-replicas`, its replicas too)
    /// confirmed it: it is valid for its TTL from when the renewal was sent, on `CLOCK_BOOTTIME`
    /// (the same clock in every process).
    Renewed { sent_boot_ns: u64 },
    /// The run ended: its exit status and how the command ended, `duration_ms` after the claim.
    Ended {
        status: u8,
        ending: Ending,
        duration_ms: u64,
    },
}

/// A won lock: the holder value and its parts, the fencing token, and when the claim was sent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LockMessage {
    pub key: String,
    /// The holder value exactly as written to Redis.
    pub value: String,
    pub token: String,
    pub host: String,
    pub pid: u32,
    pub started: u64,
    pub command: String,
    pub fence: i64,
    pub slot: u32,
    pub limit: u32,
    pub instant: Option<i64>,
    /// The instant is a manual one (`--trigger`), not the schedule's.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub manual: bool,
    pub attempt: u32,
    pub ttl_ms: u64,
    /// When the claim was sent, on `CLOCK_BOOTTIME` (the same clock in every process).
    pub sent_boot_ns: u64,
    /// The process that started the run (the replica's starter), for diagnostics: a run lives on
    /// when its starter dies, and follows its replica through this channel instead.
    #[serde(default)]
    pub parent_pid: u32,
    /// The replica watches the lock for changes and says `changed` (the run does not watch it
    /// itself).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub watched: bool,
    /// The replica renews the lock when the run asks (`renew`), and says `renewed`: the run
    /// renews it by itself only when no renewal came in time.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub renewed_by_replica: bool,
    /// `--overlap allow`: the lock is the instant's own (`KEY:at:INSTANT`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub own_lock: bool,
    /// `--overlap replace`: until when (`CLOCK_BOOTTIME`) a run replaced may still be stopping.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after_boot_ns: Option<u64>,
    /// A scheduled instant's: when Redis's clock reaches it (`CLOCK_BOOTTIME`); the command
    /// starts no earlier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub due_boot_ns: Option<u64>,
}

/// How a run's command ended, which its replica records at the release it asks for (the
/// replica makes the run record and the ledger's end from it, `config::RunConfig::release_options`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReleaseMessage {
    /// cronlock's exit status for the run.
    pub status: u8,
    /// The command was killed by this signal (the status is 128 + it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    pub ending: Ending,
    /// When the command started (wall-clock ms), if it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_ms: Option<u64>,
    /// When the run was done with it (wall-clock ms).
    pub finished_ms: u64,
    /// The run was asked to end while its command ran.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub interrupted: bool,
}

/// How the replica's release went, or why it failed (`owed`: the replica carries it out once
/// Redis answers).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReleasedMessage {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<ReleaseOutcome>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub owed: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReleaseOutcome {
    Deleted,
    Kept,
    NotOurs,
}

#[derive(Deserialize)]
struct Envelope {
    #[serde(flatten)]
    message: Message,
}

#[derive(Serialize)]
struct Sent<'a> {
    v: u64,
    #[serde(flatten)]
    message: &'a Message,
}

#[derive(Deserialize)]
struct Version {
    v: Option<u64>,
}

impl Message {
    /// The message, one line ending in a newline.
    pub fn line(&self) -> String {
        let sent = Sent {
            v: VERSION,
            message: self,
        };
        let mut text = serde_json::to_string(&sent).unwrap_or_default();
        text.push('\n');
        text
    }

    /// Read one line (without its newline): a message of this version, in its exact shape.
    pub fn parse(line: &str) -> Result<Message> {
        let version: Version =
            serde_json::from_str(line).map_err(|_| anyhow!("the message is not JSON"))?;
        match version.v {
            Some(VERSION) => {}
            Some(other) => bail!("message version {other}, and this cronlock speaks {VERSION}"),
            None => bail!("the message has no version"),
        }
        let envelope: Envelope =
            serde_json::from_str(line).map_err(|e| anyhow!("a message out of shape: {e}"))?;
        Ok(envelope.message)
    }
}
