//! Every claim skips the definitions paused right now
//! (`def_id NOT IN (SELECT id FROM notify_def WHERE paused_until > now)`).
//! Without an index that subquery reads the whole of `notify_def` on every
//! claim: at 100,000 definitions it tripled a claim's time (a drain of
//! 20,000 notices went from 30,000 to 9,000 per second). With it, the
//! claim reads only the paused ones.

use sea_orm_migration::prelude::*;

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261209_000019_paused_index"
    }
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_index(
                Index::create()
                    .if_not_exists()
                    .name("idx_notify_def_paused_until")
                    .table(Alias::new("notify_def"))
                    .col(Alias::new("paused_until"))
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_index(
                Index::drop()
                    .if_exists()
                    .name("idx_notify_def_paused_until")
                    .table(Alias::new("notify_def"))
                    .to_owned(),
            )
            .await
    }
}
