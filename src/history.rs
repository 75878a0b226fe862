//! History: finished notices (`notify_msg_history`), and the operator's
//! actions on notices: requeue a finished one, cancel one in flight. Both go
//! through the [`state`](crate::state) module, guarded by the version read,
//! and leave an audit line in the notice's failure log. Nothing here deletes
//! a notice.

use sea_orm::{ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, QueryOrder, QuerySelect};

use crate::{
    Notifier, Status,
    db::CONFLICT_TRIES,
    entity::{notify_def, notify_msg, notify_msg_history},
    error::{Error, Result},
    state::operator,
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
    /// Moves a finished notice (final failure, cancelled or parked) back into
    /// `notify_msg`, due at once, with a fresh retry budget and its failure
    /// log kept, plus a line saying it was requeued. Its id stays the same,
    /// so receivers still see one notice.
    pub async fn requeue(&self, id: i64) -> Result<()> {
        let store = &self.inner.store;
        for _ in 0..CONFLICT_TRIES {
            let row = show(&store.db, id).await?;
            if !row.status.is_requeueable() {
                return Err(Error::WrongState {
                    id,
                    status: row.status,
                    problem: "only final failures, cancelled and parked notices can be requeued",
                });
            }
            if operator::requeue(store, &row, "requeued by an operator", self.app_now()).await? {
                self.wake_workers();
                return Ok(());
            }
        }
        Err(Error::Conflict(id))
    }

    /// Cancels a notice in flight: it moves to history with status 5 and is
    /// not attempted again. An attempt already running may still deliver it;
    /// its outcome is then discarded (its claim is gone).
    pub async fn cancel(&self, id: i64) -> Result<()> {
        let store = &self.inner.store;
        for _ in 0..CONFLICT_TRIES {
            let Some(row) = notify_msg::Entity::find_by_id(id).one(&store.db).await? else {
                return Err(
                    match notify_msg_history::Entity::find_by_id(id)
                        .one(&store.db)
                        .await?
                    {
                        Some(done) => Error::WrongState {
                            id,
                            status: done.status,
                            problem: "it has finished already",
                        },
                        None => Error::NoticeNotFound(id),
                    },
                );
            };
            if operator::cancel(store, &row, "cancelled by an operator", self.app_now()).await? {
                return Ok(());
            }
        }
        Err(Error::Conflict(id))
    }
}
