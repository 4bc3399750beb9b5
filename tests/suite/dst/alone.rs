//! The daylight-saving and crontab tests that measure time: each takes the cores for itself
//! while it measures (`common::alone`), and `scripts/test.sh` runs them after the others.

use super::*;

/// 100,000 `NAME=value` lines load in well under 3 s (it took 9 s: quadratic).
#[test]
fn many_assignments_load_in_linear_time() {
    let r = Redis::start();
    let dir = scratch("names");
    let mut text = String::with_capacity(1 << 20);
    for i in 0..100_000 {
        text += &format!("V{i}=1\n");
    }
    text += "0 0 1 1 * names true\n";
    let file = crontab(&dir, &text);
    let _alone = measure_alone();
    let started = Instant::now();
    let c = crate::common::replicas::replica(&r.url(), &file, &[]);
    assert!(
        wait_for(Duration::from_secs(10), || replica_err(&file)
            .contains("serving 1 jobs")),
        "{}",
        replica_err(&file)
    );
    let took = started.elapsed();
    assert_eq!(stop(c), Some(0));
    assert!(took < Duration::from_secs(3), "{took:?}");
}

/// SIGTERM while a replica reads a long file (30,000 job lines, each checked as a command line)
/// ends it at once, with SIGTERM's status and nothing served.
#[test]
fn sigterm_while_a_file_is_read_ends_the_replica_at_once() {
    let r = Redis::start();
    let dir = scratch("slowread");
    let mut text = String::with_capacity(1 << 20);
    for i in 0..30_000 {
        text += &format!("0 0 1 1 * j{i} true\n");
    }
    let file = crontab(&dir, &text);
    let _alone = measure_alone();
    let mut c = cronlock_at(&r.url())
        .arg("--crontab")
        .arg(&file)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // As soon as it runs: the file takes it far longer to read than this.
    assert!(wait_for(Duration::from_secs(5), || {
        std::fs::read_to_string(format!("/proc/{}/comm", c.id()))
            .is_ok_and(|n| n.starts_with("cronlock"))
    }));
    signal(c.id() as i32, libc::SIGTERM);
    let asked = Instant::now();
    assert!(wait_for(Duration::from_secs(5), || c
        .try_wait()
        .unwrap()
        .is_some()));
    let took = asked.elapsed();
    let status = c.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut c.stderr.take().unwrap(), &mut err).unwrap();
    if err.contains("serving") {
        // The machine read it all before the signal came: nothing to judge.
        return;
    }
    // 143: ended by SIGTERM (as its status, or as the signal itself).
    let by_term = std::os::unix::process::ExitStatusExt::signal(&status) == Some(libc::SIGTERM);
    assert!(status.code() == Some(143) || by_term, "{status:?}: {err}");
    assert!(took < Duration::from_millis(1500), "{took:?}");
}
