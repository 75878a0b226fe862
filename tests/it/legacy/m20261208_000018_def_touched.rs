//! Definitions changed since a time, and sizes without reading payloads.
//!
//! - `notify_def.update_time` is the database's time of the row's last
//!   change, whoever changes it: a trigger sets it on every `UPDATE` (an
//!   edit in place, a pause, a sync), so the definition cache can read only
//!   the rows changed since its last read instead of the whole table.
//! - MySQL/MariaDB: `notify_msg.param_bytes`, the param's length in bytes,
//!   set by a trigger when the row is inserted (a param edited in place by
//!   hand keeps its first size: the sweep counts the real size once it has
//!   read the row), so that a claim bounded in bytes reads
//!   the sizes without reading each candidate's param from its overflow
//!   pages. (PostgreSQL's `octet_length` and SQLite's read only the value's
//!   header.)

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::DbBackend;

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261208_000018_def_touched"
    }
}

/// The cache's refresh reads the rows changed since a time.
const INDEX: &str =
    "CREATE INDEX IF NOT EXISTS idx_notify_def_update_time ON notify_def (update_time)";

fn up(backend: DbBackend) -> Vec<&'static str> {
    match backend {
        DbBackend::Postgres => vec![
            "CREATE OR REPLACE FUNCTION solid_notify_def_touched() RETURNS trigger AS $$ \
             BEGIN NEW.update_time := clock_timestamp() AT TIME ZONE 'UTC'; RETURN NEW; END \
             $$ LANGUAGE plpgsql",
            "DROP TRIGGER IF EXISTS solid_notify_def_touched ON notify_def",
            "CREATE TRIGGER solid_notify_def_touched BEFORE UPDATE ON notify_def \
             FOR EACH ROW EXECUTE FUNCTION solid_notify_def_touched()",
            INDEX,
        ],
        DbBackend::MySql => vec![
            "DROP TRIGGER IF EXISTS solid_notify_def_touched",
            "CREATE TRIGGER solid_notify_def_touched BEFORE UPDATE ON notify_def \
             FOR EACH ROW SET NEW.update_time = UTC_TIMESTAMP(6)",
            // A plain column set at insert: MariaDB reads a stored
            // generated column's source (the whole param) with it.
            "ALTER TABLE notify_msg ADD COLUMN param_bytes BIGINT NULL",
            "DROP TRIGGER IF EXISTS solid_notify_param_bytes",
            "CREATE TRIGGER solid_notify_param_bytes BEFORE INSERT ON notify_msg \
             FOR EACH ROW SET NEW.param_bytes = LENGTH(NEW.param)",
            "UPDATE notify_msg SET param_bytes = LENGTH(param) WHERE param_bytes IS NULL",
            INDEX,
        ],
        _ => vec![
            "DROP TRIGGER IF EXISTS solid_notify_def_touched",
            // After the update, once per row: the row's own update of its
            // time does not change `update_time` again (the WHEN).
            "CREATE TRIGGER solid_notify_def_touched AFTER UPDATE ON notify_def \
             FOR EACH ROW WHEN NEW.update_time = OLD.update_time BEGIN \
             UPDATE notify_def SET update_time = strftime('%Y-%m-%d %H:%M:%f', 'now') \
             WHERE id = NEW.id; END",
            INDEX,
        ],
    }
}

fn down(backend: DbBackend) -> Vec<&'static str> {
    match backend {
        DbBackend::Postgres => vec![
            "DROP TRIGGER IF EXISTS solid_notify_def_touched ON notify_def",
            "DROP FUNCTION IF EXISTS solid_notify_def_touched()",
            "DROP INDEX IF EXISTS idx_notify_def_update_time",
        ],
        DbBackend::MySql => vec![
            "DROP TRIGGER IF EXISTS solid_notify_def_touched",
            "DROP TRIGGER IF EXISTS solid_notify_param_bytes",
            "ALTER TABLE notify_msg DROP COLUMN param_bytes",
            "DROP INDEX IF EXISTS idx_notify_def_update_time ON notify_def",
        ],
        _ => vec![
            "DROP TRIGGER IF EXISTS solid_notify_def_touched",
            "DROP INDEX IF EXISTS idx_notify_def_update_time",
        ],
    }
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for sql in up(manager.get_database_backend()) {
            manager.get_connection().execute_unprepared(sql).await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for sql in down(manager.get_database_backend()) {
            manager.get_connection().execute_unprepared(sql).await?;
        }
        Ok(())
    }
}
