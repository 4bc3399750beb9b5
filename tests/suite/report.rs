//! `--metrics-dir` and `--ping`, against a real Redis and a real HTTP endpoint on loopback (a tiny
//! server in the test that records each request's method and path). The `.prom` files are parsed
//! with the Prometheus project's own Python parser (`python3-prometheus-client`).

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::*;

/// How the endpoint behaves.
#[derive(Clone, Copy, PartialEq)]
enum Endpoint {
    Answers,
    /// Accepts connections and never answers.
    Silent,
}

struct Server {
    port: u16,
    seen: Arc<Mutex<Vec<String>>>,
    bodies: Arc<Mutex<Vec<String>>>,
    /// Each request's query string (`rid=...`).
    queries: Arc<Mutex<Vec<String>>>,
}

impl Server {
    fn start(mode: Endpoint) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        let bodies = Arc::new(Mutex::new(Vec::new()));
        let body_log = bodies.clone();
        let queries = Arc::new(Mutex::new(Vec::new()));
        let query_log = queries.clone();
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                if mode == Endpoint::Silent {
                    held.push(stream);
                    continue;
                }
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut line = String::new();
                let _ = reader.read_line(&mut line);
                let mut header = String::new();
                let mut length = 0usize;
                while reader.read_line(&mut header).is_ok_and(|n| n > 2) {
                    let h = header.to_ascii_lowercase();
                    if let Some(v) = h.strip_prefix("content-length:") {
                        length = v.trim().parse().unwrap_or(0);
                    }
                    header.clear();
                }
                let mut body = vec![0u8; length];
                let _ = std::io::Read::read_exact(&mut reader, &mut body);
                body_log
                    .lock()
                    .unwrap()
                    .push(String::from_utf8_lossy(&body).into_owned());
                let mut words = line.split_whitespace();
                let (method, path) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
                let (path, query) = path.split_once('?').unwrap_or((path, ""));
                query_log.lock().unwrap().push(query.to_string());
                log.lock().unwrap().push(format!("{method} {path}"));
                let _ = stream.write_all(
                    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nOK",
                );
            }
        });
        Server {
            port,
            seen,
            bodies,
            queries,
        }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/ping/s3cr3t-uuid", self.port)
    }

    fn bodies(&self) -> Vec<String> {
        self.bodies.lock().unwrap().clone()
    }

    fn seen(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }

    /// Wait until `n` requests arrived (the process has exited, so they are all in).
    fn wait_for(&self, n: usize) -> Vec<String> {
        wait_for(Duration::from_secs(5), || self.seen().len() >= n);
        self.seen()
    }
}

#[test]
fn pings_for_success_failure_lost_lock_and_skip() {
    let r = Redis::start();
    let s = Server::start(Endpoint::Answers);
    let out = run(cronlock(&r).args(["--ping", &s.url(), "k", "-c", "echo $CRONLOCK_RUN_ID"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(
        s.wait_for(2),
        ["POST /ping/s3cr3t-uuid/start", "POST /ping/s3cr3t-uuid"]
    );
    // Both pings carry the attempt's run id, as runitor and Healthchecks do.
    let rid = format!("rid={}", stdout(&out).trim());
    assert_eq!(*s.queries.lock().unwrap(), [rid.clone(), rid]);

    let s = Server::start(Endpoint::Answers);
    let out = run(cronlock(&r).args(["--ping", &s.url(), "k", "--", "sh", "-c", "exit 3"]));
    assert_eq!(code(&out), 3);
    assert_eq!(
        s.wait_for(2),
        ["POST /ping/s3cr3t-uuid/start", "POST /ping/s3cr3t-uuid/3"]
    );

    // The job's output is never sent unless asked; with --ping-body, its tail goes with the end.
    assert!(s.bodies().iter().all(String::is_empty), "{:?}", s.bodies());
    ping_body_carries_the_tail(&r);

    // A lost lock pings /122.
    let s = Server::start(Endpoint::Answers);
    let dir = scratch("ping-lost");
    let c = cronlock(&r)
        .env("CRONLOCK_PING_URL", s.url())
        .args(["--ttl", "1s", "k", "-c"])
        .arg(format!("echo $$ > {}/pid; exec sleep 30", dir.display()))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    read_pid(&dir.join("pid"));
    r.del("cronlock:{k}");
    let out = c.wait_with_output().unwrap();
    assert_eq!(code(&out), 122, "{}", stderr(&out));
    assert_eq!(
        s.wait_for(2),
        ["POST /ping/s3cr3t-uuid/start", "POST /ping/s3cr3t-uuid/122"]
    );

    // A host that skips sends nothing: the holder pings.
    let s = Server::start(Endpoint::Answers);
    r.set("cronlock:{k}", "someone else");
    let out = run(cronlock(&r).args(["--ping", &s.url(), "-E", "75", "k", "true"]));
    assert_eq!(code(&out), 75);
    std::thread::sleep(Duration::from_millis(300));
    assert!(s.seen().is_empty(), "{:?}", s.seen());
    r.del("cronlock:{k}");

    // Command not found: no start, /127.
    let s = Server::start(Endpoint::Answers);
    let out = run(cronlock(&r).args(["--ping", &s.url(), "k", "/no/such/command"]));
    assert_eq!(code(&out), 127);
    assert_eq!(s.wait_for(1), ["POST /ping/s3cr3t-uuid/127"]);
}

/// With --ping-body, the tail of the job's output (stdout and stderr, at most 10 KiB) goes with
/// the end ping, and the output still reaches cronlock's own.
fn ping_body_carries_the_tail(r: &Redis) {
    let s = Server::start(Endpoint::Answers);
    let out = run(cronlock(r)
        .args(["--ping", &s.url(), "--ping-body", "k", "-c"])
        .arg(
            "head -c 20000 /dev/zero | tr '\\0' x; echo; echo done-out; echo done-err >&2; exit 2",
        ));
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(
        stdout(&out).ends_with("done-out\n"),
        "the output still reaches cronlock's stdout"
    );
    assert!(stdout(&out).len() > 20_000);
    assert_eq!(stderr(&out), "done-err\n");
    assert_eq!(s.wait_for(2)[1], "POST /ping/s3cr3t-uuid/2");
    let body = &s.bodies()[1];
    assert!(
        body.len() <= 10 * 1024 && body.len() > 10_000,
        "{}",
        body.len()
    );
    assert!(
        body.contains("done-out") && body.contains("done-err"),
        "{body}"
    );
}

#[test]
fn a_failing_endpoint_changes_nothing_but_a_warning() {
    let r = Redis::start();
    // Refused: nothing listens there.
    let url = format!("http://127.0.0.1:{}/ping/s3cr3t-uuid", free_port());
    let t = Instant::now();
    let out = run(cronlock(&r).args(["--ping", &url, "k", "--", "sh", "-c", "exit 4"]));
    assert_eq!(code(&out), 4, "{}", stderr(&out));
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    let err = stderr(&out);
    assert!(
        err.contains("ping (start) failed") && err.contains("ping (exit status) failed"),
        "{err}"
    );
    assert!(!err.contains("s3cr3t"), "the URL was printed: {err}");

    // Silent: each ping gives up after two bounded attempts; the status is the command's.
    let s = Server::start(Endpoint::Silent);
    let t = Instant::now();
    let out = run(cronlock(&r).args(["--log-format", "json", "--ping", &s.url(), "k", "true"]));
    let took = t.elapsed();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    // Start ping (in the background) and end ping: at most 2 x (2 x 2 s + 0.2 s), plus slack.
    assert!(took < Duration::from_secs(12), "{took:?}");
    let events: Vec<serde_json::Value> = stderr(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(
        events.iter().any(|e| e["event"] == "ping_failed"),
        "{events:?}"
    );
    assert!(!stderr(&out).contains("s3cr3t"));

    // A URL that is not http(s) is bad input: 125, nothing runs, and the value is not echoed.
    let dir = scratch("ping-bad");
    let out = run(cronlock(&r)
        .env("CRONLOCK_PING_URL", "ftp://s3cr3t@example")
        .args(["k", "-c"])
        .arg(format!("touch {}/ran", dir.display())));
    assert_eq!(code(&out), 125);
    assert!(!one_line(&out).contains("s3cr3t"));
    assert!(!dir.join("ran").exists());
    assert!(!r.exists("cronlock:{k}"));
}

#[test]
fn metrics_after_a_run_a_failure_and_a_skip() {
    let r = Redis::start();
    let dir = scratch("metrics");
    let m = |extra: &[&str], cmd: &[&str]| {
        let mut c = cronlock(&r);
        c.env("CRONLOCK_METRICS_DIR", &*dir)
            .args(extra)
            .arg("nightly report");
        c.arg("--").args(cmd);
        code(&run(&mut c))
    };
    // The KEY's space is percent-encoded in the file name.
    let file = dir.join("cronlock_nightly%20report.prom");
    let prom = || {
        let found: Vec<_> = std::fs::read_dir(&*dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert_eq!(found.len(), 1, "temporary files left: {found:?}");
        assert_eq!(found[0], file);
        crate::common::prom::parse(&found[0], "gauge")
    };
    let host = String::from_utf8(Command::new("hostname").output().unwrap().stdout)
        .unwrap()
        .trim()
        .to_string();
    let l = |outcome: &str| {
        format!("cronlock_last_attempt_outcome{{host={host},key=nightly report,outcome={outcome}}}")
    };
    let v = |name: &str| format!("{name}{{host={host},key=nightly report}}");

    assert_eq!(m(&[], &["sleep", "0.2"]), 0);
    let p = prom();
    assert_eq!(p[l("ran")], 1.0, "{p}");
    assert_eq!(p[l("skipped")], 0.0);
    assert_eq!(p[v("cronlock_last_run_exit_status")], 0.0);
    let duration = p[v("cronlock_last_run_duration_seconds")].as_f64().unwrap();
    assert!((0.2..5.0).contains(&duration), "{duration}");
    let success = p[v("cronlock_last_success_timestamp_seconds")]
        .as_f64()
        .unwrap();
    let start = p[v("cronlock_last_run_start_timestamp_seconds")]
        .as_f64()
        .unwrap();
    assert!(success >= start + 0.2 && start > 1.7e9, "{p}");

    assert_eq!(m(&[], &["false"]), 1);
    let p = prom();
    assert_eq!(p[l("ran")], 1.0);
    assert_eq!(p[v("cronlock_last_run_exit_status")], 1.0);
    // The last success is still the first run's.
    assert_eq!(p[v("cronlock_last_success_timestamp_seconds")], success);

    r.set("cronlock:{nightly report}", "another host");
    assert_eq!(m(&[], &["true"]), 0);
    let p = prom();
    assert_eq!(p[l("skipped")], 1.0, "{p}");
    assert_eq!(p[l("ran")], 0.0);
    // A skip keeps the last run's values.
    assert_eq!(p[v("cronlock_last_run_exit_status")], 1.0);
    assert_eq!(p[v("cronlock_last_success_timestamp_seconds")], success);
    r.del("cronlock:{nightly report}");

    // A directory that is not there is bad input: 125, nothing runs.
    let out = run(cronlock(&r)
        .args(["--metrics-dir", "/nonexistent/metrics", "k", "-c"])
        .arg(format!("touch {}/ran", dir.display())));
    assert_eq!(code(&out), 125);
    assert!(one_line(&out).contains("--metrics-dir"));
    assert!(!dir.join("ran").exists());
}
