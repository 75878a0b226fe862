//! Keys: the ordering keys held back by a failure.
//!
//! A definition with `ordering = "per_key"` and `stop_on_failure = true`
//! (the default) sends no notice of a key younger than a final failure or
//! parked notice of that key in history ([`order`](crate::state)). Such a
//! key is *blocked*: its *head* is the oldest such failure, and the notices
//! in flight behind it wait until an operator requeues the head (it is sent
//! again first) or cancels it (given up; the key goes on). This module
//! lists them ([`blocked`]) and counts them per definition
//! ([`blocked_counts`], the `solid_notify_blocked_keys` gauge).
//!
//! One query each, driven by `notify_def` (the ordered definitions that
//! stop on failure) and the history index by definition and status, so a
//! large history of successes is not read.

use std::collections::HashMap;

use chrono::NaiveDateTime;
use sea_orm::{ConnectionTrait, DbBackend, Statement, Value};
use serde::Serialize;

use crate::{error::Result, status::Status};

/// Default [`blocked`] page size: 100 keys.
pub const DEFAULT_BLOCKED_LIMIT: u64 = 100;
/// Largest [`blocked`] page: 1,000 keys (each counts the notices waiting
/// behind its head).
pub const MAX_BLOCKED_LIMIT: u64 = 1_000;

/// One blocked key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BlockedKey {
    /// `notify_def.id`.
    pub def_id: i64,
    /// The definition's name.
    pub def: String,
    /// The ordering key.
    pub ordering_key: String,
    /// The head: the oldest final failure or parked notice of the key in
    /// history, which holds the key.
    pub head_id: i64,
    /// The head's status: final failure (3) or parked (6).
    pub head_status: Status,
    /// When the head was added (UTC).
    pub head_created: NaiveDateTime,
    /// When the key was blocked: the head's last attempt, or when it was
    /// added if it never ran (UTC).
    pub blocked_since: NaiveDateTime,
    /// Notices of the key in flight behind the head (younger than it),
    /// waiting.
    pub waiting: u64,
}

/// The heads of blocked keys, as SQL over `notify_msg_history h` joined to
/// `notify_def d`; `{def}` is replaced by an extra condition.
const HEADS: &str = "FROM notify_def d \
     JOIN notify_msg_history h ON h.def_id = d.id AND h.status IN (3, 6) \
     WHERE d.ordering = 'per_key' AND d.stop_on_failure {def} \
     AND h.ordering_key IS NOT NULL \
     AND NOT EXISTS (SELECT 1 FROM notify_msg_history o \
         WHERE o.def_id = h.def_id AND o.ordering_key = h.ordering_key \
         AND o.status IN (3, 6) AND (o.create_time, o.id) < (h.create_time, h.id))";

fn placeholder(backend: DbBackend) -> &'static str {
    match backend {
        DbBackend::Postgres => "$1",
        _ => "?",
    }
}

/// A page of blocked keys.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BlockedKeys {
    /// Oldest head first.
    pub keys: Vec<BlockedKey>,
    /// Whether more keys are blocked than the page holds.
    pub more: bool,
}

/// The blocked keys (of definition `def_id`, or of all), oldest head first,
/// at most `limit` (1 to [`MAX_BLOCKED_LIMIT`]).
pub async fn blocked<C: ConnectionTrait>(
    db: &C,
    def_id: Option<i64>,
    limit: u64,
) -> Result<BlockedKeys> {
    let limit = limit.clamp(1, MAX_BLOCKED_LIMIT);
    let mut keys = heads(db, def_id, limit + 1).await?;
    let more = keys.len() as u64 > limit;
    keys.truncate(limit as usize);
    Ok(BlockedKeys { keys, more })
}

async fn heads<C: ConnectionTrait>(
    db: &C,
    def_id: Option<i64>,
    limit: u64,
) -> Result<Vec<BlockedKey>> {
    let backend = db.get_database_backend();
    let def = match def_id {
        Some(_) => format!("AND d.id = {}", placeholder(backend)),
        None => String::new(),
    };
    let sql = format!(
        "SELECT h.def_id, d.name, h.ordering_key, h.id, h.status, h.create_time, \
             COALESCE(h.last_call_time, h.create_time), \
             (SELECT COUNT(*) FROM notify_msg m \
                 WHERE m.def_id = h.def_id AND m.ordering_key = h.ordering_key \
                 AND (m.create_time, m.id) > (h.create_time, h.id)) \
         {} ORDER BY h.create_time, h.id LIMIT {}",
        HEADS.replace("{def}", &def),
        limit
    );
    let values: Vec<Value> = def_id.into_iter().map(Value::from).collect();
    let rows = db
        .query_all_raw(Statement::from_sql_and_values(backend, sql, values))
        .await?;
    let mut keys = Vec::with_capacity(rows.len());
    for row in rows {
        let status: i32 = match row.try_get_by_index::<i16>(4) {
            Ok(s) => s.into(),
            Err(_) => row.try_get_by_index::<i32>(4)?,
        };
        let waiting = match row.try_get_by_index::<i64>(7) {
            Ok(n) => n,
            Err(_) => i64::from(row.try_get_by_index::<i32>(7)?),
        };
        // The head's own cells as a plain-SQL producer wrote them (SQLite
        // keeps any type): a key or time that cannot be read is shown as
        // such, never stops the page.
        keys.push(BlockedKey {
            def_id: row.try_get_by_index(0)?,
            def: row.try_get_by_index(1)?,
            ordering_key: row
                .try_get_by_index(2)
                .unwrap_or_else(|_| UNREADABLE_KEY.to_string()),
            head_id: row.try_get_by_index(3)?,
            head_status: Status::parse(&status.to_string()).unwrap_or(Status::FinalFailure),
            head_created: time_at(&row, 5).unwrap_or_default(),
            blocked_since: time_at(&row, 6).unwrap_or_default(),
            waiting: u64::try_from(waiting).unwrap_or(0),
        });
    }
    Ok(keys)
}

/// How a head's ordering key that cannot be read as text (a plain-SQL
/// producer's BLOB on SQLite) is shown; its head is requeued or cancelled
/// by id all the same.
pub const UNREADABLE_KEY: &str = "(a key that cannot be read as text)";

/// The number of blocked keys of each definition that has any, by name:
/// the distinct keys with a final failure or parked notice in history (each
/// such key is blocked), one grouped query with no per-row probe.
pub async fn blocked_counts<C: ConnectionTrait>(db: &C) -> Result<HashMap<String, u64>> {
    let backend = db.get_database_backend();
    let sql = "SELECT d.name, COUNT(DISTINCT h.ordering_key) FROM notify_def d \
         JOIN notify_msg_history h ON h.def_id = d.id AND h.status IN (3, 6) \
         WHERE d.ordering = 'per_key' AND d.stop_on_failure AND h.ordering_key IS NOT NULL \
         GROUP BY d.name";
    let rows = db
        .query_all_raw(Statement::from_string(backend, sql))
        .await?;
    let mut counts = HashMap::new();
    for row in rows {
        let name: String = row.try_get_by_index(0)?;
        let n = match row.try_get_by_index::<i64>(1) {
            Ok(n) => n,
            Err(_) => i64::from(row.try_get_by_index::<i32>(1)?),
        };
        counts.insert(name, u64::try_from(n).unwrap_or(0));
    }
    Ok(counts)
}

/// `key` as shown to a person: control and invisible formatting
/// characters (CR, LF, ESC, bidirectional overrides, zero-width ones)
/// escaped, everything else as stored.
pub fn printable(key: &str) -> String {
    crate::entity::read::printable(key)
}

/// A time column: a timestamp on the servers, text on SQLite.
fn time_at(row: &sea_orm::QueryResult, i: usize) -> Result<NaiveDateTime> {
    if let Ok(t) = row.try_get_by_index::<NaiveDateTime>(i) {
        return Ok(t);
    }
    let text: String = row.try_get_by_index(i)?;
    ["%Y-%m-%d %H:%M:%S%.f", "%Y-%m-%dT%H:%M:%S%.f"]
        .iter()
        .find_map(|f| NaiveDateTime::parse_from_str(&text, f).ok())
        .ok_or_else(|| crate::error::Error::Config(format!("a stored time `{text}` is not a time")))
}

#[cfg(test)]
mod tests {
    #[test]
    fn printable_escapes_only_what_hides() {
        assert_eq!(super::printable("O'Brien \\ \"x\""), "O'Brien \\ \"x\"");
        assert_eq!(super::printable("a\r\nb\u{1b}[31m"), "a\\r\\nb\\u{1b}[31m");
        assert_eq!(super::printable("x\u{202E}y"), "x\\u{202e}y");
    }
}
