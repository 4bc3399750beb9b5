//! The tls tests that measure time: each takes the cores for itself while it measures
//! (`common::alone`), and `scripts/test.sh` runs them after the others.

use super::*;

/// Through a relay that drips the server's bytes (one every 200 ms) from the handshake on, or
/// from the acquire's reply on: the acquire fails (125) within the plain-TCP bound (the attempt
/// and the undo, each --connect-timeout), one line, the command never ran, no lock left.
#[test]
fn a_dripped_tls_handshake_or_acquire_times_out() {
    let _alone = measure_alone();
    let s = tls_redis("server.crt", false, None);
    for (after, what, says) in [
        (0, "handshake", "no TLS answer in time"),
        (2, "acquire", "did not answer in time"),
    ] {
        let relay = Relay::start(s.port, Some(after));
        let dir = scratch("tls-drip");
        let marker = dir.join("ran");
        let t = std::time::Instant::now();
        let out = run(tls_cronlock(&format!("rediss://127.0.0.1:{}", relay.port))
            .env("CRONLOCK_TLS_CA_CERT", ca())
            .args(["--connect-timeout", "1s", "k", "touch"])
            .arg(&marker));
        let took = t.elapsed();
        assert_eq!(code(&out), 125, "{what}: {}", stderr(&out));
        assert!(one_line(&out).contains(says), "{what}: {}", stderr(&out));
        assert!(took < Duration::from_millis(3500), "{what}: took {took:?}");
        assert!(!marker.exists(), "{what}: the command ran");
        assert!(
            wait_for(Duration::from_secs(2), || !s.exists(LOCK)),
            "{what}: a lock was left behind"
        );
    }
}

/// Every error: 125, one line naming the problem, the command not run, nothing left behind.
#[test]
fn tls_errors_are_one_line_each() {
    let _alone = measure_alone();
    let good = tls_redis("server.crt", false, None);
    let wrong = tls_redis("wrong.crt", false, None);
    let expired = tls_redis("expired.crt", false, None);
    let mtls = tls_redis("server.crt", true, None);
    let plain = Redis::start_tcp();
    let c = certs();
    let dir = scratch("tlserr");
    let marker = dir.join("ran");
    let path = |p: &str| c.join(p).display().to_string();
    let mut cases = certificate_cases((&good, &wrong, &expired), &path);
    cases.extend(option_cases((&good, &mtls, &plain), &path));
    for (name, url, extra, needle) in cases {
        let t = std::time::Instant::now();
        let out = run(tls_cronlock(&url)
            .args(&extra)
            .args(["--connect-timeout", "1s", "k", "touch"])
            .arg(&marker));
        assert_eq!(code(&out), 125, "{name}: {}", stderr(&out));
        let err = one_line(&out);
        assert!(err.contains(needle), "{name}: {err}");
        assert!(!marker.exists(), "{name}: the command ran");
        // Never hangs: bounded by --connect-timeout (plus the best-effort undo of a lost reply).
        assert!(
            t.elapsed() < Duration::from_secs(4),
            "{name}: took {:?}",
            t.elapsed()
        );
    }
    assert!(plain.keys().is_empty(), "left behind: {:?}", plain.keys());
    let out = run(tls_cronlock(&good.tls_url("127.0.0.1")).args([
        "--tls-ca-cert",
        &path("ca.crt"),
        "--status",
        "k",
    ]));
    assert!(stdout(&out).contains("is free"), "{}", stdout(&out));
    assert!(!stdout(&out).contains(LOCK));
}

/// The cases of [`tls_errors_are_one_line_each`]: what, the URL, the options, and what the line
/// says. These: the server's certificate, or the CA file, is wrong.
fn certificate_cases<'a>(
    (good, wrong, expired): (&Redis, &Redis, &Redis),
    path: &dyn Fn(&str) -> String,
) -> Vec<(&'a str, String, Vec<String>, &'a str)> {
    vec![
        (
            "no CA given",
            good.tls_url("127.0.0.1"),
            vec![],
            "not trusted",
        ),
        (
            "another CA",
            good.tls_url("127.0.0.1"),
            vec!["--tls-ca-cert".into(), path("other-ca.crt")],
            "not trusted",
        ),
        (
            "name mismatch",
            wrong.tls_url("127.0.0.1"),
            vec!["--tls-ca-cert".into(), path("ca.crt")],
            "not valid for the host name",
        ),
        (
            "expired",
            expired.tls_url("127.0.0.1"),
            vec!["--tls-ca-cert".into(), path("ca.crt")],
            "expired",
        ),
        (
            "missing CA file",
            good.tls_url("127.0.0.1"),
            vec!["--tls-ca-cert".into(), path("no-such.crt")],
            "no-such.crt",
        ),
        (
            "CA file without a certificate",
            good.tls_url("127.0.0.1"),
            vec!["--tls-ca-cert".into(), path("client.key")],
            "holds no PEM certificate",
        ),
    ]
}

/// More cases: the client's certificate and key, and the URL's scheme against the port.
fn option_cases<'a>(
    (good, mtls, plain): (&Redis, &Redis, &Redis),
    path: &dyn Fn(&str) -> String,
) -> Vec<(&'a str, String, Vec<String>, &'a str)> {
    vec![
        (
            "key of another certificate",
            mtls.tls_url("127.0.0.1"),
            vec![
                "--tls-ca-cert".into(),
                path("ca.crt"),
                "--tls-cert".into(),
                path("client.crt"),
                "--tls-key".into(),
                path("server.key"),
            ],
            "does not belong",
        ),
        (
            "certificate without key",
            mtls.tls_url("127.0.0.1"),
            vec!["--tls-cert".into(), path("client.crt")],
            "--tls-key",
        ),
        (
            "key without certificate",
            mtls.tls_url("127.0.0.1"),
            vec!["--tls-key".into(), path("client.key")],
            "--tls-cert",
        ),
        (
            "redis:// at a TLS port",
            format!("redis://127.0.0.1:{}", good.port),
            vec![],
            "rediss://",
        ),
        (
            "rediss:// at a plain port",
            format!("rediss://127.0.0.1:{}", plain.port),
            vec!["--tls-ca-cert".into(), path("ca.crt")],
            "plain port",
        ),
        (
            "rediss+unix",
            "rediss+unix:///tmp/redis.sock".into(),
            vec![],
            "not a thing",
        ),
        (
            "TLS options on a plain URL",
            format!("redis://127.0.0.1:{}", plain.port),
            vec!["--tls-ca-cert".into(), path("ca.crt")],
            "rediss://",
        ),
    ]
}

/// Renewals through a relay that starts dripping once the job runs: the job is stopped (122)
/// before the lock's validity (TTL 3 s from the last confirmed renewal) ends, and cronlock exits
/// within the TTL plus 1.5 s, as over plain TCP.
#[test]
fn dripped_tls_renewals_stop_the_job_in_time() {
    let s = tls_redis("server.crt", false, None);
    let relay = Relay::start(s.port, None);
    let dir = scratch("tls-drip-renew");
    let ttl = Duration::from_secs(3);
    // Alone from before the start: a wait for the other tests could outlast the job.
    let _alone = measure_alone();
    let mut cmd = tls_cronlock(&format!("rediss://127.0.0.1:{}", relay.port));
    cmd.env("CRONLOCK_TLS_CA_CERT", ca())
        .args(["--ttl", "3s", "--connect-timeout", "1s", "k", "-c"])
        .arg(format!("echo $$ > {}/pid; exec sleep 30", dir.display()))
        .stderr(Stdio::piped());
    let holder = cmd.spawn().unwrap();
    let job = read_pid(&dir.join("pid"));
    let turned = std::time::Instant::now();
    relay.drip_now();
    let mut died = None;
    assert!(
        wait_for(Duration::from_secs(10), || {
            died = (!alive(job)).then(std::time::Instant::now);
            died.is_some()
        }),
        "the job outlived the lock"
    );
    let died = died.unwrap() - turned;
    let out = holder.wait_with_output().unwrap();
    let exited = turned.elapsed();
    assert_eq!(code(&out), 122, "{}", stderr(&out));
    assert!(died < ttl, "the job died {died:?} after the drip began");
    assert!(
        exited < ttl + Duration::from_millis(1500),
        "cronlock exited {exited:?} after the drip began"
    );
    assert!(stderr(&out).contains("lock lost"), "{}", stderr(&out));
}
