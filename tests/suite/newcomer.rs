//! The newcomer's path: the quick start installs cronlock with its man page and completions, and
//! the crontab line it prints works as cron runs it (`/bin/sh -c` with `PATH=/usr/bin:/bin` and
//! nothing else). The build step is skipped (`BIN=`): the suite's binary is installed.

use std::process::Command;

use crate::common::*;

#[test]
fn the_quick_start_ends_in_a_working_crontab_line() {
    let prefix = scratch("quickstart-prefix");
    let port = free_port();
    let out = Command::new("bash")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/scripts/quickstart.sh"
        ))
        .env("BIN", bin())
        .env("PREFIX", &*prefix)
        .env("REDIS_PORT", port.to_string())
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    // Stop the demo Redis it started, whatever happens next.
    let stop = err
        .lines()
        .find_map(|l| l.split_once("stop it with: ").map(|(_, c)| c.to_string()));
    let _stopper = Stopper(stop);
    assert!(out.status.success(), "{err}");
    assert!(!err.contains('\u{1b}'), "colour without a terminal: {err}");
    for file in [
        "bin/cronlock",
        "share/man/man1/cronlock.1",
        "share/bash-completion/completions/cronlock",
        "share/zsh/site-functions/_cronlock",
        "share/fish/vendor_completions.d/cronlock.fish",
    ] {
        assert!(prefix.join(file).is_file(), "{file} not installed: {err}");
    }
    // man finds the page under the prefix.
    let man = Command::new("man")
        .env("MANPATH", prefix.join("share/man"))
        .args(["-w", "cronlock"])
        .output()
        .expect("man is required for the tests; ./scripts/test.sh installs man-db");
    assert!(
        man.status.success(),
        "{}",
        String::from_utf8_lossy(&man.stderr)
    );
    let line = err
        .lines()
        .find_map(|l| l.trim().strip_prefix("quickstart:   * * * * * "))
        .unwrap_or_else(|| panic!("no crontab line printed: {err}"))
        .to_string();
    assert!(
        line.contains(&format!("{}/bin/cronlock", prefix.display())),
        "{line}"
    );
    // As cron runs it.
    let ran = Command::new("env")
        .args(["-i", "PATH=/usr/bin:/bin", "/bin/sh", "-c", &line])
        .output()
        .unwrap();
    assert!(
        ran.status.success(),
        "{line}: {}",
        String::from_utf8_lossy(&ran.stderr)
    );
    assert!(!ran.stdout.is_empty(), "the job (date) printed nothing");
}

/// Runs the quick start's "stop it with" command when dropped.
struct Stopper(Option<String>);

impl Drop for Stopper {
    fn drop(&mut self) {
        if let Some(cmd) = &self.0 {
            let _ = Command::new("sh").args(["-c", cmd]).output();
        }
    }
}

#[test]
fn history_does_not_swallow_the_key() {
    let r = Redis::start();
    let out = run(cronlock(&r).args(["k", "true"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let out = run(cronlock(&r).args(["--status", "--json", "--history", "k"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v["key"], "k");
    assert_eq!(v["history"].as_array().map(Vec::len), Some(1), "{v}");
    // A command's own --history is never touched.
    let out = run(cronlock(&r).args(["k", "echo", "--history", "x"]));
    assert_eq!(stdout(&out), "--history x\n", "{}", stderr(&out));
    // The count still goes with a space, and unambiguously with '='.
    for args in [
        &["--status", "--history", "1", "k"][..],
        &["--status", "--history=1", "k"],
    ] {
        let out = run(cronlock(&r).args(args));
        assert_eq!(code(&out), 0, "{args:?}: {}", stderr(&out));
    }
}
