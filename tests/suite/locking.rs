//! The core contract: acquire, run, release, and one test per row of the exit-status table.

use std::process::Stdio;
use std::time::Duration;

use crate::common::*;

const LOCK: &str = "cronlock:{k}";
const FENCE: &str = "cronlock:{k}:fence";

#[test]
fn runs_the_command_and_releases_the_lock() {
    let r = Redis::start();
    let out = run(cronlock(&r).args(["k", "--", "sh", "-c", "echo ran"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stdout(&out), "ran\n");
    assert_eq!(stderr(&out), "", "a normal run is silent");
    assert!(!r.exists(LOCK), "lock must be gone after the run");
    assert_fenced(r.get(FENCE));
}

#[test]
fn child_exit_codes_pass_through() {
    let r = Redis::start();
    for c in [1, 42] {
        let out = run(cronlock(&r).args(["k", "sh", "-c", &format!("exit {c}")]));
        assert_eq!(code(&out), c);
        assert!(!r.exists(LOCK));
    }
}

#[test]
fn killed_by_signal_is_128_plus_n() {
    let r = Redis::start();
    let out = run(cronlock(&r).args(["k", "sh", "-c", "kill -9 $$"]));
    assert_eq!(code(&out), 128 + 9);
    assert!(!r.exists(LOCK));
}

#[test]
fn busy_lock_skips_silently_with_default_exit_0() {
    let r = Redis::start();
    r.set(LOCK, "someone else");
    let dir = scratch("busy");
    let marker = dir.join("ran");
    let out = run(cronlock(&r).args(["k", "touch"]).arg(&marker));
    assert_eq!(code(&out), 0);
    assert_eq!(stderr(&out), "", "a busy lock is silent by default");
    assert!(!marker.exists(), "the command must not run");
    assert_eq!(r.get(LOCK).as_deref(), Some("someone else"));

    let out = run(cronlock(&r).args(["-v", "k", "touch"]).arg(&marker));
    assert!(stderr(&out).contains("is held by"), "{}", stderr(&out));
}

#[test]
fn busy_lock_exit_code_is_configurable() {
    let r = Redis::start();
    r.set(LOCK, "someone else");
    let out = run(cronlock(&r).args(["-E", "75", "k", "true"]));
    assert_eq!(code(&out), 75);
    let out = run(cronlock(&r)
        .env("CRONLOCK_CONFLICT_EXIT_CODE", "3")
        .args(["k", "true"]));
    assert_eq!(code(&out), 3);
}

#[test]
fn wait_takes_the_lock_once_free() {
    let r = Redis::start();
    let mut con = r.con();
    redis::cmd("SET")
        .arg(LOCK)
        .arg("someone else")
        .arg("PX")
        .arg(300)
        .query::<()>(&mut con)
        .unwrap();
    let out = run(cronlock(&r).args(["-w", "5s", "k", "echo", "ran"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stdout(&out), "ran\n");
}

#[test]
fn cannot_execute_is_126_and_not_found_is_127() {
    let r = Redis::start();
    let dir = scratch("exec");
    let file = dir.join("not-executable");
    std::fs::write(&file, "#!/bin/sh\necho hi\n").unwrap();
    let out = run(cronlock(&r).arg("k").arg(&file));
    assert_eq!(code(&out), 126);
    assert_one_line(&out);
    assert!(
        !r.exists(LOCK),
        "lock must be released after a spawn failure"
    );

    let out = run(cronlock(&r).args(["k", "no-such-command-cronlock"]));
    assert_eq!(code(&out), 127);
    assert_one_line(&out);
    assert!(stderr(&out).contains("no-such-command-cronlock"));
    assert!(!r.exists(LOCK));
}

fn assert_one_line(out: &std::process::Output) {
    let err = stderr(out);
    assert_eq!(err.lines().count(), 1, "expected one line, got: {err:?}");
    assert!(err.starts_with("cronlock: "), "{err:?}");
}

/// Each bad input: status 125, one `cronlock:` line, the command not run, nothing left in Redis.
#[test]
fn bad_input_is_125_with_one_line_and_nothing_left() {
    let r = Redis::start();
    let mut wrongtype = r.con();
    redis::cmd("HSET")
        .arg("cronlock:{h}")
        .arg("a")
        .arg("b")
        .query::<()>(&mut wrongtype)
        .unwrap();
    let dir = scratch("bad");
    let marker = dir.join("ran");
    let m = marker.to_str().unwrap();
    let closed_port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let closed = format!("redis://127.0.0.1:{closed_port}");
    let cases: Vec<(&str, Vec<String>, &str)> = vec![
        ("ttl 0", args(&["--ttl", "0", "k", "touch", m]), "--ttl"),
        ("ttl abc", args(&["--ttl", "abc", "k", "touch", m]), "--ttl"),
        ("empty key", args(&["", "touch", m]), "KEY"),
        ("no command", args(&["k"]), "COMMAND"),
        ("both", args(&["k", "-c", "true", "touch", m]), "-c"),
        (
            "bad url",
            args(&["-u", "http//nope", "k", "touch", m]),
            "--redis-url",
        ),
        (
            "closed port",
            args(&["-u", &closed, "k", "touch", m]),
            "connect",
        ),
        ("wrongtype", args(&["h", "touch", m]), "WRONGTYPE"),
        (
            "unknown option",
            args(&["--bogus", "k", "touch", m]),
            "--bogus",
        ),
    ];
    for (name, argv, needle) in cases {
        let out = run(cronlock(&r).args(&argv));
        assert_eq!(code(&out), 125, "{name}: {}", stderr(&out));
        assert_one_line(&out);
        assert!(stderr(&out).contains(needle), "{name}: {}", stderr(&out));
        assert!(!marker.exists(), "{name}: the command ran");
        assert_eq!(
            r.keys(),
            vec!["cronlock:{h}".to_string()],
            "{name}: left keys"
        );
    }
    // Values from the environment are checked the same way.
    let out = run(cronlock(&r).env("CRONLOCK_TTL", "abc").args(["k", "true"]));
    assert_eq!(code(&out), 125);
    assert_one_line(&out);
}

fn args(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

#[test]
fn wrong_password_is_125_and_never_printed() {
    let r = Redis::with_password("s3cret-pw");
    let bad = format!("redis://:wrong-pw-123@127.0.0.1:{}", r.port);
    let out = run(cronlock(&r).args(["-u", &bad, "-v", "k", "true"]));
    assert_eq!(code(&out), 125);
    assert_one_line(&out);
    assert!(!stderr(&out).contains("wrong-pw-123"), "{}", stderr(&out));
    assert!(stderr(&out).contains("***"), "{}", stderr(&out));
    assert!(!r.exists(LOCK));

    // With the right password, even verbose output never shows it.
    let out = run(cronlock(&r).args(["-v", "k", "true"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(!stderr(&out).contains("s3cret-pw"));
    // And without one, Redis refuses: also 125.
    let open = format!("redis://127.0.0.1:{}", r.port);
    let out = run(cronlock(&r).args(["-u", &open, "k", "true"]));
    assert_eq!(code(&out), 125);
}

/// cronlock running a command that waits for a file; returns once the command has started.
fn start_gated(r: &Redis, name: &str) -> (std::process::Child, Scratch) {
    let dir = scratch(name);
    let started = dir.join("started");
    let go = dir.join("go");
    let script = format!(
        "touch {s}; while [ ! -f {g} ]; do sleep 0.01; done",
        s = started.display(),
        g = go.display()
    );
    let child = cronlock(r)
        .args(["k", "-c", &script])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(wait_for(Duration::from_secs(10), || started.exists()));
    (child, dir)
}

/// Let the command of [`start_gated`] finish and collect cronlock's output.
fn open_gate(child: std::process::Child, dir: &Scratch) -> std::process::Output {
    std::fs::write(dir.join("go"), "").unwrap();
    child.wait_with_output().unwrap()
}

/// Whoever notices first (the release, or the lock's watch, which stops the command: 122, see
/// `tracking`), the other holder's lock is left alone.
#[test]
fn a_lock_taken_over_is_not_deleted_by_us() {
    let r = Redis::start();
    let (child, go) = start_gated(&r, "takeover");
    r.set(LOCK, "another holder");
    let out = open_gate(child, &go);
    assert!(matches!(code(&out), 0 | 122), "{}", stderr(&out));
    assert_eq!(r.get(LOCK).as_deref(), Some("another holder"));
    assert!(stderr(&out).contains("no longer ours"), "{}", stderr(&out));
}

#[test]
fn racing_cronlocks_run_the_command_once() {
    let r = Redis::start();
    let dir = scratch("race");
    let log = dir.join("runs");
    let script = format!("echo run >> {}; sleep 1", log.display());
    let children: Vec<_> = (0..8)
        .map(|_| {
            cronlock(&r)
                .args(["-E", "75", "k", "-c", &script])
                .spawn()
                .unwrap()
        })
        .collect();
    let codes: Vec<i32> = children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap().status.code().unwrap())
        .collect();
    assert_eq!(std::fs::read_to_string(&log).unwrap(), "run\n");
    assert_eq!(codes.iter().filter(|&&c| c == 0).count(), 1, "{codes:?}");
    assert_eq!(codes.iter().filter(|&&c| c == 75).count(), 7, "{codes:?}");
}

#[test]
fn fencing_token_increases_across_runs_and_after_expiry() {
    let r = Redis::start();
    let fence = |out: &std::process::Output| -> i64 { stdout(out).trim().parse().unwrap() };
    let print = ["k", "-c", "echo $CRONLOCK_FENCING_TOKEN"];
    let a = fence(&run(cronlock(&r).args(print)));
    let b = fence(&run(cronlock(&r).args(print)));
    assert!(b > a, "{a} then {b}");

    // A holder that dies leaves its lock to expire; the next holder still gets a larger token.
    let mut holder = cronlock(&r)
        .args(["--ttl", "500ms", "k", "sleep", "30"])
        .spawn()
        .unwrap();
    assert!(wait_for(Duration::from_secs(10), || r.exists(LOCK)));
    holder.kill().unwrap();
    holder.wait().unwrap();
    assert!(wait_for(Duration::from_secs(5), || !r.exists(LOCK)));
    let dead: i64 = r.get(FENCE).unwrap().parse().unwrap();
    assert!(dead > b, "the dead holder took {dead} after {b}");
    let c = fence(&run(cronlock(&r).args(print)));
    assert!(c > dead, "the next holder got {c} after {dead}");
}

/// The counter was written: a token is the larger of the last one + 1 and Redis's time in µs.
fn assert_fenced(stored: Option<String>) {
    let token: i64 = stored.expect("a fencing counter").parse().unwrap();
    let now_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64;
    assert!(
        (now_us - 60_000_000..=now_us + 60_000_000).contains(&token),
        "token {token} is not near Redis's time {now_us}"
    );
}

#[test]
fn child_environment_names_the_lock() {
    let r = Redis::start();
    let out = run(cronlock(&r).args([
        "k",
        "-c",
        "echo $CRONLOCK_KEY; echo ${#CRONLOCK_TOKEN}; echo $CRONLOCK_FENCING_TOKEN",
    ]));
    let lines: Vec<String> = stdout(&out).lines().map(str::to_string).collect();
    assert_eq!(lines[..2], ["k", "36"]);
    assert_fenced(Some(lines[2].clone()));
    assert_eq!(Some(lines[2].clone()), r.get(FENCE));
}

#[test]
fn shell_command_runs_through_bin_sh() {
    let r = Redis::start();
    let out = run(cronlock(&r).args(["k", "-c", "echo abc | tr a-c x-z; echo $0"]));
    assert_eq!(stdout(&out), "xyz\n/bin/sh\n");
}

#[test]
fn argument_boundaries_are_preserved() {
    let r = Redis::start();
    let out = run(cronlock(&r).args(["k", "printf", "[%s]", "a b", "", "-la", "--", "$HOME"]));
    assert_eq!(stdout(&out), "[a b][][-la][--][$HOME]");
}

#[test]
fn child_stdin_is_inherited() {
    let r = Redis::start();
    let mut child = cronlock(&r)
        .args(["k", "cat"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(b"through\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(stdout(&out), "through\n");
}

#[test]
fn help_and_version_exit_0() {
    let r = Redis::start();
    let out = run(cronlock(&r).arg("--help"));
    assert_eq!(code(&out), 0);
    assert!(stdout(&out).contains("Exit status:"));
    assert!(stdout(&out).contains("122"));
    let out = run(cronlock(&r).arg("--version"));
    assert_eq!(code(&out), 0);
    assert!(stdout(&out).starts_with("cronlock "));
}

#[test]
fn errors_print_even_when_quiet() {
    let r = Redis::start();
    let out = run(cronlock(&r).args(["-q", "k", "no-such-command-cronlock"]));
    assert_eq!(code(&out), 127);
    assert_one_line(&out);
    let out = run(cronlock(&r).args(["-q", "-u", "redis://127.0.0.1:1", "k", "true"]));
    assert_eq!(code(&out), 125);
    assert_one_line(&out);
}

#[test]
fn release_survives_a_dropped_connection() {
    let r = Redis::start();
    let (child, go) = start_gated(&r, "dropped");
    // Drop every client connection but ours, as a server-side idle timeout would (cronlock's,
    // and on a loaded machine maybe a test connection whose close the server has not read yet).
    let mut con = r.con();
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("normal")
        .arg("SKIPME")
        .arg("yes")
        .query(&mut con)
        .unwrap();
    assert!(killed >= 1, "no connection of cronlock's to drop");
    let out = open_gate(child, &go);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stderr(&out), "", "the release must recover quietly");
    assert!(!r.exists(LOCK));
    assert!(r.exists("cronlock:{k}:last"), "the run is recorded");
}

#[test]
fn a_signal_while_waiting_ends_the_wait_without_running() {
    let r = Redis::start();
    r.set(LOCK, "someone else");
    let dir = scratch("waitsig");
    let marker = dir.join("ran");
    let child = cronlock(&r)
        .args(["-w", "30s", "k", "touch"])
        .arg(&marker)
        .spawn()
        .unwrap();
    // Let it start waiting: its BLPOP is on the server.
    assert!(wait_for(Duration::from_secs(5), || {
        let clients: String = r.query(redis::cmd("CLIENT").arg("LIST"));
        clients.contains("cmd=blpop")
    }));
    let t = std::time::Instant::now();
    // SAFETY: sending a signal to a process the test started.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    assert_eq!(code(&out), 128 + libc::SIGTERM);
    // Far under the 30 s the wait would last.
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert!(!marker.exists());
    assert_eq!(r.get(LOCK).as_deref(), Some("someone else"));
}

#[test]
fn the_guard_is_named_in_ps() {
    let r = Redis::start();
    let out = run(cronlock(&r).args(["k", "sh", "-c", "cat /proc/$PPID/comm"]));
    assert_eq!(stdout(&out), "cronlock-guard\n");
}

/// One run under `limit`, its command printing the fencing token it got: the token, or the run's
/// output when it was refused.
fn token_of(r: &Redis, limit: &str) -> Result<u64, std::process::Output> {
    let out = run(cronlock(r).args(["--limit", limit, "k", "-c", "echo $CRONLOCK_FENCING_TOKEN"]));
    match (code(&out), stdout(&out).trim().parse::<u64>()) {
        (0, Ok(t)) => Ok(t),
        _ => Err(out),
    }
}

/// Fencing tokens are exact and strictly increasing past 2^53 (Lua's numbers are doubles): a
/// counter at 2^53 - 1 or 2^53 + 1 gives the next integers, exactly; at 2^63 - 1 (the largest
/// integer) or holding something cronlock never wrote (negative, not a number, too long), the
/// acquire is refused in one line naming the key and the value, nothing written, no lock left.
#[test]
fn fencing_tokens_are_exact_and_never_go_back() {
    let r = Redis::start();
    const FENCE: &str = "cronlock:{k}:fence";
    for limit in ["1", "3"] {
        for start in [
            9_007_199_254_740_991_u64,
            9_007_199_254_740_993,
            9_223_372_036_854_775_805,
        ] {
            r.set(FENCE, &start.to_string());
            let first = token_of(&r, limit).unwrap_or_else(|o| panic!("{start}: {}", stderr(&o)));
            let second = token_of(&r, limit).unwrap_or_else(|o| panic!("{start}: {}", stderr(&o)));
            assert_eq!((first, second), (start + 1, start + 2), "--limit {limit}");
            assert_eq!(r.get(FENCE).as_deref(), Some(&*second.to_string()));
            // Now at 2^63 - 1: no greater token exists.
            if second == i64::MAX as u64 {
                let out = token_of(&r, limit).expect_err("a token past 2^63 - 1");
                assert_eq!(code(&out), 125, "{}", stderr(&out));
                let line = one_line(&out);
                assert!(
                    line.contains(FENCE) && line.contains("9223372036854775807"),
                    "{line}"
                );
            }
            assert!(r
                .keys()
                .iter()
                .all(|k| !k.starts_with("cronlock:{k}:slot") && k != LOCK));
        }
        for bad in ["-5", "12abc", "99999999999999999999", "9223372036854775808"] {
            r.set(FENCE, bad);
            let out = token_of(&r, limit).expect_err(bad);
            assert_eq!(code(&out), 125, "{bad}: {}", stderr(&out));
            let line = one_line(&out);
            assert!(line.contains(FENCE) && line.contains(bad), "{bad}: {line}");
            assert_eq!(
                r.get(FENCE).as_deref(),
                Some(bad),
                "{bad}: the counter was written"
            );
            assert!(!r.exists(LOCK), "{bad}: a lock was left behind");
            assert!(
                r.keys().iter().all(|k| !k.contains(":slot")),
                "{bad}: {:?}",
                r.keys()
            );
        }
        r.del(FENCE);
    }
}

/// The locking tests of the URL: where it is read from, its forms and what it carries.
mod urls;

/// The tests that measure time: they run alone (`common::alone`).
mod alone;
