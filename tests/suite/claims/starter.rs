//! The replica's starter (the process its runs are forked from), and the runs' guards, when the
//! starter or the replica is SIGKILLed while a run's command sleeps: a run outlives its starter,
//! never its replica.

use super::*;
use crate::common::replicas::starter_of;

/// A crontab of a long job (`--ttl 2s`, its command's pid written to `pid`, then 30 s of sleep)
/// and, with `tick`, a job every second (`--ttl 2s` too) appending its instant to `ticks`.
fn long_crontab(dir: &Path, tick: bool) -> std::path::PathBuf {
    let d = dir.display();
    let mut text =
        format!("CRON_TZ=UTC\n* * * * * * --ttl 2s long echo $$ > {d}/pid; exec sleep 30\n");
    if tick {
        text += &format!("* * * * * * --ttl 2s tick echo $CRONLOCK_INSTANT >> {d}/ticks\n");
    }
    crontab(dir, &text)
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

/// A starter SIGKILLed while a run's command sleeps: the run goes on (it follows its replica,
/// not the starter), so its command outlives the lock's TTL of 2 s under a lock the run still
/// renews; the replica starts its next runs from a new starter. The replica SIGKILLed then: the
/// run hears it (its channel closes) and its command is stopped within 4 s.
#[test]
fn a_killed_starter_leaves_its_runs_going_and_the_replica_serves_on() {
    let r = Redis::start();
    let dir = scratch("starter-kill");
    let file = long_crontab(&dir, true);
    let c = replica(&r.url(), &file, &[]);
    let command = command_pid(&dir, &file);
    let starter = starter_of(c.id()).expect("the replica's starter");
    signal(starter as i32, libc::SIGKILL);
    let killed = Instant::now();
    // The next instants run, from another starter, while the long run goes on.
    let ticks = dir.join("ticks");
    let before = instants(&ticks).len();
    assert!(
        wait_for(Duration::from_secs(8), || instants(&ticks).len()
            >= before + 2),
        "{}",
        replica_err(&file)
    );
    assert!(starter_of(c.id()).is_some_and(|s| s != starter));
    assert!(wait_for(Duration::from_secs(8), || killed.elapsed()
        > Duration::from_secs(4)));
    assert!(
        alive(command),
        "the run died with its starter\n{}",
        replica_err(&file)
    );
    assert!(r.exists("cronlock:{long}"), "{:?}", r.keys());
    let mut c = c;
    signal(c.id() as i32, libc::SIGKILL);
    c.wait().unwrap();
    assert!(
        wait_for(Duration::from_secs(4), || !alive(command)),
        "the command outlived its replica\n{}",
        replica_err(&file)
    );
}

/// A replica SIGKILLed while a run's command sleeps: its starter and its run die with it, and
/// the run's guard stops the command by the lock's deadline (within 4 s); the lock lapses.
#[test]
fn a_killed_replicas_guards_stop_their_commands_in_time() {
    let r = Redis::start();
    let dir = scratch("replica-kill-guard");
    let file = long_crontab(&dir, false);
    let mut c = replica(&r.url(), &file, &[]);
    let command = command_pid(&dir, &file);
    let starter = starter_of(c.id()).expect("the replica's starter");
    signal(c.id() as i32, libc::SIGKILL);
    c.wait().unwrap();
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
