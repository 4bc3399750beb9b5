//! The guard tests that measure time: each takes the cores for itself while it measures
//! (`common::alone`), and `scripts/test.sh` runs them after the others.

use super::*;

/// A stopped guard reaps nothing and reports nothing: cronlock notices the command's end itself
/// (a zombie whose parent is the guard), ends the guard, releases the lock within a renewal
/// interval (1 s for a 3 s TTL) and passes the command's status through (not 124, although the
/// lock is held no longer than --max-runtime would allow).
#[test]
fn a_stopped_guard_does_not_keep_the_lock_after_the_job() {
    let _alone = measure_alone();
    let r = Redis::start();
    let dir = scratch("stopped-guard");
    let c = cronlock(&r)
        .args(["--ttl", "3s", "--max-runtime", "20s", "k", "-c"])
        .arg(format!(
            "cd {} && echo $$ > pid && while [ ! -e go ]; do sleep 0.05; done; exit 3",
            dir.display()
        ))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let cmd = read_pid(&dir.join("pid"));
    let guard = parent_of(cmd);
    signal(guard, libc::SIGSTOP);
    std::fs::write(dir.join("go"), "").unwrap();
    let ended = std::time::Instant::now();
    assert!(
        wait_for(Duration::from_secs(5), || !r.exists("cronlock:{k}")),
        "the lock outlived the job"
    );
    let released = ended.elapsed();
    assert!(
        released < Duration::from_millis(1500),
        "released {released:?} after the job ended"
    );
    let out = c.wait_with_output().unwrap();
    assert_eq!(code(&out), 3, "{}", stderr(&out));
    assert!(
        wait_for(Duration::from_secs(2), || !alive(guard)),
        "the stopped guard was left"
    );
}
