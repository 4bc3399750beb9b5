//! Operator commands that run no job: `--status KEY`, `--list`, `--force-release KEY`.
//! Results go to stdout, as text for people or `--json` for scripts.

use std::time::Duration;

use anyhow::{anyhow, Result};
use redis::Connection;
use serde_json::{json, Value};

use crate::connect::first_line;
use crate::duration::Span;
use crate::host::{rfc3339, unix_millis};
use crate::lock::{self, Keys};

/// A holder value as JSON; a value cronlock did not write is shown as `{"value": ...}`.
fn holder_json(value: &str) -> Value {
    match serde_json::from_str::<Value>(value) {
        Ok(v @ Value::Object(_)) => v,
        _ => json!({ "value": value }),
    }
}

fn ttl_ms(pttl: i64) -> Value {
    if pttl >= 0 {
        pttl.into()
    } else {
        Value::Null
    }
}

fn round_ms(ms: u64) -> String {
    // Whole seconds read better above a minute.
    let d = if ms >= 60_000 {
        Duration::from_secs(ms / 1000)
    } else {
        Duration::from_millis(ms)
    };
    Span(d).to_string()
}

fn ago(ms: u64) -> String {
    round_ms(unix_millis().saturating_sub(ms))
}

fn text_field(v: &Value, key: &str) -> String {
    match &v[key] {
        Value::String(s) => s.clone(),
        Value::Null => "?".into(),
        other => other.to_string(),
    }
}

/// Lines describing a holder for people.
fn holder_lines(h: &Value, pttl: i64, fence: Option<i64>) -> Vec<String> {
    let mut lines = Vec::new();
    if let Some(raw) = h.get("value") {
        lines.push(format!("  value:         {raw}"));
    } else {
        lines.push(format!("  host:          {}", text_field(h, "host")));
        lines.push(format!("  pid:           {}", text_field(h, "pid")));
        lines.push(format!("  command:       {}", text_field(h, "command")));
        if let Some(started) = h["started"].as_u64() {
            lines.push(format!(
                "  since:         {} ({} ago)",
                rfc3339(started),
                ago(started)
            ));
        }
    }
    lines.push(format!(
        "  ttl left:      {}",
        if pttl >= 0 {
            round_ms(pttl as u64)
        } else {
            "no expiry".into()
        }
    ));
    if let Some(f) = fence {
        lines.push(format!("  fencing token: {f}"));
    }
    lines
}

fn run_lines(r: &Value) -> Vec<String> {
    let mut how = match r["ended"].as_str() {
        Some("exited") => format!("exited with status {}", text_field(r, "exit_status")),
        Some("signalled") => format!("killed by signal {}", text_field(r, "signal")),
        Some("lost") => "stopped: the lock was lost (exit 122)".into(),
        Some("max-runtime") => "stopped: ran past --max-runtime (exit 124)".into(),
        Some("not-started") => {
            format!("not started (exit {})", text_field(r, "exit_status"))
        }
        _ => text_field(r, "ended"),
    };
    if let Some(ms) = r["duration_ms"].as_u64() {
        how += &format!(" after {}", round_ms(ms));
    }
    let mut lines = vec![
        format!("  host:          {}", text_field(r, "host")),
        format!("  pid:           {}", text_field(r, "pid")),
        format!("  command:       {}", text_field(r, "command")),
    ];
    if let Some(started) = r["started"].as_u64() {
        lines.push(format!(
            "  started:       {} ({} ago)",
            rfc3339(started),
            ago(started)
        ));
    }
    lines.push(format!("  result:        {how}"));
    lines.push(format!(
        "  fencing token: {}",
        text_field(r, "fencing_token")
    ));
    lines
}

/// `--status KEY`.
pub fn status(con: &mut Connection, keys: &Keys, as_json: bool) -> Result<()> {
    let snap = lock::snapshot(con, keys)?;
    let last = snap
        .last_run
        .as_deref()
        .map(|r| serde_json::from_str::<Value>(r).unwrap_or_else(|_| json!({ "value": r })));
    let holder = snap.holder.as_deref().map(holder_json);
    if as_json {
        let out = json!({
            "key": keys.name,
            "held": holder.is_some(),
            "holder": holder,
            "ttl_ms": holder.as_ref().map(|_| ttl_ms(snap.pttl)),
            "fencing_token": holder.as_ref().and(snap.fence),
            "last_run": last,
        });
        println!("{out}");
        return Ok(());
    }
    match &holder {
        Some(h) => {
            let finished_run = last
                .as_ref()
                .is_some_and(|l| l.get("token").is_some() && l.get("token") == h.get("token"));
            let note = if finished_run {
                " (its run has finished; kept for --min-hold)"
            } else {
                ""
            };
            println!("lock '{}' is held{note}", keys.name);
            for line in holder_lines(h, snap.pttl, snap.fence) {
                println!("{line}");
            }
        }
        None => println!("lock '{}' is free", keys.name),
    }
    match &last {
        Some(r) => {
            println!("last run:");
            for line in run_lines(r) {
                println!("{line}");
            }
        }
        None => println!("last run: none recorded"),
    }
    Ok(())
}

/// Escape glob characters so a prefix matches itself in SCAN MATCH.
fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// `--list`: every lock held under `prefix`, found with SCAN (never KEYS).
pub fn list(con: &mut Connection, prefix: &str, as_json: bool) -> Result<()> {
    let pattern = format!("{}{{*}}", glob_escape(prefix));
    let mut names: Vec<String> = Vec::new();
    let mut cursor: u64 = 0;
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(1000)
            .query(con)
            .map_err(|e| anyhow!("cannot list locks: {}", first_line(&e)))?;
        names.extend(
            batch
                .iter()
                .filter_map(|k| Keys::name_of(prefix, k))
                .map(str::to_string),
        );
        cursor = next;
        if cursor == 0 {
            break;
        }
    }
    names.sort();
    names.dedup();
    let mut rows = Vec::new();
    for name in names {
        let keys = Keys::new(prefix, &name);
        let snap = lock::snapshot(con, &keys)?;
        // Gone since the scan, or a key of another type: skip.
        if let Some(value) = snap.holder {
            rows.push((name, holder_json(&value), snap.pttl, snap.fence));
        }
    }
    if as_json {
        let out: Vec<Value> = rows
            .iter()
            .map(|(name, h, pttl, fence)| {
                json!({ "key": name, "holder": h, "ttl_ms": ttl_ms(*pttl), "fencing_token": fence })
            })
            .collect();
        println!("{}", Value::Array(out));
        return Ok(());
    }
    for (name, h, pttl, fence) in rows {
        let since = h["started"]
            .as_u64()
            .map(|s| format!("since {} ", rfc3339(s)))
            .unwrap_or_default();
        let ttl = if pttl >= 0 {
            round_ms(pttl as u64)
        } else {
            "no expiry".into()
        };
        let who = if h.get("value").is_some() {
            format!("value {}", h["value"])
        } else {
            format!(
                "host {} pid {} {since}ttl {ttl} fencing token {}: {}",
                text_field(&h, "host"),
                text_field(&h, "pid"),
                fence.map_or("?".into(), |f| f.to_string()),
                text_field(&h, "command")
            )
        };
        println!("{name}\t{who}");
    }
    Ok(())
}

/// `--force-release KEY`.
pub fn force_release(con: &mut Connection, keys: &Keys, as_json: bool) -> Result<()> {
    let holder = lock::force_release(con, keys)?.map(|v| holder_json(&v));
    if as_json {
        let out = json!({ "key": keys.name, "released": holder.is_some(), "holder": holder });
        println!("{out}");
        return Ok(());
    }
    match holder {
        None => println!("lock '{}' was not held", keys.name),
        Some(h) if h.get("value").is_some() => {
            println!("released lock '{}' (value {})", keys.name, h["value"])
        }
        Some(h) => println!(
            "released lock '{}' held by host {} pid {} since {}: {}",
            keys.name,
            text_field(&h, "host"),
            text_field(&h, "pid"),
            h["started"].as_u64().map_or("?".into(), rfc3339),
            text_field(&h, "command")
        ),
    }
    Ok(())
}
