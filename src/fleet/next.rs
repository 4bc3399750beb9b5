//! `--next CRON`: when a schedule runs, as cronlock runs it. The instants come from the same
//! code the scheduler uses ([`Schedule::next_after`], so `H`, `CRON_TZ=` and the
//! daylight-saving rules of [`crate::fleet::instants`] hold as they do for a job), each shown in
//! the schedule's time zone with UTC beside it, and a daylight-saving change that bears on it
//! said in words (an hour skipped, a time that comes twice and runs once). The crontab check
//! (`--crontab FILE --test`) and `--status` show instants the same way.

use std::fmt::Write as _;

use serde::Serialize;

use crate::fleet::instants::ClockChange;
use crate::fleet::schedule::Schedule;

/// `--next CRON`: the next instants of a schedule, for people (or `--json`).
pub struct NextQuery {
    /// With its `H` fields drawn for `--key`.
    pub schedule: Schedule,
    /// The KEY `H` was drawn for.
    pub key: Option<String>,
    /// `--count`.
    pub count: usize,
    /// `--from` (Unix ms): instants at or after it; `None`: after now.
    pub from_ms: Option<i64>,
    pub json: bool,
}

/// One instant as `--next` shows it.
#[derive(Serialize)]
pub struct ShownInstant {
    /// Unix ms.
    pub instant: i64,
    /// In the schedule's time zone, RFC 3339 with its offset.
    pub time: String,
    /// In UTC.
    pub utc: String,
    /// The daylight-saving change that bears on it, in words.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clock_change: Option<String>,
    /// For people: weekday, date, time and the zone's abbreviation.
    #[serde(skip)]
    pub local: String,
}

/// The first `count` instants at or after `from_ms` (`None`: after now).
pub fn instants(schedule: &Schedule, from_ms: Option<i64>, count: usize) -> Vec<ShownInstant> {
    let now = crate::clock::unix_millis() as i64;
    // Strictly after the second before `--from`: an instant at `--from` itself is shown.
    let mut prev = from_ms.map_or(now, |f| f - 1000);
    let mut out = Vec::with_capacity(count);
    while out.len() < count {
        let Some(at) = schedule.next_after(prev) else {
            break;
        };
        out.push(shown(schedule, prev, at));
        prev = at;
    }
    out
}

fn shown(schedule: &Schedule, prev: i64, at: i64) -> ShownInstant {
    let (local, time, utc) = match jiff::Timestamp::from_millisecond(at) {
        Ok(ts) => {
            let z = ts.to_zoned(schedule.zone().clone());
            (
                z.strftime("%a %Y-%m-%d %H:%M:%S %Z").to_string(),
                z.strftime("%Y-%m-%dT%H:%M:%S%:z").to_string(),
                ts.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
            )
        }
        Err(_) => (at.to_string(), at.to_string(), at.to_string()),
    };
    ShownInstant {
        instant: at,
        time,
        utc,
        clock_change: schedule.clock_change(prev, at).map(words),
        local,
    }
}

/// A civil second (as UTC) as `HH:MM`, or `HH:MM:SS` when its seconds are not zero.
fn civil(c: i64) -> String {
    match jiff::Timestamp::from_second(c) {
        Ok(ts) if c % 60 == 0 => ts.strftime("%H:%M").to_string(),
        Ok(ts) => ts.strftime("%H:%M:%S").to_string(),
        Err(_) => c.to_string(),
    }
}

/// An offset change as `1h` or `30m`.
fn amount(seconds: i64) -> String {
    crate::duration::Span(std::time::Duration::from_secs(seconds.unsigned_abs())).to_string()
}

/// A change, in words.
fn words(change: ClockChange) -> String {
    match change {
        ClockChange::Forward {
            at,
            before,
            by,
            in_gap: Some(wanted),
        } => format!(
            "clocks go forward {} at {}: {} does not happen that day, so it runs once, at {}",
            amount(by),
            civil(at + before),
            civil(wanted),
            civil(at + before + by),
        ),
        ClockChange::Forward { at, before, by, .. } => format!(
            "an hour skipped: clocks went forward {} at {}, to {}",
            amount(by),
            civil(at + before),
            civil(at + before + by),
        ),
        ClockChange::Back {
            at,
            after,
            by,
            first: true,
            once,
        } => format!(
            "{}–{} comes twice (clocks go back {} at {}); {}",
            civil(at + after),
            civil(at + after + by),
            amount(by),
            civil(at + after + by),
            if once {
                "an hour run once: this is its only run"
            } else {
                "it runs in both"
            },
        ),
        ClockChange::Back { at, after, by, .. } => format!(
            "{}–{} again (clocks went back {} at {}): it runs again",
            civil(at + after),
            civil(at + after + by),
            amount(by),
            civil(at + after + by),
        ),
    }
}

/// `--next`'s output: one line per instant (after the expression `H` drew, when it has one),
/// or a JSON document.
pub fn render(query: &NextQuery) -> String {
    let shown = instants(&query.schedule, query.from_ms, query.count);
    if query.json {
        #[derive(Serialize)]
        struct ShownNext<'a> {
            schedule: &'a str,
            #[serde(skip_serializing_if = "Option::is_none")]
            key: Option<&'a str>,
            #[serde(skip_serializing_if = "Option::is_none")]
            resolved: Option<&'a str>,
            zone: Option<&'a str>,
            instants: &'a [ShownInstant],
        }
        let doc = ShownNext {
            schedule: &query.schedule.text,
            key: query.key.as_deref(),
            resolved: query.schedule.resolved.as_deref(),
            zone: query.schedule.zone().iana_name(),
            instants: &shown,
        };
        return format!("{}\n", crate::record::to_json(&doc));
    }
    let mut out = String::new();
    if let (Some(resolved), Some(key)) = (&query.schedule.resolved, &query.key) {
        w!(out, "H drawn for KEY '{key}': {resolved}");
    }
    let width = shown.iter().map(|s| s.local.len()).max().unwrap_or(0);
    for s in &shown {
        let mut line = format!("{:width$}  {}", s.local, s.utc);
        if let Some(change) = &s.clock_change {
            let _ = write!(line, "  {change}");
        }
        w!(out, "{line}");
    }
    out
}

/// `--crontab FILE --test`: the first line, for a file whose `jobs` lines are all valid.
pub fn crontab_checked(file: &std::path::Path, jobs: usize) -> String {
    match jobs {
        1 => format!("{}: 1 job, every line valid\n", file.display()),
        n => format!("{}: {n} jobs, every line valid\n", file.display()),
    }
}

/// `--crontab FILE --test`: one job (of KEY `key` at `line` of `file`) and its next instant.
pub fn crontab_job(file: &std::path::Path, line: usize, key: &str, schedule: &Schedule) -> String {
    let shown = match &schedule.resolved {
        Some(r) => format!("{} (H: {r})", schedule.text),
        None => schedule.text.clone(),
    };
    let next = match instants(schedule, None, 1).pop() {
        Some(s) => format!("next {}  {}", s.local, s.utc),
        None => "never runs again".into(),
    };
    format!("{}:{line}: {key}: {shown}: {next}\n", file.display())
}

#[cfg(test)]
mod tests;
