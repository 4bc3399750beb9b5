//! The locking tests that measure time: each takes the cores for itself while it measures
//! (`common::alone`), and `scripts/test.sh` runs them after the others.

use super::*;

#[test]
fn wait_gives_up_after_the_duration() {
    let _alone = measure_alone();
    let r = Redis::start();
    r.set(LOCK, "someone else");
    let t = std::time::Instant::now();
    let out = run(cronlock(&r).args(["-w", "300ms", "-E", "9", "k", "true"]));
    assert_eq!(code(&out), 9, "{}", stderr(&out));
    let took = t.elapsed();
    assert!(took >= Duration::from_millis(300), "{took:?}");
    assert!(took < Duration::from_secs(3), "{took:?}");
    // -n overrides -w, like flock
    let t = std::time::Instant::now();
    let out = run(cronlock(&r).args(["-w", "5s", "-n", "-E", "9", "k", "true"]));
    assert_eq!(code(&out), 9);
    assert!(t.elapsed() < Duration::from_secs(2));
}
