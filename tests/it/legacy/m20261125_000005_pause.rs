//! Adds the pause of a definition to `notify_def`: `paused_until` (no
//! worker claims the definition's notices while it lies ahead) and
//! `pause_reason` (who paused it and why, or why its circuit opened).
//! `solid-notify defs sync` never writes them; only a pause or resume does.
//! Also the circuit breaker's settings: `circuit_failures` (0: off),
//! `circuit_window` and `circuit_cool_down` (seconds), written by a sync.

use sea_orm_migration::{prelude::*, schema::*, sea_orm::DbBackend};

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261125_000005_pause_and_circuit"
    }
}

#[derive(DeriveIden)]
enum NotifyDef {
    Table,
    PausedUntil,
    PauseReason,
    CircuitFailures,
    CircuitWindow,
    CircuitCoolDown,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // One column per statement: SQLite adds one column per ALTER TABLE.
        let mut until = ColumnDef::new(NotifyDef::PausedUntil);
        match manager.get_database_backend() {
            // Microseconds, like every timestamp of these tables.
            DbBackend::MySql => until.custom(Alias::new("datetime(6)")),
            _ => until.date_time(),
        };
        until.null();
        for column in [
            until,
            text_null(NotifyDef::PauseReason),
            integer(NotifyDef::CircuitFailures).default(0).to_owned(),
            integer(NotifyDef::CircuitWindow).default(60).to_owned(),
            integer(NotifyDef::CircuitCoolDown).default(300).to_owned(),
        ] {
            manager
                .alter_table(
                    Table::alter()
                        .table(NotifyDef::Table)
                        .add_column(column)
                        .to_owned(),
                )
                .await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for column in [
            NotifyDef::PausedUntil,
            NotifyDef::PauseReason,
            NotifyDef::CircuitFailures,
            NotifyDef::CircuitWindow,
            NotifyDef::CircuitCoolDown,
        ] {
            manager
                .alter_table(
                    Table::alter()
                        .table(NotifyDef::Table)
                        .drop_column(column)
                        .to_owned(),
                )
                .await?;
        }
        Ok(())
    }
}
