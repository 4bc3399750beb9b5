//! What the replica reports for runs it did not start: instants missed, suspended jobs.

use super::*;

/// An instant no replica has room to start before its next one is recorded missed: one line, the
/// ledger (`--status`) and the job's metrics file say so.
#[test]
fn an_instant_without_room_is_recorded_missed() {
    let r = Redis::start();
    let dir = scratch("missed");
    let metrics = dir.join("metrics");
    std::fs::create_dir(&metrics).unwrap();
    let file = crontab(
        &dir,
        &format!(
            "* * * * * * hog sleep 30\n\
             * * * * * * --metrics-dir {} starved true\n",
            metrics.display()
        ),
    );
    let c = replica(&r.url(), &file, &["--max-jobs", "1", "--drain", "100ms"]);
    assert!(
        wait_for(Duration::from_secs(15), || replica_err(&file)
            .contains("recorded missed")),
        "{}",
        replica_err(&file)
    );
    let _ = stop(c);
    let err = replica_err(&file);
    let line = err
        .lines()
        .find(|l| l.contains("recorded missed"))
        .unwrap()
        .to_string();
    assert!(line.starts_with("cronlock: "), "{line}");
    let key = if line.contains("starved:") {
        "starved"
    } else {
        "hog"
    };
    let s = run(cronlock_at(&r.url()).args(["--status", "--json", key]));
    let v: serde_json::Value = serde_json::from_str(&stdout(&s)).unwrap();
    assert!(
        v["ledger"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["state"] == "missed"),
        "{v}"
    );
    if key == "starved" {
        let text: String = std::fs::read_dir(&metrics)
            .unwrap()
            .flatten()
            .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default())
            .collect();
        assert!(text.contains(r#"outcome="missed"} 1"#), "{text}");
    }
}

/// What a losing claim used to tell through its run's metrics file, the replica tells now: a
/// suspended KEY's job shows `cronlock_suspended 1` (the shipped alert's series), and nothing runs.
#[test]
fn a_suspended_jobs_metrics_come_from_the_replica() {
    let r = Redis::start();
    let dir = scratch("suspended");
    let metrics = dir.join("metrics");
    std::fs::create_dir(&metrics).unwrap();
    let ran = dir.join("ran");
    let out = run(cronlock_at(&r.url()).args(["--suspend", "--reason", "test", "held"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let file = crontab(
        &dir,
        &format!(
            "* * * * * * --metrics-dir {} held touch {}\n",
            metrics.display(),
            ran.display()
        ),
    );
    let c = replica(&r.url(), &file, &[]);
    let text = || -> String {
        std::fs::read_dir(&metrics)
            .unwrap()
            .flatten()
            .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default())
            .collect()
    };
    assert!(
        wait_for(Duration::from_secs(10), || text().lines().any(|l| l
            .starts_with("cronlock_suspended{")
            && l.ends_with(" 1"))),
        "{}\n{}",
        text(),
        replica_err(&file)
    );
    assert_eq!(stop(c), Some(0));
    assert!(!ran.exists(), "a suspended job ran");
}
