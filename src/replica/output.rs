//! A run's output, attributed to its KEY: every line of the run's stdout and stderr is written
//! whole, prefixed `[KEY] ` (or, with `--log-format json`, as `{"key", "stream", "line"}`), so
//! lines of jobs running side by side never interleave. On stderr, the run's own cronlock lines
//! (JSON, with the run's pid) are not output: they are events, which the replica reports in its
//! own log as one line per run start and end, naming the KEY, the instant and the attempt.

use std::io::{BufRead, BufReader, Read, Write};
use std::sync::Mutex;

use serde_json::{json, Value};

use crate::host::rfc3339;
use crate::log::{Level, Log};

/// One writer at a time, so a line is never cut by another job's.
static WRITE: Mutex<()> = Mutex::new(());

/// The longest line relayed whole; a longer one is cut into pieces of this size.
const MAX_LINE: usize = 64 * 1024;

/// Which of the run's streams.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// A time (Unix ms) at which a job with `--retries` should be fired again, for the main loop.
pub type FollowUp = std::sync::mpsc::Sender<(String, i64)>;

/// Relay `from` (a run's stream) until it closes; the run's cronlock lines are reported in `log`,
/// and, for a job with `--retries`, turned into follow-ups.
pub fn relay(
    from: impl Read,
    stream: Stream,
    (key, pid): (&str, u32),
    json_out: bool,
    log: &Log,
    follow: Option<&FollowUp>,
) {
    let mut reader = BufReader::with_capacity(MAX_LINE, from);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match (&mut reader)
            .take(MAX_LINE as u64)
            .read_until(b'\n', &mut buf)
        {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let text = String::from_utf8_lossy(&buf);
        let line = text.strip_suffix('\n').unwrap_or(&text);
        if stream == Stream::Stderr {
            if let Some(event) = own_event(line, pid) {
                report(log, key, &event);
                if let (Some(at), Some(follow)) = (follow_up(&event), follow) {
                    let _ = follow.send((key.to_string(), at));
                    crate::signals::wake_main();
                }
                continue;
            }
        }
        write_line(stream, key, line, json_out);
    }
}

/// When a job with `--retries` should be fired again after this event of its run: a second
/// after the run failed here, or just after the lock of a run that holds it elsewhere would
/// lapse (if that run's host died, its attempt is then abandoned, and due again).
fn follow_up(e: &Value) -> Option<i64> {
    let now = crate::host::unix_millis() as i64;
    match e["event"].as_str()? {
        "finished" if e["exit_status"].as_i64() != Some(0) => Some(now + 1000),
        "busy" => Some(now + e["expires_in_ms"].as_i64()? + 250),
        _ => None,
    }
}

/// A line of the run's cronlock: a JSON object with its pid and an event.
fn own_event(line: &str, pid: u32) -> Option<Value> {
    if !line.starts_with('{') {
        return None;
    }
    let v: Value = serde_json::from_str(line).ok()?;
    (v["pid"].as_u64() == Some(u64::from(pid)) && v["event"].is_string()).then_some(v)
}

/// One line of a job's output, whole.
fn write_line(stream: Stream, key: &str, line: &str, json_out: bool) {
    let mut text = if json_out {
        json!({
            "ts": crate::host::unix_millis(),
            "key": key,
            "stream": if stream == Stream::Stdout { "stdout" } else { "stderr" },
            "line": line,
        })
        .to_string()
    } else {
        format!("[{key}] {line}")
    };
    text.push('\n');
    let _held = WRITE.lock().unwrap_or_else(|e| e.into_inner());
    let _ = match stream {
        Stream::Stdout => std::io::stdout().lock().write_all(text.as_bytes()),
        Stream::Stderr => std::io::stderr().lock().write_all(text.as_bytes()),
    };
}

/// A run's event in the replica's log: its start and end for everyone, its warnings and errors
/// as they are, the rest (a skip, a release) under `-v`.
fn report(log: &Log, key: &str, e: &Value) {
    let msg = e["msg"].as_str().unwrap_or_default();
    let instant = e["instant"].as_i64().filter(|ms| *ms > 0);
    let at = instant.map_or(String::new(), |ms| {
        format!(" for the {} instant", rfc3339(ms as u64))
    });
    fn with<'a>(key: &str, e: &Value, extra: &[(&'a str, Value)]) -> Vec<(&'a str, Value)> {
        let mut all: Vec<(&'a str, Value)> =
            vec![("key", key.into()), ("run_pid", e["pid"].clone())];
        all.extend(extra.iter().cloned());
        all
    }
    let fields = |extra: &[(&'static str, Value)]| with(key, e, extra);
    match (e["event"].as_str().unwrap_or_default(), e["level"].as_str()) {
        ("acquired", _) => log.info(
            "run_started",
            &format!(
                "{key}: started{at}, attempt {} (fencing token {})",
                e["attempt"].as_u64().unwrap_or(1),
                e["fencing_token"]
            ),
            &fields(&[
                ("instant", e["instant"].clone()),
                ("attempt", e["attempt"].clone()),
                ("fencing_token", e["fencing_token"].clone()),
            ]),
        ),
        ("finished", _) => log.info(
            "run_ended",
            &format!("{key}: {msg}"),
            &fields(&[
                ("exit_status", e["exit_status"].clone()),
                ("ended", e["ended"].clone()),
                ("duration_ms", e["duration_ms"].clone()),
            ]),
        ),
        (event, Some("error")) => {
            log.event(Level::Error, event, &format!("{key}: {msg}"), &fields(&[]));
        }
        (event, Some("warn")) => {
            log.event(Level::Warn, event, &format!("{key}: {msg}"), &fields(&[]));
        }
        (event, _) => log.event(Level::Debug, event, &format!("{key}: {msg}"), &fields(&[])),
    }
}
