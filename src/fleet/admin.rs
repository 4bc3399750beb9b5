//! Operator commands that run no job: `--list` and `--force-release KEY` (`--status KEY` is in
//! [`crate::fleet::status`]), and what they share. Results go to stdout, as text for people or
//! `--json` for scripts. Each builds its whole output first and [`print`] writes it once: a reader
//! that went away (`| head -1`) ends us quietly with status 0, like ripgrep; a full disk is an error.

use std::fmt::Write as _;
use std::io::Write as _;
use std::time::Duration;

use anyhow::{anyhow, Result};
use serde_json::{json, Value};

use crate::clock::rfc3339;
use crate::fleet::describe::{describe_suspension, round_ms, suspension_json, ttl_ms};
use crate::log::Log;
use crate::record::holder::HolderValue;
use crate::record::suspension::Suspension;
use crate::record::{or_unknown, Stored};
use crate::store::inspect;
use crate::store::keys::Keys;
use crate::store::quorum::Masters;

/// Write `text` to stdout. A closed pipe is not an error (the reader has what it wanted).
pub fn print(text: &str) -> Result<()> {
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => {
            let text = crate::log::io_text(&e);
            Err(anyhow!("cannot write to stdout: {text}"))
        }
        Ok(()) => Ok(()),
    }
}

/// A lock `--list` shows.
struct Row {
    name: String,
    /// None when the KEY is only listed for being suspended.
    holder: Option<Stored<HolderValue>>,
    pttl: i64,
    fence: Option<i64>,
    /// How many masters hold it (with several).
    holding: usize,
    /// While `--suspend` is in force: its record.
    suspended: Option<Stored<Suspension>>,
}

/// One row of `--list --json`.
#[derive(serde::Serialize)]
struct ShownRow<'a> {
    key: &'a str,
    holder: Option<&'a Stored<HolderValue>>,
    ttl_ms: Value,
    fencing_token: Option<i64>,
    suspended: Option<Value>,
    /// With several masters: how many hold it.
    #[serde(skip_serializing_if = "Option::is_none")]
    held_on: Option<usize>,
}

/// A KEY held with `--limit` above 1.
struct Semaphore {
    name: String,
    /// N of `--limit N`.
    limit: u32,
    /// The slots in use.
    held: usize,
}

/// What `--list` found held under a prefix.
struct Listed {
    rows: Vec<Row>,
    semaphores: Vec<Semaphore>,
}

/// `--list`: every lock held, and every KEY suspended, under `prefix`, found with SCAN (never KEYS; on a cluster, on every
/// primary; with several masters, on each). A key under the prefix that cronlock cannot read
/// (another type) is skipped with a warning.
pub fn list(
    masters: &mut Masters,
    within: Duration,
    prefix: &str,
    as_json: bool,
    log: &Log,
) -> Result<String> {
    let Listed { rows, semaphores } = held_under(masters, within, prefix, log)?;
    let several = masters.len() > 1;
    if as_json {
        let mut rows_json: Vec<Value> = rows
            .iter()
            .map(|r| {
                let held = r.holder.is_some();
                crate::record::to_json(&ShownRow {
                    key: &r.name,
                    holder: r.holder.as_ref(),
                    ttl_ms: if held { ttl_ms(r.pttl) } else { Value::Null },
                    fencing_token: r.fence.filter(|_| held),
                    suspended: r.suspended.as_ref().map(suspension_json),
                    held_on: several.then_some(r.holding),
                })
            })
            .collect();
        rows_json.extend(
            semaphores
                .iter()
                .map(|s| json!({ "key": s.name, "limit": s.limit, "held": s.held })),
        );
        return Ok(format!("{}\n", Value::Array(rows_json)));
    }
    let mut out = String::new();
    for row in rows {
        let on = if several {
            format!(" on {} of {} masters", row.holding, masters.len())
        } else {
            String::new()
        };
        let suspended = row
            .suspended
            .as_ref()
            .map(|r| format!("suspended {}", describe_suspension(r)));
        let line = match (row.holder.is_none(), suspended) {
            (true, Some(s)) => s,
            (false, Some(s)) => format!("{}; {s}", list_line(&row, &on)),
            (_, None) => list_line(&row, &on),
        };
        w!(out, "{}\t{line}", row.name);
    }
    for Semaphore {
        name,
        limit,
        held: n,
    } in semaphores
    {
        w!(
            out,
            "{name}\t{n} of {limit} slots held (--limit {limit}; --status {name} shows them)"
        );
    }
    Ok(out)
}

/// The locks held under `prefix`, by name: plain ones, and semaphores.
fn held_under(masters: &mut Masters, within: Duration, prefix: &str, log: &Log) -> Result<Listed> {
    let mut names: Vec<String> = masters
        .scan(&Keys::pattern(prefix), within)
        .map_err(|e| anyhow!("cannot list locks: {e}"))?
        .iter()
        .filter_map(|k| {
            // A KEY held with --limit above 1 shows through its limit record, a suspended
            // one through its suspension.
            Keys::name_of(prefix, k)
                .or_else(|| Keys::name_of(prefix, k.strip_suffix(":limit")?))
                .or_else(|| Keys::name_of(prefix, k.strip_suffix(":suspend")?))
        })
        .collect();
    names.sort();
    names.dedup();
    let mut rows = Vec::new();
    let mut semaphores = Vec::new();
    for name in names {
        let keys = Keys::new(prefix, &name);
        let snaps = masters.snapshots(within, &keys, None);
        // A key under the prefix that is not a cronlock lock (the server says WRONGTYPE).
        let wrong_type = snaps.iter().find_map(|s| {
            let e = s.as_ref().err()?;
            (e.failure.code() == Some("WRONGTYPE")).then(|| e.to_string())
        });
        let inspect::Merged { view: snap, each } =
            match (inspect::merge(snaps, masters.majority()), wrong_type) {
                (Ok(found), _) => found,
                (Err(_), Some(e)) => {
                    log.warn(
                        "list_skipped",
                        &format!("skipped '{}': not a cronlock lock ({e})", keys.lock),
                    );
                    continue;
                }
                (Err(e), None) => return Err(e),
            };
        let holding = each
            .iter()
            .filter(|s| matches!(s, Ok(s) if s.holder.is_some() && s.holder == snap.holder))
            .count();
        if let Some(limit) = snap.limit.filter(|_| !snap.slots.is_empty()) {
            semaphores.push(Semaphore {
                name,
                limit,
                held: snap.slots.len(),
            });
            continue;
        }
        // Gone since the scan (neither held nor suspended): skip.
        if snap.holder.is_some() || snap.suspended.is_some() {
            rows.push(Row {
                name,
                holder: snap.holder.as_deref().map(Stored::read),
                pttl: snap.pttl,
                fence: snap.fence,
                holding,
                suspended: snap.suspended,
            });
        }
    }
    Ok(Listed { rows, semaphores })
}

/// One held lock for people: who, since when, how long left, and its command.
fn list_line(row: &Row, on: &str) -> String {
    let h = match &row.holder {
        Some(Stored::Ours(h)) => h,
        Some(Stored::Foreign(raw)) => return format!("value {}{on}", Value::from(raw.as_str())),
        None => return format!("value null{on}"),
    };
    let since = h
        .started
        .map(|s| format!("since {} ", rfc3339(s)))
        .unwrap_or_default();
    let ttl = if row.pttl >= 0 {
        round_ms(row.pttl as u64)
    } else {
        "no expiry".into()
    };
    format!(
        "host {} pid {} {since}ttl {ttl} fencing token {}{on}: {}",
        or_unknown(h.host.as_deref()),
        or_unknown(h.pid),
        or_unknown(row.fence),
        or_unknown(h.command.as_deref())
    )
}

/// `--force-release KEY [--token T]`: every holder (with `--limit` above 1), or the one whose
/// token is T.
pub fn force_release(
    masters: &mut Masters,
    within: Duration,
    keys: &Keys,
    token: Option<&str>,
    as_json: bool,
) -> Result<String> {
    let mut out = String::new();
    let mut answers = masters.force_release(within, keys, token);
    let released: Vec<String> = if answers.len() == 1 {
        answers.remove(0)?
    } else {
        if answers.iter().all(|a| a.is_err()) {
            return answers.remove(0).map(|_| String::new());
        }
        let mut all: Vec<String> = Vec::new();
        for v in answers.into_iter().flatten().flatten() {
            if !all.contains(&v) {
                all.push(v);
            }
        }
        all
    };
    let holders: Vec<Stored<HolderValue>> = released.iter().map(|v| Stored::read(v)).collect();
    if as_json {
        let shown: Vec<Value> = holders.iter().map(Stored::to_json).collect();
        let doc = json!({
            "key": keys.name,
            "released": !holders.is_empty(),
            "holder": shown.first(),
            "holders": shown,
        });
        w!(out, "{doc}");
        return Ok(out);
    }
    if holders.is_empty() {
        match token {
            Some(t) => w!(out, "no holder of lock '{}' has token {t}", keys.name),
            None => w!(out, "lock '{}' was not held", keys.name),
        }
    }
    for h in holders {
        match h {
            Stored::Foreign(raw) => w!(
                out,
                "released lock '{}' (value {})",
                keys.name,
                Value::from(raw.as_str())
            ),
            Stored::Ours(h) => w!(
                out,
                "released lock '{}' held by host {} pid {} since {}: {}",
                keys.name,
                or_unknown(h.host.as_deref()),
                or_unknown(h.pid),
                h.started.map_or("?".into(), rfc3339),
                or_unknown(h.command.as_deref())
            ),
        }
    }
    Ok(out)
}
