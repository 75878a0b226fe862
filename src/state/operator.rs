//! Operator: transitions an operator makes by hand, one notice or a batch
//! at a time, each row guarded by the version the operator's tool read, each
//! leaving an audit line in the notice's failure log. A row that changed
//! since it was read is skipped, never overwritten.

use chrono::NaiveDateTime;
use sea_orm::{
    DbBackend, DbErr, ExprTrait,
    sea_query::{CaseStatement, Condition, Expr},
};

use super::{
    Store, clock,
    columns::{self, Column, Set, Table},
    errors_log,
};
use crate::{db, status::Status};

/// A notice as an operator's tool read it: what a guarded write needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Seen {
    pub id: i64,
    pub version: i32,
    /// Its failure log as read; the audit line is appended to it.
    pub errors: String,
}

async fn move_guarded(
    store: &Store,
    from: Table,
    to: Table,
    guard: Condition,
    sets: Vec<Set>,
) -> Result<Vec<i64>, DbErr> {
    db::on_conflict_retry(|| async {
        if store.backend() == DbBackend::Postgres {
            return columns::move_rows(&store.db, from, to, guard.clone(), sets.clone()).await;
        }
        let txn = db::begin(&store.db).await?;
        let moved = columns::move_rows(&txn, from, to, guard.clone(), sets.clone()).await?;
        txn.commit().await?;
        Ok(moved)
    })
    .await
}

/// Each row's log with `note` (dated `at`) appended: one value for one row,
/// a `CASE id WHEN …` for a batch.
fn audited(rows: &[Seen], note: &str, at: NaiveDateTime) -> Expr {
    let line = |row: &Seen| errors_log::append_note(&row.errors, at, note);
    match rows {
        [row] => Expr::val(line(row)),
        _ => {
            let mut case = CaseStatement::new();
            for row in rows {
                case = case.case(
                    Condition::all().add(Expr::col(Column::Id).eq(row.id)),
                    Expr::val(line(row)),
                );
            }
            case.finally(Expr::col(Column::Errors)).into()
        }
    }
}

fn guard(rows: &[Seen]) -> Condition {
    let pairs: Vec<(i64, i32)> = rows.iter().map(|r| (r.id, r.version)).collect();
    columns::at_versions(&pairs)
}

/// Cancels `rows`, notices in flight as read: they move to history with
/// status 5, `last_call_time` now (the database's clock) and `note` (dated
/// `at`) in their log. An attempt running
/// meanwhile loses its claim: its outcome is not recorded. Its lease
/// (`leased`, `next_call_time`) is kept in history, so that a requeue cannot
/// make the notice due while that attempt may still be sending. Returns the
/// ids cancelled; the others changed since they were read.
pub(crate) async fn cancel(
    store: &Store,
    rows: &[Seen],
    note: &str,
    at: NaiveDateTime,
) -> Result<Vec<i64>, DbErr> {
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    let now = clock::now(store.backend());
    let sets = vec![
        (Column::Status, Expr::val(Status::Cancelled as i16)),
        (Column::Errors, audited(rows, note, at)),
        // When it finished, for retention and `--since`: a cancelled
        // notice's last call is its cancel.
        (Column::LastCallTime, now),
    ];
    let moved = move_guarded(store, Table::Live, Table::History, guard(rows), sets).await?;
    // The next notice of a cancelled one's ordering key may be in turn.
    store.finished_ids(&moved).await;
    Ok(moved)
}

/// Makes `row`, a delayed notice in flight as read (never attempted, not
/// held), due at once, whether or not its time has come by the database's
/// clock: `not_before` cleared, `next_call_time` now, `note` (dated `at`)
/// in its log. Its key's turn still applies. Whether it changed (`false`:
/// it changed since it was read).
pub(crate) async fn send_now(
    store: &Store,
    row: &Seen,
    note: &str,
    at: NaiveDateTime,
) -> Result<bool, DbErr> {
    let now = clock::now(store.backend());
    let guard = guard(std::slice::from_ref(row))
        .add(Expr::col(Column::Status).eq(Status::NotSent as i16))
        .add(Expr::col(Column::Leased).eq(false))
        .add(Expr::col(Column::NotBefore).is_not_null());
    let sets = vec![
        (Column::NextCallTime, now),
        (Column::NotBefore, Expr::val(Option::<NaiveDateTime>::None)),
        (Column::Errors, audited(std::slice::from_ref(row), note, at)),
    ];
    let changed =
        db::on_conflict_retry(|| columns::update(&store.db, guard.clone(), sets.clone())).await?;
    Ok(changed == 1)
}

/// Cancels `rows`, final failures or parked notices in history as read: they
/// stay in history with status 5 and `note` (dated `at`) in their log. With
/// `stop_on_failure` this lets the later notices of their ordering key go
/// on ([`order`](super::order)). Returns the ids cancelled; the others
/// changed since they were read.
pub(crate) async fn cancel_finished(
    store: &Store,
    rows: &[Seen],
    note: &str,
    at: NaiveDateTime,
) -> Result<Vec<i64>, DbErr> {
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    let guard = guard(rows).add(
        Expr::col(Column::Status).is_in([Status::FinalFailure, Status::Parked].map(|s| s as i16)),
    );
    let sets = vec![
        (Column::Status, Expr::val(Status::Cancelled as i16)),
        (Column::Errors, audited(rows, note, at)),
    ];
    let changed = db::on_conflict_retry(|| async {
        let txn = db::begin(&store.db).await?;
        let ids = columns::history_ids(&txn, guard.clone()).await?;
        if !ids.is_empty() {
            columns::update_history(
                &txn,
                Expr::col(Column::Id).is_in(ids.iter().copied()),
                sets.clone(),
            )
            .await?;
        }
        txn.commit().await?;
        Ok(ids)
    })
    .await?;
    store.finished_ids(&changed).await;
    Ok(changed)
}

/// Puts `rows`, finished notices as read (final failures, cancelled or
/// parked), back in flight: due now (or, for a notice cancelled while an
/// attempt held it, when that attempt's lease ends), a fresh retry budget,
/// `note` (dated `at`) in the log, ids unchanged. Returns the ids requeued;
/// the others changed since they were read.
pub(crate) async fn requeue(
    store: &Store,
    rows: &[Seen],
    note: &str,
    at: NaiveDateTime,
) -> Result<Vec<i64>, DbErr> {
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    let now = clock::now(store.backend());
    let live_lease = || {
        Condition::all()
            .add(Expr::col(Column::Leased).eq(true))
            .add(Expr::col(Column::NextCallTime).gt(now.clone()))
    };
    let sets = vec![
        (
            Column::Leased,
            Expr::case(live_lease(), true).finally(false).into(),
        ),
        (Column::Status, Expr::val(Status::NotSent as i16)),
        (Column::RetryTimes, Expr::val(0)),
        (
            Column::NextCallTime,
            Expr::case(live_lease(), Expr::col(Column::NextCallTime))
                .finally(now.clone())
                .into(),
        ),
        (Column::Errors, audited(rows, note, at)),
        // A requeue makes a delayed notice due at once too.
        (Column::NotBefore, Expr::val(Option::<NaiveDateTime>::None)),
    ];
    let requeueable = |rows: &[Seen]| {
        guard(rows).add(
            Expr::col(Column::Status)
                .is_in([Status::FinalFailure, Status::Cancelled, Status::Parked].map(|s| s as i16)),
        )
    };
    match move_guarded(store, Table::History, Table::Live, requeueable(rows), sets).await {
        Err(e) if super::keyed::is_key_conflict(&e) && rows.len() > 1 => {
            // A notice of the same key is in flight (or twice in this
            // batch, from before keys were unique): one at a time, leaving
            // in history each one whose key is taken.
            let mut moved = Vec::new();
            for row in rows {
                moved.extend(Box::pin(requeue(store, std::slice::from_ref(row), note, at)).await?);
            }
            Ok(moved)
        }
        Err(e) if super::keyed::is_key_conflict(&e) => {
            tracing::warn!(notice_id = rows[0].id, error = %e, "not requeued: a notice with its idempotency key is in flight");
            Ok(Vec::new())
        }
        other => other,
    }
}
