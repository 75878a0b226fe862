//! Counters: the process-wide series that layers below the attempt record
//! through the [`metrics`] facade (rows claimed, claims lost, payload bytes
//! held, sweeps failed). Named and described in [`crate::telemetry`], which
//! re-exports them; this module names nothing of the crate but the
//! [`report`](crate::report) leaf, so the state and attempt layers count
//! without reaching up.

use std::time::Duration;

use std::collections::HashMap;

use metrics::{counter, gauge, histogram};

use crate::report::AttemptResult;

/// Records `n` rows claimed.
pub(crate) fn claimed(n: u64) {
    if n > 0 {
        counter!("solid_notify_claims_total").increment(n);
    }
}

/// Records `n` claims lost (found taken when the outcome was written).
pub(crate) fn lost_claims(n: u64) {
    if n > 0 {
        counter!("solid_notify_lost_claims_total").increment(n);
    }
}

/// Records `n` notice rows parked because they cannot be read as notices.
pub(crate) fn unreadable(n: u64) {
    if n > 0 {
        counter!("solid_notify_notices_unreadable_total").increment(n);
    }
}

/// Moves the in-flight payload gauge by `delta` bytes.
pub(crate) fn payload_bytes(delta: f64) {
    gauge!("solid_notify_in_flight_payload_bytes").increment(delta);
}

/// Records `n` outcomes given up at shutdown (not written: their notices
/// are due again when their leases end).
pub(crate) fn outcomes_given_up(n: u64) {
    if n > 0 {
        counter!("solid_notify_outcomes_given_up_total").increment(n);
    }
}

/// Records a failed sweep (`in_a_row` > 0) or the first success after
/// failures (`in_a_row` = 0).
pub(crate) fn sweep_failed(in_a_row: u64) {
    if in_a_row > 0 {
        counter!("solid_notify_sweeps_failed_total").increment(1);
    }
    gauge!("solid_notify_sweeps_failing_in_a_row").set(in_a_row as f64);
}

/// Whether the wake-up listener hears `NOTIFY` (1) or cannot, behind a
/// pooler in transaction mode, so the worker polls (0).
#[cfg(feature = "postgres")]
pub(crate) fn wake_listening(on: bool) {
    gauge!("solid_notify_wake_listening").set(if on { 1.0 } else { 0.0 });
}

/// Records `n` operational events written (`solid_notify_events_total`).
pub(crate) fn events_written(n: u64) {
    if n > 0 {
        counter!("solid_notify_events_total").increment(n);
    }
}

/// Records `n` operational events not written because `events_to` names
/// no valid definition (`solid_notify_events_dropped_total`).
pub(crate) fn events_dropped(n: u64) {
    if n > 0 {
        counter!("solid_notify_events_dropped_total").increment(n);
    }
}

/// Records one sweep's duration.
pub(crate) fn sweep_finished(took: Duration) {
    histogram!("solid_notify_sweep_duration_seconds").record(took.as_secs_f64());
}

/// Label of rows whose definition is not in `notify_def`.
pub const UNKNOWN_DEF: &str = "_unknown";

/// At most this many definitions have series of their own in a process:
/// 100, the first to be labelled (by an attempt, or by the gauges, which
/// look at the paused definitions and those with the most notices in
/// flight first); the rest are summed under `def="_other"`
/// ([`OTHER_DEFS`]). So the series stay bounded at 100,000 definitions.
pub const METRICS_MAX_DEFS: usize = 100;

/// The `def` label of the definitions past [`METRICS_MAX_DEFS`]: `_other`.
pub const OTHER_DEFS: &str = "_other";

/// The `outcome` label of a result.
fn outcome(result: &AttemptResult) -> &'static str {
    match result {
        AttemptResult::Succeeded => "succeeded",
        AttemptResult::AwaitingConfirm => "awaiting_confirm",
        AttemptResult::WillRetry { .. } => "will_retry",
        AttemptResult::FinalFailure { .. } => "final_failure",
        AttemptResult::LostClaim => "lost_claim",
        AttemptResult::Skipped { .. } | AttemptResult::AlreadyAdded | AttemptResult::Scheduled => {
            "skipped"
        }
        AttemptResult::Released { .. } => "released",
        AttemptResult::Parked { .. } => "parked",
        AttemptResult::Error { .. } => "error",
    }
}

/// Every `outcome` label, in the order of [`outcome_index`].
const OUTCOMES: [&str; 9] = [
    "succeeded",
    "awaiting_confirm",
    "will_retry",
    "final_failure",
    "lost_claim",
    "skipped",
    "released",
    "parked",
    "error",
];

fn outcome_index(result: &AttemptResult) -> usize {
    let name = outcome(result);
    OUTCOMES.iter().position(|o| *o == name).unwrap_or(0)
}

/// The handles of one definition's series, registered once: recording
/// through a handle skips building and hashing the labels each time.
struct DefSeries {
    attempts: Vec<metrics::Counter>,
    duration: metrics::Histogram,
}

/// Per-definition handles, by name. Built on first use, so install a
/// recorder before the first attempt (as `telemetry::serve_metrics` does, before the
/// worker starts).
fn series(def: &str) -> std::sync::Arc<DefSeries> {
    use std::sync::{Arc, OnceLock, RwLock};
    static SERIES: OnceLock<RwLock<HashMap<String, Arc<DefSeries>>>> = OnceLock::new();
    let map = SERIES.get_or_init(Default::default);
    if let Some(found) = map
        .read()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .get(def)
    {
        return found.clone();
    }
    // Past the cap, every further definition shares the `_other` series.
    let def = label(def);
    if let Some(found) = map
        .read()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .get(def.as_str())
    {
        return found.clone();
    }
    let made = Arc::new(DefSeries {
        attempts: OUTCOMES
            .iter()
            .map(|o| counter!("solid_notify_attempts_total", "def" => def.to_string(), "outcome" => *o))
            .collect(),
        duration: histogram!("solid_notify_attempt_duration_seconds", "def" => def.to_string()),
    });
    map.write()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .entry(def.to_string())
        .or_insert(made)
        .clone()
}

/// The `def` label of definition `name`: its name if it is among the
/// first [`METRICS_MAX_DEFS`] names this process labelled (taking a place
/// if one is left), [`OTHER_DEFS`] otherwise. So the process's series name
/// at most that many definitions, whatever comes and goes.
pub(crate) fn label(name: &str) -> String {
    use std::sync::{Mutex, OnceLock};
    static NAMED: OnceLock<Mutex<std::collections::HashSet<String>>> = OnceLock::new();
    let mut named = NAMED
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if name == OTHER_DEFS || name == UNKNOWN_DEF || named.contains(name) {
        return name.to_string();
    }
    if named.len() < METRICS_MAX_DEFS {
        named.insert(name.to_string());
        return name.to_string();
    }
    OTHER_DEFS.to_string()
}

/// Records one finished attempt of a notice of definition `def`.
pub(crate) fn attempt_finished(def: &str, result: &AttemptResult, took: Duration) {
    let series = series(def);
    if let Some(counter) = series.attempts.get(outcome_index(result)) {
        counter.increment(1);
    }
    series.duration.record(took.as_secs_f64());
    if matches!(result, AttemptResult::LostClaim) {
        lost_claims(1);
    }
}
