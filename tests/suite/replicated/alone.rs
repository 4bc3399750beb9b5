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
