//! Sweep: find the notices that are due and attempt each through the same
//! dispatch path as the after-commit attempt.

use chrono::Utc;
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, QueryOrder, QuerySelect};

use crate::{
    AttemptReport, Notifier, Status,
    entity::notify_msg::{self, Column},
    error::Result,
};

impl Notifier {
    /// Up to `limit` rows that are due now (`next_call_time <= now`, status
    /// 0, 2 or 4), oldest first.
    pub async fn due(&self, limit: u64) -> Result<Vec<notify_msg::Model>> {
        let now = Utc::now().naive_utc();
        Ok(notify_msg::Entity::find()
            .filter(Column::NextCallTime.lte(now))
            .filter(Column::Status.is_in(Status::DUE))
            .order_by_asc(Column::NextCallTime)
            .limit(limit)
            .all(&self.inner.db)
            .await?)
    }

    /// Attempts up to `limit` due rows one after another and reports each.
    pub async fn sweep_once(&self, limit: u64) -> Result<Vec<AttemptReport>> {
        let mut reports = Vec::new();
        for row in self.due(limit).await? {
            reports.push(self.attempt(row).await);
        }
        Ok(reports)
    }
}
