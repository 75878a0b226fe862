//! Multi-step notices: `notify_def.steps` (a JSON array of `{channel,
//! target}`; empty, the default, is the one step of `channel` and `target`),
//! and on `notify_msg` and `notify_msg_history` the step a notice is on
//! (`step`, 0-based, default 0) and the result the step before it passed on
//! (`step_result`, JSON text, NULL when none). Existing rows keep today's
//! behaviour: one step, at step 0.

use sea_orm_migration::{prelude::*, schema::*, sea_orm::DbBackend};

use super::m20261122_000001_create_tables::long_text;

/// A nullable text column that holds up to 4 GiB on MySQL/MariaDB (a result
/// may be as large as a param: `Config::max_param_bytes`).
fn long_text_null(backend: DbBackend, col: impl IntoIden) -> ColumnDef {
    let mut def = ColumnDef::new(col);
    match backend {
        DbBackend::MySql => def.custom(Alias::new("longtext")),
        _ => def.text(),
    };
    def.null().take()
}

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261203_000013_steps"
    }
}

#[derive(DeriveIden)]
enum NotifyDef {
    Table,
    Steps,
}

#[derive(DeriveIden)]
enum Msg {
    Step,
    StepResult,
}

const TABLES: [&str; 2] = ["notify_msg", "notify_msg_history"];

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let backend = manager.get_database_backend();
        manager
            .alter_table(
                Table::alter()
                    .table(NotifyDef::Table)
                    .add_column(long_text(backend, NotifyDef::Steps).default(""))
                    .to_owned(),
            )
            .await?;
        for table in TABLES {
            for column in [
                integer(Msg::Step).default(0).to_owned(),
                long_text_null(backend, Msg::StepResult),
            ] {
                manager
                    .alter_table(
                        Table::alter()
                            .table(Alias::new(table))
                            .add_column(column)
                            .to_owned(),
                    )
                    .await?;
            }
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for table in TABLES {
            for column in [Msg::Step, Msg::StepResult] {
                manager
                    .alter_table(
                        Table::alter()
                            .table(Alias::new(table))
                            .drop_column(column)
                            .to_owned(),
                    )
                    .await?;
            }
        }
        manager
            .alter_table(
                Table::alter()
                    .table(NotifyDef::Table)
                    .drop_column(NotifyDef::Steps)
                    .to_owned(),
            )
            .await
    }
}
