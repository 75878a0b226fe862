//! Adds `notify_def.encrypt` (default false): the definition's params, and
//! the step results derived from them, are stored sealed (XChaCha20-Poly1305,
//! with a key id) and opened only to deliver them.

use sea_orm_migration::{prelude::*, schema::*};

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261212_000022_encrypt"
    }
}

#[derive(DeriveIden)]
enum NotifyDef {
    Table,
    Encrypt,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(NotifyDef::Table)
                    .add_column(boolean(NotifyDef::Encrypt).default(false))
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(NotifyDef::Table)
                    .drop_column(NotifyDef::Encrypt)
                    .to_owned(),
            )
            .await
    }
}
