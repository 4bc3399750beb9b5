//! Every instant accounted for: a fleet that changes, fails or overloads runs each instant of
//! each job once, or records it in the ledger (`missed` with a reason, `skipped` for an
//! overlap); no instant reads `running` once its run is gone. The tests that bound how late a
//! run may start measure alone (its module `alone`).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::replicas::{
    children_of, crontab, instants, replica, replica_err, starter_of, stop,
};
use crate::common::*;

/// A crontab of `n` jobs every second (KEYs `PREFIX-0`...), each writing `KEY INSTANT NANOS` to
/// `runs` when it starts, then `then` (a command line, or nothing).
pub fn jobs(dir: &Path, prefix: &str, n: usize, opts: &str, then: &str) -> String {
    let runs = dir.join("runs");
    let mut text = String::from("CRON_TZ=UTC\n");
    for i in 0..n {
        let then = if then.is_empty() {
            String::new()
        } else {
            format!("; {then}")
        };
        text += &format!(
            "* * * * * * {opts} {prefix}-{i} echo {prefix}-{i} $CRONLOCK_INSTANT $(date +%s%N) >> {}{then}\n",
            runs.display()
        );
    }
    text
}

/// How often each (KEY, instant in Unix seconds) ran.
pub type Counts = BTreeMap<(String, i64), usize>;

/// How often each (KEY, instant in Unix seconds) ran, and how late each run started (instant,
/// ms late).
pub fn runs(dir: &Path) -> (Counts, Vec<(i64, i64)>) {
    let mut count = BTreeMap::new();
    let mut late = Vec::new();
    for line in instants(&dir.join("runs")) {
        let parts: Vec<&str> = line.split_whitespace().collect();
        let [key, at, nanos] = parts[..] else {
            continue;
        };
        let at = secs(at);
        *count.entry((key.to_string(), at)).or_default() += 1;
        if let Ok(n) = nanos.parse::<i64>() {
            late.push((at, n / 1_000_000 - at * 1000));
        }
    }
    (count, late)
}

/// An RFC 3339 instant in Unix seconds.
pub fn secs(rfc: &str) -> i64 {
    humantime::parse_rfc3339(rfc)
        .unwrap()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// Unix seconds as RFC 3339 (`2026-11-28T17:17:43Z`), as the replicas' lines name instants.
pub fn rfc3339_secs(secs: u64) -> String {
    humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + Duration::from_secs(secs)).to_string()
}

/// Now, in Unix seconds.
pub fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// No instant ran twice.
pub fn assert_none_twice(count: &Counts) {
    let twice: Vec<_> = count.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "ran twice: {twice:?}");
}

/// Every job of `n` ran at every instant from `from` to `to` (Unix seconds, both included).
pub fn assert_all_ran(
    count: &Counts,
    (prefix, n): (&str, usize),
    (from, to): (i64, i64),
    why: &dyn Fn() -> String,
) {
    let mut lost = Vec::new();
    for at in from..=to {
        for i in 0..n {
            if !count.contains_key(&(format!("{prefix}-{i}"), at)) {
                lost.push(format!("{prefix}-{i}@{at}"));
            }
        }
    }
    assert!(lost.is_empty(), "never ran: {lost:?}\n{}", why());
}

/// KEY's ledger, as `--status --json` shows it: (instant in Unix seconds, state, reason).
pub fn ledger(url: &str, key: &str) -> Vec<(i64, String, Option<String>)> {
    let s = run(cronlock_at(url).args(["--status", "--json", key]));
    let v: serde_json::Value = serde_json::from_str(&stdout(&s)).unwrap();
    v["ledger"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["instant"].as_i64().unwrap() / 1000,
                e["state"].as_str().unwrap_or("?").to_string(),
                e["reason"].as_str().map(str::to_string),
            )
        })
        .collect()
}

/// Among 3,000 jobs due once a year, the few due every second all run at every instant, once,
/// on a fleet of two: the replica's turns look at what is due (`replica/agenda.rs`), not at
/// every job, and nothing due is left out of them.
#[test]
fn jobs_due_among_thousands_of_idle_ones_run_at_every_instant() {
    let r = Redis::start();
    let dir = scratch("acc-agenda");
    let mut text = jobs(&dir, "due", 6, "", "");
    for i in 0..3000 {
        text += &format!("0 0 1 1 * idle-{i} true\n");
    }
    let file = crontab(&dir, &text);
    let fleet: Vec<_> = (0..2).map(|_| replica(&r.url(), &file, &[])).collect();
    // Counted from when both serve: reading 3,006 jobs takes a loaded machine a while.
    assert!(
        wait_for(Duration::from_secs(20), || replica_err(&file)
            .matches("serving 3006 jobs")
            .count()
            >= 2),
        "{}",
        replica_err(&file)
    );
    let from = now_secs() + 2;
    let began = Instant::now();
    assert!(wait_for(Duration::from_secs(20), || began.elapsed()
        >= Duration::from_secs(8)));
    let to = now_secs() - 2;
    for c in fleet {
        assert_eq!(stop(c), Some(0), "{}", replica_err(&file));
    }
    let (count, _) = runs(&dir);
    assert_none_twice(&count);
    assert_all_ran(&count, ("due", 6), (from, to), &|| replica_err(&file));
}

/// More jobs than the replica has room for: each instant of each job either ran once (and the
/// ledger says how it ended) or is recorded with a reason (`missed`, or `skipped` for an
/// overlap); none ran twice.
#[test]
fn overload_records_every_instant_it_cannot_start() {
    let r = Redis::start();
    let dir = scratch("acc-overload");
    let file = crontab(&dir, &jobs(&dir, "over", 6, "", "sleep 0.9"));
    let c = replica(&r.url(), &file, &["--max-jobs", "2"]);
    let from = now_secs() + 2;
    let began = Instant::now();
    assert!(wait_for(Duration::from_secs(20), || began.elapsed()
        >= Duration::from_secs(7)));
    let to = now_secs() - 2;
    assert_eq!(stop(c), Some(0), "{}", replica_err(&file));
    let (count, _) = runs(&dir);
    assert_none_twice(&count);
    let mut missed = 0;
    for i in 0..6 {
        let key = format!("over-{i}");
        let book = ledger(&r.url(), &key);
        for at in from..=to {
            let ran = count.contains_key(&(key.clone(), at));
            let entry = book.iter().find(|(t, _, _)| *t == at);
            match (ran, entry) {
                (true, Some((_, state, _))) => assert_eq!(state, "succeeded", "{key}@{at}"),
                // Missed (no room in time), or skipped because its previous run still held KEY.
                (false, Some((_, state, reason))) => {
                    assert!(
                        state == "missed" || state == "skipped",
                        "{key}@{at}: {book:?}"
                    );
                    assert!(reason.is_some(), "{key}@{at}: {state} without a reason");
                    missed += usize::from(state == "missed");
                }
                (_, None) => panic!(
                    "{key}@{at} is not accounted for (ran: {ran}): {book:?}\n{}",
                    replica_err(&file)
                ),
            }
        }
    }
    assert!(missed > 0, "the replica was never over its room");
    assert!(
        replica_err(&file).contains("recorded missed (no_room)"),
        "{}",
        replica_err(&file)
    );
}

/// A replica SIGKILLed mid-run: its runs stop their commands and record their instants
/// `interrupted` (or `abandoned`, once the job runs again, for a run that died before it could),
/// never `running`; every instant of every job is in the ledger.
#[test]
fn a_killed_replicas_runs_never_read_running() {
    let r = Redis::start();
    let dir = scratch("acc-killed");
    let file = crontab(&dir, &jobs(&dir, "kill", 4, "--ttl 2s", "sleep 0.6"));
    let mut fleet: Vec<_> = (0..2).map(|_| replica(&r.url(), &file, &[])).collect();
    let from = now_secs() + 2;
    assert!(wait_for(Duration::from_secs(10), || runs(&dir).0.len() >= 12));
    let mut victim = fleet.remove(0);
    signal(victim.id() as i32, libc::SIGKILL);
    victim.wait().unwrap();
    let killed = Instant::now();
    assert!(wait_for(Duration::from_secs(20), || killed.elapsed()
        >= Duration::from_secs(5)));
    let to = now_secs() - 2;
    for c in fleet {
        assert_eq!(stop(c), Some(0), "{}", replica_err(&file));
    }
    let (count, _) = runs(&dir);
    assert_none_twice(&count);
    for i in 0..4 {
        let key = format!("kill-{i}");
        let book = ledger(&r.url(), &key);
        assert!(
            book.iter().all(|(_, state, _)| state != "running"),
            "{key}: {book:?}\n{}",
            replica_err(&file)
        );
        for at in from..=to {
            assert!(
                book.iter().any(|(t, _, _)| *t == at),
                "{key}@{at} is not accounted for: {book:?}\n{}",
                replica_err(&file)
            );
        }
    }
    // The fleet left: no replica is left in its members.
    assert!(
        !r.keys().iter().any(|k| k.contains("~replicas:")),
        "{:?}",
        r.keys()
    );
}

/// A small generator for the chaos test, seeded from the clock (the seed is printed, so a failure
/// can be told again).
pub struct Dice {
    state: u64,
    /// The seed, for failure messages.
    pub seed: u64,
}

impl Dice {
    /// Seeded from the clock; the seed is printed as `NAME seed SEED`.
    pub fn from_clock(name: &str) -> Dice {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
        println!("{name} seed {seed}");
        Dice { state: seed, seed }
    }

    pub fn roll(&mut self, n: u64) -> u64 {
        self.state = self
            .state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.state >> 33) % n
    }
}

/// Chaos: three replicas, eight jobs (every second with and without `--retries --catch-up`,
/// every 2 s, every 10 s with a 3 s command), a replica SIGKILLed, SIGSTOPped (1-3 s) or
/// SIGTERMed every 4-9 s for 35 s (a killed or stopped one replaced at once, never more than one
/// frozen), then calm. Every instant of every job at which a replica served ran or is in the
/// ledger; none reads `running` once the fleet has stopped; no instant ran more often than its
/// ledger has attempts, and none succeeded twice.
#[test]
fn chaos_loses_no_instant_and_runs_no_success_twice() {
    let r = Redis::start();
    let dir = scratch("acc-chaos");
    let runs_file = dir.join("runs");
    let line = |opts: &str, key: &str, then: &str| {
        format!(
            "{opts} {key} echo {key} $CRONLOCK_INSTANT $(date +%s%N) >> {}{then}\n",
            runs_file.display()
        )
    };
    let mut text = String::from("CRON_TZ=UTC\n");
    for i in 0..4 {
        text += &line("* * * * * * --ttl 3s", &format!("chaos-{i}"), "");
    }
    for i in 4..6 {
        let opts = "* * * * * * --ttl 2s --retries 1 --catch-up 10s";
        text += &line(opts, &format!("chaos-{i}"), "");
    }
    text += &line("*/2 * * * * * --ttl 3s", "chaos-6", "");
    text += &line(
        "*/10 * * * * * --ttl 2s --retries 2 --catch-up 20s",
        "chaos-7",
        "; sleep 3",
    );
    let file = crontab(&dir, &text);
    let url = r.url();
    let start = || replica(&url, &file, &["--drain", "5s"]);
    let mut fleet: Vec<std::process::Child> = (0..3).map(|_| start()).collect();
    let mut dice = Dice::from_clock("chaos");
    let seed = dice.seed;
    let from = now_secs() + 3;
    let began = Instant::now();
    let mut done = Vec::new();
    while began.elapsed() < Duration::from_secs(35) {
        let pause = Instant::now() + Duration::from_millis(4000 + dice.roll(5000));
        assert!(wait_for(Duration::from_secs(10), || Instant::now() >= pause));
        let i = dice.roll(3) as usize;
        let pid = fleet[i].id() as i32;
        match dice.roll(3) {
            0 => {
                signal(pid, libc::SIGKILL);
                let mut dead = std::mem::replace(&mut fleet[i], start());
                dead.wait().unwrap();
                done.push("kill");
            }
            1 => {
                signal(pid, libc::SIGSTOP);
                let frozen = Instant::now() + Duration::from_millis(1000 + dice.roll(2000));
                assert!(wait_for(Duration::from_secs(5), || Instant::now() >= frozen));
                signal(pid, libc::SIGCONT);
                done.push("stop");
            }
            _ => {
                let old = std::mem::replace(&mut fleet[i], start());
                stop(old);
                done.push("term");
            }
        }
    }
    // Calm: the fleet serves until every lock a killed run left has lapsed and its job ran again.
    let calm = Instant::now();
    assert!(wait_for(Duration::from_secs(20), || calm.elapsed()
        >= Duration::from_secs(8)));
    let to = now_secs() - 2;
    for c in fleet {
        stop(c);
    }
    println!("chaos: {done:?}");
    let (count, _) = runs(&dir);
    for i in 0..8 {
        let key = format!("chaos-{i}");
        let s = run(cronlock_at(&url).args(["--status", "--json", &key]));
        let v: serde_json::Value = serde_json::from_str(&stdout(&s)).unwrap();
        let book = v["ledger"].as_array().unwrap().clone();
        let every = match i {
            6 => 2,
            7 => 10,
            _ => 1,
        };
        for at in (from..=to).filter(|t| t % every == 0) {
            let ran = count.get(&(key.clone(), at)).copied().unwrap_or(0);
            let entry = book
                .iter()
                .find(|e| e["instant"].as_i64() == Some(at * 1000));
            let why = || {
                format!(
                    "{key}@{at} (seed {seed}, {done:?}): ran {ran}, {entry:?}\n{}",
                    replica_err(&file)
                )
            };
            let Some(entry) = entry else {
                panic!("not accounted for: {}", why());
            };
            assert_ne!(entry["state"], "running", "{}", why());
            assert_ran_as_attempted(entry, ran, &why);
        }
    }
}

/// An instant's ledger `entry` and how often it ran: never more often than attempted, and never
/// succeeded twice.
pub fn assert_ran_as_attempted(entry: &serde_json::Value, ran: usize, why: &dyn Fn() -> String) {
    let attempts = entry["attempts"].as_array().map_or(0, Vec::len);
    assert!(
        ran <= attempts.max(1),
        "ran more often than attempted: {}",
        why()
    );
    let succeeded = entry["attempts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|a| a["state"] == "succeeded")
        .count();
    assert!(succeeded <= 1, "succeeded twice: {}", why());
}

/// The runs of a replica SIGKILLed as soon as they appear (before or just after they take the
/// lock over): every instant is in the ledger, and none reads `running` once the job has run
/// again (its lock lapsed).
#[test]
fn runs_killed_before_they_take_over_are_recorded_never_running() {
    let r = Redis::start();
    let dir = scratch("acc-early-kill");
    let file = crontab(&dir, &jobs(&dir, "early", 2, "--ttl 2s", ""));
    let c = replica(&r.url(), &file, &[]);
    let replica_pid = c.id();
    let from = now_secs() + 2;
    let began = Instant::now();
    let mut killed = 0;
    while began.elapsed() < Duration::from_secs(5) {
        // The runs are the children of the replica's starter.
        let runs = starter_of(replica_pid).map(children_of).unwrap_or_default();
        for pid in runs {
            signal(pid as i32, libc::SIGKILL);
            killed += 1;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    // Calm: the killed runs' locks lapse, and the jobs run again.
    let calm = Instant::now();
    assert!(wait_for(Duration::from_secs(20), || calm.elapsed()
        >= Duration::from_secs(5)));
    let to = now_secs() - 2;
    assert_eq!(stop(c), Some(0), "{}", replica_err(&file));
    assert!(killed > 0);
    for i in 0..2 {
        let key = format!("early-{i}");
        let book = ledger(&r.url(), &key);
        for at in from..=to {
            let entry = book.iter().find(|(t, _, _)| *t == at);
            assert!(
                entry.is_some_and(|(_, state, _)| state != "running"),
                "{key}@{at}: {entry:?} in {book:?}\n{}",
                replica_err(&file)
            );
        }
    }
}

/// A replica SIGSTOPped while its run's command runs: the command succeeds, the run cannot hear
/// its frozen replica and releases by itself while its lock is still valid, so the other
/// replica (which sees the frozen one lapse) finds the instant succeeded and never runs it again.
#[test]
fn a_frozen_replica_does_not_turn_a_success_into_a_rerun() {
    let r = Redis::start();
    let dir = scratch("acc-frozen");
    let log = dir.join("runs");
    let file = crontab(
        &dir,
        &format!(
            "*/10 * * * * * --ttl 2s --retries 2 --catch-up 30s frozen \
             echo $CRONLOCK_INSTANT $CRONLOCK_ATTEMPT $CRONLOCK_TEST_REPLICA >> {}; sleep 3\n",
            log.display()
        ),
    );
    let fleet: Vec<std::process::Child> = (0..2).map(|_| replica(&r.url(), &file, &[])).collect();
    assert!(wait_for(Duration::from_secs(15), || !instants(&log).is_empty()));
    let first: Vec<String> = instants(&log)[0]
        .split_whitespace()
        .map(String::from)
        .collect();
    let own = &first[2];
    let runner = fleet
        .iter()
        .find(|c| {
            std::fs::read_to_string(format!("/proc/{}/environ", c.id()))
                .is_ok_and(|e| e.contains(&format!("CRONLOCK_TEST_REPLICA={own}\0")))
        })
        .unwrap();
    signal(runner.id() as i32, libc::SIGSTOP);
    let frozen = Instant::now();
    // The command ends, the frozen replica lapses from the others' view (3 s), and its lock
    // would have lapsed too.
    assert!(wait_for(Duration::from_secs(20), || frozen.elapsed()
        >= Duration::from_secs(8)));
    signal(runner.id() as i32, libc::SIGCONT);
    for c in fleet {
        stop(c);
    }
    let ran: Vec<String> = instants(&log)
        .into_iter()
        .filter(|l| l.starts_with(&first[0]))
        .collect();
    assert_eq!(ran.len(), 1, "{ran:?}\n{}", replica_err(&file));
    let at = secs(&first[0]);
    let book = ledger(&r.url(), "frozen");
    assert!(
        book.iter()
            .any(|(t, state, _)| *t == at && state == "succeeded"),
        "{book:?}"
    );
}

/// No heartbeat storm: three replicas, one of them at `--max-jobs 1` (its full flag comes and
/// goes with its run), twenty jobs every second: the fleet's heartbeats stay a few calls a second.
#[test]
fn a_full_replica_causes_no_heartbeat_storm() {
    let r = Redis::start_tcp();
    let dir = scratch("acc-storm");
    let file = crontab(&dir, &jobs(&dir, "storm", 20, "", "sleep 0.3"));
    let url = r.url();
    let mut fleet: Vec<std::process::Child> = (0..2).map(|_| replica(&url, &file, &[])).collect();
    fleet.push(replica(&url, &file, &["--max-jobs", "1"]));
    assert!(wait_for(Duration::from_secs(10), || runs(&dir).0.len() >= 60));
    // Line-buffered (redis-cli's buffer would be lost with it at SIGTERM), into a file (a pipe
    // read only at the end would fill and stall it).
    let out = dir.join("monitor");
    let mut monitor = std::process::Command::new("stdbuf")
        .args(["-oL", &cli_bin(), "-p", &r.port.to_string(), "monitor"])
        .stdout(std::fs::File::create(&out).unwrap())
        .spawn()
        .unwrap();
    let began = Instant::now();
    assert!(wait_for(Duration::from_secs(20), || began.elapsed()
        >= Duration::from_secs(6)));
    signal(monitor.id() as i32, libc::SIGTERM);
    monitor.wait().unwrap();
    let seen = std::fs::read_to_string(&out).unwrap_or_default();
    for c in fleet {
        stop(c);
    }
    // Client calls of the heartbeat script only (not the script's own commands).
    let beats = seen
        .lines()
        .filter(|l| l.contains("~replicas:") && !l.contains("lua]"))
        .count();
    assert!(beats <= 6 * 6, "{beats} heartbeats in 6 s");
}

/// The replica listening on `port` answers `/readyz` with `status` within `within` (503: it says
/// it cannot start runs); else the answer and the replicas' stderr beside `file`.
pub fn assert_readyz(port: u16, status: u16, within: Duration, file: &Path) {
    let says = || {
        let (got, body) = crate::listen::get(port, "/readyz");
        got == status && (status != 503 || body.contains("cannot start"))
    };
    assert!(
        wait_for(within, says),
        "{:?}\n{}",
        crate::listen::get(port, "/readyz"),
        replica_err(file)
    );
}

/// A replica that has no run to start for a while still learns that it cannot start runs: its
/// binary loses its run bit, its only job is due once a year, and /readyz answers 503 within
/// 15 s (its probe after 10 s without a run), then 200 again within 5 s of the bit's return.
#[test]
fn an_idle_replica_learns_it_cannot_start_runs() {
    use std::os::unix::fs::PermissionsExt;
    let r = Redis::start();
    let dir = scratch("acc-idle-probe");
    let file = crontab(&dir, "CRON_TZ=UTC\n0 0 1 1 * yearly true\n");
    let copy = dir.join("cronlock-copy");
    std::fs::copy(bin(), &copy).unwrap();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let sick = crate::common::replicas::replica_of(
        copy.to_str().unwrap(),
        &r.url(),
        &file,
        &["--listen", &addr],
        &[],
    );
    assert!(wait_for(Duration::from_secs(10), || {
        crate::listen::get(port, "/readyz").0 == 200
    }));
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o644)).unwrap();
    assert_readyz(port, 503, Duration::from_secs(15), &file);
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).unwrap();
    assert_readyz(port, 200, Duration::from_secs(5), &file);
    assert_eq!(stop(sick), Some(0));
}

mod alone {
    //! The fleet's changes and faults, measured alone (every instant of every job runs, at most a
    //! second late): a rolling restart, a replica that cannot start runs, a replica killed between
    //! instants.

    use std::os::unix::fs::PermissionsExt;
    use std::process::Child;
    use std::time::{Duration, Instant};

    use super::{assert_all_ran, assert_none_twice, assert_readyz, jobs, ledger, now_secs, runs};
    use crate::common::replicas::{crontab, replica, replica_err, replica_of, starter_of};
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

    /// A Deployment's rollout, twice on one crontab: every replica out (SIGTERM), the next fleet
    /// in right after (10 out and 3 in, then 3 out and 10 in): from the second after the new fleet
    /// started, every instant runs all 20 jobs, once; no replica is left behind in the fleet's
    /// members.
    #[test]
    fn a_rolling_restart_runs_every_job_at_every_instant() {
        let r = Redis::start();
        let dir = scratch("acc-rolling");
        let file = crontab(&dir, &jobs(&dir, "roll", 20, "", ""));
        let url = r.url();
        let mut fleet: Vec<Child> = (0..10).map(|_| replica(&url, &file, &[])).collect();
        serve_for(Instant::now(), 4);
        // The first fleet's own instants are not counted: the measuring starts at its end.
        let _alone = measure_alone();
        let mut windows = Vec::new();
        for size in [3, 10] {
            all_out(std::mem::take(&mut fleet), &file);
            // The next fleet 0.2 s after the last one exited.
            std::thread::sleep(Duration::from_millis(200));
            let from = now_secs() + 2;
            let began = Instant::now();
            fleet = (0..size).map(|_| replica(&url, &file, &[])).collect();
            serve_for(began, 4);
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

    /// Three replicas, one started from a copy of the binary that then loses its run bit, and whose
    /// starter, if it has one yet, is then killed (so a run needs a new one, which cannot start): it claims
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
        serve_for(Instant::now(), 2);
        std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o644)).unwrap();
        // Its starter, if it has started runs yet (it is spawned at the first), is killed: the
        // next run needs a new one either way.
        if let Some(starter) = starter_of(fleet[2].id()) {
            signal(starter as i32, libc::SIGKILL);
        }
        let fell = now_secs() + 1;
        assert_readyz(port, 503, Duration::from_secs(15), &file);
        // What is timed starts once it knows it is sick (the bound above is generous); the
        // instants before are accounted for (ran, or recorded with a reason) below.
        let _alone = measure_alone();
        let from = now_secs() + 1;
        let sick_pid = fleet[2].id();
        let ticks = own_ticks(sick_pid);
        serve_for(Instant::now(), 4);
        let to = now_secs() - 1;
        // Sick, it waits for its probes and its instants' deadlines: it never spins (a tick is 10 ms;
        // a spinning loop would take most of the 4 s).
        let spent = own_ticks(sick_pid) - ticks;
        assert!(spent < 100, "the sick replica used {spent} ticks in 4 s");
        std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_readyz(port, 200, Duration::from_secs(5), &file);
        all_out(fleet, &file);
        let (count, _) = runs(&dir);
        assert_none_twice(&count);
        assert_all_ran(&count, ("bit", 8), (from, to), &|| replica_err(&file));
        for i in 0..8 {
            let key = format!("bit-{i}");
            let book = ledger(&url, &key);
            for at in fell..from {
                let ran = count.contains_key(&(key.clone(), at));
                let recorded = book
                    .iter()
                    .any(|(t, _, reason)| *t == at && reason.is_some());
                assert!(
                    ran || recorded,
                    "{key}@{at}: neither ran nor recorded: {book:?}\n{}",
                    replica_err(&file)
                );
            }
        }
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
        serve_for(Instant::now(), 4);
        let _alone = measure_alone();
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
}

/// A reload that removes a job records the instant that waited for it: one replica with
/// `--max-jobs 1`, its one run busy for good, a job every 10 s whose instant waits for room; the
/// crontab read again without that job (SIGHUP) while one waits. That instant is recorded
/// `missed` with the reason `reload` (before, it was dropped with no record).
#[test]
fn a_reload_records_the_instant_it_gives_up() {
    let r = Redis::start();
    let url = r.url();
    let dir = scratch("acc-reload");
    let d = dir.display();
    let long = format!("* * * * * * long echo began > {d}/began; sleep 60\n");
    let file = crate::common::replicas::crontab(
        &dir,
        &format!("CRON_TZ=UTC\n{long}*/10 * * * * * tick echo tick\n"),
    );
    let c = crate::common::replicas::replica(&url, &file, &["--max-jobs", "1"]);
    assert!(wait_for(Duration::from_secs(10), || dir
        .join("began")
        .exists()));
    // 300 ms after tick's next instant, which then waits for room (until the one after).
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    std::thread::sleep(Duration::from_millis(10_000 - now % 10_000 + 300));
    let waiting = (now / 10_000 + 1) as i64 * 10;
    std::fs::write(&file, format!("CRON_TZ=UTC\n{long}")).unwrap();
    signal(c.id() as i32, libc::SIGHUP);
    let recorded = || {
        ledger(&url, "tick").iter().any(|(at, st, why)| {
            *at == waiting && st == "missed" && why.as_deref() == Some("reload")
        })
    };
    let done = wait_for(Duration::from_secs(5), recorded);
    let book = ledger(&url, "tick");
    signal(c.id() as i32, libc::SIGKILL);
    let mut c = c;
    c.wait().unwrap();
    assert!(
        done,
        "{waiting}: {book:?}\n{}",
        crate::common::replicas::replica_err(&file)
    );
}

/// A claim in flight while a reload changes its job (here its TTL: the claims thread holds each
/// won claim's answer 1.5 s, a test hook; the reload comes 300 ms after the instant) is undone
/// when it comes back, and its instant recorded `missed` (`reload`): no run is started that
/// would refuse the lock (125), and the replica never falls sick for it; the job goes on under
/// its new TTL.
#[test]
fn a_claim_in_flight_across_a_reload_is_undone_and_recorded() {
    let r = Redis::start();
    let url = r.url();
    let dir = scratch("acc-reload-flight");
    let d = dir.display();
    let line =
        |ttl: &str| format!("CRON_TZ=UTC\n*/5 * * * * * --ttl {ttl} tick echo tick >> {d}/ticks\n");
    let file = crate::common::replicas::crontab(&dir, &line("30s"));
    let hold = [("CRONLOCK_TEST_HOLD_CLAIM_ANSWER_MS", "1500")];
    let c = crate::common::replicas::replica_with(&url, &file, &[], &hold);
    let ticks = || crate::common::replicas::instants(&dir.join("ticks")).len();
    assert!(wait_for(Duration::from_secs(15), || ticks() >= 1));
    // 300 ms after the next instant, whose won claim is held until 1.45 s after it.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    std::thread::sleep(Duration::from_millis(5_000 - now % 5_000 + 300));
    let at = (now / 5_000 + 1) as i64 * 5;
    std::fs::write(&file, line("20s")).unwrap();
    signal(c.id() as i32, libc::SIGHUP);
    let recorded = || {
        ledger(&url, "tick")
            .iter()
            .any(|(t, st, why)| *t == at && st == "missed" && why.as_deref() == Some("reload"))
    };
    let undone = wait_for(Duration::from_secs(10), recorded);
    let after = ticks();
    let going = wait_for(Duration::from_secs(15), || ticks() >= after + 2);
    let said = crate::common::replicas::replica_err(&file);
    assert_eq!(crate::common::replicas::stop(c), Some(0), "{said}");
    assert!(undone, "{at}: {:?}\n{said}", ledger(&url, "tick"));
    assert!(going, "{said}");
    assert!(!said.contains("claiming nothing"), "{said}");
    assert!(!said.contains("not this run's"), "{said}");
}

/// A reload while a claim is in flight (the claims thread holds each won claim's answer 1.5 s,
/// a test hook) keeps the instant queued behind that claim: with SIGHUPs (the crontab
/// unchanged) every 700 ms for 8 s, every instant of a job every second ran or is in the ledger
/// with a reason.
#[test]
fn a_reload_keeps_the_instant_queued_behind_a_claim_in_flight() {
    let r = Redis::start();
    let url = r.url();
    let dir = scratch("acc-reload-queued");
    let d = dir.display();
    let file = crate::common::replicas::crontab(
        &dir,
        &format!(
            "CRON_TZ=UTC\n* * * * * * rq echo rq $CRONLOCK_INSTANT $(date +%s%N) >> {d}/runs\n"
        ),
    );
    let hold = [("CRONLOCK_TEST_HOLD_CLAIM_ANSWER_MS", "1500")];
    let c = crate::common::replicas::replica_with(&url, &file, &[], &hold);
    let ticks = || crate::common::replicas::instants(&dir.join("runs")).len();
    assert!(wait_for(Duration::from_secs(15), || ticks() >= 1));
    let from = now_secs() + 1;
    let began = Instant::now();
    while began.elapsed() < Duration::from_secs(8) {
        let until = Instant::now() + Duration::from_millis(700);
        assert!(wait_for(Duration::from_secs(2), || Instant::now() >= until));
        signal(c.id() as i32, libc::SIGHUP);
    }
    let to = now_secs() - 1;
    // Until the last given up is recorded (asked again each second while Redis does not take it).
    let calm = Instant::now();
    assert!(wait_for(Duration::from_secs(5), || calm.elapsed()
        >= Duration::from_secs(3)));
    let said = crate::common::replicas::replica_err(&file);
    assert_eq!(crate::common::replicas::stop(c), Some(0), "{said}");
    let (count, _) = runs(&dir);
    let book = ledger(&url, "rq");
    for at in from..=to {
        let ran = count.get(&("rq".to_string(), at)).copied().unwrap_or(0);
        assert!(
            ran > 0 || book.iter().any(|(t, _, _)| *t == at),
            "{at} neither ran nor is in the ledger: {book:?}\n{said}"
        );
    }
}
