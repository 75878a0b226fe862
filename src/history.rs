//! History: finished notices (`notify_msg_history`), and the operator's
//! actions on notices: requeue a finished one, cancel one in flight.
//! Nothing here deletes a notice: history is only purged by hand.

use chrono::Utc;
use sea_orm::{
    ActiveValue::Set, ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, QueryOrder,
    QuerySelect,
};

use crate::{
    Notifier, Status,
    dispatch::append_error,
    entity::{notify_def, notify_msg, notify_msg_history},
    error::{Error, Result},
};

/// Finished notices, newest first, optionally of one definition and status.
pub async fn list<C: ConnectionTrait>(
    db: &C,
    def: Option<&str>,
    status: Option<Status>,
    limit: u64,
) -> Result<Vec<notify_msg_history::Model>> {
    use notify_msg_history::Column;
    let mut query = notify_msg_history::Entity::find()
        .order_by_desc(Column::LastCallTime)
        .order_by_desc(Column::Id)
        .limit(limit);
    if let Some(name) = def {
        let def = notify_def::Entity::find()
            .filter(notify_def::Column::Name.eq(name))
            .one(db)
            .await?
            .ok_or_else(|| Error::UnknownDef(name.to_string()))?;
        query = query.filter(Column::DefId.eq(def.id));
    }
    if let Some(status) = status {
        query = query.filter(Column::Status.eq(status));
    }
    Ok(query.all(db).await?)
}

/// One finished notice.
pub async fn show<C: ConnectionTrait>(db: &C, id: i64) -> Result<notify_msg_history::Model> {
    notify_msg_history::Entity::find_by_id(id)
        .one(db)
        .await?
        .ok_or(Error::NoticeNotFound(id))
}

impl Notifier {
    /// Moves a finished notice back into `notify_msg`, due at once, with a
    /// fresh retry budget and its failure log kept (plus a line saying it was
    /// requeued). Its id stays the same, so receivers still see one notice.
    pub async fn requeue(&self, id: i64) -> Result<()> {
        let txn = crate::db::begin(&self.inner.db).await?;
        let done = notify_msg_history::Entity::find_by_id(id)
            .one(&txn)
            .await?
            .ok_or(Error::NoticeNotFound(id))?;
        let now = Utc::now().naive_utc();
        let row = notify_msg::ActiveModel {
            id: Set(done.id),
            def_id: Set(done.def_id),
            param: Set(done.param),
            description: Set(done.description),
            errors: Set(append_error(
                &done.errors,
                now,
                0,
                "requeued by an operator",
            )),
            status: Set(Status::NotSent),
            retry_times: Set(0),
            last_call_time: Set(done.last_call_time),
            next_call_time: Set(now),
            create_time: Set(done.create_time),
            version: Set(done.version.wrapping_add(1)),
            load_balance_num: Set(done.load_balance_num),
            idempotency_key: Set(done.idempotency_key),
            target_override: Set(done.target_override),
        };
        notify_msg::Entity::insert(row)
            .exec_without_returning(&txn)
            .await?;
        notify_msg_history::Entity::delete_by_id(id)
            .exec(&txn)
            .await?;
        txn.commit().await?;
        Ok(())
    }

    /// Cancels a notice in flight: it moves to history with status 5 and is
    /// not attempted again. An attempt already running may still deliver it;
    /// its outcome is then discarded (its claim is gone).
    pub async fn cancel(&self, id: i64) -> Result<()> {
        // Delete exactly the version read, so an outcome recorded meanwhile is
        // never overwritten by a stale copy; try again if it moved on.
        for _ in 0..crate::db::CONFLICT_TRIES {
            let txn = crate::db::begin(&self.inner.db).await?;
            let mut row = notify_msg::Entity::find_by_id(id)
                .one(&txn)
                .await?
                .ok_or(Error::NoticeNotFound(id))?;
            let deleted = notify_msg::Entity::delete_many()
                .filter(notify_msg::Column::Id.eq(id))
                .filter(notify_msg::Column::Version.eq(row.version))
                .exec(&txn)
                .await?;
            if deleted.rows_affected != 1 {
                txn.rollback().await?;
                continue;
            }
            row.status = Status::Cancelled;
            row.version = row.version.wrapping_add(1);
            row.errors = append_error(
                &row.errors,
                Utc::now().naive_utc(),
                0,
                "cancelled by an operator",
            );
            notify_msg_history::Entity::insert(crate::dispatch::history_row(row))
                .exec_without_returning(&txn)
                .await?;
            txn.commit().await?;
            return Ok(());
        }
        Err(Error::Conflict(id))
    }
}
