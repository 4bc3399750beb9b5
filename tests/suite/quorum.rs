//! Several independent masters (Redlock): three real redis-servers, some SIGSTOPped or killed.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;

fn three() -> Vec<Redis> {
    (0..3).map(|_| Redis::start_tcp()).collect()
}

/// cronlock with `-u` for each master.
fn on(masters: &[Redis]) -> Command {
    let mut cmd = cronlock_at("");
    cmd.env_remove("CRONLOCK_REDIS_URL");
    for m in masters {
        cmd.args(["-u", &m.tcp_url()]);
    }
    cmd
}

/// cronlock with every master in CRONLOCK_REDIS_URL, separated by spaces.
fn on_env(masters: &[Redis]) -> Command {
    let urls: Vec<String> = masters.iter().map(|m| m.tcp_url()).collect();
    cronlock_at(&urls.join(" "))
}

const LOCK: &str = "cronlock:{q}";

#[test]
fn runs_and_releases_everywhere() {
    let m = three();
    let out = run(on_env(&m).args(["q", "--", "true"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    for r in &m {
        assert!(!r.exists(LOCK));
        assert!(r.exists("cronlock:{q}:last"));
    }
}

#[test]
fn holds_a_majority_while_running_and_a_second_acquirer_skips() {
    let m = three();
    let dir = scratch("quorum-held");
    let job = on(&m)
        .current_dir(&dir)
        .args([
            "q",
            "--",
            "sh",
            "-c",
            "touch started; while [ ! -e go ]; do sleep 0.05; done",
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(wait_for(Duration::from_secs(10), || dir
        .join("started")
        .exists()));
    assert!(m.iter().filter(|r| r.exists(LOCK)).count() >= 2);
    let second = run(on(&m)
        .current_dir(&dir)
        .args(["-E", "75", "q", "--", "touch", "second"]));
    assert_eq!(code(&second), 75, "{}", stderr(&second));
    assert!(!dir.join("second").exists());
    let status = run(on(&m).args(["--status", "q"]));
    let text = stdout(&status);
    assert!(text.contains("lock 'q' is held"), "{text}");
    assert!(text.contains("masters (2 of 3 needed):"), "{text}");
    assert_eq!(text.matches(": held, ttl").count(), 3, "{text}");
    let list = run(on(&m).args(["--list"]));
    assert!(
        stdout(&list).contains("on 3 of 3 masters"),
        "{}",
        stdout(&list)
    );
    std::fs::write(dir.join("go"), "").unwrap();
    let out = job.wait_with_output().unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(m.iter().all(|r| !r.exists(LOCK)));
}

/// Two of three masters down (frozen: killed, their ports could be taken at once by another
/// test's server, which would then grant the lock): nothing runs, and the one grant is undone.
#[test]
fn two_of_three_down_runs_nothing_and_leaves_nothing() {
    let m = three();
    let dir = scratch("quorum-down");
    m[0].pause();
    m[2].pause();
    let out = run(on(&m).current_dir(&dir).args(["q", "--", "touch", "ran"]));
    assert_eq!(code(&out), 125);
    let line = one_line(&out);
    assert!(
        line.contains("1 of 3 masters granted it, 2 needed"),
        "{line}"
    );
    assert!(line.contains(&format!("127.0.0.1:{}", m[0].port)), "{line}");
    assert!(!dir.join("ran").exists());
    assert!(!m[1].exists(LOCK));
    m[0].resume();
    m[2].resume();
}

#[test]
fn fencing_tokens_keep_increasing_whichever_majority_answers() {
    let mut m = three();
    let dir = scratch("quorum-fence");
    // One master's counter is far ahead of the clock: only the write-back carries it to the
    // next majority.
    m[0].set("cronlock:{q}:fence", "5000000000000000");
    let mut last = 0u64;
    for (round, frozen) in [2usize, 0, 1, 2, 0, 1].into_iter().enumerate() {
        if round == 3 {
            // A master restarted empty changes nothing either.
            m[2].restart();
        }
        m[frozen].pause();
        let out = run(on(&m).current_dir(&dir).args([
            "q",
            "--",
            "sh",
            "-c",
            "echo $CRONLOCK_FENCING_TOKEN",
        ]));
        m[frozen].resume();
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        let token: u64 = stdout(&out).trim().parse().unwrap();
        assert!(token > last, "round {round}: {token} after {last}");
        assert!(token > 5_000_000_000_000_000, "round {round}: {token}");
        last = token;
    }
}

#[test]
fn ten_contenders_run_once_per_tick() {
    let m = three();
    let dir = scratch("quorum-contenders");
    for tick in 0..2 {
        let children: Vec<_> = (0..10)
            .map(|_| {
                on(&m)
                    .current_dir(&dir)
                    .args(["-E", "75", "q", "--", "sh", "-c"])
                    .arg(format!("echo {tick} >> runs; sleep 1"))
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        let codes = exit_codes(children);
        let runs = std::fs::read_to_string(dir.join("runs")).unwrap();
        let this_tick = runs.lines().filter(|l| *l == tick.to_string()).count();
        assert_eq!(this_tick, 1, "tick {tick}: {codes:?}");
        assert!(codes.iter().all(|c| *c == 0 || *c == 75), "{codes:?}");
    }
}

/// Votes that split (the lock held by A on one master, by B on another, free on the third): nobody
/// has a majority, so the contender that took the third undoes it and asks again, under a fresh
/// holder, a few times (up to 4 rounds, within --connect-timeout) before it finds the lock busy:
/// contenders that split at once do the same, and one of them wins a later round. Each round
/// leaves its own undo marker on the third master.
#[test]
fn split_votes_are_asked_again_a_few_times() {
    let m = three();
    let hold = |r: &Redis, who: &str| {
        r.query::<()>(redis::cmd("SET").arg(LOCK).arg(who).arg("PX").arg(20_000));
    };
    hold(&m[0], "a");
    hold(&m[1], "b");
    let out = run(on(&m).args(["-E", "75", "q", "--", "true"]));
    assert_eq!(code(&out), 75, "{}", stderr(&out));
    let markers = m[2]
        .keys()
        .into_iter()
        .filter(|k| k.starts_with(&format!("{LOCK}:abandoned:")))
        .count();
    assert_eq!(markers, 4, "{:?}", m[2].keys());
    assert!(!m[2].exists(LOCK), "the third master's vote was not undone");
    // Held by A on a majority: busy at once, one round.
    hold(&m[2], "a");
    m[0].del(LOCK);
    hold(&m[0], "a");
    let out = run(on(&m).args(["-E", "75", "q", "--", "true"]));
    assert_eq!(code(&out), 75, "{}", stderr(&out));
}

/// `--overlap replace` and `allow` on three masters: the takeover, the runs replaced and each
/// instant's own lock on a majority.
#[test]
fn replace_and_allow_on_three_masters() {
    let masters = three();
    let urls: Vec<String> = masters.iter().map(|m| m.tcp_url()).collect();
    crate::policies::replace_and_allow_on(&urls.join(" "), "q-overlap");
}

/// A rolling restart without persistence: two masters of three restarted empty 2 s apart under a
/// holder (`--ttl 3s`, renewals every second), with contenders every 200 ms. The holder writes its
/// lock back on a master that lost it while a majority confirms it, so nobody else ever gets a
/// majority, and its job goes on.
#[test]
fn a_rolling_restart_of_two_masters_lets_nobody_in() {
    let mut m = three();
    let dir = scratch("quorum-rolling");
    let holder = spawn_holding(on(&m).args(["--ttl", "3s", "q"]), &dir);
    let urls: Vec<String> = m.iter().map(|r| r.tcp_url()).collect();
    let d = dir.to_path_buf();
    let contenders = Contenders::start(
        move || {
            let mut c = cronlock_at("");
            c.env_remove("CRONLOCK_REDIS_URL").current_dir(&d);
            for u in &urls {
                c.args(["-u", u]);
            }
            c.args(["--ttl", "3s", "-E", "75", "q"]);
            c
        },
        &dir,
    );
    m[0].restart();
    // The scenario's own timing (a rolling restart), not a wait for an event.
    std::thread::sleep(Duration::from_secs(2));
    m[1].restart();
    let restarted = Instant::now();
    assert!(
        wait_for(Duration::from_secs(5), || m.iter().all(|r| r.exists(LOCK))),
        "the holder did not write its lock back on the restarted masters"
    );
    // Longer than a TTL after the second restart.
    while restarted.elapsed() < Duration::from_secs(4) {
        assert!(alive(holder.id() as i32), "the holder ended");
        assert!(!dir.join("overlap").exists(), "two jobs overlapped");
        std::thread::sleep(Duration::from_millis(100));
    }
    let codes = contenders.stop();
    std::fs::write(dir.join("go"), "").unwrap();
    let out = holder.wait_with_output().unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(!dir.join("overlap").exists(), "two jobs overlapped");
    assert!(
        codes.iter().all(|c| *c == 75 || *c == 125),
        "a contender ran: {codes:?}"
    );
}

mod alone {
    //! The quorum tests that measure time: each takes the cores for itself while it measures
    //! (`common::alone`), and `scripts/test.sh` runs them after the others.

    use super::*;

    #[test]
    fn one_frozen_master_still_runs_quickly() {
        let _alone = measure_alone();
        let m = three();
        let dir = scratch("quorum-frozen");
        m[1].pause();
        let start = Instant::now();
        let out = run(on(&m).current_dir(&dir).args(["q", "--", "touch", "ran"]));
        let took = start.elapsed();
        m[1].resume();
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        assert!(dir.join("ran").exists());
        // Each call to the frozen master is bounded by TTL/30, at most 100 ms (acquire, then
        // release).
        assert!(took < Duration::from_millis(1500), "took {took:?}");
    }

    /// Several masters: the lock deleted on a minority is not a loss: the renewal the watch asks for
    /// writes it back there at once. Taken by another holder on a majority, it is a loss, noticed at
    /// once (overwritten, not deleted: whatever order the renewals come in, nothing is written back
    /// over another holder's lock).
    #[test]
    fn a_lock_deleted_on_a_minority_is_mended_and_on_a_majority_is_lost() {
        let _alone = measure_alone();
        let m = three();
        let dir = scratch("quorum-tracked");
        let holder = spawn_holding(on(&m).args(["--ttl", "30s", "q"]), &dir);
        // The watch starts 20 ms after the command; a deletion before it is found by its first read.
        m[0].del(LOCK);
        let deleted = Instant::now();
        assert!(
            wait_for(Duration::from_secs(2), || m[0].exists(LOCK)),
            "the lock was not written back on the master that lost it"
        );
        eprintln!(
            "minority: written back {:?} after the DEL",
            deleted.elapsed()
        );
        assert!(alive(holder.id() as i32), "a minority's loss ended the job");
        std::fs::write(dir.join("go"), "").unwrap();
        let out = holder.wait_with_output().unwrap();
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        let took = stopped_at_once(on(&m), "q2", || {
            for r in &m[..2] {
                r.query::<()>(
                    redis::cmd("SET")
                        .arg("cronlock:{q2}")
                        .arg("another holder")
                        .arg("PX")
                        .arg(30_000),
                );
            }
        });
        eprintln!("majority: stopped {took:?} after the overwrites");
    }

    #[test]
    fn losing_the_quorum_mid_run_stops_the_command_before_expiry() {
        let m = three();
        let dir = scratch("quorum-lost");
        let ttl = Duration::from_secs(3);
        // Alone from before the start: a wait for the other tests could outlast the job.
        let _alone = measure_alone();
        let job = on(&m)
            .current_dir(&dir)
            .args([
                "--ttl",
                "3s",
                "q",
                "--",
                "sh",
                "-c",
                "echo $$ > pid; exec sleep 60",
            ])
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let pid = read_pid(&dir.join("pid"));
        m[0].pause();
        m[1].pause();
        let paused = Instant::now();
        let out = job.wait_with_output().unwrap();
        let ended = paused.elapsed();
        m[0].resume();
        m[1].resume();
        assert_eq!(code(&out), 122, "{}", stderr(&out));
        assert!(ended < ttl, "ended {ended:?} after the pause");
        assert!(!alive(pid));
    }

    /// Three masters, one frozen, five hosts firing `--schedule` every second (as their crons
    /// would), with `--ttl 3s` and with the default TTL: every instant runs exactly once.
    /// Contenders whose votes split undo what their grants wrote (the lock, the schedule record and
    /// the ledger entry), so their next round can still claim the instant; a contender that reads
    /// "already ran" or "busy" from masters that do not agree on one holder (a grant held on a
    /// minority, undone a moment later) asks again too; a round that failed only because a master
    /// did not answer after a grant of ours is asked again as well. Each call to the frozen master
    /// waits TTL/30 at most 100 ms, so a run's acquire and release do not span the next second.
    #[test]
    fn one_frozen_master_and_five_hosts_run_every_instant_once() {
        five_hosts_each_second(&["--ttl", "3s"], "quorum-five-hosts");
    }

    #[test]
    fn one_frozen_master_and_five_hosts_run_every_instant_once_with_the_default_ttl() {
        five_hosts_each_second(&[], "quorum-five-hosts-30s");
    }

    fn five_hosts_each_second(ttl: &[&str], name: &str) {
        let m = three();
        let dir = scratch(name);
        m[2].pause();
        let _alone = measure_alone();
        let mut hosts = Vec::new();
        let mut fired = Vec::new();
        for _ in 0..6 {
            // Just after the next whole second, as cron fires.
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap();
            std::thread::sleep(Duration::from_millis(
                1000 - u64::from(now.subsec_millis()) + 20,
            ));
            let second = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs();
            fired.push(second);
            for _ in 0..5 {
                hosts.push(
                    on(&m)
                        .current_dir(&dir)
                        .args(["--schedule", "* * * * * *", "-E", "75"])
                        .args(ttl)
                        .args(["q", "--", "sh", "-c"])
                        .arg("echo $CRONLOCK_INSTANT $(date +%s.%N) >> runs")
                        .stderr(Stdio::piped())
                        .spawn()
                        .unwrap(),
                );
            }
        }
        let mut said = String::new();
        for h in hosts {
            let out = h.wait_with_output().unwrap();
            said += &String::from_utf8_lossy(&out.stderr);
        }
        m[2].resume();
        let runs = std::fs::read_to_string(dir.join("runs")).unwrap_or_default();
        let mut count: std::collections::BTreeMap<u64, usize> = Default::default();
        for l in runs.lines() {
            let l = l.split_whitespace().next().unwrap_or_default();
            let at = humantime::parse_rfc3339(l)
                .unwrap()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs();
            *count.entry(at).or_default() += 1;
        }
        for second in &fired {
            assert_eq!(
                count.get(second),
                Some(&1),
                "the {second} instant: {count:?} (fired {fired:?})\n{runs}\n{said}"
            );
        }
    }
}

/// A split vote undoes the lock a master granted under `--overlap allow`: the instant's own lock
/// (`KEY:at:INSTANT`), not the plain KEY. Two masters are busy (64 instants running, the
/// default cap), the third grants: nobody has a majority, and the third is left with no lock of
/// the attempt (before, the undo deleted the plain KEY, and the grant stayed for its TTL,
/// counting against the cap with nothing running).
#[test]
fn a_split_vote_undoes_an_instants_own_lock() {
    let m = three();
    let running = format!("{LOCK}:running");
    for (r, who) in m[..2].iter().zip(["a", "b"]) {
        for at in 1..=64 {
            let lock = format!("{LOCK}:at:{at}");
            r.query::<()>(redis::cmd("SET").arg(lock).arg(who).arg("PX").arg(20_000));
            r.query::<()>(redis::cmd("HSET").arg(&running).arg(at).arg(who));
        }
    }
    let out = run(on(&m).args([
        "-E",
        "75",
        "--schedule",
        "* * * * * *",
        "--overlap",
        "allow",
        "q",
        "--",
        "true",
    ]));
    assert_eq!(code(&out), 75, "{}", stderr(&out));
    let left: Vec<String> = m[2]
        .keys()
        .into_iter()
        .filter(|k| k.starts_with(&format!("{LOCK}:at:")))
        .collect();
    assert_eq!(left, Vec::<String>::new());
    assert!(!m[2].exists(&running), "{:?}", m[2].keys());
}
