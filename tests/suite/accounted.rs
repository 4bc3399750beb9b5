//! Every instant accounted for: a fleet that changes, fails or overloads runs each instant of
//! each job once, or records it in the ledger (`missed` with a reason, `skipped` for an
//! overlap); no instant reads `running` once its run is gone. The tests that bound how late a
//! run may start measure alone (`accounted/alone.rs`).

mod alone;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::replicas::{crontab, instants, replica, replica_err, stop};
use crate::common::*;

/// A crontab of `n` jobs every second (KEYs `PREFIX-0`...), each writing `KEY INSTANT NANOS` to
/// `runs` when it starts, then `then` (a command line, or nothing).
pub fn jobs(dir: &Path, prefix: &str, n: usize, opts: &str, then: &str) -> String {
    let runs = dir.join("runs");
    let mut text = String::from("CRON_TZ=UTC\n");
    for i in 0..n {
        let then = if then.is_empty() {
            String::new()
        } else {
            format!("; {then}")
        };
        text += &format!(
            "* * * * * * {opts} {prefix}-{i} echo {prefix}-{i} $CRONLOCK_INSTANT $(date +%s%N) >> {}{then}\n",
            runs.display()
        );
    }
    text
}

/// How often each (KEY, instant in Unix seconds) ran.
pub type Counts = BTreeMap<(String, i64), usize>;

/// How often each (KEY, instant in Unix seconds) ran, and how late each run started (instant,
/// ms late).
pub fn runs(dir: &Path) -> (Counts, Vec<(i64, i64)>) {
    let mut count = BTreeMap::new();
    let mut late = Vec::new();
    for line in instants(&dir.join("runs")) {
        let parts: Vec<&str> = line.split_whitespace().collect();
        let [key, at, nanos] = parts[..] else {
            continue;
        };
        let at = secs(at);
        *count.entry((key.to_string(), at)).or_default() += 1;
        if let Ok(n) = nanos.parse::<i64>() {
            late.push((at, n / 1_000_000 - at * 1000));
        }
    }
    (count, late)
}

/// An RFC 3339 instant in Unix seconds.
pub fn secs(rfc: &str) -> i64 {
    humantime::parse_rfc3339(rfc)
        .unwrap()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// Now, in Unix seconds.
pub fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// No instant ran twice.
pub fn assert_none_twice(count: &Counts) {
    let twice: Vec<_> = count.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "ran twice: {twice:?}");
}

/// Every job of `n` ran at every instant from `from` to `to` (Unix seconds, both included).
pub fn assert_all_ran(
    count: &Counts,
    (prefix, n): (&str, usize),
    (from, to): (i64, i64),
    why: &dyn Fn() -> String,
) {
    let mut lost = Vec::new();
    for at in from..=to {
        for i in 0..n {
            if !count.contains_key(&(format!("{prefix}-{i}"), at)) {
                lost.push(format!("{prefix}-{i}@{at}"));
            }
        }
    }
    assert!(lost.is_empty(), "never ran: {lost:?}\n{}", why());
}

/// KEY's ledger, as `--status --json` shows it: (instant in Unix seconds, state, reason).
pub fn ledger(url: &str, key: &str) -> Vec<(i64, String, Option<String>)> {
    let s = run(cronlock_at(url).args(["--status", "--json", key]));
    let v: serde_json::Value = serde_json::from_str(&stdout(&s)).unwrap();
    v["ledger"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["instant"].as_i64().unwrap() / 1000,
                e["state"].as_str().unwrap_or("?").to_string(),
                e["reason"].as_str().map(str::to_string),
            )
        })
        .collect()
}

/// More jobs than the replica has room for: each instant of each job either ran once (and the
/// ledger says how it ended) or is recorded with a reason (`missed`, or `skipped` for an
/// overlap); none ran twice.
#[test]
fn overload_records_every_instant_it_cannot_start() {
    let r = Redis::start();
    let dir = scratch("acc-overload");
    let file = crontab(&dir, &jobs(&dir, "over", 6, "", "sleep 0.9"));
    let c = replica(&r.url(), &file, &["--max-jobs", "2"]);
    let from = now_secs() + 2;
    let began = Instant::now();
    assert!(wait_for(Duration::from_secs(20), || began.elapsed()
        >= Duration::from_secs(7)));
    let to = now_secs() - 2;
    assert_eq!(stop(c), Some(0), "{}", replica_err(&file));
    let (count, _) = runs(&dir);
    assert_none_twice(&count);
    let mut missed = 0;
    for i in 0..6 {
        let key = format!("over-{i}");
        let book = ledger(&r.url(), &key);
        for at in from..=to {
            let ran = count.contains_key(&(key.clone(), at));
            let entry = book.iter().find(|(t, _, _)| *t == at);
            match (ran, entry) {
                (true, Some((_, state, _))) => assert_eq!(state, "succeeded", "{key}@{at}"),
                // Missed (no room in time), or skipped because its previous run still held KEY.
                (false, Some((_, state, reason))) => {
                    assert!(
                        state == "missed" || state == "skipped",
                        "{key}@{at}: {book:?}"
                    );
                    assert!(reason.is_some(), "{key}@{at}: {state} without a reason");
                    missed += usize::from(state == "missed");
                }
                (_, None) => panic!(
                    "{key}@{at} is not accounted for (ran: {ran}): {book:?}\n{}",
                    replica_err(&file)
                ),
            }
        }
    }
    assert!(missed > 0, "the replica was never over its room");
    assert!(
        replica_err(&file).contains("recorded missed (no_room)"),
        "{}",
        replica_err(&file)
    );
}

/// A replica SIGKILLed mid-run: its runs die with it, and their instants read `abandoned` (once
/// the job runs again), never `running`; every instant of every job is in the ledger.
#[test]
fn a_killed_replicas_runs_never_read_running() {
    let r = Redis::start();
    let dir = scratch("acc-killed");
    let file = crontab(&dir, &jobs(&dir, "kill", 4, "--ttl 2s", "sleep 0.6"));
    let mut fleet: Vec<_> = (0..2).map(|_| replica(&r.url(), &file, &[])).collect();
    let from = now_secs() + 2;
    assert!(wait_for(Duration::from_secs(10), || runs(&dir).0.len() >= 12));
    let mut victim = fleet.remove(0);
    signal(victim.id() as i32, libc::SIGKILL);
    victim.wait().unwrap();
    let killed = Instant::now();
    assert!(wait_for(Duration::from_secs(20), || killed.elapsed()
        >= Duration::from_secs(5)));
    let to = now_secs() - 2;
    for c in fleet {
        assert_eq!(stop(c), Some(0), "{}", replica_err(&file));
    }
    let (count, _) = runs(&dir);
    assert_none_twice(&count);
    for i in 0..4 {
        let key = format!("kill-{i}");
        let book = ledger(&r.url(), &key);
        assert!(
            book.iter().all(|(_, state, _)| state != "running"),
            "{key}: {book:?}\n{}",
            replica_err(&file)
        );
        for at in from..=to {
            assert!(
                book.iter().any(|(t, _, _)| *t == at),
                "{key}@{at} is not accounted for: {book:?}\n{}",
                replica_err(&file)
            );
        }
    }
    // The fleet left: no replica is left in its members.
    assert!(
        !r.keys().iter().any(|k| k.contains("~replicas:")),
        "{:?}",
        r.keys()
    );
}
