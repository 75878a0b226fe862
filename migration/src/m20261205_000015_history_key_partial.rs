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
//! The rebuild reads the whole history table and blocks writes to it
//! while it runs: on a large history, migrate when workers are stopped.

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
    if manager.get_database_backend() == DbBackend::MySql {
        return Ok(());
    }
    let db = manager.get_connection();
    db.execute_unprepared(&format!("DROP INDEX IF EXISTS {INDEX}"))
        .await?;
    db.execute_unprepared(&format!(
        "CREATE INDEX {INDEX} ON notify_msg_history (def_id, idempotency_key){predicate}"
    ))
    .await?;
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
