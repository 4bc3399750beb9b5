//! `--schedule` (once per scheduled instant across hosts) and `--check` (the monitoring plugin),
//! against a real Redis. Hosts are cronlock processes started at chosen moments around an
//! instant of a 10-second schedule; Redis and the hosts share this machine's clock.

use std::process::{Child, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::common::*;

const EVERY_10S: &str = "*/10 * * * * *";

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Sleep until the wall clock is `offset_ms` past a multiple of `period_ms` (bounded: at most one
/// period). Returns that multiple, in Unix ms.
fn until_phase(period_ms: u64, offset_ms: u64) -> u64 {
    let now = now_ms();
    let mut base = now - now % period_ms;
    if now >= base + offset_ms {
        base += period_ms;
    }
    std::thread::sleep(Duration::from_millis(base + offset_ms - now));
    base
}

/// Sleep until the wall clock reaches `at_ms` (never longer than 15 s).
fn until(at_ms: u64) {
    let now = now_ms();
    if at_ms > now {
        std::thread::sleep(Duration::from_millis((at_ms - now).min(15_000)));
    }
}

/// A host firing for the schedule: appends "run" to `marker` when it runs; 75 when it skips.
fn host(r: &Redis, schedule: &str, key: &str, marker: &std::path::Path, extra: &[&str]) -> Child {
    cronlock(r)
        .args(["--schedule", schedule, "-E", "75", "-v"])
        .args(extra)
        .args([key, "-c"])
        .arg(format!("echo run >> {}; sleep 0.3", marker.display()))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn runs(marker: &std::path::Path) -> usize {
    std::fs::read_to_string(marker)
        .unwrap_or_default()
        .lines()
        .count()
}

#[test]
fn one_run_per_instant_whatever_each_hosts_timing() {
    let r = Redis::start();
    let dir = scratch("schedule");
    let marker = dir.join("runs");
    // Instant T is the next multiple of 10 s; the first host fires 2 s early.
    let t = until_phase(10_000, 8_000) + 10_000;
    let mut hosts = Vec::new();
    for offset in [-2000i64, -1000, 500, 1500, 3000] {
        until((t as i64 + offset) as u64);
        hosts.push((offset, host(&r, EVERY_10S, "tick", &marker, &[])));
    }
    let mut outs = Vec::new();
    for (offset, h) in hosts {
        outs.push((offset, h.wait_with_output().unwrap()));
    }
    assert_eq!(runs(&marker), 1, "{outs:?}");
    let ran: Vec<_> = outs.iter().filter(|(_, o)| code(o) == 0).collect();
    assert_eq!(ran.len(), 1, "{outs:?}");
    for (offset, o) in &outs {
        assert!(matches!(code(o), 0 | 75), "{offset}: {}", stderr(o));
    }
    // The host 3 s late skips, after the lock was released: the instant already ran.
    let late = &outs.last().unwrap().1;
    assert_eq!(code(late), 75, "{}", stderr(late));
    assert!(
        stderr(late).contains("already ran for the"),
        "{}",
        stderr(late)
    );
    assert!(!r.exists("cronlock:{tick}"));

    // --status shows the instant of the last run and the next one.
    let out = run(cronlock(&r).args(["--status", "--json", "tick"]));
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v["schedule"]["last_instant"], t);
    assert_eq!(v["schedule"]["schedule"], EVERY_10S);
    let next = v["schedule"]["next_instant"].as_u64().unwrap();
    assert!(next > now_ms() - 100 && next.is_multiple_of(10_000), "{v}");
    // And the two after it.
    let three: Vec<u64> = v["schedule"]["next_instants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i.as_u64().unwrap())
        .collect();
    assert_eq!(three, [next, next + 10_000, next + 20_000], "{v}");
    let out = run(cronlock(&r).args(["--status", "tick"]));
    assert!(
        stdout(&out).contains("schedule:        */10 * * * * *"),
        "{}",
        stdout(&out)
    );
    assert!(stdout(&out).contains("last instant:"), "{}", stdout(&out));
    assert!(stdout(&out).contains("next instant:"), "{}", stdout(&out));
    assert!(
        stdout(&out).contains("  then:          "),
        "{}",
        stdout(&out)
    );

    // A host firing well before the next instant (nearer to it than to T) runs for it.
    until(t + 6_500);
    let out = host(&r, EVERY_10S, "tick", &marker, &[])
        .wait_with_output()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(runs(&marker), 2);
}

/// Wait until the first 25 s of a minute: the nearest minute is then the one that began (a
/// firing nearer the next one would wait for it: no command starts before its instant).
fn away_from_half_minute() {
    assert!(wait_for(Duration::from_secs(40), || (now_ms() / 1000) % 60 < 25));
}

#[test]
fn five_fields_and_a_waiter_whose_instant_ran_meanwhile() {
    let r = Redis::start();
    let dir = scratch("schedule-5");
    let marker = dir.join("runs");
    away_from_half_minute();
    let first = host(&r, "* * * * *", "minutely", &marker, &[]);
    assert!(wait_for(Duration::from_secs(5), || runs(&marker) == 1));
    // Fires for the same minute while the first run holds the lock, and waits for it: when the
    // lock is released, the instant has run, so it skips instead of running it a second time.
    let waiter = host(&r, "* * * * *", "minutely", &marker, &["--wait", "10s"])
        .wait_with_output()
        .unwrap();
    assert_eq!(code(&first.wait_with_output().unwrap()), 0);
    assert_eq!(code(&waiter), 75, "{}", stderr(&waiter));
    assert!(
        stderr(&waiter).contains("already ran"),
        "{}",
        stderr(&waiter)
    );
    assert_eq!(runs(&marker), 1);
    // Without --schedule the same KEY just runs: the instant record stops only scheduled runs.
    let out = run(cronlock(&r).args(["minutely", "true"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
}

#[test]
fn a_bad_expression_is_one_line_naming_the_field() {
    let r = Redis::start();
    for (expr, field) in [
        ("61 * * * *", "minute field '61'"),
        ("0 2 * * funday", "day-of-week field 'funday'"),
        ("0 2 * *", "4 fields"),
        ("CRON_TZ=Nowhere/Town 0 2 * * *", "Nowhere/Town"),
    ] {
        let out = run(cronlock(&r).args(["--schedule", expr, "k", "true"]));
        assert_eq!(code(&out), 125, "{expr}: {}", stderr(&out));
        let line = one_line(&out);
        assert!(
            line.contains("--schedule") && line.contains(field),
            "{line}"
        );
    }
    let out = run(cronlock(&r)
        .env("CRONLOCK_SCHEDULE", "0 25 * * *")
        .args(["k", "true"]));
    assert_eq!(code(&out), 125);
    let line = one_line(&out);
    assert!(
        line.contains("CRONLOCK_SCHEDULE") && line.contains("hour field '25'"),
        "{line}"
    );
    assert!(r.keys().is_empty(), "{:?}", r.keys());
}

fn check(r: &Redis, args: &[&str]) -> (i32, String) {
    let out = run(cronlock(r).arg("--check").args(args));
    assert!(out.stderr.is_empty(), "{}", stderr(&out));
    let text = stdout(&out);
    assert_eq!(text.lines().count(), 1, "{text}");
    (code(&out), text)
}

#[test]
fn check_outcomes() {
    let r = Redis::start();
    // Never ran.
    let (c, text) = check(&r, &["--max-age", "1h", "report"]);
    assert_eq!(c, 2, "{text}");
    assert!(
        text.starts_with("CRONLOCK CRITICAL - report never ran"),
        "{text}"
    );

    // Succeeded: OK with performance data.
    assert_eq!(code(&run(cronlock(&r).args(["report", "true"]))), 0);
    let (c, text) = check(&r, &["--max-age", "1h", "report"]);
    assert_eq!(c, 0, "{text}");
    assert!(
        text.starts_with("CRONLOCK OK - report succeeded on ") && text.contains("(exit 0, "),
        "{text}"
    );
    assert!(
        text.contains(" | age=") && text.contains(" duration="),
        "{text}"
    );
    let out = run(cronlock(&r).args(["--check", "--json", "report"]));
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(
        (v["status"].as_str(), v["code"].as_u64()),
        (Some("OK"), Some(0))
    );

    // Too old: no run started within --max-age.
    std::thread::sleep(Duration::from_millis(1100));
    let (c, text) = check(&r, &["--max-age", "1s", "report"]);
    assert_eq!(c, 2, "{text}");
    assert!(
        text.contains("no run started within --max-age 1s"),
        "{text}"
    );

    // Failed.
    assert_eq!(code(&run(cronlock(&r).args(["report", "false"]))), 1);
    let (c, text) = check(&r, &["--max-age", "1h", "report"]);
    assert_eq!(c, 2, "{text}");
    assert!(
        text.contains("report failed on ") && text.contains("exit 1"),
        "{text}"
    );

    check_in_progress(&r);

    // A schedule names the instant that was missed.
    assert_eq!(code(&run(cronlock(&r).args(["nightly", "true"]))), 0);
    let (c, text) = check(
        &r,
        &[
            "--schedule",
            "TZ=UTC * * * * * *",
            "--max-age",
            "1s",
            "nightly",
        ],
    );
    assert_eq!(c, 2, "{text}");
    assert!(
        text.contains("no run for the ") && text.contains(" instant"),
        "{text}"
    );

    check_unknown(&r);
}

/// `--check` of a run in progress: OK, then WARNING once it runs longer than --max-age.
fn check_in_progress(r: &Redis) {
    let dir = scratch("check");
    let mut job = cronlock(r)
        .args(["report", "-c"])
        .arg(format!("touch {}/go; sleep 30", dir.display()))
        .spawn()
        .unwrap();
    assert!(wait_for(Duration::from_secs(5), || dir.join("go").exists()));
    let (c, text) = check(r, &["--max-age", "1h", "report"]);
    assert_eq!(c, 0, "{text}");
    assert!(text.contains("report is running on "), "{text}");
    std::thread::sleep(Duration::from_millis(1100));
    let (c, text) = check(r, &["--max-age", "1s", "report"]);
    assert_eq!(c, 1, "{text}");
    assert!(
        text.starts_with("CRONLOCK WARNING - report has been running on "),
        "{text}"
    );
    signal(job.id() as i32, libc::SIGTERM);
    job.wait().unwrap();
}

/// `--check` with Redis unreachable, or bad usage: UNKNOWN (3), never 125.
fn check_unknown(r: &Redis) {
    let port = free_port();
    let out = run(cronlock(r)
        .env(
            "CRONLOCK_REDIS_URL",
            format!("redis://:secret@127.0.0.1:{port}"),
        )
        .args(["--check", "report"]));
    assert_eq!(code(&out), 3, "{}", stdout(&out));
    assert!(
        stdout(&out).starts_with("CRONLOCK UNKNOWN - "),
        "{}",
        stdout(&out)
    );
    assert!(!stdout(&out).contains("secret"));
    let (c, text) = check(r, &["--max-age", "soon", "report"]);
    assert_eq!(c, 3, "{text}");
    assert!(
        text.starts_with("CRONLOCK UNKNOWN - ") && text.contains("--max-age"),
        "{text}"
    );
}

/// `--next`: the instants the scheduler's own code names, in the schedule's zone with UTC
/// beside them and a daylight-saving change in words; no Redis needed; a bad expression is the
/// same one line `--schedule` gives, and 125.
#[test]
fn next_prints_the_instants_as_cronlock_runs_them() {
    let next = |args: &[&str]| run(cronlock_at("redis://127.0.0.1:1").arg("--next").args(args));
    let out = next(&[
        "CRON_TZ=Europe/Berlin 30 2 * * *",
        "--from",
        "2026-03-28",
        "--count",
        "3",
    ]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "Sat 2026-03-28 02:30:00 CET   2026-03-28T01:30:00Z\n\
         Sun 2026-03-29 03:00:00 CEST  2026-03-29T01:00:00Z  clocks go forward 1h at 02:00: \
         02:30 does not happen that day, so it runs once, at 03:00\n\
         Mon 2026-03-30 02:30:00 CEST  2026-03-30T00:30:00Z\n"
    );
    // H drawn for the KEY as a replica draws it (given as --key or as KEY).
    let drawn = next(&["CRON_TZ=UTC H 3 * * *", "--key", "backup", "--count", "1"]);
    let positional = next(&["CRON_TZ=UTC H 3 * * *", "backup", "--count", "1"]);
    assert_eq!(code(&drawn), 0, "{}", stderr(&drawn));
    assert_eq!(stdout(&drawn), stdout(&positional));
    assert!(stdout(&drawn).starts_with("H drawn for KEY 'backup': "));
    let out = next(&["CRON_TZ=UTC H 3 * * *"]);
    assert_eq!(code(&out), 125);
    assert!(stderr(&out).contains("give --key KEY"), "{}", stderr(&out));
    // JSON.
    let out = next(&[
        "CRON_TZ=UTC @hourly",
        "--from",
        "2026-11-27T10:30:00Z",
        "--count",
        "2",
        "--json",
    ]);
    let doc: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(doc["instants"][1]["utc"], "2026-11-27T12:00:00Z");
    assert_eq!(doc["instants"][0]["instant"], 1_795_777_200_000i64);
    // A bad expression: the line --schedule gives.
    let bad = next(&["61 * * * *"]);
    let sched =
        run(cronlock_at("redis://127.0.0.1:1").args(["--schedule", "61 * * * *", "k", "true"]));
    assert_eq!(code(&bad), 125);
    assert_eq!(code(&sched), 125);
    assert_eq!(
        stderr(&bad).replace("--next", "--schedule"),
        stderr(&sched),
        "{}",
        stderr(&bad)
    );
    for wrong in [
        &["* * * * *", "--from", "yesterday"][..],
        &["* * * * *", "k", "true"][..],
        &["* * * * *", "--count", "0"][..],
    ] {
        let out = next(wrong);
        assert_eq!(code(&out), 125, "{wrong:?}: {}", stdout(&out));
        assert_eq!(stderr(&out).lines().count(), 1, "{}", stderr(&out));
    }
}
