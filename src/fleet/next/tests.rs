use super::*;

fn next(expr: &str, from: &str, count: usize) -> Vec<String> {
    let schedule = Schedule::parse(expr).unwrap();
    let from = from.parse::<jiff::Timestamp>().unwrap().as_millisecond();
    instants(&schedule, Some(from), count)
        .into_iter()
        .map(|s| match s.clock_change {
            Some(c) => format!("{} | {c}", s.local),
            None => s.local,
        })
        .collect()
}

#[test]
fn day_of_month_or_day_of_week_as_cron_has_it() {
    // The 13th, or any Friday.
    assert_eq!(
        next("CRON_TZ=UTC 0 0 13 * 5", "2026-11-01T00:00:00Z", 5),
        [
            "Fri 2026-11-06 00:00:00 UTC",
            "Fri 2026-11-13 00:00:00 UTC",
            "Fri 2026-11-20 00:00:00 UTC",
            "Fri 2026-11-27 00:00:00 UTC",
            "Fri 2026-12-04 00:00:00 UTC",
        ]
    );
    // The 13th (a Sunday), or any Monday.
    assert_eq!(
        next("CRON_TZ=UTC 0 0 13 * 1", "2026-12-08T00:00:00Z", 3),
        [
            "Sun 2026-12-13 00:00:00 UTC",
            "Mon 2026-12-14 00:00:00 UTC",
            "Mon 2026-12-21 00:00:00 UTC",
        ]
    );
}

#[test]
fn steps_ranges_names_and_seconds() {
    assert_eq!(
        next(
            "CRON_TZ=UTC */20 9-10 * * mon-fri",
            "2026-11-27T10:30:00Z",
            4
        ),
        [
            "Fri 2026-11-27 10:40:00 UTC",
            "Mon 2026-11-30 09:00:00 UTC",
            "Mon 2026-11-30 09:20:00 UTC",
            "Mon 2026-11-30 09:40:00 UTC",
        ]
    );
    assert_eq!(
        next("CRON_TZ=UTC 0 12 1 JAN,JUL *", "2026-11-27T00:00:00Z", 2),
        ["Fri 2027-01-01 12:00:00 UTC", "Thu 2027-07-01 12:00:00 UTC"]
    );
    assert_eq!(
        next("CRON_TZ=UTC */20 * * * * *", "2026-11-27T10:00:50Z", 3),
        [
            "Fri 2026-11-27 10:01:00 UTC",
            "Fri 2026-11-27 10:01:20 UTC",
            "Fri 2026-11-27 10:01:40 UTC",
        ]
    );
    // At --from itself.
    assert_eq!(
        next("CRON_TZ=UTC 0 * * * *", "2026-11-27T10:00:00Z", 1),
        ["Fri 2026-11-27 10:00:00 UTC"]
    );
}

#[test]
fn nicknames() {
    let from = "2026-11-27T10:30:00Z";
    let first = |expr: &str| next(&format!("CRON_TZ=UTC {expr}"), from, 1).remove(0);
    assert_eq!(first("@yearly"), "Fri 2027-01-01 00:00:00 UTC");
    assert_eq!(first("@annually"), "Fri 2027-01-01 00:00:00 UTC");
    assert_eq!(first("@monthly"), "Tue 2026-12-01 00:00:00 UTC");
    assert_eq!(first("@weekly"), "Sun 2026-11-29 00:00:00 UTC");
    assert_eq!(first("@daily"), "Sat 2026-11-28 00:00:00 UTC");
    assert_eq!(first("@midnight"), "Sat 2026-11-28 00:00:00 UTC");
    assert_eq!(first("@hourly"), "Fri 2026-11-27 11:00:00 UTC");
}

#[test]
fn spring_forward_in_berlin() {
    // 2026-03-29: 02:00 CET becomes 03:00 CEST.
    assert_eq!(
        next(
            "CRON_TZ=Europe/Berlin 30 2 * * *",
            "2026-03-28T00:00:00Z",
            3
        ),
        [
            "Sat 2026-03-28 02:30:00 CET",
            "Sun 2026-03-29 03:00:00 CEST | clocks go forward 1h at 02:00: 02:30 does not \
             happen that day, so it runs once, at 03:00",
            "Mon 2026-03-30 02:30:00 CEST",
        ]
    );
    assert_eq!(
        next(
            "CRON_TZ=Europe/Berlin */30 * * * *",
            "2026-03-29T00:30:00Z",
            3
        ),
        [
            "Sun 2026-03-29 01:30:00 CET",
            "Sun 2026-03-29 03:00:00 CEST | an hour skipped: clocks went forward 1h at 02:00, \
             to 03:00",
            "Sun 2026-03-29 03:30:00 CEST",
        ]
    );
    // A fixed time outside the gap: no word about it.
    assert_eq!(
        next("CRON_TZ=Europe/Berlin 0 9 * * *", "2026-03-28T12:00:00Z", 1),
        ["Sun 2026-03-29 09:00:00 CEST | an hour skipped: clocks went forward 1h at 02:00, to 03:00"]
    );
}

#[test]
fn fall_back_in_berlin() {
    // 2026-10-25: 03:00 CEST becomes 02:00 CET.
    assert_eq!(
        next(
            "CRON_TZ=Europe/Berlin 30 2 * * *",
            "2026-10-24T12:00:00Z",
            2
        ),
        [
            "Sun 2026-10-25 02:30:00 CEST | 02:00–03:00 comes twice (clocks go back 1h at \
             03:00); an hour run once: this is its only run",
            "Mon 2026-10-26 02:30:00 CET",
        ]
    );
    assert_eq!(
        next(
            "CRON_TZ=Europe/Berlin 30 * * * *",
            "2026-10-24T23:45:00Z",
            3
        ),
        [
            "Sun 2026-10-25 02:30:00 CEST | 02:00–03:00 comes twice (clocks go back 1h at \
             03:00); it runs in both",
            "Sun 2026-10-25 02:30:00 CET | 02:00–03:00 again (clocks went back 1h at 03:00): \
             it runs again",
            "Sun 2026-10-25 03:30:00 CET",
        ]
    );
}

#[test]
fn h_is_drawn_as_the_fleet_draws_it() {
    let schedule = Schedule::parse("CRON_TZ=UTC H H * * *")
        .unwrap()
        .for_key("backup")
        .unwrap();
    let drawn = crate::fleet::spread::resolve("H H * * *", "backup").unwrap();
    assert_eq!(schedule.resolved.as_deref(), Some(drawn.as_str()));
    let query = NextQuery {
        schedule,
        key: Some("backup".into()),
        count: 2,
        from_ms: Some(0),
        json: false,
    };
    let text = render(&query);
    assert!(
        text.starts_with(&format!("H drawn for KEY 'backup': {drawn}\n")),
        "{text}"
    );
    assert_eq!(text.lines().count(), 3, "{text}");
}
