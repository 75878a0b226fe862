//! Claim: take one attempt of a row with an optimistic version check and a lease.

use chrono::Utc;
use sea_orm::{ColumnTrait, DbErr, EntityTrait, QueryFilter, sea_query::Expr};

use crate::{
    entity::notify_msg::{self, Column},
    notifier::Inner,
};

/// A row this process holds the current attempt of.
#[derive(Debug, Clone)]
pub(crate) struct Claimed {
    /// The row as it is in the table after the claim.
    pub row: notify_msg::Model,
    /// 1-based attempt number.
    pub attempt: u32,
}

/// Claims `row` if its `version` is still the one read. `None`: lost the race.
pub(crate) async fn claim(
    inner: &Inner,
    row: &notify_msg::Model,
) -> Result<Option<Claimed>, DbErr> {
    let now = Utc::now().naive_utc();
    let lease_end = now + inner.config.lease;
    let version = row.version.wrapping_add(1);
    let done = notify_msg::Entity::update_many()
        .col_expr(Column::Version, Expr::value(version))
        .col_expr(Column::LastCallTime, Expr::value(now))
        .col_expr(Column::NextCallTime, Expr::value(lease_end))
        .filter(Column::Id.eq(row.id))
        .filter(Column::Version.eq(row.version))
        .exec(&inner.db)
        .await?;
    if done.rows_affected != 1 {
        return Ok(None);
    }
    Ok(Some(Claimed::new(notify_msg::Model {
        version,
        last_call_time: Some(now),
        next_call_time: lease_end,
        ..row.clone()
    })))
}

impl Claimed {
    /// Wraps a row as it is after its claim.
    pub fn new(row: notify_msg::Model) -> Self {
        let attempt = u32::try_from(row.retry_times)
            .unwrap_or(0)
            .saturating_add(1);
        Claimed { row, attempt }
    }
}
