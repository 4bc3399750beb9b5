//! Time that behaves like cron's, with private zones (made with `zic` in the test and named
//! through `TZDIR`) whose clocks change seconds from now; and crontab files read as cron reads
//! them: linear in their size, a FIFO refused, a bad byte named by its line, SIGTERM answered
//! while a file is read.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::common::replicas::{crontab, instants, replica_err, stop};
use crate::common::*;

fn now_secs() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// `t` (Unix seconds) as zic's UNTIL: `YEAR MON DAY H:MM:SSu`.
fn until(t: i64) -> String {
    let ts = jiff::Timestamp::from_second(t).unwrap();
    ts.strftime("%Y %b %-d %-H:%M:%Su").to_string()
}

/// Compile `rules` (zic's source) into `dir`; the TZDIR to name it by.
fn zic(dir: &Path, rules: &str) {
    let src = dir.join("zones.zi");
    std::fs::write(&src, rules).unwrap();
    let out = Command::new("zic")
        .arg("-d")
        .arg(dir)
        .arg(&src)
        .output()
        .expect("zic (libc-bin) makes the test's zones");
    assert!(
        out.status.success(),
        "zic: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A replica of `file` with `TZDIR` set.
fn replica_in(r: &Redis, file: &Path, tzdir: &Path) -> Child {
    let dir = file.parent().unwrap();
    let mut cmd = cronlock_at(&r.url());
    cmd.arg("--crontab").arg(file).env("TZDIR", tzdir);
    tie(&mut cmd);
    cmd.stdout(std::fs::File::create(dir.join("0.out")).unwrap())
        .stderr(std::fs::File::create(dir.join("0.err")).unwrap())
        .spawn()
        .unwrap()
}

fn unix(t: &str) -> i64 {
    humantime::parse_rfc3339(t)
        .unwrap()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// Client commands Redis has answered (INFO commandstats), scripts' own calls included.
fn commands(r: &Redis) -> u64 {
    let info: String = r.query(redis::cmd("INFO").arg("commandstats"));
    info.lines()
        .filter_map(|l| l.split("calls=").nth(1))
        .filter_map(|v| v.split(',').next()?.parse::<u64>().ok())
        .sum()
}

/// A replica started inside a repeated hour (the clocks went back ten minutes ago) runs a job of
/// every 5 seconds every 5 s at the real time, each instant once, with a bounded number of
/// commands (it used to fire in a tight loop, for instants an hour in the past).
#[test]
fn a_replica_started_inside_a_repeated_hour_keeps_time() {
    let r = Redis::start();
    let dir = scratch("repeated");
    let back = now_secs() - 600;
    zic(
        &dir,
        &format!("Zone Test/Back 1:00 - TZB {}\n 0:00 - TZA\n", until(back)),
    );
    let log = dir.join("log");
    let file = crontab(
        &dir,
        &format!(
            "CRON_TZ=Test/Back\n*/5 * * * * * back echo $CRONLOCK_INSTANT $(date +%s) >> {}\n",
            log.display()
        ),
    );
    let before = commands(&r);
    let c = replica_in(&r, &file, &dir);
    assert!(
        wait_for(Duration::from_secs(20), || instants(&log).len() >= 3),
        "{}",
        replica_err(&file)
    );
    assert_eq!(stop(c), Some(0), "{}", replica_err(&file));
    let used = commands(&r) - before;
    let seen: Vec<(i64, i64)> = instants(&log)
        .iter()
        .map(|l| {
            let (i, at) = l.split_once(' ').unwrap();
            (unix(i), at.parse().unwrap())
        })
        .collect();
    for (i, at) in &seen {
        assert_eq!(i % 5, 0, "{seen:?}");
        assert!(
            (at - i).abs() <= 2,
            "run at {at} for the instant {i}: {seen:?}"
        );
    }
    for pair in seen.windows(2) {
        assert_eq!(pair[1].0 - pair[0].0, 5, "{seen:?}");
    }
    // Counted with the scripts' own calls: about 30 a run and 15 a second of heartbeats. A
    // replica that fired in a loop made thousands in this time.
    assert!(used < 1500, "{used} commands for {} runs", seen.len());
}

/// A job every 2 seconds keeps a 2 s rhythm across a change back and a change forward, and a
/// job at a local time in the skipped hour runs once right after the gap, its instant the gap's
/// end, with and without --catch-up.
#[test]
fn rhythm_across_both_changes_and_a_time_in_the_gap() {
    let r = Redis::start();
    let dir = scratch("changes");
    let t0 = now_secs();
    // Forward an hour at t0 + 4, back an hour at t0 + 10.
    let (forward, back) = (t0 + 4, t0 + 10);
    zic(
        &dir,
        &format!(
            "Zone Test/Both 0:00 - TZA {}\n 1:00 - TZB {}\n 0:00 - TZA\n",
            until(forward),
            until(back)
        ),
    );
    // Local time at the gap: forward's civil time at offset 0 is skipped for an hour; a job at
    // 30 minutes into it runs at the gap's end.
    let inside = jiff::Timestamp::from_second(forward + 1800).unwrap();
    let at = inside.strftime("%-S %-M %-H * * *").to_string();
    let (every, gap, gap_catch) = (dir.join("every"), dir.join("gap"), dir.join("gapc"));
    let file = crontab(
        &dir,
        &format!(
            "CRON_TZ=Test/Both\n\
             */2 * * * * * two echo $CRONLOCK_INSTANT >> {}\n\
             {at} fixed echo $CRONLOCK_INSTANT >> {}\n\
             {at} --catch-up 1m fixed-catch echo $CRONLOCK_INSTANT >> {}\n",
            every.display(),
            gap.display(),
            gap_catch.display()
        ),
    );
    let c = replica_in(&r, &file, &dir);
    assert!(
        wait_for(Duration::from_secs(25), || now_secs() > back + 5
            && !instants(&gap).is_empty()
            && !instants(&gap_catch).is_empty()),
        "{}",
        replica_err(&file)
    );
    assert_eq!(stop(c), Some(0), "{}", replica_err(&file));
    let seen: Vec<i64> = instants(&every).iter().map(|t| unix(t)).collect();
    assert!(
        seen.first().is_some_and(|f| *f < forward) && seen.last().is_some_and(|l| *l > back),
        "{seen:?}"
    );
    for pair in seen.windows(2) {
        assert_eq!(pair[1] - pair[0], 2, "the rhythm broke: {seen:?}");
    }
    for (name, file) in [("without", &gap), ("with --catch-up", &gap_catch)] {
        let runs = instants(file);
        assert_eq!(runs.len(), 1, "{name}: {runs:?}");
        assert_eq!(
            unix(&runs[0]),
            forward,
            "{name}: not the gap's end: {runs:?}"
        );
    }
}

/// A FIFO is refused at once with one line (it used to hang, deaf to SIGTERM), and a byte that
/// is not UTF-8 is named by its line.
#[test]
fn a_fifo_is_refused_and_a_bad_byte_has_its_line() {
    let r = Redis::start();
    let dir = scratch("fifo");
    let fifo = dir.join("crontab");
    let out = Command::new("mkfifo").arg(&fifo).output().unwrap();
    assert!(out.status.success());
    let started = Instant::now();
    let out = run(cronlock_at(&r.url()).arg("--crontab").arg(&fifo));
    assert_eq!(code(&out), 125, "{}", stderr(&out));
    assert!(started.elapsed() < Duration::from_secs(5));
    let line = one_line(&out);
    assert!(line.contains("not a regular file (a FIFO)"), "{line}");
    let dir = scratch("utf8");
    let file = dir.join("crontab");
    std::fs::write(&file, b"# fine\nA=1\n0 0 1 1 * k echo \xff\n").unwrap();
    let out = run(cronlock_at(&r.url()).arg("--crontab").arg(&file));
    assert_eq!(code(&out), 125, "{}", stderr(&out));
    assert!(
        one_line(&out).contains(&format!("{}:3: not UTF-8", file.display())),
        "{}",
        stderr(&out)
    );
}

/// The rules at the level of the instant function, against cron's expectations (see
/// `src/fleet/instants.rs`): helpers for the table below.
mod rules {
    use cronlock::fleet::instants::{at_or_before, next_after};
    use jiff::tz::TimeZone;
    use jiff::Timestamp;

    fn cron(expr: &str) -> croner::Cron {
        croner::parser::CronParser::builder()
            .build()
            .parse(expr)
            .unwrap()
    }

    fn at(text: &str) -> i64 {
        text.parse::<Timestamp>().unwrap().as_second()
    }

    fn show(t: i64) -> String {
        Timestamp::from_second(t).unwrap().to_string()
    }

    /// The rules, zone by zone, around both 2026 changes: every minute and every 15 minutes count
    /// elapsed minutes (in a repeated hour too, none in a skipped one), hourly likewise, and fixed
    /// times inside, before and after the changed hour run once (the first occurrence; the gap's
    /// end).
    #[test]
    fn every_rule_in_three_zones_across_both_changes() {
        // (zone, the change as UTC, the local hour it changes at, minutes it moves by).
        let changes = [
            ("Europe/Berlin", "2026-03-29T01:00:00Z", 2, 60_i32),
            ("Europe/Berlin", "2026-10-25T01:00:00Z", 3, -60),
            ("America/New_York", "2026-03-08T07:00:00Z", 2, 60),
            ("America/New_York", "2026-11-01T06:00:00Z", 2, -60),
            ("Australia/Lord_Howe", "2026-10-03T15:30:00Z", 2, 30),
            ("Australia/Lord_Howe", "2026-04-04T15:00:00Z", 2, -30),
        ];
        for (zone, change, _hour, moved) in changes {
            let c = at(change);
            let (from, to) = (c - 3 * 3600, c + 3 * 3600);
            let span = |expr: &str, fixed: bool| -> Vec<i64> {
                let (cr, tz) = (cron(expr), TimeZone::get(zone).unwrap());
                let mut out = Vec::new();
                let mut t = from;
                while let Some(n) = next_after(&cr, &tz, t, fixed) {
                    if n > to {
                        break;
                    }
                    assert_eq!(at_or_before(&cr, &tz, n, fixed), Some(n), "{zone} {expr}");
                    out.push(n);
                    t = n;
                }
                out
            };
            // Elapsed rhythm: every minute and every 15 minutes never pause or double up.
            for (expr, step) in [("* * * * *", 60), ("*/15 * * * *", 900)] {
                let got = span(expr, false);
                for pair in got.windows(2) {
                    assert_eq!(pair[1] - pair[0], step, "{zone} {change} {expr}");
                }
                assert!(
                    got.len() as i64 >= 6 * 3600 / step - 1,
                    "{zone} {expr}: {}",
                    got.len()
                );
            }
            // Hourly: whole local hours; across a change of a whole hour, still an hour apart.
            let hourly = span("0 * * * *", false);
            if moved.abs() == 60 {
                for pair in hourly.windows(2) {
                    assert_eq!(pair[1] - pair[0], 3600, "{zone} {change} hourly");
                }
            }
            fixed_times_run_once((zone, change, moved), (from, to), &span);
        }
    }

    /// Fixed times around the change `change` (at `at(change)`, moving clocks by `moved`
    /// minutes) in `zone`, over `from..to`: each runs once (`span` lists a rule's instants).
    fn fixed_times_run_once(
        (zone, change, moved): (&str, &str, i32),
        (from, to): (i64, i64),
        span: &dyn Fn(&str, bool) -> Vec<i64>,
    ) {
        let c = at(change);
        // Fixed times: each local time of the change's day within the six hours runs
        // exactly once: a skipped one at the change (the gap's end), a repeated one at its
        // first occurrence (before the change), any other at itself.
        let tz = TimeZone::get(zone).unwrap();
        let local = |t: i64| Timestamp::from_second(t).unwrap().to_zoned(tz.clone());
        let (lo, hi) = (local(from).datetime(), local(to).datetime());
        let (after, before) = (local(c).datetime(), local(c - 1).datetime());
        let day = local(c).date();
        let mut seen_times = 0;
        for minutes in (0..24 * 60).step_by(15) {
            let (h, m) = ((minutes / 60) as i8, (minutes % 60) as i8);
            let civil = day.at(h, m, 0, 0);
            if civil <= lo || civil > hi {
                continue;
            }
            seen_times += 1;
            let expr = format!("{m} {h} * * *");
            let got = span(&expr, true);
            let shown: Vec<String> = got.iter().map(|t| show(*t)).collect();
            assert_eq!(got.len(), 1, "{zone} {change} {expr}: {shown:?}");
            let skipped = moved > 0 && civil > before && civil < after;
            let repeated = moved < 0 && civil >= after && civil <= before;
            if skipped {
                assert_eq!(got[0], c, "{zone} {expr}: not the gap's end");
            } else {
                assert_eq!(local(got[0]).datetime(), civil, "{zone} {expr}");
                if repeated {
                    assert!(got[0] < c, "{zone} {expr}: not the first occurrence");
                }
            }
        }
        assert!(
            seen_times >= 12,
            "{zone} {change}: {seen_times} fixed times checked"
        );
    }
}

mod alone {
    //! The daylight-saving and crontab tests that measure time: each takes the cores for itself
    //! while it measures (`common::alone`), and `scripts/test.sh` runs them after the others.

    use super::*;

    /// 100,000 `NAME=value` lines load in well under 3 s (it took 9 s: quadratic).
    #[test]
    fn many_assignments_load_in_linear_time() {
        let r = Redis::start();
        let dir = scratch("names");
        let mut text = String::with_capacity(1 << 20);
        for i in 0..100_000 {
            text += &format!("V{i}=1\n");
        }
        text += "0 0 1 1 * names true\n";
        let file = crontab(&dir, &text);
        let _alone = measure_alone();
        let started = Instant::now();
        let c = crate::common::replicas::replica(&r.url(), &file, &[]);
        assert!(
            wait_for(Duration::from_secs(10), || replica_err(&file)
                .contains("serving 1 jobs")),
            "{}",
            replica_err(&file)
        );
        let took = started.elapsed();
        assert_eq!(stop(c), Some(0));
        assert!(took < Duration::from_secs(3), "{took:?}");
    }

    /// SIGTERM while a replica reads a long file (30,000 job lines, each checked as a command line)
    /// ends it at once, with SIGTERM's status and nothing served.
    #[test]
    fn sigterm_while_a_file_is_read_ends_the_replica_at_once() {
        let r = Redis::start();
        let dir = scratch("slowread");
        let mut text = String::with_capacity(1 << 20);
        for i in 0..30_000 {
            text += &format!("0 0 1 1 * j{i} true\n");
        }
        let file = crontab(&dir, &text);
        let _alone = measure_alone();
        let mut c = cronlock_at(&r.url())
            .arg("--crontab")
            .arg(&file)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // As soon as it runs: the file takes it far longer to read than this.
        assert!(wait_for(Duration::from_secs(5), || {
            std::fs::read_to_string(format!("/proc/{}/comm", c.id()))
                .is_ok_and(|n| n.starts_with("cronlock"))
        }));
        signal(c.id() as i32, libc::SIGTERM);
        let asked = Instant::now();
        assert!(wait_for(Duration::from_secs(5), || c
            .try_wait()
            .unwrap()
            .is_some()));
        let took = asked.elapsed();
        let status = c.wait().unwrap();
        let mut err = String::new();
        std::io::Read::read_to_string(&mut c.stderr.take().unwrap(), &mut err).unwrap();
        if err.contains("serving") {
            // The machine read it all before the signal came: nothing to judge.
            return;
        }
        // 143: ended by SIGTERM (as its status, or as the signal itself).
        let by_term = std::os::unix::process::ExitStatusExt::signal(&status) == Some(libc::SIGTERM);
        assert!(status.code() == Some(143) || by_term, "{status:?}: {err}");
        assert!(took < Duration::from_millis(1500), "{took:?}");
    }
}
