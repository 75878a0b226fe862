//! Schedule: when the next attempt of a failed notice is due.
//!
//! A definition's `retry_interval` is a fixed interval (`5m`) or a list
//! (`5s,5m,1h,1d`). Units are `s`, `m`, `h` and `d`. The n-th retry waits the
//! n-th entry; once the list is used up the last entry repeats. Every wait is
//! capped by `max_retry_interval`, and `max_retry_times` (retries after the
//! first attempt, `-1` = unlimited) decides when a notice fails for good.
//! A `retry_jitter` of p% spreads every wait uniformly over ±p% of it (never
//! past the cap), so notices that failed together do not retry together.

use std::{fmt, str::FromStr, time::Duration};

/// The longest single interval accepted: ten years, which keeps timestamp
/// arithmetic far from overflow on every supported database.
pub const MAX_INTERVAL: Duration = Duration::from_secs(10 * 365 * 86_400);

/// Parses one interval such as `30s`, `5m`, `1h` or `1d` (at least one second).
pub fn parse_interval(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let unit_at = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("`{text}` has no unit (use s, m, h or d)"))?;
    let (digits, unit) = text.split_at(unit_at);
    if digits.is_empty() {
        return Err(format!("`{text}` does not start with a number"));
    }
    let count: u64 = digits
        .parse()
        .map_err(|_| format!("`{text}`: number too large"))?;
    let scale = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3_600,
        "d" => 86_400,
        other => {
            return Err(format!(
                "`{text}`: unknown unit `{other}` (use s, m, h or d)"
            ));
        }
    };
    let secs = count
        .checked_mul(scale)
        .filter(|s| *s <= MAX_INTERVAL.as_secs())
        .ok_or_else(|| format!("`{text}` is longer than ten years"))?;
    if secs == 0 {
        return Err(format!("`{text}` is zero; intervals are at least 1s"));
    }
    Ok(Duration::from_secs(secs))
}

/// Formats a duration the way [`parse_interval`] reads it (largest exact unit).
pub fn format_interval(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        _ if s > 0 && s.is_multiple_of(86_400) => format!("{}d", s / 86_400),
        _ if s > 0 && s.is_multiple_of(3_600) => format!("{}h", s / 3_600),
        _ if s > 0 && s.is_multiple_of(60) => format!("{}m", s / 60),
        _ => format!("{s}s"),
    }
}

/// A parsed `retry_interval`: the waits before retry 1, 2, 3, … (last repeats).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryIntervals(Vec<Duration>);

impl RetryIntervals {
    /// The wait before the `retry`-th retry (1-based; 0 is treated as 1).
    pub fn nth(&self, retry: u32) -> Duration {
        let i = (retry.max(1) as usize - 1).min(self.0.len() - 1);
        self.0[i]
    }

    /// The entries in order.
    pub fn entries(&self) -> &[Duration] {
        &self.0
    }
}

impl FromStr for RetryIntervals {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        if text.trim().is_empty() {
            return Err("empty; give an interval like `5m` or a list like `5s,5m,1h`".into());
        }
        let entries = text
            .split(',')
            .map(parse_interval)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self(entries))
    }
}

impl fmt::Display for RetryIntervals {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.0.iter().map(|d| format_interval(*d)).collect();
        f.write_str(&parts.join(","))
    }
}

/// The complete retry policy of a definition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Waits between attempts.
    pub intervals: RetryIntervals,
    /// Retries allowed after the first attempt; `None` = unlimited (`-1` in the table).
    pub max_retries: Option<u32>,
    /// Cap on any single wait; `None` = no cap (`0` in the table).
    pub cap: Option<Duration>,
    /// Each wait is spread by ± this percentage (`retry_jitter`, 0–100;
    /// default 0: exact waits).
    pub jitter_percent: u32,
}

impl RetryPolicy {
    /// The wait before the `retry`-th retry, with the cap applied.
    pub fn delay(&self, retry: u32) -> Duration {
        let wait = self.intervals.nth(retry);
        match self.cap {
            Some(cap) => wait.min(cap),
            None => wait,
        }
    }

    /// The wait before the `retry`-th retry with jitter: [`delay`](Self::delay)
    /// moved by `unit` (from -1 to 1) times the jitter share, never past the
    /// cap and never below zero.
    pub fn jittered(&self, retry: u32, unit: f64) -> Duration {
        let wait = self.delay(retry);
        if self.jitter_percent == 0 {
            return wait;
        }
        let share = f64::from(self.jitter_percent) / 100.0 * unit.clamp(-1.0, 1.0);
        let moved = Duration::try_from_secs_f64(wait.as_secs_f64() * (1.0 + share).max(0.0))
            .unwrap_or(wait);
        match self.cap {
            Some(cap) => moved.min(cap),
            None => moved,
        }
    }

    /// The wait before the `retry`-th retry, jittered at random.
    pub fn next_wait(&self, retry: u32) -> Duration {
        self.jittered(retry, fastrand::f64() * 2.0 - 1.0)
    }

    /// Whether a notice that has failed `failures` times has used up its retries.
    ///
    /// `max_retries = 3` allows four attempts: the first and three retries.
    pub fn exhausted(&self, failures: u32) -> bool {
        self.max_retries.is_some_and(|max| failures > max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn parses_units() {
        assert_eq!(parse_interval("30s"), Ok(secs(30)));
        assert_eq!(parse_interval("5m"), Ok(secs(300)));
        assert_eq!(parse_interval(" 1h "), Ok(secs(3600)));
        assert_eq!(parse_interval("1d"), Ok(secs(86_400)));
    }

    #[test]
    fn rejects_bad_intervals() {
        for bad in [
            "",
            "5",
            "m",
            "5x",
            "-5s",
            "5 s",
            "1.5h",
            "0s",
            "99999999999d",
            "5sm",
        ] {
            assert!(parse_interval(bad).is_err(), "accepted {bad:?}");
        }
        assert!("30s,,1m".parse::<RetryIntervals>().is_err());
        assert!("".parse::<RetryIntervals>().is_err());
    }

    #[test]
    fn nth_retry_waits_nth_entry_and_last_repeats() {
        let list: RetryIntervals = "30s,1m,3m,30m".parse().unwrap();
        let waits: Vec<u64> = (1..=6).map(|n| list.nth(n).as_secs()).collect();
        assert_eq!(waits, [30, 60, 180, 1800, 1800, 1800]);
    }

    #[test]
    fn jitter_spreads_waits() {
        let policy = RetryPolicy {
            intervals: "100s".parse().unwrap(),
            max_retries: None,
            cap: None,
            jitter_percent: 20,
        };
        assert_eq!(policy.jittered(1, -1.0), secs(80));
        assert_eq!(policy.jittered(1, 1.0), secs(120));
        assert_eq!(policy.jittered(1, 0.0), secs(100));
        let waits: std::collections::BTreeSet<Duration> =
            (0..100).map(|_| policy.next_wait(1)).collect();
        assert!(
            waits.len() > 50,
            "a thousand failures must not retry together"
        );
    }

    #[test]
    fn cap_and_exhaustion() {
        let policy = RetryPolicy {
            intervals: "5s,5m,1h,1d".parse().unwrap(),
            max_retries: Some(3),
            cap: Some(secs(600)),
            jitter_percent: 0,
        };
        assert_eq!(policy.delay(2), secs(300));
        assert_eq!(policy.delay(3), secs(600));
        assert_eq!(policy.delay(9), secs(600));
        assert!(!policy.exhausted(3));
        assert!(policy.exhausted(4));
        let unlimited = RetryPolicy {
            max_retries: None,
            ..policy
        };
        assert!(!unlimited.exhausted(u32::MAX));
    }

    proptest! {
        #[test]
        fn display_round_trips(list in proptest::collection::vec(1u64..=3_650 * 86_400, 1..8)) {
            let parsed = RetryIntervals(list.into_iter().map(Duration::from_secs).collect());
            let again: RetryIntervals = parsed.to_string().parse().unwrap();
            prop_assert_eq!(again, parsed);
        }

        #[test]
        fn delay_is_an_entry_and_never_exceeds_cap(
            list in proptest::collection::vec(1u64..1_000_000, 1..8),
            cap in proptest::option::of(1u64..100_000),
            retry in 0u32..1_000,
        ) {
            let policy = RetryPolicy {
                intervals: RetryIntervals(list.iter().copied().map(Duration::from_secs).collect()),
                max_retries: None,
                cap: cap.map(Duration::from_secs),
                jitter_percent: 0,
            };
            let d = policy.delay(retry).as_secs();
            prop_assert!(cap.is_none_or(|c| d <= c));
            prop_assert!(list.iter().any(|e| *e == d || cap == Some(d)));
        }

        #[test]
        fn jitter_stays_within_its_share_and_the_cap(
            wait in 1u64..10 * 365 * 86_400,
            cap in proptest::option::of(1u64..10 * 365 * 86_400),
            percent in 0u32..=100,
            unit in -1.5f64..1.5,
        ) {
            let policy = RetryPolicy {
                intervals: RetryIntervals(vec![Duration::from_secs(wait)]),
                max_retries: None,
                cap: cap.map(Duration::from_secs),
                jitter_percent: percent,
            };
            let base = policy.delay(1).as_secs_f64();
            let got = policy.jittered(1, unit).as_secs_f64();
            let share = f64::from(percent) / 100.0;
            // A millisecond of slack for floating point at ten years.
            let slack = 1e-3;
            prop_assert!(got >= base * (1.0 - share) - slack, "{got} < {base} - {percent}%");
            prop_assert!(got <= base * (1.0 + share) + slack, "{got} > {base} + {percent}%");
            prop_assert!(cap.is_none_or(|c| got <= c as f64 + slack));
            let random = policy.next_wait(1).as_secs_f64();
            prop_assert!(random >= base * (1.0 - share) - slack && random <= base * (1.0 + share) + slack);
        }

        #[test]
        fn parse_never_panics(text in "\\PC*") {
            let _ = text.parse::<RetryIntervals>();
        }
    }
}
