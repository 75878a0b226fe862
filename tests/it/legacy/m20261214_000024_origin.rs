//! Adds `origin` to `notify_msg` and `notify_msg_history`: who wrote the
//! notice, 0 a producer (the default, so a plain-SQL producer's row is
//! one), 1 the library's alert e-mail, 2 the library's operational event.
//! A `CHECK` refuses any other number. Rows written before it are told
//! apart as the library did until now: an event by its description
//! (`solid-notify event …`), an alert by its definition.

use sea_orm_migration::prelude::*;

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261214_000024_origin"
    }
}

const TABLES: [&str; 2] = ["notify_msg", "notify_msg_history"];

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        for table in TABLES {
            db.execute_unprepared(&format!(
                "ALTER TABLE {table} ADD COLUMN origin smallint NOT NULL DEFAULT 0 \
                 CHECK (origin BETWEEN 0 AND 2)"
            ))
            .await?;
            db.execute_unprepared(&format!(
                "UPDATE {table} SET origin = 2 WHERE description LIKE 'solid-notify event %'"
            ))
            .await?;
            db.execute_unprepared(&format!(
                "UPDATE {table} SET origin = 1 WHERE def_id IN \
                 (SELECT id FROM notify_def WHERE name = 'solid_notify_alert')"
            ))
            .await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for table in TABLES {
            manager
                .alter_table(
                    Table::alter()
                        .table(Alias::new(table))
                        .drop_column(Alias::new("origin"))
                        .to_owned(),
                )
                .await?;
        }
        Ok(())
    }
}
