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

/// The tests that measure time: they run alone (`common::alone`).
mod alone;
