//! `notify_msg`: one row per notice still in flight.

use sea_orm::entity::prelude::*;
use serde::Serialize;

use crate::status::{Origin, Status};

/// A notice in flight. `notify_msg_history` has the same columns.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, Serialize)]
#[sea_orm(table_name = "notify_msg")]
pub struct Model {
    /// The notice id, stable across attempts and handed to receivers.
    #[sea_orm(primary_key)]
    pub id: i64,
    /// The `notify_def.id` this notice follows.
    pub def_id: i64,
    /// The JSON payload, stored as given.
    #[sea_orm(column_type = "Text")]
    pub param: String,
    /// The caller's context; handlers may append results.
    #[sea_orm(column_type = "Text")]
    pub description: String,
    /// The failure log, one line per failed attempt.
    #[sea_orm(column_type = "Text")]
    pub errors: String,
    /// Life-cycle state.
    pub status: Status,
    /// Failed attempts so far.
    pub retry_times: i32,
    /// Start of the latest attempt.
    pub last_call_time: Option<DateTime>,
    /// When the row is next due (also the lease end while an attempt runs).
    pub next_call_time: DateTime,
    /// When the notice was added.
    pub create_time: DateTime,
    /// Optimistic lock: bumped by every claim and every outcome.
    pub version: i32,
    /// Partition number for spreading work across workers.
    pub load_balance_num: i32,
    /// Key handed to receivers for de-duplication; the notice id when absent.
    pub idempotency_key: Option<String>,
    /// Per-notice JSON object merged over the definition's target.
    #[sea_orm(column_type = "Text", nullable)]
    pub target_override: Option<String>,
    /// Whether a claim (or the producer's reservation for its after-commit
    /// attempt) holds the row: its attempt may run until `next_call_time`
    /// (the lease end). Cleared by every outcome.
    pub leased: bool,
    /// The W3C trace context of the span that added the notice: a JSON
    /// object of its `traceparent` (and `tracestate`) headers; `None` when
    /// the producer had no OpenTelemetry span. See [`crate::trace`].
    #[sea_orm(column_type = "Text", nullable)]
    pub trace_context: Option<String>,
    /// Notices of an ordered definition (`ordering = "per_key"`) sharing
    /// this key go one at a time, oldest (`create_time`, then `id`) first.
    /// `None`: no order.
    pub ordering_key: Option<String>,
    /// The step the notice is on, 0-based: a multi-step notice resumes here
    /// (its earlier steps succeeded). A succeeded notice ran every step up
    /// to and including this one; otherwise the steps before it are done.
    /// Always 0 for a definition of one step.
    pub step: i32,
    /// The JSON result the step before this one passed on (see
    /// [`Outcome::with_result`](crate::Outcome::with_result)); `None` when
    /// none.
    #[sea_orm(column_type = "Text", nullable)]
    pub step_result: Option<String>,
    /// The earliest time (UTC, by the database's clock) the notice may be
    /// attempted: a delayed notice ([`NewNotice::not_before`](crate::NewNotice::not_before),
    /// [`NewNotice::delay`](crate::NewNotice::delay)). `None`: due when
    /// added. A requeue clears it.
    pub not_before: Option<DateTime>,
    /// Who wrote it: a producer, or the library (an alert, an event).
    pub origin: Origin,
}

/// See [`super::notify_def::Relation`].
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}

/// PostgreSQL's `due_at` (migration 16), outside the entity: the column of
/// the due indexes, equal to `next_call_time` unless the row is leased,
/// and never later.
pub fn due_at() -> sea_orm::sea_query::Alias {
    sea_orm::sea_query::Alias::new("due_at")
}
