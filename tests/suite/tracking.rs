//! A lock that vanishes while the command runs is noticed at once (client-side-caching
//! invalidations), not at the next renewal: with `--ttl 30s` the next renewal is 10 s away.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;

const LOCK: &str = "cronlock:{k}";
/// How soon after the lock vanished the command must be stopped.
const NOTICE: Duration = Duration::from_millis(500);

/// A job with `--ttl TTL` that runs until stopped; returns once it runs.
fn job(cmd: &mut Command, dir: &std::path::Path, ttl: &str) -> Child {
    let c = cmd
        .args(["--ttl", ttl, "k", "sh", "-c"])
        .arg(format!("echo $$ > {}/pid; exec sleep 60", dir.display()))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    read_pid(&dir.join("pid"));
    c
}

/// The id of the connection with tracking on (it redirects to another), if there is one.
fn tracker(r: &Redis) -> Option<i64> {
    let list: String = r.query(redis::cmd("CLIENT").arg("LIST"));
    list.lines().find_map(|line| {
        let field = |name: &str| {
            line.split(' ')
                .find_map(|kv| kv.strip_prefix(name))
                .and_then(|v| v.parse::<i64>().ok())
        };
        match field("redir=") {
            Some(to) if to >= 0 => field("id="),
            _ => None,
        }
    })
}

/// Wait until the whole watch is on: a connection subscribed for invalidations, and a tracking
/// connection other than `old` redirecting to it. Returns the tracking connection's id.
fn watching_anew(r: &Redis, old: Option<i64>) -> i64 {
    let mut id = None;
    assert!(
        wait_for(Duration::from_secs(10), || {
            let n: Vec<redis::Value> = r.query(
                redis::cmd("PUBSUB")
                    .arg("NUMSUB")
                    .arg("__redis__:invalidate"),
            );
            id = tracker(r).filter(|t| Some(*t) != old);
            matches!(n.get(1), Some(redis::Value::Int(1))) && id.is_some()
        }),
        "cronlock did not start watching the lock"
    );
    id.unwrap()
}

/// Wait until the watch is on.
fn watching(r: &Redis) -> i64 {
    watching_anew(r, None)
}

/// `fault` makes the lock vanish at the instant it returns: cronlock exits 122 within NOTICE.
fn stopped_after(r: &Redis, what: &str, fault: impl FnOnce(&Redis) -> Instant) -> Duration {
    let dir = scratch("tracking");
    let mut c = job(&mut cronlock(r), &dir, "30s");
    watching(r);
    let gone = fault(r);
    let mut status = None;
    assert!(
        wait_for(Duration::from_secs(15), || {
            status = c.try_wait().unwrap();
            status.is_some()
        }),
        "{what}: cronlock did not stop the command"
    );
    let took = gone.elapsed();
    let out = c.wait_with_output().unwrap();
    let err = stderr(&out);
    assert_eq!(status.unwrap().code(), Some(122), "{what}: {err}");
    assert!(err.contains("no longer ours"), "{what}: {err}");
    assert!(took < NOTICE, "{what}: stopped {took:?} after");
    assert!(!alive(read_pid(&dir.join("pid"))), "{what}: the job lives");
    took
}

/// Killing cronlock's connections is no loss: it renews at once, finds the lock still ours, builds
/// the watch again, and the job runs to its end.
#[test]
fn killed_connections_are_not_a_loss() {
    let r = Redis::start();
    let dir = scratch("tracking-kill");
    let go = dir.join("go");
    let c = cronlock(&r)
        .args(["-v", "--ttl", "30s", "k", "sh", "-c"])
        .arg(format!(
            "echo $$ > {d}/pid; while [ ! -e {d}/go ]; do sleep 0.02; done",
            d = dir.display()
        ))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    read_pid(&dir.join("pid"));
    let mut id = watching(&r);
    for kind in ["pubsub", "normal"] {
        let _: i64 = r.query(
            redis::cmd("CLIENT")
                .arg("KILL")
                .arg("TYPE")
                .arg(kind)
                .arg("SKIPME")
                .arg("yes"),
        );
        id = watching_anew(&r, Some(id));
    }
    std::fs::write(&go, "").unwrap();
    let out = c.wait_with_output().unwrap();
    let err = stderr(&out);
    assert_eq!(code(&out), 0, "{err}");
    assert!(err.contains("renewing now"), "{err}");
    assert!(!r.exists(LOCK));
}

/// An ACL without tracking: the run works on renewals alone, and `-v` says so.
#[test]
fn without_tracking_renewals_alone_still_work() {
    let r = Redis::start();
    r.query::<()>(
        redis::cmd("ACL")
            .arg("SETUSER")
            .arg("notrack")
            .arg("on")
            .arg(">pw")
            .arg("~*")
            .arg("&*")
            .arg("+@all")
            // Every CLIENT subcommand but ID (Redis 6.2 cannot take one subcommand away).
            .arg("-client")
            .arg("+client|id"),
    );
    let url = format!("redis+unix://{}?user=notrack&pass=pw", r.sock.display());
    // Renewals every ~0.5 s; the loss is noticed at one of them.
    let dir = scratch("tracking-acl");
    let c = cronlock(&r)
        .env("CRONLOCK_REDIS_URL", &url)
        .args(["-v", "--ttl", "2s", "k", "sh", "-c"])
        .arg(format!("echo $$ > {}/pid; sleep 1.5", dir.display()))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    read_pid(&dir.join("pid"));
    let out = c.wait_with_output().unwrap();
    let err = stderr(&out);
    assert_eq!(code(&out), 0, "{err}");
    assert!(err.contains("renewals alone"), "{err}");
    // A deleted lock is still noticed, at the next renewal.
    let dir = scratch("tracking-acl-del");
    let c = job(cronlock(&r).env("CRONLOCK_REDIS_URL", &url), &dir, "2s");
    r.del(LOCK);
    let out = c.wait_with_output().unwrap();
    assert_eq!(code(&out), 122, "{}", stderr(&out));
}

/// The connections of each kind (`flags=`) in `CLIENT LIST`: (tracking on, subscribed).
fn watch_connections(r: &Redis) -> (usize, usize) {
    let list: String = r.query(redis::cmd("CLIENT").arg("LIST"));
    let flags = |f: char| {
        list.lines()
            .filter(|l| {
                l.split(' ')
                    .find_map(|kv| kv.strip_prefix("flags="))
                    .is_some_and(|v| v.contains(f))
            })
            .count()
    };
    (flags('t'), flags('P'))
}

/// A replica serving `n` jobs that each run until stopped (`--ttl 30s`, their pids in
/// `pid-J`), once every command runs.
fn replica_of_long_jobs(r: &Redis, dir: &std::path::Path, n: usize) -> (Child, Vec<i32>) {
    let d = dir.display();
    let mut text = String::from("CRON_TZ=UTC\n");
    for j in 0..n {
        text += &format!("* * * * * * --ttl 30s long{j} echo $$ > {d}/pid-{j}; exec sleep 60\n");
    }
    let file = dir.join("crontab");
    std::fs::write(&file, text).unwrap();
    let c = cronlock(r)
        .arg("--crontab")
        .arg(&file)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pids = (0..n)
        .map(|j| read_pid(&dir.join(format!("pid-{j}"))))
        .collect();
    (c, pids)
}

/// A replica's runs share its watch: three running commands, one tracking connection and one
/// subscribed one on the server (a run of its own would add a pair per run); a lock deleted
/// stops that run's command (the replica tells the run, which renews and finds it gone).
#[test]
fn a_replicas_runs_share_one_watch() {
    let r = Redis::start();
    let dir = scratch("tracking-shared");
    let (mut c, pids) = replica_of_long_jobs(&r, &dir, 3);
    watching(&r);
    // Each run's command has run past the watch's settling time: every lock is watched.
    let all_run = Instant::now();
    assert!(wait_for(Duration::from_secs(2), || all_run.elapsed()
        >= Duration::from_millis(300)));
    assert_eq!(watch_connections(&r), (1, 1));
    r.del("cronlock:{long1}");
    assert!(
        wait_for(Duration::from_secs(5), || !alive(pids[1])),
        "the command of a deleted lock still runs"
    );
    assert!(alive(pids[0]) && alive(pids[2]));
    assert_eq!(watch_connections(&r), (1, 1));
    signal(c.id() as i32, libc::SIGKILL);
    c.wait().unwrap();
}

mod alone {
    //! The tracking tests that measure time: each takes the cores for itself while it measures
    //! (`common::alone`), and `scripts/test.sh` runs them after the others.

    use super::*;

    #[test]
    fn a_deleted_lock_stops_the_command_at_once() {
        let _alone = measure_alone();
        let r = Redis::start();
        let mut worst = Duration::ZERO;
        for _ in 0..3 {
            worst = worst.max(stopped_after(&r, "DEL", |r| {
                r.del(LOCK);
                Instant::now()
            }));
        }
        eprintln!("DEL: worst {worst:?}");
    }

    /// A replica's run notices its deleted lock as fast as a run watching its own: the
    /// command is stopped within NOTICE.
    #[test]
    fn a_replicas_run_notices_a_deleted_lock_at_once() {
        let _alone = measure_alone();
        let r = Redis::start();
        let dir = scratch("tracking-replica");
        let (mut c, pids) = replica_of_long_jobs(&r, &dir, 1);
        watching(&r);
        let running = Instant::now();
        assert!(wait_for(Duration::from_secs(2), || running.elapsed()
            >= Duration::from_millis(300)));
        r.del("cronlock:{long0}");
        let gone = Instant::now();
        assert!(wait_for(Duration::from_secs(5), || !alive(pids[0])));
        let took = gone.elapsed();
        signal(c.id() as i32, libc::SIGKILL);
        c.wait().unwrap();
        assert!(took < NOTICE, "stopped {took:?} after the lock was deleted");
    }

    #[test]
    fn a_flush_stops_the_command_at_once() {
        let _alone = measure_alone();
        let r = Redis::start();
        for _ in 0..2 {
            stopped_after(&r, "FLUSHALL", |r| {
                r.query::<()>(&redis::cmd("FLUSHALL"));
                Instant::now()
            });
        }
    }

    #[test]
    fn an_overwritten_lock_stops_the_command_at_once() {
        let _alone = measure_alone();
        let r = Redis::start();
        for _ in 0..2 {
            stopped_after(&r, "SET", |r| {
                r.query::<()>(
                    redis::cmd("SET")
                        .arg(LOCK)
                        .arg("someone else")
                        .arg("PX")
                        .arg(30_000),
                );
                Instant::now()
            });
            r.del(LOCK);
        }
    }

    /// `maxmemory` with `volatile-ttl`: the lock (30 s) is the volatile key nearest to expiry, and
    /// goes first when other keys fill the memory.
    #[test]
    fn an_evicted_lock_stops_the_command_at_once() {
        let _alone = measure_alone();
        let r = Redis::start_with(
            None,
            &["--maxmemory", "8mb", "--maxmemory-policy", "volatile-ttl"],
        );
        for round in 0..2 {
            stopped_after(&r, "eviction", |r| {
                let big = "x".repeat(100 * 1024);
                let mut con = r.con();
                for i in 0..1000 {
                    let _: Result<(), _> = redis::cmd("SET")
                        .arg(format!("filler:{round}:{i}"))
                        .arg(&big)
                        .arg("EX")
                        .arg(3600)
                        .query(&mut con);
                    if !r.exists(LOCK) {
                        return Instant::now();
                    }
                }
                panic!("the lock was never evicted");
            });
            r.query::<()>(&redis::cmd("FLUSHALL"));
        }
    }

    /// The tracking connection alone killed (the subscribed one stays, and hears nothing more): the
    /// watch is built again, and a lock deleted after that is still noticed at once.
    #[test]
    fn a_killed_tracking_connection_is_noticed() {
        let _alone = measure_alone();
        let r = Redis::start();
        stopped_after(&r, "DEL after the tracking connection was killed", |r| {
            let id = tracker(r).unwrap();
            let _: i64 = r.query(redis::cmd("CLIENT").arg("KILL").arg("ID").arg(id));
            watching_anew(r, Some(id));
            r.del(LOCK);
            Instant::now()
        });
    }

    /// The documented ACL (docs/deployments.md) allows the watch.
    #[test]
    fn the_readme_acl_allows_the_watch() {
        let _alone = measure_alone();
        let r = Redis::start();
        let acl_words = documented_acl("pw");
        let mut words = acl_words.iter();
        let mut acl = redis::cmd(words.next().unwrap());
        for w in words {
            acl.arg(w);
        }
        r.query::<()>(&acl);
        let url = format!("redis+unix://{}?user=cronlock&pass=pw", r.sock.display());
        let dir = scratch("tracking-readme-acl");
        let c = job(cronlock(&r).env("CRONLOCK_REDIS_URL", &url), &dir, "30s");
        watching(&r);
        let gone = Instant::now();
        r.del(LOCK);
        let out = c.wait_with_output().unwrap();
        assert_eq!(code(&out), 122, "{}", stderr(&out));
        assert!(gone.elapsed() < NOTICE, "{:?}", gone.elapsed());
    }
}
