//! Heartbeat: each worker's row in `notify_worker`, written every few
//! seconds with its counters, from the database's clock. A worker is alive
//! while its row is fresh; rows not refreshed for [`FORGET_AFTER`] are
//! deleted by any worker's next heartbeat.

use std::time::Duration;

use sea_orm::{
    ConnectionTrait, DbErr, EntityTrait, ExprTrait, QueryFilter,
    sea_query::{Expr, OnConflict, Query},
};

use super::clock;
use crate::entity::notify_worker::{self, Column};

/// How long a silent worker's row is kept: one day.
pub const FORGET_AFTER: Duration = Duration::from_secs(24 * 3600);

/// One heartbeat: who, and what it has done so far.
#[derive(Debug, Clone)]
pub(crate) struct Beat {
    pub id: String,
    pub host: String,
    pub pid: i32,
    pub sweeps: i64,
    pub claimed: i64,
    pub succeeded: i64,
    pub failed: i64,
    /// Seconds between beats.
    pub beat_secs: f64,
}

/// Writes `beat`: inserts the worker's row on its first beat (started now),
/// refreshes `seen_at` and the counters after that. Then deletes rows
/// silent for [`FORGET_AFTER`].
pub(crate) async fn beat<C: ConnectionTrait>(db: &C, beat: &Beat) -> Result<(), DbErr> {
    let backend = db.get_database_backend();
    let mut insert = Query::insert();
    insert
        .into_table(notify_worker::Entity)
        .columns([
            Column::Id,
            Column::Host,
            Column::Pid,
            Column::StartedAt,
            Column::SeenAt,
            Column::Sweeps,
            Column::Claimed,
            Column::Succeeded,
            Column::Failed,
            Column::BeatSecs,
        ])
        .values_panic([
            beat.id.clone().into(),
            beat.host.clone().into(),
            beat.pid.into(),
            clock::now(backend),
            clock::now(backend),
            beat.sweeps.into(),
            beat.claimed.into(),
            beat.succeeded.into(),
            beat.failed.into(),
            beat.beat_secs.into(),
        ])
        .on_conflict(
            OnConflict::column(Column::Id)
                .update_columns([
                    Column::SeenAt,
                    Column::Sweeps,
                    Column::Claimed,
                    Column::Succeeded,
                    Column::Failed,
                    Column::BeatSecs,
                ])
                .to_owned(),
        );
    db.execute(&insert).await?;
    notify_worker::Entity::delete_many()
        .filter(Expr::col(Column::SeenAt).lt(clock::before(backend, FORGET_AFTER)))
        .exec(db)
        .await?;
    Ok(())
}

/// Ids of the workers whose heartbeat is at most `beats` beats late, by the
/// database's clock.
pub(crate) async fn alive<C: ConnectionTrait>(db: &C, beats: u32) -> Result<Vec<String>, DbErr> {
    let backend = db.get_database_backend();
    // seen_at + beats × beat_secs >= now, as seconds since seen_at.
    let late = match backend {
        sea_orm::DbBackend::Postgres => {
            "EXTRACT(EPOCH FROM ((statement_timestamp() AT TIME ZONE 'UTC') - seen_at))"
        }
        sea_orm::DbBackend::MySql => {
            "TIMESTAMPDIFF(MICROSECOND, seen_at, UTC_TIMESTAMP(6)) / 1000000.0"
        }
        _ => "((julianday('now') - julianday(seen_at)) * 86400.0)",
    };
    let mut select = Query::select();
    select
        .column(Column::Id)
        .from(notify_worker::Entity)
        .and_where(Expr::cust(format!("{late} <= {beats} * beat_secs")));
    db.query_all(&select)
        .await?
        .iter()
        .map(|r| r.try_get_by_index::<String>(0))
        .collect()
}
