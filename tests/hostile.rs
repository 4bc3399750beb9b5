//! Bad servers: every Redis call has a deadline for its whole reply and a bound on its size, a
//! reply of the wrong shape is a failure, and a refusal that asking again cannot mend ends a
//! `--wait` at once. The server misbehaves through a loopback proxy in front of a real Redis
//! ([`Hostile`]).

mod common;

use std::time::{Duration, Instant};

use common::*;

const LOCK: &str = "cronlock:{k}";
/// cronlock's peak RSS must stay under this whatever the server sends.
const MAX_RSS_KIB: i64 = 16 * 1024;

fn no_panic(err: &str) {
    assert!(!err.contains("panicked"), "{err}");
    assert!(!err.contains("memory allocation"), "{err}");
    assert!(!err.contains("RUST_BACKTRACE"), "{err}");
}

/// An acquire through `proxy` in `mischief` mode: 125, one line, quickly, nothing ran, no lock.
fn acquire_fails(mischief: Mischief, within: Duration) -> String {
    let r = Redis::start_tcp();
    let proxy = Hostile::start(r.port);
    proxy.set(mischief);
    let dir = scratch("hostile-acquire");
    let marker = dir.join("ran");
    let t = Instant::now();
    let (out, code, rss) = run_measured(
        cronlock_at(&proxy.url())
            .args(["--connect-timeout", "1s", "k", "touch"])
            .arg(&marker),
    );
    let took = t.elapsed();
    let err = stderr(&out);
    no_panic(&err);
    assert_eq!(code, 125, "{mischief:?}: {err}");
    assert_eq!(own_lines(&err).len(), 1, "{mischief:?}: {err}");
    assert!(took < within, "{mischief:?}: took {took:?}");
    assert!(rss < MAX_RSS_KIB, "{mischief:?}: peak RSS {rss} KiB");
    assert!(!marker.exists(), "{mischief:?}: the command ran");
    assert!(
        wait_for(Duration::from_secs(2), || !r.exists(LOCK)),
        "{mischief:?}: a lock was left behind"
    );
    err
}

/// Acquire + undo, each bounded by --connect-timeout: 2 s, plus the exit.
#[test]
fn a_dripped_acquire_reply_times_out() {
    let err = acquire_fails(Mischief::Drip, Duration::from_millis(3500));
    assert!(err.contains("did not answer in time"), "{err}");
}

#[test]
fn a_huge_acquire_reply_is_refused_at_once() {
    let err = acquire_fails(Mischief::Huge, Duration::from_secs(2));
    assert!(err.contains("larger than"), "{err}");
}

#[test]
fn a_wrong_shaped_acquire_reply_is_not_a_lock() {
    for m in [Mischief::Ok, Mischief::True] {
        let err = acquire_fails(m, Duration::from_secs(2));
        assert!(err.contains("did not answer like a Redis server"), "{err}");
    }
}

/// A job through `proxy`, turned to `mischief` once it runs: the job is stopped (122) before
/// the lock's validity (TTL 3 s from the last confirmed renewal) ends, and cronlock exits within
/// the TTL plus --connect-timeout of the mischief, with a bounded peak RSS.
fn renewal_fails(mischief: Mischief) -> String {
    let r = Redis::start_tcp();
    let proxy = Hostile::start(r.port);
    let dir = scratch("hostile-renew");
    let ttl = Duration::from_secs(3);
    let mut cmd = cronlock_at(&proxy.url());
    cmd.args(["--ttl", "3s", "--connect-timeout", "1s", "k", "sh", "-c"])
        .arg(format!("echo $$ > {}/pid; exec sleep 30", dir.display()));
    let measured = std::thread::spawn(move || run_measured(&mut cmd));
    let job = read_pid(&dir.join("pid"));
    let turned = Instant::now();
    proxy.set(mischief);
    let mut died = None;
    assert!(
        wait_for(Duration::from_secs(10), || {
            died = (!alive(job)).then(Instant::now);
            died.is_some()
        }),
        "{mischief:?}: the job outlived the lock"
    );
    let died = died.unwrap() - turned;
    let (out, code, rss) = measured.join().unwrap();
    let exited = turned.elapsed();
    let err = stderr(&out);
    no_panic(&err);
    assert_eq!(code, 122, "{mischief:?}: {err}");
    assert!(died < ttl, "{mischief:?}: the job died {died:?} after");
    assert!(
        exited < ttl + Duration::from_millis(1500),
        "{mischief:?}: cronlock exited {exited:?} after"
    );
    assert!(rss < MAX_RSS_KIB, "{mischief:?}: peak RSS {rss} KiB");
    assert!(err.contains("lock lost"), "{mischief:?}: {err}");
    err
}

#[test]
fn a_dripped_renewal_reply_stops_the_job_in_time() {
    renewal_fails(Mischief::Drip);
}

#[test]
fn a_huge_renewal_reply_stops_the_job_in_time() {
    renewal_fails(Mischief::Huge);
}

/// `+OK` and RESP3 `#t` are not "still ours".
#[test]
fn a_wrong_shaped_renewal_reply_is_not_a_renewal() {
    for m in [Mischief::Ok, Mischief::True] {
        renewal_fails(m);
    }
}

/// Refusals that asking again cannot mend end `--wait` at once: 125, one line.
#[test]
fn permanent_refusals_end_a_wait_at_once() {
    let r = Redis::with_password("right");
    let base = format!("127.0.0.1:{}", r.port);
    let cases = [
        (format!("redis://:wrong@{base}"), "WRONGPASS"),
        (format!("redis://{base}"), "password"),
        (format!("redis://:right@{base}/99"), "DB index"),
    ];
    for (url, says) in cases {
        let t = Instant::now();
        let out = run(cronlock_at(&url).args(["--wait", "1m", "k", "true"]));
        let err = stderr(&out);
        no_panic(&err);
        assert_eq!(code(&out), 125, "{says}: {err}");
        assert!(
            t.elapsed() < Duration::from_secs(1),
            "{says}: {:?}",
            t.elapsed()
        );
        let line = one_line(&out);
        assert!(line.contains(says), "{line}");
        assert!(
            !line.contains("wrong@") && !line.contains("right@"),
            "{line}"
        );
    }
    // An ACL that does not allow the scripts: a refusal too.
    let r = Redis::start_tcp();
    r.query::<()>(
        redis::cmd("ACL")
            .arg("SETUSER")
            .arg("noscripts")
            .arg("on")
            .arg(">pw")
            .arg("~*")
            .arg("+@all")
            .arg("-evalsha")
            .arg("-eval"),
    );
    let t = Instant::now();
    let out = run(
        cronlock_at(&format!("redis://noscripts:pw@127.0.0.1:{}", r.port))
            .args(["--wait", "1m", "k", "true"]),
    );
    assert_eq!(code(&out), 125, "{}", stderr(&out));
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    assert!(one_line(&out).contains("NOPERM"), "{}", stderr(&out));
}

/// The sentinel lookup is bounded too: a dripping "sentinel" costs --connect-timeout, no more.
#[test]
fn a_dripping_sentinel_is_bounded() {
    let r = Redis::start_tcp();
    let proxy = Hostile::start(r.port);
    proxy.set(Mischief::Drip);
    let t = Instant::now();
    let url = format!("redis+sentinel://127.0.0.1:{}/svc", proxy.port);
    let out = run(cronlock_at(&url).args(["--connect-timeout", "1s", "k", "true"]));
    assert_eq!(code(&out), 125, "{}", stderr(&out));
    assert!(
        t.elapsed() < Duration::from_millis(2500),
        "{:?}",
        t.elapsed()
    );
    assert!(one_line(&out).contains("'svc'"), "{}", stderr(&out));
}
