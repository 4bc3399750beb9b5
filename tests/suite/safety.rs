//! The safety core under hostile conditions: no path where the command outlives the lock.
//! One test per case of the safety-core issue; each one fails without its fix.

use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;

const LOCK: &str = "cronlock:{k}";
const FENCE: &str = "cronlock:{k}:fence";

/// Wait for `child` to exit within `timeout`; its status code, or a panic naming `what`.
fn exit_within(child: &mut Child, timeout: Duration, what: &str) -> i32 {
    let mut status = None;
    let done = wait_for(timeout, || {
        status = child.try_wait().unwrap();
        status.is_some()
    });
    if !done {
        let _ = child.kill();
        let _ = child.wait();
        panic!("{what}: cronlock did not exit within {timeout:?}");
    }
    status.unwrap().code().expect("cronlock exited by a signal")
}

fn sh(dir: &Path, body: &str) -> String {
    format!("cd {} || exit 99; {body}", dir.display())
}

/// Load the scripts into `r`, so a later EVALSHA runs without NOSCRIPT round trips.
fn preload(r: &Redis) {
    let out = run(cronlock(r).args(["warm-up", "true"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
}

/// Case 0: a stderr pipe that nobody reads must not stop the kill.
#[test]
fn a_full_stderr_pipe_does_not_stop_the_kill() {
    let r = Redis::start();
    let dir = scratch("fullpipe");
    let mut c = cronlock(&r)
        .args(["--ttl", "1s", "-v", "k", "-c"])
        .arg(sh(
            &dir,
            "echo $$ > pid; exec head -c 10000000 /dev/zero >&2",
        ))
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let cmd = read_pid(&dir.join("pid"));
    let fd = c.stderr.as_ref().unwrap().as_raw_fd();
    let queued = || {
        let mut n: libc::c_int = 0;
        // SAFETY: FIONREAD into a valid int on our own pipe.
        unsafe { libc::ioctl(fd, libc::FIONREAD, &mut n) };
        n
    };
    assert!(
        // 64 KiB of pipe, filled page by page: a blocked writer leaves it at about 60 KB.
        wait_for(Duration::from_secs(10), || queued() >= 57344),
        "the command did not fill the pipe"
    );
    r.del(LOCK);
    let status = exit_within(&mut c, Duration::from_secs(10), "full stderr");
    assert_eq!(status, 122);
    assert!(!alive(cmd), "the command outlived the lock");
    let mut rest = Vec::new();
    c.stderr.take().unwrap().read_to_end(&mut rest).unwrap();
}

fn ignoring_sigchld(cmd: &mut Command) -> &mut Command {
    // SAFETY: only signal(2) between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            libc::signal(libc::SIGCHLD, libc::SIG_IGN);
            Ok(())
        })
    }
}

/// Case 1: a parent that ignores SIGCHLD (children inherit SIG_IGN).
#[test]
fn sigchld_ignored_by_the_parent() {
    let r = Redis::start();
    let mut quick = ignoring_sigchld(cronlock(&r).args(["k", "true"]))
        .spawn()
        .unwrap();
    assert_eq!(exit_within(&mut quick, Duration::from_secs(10), "true"), 0);
    assert!(!r.exists(LOCK));

    let dir = scratch("sigchld");
    let mut long = ignoring_sigchld(
        cronlock(&r)
            .args(["k", "-c"])
            .arg(sh(&dir, "echo $$ > pid; exec sleep 60")),
    )
    .spawn()
    .unwrap();
    let cmd = read_pid(&dir.join("pid"));
    signal(long.id() as i32, libc::SIGTERM);
    assert_eq!(
        exit_within(&mut long, Duration::from_secs(10), "sleep"),
        143
    );
    assert!(!alive(cmd));
    assert!(!r.exists(LOCK));
}

/// State letter of a process from /proc (R, S, T, Z...).
fn state(pid: i32) -> char {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(')').map(|(_, r)| r.trim_start().to_string()))
        .and_then(|r| r.chars().next())
        .unwrap_or('X')
}

/// Case 2 and the SIGCONT-after-forward rule: SIGTSTP stops the command, never the lock.
#[test]
fn sigtstp_stops_the_command_and_keeps_the_lock() {
    let r = Redis::start();
    let dir = scratch("tstp");
    let mut c = cronlock(&r)
        .args(["--ttl", "1s", "k", "-c"])
        .arg(sh(&dir, "echo $$ > pid; exec sleep 60"))
        .spawn()
        .unwrap();
    let cmd = read_pid(&dir.join("pid"));
    let me = format!("\"pid\":{}", c.id());
    signal(c.id() as i32, libc::SIGTSTP);
    assert!(
        wait_for(Duration::from_secs(5), || state(cmd) == 'T'),
        "the command did not stop"
    );
    let mut con = r.con();
    let marker = dir.join("second-ran");
    let end = Instant::now() + Duration::from_secs(3);
    let mut second_tried = false;
    while Instant::now() < end {
        let holder: Option<String> = redis::cmd("GET").arg(LOCK).query(&mut con).unwrap();
        let ours = holder.as_deref().is_some_and(|h| h.contains(&me));
        assert!(
            ours || state(cmd) == 'T',
            "the command can run without the lock"
        );
        assert!(ours, "the lock lapsed while the command was stopped");
        assert_ne!(state(c.id() as i32), 'T', "cronlock itself stopped");
        if !second_tried && Instant::now() + Duration::from_millis(1500) > end {
            second_tried = true;
            let out = run(cronlock(&r)
                .args(["-n", "-E", "75", "k", "touch"])
                .arg(&marker));
            assert_eq!(code(&out), 75, "{}", stderr(&out));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!marker.exists(), "a second host ran the job");
    // SIGCONT to cronlock continues the command.
    signal(c.id() as i32, libc::SIGCONT);
    assert!(wait_for(Duration::from_secs(5), || state(cmd) != 'T'));
    // A terminating signal reaches a stopped command: it is followed by SIGCONT.
    signal(c.id() as i32, libc::SIGTSTP);
    assert!(wait_for(Duration::from_secs(5), || state(cmd) == 'T'));
    signal(c.id() as i32, libc::SIGTERM);
    assert_eq!(exit_within(&mut c, Duration::from_secs(5), "stopped"), 143);
    assert!(!r.exists(LOCK));
}

/// Bytes Redis has received on `port` but not read yet (from /proc/net/tcp).
fn unread_by_server(port: u16) -> u64 {
    let tcp = std::fs::read_to_string("/proc/net/tcp").unwrap();
    tcp.lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let local_port = u16::from_str_radix(f[1].rsplit(':').next()?, 16).ok()?;
            let rx = u64::from_str_radix(f[4].split(':').nth(1)?, 16).ok()?;
            (local_port == port).then_some(rx)
        })
        .sum()
}

/// Case 5: an acquire whose reply is lost leaves no lock behind.
#[test]
fn an_acquire_whose_reply_is_lost_leaves_no_lock() {
    let r = Redis::start_tcp();
    preload(&r);
    r.pause();
    let dir = scratch("lostreply");
    let marker = dir.join("ran");
    let out = cronlock(&r)
        .args(["--connect-timeout", "500ms", "--ttl", "30s", "k", "touch"])
        .arg(&marker)
        .output()
        .unwrap();
    assert!(
        wait_for(Duration::from_secs(5), || unread_by_server(r.port) > 0),
        "nothing reached the server"
    );
    r.resume();
    assert_eq!(code(&out), 125, "{}", stderr(&out));
    assert_eq!(own_lines(&stderr(&out)).len(), 1, "{}", stderr(&out));
    assert!(!marker.exists());
    // Redis has now run both the late acquire and the undo, in some order: no lock is left.
    let mut con = r.con();
    assert!(wait_for(Duration::from_secs(5), || {
        let marks: Vec<String> = redis::cmd("KEYS")
            .arg("cronlock:{k}:abandoned:*")
            .query(&mut con)
            .unwrap();
        !marks.is_empty()
    }));
    assert!(!r.exists(LOCK), "the lost acquisition left a lock behind");
}

/// Case 6: a script without `#!` runs through /bin/sh, like execvp.
#[test]
fn a_script_without_shebang_runs_through_sh() {
    let r = Redis::start();
    let dir = scratch("noshebang");
    let script = dir.join("job");
    std::fs::write(&script, "echo \"ran $1 in sh\"\n").unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let out = run(cronlock(&r).arg("k").arg(&script).arg("arg"));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stdout(&out), "ran arg in sh\n");
}

/// Case 7a: a lock whose reply came too late to be safe does not start the command.
#[test]
fn a_lock_granted_too_late_does_not_start_the_command() {
    let r = Redis::start_tcp();
    preload(&r);
    let dir = scratch("toolate");
    let marker = dir.join("ran");
    r.pause();
    let c = cronlock(&r)
        .args(["--ttl", "500ms", "--connect-timeout", "10s", "k", "touch"])
        .arg(&marker)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(wait_for(Duration::from_secs(5), || unread_by_server(
        r.port
    ) > 0));
    // The fault itself: Redis hangs for longer than the TTL, so by the time the reply arrives the
    // lock is valid for a moment at most.
    std::thread::sleep(Duration::from_millis(700));
    r.resume();
    let out = c.wait_with_output().unwrap();
    assert_eq!(code(&out), 122, "{}", stderr(&out));
    assert!(stderr(&out).contains("too late"), "{}", stderr(&out));
    assert!(
        !marker.exists(),
        "the command ran on a lock that was about to expire"
    );
}

fn descendants_script(dir: &Path) -> String {
    // timeout(1) makes its own process group; setsid leaves the session; both must still die.
    sh(
        dir,
        "setsid sh -c 'echo $$ > setsid.pid; exec sleep 60' & \
         timeout 100 sh -c 'echo $$ > timeout.pid; exec sleep 60' & \
         grep ^0:: /proc/$$/cgroup > cgroup; echo $$ > pid; wait",
    )
}

fn assert_all_gone(dir: &Path, what: &str) {
    for f in ["pid", "setsid.pid", "timeout.pid"] {
        let pid = read_pid(&dir.join(f));
        assert!(
            wait_for(Duration::from_secs(3), || !alive(pid)),
            "{what}: {f} ({pid}) survived"
        );
    }
}

fn escapees(wrap: impl Fn(&mut Command) -> &mut Command, mechanism: &str) {
    let r = Redis::start();
    // After a loss.
    let dir = scratch("escape-lost");
    let mut c = cronlock(&r);
    let mut c = wrap(c.args(["--ttl", "1s", "--grace", "200ms", "-v", "k", "-c"]))
        .arg(descendants_script(&dir))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    for f in ["pid", "setsid.pid", "timeout.pid"] {
        read_pid(&dir.join(f));
    }
    r.del(LOCK);
    assert_eq!(exit_within(&mut c, Duration::from_secs(10), "lost"), 122);
    assert_all_gone(&dir, "after a loss");
    let mut err = String::new();
    c.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert!(err.contains(mechanism), "{err}");
    // With a cgroup: where cronlock made it, and that it removed it.
    let cgroups = err.split_once("its own cgroup ").map(|(_, rest)| {
        let dir = PathBuf::from(rest.split(" (").next().unwrap());
        assert!(!dir.exists(), "{} left behind", dir.display());
        dir.parent().unwrap().to_path_buf()
    });

    // After SIGKILL of cronlock.
    let dir = scratch("escape-killed");
    let mut c = cronlock(&r);
    let mut c = wrap(c.args(["--ttl", "5s", "k", "-c"]))
        .arg(descendants_script(&dir))
        .spawn()
        .unwrap();
    for f in ["pid", "setsid.pid", "timeout.pid"] {
        read_pid(&dir.join(f));
    }
    signal(c.id() as i32, libc::SIGKILL);
    c.wait().unwrap();
    assert_all_gone(&dir, "after SIGKILL of cronlock");
    // Nobody is left to remove the cgroup but the guard: it does, once the job is gone.
    let dir_killed = job_cgroup(&dir);
    assert_eq!(cgroups.is_some(), dir_killed.is_some(), "{dir_killed:?}");
    if let Some(dir) = dir_killed {
        assert!(
            wait_for(Duration::from_secs(3), || !dir.exists()),
            "{} left behind after SIGKILL of cronlock",
            dir.display()
        );
    }
}

/// Case 8: descendants that leave the process group die with the job (cgroup v2 here).
#[test]
fn descendants_that_leave_the_group_die_with_the_job_cgroup() {
    if let Err(what) = own_cgroup2() {
        lacks(&what, "the cgroup containment test");
    }
    escapees(|c| c, "own cgroup");
}

/// Case 8 without a writable cgroup: the guard's subreaper catches them.
#[test]
fn descendants_that_leave_the_group_die_with_the_job_subreaper() {
    // A mount namespace where the cgroup file systems are hidden under an empty tmpfs.
    escapees(
        |c| {
            // SAFETY: unshare and mount between fork and exec, on the child's own namespace.
            unsafe {
                c.pre_exec(|| {
                    if libc::unshare(libc::CLONE_NEWNS) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    let none = c"none".as_ptr();
                    libc::mount(
                        none,
                        c"/".as_ptr(),
                        std::ptr::null(),
                        libc::MS_REC | libc::MS_PRIVATE,
                        std::ptr::null(),
                    );
                    if libc::mount(
                        none,
                        c"/sys/fs/cgroup".as_ptr(),
                        c"tmpfs".as_ptr(),
                        0,
                        std::ptr::null(),
                    ) != 0
                    {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                })
            }
        },
        "its own process group",
    );
}

/// Case 9: waiters ride out a Redis restart instead of failing with 125.
#[test]
fn waiters_retry_across_a_redis_restart() {
    let mut r = Redis::start();
    let dir = scratch("waitrestart");
    let mut holder = cronlock(&r)
        .args(["--ttl", "2s", "k", "-c"])
        .arg(sh(&dir, "echo $$ > pid; exec sleep 60"))
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    read_pid(&dir.join("pid"));
    let waiter = cronlock(&r)
        .args(["-w", "30s", "-E", "75", "k", "echo", "waiter ran"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Let the waiter find the lock busy before Redis goes away.
    assert!(wait_for(Duration::from_secs(5), || {
        let clients: String = r.query(redis::cmd("CLIENT").arg("LIST"));
        clients.contains("cmd=blpop")
    }));
    r.restart();
    assert_eq!(
        exit_within(&mut holder, Duration::from_secs(10), "holder"),
        122
    );
    let out = waiter.wait_with_output().unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stdout(&out), "waiter ran\n");
}

/// Case 10: the fencing token keeps increasing when Redis loses its data.
#[test]
fn fencing_token_survives_data_loss() {
    let mut r = Redis::start();
    let token = |r: &Redis| -> i64 {
        let out = run(cronlock(r).args(["k", "-c", "echo $CRONLOCK_FENCING_TOKEN"]));
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        stdout(&out).trim().parse().unwrap()
    };
    let a = token(&r);
    r.restart();
    assert!(!r.exists(FENCE), "the restart must lose the counter");
    let b = token(&r);
    assert!(b > a, "after a restart: {b} after {a}");
    redis::cmd("FLUSHALL").query::<()>(&mut r.con()).unwrap();
    let c = token(&r);
    assert!(c > b, "after FLUSHALL: {c} after {b}");
    // Bursts stay strictly increasing too.
    let more: Vec<i64> = (0..5).map(|_| token(&r)).collect();
    assert!(
        more.windows(2).all(|w| w[1] > w[0]) && more[0] > c,
        "{more:?}"
    );
}

/// A long job with `CRONLOCK_TEST_PANIC=injected` (debug builds only): waits for it to end and
/// returns its output and the command's pid, if it started.
fn injected(r: &Redis, injected: &str, args: &[&str]) -> (std::process::Output, Option<i32>) {
    let dir = scratch(injected);
    let c = cronlock_debug(r)
        .env("CRONLOCK_TEST_PANIC", injected)
        .args(args)
        .args(["k", "-c"])
        .arg(sh(
            &dir,
            "echo $$ > pid; grep ^0:: /proc/$$/cgroup > cgroup; exec sleep 60",
        ))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = c.wait_with_output().unwrap();
    // Its cgroup, if it had one of its own, went with it.
    if let Some(left) = job_cgroup(&dir) {
        assert!(!left.exists(), "{} left behind", left.display());
    }
    let cmd = std::fs::read_to_string(dir.join("pid"))
        .ok()
        .and_then(|p| p.trim().parse().ok());
    (out, cmd)
}

/// A panic of the watchdog is a lost lock: the command is stopped, 122, one line.
#[test]
fn a_watchdog_panic_is_a_lost_lock() {
    let r = Redis::start();
    let (out, cmd) = injected(&r, "watchdog", &["--ttl", "1s"]);
    let cmd = cmd.expect("the command started");
    assert_eq!(code(&out), 122, "{}", stderr(&out));
    assert_eq!(own_lines(&stderr(&out)).len(), 1, "{}", stderr(&out));
    assert!(stderr(&out).contains("watchdog"), "{}", stderr(&out));
    assert!(!alive(cmd));

    let (out, _) = injected(&r, "main", &[]);
    assert_eq!(code(&out), 122, "{}", stderr(&out));
    assert_eq!(own_lines(&stderr(&out)).len(), 1, "{}", stderr(&out));
    assert!(stderr(&out).contains("internal error"), "{}", stderr(&out));
    assert!(!stderr(&out).contains("panicked"), "{}", stderr(&out));
}

mod alone {
    //! The safety tests that measure time: each takes the cores for itself while it measures
    //! (`common::alone`), and `scripts/test.sh` runs them after the others.

    use super::*;

    /// Case 3 (and 7b): cronlock frozen; the guard ends the command before the lock can expire.
    #[test]
    fn a_frozen_cronlock_cannot_outlive_its_lock() {
        let _alone = measure_alone();
        let r = Redis::start();
        let mut con = r.con();
        for round in 0..3 {
            let dir = scratch("frozen");
            let mut c = cronlock(&r)
                .args(["--ttl", "2s", "k", "-c"])
                .arg(sh(
                    &dir,
                    "trap '' TERM; echo $$ > pid; while :; do sleep 1; done",
                ))
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            let cmd = read_pid(&dir.join("pid"));
            signal(c.id() as i32, libc::SIGSTOP);
            let mut pttl_at_death = -2;
            assert!(
                wait_for(Duration::from_secs(5), || {
                    if alive(cmd) {
                        return false;
                    }
                    pttl_at_death = redis::cmd("PTTL").arg(LOCK).query(&mut con).unwrap();
                    true
                }),
                "round {round}: the command outlived the lock"
            );
            assert!(
                pttl_at_death > 0,
                "round {round}: the command died only after the lock expired ({pttl_at_death})"
            );
            signal(c.id() as i32, libc::SIGCONT);
            let resumed = Instant::now();
            assert_eq!(
                exit_within(&mut c, Duration::from_secs(5), "frozen"),
                122,
                "round {round}"
            );
            assert!(
                resumed.elapsed() < Duration::from_secs(1),
                "round {round}: exit took {:?} after SIGCONT",
                resumed.elapsed()
            );
            let mut err = String::new();
            c.stderr.take().unwrap().read_to_string(&mut err).unwrap();
            assert_eq!(own_lines(&err).len(), 1, "round {round}: {err}");
            assert!(err.contains("lock lost") && err.contains("guard"), "{err}");
        }
    }

    /// Case 4: the release against a hung Redis is bounded by --connect-timeout in all.
    #[test]
    fn release_against_a_hung_redis_is_bounded() {
        let _alone = measure_alone();
        let r = Redis::start();
        let dir = scratch("hungrelease");
        let go = dir.join("go");
        let mut c = cronlock(&r)
            .args(["--ttl", "30s", "--connect-timeout", "1s", "k", "-c"])
            .arg(sh(
                &dir,
                "echo $$ > pid; while [ ! -e go ]; do sleep 0.02; done",
            ))
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let cmd = read_pid(&dir.join("pid"));
        r.pause();
        std::fs::write(&go, "").unwrap();
        assert!(wait_for(Duration::from_secs(5), || !alive(cmd)));
        let finished = Instant::now();
        let status = exit_within(&mut c, Duration::from_secs(20), "hung release");
        let took = finished.elapsed();
        r.resume();
        assert_eq!(status, 0, "the command's status still wins");
        assert!(took < Duration::from_millis(1800), "release took {took:?}");
        let mut err = String::new();
        c.stderr.take().unwrap().read_to_string(&mut err).unwrap();
        assert!(err.contains("cannot release"), "{err}");

        // Lost (Redis hung for good): no retry once the deadline passed.
        let dir = scratch("hunglost");
        let mut c = cronlock(&r)
            .args(["--ttl", "1s", "--connect-timeout", "1s", "k2", "-c"])
            .arg(sh(&dir, "echo $$ > pid; exec sleep 60"))
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let cmd = read_pid(&dir.join("pid"));
        r.pause();
        assert!(wait_for(Duration::from_secs(5), || !alive(cmd)));
        let killed = Instant::now();
        let status = exit_within(&mut c, Duration::from_secs(20), "hung lost");
        let took = killed.elapsed();
        r.resume();
        assert_eq!(status, 122);
        assert!(took < Duration::from_millis(1800), "exit took {took:?}");
    }

    /// The renewal thread starts only when the first renewal is due (a short job never needs one);
    /// if it cannot start then, nothing would renew the lock: the command is stopped, 122, and the
    /// lock is released, long before it could expire.
    #[test]
    fn a_watchdog_that_cannot_start_stops_the_command() {
        let _alone = measure_alone();
        let r = Redis::start();
        let started = Instant::now();
        let (out, cmd) = injected(&r, "watchdog-start", &["--ttl", "3s"]);
        let cmd = cmd.expect("the command started");
        assert_eq!(code(&out), 122, "{}", stderr(&out));
        assert!(stderr(&out).contains("watchdog thread"), "{}", stderr(&out));
        assert!(!alive(cmd));
        // Stopped at the first renewal's time (TTL/3), with the lock released, not left to expire.
        assert!(started.elapsed() < Duration::from_millis(2500));
        assert!(!r.exists(LOCK));

        // A job shorter than one renewal interval never needs the thread at all.
        let out = run(cronlock_debug(&r)
            .env("CRONLOCK_TEST_PANIC", "watchdog-start")
            .args(["--ttl", "3s", "k", "true"]));
        assert_eq!(code(&out), 0, "{}", stderr(&out));
    }
}
