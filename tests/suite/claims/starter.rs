//! The replica's starter (the process its runs are forked from, which guards their commands), when
//! it or the replica is SIGKILLed while a run's command sleeps: a run's command outlives neither.

use super::*;
use crate::common::replicas::starter_of;

/// A crontab of a long job (`--ttl 2s`, its command's pid written to `pid` and its instant to
/// `instant`, then 30 s of sleep)
/// and, with `tick`, a job every second (`--ttl 2s` too) appending its instant to `ticks`.
fn long_crontab(dir: &Path, tick: bool) -> std::path::PathBuf {
    let d = dir.display();
    let mut text = format!(
        "CRON_TZ=UTC\n* * * * * * --ttl 2s long echo $CRONLOCK_INSTANT > {d}/instant; \
             echo $$ > {d}/pid; exec sleep 30\n"
    );
    if tick {
        text += &format!("* * * * * * --ttl 2s tick echo $CRONLOCK_INSTANT >> {d}/ticks\n");
    }
    crontab(dir, &text)
}

/// The test's replica SIGKILLed and reaped.
fn kill_replica(mut c: std::process::Child) {
    signal(c.id() as i32, libc::SIGKILL);
    c.wait().unwrap();
}

/// The long job runs again (another instant than `instant` is written) within `within`.
fn assert_runs_again(dir: &Path, file: &Path, instant: &str, within: Duration) {
    let again = || std::fs::read_to_string(dir.join("instant")).is_ok_and(|i| i != instant);
    assert!(
        wait_for(within, again),
        "the long job did not run again\n{}",
        replica_err(file)
    );
}

/// The pid the long command wrote, once it did (within 10 s).
fn command_pid(dir: &Path, file: &Path) -> i32 {
    let written = || -> Option<i32> {
        std::fs::read_to_string(dir.join("pid"))
            .ok()?
            .trim()
            .parse()
            .ok()
    };
    assert!(
        wait_for(Duration::from_secs(10), || written().is_some()),
        "{}",
        replica_err(file)
    );
    written().unwrap()
}

/// A starter SIGKILLed while a run's command sleeps: it guarded that command (the run forked no
/// guard of its own), so its death asks the run to end, as a drain would: the run stops its
/// command, gives its lock back and records the attempt `interrupted`; the job runs again at its
/// next instant, and the other job's instants go on, from a new starter.
#[test]
fn a_killed_starters_runs_stop_their_commands_and_the_replica_serves_on() {
    let r = Redis::start();
    let dir = scratch("starter-kill");
    let file = long_crontab(&dir, true);
    let c = replica(&r.url(), &file, &[]);
    let command = command_pid(&dir, &file);
    let instant = std::fs::read_to_string(dir.join("instant")).unwrap();
    let starter = starter_of(c.id()).expect("the replica's starter");
    signal(starter as i32, libc::SIGKILL);
    assert!(
        wait_for(Duration::from_secs(4), || !alive(command)),
        "the command outlived the starter that guarded it\n{}",
        replica_err(&file)
    );
    // The next instants run, from another starter: the long job's too.
    let ticks = dir.join("ticks");
    let before = instants(&ticks).len();
    assert!(
        wait_for(Duration::from_secs(8), || instants(&ticks).len()
            >= before + 2),
        "{}",
        replica_err(&file)
    );
    assert!(starter_of(c.id()).is_some_and(|s| s != starter));
    assert_runs_again(&dir, &file, &instant, Duration::from_secs(5));
    crate::common::replicas::assert_first_attempt(&r.url(), "long", instant.trim(), "interrupted");
    kill_replica(c);
}

/// A replica's run forks no guard: its command is its own child, in a cgroup its starter made
/// (where cgroups can be made), and the starter guards it. The run SIGKILLed, its command is
/// gone at once (its death signal, and the starter's `cgroup.kill` as it reaps the run), and so
/// is its cgroup; its lock is left to lapse, and the job runs again.
#[test]
fn a_replicas_run_forks_no_guard_and_its_starter_stops_a_killed_runs_command() {
    let r = Redis::start();
    let dir = scratch("starter-guards");
    let file = long_crontab(&dir, false);
    let c = replica(&r.url(), &file, &[]);
    let command = command_pid(&dir, &file);
    let starter = starter_of(c.id()).expect("the replica's starter");
    let run = parent_of(command);
    assert_eq!(parent_of(run), starter as i32, "{}", replica_err(&file));
    let name = std::fs::read_to_string(format!("/proc/{run}/comm")).unwrap();
    assert_eq!(
        name.trim(),
        "cronlock",
        "the command's parent is not its run"
    );
    let cgroup = std::fs::read_to_string(format!("/proc/{command}/cgroup")).unwrap();
    let own = cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .unwrap_or("");
    // Where the cgroup2 hierarchy is mounted: pure v2, or hybrid's "unified".
    let mount = ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"]
        .into_iter()
        .find(|m| Path::new(m).join("cgroup.procs").exists())
        .unwrap_or("/sys/fs/cgroup");
    let dir_of = |rel: &str| Path::new(mount).join(rel.trim_start_matches('/'));
    assert!(
        own.contains("/cronlock-") && dir_of(own).is_dir(),
        "the command is not in a cgroup of its own (a writable cgroup v2 is needed): {cgroup}"
    );
    let instant = std::fs::read_to_string(dir.join("instant")).unwrap();
    signal(run, libc::SIGKILL);
    assert!(
        wait_for(Duration::from_secs(1), || !alive(command)),
        "the command outlived its run\n{}",
        replica_err(&file)
    );
    assert!(
        wait_for(Duration::from_secs(1), || !dir_of(own).exists()),
        "the run's cgroup is left: {own}"
    );
    assert_runs_again(&dir, &file, &instant, Duration::from_secs(8));
    kill_replica(c);
}

/// A replica's run SIGSTOPped while its command sleeps, and nothing else happening on the
/// replica (its one job is held by that run): the starter, woken by the run's first kill-by time
/// and sleeping until it, kills the command by the lock's deadline (`--ttl 2s`), and the job runs
/// again once the lock lapsed.
#[test]
fn a_frozen_runs_command_is_killed_by_its_starter_in_time() {
    let r = Redis::start();
    let dir = scratch("starter-frozen-run");
    let file = long_crontab(&dir, false);
    let c = replica(&r.url(), &file, &[]);
    let command = command_pid(&dir, &file);
    let run = parent_of(command);
    let instant = std::fs::read_to_string(dir.join("instant")).unwrap();
    signal(run, libc::SIGSTOP);
    let frozen = std::time::Instant::now();
    assert!(
        wait_for(Duration::from_secs(4), || !alive(command)),
        "the frozen run's command outlived its lock\n{}",
        replica_err(&file)
    );
    assert!(
        frozen.elapsed() < Duration::from_secs(2),
        "{:?}",
        frozen.elapsed()
    );
    signal(run, libc::SIGCONT);
    assert_runs_again(&dir, &file, &instant, Duration::from_secs(8));
    kill_replica(c);
}

/// A replica SIGKILLed while a run's command sleeps: its starter dies with it, and the run,
/// told by its channel's end and by its starter's death, stops its command by the lock's
/// deadline (within 4 s); the lock is gone.
#[test]
fn a_killed_replicas_runs_stop_their_commands_in_time() {
    let r = Redis::start();
    let dir = scratch("replica-kill-guard");
    let file = long_crontab(&dir, false);
    let c = replica(&r.url(), &file, &[]);
    let command = command_pid(&dir, &file);
    let starter = starter_of(c.id()).expect("the replica's starter");
    kill_replica(c);
    assert!(
        wait_for(Duration::from_secs(4), || !alive(command)),
        "the command outlived its run's lock\n{}",
        replica_err(&file)
    );
    // (The runs hear the replica's end as its descriptors close, a moment before the kernel
    // signals its starter: the command may be gone first.)
    assert!(wait_for(Duration::from_secs(2), || !alive(starter as i32)));
    assert!(
        wait_for(Duration::from_secs(3), || !r.exists("cronlock:{long}")),
        "{:?}",
        r.keys()
    );
}

/// A starter with nothing to start is let go (here after 500 ms, a test hook; 60 s otherwise),
/// so a replica whose jobs are far apart keeps no second process; the next run gets a new one.
#[test]
fn an_idle_starter_is_let_go_and_the_next_run_gets_a_new_one() {
    let r = Redis::start();
    let dir = scratch("starter-idle");
    let job = Job {
        every: 6,
        options: "",
    };
    let t = ticking(&r.url(), &dir, crate::common::BIN, &job);
    let first = starter_of(t.replica.id());
    t.starter_let_go_then_runs(1, "no run after the starter was let go");
    let mut c = t.replica;
    assert!(first.is_none() || starter_of(c.id()) != first);
    signal(c.id() as i32, libc::SIGTERM);
    c.wait().unwrap();
}

/// A replica starts its starter from the image it runs, not from the file at its path: a
/// package upgraded in place replaces that file, and a starter of another version would not
/// speak this replica's messages. Here the file becomes a script that fails; the idle starter is
/// let go (a test hook: after 500 ms) and the next run still gets a working one.
#[test]
fn a_replica_whose_binary_was_replaced_still_starts_its_runs() {
    let r = Redis::start();
    let dir = scratch("starter-replaced");
    let bin = dir.join("cronlock");
    std::fs::copy(crate::common::BIN, &bin).unwrap();
    let job = Job {
        every: 3,
        options: "",
    };
    let t = ticking(&r.url(), &dir, bin.to_str().unwrap(), &job);
    // Replaced as a package manager does: a new file renamed over the old path.
    let new = dir.join("cronlock.new");
    std::fs::write(&new, "#!/bin/sh\nexit 1\n").unwrap();
    std::fs::set_permissions(&new, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    std::fs::rename(&new, &bin).unwrap();
    t.starter_let_go_then_runs(2, "no run once the binary was replaced");
    let mut c = t.replica;
    signal(c.id() as i32, libc::SIGTERM);
    c.wait().unwrap();
}

/// A run is its job as the replica read it: the starter gets the job's resolved run and never
/// reads the line again. Here the job's Redis URL comes from `--redis-url-file`, which is removed
/// once the replica read it; the idle starter is let go (a test hook: after 500 ms), and the next
/// run, from a new starter, still reaches Redis with the URL the replica read.
#[test]
fn a_run_is_its_job_as_the_replica_read_it() {
    let r = Redis::start();
    let dir = scratch("starter-resolved");
    let url = dir.join("url");
    std::fs::write(&url, r.url()).unwrap();
    let job = Job {
        every: 3,
        options: &format!("--redis-url-file {}", url.display()),
    };
    // The replica's own URL names no server: the job's file is what reaches Redis.
    let t = ticking("redis://127.0.0.1:1", &dir, crate::common::BIN, &job);
    std::fs::remove_file(&url).unwrap();
    t.starter_let_go_then_runs(2, "no run once the URL file was gone");
    let mut c = t.replica;
    signal(c.id() as i32, libc::SIGTERM);
    c.wait().unwrap();
}

/// A replica and what it writes: see [`ticking`].
struct Ticking {
    replica: std::process::Child,
    file: std::path::PathBuf,
    ticks: std::path::PathBuf,
}

/// The job a [`ticking`] replica serves: every `every` seconds, with these options.
struct Job<'a> {
    every: u32,
    options: &'a str,
}

/// A replica started from `bin` with `url`, serving `job`, which appends its instant to
/// `DIR/ticks`, its idle starter let go after 500 ms (a test hook); returned once its first run
/// wrote.
fn ticking(url: &str, dir: &std::path::Path, bin: &str, job: &Job<'_>) -> Ticking {
    let d = dir.display();
    let Job { every, options } = job;
    let file = crontab(
        dir,
        &format!(
            "CRON_TZ=UTC\n*/{every} * * * * * {options} tick echo $CRONLOCK_INSTANT >> \
             {d}/ticks\n"
        ),
    );
    let replica = crate::common::replicas::replica_of(
        bin,
        url,
        &file,
        &[],
        &[("CRONLOCK_TEST_STARTER_IDLE_MS", "500")],
    );
    let ticks = dir.join("ticks");
    assert!(
        wait_for(Duration::from_secs(10), || !instants(&ticks).is_empty()),
        "{}",
        replica_err(&file)
    );
    Ticking {
        replica,
        file,
        ticks,
    }
}

impl Ticking {
    /// Its idle starter is let go (within a turn of the loop, 2 s, after the 500 ms), and then
    /// `more` runs follow, each started by a new one; `what` says which wait failed.
    fn starter_let_go_then_runs(&self, more: usize, what: &str) {
        assert!(
            wait_for(Duration::from_secs(5), || starter_of(self.replica.id())
                .is_none()),
            "the idle starter was kept\n{}",
            replica_err(&self.file)
        );
        let before = instants(&self.ticks).len();
        assert!(
            wait_for(Duration::from_secs(10), || instants(&self.ticks).len()
                >= before + more),
            "{what}\n{}",
            replica_err(&self.file)
        );
    }
}
