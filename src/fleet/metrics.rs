//! `--metrics-dir DIR`: after every attempt, the KEY's metrics in the Prometheus text format, for
//! node_exporter's textfile collector (the standard way to watch batch jobs). A skip updates the
//! outcome too, so an alert can tell "this host skipped, another ran it" from "this host is broken".
//!
//! The file is `DIR/cronlock_<KEY>.prom`, written whole to a temporary file in DIR and renamed over
//! the old one, so the collector never reads half a file and nothing else is left behind. The last
//! run's values survive skips: they are carried over from the previous file. The writer is a few
//! lines of our own: gauges with `key` and `host` labels need nothing of a metrics library.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// What became of one attempt, as the `outcome` label says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The command ran and exited (with any status) or was killed by a signal.
    Ran,
    /// Another host holds the lock, or ran this scheduled instant.
    Skipped,
    /// The lock was lost: the command was stopped (122).
    Lost,
    /// The command ran past `--max-runtime` (124).
    MaxRuntime,
    /// The lock was taken but the command could not be started (126, 127).
    FailedToStart,
    /// cronlock failed before running anything (125), or a signal ended the wait.
    Error,
    /// A `--crontab` instant no replica had room to start in time (recorded `missed`).
    Missed,
}

pub const OUTCOMES: [Outcome; 7] = [
    Outcome::Ran,
    Outcome::Skipped,
    Outcome::Lost,
    Outcome::MaxRuntime,
    Outcome::FailedToStart,
    Outcome::Error,
    Outcome::Missed,
];

impl Outcome {
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Ran => "ran",
            Outcome::Skipped => "skipped",
            Outcome::Lost => "lost",
            Outcome::MaxRuntime => "max_runtime",
            Outcome::FailedToStart => "failed_to_start",
            Outcome::Error => "error",
            Outcome::Missed => "missed",
        }
    }
}

/// What a run of the command on this host did.
#[derive(Debug, Clone, Copy)]
pub struct Ran {
    /// Unix ms.
    pub started_ms: u64,
    pub duration: Duration,
    pub exit_status: u8,
    /// Which attempt at its instant (1 without `--schedule`; 2, 3, ... for `--retries`).
    pub attempt: u32,
}

/// One attempt, as the metrics file records it.
#[derive(Debug, Clone, Copy)]
pub struct MetricsAttempt {
    pub outcome: Outcome,
    /// Unix ms.
    pub at_ms: u64,
    pub run: Option<Ran>,
    /// KEY was found suspended (`--suspend`) since this time (Unix ms); None: it was not, or
    /// (for an [`Outcome::Error`]) nobody could tell.
    pub suspended: Option<u64>,
}

/// The file for KEY: `cronlock_NAME.prom`, NAME being KEY with every byte outside
/// `[A-Za-z0-9_-]` percent-encoded (`nightly/report` is `nightly%2Freport`), so that distinct KEYs
/// never share a file. A name too long for a file system (over 200 bytes) is cut and told apart by
/// a 64-bit hash after a `.`, which no encoded name contains.
pub fn path(dir: &Path, key: &str) -> PathBuf {
    let mut name = String::with_capacity(key.len());
    for b in key.bytes() {
        if b.is_ascii_alphanumeric() || b == b'_' || b == b'-' {
            name.push(b as char);
        } else {
            name.push_str(&format!("%{b:02X}"));
        }
    }
    if name.len() > MAX_NAME {
        // FNV-1a: stable across versions and hosts, unlike std's hasher.
        let hash = key.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        let mut cut = MAX_NAME;
        while !name.is_char_boundary(cut) {
            cut -= 1;
        }
        name = format!("{}.{hash:016x}", &name[..cut]);
    }
    dir.join(format!("cronlock_{name}.prom"))
}

/// The longest encoded KEY kept whole in a file name (file names may have 255 bytes).
const MAX_NAME: usize = 200;

/// A label value escaped for the text format (backslash, double quote, newline).
fn escape(v: &str) -> String {
    v.replace('\\', r"\\")
        .replace('"', r#"\""#)
        .replace('\n', r"\n")
}

const START: &str = "cronlock_last_run_start_timestamp_seconds";
const DURATION: &str = "cronlock_last_run_duration_seconds";
const EXIT: &str = "cronlock_last_run_exit_status";
const SUCCESS: &str = "cronlock_last_success_timestamp_seconds";
const RUNNING: &str = "cronlock_running";
const ATTEMPT: &str = "cronlock_run_attempt";
const SUSPENDED: &str = "cronlock_suspended";
const SUSPENDED_SINCE: &str = "cronlock_suspended_since_timestamp_seconds";
const RUNNING_HELP: &str = "1 while this host runs KEY's command, else 0.";
const ATTEMPT_HELP: &str =
    "Which attempt at its instant this host's current or last run is (2 and more: --retries).";

/// The value of `metric` in a previous file of ours.
fn previous(text: &str, metric: &str) -> Option<String> {
    text.lines()
        .find(|l| l.starts_with(metric) && l[metric.len()..].starts_with('{'))
        .and_then(|l| l.rsplit(' ').next())
        .map(str::to_string)
}

fn seconds(ms: u64) -> String {
    format!("{}.{:03}", ms / 1000, ms % 1000)
}

/// The file's new text.
pub fn render(key: &str, host: &str, attempt: &MetricsAttempt, old: &str) -> String {
    let labels = format!("key=\"{}\",host=\"{}\"", escape(key), escape(host));
    let mut out = String::new();
    let mut gauge = |name: &str, help: &str, lines: &[(String, String)]| {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} gauge");
        for (extra, value) in lines {
            let _ = writeln!(out, "{name}{{{labels}{extra}}} {value}");
        }
    };
    gauge(
        "cronlock_last_attempt_timestamp_seconds",
        "When this host last tried to run KEY (Unix time).",
        &[(String::new(), seconds(attempt.at_ms))],
    );
    let outcomes: Vec<(String, String)> = OUTCOMES
        .iter()
        .map(|o| {
            let on = if *o == attempt.outcome { "1" } else { "0" };
            (format!(",outcome=\"{}\"", o.name()), on.to_string())
        })
        .collect();
    gauge(
        "cronlock_last_attempt_outcome",
        "Outcome of this host's last attempt: 1 for the outcome it had, 0 for the others.",
        &outcomes,
    );
    let [start, duration, exit, success] = last_run(attempt, old);
    let helps = [
        (
            START,
            "When this host last started the command (Unix time).",
            start,
        ),
        (DURATION, "How long this host's last run took.", duration),
        (
            EXIT,
            "Exit status of this host's last run (122: lock lost, 124: --max-runtime).",
            exit,
        ),
        (
            SUCCESS,
            "When a run on this host last ended with status 0 (Unix time).",
            success,
        ),
    ];
    for (name, help, value) in helps {
        if let Some(v) = value {
            gauge(name, help, &[(String::new(), v)]);
        }
    }
    gauge(RUNNING, RUNNING_HELP, &[(String::new(), "0".into())]);
    let attempt_no = attempt
        .run
        .map(|r| r.attempt.to_string())
        .or_else(|| previous(old, ATTEMPT));
    if let Some(n) = attempt_no {
        gauge(ATTEMPT, ATTEMPT_HELP, &[(String::new(), n)]);
    }
    let SuspensionValues { suspended, since } = suspension(attempt, old);
    let suspended_on = suspended == "1";
    gauge(
        SUSPENDED,
        "1 when this host's last attempt found KEY suspended (cronlock --suspend), else 0.",
        &[(String::new(), suspended)],
    );
    if let Some(since) = since.filter(|_| suspended_on) {
        gauge(
            SUSPENDED_SINCE,
            "When KEY's suspension began (Unix time), while it is suspended.",
            &[(String::new(), since)],
        );
    }
    out
}

/// The last run's start, duration, exit status and last success, from `attempt`, or carried
/// over from the previous file when it ran nothing.
fn last_run(attempt: &MetricsAttempt, old: &str) -> [Option<String>; 4] {
    match attempt.run {
        Some(run) => {
            let success = (run.exit_status == 0 && attempt.outcome == Outcome::Ran)
                .then(|| seconds(run.started_ms + run.duration.as_millis() as u64))
                .or_else(|| previous(old, SUCCESS));
            [
                Some(seconds(run.started_ms)),
                Some(seconds(run.duration.as_millis() as u64)),
                Some(run.exit_status.to_string()),
                success,
            ]
        }
        None => [START, DURATION, EXIT, SUCCESS].map(|m| previous(old, m)),
    }
}

/// The values of `cronlock_suspended` and `cronlock_suspended_since_seconds` as written.
struct SuspensionValues {
    suspended: String,
    since: Option<String>,
}

/// `cronlock_suspended` and since when: from `attempt`, or, when it could not tell (an error),
/// carried over from the previous file.
fn suspension(attempt: &MetricsAttempt, old: &str) -> SuspensionValues {
    match (attempt.suspended, attempt.outcome) {
        (Some(since), _) => SuspensionValues {
            suspended: "1".to_string(),
            since: Some(seconds(since)),
        },
        (None, Outcome::Error) => SuspensionValues {
            suspended: previous(old, SUSPENDED).unwrap_or_else(|| "0".into()),
            since: previous(old, SUSPENDED_SINCE),
        },
        (None, _) => SuspensionValues {
            suspended: "0".to_string(),
            since: None,
        },
    }
}

/// The file's text when the command starts (`attempt` at its instant): the previous file's lines
/// with `cronlock_running` 1 and the attempt, so an alert sees a run (a retry) in progress.
pub fn render_started(key: &str, host: &str, attempt: u32, old: &str) -> String {
    let mut out: String = old
        .lines()
        .filter(|l| {
            let metric = l
                .strip_prefix("# HELP ")
                .or_else(|| l.strip_prefix("# TYPE "))
                .unwrap_or(l);
            ![RUNNING, ATTEMPT]
                .iter()
                .any(|m| metric.starts_with(m) && metric[m.len()..].starts_with([' ', '{']))
        })
        .map(|l| format!("{l}\n"))
        .collect();
    let labels = format!("key=\"{}\",host=\"{}\"", escape(key), escape(host));
    for (name, help, value) in [(RUNNING, RUNNING_HELP, 1), (ATTEMPT, ATTEMPT_HELP, attempt)] {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} gauge");
        let _ = writeln!(out, "{name}{{{labels}}} {value}");
    }
    out
}

/// Write KEY's file in `dir` atomically and safely, even in a directory others can write to:
/// a new temporary file with an unpredictable name, created exclusively and never through a
/// symlink (`O_CREAT|O_EXCL|O_NOFOLLOW`), mode 0644 whatever the umask, then renamed over the final
/// name (which replaces a symlink there instead of following it). The previous file is read
/// without following a symlink.
pub fn write(dir: &Path, key: &str, host: &str, attempt: &MetricsAttempt) -> std::io::Result<()> {
    replace(dir, key, |old| render(key, host, attempt, old))
}

/// When the command starts: `cronlock_running` 1 and its attempt (see [`render_started`]).
pub fn write_started(dir: &Path, key: &str, host: &str, attempt: u32) -> std::io::Result<()> {
    replace(dir, key, |old| render_started(key, host, attempt, old))
}

/// Write KEY's file as `text` makes it from the previous one (see [`write`]).
fn replace(dir: &Path, key: &str, text: impl FnOnce(&str) -> String) -> std::io::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let target = path(dir, key);
    let old = read_no_follow(&target).unwrap_or_default();
    let text = text(&old);
    let name = target
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("cronlock");
    for _ in 0..8 {
        // Not *.prom, so the collector never reads it.
        let tmp = dir.join(format!(".{name}.{}.tmp", uuid::Uuid::new_v4().simple()));
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp);
        let mut file = match file {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        };
        let result = file
            .set_permissions(std::fs::Permissions::from_mode(0o644))
            .and_then(|()| file.write_all(text.as_bytes()))
            .and_then(|()| file.sync_all())
            .and_then(|()| std::fs::rename(&tmp, &target));
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        return result;
    }
    Err(std::io::Error::other(
        "cannot create a temporary file there",
    ))
}

/// A regular file's text, never through a symlink.
fn read_no_follow(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)?;
    if !f.metadata()?.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    let mut text = String::new();
    Read::by_ref(&mut f)
        .take(1 << 20)
        .read_to_string(&mut text)?;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_are_safe_and_distinct() {
        let d = Path::new("/m");
        assert_eq!(
            path(d, "nightly-report"),
            Path::new("/m/cronlock_nightly-report.prom")
        );
        assert_eq!(
            path(d, "nightly/report"),
            Path::new("/m/cronlock_nightly%2Freport.prom")
        );
        // Look-alikes stay apart: the old names hashed the first into the second.
        assert_ne!(
            path(d, "nightly/report"),
            path(d, "nightly_report_dad8c7e1")
        );
        assert_ne!(path(d, "a%2Fb"), path(d, "a/b"));
        assert!(!path(d, "../x").to_str().unwrap().contains(".."));
        let long = "k".repeat(1000);
        let name = path(d, &long);
        let file = name.file_name().unwrap().to_str().unwrap();
        assert!(file.len() < 255, "{file}");
        assert_ne!(name, path(d, &format!("{long}x")));
    }

    #[test]
    fn a_skip_keeps_the_last_run() {
        let run = MetricsAttempt {
            outcome: Outcome::Ran,
            at_ms: 1_000_000,
            run: Some(Ran {
                started_ms: 1_000_000,
                duration: Duration::from_millis(1500),
                exit_status: 0,
                attempt: 1,
            }),
            suspended: None,
        };
        let first = render("k\"1", "h", &run, "");
        assert!(
            first.contains(
                r#"cronlock_last_success_timestamp_seconds{key="k\"1",host="h"} 1001.500"#
            ),
            "{first}"
        );
        let skip = MetricsAttempt {
            outcome: Outcome::Skipped,
            at_ms: 2_000_000,
            run: None,
            suspended: None,
        };
        let second = render("k\"1", "h", &skip, &first);
        assert!(second.contains(r#"outcome="skipped"} 1"#));
        assert!(second.contains(r#"outcome="ran"} 0"#));
        assert!(second.contains(r#"cronlock_last_run_duration_seconds{key="k\"1",host="h"} 1.500"#));
        assert!(second
            .contains(r#"cronlock_last_success_timestamp_seconds{key="k\"1",host="h"} 1001.500"#));
    }
}
