//! The safety tests that measure time: each takes the cores for itself while it measures
//! (`common::alone`), and `scripts/test.sh` runs them after the others.

use super::*;

/// Case 3 (and 7b): cronlock frozen; the guard ends the command before the lock can expire.
#[test]
fn a_frozen_cronlock_cannot_outlive_its_lock() {
    let _alone = measure_alone();
    let r = Redis::start();
    let mut con = r.con();
    for round in 0..3 {
        let dir = scratch("frozen");
        let mut c = cronlock(&r)
            .args(["--ttl", "2s", "k", "-c"])
            .arg(sh(
                &dir,
                "trap '' TERM; echo $$ > pid; while :; do sleep 1; done",
            ))
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let cmd = read_pid(&dir.join("pid"));
        signal(c.id() as i32, libc::SIGSTOP);
        let mut pttl_at_death = -2;
        assert!(
            wait_for(Duration::from_secs(5), || {
                if alive(cmd) {
                    return false;
                }
                pttl_at_death = redis::cmd("PTTL").arg(LOCK).query(&mut con).unwrap();
                true
            }),
            "round {round}: the command outlived the lock"
        );
        assert!(
            pttl_at_death > 0,
            "round {round}: the command died only after the lock expired ({pttl_at_death})"
        );
        signal(c.id() as i32, libc::SIGCONT);
        let resumed = Instant::now();
        assert_eq!(
            exit_within(&mut c, Duration::from_secs(5), "frozen"),
            122,
            "round {round}"
        );
        assert!(
            resumed.elapsed() < Duration::from_secs(1),
            "round {round}: exit took {:?} after SIGCONT",
            resumed.elapsed()
        );
        let mut err = String::new();
        c.stderr.take().unwrap().read_to_string(&mut err).unwrap();
        assert_eq!(own_lines(&err).len(), 1, "round {round}: {err}");
        assert!(err.contains("lock lost") && err.contains("guard"), "{err}");
    }
}

/// Case 4: the release against a hung Redis is bounded by --connect-timeout in all.
#[test]
fn release_against_a_hung_redis_is_bounded() {
    let _alone = measure_alone();
    let r = Redis::start();
    let dir = scratch("hungrelease");
    let go = dir.join("go");
    let mut c = cronlock(&r)
        .args(["--ttl", "30s", "--connect-timeout", "1s", "k", "-c"])
        .arg(sh(
            &dir,
            "echo $$ > pid; while [ ! -e go ]; do sleep 0.02; done",
        ))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let cmd = read_pid(&dir.join("pid"));
    r.pause();
    std::fs::write(&go, "").unwrap();
    assert!(wait_for(Duration::from_secs(5), || !alive(cmd)));
    let finished = Instant::now();
    let status = exit_within(&mut c, Duration::from_secs(20), "hung release");
    let took = finished.elapsed();
    r.resume();
    assert_eq!(status, 0, "the command's status still wins");
    assert!(took < Duration::from_millis(1800), "release took {took:?}");
    let mut err = String::new();
    c.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert!(err.contains("cannot release"), "{err}");

    // Lost (Redis hung for good): no retry once the deadline passed.
    let dir = scratch("hunglost");
    let mut c = cronlock(&r)
        .args(["--ttl", "1s", "--connect-timeout", "1s", "k2", "-c"])
        .arg(sh(&dir, "echo $$ > pid; exec sleep 60"))
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let cmd = read_pid(&dir.join("pid"));
    r.pause();
    assert!(wait_for(Duration::from_secs(5), || !alive(cmd)));
    let killed = Instant::now();
    let status = exit_within(&mut c, Duration::from_secs(20), "hung lost");
    let took = killed.elapsed();
    r.resume();
    assert_eq!(status, 122);
    assert!(took < Duration::from_millis(1800), "exit took {took:?}");
}

/// The renewal thread starts only when the first renewal is due (a short job never needs one);
/// if it cannot start then, nothing would renew the lock: the command is stopped, 122, and the
/// lock is released, long before it could expire.
#[test]
fn a_watchdog_that_cannot_start_stops_the_command() {
    let _alone = measure_alone();
    let r = Redis::start();
    let started = Instant::now();
    let (out, cmd) = injected(&r, "watchdog-start", &["--ttl", "3s"]);
    let cmd = cmd.expect("the command started");
    assert_eq!(code(&out), 122, "{}", stderr(&out));
    assert!(stderr(&out).contains("watchdog thread"), "{}", stderr(&out));
    assert!(!alive(cmd));
    // Stopped at the first renewal's time (TTL/3), with the lock released, not left to expire.
    assert!(started.elapsed() < Duration::from_millis(2500));
    assert!(!r.exists(LOCK));

    // A job shorter than one renewal interval never needs the thread at all.
    let out = run(cronlock_debug(&r)
        .env("CRONLOCK_DEBUG_PANIC", "watchdog-start")
        .args(["--ttl", "3s", "k", "true"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
}
