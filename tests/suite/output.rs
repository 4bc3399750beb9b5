//! `--keep-output`: what a run printed, kept with its record in Redis and shown by `--status`
//! and `--check`; the output itself still goes where it went, and a reader that goes away ends
//! the command as it would without cronlock.

use std::time::Duration;

use serde_json::Value;

use crate::common::*;

/// KEY's last run record, as `--status --json` shows it.
fn last_run(r: &Redis, key: &str) -> Value {
    let out = run(cronlock(r).args(["--status", "--json", key]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let doc: Value = serde_json::from_str(&stdout(&out)).unwrap();
    doc["last_run"].clone()
}

/// The kept lines of a record, as `STREAM LINE`.
fn kept(record: &Value) -> Vec<String> {
    record["output"]
        .as_array()
        .map(|lines| {
            lines
                .iter()
                .map(|l| {
                    format!(
                        "{} {}",
                        l["stream"].as_str().unwrap(),
                        l["line"].as_str().unwrap()
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// A command that prints `lines` numbered lines of 64 bytes on each stream, alternating, then
/// exits with `status`.
fn flood(lines: usize, status: i32) -> Vec<String> {
    let script = format!(
        "import sys\n\
         for i in range({lines}):\n\
         \x20   sys.stdout.write('out %07d %s\\n' % (i, 'o' * 51))\n\
         \x20   sys.stderr.write('err %07d %s\\n' % (i, 'e' * 51))\n\
         sys.stdout.flush()\n\
         sys.exit({status})\n"
    );
    vec!["python3".into(), "-c".into(), script]
}

#[test]
fn a_failed_runs_last_output_is_kept_whole_lines_both_streams_in_bounded_memory() {
    let r = Redis::start();
    // 1 MiB on each stream: 16,384 lines of 64 bytes.
    let mut m = cronlock_measured(&r.url());
    m.cmd.args(["flood", "--"]).args(flood(16_384, 3));
    let (out, status, rss) = m.run();
    assert_eq!(status, 3, "{}", stderr(&out));
    // The output still went where it goes, whole.
    assert_eq!(out.stdout.len(), 1 << 20);
    assert!(stderr(&out).contains("err 0016383"));
    let record = last_run(&r, "flood");
    let lines = kept(&record);
    // The default: the last 4 KiB, whole lines, both streams.
    let bytes: usize = lines.iter().map(|l| l.len() - "stdout ".len() + 1).sum();
    assert!(
        (4096 - 2 * 65..=4096).contains(&bytes),
        "{bytes} bytes: {lines:?}"
    );
    for l in &lines {
        let text = l.split_once(' ').unwrap().1;
        assert_eq!(text.len(), 63, "a cut line: {l}");
    }
    assert!(lines.iter().any(|l| l.starts_with("stdout out 0016383")));
    assert!(lines.iter().any(|l| l.starts_with("stderr err 0016383")));
    // Bounded memory: printing 2 MiB costs what printing nothing costs, within 1 MiB.
    let mut m = cronlock_measured(&r.url());
    m.cmd.args(["quiet", "--"]).args(flood(0, 3));
    let (_, status, quiet) = m.run();
    assert_eq!(status, 3);
    assert!(
        rss <= quiet + 1024,
        "peak RSS {rss} KiB printing 2 MiB, {quiet} KiB printing nothing"
    );
}

#[test]
fn a_success_keeps_nothing_unless_asked_and_zero_keeps_nothing() {
    let r = Redis::start();
    let out = run(cronlock(&r).args(["ok", "--", "echo", "fine"]));
    assert_eq!(code(&out), 0);
    assert_eq!(stdout(&out), "fine\n");
    assert!(last_run(&r, "ok").get("output").is_none());
    let out = run(cronlock(&r).args(["--keep-output", "1KiB,all", "all", "--", "echo", "fine"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(kept(&last_run(&r, "all")), ["stdout fine"]);
    let out =
        run(cronlock(&r)
            .env("CRONLOCK_KEEP_OUTPUT", "0")
            .args(["none", "-c", "echo no; exit 1"]));
    assert_eq!(code(&out), 1);
    assert!(last_run(&r, "none").get("output").is_none());
    for bad in ["65KiB", "4 parsecs", "4KiB,some"] {
        let out = run(cronlock(&r).args(["--keep-output", bad, "bad", "--", "true"]));
        assert_eq!(code(&out), 125, "{bad}");
        assert!(stderr(&out).contains("--keep-output"), "{}", stderr(&out));
    }
}

#[test]
fn status_and_check_show_what_a_failure_said_escaped() {
    let r = Redis::start();
    let out = run(cronlock(&r).args([
        "said",
        "--",
        "python3",
        "-c",
        "import sys; print('working'); sys.stdout.flush(); \
         sys.stderr.buffer.write(b'fatal: <disk> \\xff full\\x1b[0m\\n'); sys.exit(2)",
    ]));
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    let status = stdout(&run(cronlock(&r).args(["--status", "--history", "said"])));
    assert!(status.contains("    out | working\n"), "{status}");
    assert!(
        status.contains("    err | fatal: <disk> \\xff full\\x1b[0m\n"),
        "{status}"
    );
    assert!(!status.contains('\u{1b}'), "{status}");
    let check = run(cronlock(&r).args(["--check", "said"]));
    assert_eq!(code(&check), 2);
    assert!(
        stdout(&check).contains("said failed on ")
            && stdout(&check).contains("(exit 2, ")
            && stdout(&check).contains("): \"fatal: <disk> \\xff full\\x1b[0m\" |"),
        "{}",
        stdout(&check)
    );
}

/// `cronlock KEY -- yes | head -1` ends as `yes | head -1` does: when the reader goes away,
/// the command's next write fails (SIGPIPE), although its output passes through cronlock.
#[test]
fn a_reader_that_goes_away_ends_the_command_as_without_cronlock() {
    let r = Redis::start();
    let shell = format!(
        "'{}' yes-head -- yes | head -1; echo \"status ${{PIPESTATUS[0]}}\"",
        bin()
    );
    // Bounded: a command that never saw the reader go would run until `timeout` ends it.
    let out = std::process::Command::new("timeout")
        .args(["20", "bash", "-c", &shell])
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("CRONLOCK_REDIS_URL", r.url())
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert_eq!(stdout(&out), "y\nstatus 141\n", "{}", stderr(&out));
}

/// How many of process `pid`'s threads copy a command's output.
fn copying_threads(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|tasks| {
            tasks
                .flatten()
                .filter(|t| {
                    std::fs::read_to_string(t.path().join("comm"))
                        .is_ok_and(|c| c.trim() == "output")
                })
                .count()
        })
        .unwrap_or(0)
}

/// A command that has printed nothing costs no thread of cronlock's; once it writes, one thread
/// copies both streams, and both still arrive where they went (files here, so both are
/// captured for `--keep-output`), and are kept.
#[test]
fn output_is_copied_by_one_thread_started_once_the_command_writes() {
    let r = Redis::start();
    let dir = scratch("output-one-thread");
    let (ran, go, end) = (dir.join("ran"), dir.join("go"), dir.join("end"));
    let wait = |f: &std::path::Path| format!("while [ ! -e {} ]; do sleep 0.02; done", f.display());
    let script = format!(
        "touch {}; {}; echo to-out; echo to-err >&2; {}; exit 3",
        ran.display(),
        wait(&go),
        wait(&end)
    );
    let (out, err) = (dir.join("out"), dir.join("err"));
    let mut cmd = cronlock(&r);
    tie(&mut cmd);
    let mut child = cmd
        .args(["one-thread", "--", "sh", "-c", &script])
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let pid = child.id();
    assert!(wait_for(Duration::from_secs(10), || ran.exists()));
    assert_eq!(copying_threads(pid), 0, "a thread before any output");
    std::fs::write(&go, "").unwrap();
    let read = |f: &std::path::Path| std::fs::read_to_string(f).unwrap_or_default();
    assert!(wait_for(Duration::from_secs(10), || read(&out)
        == "to-out\n"
        && read(&err).contains("to-err\n")));
    assert_eq!(copying_threads(pid), 1, "one thread copies both streams");
    std::fs::write(&end, "").unwrap();
    assert_eq!(child.wait().unwrap().code(), Some(3));
    assert_eq!(
        kept(&last_run(&r, "one-thread")),
        ["stdout to-out", "stderr to-err"]
    );
}
