//! Redis Cluster: `redis+cluster://`, every KEY on its slot's node, `--list` over every primary,
//! and a job surviving its primary's failover. Real clusters made by `redis-cli --cluster create`.

use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;

use crate::common::*;
use crate::common::{replicas, story};

/// Three primaries without replicas, for the tests that do not disturb the cluster.
fn cluster() -> &'static Cluster {
    static CLUSTER: OnceLock<&'static Cluster> = OnceLock::new();
    shared(&CLUSTER, || Cluster::start(0))
}

/// KEYs whose lock lives on each of the three primaries (found through the cluster's own
/// CLUSTER KEYSLOT).
fn keys_on_each_primary(c: &Cluster, stem: &str) -> Vec<String> {
    let mut found: Vec<(u16, String)> = Vec::new();
    for i in 0.. {
        let key = format!("{stem}-{i}");
        let port = c.owner(&format!("cronlock:{{{key}}}")).port;
        if !found.iter().any(|(p, _)| *p == port) {
            found.push((port, key));
        }
        if found.len() == 3 {
            break;
        }
    }
    found.into_iter().map(|(_, k)| k).collect()
}

#[test]
fn every_key_runs_on_its_slot_owner() {
    let c = cluster();
    let mut keys = keys_on_each_primary(c, "spread");
    keys.extend(["}", "{", "a{b}c", "{}", "a key with a space"].map(String::from));
    let mut owners = Vec::new();
    for key in &keys {
        let out = run(cronlock_at(&c.url()).args([key.as_str(), "--", "true"]));
        assert_eq!(code(&out), 0, "{key}: {}", stderr(&out));
        let status = run(cronlock_at(&c.url()).args(["--status", "--json", key.as_str()]));
        assert_eq!(code(&status), 0, "{key}: {}", stderr(&status));
        let v: serde_json::Value = serde_json::from_str(&stdout(&status)).unwrap();
        assert_eq!(v["key"], key.as_str());
        assert_eq!(v["held"], false);
        assert_eq!(v["last_run"]["exit_status"], 0, "{v}");
        owners.push(c.owner(&format!("cronlock:{{{key}}}")).port);
    }
    owners.sort();
    owners.dedup();
    assert_eq!(
        owners.len(),
        3,
        "the KEYs did not spread over all primaries"
    );
}

#[test]
fn contention_through_different_seeds_runs_once() {
    let c = cluster();
    let dir = scratch("cluster-contention");
    let ports = c.primaries();
    let children: Vec<_> = (0..6)
        .map(|i| {
            let seed = ports[i % ports.len()];
            cronlock_at(&format!("redis+cluster://127.0.0.1:{seed}"))
                .current_dir(&dir)
                .args(["-E", "75", "contended", "--", "sh", "-c"])
                .arg("echo ran >> runs; sleep 2")
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let codes = exit_codes(children);
    let runs = std::fs::read_to_string(dir.join("runs")).unwrap();
    assert_eq!(runs.lines().count(), 1, "{codes:?}");
    assert_eq!(codes.iter().filter(|c| **c == 0).count(), 1, "{codes:?}");
    assert_eq!(codes.iter().filter(|c| **c == 75).count(), 5, "{codes:?}");
}

#[test]
fn list_shows_locks_on_every_primary_and_force_release_finds_the_node() {
    let c = cluster();
    let dir = scratch("cluster-list");
    let keys = keys_on_each_primary(c, "listed");
    let mut jobs: Vec<_> = keys
        .iter()
        .map(|k| {
            cronlock_at(&c.url())
                .current_dir(&dir)
                .args([k.as_str(), "--", "sh", "-c"])
                .arg(format!("touch started-{k}; exec sleep 60"))
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for k in &keys {
        assert!(wait_for(Duration::from_secs(10), || dir
            .join(format!("started-{k}"))
            .exists()));
    }
    let out = run(cronlock_at(&c.url()).args(["--list", "--json"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let listed: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    for k in &keys {
        assert!(
            listed
                .as_array()
                .unwrap()
                .iter()
                .any(|row| row["key"] == k.as_str()),
            "{k} not in {listed}"
        );
    }
    for (k, job) in keys.iter().zip(jobs.iter_mut()) {
        let out = run(cronlock_at(&c.url()).args(["--force-release", k.as_str()]));
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        assert!(stdout(&out).contains("released lock"), "{}", stdout(&out));
        let status = job.wait().unwrap();
        assert_eq!(status.code(), Some(122), "{k}");
    }
}

#[test]
fn a_plain_url_to_a_cluster_node_says_to_use_the_cluster_form() {
    let c = cluster();
    let node = c.node(c.primaries()[0]);
    // A KEY whose slot another primary serves.
    let key = (0..)
        .map(|i| format!("elsewhere-{i}"))
        .find(|k| c.owner(&format!("cronlock:{{{k}}}")).port != node.port)
        .unwrap();
    let dir = scratch("cluster-plain");
    let out = run(cronlock_at(&format!("redis://127.0.0.1:{}", node.port))
        .current_dir(&dir)
        .args([key.as_str(), "--", "touch", "ran"]));
    assert_eq!(code(&out), 125);
    let line = one_line(&out);
    assert!(line.contains("redis+cluster://"), "{line}");
    assert!(!dir.join("ran").exists());
}

#[test]
fn a_cluster_url_to_a_plain_server_says_so() {
    let r = Redis::start_tcp();
    let out = run(
        cronlock_at(&format!("redis+cluster://127.0.0.1:{}", r.port)).args(["k", "--", "true"]),
    );
    assert_eq!(code(&out), 125);
    let line = one_line(&out);
    assert!(line.contains("not a Redis Cluster node"), "{line}");
    // Not retried under --wait: waiting cannot make it a cluster.
    let t = std::time::Instant::now();
    let out = run(
        cronlock_at(&format!("redis+cluster://127.0.0.1:{}", r.port))
            .args(["--wait", "1m", "k", "--", "true"]),
    );
    assert_eq!(code(&out), 125, "{}", stderr(&out));
    // Far under the minute a retrying wait would take.
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    let out = run(cronlock_at("redis+cluster://127.0.0.1:6379/2").args(["k", "--", "true"]));
    assert_eq!(code(&out), 125);
    assert!(one_line(&out).contains("only database 0"));
}

#[test]
fn a_job_survives_its_primarys_failover() {
    let mut c = Cluster::start(1);
    let url = c.url();
    let dir = scratch("cluster-failover");
    let key = "cluster-failover";
    let lock = format!("cronlock:{{{key}}}");
    // --min-replicas works per slot: WAIT on the KEY's primary, which has a replica.
    let out = run(cronlock_at(&url).args(["--min-replicas", "1", key, "--", "true"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let out = run(cronlock_at(&url)
        .args(["--min-replicas", "2", "--connect-timeout", "500ms"])
        .args([key, "--", "true"]));
    assert_eq!(code(&out), 125);
    assert!(one_line(&out).contains("only 1 of 2 replicas"));
    let job = cronlock_at(&url)
        .current_dir(&dir)
        .args(["--ttl", "20s", key, "--", "sh", "-c"])
        .arg("echo ran >> runs; while [ ! -e go ]; do sleep 0.05; done")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(wait_for(Duration::from_secs(10), || dir
        .join("runs")
        .exists()));
    let primary = c.owner(&lock).port;
    // Its replica has the lock before the primary dies.
    let replica = c
        .nodes
        .iter()
        .find(|n| {
            n.port != primary && n.role() == "slave" && {
                let info: String = n.query(redis::cmd("INFO").arg("replication"));
                info.contains(&format!("master_port:{primary}"))
            }
        })
        .map(|n| n.port)
        .expect("a replica of the KEY's primary");
    assert!(wait_for(Duration::from_secs(5), || {
        let mut con = c.node(replica).con();
        redis::cmd("READONLY").query::<()>(&mut con).unwrap();
        redis::cmd("EXISTS")
            .arg(&lock)
            .query::<i64>(&mut con)
            .unwrap()
            == 1
    }));
    c.node_mut(primary).kill();
    assert!(
        wait_for(Duration::from_secs(30), || c.node(replica).role()
            == "master"),
        "the replica was not promoted"
    );
    c.wait_ok();
    assert_eq!(c.owner(&lock).port, replica);
    // No second run meanwhile.
    let second = run(cronlock_at(&url).current_dir(&dir).args([
        "-E",
        "75",
        key,
        "--",
        "sh",
        "-c",
        "echo ran >> runs",
    ]));
    assert_eq!(code(&second), 75, "{}", stderr(&second));
    std::fs::write(dir.join("go"), "").unwrap();
    let out = job.wait_with_output().unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let runs = std::fs::read_to_string(dir.join("runs")).unwrap();
    assert_eq!(runs.lines().count(), 1);
    assert!(!c.node(replica).exists(&lock));
}

/// `--limit` on a cluster: all of the KEY's keys (slots, limit record) in one hash slot.
#[test]
fn limit_two_on_a_cluster() {
    let c = cluster();
    let url = c.url();
    for key in keys_on_each_primary(c, "limited") {
        limit_two_of_four(|| cronlock_at(&url), &key);
    }
}

/// The catch-up story on a Cluster: each KEY's ledger and suspension live in its slot, beside its
/// lock, so every script runs on one node.
#[test]
fn catch_up_retries_and_suspend_on_a_cluster() {
    let url = cluster().url();
    story::missed(&url, "cl-report");
    story::retries(&url, "cl-flaky");
    story::abandoned(&url, "cl-dies", 1);
    story::abandoned(&url, "cl-dies0", 0);
    story::suspend(&url, "cl-paused");
}

/// `--crontab` on a Cluster: three replicas, three jobs every second for 20 s, each instant once.
#[test]
fn crontab_replicas_run_each_instant_once_on_a_cluster() {
    replicas::each_instant_once(&cluster().url(), "cl-rep", 20);
}

/// A fleet on a Cluster with a replica per primary: a primary SIGKILLed (its replica promoted
/// after `cluster-node-timeout`), then a coordinated `CLUSTER FAILOVER` of another: no instant
/// runs twice. A killed primary takes no write after it died, and a coordinated failover pauses
/// the primary's clients until its replica has every write, so nothing a claim wrote is dropped.
#[test]
fn crontab_a_killed_primary_and_a_cluster_failover_run_no_instant_twice() {
    let mut c = Cluster::start(1);
    let url = c.url();
    let replica_of = |c: &Cluster, primary: u16| {
        c.nodes
            .iter()
            .find(|n| {
                n.port != primary && n.running() && n.role() == "slave" && {
                    let info: String = n.query(redis::cmd("INFO").arg("replication"));
                    info.contains(&format!("master_port:{primary}"))
                        && info.contains("master_link_status:up")
                }
            })
            .map(|n| n.port)
    };
    let fleet = replicas::through(&url, "cl-fail", 9, "", || {
        let serving = std::time::Instant::now() + Duration::from_secs(3);
        assert!(wait_for(
            Duration::from_secs(10),
            || std::time::Instant::now() >= serving
        ));
        let lock = format!("cronlock:{{{}}}", replicas::Through::key("cl-fail", 0));
        let killed = c.owner(&lock).port;
        let heir = replica_of(&c, killed).expect("a replica of the killed primary");
        c.node_mut(killed).kill();
        assert!(
            wait_for(Duration::from_secs(30), || c.node(heir).role() == "master"),
            "the replica was not promoted"
        );
        c.wait_ok();
        let other = c.primaries().into_iter().find(|p| *p != heir).unwrap();
        let mut next = None;
        assert!(wait_for(Duration::from_secs(30), || {
            next = replica_of(&c, other);
            next.is_some()
        }));
        let next = next.unwrap();
        let _: () = c.node(next).query(redis::cmd("CLUSTER").arg("FAILOVER"));
        assert!(
            wait_for(Duration::from_secs(30), || c.node(next).role() == "master"),
            "CLUSTER FAILOVER did not promote the replica"
        );
        c.wait_ok();
    });
    fleet.assert_none_twice();
    let lost = fleet.not_run(fleet.served.clone());
    eprintln!("cluster failovers: {} job-instants not run", lost.len());
}

/// `--trigger` on a Cluster: the request in KEY's slot, the pokes in each fleet's, the fleets
/// found with SCAN on every primary.
#[test]
fn trigger_runs_a_job_once_now_on_a_cluster() {
    crate::policies::trigger_once(&cluster().url(), "cl-trig");
}

/// `--overlap replace` and `allow` on a Cluster: an instant's own lock, and the runs replaced,
/// in KEY's slot.
#[test]
fn replace_and_allow_on_a_cluster() {
    crate::policies::replace_and_allow_on(&cluster().url(), "cl-overlap");
}

mod alone {
    //! The cluster tests that measure time: each takes the cores for itself while it measures
    //! (`common::alone`), and `scripts/test.sh` runs them after the others.

    use super::*;

    /// `--crontab` on a Cluster: a dead or drained replica's instant runs again on another.
    #[test]
    fn crontab_retries_a_dead_replicas_run_on_a_cluster() {
        replicas::retried_on_another(&cluster().url(), "cl-retry");
    }

    /// The lock deleted on its slot owner is noticed at once (the watch is on that node).
    #[test]
    fn a_deleted_lock_is_noticed_on_its_slot_owner() {
        let c = cluster();
        for key in keys_on_each_primary(c, "tracked") {
            let lock = format!("cronlock:{{{key}}}");
            let owner = c.owner(&lock);
            stopped_at_once(cronlock_at(&c.url()), &key, || owner.del(&lock));
        }
    }
}
