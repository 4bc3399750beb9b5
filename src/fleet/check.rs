//! `--check KEY`: a monitoring plugin. "Did last night's job run somewhere, and did it succeed?"
//! is answered from the run record in Redis, so any host, or the monitoring system itself, can
//! ask. Output and exit status follow the Nagios plugin conventions that Icinga, Sensu, Zabbix and
//! Checkmk run: one line on stdout, performance data after `|`, and
//! 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN. Every error in this mode is UNKNOWN, never 125.

use std::time::Duration;

use serde_json::{json, Value};

use crate::fleet::describe::{describe_suspension, round_ms};
use crate::fleet::schedule::Schedule;
use crate::record::holder::HolderValue;
use crate::record::run::{Ending, KeptStream, RecordedEnding, RunRecord};
use crate::record::{or_unknown, Stored};
use crate::store::inspect::Snapshot;

/// The plugin states, with their exit statuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckState {
    Ok = 0,
    Warning = 1,
    Critical = 2,
    Unknown = 3,
}

impl CheckState {
    pub fn name(self) -> &'static str {
        match self {
            CheckState::Ok => "OK",
            CheckState::Warning => "WARNING",
            CheckState::Critical => "CRITICAL",
            CheckState::Unknown => "UNKNOWN",
        }
    }
}

/// With `--schedule` and no `--max-age`: how long after an instant its run may take to start.
pub const DEFAULT_SCHEDULE_GRACE: Duration = Duration::from_secs(5 * 60);

/// What the check found.
#[derive(Debug, Clone)]
pub struct CheckVerdict {
    pub state: CheckState,
    pub message: String,
    /// Performance data: (label, milliseconds), shown in seconds.
    pub perf: Vec<(&'static str, u64)>,
}

impl CheckVerdict {
    pub fn unknown(message: String) -> CheckVerdict {
        CheckVerdict {
            state: CheckState::Unknown,
            message,
            perf: Vec::new(),
        }
    }

    /// The plugin's line (or JSON object), newline included.
    pub fn render(&self, key: &str, as_json: bool) -> String {
        if as_json {
            let perf: serde_json::Map<String, Value> = self
                .perf
                .iter()
                .map(|(k, v)| (format!("{k}_s"), json!(*v as f64 / 1000.0)))
                .collect();
            return format!(
                "{}\n",
                json!({
                    "key": key,
                    "status": self.state.name(),
                    "code": self.state as u8,
                    "message": self.message,
                    "perfdata": perf,
                })
            );
        }
        let mut line = format!("CRONLOCK {} - {}", self.state.name(), self.message);
        if !self.perf.is_empty() {
            line += " |";
            for (k, v) in &self.perf {
                line += &format!(" {k}={}s", seconds(*v));
            }
        }
        line + "\n"
    }
}

/// Milliseconds as seconds for performance data: `63`, or `0.003` below a whole second.
fn seconds(ms: u64) -> String {
    if ms.is_multiple_of(1000) || ms >= 10_000 {
        (ms / 1000).to_string()
    } else {
        format!("{:.3}", ms as f64 / 1000.0)
    }
}

/// A duration for people: whole seconds from one second up.
fn coarse(ms: u64) -> String {
    if ms >= 1000 {
        round_ms(ms / 1000 * 1000)
    } else {
        round_ms(ms)
    }
}

/// The most a `--check` line quotes of a failed run's output.
const QUOTED: usize = 200;

/// The first line a failed run's kept output (`--keep-output`) has on stderr, where a failure
/// is said (else its first line), quoted within [`QUOTED`] characters.
fn first_said(run: &RunRecord) -> Option<String> {
    let lines = run.output.as_deref()?;
    let line = lines
        .iter()
        .find(|l| l.stream == KeptStream::Stderr && !l.line.trim().is_empty())
        .or_else(|| lines.iter().find(|l| !l.line.trim().is_empty()))?;
    let text = crate::log::printable(line.line.trim());
    let mut quoted: String = text.chars().take(QUOTED).collect();
    if text.chars().count() > QUOTED {
        quoted.push('…');
    }
    Some(format!("\"{quoted}\""))
}

/// How a recorded run ended, in a few words; `None` when it succeeded.
fn failure(run: &RunRecord) -> Option<String> {
    let status = run.exit_status;
    let Some(RecordedEnding::Known(ending)) = &run.ended else {
        let word = match &run.ended {
            Some(RecordedEnding::Other(word)) => word.as_str(),
            _ => "?",
        };
        return Some(format!("ended '{word}'"));
    };
    match ending {
        Ending::Exited if status == Some(0) => None,
        Ending::Exited => Some(format!("exit {}", or_unknown(status))),
        Ending::Signalled => Some(format!("killed by signal {}", or_unknown(run.signal))),
        Ending::Lost => Some("lost its lock, exit 122".into()),
        Ending::MaxRuntime => Some("ran past --max-runtime, exit 124".into()),
        Ending::NotStarted => Some(format!("not started, exit {}", or_unknown(status))),
    }
}

/// Judge KEY from a snapshot at `now_ms`. A suspended KEY (`--suspend`) is a WARNING whatever its
/// runs say: nothing is expected to run, and someone should remember to resume it.
pub fn judge(
    key: &str,
    snap: &Snapshot,
    max_age: Option<Duration>,
    schedule: Option<&Schedule>,
    now_ms: u64,
) -> CheckVerdict {
    let verdict = judge_runs(key, snap, max_age, schedule, now_ms);
    match &snap.suspended {
        Some(record) => CheckVerdict {
            state: CheckState::Warning,
            message: format!(
                "{key} is suspended {} (its runs: {})",
                describe_suspension(record),
                verdict.message
            ),
            perf: verdict.perf,
        },
        None => verdict,
    }
}

/// [`judge`], from the runs alone.
fn judge_runs(
    key: &str,
    snap: &Snapshot,
    max_age: Option<Duration>,
    schedule: Option<&Schedule>,
    now_ms: u64,
) -> CheckVerdict {
    let last = snap.last_run.as_ref().and_then(Stored::ours);
    // With --limit above 1, any holder means a run is going on.
    let holder = snap
        .holder
        .as_deref()
        .or(snap.slots.first().map(|s| s.value.as_str()))
        .map(Stored::<HolderValue>::read);
    let holder = holder.as_ref().and_then(Stored::ours);
    if let Some(verdict) = running(key, holder, last, max_age, now_ms) {
        return verdict;
    }

    // With a schedule: the latest instant whose run should have started by now.
    let expected = schedule.and_then(|s| {
        let grace = max_age.unwrap_or(DEFAULT_SCHEDULE_GRACE).as_millis() as u64;
        let instant = s.at_or_before(now_ms.saturating_sub(grace) as i64)?;
        Some(Missed {
            schedule: s,
            instant,
        })
    });
    let missed = expected.filter(|m| snap.instant.is_none_or(|ran| ran < m.instant));

    let Some(run) = last else {
        let message = match missed {
            Some(m) => format!(
                "{key} never ran: no run for the {} instant",
                m.schedule.label_at(m.instant, now_ms as i64)
            ),
            None => format!("{key} never ran"),
        };
        return CheckVerdict {
            state: CheckState::Critical,
            message,
            perf: Vec::new(),
        };
    };
    judge_last(
        key,
        run,
        missed,
        max_age.filter(|_| schedule.is_none()),
        now_ms,
    )
}

/// A run in progress (a lock whose run has not finished: not one kept for `--min-hold`): OK, or
/// WARNING past `--max-age`.
fn running(
    key: &str,
    holder: Option<&HolderValue>,
    last: Option<&RunRecord>,
    max_age: Option<Duration>,
    now_ms: u64,
) -> Option<CheckVerdict> {
    let h = holder?;
    let last_token = last.and_then(|l| l.token.as_ref());
    let finished = last_token.is_some() && last_token == h.token.as_ref();
    let started = h.started.filter(|_| !finished)?;
    let running = now_ms.saturating_sub(started);
    let perf = vec![("running", running)];
    let host = or_unknown(h.host.as_deref());
    if max_age.is_some_and(|m| running > m.as_millis() as u64) {
        return Some(CheckVerdict {
            state: CheckState::Warning,
            message: format!(
                "{key} has been running on {host} for {}, longer than --max-age {}",
                coarse(running),
                coarse(max_age.unwrap_or_default().as_millis() as u64)
            ),
            perf,
        });
    }
    Some(CheckVerdict {
        state: CheckState::Ok,
        message: format!("{key} is running on {host} for {}", coarse(running)),
        perf,
    })
}

/// The latest instant of a schedule whose run should have started by now, and did not.
struct Missed<'a> {
    schedule: &'a Schedule,
    instant: i64,
}

/// Judge the last recorded run: failed, a missed instant (`missed`), too old (`max_age`, without
/// a schedule), or OK.
fn judge_last(
    key: &str,
    run: &RunRecord,
    missed: Option<Missed<'_>>,
    max_age: Option<Duration>,
    now_ms: u64,
) -> CheckVerdict {
    let since = |ms: u64| now_ms.saturating_sub(ms);
    let started = run.started.unwrap_or(0);
    let age = since(started);
    let duration = run.duration_ms.unwrap_or(0);
    let perf = vec![("age", age), ("duration", duration)];
    let host = or_unknown(run.host.as_deref());
    let when = format!("on {host} {} ago", coarse(age));
    if let Some(how) = failure(run) {
        let said = first_said(run).map_or(String::new(), |line| format!(": {line}"));
        return CheckVerdict {
            state: CheckState::Critical,
            message: format!("{key} failed {when} ({how}, {}){said}", coarse(duration)),
            perf,
        };
    }
    if let Some(m) = missed {
        return CheckVerdict {
            state: CheckState::Critical,
            message: format!(
                "{key}: no run for the {} instant (last run {when})",
                m.schedule.label_at(m.instant, now_ms as i64)
            ),
            perf,
        };
    }
    if let Some(m) = max_age.filter(|m| age > m.as_millis() as u64) {
        return CheckVerdict {
            state: CheckState::Critical,
            message: format!(
                "{key}: no run started within --max-age {} (last run {when})",
                coarse(m.as_millis() as u64)
            ),
            perf,
        };
    }
    CheckVerdict {
        state: CheckState::Ok,
        message: format!("{key} succeeded {when} (exit 0, {})", coarse(duration)),
        perf,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_795_240_800_000; // 2026-11-21T06:00:00Z

    fn snap(holder: Option<Value>, last: Option<Value>, instant: Option<i64>) -> Snapshot {
        Snapshot {
            holder: holder.map(|h| h.to_string()),
            pttl: 1000,
            fence: Some(7),
            last_run: last.map(|l| Stored::read(&l.to_string())),
            history: Vec::new(),
            instant,
            schedule: None,
            limit: None,
            slots: Vec::new(),
            ledger: Vec::new(),
            suspended: None,
        }
    }

    #[test]
    fn a_suspended_key_is_a_warning_whatever_its_runs() {
        let mut s = snap(None, Some(run("exited", 1, 60, "t")), None);
        assert_eq!(judge("k", &s, None, None, NOW).state, CheckState::Critical);
        s.suspended = Some(Stored::read(
            r#"{"host":"h","user":"ops","since":1,"reason":"db move"}"#,
        ));
        let v = judge("k", &s, None, None, NOW);
        assert_eq!(v.state, CheckState::Warning);
        assert!(v.message.contains("suspended by ops on h"), "{}", v.message);
        assert!(v.message.contains("db move"), "{}", v.message);
    }

    fn run(ended: &str, status: i64, started_ago_s: u64, token: &str) -> Value {
        json!({"host": "web-1", "started": NOW - started_ago_s * 1000, "duration_ms": 63_000,
               "ended": ended, "exit_status": status, "token": token})
    }

    #[test]
    fn ok_line_has_perfdata() {
        let v = judge(
            "nightly-report",
            &snap(None, Some(run("exited", 0, 10_800, "a")), None),
            Some(Duration::from_secs(26 * 3600)),
            None,
            NOW,
        );
        assert_eq!(
            v.render("nightly-report", false),
            "CRONLOCK OK - nightly-report succeeded on web-1 3h ago (exit 0, 1m 3s) \
             | age=10800s duration=63s\n"
        );
    }

    #[test]
    fn failures_age_and_running() {
        let day = Some(Duration::from_secs(86_400));
        let s = snap(None, Some(run("exited", 1, 60, "a")), None);
        assert_eq!(judge("k", &s, day, None, NOW).state, CheckState::Critical);
        let s = snap(None, Some(run("lost", 122, 60, "a")), None);
        assert!(judge("k", &s, day, None, NOW)
            .message
            .contains("lost its lock"));
        let s = snap(None, Some(run("exited", 0, 90_000, "a")), None);
        assert_eq!(judge("k", &s, day, None, NOW).state, CheckState::Critical);
        assert_eq!(judge("k", &s, None, None, NOW).state, CheckState::Ok);
        let s = snap(None, None, None);
        assert_eq!(judge("k", &s, day, None, NOW).state, CheckState::Critical);
        let holder = json!({"host": "web-2", "started": NOW - 7_200_000, "token": "b"});
        let s = snap(Some(holder), Some(run("exited", 0, 90_000, "a")), None);
        assert_eq!(
            judge("k", &s, Some(Duration::from_secs(3600)), None, NOW).state,
            CheckState::Warning
        );
        assert_eq!(judge("k", &s, day, None, NOW).state, CheckState::Ok);
    }

    #[test]
    fn schedule_names_the_missed_instant() {
        let daily = Schedule::parse("TZ=UTC 0 2 * * *").unwrap();
        let today_2am = (NOW - 4 * 3_600_000) as i64;
        let s = snap(
            None,
            Some(run("exited", 0, 86_400 + 4 * 3600, "a")),
            Some(today_2am - 86_400_000),
        );
        let v = judge("k", &s, None, Some(&daily), NOW);
        assert_eq!(v.state, CheckState::Critical);
        assert!(
            v.message.contains("no run for the 02:00 instant"),
            "{}",
            v.message
        );
        let s = snap(None, Some(run("exited", 0, 4 * 3600, "a")), Some(today_2am));
        assert_eq!(
            judge("k", &s, None, Some(&daily), NOW).state,
            CheckState::Ok
        );
    }
}
