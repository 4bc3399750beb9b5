//! Operator commands that run no job: `--status KEY`, `--list`, `--force-release KEY`.
//! Results go to stdout, as text for people or `--json` for scripts. Each builds its whole output
//! first and [`print`] writes it once: a reader that went away (`| head -1`) ends us quietly with
//! status 0, like ripgrep; a full disk is an error.

use std::fmt::Write as _;
use std::io::Write as _;
use std::time::Duration;

/// `writeln!` into a `String`, which cannot fail.
macro_rules! w {
    ($out:expr, $($arg:tt)*) => {{
        let _ = writeln!($out, $($arg)*);
    }};
}

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

use anyhow::{anyhow, bail, Result};
use serde_json::{json, Value};

use crate::duration::Span;
use crate::fleet::schedule::Schedule;
use crate::host::{rfc3339, unix_millis};
use crate::log::Log;
use crate::store::lock::{self, Keys};
use crate::store::quorum::Masters;

/// A holder in a few words for a log line: `host web-1 pid 42 since 2026-11-21T02:00:00Z`.
pub fn describe_holder(value: &str) -> String {
    let h = holder_json(value);
    if h.get("value").is_some() {
        return "a value cronlock did not write".into();
    }
    let since = h["started"]
        .as_u64()
        .map(|s| format!(" since {} ({} ago)", rfc3339(s), ago(s)))
        .unwrap_or_default();
    format!(
        "host {} pid {}{since}",
        text_field(&h, "host"),
        text_field(&h, "pid")
    )
}

/// Who a holder is (host, pid, since), without its command line, for log events.
pub fn holder_identity(value: &str) -> Value {
    let h = holder_json(value);
    json!({ "host": h.get("host"), "pid": h.get("pid"), "started": h.get("started") })
}

/// A holder value as JSON; a value cronlock did not write is shown as `{"value": ...}`.
pub fn holder_json(value: &str) -> Value {
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

pub(crate) fn round_ms(ms: u64) -> String {
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

/// What `--status` says about the schedule: the given `--schedule`, else the one recorded.
struct Plan {
    schedule: Schedule,
    last: Option<i64>,
    next: Option<i64>,
}

fn plan(snap: &lock::Snapshot, given: Option<&Schedule>) -> Option<Plan> {
    let schedule = match given {
        Some(s) => s.clone(),
        None => Schedule::parse(snap.schedule.as_deref()?).ok()?,
    };
    let next = schedule.next_after(unix_millis() as i64);
    Some(Plan {
        schedule,
        last: snap.instant,
        next,
    })
}

/// `--status KEY`; with `history`, also the kept runs (`Some(None)`: all of them).
pub fn status(
    masters: &mut Masters,
    within: Duration,
    keys: &Keys,
    as_json: bool,
    history: Option<Option<u32>>,
    schedule: Option<&Schedule>,
) -> Result<String> {
    let mut out = String::new();
    let snaps = masters.snapshots(within, keys, history.map(|n| n.unwrap_or(u32::MAX)));
    let (snap, each) = merge(snaps, masters.majority())?;
    let per_master: Vec<(String, Value)> = if masters.len() > 1 {
        each.iter()
            .enumerate()
            .map(|(i, s)| (masters.shown(i).to_string(), master_view(s)))
            .collect()
    } else {
        Vec::new()
    };
    let plan = plan(&snap, schedule);
    let runs: Vec<Value> = snap
        .history
        .iter()
        .map(|r| serde_json::from_str::<Value>(r).unwrap_or_else(|_| json!({ "value": r })))
        .collect();
    let last = snap
        .last_run
        .as_deref()
        .map(|r| serde_json::from_str::<Value>(r).unwrap_or_else(|_| json!({ "value": r })));
    let holder = snap.holder.as_deref().map(holder_json);
    let holders: Vec<Value> = snap
        .slots
        .iter()
        .map(|h| {
            let mut v = holder_json(&h.value);
            v["slot"] = h.slot.into();
            v["fencing_token"] = h.fence.into();
            v["ttl_ms"] = ttl_ms(h.pttl);
            v
        })
        .collect();
    if let Some(limit) = snap
        .limit
        .filter(|_| !holders.is_empty() || holder.is_none())
    {
        return Ok(slots_status(
            keys,
            limit,
            &holders,
            as_json,
            &snap,
            history.is_some(),
        ));
    }
    if as_json {
        let mut out_json = json!({
            "key": keys.name,
            "held": holder.is_some(),
            "holder": holder,
            "ttl_ms": holder.as_ref().map(|_| ttl_ms(snap.pttl)),
            "fencing_token": holder.as_ref().and(snap.fence),
            "last_run": last,
            "schedule": plan.as_ref().map(|p| json!({
                "schedule": p.schedule.text,
                "last_instant": p.last,
                "last_instant_time": p.last.map(|ms| rfc3339(ms as u64)),
                "next_instant": p.next,
                "next_instant_time": p.next.map(|ms| rfc3339(ms as u64)),
            })),
        });
        if history.is_some() {
            out_json["history"] = Value::Array(runs);
        }
        if !per_master.is_empty() {
            out_json["masters"] = per_master
                .iter()
                .map(|(url, v)| {
                    let mut v = v.clone();
                    v["url"] = url.as_str().into();
                    v
                })
                .collect();
        }
        w!(out, "{out_json}");
        return Ok(out);
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
            w!(out, "lock '{}' is held{note}", keys.name);
            for line in holder_lines(h, snap.pttl, snap.fence) {
                w!(out, "{line}");
            }
        }
        None => w!(out, "lock '{}' is free", keys.name),
    }
    if !per_master.is_empty() {
        w!(
            out,
            "masters ({} of {} needed):",
            masters.majority(),
            masters.len()
        );
        for (url, v) in &per_master {
            let what = if let Some(e) = v["error"].as_str() {
                format!("no answer: {e}")
            } else if v["held"] == true {
                format!(
                    "held, ttl {}, fencing counter {}",
                    v["ttl_ms"]
                        .as_i64()
                        .map_or("none".into(), |t| round_ms(t as u64)),
                    text_field(v, "fencing_counter")
                )
            } else {
                format!("free, fencing counter {}", text_field(v, "fencing_counter"))
            };
            w!(out, "  {url}: {what}");
        }
    }
    last_run_lines(&mut out, last.as_ref());
    if let Some(p) = &plan {
        w!(out, "schedule:        {}", p.schedule.text);
        match p.last {
            Some(ms) => w!(
                out,
                "  last instant:  {} (a run started for it)",
                p.schedule.label(ms)
            ),
            None => w!(out, "  last instant:  none recorded"),
        }
        if let Some(ms) = p.next {
            let left = (ms as u64).saturating_sub(unix_millis());
            w!(
                out,
                "  next instant:  {} (in {})",
                p.schedule.label(ms),
                round_ms(left)
            );
        }
    }
    if history.is_some() {
        if runs.is_empty() {
            w!(out, "history: none recorded");
        } else {
            w!(out, "history ({} runs, newest first):", runs.len());
        }
        for (i, r) in runs.iter().enumerate() {
            w!(out, "  #{}", i + 1);
            for line in run_lines(r) {
                w!(out, "  {line}");
            }
        }
    }
    Ok(out)
}

/// The last run, for `--status`.
fn last_run_lines(out: &mut String, last: Option<&Value>) {
    match last {
        Some(r) => {
            w!(out, "last run:");
            for line in run_lines(r) {
                w!(out, "{line}");
            }
        }
        None => w!(out, "last run: none recorded"),
    }
}

/// `--status` of a KEY held with `--limit` above 1: every holder, with its slot.
fn slots_status(
    keys: &Keys,
    limit: u32,
    holders: &[Value],
    as_json: bool,
    snap: &lock::Snapshot,
    with_history: bool,
) -> String {
    let mut out = String::new();
    let last = snap
        .last_run
        .as_deref()
        .map(|r| serde_json::from_str::<Value>(r).unwrap_or_else(|_| json!({ "value": r })));
    if as_json {
        let mut doc = json!({
            "key": keys.name,
            "held": !holders.is_empty(),
            "limit": limit,
            "holders": holders,
            "last_run": last,
        });
        if with_history {
            doc["history"] = snap
                .history
                .iter()
                .map(|r| serde_json::from_str::<Value>(r).unwrap_or_else(|_| json!({ "value": r })))
                .collect();
        }
        w!(out, "{doc}");
        return out;
    }
    w!(
        out,
        "lock '{}' has {} of {limit} slots held (--limit {limit})",
        keys.name,
        holders.len()
    );
    for h in holders {
        w!(out, "slot {}:", h["slot"]);
        let pttl = h["ttl_ms"].as_i64().unwrap_or(-1);
        for line in holder_lines(h, pttl, h["fencing_token"].as_i64()) {
            w!(out, "{line}");
        }
    }
    last_run_lines(&mut out, last.as_ref());
    out
}

/// `--list`: every lock held under `prefix`, found with SCAN (never KEYS; on a cluster, on every
/// primary; with several masters, on each). A key under the prefix that cronlock cannot read
/// (another type) is skipped with a warning.
pub fn list(
    masters: &mut Masters,
    within: Duration,
    prefix: &str,
    as_json: bool,
    log: &Log,
) -> Result<String> {
    let mut out = String::new();
    let mut names: Vec<String> = masters
        .scan(&Keys::pattern(prefix), within)
        .map_err(|e| anyhow!("cannot list locks: {e}"))?
        .iter()
        .filter_map(|k| {
            // A KEY held with --limit above 1 shows through its limit record.
            Keys::name_of(prefix, k).or_else(|| Keys::name_of(prefix, k.strip_suffix(":limit")?))
        })
        .collect();
    names.sort();
    names.dedup();
    let several = masters.len() > 1;
    let mut rows = Vec::new();
    let mut semaphores: Vec<(String, u32, usize)> = Vec::new();
    for name in names {
        let keys = Keys::new(prefix, &name);
        let snaps = masters.snapshots(within, &keys, None);
        let (snap, each) = match merge(snaps, masters.majority()) {
            Ok(found) => found,
            Err(e) if e.to_string().contains("WRONGTYPE") => {
                log.warn(
                    "list_skipped",
                    &format!("skipped '{}': not a cronlock lock ({e:#})", keys.lock),
                );
                continue;
            }
            Err(e) => return Err(e),
        };
        let holding = each
            .iter()
            .filter(|s| matches!(s, Ok(s) if s.holder.is_some() && s.holder == snap.holder))
            .count();
        if let Some(limit) = snap.limit.filter(|_| !snap.slots.is_empty()) {
            semaphores.push((name, limit, snap.slots.len()));
            continue;
        }
        // Gone since the scan: skip.
        if let Some(value) = snap.holder {
            rows.push((name, holder_json(&value), snap.pttl, snap.fence, holding));
        }
    }
    if as_json {
        let mut rows_json: Vec<Value> = rows
            .iter()
            .map(|(name, h, pttl, fence, holding)| {
                let mut row = json!({ "key": name, "holder": h, "ttl_ms": ttl_ms(*pttl), "fencing_token": fence });
                if several {
                    row["held_on"] = (*holding).into();
                }
                row
            })
            .collect();
        rows_json.extend(
            semaphores
                .iter()
                .map(|(name, limit, n)| json!({ "key": name, "limit": limit, "held": n })),
        );
        w!(out, "{}", Value::Array(rows_json));
        return Ok(out);
    }
    for (name, h, pttl, fence, holding) in rows {
        let since = h["started"]
            .as_u64()
            .map(|s| format!("since {} ", rfc3339(s)))
            .unwrap_or_default();
        let ttl = if pttl >= 0 {
            round_ms(pttl as u64)
        } else {
            "no expiry".into()
        };
        let on = if several {
            format!(" on {holding} of {} masters", masters.len())
        } else {
            String::new()
        };
        let who = if h.get("value").is_some() {
            format!("value {}{on}", h["value"])
        } else {
            format!(
                "host {} pid {} {since}ttl {ttl} fencing token {}{on}: {}",
                text_field(&h, "host"),
                text_field(&h, "pid"),
                fence.map_or("?".into(), |f| f.to_string()),
                text_field(&h, "command")
            )
        };
        w!(out, "{name}\t{who}");
    }
    for (name, limit, n) in semaphores {
        w!(
            out,
            "{name}\t{n} of {limit} slots held (--limit {limit}; --status {name} shows them)"
        );
    }
    Ok(out)
}

/// One master's view of a lock, for `--status` with several masters.
fn master_view(snap: &Result<lock::Snapshot>) -> Value {
    match snap {
        Ok(s) => json!({
            "held": s.holder.is_some(),
            "ttl_ms": s.holder.as_ref().map(|_| ttl_ms(s.pttl)),
            "fencing_counter": s.fence,
        }),
        Err(e) => json!({ "error": format!("{e:#}") }),
    }
}

/// One lock as the masters see it: the merged view (held when a majority holds the same value;
/// the newest run record; the highest counter) and each master's own answer. With one master,
/// its answer.
pub fn merge(
    snaps: Vec<Result<lock::Snapshot>>,
    majority: usize,
) -> Result<(lock::Snapshot, Vec<Result<lock::Snapshot>>)> {
    if snaps.len() == 1 {
        let mut snaps = snaps;
        let only = snaps.remove(0)?;
        return Ok((only.clone(), vec![Ok(only)]));
    }
    let ok: Vec<&lock::Snapshot> = snaps.iter().filter_map(|s| s.as_ref().ok()).collect();
    if ok.len() < majority {
        let first = snaps
            .iter()
            .find_map(|s| s.as_ref().err())
            .map(|e| format!("{e:#}"))
            .unwrap_or_default();
        bail!(
            "only {} of {} masters answered, {majority} needed ({first})",
            ok.len(),
            snaps.len()
        );
    }
    let holder = ok
        .iter()
        .filter_map(|s| s.holder.as_ref())
        .find(|h| ok.iter().filter(|s| s.holder.as_ref() == Some(*h)).count() >= majority)
        .cloned();
    let started = |s: &&&lock::Snapshot| {
        s.last_run
            .as_deref()
            .and_then(|r| serde_json::from_str::<Value>(r).ok())
            .and_then(|v| v["started"].as_u64())
            .unwrap_or(0)
    };
    let newest = ok.iter().max_by_key(started).expect("a majority answered");
    let merged = lock::Snapshot {
        pttl: ok
            .iter()
            .filter(|s| holder.is_some() && s.holder == holder)
            .map(|s| s.pttl)
            .min()
            .unwrap_or(-2),
        holder,
        fence: ok.iter().filter_map(|s| s.fence).max(),
        last_run: newest.last_run.clone(),
        history: newest.history.clone(),
        instant: ok.iter().filter_map(|s| s.instant).max(),
        schedule: ok.iter().find_map(|s| s.schedule.clone()),
        // A --limit above 1 needs a single Redis: nothing to merge.
        limit: None,
        slots: Vec::new(),
    };
    Ok((merged, snaps))
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
    let holders: Vec<Value> = released.iter().map(|v| holder_json(v)).collect();
    if as_json {
        let doc = json!({
            "key": keys.name,
            "released": !holders.is_empty(),
            "holder": holders.first(),
            "holders": holders,
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
        if h.get("value").is_some() {
            w!(out, "released lock '{}' (value {})", keys.name, h["value"]);
        } else {
            w!(
                out,
                "released lock '{}' held by host {} pid {} since {}: {}",
                keys.name,
                text_field(&h, "host"),
                text_field(&h, "pid"),
                h["started"].as_u64().map_or("?".into(), rfc3339),
                text_field(&h, "command")
            );
        }
    }
    Ok(out)
}
