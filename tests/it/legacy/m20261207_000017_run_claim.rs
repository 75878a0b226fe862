//! PostgreSQL only: a notice claimed inside a run holds no key of its own.
//!
//! A sweep's batch of successes claims, with each key's next notice, the
//! notices right behind it (a run). One live lease of the key is enough to
//! keep every other claim of that key out, so only the first and the last
//! notice of a run hold the key (`held_key`, migration 16); those between
//! are leased with `in_run_at` set to their claimed version. Their claim
//! then changes no indexed column: a heap-only update, where writing
//! `held_key` added an entry to every index of the row.
//!
//! `held_key` is now the key of a leased row unless `in_run_at` equals its
//! `version`. Every claim and every outcome bumps the version, so any later
//! transition of such a row (a release, a retry, a claim by any path) makes
//! it hold its key again whenever it is leased, without writing `in_run_at`.

use sea_orm_migration::prelude::*;

use super::m20261124_000004_wake_trigger::on_postgres;

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261207_000017_run_claim"
    }
}

const UP: [&str; 4] = [
    "ALTER TABLE notify_msg ADD COLUMN IF NOT EXISTS in_run_at integer",
    // A generation expression cannot change before PostgreSQL 17: the
    // column and its index are made again (one rewrite of the table).
    "ALTER TABLE notify_msg DROP COLUMN IF EXISTS held_key",
    "ALTER TABLE notify_msg ADD COLUMN held_key text GENERATED ALWAYS AS \
     (CASE WHEN leased AND in_run_at IS DISTINCT FROM version THEN ordering_key END) STORED",
    "CREATE INDEX IF NOT EXISTS idx_notify_msg_def_held_key ON notify_msg (def_id, held_key) \
     WHERE held_key IS NOT NULL",
];

const DOWN: [&str; 4] = [
    "ALTER TABLE notify_msg DROP COLUMN IF EXISTS held_key",
    "ALTER TABLE notify_msg ADD COLUMN held_key text \
     GENERATED ALWAYS AS (CASE WHEN leased THEN ordering_key END) STORED",
    "CREATE INDEX IF NOT EXISTS idx_notify_msg_def_held_key ON notify_msg (def_id, held_key) \
     WHERE held_key IS NOT NULL",
    "ALTER TABLE notify_msg DROP COLUMN IF EXISTS in_run_at",
];

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        on_postgres(manager, UP.map(String::from)).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        on_postgres(manager, DOWN.map(String::from)).await
    }
}
