//! The hostile tests that measure time: each takes the cores for itself while it measures
//! (`common::alone`), and `scripts/test.sh` runs them after the others.

use super::*;

/// The sentinel lookup is bounded too: a dripping "sentinel" costs --connect-timeout, no more.
#[test]
fn a_dripping_sentinel_is_bounded() {
    let _alone = measure_alone();
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

/// A name whose resolver never answers: the look-up is bounded by --connect-timeout like the
/// rest of the conversation (the C library alone would wait 5 s per try). The resolver is a
/// loopback UDP socket that reads queries and answers none, named in a private resolv.conf that
/// a mount namespace puts over /etc/resolv.conf (as root; CI runs the tests as root).
#[test]
fn a_resolver_that_never_answers_is_bounded() {
    let _alone = measure_alone();
    let dir = scratch("resolver");
    let ip = format!(
        "127.53.{}.{}",
        std::process::id() % 250 + 1,
        free_port() % 250 + 1
    );
    let dns = std::net::UdpSocket::bind((ip.as_str(), 53))
        .unwrap_or_else(|e| panic!("cannot bind a UDP socket on {ip}:53 for the resolver: {e}"));
    dns.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let asked = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let (counter, stop) = (
        asked.clone(),
        std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false)),
    );
    let stopped = stop.clone();
    let listener = std::thread::spawn(move || {
        let mut buf = [0u8; 512];
        while !stopped.load(std::sync::atomic::Ordering::SeqCst) {
            if dns.recv_from(&mut buf).is_ok() {
                counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        }
    });
    let resolv = dir.join("resolv.conf");
    std::fs::write(
        &resolv,
        format!("nameserver {ip}\noptions timeout:5 attempts:2\n"),
    )
    .unwrap();
    let dummy = Redis::start();
    let marker = dir.join("ran");
    let mut ns = under_resolver(&resolv, cronlock(&dummy), &marker);
    let t = Instant::now();
    let out = run(&mut ns);
    let took = t.elapsed();
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    listener.join().unwrap();
    let err = stderr(&out);
    no_panic(&err);
    assert!(
        !err.contains("mount:") && !err.contains("unshare:"),
        "the test's own set-up failed: {err}"
    );
    assert_eq!(code(&out), 125, "{err}");
    assert!(
        one_line(&out).contains("redis.cronlock-test.invalid"),
        "{err}"
    );
    assert!(took < Duration::from_millis(3500), "took {took:?}");
    assert!(!marker.exists(), "the command ran");
    assert!(
        asked.load(std::sync::atomic::Ordering::SeqCst) > 0,
        "the resolver was never asked: the test did not test the look-up"
    );
}

/// `cmd` (a cronlock, its environment kept) in a mount namespace where `resolv` is
/// /etc/resolv.conf, asked to lock `k` at a name only a resolver can answer for, and to touch
/// `marker` if it ran.
fn under_resolver(
    resolv: &std::path::Path,
    cmd: std::process::Command,
    marker: &std::path::Path,
) -> std::process::Command {
    let program = cmd.get_program().to_owned();
    let envs: Vec<_> = cmd
        .get_envs()
        .map(|(k, v)| (k.to_owned(), v.map(|v| v.to_owned())))
        .collect();
    let mut ns = std::process::Command::new("unshare");
    ns.args([
        "-m",
        "sh",
        "-c",
        "mount --bind \"$0\" /etc/resolv.conf && exec \"$@\"",
    ])
    .arg(resolv)
    .arg(program)
    .args([
        "-u",
        "redis://redis.cronlock-test.invalid:6379",
        "--connect-timeout",
        "1s",
    ])
    .args(["k", "touch"])
    .arg(marker)
    .stdin(std::process::Stdio::null());
    for (k, v) in envs {
        match v {
            Some(v) => ns.env(k, v),
            None => ns.env_remove(k),
        };
    }
    ns.env_remove("CRONLOCK_REDIS_URL");
    ns
}

/// A Unix socket whose listener never accepts (its queue full): the connect is bounded by
/// --connect-timeout too.
#[test]
fn a_unix_socket_that_never_accepts_is_bounded() {
    let _alone = measure_alone();
    use nix::sys::socket::{
        bind, listen, socket, AddressFamily, Backlog, SockFlag, SockType, UnixAddr,
    };
    let dir = scratch("backlog");
    let path = dir.join("full.sock");
    let listener = socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .unwrap();
    bind(
        std::os::fd::AsRawFd::as_raw_fd(&listener),
        &UnixAddr::new(&path).unwrap(),
    )
    .unwrap();
    listen(&listener, Backlog::new(0).unwrap()).unwrap();
    // The one connection a backlog of 0 queues; the next one waits for an accept that never comes.
    let _queued = std::os::unix::net::UnixStream::connect(&path).unwrap();
    let marker = dir.join("ran");
    let t = Instant::now();
    let out = run(cronlock_at(&format!("redis+unix://{}", path.display()))
        .args(["--connect-timeout", "1s", "k", "touch"])
        .arg(&marker));
    let took = t.elapsed();
    let err = stderr(&out);
    no_panic(&err);
    assert_eq!(code(&out), 125, "{err}");
    one_line(&out);
    assert!(took < Duration::from_millis(3500), "took {took:?}");
    assert!(!marker.exists(), "the command ran");
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

/// A renewal reply preceded by `:1` ("still ours") or followed by a frame: never a confirmed
/// renewal, whichever frame would be read next. The job is stopped (122) before the lock could
/// lapse.
#[test]
fn unasked_frames_at_renewals_never_confirm_one() {
    renewal_fails(Mischief::Before(b":1\r\n"));
    renewal_fails(Mischief::After(UNASKED[0]));
}
