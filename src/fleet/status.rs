//! `--status KEY`: who holds a lock (every holder, with `--limit`), each master's view, whether it
//! is suspended, the schedule and its ledger of instants, the last run and the kept history, as
//! text for people or `--json` for scripts.

use std::fmt::Write as _;
use std::time::Duration;

use anyhow::Result;
use serde_json::{json, Value};

use crate::clock::{rfc3339, unix_millis};
use crate::fleet::describe::{
    ago, describe_suspension, holder_json, round_ms, suspension_json, text_field, ttl_ms,
};
use crate::fleet::ledger;
use crate::fleet::schedule::Schedule;
use crate::store::inspect;
use crate::store::inspect::merge;
use crate::store::keys::Keys;
use crate::store::quorum::Masters;

/// Everything `--status` shows, gathered from the masters.
struct View {
    snap: inspect::Snapshot,
    /// Each master's own view (with several masters): its URL as shown, and what it holds.
    per_master: Vec<(String, Value)>,
    /// "N of M needed", with several masters.
    majority: usize,
    masters: usize,
    plan: Option<Plan>,
    runs: Vec<Value>,
    last: Option<Value>,
    holder: Option<Value>,
    holders: Vec<Value>,
    with_history: bool,
}

/// A stored record as JSON; one cronlock did not write is shown as `{"value": ...}`.
fn record_json(r: &str) -> Value {
    serde_json::from_str::<Value>(r).unwrap_or_else(|_| json!({ "value": r }))
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
    let view = View {
        plan: plan(&snap, schedule),
        runs: snap.history.iter().map(|r| record_json(r)).collect(),
        last: snap.last_run.as_deref().map(record_json),
        holder: snap.holder.as_deref().map(holder_json),
        holders,
        per_master,
        majority: masters.majority(),
        masters: masters.len(),
        with_history: history.is_some(),
        snap,
    };
    if let Some(limit) = view
        .snap
        .limit
        .filter(|_| !view.holders.is_empty() || view.holder.is_none())
    {
        return Ok(slots_status(keys, limit, &view, as_json));
    }
    Ok(if as_json {
        json_status(keys, &view)
    } else {
        text_status(keys, &view)
    })
}

/// `--status --json` of a plain lock.
fn json_status(keys: &Keys, view: &View) -> String {
    let (snap, holder) = (&view.snap, &view.holder);
    let mut doc = json!({
        "key": keys.name,
        "held": holder.is_some(),
        "holder": holder,
        "ttl_ms": holder.as_ref().map(|_| ttl_ms(snap.pttl)),
        "fencing_token": holder.as_ref().and(snap.fence),
        "suspended": snap.suspended.as_deref().map(suspension_json),
        "last_run": view.last,
        "schedule": view.plan.as_ref().map(|p| json!({
            "schedule": p.schedule.text,
            "last_instant": p.last,
            "last_instant_time": p.last.map(|ms| rfc3339(ms as u64)),
            "next_instant": p.next,
            "next_instant_time": p.next.map(|ms| rfc3339(ms as u64)),
        })),
        "ledger": ledger::json(&snap.ledger),
    });
    if view.with_history {
        doc["history"] = Value::Array(view.runs.clone());
    }
    if !view.per_master.is_empty() {
        doc["masters"] = view
            .per_master
            .iter()
            .map(|(url, v)| {
                let mut v = v.clone();
                v["url"] = url.as_str().into();
                v
            })
            .collect();
    }
    format!("{doc}\n")
}

/// `--status` of a plain lock, for people.
fn text_status(keys: &Keys, view: &View) -> String {
    let mut out = String::new();
    match &view.holder {
        Some(h) => {
            let finished_run = view
                .last
                .as_ref()
                .is_some_and(|l| l.get("token").is_some() && l.get("token") == h.get("token"));
            let note = if finished_run {
                " (its run has finished; kept for --min-hold)"
            } else {
                ""
            };
            w!(out, "lock '{}' is held{note}", keys.name);
            for line in holder_lines(h, view.snap.pttl, view.snap.fence) {
                w!(out, "{line}");
            }
        }
        None => w!(out, "lock '{}' is free", keys.name),
    }
    suspended_line(&mut out, keys, &view.snap);
    masters_lines(&mut out, view);
    last_run_lines(&mut out, view.last.as_ref());
    if let Some(p) = &view.plan {
        schedule_lines(&mut out, p, &view.snap.ledger);
    }
    if view.with_history {
        history_lines(&mut out, &view.runs);
        if view.plan.is_some() || !view.snap.ledger.is_empty() {
            let label = |ms: i64| match &view.plan {
                Some(p) => p.schedule.label(ms),
                None => rfc3339(ms.max(0) as u64),
            };
            for line in ledger::lines(&view.snap.ledger, label) {
                w!(out, "{line}");
            }
        }
    }
    out
}

/// While `--suspend` is in force: by whom, since when, why.
fn suspended_line(out: &mut String, keys: &Keys, snap: &inspect::Snapshot) {
    if let Some(r) = &snap.suspended {
        w!(
            out,
            "suspended:       {} (cronlock --resume {} ends it)",
            describe_suspension(r),
            keys.name
        );
    }
}

/// Each master's view, with several masters.
fn masters_lines(out: &mut String, view: &View) {
    if view.per_master.is_empty() {
        return;
    }
    w!(
        out,
        "masters ({} of {} needed):",
        view.majority,
        view.masters
    );
    for (url, v) in &view.per_master {
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

/// The schedule: the last instant a run started for (and its state in the ledger), and the next.
fn schedule_lines(out: &mut String, p: &Plan, ledger: &[(i64, String)]) {
    w!(out, "schedule:        {}", p.schedule.text);
    match p.last {
        Some(ms) => {
            let state = ledger
                .iter()
                .find(|(at, _)| *at == ms)
                .map_or("a run started for it".into(), |(at, raw)| {
                    ledger::state_words(&ledger::entry_json(*at, raw))
                });
            w!(out, "  last instant:  {} ({state})", p.schedule.label(ms));
        }
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

/// `--history`: the kept runs, newest first.
fn history_lines(out: &mut String, runs: &[Value]) {
    if runs.is_empty() {
        w!(out, "history: none recorded");
    } else {
        let n = match runs.len() {
            1 => "1 run".to_string(),
            n => format!("{n} runs"),
        };
        w!(out, "history ({n}, newest first):");
    }
    for (i, r) in runs.iter().enumerate() {
        w!(out, "  #{}", i + 1);
        for line in run_lines(r) {
            w!(out, "  {line}");
        }
    }
}

/// `--status` of a KEY held with `--limit` above 1: every holder, with its slot.
fn slots_status(keys: &Keys, limit: u32, view: &View, as_json: bool) -> String {
    let mut out = String::new();
    let holders = &view.holders;
    if as_json {
        let mut doc = json!({
            "key": keys.name,
            "held": !holders.is_empty(),
            "limit": limit,
            "holders": holders,
            "suspended": view.snap.suspended.as_deref().map(suspension_json),
            "last_run": view.last,
        });
        if view.with_history {
            doc["history"] = Value::Array(view.runs.clone());
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
    suspended_line(&mut out, keys, &view.snap);
    for h in holders {
        w!(out, "slot {}:", h["slot"]);
        let pttl = h["ttl_ms"].as_i64().unwrap_or(-1);
        for line in holder_lines(h, pttl, h["fencing_token"].as_i64()) {
            w!(out, "{line}");
        }
    }
    last_run_lines(&mut out, view.last.as_ref());
    out
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

/// What `--status` says about the schedule: the given `--schedule`, else the one recorded.
struct Plan {
    schedule: Schedule,
    last: Option<i64>,
    next: Option<i64>,
}

fn plan(snap: &inspect::Snapshot, given: Option<&Schedule>) -> Option<Plan> {
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

/// One master's view of a lock, for `--status` with several masters.
fn master_view(snap: &Result<inspect::Snapshot, inspect::Unread>) -> Value {
    match snap {
        Ok(s) => json!({
            "held": s.holder.is_some(),
            "ttl_ms": s.holder.as_ref().map(|_| ttl_ms(s.pttl)),
            "fencing_counter": s.fence,
        }),
        Err(e) => json!({ "error": format!("{e:#}") }),
    }
}
