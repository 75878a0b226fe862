//! Rows from producers in any language: times read whatever form SQLite
//! writes them in, times no driver reads refused at the insert, and
//! MariaDB's stored payload size kept true.
//!
//! - **SQLite**: an insert trigger rewrites a time written in another form
//!   than the library's (`YYYY-MM-DD HH:MM:SS[.fff]`, UTC) into it:
//!   ISO 8601 text with or without its time, with `T`, fractional seconds,
//!   `Z` or an offset (`+02:00`, converted to UTC); a Unix time or a Julian
//!   day, as a number or as numeric text (`strftime`'s `auto`: a value up
//!   to 5373484 is a Julian day, a larger one Unix seconds). A new notice
//!   (`version` 0) with a time in none of these forms (`'tomorrow'`, a
//!   BLOB, an offset without its colon) is refused: the insert fails with
//!   a message naming the column. A row the library moves back in (a
//!   requeue, whose version is past 0) is never refused: one whose time
//!   cannot be read is parked by the claim that meets it. The trigger never
//!   rewrites a time already in the library's form, so it never turns a
//!   readable value into an unreadable one. It also copies a future
//!   `next_call_time` of a plain-SQL row into `not_before` (the delay of
//!   migration 20, whose trigger it replaces), once normalized.
//! - **MySQL/MariaDB**: `param_bytes` is the size of `param` and
//!   `step_result` together, the bytes a claim holds, kept by an insert and
//!   an update trigger (a rekey, a step's result, a hand edit).
//!
//! (PostgreSQL needs nothing: a time its driver cannot read, such as
//! `infinity`, is told apart when a row is read, and the row parked.)

use sea_orm_migration::{prelude::*, sea_orm::DbBackend};

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261213_000023_untrusted_rows"
    }
}

/// The form the library writes a time in on SQLite (`strftime`'s).
const FORM: &str = "'%Y-%m-%d %H:%M:%f'";

/// The time columns of `notify_msg`, and whether each may be NULL.
const TIMES: [(&str, bool); 4] = [
    ("next_call_time", false),
    ("create_time", false),
    ("not_before", true),
    ("last_call_time", true),
];

/// SQL: whether `x` is a time in the library's form (text, a space between
/// date and time, digits and a point after the seconds).
fn canonical(x: &str) -> String {
    format!(
        "(typeof({x}) = 'text' AND {x} GLOB '[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9] [0-9][0-9]:[0-9][0-9]:[0-9][0-9]*' \
         AND substr({x}, 20) NOT GLOB '*[^0-9.]*')"
    )
}

/// SQL: `x` in the library's form (NULL when SQLite reads no time in it).
fn normalized(x: &str) -> String {
    format!("strftime({FORM}, {x}, 'auto')")
}

/// The SQLite insert trigger.
fn sqlite_trigger() -> String {
    let mut refusals = String::new();
    let mut sets = Vec::new();
    let mut odd = Vec::new();
    for (column, nullable) in TIMES {
        let new = format!("NEW.{column}");
        let present = match nullable {
            true => format!("{new} IS NOT NULL AND "),
            false => String::new(),
        };
        refusals.push_str(&format!(
            "SELECT RAISE(ABORT, 'notify_msg.{column} is not a time SQLite reads: write ISO 8601 text (UTC, or with an offset such as +02:00), a Unix time or a Julian day') \
             WHERE NEW.version = 0 AND {present}NOT {canonical} AND {normalized} IS NULL; ",
            canonical = canonical(&new),
            normalized = normalized(&new),
        ));
        // A time SQLite cannot read stays as it is (never NULL).
        sets.push(format!(
            "{column} = CASE WHEN {column} IS NULL OR {canonical} THEN {column} \
             ELSE COALESCE({normalized}, {column}) END",
            canonical = canonical(column),
            normalized = normalized(column),
        ));
        odd.push(format!("({present}NOT {})", canonical(&new)));
    }
    format!(
        "CREATE TRIGGER solid_notify_insert_times AFTER INSERT ON notify_msg FOR EACH ROW BEGIN \
         {refusals}\
         UPDATE notify_msg SET {sets} WHERE ({odd}) AND id = NEW.id; \
         UPDATE notify_msg SET not_before = next_call_time \
         WHERE NEW.not_before IS NULL AND NOT NEW.leased AND NEW.status = 0 AND id = NEW.id \
           AND substr(next_call_time, 1, 23) > strftime({FORM}, 'now'); \
         END",
        sets = sets.join(", "),
        odd = odd.join(" OR "),
    )
}

/// MySQL/MariaDB: the payload's size, as SQL over `NEW`.
const PAYLOAD: &str = "LENGTH(NEW.param) + COALESCE(LENGTH(NEW.step_result), 0)";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        match manager.get_database_backend() {
            DbBackend::Sqlite => {
                db.execute_unprepared("DROP TRIGGER IF EXISTS solid_notify_not_before")
                    .await?;
                db.execute_unprepared(&sqlite_trigger()).await?;
            }
            DbBackend::MySql => {
                for sql in [
                    "DROP TRIGGER IF EXISTS solid_notify_param_bytes".to_string(),
                    format!(
                        "CREATE TRIGGER solid_notify_param_bytes BEFORE INSERT ON notify_msg \
                         FOR EACH ROW SET NEW.param_bytes = {PAYLOAD}"
                    ),
                    format!(
                        "CREATE TRIGGER solid_notify_param_bytes_update BEFORE UPDATE ON notify_msg \
                         FOR EACH ROW SET NEW.param_bytes = {PAYLOAD}"
                    ),
                    "UPDATE notify_msg SET param_bytes = LENGTH(param) + LENGTH(step_result) \
                     WHERE step_result IS NOT NULL"
                        .to_string(),
                ] {
                    db.execute_unprepared(&sql).await?;
                }
            }
            _ => {}
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        match manager.get_database_backend() {
            DbBackend::Sqlite => {
                db.execute_unprepared("DROP TRIGGER IF EXISTS solid_notify_insert_times")
                    .await?;
                db.execute_unprepared(
                    "CREATE TRIGGER solid_notify_not_before AFTER INSERT ON notify_msg FOR EACH ROW \
                     WHEN NEW.not_before IS NULL AND NOT NEW.leased AND NEW.status = 0 \
                        AND substr(NEW.next_call_time, 1, 23) > strftime('%Y-%m-%d %H:%M:%f', 'now') BEGIN \
                       UPDATE notify_msg SET not_before = NEW.next_call_time WHERE id = NEW.id; \
                     END",
                )
                .await?;
            }
            DbBackend::MySql => {
                db.execute_unprepared("DROP TRIGGER IF EXISTS solid_notify_param_bytes_update")
                    .await?;
                db.execute_unprepared("DROP TRIGGER IF EXISTS solid_notify_param_bytes")
                    .await?;
                db.execute_unprepared(
                    "CREATE TRIGGER solid_notify_param_bytes BEFORE INSERT ON notify_msg \
                     FOR EACH ROW SET NEW.param_bytes = LENGTH(NEW.param)",
                )
                .await?;
            }
            _ => {}
        }
        Ok(())
    }
}
