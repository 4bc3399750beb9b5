//! Bad servers: every Redis call has a deadline for its whole reply and a bound on its size, a
//! reply of the wrong shape is a failure, and a refusal that asking again cannot mend ends a
//! `--wait` at once. The server misbehaves through a loopback proxy in front of a real Redis
//! ([`Hostile`]).

use std::time::{Duration, Instant};

use crate::common::*;

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
    let _alone = measure_alone();
    let t = Instant::now();
    let mut measured = cronlock_measured(&proxy.url());
    measured
        .cmd
        .args(["--connect-timeout", "1s", "k", "touch"])
        .arg(&marker);
    let (out, code, rss) = measured.run();
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

/// A job through `proxy`, turned to `mischief` once it runs: the job is stopped (122) before
/// the lock's validity (TTL 3 s from the last confirmed renewal) ends, and cronlock exits within
/// the TTL plus --connect-timeout of the mischief, with a bounded peak RSS.
fn renewal_fails(mischief: Mischief) -> String {
    let r = Redis::start_tcp();
    let proxy = Hostile::start(r.port);
    let dir = scratch("hostile-renew");
    let ttl = Duration::from_secs(3);
    // Alone from before the start: a wait for the other tests could outlast the job.
    let _alone = measure_alone();
    let mut measured = cronlock_measured(&proxy.url());
    measured
        .cmd
        .args(["--ttl", "3s", "--connect-timeout", "1s", "k", "sh", "-c"])
        .arg(format!("echo $$ > {}/pid; exec sleep 30", dir.display()));
    let measured = std::thread::spawn(move || measured.run());
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
        // Far under the minute of the wait: not asked again.
        assert!(
            t.elapsed() < Duration::from_secs(5),
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
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert!(one_line(&out).contains("NOPERM"), "{}", stderr(&out));
}

/// Frames nobody asked for: an extra integer, a RESP3 push, a RESP3 attribute.
const UNASKED: [&[u8]; 3] = [
    b":0\r\n",
    b">2\r\n$10\r\ninvalidate\r\n*0\r\n",
    b"|1\r\n+ttl\r\n:3600\r\n",
];

/// A job that records, when it runs, who holds the lock in Redis and which fencing token Redis
/// handed out last, beside what cronlock told it.
fn witness(r: &Redis, dir: &std::path::Path) -> String {
    let cli = format!("{} -s {}", cli_bin(), r.sock.display());
    format!(
        "cd {} && {cli} GET 'cronlock:{{k}}' > holder && {cli} GET 'cronlock:{{k}}:fence' > fence \
         && echo \"$CRONLOCK_TOKEN\" > token && echo \"$CRONLOCK_FENCING_TOKEN\" > granted",
        dir.display()
    )
}

/// The job ran under a lock that Redis really gave to this run.
fn ran_with_the_lock(dir: &std::path::Path, what: &str) {
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap_or_default();
    let token = read("token");
    assert!(!token.trim().is_empty(), "{what}: the job did not run");
    assert!(
        read("holder").contains(token.trim()),
        "{what}: the job ran while Redis's lock was {:?}, not this run's",
        read("holder")
    );
    assert_eq!(
        read("fence").trim(),
        read("granted").trim(),
        "{what}: the fencing token the job got is not the one Redis handed out"
    );
}

/// An unasked frame before, after or late after every acquire reply: never a grant. 125, one
/// line, the command never ran, and the undo (on a fresh connection) left no lock behind.
#[test]
fn unasked_frames_at_the_acquire_never_grant_the_lock() {
    let r = Redis::start_tcp();
    let proxy = Hostile::start(r.port);
    for frame in UNASKED {
        for mischief in [
            Mischief::Before(frame),
            Mischief::After(frame),
            Mischief::Late(frame),
        ] {
            let what = format!("{mischief:?}");
            proxy.set(mischief);
            let dir = scratch("unasked-acquire");
            let out = run(cronlock_at(&proxy.url())
                .args(["--connect-timeout", "1s", "k", "-c"])
                .arg(witness(&r, &dir)));
            let err = stderr(&out);
            no_panic(&err);
            if code(&out) == 0 {
                // A late frame arrives after a whole, well-shaped reply: the grant was real.
                assert!(matches!(mischief, Mischief::Late(_)), "{what}: {err}");
                ran_with_the_lock(&dir, &what);
            } else {
                assert_eq!(code(&out), 125, "{what}: {err}");
                assert_eq!(own_lines(&err).len(), 1, "{what}: {err}");
                assert!(!dir.join("token").exists(), "{what}: the command ran");
            }
            assert!(
                wait_for(Duration::from_secs(2), || !r.exists(LOCK)),
                "{what}: a lock was left behind"
            );
        }
    }
}

/// The attack seen in the wild: one acquire answered by a frame of the wrong shape before the
/// real reply, under --wait. The connection is dropped unread; the undo and the next attempt go
/// on fresh connections, and the command runs only under the lock Redis really gave it.
#[test]
fn a_stale_frame_at_the_acquire_is_never_read_as_a_later_grant() {
    let r = Redis::start_tcp();
    let proxy = Hostile::start(r.port);
    for frame in [&b":7\r\n"[..], b":0\r\n", UNASKED[1], UNASKED[2]] {
        let what = String::from_utf8_lossy(frame).into_owned();
        proxy.set(Mischief::BeforeOnce(frame));
        let dir = scratch("stale-grant");
        let out = run(cronlock_at(&proxy.url())
            .args(["--connect-timeout", "1s", "--wait", "5s", "k", "-c"])
            .arg(witness(&r, &dir)));
        assert_eq!(code(&out), 0, "{what}: {}", stderr(&out));
        ran_with_the_lock(&dir, &what);
        assert!(!r.exists(LOCK), "{what}: a lock was left behind");
    }
}

/// At the release, in a wait and in the admin modes: a frame nobody asked for is a failure of
/// that call, said in one line, never a wrong answer; the lock is gone after the release (the
/// script ran; only its reply was spoiled).
#[test]
fn unasked_frames_at_release_wait_and_admin() {
    let r = Redis::start_tcp();
    let proxy = Hostile::start(r.port);
    // Release: the job waits for the test, which spoils replies just before it ends. The server
    // is broken, so the release fails: one line that says the lock will expire, and it does.
    let dir = scratch("unasked-release");
    let mut cmd = cronlock_at(&proxy.url());
    cmd.args(["--connect-timeout", "1s", "--ttl", "10s", "k"]);
    let holder = spawn_holding(&mut cmd, &dir);
    proxy.set(Mischief::After(UNASKED[0]));
    std::fs::write(dir.join("go"), "").unwrap();
    let out = holder.wait_with_output().unwrap();
    let err = stderr(&out);
    no_panic(&err);
    assert_eq!(own_lines(&err).len(), 1, "{err}");
    assert!(
        err.contains("cannot release") && err.contains("expire"),
        "{err}"
    );
    let left = r.pttl(LOCK);
    assert!(
        left == -2 || (0..=10_000).contains(&left),
        "the lock would not expire: {left}"
    );
    r.del(LOCK);
    // Admin modes: one line, 125, never a made-up answer.
    for args in [
        &["--status", "k"][..],
        &["--force-release", "k"],
        &["--list"],
    ] {
        let out = run(cronlock_at(&proxy.url())
            .args(["--connect-timeout", "1s"])
            .args(args));
        no_panic(&stderr(&out));
        assert_eq!(code(&out), 125, "{args:?}: {}", stderr(&out));
        assert_eq!(
            own_lines(&stderr(&out)).len(),
            1,
            "{args:?}: {}",
            stderr(&out)
        );
    }
    // Wait: the BLPOP replies spoiled while another holds the lock; then a clean release.
    proxy.set(Mischief::Pass);
    let held = scratch("unasked-wait-holder");
    let mut direct = cronlock(&r);
    direct.arg("k");
    let other = spawn_holding(&mut direct, &held);
    let dir = scratch("unasked-wait");
    let mut waiter = cronlock_at(&proxy.url());
    waiter
        .args(["--connect-timeout", "1s", "--wait", "20s", "k", "-c"])
        .arg(witness(&r, &dir))
        .stderr(std::process::Stdio::piped());
    proxy.set(Mischief::Late(UNASKED[0]));
    let spoiled = proxy.replies();
    let waiter = waiter.spawn().unwrap();
    // Several spoiled replies to the waiter (its acquire attempts and BLPOPs).
    assert!(
        wait_for(Duration::from_secs(10), || proxy.replies() >= spoiled + 4),
        "the waiter did not ask"
    );
    proxy.set(Mischief::Pass);
    std::fs::write(held.join("go"), "").unwrap();
    assert_eq!(code(&other.wait_with_output().unwrap()), 0);
    let out = waiter.wait_with_output().unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    ran_with_the_lock(&dir, "wait");
}

mod alone {
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
        let dns = std::net::UdpSocket::bind((ip.as_str(), 53)).unwrap_or_else(|e| {
            panic!("cannot bind a UDP socket on {ip}:53 for the resolver: {e}")
        });
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
}

/// A reply lost (the server too slow to answer within `--connect-timeout`, the script run all
/// the same) is undone whatever lock the grant held: a `--limit 2` slot (`KEY:slot:N`), an
/// `--overlap allow` instant's own lock (`KEY:at:INSTANT`). Before, the undo deleted the plain
/// KEY and the grant stayed for its TTL (30 s), counting against the limit with nothing running.
#[test]
fn a_lost_reply_undoes_a_slot_and_an_instants_own_lock() {
    let r = Redis::start_tcp();
    let proxy = Hostile::start(r.port);
    proxy.set(Mischief::Drip);
    let dir = scratch("hostile-lost-grant");
    let marker = dir.join("ran");
    let attempts: [&[&str]; 2] = [
        &["--limit", "2"],
        &["--schedule", "* * * * * *", "--overlap", "allow"],
    ];
    for args in attempts {
        // (Run once straight to the server first: its scripts are then cached there, and the
        // slow one runs its script at once, as a server that answers late does.)
        let out = run(cronlock_at(&r.url()).args(args).args(["k", "true"]));
        assert_eq!(code(&out), 0, "{args:?}: {}", stderr(&out));
        let out = run(cronlock_at(&proxy.url())
            .args(["--connect-timeout", "500ms"])
            .args(args)
            .arg("k")
            .arg("touch")
            .arg(&marker));
        assert_eq!(code(&out), 125, "{args:?}: {}", stderr(&out));
        assert!(!marker.exists(), "{args:?}: the command ran");
        let held = || -> Vec<String> {
            r.keys()
                .into_iter()
                .filter(|k| {
                    k.starts_with(&format!("{LOCK}:slot:")) || k.starts_with(&format!("{LOCK}:at:"))
                })
                .collect()
        };
        assert!(
            wait_for(Duration::from_secs(3), || held().is_empty()),
            "{args:?}: {:?}",
            held()
        );
    }
}
