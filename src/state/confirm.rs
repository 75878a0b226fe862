//! Confirm: finishing a notice that awaits confirmation (status 4).
//!
//! A rejection, or a deadline that passes, is a failed attempt: the row is
//! claimed (`claim_one`) and recorded like any
//! other failure.

use sea_orm::{DbBackend, DbErr, ExprTrait, sea_query::Expr};

use super::{
    Lost, Store, Written,
    columns::{self, Column, Set, Table},
};
use crate::{db, entity::notify_msg, status::Status};

/// Moves `row`, read awaiting confirmation, to history as succeeded, if it
/// is still at the version read and still awaiting ([`Lost`] when it moved
/// on: nothing written).
pub(crate) async fn confirm(store: &Store, row: &notify_msg::Model) -> Result<Written<()>, DbErr> {
    let guard = columns::at_version(row.id, row.version)
        .add(Expr::col(Column::Status).eq(Status::AwaitingConfirm as i16));
    let sets: Vec<Set> = vec![
        (Column::Leased, Expr::val(false)),
        (Column::Status, Expr::val(Status::Succeeded as i16)),
    ];
    let moved = db::on_conflict_retry(|| async {
        if store.backend() == DbBackend::Postgres {
            return columns::move_rows(
                &store.db,
                Table::Live,
                Table::History,
                guard.clone(),
                sets.clone(),
            )
            .await;
        }
        let txn = db::begin(&store.db).await?;
        let moved = columns::move_rows(
            &txn,
            Table::Live,
            Table::History,
            guard.clone(),
            sets.clone(),
        )
        .await?;
        txn.commit().await?;
        Ok(moved)
    })
    .await?;
    if moved.is_empty() {
        return Ok(Err(Lost {
            id: row.id,
            version: row.version,
        }));
    }
    store.finished([(row.def_id, &row.ordering_key)]).await;
    Ok(Ok(()))
}
