//! The fleet tests that measure time: each takes the cores for itself while it measures
//! (`common::alone`), and `scripts/test.sh` runs them after the others.

use super::*;

#[test]
fn min_hold_keeps_a_short_job_locked_from_start() {
    let _alone = measure_alone();
    let r = Redis::start();
    let start = Instant::now();
    let out = run(cronlock(&r).args(["--min-hold", "2s", "k", "sleep", "0.1"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(r.exists(LOCK), "the lock must outlive a 100ms job");
    let pttl = r.pttl(LOCK);
    assert!(pttl > 1500 && pttl <= 2000, "PTTL {pttl}");
    // A lagging host firing the same slot skips.
    let dir = scratch("minhold");
    let marker = dir.join("ran");
    let out = run(cronlock(&r).args(["-E", "75", "k", "touch"]).arg(&marker));
    assert_eq!(code(&out), 75);
    assert!(!marker.exists());
    assert!(wait_for(Duration::from_secs(4), || !r.exists(LOCK)));
    let gone = start.elapsed();
    assert!(
        gone >= Duration::from_millis(1900),
        "released after {gone:?}"
    );
    assert!(
        gone < Duration::from_millis(3000),
        "released after {gone:?}"
    );
}

/// A waiter is woken by the release, not by its fallback polling (which waits 250-500ms).
#[test]
fn release_wakes_a_waiter_at_once() {
    let _alone = measure_alone();
    let r = Redis::start();
    let dir = scratch("handoff");
    let mut gaps = Vec::new();
    for i in 0..3 {
        let ended = dir.join(format!("ended{i}"));
        let began = dir.join(format!("began{i}"));
        let holder = cronlock(&r)
            .args(["k", "-c", &format!("sleep 0.3; touch {}", ended.display())])
            .spawn()
            .unwrap();
        assert!(wait_for(Duration::from_secs(5), || r.exists(LOCK)));
        let waiter = cronlock(&r)
            .args(["-w", "10s", "k", "touch"])
            .arg(&began)
            .spawn()
            .unwrap();
        assert!(wait_for(Duration::from_secs(5), || ended.exists()));
        let t_end = Instant::now();
        assert!(wait_for(Duration::from_secs(5), || began.exists()));
        gaps.push(t_end.elapsed());
        for c in [holder, waiter] {
            assert_eq!(c.wait_with_output().unwrap().status.code(), Some(0));
        }
    }
    gaps.sort();
    assert!(
        gaps[1] < Duration::from_millis(150),
        "handoff took {gaps:?}"
    );
}
