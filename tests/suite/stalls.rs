//! Redis slow, not gone, and clocks that are wrong: a run's outcome outlives a stall of Redis
//! (SIGSTOP of the server, as `DEBUG SLEEP` or a slow command would stall it), a release on
//! several masters counts only once a majority confirmed it, and replicas whose clocks are
//! seconds off run every instant once, none before it by Redis's clock.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::replicas::{crontab, instants, replica, replica_err, replica_with, stop};
use crate::common::*;

/// Each ledger entry of KEY on `r`, by instant (Unix ms).
fn ledger(r: &Redis, key: &str) -> std::collections::BTreeMap<i64, serde_json::Value> {
    let all: std::collections::HashMap<String, String> =
        r.query(redis::cmd("HGETALL").arg(format!("cronlock:{{{key}}}:ledger")));
    all.into_iter()
        .filter_map(|(at, e)| Some((at.parse().ok()?, serde_json::from_str(&e).ok()?)))
        .collect()
}

/// Wait until `until` (bounded: the stall the test holds, or the time a rerun would take).
fn wait_until(until: Instant) {
    assert!(wait_for(Duration::from_secs(60), || Instant::now() >= until));
}

/// Redis away for `away` right away: killed, then started again with its data (an append-only
/// file written at every command). When it answers again.
fn outage(r: &mut Redis, away: Duration) -> Instant {
    r.kill();
    wait_until(Instant::now() + away);
    r.restart();
    Instant::now()
}

/// A server whose data outlives a restart ([`outage`]).
fn durable() -> Redis {
    Redis::start_with(None, &["--appendonly", "yes", "--appendfsync", "always"])
}

/// Redis stalled for `stall` right away: SIGSTOP, then SIGCONT. When it answers again.
fn stall(r: &Redis, stall: Duration) -> Instant {
    r.pause();
    wait_until(Instant::now() + stall);
    r.resume();
    Instant::now()
}

/// The lines of `file` once it has `n` of them (within 20 s).
fn lines_once(file: &Path, n: usize) -> Vec<String> {
    assert!(
        wait_for(Duration::from_secs(20), || instants(file).len() >= n),
        "{:?}",
        instants(file)
    );
    instants(file)
}

/// An instant's entry succeeded in one attempt.
fn succeeded_once(entry: &serde_json::Value) -> bool {
    entry["state"] == "succeeded" && entry["attempts"].as_array().map_or(0, Vec::len) == 1
}

/// A manual instant (`--trigger`) whose command succeeds while Redis is stalled (past the lock's
/// lapse) is not run again once Redis answers: the replica keeps the run's end and writes it, and
/// the other replica's retry (`--retries 1`) finds the attempt ended, not abandoned.
#[test]
fn a_success_is_not_run_again_when_redis_stalls_as_it_ends() {
    let r = Redis::start();
    let dir = scratch("stall-trigger");
    let f = dir.join("f");
    let file = crontab(
        &dir,
        &format!(
            "0 0 1 1 * --ttl 3s --catch-up 1h --retries 1 st-t sh -c 'sleep 1; \
             echo try-$CRONLOCK_ATTEMPT >> {}'\n",
            f.display()
        ),
    );
    let (a, b) = (replica(&r.url(), &file, &[]), replica(&r.url(), &file, &[]));
    let out = run(cronlock(&r).args(["--trigger", "st-t"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    // The command runs 1 s; Redis stalls from now for 6 s, past the lock's 3 s TTL.
    let woke = stall(&r, Duration::from_secs(6));
    assert!(wait_for(Duration::from_secs(20), || ledger(&r, "st-t")
        .values()
        .any(succeeded_once)));
    // Long enough for a retry (the report window, 3 s, and a look again) to have run.
    wait_until(woke + Duration::from_secs(6));
    let err = || replica_err(&file);
    assert_eq!(instants(&f), ["try-1"], "{}", err());
    let entries = ledger(&r, "st-t");
    assert!(entries.values().all(succeeded_once), "{entries:?}");
    assert_eq!(stop(a), Some(0), "{}", err());
    assert_eq!(stop(b), Some(0), "{}", err());
}

/// The same with instants of the schedule (`--catch-up --retries`) and Redis away (killed, and
/// started again with its data, past the lock's lapse): the instant whose command succeeds
/// meanwhile runs once, and reads succeeded.
#[test]
fn a_scheduled_success_is_not_run_again_after_an_outage_of_redis() {
    let mut r = durable();
    let dir = scratch("stall-scheduled");
    let f = dir.join("f");
    let file = crontab(
        &dir,
        &format!(
            "CRON_TZ=UTC\n*/10 * * * * * --ttl 3s --catch-up 1h --retries 1 st-s sh -c \
             'echo $CRONLOCK_INSTANT_MS >> {}; sleep 1'\n",
            f.display()
        ),
    );
    let (a, b) = (replica(&r.url(), &file, &[]), replica(&r.url(), &file, &[]));
    // Its first instant of the schedule (a replica that starts catches up first: skip that).
    let first = lines_once(&f, 1)[0].clone();
    let at = lines_once(&f, 2)
        .into_iter()
        .find(|l| *l != first)
        .unwrap_or_default();
    let woke = outage(&mut r, Duration::from_secs(6));
    let instant: i64 = at.parse().unwrap();
    assert!(wait_for(Duration::from_secs(20), || ledger(&r, "st-s")
        .get(&instant)
        .is_some_and(succeeded_once)));
    wait_until(woke + Duration::from_secs(6));
    let ran = instants(&f).iter().filter(|l| **l == at).count();
    let err = || replica_err(&file);
    assert_eq!(ran, 1, "{:?} {}", instants(&f), err());
    assert_eq!(stop(a), Some(0), "{}", err());
    assert_eq!(stop(b), Some(0), "{}", err());
}

/// A plain run (`--schedule --catch-up --retries`, as on every host of a crontab) whose command
/// succeeds while Redis is away keeps trying to record its end past its lock's lapse; another
/// host that fires as Redis answers again finds the instant held (its holder may still report)
/// or done, not abandoned, and does not run it.
#[test]
fn a_plain_runs_success_is_not_run_again_by_another_host_after_an_outage() {
    let mut r = durable();
    let dir = scratch("stall-plain");
    let f = dir.join("f");
    let url = r.url();
    let host = |extra: &[&str]| {
        let mut c = cronlock_at(&url);
        c.args(extra)
            .args([
                "--schedule",
                "0 0 1 1 *",
                "--catch-up",
                "400d",
                "--retries",
                "1",
                "--ttl",
                "3s",
                "st-p",
                "--",
                "sh",
                "-c",
            ])
            .arg(format!("sleep 1; echo ran >> {}", f.display()));
        c
    };
    let first = spawn_tied(host(&[]).stderr(std::process::Stdio::piped()));
    // Its command runs: Redis stalls past the lock's lapse.
    assert!(wait_for(Duration::from_secs(10), || ledger(&r, "st-p")
        .values()
        .any(|e| e["state"] == "running")));
    let _ = outage(&mut r, Duration::from_secs(6));
    let second = run(&mut host(&[]));
    let first = first.wait_with_output().unwrap();
    assert_eq!(code(&first), 0, "{}", stderr(&first));
    assert_eq!(code(&second), 0, "{}", stderr(&second));
    assert_eq!(
        instants(&f),
        ["ran"],
        "{}\n{}",
        stderr(&first),
        stderr(&second)
    );
    let entries = ledger(&r, "st-p");
    assert!(
        entries.values().all(succeeded_once),
        "{entries:?}\n{}",
        stderr(&first)
    );
    // A third host, later, finds it done.
    let third = run(&mut host(&["-v"]));
    assert!(stderr(&third).contains("nothing due"), "{}", stderr(&third));
    assert_eq!(instants(&f), ["ran"]);
}

/// Three masters: two of them frozen around a run's release (1.6 s). The release is done only
/// once a majority confirmed it (the replica keeps it and carries it out again), so the lock
/// does not stay on the majority for its TTL: the next instants run, and the run reads
/// succeeded on the majority.
#[test]
fn a_release_counts_only_once_a_majority_of_the_masters_confirmed_it() {
    let masters: Vec<Redis> = (0..3).map(|_| Redis::start()).collect();
    let urls: Vec<String> = masters.iter().map(Redis::url).collect();
    let dir = scratch("stall-quorum");
    let f = dir.join("f");
    let us: String = urls.iter().map(|u| format!("-u {u} ")).collect();
    let file = crontab(
        &dir,
        &format!(
            "CRON_TZ=UTC\n*/2 * * * * * --ttl 20s {us}st-q sh -c 'echo $CRONLOCK_INSTANT_MS >> \
             {}; sleep 1'\n",
            f.display()
        ),
    );
    let first_url = urls[0].clone();
    let (a, b) = (
        replica(&first_url, &file, &[]),
        replica(&first_url, &file, &[]),
    );
    let started = lines_once(&f, 1);
    let at: i64 = started[0].parse().unwrap();
    masters[1].pause();
    masters[2].pause();
    wait_until(Instant::now() + Duration::from_millis(1600));
    masters[1].resume();
    masters[2].resume();
    // The next three instants run (the lock was released on the majority).
    let want: Vec<String> = (0..4).map(|i| (at + i * 2000).to_string()).collect();
    let err = || replica_err(&file);
    assert!(
        wait_for(Duration::from_secs(20), || {
            let got = instants(&f);
            want.iter().all(|w| got.contains(w))
        }),
        "{:?}\n{}",
        instants(&f),
        err()
    );
    for m in &masters {
        let entry = ledger(m, "st-q").get(&at).cloned().unwrap_or_default();
        assert!(succeeded_once(&entry), "{entry}\n{}", err());
    }
    assert_eq!(stop(a), Some(0), "{}", err());
    assert_eq!(stop(b), Some(0), "{}", err());
}

/// Five replicas of a job every second, one with its clock 3 s fast and one 3 s slow (the debug
/// build's test hook shifts its wall clock; the release build's is never shifted): every instant
/// runs once, and none starts before its instant (by this test's clock, the host's, which is
/// Redis's). Each replica says once that its clock is off.
#[test]
fn replicas_whose_clocks_are_off_run_every_instant_once_and_none_early() {
    let r = Redis::start();
    let dir = scratch("stall-clocks");
    let f = dir.join("f");
    let file = crontab(
        &dir,
        &format!(
            "CRON_TZ=UTC\n* * * * * * st-c sh -c 'echo $CRONLOCK_INSTANT_MS $(date +%s%3N) >> \
             {}'\n",
            f.display()
        ),
    );
    let url = r.url();
    let mut fleet: Vec<std::process::Child> = (0..3).map(|_| replica(&url, &file, &[])).collect();
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    for (shift, extra) in [("3000", vec!["--listen", &listen]), ("-3000", vec![])] {
        let env = [("CRONLOCK_TEST_CLOCK_SHIFT_MS", shift)];
        fleet.push(replica_with(&url, &file, &extra, &env));
    }
    let from = now_ms() + 4000;
    wait_until(Instant::now() + Duration::from_secs(14));
    let to = now_ms() - 2000;
    // The fast one shows its offset on /metrics, and --status lists each replica's.
    let metrics = crate::listen::get(port, "/metrics").1;
    let offset = metrics
        .lines()
        .find_map(|l| l.strip_prefix("cronlock_replica_clock_offset_seconds "))
        .and_then(|v| v.trim().parse::<f64>().ok());
    assert!(offset.is_some_and(|o| (o + 3.0).abs() < 0.2), "{metrics}");
    let out = run(cronlock(&r).args(["--status", "--json", "st-c"]));
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let offsets: Vec<i64> = v["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["clock_offset_ms"].as_i64())
        .collect();
    assert_eq!(offsets.len(), 5, "{v}");
    assert!(
        offsets.iter().any(|o| (o + 3000).abs() < 200),
        "{offsets:?}"
    );
    assert!(
        offsets.iter().any(|o| (o - 3000).abs() < 200),
        "{offsets:?}"
    );
    let err = || replica_err(&file);
    for c in fleet {
        assert_eq!(stop(c), Some(0), "{}", err());
    }
    let mut runs = std::collections::BTreeMap::<i64, usize>::new();
    for line in instants(&f) {
        let (at, started) = line.split_once(' ').unwrap();
        let (at, started): (i64, i64) = (at.parse().unwrap(), started.trim().parse().unwrap());
        assert!(
            started >= at,
            "started before its instant: {line}\n{}",
            err()
        );
        *runs.entry(at).or_default() += 1;
    }
    let first = (from + 999) / 1000 * 1000;
    for at in (first..=to).step_by(1000) {
        assert_eq!(runs.get(&at), Some(&1), "{at}: {runs:?}\n{}", err());
    }
    let said = err();
    // "clock is 2.998 s ahead of redis's": the offset as measured, within 200 ms of the shift.
    for side in ["ahead of", "behind"] {
        let near_three = said.lines().any(|l| {
            l.split_once(&format!(" s {side} redis's"))
                .and_then(|(before, _)| before.rsplit(' ').next()?.parse::<f64>().ok())
                .is_some_and(|s| (s - 3.0).abs() < 0.2)
        });
        assert!(near_three, "no offset of about 3 s {side}: {said}");
    }
}

/// This host's wall clock, in Unix ms.
fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}
