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
    // Alone from before the start: a wait for the other tests could outlast the job.
    let _alone = measure_alone();
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

/// Three masters, one frozen, five hosts firing `--schedule` every second (as their crons
/// would): every instant runs exactly once. Contenders whose votes split undo what their grants
/// wrote (the lock, the schedule record and the ledger entry), so their next round can still
/// claim the instant instead of reading "already ran"; a round that failed only because a master
/// did not answer after a grant of ours is asked again too. (`--ttl 3s`: each call to the frozen
/// master waits TTL/30, 100 ms; with the default 30 s it waits 1 s, so a run's acquire and
/// release span the next second's firing, which then finds the KEY held and records its
/// instant skipped for the overlap.)
#[test]
fn one_frozen_master_and_five_hosts_run_every_instant_once() {
    let m = three();
    let dir = scratch("quorum-five-hosts");
    m[2].pause();
    let _alone = measure_alone();
    let mut hosts = Vec::new();
    let mut fired = Vec::new();
    for _ in 0..8 {
        // Just after the next whole second, as cron fires.
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap();
        std::thread::sleep(Duration::from_millis(
            1000 - u64::from(now.subsec_millis()) + 20,
        ));
        let second = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        fired.push(second);
        for _ in 0..5 {
            hosts.push(
                on(&m)
                    .current_dir(&dir)
                    .args(["--schedule", "* * * * * *", "--ttl", "3s", "-E", "75"])
                    .args(["q", "--", "sh", "-c"])
                    .arg("echo $CRONLOCK_INSTANT $(date +%s.%N) >> runs")
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap(),
            );
        }
    }
    let mut said = String::new();
    for h in hosts {
        let out = h.wait_with_output().unwrap();
        said += &String::from_utf8_lossy(&out.stderr);
    }
    m[2].resume();
    let runs = std::fs::read_to_string(dir.join("runs")).unwrap_or_default();
    let mut count: std::collections::BTreeMap<u64, usize> = Default::default();
    for l in runs.lines() {
        let l = l.split_whitespace().next().unwrap_or_default();
        let at = humantime::parse_rfc3339(l)
            .unwrap()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        *count.entry(at).or_default() += 1;
    }
    for second in &fired {
        assert_eq!(
            count.get(second),
            Some(&1),
            "the {second} instant: {count:?} (fired {fired:?})\n{runs}\n{said}"
        );
    }
}
