//! Running a fleet: --min-hold, the --wait handoff, --status/--list/--force-release, run history,
//! JSON logs.

use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::common::*;
use serde_json::Value;

const LOCK: &str = "cronlock:{k}";

#[test]
fn min_hold_shorter_than_the_job_releases_at_once() {
    let r = Redis::start();
    let out = run(cronlock(&r).args(["--min-hold", "200ms", "k", "sleep", "0.5"]));
    assert_eq!(code(&out), 0);
    assert!(
        !r.exists(LOCK),
        "a job longer than --min-hold releases on finish"
    );
}

#[test]
fn twenty_waiters_each_run_once_without_overlap() {
    let r = Redis::start();
    let dir = scratch("waiters");
    let log = dir.join("log");
    let body = format!(
        "echo start >> {l}; sleep 0.02; echo end >> {l}",
        l = log.display()
    );
    let children: Vec<_> = (0..20)
        .map(|_| {
            cronlock(&r)
                .args(["-w", "30s", "k", "-c", &body])
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for c in children {
        let (status, err) = {
            let out = c.wait_with_output().unwrap();
            (code(&out), stderr(&out))
        };
        assert_eq!(status, 0, "{err}");
    }
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 40, "each waiter runs exactly once: {text}");
    for pair in lines.chunks(2) {
        assert_eq!(
            pair,
            ["start", "end"],
            "critical sections overlapped: {text}"
        );
    }
    // Every run took a larger token than the one before (history: newest first).
    let hist = history(&r);
    let tokens: Vec<i64> = hist
        .iter()
        .map(|h| {
            serde_json::from_str::<Value>(h).unwrap()["fencing_token"]
                .as_i64()
                .unwrap()
        })
        .collect();
    assert_eq!(tokens.len(), 10);
    assert!(tokens.windows(2).all(|w| w[0] > w[1]), "{tokens:?}");
}

/// `--list` (text and JSON) shows KEY `k` and a lock made by hand, `other`.
fn lists_k_and_a_hand_made_lock(r: &Redis) {
    r.set("cronlock:{other}", "hand-made");
    let out = run(cronlock(r).args(["--list"]));
    let text = stdout(&out);
    assert_eq!(text.lines().count(), 2, "{text}");
    assert!(text.lines().any(|l| l.starts_with("k\t")), "{text}");
    assert!(text.lines().any(|l| l.starts_with("other\t")), "{text}");
    let out = run(cronlock(r).args(["--list", "--json"]));
    let v: Value = serde_json::from_str(&stdout(&out)).unwrap();
    let keys: Vec<&str> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["k", "other"]);
}

#[test]
fn status_list_and_force_release() {
    let r = Redis::start();
    // Free, nothing recorded.
    let out = run(cronlock(&r).args(["--status", "k"]));
    assert_eq!(code(&out), 0);
    assert!(
        stdout(&out).contains("lock 'k' is free"),
        "{}",
        stdout(&out)
    );
    assert!(stdout(&out).contains("none recorded"));

    // A finished run is recorded.
    run(cronlock(&r).args(["k", "sh", "-c", "exit 4"]));
    let out = run(cronlock(&r).args(["--status", "--json", "k"]));
    let v: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v["held"], false);
    assert_eq!(v["last_run"]["exit_status"], 4);
    assert_eq!(v["last_run"]["ended"], "exited");
    assert_eq!(v["last_run"]["fencing_token"], fence(&r));
    assert_eq!(v["last_run"]["command"], "sh -c 'exit 4'");
    assert!(v["last_run"]["host"].is_string());
    assert!(v["last_run"]["duration_ms"].is_u64());

    // Held: status and list show the holder.
    let dir = scratch("status");
    let holder = cronlock(&r)
        .args(["--ttl", "1s", "k", "-c"])
        .arg(format!("echo $$ > {}/pid; sleep 30", dir.display()))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    read_pid(&dir.join("pid"));
    let out = run(cronlock(&r).args(["--status", "k"]));
    let text = stdout(&out);
    assert!(text.contains("lock 'k' is held"), "{text}");
    assert!(
        text.contains(&format!("pid:           {}", holder.id())),
        "{text}"
    );
    assert!(
        text.contains(&format!("fencing token: {}", fence(&r))),
        "{text}"
    );
    assert!(text.contains("exited with status 4"), "{text}");
    let out = run(cronlock(&r).args(["--status", "--json", "k"]));
    let v: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v["held"], true);
    assert_eq!(v["holder"]["pid"], holder.id());
    assert_eq!(v["fencing_token"], fence(&r));
    assert!(v["ttl_ms"].as_i64().unwrap() > 0);

    lists_k_and_a_hand_made_lock(&r);

    // Force-release: prints who held it; the holder's watchdog stops its command (122).
    let out = run(cronlock(&r).args(["--force-release", "k"]));
    assert_eq!(code(&out), 0);
    assert!(
        stdout(&out).contains(&format!("pid {}", holder.id())),
        "{}",
        stdout(&out)
    );
    let out = holder.wait_with_output().unwrap();
    assert_eq!(code(&out), 122, "{}", stderr(&out));
    let out = run(cronlock(&r).args(["--status", "--json", "k"]));
    let v: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v["last_run"]["ended"], "lost");
    assert_eq!(v["last_run"]["exit_status"], 122);
    let out = run(cronlock(&r).args(["--force-release", "--json", "k"]));
    let v: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v["released"], false);
}

#[test]
fn history_is_capped_and_can_expire() {
    let r = Redis::start();
    for _ in 0..5 {
        run(cronlock(&r).args(["--history", "3", "k", "true"]));
    }
    let hist = history(&r);
    assert_eq!(hist.len(), 3);
    let newest: Value = serde_json::from_str(&hist[0]).unwrap();
    assert_eq!(newest["fencing_token"], fence(&r));
    run(cronlock(&r).args(["--history-ttl", "1h", "k", "true"]));
    let ttl = r.pttl("cronlock:{k}:last");
    assert!(ttl > 3_500_000 && ttl <= 3_600_000, "{ttl}");
}

#[test]
fn json_logs_are_one_object_per_line() {
    let r = Redis::start();
    let out = run(cronlock(&r).args(["--log-format", "json", "k", "sh", "-c", "exit 2"]));
    assert_eq!(code(&out), 2);
    let err = stderr(&out);
    let events: Vec<Value> = err
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let names: Vec<&str> = events
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["acquired", "containment", "finished", "released"]);
    let finished = &events[2];
    assert_eq!(finished["exit_status"], 2);
    assert_eq!(finished["key"], "k");
    assert_eq!(finished["fencing_token"], fence(&r));
    assert!(finished["token"].is_string() && finished["host"].is_string());
    assert!(finished["duration_ms"].is_u64() && finished["pid"].is_u64());

    // Busy and errors are JSON too.
    r.set(LOCK, "x");
    let out = run(cronlock(&r)
        .env("CRONLOCK_LOG_FORMAT", "json")
        .args(["k", "true"]));
    let v: Value = serde_json::from_str(stderr(&out).trim()).unwrap();
    assert_eq!(v["event"], "busy");
    let out = run(cronlock(&r)
        .env("CRONLOCK_LOG_FORMAT", "json")
        .args(["--ttl", "abc", "k", "true"]));
    assert_eq!(code(&out), 125);
    let v: Value = serde_json::from_str(stderr(&out).trim()).unwrap();
    assert_eq!(v["level"], "error");
}

/// The KEY `k`'s fencing counter: the last token handed out.
fn fence(r: &Redis) -> i64 {
    r.get("cronlock:{k}:fence").unwrap().parse().unwrap()
}

/// The KEY `k`'s kept run records, newest first.
fn history(r: &Redis) -> Vec<String> {
    r.query(
        redis::cmd("LRANGE")
            .arg("cronlock:{k}:history")
            .arg(0)
            .arg(-1),
    )
}

mod alone {
    //! The fleet tests that measure time: each takes the cores for itself while it measures
    //! (`common::alone`), and `scripts/test.sh` runs them after the others.

    use super::*;

    #[test]
    fn min_hold_keeps_a_short_job_locked_from_start() {
        let _alone = measure_alone();
        let r = Redis::start();
        let start = Instant::now();
        let out = run(cronlock(&r).args(["--min-hold", "2s", "k", "sleep", "0.1"]));
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        assert!(r.exists(LOCK), "the lock must outlive a 100ms job");
        let pttl = r.pttl(LOCK);
        assert!(pttl > 1500 && pttl <= 2000, "PTTL {pttl}");
        // A lagging host firing the same slot skips.
        let dir = scratch("minhold");
        let marker = dir.join("ran");
        let out = run(cronlock(&r).args(["-E", "75", "k", "touch"]).arg(&marker));
        assert_eq!(code(&out), 75);
        assert!(!marker.exists());
        assert!(wait_for(Duration::from_secs(4), || !r.exists(LOCK)));
        let gone = start.elapsed();
        assert!(
            gone >= Duration::from_millis(1900),
            "released after {gone:?}"
        );
        assert!(
            gone < Duration::from_millis(3000),
            "released after {gone:?}"
        );
    }

    /// A waiter is woken by the release, not by its fallback polling (which waits 250-500ms).
    #[test]
    fn release_wakes_a_waiter_at_once() {
        let _alone = measure_alone();
        let r = Redis::start();
        let dir = scratch("handoff");
        let mut gaps = Vec::new();
        for i in 0..3 {
            let ended = dir.join(format!("ended{i}"));
            let began = dir.join(format!("began{i}"));
            let holder = cronlock(&r)
                .args(["k", "-c", &format!("sleep 0.3; touch {}", ended.display())])
                .spawn()
                .unwrap();
            assert!(wait_for(Duration::from_secs(5), || r.exists(LOCK)));
            let waiter = cronlock(&r)
                .args(["-w", "10s", "k", "touch"])
                .arg(&began)
                .spawn()
                .unwrap();
            assert!(wait_for(Duration::from_secs(5), || ended.exists()));
            let t_end = Instant::now();
            assert!(wait_for(Duration::from_secs(5), || began.exists()));
            gaps.push(t_end.elapsed());
            for c in [holder, waiter] {
                assert_eq!(c.wait_with_output().unwrap().status.code(), Some(0));
            }
        }
        gaps.sort();
        assert!(
            gaps[1] < Duration::from_millis(150),
            "handoff took {gaps:?}"
        );
    }
}
