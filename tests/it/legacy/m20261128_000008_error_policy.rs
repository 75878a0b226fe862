//! Adds `notify_def.on_error`: what a handler's `Err` or panic means for a
//! notice, `retry` (the default, today's behaviour for existing rows) or
//! `fail` (a final failure at once, as seed 000's default exception
//! strategy does). Written by `solid-notify defs sync`.

use sea_orm_migration::{prelude::*, schema::*};

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261128_000008_error_policy"
    }
}

#[derive(DeriveIden)]
enum NotifyDef {
    Table,
    OnError,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(NotifyDef::Table)
                    .add_column(string_len(NotifyDef::OnError, 16).default("retry"))
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(NotifyDef::Table)
                    .drop_column(NotifyDef::OnError)
                    .to_owned(),
            )
            .await
    }
}
