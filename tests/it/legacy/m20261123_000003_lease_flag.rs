//! Adds `leased` to `notify_msg` and `notify_msg_history`: set by a claim,
//! cleared by every outcome, so "an attempt is in progress" means a live
//! claim (`leased` and `next_call_time` still ahead), never merely "due later".

use sea_orm_migration::{prelude::*, schema::*};

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261123_000003_lease_flag"
    }
}

#[derive(DeriveIden)]
enum Msg {
    Leased,
}

const TABLES: [&str; 2] = ["notify_msg", "notify_msg_history"];

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for table in TABLES {
            manager
                .alter_table(
                    Table::alter()
                        .table(Alias::new(table))
                        .add_column(boolean(Msg::Leased).default(false))
                        .to_owned(),
                )
                .await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for table in TABLES {
            manager
                .alter_table(
                    Table::alter()
                        .table(Alias::new(table))
                        .drop_column(Msg::Leased)
                        .to_owned(),
                )
                .await?;
        }
        Ok(())
    }
}
