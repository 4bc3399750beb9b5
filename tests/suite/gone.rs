//! A run that is gone frees its job at once: a replica killed or frozen while its run's command
//! works never leaves the job's lock to wait out its TTL (30 s by default) while a process on the
//! same host knows the command is gone; the job's next instants run on time on another replica.

use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

use crate::accounted::{ledger, now_secs, runs, Counts};
use crate::common::replicas::{children_of, crontab, replica, replica_err, starter_of, stop};
use crate::common::*;

/// Three replicas serving one job every second with the default TTL (30 s), its command 0.3 s
/// long (KEY `key`), once it has run twice.
struct OneJob {
    r: Redis,
    dir: Scratch,
    file: std::path::PathBuf,
    fleet: Vec<Child>,
}

impl OneJob {
    fn start(key: &str) -> OneJob {
        let r = Redis::start();
        let dir = scratch(key);
        let file = crontab(
            &dir,
            &format!(
                "CRON_TZ=UTC\n* * * * * * {key} echo {key} $CRONLOCK_INSTANT $(date +%s%N) >> \
                 {}; sleep 0.3\n",
                dir.join("runs").display()
            ),
        );
        let fleet = (0..3).map(|_| replica(&r.url(), &file, &[])).collect();
        assert!(wait_for(Duration::from_secs(15), || runs(&dir).0.len() >= 2));
        OneJob {
            r,
            dir,
            file,
            fleet,
        }
    }

    /// The index of the replica that has a run in flight (its starter has a child), once one
    /// has (within 10 s).
    fn running_one(&self) -> usize {
        let mut found = None;
        assert!(
            wait_for(Duration::from_secs(10), || {
                found = self
                    .fleet
                    .iter()
                    .position(|c| starter_of(c.id()).is_some_and(|s| !children_of(s).is_empty()));
                found.is_some()
            }),
            "no run in flight\n{}",
            replica_err(&self.file)
        );
        found.unwrap()
    }

    /// SIGTERM every replica: their exit statuses.
    fn stop_all(&mut self) -> Vec<Option<i32>> {
        self.fleet.drain(..).map(stop).collect()
    }
}

/// Let the fleet serve for `secs` seconds (bounded polling, no bare sleep).
fn serve_for(secs: u64) {
    let since = Instant::now();
    assert!(wait_for(Duration::from_secs(secs * 2 + 10), || since
        .elapsed()
        >= Duration::from_secs(secs)));
}

/// Every instant of `key` from `from` to `to` (Unix seconds) ran exactly once.
fn each_ran_once(count: &Counts, key: &str, (from, to): (i64, i64), why: &dyn Fn() -> String) {
    let wrong: Vec<(i64, usize)> = (from..=to)
        .map(|at| (at, count.get(&(key.to_string(), at)).copied().unwrap_or(0)))
        .filter(|(_, n)| *n != 1)
        .collect();
    assert!(
        wrong.is_empty(),
        "{key}: (instant, runs) {wrong:?}\n{}",
        why()
    );
}

/// A replica SIGKILLed while its run's command works (a job every second, the default TTL): its
/// run is told (its starter died with the replica), stops its command, gives the lock back and
/// records the attempt; the job's next instants run on time on the other replicas (before, the
/// lock stayed for its TTL and about 29 instants were skipped).
#[test]
fn a_killed_replicas_run_frees_its_job_at_once() {
    let mut job = OneJob::start("gone-kill");
    let mut victim = job.fleet.remove(job.running_one());
    signal(victim.id() as i32, libc::SIGKILL);
    let killed_at = now_secs();
    victim.wait().unwrap();
    serve_for(5);
    let to = now_secs() - 1;
    let codes = job.stop_all();
    let (count, _) = runs(&job.dir);
    let book = ledger(&job.r.url(), "gone-kill");
    let why = || format!("{codes:?} {book:?}\n{}", replica_err(&job.file));
    assert!(codes.iter().all(|c| *c == Some(0)), "{}", why());
    each_ran_once(&count, "gone-kill", (killed_at + 1, to), &why);
    assert!(
        book.iter().all(|(_, state, _)| state != "running"),
        "{}",
        why()
    );
    // The killed run's attempt reads how it ended.
    let (_, state, _) = book.iter().find(|(t, _, _)| *t == killed_at).unwrap();
    assert!(
        ["interrupted", "succeeded"].contains(&state.as_str()),
        "{}",
        why()
    );
}

/// A replica SIGSTOPped for 10 s while its run's command works: the run does not wait on it for
/// its release (no `releasing` within milliseconds), releases by itself and records its end; the
/// job's next instants run on time on the other replicas, and none runs twice once the frozen
/// one wakes.
#[test]
fn a_frozen_replicas_run_frees_its_job_at_once() {
    let mut job = OneJob::start("gone-stop");
    let pid = job.fleet[job.running_one()].id() as i32;
    signal(pid, libc::SIGSTOP);
    let frozen_at = now_secs();
    serve_for(10);
    let to = now_secs() - 1;
    signal(pid, libc::SIGCONT);
    serve_for(3);
    let end = now_secs() - 1;
    let codes = job.stop_all();
    let (count, _) = runs(&job.dir);
    let book = ledger(&job.r.url(), "gone-stop");
    let why = || format!("{codes:?} {book:?}\n{}", replica_err(&job.file));
    each_ran_once(&count, "gone-stop", (frozen_at + 1, to), &why);
    assert!(
        count.values().all(|n| *n == 1),
        "ran twice: {count:?}\n{}",
        why()
    );
    assert!(
        book.iter()
            .filter(|(t, _, _)| *t <= end)
            .all(|(_, state, _)| state == "succeeded"),
        "{}",
        why()
    );
    assert!(codes.iter().all(|c| *c == Some(0)), "{}", why());
}

/// A replica's run frozen (SIGSTOP) past its lock's lapse: its guard stops its command in time,
/// the job's next instant takes the lock; resumed, the old run's release (through its replica or
/// by itself) finds the lock not ours and deletes nothing: the new run keeps its lock to its end.
#[test]
fn a_resumed_runs_release_never_deletes_the_next_runs_lock() {
    let r = Redis::start();
    let dir = scratch("gone-late");
    let d = dir.display();
    let file = crontab(
        &dir,
        &format!(
            "CRON_TZ=UTC\n*/4 * * * * * --ttl 2s gone-late echo $CRONLOCK_INSTANT >> {d}/runs; \
             sleep 2.5\n"
        ),
    );
    let c = replica(&r.url(), &file, &[]);
    let lines = || crate::common::replicas::instants(&dir.join("runs"));
    assert!(
        wait_for(Duration::from_secs(10), || !lines().is_empty()),
        "{}",
        replica_err(&file)
    );
    let starter = starter_of(c.id()).expect("the replica's starter");
    let mut old = Vec::new();
    assert!(wait_for(Duration::from_secs(2), || {
        old = children_of(starter);
        !old.is_empty()
    }));
    let frozen = old[0] as i32;
    signal(frozen, libc::SIGSTOP);
    // The next instant's run holds the lock (its command sleeps 2.5 s).
    let before = lines().len();
    assert!(
        wait_for(Duration::from_secs(8), || lines().len() > before),
        "{}",
        replica_err(&file)
    );
    let holder: String = r.get("cronlock:{gone-late}").expect("the next run's lock");
    signal(frozen, libc::SIGCONT);
    assert!(
        wait_for(Duration::from_secs(5), || !alive(frozen)),
        "the resumed run did not end"
    );
    assert_eq!(
        r.get("cronlock:{gone-late}").as_deref(),
        Some(holder.as_str()),
        "the resumed run's release touched the next run's lock\n{}",
        replica_err(&file)
    );
    assert_eq!(stop(c), Some(0), "{}", replica_err(&file));
}

/// A window in which a job may lose instants: its lock was held by a replica whose whole process
/// group was killed or frozen (nothing on the host was left to prove its command gone), from the
/// fault until the lock lapsed (its TTL after the group woke) and the next instant after.
struct Excused {
    key: String,
    from: i64,
    to: i64,
}

/// The jobs whose lock replica `pid` (its claim's holder value) holds now, among `keys`.
fn held_by(r: &Redis, pid: u32, keys: &[(String, i64)]) -> Vec<(String, i64)> {
    keys.iter()
        .filter(|(key, _)| {
            r.get(&format!("cronlock:{{{key}}}"))
                .and_then(|v| serde_json::from_str::<serde_json::Value>(&v).ok())
                .is_some_and(|v| v["pid"].as_u64() == Some(u64::from(pid)))
        })
        .cloned()
        .collect()
}

/// Chaos for 60 s: three replicas (each leading its process group), six jobs every second (three
/// with the default TTL, three with `--ttl 2s`, two of those with `--retries 1 --catch-up 10s`),
/// and every 4-9 s one of: a replica SIGKILLed, its whole group SIGKILLed, it or its group
/// SIGSTOPped for 1-3 s, SIGTERMed (a killed one replaced at once), or Redis stalled for 1-4 s.
/// Of the instants at which a replica served, at most 1 % never ran, not counting a job's
/// instants within its TTL after a group holding its lock was killed or frozen, nor those due
/// while Redis stalled (and 2 s after); every lost instant is printed with the fault before it;
/// every instant is in the ledger, none reads `running` once the fleet stopped, no two runs of
/// a job overlap, none succeeded twice, and no command ran to its end twice for one instant
/// outside a group killed or frozen past a TTL.
#[test]
fn chaos_of_kills_and_freezes_loses_at_most_one_instant_in_a_hundred() {
    use crate::accounted::Dice;
    use crate::common::replicas::replica_grouped;
    let r = Redis::start();
    let dir = scratch("gone-chaos");
    let d = dir.display();
    let mut jobs: Vec<(String, i64)> = Vec::new();
    let mut text = String::from("CRON_TZ=UTC\n");
    for i in 0..6 {
        let key = format!("gc-{i}");
        let (opts, ttl) = match i {
            0..=2 => ("", 30),
            3 | 4 => ("--ttl 2s --retries 1 --catch-up 10s", 2),
            _ => ("--ttl 2s", 2),
        };
        text += &format!(
            "* * * * * * {opts} {key} echo {key} $CRONLOCK_INSTANT $(date +%s%N) >> {d}/runs; \
             echo {key} $CRONLOCK_RUN_ID $(date +%s%N) >> {d}/starts; sleep 0.3; \
             echo {key} $CRONLOCK_RUN_ID $(date +%s%N) >> {d}/ends; \
             echo {key} $CRONLOCK_INSTANT >> {d}/done\n"
        );
        jobs.push((key, ttl));
    }
    let file = crontab(&dir, &text);
    let url = r.url();
    let start = || replica_grouped(&url, &file, &["--drain", "5s", "-v"]);
    let mut fleet: Vec<Child> = (0..3).map(|_| start()).collect();
    let mut dice = Dice::from_clock("chaos");
    let seed = dice.seed;
    let from = now_secs() + 3;
    let began = Instant::now();
    let mut done = Vec::new();
    let mut excused: Vec<Excused> = Vec::new();
    let pause_for = |ms: u64| {
        let until = Instant::now() + Duration::from_millis(ms);
        assert!(wait_for(Duration::from_secs(10), || Instant::now() >= until));
    };
    // The ledger keeps a job's 64 newest instants: read as the chaos goes, the newest read kept.
    let mut books = std::collections::BTreeMap::new();
    while began.elapsed() < Duration::from_secs(60) {
        pause_for(4000 + dice.roll(5000));
        read_books(&url, &jobs, &mut books);
        let held = |pid: u32| held_by(&r, pid, &jobs);
        let at = now_secs();
        let (what, mut more) = fault(&mut fleet, &start, &r, &mut dice, &held);
        done.push(Fault { what, at });
        excused.append(&mut more);
        if what == "redis stall" {
            // What was due while Redis answered nothing could not run (and a run longer than its
            // TTL was stopped): lost for a reason, said below, and excused.
            let to = now_secs() + 2;
            excused.extend(jobs.iter().map(|(key, _)| Excused {
                key: key.clone(),
                from: at,
                to,
            }));
        }
    }
    serve_for(6);
    let to = now_secs() - 2;
    for c in fleet {
        stop(c);
    }
    println!("chaos: {done:?}");
    let (count, _) = runs(&dir);
    let why = |what: &str| format!("{what} (seed {seed}, {done:?})\n{}", replica_err(&file));
    read_books(&url, &jobs, &mut books);
    let (mut total, mut lost) = (0, Vec::new());
    for (key, _) in &jobs {
        for at in from..=to {
            let ran = count.get(&(key.clone(), at)).copied().unwrap_or(0);
            let Some(entry) = books.get(&(key.clone(), at)) else {
                panic!(
                    "{}",
                    why(&format!("{key}@{at} is in no ledger (ran {ran})"))
                );
            };
            let excused = excused
                .iter()
                .any(|e| e.key == *key && (e.from..=e.to).contains(&at));
            // (A run killed with its whole group holds its lock, and its entry reads `running`,
            // until the lock lapses and the job is claimed again.)
            assert!(
                excused || entry["state"] != "running",
                "{}",
                why(&format!("{key}@{at} reads running"))
            );
            crate::accounted::assert_ran_as_attempted(entry, ran, &|| {
                why(&format!("{key}@{at}: {entry}"))
            });
            if excused {
                if ran == 0 {
                    let l = format!("{key}@{at} {} {}", entry["state"], entry["reason"]);
                    println!("chaos: lost (excused) {l} after {}", cause(&done, &l));
                }
                continue;
            }
            total += 1;
            if ran == 0 {
                lost.push(format!("{key}@{at} {} {}", entry["state"], entry["reason"]));
            }
        }
    }
    assert_no_overlap(&dir, &why);
    let twice = completed_twice(&dir, &excused);
    for t in &twice {
        println!("chaos: completed twice: {t} after {}", cause(&done, t));
    }
    assert!(
        twice.is_empty(),
        "{}",
        why(&format!("completed twice: {twice:?}"))
    );
    println!("chaos: {} of {total} instants lost: {lost:?}", lost.len());
    for l in &lost {
        println!("chaos: lost {l} after {}", cause(&done, l));
    }
    // What the replicas said of each lost instant (shown with --nocapture, or on a failure).
    let said = replica_err(&file);
    for l in &lost {
        let (key, at) = l.split_once('@').unwrap_or_default();
        let at: u64 = at
            .split_whitespace()
            .next()
            .unwrap_or("0")
            .parse()
            .unwrap_or(0);
        let when = crate::accounted::rfc3339_secs(at);
        for line in said
            .lines()
            .filter(|s| s.contains(key) && s.contains(&when))
        {
            println!("  {line}");
        }
    }
    assert!(
        lost.len() * 100 <= total,
        "{}",
        why(&format!("{} of {total} lost: {lost:?}", lost.len()))
    );
}

/// A fault the chaos did, and when (Unix seconds).
#[derive(Debug)]
struct Fault {
    what: &'static str,
    at: i64,
}

/// The faults that came within 5 s before the instant `KEY@SECS ...` names: the one a lost or
/// doubled instant is blamed on.
fn cause(done: &[Fault], instant: &str) -> String {
    let at: i64 = instant
        .split_once('@')
        .and_then(|(_, rest)| rest.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    let near: Vec<String> = done
        .iter()
        .filter(|f| f.at <= at + 1 && at - f.at <= 5)
        .map(|f| format!("{} at {}", f.what, f.at))
        .collect();
    if near.is_empty() {
        "no fault within 5 s".into()
    } else {
        format!("{near:?}")
    }
}

/// The instants (`KEY@SECS`) whose command ran to its end twice (the `done` lines), but those
/// `excused` (a group killed or frozen past a TTL: nothing on its host could prove the run
/// gone, or report its end).
fn completed_twice(dir: &Path, excused: &[Excused]) -> Vec<String> {
    let mut done = std::collections::BTreeMap::<(String, i64), usize>::new();
    for line in crate::common::replicas::instants(&dir.join("done")) {
        let Some((key, at)) = line.split_once(' ') else {
            continue;
        };
        let at = crate::accounted::secs(at.trim());
        *done.entry((key.to_string(), at)).or_default() += 1;
    }
    done.into_iter()
        .filter(|((key, at), n)| {
            *n > 1
                && !excused
                    .iter()
                    .any(|e| e.key == *key && (e.from..=e.to).contains(at))
        })
        .map(|((key, at), _)| format!("{key}@{at}"))
        .collect()
}

/// One fault of the chaos harness, on a replica of `fleet` the dice pick (one killed is replaced
/// at once, from `start`): a SIGKILL of it or of its group, a SIGSTOP of it or of its group for
/// 1-3 s, a SIGTERM, or Redis itself stalled (SIGSTOPped) for 1-4 s, past the short TTLs. Returns
/// what was done, and the instants it excuses from reading `running` for a while: those of the
/// jobs (KEY, TTL) `held` says the replica held, for their TTL (and 2 s) after its group was
/// killed or woke (a stall of Redis excuses nothing).
fn fault(
    fleet: &mut [Child],
    start: &dyn Fn() -> Child,
    redis: &Redis,
    dice: &mut crate::accounted::Dice,
    held: &dyn Fn(u32) -> Vec<(String, i64)>,
) -> (&'static str, Vec<Excused>) {
    let pause_for = |ms: u64| {
        let until = Instant::now() + Duration::from_millis(ms);
        assert!(wait_for(Duration::from_secs(10), || Instant::now() >= until));
    };
    let excuse = |held: Vec<(String, i64)>, from: i64, woke: i64| -> Vec<Excused> {
        held.into_iter()
            .map(|(key, ttl)| Excused {
                key,
                from,
                to: woke + ttl + 2,
            })
            .collect()
    };
    let i = dice.roll(fleet.len() as u64) as usize;
    let pid = fleet[i].id();
    match dice.roll(6) {
        0 => {
            signal(pid as i32, libc::SIGKILL);
            let mut dead = std::mem::replace(&mut fleet[i], start());
            dead.wait().unwrap();
            ("kill", Vec::new())
        }
        1 => {
            let was = held(pid);
            signal(-(pid as i32), libc::SIGKILL);
            let at = now_secs();
            let mut dead = std::mem::replace(&mut fleet[i], start());
            dead.wait().unwrap();
            ("kill group", excuse(was, at, at))
        }
        2 => {
            signal(pid as i32, libc::SIGSTOP);
            pause_for(1000 + dice.roll(2000));
            signal(pid as i32, libc::SIGCONT);
            ("stop", Vec::new())
        }
        3 => {
            signal(-(pid as i32), libc::SIGSTOP);
            let at = now_secs();
            let was = held(pid);
            pause_for(1000 + dice.roll(2000));
            signal(-(pid as i32), libc::SIGCONT);
            ("stop group", excuse(was, at, now_secs()))
        }
        4 => {
            redis.pause();
            pause_for(1000 + dice.roll(3000));
            redis.resume();
            ("redis stall", Vec::new())
        }
        _ => {
            let old = std::mem::replace(&mut fleet[i], start());
            stop(old);
            ("term", Vec::new())
        }
    }
}

/// Each job's ledger entries, by (KEY, instant in Unix seconds), into `books` (a later read of an
/// instant replaces an earlier one).
fn read_books(
    url: &str,
    jobs: &[(String, i64)],
    books: &mut std::collections::BTreeMap<(String, i64), serde_json::Value>,
) {
    for (key, _) in jobs {
        let s = run(cronlock_at(url).args(["--status", "--json", key]));
        let v: serde_json::Value = serde_json::from_str(&stdout(&s)).unwrap();
        for e in v["ledger"].as_array().into_iter().flatten() {
            if let Some(at) = e["instant"].as_i64() {
                books.insert((key.clone(), at / 1000), e.clone());
            }
        }
    }
}

/// No two runs of a job overlapped: each run that wrote its end (a command stopped by a fault
/// did not) ended before the job's next run started.
fn assert_no_overlap(dir: &Path, why: &dyn Fn(&str) -> String) {
    // (KEY, run id, nanoseconds) lines.
    let read = |name: &str| -> Vec<(String, String, i64)> {
        crate::common::replicas::instants(&dir.join(name))
            .iter()
            .filter_map(|l| {
                let p: Vec<&str> = l.split_whitespace().collect();
                Some((
                    p.first()?.to_string(),
                    p.get(1)?.to_string(),
                    p.get(2)?.parse().ok()?,
                ))
            })
            .collect()
    };
    let ends = read("ends");
    let mut starts = read("starts");
    starts.sort_by_key(|(key, _, at)| (key.clone(), *at));
    for pair in starts.windows(2) {
        let ((key, id, _), (next_key, _, next_start)) = (&pair[0], &pair[1]);
        if key != next_key {
            continue;
        }
        if let Some((_, _, end)) = ends.iter().find(|(_, i, _)| i == id) {
            assert!(
                end < next_start,
                "{}",
                why(&format!("{key}: run {id} overlapped the next"))
            );
        }
    }
}

/// One slow start costs that start, never the runs already going: a replica's starter
/// SIGSTOPped for 3 s while a long run works (a job every second asks it to start a run, gets no
/// answer within 2 s, and the replica replaces that starter) leaves the long run alone: its
/// command finishes and its instant reads `succeeded`; the job every second runs again.
#[test]
fn a_slow_start_never_stops_the_runs_already_going() {
    let r = Redis::start();
    let url = r.url();
    let dir = scratch("gone-slow-start");
    let d = dir.display();
    let file = crontab(
        &dir,
        &format!(
            "CRON_TZ=UTC\n\
             0 0 1 1 * long echo began > {d}/began; sleep 6; echo done > {d}/done\n\
             * * * * * * tick echo $CRONLOCK_INSTANT >> {d}/tick\n"
        ),
    );
    let c = replica(&url, &file, &[]);
    let ticks = || {
        std::fs::read_to_string(dir.join("tick"))
            .unwrap_or_default()
            .lines()
            .count()
    };
    assert!(wait_for(Duration::from_secs(15), || ticks() >= 2));
    let out = run(cronlock_at(&url).args(["--trigger", "long"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(wait_for(Duration::from_secs(10), || dir
        .join("began")
        .exists()));
    let starter = starter_of(c.id()).expect("the replica's starter");
    signal(starter as i32, libc::SIGSTOP);
    let said = || replica_err(&file);
    let unanswered = wait_for(Duration::from_secs(15), || {
        said().contains("did not answer")
    });
    signal(starter as i32, libc::SIGCONT);
    assert!(unanswered, "{}", said());
    let after = ticks();
    assert!(
        wait_for(Duration::from_secs(15), || dir.join("done").exists()),
        "the long command never finished\n{}",
        said()
    );
    assert!(wait_for(Duration::from_secs(10), || ticks() >= after + 2));
    assert!(wait_for(Duration::from_secs(10), || {
        ledger(&url, "long")
            .iter()
            .any(|(_, state, _)| state == "succeeded")
    }));
    assert_eq!(stop(c), Some(0), "{}", said());
}

/// Under `--overlap allow` every instant whose run is gone is judged so, not only the last one
/// started: a replica whose group is SIGKILLed while several instants of a job run side by side
/// (each 3.5 s long, one a second, `--ttl 2s`) leaves none of them `running` once their locks
/// lapsed: the next claims of the job end them `abandoned`.
#[test]
fn under_allow_every_instant_whose_run_died_reads_abandoned() {
    let r = Redis::start();
    let url = r.url();
    let dir = scratch("gone-allow");
    let d = dir.display();
    let file = crontab(
        &dir,
        &format!(
            "CRON_TZ=UTC\n* * * * * * --overlap allow --ttl 2s side \
             echo $CRONLOCK_INSTANT >> {d}/side; sleep 3.5\n"
        ),
    );
    let mut victim = crate::common::replicas::replica_grouped(&url, &file, &[]);
    let running = || {
        ledger(&url, "side")
            .into_iter()
            .filter(|(_, st, _)| st == "running")
            .map(|(at, _, _)| at)
            .collect::<Vec<i64>>()
    };
    assert!(
        wait_for(Duration::from_secs(15), || running().len() >= 3),
        "{}",
        replica_err(&file)
    );
    signal(-(victim.id() as i32), libc::SIGKILL);
    victim.wait().unwrap();
    let killed_at = now_secs();
    let dead = running();
    let other = replica(&url, &file, &[]);
    // Its claims come once the dead runs' locks lapsed (2 s), each second.
    let ended = wait_for(Duration::from_secs(15), || {
        let now = running();
        dead.iter().all(|at| !now.contains(at))
    });
    let book = ledger(&url, "side");
    stop(other);
    assert!(
        ended,
        "still running {:?} (killed at {killed_at}): {book:?}",
        running()
    );
    for at in &dead {
        assert!(
            book.iter().any(|(t, st, _)| t == at
                && ["abandoned", "interrupted", "succeeded"].contains(&st.as_str())),
            "{at}: {book:?}"
        );
    }
}

/// The chaos of [`chaos_of_kills_and_freezes_loses_at_most_one_instant_in_a_hundred`] for 60 s
/// over jobs under each policy (`--ttl 2s` all): `--overlap queue` (1.5 s every second),
/// `allow --limit 2` (2.5 s every second), `replace` (3 s every 2 s) and a job every 5 s
/// triggered every 3 s. No two commands of the queue, replace or plain job at once, at most two
/// of the allow one; no manual instant run twice; every instant is in the ledger, none reads
/// `running` once the fleet stopped (but within its TTL after a group was killed or frozen), and
/// every trigger a replica took has its ledger entry.
#[test]
fn chaos_with_every_policy_runs_each_instant_once_at_most() {
    use crate::accounted::Dice;
    use crate::common::replicas::replica_grouped;
    let r = Redis::start();
    let dir = scratch("gone-policies");
    let d = dir.display();
    let mark =
        |key: &str, file: &str| format!("echo {key} $CRONLOCK_RUN_ID $(date +%s%N) >> {d}/{file}");
    let said =
        |key: &str| format!("echo {key} $CRONLOCK_MANUAL $CRONLOCK_INSTANT_MS >> {d}/instants");
    let text = format!(
        "CRON_TZ=UTC\n\
         * * * * * * --overlap queue --ttl 2s pq {}; {}; sleep 1.5; {}\n\
         * * * * * * --overlap allow --limit 2 --ttl 2s pa {}; {}; sleep 2.5; {}\n\
         */2 * * * * * --overlap replace --ttl 2s --grace 1s pr {}; {}; \
         trap '{}; exit 0' TERM; sleep 3 & wait; {}\n\
         */5 * * * * * --ttl 2s pm {}; {}; sleep 0.3; {}\n",
        said("pq"),
        mark("pq", "starts"),
        mark("pq", "ends"),
        said("pa"),
        mark("pa", "astarts"),
        mark("pa", "aends"),
        said("pr"),
        mark("pr", "starts"),
        mark("pr", "ends"),
        mark("pr", "ends"),
        said("pm"),
        mark("pm", "starts"),
        mark("pm", "ends"),
    );
    let file = crontab(&dir, &text);
    let url = r.url();
    let jobs: Vec<(String, i64)> = ["pq", "pa", "pr", "pm"]
        .iter()
        .map(|k| (k.to_string(), 2))
        .collect();
    let start = || replica_grouped(&url, &file, &["--drain", "5s"]);
    let mut fleet: Vec<Child> = (0..3).map(|_| start()).collect();
    let mut dice = Dice::from_clock("policies");
    let seed = dice.seed;
    let stop_triggers = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let triggers = {
        let (url, stop) = (url.clone(), stop_triggers.clone());
        std::thread::spawn(move || {
            let mut asked = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let began = Instant::now();
                let _ = run(cronlock_at(&url).args(["--trigger", "pm"]));
                asked += 1;
                let until = began + Duration::from_secs(3);
                wait_for(Duration::from_secs(4), || Instant::now() >= until);
            }
            asked
        })
    };
    let from = now_secs() + 3;
    let began = Instant::now();
    let (mut done, mut excused) = (Vec::new(), Vec::new());
    let mut books = std::collections::BTreeMap::new();
    while began.elapsed() < Duration::from_secs(60) {
        let until = Instant::now() + Duration::from_millis(4000 + dice.roll(5000));
        assert!(wait_for(Duration::from_secs(10), || Instant::now() >= until));
        read_books(&url, &jobs, &mut books);
        let every = |_: u32| jobs.clone();
        let at = now_secs();
        let (what, mut more) = fault(&mut fleet, &start, &r, &mut dice, &every);
        done.push(Fault { what, at });
        excused.append(&mut more);
    }
    stop_triggers.store(true, std::sync::atomic::Ordering::SeqCst);
    let asked = triggers.join().unwrap();
    serve_for(6);
    let to = now_secs() - 2;
    for c in fleet {
        stop(c);
    }
    read_books(&url, &jobs, &mut books);
    let why = |what: &str| format!("{what} (seed {seed}, {done:?})\n{}", replica_err(&file));
    for (key, period) in [("pq", 1), ("pa", 1), ("pr", 2), ("pm", 5)] {
        for at in (from..=to).filter(|at| at % period == 0) {
            let Some(entry) = books.get(&(key.to_string(), at)) else {
                panic!("{}", why(&format!("{key}@{at} is in no ledger")));
            };
            let excused = excused
                .iter()
                .any(|e| e.key == key && (e.from..=e.to).contains(&at));
            assert!(
                excused || (entry["state"] != "running" && entry["state"] != "queued"),
                "{}",
                why(&format!("{key}@{at} reads {}: {entry}", entry["state"]))
            );
        }
    }
    assert_no_overlap(&dir, &why);
    // At most two of the allow job's commands at once (those that wrote both ends).
    let lines = |name: &str| crate::common::replicas::instants(&dir.join(name));
    let ns = |l: &String| -> Option<(String, i64)> {
        let p: Vec<&str> = l.split_whitespace().collect();
        Some((p.get(1)?.to_string(), p.get(2)?.parse().ok()?))
    };
    let ends: std::collections::HashMap<String, i64> =
        lines("aends").iter().filter_map(ns).collect();
    let spans: Vec<(i64, i64)> = lines("astarts")
        .iter()
        .filter_map(ns)
        .filter_map(|(id, s)| Some((s, *ends.get(&id)?)))
        .collect();
    for (s, _) in &spans {
        let at_once = spans.iter().filter(|(a, b)| a <= s && s < b).count();
        assert!(
            at_once <= 2,
            "{}",
            why(&format!("{at_once} allow runs at once"))
        );
    }
    // No manual instant ran twice.
    let manual: Vec<String> = lines("instants")
        .into_iter()
        .filter(|l| l.split_whitespace().nth(1) == Some("1"))
        .collect();
    let mut seen = std::collections::HashSet::new();
    for l in &manual {
        assert!(
            seen.insert(l.clone()),
            "{}",
            why(&format!("ran twice: {l}"))
        );
    }
    // Every trigger a replica took has its ledger entry.
    let requests: std::collections::HashMap<String, String> =
        r.query(redis::cmd("HGETALL").arg("cronlock:{pm}:trigger"));
    for (at, request) in &requests {
        let v: serde_json::Value = serde_json::from_str(request).unwrap();
        if v["state"] == "accepted" || v["state"] == "skipped" {
            let entry: Option<String> =
                r.query(redis::cmd("HGET").arg("cronlock:{pm}:ledger").arg(at));
            assert!(
                entry.is_some(),
                "{}",
                why(&format!("trigger {at}: {request}"))
            );
        }
    }
    println!(
        "policies chaos: {done:?}, {asked} triggers asked, {} manual runs, {} requests",
        manual.len(),
        requests.len()
    );
}
