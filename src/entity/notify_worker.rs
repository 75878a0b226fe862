//! `notify_worker`: one row per running worker, its heartbeat.

use sea_orm::entity::prelude::*;
use serde::Serialize;

/// A worker as it last reported itself.
#[derive(Clone, Debug, PartialEq, DeriveEntityModel, Serialize)]
#[sea_orm(table_name = "notify_worker")]
pub struct Model {
    /// `host:pid:random`, fixed for the worker's life.
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    /// Host name (or `unknown`).
    pub host: String,
    /// Process id.
    pub pid: i32,
    /// When the worker started (UTC, the database's clock).
    pub started_at: DateTime,
    /// Its last heartbeat (UTC, the database's clock).
    pub seen_at: DateTime,
    /// Sweeps it started.
    pub sweeps: i64,
    /// Rows it claimed.
    pub claimed: i64,
    /// Attempts that succeeded (or now await confirmation).
    pub succeeded: i64,
    /// Attempts that failed (retried or final).
    pub failed: i64,
    /// Seconds between its heartbeats.
    #[sea_orm(column_type = "Double")]
    pub beat_secs: f64,
}

/// No relations.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
