//! Ordered delivery per key: `notify_def.ordering` (`per_key`; empty, the
//! default, is unordered) and `notify_def.stop_on_failure` (default true),
//! `ordering_key` on `notify_msg` and `notify_msg_history`, and the indexes
//! that make each check of a key's turn one index probe: in flight by
//! `(def_id, ordering_key, create_time, id)` and the claimed ones by
//! `(def_id, ordering_key)`; in history the final failures and parked
//! notices by the same four columns, and those cancelled while claimed
//! (partial indexes on PostgreSQL and SQLite, which skip rows without a
//! key; on MariaDB the history index leads with the status). On MariaDB the
//! key compares byte for byte, as idempotency keys do.
//!
//! On PostgreSQL `notify_msg.create_time` now defaults to the wall clock at
//! the insert (`clock_timestamp()`), not the transaction's start, so a
//! plain-SQL producer that waited for a lock before its insert orders after
//! the transaction it waited for (MariaDB's default is the statement's
//! time already).
//!
//! On PostgreSQL a notice with a key that leaves `notify_msg`, or a final
//! failure with a key cancelled in history, sends `NOTIFY solid_notify`:
//! the next notice of its key may be in turn now, so workers in other
//! processes wake at once instead of at their next poll.

use sea_orm_migration::{
    prelude::*,
    schema::*,
    sea_orm::{ConnectionTrait, DbBackend},
};

use super::m20261130_000010_idempotency_key::binary_collation;

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261202_000012_ordering"
    }
}

#[derive(DeriveIden)]
enum NotifyDef {
    Table,
    Ordering,
    StopOnFailure,
}

const LIVE: &str = "idx_notify_msg_def_order";
const LIVE_HELD: &str = "idx_notify_msg_def_order_held";
const HISTORY: &str = "idx_notify_msg_history_def_order";
const HISTORY_HELD: &str = "idx_notify_msg_history_def_order_held";

const PG_UP: [&str; 4] = [
    "ALTER TABLE notify_msg ALTER COLUMN create_time SET DEFAULT (clock_timestamp() AT TIME ZONE 'UTC')",
    "CREATE OR REPLACE FUNCTION solid_notify_wake_turn() RETURNS trigger LANGUAGE plpgsql AS $$
     BEGIN
       PERFORM pg_notify('solid_notify', '');
       RETURN NULL;
     END $$",
    "CREATE TRIGGER solid_notify_wake_turn AFTER DELETE ON notify_msg
     FOR EACH ROW WHEN (OLD.ordering_key IS NOT NULL) EXECUTE FUNCTION solid_notify_wake_turn()",
    "CREATE TRIGGER solid_notify_wake_turn_cancel AFTER UPDATE ON notify_msg_history
     FOR EACH ROW WHEN (NEW.ordering_key IS NOT NULL AND NEW.status = 5 AND OLD.status <> 5)
     EXECUTE FUNCTION solid_notify_wake_turn()",
];

const PG_DOWN: [&str; 4] = [
    "ALTER TABLE notify_msg ALTER COLUMN create_time SET DEFAULT (now() AT TIME ZONE 'utc')",
    "DROP TRIGGER IF EXISTS solid_notify_wake_turn_cancel ON notify_msg_history",
    "DROP TRIGGER IF EXISTS solid_notify_wake_turn ON notify_msg",
    "DROP FUNCTION IF EXISTS solid_notify_wake_turn()",
];

/// The indexes of a key's turn on `backend`: (name, table, statement).
fn indexes(backend: DbBackend) -> Vec<(&'static str, &'static str, String)> {
    match backend {
        DbBackend::MySql => vec![
            (
                LIVE,
                "notify_msg",
                format!(
                    "CREATE INDEX {LIVE} ON notify_msg (def_id, ordering_key, create_time, id)"
                ),
            ),
            (
                LIVE_HELD,
                "notify_msg",
                format!("CREATE INDEX {LIVE_HELD} ON notify_msg (def_id, ordering_key, leased)"),
            ),
            // Final failures, parked and cancelled notices: by status.
            (
                HISTORY,
                "notify_msg_history",
                format!(
                    "CREATE INDEX {HISTORY} ON notify_msg_history \
                     (def_id, ordering_key, status, create_time, id)"
                ),
            ),
        ],
        _ => vec![
            (
                LIVE,
                "notify_msg",
                format!(
                    "CREATE INDEX IF NOT EXISTS {LIVE} ON notify_msg \
                     (def_id, ordering_key, create_time, id) WHERE ordering_key IS NOT NULL"
                ),
            ),
            (
                LIVE_HELD,
                "notify_msg",
                format!(
                    "CREATE INDEX IF NOT EXISTS {LIVE_HELD} ON notify_msg \
                     (def_id, ordering_key) WHERE ordering_key IS NOT NULL AND leased"
                ),
            ),
            (
                HISTORY,
                "notify_msg_history",
                format!(
                    "CREATE INDEX IF NOT EXISTS {HISTORY} ON notify_msg_history \
                     (def_id, ordering_key, create_time, id) \
                     WHERE ordering_key IS NOT NULL AND status IN (3, 6)"
                ),
            ),
            (
                HISTORY_HELD,
                "notify_msg_history",
                format!(
                    "CREATE INDEX IF NOT EXISTS {HISTORY_HELD} ON notify_msg_history \
                     (def_id, ordering_key) WHERE ordering_key IS NOT NULL AND leased"
                ),
            ),
        ],
    }
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        let backend = manager.get_database_backend();
        manager
            .alter_table(
                Table::alter()
                    .table(NotifyDef::Table)
                    .add_column(string_len(NotifyDef::Ordering, 16).default(""))
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(NotifyDef::Table)
                    .add_column(boolean(NotifyDef::StopOnFailure).default(true))
                    .to_owned(),
            )
            .await?;
        let key_type = match backend {
            DbBackend::MySql => format!(
                "VARCHAR(255) CHARACTER SET utf8mb4 COLLATE {} NULL",
                binary_collation(db).await?
            ),
            _ => "VARCHAR(255) NULL".to_string(),
        };
        for table in ["notify_msg", "notify_msg_history"] {
            db.execute_unprepared(&format!(
                "ALTER TABLE {table} ADD COLUMN ordering_key {key_type}"
            ))
            .await?;
        }
        for (_, _, sql) in indexes(backend) {
            db.execute_unprepared(&sql).await?;
        }
        if backend == DbBackend::Postgres {
            for sql in PG_UP {
                db.execute_unprepared(sql).await?;
            }
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        if manager.get_database_backend() == DbBackend::Postgres {
            for sql in PG_DOWN {
                db.execute_unprepared(sql).await?;
            }
        }
        for (name, table, _) in indexes(manager.get_database_backend()) {
            manager
                .drop_index(Index::drop().name(name).table(Alias::new(table)).to_owned())
                .await?;
        }
        for table in ["notify_msg", "notify_msg_history"] {
            manager
                .alter_table(
                    Table::alter()
                        .table(Alias::new(table))
                        .drop_column(Alias::new("ordering_key"))
                        .to_owned(),
                )
                .await?;
        }
        for column in [NotifyDef::Ordering, NotifyDef::StopOnFailure] {
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
