//! `--crontab FILE`: replicas that are all equal, as separate processes against a real Redis.
//! Each instant of each job runs once across them; SIGTERM drains; SIGHUP reloads; a bad file is
//! one `FILE:LINE: message` at start.

use std::time::{Duration, Instant};

use crate::common::replicas::{self, crontab, instants, replica, replica_err, stop};
use crate::common::*;

#[test]
fn three_replicas_run_each_instant_of_each_job_once() {
    replicas::each_instant_once(&Redis::start().url(), "replicas", 20);
}

/// SIGTERM: a running job ends on its own and the replica exits 0, claiming nothing after the
/// signal; a job longer than --drain is stopped, and the replica exits 143.
#[test]
fn sigterm_drains_then_stops() {
    let r = Redis::start();
    let dir = scratch("drain");
    let d = dir.display();
    let file = crontab(
        &dir,
        &format!(
            "CRON_TZ=UTC\n\
             * * * * * * short sh -c 'echo start >> {d}/short; sleep 1; echo end >> {d}/short'\n"
        ),
    );
    let c = replica(&r.url(), &file, &[]);
    assert!(wait_for(Duration::from_secs(10), || instants(
        &dir.join("short")
    )
    .first()
    .is_some_and(|l| l == "start")));
    assert_eq!(stop(c), Some(0), "{}", replica_err(&file));
    let lines = instants(&dir.join("short"));
    assert_eq!(lines.last().map(String::as_str), Some("end"), "{lines:?}");
    // Nothing claimed after the signal: every start has its end.
    let starts = lines.iter().filter(|l| *l == "start").count();
    let ends = lines.iter().filter(|l| *l == "end").count();
    assert_eq!(starts, ends, "{lines:?}");

    let file = crontab(
        &dir,
        &format!("* * * * * * long sh -c 'echo start >> {d}/long; exec sleep 60'\n"),
    );
    let c = replica(&r.url(), &file, &["--drain", "500ms", "--grace", "1s"]);
    assert!(wait_for(Duration::from_secs(10), || !instants(
        &dir.join("long")
    )
    .is_empty()));
    let stopped = Instant::now();
    let code = stop(c);
    let err = replica_err(&file);
    assert_eq!(code, Some(143), "{err}");
    assert!(stopped.elapsed() < Duration::from_secs(10), "{err}");
    assert!(err.contains("long: stopping its run"), "{err}");
}

/// SIGHUP reads the file again: an added job starts, a removed one stops; a broken file keeps
/// the table that runs, with one line naming FILE:LINE.
#[test]
fn sighup_adds_and_removes_jobs_and_a_broken_file_keeps_the_table() {
    let r = Redis::start();
    let dir = scratch("reload");
    let d = dir.display();
    let file = crontab(&dir, &format!("* * * * * * one echo x >> {d}/one\n"));
    let c = replica(&r.url(), &file, &[]);
    assert!(wait_for(Duration::from_secs(10), || !instants(
        &dir.join("one")
    )
    .is_empty()));
    std::fs::write(&file, format!("* * * * * * two echo x >> {d}/two\n")).unwrap();
    signal(c.id() as i32, libc::SIGHUP);
    assert!(wait_for(Duration::from_secs(10), || !instants(
        &dir.join("two")
    )
    .is_empty()));
    // "one" is no longer fired: its count stops growing.
    let before = instants(&dir.join("one")).len();
    let two_before = instants(&dir.join("two")).len();
    assert!(wait_for(Duration::from_secs(10), || instants(
        &dir.join("two")
    )
    .len()
        >= two_before + 2));
    assert!(instants(&dir.join("one")).len() <= before + 1);
    // A broken file: the old table goes on.
    std::fs::write(&file, "* * * * * * two\n").unwrap();
    signal(c.id() as i32, libc::SIGHUP);
    let n = instants(&dir.join("two")).len();
    assert!(wait_for(Duration::from_secs(10), || instants(
        &dir.join("two")
    )
    .len()
        >= n + 2));
    assert_eq!(stop(c), Some(0));
    let err = replica_err(&file);
    assert!(
        err.contains(&format!("{}:1: ", file.display())) && err.contains("still serving"),
        "{err}"
    );
}

/// Every bad input is 125 at start with `FILE:LINE: message`, and nothing runs.
#[test]
fn bad_crontabs_are_one_line_naming_file_and_line() {
    let r = Redis::start();
    let dir = scratch("badtab");
    let ran = dir.join("ran");
    let cmd = format!("touch {}", ran.display());
    let cases: Vec<(String, &str)> = vec![
        (format!("# ok\n* * * * * k {cmd}\nnot a line\n"), ":3: "),
        (format!("61 * * * * k {cmd}\n"), ":1: bad schedule"),
        (format!("* * * * * --nope k {cmd}\n"), ":1: "),
        ("* * * * * k\n".to_string(), ":1: "),
        ("* * * * *\n".to_string(), ":1: "),
        (
            format!("* * * * * k {cmd}\n* * * * * k {cmd}\n"),
            ":2: KEY 'k'",
        ),
        (format!("* * * * * --crontab x k {cmd}\n"), ":1: --crontab"),
        (format!("* * * * * --wait 5s k {cmd}\n"), ":1: --wait"),
        (format!("* * * * * --limit 2 k {cmd}\n"), ":1: "),
        (
            format!("CRONLOCK_TTL=5s\n* * * * * k {cmd}\n"),
            ":1: CRONLOCK_TTL",
        ),
        (format!("* * * * * --ttl nope k {cmd}\n"), ":1: "),
    ];
    for (text, expect) in cases {
        let file = crontab(&dir, &text);
        let out = run(cronlock(&r).arg("--crontab").arg(&file));
        assert_eq!(code(&out), 125, "{text}: {}", stderr(&out));
        let line = one_line(&out);
        assert!(
            line.contains(&format!("{}{expect}", file.display())),
            "{text}: {line}"
        );
    }
    let out = run(cronlock(&r).args(["--crontab", "/nonexistent/crontab"]));
    assert_eq!(code(&out), 125);
    assert!(one_line(&out).contains("/nonexistent/crontab"));
    let out = run(cronlock(&r).args(["--crontab", "x", "k", "true"]));
    assert_eq!(code(&out), 125);
    assert!(one_line(&out).contains("--crontab takes no KEY"));
    // The replica's own options, without --crontab: named, the flag or the variable.
    let out = run(cronlock(&r)
        .args(["--max-jobs", "3", "k", "--", "touch"])
        .arg(&ran));
    assert_eq!(code(&out), 125);
    assert!(one_line(&out).contains("--max-jobs only applies to a replica"));
    let out = run(cronlock(&r)
        .env("CRONLOCK_DRAIN", "5s")
        .args(["k", "--", "touch"])
        .arg(&ran));
    assert_eq!(code(&out), 125);
    assert!(one_line(&out).contains("CRONLOCK_DRAIN only applies to a replica"));
    let out = run(cronlock(&r).args(["--crontab", "x", "--max-jobs", "0"]));
    assert_eq!(code(&out), 125);
    assert!(one_line(&out).contains("--max-jobs"));
    assert!(!ran.exists());
}

/// Every replica was down across an instant: one that starts inside --catch-up runs it, once; a
/// second one started then finds nothing due.
#[test]
fn a_replica_started_late_catches_up_once() {
    let r = Redis::start();
    let dir = scratch("late");
    let log = dir.join("log");
    let file = crontab(
        &dir,
        &format!(
            "CRON_TZ=UTC\n0 0 0 1 * * --catch-up 100d late echo $CRONLOCK_INSTANT >> {}\n",
            log.display()
        ),
    );
    let a = replica(&r.url(), &file, &[]);
    assert!(wait_for(Duration::from_secs(10), || !instants(&log).is_empty()));
    let b = replica(&r.url(), &file, &[]);
    // b has fired too (its start line), and found nothing due.
    assert!(wait_for(Duration::from_secs(10), || replica_err(&file)
        .matches("serving 1 jobs")
        .count()
        == 2));
    let settled = Instant::now();
    assert!(wait_for(Duration::from_secs(5), || settled.elapsed()
        > Duration::from_secs(1)));
    assert_eq!(stop(a), Some(0));
    assert_eq!(stop(b), Some(0));
    let seen = instants(&log);
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert!(seen[0].ends_with("-01T00:00:00Z"), "{seen:?}");
}

/// Each job's output lines are its KEY's (prefixed, or JSON with `key` and `stream`), whole even
/// when two jobs write long lines at once; the replica's start and end lines name the KEY, the
/// instant and the attempt.
#[test]
fn output_lines_are_attributed_whole_and_runs_are_logged() {
    let r = Redis::start();
    let dir = scratch("output");
    let line = |c: char| c.to_string().repeat(3000);
    let body = |c: char| {
        format!(
            "i=0; while [ $i -lt 50 ]; do echo {l}; echo {l} >&2; i=$((i+1)); done",
            l = line(c)
        )
    };
    let file = crontab(
        &dir,
        &format!(
            "* * * * * * out-x {}\n* * * * * * out-y {}\n",
            body('x'),
            body('y')
        ),
    );
    for json in [false, true] {
        let extra: &[&str] = if json { &["--log-format", "json"] } else { &[] };
        let c = replica(&r.url(), &file, extra);
        let n = c_number(&c);
        let out_file = dir.join(format!("{n}.out"));
        assert!(wait_for(Duration::from_secs(10), || {
            let text = std::fs::read_to_string(&out_file).unwrap_or_default();
            text.lines().count() >= 200
        }));
        assert_eq!(stop(c), Some(0));
        let out = std::fs::read_to_string(&out_file).unwrap();
        let err = std::fs::read_to_string(dir.join(format!("{n}.err"))).unwrap();
        for (stream, text) in [("stdout", out.as_str()), ("stderr", err.as_str())] {
            for l in text
                .lines()
                .filter(|l| l.contains("xxx") || l.contains("yyy"))
            {
                let (key, content) = if json {
                    let v: serde_json::Value = serde_json::from_str(l).unwrap();
                    assert_eq!(v["stream"], stream, "{l}");
                    (
                        v["key"].as_str().unwrap().to_string(),
                        v["line"].as_str().unwrap().to_string(),
                    )
                } else {
                    let (k, c) = l.split_once("] ").unwrap();
                    (k.trim_start_matches('[').to_string(), c.to_string())
                };
                let c = if key == "out-x" { 'x' } else { 'y' };
                assert_eq!(content, line(c), "a line of {key} was cut or mixed");
            }
        }
        if json {
            let started = err
                .lines()
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .find(|v| v["event"] == "run_started")
                .expect("a run_started line");
            assert!(started["key"].as_str().unwrap().starts_with("out-"));
            assert!(started["instant"].as_i64().unwrap() > 0);
            assert_eq!(started["attempt"], 1);
        } else {
            assert!(err.contains("out-x: started for the "), "{err}");
            assert!(err.contains("out-x: command exited with status 0"), "{err}");
        }
    }
}

/// The number `replica` gave this child (its `N.out` file).
fn c_number(c: &std::process::Child) -> String {
    let env = std::fs::read_to_string(format!("/proc/{}/environ", c.id())).unwrap();
    env.split('\0')
        .find_map(|v| v.strip_prefix("CRONLOCK_TEST_REPLICA="))
        .unwrap()
        .to_string()
}

/// A replica at --max-jobs claims nothing: another replica runs the instants meanwhile.
#[test]
fn a_replica_at_its_limit_leaves_the_instants_to_another() {
    let r = Redis::start();
    let dir = scratch("limit");
    let ticks = dir.join("ticks");
    let busy = dir.join("busy");
    let file = crontab(
        &dir,
        &format!(
            "* * * * * * --ttl 3s hold sh -c 'touch {}; sleep 6'\n\
             * * * * * * tick echo $CRONLOCK_TEST_REPLICA >> {}\n",
            busy.display(),
            ticks.display()
        ),
    );
    let a = replica(&r.url(), &file, &["--max-jobs", "1"]);
    assert!(wait_for(Duration::from_secs(10), || busy.exists()));
    let b = replica(&r.url(), &file, &[]);
    // A holds its one run (hold sleeps 6 s): every tick meanwhile is B's.
    let from = instants(&ticks).len();
    assert!(wait_for(Duration::from_secs(10), || instants(&ticks).len()
        >= from + 3));
    let own_a = std::fs::read_to_string(format!("/proc/{}/environ", a.id()))
        .unwrap()
        .split('\0')
        .find_map(|v| v.strip_prefix("CRONLOCK_TEST_REPLICA=").map(String::from))
        .unwrap();
    let later: Vec<String> = instants(&ticks).split_off(from);
    assert!(later.iter().all(|n| *n != own_a), "{later:?}");
    assert!(
        replica_err(&file).contains("--max-jobs 1"),
        "{}",
        replica_err(&file)
    );
    assert_eq!(stop(b), Some(0));
    let _ = stop(a);
}

/// A second SIGTERM stops the runs at once; a change of the file (no SIGHUP) is read too.
#[test]
fn a_second_sigterm_stops_at_once_and_a_changed_file_is_read() {
    let r = Redis::start();
    let dir = scratch("twice");
    let d = dir.display();
    let file = crontab(
        &dir,
        &format!("* * * * * * slow sh -c 'echo x >> {d}/slow; exec sleep 60'\n"),
    );
    let c = replica(&r.url(), &file, &["--drain", "60s", "--grace", "1s"]);
    assert!(wait_for(Duration::from_secs(10), || !instants(
        &dir.join("slow")
    )
    .is_empty()));
    // The file changes: the new job starts without a signal.
    std::fs::write(
        &file,
        format!(
            "* * * * * * slow sh -c 'echo x >> {d}/slow; exec sleep 60'\n\
             * * * * * * fresh echo x >> {d}/fresh\n"
        ),
    )
    .unwrap();
    assert!(wait_for(Duration::from_secs(10), || !instants(
        &dir.join("fresh")
    )
    .is_empty()));
    signal(c.id() as i32, libc::SIGTERM);
    assert!(wait_for(Duration::from_secs(5), || replica_err(&file)
        .contains("claiming nothing more")));
    // Draining, it sleeps: its jobs' instants pass unclaimed, and it does not spin on them.
    let before = own_ticks(c.id());
    let idle = Instant::now();
    assert!(wait_for(Duration::from_secs(5), || idle.elapsed()
        > Duration::from_millis(2500)));
    let ticks = own_ticks(c.id()) - before;
    assert!(
        ticks < 50,
        "{ticks} clock ticks of CPU in 2.5 s of draining"
    );
    let again = Instant::now();
    let code = stop(c);
    assert_eq!(code, Some(143), "{}", replica_err(&file));
    assert!(
        again.elapsed() < Duration::from_secs(5),
        "{}",
        replica_err(&file)
    );
}

mod alone {
    //! The crontab tests that measure time: each takes the cores for itself while it measures
    //! (`common::alone`), and `scripts/test.sh` runs them after the others.

    use super::*;

    /// A replica SIGKILLed, or SIGTERMed with a run longer than --drain: its instant runs again on
    /// another replica within TTL + 2 s.
    #[test]
    fn a_dead_or_drained_replicas_run_is_retried_on_another() {
        replicas::retried_on_another(&Redis::start().url(), "retry");
    }
}

/// `--crontab FILE --test`: the file read and checked as a replica reads it, each job shown with
/// its next instant; a bad line is `FILE:LINE: message` and 125; nothing runs and no Redis is
/// needed.
#[test]
fn test_checks_the_file_and_shows_each_jobs_next_instant() {
    let dir = scratch("crontab-test");
    let marker = dir.join("ran");
    let file = crontab(
        &dir,
        &format!(
            "CRON_TZ=UTC\n# a comment\n* * * * * * every-second touch {m}\n\
             H 3 * * * --overlap queue nightly touch {m}\n",
            m = marker.display()
        ),
    );
    let test = |file: &std::path::Path| {
        run(cronlock_at("redis://127.0.0.1:1")
            .arg("--crontab")
            .arg(file)
            .arg("--test"))
    };
    let out = test(&file);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let text = stdout(&out);
    let shown = file.display();
    assert!(
        text.starts_with(&format!("{shown}: 2 jobs, every line valid\n")),
        "{text}"
    );
    assert!(text.contains(&format!(
        "{shown}:3: every-second: CRON_TZ=UTC * * * * * *: next "
    )));
    assert!(text.contains(&format!("{shown}:4: nightly: CRON_TZ=UTC H 3 * * * (H: ")));
    assert!(text.contains(" UTC  20"), "{text}");
    assert!(!marker.exists());
    // A bad line: one line naming it, 125.
    let bad = crontab(&dir, "* * * * * --grace 30s x /bin/true\n");
    let out = test(&bad);
    assert_eq!(code(&out), 125);
    assert_eq!(
        stderr(&out),
        format!(
            "cronlock: {}:1: --grace 30s must be at most half of --ttl 30s: the command must be \
             gone before the lock can expire\n",
            bad.display()
        )
    );
    assert_eq!(stdout(&out), "");
    // A file others may change is refused, as a replica refuses it.
    let loose = crontab(&dir, "* * * * * x /bin/true\n");
    std::fs::set_permissions(&loose, std::os::unix::fs::PermissionsExt::from_mode(0o666)).unwrap();
    let out = test(&loose);
    assert_eq!(code(&out), 125);
    assert!(stderr(&out).contains("chmod go-w"), "{}", stderr(&out));
}

/// A replica claims an instant 50 ms ahead; its run's record says when the command started,
/// never before its instant (a run of 11:45:00 read as started 11:44:59 before).
#[test]
fn a_replicas_run_is_recorded_started_at_or_after_its_instant() {
    let r = Redis::start();
    let dir = scratch("crontab-started");
    let file = crontab(&dir, "CRON_TZ=UTC\n* * * * * * tick true\n");
    let c = replica(&r.url(), &file, &[]);
    let mut records = Vec::new();
    assert!(wait_for(Duration::from_secs(15), || {
        let out = run(cronlock(&r).args(["--status", "--json", "--history", "tick"]));
        let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap_or_default();
        records = v["history"].as_array().cloned().unwrap_or_default();
        records.len() >= 3
    }));
    assert_eq!(stop(c), Some(0));
    for rec in &records {
        let (instant, started, finished) = (
            rec["instant"].as_u64().unwrap(),
            rec["started"].as_u64().unwrap(),
            rec["finished"].as_u64().unwrap(),
        );
        assert!(started >= instant, "{rec}");
        assert!(finished >= started, "{rec}");
        assert_eq!(
            rec["duration_ms"].as_u64().unwrap(),
            finished - started,
            "{rec}"
        );
    }
}
