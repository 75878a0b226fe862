//! Makes `idempotency_key` unique per definition among notices in flight:
//! a unique index on `notify_msg (def_id, idempotency_key)` (partial, `WHERE
//! idempotency_key IS NOT NULL`, on PostgreSQL and SQLite; rows without a
//! key are never in conflict on any backend, NULLs being distinct), and a
//! plain index on the same columns of `notify_msg_history` for the lookup
//! an idempotent add makes there. On MySQL/MariaDB the key column of both
//! tables gets a binary collation first, so keys compare byte for byte as on
//! the other backends (not case-, accent- or trailing-space-blind).
//!
//! Notices already in flight that share a key would make the unique index
//! impossible: the migration then stops before changing anything and names
//! them, so that an operator decides (finish or cancel the extras, or clear
//! their keys) rather than the migration dropping anything.

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::{ConnectionTrait, DbBackend, Statement};

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261130_000010_idempotency_key"
    }
}

const UNIQUE: &str = "idx_notify_msg_def_key";
const HISTORY: &str = "idx_notify_msg_history_def_key";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        let backend = manager.get_database_backend();
        let dupes = db
            .query_all_raw(Statement::from_string(
                backend,
                "SELECT def_id, idempotency_key, COUNT(*) AS n, MIN(id) AS first_id \
                 FROM notify_msg WHERE idempotency_key IS NOT NULL \
                 GROUP BY def_id, idempotency_key HAVING COUNT(*) > 1 \
                 ORDER BY def_id, idempotency_key",
            ))
            .await?;
        if !dupes.is_empty() {
            let mut listed = Vec::new();
            for row in dupes.iter().take(10) {
                let def_id: i64 = row.try_get("", "def_id")?;
                let key: String = row.try_get("", "idempotency_key")?;
                let n: i64 = row.try_get("", "n")?;
                listed.push(format!("def_id {def_id} key {key:?}: {n} notices"));
            }
            return Err(DbErr::Migration(format!(
                "{} idempotency keys are shared by several notices in flight ({}{}); \
                 idempotency keys become unique per definition. Finish or cancel the extra \
                 notices (`solid-notify show --key K`, `solid-notify cancel`), or clear their \
                 keys (UPDATE notify_msg SET idempotency_key = NULL WHERE id = …), then migrate again",
                dupes.len(),
                listed.join("; "),
                if dupes.len() > 10 { "; …" } else { "" },
            )));
        }
        if backend == DbBackend::MySql {
            // Keys compare byte for byte, as on the other backends: the
            // default collation would make `Order-1` and `order-1` (or
            // `k` and `k `) one key, and the second notice would be
            // taken for the first. A no-pad binary collation where the
            // server has one.
            let chosen = binary_collation(db).await?;
            for table in ["notify_msg", "notify_msg_history"] {
                db.execute_unprepared(&format!(
                    "ALTER TABLE {table} MODIFY idempotency_key VARCHAR(255) \
                     CHARACTER SET utf8mb4 COLLATE {chosen} NULL"
                ))
                .await?;
            }
        }
        let unique = match backend {
            DbBackend::MySql => {
                format!("CREATE UNIQUE INDEX {UNIQUE} ON notify_msg (def_id, idempotency_key)")
            }
            _ => format!(
                "CREATE UNIQUE INDEX IF NOT EXISTS {UNIQUE} ON notify_msg (def_id, idempotency_key) \
                 WHERE idempotency_key IS NOT NULL"
            ),
        };
        db.execute_unprepared(&unique).await?;
        manager
            .create_index(
                Index::create()
                    .name(HISTORY)
                    .table(Alias::new("notify_msg_history"))
                    .col(Alias::new("def_id"))
                    .col(Alias::new("idempotency_key"))
                    .if_not_exists()
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for (name, table) in [(UNIQUE, "notify_msg"), (HISTORY, "notify_msg_history")] {
            manager
                .drop_index(Index::drop().name(name).table(Alias::new(table)).to_owned())
                .await?;
        }
        Ok(())
    }
}

/// MySQL/MariaDB: the collation keys compare under, byte for byte, without
/// padding where the server has such a collation.
pub(crate) async fn binary_collation<C: ConnectionTrait>(db: &C) -> Result<&'static str, DbErr> {
    for name in ["utf8mb4_nopad_bin", "utf8mb4_0900_bin"] {
        let found = db
            .query_one_raw(Statement::from_string(
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
