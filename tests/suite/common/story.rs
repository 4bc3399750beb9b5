//! The catch-up story told the same way on every topology (one server, Sentinel, Cluster): missed
//! instants, retries of a failing command, a holder that dies, suspend and resume. Everything is
//! read back through cronlock itself (`--status --json`), so the story needs only a URL.
//!
//! The schedule is monthly (6 fields, seconds first, in UTC), so the instants inside a window are
//! fixed whatever the moment the test runs, and "all hosts were down" needs no waiting: no host
//! fired since the instants passed. Suspend and resume use a schedule of seconds.

use std::process::{Output, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::*;

/// Midnight UTC on the first of every month.
pub const MONTHLY: &str = "CRON_TZ=UTC 0 0 0 1 * *";

pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// `--status --json KEY` at `url`.
pub fn status(url: &str, key: &str) -> serde_json::Value {
    let out = run(cronlock_at(url).args(["--status", "--json", key]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    serde_json::from_str(&stdout(&out)).unwrap()
}

/// KEY's ledger, oldest first: (instant in Unix ms, entry).
pub fn ledger(url: &str, key: &str) -> Vec<(i64, serde_json::Value)> {
    let mut out: Vec<(i64, serde_json::Value)> = status(url, key)["ledger"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["instant"].as_i64().unwrap(), e.clone()))
        .collect();
    out.sort_by_key(|(k, _)| *k);
    out
}

/// One firing of KEY on the monthly schedule (window 100 days, -E 75); its job prints its
/// instant, attempt and run id, and exits with `status`.
pub fn fire(url: &str, key: &str, extra: &[&str], status: i32) -> Output {
    run(cronlock_at(url)
        .args(["--schedule", MONTHLY, "--catch-up", "100d", "-E", "75"])
        .args(extra)
        .args([key, "-c"])
        .arg(format!(
            "echo \"$CRONLOCK_INSTANT $CRONLOCK_ATTEMPT $CRONLOCK_RUN_ID\"; exit {status}"
        )))
}

/// All hosts were down across the latest instants: the first firing runs the latest one, once,
/// with `CRONLOCK_INSTANT` equal to it; later firings skip quietly; the older ones inside the
/// window are recorded missed.
pub fn missed(url: &str, key: &str) {
    let out = fire(url, key, &[], 0);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let said: Vec<String> = stdout(&out).split_whitespace().map(String::from).collect();
    assert!(said[0].ends_with("-01T00:00:00Z"), "{said:?}");
    assert_eq!(said[1], "1", "CRONLOCK_ATTEMPT");
    assert_eq!(said[2].len(), 36, "CRONLOCK_RUN_ID is a UUID: {said:?}");
    for _ in 0..3 {
        let out = fire(url, key, &[], 0);
        assert_eq!(code(&out), 75, "{}", stderr(&out));
        assert_eq!(stdout(&out), "");
        assert_eq!(stderr(&out), "");
    }
    let entries = ledger(url, key);
    let (last, older) = entries.split_last().unwrap();
    assert_eq!(last.1["instant_time"], said[0].as_str(), "CRONLOCK_INSTANT");
    assert!(last.0 <= now_ms() && now_ms() - last.0 <= 31 * 86_400_000);
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

/// A command that exits 1 with `--retries 2`: exactly 3 attempts, one after the other.
pub fn retries(url: &str, key: &str) {
    let mut attempts = Vec::new();
    for _ in 0..6 {
        let out = fire(url, key, &["--retries", "2"], 1);
        match code(&out) {
            1 => attempts.push(stdout(&out).split(' ').nth(1).unwrap().to_string()),
            75 => {}
            other => panic!("status {other}: {}", stderr(&out)),
        }
    }
    assert_eq!(attempts, ["1", "2", "3"]);
    let entries = ledger(url, key);
    let (_, e) = entries.last().unwrap();
    assert_eq!(e["state"], "failed");
    let tries = e["attempts"].as_array().unwrap();
    assert_eq!(tries.len(), 3);
    for pair in tries.windows(2) {
        assert!(pair[0]["ended"].as_i64().unwrap() <= pair[1]["started"].as_i64().unwrap());
    }
    let out = fire(url, key, &["--retries", "2"], 0);
    assert_eq!(code(&out), 75, "{}", stderr(&out));
}

/// The holder dies with its guard and its command (a power cut): after the lock's TTL, and the
/// 2 s its holder has to report, a firing runs attempt 2 with `--retries 1`; with `--retries 0`
/// nobody runs it again.
pub fn abandoned(url: &str, key: &str, retries: u32) {
    let dir = scratch(key);
    let pids = dir.join("pids");
    let mut holder = cronlock_at(url)
        .args(["--schedule", MONTHLY, "--catch-up", "100d", "--ttl", "2s"])
        .args(["--retries", &retries.to_string(), key, "-c"])
        .arg(format!("echo $$ $PPID > {}; exec sleep 60", pids.display()))
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
    assert!(wait_for(Duration::from_secs(10), || status(url, key)
        ["held"]
        == false));
    let mut out = fire(url, key, &["--retries", &retries.to_string()], 0);
    // With --retries, the attempt judged abandoned reads held for 2 s more (its holder may still
    // write its end: Redis may have been what kept it from it), then runs again.
    if retries > 0 {
        assert!(wait_for(Duration::from_secs(5), || {
            out = fire(url, key, &["--retries", &retries.to_string()], 0);
            code(&out) != 75
        }));
    }
    let (_, e) = ledger(url, key).pop().unwrap();
    if retries > 0 {
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        assert_eq!(stdout(&out).split(' ').nth(1), Some("2"));
        assert_eq!(e["state"], "succeeded");
        assert_eq!(e["attempts"][0]["state"], "abandoned");
    } else {
        assert_eq!(code(&out), 75, "{}", stderr(&out));
        assert_eq!(e["state"], "abandoned");
    }
}

/// Every 2 seconds, with a window of a minute.
const EVERY_2S: &str = "*/2 * * * * *";

fn fire_often(url: &str, key: &str, extra: &[&str]) -> Output {
    run(cronlock_at(url)
        .args(["--schedule", EVERY_2S, "-E", "75"])
        .args(extra)
        .args([key, "-c", "echo $CRONLOCK_INSTANT"]))
}

/// Suspend: a running command goes on; every firing skips with -E (saying who, when, why under
/// -v) and its instant is recorded skipped; `--status`, `--list` and `--check` say so; after
/// resume, the instants that passed meanwhile are not caught up, and the next one runs.
pub fn suspend(url: &str, key: &str) {
    let dir = scratch(key);
    let done = dir.join("done");
    // A run in progress when the suspension comes: it is not stopped.
    let mut running = cronlock_at(url)
        .args([key, "-c"])
        .arg(format!(
            "while [ ! -e {0}.go ]; do sleep 0.01; done; touch {0}",
            done.display()
        ))
        .spawn()
        .unwrap();
    assert!(wait_for(Duration::from_secs(10), || status(url, key)
        ["held"]
        == true));
    let out = run(cronlock_at(url).args(["--suspend", "--reason", "db move", key]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(stdout(&out).contains("is suspended by"), "{}", stdout(&out));
    std::fs::write(format!("{}.go", done.display()), "").unwrap();
    assert!(running.wait().unwrap().success());
    assert!(done.exists(), "the running command was stopped");

    let suspended_at = now_ms();
    // Firings skip, with -E, quietly; -v says who, when and why.
    for extra in [&["--catch-up", "1m"][..], &[], &["-v", "--catch-up", "1m"]] {
        let out = fire_often(url, key, extra);
        assert_eq!(code(&out), 75, "{extra:?}: {}", stderr(&out));
        assert_eq!(stdout(&out), "");
        if extra.contains(&"-v") {
            let err = stderr(&out);
            assert!(
                err.contains("is suspended by") && err.contains("db move"),
                "{err}"
            );
        } else {
            assert_eq!(stderr(&out), "");
        }
    }
    // Not even a plain run, nor a waiting one.
    let out = run(cronlock_at(url).args(["-E", "75", "--wait", "5s", key, "--", "true"]));
    assert_eq!(code(&out), 75, "{}", stderr(&out));
    says_suspended(url, key);

    // Let an instant pass while suspended, unfired: it is skipped, not caught up.
    assert!(wait_for(Duration::from_secs(5), || now_ms()
        > suspended_at / 2000 * 2000 + 2100));
    let out = run(cronlock_at(url).args(["--resume", key]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(stdout(&out).contains("resumed"), "{}", stdout(&out));
    let resumed_at = now_ms();
    assert_eq!(
        run(cronlock_at(url).args(["--check", key])).status.code(),
        Some(0)
    );
    // The next instant runs; none before it does.
    let mut ran = None;
    assert!(wait_for(Duration::from_secs(10), || {
        let out = fire_often(url, key, &["--catch-up", "1m"]);
        match code(&out) {
            0 => {
                ran = Some(stdout(&out).trim().to_string());
                true
            }
            75 => false,
            other => panic!("status {other}: {}", stderr(&out)),
        }
    }));
    let ran = ran.unwrap();
    let instant = ledger(url, key)
        .into_iter()
        .find(|(_, e)| e["instant_time"] == ran.as_str())
        .unwrap();
    // An early host may run an instant up to 5 s ahead: never one before the resume.
    assert!(
        instant.0 > resumed_at - 100,
        "{ran} ran, resumed at {resumed_at}"
    );
    assert_eq!(instant.1["state"], "succeeded");
}

/// `--status` (JSON and text), `--check` and `--list` (text and JSON) say KEY is suspended for
/// "db move", and the ledger has a skipped instant.
fn says_suspended(url: &str, key: &str) {
    let s = status(url, key);
    assert_eq!(s["suspended"]["reason"], "db move", "{s}");
    assert!(s["ledger"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["state"] == "skipped"));
    let text = run(cronlock_at(url).args(["--status", key]));
    assert!(stdout(&text).contains("suspended:"), "{}", stdout(&text));
    let check = run(cronlock_at(url).args(["--check", key]));
    assert_eq!(code(&check), 1, "{}", stdout(&check));
    assert!(stdout(&check).contains("WARNING"), "{}", stdout(&check));
    assert!(stdout(&check).contains("suspended"), "{}", stdout(&check));
    let list = run(cronlock_at(url).args(["--list"]));
    assert!(
        stdout(&list)
            .lines()
            .any(|l| l.starts_with(&format!("{key}\t")) && l.contains("suspended")),
        "{}",
        stdout(&list)
    );
    let list = run(cronlock_at(url).args(["--list", "--json"]));
    let rows: serde_json::Value = serde_json::from_str(&stdout(&list)).unwrap();
    assert!(rows
        .as_array()
        .unwrap()
        .iter()
        .any(|r| r["key"] == key && r["suspended"]["reason"] == "db move"));
}
