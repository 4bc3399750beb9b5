//! `H` in a cron field, as Jenkins defines it: a value drawn from a hash of the job's KEY, so 300
//! jobs written `H 0 * * *` spread over the hour instead of all starting at 00:00, and every host
//! of a fleet (and every restart) draws the same value for the same KEY.
//!
//! - `H`: one value in the field's range (minutes 0-59, hours 0-23, days of the month 1-28, so
//!   that every month has it, months 1-12, days of the week 0-6, seconds 0-59);
//! - `H(A-B)`: one value from A to B;
//! - `H/N`: every N from an offset below N (`H/15` in minutes: 7,22,37,52 for one KEY);
//! - `H(A-B)/N`: every N from A plus an offset, up to B.
//!
//! `--jitter SPAN` draws KEY's offset within SPAN the same way ([`offset`]).
//!
//! The hash is FNV-1a (64 bits) of KEY, mixed with the field's place by SplitMix64: fixed here
//! for good, since a change would move every such job's times on an upgrade.

/// The values a field can hold, from `lo` to `hi`.
#[derive(Clone, Copy)]
struct FieldRange {
    lo: u32,
    hi: u32,
}

const fn range(lo: u32, hi: u32) -> FieldRange {
    FieldRange { lo, hi }
}

/// The fields' ranges for `H`, seconds first when there are six fields.
const RANGES_6: [FieldRange; 6] = [
    range(0, 59),
    range(0, 59),
    range(0, 23),
    range(1, 28),
    range(1, 12),
    range(0, 6),
];

/// Whether `expr` has an `H` field (a nickname such as `@daily` never has).
pub fn is_hashed(expr: &str) -> bool {
    !expr.trim_start().starts_with('@')
        && expr
            .split_whitespace()
            .any(|f| f.split(',').any(|p| p.starts_with('H')))
}

/// `expr` (5 or 6 fields, no zone prefix) with each `H` replaced by KEY's value; the error names
/// the field.
pub fn resolve(expr: &str, key: &str) -> Result<String, String> {
    let fields: Vec<&str> = expr.split_whitespace().collect();
    let ranges: &[FieldRange] = match fields.len() {
        6 => &RANGES_6,
        5 => &RANGES_6[1..],
        _ => return Ok(expr.to_string()),
    };
    let names: &[&str] = if fields.len() == 6 {
        &[
            "second",
            "minute",
            "hour",
            "day-of-month",
            "month",
            "day-of-week",
        ]
    } else {
        &["minute", "hour", "day-of-month", "month", "day-of-week"]
    };
    let base = fnv1a(key.as_bytes());
    let mut out = Vec::with_capacity(fields.len());
    for (i, field) in fields.iter().enumerate() {
        // The place counts from the minutes, so a 5- and a 6-field line agree on them.
        let place = i + 6 - fields.len();
        let draw = mix(base ^ (place as u64 + 1));
        let parts: Result<Vec<String>, String> =
            field.split(',').map(|p| part(p, ranges[i], draw)).collect();
        let parts = parts.map_err(|e| format!("bad {} field '{field}': {e}", names[i]))?;
        out.push(parts.join(","));
    }
    Ok(out.join(" "))
}

/// One comma-separated part of a field: itself unless it starts with `H`.
fn part(p: &str, field: FieldRange, draw: u64) -> Result<String, String> {
    let FieldRange { lo, hi } = field;
    let Some(rest) = p.strip_prefix('H') else {
        return Ok(p.to_string());
    };
    let (range, step) = match rest.split_once('/') {
        Some((range, step)) => (range, Some(step)),
        None => (rest, None),
    };
    let (a, b) = if range.is_empty() {
        (lo, hi)
    } else {
        let inner = range
            .strip_prefix('(')
            .and_then(|r| r.strip_suffix(')'))
            .ok_or("H takes a range as H(A-B)")?;
        let (a, b) = inner.split_once('-').ok_or("H takes a range as H(A-B)")?;
        let (a, b) = (number(a)?, number(b)?);
        if a > b || a < lo || b > hi {
            return Err(format!("H({a}-{b}) is not within {lo}-{hi}"));
        }
        (a, b)
    };
    let width = u64::from(b - a + 1);
    match step {
        None => Ok((u64::from(a) + draw % width).to_string()),
        Some(step) => {
            let n = number(step)?;
            if n == 0 {
                return Err("a step of 0".into());
            }
            let start = u64::from(a) + draw % u64::from(n).min(width);
            Ok(format!("{start}-{b}/{n}"))
        }
    }
}

/// `--jitter SPAN`: KEY's offset within `span` (whole milliseconds below it), from the same hash,
/// mixed with a place no field has.
pub fn offset(key: &str, span: std::time::Duration) -> std::time::Duration {
    let ms = span.as_millis() as u64;
    if ms == 0 {
        return std::time::Duration::ZERO;
    }
    std::time::Duration::from_millis(mix(fnv1a(key.as_bytes()) ^ 0x6a69_7474_6572) % ms)
}

fn number(text: &str) -> Result<u32, String> {
    text.parse()
        .map_err(|_| format!("'{text}' is not a number"))
}

/// FNV-1a, 64 bits.
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// SplitMix64's finalizer.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_draws_the_same_values_every_time_and_within_the_range() {
        let a = resolve("H H(9-17) * * H(1-5)", "nightly-report").unwrap();
        assert_eq!(
            a,
            resolve("H H(9-17) * * H(1-5)", "nightly-report").unwrap()
        );
        let f: Vec<u32> = a
            .split(' ')
            .filter(|f| *f != "*")
            .map(|f| f.parse().unwrap())
            .collect();
        assert!(
            f[0] < 60 && (9..=17).contains(&f[1]) && (1..=5).contains(&f[2]),
            "{a}"
        );
        // Fixed for good: an upgrade must not move a job's times.
        assert_eq!(resolve("H H * * *", "backup").unwrap(), "34 5 * * *");
    }

    #[test]
    fn steps_start_below_the_step() {
        for key in ["a", "b", "c", "d", "e"] {
            let r = resolve("H/15 * * * *", key).unwrap();
            let (start, rest) = r.split_once('-').unwrap();
            assert!(start.parse::<u32>().unwrap() < 15, "{r}");
            assert!(rest.starts_with("59/15 "), "{r}");
            let r = resolve("0 H(0-29)/10 * * * *", key).unwrap();
            assert!(r.starts_with("0 ") && r.contains("-29/10 "), "{r}");
        }
    }

    #[test]
    fn three_hundred_keys_spread_over_the_hour() {
        let mut count = [0u32; 60];
        for i in 0..300 {
            let r = resolve("H 0 * * *", &format!("job-{i}")).unwrap();
            count[r.split(' ').next().unwrap().parse::<usize>().unwrap()] += 1;
        }
        // 5 each on average; none more than 3x its share, and most minutes used.
        assert!(count.iter().all(|c| *c <= 15), "{count:?}");
        assert!(count.iter().filter(|c| **c > 0).count() >= 50, "{count:?}");
    }

    #[test]
    fn jitter_offsets_are_within_the_span_and_spread() {
        let span = std::time::Duration::from_secs(60);
        let mut seconds = std::collections::BTreeSet::new();
        for i in 0..300 {
            let o = offset(&format!("job-{i}"), span);
            assert!(o < span);
            assert_eq!(o, offset(&format!("job-{i}"), span));
            seconds.insert(o.as_secs());
        }
        assert!(seconds.len() >= 50, "{seconds:?}");
        assert_eq!(
            offset("k", std::time::Duration::ZERO),
            std::time::Duration::ZERO
        );
    }

    #[test]
    fn bad_h_fields_name_the_field() {
        let e = resolve("H(50-70) * * * *", "k").unwrap_err();
        assert!(e.contains("minute") && e.contains("0-59"), "{e}");
        let e = resolve("0 H(3) * * *", "k").unwrap_err();
        assert!(e.contains("hour"), "{e}");
        let e = resolve("H/0 * * * *", "k").unwrap_err();
        assert!(e.contains("step of 0"), "{e}");
        assert!(!is_hashed("@daily") && is_hashed("H 2 * * *") && !is_hashed("0 2 * * *"));
    }
}
