//! Replicated Redis: Sentinel URLs, a job surviving a failover, and `--min-replicas` (WAIT).
//! Real servers: a primary, a replica and three sentinels (`redis-server x.conf --sentinel`).

use std::process::Stdio;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::common::*;
use crate::common::{replicas, story};

/// One topology for the tests that do not disturb it.
fn topology() -> &'static Replicated {
    static TOPOLOGY: OnceLock<&'static Replicated> = OnceLock::new();
    shared(&TOPOLOGY, Replicated::start)
}

#[test]
fn runs_through_the_sentinels_and_replicates() {
    let t = topology();
    let out = run(cronlock_at(&t.url(SERVICE)).args([
        "sentinel-run",
        "--",
        "sh",
        "-c",
        "echo ran $CRONLOCK_FENCING_TOKEN",
    ]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(stdout(&out).starts_with("ran "), "{}", stdout(&out));
    assert!(!t.primary.exists("cronlock:{sentinel-run}"));
    assert!(t.primary.exists("cronlock:{sentinel-run}:last"));
    assert!(wait_for(Duration::from_secs(5), || t
        .replica
        .exists("cronlock:{sentinel-run}:last")));
}

#[test]
fn status_and_list_through_the_sentinels() {
    let t = topology();
    let url = t.url(SERVICE);
    let out = run(cronlock_at(&url).args(["sentinel-status", "--", "true"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let out = run(cronlock_at(&url).args(["--status", "sentinel-status"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("lock 'sentinel-status' is free"), "{text}");
    assert!(text.contains("exited with status 0"), "{text}");
    let out = run(cronlock_at(&url).args(["--list"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
}

#[test]
fn min_replicas_with_a_live_replica_runs() {
    let t = topology();
    let out = run(cronlock_at(&t.url(SERVICE)).args([
        "--min-replicas",
        "1",
        "sentinel-wait",
        "--",
        "true",
    ]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(t.primary.exists("cronlock:{sentinel-wait}:last"));
}

#[test]
fn an_unknown_service_is_one_line_naming_it() {
    let t = topology();
    let dir = scratch("sentinel-unknown");
    let url = format!(
        "redis+sentinel://:s3cret@127.0.0.1:{},127.0.0.1:{}/no-such-service",
        t.sentinels[0].port, t.sentinels[1].port
    );
    let out =
        run(cronlock_at(&url)
            .current_dir(&dir)
            .args(["sentinel-unknown", "--", "touch", "ran"]));
    assert_eq!(code(&out), 125);
    let line = one_line(&out);
    assert!(line.contains("'no-such-service'"), "{line}");
    assert!(!line.contains("s3cret"), "{line}");
    assert!(!dir.join("ran").exists());
}

#[test]
fn no_reachable_sentinel_is_one_line() {
    let dir = scratch("sentinel-none");
    let url = format!(
        "redis+sentinel://u:s3cret@127.0.0.1:{},127.0.0.1:{}/svc",
        free_port(),
        free_port()
    );
    let out = run(cronlock_at(&url).current_dir(&dir).args([
        "--connect-timeout",
        "2s",
        "k",
        "--",
        "touch",
        "ran",
    ]));
    assert_eq!(code(&out), 125);
    let line = one_line(&out);
    assert!(line.contains("'svc'"), "{line}");
    assert!(line.contains("refused"), "{line}");
    assert!(!line.contains("s3cret"), "{line}");
    assert!(!dir.join("ran").exists());
}

#[test]
fn a_plain_server_is_not_a_sentinel() {
    let r = Redis::start_tcp();
    let url = format!("redis+sentinel://127.0.0.1:{}/svc", r.port);
    let out = run(cronlock_at(&url).args(["k", "--", "true"]));
    assert_eq!(code(&out), 125);
    let line = one_line(&out);
    assert!(line.contains("'svc'"), "{line}");
    assert!(line.contains("sentinel"), "{line}");
}

#[test]
fn bad_sentinel_urls_are_one_line() {
    for (url, says) in [
        ("redis+sentinel://127.0.0.1:26379", "SERVICE"),
        ("redis+sentinel://127.0.0.1:26379/svc/x", "database 'x'"),
        ("redis+sentinel://127.0.0.1:99999/svc", "port '99999'"),
        ("redis+sentinel://127.0.0.1,,h/svc", "empty host"),
        (
            "redis+sentinel://:pw@h/svc?foo=1",
            "unknown parameter 'foo'",
        ),
    ] {
        let out = run(cronlock_at(url).args(["k", "--", "true"]));
        assert_eq!(code(&out), 125, "{url}");
        let line = one_line(&out);
        assert!(line.contains(says), "{url}: {line}");
        assert!(line.contains("CRONLOCK_REDIS_URL"), "{line}");
    }
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// The token a job printed to `file`.
fn token_in(file: &std::path::Path) -> u64 {
    let mut token = 0;
    assert!(wait_for(Duration::from_secs(10), || {
        token = std::fs::read_to_string(file)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0);
        token > 0
    }));
    token
}

/// A lock held across a failover stays held. Its TTL (45 s) outlasts the longest promotion the
/// test waits for (30 s): a first failover attempt that fails leaves the sentinels waiting their
/// failover timeout before the next, and a lock whose TTL ran out meanwhile is rightly gone.
#[test]
fn a_job_survives_a_failover() {
    let mut t = Replicated::start();
    let url = t.url(SERVICE);
    let dir = scratch("failover");
    let job = cronlock_at(&url)
        .current_dir(&dir)
        .args(["--ttl", "45s", "-v", "--log-format", "json"])
        .args(["failover-job", "--", "sh", "-c"])
        .arg(
            "echo $CRONLOCK_FENCING_TOKEN > token.tmp && mv token.tmp token; \
             while [ ! -e go ]; do sleep 0.05; done",
        )
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let first = token_in(&dir.join("token"));
    assert!(wait_for(Duration::from_secs(5), || t
        .replica
        .exists("cronlock:{failover-job}")));
    let killed = Instant::now();
    let killed_ms = unix_ms();
    t.primary.kill();
    assert!(
        wait_for(Duration::from_secs(30), || t.primary_port()
            == Some(t.replica.port)
            && t.replica.role() == "master"),
        "the sentinels did not promote the replica"
    );
    let promoted = killed.elapsed();
    // A second host during the job skips: the lock came through the failover.
    let second = run(cronlock_at(&url).current_dir(&dir).args([
        "-E",
        "75",
        "failover-job",
        "--",
        "touch",
        "second-ran",
    ]));
    assert_eq!(
        code(&second),
        75,
        "promoted {promoted:?} after the kill\n{}",
        stderr(&second)
    );
    assert!(!dir.join("second-ran").exists());
    // The renewal after the promotion is confirmed before the job goes on.
    assert!(wait_for(Duration::from_secs(15), || t
        .replica
        .pttl("cronlock:{failover-job}")
        > 44_000
        || !alive(job.id() as i32)));
    std::fs::write(dir.join("go"), "").unwrap();
    let out = job.wait_with_output().unwrap();
    let err = stderr(&out);
    assert_eq!(code(&out), 0, "{err}");
    assert!(!t.replica.exists("cronlock:{failover-job}"), "{err}");
    // How long the job went without a confirmed renewal across the failover.
    let confirmed: Vec<u64> = err
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["event"] == "renewed" || v["event"] == "acquired")
        .filter_map(|v| v["ts"].as_u64())
        .collect();
    let before = confirmed.iter().filter(|t| **t <= killed_ms).max().unwrap();
    let after = confirmed.iter().filter(|t| **t > killed_ms).min();
    let after = after.expect("a renewal was confirmed after the failover");
    eprintln!(
        "failover: promoted {promoted:?} after the kill; no confirmed renewal for {} ms \
         (last {} ms before the kill, next {} ms after it)",
        after - before,
        killed_ms - before,
        after - killed_ms
    );
    // The fencing token keeps increasing on the new primary.
    let third = run(cronlock_at(&url)
        .current_dir(&dir)
        .args(["failover-job", "--", "sh", "-c"])
        .arg("echo $CRONLOCK_FENCING_TOKEN > token2"));
    assert_eq!(code(&third), 0, "{}", stderr(&third));
    assert!(token_in(&dir.join("token2")) > first);
}

#[test]
fn min_replicas_with_a_frozen_replica_runs_nothing() {
    let primary = Redis::start_tcp();
    let replica = Redis::replica_of(&primary);
    let dir = scratch("replicas-frozen");
    replica.pause();
    let out = run(cronlock(&primary).current_dir(&dir).args([
        "--min-replicas",
        "1",
        "--connect-timeout",
        "1s",
        "frozen",
        "--",
        "touch",
        "ran",
    ]));
    replica.resume();
    assert_eq!(code(&out), 125);
    let line = one_line(&out);
    assert!(line.contains("only 0 of 1 replicas"), "{line}");
    assert!(line.contains("--min-replicas"), "{line}");
    assert!(!dir.join("ran").exists());
    assert!(!primary.exists("cronlock:{frozen}"));
}

/// A holder with `--ttl 6s` (and `extra` options) through the sentinels, contenders every 200 ms
/// (`-E 75`), and `fault` done to the topology once the holder runs; then the contenders go on
/// for longer than a TTL. No two jobs ever overlap, and the holder's job goes on to exit 0.
fn no_overlap_across(
    t: &mut Replicated,
    ttl: u64,
    extra: &[&str],
    fault: impl FnOnce(&mut Replicated),
) {
    let ttl_arg = format!("{ttl}s");
    let url = t.url(SERVICE);
    let dir = scratch("no-overlap");
    let holder = spawn_holding(
        cronlock_at(&url)
            .args(["-v", "--ttl", &ttl_arg])
            .args(extra)
            .arg("held"),
        &dir,
    );
    assert!(wait_for(Duration::from_secs(5), || t
        .replica
        .exists("cronlock:{held}")));
    let (u, d) = (url.clone(), dir.to_path_buf());
    let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
    let contenders = Contenders::start(
        move || {
            let mut c = cronlock_at(&u);
            c.current_dir(&d)
                .args(["--ttl", &ttl_arg, "-E", "75"])
                .args(&extra)
                .arg("held");
            c
        },
        &dir,
    );
    let original = t.primary.port;
    fault(t);
    assert!(
        wait_for(Duration::from_secs(30), || t
            .primary_port()
            .is_some_and(|p| p != original)),
        "no failover happened"
    );
    // Longer than a TTL after the failover: a lock left to expire on the new primary would
    // have let a contender in by now.
    let after = Instant::now();
    while after.elapsed() < Duration::from_secs(ttl + 2) && alive(holder.id() as i32) {
        assert!(!dir.join("overlap").exists(), "two jobs overlapped");
        std::thread::sleep(Duration::from_millis(100));
    }
    if !alive(holder.id() as i32) {
        let out = holder.wait_with_output().unwrap();
        panic!(
            "the holder ended during the failover ({}): {}",
            code(&out),
            stderr(&out)
        );
    }
    let codes = contenders.stop();
    std::fs::write(dir.join("go"), "").unwrap();
    let out = holder.wait_with_output().unwrap();
    let err = stderr(&out);
    assert_eq!(code(&out), 0, "{err}");
    assert!(!dir.join("overlap").exists(), "two jobs overlapped");
    assert!(
        codes.iter().all(|c| *c == 75 || *c == 125),
        "a contender ran: {codes:?}"
    );
    eprintln!(
        "{} contenders: {} skipped, {} failed (no primary during the failover)",
        codes.len(),
        codes.iter().filter(|c| **c == 75).count(),
        codes.iter().filter(|c| **c == 125).count()
    );
}

/// A planned failover: the old primary stays up (a master for a while) until Sentinel demotes
/// it. The holder must move to the new primary at its next renewal, not renew on the old one.
#[test]
fn a_planned_failover_moves_the_holder_and_lets_nobody_in() {
    let mut t = Replicated::start();
    no_overlap_across(&mut t, 6, &[], |t| t.failover());
}

/// A primary frozen for 6 s: the sentinels promote the replica; when the old primary wakes, it
/// still believes it is the primary for a moment. Nobody may take the lock there.
#[test]
fn a_frozen_primary_that_wakes_up_lets_nobody_in() {
    let mut t = Replicated::start();
    no_overlap_across(&mut t, 6, &[], |t| {
        // Right after a confirmed renewal, so the failover has the most time.
        let pttl = || t.primary.pttl("cronlock:{held}");
        assert!(wait_for(Duration::from_secs(5), || pttl() > 5_800));
        t.primary.pause();
        let frozen = Instant::now();
        assert!(
            wait_for(Duration::from_secs(20), || t.primary_port()
                == Some(t.replica.port)),
            "the sentinels did not promote the replica"
        );
        let left = Duration::from_secs(6).saturating_sub(frozen.elapsed());
        std::thread::sleep(left);
        t.primary.resume();
    });
}

/// With `--min-replicas 1`, a WAIT that falls short on the old primary after a failover must not
/// end the job: the holder moves to the new primary, whose replica confirms it once Sentinel has
/// attached it there (1-3 s after a planned failover here). That counts in the failover time the
/// TTL must cover (README, "Sizing the TTL for a failover"): a 6 s TTL leaves 2.4-4.4 s, too little
/// in about one run in three; 12 s leaves 6-8.8 s.
#[test]
fn a_short_wait_after_a_failover_does_not_end_the_job() {
    let mut t = Replicated::with_replicas(2);
    no_overlap_across(&mut t, 12, &["--min-replicas", "1"], |t| t.failover());
}

/// `--limit` through the sentinels.
#[test]
fn limit_two_through_the_sentinels() {
    let t = topology();
    let url = t.url(SERVICE);
    limit_two_of_four(|| cronlock_at(&url), "sentinel-limit");
}

/// A refusal by the named primary that retrying cannot mend (here a database that does not
/// exist) ends a `--wait` at once.
#[test]
fn a_permanent_refusal_through_the_sentinels_ends_a_wait_at_once() {
    let t = topology();
    let url = format!("{}/99", t.url(SERVICE));
    let started = Instant::now();
    let out = run(cronlock_at(&url).args(["--wait", "1m", "k", "--", "true"]));
    assert_eq!(code(&out), 125, "{}", stderr(&out));
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert!(one_line(&out).contains("DB index"), "{}", stderr(&out));
}

/// The catch-up story through the sentinels: the ledger and the suspension are on the primary
/// they name, like the lock.
#[test]
fn catch_up_retries_and_suspend_through_the_sentinels() {
    let url = topology().url(SERVICE);
    story::missed(&url, "sn-report");
    story::retries(&url, "sn-flaky");
    story::abandoned(&url, "sn-dies", 1);
    story::abandoned(&url, "sn-dies0", 0);
    story::suspend(&url, "sn-paused");
}

/// `--trigger` through the sentinels.
#[test]
fn trigger_runs_a_job_once_now_through_the_sentinels() {
    crate::policies::trigger_once(&topology().url(SERVICE), "sn-trig");
}

/// `--overlap replace` and `allow` through the sentinels.
#[test]
fn replace_and_allow_through_the_sentinels() {
    crate::policies::replace_and_allow_on(&topology().url(SERVICE), "sn-overlap");
}

/// A primary frozen past `down-after` (the sentinels promote its replica), then woken: no instant
/// runs twice, and every instant that did not run is recorded on the new primary (missed, or
/// skipped behind a lock a lost release left), also those lost while no primary answered
/// (recorded once one does).
#[test]
fn crontab_a_frozen_primary_runs_no_instant_twice_and_every_instant_is_accounted() {
    let t = Replicated::start();
    let fleet = replicas::through(&t.url(SERVICE), "sn-frozen", 4, "", || {
        let serving = Instant::now() + Duration::from_secs(3);
        assert!(wait_for(Duration::from_secs(10), || Instant::now() >= serving));
        t.primary.pause();
        let frozen = Instant::now();
        assert!(
            wait_for(Duration::from_secs(30), || t.primary_port()
                == Some(t.replica.port)
                && t.replica.role() == "master"),
            "the sentinels did not promote the replica"
        );
        let woken = frozen + Duration::from_secs(6);
        assert!(wait_for(Duration::from_secs(10), || Instant::now() >= woken));
        t.primary.resume();
        // Until the unrecorded instants were recorded (every second) and Sentinel demoted it.
        let settled = Instant::now() + Duration::from_secs(4);
        assert!(wait_for(Duration::from_secs(10), || Instant::now() >= settled));
    });
    fleet.assert_none_twice();
    let now = t.current();
    let unaccounted: Vec<(usize, i64)> = fleet
        .not_run(fleet.served.clone())
        .into_iter()
        .filter(|(job, at)| {
            let ledger = format!(
                "cronlock:{{{}}}:ledger",
                replicas::Through::key("sn-frozen", *job)
            );
            let entry: Option<String> = now.query(redis::cmd("HGET").arg(ledger).arg(at * 1000));
            !entry.is_some_and(|e| e.contains("\"missed\"") || e.contains("\"skipped\""))
        })
        .collect();
    assert!(
        unaccounted.is_empty(),
        "instants neither run nor recorded: {unaccounted:?}\n{}",
        fleet.said
    );
}

/// Five planned failovers in a row under a fleet with five jobs every second, each once the
/// previous one settled (the sentinels agree on the new primary and the old one follows it, in
/// sync): no instant runs twice.
#[test]
fn crontab_five_planned_failovers_run_no_instant_twice() {
    let t = Replicated::start();
    let fleet = replicas::through(&t.url(SERVICE), "sn-planned", 5, "", || {
        for n in 0..5 {
            let from = t.current().port;
            let serving = Instant::now() + Duration::from_secs(2);
            assert!(wait_for(Duration::from_secs(10), || Instant::now() >= serving));
            t.failover();
            assert!(
                wait_for(Duration::from_secs(60), || {
                    t.primary_port().is_some_and(|p| p != from)
                        && t.server(from).role() == "slave"
                        && t.server(from).synced()
                }),
                "failover {n}: the old primary did not follow the new one"
            );
        }
    });
    fleet.assert_none_twice();
}

/// `--min-replicas 1` with two replicas (the servers at `repl-diskless-sync-delay 0`, as
/// docs/deployments.md advises: a replica that needs a full resync reattaches at once): a planned
/// failover runs no instant twice and loses at most the instants of its own second or two (here
/// those due within 3 s of asking for it).
#[test]
fn crontab_min_replicas_loses_at_most_a_planned_failovers_own_seconds() {
    let t = Replicated::with_servers(2, &["--repl-diskless-sync-delay", "0"]);
    let mut failed_at = 0;
    let fleet = replicas::through(&t.url(SERVICE), "sn-minrep", 5, "--min-replicas 1", || {
        let from = t.current().port;
        let serving = Instant::now() + Duration::from_secs(3);
        assert!(wait_for(Duration::from_secs(10), || Instant::now() >= serving));
        failed_at = replicas::unix_secs();
        t.failover();
        assert!(
            wait_for(Duration::from_secs(30), || t
                .primary_port()
                .is_some_and(|p| p != from)),
            "the sentinels did not name a new primary"
        );
        let settled = Instant::now() + Duration::from_secs(4);
        assert!(wait_for(Duration::from_secs(10), || Instant::now() >= settled));
    });
    fleet.assert_none_twice();
    let lost = fleet.not_run(fleet.served.clone());
    let outside: Vec<&(usize, i64)> = lost
        .iter()
        .filter(|(_, at)| *at < failed_at || *at > failed_at + 3)
        .collect();
    assert!(
        outside.is_empty(),
        "instants lost outside the failover's seconds ({failed_at}..={}): {outside:?}\n{}",
        failed_at + 3,
        fleet.said
    );
}

/// `--crontab` through the sentinels: three replicas, three jobs every second for 20 s, each instant once.
#[test]
fn crontab_replicas_run_each_instant_once_through_the_sentinels() {
    replicas::each_instant_once(&topology().url(SERVICE), "sn-rep", 20);
}

mod alone {
    //! The replicated tests that measure time: each takes the cores for itself while it measures
    //! (`common::alone`), and `scripts/test.sh` runs them after the others.

    use super::*;

    /// `--crontab` through the sentinels: a dead or drained replica's instant runs again on another.
    #[test]
    fn crontab_retries_a_dead_replicas_run_through_the_sentinels() {
        replicas::retried_on_another(&topology().url(SERVICE), "sn-retry");
    }

    /// The lock deleted on the primary the sentinels name is noticed at once.
    #[test]
    fn a_deleted_lock_is_noticed_on_the_named_primary() {
        let t = topology();
        let took = stopped_at_once(cronlock_at(&t.url(SERVICE)), "tracked", || {
            t.primary.del("cronlock:{tracked}")
        });
        eprintln!("sentinel: stopped {took:?} after the DEL");
    }

    #[test]
    fn min_replicas_stops_the_command_when_renewals_are_not_replicated() {
        let primary = Redis::start_tcp();
        let replica = Redis::replica_of(&primary);
        let dir = scratch("replicas-midrun");
        let ttl = Duration::from_secs(3);
        // Alone from before the start: a wait for the other tests could outlast the job.
        let _alone = measure_alone();
        let job = cronlock(&primary)
            .current_dir(&dir)
            .args([
                "--min-replicas",
                "1",
                "--ttl",
                "3s",
                "midrun",
                "--",
                "sh",
                "-c",
            ])
            .arg("echo $$ > pid; exec sleep 60")
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let pid = read_pid(&dir.join("pid"));
        replica.pause();
        let paused = Instant::now();
        let out = job.wait_with_output().unwrap();
        let ended = paused.elapsed();
        replica.resume();
        assert_eq!(code(&out), 122, "{}", stderr(&out));
        // The lock's last confirmed renewal was before the pause: the command is gone before that
        // renewal's expiry.
        assert!(ended < ttl, "ended {ended:?} after the pause");
        assert!(!alive(pid));
        assert!(stderr(&out).contains("--min-replicas"), "{}", stderr(&out));
    }
}
