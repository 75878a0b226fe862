//! Operator: transitions an operator makes by hand, each guarded by the
//! version the operator's tool read, each leaving an audit line in the
//! notice's failure log.

use chrono::NaiveDateTime;
use sea_orm::{
    DbBackend, DbErr, ExprTrait,
    sea_query::{Condition, Expr},
};

use super::{
    Store, clock,
    columns::{self, Column, Set, Table},
    errors_log,
};
use crate::{
    Status, db,
    entity::{notify_msg, notify_msg_history},
};

async fn move_guarded(
    store: &Store,
    from: Table,
    to: Table,
    id: i64,
    version: i32,
    sets: Vec<Set>,
) -> Result<bool, DbErr> {
    let guard = columns::at_version(id, version);
    let moved = db::on_conflict_retry(|| async {
        if store.backend() == DbBackend::Postgres {
            return columns::move_rows(&store.db, from, to, guard.clone(), sets.clone()).await;
        }
        let txn = db::begin(&store.db).await?;
        let moved = columns::move_rows(&txn, from, to, guard.clone(), sets.clone()).await?;
        txn.commit().await?;
        Ok(moved)
    })
    .await?;
    Ok(!moved.is_empty())
}

/// Cancels `row`, a notice in flight as read: it moves to history with
/// status 5 and `note` (dated `at`) in its log. An attempt running meanwhile
/// loses its claim: its outcome is not recorded. Its lease (`leased`,
/// `next_call_time`) is kept in history, so that a requeue cannot make the
/// notice due while that attempt may still be sending. `false`: the row
/// changed since it was read (read it again and retry).
pub(crate) async fn cancel(
    store: &Store,
    row: &notify_msg::Model,
    note: &str,
    at: NaiveDateTime,
) -> Result<bool, DbErr> {
    let sets = vec![
        (Column::Status, Expr::val(Status::Cancelled as i16)),
        (
            Column::Errors,
            Expr::val(errors_log::append_note(&row.errors, at, note)),
        ),
    ];
    move_guarded(
        store,
        Table::Live,
        Table::History,
        row.id,
        row.version,
        sets,
    )
    .await
}

/// Puts `row`, a finished notice as read (final failure, cancelled or
/// parked), back in flight: due now (or, for a notice cancelled while an
/// attempt held it, when that attempt's lease ends), a fresh retry budget,
/// `note` (dated `at`) in its log, its id unchanged. `false`: the row
/// changed since it was read.
pub(crate) async fn requeue(
    store: &Store,
    row: &notify_msg_history::Model,
    note: &str,
    at: NaiveDateTime,
) -> Result<bool, DbErr> {
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
        (
            Column::Errors,
            Expr::val(errors_log::append_note(&row.errors, at, note)),
        ),
    ];
    move_guarded(
        store,
        Table::History,
        Table::Live,
        row.id,
        row.version,
        sets,
    )
    .await
}
