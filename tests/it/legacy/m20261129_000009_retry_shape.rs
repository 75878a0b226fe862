//! Adds the shape of a definition's retries to `notify_def`:
//! `immediate_retries` (tries again within the same claim before the
//! schedule takes over, default 0), `immediate_retry_delay` (milliseconds
//! between them, default 100) and `retry_jitter` (a percentage each
//! scheduled wait is spread by, default 0). Existing rows keep today's
//! behaviour. Written by `solid-notify defs sync`.

use sea_orm_migration::{prelude::*, schema::*};

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261129_000009_retry_shape"
    }
}

#[derive(DeriveIden, Clone, Copy)]
enum NotifyDef {
    Table,
    ImmediateRetries,
    ImmediateRetryDelay,
    RetryJitter,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // One column per statement: SQLite alters one column at a time.
        for col in [
            integer(NotifyDef::ImmediateRetries).default(0).to_owned(),
            integer(NotifyDef::ImmediateRetryDelay)
                .default(100)
                .to_owned(),
            small_integer(NotifyDef::RetryJitter).default(0).to_owned(),
        ] {
            manager
                .alter_table(
                    Table::alter()
                        .table(NotifyDef::Table)
                        .add_column(col)
                        .to_owned(),
                )
                .await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for col in [
            NotifyDef::ImmediateRetries,
            NotifyDef::ImmediateRetryDelay,
            NotifyDef::RetryJitter,
        ] {
            manager
                .alter_table(
                    Table::alter()
                        .table(NotifyDef::Table)
                        .drop_column(col)
                        .to_owned(),
                )
                .await?;
        }
        Ok(())
    }
}
