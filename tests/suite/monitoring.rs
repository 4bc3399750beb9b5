//! The shipped alerting rules (`examples/monitoring/cronlock.rules.yml`) pass `promtool test rules`
//! on series taken from metrics files that cronlock itself wrote here: a run that succeeded, one
//! that lost its lock, a retry in progress, a suspended KEY. promtool comes with Debian's
//! `prometheus` package (scripts/test.sh installs it); without it this test fails, never skips.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use crate::common::prom::{self, promtool, samples, RULES};
use crate::common::story::MONTHLY;
use crate::common::*;

fn prom(dir: &Path, key: &str) -> String {
    std::fs::read_to_string(dir.join(format!("cronlock_{key}.prom"))).unwrap()
}

#[test]
fn the_shipped_rules_pass_promtool_on_series_cronlock_wrote() {
    let out = promtool(&["check", "rules", RULES]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );

    let r = Redis::start();
    let dir = scratch("monitoring");
    let metrics = dir.join("metrics");
    std::fs::create_dir(&metrics).unwrap();
    let m = metrics.to_str().unwrap();
    let mut files: Vec<String> = Vec::new();

    // A run that succeeded.
    let out = run(cronlock(&r).args(["--metrics-dir", m, "ok-job", "--", "true"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    files.push(prom(&metrics, "ok-job"));

    // A run that lost its lock (--force-release): stopped, 122.
    let started = dir.join("started");
    let mut lost = cronlock(&r)
        .args(["--metrics-dir", m, "lost-job", "-c"])
        .arg(format!("touch {}; exec sleep 60", started.display()))
        .spawn()
        .unwrap();
    assert!(wait_for(Duration::from_secs(10), || started.exists()));
    let out = run(cronlock(&r).args(["--force-release", "lost-job"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(lost.wait().unwrap().code(), Some(122));
    files.push(prom(&metrics, "lost-job"));

    files.push(retry_running(&r, &dir, m));

    // A suspended KEY: the firing skips and says so.
    let out = run(cronlock(&r).args(["--suspend", "--reason", "test", "paused-job"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let out = run(cronlock(&r).args(["--metrics-dir", m, "paused-job", "--", "true"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    files.push(prom(&metrics, "paused-job"));

    // A replica's /metrics, from its first scrape: an hourly job that succeeded (caught up at
    // start) and one that never did, each with its last success, period and serving time.
    all_fleet(&r, &dir, &mut files);

    // The series, with every timestamp rebased so that the test's start is promtool's time 60 s.
    let all: Vec<(String, String, f64)> = files.iter().flat_map(|f| samples(f)).collect();
    let host = all[0]
        .1
        .split("host=\"")
        .nth(1)
        .unwrap()
        .split('"')
        .next()
        .unwrap()
        .to_string();
    // What each alert should say 10 minutes and 27 hours after the runs: its labels and its
    // annotations, templates filled in.
    let no_success = prom::no_success("ok-job");
    let lost = (
        format!("key: lost-job, host: {host}, severity: warning"),
        format!("summary: 'lost-job lost its lock on {host}; the command was stopped'"),
    );
    let retry = (
        format!("key: retry-job, host: {host}, severity: info"),
        format!("summary: 'retry-job is running a retry on {host}'"),
    );
    let suspended = prom::suspended("paused-job");
    let alerts: BTreeMap<&str, [Vec<(String, String)>; 2]> = BTreeMap::from([
        ("CronlockNoRecentSuccess", [vec![], vec![no_success]]),
        ("CronlockLockLost", [vec![lost.clone()], vec![lost]]),
        (
            "CronlockRetryInProgress",
            [vec![retry.clone()], vec![retry]],
        ),
        ("CronlockSuspendedTooLong", [vec![], vec![suspended]]),
        (
            "CronlockNoSuccessInTwoPeriods",
            [
                vec![],
                vec![
                    prom::no_success_in_two_periods("fleet-never"),
                    prom::no_success_in_two_periods("fleet-ok"),
                ],
            ],
        ),
    ]);
    prom::rules_test(&dir, &all, &alerts);
}

/// The metrics file of a retry in progress: attempt 1 failed, attempt 2 is running when the file
/// is read (from `dir`'s `metrics` directory, `m`).
fn retry_running(r: &Redis, dir: &Path, m: &str) -> String {
    let metrics = dir.join("metrics");
    let fire = |script: &str| {
        cronlock(r)
            .args([
                "--schedule",
                MONTHLY,
                "--catch-up",
                "100d",
                "--retries",
                "1",
            ])
            .args(["--metrics-dir", m, "retry-job", "-c", script])
            .spawn()
            .unwrap()
    };
    assert_eq!(fire("exit 1").wait().unwrap().code(), Some(1));
    let go = dir.join("go");
    let mut second = fire(&format!(
        "while [ ! -e {} ]; do sleep 0.01; done",
        go.display()
    ));
    let mut running = String::new();
    assert!(wait_for(Duration::from_secs(10), || {
        running = std::fs::read_to_string(metrics.join("cronlock_retry-job.prom")).unwrap();
        samples(&running)
            .iter()
            .any(|(n, _, v)| n == "cronlock_running" && *v == 1.0)
    }));
    std::fs::write(&go, "").unwrap();
    assert_eq!(second.wait().unwrap().code(), Some(0));
    running
}

/// A replica serving two hourly jobs caught up at its start (`fleet-ok` succeeds, `fleet-never`
/// fails): its `/metrics` once both have run, pushed to `files`.
fn all_fleet(r: &Redis, dir: &Path, files: &mut Vec<String>) {
    let file = crate::common::replicas::crontab(
        dir,
        "0 0 * * * * --catch-up 2h fleet-ok true\n0 0 * * * * --catch-up 2h fleet-never false\n",
    );
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let replica = crate::common::replicas::replica(&r.url(), &file, &["--listen", &addr]);
    let mut text = String::new();
    let ran = wait_for(Duration::from_secs(15), || {
        text = crate::listen::get(port, "/metrics").1;
        let ledger = |key: &str, state: &str| {
            text.contains(&format!(
                "cronlock_ledger_instants{{key=\"{key}\",state=\"{state}\"}} 1"
            ))
        };
        ledger("fleet-ok", "succeeded") && ledger("fleet-never", "failed")
    });
    crate::common::replicas::stop(replica);
    assert!(
        ran,
        "{text}\n{}",
        crate::common::replicas::replica_err(&file)
    );
    for want in [
        "cronlock_fleet_last_success_timestamp_seconds{key=\"fleet-never\"} 0",
        "cronlock_schedule_period_seconds{key=\"fleet-ok\"} 3600",
        "cronlock_replica_serving_since_timestamp_seconds{key=\"fleet-never\"}",
    ] {
        assert!(text.contains(want), "no {want}: {text}");
    }
    // Only the fleet's series (the replica's own are about it, not the jobs).
    let keep = [
        "cronlock_fleet_last_success_timestamp_seconds",
        "cronlock_schedule_period_seconds",
        "cronlock_replica_serving_since_timestamp_seconds",
        "cronlock_fleet_suspended",
    ];
    let kept: String = text
        .lines()
        .filter(|l| l.starts_with('#') || keep.iter().any(|k| l.starts_with(&format!("{k}{{"))))
        .map(|l| format!("{l}\n"))
        .collect();
    files.push(kept);
}
