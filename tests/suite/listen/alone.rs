//! The listen tests that measure time: each takes the cores for itself while it measures
//! (`common::alone`), and `scripts/test.sh` runs them after the others.

use super::*;

#[test]
fn readyz_follows_redis_and_healthz_follows_the_loop() {
    let mut r = Redis::start_tcp();
    let dir = scratch("listen-probes");
    let hold = dir.join("hold");
    let hook = hold.to_str().unwrap();
    let (child, port) = listening(
        &r.tcp_url(),
        &dir,
        "* * * * * * probe-job sleep 2\n",
        &[("CRONLOCK_TEST_HOLD_LOOP", hook)],
    );
    assert!(wait_for(Duration::from_secs(5), || get(port, "/readyz").0 == 200));
    let alone = measure_alone();
    r.kill();
    let stopped = Instant::now();
    assert!(wait_for(Duration::from_secs(5), || get(port, "/readyz").0 == 503));
    assert!(
        stopped.elapsed() < Duration::from_millis(2500),
        "{:?}",
        stopped.elapsed()
    );
    drop(alone);
    let (_, why) = get(port, "/readyz");
    assert!(why.starts_with("redis"), "{why}");
    r.restart();
    assert!(wait_for(Duration::from_secs(10), || get(port, "/readyz").0 == 200));
    // The loop held: /healthz turns 503 (after 6 s), and 200 again once it turns.
    assert_eq!(get(port, "/healthz").0, 200);
    std::fs::write(&hold, "").unwrap();
    assert!(wait_for(Duration::from_secs(15), || get(port, "/healthz")
        .0
        == 503));
    std::fs::remove_file(&hold).unwrap();
    assert!(wait_for(Duration::from_secs(5), || get(port, "/healthz").0 == 200));
    // Draining (a run of 2 s goes on): not ready.
    let mut child = child;
    assert!(wait_for(Duration::from_secs(5), || get(port, "/metrics")
        .1
        .contains("cronlock_running{key=\"probe-job\",host=")
        && get(port, "/metrics").1.contains("cronlock_replica_runs 1")));
    signal(child.id() as i32, libc::SIGTERM);
    assert!(wait_for(Duration::from_secs(2), || get(port, "/readyz")
        == (503, "draining: this replica claims nothing more\n".into())));
    assert!(wait_for(Duration::from_secs(10), || child
        .try_wait()
        .unwrap()
        .is_some()));
    assert_eq!(child.wait().unwrap().code(), Some(0));
}

#[test]
fn bad_clients_get_one_answer_and_the_replica_goes_on() {
    let _alone = measure_alone();
    let r = Redis::start();
    let dir = scratch("listen-bad");
    let (child, port) = listening_with(
        &r.url(),
        &dir,
        "* * * * * * bad-job true\n",
        &[],
        &["-v", "--log-format", "json"],
    );
    assert_eq!(get(port, "/nowhere").0, 404);
    assert_eq!(send(port, b"POST / HTTP/1.1\r\nHost: x\r\n\r\n").0, 405);
    assert_eq!(send(port, b"\x16\x03\x01garbage\r\n\r\n").0, 400);
    let big = format!("GET /{} HTTP/1.1\r\n\r\n", "a".repeat(9000));
    assert_eq!(send(port, big.as_bytes()).0, 400);
    let many: String = (0..40).map(|i| format!("X-{i}: y\r\n")).collect();
    let many = format!("GET / HTTP/1.1\r\n{many}\r\n");
    assert_eq!(send(port, many.as_bytes()).0, 400);
    let (code, head) = send(port, b"HEAD /healthz HTTP/1.1\r\n\r\n");
    assert_eq!((code, head.as_str()), (200, ""));
    // A client that says nothing is dropped within 2 s; one more than 256 is closed at once.
    let mut quiet: Vec<TcpStream> = (0..300)
        .filter_map(|_| TcpStream::connect(("127.0.0.1", port)).ok())
        .collect();
    assert_eq!(get(port, "/healthz").0, 0, "a 257th connection was served");
    let begun = Instant::now();
    let mut buf = [0u8; 1];
    quiet[0]
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    assert_eq!(quiet[0].read(&mut buf).unwrap_or(0), 0);
    assert!(
        begun.elapsed() < Duration::from_secs(5),
        "{:?}",
        begun.elapsed()
    );
    quiet.clear();
    assert!(wait_for(Duration::from_secs(5), || get(port, "/healthz").0 == 200));
    assert_eq!(stop(child), Some(0));
    // Each bad request said in one line under -v (a replica's debug events).
    let err = crate::common::replicas::replica_err(&dir.join("crontab"));
    assert!(err.contains("\"event\":\"bad_request\""), "{err}");
    for said in [
        "--listen: answered 404 to 127.0.0.1:",
        "answered 405 to",
        "more than 32 header lines",
        "a request head over 8192 bytes",
        "not an HTTP/1 request",
    ] {
        assert!(err.contains(said), "{said}: {err}");
    }
}
