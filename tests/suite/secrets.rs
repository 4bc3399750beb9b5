//! Secrets out of command lines and environments, metrics files written safely, KEYs that cannot
//! hurt: the file forms of the URLs, symlinks planted in a world-writable metrics directory, an
//! over-long KEY, a KEY that tries to forge a line, look-alike KEYs.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use crate::common::*;

const PASSWORD: &str = "s3cret-from-a-file";
/// The plain forms' password: another, so that the file forms' scan of every process (the tests
/// run side by side) never finds the plain forms' cronlock, which holds its own in its variables.
const PLAIN_PASSWORD: &str = "s3cret-in-a-variable";

/// An HTTP endpoint on loopback that answers every request 200; it counts them.
fn http_ok() -> (u16, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = seen.clone();
    std::thread::spawn(move || {
        for mut s in listener.incoming().map_while(Result::ok) {
            let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let _ =
                s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        }
    });
    (port, seen)
}

/// Every process's command line and environment that holds `needle`.
fn processes_holding(needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().filter_map(Result::ok) {
        let name = entry.file_name();
        if !name.to_string_lossy().chars().all(|c| c.is_ascii_digit()) {
            continue;
        }
        for what in ["cmdline", "environ"] {
            let Ok(bytes) = std::fs::read(entry.path().join(what)) else {
                continue;
            };
            if bytes.windows(needle.len()).any(|w| w == needle.as_bytes()) {
                found.push(format!("{}/{what}", name.to_string_lossy()));
            }
        }
    }
    found
}

#[test]
fn the_file_forms_keep_secrets_out_of_every_process() {
    let r = Redis::with_password(PASSWORD);
    let (port, pings) = http_ok();
    let ping_url = format!("http://127.0.0.1:{port}/ping/secret-ping-uuid");
    let dir = scratch("secret-files");
    let url_file = dir.join("redis-url");
    std::fs::write(
        &url_file,
        format!("  redis://:{PASSWORD}@127.0.0.1:{}\n", r.port),
    )
    .unwrap();
    let ping_file = dir.join("ping-url");
    std::fs::write(&ping_file, format!("{ping_url}\n")).unwrap();
    let mut c = cronlock_at("");
    c.env_remove("CRONLOCK_REDIS_URL")
        .env("CRONLOCK_REDIS_URL_FILE", &url_file)
        .args(["--ping-url-file"])
        .arg(&ping_file)
        .args(["k", "sh", "-c"])
        .arg(format!(
            "echo $$ > {0}/pid; env > {0}/env; while [ ! -e {0}/go ]; do sleep 0.05; done",
            dir.display()
        ));
    let c = c.stderr(Stdio::piped()).spawn().unwrap();
    read_pid(&dir.join("pid"));
    // cronlock, its guard and the command are all running now.
    for needle in [PASSWORD, "secret-ping-uuid"] {
        let found = processes_holding(needle);
        assert!(found.is_empty(), "'{needle}' is readable in {found:?}");
    }
    let env = std::fs::read_to_string(dir.join("env")).unwrap();
    assert!(env.contains("CRONLOCK_REDIS_URL_FILE="), "{env}");
    assert!(!env.contains(PASSWORD), "{env}");
    std::fs::write(dir.join("go"), "").unwrap();
    let out = c.wait_with_output().unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(wait_for(Duration::from_secs(5), || pings
        .load(std::sync::atomic::Ordering::SeqCst)
        >= 2));
}

/// With the plain forms, the command still does not inherit cronlock's secret variables.
#[test]
fn the_command_does_not_inherit_cronlocks_secret_variables() {
    let r = Redis::with_password(PLAIN_PASSWORD);
    let (port, _) = http_ok();
    let dir = scratch("secret-env");
    let out = run(
        cronlock_at(&format!("redis://:{PLAIN_PASSWORD}@127.0.0.1:{}", r.port))
            .env(
                "CRONLOCK_PING_URL",
                format!("http://127.0.0.1:{port}/secret-ping-uuid"),
            )
            .args(["k", "sh", "-c"])
            .arg(format!("env > {}/env", dir.display())),
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let env = std::fs::read_to_string(dir.join("env")).unwrap();
    assert!(!env.contains(PLAIN_PASSWORD), "{env}");
    assert!(!env.contains("secret-ping-uuid"), "{env}");
    assert!(env.contains("CRONLOCK_KEY=k"), "{env}");
}

/// Arguments, variables, and what the one line must say.
type Case<'a> = (Vec<String>, Vec<(&'a str, &'a Path)>, &'a str);

#[test]
fn missing_unreadable_or_empty_files_are_one_line_naming_them() {
    let dir = scratch("secret-missing");
    let empty = dir.join("empty");
    std::fs::write(&empty, " \n").unwrap();
    let missing = dir.join("missing");
    let cases: Vec<Case> = vec![
        (
            vec![],
            vec![("CRONLOCK_REDIS_URL_FILE", &missing)],
            "CRONLOCK_REDIS_URL_FILE",
        ),
        (
            vec!["--redis-url-file".into(), missing.display().to_string()],
            vec![],
            "--redis-url-file",
        ),
        (
            vec![],
            vec![("CRONLOCK_REDIS_URL_FILE", &empty)],
            "is empty",
        ),
        (
            vec![],
            vec![("CRONLOCK_PING_URL_FILE", &missing)],
            "CRONLOCK_PING_URL_FILE",
        ),
    ];
    for (args, vars, says) in cases {
        let mut c = cronlock_at("redis://127.0.0.1:1");
        c.env_remove("CRONLOCK_REDIS_URL");
        for (k, v) in &vars {
            c.env(k, v);
        }
        let out = run(c.args(&args).args(["k", "touch"]).arg(dir.join("ran")));
        assert_eq!(code(&out), 125, "{says}: {}", stderr(&out));
        let line = one_line(&out);
        assert!(line.contains(says), "{line}");
        assert!(!dir.join("ran").exists());
    }
}

#[test]
fn the_same_url_twice_is_a_usage_error() {
    let url = "redis://:pw@127.0.0.1:1";
    let out = run(cronlock_at(url).args(["-u", url, "-u", url, "k", "true"]));
    assert_eq!(code(&out), 125, "{}", stderr(&out));
    let line = one_line(&out);
    assert!(line.contains("twice"), "{line}");
    assert!(!line.contains(":pw@"), "{line}");
}

/// Symlinks planted at every name cronlock could use for KEY's metrics (the final name and the
/// temporary names earlier versions used) in a world-writable directory, under umask 000: the
/// targets are untouched, and the metrics land in a regular 0644 file.
#[test]
fn planted_symlinks_do_not_redirect_the_metrics() {
    let r = Redis::start();
    let dir = scratch("metrics-symlinks");
    let metrics = dir.join("metrics");
    std::fs::create_dir(&metrics).unwrap();
    std::fs::set_permissions(&metrics, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let victim = dir.join("victim");
    std::fs::write(&victim, "precious\n").unwrap();
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).unwrap();
    let name = "cronlock_k.prom";
    for planted in [
        name.to_string(),
        format!(".{name}.tmp"),
        format!(".{name}.{}.tmp", std::process::id()),
    ] {
        std::os::unix::fs::symlink(&victim, metrics.join(planted)).unwrap();
    }
    for round in 0..2 {
        let mut c = cronlock(&r);
        // SAFETY: umask between fork and exec affects only the child.
        unsafe {
            c.pre_exec(|| {
                libc::umask(0);
                Ok(())
            })
        };
        let out = run(c.arg("--metrics-dir").arg(&metrics).args(["k", "true"]));
        assert_eq!(code(&out), 0, "round {round}: {}", stderr(&out));
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
        let meta = std::fs::symlink_metadata(metrics.join(name)).unwrap();
        assert!(
            meta.file_type().is_file(),
            "round {round}: not a regular file"
        );
        assert_eq!(meta.permissions().mode() & 0o7777, 0o644, "round {round}");
        let text = std::fs::read_to_string(metrics.join(name)).unwrap();
        assert!(text.contains("cronlock_last_run_exit_status"), "{text}");
    }
    // No temporary file left behind, none followed.
    let left: Vec<String> = std::fs::read_dir(&metrics)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp") && !n.starts_with(".cronlock_k.prom.tmp"))
        .filter(|n| *n != format!(".{name}.{}.tmp", std::process::id()))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn look_alike_keys_get_two_metrics_files() {
    let r = Redis::start();
    let dir = scratch("metrics-lookalike");
    for key in ["nightly/report", "nightly_report_dad8c7e1"] {
        let out = run(cronlock(&r)
            .arg("--metrics-dir")
            .arg(&*dir)
            .args([key, "true"]));
        assert_eq!(code(&out), 0, "{}", stderr(&out));
    }
    let files: Vec<_> = std::fs::read_dir(&*dir).unwrap().collect();
    assert_eq!(files.len(), 2, "{files:?}");
}

/// An over-long KEY is refused before any Redis call (the URL here would refuse to connect).
#[test]
fn an_over_long_key_is_refused_before_redis() {
    for len in [1025, 100_000] {
        let key = "k".repeat(len);
        let out = run(cronlock_at("redis://127.0.0.1:1").args([key.as_str(), "true"]));
        assert_eq!(code(&out), 125, "{}", stderr(&out));
        let line = one_line(&out);
        assert!(line.contains("KEY") && line.contains("1024"), "{line}");
        assert!(!line.contains("connect"), "{line}");
    }
    // At the bound, it runs.
    let r = Redis::start();
    let out = run(cronlock(&r).args([&"k".repeat(1024), "true"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
}

/// A KEY with a newline and escape codes cannot forge a `cronlock:` line or reach the terminal.
#[test]
fn a_key_cannot_forge_a_line() {
    let r = Redis::start();
    let key = "a\ncronlock: forged\u{1b}[2J";
    let out = run(cronlock(&r).args(["-v", key, "true"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.lines().all(|l| !l.starts_with("cronlock: forged")),
        "{err}"
    );
    assert!(!err.contains('\u{1b}'), "{err}");
    assert!(err.contains(r"a\ncronlock: forged\u{1b}[2J"), "{err}");
    // JSON lines stay valid JSON.
    let out = run(cronlock(&r).args(["-v", "--log-format", "json", key, "true"]));
    for line in stderr(&out).lines() {
        let v: serde_json::Value = serde_json::from_str(line).expect(line);
        assert_eq!(v["key"], key);
    }
}

/// A variable that is not UTF-8 is named.
#[test]
fn a_non_utf8_variable_is_named() {
    use std::os::unix::ffi::OsStrExt;
    let r = Redis::start();
    let out = run(cronlock(&r)
        .env("CRONLOCK_TTL", std::ffi::OsStr::from_bytes(b"3\xffs"))
        .args(["k", "true"]));
    assert_eq!(code(&out), 125, "{}", stderr(&out));
    assert!(one_line(&out).contains("CRONLOCK_TTL"), "{}", stderr(&out));
}

/// Every form of a secret seen echoed before: whitespace in the password, a percent-encoded or
/// capitalised query name, a URL without a scheme, a URL that does not parse. None of them is in
/// anything cronlock prints, in text, with -v, as JSON, in the admin modes, from the variable or
/// from the file.
#[test]
fn no_form_of_a_secret_is_ever_printed() {
    let dir = scratch("secret-forms");
    let urls = [
        "redis://:hunter2 S3cr3t@127.0.0.1:1",
        "redis://:hunter2\tS3cr3t@127.0.0.1:1",
        "redis+unix:///nonexistent/redis.sock?pa%73s=S3cr3t&db=99",
        "redis+unix:///nonexistent/redis.sock?PASS=S3cr3t",
        "redis+unix:///nonexistent/redis.sock?Password=S3cr3t",
        "S3cr3t",
        "hunter2:S3cr3t",
        "redis://:S3cr3t@",
        "redis://:S3cr3t@h:99999",
        "redis+sentinel://:S3cr3t@",
        "redis+cluster://:S3cr3t@h/1",
        "rediss+unix:///s?pass=S3cr3t",
    ];
    let modes: [&[&str]; 6] = [
        &["k", "true"],
        &["-v", "k", "true"],
        &["-v", "--log-format", "json", "k", "true"],
        &["--status", "k"],
        &["--status", "--json", "k"],
        &["--list", "--json"],
    ];
    for url in urls {
        std::fs::write(dir.join("url"), url).unwrap();
        for mode in modes {
            let from_var = run(cronlock_at(url)
                .args(["--connect-timeout", "1s"])
                .args(mode));
            let from_file = run(cronlock_at("redis://unused")
                .env_remove("CRONLOCK_REDIS_URL")
                .env("CRONLOCK_REDIS_URL_FILE", dir.join("url"))
                .args(["--connect-timeout", "1s"])
                .args(mode));
            for out in [from_var, from_file] {
                assert_eq!(code(&out), 125, "{url:?} {mode:?}: {}", stderr(&out));
                let all = format!("{}{}", stdout(&out), stderr(&out));
                assert!(
                    !all.contains("S3cr3t") && !all.contains("hunter2"),
                    "{url:?} {mode:?}: {all}"
                );
            }
        }
    }
}

/// A crontab header's CRONLOCK_REDIS_URL_FILE and a line's own setting: a flag on the line wins
/// over either variable; both variables, or both flags, are refused in one line naming them.
#[test]
fn the_url_and_the_url_file_combine_as_a_user_expects() {
    let r = Redis::start();
    let dir = scratch("url-sources");
    std::fs::write(dir.join("good"), r.url()).unwrap();
    std::fs::write(dir.join("bad"), "redis://127.0.0.1:1").unwrap();
    // -u on the line beats the header's file.
    let out = run(cronlock_at(&r.url())
        .env_remove("CRONLOCK_REDIS_URL")
        .env("CRONLOCK_REDIS_URL_FILE", dir.join("bad"))
        .args(["-u", &r.url(), "k", "true"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    // --redis-url-file on the line beats the variable.
    let out = run(cronlock_at("redis://127.0.0.1:1")
        .arg("--redis-url-file")
        .arg(dir.join("good"))
        .args(["k", "true"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    // Both variables: one line naming both.
    let out = run(cronlock_at(&r.url())
        .env("CRONLOCK_REDIS_URL_FILE", dir.join("good"))
        .args(["k", "true"]));
    assert_eq!(code(&out), 125, "{}", stderr(&out));
    let line = one_line(&out);
    assert!(
        line.contains("CRONLOCK_REDIS_URL and CRONLOCK_REDIS_URL_FILE"),
        "{line}"
    );
    // Both flags.
    let out = run(cronlock_at(&r.url())
        .args(["-u", &r.url(), "--redis-url-file"])
        .arg(dir.join("good"))
        .args(["k", "true"]));
    assert_eq!(code(&out), 125, "{}", stderr(&out));
    assert!(
        one_line(&out).contains("--redis-url and --redis-url-file"),
        "{}",
        stderr(&out)
    );
    // --help's usage lines name KEY required where it is; its argument says which modes do
    // without (--list, --next, --crontab), so it is listed as optional.
    let help = stdout(&run(cronlock(&r).arg("--help")));
    assert!(
        help.contains("Usage: cronlock [OPTIONS] <KEY> [--] <COMMAND> [ARGS]..."),
        "{help}"
    );
    assert!(help.lines().any(|l| l.trim() == "[KEY]"), "{help}");
    assert!(
        help.contains("Every mode needs it but --list, --next and --crontab"),
        "{help}"
    );
    // A mistyped flag gets a suggestion.
    let out = run(cronlock(&r).args(["--ttll", "5s", "k", "true"]));
    assert_eq!(code(&out), 125);
    assert!(
        one_line(&out).contains("a similar argument exists: '--ttl'"),
        "{}",
        stderr(&out)
    );
}
