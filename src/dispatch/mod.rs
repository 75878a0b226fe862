//! Dispatch: the one path every attempt takes, whether it comes right after a
//! commit or from a sweeper.
//!
//! 1. [`claim`]: bump `version` where it still has the value that was read,
//!    and push `next_call_time` forward by the lease. Zero rows changed means
//!    someone else holds the attempt: the loser sends nothing.
//! 2. [`deliver`]: run the channel or handler, with a timeout; errors and
//!    panics become retryable failures.
//! 3. [`record`]: write the outcome against the claimed version. Success (and
//!    final failure) moves the row to history in one transaction; a failure
//!    appends to `errors` and schedules the next call; an alert fires when the
//!    definition's policy says so.

mod claim;
mod deliver;
mod errors_log;
mod record;

use std::time::Instant;

use chrono::NaiveDateTime;
use serde::Serialize;
use tracing::Instrument;

use crate::{Notifier, def::DefRef, entity::notify_msg};

pub(crate) use claim::Claimed;
pub(crate) use deliver::{Delivery, available, deliver};
pub(crate) use errors_log::{append_error, truncate};
pub(crate) use record::{confirmed, history_row, park_claimed, record};

/// How one attempt of one notice ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum AttemptResult {
    /// Delivered; the notice is in history with status 1.
    Succeeded,
    /// Delivered and waiting for confirmation (status 4).
    AwaitingConfirm,
    /// Failed; the next attempt is due at `at`.
    WillRetry {
        /// The attempt that failed.
        attempt: u32,
        /// When the next attempt is due (UTC).
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
    /// Another sender claimed this attempt first; nothing was sent here.
    LostClaim,
    /// Not attempted here (e.g. its handler is not registered in this process).
    Skipped {
        /// Why.
        reason: String,
    },
    /// A database error interrupted the attempt; the lease makes it due again.
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

impl Notifier {
    /// Attempts one notice as read from `notify_msg` (its `version` is the one
    /// the claim expects). Safe to call from any number of tasks or processes
    /// at once: at most one of them sends.
    pub async fn attempt(&self, row: notify_msg::Model) -> AttemptReport {
        match self.inner.defs.by_id(&self.inner.db, row.def_id).await {
            Ok(def) => self.attempt_with_def(row, def).await,
            Err(error) => {
                let notice_id = row.id;
                let result = record::park(&self.inner, row, &error.to_string()).await;
                AttemptReport { notice_id, result }
            }
        }
    }

    pub(crate) async fn attempt_with_def(
        &self,
        row: notify_msg::Model,
        def: DefRef,
    ) -> AttemptReport {
        let notice_id = row.id;
        let span = tracing::info_span!(
            "attempt",
            notice_id,
            def = %def.name,
            attempt = row.retry_times + 1,
            outcome = tracing::field::Empty,
            ms = tracing::field::Empty,
        );
        let started = Instant::now();
        let result = async {
            if let Err(reason) = available(&self.inner, &def) {
                return AttemptResult::Skipped { reason };
            }
            let claimed = match claim::claim(&self.inner, &row).await {
                Ok(Some(claimed)) => claimed,
                Ok(None) => return AttemptResult::LostClaim,
                Err(e) => {
                    return AttemptResult::Error {
                        error: e.to_string(),
                    };
                }
            };
            self.inner.track_claim(claimed.row.id, claimed.row.version);
            let delivery = deliver(&self.inner, &def, &claimed).await;
            let id = claimed.row.id;
            let result = record(self, &def, claimed, delivery).await;
            self.inner.untrack_claim(id);
            result
        }
        .instrument(span.clone())
        .await;
        span.record("outcome", tracing::field::debug(&result));
        span.record("ms", started.elapsed().as_millis() as u64);
        tracing::debug!(parent: &span, "attempt finished");
        AttemptReport { notice_id, result }
    }
}
