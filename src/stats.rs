//! Stats: what a worker's sweeps have done, counted as they go.

use std::{
    collections::VecDeque,
    sync::{
        Mutex,
        atomic::{AtomicU64, Ordering::Relaxed},
    },
};

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::report::AttemptResult;

/// How many sweep start times are kept.
pub const RECENT_SWEEPS: usize = 64;

/// Counters of one worker; cheap to update from many tasks.
#[derive(Debug, Default)]
pub struct WorkerStats {
    sweeps: AtomicU64,
    claimed: AtomicU64,
    succeeded: AtomicU64,
    awaiting_confirm: AtomicU64,
    retried: AtomicU64,
    final_failures: AtomicU64,
    lost_claims: AtomicU64,
    skipped: AtomicU64,
    released: AtomicU64,
    parked: AtomicU64,
    errors: AtomicU64,
    sweeps_failed: AtomicU64,
    failing_in_a_row: AtomicU64,
    flushes: AtomicU64,
    flushed: AtomicU64,
    wakeups: AtomicU64,
    given_up: AtomicU64,
    /// Successes handed to a batch and not written yet.
    unrecorded: AtomicU64,
    /// Bytes of params held by this worker's sweeps now.
    payload_bytes: AtomicU64,
    recent_sweeps: Mutex<VecDeque<DateTime<Utc>>>,
}

/// A copy of the counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct StatsSnapshot {
    /// Sweeps started.
    pub sweeps: u64,
    /// Rows claimed by sweeps.
    pub claimed: u64,
    /// Attempts that succeeded.
    pub succeeded: u64,
    /// Attempts now waiting for confirmation.
    pub awaiting_confirm: u64,
    /// Failed attempts that will be retried.
    pub retried: u64,
    /// Failed attempts that ended their notice.
    pub final_failures: u64,
    /// Attempts that lost their claim to another sender.
    pub lost_claims: u64,
    /// Rows not attempted (definition unusable here).
    pub skipped: u64,
    /// Claimed rows handed back (shutdown, too little lease left to start).
    pub released: u64,
    /// Rows parked because their definition is unknown or invalid.
    pub parked: u64,
    /// Sweeps, or outcomes, that hit a database error they could not wait out.
    pub errors: u64,
    /// Sweeps that failed (a database error, e.g. a revoked privilege); each
    /// is retried soon.
    pub sweeps_failed: u64,
    /// Sweeps failed since the last one that succeeded.
    pub sweeps_failing_in_a_row: u64,
    /// Batches of successes moved to history ...
    pub flushes: u64,
    /// ... and the successes in them.
    pub flushed: u64,
    /// Sweeps started early because the worker was woken (notices made due,
    /// or the earliest known due time came), not by its schedule.
    pub wakeups: u64,
    /// Outcomes not written because the worker stopped while the database
    /// could not take them (their notices are due again when their leases
    /// end: a delivered success is then sent again).
    pub given_up: u64,
    /// Delivered successes waiting in a batch to be written, now.
    pub unrecorded: u64,
    /// Bytes of params held now (waiting or being delivered; counted three
    /// times while delivered: the row's, the parsed one, the request's).
    pub payload_bytes: u64,
}

impl StatsSnapshot {
    /// Failed attempts, retried or final.
    pub fn failed(&self) -> u64 {
        self.retried + self.final_failures
    }
}

impl WorkerStats {
    /// The counters now.
    pub fn snapshot(&self) -> StatsSnapshot {
        StatsSnapshot {
            sweeps: self.sweeps.load(Relaxed),
            claimed: self.claimed.load(Relaxed),
            succeeded: self.succeeded.load(Relaxed),
            awaiting_confirm: self.awaiting_confirm.load(Relaxed),
            retried: self.retried.load(Relaxed),
            final_failures: self.final_failures.load(Relaxed),
            lost_claims: self.lost_claims.load(Relaxed),
            skipped: self.skipped.load(Relaxed),
            released: self.released.load(Relaxed),
            parked: self.parked.load(Relaxed),
            errors: self.errors.load(Relaxed),
            sweeps_failed: self.sweeps_failed.load(Relaxed),
            sweeps_failing_in_a_row: self.failing_in_a_row.load(Relaxed),
            flushes: self.flushes.load(Relaxed),
            flushed: self.flushed.load(Relaxed),
            wakeups: self.wakeups.load(Relaxed),
            given_up: self.given_up.load(Relaxed),
            unrecorded: self.unrecorded.load(Relaxed),
            payload_bytes: self.payload_bytes.load(Relaxed),
        }
    }

    /// Start times of the latest sweeps (at most [`RECENT_SWEEPS`]), oldest first.
    pub fn recent_sweeps(&self) -> Vec<DateTime<Utc>> {
        match self.recent_sweeps.lock() {
            Ok(q) => q.iter().copied().collect(),
            Err(poisoned) => poisoned.into_inner().iter().copied().collect(),
        }
    }

    pub(crate) fn sweep_started(&self) {
        self.sweeps.fetch_add(1, Relaxed);
        let mut q = self
            .recent_sweeps
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if q.len() == RECENT_SWEEPS {
            q.pop_front();
        }
        q.push_back(Utc::now());
    }

    pub(crate) fn add_wakeup(&self) {
        self.wakeups.fetch_add(1, Relaxed);
    }

    pub(crate) fn add_claimed(&self, n: u64) {
        self.claimed.fetch_add(n, Relaxed);
    }

    pub(crate) fn add_flush(&self, n: u64) {
        self.flushes.fetch_add(1, Relaxed);
        self.flushed.fetch_add(n, Relaxed);
    }

    pub(crate) fn add_error(&self) {
        self.errors.fetch_add(1, Relaxed);
    }

    /// A sweep failed; returns how many have failed in a row, this one
    /// included (also the metrics `solid_notify_sweeps_failed_total` and
    /// `solid_notify_sweeps_failing_in_a_row`).
    pub(crate) fn sweep_failed(&self) -> u64 {
        self.errors.fetch_add(1, Relaxed);
        self.sweeps_failed.fetch_add(1, Relaxed);
        let n = self.failing_in_a_row.fetch_add(1, Relaxed) + 1;
        crate::counters::sweep_failed(n);
        n
    }

    /// A sweep succeeded; returns how many had failed in a row before it.
    pub(crate) fn sweep_succeeded(&self) -> u64 {
        let before = self.failing_in_a_row.swap(0, Relaxed);
        if before > 0 {
            crate::counters::sweep_failed(0);
        }
        before
    }

    /// `n` outcomes given up at shutdown (also counted by the metric).
    pub(crate) fn add_given_up(&self, n: u64) {
        self.given_up.fetch_add(n, Relaxed);
        crate::counters::outcomes_given_up(n);
    }

    /// Bytes of params held now ([`StatsSnapshot::payload_bytes`]).
    pub fn payload_bytes(&self) -> u64 {
        self.payload_bytes.load(Relaxed)
    }

    /// `n` more bytes of params held (also the process's gauge).
    pub(crate) fn payload_held(&self, n: u64) {
        self.payload_bytes.fetch_add(n, Relaxed);
        crate::counters::payload_bytes(n as f64);
    }

    /// `n` bytes of params let go.
    pub(crate) fn payload_released(&self, n: u64) {
        let _ = self
            .payload_bytes
            .fetch_update(Relaxed, Relaxed, |held| Some(held.saturating_sub(n)));
        crate::counters::payload_bytes(-(n as f64));
    }

    /// A success handed to a batch ...
    pub(crate) fn success_handed(&self) {
        self.unrecorded.fetch_add(1, Relaxed);
    }

    /// ... and settled (written, lost or given up).
    pub(crate) fn success_settled(&self) {
        // Never below zero, whatever the order of the two.
        let _ = self
            .unrecorded
            .fetch_update(Relaxed, Relaxed, |n| Some(n.saturating_sub(1)));
    }

    pub(crate) fn count(&self, result: &AttemptResult) {
        let counter = match result {
            AttemptResult::Succeeded => &self.succeeded,
            AttemptResult::AwaitingConfirm => &self.awaiting_confirm,
            AttemptResult::WillRetry { .. } => &self.retried,
            AttemptResult::FinalFailure { .. } => &self.final_failures,
            AttemptResult::LostClaim => &self.lost_claims,
            AttemptResult::Skipped { .. }
            | AttemptResult::AlreadyAdded
            | AttemptResult::Scheduled => &self.skipped,
            AttemptResult::Released { .. } => &self.released,
            AttemptResult::Parked { .. } => &self.parked,
            AttemptResult::Error { .. } => &self.errors,
        };
        counter.fetch_add(1, Relaxed);
    }
}
