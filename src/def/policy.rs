//! The policy types of a validated definition: alerts, confirmation,
//! ordering, rate limit, immediate retries, what a handler's error means and
//! the circuit breaker, with their limits. (The retry schedule is
//! [`crate::schedule`]'s.)

use std::time::Duration;

use serde::Serialize;

use crate::handler::Outcome;

/// When a definition's failures e-mail its `email` recipients.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum AlertPolicy {
    /// Type 0: once, when the notice fails for good.
    OnFinalFailure,
    /// Type 1: on every failed attempt, thinned against storms: failures
    /// 1, 2, 4, 8, … (powers of two) and the final failure.
    OnEveryFailure,
    /// Type 2: never.
    Never,
    /// Type 3: once, when the failure count reaches N.
    AfterFailures(u32),
}

impl AlertPolicy {
    /// Whether the failure that brought the count to `failures` alerts.
    pub fn fires(self, failures: u32, is_final: bool) -> bool {
        match self {
            AlertPolicy::OnFinalFailure => is_final,
            AlertPolicy::OnEveryFailure => is_final || failures.is_power_of_two(),
            AlertPolicy::Never => false,
            AlertPolicy::AfterFailures(n) => failures == n,
        }
    }

    /// Whether one of the first `failures` failures, none of them final,
    /// alerted: the notice was reported failing (its `notice.failing`
    /// event), so its delivery now is a recovery.
    pub fn reported_failing(self, failures: u32) -> bool {
        match self {
            AlertPolicy::OnFinalFailure | AlertPolicy::Never => false,
            AlertPolicy::OnEveryFailure => failures >= 1,
            AlertPolicy::AfterFailures(n) => failures >= n,
        }
    }

    /// The `alert_trigger_type` column value.
    pub fn type_code(self) -> i16 {
        match self {
            AlertPolicy::OnFinalFailure => 0,
            AlertPolicy::OnEveryFailure => 1,
            AlertPolicy::Never => 2,
            AlertPolicy::AfterFailures(_) => 3,
        }
    }
}

/// Whether and how long a sent notice waits for a confirmation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Confirm {
    /// A successful send is final (`need_confirm = false`).
    NotNeeded,
    /// Unconfirmed after this long = a failed attempt.
    Within(Duration),
    /// Wait for the confirmation forever (`max_confirm_delay = 0`).
    Forever,
}

/// A definition's `ordering`: whether notices sharing an `ordering_key` are
/// delivered one at a time, oldest first ([`crate::state::claim`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Ordering {
    /// `ordering = ""` (the default): notices go independently, in any order.
    #[default]
    Unordered,
    /// `ordering = "per_key"`: a notice with an `ordering_key` is not
    /// claimed while an older notice of its definition and key is in flight
    /// (due, retrying, being sent or awaiting confirmation); notices without
    /// a key go independently. Keys never wait for each other.
    PerKey {
        /// `stop_on_failure` (default true): a final failure (or a parked
        /// notice) also holds back the later notices of its key until it is
        /// requeued or cancelled. `false`: they go on after it.
        stop_on_failure: bool,
    },
}

impl Ordering {
    /// The `ordering` column value.
    pub fn as_str(self) -> &'static str {
        match self {
            Ordering::Unordered => "",
            Ordering::PerKey { .. } => PER_KEY,
        }
    }
}

/// The `ordering` value of an ordered definition.
pub const PER_KEY: &str = "per_key";

/// A definition's `rate_limit`: at most `count` tries start in each aligned
/// window of `per` (by the database's clock), across every worker and
/// after-commit attempt, counted in `notify_rate`
/// (`crate::state::rate`). A notice over the limit is not attempted and
/// not charged: its claim is released, due when the next window begins.
/// Windows are fixed, so up to twice `count` may start within one period
/// that straddles a boundary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimit {
    /// Tries per window (1 to [`MAX_RATE_COUNT`]).
    pub count: u32,
    /// The window: one second, minute or hour.
    pub per: Duration,
}

/// Largest count a `rate_limit` accepts.
pub const MAX_RATE_COUNT: u32 = 1_000_000;

impl RateLimit {
    /// Parses `50/s`, `600/m` or `1000/h`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let bad = || format!("`{text}` is not a rate like \"50/s\", \"600/m\" or \"1000/h\"");
        let (count, unit) = text.trim().split_once('/').ok_or_else(bad)?;
        let count: u32 = count.trim().parse().map_err(|_| bad())?;
        if count == 0 || count > MAX_RATE_COUNT {
            return Err(format!(
                "{}: the count must be 1 to {MAX_RATE_COUNT}",
                bad()
            ));
        }
        let per = match unit.trim() {
            "s" => Duration::from_secs(1),
            "m" => Duration::from_secs(60),
            "h" => Duration::from_secs(3_600),
            _ => return Err(bad()),
        };
        Ok(RateLimit { count, per })
    }
}

impl std::fmt::Display for RateLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let unit = match self.per.as_secs() {
            1 => "s",
            60 => "m",
            _ => "h",
        };
        write!(f, "{}/{unit}", self.count)
    }
}

/// Retries run at once, within the claim of the attempt that failed, before
/// the notice is handed to its retry schedule (seed 002: try a few times at
/// once, then queue it for later).
///
/// The tries of one claim are one attempt: together they count once toward
/// `max_retry_times`, and a retryable failure of the last of them schedules
/// the next attempt. A permanent failure is never tried again. A try starts
/// only while it fits in what is left of the lease (its delay, the attempt
/// timeout and the lease margin), so fewer are run rather than overrun it;
/// none are run while the definition's circuit is open or probing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ImmediateRetries {
    /// Extra tries after a retryable failure (`immediate_retries`, default
    /// 0: none).
    pub count: u32,
    /// Wait before each of them (`immediate_retry_delay`, default
    /// [`DEFAULT_IMMEDIATE_RETRY_DELAY_MS`] milliseconds).
    pub delay: Duration,
}

/// Default `immediate_retry_delay`: 100 milliseconds.
pub const DEFAULT_IMMEDIATE_RETRY_DELAY_MS: i64 = 100;
/// Most `immediate_retries` accepted: 10 (more belongs on the schedule).
pub const MAX_IMMEDIATE_RETRIES: u32 = 10;
/// Longest `immediate_retry_delay` accepted: one minute.
pub const MAX_IMMEDIATE_RETRY_DELAY_MS: u32 = 60_000;
/// Largest `retry_jitter` accepted, in percent.
pub const MAX_RETRY_JITTER: u32 = 100;

/// What a handler's `Err` or panic means for the notice (`on_error`).
/// [`Outcome::permanent`](crate::Outcome::permanent) always fails for good,
/// whatever this says; errors of the built-in channels are not affected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnError {
    /// A retryable failure: retried on the definition's schedule. The
    /// default.
    #[default]
    Retry,
    /// A final failure at once: the notice moves to history (and alerts as
    /// its definition says), as seed 000's default exception strategy does.
    Fail,
}

impl OnError {
    /// The column value.
    pub fn as_str(self) -> &'static str {
        match self {
            OnError::Retry => "retry",
            OnError::Fail => "fail",
        }
    }

    /// The outcome of a handler that failed for `reason`.
    pub fn outcome(self, reason: String) -> Outcome {
        match self {
            OnError::Retry => Outcome::retry(reason),
            OnError::Fail => Outcome::permanent(format!("{reason} (on_error = \"fail\")")),
        }
    }
}

/// A definition's circuit breaker ([`crate::circuit`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Circuit {
    /// Failed attempts, with no success among them, that open it.
    pub failures: u32,
    /// Within this long.
    pub window: Duration,
    /// How long it stays open before one probe attempt.
    pub cool_down: Duration,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_limits_parse_and_print() {
        for text in ["50/s", "600/m", "1000/h"] {
            assert_eq!(RateLimit::parse(text).unwrap().to_string(), text);
        }
        assert_eq!(
            RateLimit::parse(" 7 / s ").unwrap(),
            RateLimit {
                count: 7,
                per: Duration::from_secs(1)
            }
        );
        for bad in ["", "s", "/s", "-1/s", "1.5/s", "1/x", "1000001/s"] {
            assert!(RateLimit::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn alert_policy_fires() {
        assert!(AlertPolicy::OnFinalFailure.fires(3, true));
        assert!(!AlertPolicy::OnFinalFailure.fires(3, false));
        let every: Vec<u32> = (1..=20)
            .filter(|n| AlertPolicy::OnEveryFailure.fires(*n, *n == 20))
            .collect();
        assert_eq!(every, [1, 2, 4, 8, 16, 20]);
        assert!(!AlertPolicy::Never.fires(9, true));
        let three = AlertPolicy::AfterFailures(3);
        let fired: Vec<u32> = (1..=6).filter(|n| three.fires(*n, *n == 6)).collect();
        assert_eq!(fired, [3]);
    }
}
