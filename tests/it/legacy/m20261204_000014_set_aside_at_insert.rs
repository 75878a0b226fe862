//! PostgreSQL only: a notice of an ordered definition that is at least
//! third in line is written set aside, so no claim reads it until its key
//! moves on.
//!
//! A notice inserted due now, never attempted and not leased, with an
//! `ordering_key` of a `per_key` definition that already has two or more
//! older notices in `notify_msg`, is written due 60 seconds later
//! (`TURN_RECHECK` in the library), by a `BEFORE INSERT` row trigger. The
//! notice before it promotes it when it finishes, as any notice set aside
//! (the library's `state::order`). A notice second in line is left due:
//! the first claim that meets it sets it aside, as on the other backends.

use sea_orm_migration::prelude::*;

use super::m20261124_000004_wake_trigger::on_postgres;

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261204_000014_set_aside_at_insert"
    }
}

const NOW: &str = "(statement_timestamp() AT TIME ZONE 'UTC')";

const UP: [&str; 2] = [
    "CREATE OR REPLACE FUNCTION solid_notify_set_aside() RETURNS trigger LANGUAGE plpgsql AS $$
     BEGIN
       IF NEW.next_call_time <= @NOW@
          AND EXISTS (SELECT 1 FROM notify_def d WHERE d.id = NEW.def_id AND d.ordering = 'per_key')
          AND (SELECT count(*) FROM (SELECT 1 FROM notify_msg o
                 WHERE o.def_id = NEW.def_id AND o.ordering_key = NEW.ordering_key
                 AND (o.create_time, o.id) < (NEW.create_time, NEW.id) LIMIT 2) x) = 2 THEN
         NEW.next_call_time := @NOW@ + interval '60 seconds';
       END IF;
       RETURN NEW;
     END $$",
    "CREATE TRIGGER solid_notify_set_aside BEFORE INSERT ON notify_msg
     FOR EACH ROW WHEN (NEW.ordering_key IS NOT NULL AND NEW.status = 0 AND NOT NEW.leased)
     EXECUTE FUNCTION solid_notify_set_aside()",
];

const DOWN: [&str; 2] = [
    "DROP TRIGGER IF EXISTS solid_notify_set_aside ON notify_msg",
    "DROP FUNCTION IF EXISTS solid_notify_set_aside()",
];

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        on_postgres(manager, UP.map(|sql| sql.replace("@NOW@", NOW))).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        on_postgres(manager, DOWN.map(String::from)).await
    }
}
