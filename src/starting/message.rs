//! The messages between a replica (`--crontab`) and its starter (`run/starter.rs`), the small
//! process that forks the replica's runs: the replica asks `start` (the run's descriptors travel
//! beside it, `starting/mod.rs`), the starter answers `started` or `refused` to that request,
//! and says `exited` when a run's process ended. Each is one JSON object with a version (`"v"`).

use anyhow::{anyhow, bail, Result};
use serde::{Deserialize, Serialize};

/// The version of these messages; a process refuses any other.
pub const VERSION: u64 = 2;

/// A crontab's `NAME=value` line, as the jobs below it give it to their commands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Variable {
    pub name: String,
    pub value: String,
}

/// One message, by kind.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum StarterMessage {
    /// Start request `id`: a run of KEY's job, whose run has these arguments (after the program
    /// name) and whose command gets these crontab variables.
    Start {
        id: u64,
        key: String,
        args: Vec<String>,
        env: Vec<Variable>,
    },
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
    use super::StarterMessage;

    #[test]
    fn messages_read_back_whole() {
        let all = [
            StarterMessage::Start {
                id: 7,
                key: "k".into(),
                args: vec!["--schedule".into(), "* * * * *".into()],
                env: vec![super::Variable {
                    name: "A".into(),
                    value: "b c".into(),
                }],
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
        assert!(StarterMessage::decode(br#"{"v":1,"kind":"exited","pid":1,"status":0}"#).is_err());
        assert!(StarterMessage::decode(br#"{"v":3,"kind":"exited","pid":1,"status":0}"#).is_err());
    }
}
