//! `--schedule CRON`: once per *scheduled instant* across the fleet, not merely not-concurrently.
//!
//! Every host fires for the same schedule (crontab, CronJob, timer), each a little early or late
//! by its own clock. A run belongs to the schedule's instant nearest to **Redis's** clock: cronlock
//! computes the instants around its own clock (two before, two after) and the acquire script picks
//! the one nearest to Redis `TIME`, so host clock skew does not matter. The script records the
//! instant for the KEY; a host firing for an instant that already started skips, even after the
//! lock was released (the run a `--min-hold` would only approximate).
//!
//! Expressions are cron's: 5 fields, or 6 with seconds first; ranges, steps, lists, names and
//! `@hourly`-style nicknames, parsed and evaluated by `croner`; `H` draws a value from KEY
//! (`spread.rs`). The time zone is a `CRON_TZ=` or
//! `TZ=` prefix, else the `TZ` variable, else the system's (`/etc/localtime`), all from the
//! system's tz database through `jiff`, as cron itself does.

use croner::parser::CronParser;
use croner::Cron;
use jiff::tz::TimeZone;

use crate::fleet::{instants, spread};

/// A parsed `--schedule`.
#[derive(Clone, Debug)]
pub struct Schedule {
    /// As the user wrote it (stored with the run, shown by `--status`).
    pub text: String,
    /// Shared between schedules of the same expression (see [`parsed`]).
    cron: std::sync::Arc<Cron>,
    zone: TimeZone,
    /// The hour field names hours: the job runs at a local time, once a day across a
    /// daylight-saving change; otherwise (`*`, a step) on elapsed time ([`instants`]).
    fixed: bool,
    /// With an `H` field ([`spread`]): the expression as KEY resolved it (as drawn for no KEY
    /// until [`Schedule::for_key`]).
    pub resolved: Option<String>,
}

/// The most distinct expressions kept for sharing.
const SHARED_MAX: usize = 4096;

/// `expr` parsed, shared with every other schedule of the same expression: croner keeps about 6
/// KiB per expression (a byte per possible year among them), and a replica's thousand jobs
/// mostly share a few expressions (many jobs at `0 0 * * *`).
fn parsed(parser: &CronParser, expr: &str) -> Result<std::sync::Arc<Cron>, String> {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};
    static SHARED: Mutex<Option<HashMap<String, Arc<Cron>>>> = Mutex::new(None);
    let mut shared = SHARED.lock().unwrap_or_else(|e| e.into_inner());
    let map = shared.get_or_insert_with(HashMap::new);
    if let Some(cron) = map.get(expr) {
        return Ok(cron.clone());
    }
    let cron = Arc::new(parser.parse(expr).map_err(|e| explain(parser, expr, &e))?);
    if map.len() < SHARED_MAX {
        map.insert(expr.to_string(), cron.clone());
    }
    Ok(cron)
}

/// How many instants on each side of the local clock go to the acquire script.
const AROUND: usize = 2;

/// The zone `name` read from its file in the tz database (`TZDIR`, else
/// `/usr/share/zoneinfo`), when the name is a plain path there. Looking a name up in jiff's
/// database first lists every zone in the directory tree (about a hundred directory reads, a
/// millisecond or more), which every scheduled run and every replica would pay at start.
fn zone_file(name: &str) -> Option<jiff::tz::TimeZone> {
    if name == "UTC" || name == "Etc/UTC" {
        return Some(jiff::tz::TimeZone::UTC);
    }
    let plain = !name.is_empty()
        && !name.starts_with('/')
        && name
            .split('/')
            .all(|part| !part.is_empty() && part != "." && part != "..");
    if !plain {
        return None;
    }
    let dir = std::env::var_os("TZDIR").unwrap_or_else(|| "/usr/share/zoneinfo".into());
    let path = std::path::Path::new(&dir).join(name);
    // A zone file is a few KiB; anything larger is not one.
    let file = std::fs::File::open(path).ok()?;
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut std::io::Read::take(file, 1 << 20), &mut bytes).ok()?;
    jiff::tz::TimeZone::tzif(name, &bytes).ok()
}

/// How a schedule's `H` fields get their values: drawn for a KEY, or as they were drawn (a
/// schedule read back, [`Schedule`]'s `Deserialize`).
enum Drawn<'a> {
    For(&'a str),
    As(Option<String>),
}

/// A schedule as it crosses to another process (a crontab job's run): its text and its `H`
/// fields' values; parsed again there (its parsed form is croner's, shared in this process).
#[derive(serde::Serialize, serde::Deserialize)]
struct ScheduleText {
    text: String,
    resolved: Option<String>,
}

impl serde::Serialize for Schedule {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let text = ScheduleText {
            text: self.text.clone(),
            resolved: self.resolved.clone(),
        };
        text.serialize(s)
    }
}

impl<'de> serde::Deserialize<'de> for Schedule {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Schedule, D::Error> {
        let t = ScheduleText::deserialize(d)?;
        Schedule::parse_for(&t.text, Drawn::As(t.resolved))
            .map_err(|e| serde::de::Error::custom(format!("schedule '{}': {e}", t.text)))
    }
}

const FIELDS_5: [&str; 5] = ["minute", "hour", "day-of-month", "month", "day-of-week"];

impl Schedule {
    /// Parse `text`; the error names the offending field or time zone. An `H` field is drawn
    /// for no KEY: [`Schedule::for_key`] draws it for the job's.
    pub fn parse(text: &str) -> Result<Schedule, String> {
        Schedule::parse_for(text, Drawn::For(""))
    }

    /// This schedule with its `H` fields drawn for `key` (itself when it has none).
    pub fn for_key(&self, key: &str) -> Result<Schedule, String> {
        match self.resolved {
            Some(_) => Schedule::parse_for(&self.text, Drawn::For(key)),
            None => Ok(self.clone()),
        }
    }

    fn parse_for(text: &str, drawn: Drawn<'_>) -> Result<Schedule, String> {
        let trimmed = text.trim();
        let (zone, expr) = match trimmed.split_once(char::is_whitespace) {
            Some((first, rest)) if first.starts_with("CRON_TZ=") || first.starts_with("TZ=") => {
                let name = first.split_once('=').map_or("", |(_, n)| n);
                let tz = zone_file(name).map_or_else(|| jiff::tz::TimeZone::get(name), Ok);
                let tz = tz.map_err(|_| {
                    format!("unknown time zone '{name}' (not in the system's tz database)")
                })?;
                (tz, rest.trim())
            }
            _ => (TimeZone::system(), trimmed),
        };
        // cron's `@midnight` is `@daily`; croner knows only the latter.
        let expr = if expr.eq_ignore_ascii_case("@midnight") {
            "@daily"
        } else {
            expr
        };
        let resolved = match drawn {
            Drawn::For(key) => spread::is_hashed(expr)
                .then(|| spread::resolve(expr, key))
                .transpose()?,
            Drawn::As(resolved) if resolved.is_some() == spread::is_hashed(expr) => resolved,
            Drawn::As(_) => return Err("its H fields and their values differ".into()),
        };
        let parser = CronParser::builder().build();
        let cron = parsed(&parser, resolved.as_deref().unwrap_or(expr))?;
        let hours = &cron.pattern.hours;
        let fixed = !(hours.from_wildcard || hours.step > 1);
        let schedule = Schedule {
            text: trimmed.to_string(),
            cron,
            zone,
            fixed,
            resolved,
        };
        if schedule
            .next_after(crate::clock::unix_millis() as i64)
            .is_none()
        {
            return Err("it never matches a date".into());
        }
        Ok(schedule)
    }

    /// The first instant strictly after `ms` (never in the past, whatever moment of a
    /// daylight-saving change it is asked at).
    pub fn next_after(&self, ms: i64) -> Option<i64> {
        instants::next_after(&self.cron, &self.zone, ms.div_euclid(1000), self.fixed)
            .map(|s| s * 1000)
    }

    /// The last instant at or before `ms`.
    pub fn at_or_before(&self, ms: i64) -> Option<i64> {
        instants::at_or_before(&self.cron, &self.zone, ms.div_euclid(1000), self.fixed)
            .map(|s| s * 1000)
    }

    /// At most `max` instants before `before_ms`, down to `since_ms`, newest first.
    pub fn earlier(&self, before_ms: i64, since_ms: i64, max: usize) -> Vec<i64> {
        let mut out = Vec::new();
        let mut t = before_ms - 1000;
        while out.len() < max {
            match self.at_or_before(t) {
                Some(p) if p >= since_ms => {
                    out.push(p);
                    t = p - 1000;
                }
                _ => break,
            }
        }
        out
    }

    /// The instants around `now_ms` for the acquire script to choose from, oldest first.
    pub fn candidates(&self, now_ms: i64) -> Vec<i64> {
        let mut out = Vec::with_capacity(2 * AROUND);
        let mut t = now_ms;
        for _ in 0..AROUND {
            match self.at_or_before(t) {
                Some(p) => {
                    out.push(p);
                    t = p - 1000;
                }
                None => break,
            }
        }
        out.reverse();
        let mut t = now_ms;
        for _ in 0..AROUND {
            match self.next_after(t) {
                Some(n) => {
                    out.push(n);
                    t = n;
                }
                None => break,
            }
        }
        out.dedup();
        out
    }

    /// The schedule's time zone.
    pub fn zone(&self) -> &TimeZone {
        &self.zone
    }

    /// The daylight-saving change that bears on instant `ms`, the instant before it being
    /// `prev_ms` (see [`instants::clock_change`]).
    pub fn clock_change(&self, prev_ms: i64, ms: i64) -> Option<instants::ClockChange> {
        instants::clock_change(
            &self.cron,
            &self.zone,
            prev_ms.div_euclid(1000),
            ms.div_euclid(1000),
            self.fixed,
        )
    }

    /// An instant as people name it: `02:00` (`02:00:10` with seconds), with the date when it
    /// is not today, in the schedule's time zone.
    pub fn label(&self, ms: i64) -> String {
        self.label_at(ms, crate::clock::unix_millis() as i64)
    }

    /// [`Schedule::label`] as seen at `now_ms`.
    pub fn label_at(&self, ms: i64, now_ms: i64) -> String {
        let (Ok(ts), Ok(now)) = (
            jiff::Timestamp::from_millisecond(ms),
            jiff::Timestamp::from_millisecond(now_ms),
        ) else {
            return ms.to_string();
        };
        let z = ts.to_zoned(self.zone.clone());
        let today = now.to_zoned(self.zone.clone()).date();
        let time = if z.second() == 0 {
            z.strftime("%H:%M").to_string()
        } else {
            z.strftime("%H:%M:%S").to_string()
        };
        if z.date() == today {
            time
        } else {
            format!("{} {time}", z.strftime("%Y-%m-%d"))
        }
    }
}

/// Name the field of `expr` that croner refused, by parsing each field alone.
fn explain(parser: &CronParser, expr: &str, err: &croner::errors::CronError) -> String {
    let fields: Vec<&str> = expr.split_whitespace().collect();
    let names: Vec<&str> = match fields.len() {
        5 => FIELDS_5.to_vec(),
        6 => [&["second"][..], &FIELDS_5[..]].concat(),
        7 => [&["second"][..], &FIELDS_5[..], &["year"][..]].concat(),
        _ if expr.starts_with('@') => {
            return format!(
                "unknown nickname '{expr}' (use @yearly, @annually, @monthly, @weekly, @daily, @midnight or @hourly)"
            );
        }
        n => {
            return format!("it has {n} fields: cron expressions have 5 (or 6, with seconds first)")
        }
    };
    for (i, field) in fields.iter().enumerate() {
        let alone: Vec<&str> = (0..fields.len())
            .map(|j| if j == i { *field } else { "*" })
            .collect();
        if parser.parse(&alone.join(" ")).is_err() {
            return format!("the {} field '{field}' is invalid", names[i]);
        }
    }
    format!("{err}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn utc(text: &str) -> Schedule {
        Schedule::parse(&format!("TZ=UTC {text}")).unwrap()
    }

    #[test]
    fn five_and_six_fields_and_nicknames() {
        // 2026-11-21T02:00:07Z
        let now = 1_795_226_407_000;
        let s = utc("*/10 * * * * *");
        assert_eq!(s.at_or_before(now), Some(1_795_226_400_000));
        assert_eq!(s.next_after(now), Some(1_795_226_410_000));
        assert_eq!(
            s.candidates(now),
            vec![
                1_795_226_390_000,
                1_795_226_400_000,
                1_795_226_410_000,
                1_795_226_420_000
            ]
        );
        let s = utc("0 2 * * *");
        assert_eq!(s.at_or_before(now), Some(1_795_226_400_000));
        assert_eq!(utc("@daily").next_after(now), Some(1_795_305_600_000));
        assert_eq!(
            utc("0 2 * nov sat").at_or_before(now),
            Some(1_795_226_400_000)
        );
    }

    #[test]
    fn time_zones() {
        let berlin = Schedule::parse("CRON_TZ=Europe/Berlin 0 3 * * *").unwrap();
        // 03:00 in Berlin is 02:00 UTC in November.
        assert_eq!(
            berlin.at_or_before(1_795_226_407_000),
            Some(1_795_226_400_000)
        );
        let err = Schedule::parse("CRON_TZ=Mars/Olympus 0 3 * * *").unwrap_err();
        assert!(err.contains("Mars/Olympus"), "{err}");
    }

    #[test]
    fn errors_name_the_field() {
        let err = Schedule::parse("61 * * * *").unwrap_err();
        assert!(err.contains("minute field '61'"), "{err}");
        let err = Schedule::parse("0 25 * * *").unwrap_err();
        assert!(err.contains("hour field '25'"), "{err}");
        let err = Schedule::parse("* * * * * * * *").unwrap_err();
        assert!(err.contains("8 fields"), "{err}");
        let err = Schedule::parse("0 0 * * funday").unwrap_err();
        assert!(err.contains("day-of-week"), "{err}");
        let err = Schedule::parse("@reboot").unwrap_err();
        assert!(err.contains("@reboot"), "{err}");
        assert!(Schedule::parse("0 0 31 2 *").is_err());
    }
}
