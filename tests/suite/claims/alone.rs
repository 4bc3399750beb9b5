//! The claims tests that measure time: each takes the cores for itself while it measures
//! (`common::alone`), and `scripts/test.sh` runs them after the others.

use super::*;

/// A claim sent to a paused Redis (hung, not refusing) does not hold the replica: SIGTERM drains
/// and exits within --drain, though the claim's own deadline is far away.
#[test]
fn a_claim_on_a_paused_redis_does_not_stop_the_drain() {
    let r = Redis::start();
    let dir = scratch("paused");
    let file = crontab(&dir, "* * * * * * paused true\n");
    let c = replica(
        &r.url(),
        &file,
        &["--connect-timeout", "30s", "--drain", "1s"],
    );
    assert!(wait_for(Duration::from_secs(10), || replica_err(&file)
        .contains("paused: command exited with status 0")));
    // Alone from here; then paused just after a run has ended (its runs take 60 ms).
    let _alone = measure_alone();
    let ran = replica_err(&file).matches("exited with status 0").count();
    assert!(wait_for(Duration::from_secs(3), || replica_err(&file)
        .matches("exited with status 0")
        .count()
        > ran));
    r.pause();
    // An instant passes: its claim waits on the paused server.
    let paused = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(wait_for(Duration::from_secs(3), || {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs();
        now > paused && ms_into_second() >= 200
    }));
    let asked = Instant::now();
    let status = stop(c);
    let took = asked.elapsed();
    r.resume();
    // Its leave could not reach Redis within the bounded wait: the exit status says so.
    assert_eq!(status, Some(125), "{}", replica_err(&file));
    assert!(
        replica_err(&file).contains("cannot confirm leaving the fleet"),
        "{}",
        replica_err(&file)
    );
    assert!(
        took < Duration::from_millis(2500),
        "the drain took {took:?}"
    );
}

/// A replica SIGKILLed after it won a claim and before it started the run (held there by a test
/// hook): the instant, recorded abandoned, runs again on another replica.
#[test]
fn a_replica_killed_between_claim_and_spawn_loses_nothing() {
    let r = Redis::start();
    let dir = scratch("between");
    let held = dir.join("held");
    let file = between_crontab(&dir);
    let hook = held.to_str().unwrap();
    let others: Vec<Child> = (0..2).map(|_| replica(&r.url(), &file, &[])).collect();
    // The holding replica starts 1.5 s after an instant the others ran: its own catch-up at
    // start then finds every instant done, and the claim it holds is a scheduled instant's, at
    // that instant (a start-up claim of an older instant, moments before the next one, would be
    // superseded by that next one rather than retried: --catch-up runs the latest).
    assert!(
        wait_for(Duration::from_secs(15), || (0..24).any(|j| {
            instants(&dir.join(format!("j{j}")).join("log"))
                .iter()
                .any(|l| l.starts_with("done "))
        })),
        "{}",
        replica_err(&file)
    );
    let _alone = measure_alone();
    assert!(wait_for(Duration::from_secs(6), || {
        let t = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        t.as_secs() % 5 == 1 && ms_into_second() >= 500
    }));
    let mut holder = replica_with(
        &r.url(),
        &file,
        &[],
        &[("CRONLOCK_TEST_HOLD_AFTER_CLAIM", hook)],
    );
    // (The hook creates the file, then writes the KEY: read once it is there.)
    let mut key = String::new();
    assert!(
        wait_for(Duration::from_secs(10), || {
            key = std::fs::read_to_string(&held).unwrap_or_default();
            !key.is_empty()
        }),
        "{}",
        replica_err(&file)
    );
    signal(holder.id() as i32, libc::SIGKILL);
    holder.wait().unwrap();
    let killed = Instant::now();
    let j: usize = key.trim_start_matches("between").parse().unwrap();
    let log = dir.join(format!("j{j}")).join("log");
    // The attempt the dead replica claimed is abandoned when its lock lapses (1 s), and the
    // replica that ranks next runs attempt 2 once the dead one has left the view (within 2 s).
    assert!(
        wait_for(Duration::from_secs(5), || instants(&log)
            .iter()
            .any(|l| l.starts_with("start ") && l.ends_with(" 2"))),
        "{key}: {:?}\n{}",
        instants(&log),
        replica_err(&file)
    );
    assert!(killed.elapsed() < Duration::from_secs(5));
    let retried = instants(&log)
        .into_iter()
        .find(|l| l.ends_with(" 2"))
        .unwrap();
    let instant = retried.split_whitespace().nth(1).unwrap().to_string();
    crate::common::replicas::assert_first_attempt(&r.url(), &key, &instant, "abandoned");
    assert!(wait_for(Duration::from_secs(5), || instants(&log)
        .iter()
        .any(|l| *l == format!("done {instant}"))));
    for c in others {
        kill_hard(c);
    }
    done_once(&log);
}

/// The crontab of 24 careful jobs (`between0`..`between23`, every 5 s), each logging in
/// `dir/jN/log`. 24 jobs are 3 shares (`rank.rs`): at every instant each of the 3 replicas
/// claims one, so the holding replica wins a claim at its first instant (with one share it was
/// its turn at an instant only one time in three, and 20 s were sometimes not enough).
fn between_crontab(dir: &Path) -> std::path::PathBuf {
    let mut text = String::new();
    for j in 0..24 {
        let sub = dir.join(format!("j{j}"));
        std::fs::create_dir(&sub).unwrap();
        text += &careful_job(&sub, &format!("between{j}"), 5);
    }
    crontab(dir, &text)
}
