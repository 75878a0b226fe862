//! Adds `notify_def.rate_limit` (`50/s`, `600/m`, `1000/h`; empty, the
//! default, is no limit) and `notify_rate`, the budget every worker takes
//! from: one row per rate-limited definition, the number of the current
//! window by the database's clock and the tries started in it.

use sea_orm_migration::{prelude::*, schema::*};

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261201_000011_rate_limit"
    }
}

#[derive(DeriveIden)]
enum NotifyDef {
    Table,
    RateLimit,
}

#[derive(DeriveIden)]
enum NotifyRate {
    Table,
    DefId,
    WindowNo,
    Used,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(NotifyDef::Table)
                    .add_column(string_len(NotifyDef::RateLimit, 32).default(""))
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table(NotifyRate::Table)
                    .if_not_exists()
                    .col(big_integer(NotifyRate::DefId).primary_key())
                    .col(big_integer(NotifyRate::WindowNo).default(0))
                    .col(integer(NotifyRate::Used).default(0))
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table(NotifyRate::Table).to_owned())
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(NotifyDef::Table)
                    .drop_column(NotifyDef::RateLimit)
                    .to_owned(),
            )
            .await
    }
}
