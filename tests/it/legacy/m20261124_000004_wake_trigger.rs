//! PostgreSQL only: wakes workers when notices become due.
//!
//! Row triggers on `notify_msg` send `NOTIFY solid_notify` for rows written
//! due now and not leased (a plain-SQL insert, a requeue, a release);
//! PostgreSQL folds the identical notifications of one transaction into one.
//! Their `WHEN` clause is checked in the executor, so the rows that notify
//! nobody (claims, retries scheduled for later, notices reserved for their
//! after-commit attempt) cost no function call. Other backends rely on
//! in-process wake-ups and polling.

use sea_orm_migration::{prelude::*, sea_orm::DbBackend};

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261124_000004_wake_trigger"
    }
}

/// The channel workers listen on.
pub const WAKE_CHANNEL: &str = "solid_notify";

/// Whether a written row is due now for a sweeper: not leased, in flight,
/// `next_call_time` reached (the database's clock).
const DUE_NOW: &str = "NOT NEW.leased AND NEW.status IN (0, 2, 4) \
     AND NEW.next_call_time <= (statement_timestamp() AT TIME ZONE 'UTC')";

const UP: [&str; 4] = [
    "CREATE OR REPLACE FUNCTION solid_notify_wake() RETURNS trigger LANGUAGE plpgsql AS $$
     BEGIN
       PERFORM pg_notify('solid_notify', '');
       RETURN NULL;
     END $$",
    "CREATE TRIGGER solid_notify_wake_insert AFTER INSERT ON notify_msg
     FOR EACH ROW WHEN (@DUE_NOW@) EXECUTE FUNCTION solid_notify_wake()",
    "CREATE TRIGGER solid_notify_wake_update AFTER UPDATE ON notify_msg
     FOR EACH ROW WHEN (@DUE_NOW@) EXECUTE FUNCTION solid_notify_wake()",
    "COMMENT ON FUNCTION solid_notify_wake() IS 'solid-notify: NOTIFY solid_notify when notices become due'",
];

const DOWN: [&str; 3] = [
    "DROP TRIGGER IF EXISTS solid_notify_wake_insert ON notify_msg",
    "DROP TRIGGER IF EXISTS solid_notify_wake_update ON notify_msg",
    "DROP FUNCTION IF EXISTS solid_notify_wake()",
];

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        on_postgres(manager, UP.map(|sql| sql.replace("@DUE_NOW@", DUE_NOW))).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        on_postgres(manager, DOWN.map(String::from)).await
    }
}

/// Runs `statements` in order on PostgreSQL; nothing on other backends.
pub(crate) async fn on_postgres(
    manager: &SchemaManager<'_>,
    statements: impl IntoIterator<Item = String>,
) -> Result<(), DbErr> {
    if manager.get_database_backend() != DbBackend::Postgres {
        return Ok(());
    }
    for sql in statements {
        manager.get_connection().execute_unprepared(&sql).await?;
    }
    Ok(())
}
