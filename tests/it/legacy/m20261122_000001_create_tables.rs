//! Creates `notify_def`, `notify_msg` and `notify_msg_history` with their indexes.

use sea_orm_migration::{prelude::*, schema::*, sea_orm::DbBackend};

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261122_000001_create_tables"
    }
}

#[derive(DeriveIden)]
enum NotifyDef {
    Table,
    Id,
    Name,
    Channel,
    Target,
    RetryInterval,
    MaxRetryTimes,
    MaxRetryInterval,
    AlertTriggerType,
    AlertTriggerFailTimes,
    Email,
    NeedConfirm,
    MaxConfirmDelay,
    Description,
    CreateTime,
    UpdateTime,
}

#[derive(DeriveIden, Clone, Copy)]
enum Msg {
    Id,
    DefId,
    Param,
    Description,
    Errors,
    Status,
    RetryTimes,
    LastCallTime,
    NextCallTime,
    CreateTime,
    Version,
    LoadBalanceNum,
    IdempotencyKey,
    TargetOverride,
}

const NOTIFY_MSG: &str = "notify_msg";
const NOTIFY_MSG_HISTORY: &str = "notify_msg_history";

/// A UTC timestamp column with microsecond precision on every backend,
/// defaulting to the database's current UTC time when `default_now`.
pub(crate) fn timestamp(backend: DbBackend, col: impl IntoIden, default_now: bool) -> ColumnDef {
    let mut def = ColumnDef::new(col);
    match backend {
        DbBackend::MySql => def.custom(Alias::new("datetime(6)")),
        _ => def.date_time(),
    };
    if default_now {
        let now = match backend {
            DbBackend::Postgres => "(now() at time zone 'utc')",
            DbBackend::MySql => "(UTC_TIMESTAMP(6))",
            _ => "CURRENT_TIMESTAMP",
        };
        def.not_null().default(Expr::cust(now));
    } else {
        def.null();
    }
    def
}

/// A text column that holds up to 4 GiB on MySQL/MariaDB (plain `TEXT` stops
/// at 64 KiB there) and is plain `text` elsewhere.
pub(crate) fn long_text(backend: DbBackend, col: impl IntoIden) -> ColumnDef {
    let mut def = ColumnDef::new(col);
    match backend {
        DbBackend::MySql => def.custom(Alias::new("longtext")),
        _ => def.text(),
    };
    def.not_null().take()
}

/// The columns shared by `notify_msg` and `notify_msg_history`; only the
/// primary key differs (history keeps the id the notice had in flight).
fn notice_table(backend: DbBackend, table: &str, auto_id: bool) -> TableCreateStatement {
    let id = if auto_id {
        big_pk_auto(Msg::Id)
    } else {
        big_integer(Msg::Id).primary_key().take()
    };
    Table::create()
        .table(Alias::new(table))
        .if_not_exists()
        .col(id)
        .col(big_integer(Msg::DefId))
        .col(long_text(backend, Msg::Param))
        .col(long_text(backend, Msg::Description).default(""))
        .col(long_text(backend, Msg::Errors).default(""))
        .col(small_integer(Msg::Status).default(0))
        .col(integer(Msg::RetryTimes).default(0))
        .col(timestamp(backend, Msg::LastCallTime, false))
        .col(timestamp(backend, Msg::NextCallTime, true))
        .col(timestamp(backend, Msg::CreateTime, true))
        .col(integer(Msg::Version).default(0))
        .col(integer(Msg::LoadBalanceNum).default(0))
        .col(string_len_null(Msg::IdempotencyKey, 255))
        .col(text_null(Msg::TargetOverride))
        .to_owned()
}

fn index(table: &str, name: &str, cols: &[Msg]) -> IndexCreateStatement {
    let mut stmt = Index::create();
    stmt.name(format!("idx_{table}_{name}"))
        .table(Alias::new(table))
        .if_not_exists();
    for col in cols {
        stmt.col(*col);
    }
    stmt.to_owned()
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let backend = manager.get_database_backend();
        manager
            .create_table(
                Table::create()
                    .table(NotifyDef::Table)
                    .if_not_exists()
                    .col(big_pk_auto(NotifyDef::Id))
                    .col(string_len_uniq(NotifyDef::Name, 191))
                    .col(string_len(NotifyDef::Channel, 32))
                    .col(text(NotifyDef::Target))
                    .col(string_len(NotifyDef::RetryInterval, 255))
                    .col(integer(NotifyDef::MaxRetryTimes))
                    .col(integer(NotifyDef::MaxRetryInterval))
                    .col(small_integer(NotifyDef::AlertTriggerType))
                    .col(integer(NotifyDef::AlertTriggerFailTimes))
                    .col(text(NotifyDef::Email).default(""))
                    .col(boolean(NotifyDef::NeedConfirm).default(false))
                    .col(integer(NotifyDef::MaxConfirmDelay).default(0))
                    .col(text(NotifyDef::Description).default(""))
                    .col(timestamp(backend, NotifyDef::CreateTime, true))
                    .col(timestamp(backend, NotifyDef::UpdateTime, true))
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(notice_table(backend, NOTIFY_MSG, true))
            .await?;
        manager
            .create_table(notice_table(backend, NOTIFY_MSG_HISTORY, false))
            .await?;
        // Due rows, oldest first; due rows of one partition; due rows of some defs.
        manager
            .create_index(index(NOTIFY_MSG, "due", &[Msg::NextCallTime]))
            .await?;
        manager
            .create_index(index(
                NOTIFY_MSG,
                "partition_due",
                &[Msg::LoadBalanceNum, Msg::NextCallTime],
            ))
            .await?;
        manager
            .create_index(index(
                NOTIFY_MSG,
                "def_due",
                &[Msg::DefId, Msg::NextCallTime],
            ))
            .await?;
        // Operators look history up by definition and outcome.
        manager
            .create_index(index(
                NOTIFY_MSG_HISTORY,
                "def_status",
                &[Msg::DefId, Msg::Status, Msg::CreateTime],
            ))
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for table in [NOTIFY_MSG_HISTORY, NOTIFY_MSG] {
            manager
                .drop_table(Table::drop().table(Alias::new(table)).to_owned())
                .await?;
        }
        manager
            .drop_table(Table::drop().table(NotifyDef::Table).to_owned())
            .await
    }
}
