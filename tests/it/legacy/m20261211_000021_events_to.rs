//! Adds `notify_def.events_to`: the name of the definition that receives the
//! operational events of this one (`notice.failing`, `notice.failed`,
//! `notice.recovered`, `key.blocked`, `key.released`, `definition.paused`,
//! `definition.resumed`, `circuit.opened`, `circuit.closed`); empty, the
//! default, sends none.

use sea_orm_migration::{prelude::*, schema::*};

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261211_000021_events_to"
    }
}

#[derive(DeriveIden)]
enum NotifyDef {
    Table,
    EventsTo,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(NotifyDef::Table)
                    .add_column(string_len(NotifyDef::EventsTo, 191).default(""))
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(NotifyDef::Table)
                    .drop_column(NotifyDef::EventsTo)
                    .to_owned(),
            )
            .await
    }
}
