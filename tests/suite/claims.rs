//! A replica claims each due instant itself and hands the won lock to the run it starts: every
//! due job runs while the fleet has room, a run reports to its replica on a channel whatever its
//! output, and no fault between the claim and the run (a replica SIGKILLed around an instant, or
//! between claim and spawn; a paused Redis) loses an instant, runs one twice or lets two
//! attempts overlap.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::common::replicas::{crontab, instants, replica, replica_err, replica_with, stop};
use crate::common::*;

/// `KEY INSTANT` lines a job writes, as (KEY, INSTANT) counts.
fn runs_of(file: &Path) -> BTreeMap<(String, String), usize> {
    let mut out = BTreeMap::new();
    for line in instants(file) {
        if let Some((k, i)) = line.split_once(' ') {
            *out.entry((k.to_string(), i.to_string())).or_default() += 1;
        }
    }
    out
}

/// The instants at which every one of `keys` ran.
fn complete_instants(runs: &BTreeMap<(String, String), usize>, keys: usize) -> Vec<String> {
    let mut per: BTreeMap<&str, usize> = BTreeMap::new();
    for (k, _) in runs.keys().map(|(k, i)| (i.as_str(), k)) {
        *per.entry(k).or_default() += 1;
    }
    per.into_iter()
        .filter(|(_, n)| *n == keys)
        .map(|(i, _)| i.to_string())
        .collect()
}

/// 40 jobs due at the same instant on 3 replicas with the default --max-jobs (16): each runs once
/// per instant (one replica alone could not hold them all).
#[test]
fn forty_jobs_due_at_once_each_run_once_per_instant() {
    let r = Redis::start();
    let dir = scratch("forty");
    let log = dir.join("log");
    let mut text = String::from("CRON_TZ=UTC\n");
    for j in 0..40 {
        text += &format!(
            "*/4 * * * * * f{j} echo f{j} $CRONLOCK_INSTANT >> {}; sleep 2\n",
            log.display()
        );
    }
    let file = crontab(&dir, &text);
    let replicas: Vec<Child> = (0..3).map(|_| replica(&r.url(), &file, &[])).collect();
    // Two whole instants after the first (which may have come while replicas were starting).
    assert!(
        wait_for(Duration::from_secs(30), || complete_instants(
            &runs_of(&log),
            40
        )
        .len()
            >= 2),
        "{:?}\n{}",
        runs_of(&log).len(),
        replica_err(&file)
    );
    for c in replicas {
        assert_eq!(stop(c), Some(0), "{}", replica_err(&file));
    }
    let twice: Vec<_> = runs_of(&log).into_iter().filter(|(_, n)| *n > 1).collect();
    assert!(twice.is_empty(), "ran twice: {twice:?}");
}

/// 20 jobs of 1 s due at once on 3 replicas with --max-jobs 4 (12 at a time): all 20 run for that
/// instant, the ones without room waiting for it instead of being skipped.
#[test]
fn jobs_beyond_the_fleets_room_wait_for_it() {
    let r = Redis::start();
    let dir = scratch("room");
    let log = dir.join("log");
    let mut text = String::from("CRON_TZ=UTC\n");
    for j in 0..20 {
        text += &format!(
            "*/10 * * * * * w{j} echo w{j} $CRONLOCK_INSTANT >> {}; sleep 1\n",
            log.display()
        );
    }
    let file = crontab(&dir, &text);
    let replicas: Vec<Child> = (0..3)
        .map(|_| replica(&r.url(), &file, &["--max-jobs", "4"]))
        .collect();
    // The first instant each replica sees whole: replicas start within a second, so the
    // instant after the first one that came is fully theirs.
    assert!(
        wait_for(Duration::from_secs(35), || !complete_instants(
            &runs_of(&log),
            20
        )
        .is_empty()),
        "{:?}\n{}",
        runs_of(&log),
        replica_err(&file)
    );
    for c in replicas {
        assert_eq!(stop(c), Some(0), "{}", replica_err(&file));
    }
    assert!(
        runs_of(&log).values().all(|n| *n == 1),
        "{:?}",
        runs_of(&log)
    );
}

/// What a run did reaches its replica on the channel, whatever the job prints or how verbose it
/// is: a -q job that exits 3 gets its end line with status 3, a command that leaves a partial line
/// on stderr does not swallow its end line, and the command's environment has no internal
/// variable.
#[test]
fn the_replica_knows_what_runs_did_whatever_their_output() {
    let r = Redis::start();
    let dir = scratch("channel");
    let env = dir.join("env");
    let file = crontab(
        &dir,
        &format!(
            "* * * * * * -q quiet exit 3\n\
             * * * * * * --log-format text partial printf 'no newline' >&2; exit 4\n\
             * * * * * * -v environ env > {}\n",
            env.display()
        ),
    );
    let c = replica(&r.url(), &file, &[]);
    assert!(
        wait_for(Duration::from_secs(10), || {
            let err = replica_err(&file);
            err.contains("quiet: command exited with status 3")
                && err.contains("partial: command exited with status 4")
                && err.contains("environ: command exited with status 0")
        }),
        "{}",
        replica_err(&file)
    );
    assert_eq!(stop(c), Some(0));
    let err = replica_err(&file);
    assert!(err.contains("[partial] no newline"), "{err}");
    assert!(err.contains("quiet: started for the "), "{err}");
    let seen = std::fs::read_to_string(&env).unwrap();
    for internal in [
        "CRONLOCK_HANDOVER_FD",
        "CRONLOCK_FIRED_FOR",
        "CRONLOCK_LOG_FORMAT",
        "CRONLOCK_TEST_HOLD_AFTER_CLAIM",
    ] {
        assert!(
            !seen.contains(internal),
            "{internal} reached the command:\n{seen}"
        );
    }
    assert!(seen.contains("CRONLOCK_INSTANT="), "{seen}");
    // The channel is closed on exec: the command has only its stdio open (and what sh opens).
    assert!(err.contains("environ: started"), "{err}");
}

/// A job that runs 0.3 s and records each attempt's start and success, and any attempt of it
/// still alive when another starts.
fn careful_job(dir: &Path, key: &str, every: u32) -> String {
    let d = dir.display();
    format!(
        "*/{every} * * * * * --ttl 1s --catch-up 30s --retries 3 {key} \
         for p in $(cat {d}/pids 2>/dev/null); do kill -0 $p 2>/dev/null && echo OVERLAP >> {d}/log; done; \
         echo $$ >> {d}/pids; echo start $CRONLOCK_INSTANT $CRONLOCK_ATTEMPT >> {d}/log; \
         sleep 0.3; echo done $CRONLOCK_INSTANT >> {d}/log\n"
    )
}

/// The log's verdict: no overlap, no instant done twice; the instants done.
fn done_once(log: &Path) -> BTreeSet<String> {
    let lines = instants(log);
    assert!(!lines.iter().any(|l| l == "OVERLAP"), "{lines:#?}");
    let mut done = BTreeMap::new();
    for l in lines.iter().filter_map(|l| l.strip_prefix("done ")) {
        *done.entry(l.to_string()).or_insert(0) += 1;
    }
    let twice: Vec<_> = done.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "done twice: {twice:?}\n{lines:#?}");
    done.into_keys().collect()
}

/// Every instant from the first to the last done was done (consecutive by `every` seconds).
fn none_missing(done: &BTreeSet<String>, every: u64, log: &Path, file: &Path) {
    let secs: Vec<u64> = done
        .iter()
        .map(|t| {
            humantime::parse_rfc3339(t)
                .unwrap()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_secs()
        })
        .collect();
    for pair in secs.windows(2) {
        assert_eq!(
            pair[1] - pair[0],
            every,
            "an instant was lost: {done:?}\n{:#?}\n{}",
            instants(log),
            replica_err(file)
        );
    }
}

/// Replicas SIGKILLed (with their runs) at random moments within 40 ms after an instant, and a
/// new one started each time: no instant succeeds twice, no two attempts overlap, and every
/// instant runs, by a retry on another replica where needed.
#[test]
fn replicas_killed_around_instants_lose_nothing() {
    let r = Redis::start();
    let dir = scratch("killed");
    let log = dir.join("log");
    let file = crontab(&dir, &careful_job(&dir, "careful", 5));
    let mut replicas: Vec<Child> = (0..3).map(|_| replica(&r.url(), &file, &[])).collect();
    let rounds = 4;
    let mut seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .subsec_nanos() as u64;
    for round in 0..rounds {
        // Just after an instant of the job (every 5 s): the next one comes within 5 s.
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let next = (now / 5 + 1) * 5;
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let after = (seed >> 33) % 40;
        assert!(wait_for(Duration::from_secs(7), || {
            let t = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
            t.as_secs() > next || (t.as_secs() == next && ms_into_second() >= after)
        }));
        let victim = replicas.remove((seed >> 40) as usize % replicas.len());
        kill_hard(victim);
        replicas.push(replica(&r.url(), &file, &[]));
        let _ = round;
    }
    // The last instant's retry has time to run (TTL 1 s, a replica lapses within 2 s).
    let last = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
        / 5
        * 5;
    assert!(wait_for(Duration::from_secs(12), || {
        instants(&log)
            .iter()
            .any(|l| l.starts_with("done ") && time_of(&l[5..]) > last)
    }));
    for c in replicas {
        kill_hard(c);
    }
    let done = done_once(&log);
    eprintln!("{:#?}", instants(&log));
    assert!(done.len() >= rounds, "{done:?}");
    none_missing(&done, 5, &log, &file);
}

/// SIGKILL, and the reaping.
fn kill_hard(mut c: Child) {
    signal(c.id() as i32, libc::SIGKILL);
    c.wait().unwrap();
}

/// An instant's Unix seconds.
fn time_of(t: &str) -> u64 {
    humantime::parse_rfc3339(t.trim())
        .map(|t| t.duration_since(UNIX_EPOCH).unwrap().as_secs())
        .unwrap_or(0)
}

/// Replicas whose turn an instant is not keep it waiting without spinning, and none spins at its
/// heartbeats' slots: three replicas serving jobs every second use a few clock ticks each, not a
/// core (nor a tenth of one).
#[test]
fn replicas_waiting_on_others_do_not_spin() {
    let r = Redis::start();
    let dir = scratch("spin");
    let log = dir.join("log");
    let mut text = String::from("CRON_TZ=UTC\n");
    for j in 0..4 {
        text += &format!(
            "* * * * * * s{j} echo s{j} $CRONLOCK_INSTANT >> {}\n",
            log.display()
        );
    }
    let file = crontab(&dir, &text);
    let replicas: Vec<Child> = (0..3).map(|_| replica(&r.url(), &file, &[])).collect();
    assert!(wait_for(Duration::from_secs(10), || instants(&log).len() >= 4));
    let before: Vec<u64> = replicas.iter().map(|c| own_ticks(c.id())).collect();
    let from = instants(&log).len();
    // Four more seconds of instants.
    assert!(wait_for(Duration::from_secs(10), || instants(&log).len()
        >= from + 16));
    let used: Vec<u64> = replicas
        .iter()
        .zip(&before)
        .map(|(c, b)| own_ticks(c.id()) - b)
        .collect();
    for c in replicas {
        assert_eq!(stop(c), Some(0), "{}", replica_err(&file));
    }
    // Spinning would be about 100 ticks a second (a spin at each heartbeat's slot, about 18); a
    // replica that sleeps uses a few.
    assert!(
        used.iter().all(|t| *t < 40),
        "clock ticks per replica: {used:?}"
    );
    eprintln!("clock ticks per replica over four seconds: {used:?}");
}

/// Replicas of different crontabs sharing one Redis (and prefix) are different fleets: each
/// ranks only the replicas serving its own jobs, so no instant is left to a replica that does not
/// have the job.
#[test]
fn fleets_of_different_crontabs_share_a_redis_without_losing_instants() {
    let r = Redis::start();
    let mut fleets = Vec::new();
    for name in ["left", "right"] {
        let dir = scratch(name);
        let log = dir.join("log");
        let mut text = String::from("CRON_TZ=UTC\n");
        for j in 0..3 {
            text += &format!(
                "* * * * * * {name}{j} echo {name}{j} $CRONLOCK_INSTANT >> {}\n",
                log.display()
            );
        }
        let file = crontab(&dir, &text);
        let replicas: Vec<Child> = (0..2).map(|_| replica(&r.url(), &file, &[])).collect();
        fleets.push((dir, log, file, replicas));
    }
    // Six whole seconds of every job of both fleets.
    assert!(wait_for(Duration::from_secs(20), || fleets.iter().all(
        |(_, log, _, _)| complete_instants(&runs_of(log), 3).len() >= 6
    )));
    for (_, log, file, replicas) in fleets {
        for c in replicas {
            assert_eq!(stop(c), Some(0), "{}", replica_err(&file));
        }
        let runs = runs_of(&log);
        assert!(runs.values().all(|n| *n == 1), "{runs:?}");
        // Every second between the first and the last whole one, for every job.
        let whole = complete_instants(&runs, 3);
        let first = time_of(&whole[0]);
        let last = time_of(whole.last().unwrap());
        assert_eq!(
            whole.len() as u64,
            last - first + 1,
            "an instant was lost: {whole:?}\n{}",
            replica_err(&file)
        );
    }
}

/// The states in KEY's ledger.
fn ledger_states(r: &Redis, key: &str) -> Vec<String> {
    let entries: Vec<String> =
        r.query(redis::cmd("HVALS").arg(format!("cronlock:{{{key}}}:ledger")));
    entries
        .iter()
        .map(|e| {
            let v: serde_json::Value = serde_json::from_str(e).unwrap();
            v["state"].as_str().unwrap_or_default().to_string()
        })
        .collect()
}

/// How many `CLIENT TRACKING` calls `r` answered: one per lock watch, which a run opens (two
/// connections) once its command has run 20 ms.
fn watches(r: &Redis) -> u64 {
    let info: String = r.query(redis::cmd("INFO").arg("commandstats"));
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_client|tracking:calls="))
        .and_then(|rest| rest.split(',').next()?.parse().ok())
        .unwrap_or(0)
}

/// A replica's runs open no connection to Redis to claim or release (the replica does it for
/// them on its own), their ends are recorded all the same, and each command starts on its
/// instant, never before it (the replica claims a little ahead; the run waits). The only
/// connections a run may open are its lock's watch, when its command runs over 20 ms (a `sh` with
/// `date` may, on a busy machine).
#[test]
fn runs_open_no_connection_and_start_on_their_instant() {
    let r = Redis::start();
    let dir = scratch("noconn");
    let log = dir.join("log");
    let file = crontab(
        &dir,
        &format!(
            "CRON_TZ=UTC\n* * * * * * noconn echo $CRONLOCK_INSTANT $(date +%s.%N) >> {}\n",
            log.display()
        ),
    );
    let c = replica(&r.url(), &file, &[]);
    assert!(wait_for(Duration::from_secs(10), || !instants(&log).is_empty()));
    let before = (r.connections_received(), watches(&r));
    assert!(wait_for(Duration::from_secs(15), || instants(&log).len() >= 5));
    let after = (r.connections_received(), watches(&r));
    assert_eq!(stop(c), Some(0), "{}", replica_err(&file));
    let watched = after.1 - before.1;
    // A watch counted on one side of a snapshot may have its connections counted on the other
    // (opened just before it, CLIENT TRACKING just after): one watch's worth either way. Runs
    // that opened connections of their own would be five or more over.
    let opened = after.0 - before.0;
    assert!(
        opened <= 2 * watched + 2,
        "runs opened {opened} connections, besides {watched} lock watches (two each)"
    );
    for line in instants(&log) {
        let (instant, start) = line.split_once(' ').unwrap();
        let start: f64 = start.trim().parse().unwrap();
        assert!(
            start >= time_of(instant) as f64,
            "started before its instant: {line}"
        );
    }
    let states = ledger_states(&r, "noconn");
    assert!(states.len() >= 5, "{states:?}");
    assert!(states.iter().all(|s| s == "succeeded"), "{states:?}");
}

/// A run whose replica does not answer its release (the replica is stopped) releases its lock by
/// itself within --connect-timeout, and the ledger records its end.
#[test]
fn a_run_whose_replica_hangs_releases_by_itself() {
    let r = Redis::start();
    let dir = scratch("hung");
    let started = dir.join("started");
    let file = crontab(
        &dir,
        &format!("*/3 * * * * * hung touch {}; sleep 1\n", started.display()),
    );
    let c = replica(&r.url(), &file, &["--connect-timeout", "1s"]);
    assert!(wait_for(Duration::from_secs(10), || started.exists()));
    // Stopped while its run's command sleeps: the run's release goes unanswered.
    signal(c.id() as i32, libc::SIGSTOP);
    let released = wait_for(Duration::from_secs(8), || {
        !r.exists("cronlock:{hung}") && ledger_states(&r, "hung").contains(&"succeeded".into())
    });
    let states = ledger_states(&r, "hung");
    signal(c.id() as i32, libc::SIGCONT);
    assert_eq!(stop(c), Some(0), "{}", replica_err(&file));
    assert!(
        released,
        "the lock stayed with a stopped replica: {states:?}"
    );
}

/// A replica renews its runs' locks itself (those due together, as one pipeline) and tells
/// each run, so its runs open no connection of their own while their commands outlive several
/// renewals. A frozen replica's runs renew by themselves: their locks never lapse, and their
/// commands (twice as long as the TTL) end as they would, recorded `succeeded` (the instants
/// that came while they ran are skipped, or missed while the replica was frozen; none failed).
#[test]
fn the_replica_renews_its_runs_locks_and_a_frozen_replicas_runs_renew_by_themselves() {
    let r = Redis::start();
    let dir = scratch("renewed");
    let log = dir.join("log");
    let jobs: String = (1..=6)
        .map(|j| {
            format!(
                "* * * * * * --ttl 4s --connect-timeout 1s renew{j} sh -c 'echo start >> {0}; sleep 8; echo done >> {0}'\n",
                log.display()
            )
        })
        .collect();
    let file = crontab(&dir, &jobs);
    let lines = |word: &str| {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .filter(|l| *l == word)
            .count()
    };
    // (A run waits for its replica's release only while a release of its own could still reach
    // Redis within --connect-timeout before its lock could lapse.)
    let c = replica(&r.url(), &file, &[]);
    // The first runs: renewed by the replica, each about eight times (every 0.97 s; a run would
    // renew by itself 0.48 s after one came late).
    assert!(wait_for(Duration::from_secs(10), || lines("start") >= 6));
    let before = (r.connections_received(), watches(&r));
    assert!(wait_for(Duration::from_secs(20), || lines("done") >= 6));
    let after = (r.connections_received(), watches(&r));
    let opened = after.0 - before.0;
    let watched = after.1 - before.1;
    // (A watch counted on one side of a snapshot may have its connections on the other, and a
    // run whose renewal came late on a busy machine opens one.) Runs renewing by themselves
    // would open six or more.
    assert!(
        opened <= 2 * watched + 3,
        "runs opened {opened} connections, besides {watched} lock watches (two each)"
    );
    // The next runs: the replica frozen for longer than their TTL while they work.
    assert!(wait_for(Duration::from_secs(10), || lines("start") >= 12));
    std::thread::sleep(Duration::from_millis(500));
    signal(c.id() as i32, libc::SIGSTOP);
    let lapsed = wait_for(Duration::from_secs(5), || {
        !(1..=6).all(|j| r.exists(&format!("cronlock:{{renew{j}}}")))
    });
    signal(c.id() as i32, libc::SIGCONT);
    assert!(!lapsed, "a lock lapsed while its replica was frozen");
    assert!(wait_for(Duration::from_secs(20), || lines("done") >= 12));
    assert_eq!(stop(c), Some(0), "{}", replica_err(&file));
    let err = replica_err(&file);
    assert!(!err.contains("lost"), "{err}");
    for j in 1..=6 {
        let states = ledger_states(&r, &format!("renew{j}"));
        assert!(
            states.iter().filter(|s| *s == "succeeded").count() >= 2,
            "renew{j}: {states:?}"
        );
        assert!(
            states
                .iter()
                .all(|s| !matches!(s.as_str(), "failed" | "interrupted" | "abandoned")),
            "renew{j}: {states:?}\n{err}"
        );
    }
}

/// What the replica reports for runs it did not start: instants missed, suspended jobs.
mod reports;

/// The starter, which guards its runs' commands, when it, a run or the replica is SIGKILLed mid-run.
mod starter;

/// The tests that measure time: they run alone (`common::alone`).
mod alone;

/// A run that asked its replica for a renewal and then for its release, while the replica's loop
/// was held (a test hook), releases its `--min-hold` lock by itself; when the loop turns again,
/// the replica carries out that renewal and release: the renewal is refused (the run asked for
/// its release), and the release keeps only what is left of `--min-hold`, so the lock is gone
/// when `--min-hold` ends, never kept for a TTL or for the hold the run asked at its end.
#[test]
fn a_late_renewal_never_keeps_a_min_hold_lock_past_its_end() {
    let r = Redis::start();
    let dir = scratch("late-renewal");
    let hold = dir.join("hold");
    let log = dir.join("log");
    let file = crontab(
        &dir,
        &format!(
            "CRON_TZ=UTC\n*/10 * * * * * --ttl 3s --min-hold 4s --connect-timeout 300ms mh sh -c \
             'echo $CRONLOCK_INSTANT_MS >> {}; sleep 1.5'\n",
            log.display()
        ),
    );
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let hook = hold.to_str().unwrap();
    let c = crate::common::replicas::replica_with(
        &r.url(),
        &file,
        &["--listen", &addr],
        &[("CRONLOCK_TEST_HOLD_LOOP", hook)],
    );
    assert!(
        wait_for(Duration::from_secs(25), || !instants(&log).is_empty()),
        "{}",
        replica_err(&file)
    );
    std::fs::write(&hold, "").unwrap();
    let at: u64 = instants(&log)[0].parse().unwrap();
    let now_ms = || {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64
    };
    // The run asks for a renewal (at 1 s), ends (1.5 s), and releases by itself (the replica
    // does not answer): the loop turns again at 3 s.
    assert!(wait_for(Duration::from_secs(5), || now_ms() >= at + 3000));
    std::fs::remove_file(&hold).unwrap();
    assert!(wait_for(Duration::from_secs(5), || now_ms() >= at + 4400));
    let pttl = r.pttl("cronlock:{mh}");
    let said = replica_err(&file);
    assert_eq!(stop(c), Some(0), "{said}");
    assert_eq!(
        pttl, -2,
        "the lock is kept past --min-hold: {pttl} ms left\n{said}"
    );
}
