//! Who holds a lock: the value cronlock writes to Redis (a `record::holder::HolderValue`),
//! compared whole by every script that extends or deletes a lock, and its parts.

use crate::record::holder::HolderValue;

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
        let value = crate::record::to_text(&HolderValue {
            command: Some(command.clone()),
            host: Some(host.clone()),
            pid: Some(u64::from(pid)),
            started: Some(started_ms),
            token: Some(token.clone()),
            rest: Default::default(),
        });
        Holder {
            token,
            host,
            pid,
            started_ms,
            command,
            value,
        }
    }

    /// The holder value as a JSON string (quoted and escaped), as the ledger entry holds it.
    pub fn quoted(&self) -> String {
        serde_json::Value::from(self.value.as_str()).to_string()
    }

    /// The ledger's members for this holder's attempt: `"host":...,"run_id":...` (the run id is
    /// the token).
    pub fn attempt_members(&self) -> String {
        format!(
            "\"host\":{},\"run_id\":{}",
            serde_json::Value::from(self.host.as_str()),
            serde_json::Value::from(self.token.as_str())
        )
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
        let v: HolderValue = serde_json::from_str(&h.value).unwrap();
        assert_eq!(v.token.as_deref(), Some(h.token.as_str()));
        assert_eq!(v.command.as_deref(), Some("report.sh --all"));
        assert_eq!(v.pid, Some(u64::from(std::process::id())));
    }

    #[test]
    fn the_ledger_forms_are_json() {
        let h = Holder::new("say \"hi\" \\ \u{1}");
        let quoted: serde_json::Value = serde_json::from_str(&h.quoted()).unwrap();
        assert_eq!(quoted, h.value.as_str());
        let members: crate::record::ledger::LedgerAttempt =
            serde_json::from_str(&format!("{{{}}}", h.attempt_members())).unwrap();
        assert_eq!(members.host.as_deref(), Some(h.host.as_str()));
        assert_eq!(members.run_id.as_deref(), Some(h.token.as_str()));
    }
}
