//! Job cgroups left by runs killed together with their guards are removed by the next run.
//! The test's runs live in a cgroup of their own, so that no other test's run sweeps the
//! cgroup it leaves before it looks, and its sweep touches no other test's.

use super::*;

/// A cgroup v2 directory of its own for the calling test's cronlocks: their job cgroups are made
/// inside it, beside each other only. Everything in it is killed and it is removed on drop.
struct Parent {
    dir: PathBuf,
}

impl Parent {
    fn new() -> Parent {
        let own = own_cgroup2().unwrap_or_else(|what| lacks(&what, "the orphaned-cgroup test"));
        // Not named `cronlock-*`: other tests' runs sweep those beside theirs.
        let dir = own.join(format!("sweep-test-{}", std::process::id()));
        std::fs::create_dir(&dir).unwrap_or_else(|e| {
            lacks(
                &format!("a writable cgroup v2 hierarchy ({}: {e})", dir.display()),
                "the orphaned-cgroup test",
            )
        });
        Parent { dir }
    }

    /// A cronlock whose process joins this cgroup before it runs.
    fn cronlock(&self, r: &Redis) -> Command {
        let mut c = cronlock(r);
        // SAFETY: `join` makes only system calls.
        unsafe { c.pre_exec(join(&self.dir.join("cgroup.procs"))) };
        c
    }
}

impl Drop for Parent {
    fn drop(&mut self) {
        remove_cgroup(&self.dir);
    }
}

/// cronlock and its guard SIGKILLed together (as a crashing host kills them): the command goes
/// with them, and the job cgroup they leave (empty: nobody is left to remove it) is removed by
/// the next run that starts, once it has been empty for a while (5 s: a starting run's is empty
/// for microseconds), so a crash-looping host does not pile them up. A live run's cgroup is never
/// touched.
#[test]
fn cgroups_left_by_killed_runs_are_removed_by_the_next_run() {
    let r = Redis::start();
    let parent = Parent::new();
    // A live run beside it, whose cgroup must survive the sweep.
    let live_dir = scratch("sweep-live");
    let mut live = parent.cronlock(&r);
    live.args(["--ttl", "30s", "other", "-c"])
        .arg(job(&live_dir));
    let mut live = live.spawn().unwrap();
    read_pid(&live_dir.join("pid"));
    let live_cg = job_cgroup(&live_dir)
        .unwrap_or_else(|| lacks("a writable cgroup v2 hierarchy", "the orphaned-cgroup test"));

    // (No setsid escapee: with its guard gone too, nothing would end one, and a cgroup with a
    // process in it is not empty.)
    let dir = scratch("sweep");
    let mut c = parent.cronlock(&r);
    let mut c = c
        .args(["--ttl", "2s", "k", "-c"])
        .arg(format!(
            "cd {} && grep ^0:: /proc/$$/cgroup > cgroup && echo $$ > pid && exec sleep 60",
            dir.display()
        ))
        .spawn()
        .unwrap();
    let cmd = read_pid(&dir.join("pid"));
    let left = job_cgroup(&dir)
        .unwrap_or_else(|| lacks("a writable cgroup v2 hierarchy", "the orphaned-cgroup test"));
    assert!(left.starts_with(&parent.dir), "{}", left.display());
    let guard = parent_of(cmd);
    // Both stopped first, so that neither sees the other die (and cleans up) before its own
    // SIGKILL: killed together, as a crash kills them.
    signal(c.id() as i32, libc::SIGSTOP);
    signal(guard, libc::SIGSTOP);
    signal(guard, libc::SIGKILL);
    signal(c.id() as i32, libc::SIGKILL);
    let _ = c.wait();
    assert!(
        wait_for(Duration::from_secs(10), || !alive(cmd)),
        "the command survived"
    );
    assert!(
        left.exists(),
        "nothing was left behind: the test tests nothing"
    );
    // The next runs (once the killed run's lock expired) remove it.
    let mut last = String::new();
    assert!(
        wait_for(Duration::from_secs(30), || {
            let out = run(parent.cronlock(&r).args(["-v", "k", "true"]));
            last = stderr(&out);
            assert!(matches!(code(&out), 0), "{last}");
            !left.exists()
        }),
        "{} was left behind: {last}",
        left.display()
    );
    assert!(live_cg.exists(), "a live run's cgroup was removed");
    std::fs::write(live_dir.join("stop"), "").unwrap();
    signal(live.id() as i32, libc::SIGTERM);
    let _ = live.wait();
}
