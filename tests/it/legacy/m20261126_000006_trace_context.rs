//! Adds `trace_context` to `notify_msg` and `notify_msg_history`: the W3C
//! trace context (`traceparent`, `tracestate`) of the span that added the
//! notice, as a JSON object of those headers, or NULL when the producer had
//! no OpenTelemetry span. Plain-SQL producers may set it themselves.

use sea_orm_migration::{prelude::*, schema::*};

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261126_000006_trace_context"
    }
}

#[derive(DeriveIden)]
enum Msg {
    TraceContext,
}

const TABLES: [&str; 2] = ["notify_msg", "notify_msg_history"];

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for table in TABLES {
            manager
                .alter_table(
                    Table::alter()
                        .table(Alias::new(table))
                        .add_column(text_null(Msg::TraceContext))
                        .to_owned(),
                )
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
                        .drop_column(Msg::TraceContext)
                        .to_owned(),
                )
                .await?;
        }
        Ok(())
    }
}
