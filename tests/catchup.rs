//! `--catch-up` and `--retries`: every scheduled instant gets its run. The schedule is monthly
//! (6 fields, seconds first, in UTC), so the instants inside a window are fixed whatever the
//! moment the test runs, and "all hosts were down" needs no waiting: no host fired since the
//! instants passed. Against a real Redis, with the real binary.

mod common;

use std::process::Stdio;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::*;

/// Midnight UTC on the first of every month.
const MONTHLY: &str = "CRON_TZ=UTC 0 0 0 1 * *";

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// The ledger of `key`: instant (Unix ms) → its entry (JSON).
fn ledger(r: &Redis, key: &str) -> Vec<(i64, serde_json::Value)> {
    let raw: Vec<(String, String)> =
        r.query(redis::cmd("HGETALL").arg(format!("cronlock:{{{key}}}:ledger")));
    let mut out: Vec<(i64, serde_json::Value)> = raw
        .into_iter()
        .map(|(k, v)| (k.parse().unwrap(), serde_json::from_str(&v).unwrap()))
        .collect();
    out.sort_by_key(|(k, _)| *k);
    out
}

/// One firing of `key` on the monthly schedule; its job prints its instant and attempt and
/// exits with `status`.
fn fire(r: &Redis, key: &str, extra: &[&str], status: i32) -> std::process::Output {
    run(cronlock(r)
        .args(["--schedule", MONTHLY, "--catch-up", "100d", "-E", "75"])
        .args(extra)
        .args([key, "-c"])
        .arg(format!(
            "echo \"$CRONLOCK_INSTANT $CRONLOCK_ATTEMPT $CRONLOCK_RUN_ID\"; exit {status}"
        )))
}

/// The latest first-of-month midnight UTC at or before now, as the command sees it.
fn latest_instant(r: &Redis) -> (i64, String) {
    let entries = ledger(r, "probe");
    assert!(entries.is_empty());
    let out = fire(r, "probe", &[], 0);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let instant = *ledger(r, "probe")
        .iter()
        .find(|(_, e)| e["state"] == "succeeded")
        .map(|(i, _)| i)
        .unwrap();
    let text = stdout(&out).split(' ').next().unwrap().to_string();
    (instant, text)
}

#[test]
fn missed_instants_run_the_latest_once_and_record_the_rest_as_missed() {
    let r = Redis::start();
    let (instant, text) = latest_instant(&r);
    assert!(text.ends_with("-01T00:00:00Z"), "{text}");
    assert!(instant <= now_ms() && now_ms() - instant <= 31 * 86_400_000);
    // All hosts were down since: the first firing runs the latest instant, once.
    let out = fire(&r, "report", &[], 0);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let said: Vec<String> = stdout(&out).split_whitespace().map(String::from).collect();
    assert_eq!(said[0], text, "CRONLOCK_INSTANT");
    assert_eq!(said[1], "1", "CRONLOCK_ATTEMPT");
    assert_eq!(said[2].len(), 36, "CRONLOCK_RUN_ID is a UUID: {said:?}");
    // Later firings skip, quietly (-E), and print nothing.
    for _ in 0..3 {
        let out = fire(&r, "report", &[], 0);
        assert_eq!(code(&out), 75, "{}", stderr(&out));
        assert_eq!(stdout(&out), "");
        assert_eq!(stderr(&out), "");
    }
    // The instants before it inside the 100 days (at least two): missed, never run.
    let entries = ledger(&r, "report");
    let (last, older) = entries.split_last().unwrap();
    assert_eq!(last.0, instant);
    assert_eq!(last.1["state"], "succeeded");
    assert_eq!(last.1["attempts"].as_array().unwrap().len(), 1);
    assert_eq!(last.1["attempts"][0]["exit"], 0);
    assert_eq!(last.1["attempts"][0]["run_id"], said[2].as_str());
    assert!(older.len() >= 2, "{entries:?}");
    for (at, e) in older {
        assert_eq!(e["state"], "missed", "{at}: {e}");
        assert!(now_ms() - at <= 100 * 86_400_000);
    }
}

#[test]
fn a_failing_command_gets_exactly_its_retries_never_two_at_once() {
    let r = Redis::start();
    let mut attempts = Vec::new();
    for _ in 0..6 {
        let out = fire(&r, "flaky", &["--retries", "2"], 1);
        match code(&out) {
            1 => attempts.push(stdout(&out).split(' ').nth(1).unwrap().to_string()),
            75 => {}
            other => panic!("status {other}: {}", stderr(&out)),
        }
    }
    assert_eq!(attempts, ["1", "2", "3"]);
    let entries = ledger(&r, "flaky");
    let (_, e) = entries.last().unwrap();
    assert_eq!(e["state"], "failed");
    let tries = e["attempts"].as_array().unwrap();
    assert_eq!(tries.len(), 3);
    // One after the other: each ended before the next started.
    for pair in tries.windows(2) {
        assert!(pair[0]["ended"].as_i64().unwrap() <= pair[1]["started"].as_i64().unwrap());
    }
    // A success ends the retries: the next instant's story, not this one's.
    let out = fire(&r, "flaky", &["--retries", "2"], 0);
    assert_eq!(code(&out), 75, "{}", stderr(&out));
}

/// The holder dies with its guard and its command (a power cut): after the lock's TTL the next
/// firing runs attempt 2 with `--retries 1`; with `--retries 0` nobody runs it again.
#[test]
fn an_abandoned_run_is_retried_only_with_retries() {
    let r = Redis::start();
    for (key, retries, expect) in [("dies", "1", Some("2")), ("dies0", "0", None)] {
        let dir = scratch(key);
        let pids = dir.join("pids");
        let mut holder = cronlock(&r)
            .args(["--schedule", MONTHLY, "--catch-up", "100d", "--ttl", "2s"])
            .args(["--retries", retries, key, "-c"])
            .arg(format!("echo $$ $PPID > {}; sleep 60", pids.display()))
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        assert!(wait_for(Duration::from_secs(10), || {
            std::fs::read_to_string(&pids).is_ok_and(|t| t.ends_with('\n'))
        }));
        let text = std::fs::read_to_string(&pids).unwrap();
        let ids: Vec<i32> = text
            .split_whitespace()
            .map(|p| p.parse().unwrap())
            .collect();
        // cronlock, then its guard, then the command: nothing is left to release the lock.
        signal(holder.id() as i32, libc::SIGKILL);
        signal(ids[1], libc::SIGKILL);
        signal(ids[0], libc::SIGKILL);
        holder.wait().unwrap();
        let lock = format!("cronlock:{{{key}}}");
        assert!(wait_for(Duration::from_secs(10), || !r.exists(&lock)));
        let out = fire(&r, key, &["--retries", retries], 0);
        match expect {
            Some(attempt) => {
                assert_eq!(code(&out), 0, "{}", stderr(&out));
                assert_eq!(stdout(&out).split(' ').nth(1), Some(attempt));
                let (_, e) = ledger(&r, key).pop().unwrap();
                assert_eq!(e["state"], "succeeded");
                assert_eq!(e["attempts"][0]["state"], "abandoned");
            }
            None => {
                assert_eq!(code(&out), 75, "{}", stderr(&out));
                let (_, e) = ledger(&r, key).pop().unwrap();
                assert_eq!(e["state"], "abandoned");
            }
        }
    }
}

#[test]
fn bad_catch_up_and_retries_are_one_line_naming_the_option() {
    let r = Redis::start();
    let cases: [(&[&str], &str); 6] = [
        (&["--catch-up", "1h"], "--catch-up"),
        (&["--schedule", MONTHLY, "--retries", "1"], "--retries"),
        (
            &["--schedule", MONTHLY, "--catch-up", "500ms"],
            "--catch-up",
        ),
        (
            &["--schedule", MONTHLY, "--catch-up", "11years"],
            "--catch-up",
        ),
        (
            &["--schedule", MONTHLY, "--catch-up", "1h", "--retries", "-1"],
            "--retries",
        ),
        (
            &["--schedule", MONTHLY, "--catch-up", "1h", "--retries", "x"],
            "--retries",
        ),
    ];
    for (args, named) in cases {
        let out = run(cronlock(&r)
            .args(args)
            .args(["bad", "--", "touch", "/nonexistent-ran"]));
        assert_eq!(code(&out), 125, "{args:?}: {}", stderr(&out));
        let line = one_line(&out);
        assert!(line.contains(named), "{args:?}: {line}");
        assert!(!r.exists("cronlock:{bad}"), "{args:?} left a lock");
    }
    // The variables are named too.
    let out = run(cronlock(&r)
        .env("CRONLOCK_CATCH_UP", "1h")
        .args(["bad", "--", "true"]));
    assert_eq!(code(&out), 125);
    assert!(
        one_line(&out).contains("CRONLOCK_CATCH_UP"),
        "{}",
        one_line(&out)
    );
}

/// A ledger entry cronlock did not write: 125 naming the key, nothing written.
#[test]
fn a_ledger_entry_of_the_wrong_shape_is_refused_and_nothing_is_written() {
    let r = Redis::start();
    let (instant, _) = latest_instant(&r);
    r.query::<()>(
        redis::cmd("HSET")
            .arg("cronlock:{odd}:ledger")
            .arg(instant.to_string())
            .arg("not json"),
    );
    let out = fire(&r, "odd", &[], 0);
    assert_eq!(code(&out), 125, "{}", stderr(&out));
    assert!(
        one_line(&out).contains("cronlock:{odd}:ledger"),
        "{}",
        one_line(&out)
    );
    assert_eq!(stdout(&out), "");
    assert!(!r.exists("cronlock:{odd}"));
    assert!(!r.exists("cronlock:{odd}:fence"));
}
