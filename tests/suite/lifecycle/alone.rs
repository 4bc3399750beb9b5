//! The lifecycle tests that measure time: each takes the cores for itself while it measures
//! (`common::alone`), and `scripts/test.sh` runs them after the others.

use super::*;

#[test]
fn watchdog_keeps_a_short_ttl_lock_for_a_long_job() {
    let _alone = measure_alone();
    let r = Redis::start();
    let first = start(&r, &["--ttl", "1s", "k", "sleep", "4"]);
    assert!(wait_for(Duration::from_secs(5), || r.exists(LOCK)));
    let t = Instant::now();
    let mut attempts = 0;
    let mut first = Some(first);
    while t.elapsed() < Duration::from_millis(3500) {
        let pttl = r.pttl(LOCK);
        assert!(
            pttl > 0,
            "lock must stay held, PTTL {pttl} after {:?}",
            t.elapsed()
        );
        let out = run(cronlock(&r).args(["-E", "75", "k", "true"]));
        assert_eq!(code(&out), 75, "a second cronlock got the lock");
        attempts += 1;
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(attempts > 20);
    let (code, err) = finish(first.take().unwrap());
    assert_eq!(code, 0, "{err}");
    assert!(!r.exists(LOCK), "lock must be gone right after");
}

#[test]
fn lock_deleted_from_outside_stops_the_child_with_122() {
    let _alone = measure_alone();
    let r = Redis::start();
    assert_terminated_for_lost_lock(&r, |r| r.del(LOCK));
}

#[test]
fn lock_overwritten_from_outside_stops_the_child_with_122() {
    let _alone = measure_alone();
    let r = Redis::start();
    assert_terminated_for_lost_lock(&r, |r| r.set(LOCK, "someone else"));
    assert_eq!(
        r.get(LOCK).as_deref(),
        Some("someone else"),
        "not ours to delete"
    );
}

#[test]
fn redis_hung_child_dies_before_lock_expiry() {
    let _alone = measure_alone();
    assert_child_dead_before_expiry(|r| r.pause());
}

#[test]
fn redis_killed_child_dies_before_lock_expiry() {
    let _alone = measure_alone();
    assert_child_dead_before_expiry(|r| r.kill());
}

#[test]
fn max_runtime_stops_the_whole_group_with_124() {
    let _alone = measure_alone();
    let r = Redis::start();
    let dir = scratch("maxrt");
    let body = format!(
        "sleep 100 & echo $! > {d}/a; sleep 100 & echo $! > {d}/b; wait",
        d = dir.display()
    );
    let t = Instant::now();
    let c = start(
        &r,
        &["--max-runtime", "500ms", "k", "-c", &script(&dir, &body)],
    );
    let (a, b) = (read_pid(&dir.join("a")), read_pid(&dir.join("b")));
    let (code, err) = finish(c);
    assert_eq!(code, 124, "{err}");
    assert!(err.contains("--max-runtime"), "{err}");
    assert!(t.elapsed() >= Duration::from_millis(500));
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    assert!(!alive(a) && !alive(b), "grandchildren must be gone");
    assert!(!r.exists(LOCK));
}

#[test]
fn child_ignoring_sigterm_is_killed_after_the_grace() {
    let _alone = measure_alone();
    let r = Redis::start();
    let dir = scratch("ignore");
    let t = Instant::now();
    let c = start(
        &r,
        &[
            "--max-runtime",
            "300ms",
            "--grace",
            "700ms",
            "k",
            "-c",
            &script(&dir, "trap '' TERM; while :; do sleep 0.02; done"),
        ],
    );
    let (code, err) = finish(c);
    assert_eq!(code, 124, "{err}");
    let took = t.elapsed();
    assert!(took >= Duration::from_millis(1000), "{took:?}");
    assert!(took < Duration::from_millis(2500), "{took:?}");
    assert!(err.contains("SIGKILL"), "{err}");
}

#[test]
fn sigkill_of_cronlock_kills_the_group_and_the_lock_expires() {
    let _alone = measure_alone();
    let r = Redis::start();
    let dir = scratch("sigkill");
    let body = format!(
        "sleep 100 & echo $! > {d}/a; sleep 100 & echo $! > {d}/b; wait",
        d = dir.display()
    );
    let mut c = start(&r, &["--ttl", "1s", "k", "-c", &script(&dir, &body)]);
    let sh = read_pid(&dir.join("pid"));
    let (a, b) = (read_pid(&dir.join("a")), read_pid(&dir.join("b")));
    let killed = Instant::now();
    c.kill().unwrap();
    c.wait().unwrap();
    for pid in [sh, a, b] {
        assert!(
            death_of(pid, Duration::from_secs(1)).is_some(),
            "pid {pid} outlived cronlock by over a second"
        );
    }
    // The lock expires within one TTL and another run can take it.
    let out = run(cronlock(&r).args(["-w", "3s", "-E", "75", "k", "true"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(killed.elapsed() < Duration::from_millis(2500));
}
