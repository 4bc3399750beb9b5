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
    read_pid(&dir.join("guard1"));
    // A power cut: cronlock, its guard and its command at once (nothing is left to release).
    signal(holders[0].id() as i32, libc::SIGKILL);
    signal(guard, libc::SIGKILL);
    signal(read_pid(&dir.join("command0")), libc::SIGKILL);
    let killed = std::time::Instant::now();
    let out = run(cronlock(&r).args(["--limit", "2", "--ttl", "2s", "--wait", "10s", "k", "true"]));
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
