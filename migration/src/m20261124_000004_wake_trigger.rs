//! PostgreSQL only: wakes workers when notices become due.
//!
//! A statement-level trigger on `notify_msg` sends one `NOTIFY
//! solid_notify` per statement that inserts or updates rows due now and not
//! leased (a plain-SQL insert, a requeue, a release); PostgreSQL folds
//! identical notifications of one transaction into one. Claims (leased rows)
//! and retries scheduled for later notify nobody. Other backends rely on
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

const UP: [&str; 4] = [
    "CREATE OR REPLACE FUNCTION solid_notify_wake() RETURNS trigger LANGUAGE plpgsql AS $$
     BEGIN
       IF EXISTS (SELECT 1 FROM changed
                  WHERE NOT changed.leased
                    AND changed.status IN (0, 2, 4)
                    AND changed.next_call_time <= (statement_timestamp() AT TIME ZONE 'UTC')) THEN
         PERFORM pg_notify('solid_notify', '');
       END IF;
       RETURN NULL;
     END $$",
    "CREATE TRIGGER solid_notify_wake_insert AFTER INSERT ON notify_msg
     REFERENCING NEW TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION solid_notify_wake()",
    "CREATE TRIGGER solid_notify_wake_update AFTER UPDATE ON notify_msg
     REFERENCING NEW TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION solid_notify_wake()",
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
        if manager.get_database_backend() != DbBackend::Postgres {
            return Ok(());
        }
        for sql in UP {
            manager.get_connection().execute_unprepared(sql).await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if manager.get_database_backend() != DbBackend::Postgres {
            return Ok(());
        }
        for sql in DOWN {
            manager.get_connection().execute_unprepared(sql).await?;
        }
        Ok(())
    }
}
