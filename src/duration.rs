//! Durations on the command line: humantime (`500ms`, `30s`, `5m`) or bare seconds like flock's `-w 10`.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// The longest duration accepted: far beyond any sensible lock, well within what Redis expiries
/// and the monotonic clock can represent.
pub const MAX: Duration = Duration::from_secs(10 * 31_557_600);

/// A duration parsed from the command line or environment; displays back in humantime form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Span(pub Duration);

impl FromStr for Span {
    type Err = String;

    fn from_str(s: &str) -> Result<Span, String> {
        let s = s.trim();
        let d = if let Ok(secs) = s.parse::<f64>() {
            Duration::try_from_secs_f64(secs)
                .map_err(|_| "expected a non-negative duration".to_string())?
        } else {
            humantime::parse_duration(s)
                .map_err(|_| "expected a duration like 500ms, 30s, 5m or 1h30m".to_string())?
        };
        if d > MAX {
            return Err("must be at most 10 years".into());
        }
        Ok(Span(d))
    }
}

impl fmt::Display for Span {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", humantime::format_duration(self.0))
    }
}

/// clap value parser for durations that must be greater than zero.
pub fn positive(s: &str) -> Result<Span, String> {
    let span: Span = s.parse()?;
    if span.0.is_zero() {
        return Err("must be greater than 0".into());
    }
    Ok(span)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_humantime_and_seconds() {
        assert_eq!("30s".parse::<Span>().unwrap().0, Duration::from_secs(30));
        assert_eq!(
            "500ms".parse::<Span>().unwrap().0,
            Duration::from_millis(500)
        );
        assert_eq!("10".parse::<Span>().unwrap().0, Duration::from_secs(10));
        assert_eq!("0.5".parse::<Span>().unwrap().0, Duration::from_millis(500));
        assert!("abc".parse::<Span>().is_err());
        assert!("-1".parse::<Span>().is_err());
        assert!(positive("0").is_err());
        assert!(positive("0s").is_err());
        assert!("10y".parse::<Span>().is_ok());
        assert!("11y".parse::<Span>().is_err());
        assert!("1e30".parse::<Span>().is_err());
    }
}
