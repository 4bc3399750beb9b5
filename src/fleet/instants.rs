//! A schedule's instants across daylight-saving changes, as cron users rely on them (cronie's
//! and Vixie cron's rules, which Kubernetes CronJob documents too):
//! - a job whose hour field is `*` or a step (every minute, every 15 minutes, `0 * * * *`, `*/10`
//!   seconds) runs on elapsed time: across a change it keeps its rhythm, and runs in a repeated
//!   hour too (both times its minutes come round);
//! - a job at a fixed local time runs once a day: in a repeated hour at its first occurrence
//!   only; in a skipped hour once, right after the gap, and that instant is the gap's end.
//!
//! The search walks the zone's stretches of constant offset: inside one, local and absolute time
//! differ by a fixed amount, so croner matches the pattern on local (civil) time, evaluated as
//! if it were UTC. A next instant is therefore always after the time asked about, never in the
//! past, whatever moment of a change it is asked at.

use croner::Cron;
use jiff::tz::TimeZone;
use jiff::Timestamp;

/// How many stretches of constant offset one search crosses at most (a zone changes twice a
/// year; this bounds a pattern that never matches, such as February 30).
const MAX_STRETCHES: usize = 64;

/// A stretch of constant offset: from `start` (the change into it; None: since ever) to `end`
/// (None: for ever), with `off` in it and `before` the offset before `start` (seconds).
struct Stretch {
    start: Option<i64>,
    end: Option<i64>,
    off: i64,
    before: i64,
}

fn offset_at(tz: &TimeZone, t: i64) -> i64 {
    Timestamp::from_second(t).map_or(0, |ts| i64::from(tz.to_offset(ts).seconds()))
}

/// The stretch that holds second `t`.
fn stretch_at(tz: &TimeZone, t: i64) -> Stretch {
    let start = Timestamp::from_second(t.saturating_add(1))
        .ok()
        .and_then(|ts| tz.preceding(ts).next())
        .map(|tr| tr.timestamp().as_second());
    let end = Timestamp::from_second(t)
        .ok()
        .and_then(|ts| tz.following(ts).next())
        .map(|tr| tr.timestamp().as_second());
    let off = offset_at(tz, t);
    let before = start.map_or(off, |s| offset_at(tz, s - 1));
    Stretch {
        start,
        end,
        off,
        before,
    }
}

/// The civil second as croner sees it (as UTC).
fn civil(s: i64) -> Option<chrono::DateTime<chrono::Utc>> {
    chrono::DateTime::from_timestamp(s, 0)
}

/// The first civil second after `c` (exclusive) the pattern matches.
fn civil_next(cron: &Cron, c: i64) -> Option<i64> {
    let at = civil(c)?;
    cron.find_next_occurrence(&at, false)
        .ok()
        .map(|m| m.timestamp())
}

/// The last civil second at or before `c` the pattern matches.
fn civil_prev(cron: &Cron, c: i64) -> Option<i64> {
    let at = civil(c)?;
    cron.find_previous_occurrence(&at, true)
        .ok()
        .map(|m| m.timestamp())
}

/// The first instant (Unix seconds) strictly after second `t`. `fixed`: the hour field names
/// hours (runs once a day at a local time), rather than `*` or a step (runs on elapsed time).
pub fn next_after(cron: &Cron, tz: &TimeZone, t: i64, fixed: bool) -> Option<i64> {
    let mut s = stretch_at(tz, t);
    // The civil second the match must come after.
    let mut from = t + s.off;
    for _ in 0..MAX_STRETCHES {
        if let (true, Some(start)) = (fixed && s.before > s.off, s.start) {
            // Fall back: the civil times [start + off, start + before) came once already, in
            // the stretch before; a job at a fixed time runs at their first occurrence only.
            from = from.max(start + s.before - 1);
        }
        let m = civil_next(cron, from)?;
        let Some(end) = s.end else {
            return Some(m - s.off);
        };
        if m < end + s.off {
            return Some(m - s.off);
        }
        let next = stretch_at(tz, end);
        // Spring forward: the civil times [end + off, end + next.off) do not happen. A job at a
        // fixed time among them runs once, at the gap's end.
        if fixed && next.off > s.off && m < end + next.off {
            return Some(end);
        }
        from = end + next.off - 1;
        s = next;
    }
    None
}

/// The last instant (Unix seconds) at or before second `t` (see [`next_after`]).
pub fn at_or_before(cron: &Cron, tz: &TimeZone, t: i64, fixed: bool) -> Option<i64> {
    let mut s = stretch_at(tz, t);
    // The civil second the match must be at or before.
    let mut to = t + s.off;
    for _ in 0..MAX_STRETCHES {
        let m = civil_prev(cron, to)?;
        let Some(start) = s.start else {
            return Some(m - s.off);
        };
        if m >= start + s.off {
            // Fall back: a fixed time in the repeated civil hour ran at its first occurrence,
            // in the stretch before.
            if fixed && s.before > s.off && m < start + s.before {
                let before = stretch_at(tz, start - 1);
                to = m;
                s = before;
                continue;
            }
            return Some(m - s.off);
        }
        // Spring forward into this stretch: a fixed time in the skipped civil times ran at the
        // gap's end.
        if fixed && s.off > s.before && m >= start + s.before {
            return Some(start);
        }
        let before = stretch_at(tz, start - 1);
        to = start + before.off - 1;
        s = before;
    }
    None
}

/// A change of the zone's offset (daylight saving) that bears on an instant, for people to read
/// beside it (`--next`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClockChange {
    /// The clocks went forward at `at` (Unix seconds) by `by` seconds, after the instant before
    /// this one: the civil times `[at + before, at + before + by)` did not happen. `in_gap`: the
    /// civil second (as UTC) a job at a fixed time named inside them, run once at the gap's end,
    /// which is this instant.
    Forward {
        at: i64,
        before: i64,
        by: i64,
        in_gap: Option<i64>,
    },
    /// The clocks go back at `at` by `by` seconds (to offset `after`), and this instant's local
    /// time comes twice. `first`: this is its first occurrence; `once`: a job at a fixed time,
    /// which runs at the first only (else on elapsed time, at both).
    Back {
        at: i64,
        after: i64,
        by: i64,
        first: bool,
        once: bool,
    },
}

/// The offset change that bears on instant `t`, the instant before it being `prev` (Unix
/// seconds): a spring forward between them, or a fall back that makes `t`'s local time come
/// twice.
pub fn clock_change(
    cron: &Cron,
    tz: &TimeZone,
    prev: i64,
    t: i64,
    fixed: bool,
) -> Option<ClockChange> {
    let changes = Timestamp::from_second(prev)
        .ok()
        .into_iter()
        .flat_map(|p| tz.following(p).take(MAX_STRETCHES))
        .map(|tr| tr.timestamp().as_second())
        .take_while(|&at| at <= t);
    for at in changes {
        let (before, after) = (offset_at(tz, at - 1), offset_at(tz, at));
        if after > before {
            // A job at a fixed time in the gap runs at its end: this instant, when the pattern
            // does not name it itself.
            let named = civil_prev(cron, t + after) == Some(t + after);
            let in_gap = (fixed && t == at && !named)
                .then(|| civil_next(cron, at + before - 1))
                .flatten()
                .filter(|&c| c < at + after);
            return Some(ClockChange::Forward {
                at,
                before,
                by: after - before,
                in_gap,
            });
        }
    }
    let stamp = Timestamp::from_second(t).ok()?;
    let back = |at: i64| {
        let (before, after) = (offset_at(tz, at - 1), offset_at(tz, at));
        (before > after).then_some((at, before, after))
    };
    // The fall back after `t` whose repeated civil times hold `t`'s: the first occurrence.
    let next = tz
        .following(stamp)
        .next()
        .map(|tr| tr.timestamp().as_second());
    if let Some((at, before, after)) = next.and_then(back) {
        if t >= at - (before - after) {
            return Some(ClockChange::Back {
                at,
                after,
                by: before - after,
                first: true,
                once: fixed,
            });
        }
    }
    let last = Timestamp::from_second(t.saturating_add(1))
        .ok()
        .and_then(|ts| tz.preceding(ts).next())
        .map(|tr| tr.timestamp().as_second());
    if let Some((at, before, after)) = last.and_then(back) {
        if t < at + (before - after) {
            return Some(ClockChange::Back {
                at,
                after,
                by: before - after,
                first: false,
                once: fixed,
            });
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use croner::parser::CronParser;

    fn cron(expr: &str) -> Cron {
        CronParser::builder().build().parse(expr).unwrap()
    }

    fn at(text: &str) -> i64 {
        text.parse::<Timestamp>().unwrap().as_second()
    }

    fn show(t: i64) -> String {
        Timestamp::from_second(t).unwrap().to_string()
    }

    /// The instants from `from` (exclusive) to `to` (inclusive), as UTC text.
    fn run(expr: &str, zone: &str, fixed: bool, from: &str, to: &str) -> Vec<String> {
        let (c, tz) = (cron(expr), TimeZone::get(zone).unwrap());
        let mut out = Vec::new();
        let mut t = at(from);
        while let Some(n) = next_after(&c, &tz, t, fixed) {
            assert!(n > t, "{expr}: {} is not after {}", show(n), show(t));
            if n > at(to) {
                break;
            }
            // Walking back finds the same instant.
            assert_eq!(
                at_or_before(&c, &tz, n, fixed),
                Some(n),
                "{expr} at {}",
                show(n)
            );
            assert_eq!(
                at_or_before(&c, &tz, n + 1, fixed),
                Some(n),
                "{expr} at {}",
                show(n)
            );
            out.push(show(n));
            t = n;
        }
        out
    }

    #[test]
    fn berlin_spring_forward() {
        // 2026-03-29: 02:00 CET (01:00Z) becomes 03:00 CEST.
        let every15 = run(
            "*/15 * * * *",
            "Europe/Berlin",
            false,
            "2026-03-29T00:30Z",
            "2026-03-29T01:30Z",
        );
        assert_eq!(
            every15,
            [
                "2026-03-29T00:45:00Z",
                "2026-03-29T01:00:00Z",
                "2026-03-29T01:15:00Z",
                "2026-03-29T01:30:00Z"
            ]
        );
        // At 02:30, a skipped time: once, at the gap's end.
        let fixed = run(
            "30 2 * * *",
            "Europe/Berlin",
            true,
            "2026-03-28T00:00Z",
            "2026-03-30T12:00Z",
        );
        assert_eq!(
            fixed,
            [
                "2026-03-28T01:30:00Z",
                "2026-03-29T01:00:00Z",
                "2026-03-30T00:30:00Z"
            ]
        );
        // Before and after the changed hour: as always.
        let before = run(
            "30 1 * * *",
            "Europe/Berlin",
            true,
            "2026-03-28T12:00Z",
            "2026-03-29T12:00Z",
        );
        assert_eq!(before, ["2026-03-29T00:30:00Z"]);
        let after = run(
            "30 3 * * *",
            "Europe/Berlin",
            true,
            "2026-03-28T12:00Z",
            "2026-03-29T12:00Z",
        );
        assert_eq!(after, ["2026-03-29T01:30:00Z"]);
        let hourly = run(
            "0 * * * *",
            "Europe/Berlin",
            false,
            "2026-03-28T23:30Z",
            "2026-03-29T02:30Z",
        );
        assert_eq!(
            hourly,
            [
                "2026-03-29T00:00:00Z",
                "2026-03-29T01:00:00Z",
                "2026-03-29T02:00:00Z"
            ]
        );
    }

    #[test]
    fn berlin_fall_back() {
        // 2026-10-25: 03:00 CEST (01:00Z) becomes 02:00 CET; 02:00-03:00 comes twice.
        let every15 = run(
            "*/15 * * * *",
            "Europe/Berlin",
            false,
            "2026-10-25T00:30Z",
            "2026-10-25T01:30Z",
        );
        assert_eq!(
            every15,
            [
                "2026-10-25T00:45:00Z",
                "2026-10-25T01:00:00Z",
                "2026-10-25T01:15:00Z",
                "2026-10-25T01:30:00Z"
            ]
        );
        let hourly = run(
            "0 * * * *",
            "Europe/Berlin",
            false,
            "2026-10-24T23:30Z",
            "2026-10-25T02:30Z",
        );
        assert_eq!(
            hourly,
            [
                "2026-10-25T00:00:00Z",
                "2026-10-25T01:00:00Z",
                "2026-10-25T02:00:00Z"
            ]
        );
        // At 02:30, a repeated time: its first occurrence only.
        let fixed = run(
            "30 2 * * *",
            "Europe/Berlin",
            true,
            "2026-10-24T00:00Z",
            "2026-10-26T12:00Z",
        );
        assert_eq!(
            fixed,
            [
                "2026-10-24T00:30:00Z",
                "2026-10-25T00:30:00Z",
                "2026-10-26T01:30:00Z"
            ]
        );
        let before = run(
            "30 1 * * *",
            "Europe/Berlin",
            true,
            "2026-10-24T12:00Z",
            "2026-10-25T12:00Z",
        );
        assert_eq!(before, ["2026-10-24T23:30:00Z"]);
        let after = run(
            "30 3 * * *",
            "Europe/Berlin",
            true,
            "2026-10-24T12:00Z",
            "2026-10-25T12:00Z",
        );
        assert_eq!(after, ["2026-10-25T02:30:00Z"]);
        let minute = run(
            "* * * * *",
            "Europe/Berlin",
            false,
            "2026-10-25T00:58Z",
            "2026-10-25T01:02Z",
        );
        assert_eq!(minute.len(), 4, "{minute:?}");
    }

    #[test]
    fn new_york_both_changes() {
        // 2026-03-08: 02:00 EST (07:00Z) becomes 03:00 EDT; 2026-11-01: 02:00 EDT (06:00Z)
        // becomes 01:00 EST.
        let fixed = run(
            "30 2 * * *",
            "America/New_York",
            true,
            "2026-03-07T12:00Z",
            "2026-03-08T12:00Z",
        );
        assert_eq!(fixed, ["2026-03-08T07:00:00Z"]);
        let fold = run(
            "30 1 * * *",
            "America/New_York",
            true,
            "2026-10-31T12:00Z",
            "2026-11-01T12:00Z",
        );
        assert_eq!(fold, ["2026-11-01T05:30:00Z"]);
        let every15 = run(
            "*/15 * * * *",
            "America/New_York",
            false,
            "2026-11-01T05:30Z",
            "2026-11-01T06:30Z",
        );
        assert_eq!(
            every15,
            [
                "2026-11-01T05:45:00Z",
                "2026-11-01T06:00:00Z",
                "2026-11-01T06:15:00Z",
                "2026-11-01T06:30:00Z"
            ]
        );
        let every15 = run(
            "*/15 * * * *",
            "America/New_York",
            false,
            "2026-03-08T06:30Z",
            "2026-03-08T07:30Z",
        );
        assert_eq!(
            every15,
            [
                "2026-03-08T06:45:00Z",
                "2026-03-08T07:00:00Z",
                "2026-03-08T07:15:00Z",
                "2026-03-08T07:30:00Z"
            ]
        );
    }

    #[test]
    fn lord_howe_half_hour_changes() {
        // 2026-04-05: 02:00 +11 (15:00Z on the 4th) becomes 01:30 +10:30; 2026-10-04: 02:00
        // +10:30 (15:30Z on the 3rd) becomes 02:30 +11.
        let tz = "Australia/Lord_Howe";
        let fold = run(
            "45 1 * * *",
            tz,
            true,
            "2026-04-04T00:00Z",
            "2026-04-05T00:00Z",
        );
        assert_eq!(fold, ["2026-04-04T14:45:00Z"]);
        let every15 = run(
            "*/15 * * * *",
            tz,
            false,
            "2026-04-04T14:30Z",
            "2026-04-04T15:30Z",
        );
        assert_eq!(
            every15,
            [
                "2026-04-04T14:45:00Z",
                "2026-04-04T15:00:00Z",
                "2026-04-04T15:15:00Z",
                "2026-04-04T15:30:00Z"
            ]
        );
        let gap = run(
            "15 2 * * *",
            tz,
            true,
            "2026-10-03T00:00Z",
            "2026-10-04T00:00Z",
        );
        assert_eq!(gap, ["2026-10-03T15:30:00Z"]);
        let edge = run(
            "30 2 * * *",
            tz,
            true,
            "2026-10-03T00:00Z",
            "2026-10-04T00:00Z",
        );
        assert_eq!(edge, ["2026-10-03T15:30:00Z"]);
        // Whole local hours fall at :30 UTC before the change and :00 after; 02:00 never comes
        // (cron runs a wildcard-hour job only at times that happen).
        let hourly = run(
            "0 * * * *",
            tz,
            false,
            "2026-10-03T13:45Z",
            "2026-10-03T17:00Z",
        );
        assert_eq!(
            hourly,
            [
                "2026-10-03T14:30:00Z",
                "2026-10-03T16:00:00Z",
                "2026-10-03T17:00:00Z"
            ]
        );
        let every15 = run(
            "*/15 * * * *",
            tz,
            false,
            "2026-10-03T15:00Z",
            "2026-10-03T15:45Z",
        );
        assert_eq!(
            every15,
            [
                "2026-10-03T15:15:00Z",
                "2026-10-03T15:30:00Z",
                "2026-10-03T15:45:00Z"
            ]
        );
    }

    #[test]
    fn asked_inside_a_change_the_next_instant_is_ahead() {
        let (c, tz) = (
            cron("*/10 * * * * *"),
            TimeZone::get("Europe/Berlin").unwrap(),
        );
        let start = at("2026-10-25T00:59:00Z");
        for t in start..start + 240 {
            let n = next_after(&c, &tz, t, false).unwrap();
            assert!(n > t && n <= t + 10, "{} -> {}", show(t), show(n));
            let p = at_or_before(&c, &tz, t, false).unwrap();
            assert!(p <= t && p > t - 10, "{} <- {}", show(t), show(p));
        }
    }
}
