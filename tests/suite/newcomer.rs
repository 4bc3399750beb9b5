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
    // How it says to see what the line did: the run is there.
    let check = err
        .lines()
        .find_map(|l| {
            l.split_once("with: ")
                .map(|(_, c)| c.to_string())
                .filter(|c| c.contains("--status"))
        })
        .unwrap_or_else(|| panic!("no way to check the line's run is given: {err}"));
    let check = check.replacen("cronlock", &format!("{}/bin/cronlock", prefix.display()), 1);
    let seen = Command::new("sh").args(["-c", &check]).output().unwrap();
    let text = String::from_utf8_lossy(&seen.stdout).into_owned();
    assert!(
        seen.status.success() && text.contains("exited with status 0"),
        "{check}: {text}"
    );
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

/// The README's example crontab, pasted as the README says: the URL file made by its commands
/// (in a scratch directory instead of /etc/cronlock, without sudo, the test's Redis as the URL),
/// then each line run once as cron runs it (`/bin/sh -c` with the crontab's variables and nothing
/// else). Each reaches Redis and its run is recorded, as `--status` shows (the commands
/// themselves are not on this machine: 127), so the README and its example cannot drift apart.
#[test]
fn the_readmes_example_crontab_runs_as_pasted() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let examples = readme.split("## Examples").nth(1).unwrap();
    let blocks: Vec<&str> = examples.split("```").skip(1).step_by(2).collect();
    let setup = blocks
        .iter()
        .find_map(|b| {
            b.strip_prefix("sh\n")
                .filter(|b| b.contains("/etc/cronlock/redis-url"))
        })
        .expect("the README shows how to make the URL file");
    let table = blocks
        .iter()
        .find(|b| b.starts_with('\n') && b.contains("CRONLOCK_REDIS_URL_FILE=/etc/cronlock/"))
        .expect("the README's example crontab");
    let r = Redis::start();
    let dir = scratch("readme-crontab");
    let etc = dir.join("etc-cronlock");
    let here = |text: &str| text.replace("/etc/cronlock", etc.to_str().unwrap());
    let made = Command::new("sh")
        .arg("-c")
        .arg(here(&setup.replace("sudo ", "").replace(
            "redis://:PASSWORD@redis.example.com:6379",
            &r.url(),
        )))
        .output()
        .unwrap();
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(etc.join("redis-url"))
            .unwrap()
            .permissions(),
    );
    assert_eq!(mode & 0o777, 0o600, "the URL file is readable by others");
    // cronlock where the crontab's PATH finds it.
    let bin_dir = dir.join("bin");
    std::fs::create_dir(&bin_dir).unwrap();
    std::os::unix::fs::symlink(bin(), bin_dir.join("cronlock")).unwrap();
    let mut vars: Vec<String> = Vec::new();
    let mut ran = 0;
    for line in table.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields[0].contains('=') {
            let var = here(line);
            vars.push(match var.strip_prefix("PATH=") {
                Some(path) => format!("PATH={}:{path}", bin_dir.display()),
                None => var,
            });
            continue;
        }
        let command = fields[5..].join(" ");
        let out = Command::new("env")
            .arg("-i")
            .args(&vars)
            .args(["/bin/sh", "-c", &command])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_ne!(out.status.code(), Some(125), "{line}: {err}");
        let key = key_of(&fields[5..]);
        let status = run(cronlock_at(&r.url()).args(["--status", "--json", key]));
        let v: serde_json::Value = serde_json::from_str(&stdout(&status)).unwrap();
        assert!(v["last_run"].is_object(), "{line}: no run recorded: {err}");
        ran += 1;
    }
    assert!(ran >= 2, "only {ran} crontab lines in the README's example");
}

/// The KEY of a `cronlock [OPTIONS] KEY ...` command line.
fn key_of<'a>(words: &[&'a str]) -> &'a str {
    let mut i = words.iter().position(|w| w.ends_with("cronlock")).unwrap() + 1;
    while words[i].starts_with('-') {
        // The short options that take a value.
        i += if ["-t", "-w", "-u", "-E"].contains(&words[i]) {
            2
        } else {
            1
        };
    }
    words[i]
}
