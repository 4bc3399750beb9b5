//! `--crontab FILE`: replicas that are all equal, as separate processes against a real Redis.
//! Each instant of each job runs once across them; SIGTERM drains; SIGHUP reloads; a bad file is
//! one `FILE:LINE: message` at start.
mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use common::*;

/// A replica serving `file`, tied to the test; its stdout and stderr go to files beside the
/// crontab (`N.out`, `N.err`), so a full pipe never stalls it.
fn replica(r: &Redis, file: &Path, extra: &[&str]) -> Child {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let dir = file.parent().unwrap();
    let mut cmd = cronlock(r);
    cmd.arg("--crontab").arg(file).args(extra);
    tie(&mut cmd);
    cmd.stdout(std::fs::File::create(dir.join(format!("{n}.out"))).unwrap())
        .stderr(std::fs::File::create(dir.join(format!("{n}.err"))).unwrap())
        .env("CRONLOCK_TEST_REPLICA", n.to_string())
        .spawn()
        .unwrap()
}

/// What the replicas of `file` wrote on stderr.
fn replica_err(file: &Path) -> String {
    let dir = file.parent().unwrap();
    let mut all = String::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        if e.path().extension().is_some_and(|x| x == "err") {
            all += &std::fs::read_to_string(e.path()).unwrap_or_default();
        }
    }
    all
}

/// The instants (as the jobs saw them) recorded in `file`, one per line.
fn instants(file: &Path) -> Vec<String> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

fn crontab(dir: &Path, text: &str) -> PathBuf {
    let file = dir.join("crontab");
    std::fs::write(&file, text).unwrap();
    file
}

/// SIGTERM, and the exit status (None: still running after 30 s, then killed).
fn stop(mut c: Child) -> Option<i32> {
    signal(c.id() as i32, libc::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(30);
    while c.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = c.kill();
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    c.wait().unwrap().code()
}

/// Three replicas, three jobs every second, 20 seconds: every instant of every job runs exactly
/// once, and none is missed while the replicas are up.
#[test]
fn three_replicas_run_each_instant_of_each_job_once() {
    let r = Redis::start();
    let dir = scratch("replicas");
    let d = dir.display();
    let file = crontab(
        &dir,
        &format!(
            "# three jobs, every second\nCRON_TZ=UTC\n\
             * * * * * * job-a echo $CRONLOCK_INSTANT >> {d}/a\n\
             * * * * * * --ttl 5s job-b echo $CRONLOCK_INSTANT >> {d}/b\n\
             * * * * * * job-c sh -c 'echo $CRONLOCK_INSTANT >> {d}/c; sleep 0.3'\n"
        ),
    );
    let replicas: Vec<Child> = (0..3).map(|_| replica(&r, &file, &[])).collect();
    let started = Instant::now();
    assert!(wait_for(Duration::from_secs(30), || started.elapsed()
        >= Duration::from_secs(20)));
    for (i, c) in replicas.into_iter().enumerate() {
        assert_eq!(stop(c), Some(0), "replica {i}: {}", replica_err(&file));
    }
    for job in ["a", "b", "c"] {
        let seen = instants(&dir.join(job));
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        for s in &seen {
            *counts.entry(s.as_str()).or_default() += 1;
        }
        let twice: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).collect();
        assert!(twice.is_empty(), "job {job} ran twice: {twice:?}");
        // Consecutive seconds from the first to the last: none missed.
        let secs: Vec<i64> = counts
            .keys()
            .map(|t| {
                humantime::parse_rfc3339(t)
                    .unwrap()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_secs() as i64
            })
            .collect();
        for pair in secs.windows(2) {
            assert_eq!(
                pair[1] - pair[0],
                1,
                "job {job} missed an instant: {seen:?}"
            );
        }
        assert!(
            secs.len() >= 18,
            "job {job}: {} instants in 20 s",
            secs.len()
        );
    }
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
    let c = replica(&r, &file, &[]);
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
    let c = replica(&r, &file, &["--drain", "500ms", "--grace", "1s"]);
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
    let c = replica(&r, &file, &[]);
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
    assert!(!ran.exists());
}

/// The lines `INSTANT ATTEMPT REPLICA PID` the jobs of the retry tests write.
fn attempts(file: &Path) -> Vec<Vec<String>> {
    instants(file)
        .iter()
        .map(|l| l.split_whitespace().map(String::from).collect())
        .collect()
}

/// A replica SIGKILLed mid-run takes its run with it; another replica runs the instant again
/// (`--retries 1`) within TTL + 2 s (before the next instant: a later instant, once due, is the
/// one a firing runs, never a backlog). A replica SIGTERMed with a run longer than --drain stops it,
/// records it `interrupted`, and another replica runs it again.
#[test]
fn a_dead_or_drained_replicas_run_is_retried_on_another() {
    let r = Redis::start();
    for (case, how) in [("killed", libc::SIGKILL), ("drained", libc::SIGTERM)] {
        let dir = scratch(case);
        let log = dir.join("log");
        let key = format!("retry-{case}");
        let file = crontab(
            &dir,
            &format!(
                "*/10 * * * * * --ttl 2s --catch-up 1m --retries 1 {key} \
                 [ -e {go} ] || exit 0; \
                 echo $CRONLOCK_INSTANT $CRONLOCK_ATTEMPT $CRONLOCK_TEST_REPLICA $$ >> {}; \
                 exec sleep 60\n",
                log.display(),
                go = dir.join("go").display()
            ),
        );
        let args = ["--drain", "300ms", "--grace", "500ms"];
        let mut replicas: Vec<Child> = (0..2).map(|_| replica(&r, &file, &args)).collect();
        // Their catch-up at start runs the past instant, quickly; the test's run is the next
        // instant's, fired on time.
        assert!(wait_for(Duration::from_secs(10), || replica_err(&file)
            .matches("command exited with status 0")
            .count()
            >= 1));
        std::fs::write(dir.join("go"), "").unwrap();
        assert!(wait_for(Duration::from_secs(15), || !attempts(&log).is_empty()));
        let first = attempts(&log)[0].clone();
        assert_eq!(first[1], "1", "{first:?}");
        // The replica that runs it (the environment says which).
        let own: u32 = first[2].parse().unwrap();
        let i = replicas
            .iter()
            .position(|c| {
                std::fs::read_to_string(format!("/proc/{}/environ", c.id()))
                    .is_ok_and(|e| e.contains(&format!("CRONLOCK_TEST_REPLICA={own}\0")))
            })
            .unwrap();
        let mut victim = replicas.remove(i);
        let stopped = Instant::now();
        signal(victim.id() as i32, how);
        let status = victim.wait().unwrap();
        let command: i32 = first[3].parse().unwrap();
        assert!(
            wait_for(Duration::from_secs(5), || !alive(command)),
            "{case}: the run's command outlived its replica"
        );
        if how == libc::SIGTERM {
            assert_eq!(status.code(), Some(143), "{}", replica_err(&file));
        }
        // Attempt 2 of the same instant, on the other replica, within TTL + 2 s.
        assert!(
            wait_for(Duration::from_secs(4), || attempts(&log)
                .iter()
                .any(|a| a[0] == first[0] && a[1] == "2")),
            "{case}: {:?}\n{}",
            attempts(&log),
            replica_err(&file)
        );
        assert!(stopped.elapsed() < Duration::from_secs(4));
        let again = attempts(&log)
            .into_iter()
            .find(|a| a[0] == first[0] && a[1] == "2")
            .unwrap();
        assert_ne!(again[2], first[2], "{case}: rerun on the same replica");
        let s = run(cronlock(&r).args(["--status", "--json", &key]));
        let v: serde_json::Value = serde_json::from_str(&stdout(&s)).unwrap();
        let entry = v["ledger"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["instant_time"] == first[0].as_str())
            .unwrap()
            .clone();
        let want = if how == libc::SIGKILL {
            "abandoned"
        } else {
            "interrupted"
        };
        assert_eq!(entry["attempts"][0]["state"], want, "{entry}");
        for mut c in replicas {
            signal(c.id() as i32, libc::SIGKILL);
            c.wait().unwrap();
        }
    }
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
    let a = replica(&r, &file, &[]);
    assert!(wait_for(Duration::from_secs(10), || !instants(&log).is_empty()));
    let b = replica(&r, &file, &[]);
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
