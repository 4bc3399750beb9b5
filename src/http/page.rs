//! `GET /`: the status page, for a person at a glance. One row per job of the table: its schedule,
//! next instant, whether it runs now (where, since when, which attempt), whether it is suspended,
//! and its newest instants from the ledger as coloured cells, the details on hover. Rendered
//! here, with inline CSS, no script and nothing from elsewhere; it reloads itself every 5 s.
//! Nothing secret is shown: no URL, no command line, no environment.

use std::fmt::Write as _;

use crate::clock::{rfc3339, unix_millis};
use crate::fleet::describe::{describe_suspension, round_ms};
use crate::fleet::ledger;
use crate::host::hostname;
use crate::record::ledger::{LedgerEntry, LedgerInstant, STATES};
use crate::record::{or_unknown, Stored};

use super::answer::Response;
use super::board::{Board, Failed, Fleetwide, JobLine, Running};
use super::fleet::Reader;

/// The newest instants shown per job.
const CELLS: usize = 32;

const STYLE: &str = "body{font:14px/1.4 system-ui,sans-serif;margin:1em;color:#222}\
h1{font-size:1.2em}table{border-collapse:collapse;width:100%}\
.wrap{overflow-x:auto}th,td{text-align:left;padding:.35em .5em;border-bottom:1px solid #ddd;\
vertical-align:top}th{background:#f4f4f4}.cells{white-space:nowrap}\
.c{display:inline-block;width:.8em;height:1.2em;margin-right:2px;border-radius:2px;background:#ccc}\
.succeeded{background:#2e9e44}.failed{background:#d23c3c}.missed{background:#8a5cc2}\
.abandoned{background:#e08a00}.interrupted{background:#c76b98}.skipped{background:#9aa5b1}\
.running{background:#2f7bd9}.queued{background:#8fc3f0}.replaced{background:#b5651d}.manual{outline:2px solid #222;outline-offset:-2px}.warn{color:#b00}.muted{color:#777}.failure pre{white-space:pre-wrap;margin:.3em 0}\
@media (max-width:640px){thead{display:none}tr.job{display:block;border-bottom:1px solid #ddd;\
padding:.4em 0}tr.job td{display:block;border:0;padding:.1em .5em}\
tr.job td::before{content:attr(data-label);font-weight:600;margin-right:.5em}}";

pub fn answer(board: &Board, fleet: &mut Reader) -> Response {
    let (jobs, running, draining, offset) = {
        let s = board.state();
        (
            s.jobs.clone(),
            s.running.clone(),
            s.draining,
            s.clock_offset_ms,
        )
    };
    let super::fleet::FleetRead {
        by_key: read,
        trouble,
    } = fleet.read(&jobs);
    let mut out = String::new();
    let now = unix_millis();
    let _ = write!(
        out,
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">\
         <meta http-equiv=\"refresh\" content=\"5\"><title>cronlock replica on {host}</title>\
         <style>{STYLE}</style></head><body><h1>cronlock replica on {host}</h1>\
         <p class=\"muted\">{n} jobs &middot; {r} running here &middot; {state} &middot; {at}</p>",
        host = esc(&hostname()),
        n = jobs.len(),
        r = running.len(),
        state = if draining { "draining" } else { "serving" },
        at = rfc3339(now),
    );
    if let Some(ms) = offset {
        let class = if ms.abs() >= 500 { "warn" } else { "muted" };
        let way = if ms > 0 { "behind" } else { "ahead of" };
        let _ = write!(
            out,
            "<p class=\"{class}\">This host's clock is {}.{:03} s {way} Redis's (instants are \
             named by Redis's clock).</p>",
            ms.abs() / 1000,
            ms.abs() % 1000
        );
    }
    if let Some(why) = &trouble {
        let _ = write!(
            out,
            "<p class=\"warn\">Some of the fleet's state is unknown: {}</p>",
            esc(why)
        );
    }
    out.push_str(
        "<div class=\"wrap\"><table><thead><tr><th>Job</th><th>Schedule</th><th>Next</th>\
         <th>Now</th><th>Suspended</th><th>Newest instants (newest first)</th></tr></thead><tbody>",
    );
    for job in &jobs {
        row(
            &mut out,
            job,
            read.get(&job.key),
            running.get(&job.key),
            now as i64,
        );
    }
    out.push_str("</tbody></table></div><p class=\"muted\">");
    for state in STATES {
        let _ = write!(out, "<span class=\"c {state}\"></span> {state} &nbsp; ");
    }
    out.push_str("</p></body></html>\n");
    Response {
        status: 200,
        kind: "text/html; charset=utf-8",
        body: out,
    }
}

/// One job's row.
fn row(
    out: &mut String,
    job: &JobLine,
    fleet: Option<&Fleetwide>,
    here: Option<&Running>,
    now: i64,
) {
    let offset = job.config.jitter_offset();
    let next = job
        .schedule
        .next_after(now)
        .map_or("never".into(), |ms| rfc3339(ms as u64));
    // With --jitter, when its run starts: KEY's offset after the instant.
    let next = match offset.is_zero() {
        true => next,
        false => format!("{next} (+{})", crate::duration::Span(offset)),
    };
    let (runs, suspended) = match fleet {
        Some(f) => (
            now_running(f, here),
            f.suspended.as_ref().map_or("no".to_string(), |r| {
                format!("yes, {}", describe_suspension(r))
            }),
        ),
        None => ("unknown".to_string(), "unknown".to_string()),
    };
    let state = if fleet.is_some_and(|f| f.suspended.is_some()) {
        "suspended"
    } else if runs.starts_with("running") {
        "running"
    } else {
        "idle"
    };
    let _ = write!(
        out,
        "<tr class=\"job\" data-key=\"{k}\" data-state=\"{state}\"><td data-label=\"Job\">{k}</td>\
         <td data-label=\"Schedule\"><code>{s}</code></td><td data-label=\"Next\">{next}</td>\
         <td data-label=\"Now\">{runs}</td><td data-label=\"Suspended\">{susp}</td>\
         <td data-label=\"Instants\" class=\"cells\">",
        k = esc(&job.key),
        s = esc(&match &job.schedule.resolved {
            Some(r) => format!("{} = {r}", job.schedule.text),
            None => job.schedule.text.clone(),
        }),
        runs = esc(&runs),
        susp = esc(&suspended),
    );
    for LedgerInstant { instant: at, entry } in
        fleet.map_or(&[][..], |f| &f.ledger[..]).iter().take(CELLS)
    {
        let st = ledger::state(entry);
        let class = if st.chars().all(|c| c.is_ascii_lowercase()) {
            st.as_str()
        } else {
            ""
        };
        // A manual instant (--trigger) is marked apart from the schedule's.
        let manual = entry.ours().is_some_and(|e| e.manual);
        let _ = write!(
            out,
            "<span class=\"c {class}{}\" data-state=\"{}\"{} title=\"{}{}\"></span>",
            if manual { " manual" } else { "" },
            esc(&st),
            if manual { " data-manual=\"1\"" } else { "" },
            if manual { "manual (--trigger): " } else { "" },
            esc(&details(*at, entry))
        );
    }
    out.push_str("</td></tr>");
    if let Some(failed) = fleet.and_then(|f| f.failed.as_ref()) {
        failure_row(out, &job.key, failed);
    }
}

/// With `--show-output`: the job's last failure and the output it kept, every byte of it
/// escaped (a job's output is untrusted input to a browser).
fn failure_row(out: &mut String, key: &str, failed: &Failed) {
    let _ = write!(
        out,
        "<tr class=\"failure\" data-key=\"{k}\"><td colspan=\"6\"><details><summary>last \
         failure: exit {status} on {host}{at}</summary><pre>",
        k = esc(key),
        status = failed.exit_status.map_or("?".into(), |s| s.to_string()),
        host = esc(failed.host.as_deref().unwrap_or("?")),
        at = failed
            .started
            .map_or(String::new(), |ms| format!(", started {}", rfc3339(ms))),
    );
    if failed.output.is_empty() {
        out.push_str("(no output kept)");
    }
    for line in &failed.output {
        let _ = writeln!(
            out,
            "{} | {}",
            line.stream.mark(),
            esc(&crate::log::printable(&line.line))
        );
    }
    out.push_str("</pre></details></td></tr>");
}

/// Whether the job runs now, fleet-wide: the newest instant's attempt while it is `running`.
fn now_running(f: &Fleetwide, here: Option<&Running>) -> String {
    let newest = f.ledger.first().and_then(|l| l.entry.ours());
    if let Some(entry) = newest.filter(|e| e.state.as_deref() == Some("running")) {
        let n = entry.attempts.len();
        let last = entry.attempts.last();
        let since = last.and_then(|a| a.started).map_or(String::new(), |ms| {
            format!(
                " since {} ({} ago)",
                rfc3339(ms),
                round_ms(unix_millis().saturating_sub(ms))
            )
        });
        return format!(
            "running on {}{since}, attempt {n}",
            or_unknown(last.and_then(|a| a.host.as_deref()))
        );
    }
    match here {
        Some(r) => format!(
            "running here since {}, attempt {}",
            rfc3339(r.since_ms),
            r.attempt
        ),
        None => "not running".into(),
    }
}

/// An instant's details, for the hover: its time, state and attempts.
fn details(at: i64, entry: &Stored<LedgerEntry>) -> String {
    let mut s = format!("{}: {}", rfc3339(at.max(0) as u64), ledger::state(entry));
    for (i, a) in ledger::attempts(entry).iter().enumerate() {
        let exit = a.exit.map_or(String::new(), |c| format!(", exit {c}"));
        let took = ledger::took(a).map_or(String::new(), |t| format!(", {t}"));
        let _ = write!(
            s,
            "\nattempt {} on {}: {}{exit}{took}",
            i + 1,
            or_unknown(a.host.as_deref()),
            or_unknown(a.state.as_deref())
        );
    }
    s
}

/// Text made safe inside HTML elements and attribute values.
fn esc(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}
