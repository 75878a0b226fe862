//! Read: notice rows decoded one at a time. A row that cannot be read as a
//! notice (a cell of another type than its column's, which SQLite allows;
//! a number out of range; a time no driver reads; a status that is none)
//! is told apart as [`Unreadable`], naming each such cell and what it
//! holds, instead of failing every row read with it.
//!
//! Every reader of `notify_msg` and `notify_msg_history` rows goes through
//! [`notice`] or [`notices`]: the claims park what is unreadable, the
//! listings show it as unreadable with its id.

use chrono::NaiveDateTime;
use sea_orm::{ActiveEnum, FromQueryResult, QueryResult};

use crate::status::{Origin, Status};

/// How a column of a notice is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A 64-bit integer.
    Big,
    /// A 32-bit integer.
    Int,
    /// A [`Status`] number.
    Status,
    /// An [`Origin`] number.
    Origin,
    /// Text.
    Text,
    /// Text or `NULL`.
    OptText,
    /// A time.
    Time,
    /// A time or `NULL`.
    OptTime,
    /// A boolean (0 or 1 on SQLite and MariaDB).
    Flag,
}

impl Kind {
    fn expected(self) -> &'static str {
        match self {
            Kind::Big => "a 64-bit integer",
            Kind::Int => "an integer from -2147483648 to 2147483647",
            Kind::Status => "a status from 0 to 6",
            Kind::Origin => "an origin from 0 to 2",
            Kind::Text => "text",
            Kind::OptText => "text or NULL",
            Kind::Time => "a time",
            Kind::OptTime => "a time or NULL",
            Kind::Flag => "0 or 1",
        }
    }
}

/// The columns of a notice (both tables), in the order of
/// [`notify_msg::Column`](super::notify_msg::Column), how each is read, and
/// whether its content is the producer's payload (never quoted in a reason:
/// it may be secret).
const COLUMNS: [(&str, Kind, bool); 21] = [
    ("id", Kind::Big, false),
    ("def_id", Kind::Big, false),
    ("param", Kind::Text, true),
    ("description", Kind::Text, true),
    ("errors", Kind::Text, true),
    ("status", Kind::Status, false),
    ("retry_times", Kind::Int, false),
    ("last_call_time", Kind::OptTime, false),
    ("next_call_time", Kind::Time, false),
    ("create_time", Kind::Time, false),
    ("version", Kind::Int, false),
    ("load_balance_num", Kind::Int, false),
    ("idempotency_key", Kind::OptText, true),
    ("target_override", Kind::OptText, true),
    ("leased", Kind::Flag, false),
    ("trace_context", Kind::OptText, true),
    ("ordering_key", Kind::OptText, true),
    ("step", Kind::Int, false),
    ("step_result", Kind::OptText, true),
    ("not_before", Kind::OptTime, false),
    ("origin", Kind::Origin, false),
];

/// One cell that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadCell {
    /// The column.
    pub column: &'static str,
    /// What it holds, as a person reads it (`text "abc"`, `a BLOB of 12
    /// bytes`); the payload's columns are described by type and size only.
    pub found: String,
    /// What the column takes.
    pub expected: &'static str,
}

/// A notice row that cannot be read as a notice, with what could be read of
/// it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unreadable {
    /// The notice id (always readable: every backend's key is an integer).
    pub id: i64,
    /// Its version, when readable as an integer (a guard on it parks only
    /// the row as read).
    pub version: Option<i64>,
    /// Its definition, when readable.
    pub def_id: Option<i64>,
    /// Its failure log, when readable.
    pub errors: Option<String>,
    /// Its ordering key, when it has one and it is readable.
    pub ordering_key: Option<String>,
    /// Each cell that cannot be read.
    pub cells: Vec<BadCell>,
}

impl Unreadable {
    /// Why the row cannot be read: each cell, what it holds and what its
    /// column takes.
    pub fn reason(&self) -> String {
        let cells: Vec<String> = self
            .cells
            .iter()
            .map(|c| format!("{} holds {} ({} expected)", c.column, c.found, c.expected))
            .collect();
        match cells.is_empty() {
            true => "the row cannot be read".into(),
            false => format!("the row cannot be read: {}", cells.join("; ")),
        }
    }

    /// What can be read of `row`, which failed to decode as a notice with
    /// `error`: every column is tried on its own. (The decode failing while
    /// every column reads is left to `error`'s message.)
    fn of(row: &QueryResult, error: &sea_orm::DbErr) -> Unreadable {
        let mut cells: Vec<BadCell> = COLUMNS
            .iter()
            .filter_map(|&(column, kind, payload)| bad_cell(row, column, kind, payload))
            .collect();
        if cells.is_empty() {
            cells.push(BadCell {
                column: "a column",
                found: excerpt(&error.to_string()),
                expected: "a notice",
            });
        }
        Unreadable {
            id: row.try_get("", "id").unwrap_or_default(),
            // An INT column (PostgreSQL refuses it as i64), else any
            // integer SQLite holds.
            version: row
                .try_get::<i32>("", "version")
                .map(i64::from)
                .or_else(|_| row.try_get::<i64>("", "version"))
                .ok(),
            def_id: row.try_get("", "def_id").ok(),
            errors: row.try_get("", "errors").ok(),
            ordering_key: row.try_get("", "ordering_key").ok().flatten(),
            cells,
        }
    }
}

/// Decodes `row` as a notice of either table (`M` is one of their models),
/// or tells what cannot be read of it.
pub fn notice<M: FromQueryResult>(row: &QueryResult) -> Result<M, Unreadable> {
    if !times_in_range(row) {
        let error = sea_orm::DbErr::Type("a time out of range".into());
        return Err(Unreadable::of(row, &error));
    }
    M::from_query_result(row, "").map_err(|e| Unreadable::of(row, &e))
}

/// Whether every time of `row` is one the driver reads without failing
/// loudly: on PostgreSQL `infinity`, `-infinity` and years past chrono's
/// range (±262,143) make sqlx panic, so they are checked on the raw value
/// first. Elsewhere a time the driver cannot read is an error, and true.
pub fn times_in_range(row: &QueryResult) -> bool {
    COLUMNS
        .iter()
        .filter(|(_, kind, _)| matches!(kind, Kind::Time | Kind::OptTime))
        .all(|(column, ..)| !pg_time_out_of_range(row, column))
}

/// PostgreSQL: microseconds from 2000-01-01 past which a `timestamp` is not
/// read (about ±253,000 years; chrono ends at ±262,143).
#[cfg(feature = "postgres")]
const PG_MICROS_READ: u64 = 8_000_000_000_000_000_000;

/// PostgreSQL: whether cell `column` of `row` is a time sqlx would panic on
/// (see [`times_in_range`]).
#[cfg(feature = "postgres")]
fn pg_time_out_of_range(row: &QueryResult, column: &str) -> bool {
    use sea_orm::sqlx::{Row, ValueRef, postgres::PgValueFormat};
    let Some(pg) = row.try_as_pg_row() else {
        return false;
    };
    let Ok(value) = pg.try_get_raw(column) else {
        return false;
    };
    if value.is_null() || value.format() != PgValueFormat::Binary {
        return false;
    }
    match value.as_bytes().map(<[u8; 8]>::try_from) {
        Ok(Ok(bytes)) => i64::from_be_bytes(bytes).unsigned_abs() >= PG_MICROS_READ,
        _ => false,
    }
}

#[cfg(not(feature = "postgres"))]
fn pg_time_out_of_range(_: &QueryResult, _: &str) -> bool {
    false
}

/// [`notice`] for each of `rows`: those read, and those that cannot be.
pub fn notices<M: FromQueryResult>(rows: &[QueryResult]) -> (Vec<M>, Vec<Unreadable>) {
    let mut read = Vec::with_capacity(rows.len());
    let mut unreadable = Vec::new();
    for row in rows {
        match notice(row) {
            Ok(m) => read.push(m),
            Err(u) => unreadable.push(u),
        }
    }
    (read, unreadable)
}

/// What can be read of a notice row of either table, each cell on its own:
/// a cell that cannot be read is its type's default (empty text, 0, `NULL`,
/// 1970-01-01; a status that is none reads as parked). For showing an
/// [`Unreadable`] row, never for delivering one.
pub fn lenient(row: &QueryResult) -> super::notify_msg::Model {
    fn get<T: sea_orm::TryGetable + Default>(row: &QueryResult, column: &str) -> T {
        match pg_time_out_of_range(row, column) {
            true => T::default(),
            false => row.try_get("", column).unwrap_or_default(),
        }
    }
    super::notify_msg::Model {
        id: get(row, "id"),
        def_id: get(row, "def_id"),
        param: get(row, "param"),
        description: get(row, "description"),
        errors: get(row, "errors"),
        status: row
            .try_get::<i16>("", "status")
            .ok()
            .and_then(|n| Status::try_from_value(&n).ok())
            .unwrap_or(Status::Parked),
        retry_times: get(row, "retry_times"),
        last_call_time: get(row, "last_call_time"),
        next_call_time: get(row, "next_call_time"),
        create_time: get(row, "create_time"),
        version: get(row, "version"),
        load_balance_num: get(row, "load_balance_num"),
        idempotency_key: get(row, "idempotency_key"),
        target_override: get(row, "target_override"),
        leased: get(row, "leased"),
        trace_context: get(row, "trace_context"),
        ordering_key: get(row, "ordering_key"),
        step: get(row, "step"),
        step_result: get(row, "step_result"),
        not_before: get(row, "not_before"),
        origin: row
            .try_get::<i16>("", "origin")
            .ok()
            .and_then(|n| Origin::try_from_value(&n).ok())
            .unwrap_or_default(),
    }
}

/// Rows of a partial or grouped read of the notice tables, each decoded on
/// its own: those that cannot be read (a plain-SQL producer's cell of
/// another type, on SQLite) are left out.
pub fn each<M: FromQueryResult>(rows: &[QueryResult]) -> Vec<M> {
    rows.iter()
        .filter_map(|row| M::from_query_result(row, "").ok())
        .collect()
}

/// The cell `column` of `row` when it cannot be read as `kind`.
fn bad_cell(row: &QueryResult, column: &'static str, kind: Kind, payload: bool) -> Option<BadCell> {
    if pg_time_out_of_range(row, column) {
        return Some(BadCell {
            column,
            found: "a time out of range (infinity, or a year past 262143)".into(),
            expected: kind.expected(),
        });
    }
    let read = match kind {
        Kind::Big => row.try_get::<i64>("", column).is_ok(),
        Kind::Int => row.try_get::<i32>("", column).is_ok(),
        Kind::Status | Kind::Origin => match row.try_get::<i16>("", column) {
            Ok(n)
                if (kind == Kind::Status && Status::try_from_value(&n).is_err())
                    || (kind == Kind::Origin && Origin::try_from_value(&n).is_err()) =>
            {
                return Some(BadCell {
                    column,
                    found: format!("{n}"),
                    expected: kind.expected(),
                });
            }
            read => read.is_ok(),
        },
        Kind::Text => row.try_get::<String>("", column).is_ok(),
        Kind::OptText => row.try_get::<Option<String>>("", column).is_ok(),
        Kind::Time => match row.try_get::<Option<NaiveDateTime>>("", column) {
            Ok(Some(_)) => true,
            // MariaDB reads a zero date (`0000-00-00`) as NULL.
            Ok(None) => {
                return Some(BadCell {
                    column,
                    found: "NULL (or a zero date)".into(),
                    expected: kind.expected(),
                });
            }
            Err(_) => false,
        },
        Kind::OptTime => row.try_get::<Option<NaiveDateTime>>("", column).is_ok(),
        Kind::Flag => row.try_get::<bool>("", column).is_ok(),
    };
    // A column the statement did not select (a listing's excerpt) is not
    // the row's fault.
    if read || !row.column_names().iter().any(|c| c == column) {
        return None;
    }
    Some(BadCell {
        column,
        found: found(row, column, payload),
        expected: kind.expected(),
    })
}

/// What cell `column` of `row` holds, tried as text, integer, real and
/// bytes in turn.
fn found(row: &QueryResult, column: &str, payload: bool) -> String {
    if let Ok(text) = row.try_get::<Option<String>>("", column) {
        return match text {
            None => "NULL".into(),
            Some(t) if payload => format!("text of {} bytes", t.len()),
            Some(t) => format!("text \"{}\"", excerpt(&t)),
        };
    }
    if let Ok(n) = row.try_get::<i64>("", column) {
        return format!("the integer {n}");
    }
    if let Ok(x) = row.try_get::<f64>("", column) {
        return format!("the real number {x}");
    }
    if let Ok(bytes) = row.try_get::<Vec<u8>>("", column) {
        return format!("a BLOB of {} bytes", bytes.len());
    }
    match (payload, row.try_get::<Option<String>>("", column)) {
        (false, Err(e)) => format!(
            "a value the driver cannot read ({})",
            excerpt(&e.to_string())
        ),
        _ => "a value of another type".into(),
    }
}

/// `text` as quoted in a reason: at most 40 characters, control and
/// invisible characters escaped.
fn excerpt(text: &str) -> String {
    let mut cut: String = text.chars().take(40).collect();
    if cut.len() < text.len() {
        cut.push('…');
    }
    printable(&cut)
}

/// `text` with control and invisible formatting characters (CR, LF, ESC,
/// bidirectional overrides, zero-width ones) escaped, everything else as
/// it is.
pub fn printable(text: &str) -> String {
    let hidden = |c: char| {
        c.is_control()
            || matches!(c, '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2060}'..='\u{2069}' | '\u{FEFF}')
    };
    let mut shown = String::with_capacity(text.len());
    for c in text.chars() {
        if hidden(c) {
            let escaped: String = c.escape_debug().collect();
            match escaped.chars().eq(std::iter::once(c)) {
                // `escape_debug` leaves some format characters as they are.
                true => shown.extend(c.escape_unicode()),
                false => shown.push_str(&escaped),
            }
        } else {
            shown.push(c);
        }
    }
    shown
}

#[cfg(test)]
mod tests {
    use super::*;
    use sea_orm::{IdenStatic, Iterable};

    #[test]
    fn every_column_of_a_notice_is_read_and_in_order() {
        let names: Vec<&str> = super::super::notify_msg::Column::iter()
            .map(|c| c.as_str())
            .collect();
        let ours: Vec<&str> = COLUMNS.iter().map(|(c, ..)| *c).collect();
        assert_eq!(names, ours);
        let history: Vec<&str> = super::super::notify_msg_history::Column::iter()
            .map(|c| c.as_str())
            .collect();
        assert_eq!(history, ours);
    }

    #[test]
    fn a_reason_names_each_cell() {
        let u = Unreadable {
            id: 7,
            version: Some(1),
            def_id: None,
            errors: None,
            ordering_key: None,
            cells: vec![
                BadCell {
                    column: "retry_times",
                    found: "text \"abc\"".into(),
                    expected: Kind::Int.expected(),
                },
                BadCell {
                    column: "param",
                    found: "a BLOB of 3 bytes".into(),
                    expected: Kind::Text.expected(),
                },
            ],
        };
        assert_eq!(
            u.reason(),
            "the row cannot be read: retry_times holds text \"abc\" (an integer from -2147483648 to 2147483647 expected); param holds a BLOB of 3 bytes (text expected)"
        );
    }

    #[test]
    fn excerpts_are_short_and_escaped() {
        assert_eq!(excerpt("a\nb"), "a\\nb");
        assert_eq!(excerpt(&"x".repeat(50)), format!("{}…", "x".repeat(40)));
    }
}
