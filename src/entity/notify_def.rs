//! `notify_def`: one row per kind of notification, holding its delivery policy.

use sea_orm::entity::prelude::*;
use serde::Serialize;

/// A `notify_def` row as stored. See [`crate::def::Def`] for the validated form.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, Serialize)]
#[sea_orm(table_name = "notify_def")]
pub struct Model {
    /// Surrogate key, referenced by `notify_msg.def_id`.
    #[sea_orm(primary_key)]
    pub id: i64,
    /// Unique name producers refer to.
    #[sea_orm(unique)]
    pub name: String,
    /// `http`, `amqp`, `email` or `handler`.
    pub channel: String,
    /// JSON object with the channel's settings.
    #[sea_orm(column_type = "Text")]
    pub target: String,
    /// `5m` or `5s,5m,1h,1d`.
    pub retry_interval: String,
    /// Retries after the first attempt; -1 = unlimited.
    pub max_retry_times: i32,
    /// Cap on a single wait, in minutes; 0 = no cap.
    pub max_retry_interval: i32,
    /// 0 final failure, 1 every failure, 2 never, 3 after N failures.
    pub alert_trigger_type: i16,
    /// N for alert type 3.
    pub alert_trigger_fail_times: i32,
    /// Alert recipients, comma separated.
    #[sea_orm(column_type = "Text")]
    pub email: String,
    /// Whether a send only counts once confirmed.
    pub need_confirm: bool,
    /// Seconds to wait for confirmation; 0 = forever.
    pub max_confirm_delay: i32,
    /// Free text.
    #[sea_orm(column_type = "Text")]
    pub description: String,
    /// When the row was created.
    pub create_time: DateTime,
    /// When the row was last changed by `defs sync`.
    pub update_time: DateTime,
    /// While this lies ahead (UTC, the database's clock), no worker claims
    /// the definition's notices. `NULL`: not paused.
    pub paused_until: Option<DateTime>,
    /// Why it was paused, and by whom (or why its circuit opened).
    #[sea_orm(column_type = "Text", nullable)]
    pub pause_reason: Option<String>,
    /// Circuit breaker: failures that open it (0: off).
    pub circuit_failures: i32,
    /// Circuit window, seconds.
    pub circuit_window: i32,
    /// Circuit cool-down, seconds.
    pub circuit_cool_down: i32,
    /// What a handler's `Err` or panic means: `retry` or `fail`.
    pub on_error: String,
    /// Tries again within the same claim before the schedule takes over.
    pub immediate_retries: i32,
    /// Milliseconds between immediate retries.
    pub immediate_retry_delay: i32,
    /// Percentage each scheduled wait is spread by (±).
    pub retry_jitter: i16,
    /// Most tries per window across all workers (`50/s`); empty: none.
    pub rate_limit: String,
    /// `per_key`: notices sharing an `ordering_key` go one at a time, oldest
    /// first; empty: unordered.
    pub ordering: String,
    /// With `per_key`: a final failure holds back the later notices of its
    /// key until it is requeued or cancelled.
    pub stop_on_failure: bool,
    /// A JSON array of `{"channel": …, "target": …}`: the steps of a
    /// multi-step notice, run in order; empty: the one step of `channel`
    /// and `target` (which, with steps, hold the first step's).
    #[sea_orm(column_type = "Text")]
    pub steps: String,
    /// The name of the definition that receives this one's operational
    /// events ([`crate::event`]); empty: none.
    pub events_to: String,
    /// Whether params (and step results) are stored sealed
    /// ([`crate::crypto`]).
    pub encrypt: bool,
}

/// No relations are declared: `notify_msg.def_id` is a plain column so that
/// producers in other languages can insert rows without ORM knowledge.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
