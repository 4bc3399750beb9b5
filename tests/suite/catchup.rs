//! `--catch-up`, `--retries` and `--suspend`: every scheduled instant gets its run. The story
//! (`common/story.rs`) is told here on one server, and in `cluster.rs` and `replicated.rs` on a
//! Cluster and through Sentinel; what is particular to one server (bad input, a ledger of the
//! wrong shape, many hosts at once, the round trips of a firing) is here only. Against a real
//! Redis, with the real binary.

use crate::common::story::{self, fire, ledger, MONTHLY};
use crate::common::*;

/// The latest first-of-month midnight UTC at or before now (Unix ms), as the ledger has it.
fn latest_instant(r: &Redis) -> i64 {
    let out = fire(&r.url(), "probe", &[], 0);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    ledger(&r.url(), "probe")
        .iter()
        .find(|(_, e)| e["state"] == "succeeded")
        .map(|(i, _)| *i)
        .unwrap()
}

#[test]
fn missed_instants_run_the_latest_once_and_record_the_rest_as_missed() {
    story::missed(&Redis::start().url(), "report");
}

#[test]
fn a_failing_command_gets_exactly_its_retries_never_two_at_once() {
    story::retries(&Redis::start().url(), "flaky");
}

#[test]
fn an_abandoned_run_is_retried_only_with_retries() {
    let r = Redis::start();
    story::abandoned(&r.url(), "dies", 1);
    story::abandoned(&r.url(), "dies0", 0);
}

#[test]
fn suspend_skips_every_firing_and_resume_runs_the_next_instant() {
    story::suspend(&Redis::start().url(), "paused");
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
    let instant = latest_instant(&r);
    r.query::<()>(
        redis::cmd("HSET")
            .arg("cronlock:{odd}:ledger")
            .arg(instant.to_string())
            .arg("not json"),
    );
    let out = fire(&r.url(), "odd", &[], 0);
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

/// A first attempt's ledger entry is written and ended as text (without cjson, which costs Redis
/// more than the rest of a claim): whatever the command line holds (quotes, backslashes, a tab,
/// a control character, non-ASCII), the entry is JSON with the run's attempt, ended, and the
/// holder value whole.
#[test]
fn a_ledger_entry_holds_any_command_line() {
    let r = Redis::start();
    let text = "echo \"$CRONLOCK_RUN_ID\"; : 'q\" b\\ t\t c\u{1} \u{e9} \u{2713} /'";
    let out = run(cronlock(&r)
        .args(["--schedule", MONTHLY, "--catch-up", "100d", "-E", "75"])
        .args(["textual", "-c", text]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let run_id = stdout(&out).trim().to_string();
    // The earlier instants inside the window are recorded missed; one ran.
    let raw: Vec<String> = r.query(redis::cmd("HVALS").arg("cronlock:{textual}:ledger"));
    let entries: Vec<serde_json::Value> = raw
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let ran: Vec<&serde_json::Value> = entries.iter().filter(|e| e["state"] != "missed").collect();
    assert_eq!(ran.len(), 1, "{raw:?}");
    let e = ran[0];
    assert_eq!(e["state"], "succeeded", "{e}");
    let holder: serde_json::Value = serde_json::from_str(e["holder"].as_str().unwrap()).unwrap();
    assert_eq!(holder["token"], run_id.as_str(), "{e}");
    // The command line as the shell would read it: the text's single quotes are quoted again.
    let quoted = "q\" b\\ t\t c\u{1} \u{e9} \u{2713} /";
    assert!(holder["command"].as_str().unwrap().contains(quoted), "{e}");
    let attempts = e["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 1, "{e}");
    let a = &attempts[0];
    assert_eq!(a["run_id"], run_id.as_str(), "{e}");
    assert_eq!(
        (&a["state"], &a["exit"]),
        (&"succeeded".into(), &0.into()),
        "{e}"
    );
    assert!(
        a["fence"].as_str().unwrap().parse::<u64>().unwrap() > 0,
        "{e}"
    );
    assert!(
        a["started"].as_i64().unwrap() <= a["ended"].as_i64().unwrap(),
        "{e}"
    );
    assert!(!a["host"].as_str().unwrap().is_empty(), "{e}");
}

/// 200 hosts (processes) fire at once on a due instant: exactly one runs it.
#[test]
fn two_hundred_firings_at_once_run_the_instant_once() {
    let r = Redis::start();
    let dir = scratch("crowd");
    let ran = dir.join("ran");
    let mut crowd: Vec<std::process::Child> = (0..200)
        .map(|_| {
            cronlock(&r)
                .args(["--schedule", MONTHLY, "--catch-up", "100d", "-E", "75"])
                .args(["--retries", "2", "crowd", "-c"])
                .arg(format!(
                    "echo \"$CRONLOCK_INSTANT $CRONLOCK_ATTEMPT\" >> {}; sleep 0.2",
                    ran.display()
                ))
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut codes = std::collections::BTreeMap::new();
    for child in crowd.iter_mut() {
        let status = child.wait().unwrap();
        *codes.entry(status.code()).or_insert(0) += 1;
    }
    assert_eq!(
        codes,
        std::collections::BTreeMap::from([(Some(0), 1), (Some(75), 199)])
    );
    let lines = std::fs::read_to_string(&ran).unwrap();
    assert_eq!(lines.lines().count(), 1, "{lines}");
    assert!(lines.ends_with("-01T00:00:00Z 1\n"), "{lines}");
    let entries = ledger(&r.url(), "crowd");
    let (_, e) = entries.last().unwrap();
    assert_eq!(e["state"], "succeeded");
    assert_eq!(e["attempts"].as_array().unwrap().len(), 1);
}

/// A firing with nothing due is one round trip: one connection, one EVALSHA, nothing else asked.
#[test]
fn a_firing_with_nothing_due_is_one_round_trip() {
    let r = Redis::start();
    let out = fire(&r.url(), "quiet", &[], 0);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    r.query::<()>(redis::cmd("CONFIG").arg("RESETSTAT"));
    let before = r.connections_received();
    let out = fire(&r.url(), "quiet", &[], 0);
    assert_eq!(code(&out), 75, "{}", stderr(&out));
    assert_eq!(stdout(&out), "");
    assert_eq!(stderr(&out), "");
    // The harness's own connection is reused; the firing opened one.
    assert_eq!(r.connections_received() - before, 1);
    let stats: String = r.query(redis::cmd("INFO").arg("commandstats"));
    let calls: std::collections::BTreeMap<String, u64> = stats
        .lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let n = rest
                .strip_prefix("calls=")?
                .split(',')
                .next()?
                .parse()
                .ok()?;
            Some((name.to_string(), n))
        })
        .collect();
    assert_eq!(calls.get("evalsha"), Some(&1), "{calls:?}");
    // Everything else ran inside that script (reads of the lock, the ledger, the suspension and
    // Redis's clock), or was the harness's own (CONFIG RESETSTAT, INFO).
    for (name, n) in &calls {
        assert!(
            [
                "evalsha",
                "exists",
                "get",
                "hget",
                "hmget",
                "time",
                "config|resetstat",
                // Redis 6.2 counts CONFIG RESETSTAT as "config" (subcommands from 7.0).
                "config",
                "info"
            ]
            .contains(&name.as_str()),
            "{name} was called {n} times: {calls:?}"
        );
    }
}

/// The ledger keeps the 64 newest instants: a claim trims it in batches (once it holds more than
/// 80, back to 64), and `--status` shows the 64 newest whatever it holds.
#[test]
fn the_ledger_keeps_the_newest_64_instants() {
    let r = Redis::start();
    let old = |n: i64| 1_580_000_000_000 + n * 1000;
    let fill = |from: i64, to: i64| {
        for n in from..to {
            r.query::<()>(
                redis::cmd("HSET")
                    .arg("cronlock:{trim}:ledger")
                    .arg(old(n).to_string())
                    .arg(r#"{"state":"succeeded","attempts":[]}"#),
            );
        }
    };
    let held = || -> i64 { r.query(redis::cmd("HLEN").arg("cronlock:{trim}:ledger")) };
    // 70 held, 64 shown: the newest.
    fill(0, 70);
    let shown = ledger(&r.url(), "trim");
    assert_eq!(shown.len(), 64);
    assert_eq!(shown[0].0, old(6));
    // More than 80 once a firing adds its instants (the latest and those missed in the window):
    // trimmed back to the 64 newest, the firing's own kept.
    fill(70, 80);
    let out = fire(&r.url(), "trim", &[], 0);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(held(), 64);
    let shown = ledger(&r.url(), "trim");
    assert_eq!(shown.len(), 64);
    let (_, newest) = shown.last().unwrap();
    assert_eq!(newest["state"], "succeeded");
    assert!(shown[0].0 > old(15), "{}", shown[0].0);
}
