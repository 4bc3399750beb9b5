//! The fleet's changes and faults, measured alone (every instant of every job runs, at most a
//! second late): a rolling restart, a replica that cannot start runs, a replica killed between
//! instants.

use std::os::unix::fs::PermissionsExt;
use std::process::Child;
use std::time::{Duration, Instant};

use super::{assert_all_ran, assert_none_twice, jobs, now_secs, runs};
use crate::common::replicas::{crontab, replica, replica_err, replica_of};
use crate::common::*;

/// SIGTERM to all of `fleet`, as their claims of the next instant go out (50 ms before it: the
/// leave then queues behind them); each must exit 0 (its leave confirmed) within 30 s.
fn all_out(fleet: Vec<Child>, file: &std::path::Path) {
    assert!(wait_for(Duration::from_secs(3), || (952..960)
        .contains(&ms_into_second())));
    for c in &fleet {
        signal(c.id() as i32, libc::SIGTERM);
    }
    for mut c in fleet {
        let deadline = Instant::now() + Duration::from_secs(30);
        while c.try_wait().unwrap().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = c.kill();
        assert_eq!(c.wait().unwrap().code(), Some(0), "{}", replica_err(file));
    }
}

/// Wait until `secs` seconds have passed since `since`.
fn serve_for(since: Instant, secs: u64) {
    assert!(wait_for(Duration::from_secs(secs + 10), || since.elapsed()
        >= Duration::from_secs(secs)));
}

/// A Deployment's rollout, three times on one crontab: every replica out (SIGTERM), the next
/// fleet in right after (10 out and 3 in, 3 out and 10 in, 10 out and 3 in): from the second
/// after the new fleet started, every instant runs all 20 jobs, once; no replica is left behind
/// in the fleet's members.
#[test]
fn a_rolling_restart_runs_every_job_at_every_instant() {
    let r = Redis::start();
    let dir = scratch("acc-rolling");
    let file = crontab(&dir, &jobs(&dir, "roll", 20, "", ""));
    let url = r.url();
    let _alone = measure_alone();
    let mut fleet: Vec<Child> = (0..10).map(|_| replica(&url, &file, &[])).collect();
    serve_for(Instant::now(), 4);
    let mut windows = Vec::new();
    for size in [3, 10, 3] {
        all_out(std::mem::take(&mut fleet), &file);
        // The next fleet 0.2 s after the last one exited.
        std::thread::sleep(Duration::from_millis(200));
        let from = now_secs() + 2;
        let began = Instant::now();
        fleet = (0..size).map(|_| replica(&url, &file, &[])).collect();
        serve_for(began, 5);
        windows.push((from, now_secs() - 1));
    }
    all_out(fleet, &file);
    let (count, _) = runs(&dir);
    assert_none_twice(&count);
    for w in windows {
        assert_all_ran(&count, ("roll", 20), w, &|| replica_err(&file));
    }
    assert!(
        !r.keys().iter().any(|k| k.contains("~replicas:")),
        "{:?}",
        r.keys()
    );
}

/// Three replicas, one started from a copy of the binary that then loses its run bit: it claims
/// nothing more and says so on /readyz (503 within 15 s: at its next won claim, or at the probe
/// of a replica that started no run for 10 s, as the instants' owners are drawn by lot), every
/// later instant runs all jobs on the others, and once the bit is back it is ready again (200
/// within 5 s).
#[test]
fn a_replica_that_cannot_start_runs_leaves_its_share_to_the_others() {
    let r = Redis::start();
    let dir = scratch("acc-runbit");
    let file = crontab(&dir, &jobs(&dir, "bit", 8, "", ""));
    let copy = dir.join("cronlock-copy");
    std::fs::copy(bin(), &copy).unwrap();
    let url = r.url();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let sick = replica_of(
        copy.to_str().unwrap(),
        &url,
        &file,
        &["--listen", &addr],
        &[],
    );
    let mut fleet: Vec<Child> = (0..2).map(|_| replica(&url, &file, &[])).collect();
    fleet.push(sick);
    assert!(wait_for(Duration::from_secs(10), || {
        crate::listen::get(port, "/readyz").0 == 200
    }));
    let _alone = measure_alone();
    serve_for(Instant::now(), 2);
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o644)).unwrap();
    let from = now_secs() + 1;
    assert!(
        wait_for(Duration::from_secs(15), || {
            let (status, body) = crate::listen::get(port, "/readyz");
            status == 503 && body.contains("cannot start")
        }),
        "{:?}\n{}",
        crate::listen::get(port, "/readyz"),
        replica_err(&file)
    );
    let sick_pid = fleet[2].id();
    let ticks = own_ticks(sick_pid);
    serve_for(Instant::now(), 6);
    let to = now_secs() - 1;
    // Sick, it waits for its probes and its instants' deadlines: it never spins (a tick is 10 ms;
    // a spinning loop would take most of the 6 s).
    let spent = own_ticks(sick_pid) - ticks;
    assert!(spent < 100, "the sick replica used {spent} ticks in 6 s");
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).unwrap();
    assert!(
        wait_for(Duration::from_secs(5), || {
            crate::listen::get(port, "/readyz").0 == 200
        }),
        "{:?}",
        crate::listen::get(port, "/readyz")
    );
    all_out(fleet, &file);
    let (count, _) = runs(&dir);
    assert_none_twice(&count);
    assert_all_ran(&count, ("bit", 8), (from, to), &|| replica_err(&file));
}

/// Ten replicas, twenty jobs, no `--catch-up`: one replica SIGKILLed (its runs die with it) half-way
/// between two instants. The next instants run all jobs, each at most a second late (the dead
/// replica's share is claimed by the others shortly after it is due, long before its heartbeat
/// lapses).
#[test]
fn a_killed_replicas_share_runs_at_most_a_second_late() {
    let r = Redis::start();
    let dir = scratch("acc-kill10");
    let file = crontab(&dir, &jobs(&dir, "k10", 20, "", ""));
    let url = r.url();
    let mut fleet: Vec<Child> = (0..10).map(|_| replica(&url, &file, &[])).collect();
    let _alone = measure_alone();
    serve_for(Instant::now(), 4);
    // Half-way between two instants.
    assert!(wait_for(Duration::from_secs(2), || (500..600)
        .contains(&ms_into_second())));
    let mut victim = fleet.remove(0);
    signal(victim.id() as i32, libc::SIGKILL);
    victim.wait().unwrap();
    let from = now_secs() + 1;
    serve_for(Instant::now(), 5);
    let to = now_secs() - 1;
    all_out(fleet, &file);
    let (count, _) = runs(&dir);
    assert_none_twice(&count);
    assert_all_ran(&count, ("k10", 20), (from, to), &|| replica_err(&file));
    let (_, late) = runs(&dir);
    let worst = late
        .iter()
        .filter(|(at, _)| (from..=to).contains(at))
        .map(|(_, ms)| *ms)
        .max()
        .unwrap_or(0);
    assert!(worst <= 1000, "a run started {worst} ms late");
}
