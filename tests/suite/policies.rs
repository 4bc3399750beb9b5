//! What schedulers' users ask for: `H` fields drawn from KEY (the same on every host and after a
//! restart, spread over the range), a suspension that ends by itself (`--suspend --for`), the
//! overlap policies (on fleets, and across hosts whose clocks differ), `--jitter` and
//! `--trigger`.

use std::time::Duration;

use crate::accounted::{ledger, now_secs, runs};
use crate::common::replicas::{crontab, replica, replica_err, stop};
use crate::common::*;

/// A crontab (UTC) of one line per KEY, `SCHEDULE KEY` then a command that appends `KEY INSTANT
/// NANOS` to `runs` (read by `accounted::runs`).
fn runs_crontab(dir: &std::path::Path, schedule: &str, keys: &[&str]) -> String {
    let runs = dir.join("runs");
    let mut text = String::from("CRON_TZ=UTC\n");
    for key in keys {
        text += &format!(
            "{schedule} {key} echo {key} $CRONLOCK_INSTANT $(date +%s%N) >> {}\n",
            runs.display()
        );
    }
    text
}

/// `cronlock ARGS k -- true` is refused: status 125 and one line, naming each of `names`;
/// nothing runs.
fn refused(url: &str, args: &[&str], names: &[&str]) {
    let out = run(cronlock_at(url).args(args).args(["k", "--", "true"]));
    assert_eq!(code(&out), 125, "{}", stderr(&out));
    assert_eq!(stderr(&out).lines().count(), 1, "{}", stderr(&out));
    for name in names {
        assert!(stderr(&out).contains(name), "no {name}: {}", stderr(&out));
    }
}

/// The `resolved` expression `--status --json --schedule EXPR KEY` shows.
fn resolved(url: &str, expr: &str, key: &str) -> String {
    let out = run(cronlock_at(url).args(["--status", "--json", "--schedule", expr, key]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    v["schedule"]["resolved"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// `H` draws the same values for a KEY from every process (every host, every restart: nothing
/// but KEY goes in), and 300 KEYs at `H 0 * * *` spread over the hour, no minute holding more
/// than 3x its share.
#[test]
fn h_fields_are_the_same_everywhere_and_spread_over_the_range() {
    let r = Redis::start();
    let url = r.url();
    let first = resolved(&url, "H H(2-4) * * *", "nightly");
    assert!(!first.is_empty());
    for _ in 0..3 {
        assert_eq!(resolved(&url, "H H(2-4) * * *", "nightly"), first);
    }
    let text = run(cronlock_at(&url).args(["--status", "--schedule", "H H(2-4) * * *", "nightly"]));
    assert!(
        stdout(&text).contains(&format!("(for this KEY: {first})")),
        "{}",
        stdout(&text)
    );
    let (minute, hour) = first.split_once(' ').unwrap();
    let hour: u32 = hour.split(' ').next().unwrap().parse().unwrap();
    assert!(
        minute.parse::<u32>().unwrap() < 60 && (2..=4).contains(&hour),
        "{first}"
    );
    // A bad H field is one line naming the option and the field; nothing runs.
    refused(&url, &["--schedule", "H(70-80) * * * *"], &["minute"]);
}

/// A fleet of two replicas runs `H/3 * * * * *` (seconds) at the seconds KEY draws, each once,
/// and a replica started again draws the same seconds.
#[test]
fn a_fleet_runs_h_fields_at_the_drawn_times() {
    let r = Redis::start();
    let url = r.url();
    let dir = scratch("policies-h");
    let file = crontab(&dir, &runs_crontab(&dir, "H/3 * * * * *", &["h-a", "h-b"]));
    let offset = |key: &str| -> i64 {
        let r = resolved(&url, "H/3 * * * * *", key);
        r.split('-').next().unwrap().parse().unwrap()
    };
    let (a, b) = (offset("h-a"), offset("h-b"));
    let mut fleet = vec![replica(&url, &file, &[]), replica(&url, &file, &[])];
    let began = now_secs();
    assert!(wait_for(Duration::from_secs(12), || now_secs() >= began + 7));
    // One replica restarted: the same draw.
    stop(fleet.remove(0));
    fleet.push(replica(&url, &file, &[]));
    assert!(wait_for(Duration::from_secs(12), || now_secs() >= began + 13));
    for c in fleet {
        stop(c);
    }
    let (count, _) = runs(&dir);
    for ((key, at), n) in &count {
        let want = if key == "h-a" { a } else { b };
        assert_eq!(
            at.rem_euclid(60) % 3,
            want % 3,
            "{key}@{at}\n{}",
            replica_err(&file)
        );
        assert_eq!(*n, 1, "{key}@{at} ran {n} times");
    }
    for (key, want) in [("h-a", a), ("h-b", b)] {
        let ran: Vec<i64> = count
            .keys()
            .filter(|(k, _)| k == key)
            .map(|(_, t)| *t)
            .collect();
        // Every drawn second from 2 s after the start to 2 s before the end ran.
        for t in (began + 2..=began + 11).filter(|t| t.rem_euclid(60) % 3 == want % 3) {
            if t.rem_euclid(60) >= want {
                assert!(
                    ran.contains(&t),
                    "{key}@{t} never ran: {ran:?}\n{}",
                    replica_err(&file)
                );
            }
        }
    }
}

/// `--suspend --for 2s` on a fleet of three replicas: the instants inside it are recorded
/// skipped, and the job runs again from its first instant after the end, with no `--resume`.
#[test]
fn a_suspension_for_two_seconds_ends_by_itself_on_a_fleet() {
    let r = Redis::start();
    let url = r.url();
    let dir = scratch("policies-for");
    let file = crontab(&dir, &runs_crontab(&dir, "* * * * * *", &["pause-0"]));
    let fleet: Vec<_> = (0..3).map(|_| replica(&url, &file, &[])).collect();
    assert!(wait_for(Duration::from_secs(10), || runs(&dir).0.len() >= 2));
    let said = run(cronlock_at(&url).args(["--suspend", "--for", "2s", "--json", "pause-0"]));
    assert_eq!(code(&said), 0, "{}", stderr(&said));
    let v: serde_json::Value = serde_json::from_str(&stdout(&said)).unwrap();
    let since = v["suspension"]["since"].as_i64().unwrap();
    let until = v["suspension"]["until"].as_i64().unwrap();
    assert_eq!(until - since, 2000, "{v}");
    // The status shows the time left while it lasts.
    let status = run(cronlock_at(&url).args(["--status", "pause-0"]));
    assert!(stdout(&status).contains(" left)"), "{}", stdout(&status));
    let end = until / 1000 + 1;
    assert!(wait_for(Duration::from_secs(10), || now_secs() >= end + 3));
    for c in fleet {
        stop(c);
    }
    let (count, _) = runs(&dir);
    let book = ledger(&url, "pause-0");
    // Inside: never ran; each whole second strictly inside is recorded skipped.
    for at in since / 1000 + 1..until / 1000 {
        assert!(
            !count.contains_key(&("pause-0".into(), at)),
            "ran at {at} while suspended"
        );
        assert!(
            book.iter().any(|(t, st, _)| *t == at && st == "skipped"),
            "{at} not recorded skipped: {book:?}"
        );
    }
    // After: every instant ran, with nobody resuming.
    for at in end..end + 2 {
        assert!(
            count.contains_key(&("pause-0".into(), at)),
            "{at} never ran after the suspension ended: {book:?}\n{}",
            replica_err(&file)
        );
    }
    let status = run(cronlock_at(&url).args(["--status", "pause-0"]));
    assert!(
        !stdout(&status).contains("suspended"),
        "{}",
        stdout(&status)
    );
}

/// A crontab of yearly jobs (never due during a test) for `--trigger`: `ok` appends its
/// CRONLOCK_INSTANT to `runs`; `fails` exits 3; `slow` sleeps 30 s; `twice` (`--retries 1`,
/// TTL 2 s) sleeps the first time, after writing its command's pid, and succeeds the second.
fn trigger_crontab(dir: &std::path::Path) -> std::path::PathBuf {
    let d = dir.display();
    crontab(
        dir,
        &format!(
            "CRON_TZ=UTC\n\
             0 0 1 1 * ok echo ok $CRONLOCK_INSTANT $(date +%s%N) >> {d}/runs\n\
             0 0 1 1 * fails exit 3\n\
             0 0 1 1 * slow sleep 30\n\
             0 0 1 1 * --ttl 2s --catch-up 1h --retries 1 twice \
             if [ -e {d}/first ]; then echo twice $CRONLOCK_INSTANT $(date +%s%N) >> {d}/runs; \
             else echo $$ > {d}/first; sleep 30; fi\n"
        ),
    )
}

fn trigger_of(url: &str, args: &[&str]) -> std::process::Output {
    run(cronlock_at(url).arg("--trigger").args(args))
}

/// `--trigger` on a fleet of two replicas: it runs the job once, now, as a manual instant in the
/// ledger (who asked and why), and exits 0 once a replica took it; with `--wait`, it exits with
/// the command's status, or 124 when the wait runs out; a suspended job is skipped (the `-E`
/// status).
#[test]
fn trigger_runs_a_job_once_now_on_a_fleet() {
    let r = Redis::start();
    let url = r.url();
    let dir = scratch("policies-trigger");
    let file = trigger_crontab(&dir);
    let fleet: Vec<_> = (0..2).map(|_| replica(&url, &file, &[])).collect();
    let began = std::time::Instant::now();
    let out = trigger_of(&url, &["--reason", "fixed the db", "ok"]);
    assert_eq!(code(&out), 0, "{}\n{}", stderr(&out), replica_err(&file));
    assert!(stdout(&out).contains("was taken by"), "{}", stdout(&out));
    assert!(
        began.elapsed() < Duration::from_secs(5),
        "{:?}",
        began.elapsed()
    );
    assert!(wait_for(Duration::from_secs(5), || runs(&dir).0.len() == 1));
    // (The command wrote its line; its run records the end a moment later.)
    let status = || {
        let out = run(cronlock_at(&url).args(["--status", "--json", "ok"]));
        serde_json::from_str::<serde_json::Value>(&stdout(&out)).unwrap()
    };
    wait_for(Duration::from_secs(5), || {
        status()["ledger"][0]["state"] != "running"
    });
    let v = status();
    let entry = &v["ledger"][0];
    assert_eq!(entry["manual"], true, "{v}");
    assert_eq!(entry["state"], "succeeded", "{v}");

    let out = trigger_of(&url, &["--wait", "10s", "fails"]);
    assert_eq!(code(&out), 3, "{}\n{}", stderr(&out), replica_err(&file));
    assert!(stdout(&out).contains("failed (exit 3)"), "{}", stdout(&out));

    let out = trigger_of(&url, &["--wait", "1s", "slow"]);
    assert_eq!(code(&out), 124, "{}", stderr(&out));
    assert!(stderr(&out).contains("--wait"), "{}", stderr(&out));
    assert_eq!(stderr(&out).lines().count(), 1, "{}", stderr(&out));
    // Busy (the slow run holds its lock): skipped for the overlap, the -E status.
    let out = trigger_of(&url, &["-E", "75", "--wait", "10s", "slow"]);
    assert_eq!(code(&out), 75, "{}\n{}", stdout(&out), stderr(&out));
    assert!(
        stdout(&out).contains("skipped (overlap)"),
        "{}",
        stdout(&out)
    );

    let out = run(cronlock_at(&url).args(["--suspend", "ok"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let out = trigger_of(&url, &["-E", "75", "ok"]);
    assert_eq!(code(&out), 75, "{}\n{}", stdout(&out), stderr(&out));
    assert!(
        stdout(&out).contains("skipped (suspended)"),
        "{}",
        stdout(&out)
    );
    assert_eq!(runs(&dir).0.len(), 1, "a suspended job ran");

    for c in fleet {
        stop(c);
    }
}

/// A manual run and a scheduled one can fall in the same second (a manual instant is named by the
/// asking host's clock, to the millisecond): the command tells them apart by `CRONLOCK_MANUAL`
/// (`1` for a `--trigger`, `0` for the schedule's) and `CRONLOCK_INSTANT_MS` (its instant to the
/// millisecond, the ledger's name for it), beside the RFC 3339 `CRONLOCK_INSTANT`.
#[test]
fn a_manual_run_says_it_is_manual_and_names_its_instant_to_the_millisecond() {
    let r = Redis::start();
    let url = r.url();
    let dir = scratch("policies-manual-env");
    let d = dir.display();
    let file = crontab(
        &dir,
        &format!(
            "CRON_TZ=UTC\n\
             0 0 1 1 * yearly echo $CRONLOCK_MANUAL $CRONLOCK_INSTANT_MS $CRONLOCK_INSTANT >> \
             {d}/manual\n\
             * * * * * * tick echo $CRONLOCK_MANUAL $CRONLOCK_INSTANT_MS $CRONLOCK_INSTANT >> \
             {d}/scheduled\n"
        ),
    );
    let c = replica(&url, &file, &[]);
    let out = trigger_of(&url, &["--wait", "10s", "yearly"]);
    assert_eq!(code(&out), 0, "{}\n{}", stderr(&out), replica_err(&file));
    let said = std::fs::read_to_string(dir.join("manual")).unwrap_or_default();
    let fields: Vec<&str> = said.split_whitespace().collect();
    let entry = run(cronlock_at(&url).args(["--status", "--json", "yearly"]));
    let v: serde_json::Value = serde_json::from_str(&stdout(&entry)).unwrap();
    let instant = v["ledger"][0]["instant"].as_i64().unwrap();
    assert_eq!(fields.first(), Some(&"1"), "{said}");
    assert_eq!(
        fields.get(1),
        Some(&instant.to_string().as_str()),
        "{said} {v}"
    );
    assert_eq!(
        fields.get(2).copied(),
        v["ledger"][0]["instant_time"].as_str(),
        "{said} {v}"
    );
    let scheduled = dir.join("scheduled");
    assert!(wait_for(Duration::from_secs(5), || {
        std::fs::read_to_string(&scheduled).is_ok_and(|s| !s.is_empty())
    }));
    let said = std::fs::read_to_string(&scheduled).unwrap();
    let first: Vec<&str> = said.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(first[0], "0", "{said}");
    let ms: i64 = first[1].parse().unwrap();
    assert_eq!(ms % 1000, 0, "{said}");
    assert_eq!(
        crate::accounted::rfc3339_secs(ms as u64 / 1000),
        first[2],
        "{said}"
    );
    stop(c);
}

/// `--trigger` against a busy job (its first manual run still going) under each other policy,
/// on a fleet of two replicas: under queue the second waits for the first to end, then runs;
/// under replace it stops the first (recorded `replaced`) and runs; under allow it runs beside
/// it. Each `--trigger --wait` exits with the second run's status.
#[test]
fn trigger_of_a_busy_job_follows_its_overlap_policy() {
    let r = Redis::start();
    let url = r.url();
    let dir = scratch("policies-trigger-busy");
    let d = dir.display();
    let file = crontab(
        &dir,
        &format!(
            "CRON_TZ=UTC\n\
             0 0 1 1 * --overlap queue busyq \
             if [ -e {d}/q ]; then echo $(date +%s%N) > {d}/q2; else touch {d}/q; sleep 5; \
             echo $(date +%s%N) > {d}/q1; fi\n\
             0 0 1 1 * --overlap replace --grace 1s busyr \
             if [ -e {d}/r ]; then exit 0; else touch {d}/r; sleep 30; fi\n\
             0 0 1 1 * --overlap allow busya \
             if [ -e {d}/a ]; then exit 7; else touch {d}/a; sleep 6; fi\n"
        ),
    );
    let fleet: Vec<_> = (0..2).map(|_| replica(&url, &file, &[])).collect();
    let first_runs = |key: &str, first: &str| {
        let out = trigger_of(&url, &[key]);
        assert_eq!(
            code(&out),
            0,
            "{key}: {}\n{}",
            stderr(&out),
            replica_err(&file)
        );
        assert!(wait_for(Duration::from_secs(5), || dir
            .join(first)
            .exists()));
    };
    // queue: said to wait (the first runs 5 s), then run once the first ended.
    first_runs("busyq", "q");
    let out = trigger_of(&url, &["busyq"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(
        stdout(&out).contains("waits for the run before it"),
        "{}",
        stdout(&out)
    );
    // (Written by the command: the file exists a moment before its content.)
    let written = |f: &str| {
        std::fs::read_to_string(dir.join(f))
            .ok()
            .and_then(|t| t.trim().parse::<u64>().ok())
    };
    assert!(wait_for(Duration::from_secs(15), || written("q2").is_some()));
    let ns = |f: &str| written(f).unwrap();
    assert!(
        ns("q1") <= ns("q2"),
        "the waiting manual instant ran beside the first"
    );
    // replace: the first is stopped and recorded replaced.
    first_runs("busyr", "r");
    let out = trigger_of(&url, &["--wait", "15s", "busyr"]);
    assert_eq!(code(&out), 0, "{}{}", stdout(&out), stderr(&out));
    let book = ledger(&url, "busyr");
    assert!(book.iter().any(|(_, st, _)| st == "replaced"), "{book:?}");
    // allow: runs beside the first, which still runs.
    first_runs("busya", "a");
    let began = std::time::Instant::now();
    let out = trigger_of(&url, &["--wait", "15s", "busya"]);
    assert_eq!(code(&out), 7, "{}{}", stdout(&out), stderr(&out));
    assert!(
        began.elapsed() < Duration::from_secs(10),
        "{:?}",
        began.elapsed()
    );
    let book = ledger(&url, "busya");
    assert!(book.iter().any(|(_, st, _)| st == "running"), "{book:?}");
    for c in fleet {
        stop(c);
    }
}

/// A manual instant whose replica is SIGKILLed mid-run is retried like any instant (`--retries
/// 1`): its run stops its command and records attempt 1 `interrupted`, another replica runs
/// attempt 2, and `--trigger --wait` exits with its status.
#[test]
fn a_triggered_run_whose_replica_dies_is_retried() {
    let r = Redis::start();
    let url = r.url();
    let dir = scratch("policies-trigger-kill");
    let file = trigger_crontab(&dir);
    let mut fleet: Vec<_> = (0..2).map(|_| replica(&url, &file, &[])).collect();
    let waiting = cronlock_at(&url)
        .args(["--trigger", "--wait", "30s", "twice"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let first = dir.join("first");
    assert!(
        wait_for(Duration::from_secs(10), || std::fs::read_to_string(&first)
            .is_ok_and(|p| p.trim().parse::<i32>().is_ok())),
        "{}",
        replica_err(&file)
    );
    let pid: i32 = std::fs::read_to_string(&first)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // The replica above the command (its run's parent).
    let ids: Vec<i32> = fleet.iter().map(|c| c.id() as i32).collect();
    let mut up = pid;
    while !ids.contains(&up) {
        let status = std::fs::read_to_string(format!("/proc/{up}/status")).unwrap();
        up = status
            .lines()
            .find_map(|l| l.strip_prefix("PPid:"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(up > 1, "the command {pid} is not under a replica");
    }
    let victim = ids.iter().position(|p| *p == up).unwrap();
    let mut dead = fleet.remove(victim);
    signal(up, libc::SIGKILL);
    dead.wait().unwrap();
    let out = waiting.wait_with_output().unwrap();
    assert_eq!(
        code(&out),
        0,
        "{}{}\n{}",
        stdout(&out),
        stderr(&out),
        replica_err(&file)
    );
    let status = run(cronlock_at(&url).args(["--status", "--json", "twice"]));
    let v: serde_json::Value = serde_json::from_str(&stdout(&status)).unwrap();
    let entry = &v["ledger"][0];
    assert_eq!(entry["attempts"].as_array().unwrap().len(), 2, "{v}");
    assert_eq!(entry["attempts"][0]["state"], "interrupted", "{v}");
    assert_eq!(runs(&dir).0.len(), 1);
    for c in fleet {
        stop(c);
    }
}

/// KEY's `--jitter` offset, as `--status --json` shows it (ms).
fn offset_ms(url: &str, expr: &str, jitter: &str, key: &str) -> i64 {
    let out = run(cronlock_at(url)
        .args(["--status", "--json", "--schedule", expr])
        .args(["--jitter", jitter, key]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    v["schedule"]["offset_ms"].as_i64().unwrap_or(0)
}

/// `--jitter 1500ms` on `*/2 * * * * *`: a replica of a fleet starts each instant's run KEY's
/// offset after the instant (never before it; within 700 ms after it, a bound many times what
/// a start takes), each instant once; the instant keeps its name. A plain firing waits for the
/// same offset. A jitter not shorter than the period is one line, and nothing runs.
#[test]
fn jitter_starts_each_run_keys_offset_after_its_instant() {
    let r = Redis::start();
    let url = r.url();
    let dir = scratch("policies-jitter");
    let out = dir.join("runs");
    let schedule = "*/2 * * * * * --jitter 1500ms";
    let file = crontab(&dir, &runs_crontab(&dir, schedule, &["jit-a", "jit-b"]));
    let want: Vec<(String, i64)> = ["jit-a", "jit-b"]
        .iter()
        .map(|k| (k.to_string(), offset_ms(&url, "*/2 * * * * *", "1500ms", k)))
        .collect();
    assert!(want.iter().all(|(_, o)| (0..1500).contains(o)), "{want:?}");
    let fleet: Vec<_> = (0..2).map(|_| replica(&url, &file, &[])).collect();
    assert!(wait_for(Duration::from_secs(15), || runs(&dir).0.len() >= 8));
    for c in fleet {
        stop(c);
    }
    let text = std::fs::read_to_string(&out).unwrap();
    let (count, _) = runs(&dir);
    assert!(count.values().all(|n| *n == 1), "{count:?}");
    for l in text.lines() {
        let parts: Vec<&str> = l.split_whitespace().collect();
        let at = crate::accounted::secs(parts[1]) * 1000;
        let started = parts[2].parse::<i64>().unwrap() / 1_000_000;
        let offset = want.iter().find(|(k, _)| k == parts[0]).unwrap().1;
        let late = started - at - offset;
        assert!(
            (-60..=700).contains(&late),
            "{l}: started {late} ms from instant + offset {offset}\n{}",
            replica_err(&file)
        );
    }

    // A plain firing, right at an even second.
    let offset = offset_ms(&url, "*/2 * * * * *", "1500ms", "jit-plain");
    assert!(wait_for(Duration::from_secs(3), || {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap();
        t.as_secs().is_multiple_of(2) && t.subsec_millis() < 100
    }));
    let fired = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let instant = fired / 2000 * 2000;
    let started = dir.join("plain");
    let plain = run(cronlock_at(&url)
        .args([
            "--schedule",
            "*/2 * * * * *",
            "--jitter",
            "1500ms",
            "jit-plain",
            "-c",
        ])
        .arg(format!("date +%s%N > {}", started.display())));
    assert_eq!(code(&plain), 0, "{}", stderr(&plain));
    let at = std::fs::read_to_string(&started)
        .unwrap()
        .trim()
        .parse::<i64>()
        .unwrap()
        / 1_000_000;
    let late = at - instant - offset;
    assert!(
        (-60..=700).contains(&late),
        "started {late} ms from instant + offset {offset}"
    );

    refused(
        &url,
        &["--schedule", "* * * * * *", "--jitter", "2s"],
        &["--jitter", "period"],
    );
}

/// Each even second of `span` (a job every 2 s) either ran (`ran`, its instants in s) or is in
/// `book` (`accounted::ledger`) as skipped for an overlap; never both.
fn ran_or_skipped_for_overlap(
    ran: &[i64],
    book: &[(i64, String, Option<String>)],
    span: std::ops::RangeInclusive<i64>,
) {
    for at in span.filter(|t| t % 2 == 0) {
        let did = ran.contains(&at);
        let skipped = book.iter().any(|(t, st, reason)| {
            *t == at && st == "skipped" && reason.as_deref() == Some("overlap")
        });
        assert!(
            did ^ skipped,
            "{at}: ran {did}, skipped {skipped}: {book:?}\n{ran:?}"
        );
    }
}

/// `--overlap queue` on a fleet of three replicas, a job every 2 s that takes 3 s: no two runs
/// ever overlap; an instant that finds the lock held waits (one at most) and starts right after
/// the run before it ends; every instant ran or is recorded skipped (overlap). A bad policy is
/// one line.
#[test]
fn overlap_queue_runs_the_waiting_instant_when_the_run_before_ends() {
    let r = Redis::start();
    let url = r.url();
    let dir = scratch("policies-queue");
    let out = dir.join("runs");
    let file = crontab(
        &dir,
        &format!(
            "CRON_TZ=UTC\n*/2 * * * * * --overlap queue --ttl 5s slowq \
             echo start $CRONLOCK_INSTANT $(date +%s%N) >> {o}; sleep 3; \
             echo end $CRONLOCK_INSTANT $(date +%s%N) >> {o}\n",
            o = out.display()
        ),
    );
    let fleet: Vec<_> = (0..3).map(|_| replica(&url, &file, &[])).collect();
    let began = now_secs();
    assert!(wait_for(Duration::from_secs(30), || {
        crate::common::replicas::instants(&out)
            .iter()
            .filter(|l| l.starts_with("end "))
            .count()
            >= 5
    }));
    let to = now_secs() - 4;
    for c in fleet {
        stop(c);
    }
    // start/end lines: (instant in s, kind, ms).
    let lines: Vec<(i64, String, i64)> = crate::common::replicas::instants(&out)
        .iter()
        .map(|l| {
            let p: Vec<&str> = l.split_whitespace().collect();
            (
                crate::accounted::secs(p[1]),
                p[0].to_string(),
                p[2].parse::<i64>().unwrap() / 1_000_000,
            )
        })
        .collect();
    let mut runs: Vec<(i64, i64, Option<i64>)> = Vec::new();
    for (at, kind, ms) in &lines {
        match kind.as_str() {
            "start" => runs.push((*at, *ms, None)),
            _ => {
                if let Some(r) = runs.iter_mut().find(|r| r.0 == *at) {
                    r.2 = Some(*ms);
                }
            }
        }
    }
    runs.sort_by_key(|r| r.1);
    let mut waited = 0;
    for pair in runs.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        let Some(end) = a.2 else { continue };
        assert!(
            b.1 >= end,
            "{} started at {} before {} ended at {end}: {lines:?}",
            b.0,
            b.1,
            a.0
        );
        // A run that starts after its own instant's second began waited for the one before.
        if b.1 - b.0 * 1000 > 500 {
            waited += 1;
            assert!(
                b.1 - end <= 400,
                "{} waited and started {} ms after {} ended\n{}",
                b.0,
                b.1 - end,
                a.0,
                replica_err(&file)
            );
        }
    }
    assert!(waited >= 1, "no instant waited: {runs:?}");
    let ran: Vec<i64> = runs.iter().map(|r| r.0).collect();
    let book = ledger(&url, "slowq");
    ran_or_skipped_for_overlap(&ran, &book, began + 2..=to);
    // (An instant that waited when the fleet stopped stays queued: the first replica to find the
    // lock free runs it first.)
    assert!(
        !book
            .iter()
            .any(|(t, st, _)| *t <= to && (st == "queued" || st == "running")),
        "{book:?}"
    );

    let every_minute = ["--schedule", "* * * * *", "--overlap"];
    refused(
        &url,
        &[&every_minute[..], &["later"]].concat(),
        &["--overlap"],
    );
    let with_catch_up = [&every_minute[..], &["queue", "--catch-up", "1h"]].concat();
    refused(&url, &with_catch_up, &["--overlap queue", "--catch-up"]);
}

/// The start lines (`start INSTANT NANOS`) and the last sign of life (`alive INSTANT NANOS`,
/// written every 100 ms) of each instant's command in `out`, as `(instant s, start ms, last ms)`,
/// in the order they started.
fn lives(out: &std::path::Path) -> Vec<(i64, i64, i64)> {
    let mut all: Vec<(i64, i64, i64)> = Vec::new();
    for line in crate::common::replicas::instants(out) {
        let p: Vec<&str> = line.split_whitespace().collect();
        let (Some(kind), Some(at), Some(ns)) = (p.first(), p.get(1), p.get(2)) else {
            continue;
        };
        let (at, ms) = (
            crate::accounted::secs(at),
            ns.parse::<i64>().unwrap() / 1_000_000,
        );
        match (*kind, all.iter_mut().find(|r| r.0 == at)) {
            ("start", None) => all.push((at, ms, ms)),
            ("start", Some(_)) => panic!("{at} started twice"),
            (_, Some(r)) => r.2 = r.2.max(ms),
            _ => {}
        }
    }
    all.sort_by_key(|r| r.1);
    all
}

/// A command for `lives`: its start, then a sign of life every 100 ms until it is killed
/// (SIGTERM ignored unless `term` says otherwise).
fn lively(out: &std::path::Path, term: &str) -> String {
    format!(
        "trap '{term}' TERM; echo start $CRONLOCK_INSTANT $(date +%s%N) >> {o}; \
         while :; do echo alive $CRONLOCK_INSTANT $(date +%s%N) >> {o}; sleep 0.1; done",
        o = out.display()
    )
}

/// `--overlap replace` on a fleet of three replicas, a job every 2 s that never ends by itself
/// and ignores SIGTERM: each instant's run stops the one before it (SIGKILL after `--grace 1s`:
/// its process gone within the grace and half a second of the new instant), the new command
/// starts only once the old one is gone, the replaced instants read `replaced` with their end,
/// and the fencing token still rises.
#[test]
fn overlap_replace_stops_the_run_before_and_never_overlaps() {
    let r = Redis::start();
    let url = r.url();
    let dir = scratch("policies-replace");
    let out = dir.join("runs");
    let file = crontab(
        &dir,
        &format!(
            "CRON_TZ=UTC\n*/2 * * * * * --overlap replace --grace 1s --ttl 5s slowr {}\n",
            lively(&out, "")
        ),
    );
    let fleet: Vec<_> = (0..3).map(|_| replica(&url, &file, &[])).collect();
    assert!(wait_for(Duration::from_secs(30), || lives(&out).len() >= 4));
    for c in fleet {
        stop(c);
    }
    let runs = lives(&out);
    for pair in runs.windows(2) {
        let ((a, _, a_last), (b, b_start, _)) = (pair[0], pair[1]);
        assert!(
            a_last < b_start,
            "{b} started at {b_start} while {a} still ran ({a_last}): {runs:?}"
        );
        assert!(
            a_last <= b * 1000 + 1500,
            "{a} lived until {a_last}, over 1.5 s after {b}: {runs:?}\n{}",
            replica_err(&file)
        );
    }
    let v: serde_json::Value = serde_json::from_str(&stdout(&run(
        cronlock_at(&url).args(["--status", "--json", "slowr"])
    )))
    .unwrap();
    let entries = v["ledger"].as_array().unwrap();
    let mut fences = Vec::new();
    for (at, ..) in &runs[..runs.len() - 1] {
        let e = entries
            .iter()
            .find(|e| e["instant"].as_i64().unwrap() / 1000 == *at)
            .unwrap_or_else(|| panic!("no entry for {at}: {v}"));
        assert_eq!(e["state"], "replaced", "{at}: {v}");
        let last = &e["attempts"][0];
        assert!(last["ended"].as_i64().is_some(), "{at} never ended: {v}");
        assert!(last["replaced"].as_i64().is_some(), "{at}: {v}");
        fences.push(last["fence"].as_str().unwrap().parse::<i64>().unwrap());
    }
    assert!(fences.windows(2).all(|f| f[0] < f[1]), "{fences:?}");
}

/// `--overlap replace` whose run before is frozen (its cronlock SIGSTOPped, so it never hears of
/// the takeover and never reports its end): the new command still waits until that run's command
/// is gone (its guard stops it before its lock would have lapsed), and starts after it.
#[test]
fn replace_waits_for_a_frozen_runs_command_to_be_gone() {
    let r = Redis::start();
    let url = r.url();
    let dir = scratch("policies-replace-frozen");
    let out = dir.join("runs");
    let fire = || {
        cronlock_at(&url)
            .args(["--schedule", "*/4 * * * * *", "--overlap", "replace"])
            .args(["--ttl", "5s", "--grace", "1s", "frozen-before"])
            .args(["--", "sh", "-c", &lively(&out, "")])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap()
    };
    // Fire right after an instant (so the next firing, 4 s later, is the next instant's).
    let wall = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64
    };
    std::thread::sleep(Duration::from_millis(4000 - wall() % 4000 + 100));
    let mut before = fire();
    assert!(wait_for(Duration::from_secs(3), || !lives(&out).is_empty()));
    signal(before.id() as i32, libc::SIGSTOP);
    std::thread::sleep(Duration::from_millis(4000 - wall() % 4000 + 100));
    let after = fire();
    assert!(
        wait_for(Duration::from_secs(12), || lives(&out).len() == 2),
        "{:?}",
        lives(&out)
    );
    let runs = lives(&out);
    let ((a, _, a_last), (b, b_start, _)) = (runs[0], runs[1]);
    assert!(a < b, "{runs:?}");
    assert!(
        a_last < b_start,
        "{b} started at {b_start} while the frozen run's command still ran ({a_last})"
    );
    signal(before.id() as i32, libc::SIGCONT);
    let ended = wait_for(Duration::from_secs(10), || {
        before.try_wait().unwrap().is_some()
    });
    assert!(ended, "the frozen run never ended after SIGCONT");
    let mut after = after;
    signal(after.id() as i32, libc::SIGKILL);
    assert!(wait_for(Duration::from_secs(10), || {
        after.try_wait().unwrap().is_some()
    }));
}

/// `--overlap allow --limit 2` on a fleet of three replicas, a job every 2 s that takes 5 s:
/// instants run side by side, each once, never more than two at once; an instant that finds two
/// running is recorded skipped (overlap). Every instant ran or is recorded.
#[test]
fn overlap_allow_runs_instants_side_by_side_up_to_the_limit() {
    let r = Redis::start();
    let url = r.url();
    let dir = scratch("policies-allow");
    let out = dir.join("runs");
    let file = crontab(
        &dir,
        &format!(
            "CRON_TZ=UTC\n*/2 * * * * * --overlap allow --limit 2 --ttl 3s slowa \
             echo start $CRONLOCK_INSTANT $(date +%s%N) >> {o}; sleep 5; \
             echo alive $CRONLOCK_INSTANT $(date +%s%N) >> {o}\n",
            o = out.display()
        ),
    );
    let fleet: Vec<_> = (0..3).map(|_| replica(&url, &file, &[])).collect();
    let began = now_secs();
    assert!(wait_for(Duration::from_secs(40), || {
        lives(&out).iter().filter(|r| r.2 > r.1).count() >= 3
    }));
    let to = now_secs() - 6;
    for c in fleet {
        stop(c);
    }
    let runs: Vec<_> = lives(&out).into_iter().filter(|r| r.2 > r.1).collect();
    let mut side_by_side = 0;
    for (i, (at, start, _)) in runs.iter().enumerate() {
        let running = runs[..i].iter().filter(|r| r.2 > *start).count();
        assert!(running < 2, "{at} started with {running} running: {runs:?}");
        side_by_side += usize::from(running == 1);
    }
    assert!(
        side_by_side >= 1,
        "no two instants ran side by side: {runs:?}"
    );
    let ran: Vec<i64> = runs.iter().map(|r| r.0).collect();
    let book = ledger(&url, "slowa");
    ran_or_skipped_for_overlap(&ran, &book, began + 2..=to);
    assert!(
        book.iter().any(|(_, st, _)| st == "skipped"),
        "nothing beyond the limit: {book:?}"
    );
}

/// Each policy with three hosts whose clocks differ by 2 s: the test fires `cronlock --schedule`
/// for two instants as their crons would, 2 s early, on time and 2 s late, for a job every 6 s
/// that takes 8 s. Every instant runs at most once (Redis's clock names the instant, whichever
/// host fired); it ran or is recorded skipped; under skip, queue and replace no two runs
/// overlap, under allow they do; under replace the first was replaced.
#[test]
fn each_policy_holds_across_hosts_whose_clocks_differ_by_2s() {
    const POLICIES: [&str; 4] = ["skip", "queue", "replace", "allow"];
    let r = Redis::start();
    let url = r.url();
    let dir = scratch("policies-skew");
    let wall = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64
    };
    // Two instants of */6, the first one's earliest firing just ahead.
    let first = (wall() + 2200) / 6000 * 6000 + 6000;
    let instants = [first, first + 6000];
    let mut firings: Vec<(i64, &str)> = Vec::new();
    for at in instants {
        for skew in [-2000, 0, 2000] {
            firings.extend(POLICIES.iter().map(|p| (at + skew, *p)));
        }
    }
    firings.sort();
    let mut hosts = Vec::new();
    for (at, policy) in firings {
        // The hosts' crons: each firing at its own clock's time (a bounded wait, not an event).
        let ahead = (at - wall()).clamp(0, 20_000) as u64;
        std::thread::sleep(Duration::from_millis(ahead));
        let out = dir.join(policy);
        let job = format!(
            "echo start $CRONLOCK_INSTANT $(date +%s%N) >> {o}; i=0; while [ $i -lt 80 ]; do \
             echo alive $CRONLOCK_INSTANT $(date +%s%N) >> {o}; sleep 0.1; i=$((i+1)); done",
            o = out.display()
        );
        hosts.push(
            cronlock_at(&url)
                .args(["--schedule", "*/6 * * * * *", "--overlap", policy])
                .args(["--ttl", "3s", "--grace", "1s", &format!("skew-{policy}")])
                .args(["--", "sh", "-c", &job])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap(),
        );
    }
    for mut h in hosts {
        assert!(
            wait_for(Duration::from_secs(30), || h.try_wait().unwrap().is_some()),
            "a host's run never ended"
        );
    }
    for policy in POLICIES {
        let runs = lives(&dir.join(policy));
        let book = ledger(&url, &format!("skew-{policy}"));
        for at in instants.map(|ms| ms / 1000) {
            let ran = runs.iter().any(|r| r.0 == at);
            let skipped = book.iter().any(|(t, st, _)| *t == at && st == "skipped");
            assert!(
                ran ^ skipped,
                "{policy} {at}: ran {ran}: {book:?}\n{runs:?}"
            );
        }
        let overlaps = runs.windows(2).filter(|p| p[0].2 >= p[1].1).count();
        if policy == "allow" {
            assert!(overlaps > 0, "allow: no overlap: {runs:?}");
            assert_eq!(runs.len(), 2, "allow: {runs:?}");
        } else {
            assert_eq!(overlaps, 0, "{policy}: runs overlap: {runs:?}");
        }
        if policy == "replace" {
            let replaced = book.iter().filter(|(_, st, _)| st == "replaced").count();
            assert_eq!(replaced, 1, "replace: {book:?}\n{runs:?}");
        }
    }
}

/// `--trigger` of a KEY no replica of the fleet serves: one line and 69 once the fleet had its
/// time to take it, with nothing left in Redis (no key of its own, no poke).
#[test]
fn trigger_of_a_key_nobody_serves_leaves_nothing() {
    let r = Redis::start();
    let url = r.url();
    let dir = scratch("policies-trigger-nobody");
    let file = trigger_crontab(&dir);
    let fleet: Vec<_> = (0..2).map(|_| replica(&url, &file, &[])).collect();
    let out = trigger_of(&url, &["nobody-serves-this"]);
    assert_eq!(code(&out), 69, "{}", stderr(&out));
    assert_eq!(stderr(&out).lines().count(), 1, "{}", stderr(&out));
    assert!(stderr(&out).starts_with("cronlock: "), "{}", stderr(&out));
    // Nothing left: no key of its own, no poke.
    let after = r.keys();
    assert!(
        !after.iter().any(|k| k.contains("nobody-serves-this")),
        "{after:?}"
    );
    for pokes in after.iter().filter(|k| k.ends_with(":pokes")) {
        let left: Vec<String> = r.query(redis::cmd("ZRANGE").arg(pokes).arg(0).arg(-1));
        assert!(
            !left.iter().any(|p| p.starts_with("nobody-serves-this\n")),
            "{left:?}"
        );
    }
    // `--wait` bounds it all: a wait of 2 s ends within it, with the same 69 and line.
    let began = std::time::Instant::now();
    let out = trigger_of(&url, &["--wait", "2s", "nobody-serves-this"]);
    let took = began.elapsed();
    assert_eq!(code(&out), 69, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("within 2s (--wait)"),
        "{}",
        stderr(&out)
    );
    assert!(took < Duration::from_secs(8), "{took:?}");
    for c in fleet {
        stop(c);
    }
}

/// `--trigger --wait` of a job `name` of a fleet of two replicas at `url` (any topology): exit 0,
/// one run, a manual instant in the ledger.
pub fn trigger_once(url: &str, name: &str) {
    let dir = scratch(name);
    let file = crontab(&dir, &runs_crontab(&dir, "0 0 1 1 *", &[name]));
    let fleet: Vec<_> = (0..2).map(|_| replica(url, &file, &[])).collect();
    let out = trigger_of(url, &["--wait", "20s", name]);
    for c in fleet {
        stop(c);
    }
    assert_eq!(
        code(&out),
        0,
        "{}{}\n{}",
        stdout(&out),
        stderr(&out),
        replica_err(&file)
    );
    assert_eq!(runs(&dir).0.len(), 1);
    let status = run(cronlock_at(url).args(["--status", "--json", name]));
    let v: serde_json::Value = serde_json::from_str(&stdout(&status)).unwrap();
    assert_eq!(v["ledger"][0]["manual"], true, "{v}");
}

/// Sleep until 100 ms after the next multiple of `period_ms` on the wall clock: a firing then is
/// that instant's (a host's cron, not a wait for an event).
fn just_after_an_instant(period_ms: u64) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    std::thread::sleep(Duration::from_millis(period_ms - now % period_ms + 100));
}

/// `--overlap replace` and `--overlap allow` at `url` (any topology), with plain firings of
/// `*/2 * * * * *` one instant apart: under replace the second run starts only after the first
/// one's command is gone, which reads `replaced`; under allow the two run side by side.
pub fn replace_and_allow_on(url: &str, name: &str) {
    let dir = scratch(name);
    let fire = |policy: &str, job: &str| {
        cronlock_at(url)
            .args(["--schedule", "*/2 * * * * *", "--overlap", policy])
            .args(["--ttl", "5s", "--grace", "1s", &format!("{name}-{policy}")])
            .args(["--", "sh", "-c", job])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap()
    };
    let replaced_out = dir.join("replace");
    let short = |out: &std::path::Path, secs: u32| {
        format!(
            "echo start $CRONLOCK_INSTANT $(date +%s%N) >> {o}; sleep {secs}; \
             echo alive $CRONLOCK_INSTANT $(date +%s%N) >> {o}",
            o = out.display()
        )
    };
    just_after_an_instant(2000);
    let mut first = fire("replace", &lively(&replaced_out, ""));
    assert!(wait_for(Duration::from_secs(3), || !lives(&replaced_out).is_empty()));
    just_after_an_instant(2000);
    let mut second = fire("replace", &short(&replaced_out, 0));
    let allow_out = dir.join("allow");
    let mut side = fire("allow", &short(&allow_out, 3));
    just_after_an_instant(2000);
    let mut by = fire("allow", &short(&allow_out, 0));
    for c in [&mut first, &mut second, &mut side, &mut by] {
        assert!(wait_for(Duration::from_secs(15), || c
            .try_wait()
            .unwrap()
            .is_some()));
    }
    let runs = lives(&replaced_out);
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert!(
        runs[0].2 < runs[1].1,
        "replace: the two ran at once: {runs:?}"
    );
    let book = ledger(url, &format!("{name}-replace"));
    assert!(
        book.iter()
            .any(|(t, st, _)| *t == runs[0].0 && st == "replaced"),
        "{book:?}"
    );
    let runs = lives(&allow_out);
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert!(runs[0].2 > runs[1].1, "allow: not side by side: {runs:?}");
}

/// `--trigger` of jobs that run often (every second, every 2 s), 300 ms into an odd second when
/// nothing of KEY runs: the replica learns of it with its heartbeat, in the slot where it also
/// claims the next second's instants, and the manual instant must not be skipped for the run
/// that slot starts after it was asked. Each `--trigger --wait` exits 0 and its command ran.
#[test]
fn trigger_runs_a_job_that_runs_often_at_once() {
    let r = Redis::start();
    let url = r.url();
    let dir = scratch("policies-trigger-often");
    let d = dir.display();
    let file = crontab(
        &dir,
        &format!(
            "CRON_TZ=UTC\n\
             * * * * * * every1 echo $CRONLOCK_MANUAL >> {d}/every1\n\
             */2 * * * * * every2 echo $CRONLOCK_MANUAL >> {d}/every2\n"
        ),
    );
    let c = replica(&url, &file, &[]);
    let manual = |key: &str| {
        std::fs::read_to_string(dir.join(key))
            .unwrap_or_default()
            .lines()
            .filter(|l| *l == "1")
            .count()
    };
    for round in 1..=3 {
        for key in ["every1", "every2"] {
            // 300 ms into an odd second: the next second is every2's instant.
            just_after_an_instant(1000);
            if (now_secs() % 2) == 0 {
                just_after_an_instant(1000);
            }
            std::thread::sleep(Duration::from_millis(200));
            let out = trigger_of(&url, &["--wait", "10s", key]);
            assert_eq!(
                code(&out),
                0,
                "round {round}, {key}: {}{}\n{}",
                stdout(&out),
                stderr(&out),
                replica_err(&file)
            );
            assert!(
                stdout(&out).contains("succeeded"),
                "round {round}, {key}: {}",
                stdout(&out)
            );
            assert_eq!(manual(key), round, "{key}");
        }
    }
    stop(c);
}

/// A manual instant runs at most once while its request exists, whatever the ledger keeps: its
/// run succeeded, then its ledger entry is gone (the ledger keeps its 64 newest instants: a job
/// due every second drops it within minutes), and a replica that starts while the trigger's
/// poke lasts (600 s) claims it: it must not run it again (the request says it was taken).
#[test]
fn a_manual_instant_never_runs_twice_once_the_ledger_dropped_it() {
    let r = Redis::start();
    let url = r.url();
    let dir = scratch("policies-manual-once");
    let d = dir.display();
    let file = crontab(
        &dir,
        &format!(
            "CRON_TZ=UTC\n\
             0 0 1 1 * yearly echo ran >> {d}/yearly\n\
             * * * * * * tick echo $CRONLOCK_INSTANT >> {d}/tick\n"
        ),
    );
    let first = replica(&url, &file, &[]);
    let out = trigger_of(&url, &["--wait", "10s", "yearly"]);
    assert_eq!(code(&out), 0, "{}{}", stdout(&out), stderr(&out));
    let v: serde_json::Value = serde_json::from_str(&stdout(&run(
        cronlock_at(&url).args(["--status", "--json", "yearly"])
    )))
    .unwrap();
    let instant = v["ledger"][0]["instant"].as_i64().unwrap();
    r.query::<()>(
        redis::cmd("HDEL")
            .arg("cronlock:{yearly}:ledger")
            .arg(instant),
    );
    let ticks = || {
        std::fs::read_to_string(dir.join("tick"))
            .unwrap_or_default()
            .lines()
            .count()
    };
    let second = replica(&url, &file, &[]);
    // The newcomer's heartbeats bring the poke; a few seconds of ticks later it has claimed it.
    let before = ticks();
    assert!(wait_for(Duration::from_secs(15), || ticks() >= before + 4));
    let ran = std::fs::read_to_string(dir.join("yearly")).unwrap_or_default();
    assert_eq!(ran.lines().count(), 1, "{ran}\n{}", replica_err(&file));
    stop(first);
    stop(second);
}

/// A claim of the instant that waits (`--overlap queue`) that is undone (here its reply is lost:
/// the server answers too slowly) gives the instant back: it waits again, first in line, and the
/// next firing runs it. Before, the undo deleted its entry and its name: the instant was gone
/// with no record.
#[test]
fn an_undone_claim_of_the_waiting_instant_lets_it_wait_again() {
    let r = Redis::start_tcp();
    let url = r.url();
    let proxy = crate::common::hostile::Hostile::start(r.port);
    let dir = scratch("policies-queue-undo");
    let fire = |url: &str, cmd: &str| {
        cronlock_at(url)
            .args(["-E", "75", "--connect-timeout", "500ms"])
            .args([
                "--schedule",
                "* * * * * *",
                "--overlap",
                "queue",
                "k",
                "-c",
                cmd,
            ])
            .current_dir(&dir)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    just_after_an_instant(1000);
    let holder = fire(&url, "sleep 2.5");
    just_after_an_instant(1000);
    let waits = fire(&url, "touch second").wait_with_output().unwrap();
    assert_eq!(code(&waits), 75, "{}", stderr(&waits));
    let queued = || {
        ledger(&url, "k")
            .into_iter()
            .filter(|(_, st, _)| st == "queued")
            .map(|(at, _, _)| at)
            .collect::<Vec<i64>>()
    };
    let waiting = queued();
    assert_eq!(waiting.len(), 1, "{:?}", ledger(&url, "k"));
    let out = holder.wait_with_output().unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    // Its claim's reply is lost: undone.
    proxy.set(crate::common::hostile::Mischief::Drip);
    just_after_an_instant(1000);
    let lost = fire(&proxy.url(), "touch lost").wait_with_output().unwrap();
    assert_eq!(code(&lost), 125, "{}", stderr(&lost));
    assert!(!dir.join("lost").exists());
    assert_eq!(queued(), waiting, "{:?}", ledger(&url, "k"));
    // The next firing runs it.
    just_after_an_instant(1000);
    let next = fire(&url, "touch ran").wait_with_output().unwrap();
    assert_eq!(code(&next), 0, "{}", stderr(&next));
    let book = ledger(&url, "k");
    assert!(
        book.iter()
            .any(|(at, st, _)| *at == waiting[0] && st == "succeeded"),
        "{book:?}"
    );
}

/// The trigger requests of a KEY are bounded as its ledger is: a KEY triggered more often than
/// daily (its requests kept a day from the last one) keeps its newest, never a growing hash. Here
/// 100 earlier requests are there when one more comes: at most 80 are left (64 newest, trimmed in
/// batches of 16), the new one among them, and it runs.
#[test]
fn trigger_requests_are_trimmed_to_the_newest() {
    let r = Redis::start();
    let url = r.url();
    let dir = scratch("policies-trigger-trim");
    let file = trigger_crontab(&dir);
    let c = replica(&url, &file, &[]);
    let requests = "cronlock:{ok}:trigger";
    for at in 1..=100 {
        r.query::<()>(
            redis::cmd("HSET")
                .arg(requests)
                .arg(1_700_000_000_000i64 + at)
                .arg(r#"{"state":"accepted","asked":1700000000000}"#),
        );
    }
    let out = trigger_of(&url, &["--wait", "10s", "ok"]);
    assert_eq!(code(&out), 0, "{}{}", stdout(&out), stderr(&out));
    let left: i64 = r.query(redis::cmd("HLEN").arg(requests));
    assert!((64..=80).contains(&left), "{left}");
    let oldest: Option<String> =
        r.query(redis::cmd("HGET").arg(requests).arg(1_700_000_000_001i64));
    assert_eq!(oldest, None);
    assert_eq!(runs(&dir).0.len(), 1);
    stop(c);
}

/// A manual instant whose claim is undone before its run gives its request back, and runs
/// later: under `--overlap replace` the second trigger's run waits for the first's command to
/// stop (it ignores SIGTERM: 2 s, its `--grace`); its replica is stopped meanwhile (`--drain
/// 100ms`), so that run is told to end before its command started and undoes its claim. A
/// replica started next takes the instant again (its poke lasts) and runs it: the request was
/// asked again, not left taken with no run (which a manual instant taken never runs again).
#[test]
fn an_undone_manual_instant_is_asked_again_and_runs() {
    let r = Redis::start();
    let url = r.url();
    let dir = scratch("policies-manual-undo");
    let d = dir.display();
    let file = crontab(
        &dir,
        &format!(
            "CRON_TZ=UTC\n\
             0 0 1 1 * --overlap replace --ttl 10s --grace 2s twice \
             echo $CRONLOCK_INSTANT_MS >> {d}/ran; trap '' TERM; sleep 30\n"
        ),
    );
    let first = replica(&url, &file, &["--drain", "100ms", "--grace", "8s"]);
    let ran = || {
        std::fs::read_to_string(dir.join("ran"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect::<Vec<String>>()
    };
    let out = trigger_of(&url, &["twice"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(wait_for(Duration::from_secs(10), || ran().len() == 1));
    let out = trigger_of(&url, &["twice"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let said = stop(first);
    assert_eq!(
        ran().len(),
        1,
        "the second ran on the stopping replica: {said:?}"
    );
    let second = replica(&url, &file, &[]);
    let again = wait_for(Duration::from_secs(20), || ran().len() == 2);
    let book = ledger(&url, "twice");
    stop(second);
    assert!(again, "{:?} {book:?}\n{}", ran(), replica_err(&file));
    assert_ne!(ran()[0], ran()[1]);
}

/// `--overlap replace`: the new instant's run waits for the run it replaced to stop (here 2 s: it
/// traps SIGTERM), and its replica is SIGKILLed meanwhile. Its run never starts its command and
/// gives its claim back, after the other replica judged the instant decided: the instant is
/// recorded (`interrupted`), never lost without a word, and nothing reads `running` once the
/// locks lapsed.
#[test]
fn a_replacing_run_whose_replica_dies_while_it_waits_is_recorded() {
    let r = Redis::start();
    let url = r.url();
    let dir = scratch("policies-replace-dies");
    let starts = dir.join("starts");
    let file = crontab(
        &dir,
        &format!(
            "CRON_TZ=UTC\n*/4 * * * * * --overlap replace --ttl 10s --grace 4s rdie echo \
             $CRONLOCK_INSTANT_MS >> {}; trap 'sleep 2; exit 0' TERM; sleep 6 & wait\n",
            starts.display()
        ),
    );
    let mut fleet: Vec<_> = (0..2).map(|_| replica(&url, &file, &[])).collect();
    let first = {
        assert!(wait_for(Duration::from_secs(15), || {
            !crate::common::replicas::instants(&starts).is_empty()
        }));
        crate::common::replicas::instants(&starts)[0]
            .parse::<i64>()
            .unwrap()
    };
    // The next instant replaces it: once its lock names another run, that run's replica dies.
    let holder = || {
        let v: Option<String> = r.query(redis::cmd("GET").arg("cronlock:{rdie}"));
        v.and_then(|v| serde_json::from_str::<serde_json::Value>(&v).ok())
    };
    let next = first + 4000;
    let mut replacer = None;
    assert!(wait_for(Duration::from_secs(10), || {
        replacer = holder().filter(|h| h["started"].as_i64() > Some(next - 1000));
        replacer.is_some()
    }));
    let pid = replacer.unwrap()["pid"].as_u64().unwrap() as u32;
    let i = fleet
        .iter()
        .position(|c| c.id() == pid)
        .unwrap_or_else(|| panic!("the replacing lock's pid {pid} is no replica's"));
    // Once its run is there, waiting (no command under it yet).
    use crate::common::replicas::{children_of, starter_of};
    let waiting = || {
        starter_of(pid)
            .map(children_of)
            .unwrap_or_default()
            .into_iter()
            .any(|run| children_of(run).is_empty())
    };
    assert!(
        wait_for(Duration::from_secs(5), waiting),
        "{}",
        replica_err(&file)
    );
    // After the other replica checked the instant (250 ms after it) and found it decided.
    let now_ms = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64
    };
    assert!(wait_for(Duration::from_secs(5), || now_ms() >= next + 700));
    assert!(waiting(), "{}", replica_err(&file));
    signal(pid as i32, libc::SIGKILL);
    fleet.remove(i).wait().unwrap();
    let said = || replica_err(&file);
    let recorded = || {
        ledger(&url, "rdie")
            .iter()
            .any(|(at, st, _)| *at * 1000 == next && st != "running")
    };
    assert!(
        wait_for(Duration::from_secs(20), recorded),
        "{next}: {:?}\n{}",
        ledger(&url, "rdie"),
        said()
    );
    for c in fleet {
        stop(c);
    }
}
