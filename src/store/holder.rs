//! Who holds a lock: the value cronlock writes to Redis (JSON: token, host, pid, start, command),
//! compared whole by every script that extends or deletes a lock.

use serde_json::json;

/// How many characters of the command line the lock value and the run record keep.
pub const MAX_COMMAND: usize = 256;

/// `text` cut to `max` characters, the last being `…` when anything was cut.
pub fn truncate(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_string();
    }
    let mut cut: String = text.chars().take(max - 1).collect();
    cut.push('…');
    cut
}

/// Who holds the lock: the value stored in Redis is this, as JSON, and is compared whole.
#[derive(Debug, Clone)]
pub struct Holder {
    /// A fresh uuid v4 per run; also given to the child as `CRONLOCK_TOKEN`.
    pub token: String,
    pub host: String,
    pub pid: u32,
    /// Wall-clock milliseconds when we asked for the lock.
    pub started_ms: u64,
    pub command: String,
    /// The exact value written to Redis.
    pub value: String,
}

impl Holder {
    pub fn new(command: &str) -> Holder {
        let token = uuid::Uuid::new_v4().to_string();
        let host = crate::host::hostname();
        let pid = std::process::id();
        let started_ms = crate::clock::unix_millis();
        let command = truncate(command, MAX_COMMAND);
        let value = json!({
            "token": token, "host": host, "pid": pid, "started": started_ms, "command": command,
        })
        .to_string();
        Holder {
            token,
            host,
            pid,
            started_ms,
            command,
            value,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_commands_are_cut_with_a_marker() {
        assert_eq!(truncate("short", 256), "short");
        let long = "x".repeat(300);
        let cut = Holder::new(&long).command;
        assert_eq!(cut.chars().count(), MAX_COMMAND);
        assert!(cut.ends_with('…'));
    }

    #[test]
    fn holder_value_is_json_with_identity() {
        let h = Holder::new("report.sh --all");
        let v: serde_json::Value = serde_json::from_str(&h.value).unwrap();
        assert_eq!(v["token"], h.token.as_str());
        assert_eq!(v["command"], "report.sh --all");
        assert_eq!(v["pid"], std::process::id());
    }
}
