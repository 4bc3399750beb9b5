//! What schedulers' users ask for: `H` fields drawn from KEY (the same on every host and after a
//! restart, spread over the range), and a suspension that ends by itself (`--suspend --for`).

use std::time::Duration;

use crate::accounted::{ledger, now_secs, runs};
use crate::common::replicas::{crontab, replica, replica_err, stop};
use crate::common::*;

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
    let out = run(cronlock_at(&url).args(["--schedule", "H(70-80) * * * *", "k", "--", "true"]));
    assert_eq!(code(&out), 125, "{}", stderr(&out));
    assert!(stderr(&out).contains("minute"), "{}", stderr(&out));
    assert_eq!(stderr(&out).lines().count(), 1, "{}", stderr(&out));
}

/// A fleet of two replicas runs `H/3 * * * * *` (seconds) at the seconds KEY draws, each once,
/// and a replica started again draws the same seconds.
#[test]
fn a_fleet_runs_h_fields_at_the_drawn_times() {
    let r = Redis::start();
    let url = r.url();
    let dir = scratch("policies-h");
    let out = dir.join("runs");
    let line = |key: &str| {
        format!(
            "H/3 * * * * * {key} echo {key} $CRONLOCK_INSTANT $(date +%s%N) >> {}\n",
            out.display()
        )
    };
    let file = crontab(
        &dir,
        &format!("CRON_TZ=UTC\n{}{}", line("h-a"), line("h-b")),
    );
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
    let out = dir.join("runs");
    let file = crontab(
        &dir,
        &format!(
            "CRON_TZ=UTC\n* * * * * * pause-0 echo pause-0 $CRONLOCK_INSTANT $(date +%s%N) >> {}\n",
            out.display()
        ),
    );
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
