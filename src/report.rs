//! Report: how one attempt of one notice ended ([`AttemptResult`]), and the
//! notice with it ([`AttemptReport`]). A leaf: attempts, sweeps and the
//! counters name it without reaching each other.

use chrono::NaiveDateTime;
use serde::Serialize;

/// How one attempt of one notice ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "result", rename_all = "snake_case")]
#[non_exhaustive]
pub enum AttemptResult {
    /// Delivered; the notice is in history with status 1.
    Succeeded,
    /// Delivered and waiting for confirmation (status 4).
    AwaitingConfirm,
    /// Failed; the next attempt is due at `at`.
    WillRetry {
        /// The attempt that failed.
        attempt: u32,
        /// When the next attempt is due (UTC, the database's clock).
        at: NaiveDateTime,
        /// Why it failed.
        reason: String,
    },
    /// Failed for good; the notice is in history with status 3.
    FinalFailure {
        /// The attempt that failed.
        attempt: u32,
        /// Why it failed.
        reason: String,
    },
    /// Another sender claimed this attempt first, or an operator finished
    /// the notice meanwhile; nothing was recorded here.
    LostClaim,
    /// Not attempted here (its handler is not registered in this process,
    /// say); it is due at once for a process that can.
    Skipped {
        /// Why.
        reason: String,
    },
    /// Claimed but not finished here (shutdown, or too little of the lease
    /// left to start): released, due again at once.
    Released {
        /// Why.
        reason: String,
    },
    /// Its definition is unknown or invalid: moved to history as parked.
    Parked {
        /// Why.
        reason: String,
    },
    /// A delayed notice ([`NewNotice::not_before`](crate::NewNotice::not_before),
    /// [`NewNotice::delay`](crate::NewNotice::delay)): not attempted after
    /// its commit; a sweeper takes it once it is due.
    Scheduled,
    /// Nothing written, nothing attempted: an idempotent add found an
    /// existing notice of the definition with the same key (the report's
    /// `notice_id`), in flight or in history.
    AlreadyAdded,
    /// The database could not be reached to record the outcome; the row is
    /// due again when its lease ends.
    Error {
        /// The error.
        error: String,
    },
}

/// The notice and how its attempt ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AttemptReport {
    /// The notice id.
    pub notice_id: i64,
    /// How the attempt ended.
    pub result: AttemptResult,
}
