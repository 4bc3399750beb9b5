//! A request for a manual instant (`cronlock --trigger KEY`): who asked, from which host, why,
//! when (`asked`, Redis's clock, set by `trigger.lua`), and where it stands (`state`: `asked`,
//! then `accepted` by a replica's claim, with the host that took it, `by`, and the job's
//! `--retries`; `queued`: waiting for the run before it, under `--overlap queue`, or under the
//! others when that run started after the request was made; or `skipped`: suspended, or busy
//! under `--overlap skip` or `allow` with a run that started before the request).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TriggerRequest {
    /// Unix ms, from Redis's clock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub asked: Option<u64>,
    /// The host whose replica accepted it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The job's `--retries`, written when a replica took it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retries: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Fields this version does not know.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}
