//! Honest edges: secrets, environment variables, output, and the messages people see.

use std::io::Write;
use std::net::TcpListener;
use std::os::fd::{FromRawFd, OwnedFd};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::*;
use serde_json::Value;

const LOCK: &str = "cronlock:{k}";

#[test]
fn passwords_with_url_delimiters_are_never_printed() {
    let r = Redis::start();
    for pw in [
        "Xq7/Zr9",
        "Kp7?W3#Lm8",
        "Aa1@Bb2@Cc3",
        "Q9x/Y8y?Z7z#W6w@V5v",
    ] {
        let url = format!("redis://:{pw}@host:notaport/0");
        for format in ["text", "json"] {
            let out = run(cronlock(&r).env("CRONLOCK_REDIS_URL", &url).args([
                "--log-format",
                format,
                "k",
                "true",
            ]));
            assert_eq!(code(&out), 125);
            let err = stderr(&out);
            assert_eq!(err.lines().count(), 1, "{err}");
            assert!(err.contains("CRONLOCK_REDIS_URL"), "{err}");
            assert!(!err.contains(pw), "{pw} printed: {err}");
            for part in pw.split(['/', '?', '#', '@']) {
                assert!(!err.contains(part), "part {part} of {pw} printed: {err}");
            }
        }
    }
}

#[test]
fn a_short_password_does_not_mangle_messages() {
    let r = Redis::with_password("1");
    let out = run(cronlock(&r).args(["--log-format", "json", "k", "sh", "-c", "exit 3"]));
    assert_eq!(code(&out), 3, "{}", stderr(&out));
    for line in stderr(&out).lines() {
        let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(v["pid"].is_u64(), "{line}");
        if let Some(t) = v.get("fencing_token") {
            assert!(t.as_i64().unwrap() > 1_000_000, "{line}");
        }
    }
    let out = run(cronlock(&r).args(["-v", "k", "true"]));
    assert!(stderr(&out).contains("fencing token 1"), "{}", stderr(&out));
    assert!(!stderr(&out).contains("***"), "{}", stderr(&out));
}

/// A real Sentinel with no master, on a free port; killed on drop.
struct Sentinel(std::process::Child, u16, #[allow(dead_code)] Scratch);

impl Sentinel {
    fn start() -> Sentinel {
        for _ in 0..20 {
            let dir = scratch("sentinel");
            let port = free_port();
            let conf = dir.join("sentinel.conf");
            std::fs::write(&conf, format!("port {port}\nbind 127.0.0.1\n")).unwrap();
            let child = Command::new(server_bin())
                .arg(&conf)
                .arg("--sentinel")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("redis-server");
            let mut s = Sentinel(child, port, dir);
            let up = wait_for(Duration::from_secs(5), || {
                std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
                    || s.0.try_wait().unwrap().is_some()
            });
            if up && s.0.try_wait().unwrap().is_none() {
                return s;
            }
        }
        panic!("sentinel did not start");
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_sentinel_port_is_named_and_the_lock_value_not_echoed() {
    let r = Redis::start();
    let s = Sentinel::start();
    let url = format!("redis://127.0.0.1:{}", s.1);
    let out = run(cronlock(&r).args(["-u", &url, "k", "echo", "secret-argument"]));
    assert_eq!(code(&out), 125);
    let err = one_line(&out);
    assert!(err.contains("Sentinel"), "{err}");
    assert!(
        !err.contains("secret-argument") && !err.contains("token"),
        "{err}"
    );
}

#[test]
fn help_examples_keep_the_password_out_of_dash_u() {
    let r = Redis::start();
    let out = run(cronlock(&r).arg("--help"));
    let help = stdout(&out);
    assert!(!help.contains("-u redis://:"), "{help}");
    assert!(help.contains("CRONLOCK_REDIS_URL=redis://:"), "{help}");
    assert!(help.contains("except -c"), "{help}");
}

#[test]
fn a_variable_set_to_off_is_off_and_the_command_line_wins() {
    let r = Redis::start();
    for (var, value, flag) in [
        ("CRONLOCK_QUIET", "0", "-v"),
        ("CRONLOCK_QUIET", "", "-v"),
        ("CRONLOCK_QUIET", "false", "-v"),
        ("CRONLOCK_VERBOSE", "no", "-q"),
        ("CRONLOCK_QUIET", "1", "-v"),
        ("CRONLOCK_VERBOSE", "yes", "-q"),
    ] {
        let out = run(cronlock(&r)
            .env(var, value)
            .args([flag, "k", "echo", "ran"]));
        assert_eq!(code(&out), 0, "{var}={value} {flag}: {}", stderr(&out));
        assert_eq!(stdout(&out), "ran\n");
        // The flag given decides: -v reports, -q is silent.
        assert_eq!(
            stderr(&out).contains("acquired"),
            flag == "-v",
            "{var}={value} {flag}: {}",
            stderr(&out)
        );
    }
    let out = run(cronlock(&r)
        .env("CRONLOCK_QUIET", "1")
        .env("CRONLOCK_VERBOSE", "1")
        .args(["k", "true"]));
    assert_eq!(code(&out), 125);
    assert!(one_line(&out).contains("CRONLOCK_QUIET"));
}

#[test]
fn invalid_values_name_their_variable() {
    let r = Redis::start();
    let dir = scratch("invalid");
    let marker = dir.join("ran");
    for (var, value) in [
        ("CRONLOCK_VERBOSE", "maybe"),
        ("CRONLOCK_VERBOSE", "2"),
        ("CRONLOCK_NONBLOCK", "sometimes"),
        ("CRONLOCK_TTL", "abc"),
        ("CRONLOCK_HISTORY", "many"),
    ] {
        let out = run(cronlock(&r)
            .env(var, value)
            .args(["k", "touch"])
            .arg(&marker));
        assert_eq!(code(&out), 125, "{var}={value}");
        let err = one_line(&out);
        assert!(err.contains(var), "{var}={value}: {err}");
        assert!(err.contains(&format!("'{value}'")), "{err}");
        assert!(!marker.exists());
    }
    assert!(r.keys().is_empty(), "{:?}", r.keys());
    // A negative duration is an invalid value, not an unknown option.
    let out = run(cronlock(&r).args(["--ttl", "-5s", "k", "true"]));
    assert_eq!(code(&out), 125);
    let err = one_line(&out);
    assert!(err.contains("invalid value '-5s' for --ttl"), "{err}");
}

#[test]
fn max_runtime_zero_means_no_limit() {
    let r = Redis::start();
    let out = run(cronlock(&r).args(["--max-runtime", "0", "k", "sleep", "0.3"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let out = run(cronlock(&r)
        .env("CRONLOCK_MAX_RUNTIME", "0")
        .args(["k", "sleep", "0.3"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
}

/// A stdout whose reader is already gone: every write fails with EPIPE.
fn closed_pipe() -> Stdio {
    let mut fds = [0; 2];
    // SAFETY: a valid two-element array for pipe2.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: both descriptors are fresh and owned here; the read end is closed at once.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    drop(read);
    Stdio::from(write)
}

#[test]
fn a_closed_stdout_is_quiet_and_a_full_one_is_125() {
    let r = Redis::start();
    run(cronlock(&r).args(["k", "true"]));
    r.set("cronlock:{held}", "someone");
    for mode in [&["--list"][..], &["--status", "k"], &["--list", "--json"]] {
        let out = cronlock(&r)
            .args(mode)
            .stdout(closed_pipe())
            .output()
            .unwrap();
        assert_eq!(code(&out), 0, "{mode:?}: {}", stderr(&out));
        assert_eq!(stderr(&out), "", "{mode:?}");
        let full = std::fs::File::create("/dev/full").unwrap();
        let out = cronlock(&r).args(mode).stdout(full).output().unwrap();
        assert_eq!(code(&out), 125, "{mode:?}");
        assert!(one_line(&out).contains("no space left"), "{}", stderr(&out));
    }
}

#[test]
fn status_shows_the_kept_runs() {
    let r = Redis::start();
    for c in [1, 2, 3] {
        run(cronlock(&r).args(["k", "sh", "-c", &format!("exit {c}")]));
    }
    let out = run(cronlock(&r).args(["--status", "k", "--history"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("history (3 runs, newest first):"), "{text}");
    let order: Vec<usize> = ["status 3", "status 2", "status 1"]
        .iter()
        .map(|s| text.rfind(s).unwrap())
        .collect();
    assert!(order.windows(2).all(|w| w[0] < w[1]), "{text}");
    let out = run(cronlock(&r).args(["--status", "--json", "k", "--history", "2"]));
    let v: Value = serde_json::from_str(&stdout(&out)).unwrap();
    let runs = v["history"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    assert_eq!(runs[0]["exit_status"], 3);
    assert_eq!(runs[1]["exit_status"], 2);
    // Without --history, no history field; --history 0 trims the kept list.
    let out = run(cronlock(&r).args(["--status", "--json", "k"]));
    let v: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert!(v.get("history").is_none());
    run(cronlock(&r).args(["--history", "0", "k", "true"]));
    assert!(!r.exists("cronlock:{k}:history"));
    assert!(r.exists("cronlock:{k}:last"));
    // A bare --history is no number of runs to keep.
    let out = run(cronlock(&r).args(["k", "--history", "--", "true"]));
    assert_eq!(code(&out), 125);
    assert!(one_line(&out).contains("--history"));
}

#[test]
fn a_busy_lock_names_its_holder_and_the_wait() {
    let r = Redis::start();
    let dir = scratch("holder");
    let mut holder = cronlock(&r)
        .args(["k", "-c"])
        .arg(format!("echo $$ > {}/pid; exec sleep 30", dir.display()))
        .spawn()
        .unwrap();
    read_pid(&dir.join("pid"));
    let out = run(cronlock(&r).args(["-v", "-w", "200ms", "k", "true"]));
    assert_eq!(code(&out), 0);
    let err = stderr(&out);
    assert!(
        err.contains("is held by host ") && err.contains(&format!("pid {}", holder.id())),
        "{err}"
    );
    // The wait it names is at least the 200 ms asked (more on a busy machine: its last poll).
    let waited = err
        .split("after waiting ")
        .nth(1)
        .and_then(|w| w.split(';').next())
        .and_then(|w| humantime::parse_duration(w).ok())
        .unwrap_or_default();
    assert!(
        err.contains(" since ") && waited >= Duration::from_millis(200),
        "{err}"
    );
    signal(holder.id() as i32, libc::SIGTERM);
    holder.wait().unwrap();
}

#[test]
fn a_long_command_line_is_cut_with_a_marker() {
    let r = Redis::start();
    let long = "x".repeat(400);
    let out = run(cronlock(&r).args(["k", "echo", &long]));
    assert_eq!(code(&out), 0);
    let last: Value = serde_json::from_str(&r.get("cronlock:{k}:last").unwrap()).unwrap();
    let cmd = last["command"].as_str().unwrap();
    assert_eq!(cmd.chars().count(), 256);
    assert!(cmd.ends_with('…'), "{cmd}");
}

#[test]
fn noauth_says_how_to_give_the_password() {
    let r = Redis::with_password("s3cret");
    let url = format!("redis://127.0.0.1:{}", r.port);
    let out = run(cronlock(&r).args(["-u", &url, "k", "true"]));
    assert_eq!(code(&out), 125);
    let err = one_line(&out);
    assert!(
        err.contains("wants a password") && err.contains("CRONLOCK_REDIS_URL"),
        "{err}"
    );
}

#[test]
fn a_server_that_is_not_redis_is_named_as_such() {
    let r = Redis::start();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        // An HTTP server: answers anything with a 400 and closes.
        for stream in listener.incoming().take(1) {
            let mut s = stream.unwrap();
            let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
        }
    });
    let url = format!("redis://127.0.0.1:{port}");
    let out = run(cronlock(&r).args(["-u", &url, "k", "true"]));
    assert_eq!(code(&out), 125);
    let err = one_line(&out);
    assert!(err.contains("did not answer like a Redis server"), "{err}");
    server.join().unwrap();
}

#[test]
fn list_skips_a_key_of_another_type() {
    let r = Redis::start();
    r.query::<()>(redis::cmd("HSET").arg("cronlock:{odd}").arg("a").arg("b"));
    r.set(
        LOCK,
        r#"{"host":"h","pid":1,"started":1,"token":"t","command":"c"}"#,
    );
    let out = run(cronlock(&r).arg("--list"));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(stdout(&out).starts_with("k\t"), "{}", stdout(&out));
    assert!(one_line(&out).contains("skipped 'cronlock:{odd}'"));
}

#[test]
fn the_readme_acl_is_enough_for_everything() {
    let r = Redis::start();
    let mut acl = redis::cmd(&documented_acl("pw")[0]);
    for w in &documented_acl("pw")[1..] {
        acl.arg(w);
    }
    r.query::<()>(&acl);
    let url = format!("redis+unix://{}?user=cronlock&pass=pw", r.sock.display());
    let as_user = |args: &[&str]| run(cronlock(&r).env("CRONLOCK_REDIS_URL", &url).args(args));
    let out = as_user(&["--min-hold", "0", "k", "true"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    // A second run waits for a holder and gets a handoff.
    let dir = scratch("acl");
    let mut holder = cronlock(&r)
        .env("CRONLOCK_REDIS_URL", &url)
        .args(["k", "-c"])
        .arg(format!("echo $$ > {}/pid; sleep 0.3", dir.display()))
        .spawn()
        .unwrap();
    read_pid(&dir.join("pid"));
    let out = as_user(&["-w", "10s", "k", "true"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    holder.wait().unwrap();
    // A scheduled run with catch-up and retries (the ledger), a skip, and the suspension.
    let scheduled = [
        "--schedule",
        "CRON_TZ=UTC 0 0 0 1 * *",
        "--catch-up",
        "100d",
        "--retries",
        "1",
        "-E",
        "75",
        "k",
        "true",
    ];
    assert_eq!(code(&as_user(&scheduled)), 0);
    let out = as_user(&scheduled);
    assert_eq!(code(&out), 75, "{}", stderr(&out));
    for mode in [
        &["--status", "k", "--history"][..],
        &["--list"],
        &["--suspend", "--reason", "acl", "k"],
        &["--list"],
        &["--status", "--json", "k"],
        &["--resume", "k"],
        &["--check", "k"],
        &["--force-release", "k"],
    ] {
        let out = as_user(mode);
        assert_eq!(code(&out), 0, "{mode:?}: {}", stderr(&out));
    }
    replica_as_user(&r, &url, &dir);
    // Keys outside the prefix are out of reach.
    let out = as_user(&["--prefix", "other:", "k", "true"]);
    assert_eq!(code(&out), 125);
    assert!(one_line(&out).contains("NOPERM"), "{}", stderr(&out));
}

/// A --crontab replica as the ACL's user (`url`): its claims, its heartbeats (members.lua) and
/// its runs' releases all go through.
fn replica_as_user(r: &Redis, url: &str, dir: &std::path::Path) {
    let ran = dir.join("ran");
    let file = dir.join("crontab");
    std::fs::write(
        &file,
        format!("* * * * * * aclcron touch {}\n", ran.display()),
    )
    .unwrap();
    let err_file = dir.join("replica.err");
    let replica = cronlock(r)
        .env("CRONLOCK_REDIS_URL", url)
        .args(["--log-format", "json", "--crontab"])
        .arg(&file)
        .stderr(std::fs::File::create(&err_file).unwrap())
        .spawn()
        .unwrap();
    let err = || std::fs::read_to_string(&err_file).unwrap_or_default();
    assert!(
        wait_for(Duration::from_secs(10), || ran.exists()
            && err().contains(r#""event":"run_ended""#)),
        "{}",
        err()
    );
    signal(replica.id() as i32, libc::SIGTERM);
    assert_eq!(exit_codes(vec![replica]), vec![0]);
    assert!(!err().contains("heartbeat_failed"), "{}", err());
    assert!(!err().contains("NOPERM"), "{}", err());
}

/// Started with its standard descriptors closed (a careless supervisor), cronlock opens them on
/// /dev/null first: the Redis socket must never become its "stderr" or "stdout", or its own
/// messages would be sent to Redis as commands.
#[test]
fn closed_standard_descriptors_never_become_the_redis_connection() {
    let r = Redis::start();
    let url = r.url();
    for closed in ["<&- >&- 2>&-", "2>&-", ">&-"] {
        let out = Command::new("sh")
            .arg("-c")
            .arg(format!(
                r#""$0" -v -u "$1" k -- sh -c 'echo out; echo err >&2' {closed}; echo "exit=$?""#
            ))
            .arg(bin())
            .arg(&url)
            .output()
            .unwrap();
        assert!(
            stdout(&out).ends_with("exit=0\n"),
            "{closed}: {}{}",
            stdout(&out),
            stderr(&out)
        );
        assert!(!r.exists(LOCK), "{closed}: the lock was not released");
    }
}
