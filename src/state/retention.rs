//! Retention: deleting finished notices from `notify_msg_history`, each row
//! guarded by the version the purge read (and archived), so a row requeued
//! or changed meanwhile is never deleted unseen.
//!
//! A row whose lease is still live is never deleted either: a notice
//! cancelled while an attempt held it keeps that lease in history, and the
//! lease is what holds its ordering key until the attempt can no longer be
//! sending ([`order`](super::order)). Deleting it would let the next notice
//! of the key go beside that attempt.

use sea_orm::{
    DbErr, EntityTrait, ExprTrait, QueryFilter,
    sea_query::{Condition, Expr},
};

use super::{clock, columns};
use crate::entity::notify_msg_history;

/// Rows of history whose lease has not ended by the database's clock (a
/// notice cancelled while an attempt held it).
pub(crate) fn lease_live(backend: sea_orm::DbBackend) -> Condition {
    Condition::all()
        .add(Expr::col(notify_msg_history::Column::Leased).eq(true))
        .add(Expr::col(notify_msg_history::Column::NextCallTime).gt(clock::now(backend)))
}

/// Deletes the history rows still at the `(id, version)` pairs read, but
/// none whose lease is still live. Returns how many were deleted.
pub(crate) async fn delete_history<C: sea_orm::ConnectionTrait>(
    conn: &C,
    pairs: &[(i64, i32)],
) -> Result<u64, DbErr> {
    if pairs.is_empty() {
        return Ok(0);
    }
    let backend = conn.get_database_backend();
    Ok(notify_msg_history::Entity::delete_many()
        .filter(columns::at_versions(pairs))
        .filter(lease_live(backend).not())
        .exec(conn)
        .await?
        .rows_affected)
}
