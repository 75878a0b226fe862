//! The baseline: the whole schema of the first release, in one migration
//! (ADR 0013). Each backend's statements are in `baseline/*.sql`,
//! separated by `--> statement-breakpoint` lines; then the built-in alert
//! definition is added.
//!
//! - `notify_def`: one row per definition (its channel, target and policy).
//! - `notify_msg`: notices in flight; `notify_msg_history`: finished ones,
//!   with the same columns.
//! - `notify_worker`: each worker's heartbeat; `notify_rate`: the rate
//!   limits' windows.
//! - Triggers: PostgreSQL wakes workers (`NOTIFY` on [`crate::WAKE_CHANNEL`])
//!   and keeps `due_at`; SQLite normalizes the times of plain-SQL rows;
//!   MySQL/MariaDB keeps `param_bytes`; every backend stamps
//!   `notify_def.update_time` and copies a plain-SQL row's future
//!   `next_call_time` into `not_before`.

use sea_orm_migration::{prelude::*, sea_orm::DbBackend};

/// The baseline migration.
pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261215_000001_baseline"
    }
}

/// The definition of alert e-mails (same as `solid_notify::alert::ALERT_DEF`).
const ALERT_DEF: &str = "solid_notify_alert";

/// The collation of the keys in `baseline/mysql.sql`: byte for byte,
/// trailing spaces included (MariaDB's).
const MARIADB_BINARY: &str = "utf8mb4_nopad_bin";

/// The server's collation that compares keys byte for byte: MariaDB's
/// [`MARIADB_BINARY`], MySQL 8's `utf8mb4_0900_bin` (no padding either),
/// else `utf8mb4_bin` (which ignores trailing spaces).
async fn binary_collation(db: &SchemaManagerConnection<'_>) -> Result<&'static str, DbErr> {
    for name in [MARIADB_BINARY, "utf8mb4_0900_bin"] {
        let found = db
            .query_one_raw(sea_orm_migration::sea_orm::Statement::from_string(
                DbBackend::MySql,
                format!(
                    "SELECT 1 FROM information_schema.COLLATIONS WHERE COLLATION_NAME = '{name}'"
                ),
            ))
            .await?;
        if found.is_some() {
            return Ok(name);
        }
    }
    Ok("utf8mb4_bin")
}

/// What separates two statements of a baseline file.
const BREAK: &str = "--> statement-breakpoint";

/// The baseline statements of `backend`, in order.
pub fn statements(backend: DbBackend) -> Vec<&'static str> {
    let file = match backend {
        DbBackend::Postgres => include_str!("baseline/postgres.sql"),
        DbBackend::MySql => include_str!("baseline/mysql.sql"),
        _ => include_str!("baseline/sqlite.sql"),
    };
    file.split(BREAK)
        .map(str::trim)
        .filter(|s| {
            s.lines()
                .any(|l| !l.trim().is_empty() && !l.trim_start().starts_with("--"))
        })
        .collect()
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        let backend = manager.get_database_backend();
        let collation = match backend {
            DbBackend::MySql => binary_collation(db).await?,
            _ => MARIADB_BINARY,
        };
        for sql in statements(backend) {
            db.execute_unprepared(&sql.replace(MARIADB_BINARY, collation))
                .await?;
        }
        let insert = Query::insert()
            .into_table(Alias::new("notify_def"))
            .columns(
                [
                    "name",
                    "channel",
                    "target",
                    "retry_interval",
                    "max_retry_times",
                    "max_retry_interval",
                    "alert_trigger_type",
                    "alert_trigger_fail_times",
                    "description",
                ]
                .map(Alias::new),
            )
            .values_panic([
                ALERT_DEF.into(),
                "email".into(),
                "{}".into(),
                "30s,1m,5m,15m,1h".into(),
                (-1).into(),
                60.into(),
                2.into(),
                0.into(),
                "alert e-mails about failing notices (recipients in each param)".into(),
            ])
            .to_owned();
        manager.exec_stmt(insert).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for table in [
            "notify_rate",
            "notify_worker",
            "notify_msg_history",
            "notify_msg",
            "notify_def",
        ] {
            manager
                .drop_table(Table::drop().table(Alias::new(table)).to_owned())
                .await?;
        }
        if manager.get_database_backend() == DbBackend::Postgres {
            for function in [
                "solid_notify_def_touched",
                "solid_notify_not_before",
                "solid_notify_set_aside",
                "solid_notify_sync_due",
                "solid_notify_wake",
                "solid_notify_wake_later",
                "solid_notify_wake_turn",
            ] {
                manager
                    .get_connection()
                    .execute_unprepared(&format!("DROP FUNCTION {function}()"))
                    .await?;
            }
        }
        Ok(())
    }
}
