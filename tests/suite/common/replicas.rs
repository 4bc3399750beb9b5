//! Replicas of `--crontab` as separate processes, over any URL: the scenarios told on one server
//! (`crontab.rs`), on a Cluster (`cluster.rs`) and through Sentinel (`replicated.rs`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use super::*;

/// A replica serving `file`, tied to the test; its stdout and stderr go to files beside the
/// crontab (`N.out`, `N.err`), so a full pipe never stalls it.
pub fn replica(url: &str, file: &Path, extra: &[&str]) -> Child {
    replica_with(url, file, extra, &[])
}

/// [`replica`], with more variables in its environment. Given a test hook (`CRONLOCK_TEST_...`),
/// the replica is this test build's binary: a release build reads no hook.
pub fn replica_with(url: &str, file: &Path, extra: &[&str], env: &[(&str, &str)]) -> Child {
    let hooked = env.iter().any(|(k, _)| k.starts_with("CRONLOCK_TEST_"));
    let bin = if hooked { BIN.to_string() } else { bin() };
    replica_of(&bin, url, file, extra, env)
}

/// [`replica_with`], started from the binary at `bin` (a copy of the one under test).
pub fn replica_of(
    bin: &str,
    url: &str,
    file: &Path,
    extra: &[&str],
    env: &[(&str, &str)],
) -> Child {
    spawn_replica(cronlock_of(bin, url), file, extra, env)
}

/// [`replica`], leading a process group of its own (its starter and runs in it), so that a test
/// can signal the whole group as a host-like fault would.
pub fn replica_grouped(url: &str, file: &Path, extra: &[&str]) -> Child {
    let mut cmd = cronlock_of(&bin(), url);
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    spawn_replica(cmd, file, extra, &[])
}

/// Spawn `cmd` as a replica serving `file` (see [`replica`]).
fn spawn_replica(mut cmd: Command, file: &Path, extra: &[&str], env: &[(&str, &str)]) -> Child {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let dir = file.parent().unwrap();
    cmd.arg("--crontab").arg(file).args(extra);
    tie(&mut cmd);
    cmd.stdout(std::fs::File::create(dir.join(format!("{n}.out"))).unwrap())
        .stderr(std::fs::File::create(dir.join(format!("{n}.err"))).unwrap())
        .env("CRONLOCK_TEST_REPLICA", n.to_string())
        .envs(env.iter().copied());
    // A copy of the binary just written may be busy for a moment: a process another test forked
    // meanwhile holds the copy's write descriptor until it execs (ETXTBSY).
    let mut busy = 0;
    loop {
        match cmd.spawn() {
            Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy && busy < 200 => {
                busy += 1;
                std::thread::sleep(Duration::from_millis(10));
            }
            spawned => return spawned.unwrap(),
        }
    }
}

/// What the replicas of `file` wrote on stderr.
pub fn replica_err(file: &Path) -> String {
    let dir = file.parent().unwrap();
    let mut all = String::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        if e.path().extension().is_some_and(|x| x == "err") {
            all += &std::fs::read_to_string(e.path()).unwrap_or_default();
        }
    }
    all
}

/// The instants (as the jobs saw them) recorded in `file`, one per line.
pub fn instants(file: &Path) -> Vec<String> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

pub fn crontab(dir: &Path, text: &str) -> PathBuf {
    let file = dir.join("crontab");
    std::fs::write(&file, text).unwrap();
    file
}

/// SIGTERM, and the exit status (None: still running after 30 s, then killed).
pub fn stop(mut c: Child) -> Option<i32> {
    signal(c.id() as i32, libc::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(30);
    while c.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = c.kill();
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    c.wait().unwrap().code()
}

/// The lines `INSTANT ATTEMPT REPLICA PID` the jobs of the retry tests write.
pub fn attempts(file: &Path) -> Vec<Vec<String>> {
    instants(file)
        .iter()
        .map(|l| l.split_whitespace().map(String::from).collect())
        .collect()
}

/// Three replicas, three jobs every second, for `secs` seconds: every instant of every job runs exactly
/// once, and none is missed while the replicas are up.
pub fn each_instant_once(url: &str, name: &str, secs: u64) {
    let dir = scratch(name);
    let d = dir.display();
    let file = crontab(
        &dir,
        &format!(
            "# three jobs, every second\nCRON_TZ=UTC\n\
             * * * * * * {name}-a echo $CRONLOCK_INSTANT >> {d}/a\n\
             * * * * * * --ttl 5s {name}-b echo $CRONLOCK_INSTANT >> {d}/b\n\
             * * * * * * {name}-c sh -c 'echo $CRONLOCK_INSTANT >> {d}/c; sleep 0.3'\n"
        ),
    );
    let replicas: Vec<Child> = (0..3)
        .map(|_| replica(url, &file, &["--log-format", "json"]))
        .collect();
    let started = Instant::now();
    assert!(wait_for(Duration::from_secs(secs + 10), || started
        .elapsed()
        >= Duration::from_secs(secs)));
    for (i, c) in replicas.into_iter().enumerate() {
        assert_eq!(stop(c), Some(0), "replica {i}: {}", replica_err(&file));
    }
    for job in ["a", "b", "c"] {
        let seen = instants(&dir.join(job));
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        for s in &seen {
            *counts.entry(s.as_str()).or_default() += 1;
        }
        let twice: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).collect();
        assert!(twice.is_empty(), "job {job} ran twice: {twice:?}");
        // Consecutive seconds from the first to the last: none missed.
        let seconds: Vec<i64> = counts
            .keys()
            .map(|t| {
                humantime::parse_rfc3339(t)
                    .unwrap()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_secs() as i64
            })
            .collect();
        for pair in seconds.windows(2) {
            assert_eq!(
                pair[1] - pair[0],
                1,
                "job {job} missed an instant: {seen:?}\n{}",
                replica_err(&file)
            );
        }
        assert!(
            seconds.len() as u64 + 2 >= secs,
            "job {job}: {} instants in {secs} s",
            seconds.len()
        );
    }
}

/// A replica SIGKILLed mid-run: its run stops its command, gives its lock back and records the
/// attempt `interrupted`; another replica runs the instant again (`--retries 1`) within TTL + 2 s (before the next instant: a later instant, once due, is the
/// one a firing runs, never a backlog). A replica SIGTERMed with a run longer than --drain stops it,
/// records it `interrupted`, and another replica runs it again. The two cases run at once, each
/// with its own replicas, and measure alone together.
pub fn retried_on_another(url: &str, name: &str) {
    use std::sync::mpsc;
    let cases = [("killed", libc::SIGKILL), ("drained", libc::SIGTERM)];
    // Taken once both cases are ready, held until both have ended (the scope joins them).
    let mut alone = None;
    std::thread::scope(|s| {
        let (ready, readied) = mpsc::channel();
        let goes: Vec<mpsc::Sender<()>> = cases
            .map(|(case, how)| {
                let (go, gone) = mpsc::channel();
                let ready = ready.clone();
                s.spawn(move || {
                    retried_case(url, name, case, how, || {
                        let _ = ready.send(());
                        gone.recv_timeout(Duration::from_secs(300))
                            .expect("the test did not say go");
                    })
                });
                go
            })
            .into();
        drop(ready);
        // Both cases' replicas serve; a case that failed on the way ends its thread, and the
        // scope's end fails the test with its panic.
        let both = readied.recv_timeout(Duration::from_secs(60)).is_ok()
            && readied.recv_timeout(Duration::from_secs(60)).is_ok();
        alone = both.then(super::measure_alone);
        for go in goes {
            let _ = go.send(());
        }
    });
    drop(alone);
}

/// One case of [`retried_on_another`]: `SIGKILL` or `SIGTERM` for the replica running the job;
/// `ready` is called once the replicas serve, and returns when the case may go on.
fn retried_case(url: &str, name: &str, case: &str, how: i32, ready: impl FnOnce()) {
    let dir = scratch(&format!("{name}-{case}"));
    let log = dir.join("log");
    let key = format!("{name}-{case}");
    let file = crontab(
        &dir,
        &format!(
            "*/5 * * * * * --ttl 1s --catch-up 1m --retries 1 {key} \
             [ -e {go} ] || exit 0; \
             echo $CRONLOCK_INSTANT $CRONLOCK_ATTEMPT $CRONLOCK_TEST_REPLICA $$ >> {}; \
             exec sleep 60\n",
            log.display(),
            go = dir.join("go").display()
        ),
    );
    let args = ["--drain", "300ms", "--grace", "500ms"];
    let mut replicas: Vec<Child> = (0..2).map(|_| replica(url, &file, &args)).collect();
    // Their catch-up at start runs the past instant, quickly; the test's run is the next
    // instant's, fired on time.
    assert!(wait_for(Duration::from_secs(10), || replica_err(&file)
        .matches("command exited with status 0")
        .count()
        >= 1));
    ready();
    std::fs::write(dir.join("go"), "").unwrap();
    assert!(wait_for(Duration::from_secs(15), || !attempts(&log).is_empty()));
    let first = attempts(&log)[0].clone();
    assert_eq!(first[1], "1", "{first:?}");
    // The replica that runs it (the environment says which).
    let own: u32 = first[2].parse().unwrap();
    let i = replicas
        .iter()
        .position(|c| {
            std::fs::read_to_string(format!("/proc/{}/environ", c.id()))
                .is_ok_and(|e| e.contains(&format!("CRONLOCK_TEST_REPLICA={own}\0")))
        })
        .unwrap();
    let mut victim = replicas.remove(i);
    let stopped = Instant::now();
    signal(victim.id() as i32, how);
    let status = victim.wait().unwrap();
    let command: i32 = first[3].parse().unwrap();
    assert!(
        wait_for(Duration::from_secs(5), || !alive(command)),
        "{case}: the run's command outlived its replica"
    );
    if how == libc::SIGTERM {
        assert_eq!(status.code(), Some(143), "{}", replica_err(&file));
    }
    // Attempt 2 of the same instant, on the other replica, within TTL + 2 s.
    assert!(
        wait_for(Duration::from_secs(3), || attempts(&log)
            .iter()
            .any(|a| a[0] == first[0] && a[1] == "2")),
        "{case}: {:?}\n{}",
        attempts(&log),
        replica_err(&file)
    );
    assert!(stopped.elapsed() < Duration::from_secs(3));
    let again = attempts(&log)
        .into_iter()
        .find(|a| a[0] == first[0] && a[1] == "2")
        .unwrap();
    assert_ne!(again[2], first[2], "{case}: rerun on the same replica");
    // Killed, the replica's run is told (its starter died with it) and records its end itself.
    assert_first_attempt(url, &key, &first[0], "interrupted");
    for mut c in replicas {
        signal(c.id() as i32, libc::SIGKILL);
        c.wait().unwrap();
    }
}

/// The first attempt at `instant` (as `CRONLOCK_INSTANT` says it) of KEY, in `--status`, ended
/// as `want` says.
pub fn assert_first_attempt(url: &str, key: &str, instant: &str, want: &str) {
    let s = run(cronlock_at(url).args(["--status", "--json", key]));
    let v: serde_json::Value = serde_json::from_str(&stdout(&s)).unwrap();
    let entry = v["ledger"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["instant_time"] == instant)
        .unwrap()
        .clone();
    assert_eq!(entry["attempts"][0]["state"], want, "{entry}");
}

/// The children of process `pid`.
pub fn children_of(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// The starter of the replica `pid` (the child it forks its runs from), once it has one.
pub fn starter_of(pid: u32) -> Option<u32> {
    children_of(pid).into_iter().find(|c| {
        std::fs::read(format!("/proc/{c}/cmdline"))
            .is_ok_and(|cmd| cmd.split(|b| *b == 0).next() == Some(b"cronlock-starter"))
    })
}

/// What a fleet of three replicas did with `jobs` jobs due every second while `disturb` ran
/// (see [`through`]).
pub struct Through {
    /// Each job's runs: how many times each instant (Unix seconds) ran.
    pub runs: Vec<BTreeMap<i64, usize>>,
    /// The instants every replica served: from the fleet's third second to its last but one.
    pub served: std::ops::RangeInclusive<i64>,
    /// What the replicas said, for failure messages.
    pub said: String,
}

impl Through {
    /// Each job's KEY.
    pub fn key(name: &str, job: usize) -> String {
        format!("{name}-{job}")
    }

    /// Fails when an instant of a job ran more than once.
    pub fn assert_none_twice(&self) {
        for (job, runs) in self.runs.iter().enumerate() {
            let twice: Vec<_> = runs.iter().filter(|(_, n)| **n > 1).collect();
            assert!(
                twice.is_empty(),
                "job {job} ran an instant twice: {twice:?}\n{}",
                self.said
            );
        }
    }

    /// Each job's served instants that did not run, in `range`, as (job, Unix seconds).
    pub fn not_run(&self, range: std::ops::RangeInclusive<i64>) -> Vec<(usize, i64)> {
        let mut lost = Vec::new();
        for (job, runs) in self.runs.iter().enumerate() {
            for at in range.clone() {
                if self.served.contains(&at) && !runs.contains_key(&at) {
                    lost.push((job, at));
                }
            }
        }
        lost
    }
}

/// Three replicas serving `jobs` jobs due every second (`extra`: options on each line), while
/// `disturb` runs (failovers, kills), and 2 s more; then stopped. Each job's command appends its
/// instant to a file of its own; [`Through`] counts them.
pub fn through(url: &str, name: &str, jobs: usize, extra: &str, disturb: impl FnOnce()) -> Through {
    let dir = scratch(name);
    let d = dir.display();
    let mut text = "CRON_TZ=UTC\n".to_string();
    for j in 0..jobs {
        let key = Through::key(name, j);
        text +=
            &format!("* * * * * * {extra} {key} sh -c 'echo $CRONLOCK_INSTANT >> {d}/{j}.ran'\n");
    }
    let file = crontab(&dir, &text);
    let replicas: Vec<Child> = (0..3).map(|_| replica(url, &file, &["-v"])).collect();
    let started = unix_secs();
    disturb();
    let until = Instant::now() + Duration::from_secs(2);
    assert!(wait_for(Duration::from_secs(10), || Instant::now() >= until));
    let stopped = unix_secs();
    for (i, c) in replicas.into_iter().enumerate() {
        assert_eq!(stop(c), Some(0), "replica {i}: {}", replica_err(&file));
    }
    let runs = (0..jobs)
        .map(|j| {
            let mut counts = BTreeMap::new();
            for t in instants(&dir.join(format!("{j}.ran"))) {
                let at = humantime::parse_rfc3339(&t)
                    .unwrap()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_secs() as i64;
                *counts.entry(at).or_insert(0) += 1;
            }
            counts
        })
        .collect();
    Through {
        runs,
        served: started + 3..=stopped - 2,
        said: replica_err(&file),
    }
}

/// Now, in whole Unix seconds.
pub fn unix_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}
