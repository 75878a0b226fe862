//! Lease: a claimed row, and the transitions its holder may make.
//!
//! Each transition consumes the lease and writes against the claimed
//! version. `Ok(Err(Lost))` means the claim was lost meanwhile (an operator
//! cancelled or changed the notice, or the lease ran out and another sender
//! took it): nothing was written, whatever the transition. `Err(Held)` means
//! the database could not be reached: nothing was written and the lease
//! comes back to the caller, who may try again.

use std::time::{Duration, Instant};

use chrono::NaiveDateTime;
use sea_orm::{DbBackend, DbErr, ExprTrait, sea_query::Expr};

use super::{
    Store, clock,
    columns::{self, Column, Set, Table},
    insert::{self, NewRow},
};
use crate::{db, entity::notify_msg, status::Status};

/// A row this process holds the current attempt of.
pub(crate) struct Lease {
    row: notify_msg::Model,
    deadline: Instant,
    store: Store,
    settled: bool,
    /// Failed tries of this attempt tried again at once (immediate retries).
    tries: u32,
    /// `errors` with a line per failed try, once there is one.
    tries_log: Option<String>,
    /// Its payload's bytes, counted in a worker's in-flight bytes while held.
    counted: Option<Counted>,
}

/// Bytes counted in a worker's in-flight payload bytes, given back when
/// dropped (with the lease, or when the payload is let go).
struct Counted {
    stats: std::sync::Arc<crate::stats::WorkerStats>,
    bytes: u64,
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.stats.payload_released(self.bytes);
    }
}

/// How many times a payload being delivered is held: the row's text, the
/// parsed JSON the channel is given, the request's body.
pub(crate) const DELIVERY_COPIES: u64 = 3;

impl Lease {
    /// Whether this lease is a producer's reservation (version 0, never
    /// claimed): its outcome also stamps `last_call_time`, which a claim
    /// would have set.
    fn reserved(&self) -> bool {
        self.row.version == 0 && self.row.last_call_time.is_none()
    }

    /// The columns every outcome sets: not leased any more, for a
    /// reservation the time of its (only) call, and the log of failed tries
    /// (unless the outcome writes `errors` itself: `with_tries = false`).
    fn outcome_sets(&self, with_tries: bool) -> Vec<Set> {
        let mut sets = vec![(Column::Leased, Expr::val(false))];
        if self.reserved() {
            sets.push((Column::LastCallTime, clock::now(self.store.backend())));
        }
        if with_tries && let Some(log) = &self.tries_log {
            sets.push((Column::Errors, Expr::val(log.clone())));
        }
        sets
    }

    /// Notes a failed try that is tried again at once within this claim:
    /// its line goes into `errors` with whatever outcome is recorded.
    pub fn failed_try(&mut self, at: NaiveDateTime, reason: &str) {
        self.tries += 1;
        let log = self.errors_so_far().to_string();
        self.tries_log = Some(super::errors_log::append_try(
            &log,
            at,
            self.attempt(),
            self.tries,
            reason,
        ));
    }

    /// Whether the step the row is on is followed by another of the
    /// definition's `steps` steps.
    pub fn has_next_step(&self, steps: usize) -> bool {
        usize::try_from(self.row.step).is_ok_and(|step| step.saturating_add(1) < steps)
    }

    /// Failed tries of this attempt so far.
    pub fn tries(&self) -> u32 {
        self.tries
    }

    /// The bytes of its payload (param and the previous step's result).
    pub fn payload_bytes(&self) -> u64 {
        (self.row.param.len() + self.row.step_result.as_ref().map_or(0, String::len)) as u64
    }

    /// Counts its payload, `copies` times, in `stats`' in-flight bytes
    /// (instead of what was counted before).
    pub fn count_payload(
        &mut self,
        stats: &std::sync::Arc<crate::stats::WorkerStats>,
        copies: u64,
    ) {
        let bytes = self.payload_bytes().saturating_mul(copies);
        stats.payload_held(bytes);
        self.counted = Some(Counted {
            stats: stats.clone(),
            bytes,
        });
    }

    /// Counts its payload `copies` times where it is counted already.
    pub fn recount_payload(&mut self, copies: u64) {
        if let Some(stats) = self.counted.as_ref().map(|c| c.stats.clone()) {
            self.count_payload(&stats, copies);
        }
    }

    /// Lets its payload go (param and step result): what is left to do
    /// with the lease (record a success, release it) needs neither.
    pub fn drop_payload(&mut self) {
        self.row.param = String::new();
        self.row.step_result = None;
        self.counted = None;
    }

    /// `errors` as it stands: the row's, with a line per failed try.
    pub fn errors_so_far(&self) -> &str {
        self.tries_log.as_deref().unwrap_or(&self.row.errors)
    }
}

/// A guarded transition found its row no longer at the claimed version (or
/// no longer in `notify_msg`): an operator cancelled or changed it, or the
/// lease ran out and another sender claimed it. Nothing was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("notice {id}: the claim at version {version} was lost; nothing written")]
pub(crate) struct Lost {
    /// The notice.
    pub id: i64,
    /// The version the transition expected.
    pub version: i32,
}

/// What a guarded transition did once the database answered: written (with
/// what it gives back), or [`Lost`].
pub(crate) type Written<T> = Result<T, Lost>;

/// A transition that could not be written; the lease is still held.
pub(crate) struct Held {
    /// The lease, as it was.
    pub lease: Lease,
    /// Why the write failed.
    pub error: DbErr,
}

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Held({}: {})", self.lease.id(), self.error)
    }
}

/// A failed attempt to be retried later.
#[derive(Debug, Clone)]
pub(crate) struct Retry {
    /// The failure log with this failure's line.
    pub errors: String,
    /// Failures so far, this one included.
    pub retry_times: i32,
    /// Wait before the next attempt.
    pub delay: Duration,
    /// The notices to queue with it (its alert, its events).
    pub follow: Vec<NewRow>,
}

/// A failed attempt that ends the notice.
#[derive(Debug, Clone)]
pub(crate) struct Final {
    /// The failure log with this failure's line.
    pub errors: String,
    /// Failures so far, this one included.
    pub retry_times: i32,
    /// The notices to queue with it (its alert, its events).
    pub follow: Vec<NewRow>,
}

/// What a recorded retry scheduled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Scheduled {
    /// When the next attempt is due (the database's clock).
    pub at: NaiveDateTime,
    /// The ids of the notices queued with it, in the order given.
    pub follow: Vec<i64>,
}

/// How long a sent notice waits for its confirmation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Deadline {
    /// This long from now.
    After(Duration),
    /// Until confirmed.
    Forever,
}

impl Lease {
    /// A lease whose claiming statement was sent at `started`: the
    /// in-process deadline is `started + lease`, never later than the
    /// database's.
    pub(crate) fn new(store: Store, row: notify_msg::Model, started: Instant) -> Self {
        Lease {
            deadline: started + store.lease,
            row,
            store,
            settled: false,
            tries: 0,
            tries_log: None,
            counted: None,
        }
    }

    /// The row as claimed (`version` is the claimed version; times are as
    /// they were read).
    pub fn row(&self) -> &notify_msg::Model {
        &self.row
    }

    /// The notice's definition and ordering key, as
    /// [`Store::finished`](super::Store::finished) takes them.
    pub fn key(&self) -> (i64, &Option<String>) {
        (self.row.def_id, &self.row.ordering_key)
    }

    /// The notice id.
    pub fn id(&self) -> i64 {
        self.row.id
    }

    /// The claimed version.
    pub fn version(&self) -> i32 {
        self.row.version
    }

    /// 1-based number of this attempt.
    pub fn attempt(&self) -> u32 {
        u32::try_from(self.row.retry_times)
            .unwrap_or(0)
            .saturating_add(1)
    }

    /// When the claiming statement was sent (this process's monotonic clock).
    pub fn claimed_at(&self) -> Instant {
        self.deadline
            .checked_sub(self.store.lease)
            .unwrap_or(self.deadline)
    }

    /// What is left of the lease, by this process's monotonic clock.
    pub fn remaining(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    fn backend(&self) -> DbBackend {
        self.store.backend()
    }

    fn done<T>(mut self, value: T) -> T {
        self.settled = true;
        value
    }

    /// The lease as lost: settled, nothing written.
    fn lost<T>(self) -> Written<T> {
        let lost = Lost {
            id: self.id(),
            version: self.version(),
        };
        self.done(Err(lost))
    }

    /// `value` when `written` (the statement changed the row), else lost.
    fn written<T>(self, written: bool, value: T) -> Written<T> {
        if written {
            self.done(Ok(value))
        } else {
            self.lost()
        }
    }

    /// Marks the lease as transitioned by a batch statement.
    pub(super) fn settle(self) {
        self.done(())
    }

    fn held(self, error: DbErr) -> Held {
        Held { lease: self, error }
    }

    /// Gives the lease up without writing: the row is due again when the
    /// lease ends (used when the database cannot be reached).
    pub fn forget(self) {
        tracing::debug!(notice_id = self.id(), "lease left to run out");
        self.done(())
    }

    /// Makes the row due again after `wait` (by the database's clock; zero:
    /// at once), for any sender, uncharged: an attempt not made here, or a
    /// try the rate limit did not allow.
    pub async fn release_for(self, wait: Duration) -> Result<Written<()>, Held> {
        let mut sets = vec![
            (Column::Leased, Expr::val(false)),
            (Column::NextCallTime, clock::after(self.backend(), wait)),
        ];
        // Tries that failed before the attempt was abandoned keep their lines.
        if let Some(log) = &self.tries_log {
            sets.push((Column::Errors, Expr::val(log.clone())));
        }
        let guard = columns::at_version(self.id(), self.version());
        match db::on_conflict_retry(|| columns::update(&self.store.db, guard.clone(), sets.clone()))
            .await
        {
            Ok(n) => Ok(self.written(n == 1, ())),
            Err(e) => Err(self.held(e)),
        }
    }

    /// The step this attempt is on succeeded and is not the last: records
    /// it (`step` + 1, `step_result` = `result`, the lines of its failed
    /// tries, its `note` appended to the description) and renews the lease for the next step, which this attempt
    /// runs next.
    pub async fn advance(
        mut self,
        result: Option<String>,
        note: Option<&str>,
    ) -> Result<Written<Lease>, Held> {
        let description = note.map(|note| self.with_note(note));
        let mut sets = vec![
            (Column::Step, Expr::col(Column::Step).add(1)),
            (Column::StepResult, Expr::val(result.clone())),
            (
                Column::NextCallTime,
                clock::after(self.backend(), self.store.lease),
            ),
        ];
        if self.reserved() {
            sets.push((Column::LastCallTime, clock::now(self.backend())));
        }
        if let Some(log) = &self.tries_log {
            sets.push((Column::Errors, Expr::val(log.clone())));
        }
        if let Some(description) = &description {
            sets.push((Column::Description, Expr::val(description.clone())));
        }
        let guard = columns::at_version(self.id(), self.version());
        let started = Instant::now();
        match db::on_conflict_retry(|| columns::update(&self.store.db, guard.clone(), sets.clone()))
            .await
        {
            Ok(1) => {
                let mut row = self.row.clone();
                row.version = row.version.wrapping_add(1);
                row.step = row.step.saturating_add(1);
                row.step_result = result;
                row.errors = self.errors_so_far().to_string();
                if let Some(description) = description {
                    row.description = description;
                }
                if self.reserved() {
                    // Stamped by the write above; only its presence matters.
                    row.last_call_time = Some(NaiveDateTime::MIN);
                }
                let mut next = Lease::new(self.store.clone(), row, started);
                next.counted = self.counted.take();
                Ok(self.done(Ok(next)))
            }
            Ok(_) => Ok(self.lost()),
            Err(e) => Err(self.held(e)),
        }
    }

    /// Records a failed attempt to be retried after `retry.delay` (status 2),
    /// with the notices it queues in the same transaction.
    pub async fn retry(self, retry: &Retry) -> Result<Written<Scheduled>, Held> {
        let backend = self.backend();
        let mut sets = self.outcome_sets(false);
        sets.extend([
            (Column::Status, Expr::val(Status::Failed as i16)),
            (Column::Errors, Expr::val(retry.errors.clone())),
            (Column::RetryTimes, Expr::val(retry.retry_times)),
            (Column::NextCallTime, clock::after(backend, retry.delay)),
        ]);
        let (id, version) = (self.id(), self.version());
        let written = db::on_conflict_retry(|| async {
            if retry.follow.is_empty() {
                let row =
                    columns::update_returning(&self.store.db, id, version, sets.clone()).await?;
                return Ok(row.map(|r| Scheduled {
                    at: r.next_call_time,
                    follow: Vec::new(),
                }));
            }
            let txn = db::begin(&self.store.db).await?;
            let Some(row) = columns::update_returning(&txn, id, version, sets.clone()).await?
            else {
                txn.rollback().await?;
                return Ok(None);
            };
            let follow = insert::insert_all(&txn, &retry.follow).await?;
            txn.commit().await?;
            Ok(Some(Scheduled {
                at: row.next_call_time,
                follow,
            }))
        })
        .await;
        match written {
            Ok(Some(scheduled)) => Ok(self.done(Ok(scheduled))),
            Ok(None) => Ok(self.lost()),
            Err(e) => Err(self.held(e)),
        }
    }

    /// Moves the row to history as succeeded, appending `note` to its
    /// description, with `follow` (its events) queued in the same
    /// transaction: their ids.
    pub async fn succeed(
        self,
        note: Option<&str>,
        follow: &[NewRow],
    ) -> Result<Written<Vec<i64>>, Held> {
        let mut sets = self.outcome_sets(true);
        sets.push((Column::Status, Expr::val(Status::Succeeded as i16)));
        if let Some(note) = note {
            sets.push((Column::Description, Expr::val(self.with_note(note))));
        }
        match self.finish(sets, follow).await {
            Ok(Some(ids)) => Ok(self.done(Ok(ids))),
            Ok(None) => Ok(self.lost()),
            Err(e) => Err(self.held(e)),
        }
    }

    /// Moves the row to history as a final failure, with the notices it
    /// queues (its alert, its events) in the same transaction: their ids.
    pub async fn fail_for_good(self, fail: &Final) -> Result<Written<Vec<i64>>, Held> {
        let mut sets = self.outcome_sets(false);
        sets.extend([
            (Column::Status, Expr::val(Status::FinalFailure as i16)),
            (Column::Errors, Expr::val(fail.errors.clone())),
            (Column::RetryTimes, Expr::val(fail.retry_times)),
        ]);
        match self.finish(sets, &fail.follow).await {
            Ok(Some(ids)) => Ok(self.done(Ok(ids))),
            Ok(None) => Ok(self.lost()),
            Err(e) => Err(self.held(e)),
        }
    }

    /// Leaves the sent notice awaiting confirmation (status 4) until the
    /// deadline, appending `note` to its description, with `follow` (its
    /// events) queued in the same transaction: their ids.
    pub async fn await_confirmation(
        self,
        until: Deadline,
        note: Option<&str>,
        follow: &[NewRow],
    ) -> Result<Written<Vec<i64>>, Held> {
        let backend = self.backend();
        let deadline = match until {
            Deadline::After(d) => clock::after(backend, d),
            Deadline::Forever => Expr::val(clock::far_future()),
        };
        let mut sets = self.outcome_sets(true);
        sets.extend([
            (Column::Status, Expr::val(Status::AwaitingConfirm as i16)),
            (Column::NextCallTime, deadline),
        ]);
        if let Some(note) = note {
            sets.push((Column::Description, Expr::val(self.with_note(note))));
        }
        let guard = columns::at_version(self.id(), self.version());
        let written = db::on_conflict_retry(|| async {
            if follow.is_empty() {
                let n = columns::update(&self.store.db, guard.clone(), sets.clone()).await?;
                return Ok((n == 1).then(Vec::new));
            }
            let txn = db::begin(&self.store.db).await?;
            if columns::update(&txn, guard.clone(), sets.clone()).await? != 1 {
                txn.rollback().await?;
                return Ok(None);
            }
            let ids = insert::insert_all(&txn, follow).await?;
            txn.commit().await?;
            Ok(Some(ids))
        })
        .await;
        match written {
            Ok(Some(ids)) => Ok(self.done(Ok(ids))),
            Ok(None) => Ok(self.lost()),
            Err(e) => Err(self.held(e)),
        }
    }

    fn with_note(&self, note: &str) -> String {
        let mut description = self.row.description.clone();
        if !description.is_empty() {
            description.push('\n');
        }
        description.push_str(&super::errors_log::clean_note(note));
        description
    }

    /// Moves the claimed row to history with `sets`, and `follow` in the
    /// same transaction: their ids. `None`: lost.
    async fn finish(&self, sets: Vec<Set>, follow: &[NewRow]) -> Result<Option<Vec<i64>>, DbErr> {
        let guard = columns::at_version(self.id(), self.version());
        let moved = db::on_conflict_retry(|| async {
            if self.backend() == DbBackend::Postgres && follow.is_empty() {
                let moved = columns::move_rows(
                    &self.store.db,
                    Table::Live,
                    Table::History,
                    guard.clone(),
                    sets.clone(),
                )
                .await?;
                return Ok((!moved.is_empty()).then(Vec::new));
            }
            let txn = db::begin(&self.store.db).await?;
            let moved = columns::move_rows(
                &txn,
                Table::Live,
                Table::History,
                guard.clone(),
                sets.clone(),
            )
            .await?;
            if moved.is_empty() {
                txn.rollback().await?;
                return Ok(None);
            }
            let ids = insert::insert_all(&txn, follow).await?;
            txn.commit().await?;
            Ok(Some(ids))
        })
        .await?;
        if moved.is_some() {
            self.store.finished([self.key()]).await;
        }
        Ok(moved)
    }
}

impl Drop for Lease {
    /// A lease dropped without a transition (its attempt was cancelled, or a
    /// bug) is released in the background, so the row is due again at once;
    /// without a runtime it is left to run out.
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        let (id, version) = (self.id(), self.version());
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(
                notice_id = id,
                "lease dropped without an outcome; left to run out"
            );
            return;
        };
        tracing::debug!(
            notice_id = id,
            "lease dropped without an outcome; releasing it"
        );
        let store = self.store.clone();
        let tries_log = self.tries_log.take();
        runtime.spawn(async move {
            let pairs = [(id, version)];
            let mut sets = vec![
                (Column::Leased, Expr::val(false)),
                (Column::NextCallTime, clock::now(store.backend())),
            ];
            if let Some(log) = tries_log {
                sets.push((Column::Errors, Expr::val(log)));
            }
            if let Err(e) = columns::update(&store.db, columns::at_versions(&pairs), sets).await {
                tracing::warn!(notice_id = id, error = %e, "cannot release a dropped lease; it runs out by itself");
            }
        });
    }
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("id", &self.row.id)
            .field("version", &self.row.version)
            .field("remaining", &self.remaining())
            .finish()
    }
}
