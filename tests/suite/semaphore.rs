//! `--limit N`: at most N holders of a KEY at once, each a full holder with a slot of its own.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::common::*;

/// A job that records, from inside the lock, its slot, fencing token and when it ran (ns).
fn recording_job(dir: &Path, secs: &str) -> String {
    format!(
        "cd {} && s=$(date +%s%N) && sleep {secs} && \
         echo \"$CRONLOCK_SLOT $CRONLOCK_FENCING_TOKEN $s $(date +%s%N)\" > run.$$",
        dir.display()
    )
}

/// (slot, fencing token, start ns, end ns) of every recorded run.
fn runs(dir: &Path) -> Vec<(u32, u64, u128, u128)> {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("run."))
        .map(|e| {
            let text = std::fs::read_to_string(e.path()).unwrap();
            let f: Vec<&str> = text.split_whitespace().collect();
            (
                f[0].parse().unwrap(),
                f[1].parse().unwrap(),
                f[2].parse().unwrap(),
                f[3].parse().unwrap(),
            )
        })
        .collect()
}

/// The most runs going on at once, and whether runs at the same time ever shared a slot.
fn peak(runs: &[(u32, u64, u128, u128)]) -> (usize, bool) {
    let mut most = 0;
    let mut clash = false;
    for (slot, _, start, _) in runs {
        let at: Vec<&(u32, u64, u128, u128)> = runs
            .iter()
            .filter(|(_, _, s, e)| s <= start && start < e)
            .collect();
        most = most.max(at.len());
        clash |= at.iter().filter(|r| r.0 == *slot).count() > 1;
    }
    (most, clash)
}

fn start(mut c: Command) -> Child {
    tie(&mut c);
    c.stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn eight_contenders_with_limit_three_run_three_at_a_time() {
    let r = Redis::start();
    let dir = scratch("semaphore-eight");
    let children: Vec<Child> = (0..8)
        .map(|_| {
            let mut c = cronlock(&r);
            c.args(["--limit", "3", "--wait", "1m", "sem", "sh", "-c"])
                .arg(recording_job(&dir, "0.4"));
            start(c)
        })
        .collect();
    // While three hold it: --status lists them, a fourth without --wait skips.
    assert!(wait_for(Duration::from_secs(10), || {
        let out = run(cronlock(&r).args(["--status", "--json", "sem"]));
        let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
        v["holders"].as_array().is_some_and(|h| h.len() == 3)
    }));
    let out = run(cronlock(&r).args(["--limit", "3", "-E", "75", "sem", "true"]));
    assert_eq!(code(&out), 75, "{}", stderr(&out));
    let codes = exit_codes(children);
    assert_eq!(codes, vec![0; 8]);
    let runs = runs(&dir);
    assert_eq!(runs.len(), 8);
    let (most, clash) = peak(&runs);
    assert_eq!(most, 3, "{runs:?}");
    assert!(!clash, "two holders at once had the same slot: {runs:?}");
    let mut tokens: Vec<u64> = runs.iter().map(|r| r.1).collect();
    tokens.sort();
    tokens.dedup();
    assert_eq!(tokens.len(), 8, "fencing tokens repeat: {runs:?}");
    // All gone: nothing of the semaphore is left but the records.
    assert!(!r.exists("cronlock:{sem}:limit"));
    for i in 0..3 {
        assert!(!r.exists(&format!("cronlock:{{sem}}:slot:{i}")));
    }
}

/// A mismatched --limit is refused (125, one line naming --limit and both numbers) while the
/// holders run on; so is a plain lock (--limit 1) while a semaphore is held, and the reverse.
#[test]
fn a_mismatched_limit_is_refused_and_disturbs_nobody() {
    let r = Redis::start();
    let dir = scratch("semaphore-mismatch");
    let mut c = cronlock(&r);
    c.args(["--limit", "3", "held", "sh", "-c"])
        .arg(format!("touch {}/started; sleep 1", dir.display()));
    let holder = start(c);
    assert!(wait_for(Duration::from_secs(10), || dir
        .join("started")
        .exists()));
    for limit in ["2", "1", "5"] {
        let out = run(cronlock(&r)
            .args(["--limit", limit, "held", "touch"])
            .arg(dir.join("ran")));
        assert_eq!(code(&out), 125, "{}", stderr(&out));
        let line = one_line(&out);
        assert!(
            line.contains("--limit 3") && line.contains(&format!("--limit {limit}")),
            "{line}"
        );
        assert!(!dir.join("ran").exists());
    }
    let out = holder.wait_with_output().unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    // The reverse: a plain holder, then --limit 2.
    let mut c = cronlock(&r);
    c.args(["plain", "sh", "-c"])
        .arg(format!("touch {}/plain; sleep 1", dir.display()));
    let holder = start(c);
    assert!(wait_for(Duration::from_secs(10), || dir
        .join("plain")
        .exists()));
    let out = run(cronlock(&r).args(["--limit", "2", "plain", "true"]));
    assert_eq!(code(&out), 125, "{}", stderr(&out));
    assert!(one_line(&out).contains("--limit 1"), "{}", stderr(&out));
    assert_eq!(code(&holder.wait_with_output().unwrap()), 0);
}

/// --force-release KEY releases every holder; --token T only that one; holders see 122.
#[test]
fn force_release_takes_every_holder_or_one_by_token() {
    let r = Redis::start();
    let dir = scratch("semaphore-force");
    let holders: Vec<Child> = (0..3)
        .map(|i| {
            let mut c = cronlock(&r);
            c.args(["--limit", "3", "k", "sh", "-c"]).arg(format!(
                "echo $CRONLOCK_TOKEN > {}/token{i}; sleep 30",
                dir.display()
            ));
            start(c)
        })
        .collect();
    let tokens: Vec<String> = (0..3)
        .map(|i| {
            let path = dir.join(format!("token{i}"));
            assert!(wait_for(Duration::from_secs(10), || {
                std::fs::read_to_string(&path).is_ok_and(|t| t.ends_with('\n'))
            }));
            std::fs::read_to_string(&path).unwrap().trim().to_string()
        })
        .collect();
    let out = run(cronlock(&r).args(["--force-release", "k", "--token", &tokens[1], "--json"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v["holders"].as_array().unwrap().len(), 1, "{v}");
    assert_eq!(v["holders"][0]["token"], tokens[1].as_str());
    let mut holders = holders;
    let second = holders.remove(1);
    assert_eq!(code(&second.wait_with_output().unwrap()), 122);
    let out = run(cronlock(&r).args(["--force-release", "k"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stdout(&out).lines().count(), 2, "{}", stdout(&out));
    assert_eq!(exit_codes(holders), vec![122, 122]);
    assert!(!r.exists("cronlock:{k}:limit"));
}

/// What --limit cannot go with: --schedule (once per instant is one run), several masters.
#[test]
fn limit_refusals() {
    let r = Redis::start();
    let out = run(cronlock(&r).args(["--limit", "2", "--schedule", "* * * * *", "k", "true"]));
    assert_eq!(code(&out), 125);
    assert!(one_line(&out).contains("--schedule"), "{}", stderr(&out));
    let (a, b) = (Redis::start_tcp(), Redis::start_tcp());
    let out = run(cronlock_at(&format!("{} {}", a.tcp_url(), b.tcp_url()))
        .args(["--limit", "2", "k", "true"]));
    assert_eq!(code(&out), 125);
    assert!(one_line(&out).contains("--limit 2"), "{}", stderr(&out));
    for bad in ["0", "65", "x"] {
        let out = run(cronlock(&r).args(["--limit", bad, "k", "true"]));
        assert_eq!(code(&out), 125, "{bad}");
        assert!(one_line(&out).contains("--limit"), "{}", stderr(&out));
    }
}

/// The run history records the slot.
#[test]
fn the_history_records_the_slot() {
    let r = Redis::start();
    let out = run(cronlock(&r).args(["--limit", "2", "k", "true"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let out = run(cronlock(&r).args(["--status", "--json", "k"]));
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v["last_run"]["slot"], 0, "{v}");
    assert_eq!(v["last_run"]["limit"], 2, "{v}");
}

mod alone {
    //! The semaphore tests that measure time: each takes the cores for itself while it measures
    //! (`common::alone`), and `scripts/test.sh` runs them after the others.

    use super::*;

    /// A holder killed with its guard and its command frees its slot by expiry, within the TTL.
    #[test]
    fn a_killed_holder_frees_its_slot_within_the_ttl() {
        let _alone = measure_alone();
        let r = Redis::start();
        let dir = scratch("semaphore-killed");
        let mut holders = Vec::new();
        for i in 0..2 {
            let mut c = cronlock(&r);
            c.args(["--limit", "2", "--ttl", "2s", "k", "sh", "-c"])
                .arg(format!(
                    "echo $PPID > {0}/guard{i}; echo $$ > {0}/command{i}; exec sleep 30",
                    dir.display()
                ));
            holders.push(start(c));
        }
        let guard = read_pid(&dir.join("guard0"));
        // (Read before the kills: the command writes it just after its guard's pid.)
        let command = read_pid(&dir.join("command0"));
        read_pid(&dir.join("guard1"));
        // A power cut: cronlock, its guard and its command at once (nothing is left to release).
        signal(holders[0].id() as i32, libc::SIGKILL);
        signal(guard, libc::SIGKILL);
        signal(command, libc::SIGKILL);
        let killed = std::time::Instant::now();
        let out =
            run(cronlock(&r).args(["--limit", "2", "--ttl", "2s", "--wait", "10s", "k", "true"]));
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        let took = killed.elapsed();
        assert!(
            took < Duration::from_millis(2500),
            "the slot freed after {took:?}"
        );
        signal(holders[1].id() as i32, libc::SIGTERM);
        for mut h in holders {
            let _ = h.wait();
        }
    }
}
