//! Adds `notify_worker`: one row per running worker, refreshed every few
//! seconds (its heartbeat), so operators see which workers are alive and
//! what they swept. A row not refreshed for a while is a worker gone; rows
//! gone for a day are deleted by the next heartbeat.
//!
//! Also indexes `notify_msg_history` by `last_call_time` (when a notice
//! finished), then `def_id` and `status`, so the dashboard's last-24-hours
//! counts read one day of that index alone, not the whole table.

use sea_orm_migration::{prelude::*, schema::*, sea_orm::DbBackend};

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261127_000007_worker_heartbeat"
    }
}

#[derive(DeriveIden)]
enum NotifyWorker {
    Table,
    Id,
    Host,
    Pid,
    StartedAt,
    SeenAt,
    Sweeps,
    Claimed,
    Succeeded,
    Failed,
    BeatSecs,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let time = |name: NotifyWorker| {
            let mut c = ColumnDef::new(name);
            match manager.get_database_backend() {
                // Microseconds, like every timestamp of these tables.
                DbBackend::MySql => c.custom(Alias::new("datetime(6)")),
                _ => c.date_time(),
            };
            c.not_null().to_owned()
        };
        manager
            .create_table(
                Table::create()
                    .table(NotifyWorker::Table)
                    .if_not_exists()
                    .col(string_len(NotifyWorker::Id, 255).primary_key())
                    .col(string_len(NotifyWorker::Host, 255))
                    .col(integer(NotifyWorker::Pid))
                    .col(time(NotifyWorker::StartedAt))
                    .col(time(NotifyWorker::SeenAt))
                    .col(big_integer(NotifyWorker::Sweeps).default(0))
                    .col(big_integer(NotifyWorker::Claimed).default(0))
                    .col(big_integer(NotifyWorker::Succeeded).default(0))
                    .col(big_integer(NotifyWorker::Failed).default(0))
                    .col(double(NotifyWorker::BeatSecs).default(5.0))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("idx_notify_msg_history_finished")
                    .table(Alias::new("notify_msg_history"))
                    .col(Alias::new("last_call_time"))
                    .col(Alias::new("def_id"))
                    .col(Alias::new("status"))
                    .if_not_exists()
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_index(
                Index::drop()
                    .name("idx_notify_msg_history_finished")
                    .table(Alias::new("notify_msg_history"))
                    .to_owned(),
            )
            .await?;
        manager
            .drop_table(Table::drop().table(NotifyWorker::Table).to_owned())
            .await
    }
}
