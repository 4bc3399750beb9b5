//! The records cronlock keeps in Redis, each one Rust type, written and read only here: a lock's
//! holder value (`holder.rs`), a run record (`run.rs`), a ledger entry and its attempts
//! (`ledger.rs`), a suspension (`suspension.rs`), a `--trigger` request (`trigger.rs`). The
//! messages between processes live with their conversation ([`crate::handover`],
//! [`crate::starting`]). No reader above indexes JSON by name, so a field renamed here is renamed
//! for every reader, and a test reads every shape a Lua script writes through these types.
//!
//! A stored value cronlock did not write (another client's, a hand-edited key) reads as
//! [`Stored::Foreign`] and is shown as `{"value": ...}`. Fields another version adds are kept
//! (each record's `rest`), so a record read and shown again loses nothing.

pub mod holder;
pub mod ledger;
pub mod run;
pub mod suspension;
pub mod trigger;

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};

/// A stored record: one cronlock wrote (its fields may still be missing), or a value it did not.
#[derive(Debug, Clone, PartialEq)]
pub enum Stored<T> {
    Ours(T),
    Foreign(String),
}

impl<T: DeserializeOwned> Stored<T> {
    /// Read a stored value: a JSON object whose known fields have their types is ours.
    pub fn read(raw: &str) -> Stored<T> {
        match serde_json::from_str::<Value>(raw) {
            Ok(v @ Value::Object(_)) => match serde_json::from_value(v) {
                Ok(t) => Stored::Ours(t),
                Err(_) => Stored::Foreign(raw.to_string()),
            },
            _ => Stored::Foreign(raw.to_string()),
        }
    }
}

impl<T> Stored<T> {
    /// The record, when cronlock wrote it.
    pub fn ours(&self) -> Option<&T> {
        match self {
            Stored::Ours(t) => Some(t),
            Stored::Foreign(_) => None,
        }
    }
}

impl<T: Serialize> Stored<T> {
    /// As JSON for `--json` outputs: the record's fields, or `{"value": ...}`.
    pub fn to_json(&self) -> Value {
        to_json(self)
    }
}

/// Shown as the record's fields, or `{"value": ...}` for a value cronlock did not write.
impl<T: Serialize> Serialize for Stored<T> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Stored::Ours(t) => t.serialize(s),
            Stored::Foreign(raw) => json!({ "value": raw }).serialize(s),
        }
    }
}

/// A record as JSON (its fields in name order, as every `--json` output prints them).
pub fn to_json(record: &impl Serialize) -> Value {
    serde_json::to_value(record).unwrap_or(Value::Null)
}

/// A record's text, as stored.
pub fn to_text(record: &impl Serialize) -> String {
    to_json(record).to_string()
}

/// A field for people: its value, or `?` when the record lacks it.
pub fn or_unknown(field: Option<impl std::fmt::Display>) -> String {
    field.map_or_else(|| "?".to_string(), |f| f.to_string())
}

#[cfg(test)]
mod tests;
