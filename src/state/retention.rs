//! Retention: deleting finished notices from `notify_msg_history`, each row
//! guarded by the version the purge read (and archived), so a row requeued
//! or changed meanwhile is never deleted unseen.

use sea_orm::{DbErr, EntityTrait, QueryFilter};

use super::columns;
use crate::entity::notify_msg_history;

/// Deletes the history rows still at the `(id, version)` pairs read.
/// Returns how many were deleted.
pub(crate) async fn delete_history<C: sea_orm::ConnectionTrait>(
    conn: &C,
    pairs: &[(i64, i32)],
) -> Result<u64, DbErr> {
    if pairs.is_empty() {
        return Ok(0);
    }
    Ok(notify_msg_history::Entity::delete_many()
        .filter(columns::at_versions(pairs))
        .exec(conn)
        .await?
        .rows_affected)
}
