//! TLS against real `redis-server --tls-port` servers, with a private CA, server and client
//! certificates generated in the test with openssl (installed by ./scripts/test.sh).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use crate::common::*;

const LOCK: &str = "cronlock:{k}";

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl is required for the TLS tests; ./scripts/test.sh installs it");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A private CA; a server certificate for localhost and 127.0.0.1 (and variants: wrong name,
/// expired); a client certificate; an unrelated CA. Made once per test binary.
fn certs() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    crate::common::alone::enter();
    DIR.get_or_init(|| {
        let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
        // Certificates of earlier runs whose test process is gone.
        for old in std::fs::read_dir(tmp).into_iter().flatten().flatten() {
            let name = old.file_name().to_string_lossy().into_owned();
            if let Some(pid) = name
                .strip_prefix("tls-")
                .and_then(|p| p.parse::<i32>().ok())
            {
                if !alive(pid) {
                    let _ = std::fs::remove_dir_all(old.path());
                }
            }
        }
        let dir = tmp.join(format!("tls-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let ec = "-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes";
        let sh = |line: String| {
            let args: Vec<&str> = line.split(' ').collect();
            openssl(&dir, &args);
        };
        for name in ["ca", "other-ca"] {
            sh(format!(
                "req -x509 {ec} -keyout {name}.key -out {name}.crt -days 2 -subj /CN={name}"
            ));
        }
        for (name, cn) in [("server", "localhost"), ("client", "cronlock")] {
            sh(format!(
                "req {ec} -keyout {name}.key -out {name}.csr -subj /CN={cn}"
            ));
        }
        std::fs::write(
            dir.join("server.ext"),
            "subjectAltName=DNS:localhost,IP:127.0.0.1\n",
        )
        .unwrap();
        std::fs::write(dir.join("wrong.ext"), "subjectAltName=DNS:other.example\n").unwrap();
        std::fs::write(dir.join("client.ext"), "extendedKeyUsage=clientAuth\n").unwrap();
        for (csr, out, ext, days) in [
            ("server", "server", "server", "2"),
            ("server", "wrong", "wrong", "2"),
            ("server", "expired", "server", "-1"),
            ("client", "client", "client", "2"),
        ] {
            sh(format!(
                "x509 -req -in {csr}.csr -CA ca.crt -CAkey ca.key -CAcreateserial \
                 -out {out}.crt -days {days} -extfile {ext}.ext"
            ));
        }
        dir
    })
}

/// A redis-server whose TCP port is TLS-only, with `cert` as its certificate.
fn tls_redis(cert: &str, client_auth: bool, password: Option<&str>) -> Redis {
    let c = certs();
    let path = |f: &str| c.join(f).display().to_string();
    let args = [
        "--tls-cert-file".to_string(),
        path(cert),
        "--tls-key-file".into(),
        path("server.key"),
        "--tls-ca-cert-file".into(),
        path("ca.crt"),
        "--tls-auth-clients".into(),
        if client_auth { "yes" } else { "no" }.into(),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Redis::start_tls(password, &args)
}

/// cronlock against `url`, trusting our CA, with a clean environment.
fn tls_cronlock(url: &str) -> Command {
    let dummy = Redis::start();
    let mut cmd = cronlock(&dummy);
    cmd.env("CRONLOCK_REDIS_URL", url);
    cmd
}

fn ca() -> PathBuf {
    certs().join("ca.crt")
}

#[test]
fn a_run_over_tls_with_the_flag_and_the_variable() {
    let s = tls_redis("server.crt", false, None);
    for host in ["127.0.0.1", "localhost"] {
        let out = run(tls_cronlock(&s.tls_url(host))
            .arg("--tls-ca-cert")
            .arg(ca())
            .args(["k", "echo", "ran"]));
        assert_eq!(code(&out), 0, "{host}: {}", stderr(&out));
        assert_eq!(stdout(&out), "ran\n");
    }
    let out = run(tls_cronlock(&s.tls_url("127.0.0.1"))
        .env("CRONLOCK_TLS_CA_CERT", ca())
        .args(["k", "echo", "ran"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    // --status over TLS shows the last run.
    let out = run(tls_cronlock(&s.tls_url("127.0.0.1"))
        .env("CRONLOCK_TLS_CA_CERT", ca())
        .args(["--status", "k"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(
        stdout(&out).contains("exited with status 0"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn renewals_over_tls_keep_a_short_lock_and_a_deletion_is_noticed() {
    let s = tls_redis("server.crt", false, Some("tls-pw/7?"));
    let url = format!("rediss://:tls-pw%2F7%3F@127.0.0.1:{}", s.port);
    // A 1s lock through a 2.5s job: renewals every ~0.24s over TLS.
    let out = run(tls_cronlock(&url)
        .env("CRONLOCK_TLS_CA_CERT", ca())
        .args(["--ttl", "1s", "k", "sleep", "2.5"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(!stderr(&out).contains("tls-pw"), "{}", stderr(&out));

    // The lock deleted under a TLS holder: 122.
    let dir = scratch("tlsdel");
    let holder = tls_cronlock(&url)
        .env("CRONLOCK_TLS_CA_CERT", ca())
        .args(["--ttl", "1s", "k", "-c"])
        .arg(format!("echo $$ > {}/pid; exec sleep 30", dir.display()))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let cmd = read_pid(&dir.join("pid"));
    let out = run(tls_cronlock(&url)
        .env("CRONLOCK_TLS_CA_CERT", ca())
        .args(["--force-release", "k"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let out = holder.wait_with_output().unwrap();
    assert_eq!(code(&out), 122, "{}", stderr(&out));
    assert!(!alive(cmd));
    assert!(!stderr(&out).contains("tls-pw"), "{}", stderr(&out));
}

#[test]
fn mutual_tls_with_and_without_a_client_certificate() {
    let s = tls_redis("server.crt", true, None);
    let c = certs();
    let out = run(tls_cronlock(&s.tls_url("127.0.0.1"))
        .env("CRONLOCK_TLS_CA_CERT", ca())
        .env("CRONLOCK_TLS_CERT", c.join("client.crt"))
        .env("CRONLOCK_TLS_KEY", c.join("client.key"))
        .args(["k", "echo", "ran"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stdout(&out), "ran\n");
    let out = run(tls_cronlock(&s.tls_url("127.0.0.1"))
        .env("CRONLOCK_TLS_CA_CERT", ca())
        .args(["k", "echo", "ran"]));
    assert_eq!(code(&out), 125);
    assert!(
        one_line(&out).contains("requires a client certificate"),
        "{}",
        stderr(&out)
    );
    assert_eq!(stdout(&out), "");
}

#[test]
fn the_system_store_is_used_and_an_empty_one_falls_back_to_bundled_roots() {
    let s = tls_redis("server.crt", false, None);
    // The system's store, as rustls-native-certs finds it: here, one file holding our CA.
    let out = run(tls_cronlock(&s.tls_url("127.0.0.1"))
        .env("SSL_CERT_FILE", ca())
        .env("SSL_CERT_DIR", "/nonexistent")
        .args(["k", "echo", "ran"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stdout(&out), "ran\n");
    // No store at all (a FROM scratch image): the bundled Mozilla roots, which do not know our
    // private CA. A clean refusal, not a crash.
    let out = run(tls_cronlock(&s.tls_url("127.0.0.1"))
        .env("SSL_CERT_FILE", "/nonexistent/ca.pem")
        .env("SSL_CERT_DIR", "/nonexistent")
        .args(["k", "echo", "ran"]));
    assert_eq!(code(&out), 125);
    assert!(one_line(&out).contains("not trusted"), "{}", stderr(&out));
}

#[test]
fn a_run_through_tls_sentinels() {
    let primary = tls_redis("server.crt", false, None);
    let c = certs();
    let path = |f: &str| c.join(f).display().to_string();
    let lines = format!(
        "tls-cert-file {}\ntls-key-file {}\ntls-ca-cert-file {}\ntls-auth-clients no\n",
        path("server.crt"),
        path("server.key"),
        path("ca.crt")
    );
    let sentinel = Sentinel::start_with(primary.port, 1, Some((&lines, &ca())));
    assert!(
        wait_for(Duration::from_secs(10), || sentinel.primary_port()
            == Some(primary.port)),
        "the sentinel does not see the primary"
    );
    let url = format!("rediss+sentinel://127.0.0.1:{}/{SERVICE}", sentinel.port);
    let out = run(tls_cronlock(&url)
        .arg("--tls-ca-cert")
        .arg(ca())
        .args(["k", "echo", "ran"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stdout(&out), "ran\n");
    assert!(primary.exists("cronlock:{k}:last"));
    // Without our CA, the sentinel's certificate is not trusted: one line, 125.
    let out = run(tls_cronlock(&url).args(["k", "echo", "ran"]));
    assert_eq!(code(&out), 125);
    let line = one_line(&out);
    assert!(line.contains(SERVICE), "{line}");
}

mod alone {
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
}
