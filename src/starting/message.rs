//! The messages between a replica (`--crontab`) and its starter (`run/starter.rs`), the small
//! process that forks the replica's runs: the replica asks `start` with the job's resolved run
//! ([`Plan`]; the run's descriptors travel beside it, `starting/mod.rs`), the starter answers
//! `started` or `refused` to that request, and says `exited` when a run's process ended. Each is
//! one JSON object with a version (`"v"`).

use anyhow::{anyhow, bail, Result};
use serde::{Deserialize, Serialize};

use crate::config::JobRun;

/// The version of these messages; a process refuses any other.
pub const VERSION: u64 = 3;

/// A job's resolved run ([`JobRun`]) as it crosses the link: its JSON, as a string of the
/// message. The starter keeps each job's run decoded by this text ([`Plan::text`]), so a job's
/// run is decoded once per starter, not once per start (its servers are resolved there, its TLS
/// files read). Its text may hold a password: it is never shown (its `Debug` says its length).
#[derive(Clone, Serialize, Deserialize)]
pub struct Plan(String);

impl Plan {
    /// `run`, encoded.
    pub fn of(run: &JobRun) -> Result<Plan> {
        serde_json::to_string(run)
            .map(Plan)
            .map_err(|e| anyhow!("the job's run cannot be sent to its starter: {e}"))
    }

    /// The run back, its servers resolved.
    pub fn read(&self) -> Result<JobRun> {
        serde_json::from_str(&self.0).map_err(|e| anyhow!("{e}"))
    }

    /// What it is kept by.
    pub fn text(&self) -> &str {
        &self.0
    }
}

impl PartialEq for Plan {
    fn eq(&self, other: &Plan) -> bool {
        self.text() == other.text()
    }
}

impl std::fmt::Debug for Plan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Plan({} bytes)", self.text().len())
    }
}

/// One message, by kind.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum StarterMessage {
    /// Start request `id`: a run of KEY's job, as it resolved.
    Start { id: u64, key: String, run: Plan },
    /// Request `id` started as process `pid`.
    Started { id: u64, pid: u32 },
    /// Request `id` could not be started.
    Refused { id: u64, why: String },
    /// A run's process ended, with this wait status (as `waitpid` gives it).
    Exited { pid: u32, status: i32 },
}

#[derive(Serialize)]
struct StarterSent<'a> {
    v: u64,
    #[serde(flatten)]
    message: &'a StarterMessage,
}

#[derive(Deserialize)]
struct StarterReceived {
    v: Option<u64>,
    #[serde(flatten)]
    message: StarterMessage,
}

impl StarterMessage {
    /// The message as bytes.
    pub fn encode(&self) -> Vec<u8> {
        let sent = StarterSent {
            v: VERSION,
            message: self,
        };
        serde_json::to_vec(&sent).unwrap_or_default()
    }

    /// Read one message of this version, in its exact shape.
    pub fn decode(bytes: &[u8]) -> Result<StarterMessage> {
        let got: StarterReceived = serde_json::from_slice(bytes)
            .map_err(|e| anyhow!("a starter message out of shape: {e}"))?;
        match got.v {
            Some(VERSION) => Ok(got.message),
            Some(other) => {
                bail!("starter message version {other}, and this cronlock speaks {VERSION}")
            }
            None => bail!("the starter message has no version"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Plan, StarterMessage};

    #[test]
    fn messages_read_back_whole() {
        let plan = r#"{"a":[1,"b"]}"#.to_string();
        let all = [
            StarterMessage::Start {
                id: 7,
                key: "k".into(),
                run: Plan(plan),
            },
            StarterMessage::Started { id: 7, pid: 42 },
            StarterMessage::Refused {
                id: 8,
                why: "cannot fork".into(),
            },
            StarterMessage::Exited { pid: 42, status: 9 },
        ];
        for m in all {
            assert_eq!(StarterMessage::decode(&m.encode()).unwrap(), m);
        }
        // Another version is refused.
        assert!(StarterMessage::decode(br#"{"v":2,"kind":"exited","pid":1,"status":0}"#).is_err());
        assert!(StarterMessage::decode(br#"{"v":4,"kind":"exited","pid":1,"status":0}"#).is_err());
    }
}
