//! Counters: the process-wide series that layers below the attempt record
//! through the [`metrics`] facade (rows claimed, claims lost, payload bytes
//! held, sweeps failed). Named and described in [`crate::telemetry`], which
//! re-exports them; this module names nothing of the crate, so the state
//! layer can count without reaching up.

use std::time::Duration;

use metrics::{counter, gauge, histogram};

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

/// Records one sweep's duration.
pub(crate) fn sweep_finished(took: Duration) {
    histogram!("solid_notify_sweep_duration_seconds").record(took.as_secs_f64());
}
