//! Rate: the per-definition delivery budget behind `rate_limit`, shared by
//! every worker through the database.
//!
//! `notify_rate` holds one row per rate-limited definition: the number of
//! the current window (`floor(epoch seconds / period)`, by the database's
//! clock) and the tries started in it. Each try takes one unit with a single
//! guarded `UPDATE` (a new window starts at 1; a full one changes nothing;
//! a take that read the clock before the window moved on cannot move it
//! back), so at most `count` tries start in any aligned window, across all
//! processes. Windows are fixed, not sliding: up to twice `count` can start
//! within one period that straddles a window boundary.

use std::time::Duration;

use sea_orm::{ConnectionTrait, DbBackend, DbErr, Statement};

use super::Store;
use crate::def::RateLimit;

/// What a take found.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Take {
    /// One unit taken: the try may start.
    Granted,
    /// The window is used up; the next one begins after this long.
    Full(Duration),
}

/// The database's clock, in seconds since the epoch.
fn epoch(backend: DbBackend) -> &'static str {
    match backend {
        DbBackend::Postgres => {
            "SELECT CAST(EXTRACT(EPOCH FROM statement_timestamp()) AS DOUBLE PRECISION)"
        }
        // Arithmetic on UTC datetimes: no session time zone involved.
        DbBackend::MySql => {
            "SELECT CAST(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) AS DOUBLE) / 1000000"
        }
        _ => "SELECT CAST((julianday('now') - 2440587.5) * 86400.0 AS REAL)",
    }
}

/// Takes one unit of `def_id`'s budget for the current window.
pub(crate) async fn take(store: &Store, def_id: i64, limit: RateLimit) -> Result<Take, DbErr> {
    let db = &store.db;
    let backend = store.backend();
    let now: f64 = db
        .query_one_raw(Statement::from_string(backend, epoch(backend)))
        .await?
        .ok_or_else(|| DbErr::Custom("the database returned no time".into()))?
        .try_get_by_index(0)?;
    let per = limit.per.as_secs_f64();
    let window = (now / per).floor();
    let next =
        Duration::try_from_secs_f64(((window + 1.0) * per - now).max(0.0)).unwrap_or(limit.per);
    // `used` first: MySQL assigns left to right, reading `window_no` as it
    // was; the others read every column as it was anyway.
    let update = Statement::from_sql_and_values(
        backend,
        match backend {
            DbBackend::Postgres => {
                "UPDATE notify_rate SET used = CASE WHEN window_no = $1 THEN used + 1 ELSE 1 END, \
                 window_no = $1 WHERE def_id = $2 AND (window_no < $1 OR (window_no = $1 AND used < $3))"
            }
            _ => {
                "UPDATE notify_rate SET used = CASE WHEN window_no = ? THEN used + 1 ELSE 1 END, \
                 window_no = ? WHERE def_id = ? AND (window_no < ? OR (window_no = ? AND used < ?))"
            }
        },
        match backend {
            DbBackend::Postgres => vec![
                (window as i64).into(),
                def_id.into(),
                i64::from(limit.count).into(),
            ],
            _ => vec![
                (window as i64).into(),
                (window as i64).into(),
                def_id.into(),
                (window as i64).into(),
                (window as i64).into(),
                i64::from(limit.count).into(),
            ],
        },
    );
    if db.execute_raw(update.clone()).await?.rows_affected() == 1 {
        return Ok(Take::Granted);
    }
    let p = |n: usize| match backend {
        DbBackend::Postgres => format!("${n}"),
        _ => "?".to_string(),
    };
    let exists = db
        .query_one_raw(Statement::from_sql_and_values(
            backend,
            format!("SELECT 1 FROM notify_rate WHERE def_id = {}", p(1)),
            [def_id.into()],
        ))
        .await?
        .is_some();
    if exists {
        return Ok(Take::Full(next));
    }
    // The definition's first try: create its row (a concurrent first try
    // may have done so), then take as usual.
    let ignore = match backend {
        DbBackend::MySql => "ON DUPLICATE KEY UPDATE def_id = def_id",
        _ => "ON CONFLICT (def_id) DO NOTHING",
    };
    db.execute_raw(Statement::from_sql_and_values(
        backend,
        format!(
            "INSERT INTO notify_rate (def_id, window_no, used) VALUES ({}, 0, 0) {ignore}",
            p(1)
        ),
        [def_id.into()],
    ))
    .await?;
    if db.execute_raw(update).await?.rows_affected() == 1 {
        return Ok(Take::Granted);
    }
    Ok(Take::Full(next))
}
