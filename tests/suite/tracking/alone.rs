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
