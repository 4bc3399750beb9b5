//! `--status KEY`: who holds a lock (every holder, with `--limit`), each master's view, whether it
//! is suspended, the schedule and its ledger of instants, the last run and the kept history, as
//! text for people or `--json` for scripts.

use std::fmt::Write as _;
use std::time::Duration;

use anyhow::Result;
use serde::Serialize;
use serde_json::{json, Value};

use crate::clock::{rfc3339, unix_millis};
use crate::fleet::describe::{ago, describe_suspension, round_ms, suspension_json, ttl_ms};
use crate::fleet::ledger;
use crate::fleet::replicas::{self, ShownReplica};
use crate::fleet::schedule::Schedule;
use crate::record::holder::HolderValue;
use crate::record::ledger::LedgerInstant;
use crate::record::run::{Ending, RecordedEnding, RunRecord};
use crate::record::{or_unknown, Stored};
use crate::store::inspect;
use crate::store::inspect::{merge, Merged};
use crate::store::keys::Keys;
use crate::store::quorum::Masters;

/// Everything `--status` shows, gathered from the masters.
struct StatusView {
    snap: inspect::Snapshot,
    /// Each master's own view (with several masters): its URL as shown, and what it holds.
    per_master: Vec<(String, MasterView)>,
    /// "N of M needed", with several masters.
    majority: usize,
    masters: usize,
    plan: Option<SchedulePlan>,
    holder: Option<Stored<HolderValue>>,
    holders: Vec<SlotView>,
    with_history: bool,
    /// The replicas heartbeating under the prefix (any fleet), with their clocks' offsets.
    replicas: Vec<ShownReplica>,
}

/// One holder of a `--limit` above 1, as `--status` shows it.
struct SlotView {
    slot: u32,
    holder: Stored<HolderValue>,
    pttl: i64,
    fence: i64,
}

/// A slot's holder as `--status --json` shows it: the holder value's fields and the slot's.
#[derive(Serialize)]
struct ShownSlot<'a> {
    #[serde(flatten)]
    holder: &'a Stored<HolderValue>,
    slot: u32,
    fencing_token: i64,
    ttl_ms: Option<i64>,
}

impl SlotView {
    fn shown(&self) -> ShownSlot<'_> {
        ShownSlot {
            holder: &self.holder,
            slot: self.slot,
            fencing_token: self.fence,
            ttl_ms: (self.pttl >= 0).then_some(self.pttl),
        }
    }
}

/// A master's view with its URL, for `--status --json` with several masters.
#[derive(Serialize)]
struct ShownMaster<'a> {
    #[serde(flatten)]
    view: Value,
    url: &'a str,
}

/// `--status --json` of a plain lock.
#[derive(Serialize)]
struct ShownStatus<'a> {
    key: &'a str,
    held: bool,
    holder: Option<&'a Stored<HolderValue>>,
    ttl_ms: Option<Value>,
    fencing_token: Option<i64>,
    suspended: Option<Value>,
    last_run: Option<&'a Stored<RunRecord>>,
    schedule: Option<ShownSchedule<'a>>,
    ledger: Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    history: Option<&'a [Stored<RunRecord>]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    masters: Option<Vec<ShownMaster<'a>>>,
    /// The replicas (`--crontab`) heartbeating under the prefix, any fleet.
    replicas: &'a [ShownReplica],
}

/// The schedule in `--status --json` (its keys in name order, as before they were typed).
#[derive(Serialize)]
struct ShownSchedule<'a> {
    last_instant: Option<i64>,
    last_instant_time: Option<String>,
    next_instant: Option<i64>,
    next_instant_time: Option<String>,
    /// The next three instants (the first is `next_instant`).
    next_instants: Vec<i64>,
    /// With `--jitter`: KEY's offset after each instant (ms).
    #[serde(skip_serializing_if = "Option::is_none")]
    offset_ms: Option<u64>,
    /// With an `H` field: the expression as drawn for KEY.
    #[serde(skip_serializing_if = "Option::is_none")]
    resolved: Option<&'a str>,
    schedule: &'a str,
}

/// `--status --json` of a KEY held with `--limit` above 1.
#[derive(Serialize)]
struct ShownSlots<'a> {
    key: &'a str,
    held: bool,
    limit: u32,
    holders: Vec<ShownSlot<'a>>,
    suspended: Option<Value>,
    last_run: Option<&'a Stored<RunRecord>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    history: Option<&'a [Stored<RunRecord>]>,
}

/// One master's view of a lock, with several masters.
enum MasterView {
    Read {
        held: bool,
        pttl: Option<i64>,
        fencing_counter: Option<i64>,
    },
    Unread(String),
}

impl MasterView {
    fn of(snap: &Result<inspect::Snapshot, inspect::Unread>) -> MasterView {
        match snap {
            Ok(s) => MasterView::Read {
                held: s.holder.is_some(),
                pttl: s.holder.as_ref().map(|_| s.pttl),
                fencing_counter: s.fence,
            },
            Err(e) => MasterView::Unread(format!("{e:#}")),
        }
    }

    fn to_json(&self) -> Value {
        match self {
            MasterView::Read {
                held,
                pttl,
                fencing_counter,
            } => json!({
                "held": held,
                "ttl_ms": pttl.map(ttl_ms),
                "fencing_counter": fencing_counter,
            }),
            MasterView::Unread(e) => json!({ "error": e }),
        }
    }
}

/// `--status KEY` (under `prefix`: the replicas heartbeating there are listed too); with
/// `history`, also the kept runs (`Some(None)`: all of them).
pub fn status(
    masters: &mut Masters,
    within: Duration,
    keys: &Keys,
    prefix: &str,
    as_json: bool,
    history: Option<Option<u32>>,
    planned: Planned,
) -> Result<String> {
    let snaps = masters.snapshots(within, keys, history.map(|n| n.unwrap_or(u32::MAX)));
    let Merged { view: snap, each } = merge(snaps, masters.majority())?;
    let per_master: Vec<(String, MasterView)> = if masters.len() > 1 {
        each.iter()
            .enumerate()
            .map(|(i, s)| (masters.shown(i).to_string(), MasterView::of(s)))
            .collect()
    } else {
        Vec::new()
    };
    let holders: Vec<SlotView> = snap
        .slots
        .iter()
        .map(|h| SlotView {
            slot: h.slot,
            holder: Stored::read(&h.value),
            pttl: h.pttl,
            fence: h.fence,
        })
        .collect();
    let view = StatusView {
        plan: plan(&snap, &keys.name, planned),
        holder: snap.holder.as_deref().map(Stored::read),
        holders,
        per_master,
        majority: masters.majority(),
        masters: masters.len(),
        with_history: history.is_some(),
        replicas: replicas::seen(masters, within, prefix),
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
fn json_status(keys: &Keys, view: &StatusView) -> String {
    let (snap, holder) = (&view.snap, &view.holder);
    let doc = ShownStatus {
        key: &keys.name,
        held: holder.is_some(),
        holder: holder.as_ref(),
        ttl_ms: holder.as_ref().map(|_| ttl_ms(snap.pttl)),
        fencing_token: holder.as_ref().and(snap.fence),
        suspended: snap.suspended.as_ref().map(suspension_json),
        last_run: snap.last_run.as_ref(),
        schedule: view.plan.as_ref().map(|p| ShownSchedule {
            last_instant: p.last,
            last_instant_time: p.last.map(|ms| rfc3339(ms as u64)),
            next_instant: p.next.first().copied(),
            next_instant_time: p.next.first().map(|&ms| rfc3339(ms as u64)),
            next_instants: p.next.clone(),
            offset_ms: (!p.offset.is_zero()).then_some(p.offset.as_millis() as u64),
            resolved: p.schedule.resolved.as_deref(),
            schedule: &p.schedule.text,
        }),
        ledger: ledger::json(&snap.ledger),
        history: view.with_history.then_some(snap.history.as_slice()),
        masters: (!view.per_master.is_empty()).then(|| {
            view.per_master
                .iter()
                .map(|(url, m)| ShownMaster {
                    view: m.to_json(),
                    url,
                })
                .collect()
        }),
        replicas: &view.replicas,
    };
    format!("{}\n", crate::record::to_json(&doc))
}

/// `--status` of a plain lock, for people.
fn text_status(keys: &Keys, view: &StatusView) -> String {
    let mut out = String::new();
    match &view.holder {
        Some(h) => {
            let last = view.snap.last_run.as_ref().and_then(Stored::ours);
            let last_token = last.and_then(|l| l.token.as_ref());
            let finished_run =
                last_token.is_some() && last_token == h.ours().and_then(|h| h.token.as_ref());
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
    last_run_lines(&mut out, view.snap.last_run.as_ref());
    if let Some(p) = &view.plan {
        schedule_lines(&mut out, p, &view.snap.ledger);
    }
    replica_lines(&mut out, &view.replicas);
    if view.with_history {
        history_lines(&mut out, &view.snap.history);
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

/// The replicas heartbeating under the prefix, each with its clock against Redis's.
fn replica_lines(out: &mut String, seen: &[ShownReplica]) {
    if seen.is_empty() {
        return;
    }
    w!(
        out,
        "replicas:        {} heartbeating (any fleet)",
        seen.len()
    );
    for r in seen {
        w!(out, "{}", replicas::line(r));
    }
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
fn masters_lines(out: &mut String, view: &StatusView) {
    if view.per_master.is_empty() {
        return;
    }
    w!(
        out,
        "masters ({} of {} needed):",
        view.majority,
        view.masters
    );
    for (url, m) in &view.per_master {
        let what = match m {
            MasterView::Unread(e) => format!("no answer: {e}"),
            MasterView::Read {
                held: true,
                pttl,
                fencing_counter,
            } => format!(
                "held, ttl {}, fencing counter {}",
                pttl.filter(|t| *t >= 0)
                    .map_or("none".into(), |t| round_ms(t as u64)),
                or_unknown(*fencing_counter)
            ),
            MasterView::Read {
                fencing_counter, ..
            } => format!("free, fencing counter {}", or_unknown(*fencing_counter)),
        };
        w!(out, "  {url}: {what}");
    }
}

/// The schedule: the last instant a run started for (and its state in the ledger), and the next.
fn schedule_lines(out: &mut String, p: &SchedulePlan, ledger: &[LedgerInstant]) {
    match &p.schedule.resolved {
        Some(r) => w!(
            out,
            "schedule:        {} (for this KEY: {r})",
            p.schedule.text
        ),
        None => w!(out, "schedule:        {}", p.schedule.text),
    }
    match p.last {
        Some(ms) => {
            let state = ledger
                .iter()
                .find(|l| l.instant == ms)
                .map_or("a run started for it".into(), |l| {
                    ledger::state_words(&l.entry)
                });
            w!(out, "  last instant:  {} ({state})", p.schedule.label(ms));
        }
        None => w!(out, "  last instant:  none recorded"),
    }
    let manual = ledger
        .iter()
        .find(|l| l.entry.ours().is_some_and(|e| e.manual));
    if let Some(LedgerInstant { instant, entry }) = manual {
        let state = ledger::state_words(entry);
        w!(
            out,
            "  last manual:   {} ({state})",
            p.schedule.label(*instant)
        );
    }
    if let Some(&ms) = p.next.first() {
        let left = (ms as u64).saturating_sub(unix_millis());
        w!(
            out,
            "  next instant:  {} (in {})",
            p.schedule.label(ms),
            round_ms(left)
        );
        if !p.offset.is_zero() {
            w!(
                out,
                "  its run:       at {} (--jitter: {} after each instant for this KEY)",
                p.schedule.label(ms + p.offset.as_millis() as i64),
                round_ms(p.offset.as_millis() as u64)
            );
        }
        if p.next.len() > 1 {
            let then: Vec<String> = p.next[1..].iter().map(|&ms| p.schedule.label(ms)).collect();
            w!(out, "  then:          {}", then.join(", "));
        }
    }
}

/// `--history`: the kept runs, newest first.
fn history_lines(out: &mut String, runs: &[Stored<RunRecord>]) {
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
fn slots_status(keys: &Keys, limit: u32, view: &StatusView, as_json: bool) -> String {
    let mut out = String::new();
    let holders = &view.holders;
    if as_json {
        let doc = ShownSlots {
            key: &keys.name,
            held: !holders.is_empty(),
            limit,
            holders: holders.iter().map(SlotView::shown).collect(),
            suspended: view.snap.suspended.as_ref().map(suspension_json),
            last_run: view.snap.last_run.as_ref(),
            history: view.with_history.then_some(view.snap.history.as_slice()),
        };
        w!(out, "{}", crate::record::to_json(&doc));
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
        w!(out, "slot {}:", h.slot);
        let pttl = if h.pttl >= 0 { h.pttl } else { -1 };
        for line in holder_lines(&h.holder, pttl, Some(h.fence)) {
            w!(out, "{line}");
        }
    }
    last_run_lines(&mut out, view.snap.last_run.as_ref());
    out
}

/// The last run, for `--status`.
fn last_run_lines(out: &mut String, last: Option<&Stored<RunRecord>>) {
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

/// What `--status` was given of the schedule: `--schedule` (else the one recorded is shown) and
/// KEY's `--jitter` offset.
#[derive(Clone, Copy)]
pub struct Planned<'a> {
    pub schedule: Option<&'a Schedule>,
    pub offset: Duration,
}

/// What `--status` says about the schedule: the given `--schedule`, else the one recorded.
struct SchedulePlan {
    schedule: Schedule,
    last: Option<i64>,
    /// The next [`NEXT_SHOWN`] instants.
    next: Vec<i64>,
    /// `--jitter`: KEY's offset after each instant.
    offset: Duration,
}

/// How many instants to come `--status` shows.
const NEXT_SHOWN: usize = 3;

fn plan(snap: &inspect::Snapshot, key: &str, planned: Planned) -> Option<SchedulePlan> {
    let schedule = match planned.schedule {
        Some(s) => s.clone(),
        None => Schedule::parse(snap.schedule.as_deref()?)
            .and_then(|s| s.for_key(key))
            .ok()?,
    };
    let next = crate::fleet::next::instants(&schedule, None, NEXT_SHOWN)
        .into_iter()
        .map(|s| s.instant)
        .collect();
    Some(SchedulePlan {
        schedule,
        last: snap.instant,
        next,
        offset: planned.offset,
    })
}

/// Lines describing a holder for people.
fn holder_lines(h: &Stored<HolderValue>, pttl: i64, fence: Option<i64>) -> Vec<String> {
    let mut lines = Vec::new();
    match h {
        Stored::Foreign(raw) => {
            lines.push(format!("  value:         {}", Value::from(raw.as_str())))
        }
        Stored::Ours(h) => {
            lines.push(format!(
                "  host:          {}",
                or_unknown(h.host.as_deref())
            ));
            lines.push(format!("  pid:           {}", or_unknown(h.pid)));
            lines.push(format!(
                "  command:       {}",
                or_unknown(h.command.as_deref())
            ));
            if let Some(started) = h.started {
                lines.push(format!(
                    "  since:         {} ({} ago)",
                    rfc3339(started),
                    ago(started)
                ));
            }
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

fn run_lines(r: &Stored<RunRecord>) -> Vec<String> {
    let Stored::Ours(r) = r else {
        return vec![
            "  host:          ?".into(),
            "  pid:           ?".into(),
            "  command:       ?".into(),
            "  result:        ?".into(),
            "  fencing token: ?".into(),
        ];
    };
    let status = or_unknown(r.exit_status);
    let mut how = match &r.ended {
        Some(RecordedEnding::Known(Ending::Exited)) => format!("exited with status {status}"),
        Some(RecordedEnding::Known(Ending::Signalled)) => {
            format!("killed by signal {}", or_unknown(r.signal))
        }
        Some(RecordedEnding::Known(Ending::Lost)) => "stopped: the lock was lost (exit 122)".into(),
        Some(RecordedEnding::Known(Ending::MaxRuntime)) => {
            "stopped: ran past --max-runtime (exit 124)".into()
        }
        Some(RecordedEnding::Known(Ending::NotStarted)) => format!("not started (exit {status})"),
        Some(RecordedEnding::Other(word)) => word.clone(),
        None => "?".into(),
    };
    if let Some(ms) = r.duration_ms {
        how += &format!(" after {}", round_ms(ms));
    }
    let mut lines = vec![
        format!("  host:          {}", or_unknown(r.host.as_deref())),
        format!("  pid:           {}", or_unknown(r.pid)),
        format!("  command:       {}", or_unknown(r.command.as_deref())),
    ];
    if let Some(started) = r.started {
        lines.push(format!(
            "  started:       {} ({} ago)",
            rfc3339(started),
            ago(started)
        ));
    }
    lines.push(format!("  result:        {how}"));
    lines.push(format!("  fencing token: {}", or_unknown(r.fencing_token)));
    if let Some(kept) = r.output.as_deref().filter(|k| !k.is_empty()) {
        let n = match kept.len() {
            1 => "1 line".to_string(),
            n => format!("{n} lines"),
        };
        lines.push(format!("  output (last {n}, kept):"));
        for line in kept {
            lines.push(format!(
                "    {} | {}",
                line.stream.mark(),
                crate::log::printable(&line.line)
            ));
        }
    }
    lines
}
