//! The quorum tests that measure time: each takes the cores for itself while it measures
//! (`common::alone`), and `scripts/test.sh` runs them after the others.

use super::*;

#[test]
fn one_frozen_master_still_runs_quickly() {
    let _alone = measure_alone();
    let m = three();
    let dir = scratch("quorum-frozen");
    m[1].pause();
    let start = Instant::now();
    let out = run(on(&m).current_dir(&dir).args(["q", "--", "touch", "ran"]));
    let took = start.elapsed();
    m[1].resume();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(dir.join("ran").exists());
    // Each call to the frozen master is bounded by TTL/30 = 1 s (acquire, then release).
    assert!(took < Duration::from_millis(2800), "took {took:?}");
}

/// Several masters: the lock deleted on a minority is not a loss: the renewal the watch asks for
/// writes it back there at once. Taken by another holder on a majority, it is a loss, noticed at
/// once (overwritten, not deleted: whatever order the renewals come in, nothing is written back
/// over another holder's lock).
#[test]
fn a_lock_deleted_on_a_minority_is_mended_and_on_a_majority_is_lost() {
    let _alone = measure_alone();
    let m = three();
    let dir = scratch("quorum-tracked");
    let holder = spawn_holding(on(&m).args(["--ttl", "30s", "q"]), &dir);
    // The watch starts 20 ms after the command; a deletion before it is found by its first read.
    m[0].del(LOCK);
    let deleted = Instant::now();
    assert!(
        wait_for(Duration::from_secs(2), || m[0].exists(LOCK)),
        "the lock was not written back on the master that lost it"
    );
    eprintln!(
        "minority: written back {:?} after the DEL",
        deleted.elapsed()
    );
    assert!(alive(holder.id() as i32), "a minority's loss ended the job");
    std::fs::write(dir.join("go"), "").unwrap();
    let out = holder.wait_with_output().unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let took = stopped_at_once(on(&m), "q2", || {
        for r in &m[..2] {
            r.query::<()>(
                redis::cmd("SET")
                    .arg("cronlock:{q2}")
                    .arg("another holder")
                    .arg("PX")
                    .arg(30_000),
            );
        }
    });
    eprintln!("majority: stopped {took:?} after the overwrites");
}

#[test]
fn losing_the_quorum_mid_run_stops_the_command_before_expiry() {
    let m = three();
    let dir = scratch("quorum-lost");
    let ttl = Duration::from_secs(3);
    let job = on(&m)
        .current_dir(&dir)
        .args([
            "--ttl",
            "3s",
            "q",
            "--",
            "sh",
            "-c",
            "echo $$ > pid; exec sleep 60",
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = read_pid(&dir.join("pid"));
    let _alone = measure_alone();
    m[0].pause();
    m[1].pause();
    let paused = Instant::now();
    let out = job.wait_with_output().unwrap();
    let ended = paused.elapsed();
    m[0].resume();
    m[1].resume();
    assert_eq!(code(&out), 122, "{}", stderr(&out));
    assert!(ended < ttl, "ended {ended:?} after the pause");
    assert!(!alive(pid));
}
