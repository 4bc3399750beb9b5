//! A lock's holder value: what cronlock writes to Redis as the lock's value (JSON: token, host,
//! pid, start, command), compared whole by every script that extends or deletes a lock.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Who holds a lock, as its value says.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HolderValue {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u64>,
    /// Wall-clock milliseconds when the holder asked for the lock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started: Option<u64>,
    /// A fresh uuid v4 per run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// Fields this version does not know.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// Who a holder is without its command line (host, pid, since), for log events.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Identity {
    pub host: Option<String>,
    pub pid: Option<u64>,
    pub started: Option<u64>,
}

impl HolderValue {
    pub fn identity(&self) -> Identity {
        Identity {
            host: self.host.clone(),
            pid: self.pid,
            started: self.started,
        }
    }
}
