//! PostgreSQL and SQLite: the history's index of idempotency keys holds only
//! notices that have a key.
//!
//! Most notices have none, and every success moved to history paid an entry
//! for its `NULL` key in `idx_notify_msg_history_def_key` that no lookup
//! ever reads: an add with a key looks it up by `idempotency_key = …`,
//! which only a row with a key can match. The index is rebuilt partial
//! (`WHERE idempotency_key IS NOT NULL`), like the unique index on
//! `notify_msg`. MariaDB has no partial indexes and keeps the full one.
//!
//! The rebuild reads the whole history table. On PostgreSQL the new index
//! is built under another name first, which blocks writes to history (the
//! moves of finished notices) but not reads (keyed adds, the dashboard),
//! and then takes the old one's place; the exclusive lock of that swap is
//! brief. On a large history, migrate when workers are stopped.

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::DbBackend;

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261205_000015_history_key_partial"
    }
}

const INDEX: &str = "idx_notify_msg_history_def_key";

async fn rebuild(manager: &SchemaManager<'_>, predicate: &str) -> Result<(), DbErr> {
    let db = manager.get_connection();
    let create = |name: &str| {
        format!("CREATE INDEX {name} ON notify_msg_history (def_id, idempotency_key){predicate}")
    };
    match manager.get_database_backend() {
        DbBackend::MySql => {}
        DbBackend::Postgres => {
            // Built beside the old one (a SHARE lock: reads go on), then
            // swapped in under the old name.
            let building = format!("{INDEX}_new");
            db.execute_unprepared(&create(&building)).await?;
            db.execute_unprepared(&format!("DROP INDEX IF EXISTS {INDEX}"))
                .await?;
            db.execute_unprepared(&format!("ALTER INDEX {building} RENAME TO {INDEX}"))
                .await?;
        }
        _ => {
            // SQLite: one writer at a time anyway.
            db.execute_unprepared(&format!("DROP INDEX IF EXISTS {INDEX}"))
                .await?;
            db.execute_unprepared(&create(INDEX)).await?;
        }
    }
    Ok(())
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    /// One transaction on SQLite too: the drop and the create run on one
    /// connection, and a failure leaves the old index in place.
    fn use_transaction(&self) -> Option<bool> {
        Some(true)
    }

    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        rebuild(manager, " WHERE idempotency_key IS NOT NULL").await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        rebuild(manager, "").await
    }
}
