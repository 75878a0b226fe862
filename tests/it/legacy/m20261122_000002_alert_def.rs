//! Adds the reserved definition whose notices are alert e-mails.

use sea_orm_migration::prelude::*;

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261122_000002_alert_def"
    }
}

/// Same as `solid_notify::alert::ALERT_DEF`.
const ALERT_DEF: &str = "solid_notify_alert";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let insert = Query::insert()
            .into_table(Alias::new("notify_def"))
            .columns(
                [
                    "name",
                    "channel",
                    "target",
                    "retry_interval",
                    "max_retry_times",
                    "max_retry_interval",
                    "alert_trigger_type",
                    "alert_trigger_fail_times",
                    "email",
                    "need_confirm",
                    "max_confirm_delay",
                    "description",
                ]
                .map(Alias::new),
            )
            .values_panic([
                ALERT_DEF.into(),
                "email".into(),
                "{}".into(),
                "30s,1m,5m,15m,1h".into(),
                (-1).into(),
                60.into(),
                2.into(),
                0.into(),
                "".into(),
                false.into(),
                0.into(),
                "alert e-mails about failing notices (recipients in each param)".into(),
            ])
            .to_owned();
        manager.exec_stmt(insert).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let delete = Query::delete()
            .from_table(Alias::new("notify_def"))
            .and_where(Expr::col(Alias::new("name")).eq(ALERT_DEF))
            .to_owned();
        manager.exec_stmt(delete).await
    }
}
