//! The child never outlives its lock: watchdog renewals, lock loss, Redis faults, max runtime,
//! signals, SIGKILL of cronlock, PID 1.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;

const LOCK: &str = "cronlock:{k}";

/// Start cronlock in the background with stderr captured.
fn start(r: &Redis, args: &[&str]) -> Child {
    cronlock(r)
        .args(args)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn finish(c: Child) -> (i32, String) {
    let out = c.wait_with_output().unwrap();
    (code(&out), stderr(&out))
}

/// A shell script that writes its pid to `dir/pid`, then runs `rest`.
/// A shell body that writes its pid to `dir/pid`, after a leading `trap` (so a signal sent once
/// the pid file exists always finds the trap in place).
fn script(dir: &Path, rest: &str) -> String {
    let pid = format!("echo $$ > {}/pid", dir.display());
    // `trap 'ACTION' SIGNALS; BODY`: the trap ends at the first "; " after the quoted action.
    let trap_end = rest
        .strip_prefix("trap '")
        .and_then(|r| r.find('\'').map(|q| q + "trap '".len() + 1))
        .and_then(|after| rest[after..].find("; ").map(|i| after + i));
    match trap_end {
        Some(end) => format!("{}; {pid}; {}", &rest[..end], &rest[end + 2..]),
        None => format!("{pid}; {rest}"),
    }
}

/// Poll until `pid` is dead; returns when it was seen dead.
fn death_of(pid: i32, timeout: Duration) -> Option<Instant> {
    wait_for(timeout, || !alive(pid)).then(Instant::now)
}

fn assert_terminated_for_lost_lock(r: &Redis, tamper: impl FnOnce(&Redis)) {
    let dir = scratch("lost");
    let got = dir.join("got");
    let body = format!(
        "trap 'echo TERM > {}; exit 0' TERM; while :; do sleep 0.02; done",
        got.display()
    );
    let c = start(r, &["--ttl", "3s", "k", "-c", &script(&dir, &body)]);
    read_pid(&dir.join("pid"));
    let t = Instant::now();
    tamper(r);
    assert!(wait_for(Duration::from_secs(5), || got.exists()));
    // Renewals run every ~0.72s with --ttl 3s; the loss is noticed at the next one.
    assert!(
        t.elapsed() < Duration::from_millis(720 + 500),
        "{:?}",
        t.elapsed()
    );
    let (code, err) = finish(c);
    assert_eq!(code, 122, "{err}");
    assert_eq!(own_lines(&err).len(), 1, "one line from cronlock: {err}");
    assert!(
        err.contains("lock lost") && err.contains("no longer ours"),
        "{err}"
    );
}

#[test]
fn redis_restarted_without_persistence_is_a_lost_lock() {
    let mut r = Redis::start();
    let dir = scratch("restart");
    let c = start(&r, &["--ttl", "2s", "k", "-c", &script(&dir, "sleep 30")]);
    read_pid(&dir.join("pid"));
    r.restart();
    let (code, err) = finish(c);
    assert_eq!(code, 122, "{err}");
    assert!(err.contains("no longer ours"), "{err}");
}

/// The child is gone before the lock could expire in Redis when Redis stops answering.
/// The child ignores SIGTERM, so this also checks the SIGKILL lands before the deadline.
fn assert_child_dead_before_expiry(fault: impl FnOnce(&mut Redis)) {
    let mut r = Redis::start();
    let dir = scratch("fault");
    let ttl = Duration::from_secs(2);
    let c = start(
        &r,
        &[
            "--ttl",
            "2s",
            "--connect-timeout",
            "300ms",
            "k",
            "-c",
            &script(&dir, "trap '' TERM; while :; do sleep 0.02; done"),
        ],
    );
    let pid = read_pid(&dir.join("pid"));
    let stopped = Instant::now();
    fault(&mut r);
    let died = death_of(pid, Duration::from_secs(10)).expect("child still alive");
    assert!(
        died < stopped + ttl,
        "child died {:?} after the fault, the lock could expire after {ttl:?}",
        died - stopped
    );
    // Not much earlier either: it waited for renewals to fail, then the grace.
    assert!(
        died - stopped > Duration::from_millis(500),
        "{:?}",
        died - stopped
    );
    let (code, err) = finish(c);
    r.resume();
    assert_eq!(code, 122, "{err}");
    assert!(err.contains("lock lost"), "{err}");
    // One line says why; the only other one reports the SIGKILL this TERM-ignoring child needed
    // (the failed release of a lost lock is not worth a line).
    let lines = own_lines(&err);
    assert_eq!(lines.len(), 2, "{err}");
    assert!(lines[1].contains("SIGKILL"), "{err}");
}

#[test]
fn renewal_recovering_after_errors_continues() {
    let r = Redis::start();
    let dir = scratch("recover");
    // --ttl 4s: renewals every ~0.97s, each call bounded by that; a feared loss would only
    // start at ~2.9s. A 2.3s pause from the start makes the first renewal (sent at ~0.97s) time
    // out at ~1.94s, and the retry succeeds when Redis answers again, 0.6s before the fear.
    let c = start(
        &r,
        &["-v", "--ttl", "4s", "k", "-c", &script(&dir, "sleep 3.5")],
    );
    read_pid(&dir.join("pid"));
    // The fault itself: Redis hangs for 2.3s, longer than one renewal's budget.
    r.pause();
    std::thread::sleep(Duration::from_millis(2300));
    r.resume();
    let (code, err) = finish(c);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("works again"), "{err}");
    assert!(!r.exists(LOCK));
}

/// Send `sig` to a running cronlock whose child dies of it: 128+N, lock released.
#[test]
fn signals_are_forwarded_and_reported_as_128_plus_n() {
    for (sig, name) in [
        (libc::SIGTERM, "TERM"),
        (libc::SIGINT, "INT"),
        (libc::SIGHUP, "HUP"),
        (libc::SIGQUIT, "QUIT"),
        (libc::SIGUSR1, "USR1"),
        (libc::SIGUSR2, "USR2"),
    ] {
        let r = Redis::start();
        let dir = scratch("sig");
        let c = start(&r, &["k", "-c", &script(&dir, "exec sleep 30")]);
        let pid = read_pid(&dir.join("pid"));
        signal(c.id() as i32, sig);
        assert!(death_of(pid, Duration::from_secs(5)).is_some(), "{name}");
        let (code, err) = finish(c);
        assert_eq!(code, 128 + sig, "SIG{name}: {err}");
        assert!(!r.exists(LOCK), "SIG{name}: lock must be released");
    }
}

/// A child that handles the signal exits with its own code; the lock stays held (renewed) while
/// it cleans up, longer than one TTL.
#[test]
fn signal_handled_by_child_keeps_lock_until_it_exits() {
    let r = Redis::start();
    let dir = scratch("handled");
    let seen = dir.join("seen");
    let body = format!(
        "trap 'echo TERM >> {s}; sleep 1.5; exit 3' TERM; while :; do sleep 0.02; done",
        s = seen.display()
    );
    let c = start(&r, &["--ttl", "500ms", "k", "-c", &script(&dir, &body)]);
    read_pid(&dir.join("pid"));
    signal(c.id() as i32, libc::SIGTERM);
    assert!(wait_for(Duration::from_secs(5), || seen.exists()));
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(1200) {
        assert!(
            r.pttl(LOCK) > 0,
            "lock must be held while the child cleans up"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let (code, err) = finish(c);
    assert_eq!(code, 3, "{err}");
    assert_eq!(std::fs::read_to_string(&seen).unwrap(), "TERM\n");
    assert!(!r.exists(LOCK));
}

/// Ctrl-C in a terminal signals the whole foreground group; the child (in its own group) must see
/// SIGINT exactly once.
#[test]
fn ctrl_c_reaches_the_child_once() {
    let r = Redis::start();
    let dir = scratch("ctrlc");
    let seen = dir.join("seen");
    // The trap is set before the pid is written: a SIGINT after the pid file exists is handled.
    let body = format!(
        "trap 'echo INT >> {s}; exit 130' INT; echo $$ > {d}/pid; while :; do sleep 0.02; done",
        s = seen.display(),
        d = dir.display()
    );
    let c = cronlock(&r)
        .args(["k", "-c", &body])
        .process_group(0)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    read_pid(&dir.join("pid"));
    signal(-(c.id() as i32), libc::SIGINT);
    let (code, err) = finish(c);
    assert_eq!(code, 130, "{err}");
    assert_eq!(std::fs::read_to_string(&seen).unwrap(), "INT\n");
}

/// Direct children of `pid` and their states, from /proc.
fn children(pid: i32) -> Vec<(i32, String)> {
    let mut out = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for t in tasks.flatten() {
        let list = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
        for c in list.split_whitespace().filter_map(|s| s.parse().ok()) {
            let stat = std::fs::read_to_string(format!("/proc/{c}/stat")).unwrap_or_default();
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, r)| r.split_whitespace().next())
                .unwrap_or("?")
                .to_string();
            out.push((c, state));
        }
    }
    out
}

/// What a PID 1 test needs: root (for `unshare --pid`) and a mount point at `/` (for
/// `--mount-proc`); a suite run without them fails, never skips.
fn pid_namespace_or_fail() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        lacks("root (unshare --pid needs CAP_SYS_ADMIN)", "the PID 1 test");
    }
    if !root_is_a_mount_point() {
        lacks(
            "a mount point at / (a chroot has none: run the suite in a VM or a privileged \
             container)",
            "unshare --mount-proc, for the PID 1 test,",
        );
    }
}

/// Every process under `root` and its state.
fn subtree(root: i32) -> Vec<(i32, String)> {
    let mut all = Vec::new();
    let mut todo = vec![root];
    while let Some(p) = todo.pop() {
        for (c, state) in children(p) {
            todo.push(c);
            all.push((c, state));
        }
    }
    all
}

/// The first child of `unshare` (the PID 1 it started), within 5 s.
fn pid_1_under(c: &mut Child) -> i32 {
    let unshare = c.id() as i32;
    let mut pid1 = 0;
    if !wait_for(Duration::from_secs(5), || {
        pid1 = children(unshare).first().map(|c| c.0).unwrap_or(0);
        pid1 > 0
    }) {
        let _ = c.kill();
        let mut err = String::new();
        if let Some(mut e) = c.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut e, &mut err);
        }
        panic!("cronlock did not start under unshare: {}", err.trim());
    }
    pid1
}

#[test]
fn as_pid_1_reaps_orphans_and_stops_on_sigterm() {
    pid_namespace_or_fail();
    let r = Redis::start();
    let dir = scratch("pid1");
    let started = dir.join("started");
    let body = format!(
        "for i in 1 2 3 4 5; do (sleep 0.1 &); done; touch {s}; sleep 30",
        s = started.display()
    );
    let c = std::process::Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", &bin()])
        .env("CRONLOCK_REDIS_URL", r.url())
        .args(["k", "-c", &body])
        .stderr(Stdio::piped())
        .spawn()
        .expect("unshare (util-linux) is required");
    let mut c = c;
    let pid1 = pid_1_under(&mut c);
    assert!(wait_for(Duration::from_secs(5), || started.exists()));
    // The orphaned sleeps reparent (to the guard, a subreaper, or to cronlock as PID 1) and exit
    // after 0.1s: they must be reaped, leaving the guard, sh and `sleep 30`, and no zombie.
    assert!(
        wait_for(Duration::from_secs(5), || {
            let t = subtree(pid1);
            t.len() == 3 && t.iter().all(|(_, s)| s != "Z")
        }),
        "under cronlock: {:?}",
        subtree(pid1)
    );
    assert!(r.exists(LOCK));
    signal(pid1, libc::SIGTERM);
    let (code, err) = finish(c);
    assert_eq!(code, 128 + libc::SIGTERM, "{err}");
    assert!(!r.exists(LOCK));
}

/// A `--crontab` replica as PID 1 (a container's entrypoint) whose starter is SIGKILLed while a
/// run works: the starter guarded the run's command, so the run stops it (its instant reads
/// `interrupted`); the run, now the replica's own child, is reaped (no zombie is left under
/// PID 1), and the replica still drains and exits 0 on SIGTERM.
#[test]
fn as_pid_1_a_replica_reaps_the_runs_of_a_killed_starter() {
    pid_namespace_or_fail();
    let r = Redis::start();
    let dir = scratch("pid1-replica");
    let d = dir.display();
    let file = dir.join("crontab");
    std::fs::write(
        &file,
        format!(
            "CRON_TZ=UTC\n0 0 1 1 * long echo began > {d}/began; sleep 3; echo done > {d}/done\n"
        ),
    )
    .unwrap();
    let mut c = std::process::Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", &bin()])
        .env("CRONLOCK_REDIS_URL", r.url())
        .arg("--crontab")
        .arg(&file)
        .stderr(Stdio::piped())
        .spawn()
        .expect("unshare (util-linux) is required");
    let pid1 = pid_1_under(&mut c);
    let out = run(cronlock(&r).args(["--trigger", "long"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(wait_for(Duration::from_secs(10), || dir
        .join("began")
        .exists()));
    let starter = children(pid1).into_iter().find(|(p, _)| {
        std::fs::read(format!("/proc/{p}/cmdline"))
            .is_ok_and(|cmd| cmd.starts_with(b"cronlock-starter\0"))
    });
    let (starter, _) = starter.expect("the replica's starter");
    signal(starter, libc::SIGKILL);
    assert!(
        wait_for(Duration::from_secs(10), || subtree(pid1).is_empty()),
        "under the replica: {:?}",
        subtree(pid1)
    );
    assert!(
        !dir.join("done").exists(),
        "the command outlived its starter"
    );
    assert!(
        wait_for(Duration::from_secs(10), || subtree(pid1).is_empty()),
        "under the replica: {:?}",
        subtree(pid1)
    );
    let status = run(cronlock(&r).args(["--status", "--json", "long"]));
    let v: serde_json::Value = serde_json::from_str(&stdout(&status)).unwrap();
    assert_eq!(v["ledger"][0]["state"], "interrupted", "{v}");
    signal(pid1, libc::SIGTERM);
    let (code, err) = finish(c);
    assert_eq!(code, 0, "{err}");
}

/// Parse a hex signal mask line (`SigBlk:`, `SigIgn:`) of /proc/self/status as printed by the child.
fn mask(status: &str, field: &str) -> u64 {
    let line = status
        .lines()
        .find(|l| l.starts_with(field))
        .unwrap_or_else(|| panic!("no {field} in {status}"));
    u64::from_str_radix(line.split_whitespace().nth(1).unwrap(), 16).unwrap()
}

#[test]
fn child_starts_with_empty_mask_and_default_sigpipe() {
    let r = Redis::start();
    let out = run(cronlock(&r).args(["k", "cat", "/proc/self/status"]));
    let status = stdout(&out);
    assert_eq!(mask(&status, "SigBlk:"), 0, "no signal may stay blocked");
    let pipe_bit = 1u64 << (libc::SIGPIPE - 1);
    assert_eq!(
        mask(&status, "SigIgn:") & pipe_bit,
        0,
        "SIGPIPE must be default"
    );
}

#[test]
fn signals_ignored_at_start_stay_ignored_like_nohup() {
    let r = Redis::start();
    // The inner cronlock gets the URL itself: the command does not inherit CRONLOCK_REDIS_URL.
    let out = run(cronlock(&r)
        .env("BIN", BIN)
        .env("URL", r.url())
        .args(["-u", &r.url()])
        .arg("outer")
        .args([
            "sh",
            "-c",
            "trap '' HUP; exec \"$BIN\" -u \"$URL\" inner cat /proc/self/status",
        ]));
    let status = stdout(&out);
    let hup_bit = 1u64 << (libc::SIGHUP - 1);
    assert_ne!(
        mask(&status, "SigIgn:") & hup_bit,
        0,
        "SIGHUP must stay ignored"
    );
}

mod alone {
    //! The lifecycle tests that measure time: each takes the cores for itself while it measures
    //! (`common::alone`), and `scripts/test.sh` runs them after the others.

    use super::*;

    #[test]
    fn watchdog_keeps_a_short_ttl_lock_for_a_long_job() {
        let _alone = measure_alone();
        let r = Redis::start();
        let first = start(&r, &["--ttl", "1s", "k", "sleep", "4"]);
        assert!(wait_for(Duration::from_secs(5), || r.exists(LOCK)));
        let t = Instant::now();
        let mut attempts = 0;
        let mut first = Some(first);
        while t.elapsed() < Duration::from_millis(3500) {
            let pttl = r.pttl(LOCK);
            assert!(
                pttl > 0,
                "lock must stay held, PTTL {pttl} after {:?}",
                t.elapsed()
            );
            let out = run(cronlock(&r).args(["-E", "75", "k", "true"]));
            assert_eq!(code(&out), 75, "a second cronlock got the lock");
            attempts += 1;
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(attempts > 20);
        let (code, err) = finish(first.take().unwrap());
        assert_eq!(code, 0, "{err}");
        assert!(!r.exists(LOCK), "lock must be gone right after");
    }

    #[test]
    fn lock_deleted_from_outside_stops_the_child_with_122() {
        let _alone = measure_alone();
        let r = Redis::start();
        assert_terminated_for_lost_lock(&r, |r| r.del(LOCK));
    }

    #[test]
    fn lock_overwritten_from_outside_stops_the_child_with_122() {
        let _alone = measure_alone();
        let r = Redis::start();
        assert_terminated_for_lost_lock(&r, |r| r.set(LOCK, "someone else"));
        assert_eq!(
            r.get(LOCK).as_deref(),
            Some("someone else"),
            "not ours to delete"
        );
    }

    #[test]
    fn redis_hung_child_dies_before_lock_expiry() {
        let _alone = measure_alone();
        assert_child_dead_before_expiry(|r| r.pause());
    }

    #[test]
    fn redis_killed_child_dies_before_lock_expiry() {
        let _alone = measure_alone();
        assert_child_dead_before_expiry(|r| r.kill());
    }

    #[test]
    fn max_runtime_stops_the_whole_group_with_124() {
        let _alone = measure_alone();
        let r = Redis::start();
        let dir = scratch("maxrt");
        let body = format!(
            "sleep 100 & echo $! > {d}/a; sleep 100 & echo $! > {d}/b; wait",
            d = dir.display()
        );
        let t = Instant::now();
        let c = start(
            &r,
            &["--max-runtime", "500ms", "k", "-c", &script(&dir, &body)],
        );
        let (a, b) = (read_pid(&dir.join("a")), read_pid(&dir.join("b")));
        let (code, err) = finish(c);
        assert_eq!(code, 124, "{err}");
        assert!(err.contains("--max-runtime"), "{err}");
        assert!(t.elapsed() >= Duration::from_millis(500));
        assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
        assert!(!alive(a) && !alive(b), "grandchildren must be gone");
        assert!(!r.exists(LOCK));
    }

    #[test]
    fn child_ignoring_sigterm_is_killed_after_the_grace() {
        let _alone = measure_alone();
        let r = Redis::start();
        let dir = scratch("ignore");
        let t = Instant::now();
        let c = start(
            &r,
            &[
                "--max-runtime",
                "300ms",
                "--grace",
                "700ms",
                "k",
                "-c",
                &script(&dir, "trap '' TERM; while :; do sleep 0.02; done"),
            ],
        );
        let (code, err) = finish(c);
        assert_eq!(code, 124, "{err}");
        let took = t.elapsed();
        assert!(took >= Duration::from_millis(1000), "{took:?}");
        assert!(took < Duration::from_millis(2500), "{took:?}");
        assert!(err.contains("SIGKILL"), "{err}");
    }

    #[test]
    fn sigkill_of_cronlock_kills_the_group_and_the_lock_expires() {
        let _alone = measure_alone();
        let r = Redis::start();
        let dir = scratch("sigkill");
        let body = format!(
            "sleep 100 & echo $! > {d}/a; sleep 100 & echo $! > {d}/b; wait",
            d = dir.display()
        );
        let mut c = start(&r, &["--ttl", "1s", "k", "-c", &script(&dir, &body)]);
        let sh = read_pid(&dir.join("pid"));
        let (a, b) = (read_pid(&dir.join("a")), read_pid(&dir.join("b")));
        let killed = Instant::now();
        c.kill().unwrap();
        c.wait().unwrap();
        for pid in [sh, a, b] {
            assert!(
                death_of(pid, Duration::from_secs(1)).is_some(),
                "pid {pid} outlived cronlock by over a second"
            );
        }
        // The lock expires within one TTL and another run can take it.
        let out = run(cronlock(&r).args(["-w", "3s", "-E", "75", "k", "true"]));
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        assert!(killed.elapsed() < Duration::from_millis(2500));
    }
}
