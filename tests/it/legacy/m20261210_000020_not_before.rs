//! Delayed notices: `not_before` on `notify_msg` and `notify_msg_history`,
//! the earliest time (UTC, the database's clock) a notice may be attempted;
//! NULL for a notice due at once. Existing rows keep NULL.
//!
//! `next_call_time` still decides when a notice is due. `not_before` tells
//! a delayed notice from one set aside for its key's turn (both wait with
//! `next_call_time` ahead): what makes a waiting notice due early (the
//! promotion of a key's next notice, a run of a key's notices) leaves a
//! notice alone until its `not_before`.
//!
//! On every backend an insert trigger gives a plain-SQL row written with a
//! future `next_call_time`, not leased and without `not_before`, that time
//! as its `not_before`, so such a producer needs to write only
//! `next_call_time` (the library writes both; its rows match no trigger's
//! condition): `BEFORE INSERT` on PostgreSQL and MySQL/MariaDB, an `AFTER
//! INSERT` update of the row on SQLite (whose `WHEN` skips every other row).
//!
//! On PostgreSQL also:
//! - an insert trigger sends `NOTIFY solid_notify, 'later'` for a delayed
//!   notice (once per transaction: PostgreSQL folds identical
//!   notifications), so that every worker asks at once when it falls due
//!   and sleeps until then, not until its next poll. It does not sweep for
//!   it: the notice is not due.

use sea_orm_migration::{prelude::*, sea_orm::DbBackend};

use super::m20261122_000001_create_tables::timestamp;
use super::m20261124_000004_wake_trigger::on_postgres;

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261210_000020_not_before"
    }
}

#[derive(DeriveIden)]
enum Msg {
    NotBefore,
}

const TABLES: [&str; 2] = ["notify_msg", "notify_msg_history"];

const NOW: &str = "(statement_timestamp() AT TIME ZONE 'UTC')";

const UP_PG: [&str; 6] = [
    "CREATE OR REPLACE FUNCTION solid_notify_not_before() RETURNS trigger LANGUAGE plpgsql AS $$
     BEGIN
       NEW.not_before := NEW.next_call_time;
       RETURN NEW;
     END $$",
    // Named to run before `solid_notify_set_aside` and
    // `solid_notify_sync_due_insert` (BEFORE triggers run by name).
    "CREATE TRIGGER solid_notify_not_before BEFORE INSERT ON notify_msg
     FOR EACH ROW WHEN (NEW.not_before IS NULL AND NOT NEW.leased AND NEW.status = 0
         AND NEW.next_call_time > @NOW@)
     EXECUTE FUNCTION solid_notify_not_before()",
    "COMMENT ON FUNCTION solid_notify_not_before() IS 'solid-notify: a plain-SQL notice written due later is delayed until then'",
    "CREATE OR REPLACE FUNCTION solid_notify_wake_later() RETURNS trigger LANGUAGE plpgsql AS $$
     BEGIN
       PERFORM pg_notify('solid_notify', 'later');
       RETURN NULL;
     END $$",
    // A delayed notice (not a row set aside for its key's turn, which has
    // no `not_before`): workers ask when it is due, without sweeping.
    "CREATE TRIGGER solid_notify_wake_later AFTER INSERT ON notify_msg
     FOR EACH ROW WHEN (NOT NEW.leased AND NEW.status = 0 AND NEW.not_before > @NOW@)
     EXECUTE FUNCTION solid_notify_wake_later()",
    "COMMENT ON FUNCTION solid_notify_wake_later() IS 'solid-notify: NOTIFY solid_notify, ''later'' when a notice is added due later'",
];

const DOWN_PG: [&str; 4] = [
    "DROP TRIGGER IF EXISTS solid_notify_wake_later ON notify_msg",
    "DROP FUNCTION IF EXISTS solid_notify_wake_later()",
    "DROP TRIGGER IF EXISTS solid_notify_not_before ON notify_msg",
    "DROP FUNCTION IF EXISTS solid_notify_not_before()",
];

/// MySQL/MariaDB (no `WHEN` on a trigger: the `IF` is evaluated per row).
const UP_MYSQL: [&str; 2] = [
    "DROP TRIGGER IF EXISTS solid_notify_not_before",
    "CREATE TRIGGER solid_notify_not_before BEFORE INSERT ON notify_msg FOR EACH ROW \
     IF NEW.not_before IS NULL AND NOT NEW.leased AND NEW.status = 0 \
        AND NEW.next_call_time > UTC_TIMESTAMP(6) THEN \
       SET NEW.not_before = NEW.next_call_time; \
     END IF",
];

/// SQLite: compared to the millisecond, as `strftime` writes the time
/// (sqlx writes nanoseconds: a time bound as "now" would otherwise sort
/// after the same millisecond's `strftime` and look later).
const UP_SQLITE: [&str; 2] = [
    "DROP TRIGGER IF EXISTS solid_notify_not_before",
    "CREATE TRIGGER solid_notify_not_before AFTER INSERT ON notify_msg FOR EACH ROW \
     WHEN NEW.not_before IS NULL AND NOT NEW.leased AND NEW.status = 0 \
        AND substr(NEW.next_call_time, 1, 23) > strftime('%Y-%m-%d %H:%M:%f', 'now') BEGIN \
       UPDATE notify_msg SET not_before = NEW.next_call_time WHERE id = NEW.id; \
     END",
];

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let backend = manager.get_database_backend();
        for table in TABLES {
            manager
                .alter_table(
                    Table::alter()
                        .table(Alias::new(table))
                        .add_column(timestamp(backend, Msg::NotBefore, false))
                        .to_owned(),
                )
                .await?;
        }
        let others: &[&str] = match backend {
            DbBackend::MySql => &UP_MYSQL,
            DbBackend::Sqlite => &UP_SQLITE,
            _ => &[],
        };
        for sql in others {
            manager.get_connection().execute_unprepared(sql).await?;
        }
        on_postgres(manager, UP_PG.map(|sql| sql.replace("@NOW@", NOW))).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        on_postgres(manager, DOWN_PG.map(String::from)).await?;
        if manager.get_database_backend() != DbBackend::Postgres {
            manager
                .get_connection()
                .execute_unprepared("DROP TRIGGER IF EXISTS solid_notify_not_before")
                .await?;
        }
        for table in TABLES {
            manager
                .alter_table(
                    Table::alter()
                        .table(Alias::new(table))
                        .drop_column(Msg::NotBefore)
                        .to_owned(),
                )
                .await?;
        }
        Ok(())
    }
}
