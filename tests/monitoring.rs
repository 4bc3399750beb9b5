//! The shipped alerting rules (`examples/monitoring/cronlock.rules.yml`) pass `promtool test rules`
//! on series taken from metrics files that cronlock itself wrote here: a run that succeeded, one
//! that lost its lock, a retry in progress, a suspended KEY. promtool comes with Debian's
//! `prometheus` package (scripts/test.sh installs it); without it this test fails, never skips.
mod common;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::story::MONTHLY;
use common::*;

const RULES: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/examples/monitoring/cronlock.rules.yml"
);

/// The samples of a metrics file: `name{labels}` → value.
fn samples(text: &str) -> Vec<(String, String, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').unwrap();
            let name = series.split('{').next().unwrap().to_string();
            (name, series.to_string(), value.parse().unwrap())
        })
        .collect()
}

fn prom(dir: &Path, key: &str) -> String {
    std::fs::read_to_string(dir.join(format!("cronlock_{key}.prom"))).unwrap()
}

fn promtool(args: &[&str]) -> std::process::Output {
    Command::new("promtool").args(args).output().expect(
        "promtool is required (Debian: apt-get install prometheus; scripts/test.sh installs it)",
    )
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

    // A retry in progress: attempt 1 failed, attempt 2 is running when the file is read.
    let fire = |script: &str| {
        cronlock(&r)
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
    files.push(running);

    // A suspended KEY: the firing skips and says so.
    let out = run(cronlock(&r).args(["--suspend", "--reason", "test", "paused-job"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let out = run(cronlock(&r).args(["--metrics-dir", m, "paused-job", "--", "true"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    files.push(prom(&metrics, "paused-job"));

    // The series, with every timestamp rebased so that the test's start is promtool's time 60 s.
    let all: Vec<(String, String, f64)> = files.iter().flat_map(|f| samples(f)).collect();
    let base = all
        .iter()
        .filter(|(n, _, _)| n.ends_with("_timestamp_seconds"))
        .map(|(_, _, v)| *v)
        .fold(f64::MAX, f64::min)
        .floor()
        - 60.0;
    let host = all[0]
        .1
        .split("host=\"")
        .nth(1)
        .unwrap()
        .split('"')
        .next()
        .unwrap()
        .to_string();
    let mut test = String::new();
    writeln!(
        test,
        "rule_files:\n  - {RULES}\nevaluation_interval: 1m\ntests:"
    )
    .unwrap();
    writeln!(test, "  - interval: 1m\n    input_series:").unwrap();
    for (name, series, value) in &all {
        let v = if name.ends_with("_timestamp_seconds") {
            value - base
        } else {
            *value
        };
        // Constant for 1,700 minutes (over 28 hours).
        writeln!(
            test,
            "      - series: '{series}'\n        values: '{v}+0x1700'"
        )
        .unwrap();
    }
    // What each alert should say 10 minutes and 27 hours after the runs: its labels and its
    // annotations, templates filled in.
    let no_success = (
        "key: ok-job, severity: page".to_string(),
        "summary: 'ok-job has not succeeded on any host for 26h', description: 'cronlock \
         --status --history ok-job shows its recent instants and attempts.'"
            .to_string(),
    );
    let lost = (
        format!("key: lost-job, host: {host}, severity: warning"),
        format!("summary: 'lost-job lost its lock on {host}; the command was stopped'"),
    );
    let retry = (
        format!("key: retry-job, host: {host}, severity: info"),
        format!("summary: 'retry-job is running a retry on {host}'"),
    );
    let suspended = (
        "key: paused-job, severity: warning".to_string(),
        "summary: 'paused-job has been suspended for more than a day', description: 'cronlock \
         --status paused-job says who suspended it and why; cronlock --resume paused-job ends \
         it.'"
            .to_string(),
    );
    let alerts: BTreeMap<&str, [Vec<(String, String)>; 2]> = BTreeMap::from([
        ("CronlockNoRecentSuccess", [vec![], vec![no_success]]),
        ("CronlockLockLost", [vec![lost.clone()], vec![lost]]),
        (
            "CronlockRetryInProgress",
            [vec![retry.clone()], vec![retry]],
        ),
        ("CronlockSuspendedTooLong", [vec![], vec![suspended]]),
    ]);
    writeln!(test, "    alert_rule_test:").unwrap();
    for (name, at) in &alerts {
        for (eval, expected) in ["10m", "27h"].iter().zip(at) {
            writeln!(
                test,
                "      - eval_time: {eval}\n        alertname: {name}\n        exp_alerts:"
            )
            .unwrap();
            if expected.is_empty() {
                // promtool's way to say "none": an empty list.
                test.truncate(test.len() - 1);
                writeln!(test, " []").unwrap();
            }
            for (labels, annotations) in expected {
                writeln!(
                    test,
                    "          - exp_labels: {{ {labels} }}\n            exp_annotations: {{ {annotations} }}"
                )
                .unwrap();
            }
        }
    }
    let file = dir.join("cronlock.rules.test.yml");
    std::fs::write(&file, &test).unwrap();
    let out = promtool(&["test", "rules", file.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}{}\n--- {}:\n{test}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        file.display()
    );
}
